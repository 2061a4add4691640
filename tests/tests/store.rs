//! The broker's store against both backends it supports, with the same queries: SQLite (a
//! file) and a real PostgreSQL server started by the test. Then the daemon itself on
//! PostgreSQL: a cluster created, listed and deleted; and a cluster whose objects are in a
//! PostgreSQL database of its own (`--datastore postgres`).

use std::time::{Duration, SystemTime};

use socialweb_broker::store::{NewCluster, Store};
use socialweb_broker_core::{CertRecord, DecisionRow, Provision, Step, millis};
use testbed::Netns;
use testbed::broker::{Broker, BrokerOptions};
use testbed::postgres::Postgres;
use testbed::tmp::TempDir;

/// An operator's cluster (counted, never refused).
fn op(name: &str) -> NewCluster<'_> {
    NewCluster {
        name,
        owner: None,
        dir: name,
        limits: None,
        hibernate_after_secs: None,
        datastore: "etcd",
    }
}

fn provision(cluster: &str, node: &str) -> Provision {
    Provision {
        id: format!("id-{node}"),
        cluster: cluster.into(),
        node: node.into(),
        state: Step::Planned,
        rfp_id: format!("rfp-{node}"),
        bid_id: None,
        lease_id: format!("lease-{node}"),
        provider: None,
        token_id: "abcdef".into(),
        token_secret: "0123456789abcdef".into(),
        mesh_key: "11".repeat(32),
        endpoint: "e".into(),
        node_ip: Some("10.41.0.1".parse().unwrap()),
        spec: Some(socialweb_market::NodeSpec {
            vcpu: 2,
            mem_mib: 4096,
            disk_mib: 20480,
        }),
        // Written with the provision, read back after a restart (migration 0012).
        topology: socialweb_market::Topology {
            region: Some("eu".into()),
            zone: Some("eu-1a".into()),
        },
        reason: None,
        attempts: 0,
        created_at: 1,
        updated_at: 1,
    }
}

