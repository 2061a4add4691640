-- The way in (docs/api.md): who owns a cluster, every client certificate issued for a
-- cluster (so that the front admits only recorded, unrevoked ones), and the nonces of the
-- service-auth tokens already used (so that none is accepted twice).

-- The DID that owns a cluster; NULL for a cluster the operator made with the CLI and gave
-- to no one.
ALTER TABLE clusters ADD COLUMN owner TEXT;

CREATE TABLE certificates (
    -- The certificate's serial number, lowercase hex.
    serial TEXT PRIMARY KEY,
    cluster TEXT NOT NULL,
    did TEXT NOT NULL,
    -- Unix milliseconds; NULL: issued with no expiry.
    not_after BIGINT,
    created_at BIGINT NOT NULL,
    -- Unix milliseconds; NULL while it is good.
    revoked_at BIGINT
);
CREATE INDEX certificates_cluster ON certificates (cluster);
CREATE INDEX certificates_did ON certificates (did);

CREATE TABLE token_nonces (
    -- `<iss> <jti>`: a token's nonce, unique per issuer.
    nonce TEXT PRIMARY KEY,
    -- When the token expires; the row is useless after that and is swept.
    expires_at BIGINT NOT NULL
);
