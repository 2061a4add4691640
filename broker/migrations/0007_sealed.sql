-- A cluster's CA material sealed under the operator's key (store.key_file, broker/src/vault):
-- one row per kept file (`path` relative to the cluster's directory), so that the store is its
-- home and a host's disk holds copies. `key_id` names the key it was sealed under.
CREATE TABLE sealed_files (
    cluster TEXT NOT NULL,
    path TEXT NOT NULL,
    key_id TEXT NOT NULL,
    sealed TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (cluster, path)
);