/// The same checks on any backend, with a reopen of the same store between (as a restart).
async fn exercise(url: &str) {
    let s = Store::open(url).await.unwrap();
    let now = SystemTime::now();
    let c = s.create_cluster(&op("demo"), now).await.unwrap();
    assert_eq!((c.state.as_str(), c.next_node), ("active", 1));
    assert_eq!(c.dir.as_deref(), Some("demo"));
    let e = s.create_cluster(&op("demo"), now).await.unwrap_err();
    assert!(e.to_string().contains("exists already"), "{e}");
    assert_eq!(s.next_node_name("demo").await.unwrap(), "demo-1");
    assert_eq!(s.next_node_name("demo").await.unwrap(), "demo-2");
    let ports = s
        .lease_ports("demo", &["api", "etcd"], 20000, 10, |_| true)
        .await
        .unwrap();
    assert_eq!(ports.len(), 2);
    assert_ne!(ports[0].1, ports[1].1);
    s.create_cluster(&op("other"), now).await.unwrap();
    let other = s
        .lease_ports("other", &["api"], 20000, 10, |p| p != 20002)
        .await
        .unwrap();
    assert!(
        !ports.iter().any(|(_, p)| *p == other[0].1),
        "ports are not shared"
    );
    assert_ne!(other[0].1, 20002, "a busy port is skipped");
    let mut p = provision("demo", "demo-1");
    s.insert_provision(&p, None).await.unwrap();
    p.state = Step::Accepted;
    p.bid_id = Some("bid".into());
    p.updated_at = 5;
    s.update_provision(&p, None).await.unwrap();
    s.record_decision(&DecisionRow {
        cluster: "demo".into(),
        at: millis(now),
        action: "Provision".into(),
        target: 1,
        nodes: 0,
        intent: 1,
        reason: "Provision: intent and no node".into(),
    })
    .await
    .unwrap();
    s.set_last_intent("demo", now + Duration::from_secs(5))
        .await
        .unwrap();
    let owned = NewCluster {
        owner: Some("did:key:zDnae"),
        ..op("owned")
    };
    s.create_cluster(&owned, now).await.unwrap();
    // Hibernation: the state and its time in one write, and a cluster's own idle time.
    s.set_hibernating("owned", Some(now), None).await.unwrap();
    s.set_hibernate_after("owned", Some(0)).await.unwrap();
    let cert = CertRecord {
        serial: "0a1b".into(),
        cluster: "demo".into(),
        did: "did:key:zDnae".into(),
        not_after: None,
        created_at: millis(now),
        revoked_at: None,
        ca_sha256: Some("ab".repeat(32)),
    };
    s.insert_certificate(&cert).await.unwrap();
    assert!(s.use_nonce("did:key:zDnae n1", 10).await.unwrap());
    assert!(
        !s.use_nonce("did:key:zDnae n1", 10).await.unwrap(),
        "a nonce is accepted once"
    );
    s.close().await;

    // A restart finds everything as it was written.
    let s = Store::open(url).await.unwrap();
    let got = s.provisions(Some("demo")).await.unwrap();
    assert_eq!(got, vec![p.clone()]);
    assert_eq!(got[0].token_secret, "0123456789abcdef");
    assert_eq!(s.ports("demo").await.unwrap(), ports, "ports stay leased");
    assert_eq!(
        s.decisions("demo").await.unwrap()[0].reason,
        "Provision: intent and no node"
    );
    assert_eq!(
        s.cluster("demo").await.unwrap().unwrap().last_intent_at,
        millis(now + Duration::from_secs(5))
    );
    assert_eq!(
        s.next_node_name("demo").await.unwrap(),
        "demo-3",
        "names are never reused"
    );
    assert_eq!(
        s.cluster("owned").await.unwrap().unwrap().owner.as_deref(),
        Some("did:key:zDnae")
    );
    let owned = s.cluster("owned").await.unwrap().unwrap();
    assert_eq!(
        (
            owned.state.as_str(),
            owned.hibernating_since,
            owned.hibernate_after_secs
        ),
        ("hibernating", Some(millis(now)), Some(0)),
        "hibernation survives a restart"
    );
    s.set_hibernating("owned", None, None).await.unwrap();
    let owned = s.cluster("owned").await.unwrap().unwrap();
    assert_eq!(
        (owned.state.as_str(), owned.hibernating_since),
        ("active", None)
    );
    s.set_cluster_state("owned", socialweb_broker_core::ClusterPhase::Deleting)
        .await
        .unwrap();
    s.set_hibernating("owned", Some(now), None).await.unwrap();
    assert_eq!(
        s.cluster("owned").await.unwrap().unwrap().state.as_str(),
        "deleting",
        "a deletion is never undone by hibernating"
    );
    assert_eq!(s.certificates().await.unwrap(), vec![cert.clone()]);
    let revoked = s.revoke_certificate("0a1b", 7).await.unwrap().unwrap();
    assert_eq!(revoked.revoked_at, Some(7));
    let again = s.revoke_certificate("0a1b", 9).await.unwrap().unwrap();
    assert_eq!(
        again.revoked_at,
        Some(7),
        "the first revocation's time stays"
    );
    assert!(s.revoke_certificate("ffff", 9).await.unwrap().is_none());
    assert!(
        !s.use_nonce("did:key:zDnae n1", 10).await.unwrap(),
        "nonces survive a restart"
    );
    assert_eq!(
        s.sweep(11, 0).await.unwrap(),
        (1, 0),
        "an expired nonce is swept"
    );
    assert!(s.use_nonce("did:key:zDnae n1", 20).await.unwrap());
    s.delete_cluster("owned").await.unwrap();
    fleet_rows(&s).await;
    sealing(&s).await;
    // A bootstrap token is used once: its first CSR claims it, a repeat of that CSR (a
    // crash before its approval) finds its own claim, any other CSR is told which one won.
    assert_eq!(
        s.claim_bootstrap("demo", "demo-1", "abcdef", "csr-a", 1)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        s.claim_bootstrap("demo", "demo-1", "abcdef", "csr-a", 2)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        s.claim_bootstrap("demo", "demo-1", "abcdef", "csr-b", 3)
            .await
            .unwrap(),
        Some("csr-a".into())
    );
    s.delete_cluster("demo").await.unwrap();
    assert!(s.cluster("demo").await.unwrap().is_none());
    assert_eq!(
        s.claim_bootstrap("demo", "demo-1", "abcdef", "csr-c", 4)
            .await
            .unwrap(),
        None,
        "a deleted cluster's uses went with it"
    );
    assert_eq!(s.sealed_files("demo").await.unwrap(), 0);
    assert_eq!(
        s.owner("demo").await.unwrap().owner,
        None,
        "its lease went with it"
    );
    assert!(s.provisions(Some("demo")).await.unwrap().is_empty());
    assert!(s.ports("demo").await.unwrap().is_empty());
    assert!(
        s.certificates().await.unwrap().is_empty(),
        "a deleted cluster's certificates go with it"
    );
    assert_eq!(s.clusters().await.unwrap().len(), 1);
    s.close().await;
}

