-- Open to the internet (docs/security.md).

-- Every DID that owns clusters or was admitted by an invite: how many clusters it has now
-- (the per-DID limit is one conditional UPDATE of this row, so concurrent creates cannot
-- pass it), and how it was admitted (NULL: by the allow list or open registration, which
-- are checked at each create).
CREATE TABLE accounts (
    did TEXT PRIMARY KEY,
    clusters BIGINT NOT NULL,
    admitted_via TEXT,
    created_at BIGINT NOT NULL
);
INSERT INTO accounts (did, clusters, created_at)
    SELECT owner, COUNT(*), MIN(created_at) FROM clusters WHERE owner IS NOT NULL GROUP BY owner;

-- Counts kept beside the rows they count, for limits checked and taken in one UPDATE:
-- `user_clusters`, the clusters users own (the global cap).
CREATE TABLE counters (
    name TEXT PRIMARY KEY,
    n BIGINT NOT NULL
);
INSERT INTO counters (name, n)
    SELECT 'user_clusters', COUNT(*) FROM clusters WHERE owner IS NOT NULL;

-- Invites the operator made (`socialweb-broker invite create`); a code is `<id>.<secret>`
-- and only the secret's SHA-256 is kept. Used once.
CREATE TABLE invites (
    id TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    note TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    used_by TEXT,
    used_at BIGINT,
    revoked_at BIGINT
);

-- A cluster's directory under `<state_dir>/clusters`, never reused by a later cluster of
-- the same name (its CA keys must not outlive it); NULL: made before this, at `<name>`.
ALTER TABLE clusters ADD COLUMN dir TEXT;

-- The SHA-256 of the users CA a certificate was signed by: the front admits a certificate
-- only for the cluster whose CA that is. NULL: issued before this.
ALTER TABLE certificates ADD COLUMN ca_sha256 TEXT;
CREATE INDEX certificates_not_after ON certificates (not_after);

-- The nonce sweep deletes by expiry.
CREATE INDEX token_nonces_expires ON token_nonces (expires_at);
