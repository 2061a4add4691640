-- Where a node was planned (docs/scale.md, "Zones"): the region and zone its RFP goes to,
-- JSON (`{"region":"eu","zone":"eu-1a"}`); NULL for provisions planned anywhere.
ALTER TABLE provisions ADD COLUMN topology TEXT;
