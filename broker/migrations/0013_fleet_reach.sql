-- Which host of a fleet last reached which (broker/src/cluster/reach.rs): each host tries
-- every live peer's public address once a renewal period and records its successes here
-- (`reached_at`: the store's clock, Unix ms). A host no live peer reached while they reached each
-- other is cut off from its users, and gives its clusters up (broker/core/src/reach.rs).
CREATE TABLE fleet_reach (
    prober TEXT NOT NULL,
    target TEXT NOT NULL,
    reached_at BIGINT NOT NULL,
    PRIMARY KEY (prober, target)
);
