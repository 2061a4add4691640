-- A node's bootstrap token is approved once (docs/security.md, "Nodes' credentials"): the
-- first client certificate request made with it claims it here, in the same store every
-- host of a fleet shares, before the broker approves; any later request with it is denied.
CREATE TABLE bootstrap_uses (
    cluster TEXT NOT NULL,
    token_id TEXT NOT NULL,
    node TEXT NOT NULL,
    csr TEXT NOT NULL,
    at BIGINT NOT NULL,
    PRIMARY KEY (cluster, token_id)
);