/// A fleet's leases (`crate::cluster::ownership`'s rows), on cluster `demo`, timed by the
/// store's own clock (no host's): a claim wins only over a lease expired more than the grace
/// or its own, bumps the fence, and a renewal, release or record by a host that lost the
/// lease changes nothing.
/// The first sealing of a file stays; a key's rotation lists the rows under other keys and
/// seals each again only if it is still as read.
async fn sealing(s: &Store) {
    s.insert_sealed_file("demo", "pki/ca.key", "k1", "v1:first", 1)
        .await
        .unwrap();
    s.insert_sealed_file("demo", "pki/ca.key", "k1", "v1:second", 2)
        .await
        .unwrap();
    assert_eq!(
        s.sealed_file("demo", "pki/ca.key").await.unwrap(),
        Some(("k1".into(), "v1:first".into())),
        "the first sealing of a file stays"
    );
    let before = s.sealed_count().await.unwrap();
    let others = s.sealed_not_under("k2").await.unwrap();
    assert!(
        others
            .iter()
            .any(|r| r[..3] == ["demo", "pki/ca.key", "k1"]),
        "{others:?}"
    );
    assert!(
        !s.reseal("demo", "pki/ca.key", ("k1", "v1:stale"), ("k2", "v1:x"))
            .await
            .unwrap(),
        "a row changed since it was read is left"
    );
    assert!(
        s.reseal("demo", "pki/ca.key", ("k1", "v1:first"), ("k2", "v1:again"))
            .await
            .unwrap()
    );
    assert_eq!(
        s.sealed_file("demo", "pki/ca.key").await.unwrap(),
        Some(("k2".into(), "v1:again".into()))
    );
    assert!(
        s.sealed_not_under("k2")
            .await
            .unwrap()
            .iter()
            .all(|r| r[1] != "pki/ca.key" || r[0] != "demo")
    );
    assert_eq!(s.sealed_count().await.unwrap(), before, "nothing added");
}

async fn leases(s: &Store) {
    let a = s.claim_owner("demo", "a", 60_000, 0).await.unwrap();
    assert_eq!((a.host.as_str(), a.fence), ("a", 1));
    let seen = s.owner("demo").await.unwrap();
    let left = seen.owner.as_ref().unwrap().expires_at - seen.now;
    assert!((55_000..=60_000).contains(&left), "{left} ms left");
    // b cannot take a lease that has not expired, whatever b's clock says.
    let held = s.claim_owner("demo", "b", 60_000, 0).await.unwrap();
    assert_eq!((held.host.as_str(), held.fence), ("a", 1));
    let renewed = s
        .renew_owners("a", &[("demo".into(), 1)], 300)
        .await
        .unwrap();
    assert!(renewed.contains("demo"));
    assert_eq!(s.owned_by("a").await.unwrap(), 1);
    // Within the grace after expiry it is still a's; past it, b takes it, the fence grows,
    // and a's renewal and release no longer match.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(s.owned_by("a").await.unwrap(), 0);
    let held = s.claim_owner("demo", "b", 60_000, 60_000).await.unwrap();
    assert_eq!(
        (held.host.as_str(), held.fence),
        ("a", 1),
        "within the grace"
    );
    let b = s.claim_owner("demo", "b", 60_000, 100).await.unwrap();
    assert_eq!((b.host.as_str(), b.fence), ("b", 2));
    let renewed = s
        .renew_owners("a", &[("demo".into(), 1)], 60_000)
        .await
        .unwrap();
    assert!(!renewed.contains("demo"));
    s.release_owner("demo", "a", 1).await.unwrap();
    assert_eq!(s.owner("demo").await.unwrap().owner, Some(b));
    // Batched renewals: each lease under its own fence, a stale one not.
    let renewed = s
        .renew_owners("b", &[("demo".into(), 2), ("other".into(), 1)], 60_000)
        .await
        .unwrap();
    assert_eq!(
        renewed,
        std::collections::HashSet::from(["demo".to_string()])
    );
    let stale = s.renew_owners("a", &[("demo".into(), 1)], 60_000).await;
    assert!(stale.unwrap().is_empty());
    let (all, now) = s.owners().await.unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(now > 1_700_000_000_000, "the store's clock: {now}");
    records_are_fenced(s).await;
    // Its holder claims it again at once (a restarted broker), with a new fence.
    let again = s.claim_owner("demo", "b", 60_000, 60_000).await.unwrap();
    assert_eq!((again.host.as_str(), again.fence), ("b", 3));
    s.release_owner("demo", "b", 3).await.unwrap();
    let revived = s.renew_owners("b", &[("demo".into(), 3)], 60_000).await;
    assert!(
        revived.unwrap().is_empty(),
        "a released lease is not renewed again"
    );
    assert_eq!(
        s.owner("demo").await.unwrap().owner.map(|o| o.expires_at),
        Some(0)
    );
    assert_eq!(s.owned_by("b").await.unwrap(), 0);
    let c = s.claim_owner("demo", "c", 60_000, 1).await.unwrap();
    assert_eq!(
        (c.host.as_str(), c.fence),
        ("c", 4),
        "a released lease is anyone's, and its fence still grows"
    );
}

/// A fleet's rows: leases, then hosts and who reached whom.
async fn fleet_rows(s: &Store) {
    leases(s).await;
    reachability(s).await;
}

