-- The broker's store, in the subset of SQL that SQLite and PostgreSQL share: BIGINT for every
-- integer (times are Unix milliseconds), TEXT for everything else, no autoincrement (ids are
-- chosen by the broker before it writes).

CREATE TABLE clusters (
    name TEXT PRIMARY KEY,
    -- active | deleting
    state TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    -- When intent was last non-zero: the hold survives a restart.
    last_intent_at BIGINT NOT NULL,
    -- Node names are <cluster>-<n>; n only grows, so a name is never reused.
    next_node BIGINT NOT NULL
);

-- Loopback ports leased to clusters' control planes.
CREATE TABLE ports (
    port BIGINT PRIMARY KEY,
    cluster TEXT NOT NULL,
    purpose TEXT NOT NULL
);
CREATE INDEX ports_cluster ON ports (cluster);

-- One row per node the broker rents, written before each step is acted on.
CREATE TABLE provisions (
    id TEXT PRIMARY KEY,
    cluster TEXT NOT NULL,
    node TEXT NOT NULL,
    -- planned | rfp_sent | accepted | booting | running | joined | releasing | released | failed
    state TEXT NOT NULL,
    rfp_id TEXT NOT NULL,
    bid_id TEXT,
    lease_id TEXT NOT NULL,
    provider TEXT,
    token_id TEXT NOT NULL,
    token_secret TEXT NOT NULL,
    mesh_key TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    reason TEXT,
    attempts BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX provisions_cluster ON provisions (cluster, state);

-- Every scale decision that changed something, with its reason.
CREATE TABLE decisions (
    id TEXT PRIMARY KEY,
    cluster TEXT NOT NULL,
    at BIGINT NOT NULL,
    action TEXT NOT NULL,
    target BIGINT NOT NULL,
    nodes BIGINT NOT NULL,
    intent BIGINT NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX decisions_cluster ON decisions (cluster, at);
