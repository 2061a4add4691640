-- Who runs each awake cluster in a fleet (fleet.enabled, broker/src/cluster/ownership.rs): the
-- host holding its lease until `expires_at` (Unix ms, the host's clock), renewed by it. `fence`
-- grows by one at every claim, so a renewal by a host that lost the lease matches no row.
-- A released lease (a hibernated cluster's) expires at once (0): no one owns it.
CREATE TABLE owners (
    cluster TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    fence BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