/// A fleet's hosts and who reached whom (`crate::cluster::reach`'s rows), by the store's
/// clock: live hosts are those seen within the window, a success recorded again moves on.
async fn reachability(s: &Store) {
    let empty = s.reach(Duration::from_secs(10)).await.unwrap();
    assert!(
        empty.live.is_empty() && empty.reached.is_empty(),
        "{empty:?}"
    );
    assert!(
        empty.now > 1_700_000_000_000,
        "the store's clock: {}",
        empty.now
    );
    s.register_host("h1", "https://198.18.0.11:6445", "{}")
        .await
        .unwrap();
    s.register_host("h2", "https://198.18.0.12:6445", "{}")
        .await
        .unwrap();
    s.reached("h1", &["h2".to_string()]).await.unwrap();
    s.reached("h2", &[]).await.unwrap();
    let first = s.reach(Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        first.live,
        [
            ("h1".to_string(), "https://198.18.0.11:6445".to_string()),
            ("h2".to_string(), "https://198.18.0.12:6445".to_string())
        ]
    );
    assert_eq!(first.reached.len(), 1, "{first:?}");
    let (r, at) = (&first.reached[0], first.reached[0].at);
    assert_eq!((r.prober.as_str(), r.target.as_str()), ("h1", "h2"));
    assert!(
        (first.now - 5_000..=first.now).contains(&at),
        "{at} vs {}",
        first.now
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.reached("h1", &["h2".to_string()]).await.unwrap();
    s.heartbeat("h1").await.unwrap();
    let again = s.reach(Duration::from_millis(200)).await.unwrap();
    assert_eq!(again.reached.len(), 1, "one row per pair");
    assert!(again.reached[0].at >= at + 250, "moved on: {again:?}");
    assert_eq!(
        again
            .live
            .iter()
            .map(|(id, _)| id.as_str())
            .collect::<Vec<_>>(),
        ["h1"],
        "h2, not seen for 300 ms, is not live within 200 ms"
    );
}

/// Under `demo`'s lease (b's, fence 2, taken from a's fence 1): a's record of the cluster
/// under its old fence is refused; b's is written.
async fn records_are_fenced(s: &Store) {
    let fence = |host: &str, fence| socialweb_broker::store::Fence {
        host: host.into(),
        fence,
    };
    let stale = s
        .set_hibernating("demo", Some(SystemTime::now()), Some(&fence("a", 1)))
        .await
        .unwrap_err();
    assert!(format!("{stale:#}").contains("fence 1"), "{stale:#}");
    assert_eq!(
        s.cluster("demo").await.unwrap().unwrap().state.as_str(),
        "active"
    );
    s.set_hibernating("demo", None, Some(&fence("b", 2)))
        .await
        .unwrap();
    provisions_are_fenced(s, &fence("a", 1), &fence("b", 2)).await;
}

/// A stale owner (`stale`) rents nothing and moves no node of the cluster the current one
/// (`now`) runs: its new provision and its step are refused, and it is told before a
/// release at a provider; the current owner's are written.
async fn provisions_are_fenced(
    s: &Store,
    stale: &socialweb_broker::store::Fence,
    now: &socialweb_broker::store::Fence,
) {
    let mut p = provision("demo", "demo-fenced");
    p.id = "fenced".into();
    let e = s.insert_provision(&p, Some(stale)).await.unwrap_err();
    assert!(
        format!("{e:#}").contains("no longer this host's (fence 1)"),
        "{e:#}"
    );
    let mine = |s: Vec<socialweb_broker_core::Provision>| s.into_iter().any(|x| x.id == "fenced");
    assert!(
        !mine(s.provisions(Some("demo")).await.unwrap()),
        "not written"
    );
    s.insert_provision(&p, Some(now)).await.unwrap();
    assert!(mine(s.provisions(Some("demo")).await.unwrap()));
    p.state = Step::Releasing;
    let e = s.update_provision(&p, Some(stale)).await.unwrap_err();
    assert!(format!("{e:#}").contains("fence 1"), "{e:#}");
    let kept = s.provisions(Some("demo")).await.unwrap();
    let kept = kept.iter().find(|x| x.id == "fenced").unwrap();
    assert_eq!(kept.state, Step::Planned, "the stale step not written");
    s.update_provision(&p, Some(now)).await.unwrap();
    assert!(!s.holds("demo", stale).await.unwrap());
    assert!(s.holds("demo", now).await.unwrap());
}

/// The attack on the per-DID and global limits: many createCluster calls at once, on the
/// store's own connections (PostgreSQL: five, each its own transaction). Exactly the limit
/// get in; a delete gives its place back.
async fn concurrent_creates(url: &str) {
    let s = Store::open(url).await.unwrap();
    let now = SystemTime::now();
    let names: Vec<String> = (0..20).map(|i| format!("race-{i}")).collect();
    let tries = names.iter().map(|n| {
        let s = s.clone();
        async move {
            let c = NewCluster {
                name: n,
                owner: Some("did:key:zMallory"),
                dir: n,
                limits: Some((3, 100)),
                hibernate_after_secs: None,
                datastore: "etcd",
            };
            s.create_cluster(&c, now).await
        }
    });
    let got = futures_util::future::join_all(tries).await;
    let made: Vec<_> = got.iter().filter(|r| r.is_ok()).collect();
    assert_eq!(made.len(), 3, "the per-DID limit of 3 held: {got:?}");
    for e in got.iter().filter_map(|r| r.as_ref().err()) {
        assert!(
            e.to_string()
                .contains("the most this broker allows one DID"),
            "{e}"
        );
    }
    // The global cap across DIDs: 3 from mallory are in; 2 more of anyone's fit under 5.
    let others = (0..10).map(|i| {
        let s = s.clone();
        async move {
            let (name, did) = (format!("g-{i}"), format!("did:key:zSybil{i}"));
            let c = NewCluster {
                name: &name,
                owner: Some(&did),
                dir: &name,
                limits: Some((3, 5)),
                hibernate_after_secs: None,
                datastore: "etcd",
            };
            s.create_cluster(&c, now).await.map(|_| ())
        }
    });
    let got = futures_util::future::join_all(others).await;
    assert_eq!(got.iter().filter(|r| r.is_ok()).count(), 2, "{got:?}");
    assert_eq!(s.user_clusters().await.unwrap(), 5);
    let first = made[0].as_ref().unwrap().name.clone();
    s.delete_cluster(&first).await.unwrap();
    assert_eq!(
        s.user_clusters().await.unwrap(),
        4,
        "a delete gives its place back"
    );
    let again = NewCluster {
        name: "race-again",
        owner: Some("did:key:zMallory"),
        dir: "race-again",
        limits: Some((3, 5)),
        hibernate_after_secs: None,
        datastore: "etcd",
    };
    s.create_cluster(&again, now).await.unwrap();

    // One invite, redeemed by ten DIDs at once: one is admitted.
    let secret = "f".repeat(64);
    s.create_invite("0a1b2c3d", &secret, "for one", millis(now) + 60_000, now)
        .await
        .unwrap();
    let redeem = (0..10).map(|i| {
        let (s, secret) = (s.clone(), secret.clone());
        async move {
            let did = format!("did:key:zGuest{i}");
            s.redeem_invite(&did, "0a1b2c3d", &secret, now)
                .await
                .unwrap()
        }
    });
    let won = futures_util::future::join_all(redeem).await;
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
    let used = s.invite("0a1b2c3d").await.unwrap().unwrap();
    assert!(used.used_by.is_some());
    assert!(s.admitted(used.used_by.as_deref().unwrap()).await.unwrap());
    assert!(!s.admitted("did:key:zMallory").await.unwrap());
    s.close().await;
}

/// Two hosts of a fleet leasing a new cluster's ports at once (its creator, and a host that
/// began following it as it appeared), each on its own connections: both end with the same
/// port for each purpose, and the store holds one. (CI, 2026-12-06: each host leased its
/// own "api" port; the owner's apiserver listened on one, the tunnel dialled the other.)
async fn concurrent_port_leases(url: &str) {
    const PURPOSES: [&str; 6] = ["api", "etcd-client", "etcd-peer", "cm", "sched", "guard"];
    let (a, b) = (
        Store::open(url).await.unwrap(),
        Store::open(url).await.unwrap(),
    );
    for round in 0..32 {
        let name = format!("leased-{round}");
        a.create_cluster(&op(&name), SystemTime::now())
            .await
            .unwrap();
        let lease = |s: &Store| {
            let (s, name) = (s.clone(), name.clone());
            tokio::spawn(async move {
                s.lease_ports(&name, &PURPOSES, 30000, 1000, |_| true)
                    .await
                    .unwrap()
            })
        };
        let (got_a, got_b) = tokio::join!(lease(&a), lease(&b));
        let (mut got_a, mut got_b) = (got_a.unwrap(), got_b.unwrap());
        got_a.sort();
        got_b.sort();
        assert_eq!(got_a, got_b, "round {round}: both hosts use the same ports");
        let mut kept = a.ports(&name).await.unwrap();
        kept.sort();
        assert_eq!(
            kept, got_a,
            "round {round}: one port per purpose in the store"
        );
    }
    a.close().await;
    b.close().await;
}

#[test]
fn the_store_keeps_the_same_records_on_sqlite_and_postgresql() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = TempDir::new("store").unwrap();
    rt.block_on(exercise(&format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("b.db").display()
    )));
    rt.block_on(concurrent_creates(&format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("race.db").display()
    )));
    rt.block_on(concurrent_port_leases(&format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("ports.db").display()
    )));

    let ns = Netns::new("pg").unwrap();
    let pg = Postgres::start(&ns).unwrap();
    // The store client runs in the namespace where PostgreSQL listens on loopback.
    ns.run(|| {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(exercise(&pg.url));
        rt.block_on(concurrent_creates(&pg.url));
        rt.block_on(concurrent_port_leases(&pg.url));
    })
    .unwrap();
}

