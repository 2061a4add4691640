-- Hibernation (docs/hibernation.md): since when a cluster's control plane has been stopped
-- while idle (NULL while awake), and its own idle time before that happens in seconds
-- (0: never; NULL: the broker's `clusters.hibernate_after`).
ALTER TABLE clusters ADD COLUMN hibernating_since BIGINT;
ALTER TABLE clusters ADD COLUMN hibernate_after_secs BIGINT;
-- What keeps the cluster's objects: `etcd` or `kine` (SQLite through the etcd API); NULL:
-- made before there was a choice, etcd.
ALTER TABLE clusters ADD COLUMN datastore TEXT;
