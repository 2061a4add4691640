-- The hosts of a fleet (fleet.enabled): each broker host's id (its broker-id) and the URL of
-- its link, where the other hosts carry the requests their fronts admit for the clusters it
-- runs (broker/src/front/link.rs), and its tunnel endpoint (`{"endpoint": "<hex>", "addrs":
-- [...]}`), which nodes' identities list so that a node reaches whichever host runs its
-- cluster. Written by each host at start; `seen_at` is Unix ms.
CREATE TABLE fleet_hosts (
    id TEXT PRIMARY KEY,
    link TEXT NOT NULL,
    tunnel TEXT NOT NULL,
    seen_at BIGINT NOT NULL
);