#[test]
fn the_daemon_runs_on_postgresql() {
    let world = testbed::world::World::new(0).unwrap();
    let pg = Postgres::start(&world.operator).unwrap();
    let b = Broker::start(
        &world,
        BrokerOptions {
            store_url: Some(pg.url.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let c = b.cli_json(&["cluster", "create", "pg"]).unwrap();
    assert_eq!(c["state"], "ready", "{c}\n{}", b.diagnostics());
    let list = b.cli_json(&["cluster", "list"]).unwrap();
    assert_eq!(list[0]["name"], "pg");
    assert_eq!(
        b.kubectl("pg", &["get", "--raw", "/readyz"])
            .unwrap()
            .trim(),
        "ok"
    );
    b.cli(&["cluster", "delete", "pg"]).unwrap();
    assert_eq!(
        b.cli_json(&["cluster", "list"]).unwrap(),
        serde_json::json!([])
    );
}

#[test]
fn a_cluster_on_postgresql_keeps_its_objects_in_a_database_of_its_own() {
    let world = testbed::world::World::new(0).unwrap();
    let ns = &world.operator;
    let pg = Postgres::start(ns).unwrap();
    let b = Broker::start(
        &world,
        BrokerOptions {
            clusters: socialweb_broker::config::ClusterDefaults {
                postgres_url: Some(pg.url.clone()),
                hibernate_after: Duration::from_secs(3),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    let databases = || {
        testbed::postgres::query(
            ns,
            "postgres",
            "select datname from pg_database where datname like 'sw\\_%' order by 1",
        )
        .unwrap()
    };
    let c = b
        .cli_json(&["cluster", "create", "objs", "--datastore", "postgres"])
        .unwrap();
    assert_eq!(
        (&c["state"], &c["datastore"]),
        (&"ready".into(), &"postgres".into()),
        "{c}\n{}",
        b.diagnostics()
    );
    let dir = b.cluster_dir("objs");
    let db = socialweb_broker::control_plane::postgres::database_name(
        dir.file_name().unwrap().to_str().unwrap(),
    );
    assert_eq!(databases(), db, "one database, the cluster's");
    assert!(!dir.join("kine").exists(), "no SQLite beside it");
    b.kubectl(
        "objs",
        &["create", "configmap", "kept", "--from-literal=k=v"],
    )
    .unwrap();
    let rows = testbed::postgres::query(
        ns,
        &db,
        "select count(*) from kine where name = '/registry/configmaps/default/kept'",
    )
    .unwrap();
    assert_eq!(
        rows, "1",
        "the ConfigMap is a row of the cluster's database"
    );
    // Its control plane stops and starts again from the database alone.
    b.wait_state("objs", "hibernating", Duration::from_secs(60));
    let woke = b
        .cli_json(&["cluster", "wake", "objs", "--wait", "60s"])
        .unwrap();
    assert_eq!(woke["state"], "ready", "{woke}");
    let v = b
        .kubectl(
            "objs",
            &["get", "configmap", "kept", "-o", "jsonpath={.data.k}"],
        )
        .unwrap();
    assert_eq!(v, "v", "the object outlived the hibernation");
    // A backup says what it does not hold.
    let to = TempDir::new("pg-backup").unwrap();
    let to = to.path().join("b");
    let out = b
        .operator("backup", &["--to", to.to_str().unwrap(), "--json"])
        .unwrap();
    assert!(
        out.contains(&db),
        "the backup names the database it leaves to pg_dump: {out}"
    );
    b.cli(&["cluster", "delete", "objs"]).unwrap();
    assert_eq!(databases(), "", "the database went with the cluster");
    // Without a server to put it on, a postgres cluster is refused, naming what to set.
    drop(b);
    let b = Broker::start(&world, BrokerOptions::default()).unwrap();
    let e = b
        .cli(&["cluster", "create", "nope", "--datastore", "postgres"])
        .unwrap_err();
    assert!(format!("{e:#}").contains("clusters.postgres_url"), "{e:#}");
}

#[test]
fn while_postgresql_is_down_its_clusters_refuse_writes_and_lose_nothing() {
    let world = testbed::world::World::new(0).unwrap();
    let ns = &world.operator;
    let mut pg = Postgres::start(ns).unwrap();
    let b = Broker::start(
        &world,
        BrokerOptions {
            clusters: socialweb_broker::config::ClusterDefaults {
                postgres_url: Some(pg.url.clone()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    for (name, datastore) in [("far", "postgres"), ("near", "kine")] {
        let c = b
            .cli_json(&["cluster", "create", name, "--datastore", datastore])
            .unwrap();
        assert_eq!(c["state"], "ready", "{c}\n{}", b.diagnostics());
    }
    let create = |cluster: &str, name: &str| {
        b.kubectl(
            cluster,
            &[
                "--request-timeout=10s",
                "create",
                "configmap",
                name,
                "--from-literal=k=v",
            ],
        )
    };
    create("far", "before").unwrap();
    pg.stop().unwrap();
    let down = std::time::Instant::now();
    let e = create("far", "during").unwrap_err();
    eprintln!("a write while PostgreSQL is down: {e:#}");
    // The rest of the broker is not its database: the SQLite cluster takes writes.
    create("near", "during").unwrap();
    // An outage longer than a blip: kine's connections are gone, not just interrupted.
    std::thread::sleep(Duration::from_secs(20).saturating_sub(down.elapsed()));
    let e = create("far", "later").unwrap_err();
    eprintln!("{:?} into the outage: {e:#}", down.elapsed());
    pg.start_again(ns).unwrap();
    eprintln!("PostgreSQL down for {:?}", down.elapsed());
    let back = std::time::Instant::now();
    testbed::k8s::wait_for(
        "writes to the PostgreSQL cluster again",
        Duration::from_secs(120),
        || Ok(create("far", "after").ok().map(|_| ())),
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    eprintln!(
        "writes again {:?} after PostgreSQL was back",
        back.elapsed()
    );
    let v = b
        .kubectl(
            "far",
            &["get", "configmap", "before", "-o", "jsonpath={.data.k}"],
        )
        .unwrap();
    assert_eq!(v, "v", "what was written before the outage is there");
    b.wait_state("far", "ready", Duration::from_secs(60));
}

/// `socialweb-broker store-key FILE --json`: a new key, its id.
fn store_key(file: &std::path::Path) -> String {
    let out = std::process::Command::new(testbed::cni::workspace_bin("socialweb-broker"))
        .args(["store-key", "--json"])
        .arg(file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["key_id"].as_str().unwrap().to_string()
}

/// With `store.key_file`, a cluster's CAs live in the store, sealed: a broker whose disk
/// lost every cluster directory serves its clusters again, and everything issued before
/// (a user's kubeconfig, a ServiceAccount token, the CA nodes pin) is still good; with
/// another key the store's rows do not open and the cluster says why.
#[test]
fn a_host_that_lost_its_disk_serves_its_clusters_from_postgresql_with_the_same_cas() {
    let world = testbed::world::World::new(0).unwrap();
    let ns = &world.operator;
    let pg = Postgres::start(ns).unwrap();
    let keys = TempDir::new("store-key").unwrap();
    let key_file = keys.path().join("store.key");
    let first_key = store_key(&key_file);
    let mut b = Broker::start(
        &world,
        BrokerOptions {
            store_url: Some(pg.url.clone()),
            store_key_file: Some(key_file.clone()),
            clusters: socialweb_broker::config::ClusterDefaults {
                datastore: socialweb_broker::config::DatastoreKind::Postgres,
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    let user = keys.path().join("user.key");
    let out = std::process::Command::new(testbed::cni::workspace_bin("socialweb-broker"))
        .args(["api", "keygen", "--out"])
        .arg(&user)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let created = b
        .api(&user, &["create-cluster", "kept", "--wait", "150s"])
        .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    assert_eq!(created["state"], "ready", "{created}");
    let kc = keys.path().join("kept.kubeconfig");
    b.api(
        &user,
        &["kubeconfig", "kept", "--out", kc.to_str().unwrap()],
    )
    .unwrap();
    let kubectl = |b: &Broker<'_>, args: &[&str]| {
        let o = b.kubectl_as(&kc, &[], args).output().unwrap();
        assert!(
            o.status.success(),
            "kubectl {args:?}: {o:?}\n{}",
            b.diagnostics()
        );
        String::from_utf8(o.stdout).unwrap()
    };
    kubectl(&b, &["create", "configmap", "kept", "--from-literal=k=v"]);
    let token = b
        .kubectl("kept", &["create", "token", "default", "--duration", "1h"])
        .unwrap();
    let dir = b.cluster_dir("kept");
    let ca = std::fs::read(dir.join("pki/ca.crt")).unwrap();
    let sealed = |sql: &str| testbed::postgres::query(ns, "broker", sql).unwrap();
    assert_eq!(
        sealed("select count(*) from sealed_files where cluster = 'kept'"),
        socialweb_broker::vault::kept().len().to_string()
    );
    assert_eq!(
        sealed(&format!(
            "select count(*) from sealed_files where sealed like '%PRIVATE KEY%' \
             or key_id <> '{first_key}'"
        )),
        "0",
        "every row sealed under the key, none in the clear"
    );

    // The host loses every cluster directory; its store and key remain.
    b.stop_broker().unwrap();
    served_again_without_its_disk(&mut b, &ca, &kubectl);
    let review = keys.path().join("review.json");
    std::fs::write(
        &review,
        serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token.trim()},
        })
        .to_string(),
    )
    .unwrap();
    let reviewed: serde_json::Value = serde_json::from_str(
        &b.kubectl(
            "kept",
            &["create", "-o", "json", "-f", review.to_str().unwrap()],
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        reviewed["status"]["authenticated"], true,
        "a ServiceAccount token issued before the loss is still valid: {reviewed}"
    );

    let rotated = rotate_the_key(&mut b, ns, &key_file, &first_key, &ca, &kubectl);

    // Another key: the rows do not open, nothing is made in their place.
    b.stop_broker().unwrap();
    std::fs::remove_dir_all(&b.paths.clusters).unwrap();
    std::fs::remove_file(&key_file).unwrap();
    let other_key = store_key(&key_file);
    b.start_broker().unwrap();
    let failed = b.wait_state("kept", "failed", Duration::from_secs(60));
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("store.key_file") && error.contains(&rotated) && error.contains(&other_key),
        "{failed}"
    );
    assert!(!b.cluster_dir("kept").join("pki/ca.key").exists());
}

/// The stopped broker, its cluster directories removed, started again: cluster `kept` is
/// ready with the CA nodes pin (`ca`, opened from the store), and the user's kubeconfig reads
/// its ConfigMap.
fn served_again_without_its_disk(
    b: &mut Broker<'_>,
    ca: &[u8],
    kubectl: &dyn Fn(&Broker<'_>, &[&str]) -> String,
) {
    std::fs::remove_dir_all(&b.paths.clusters).unwrap();
    b.start_broker().unwrap();
    b.wait_state("kept", "ready", Duration::from_secs(120));
    assert_eq!(
        std::fs::read(b.cluster_dir("kept").join("pki/ca.crt")).unwrap(),
        ca,
        "the CA nodes pin is the same"
    );
    assert_eq!(
        kubectl(b, &["get", "configmap", "kept", "-o", "jsonpath={.data.k}"]),
        "v",
        "the user's kubeconfig still works, and the object is there"
    );
}

/// Rotates `store.key_file` (docs/operations.md, "Rotating store.key_file"): the new key in
/// `key_file`, the old one in `previous_key_files`, the broker serving with both;
/// `store-rekey` while it runs seals every row under the new key; the old key gone, a host
/// that lost its disk serves the cluster with the same CA. The new key's id.
fn rotate_the_key(
    b: &mut Broker<'_>,
    ns: &testbed::netns::Netns,
    key_file: &std::path::Path,
    old_key: &str,
    ca: &[u8],
    kubectl: &dyn Fn(&Broker<'_>, &[&str]) -> String,
) -> String {
    let dir = key_file.parent().unwrap();
    let (old_file, new_file) = (dir.join("old.key"), dir.join("new.key"));
    std::fs::copy(key_file, &old_file).unwrap();
    let new_key = store_key(&new_file);
    b.stop_broker().unwrap();
    b.edit_config(|c| {
        c.store.key_file = Some(new_file.clone());
        c.store.previous_key_files = vec![old_file.clone()];
    })
    .unwrap();
    b.start_broker().unwrap();
    b.wait_state("kept", "ready", Duration::from_secs(120));
    let under = |key: &str| {
        testbed::postgres::query(
            ns,
            "broker",
            &format!("select count(*) from sealed_files where key_id = '{key}'"),
        )
        .unwrap()
    };
    let kept = socialweb_broker::vault::kept().len().to_string();
    assert_eq!(under(old_key), kept, "nothing sealed again by itself");

    // While the broker serves.
    let out = ns
        .command(&testbed::cni::workspace_bin("socialweb-broker").to_string_lossy())
        .args(["store-rekey", "--json", "--config"])
        .arg(&b.config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(said["key_id"], new_key.as_str(), "{said}");
    assert_eq!(said["resealed"][old_key].to_string(), kept, "{said}");
    assert_eq!((under(old_key), under(&new_key)), ("0".to_string(), kept));
    let again = ns
        .command(&testbed::cni::workspace_bin("socialweb-broker").to_string_lossy())
        .args(["store-rekey", "--json", "--config"])
        .arg(&b.config)
        .output()
        .unwrap();
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(
        again["resealed"],
        serde_json::json!({}),
        "once is enough: {again}"
    );
    kubectl(b, &["get", "configmap", "kept"]);

    // The old key gone: a host with an empty disk serves the same CA from the new rows.
    b.stop_broker().unwrap();
    b.edit_config(|c| c.store.previous_key_files.clear())
        .unwrap();
    std::fs::remove_file(&old_file).unwrap();
    served_again_without_its_disk(b, ca, kubectl);
    // Back in its usual place, for the next start.
    std::fs::copy(&new_file, key_file).unwrap();
    b.edit_config(|c| c.store.key_file = Some(key_file.to_path_buf()))
        .unwrap();
    new_key
}
