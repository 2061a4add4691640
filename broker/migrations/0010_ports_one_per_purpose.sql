-- A cluster has one port per purpose. Without this, two hosts of a fleet that leased a new
-- cluster's ports at once (its creator, and a host that began following it as it appeared)
-- could each insert their own: the owner's apiserver listened on one "api" port while the
-- tunnel dialled the other (CI, 2026-12-06: every node stream of the cluster refused).
-- Duplicates a store may hold already keep their lowest port, the one readers found first.
DELETE FROM ports WHERE port NOT IN (SELECT MIN(port) FROM ports GROUP BY cluster, purpose);
CREATE UNIQUE INDEX ports_cluster_purpose ON ports (cluster, purpose);
