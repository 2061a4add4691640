-- Node shapes (docs/scale.md): the spec each node is rented as, JSON (`{"vcpu":2,"memMiB":4096,
-- "diskMiB":20480}`), chosen when the provision is planned; NULL for provisions planned
-- before, which were rented at the broker's `[node]` size.
ALTER TABLE provisions ADD COLUMN spec TEXT;
