//! `socialweb-broker backup` and `restore` (docs/operations.md, "Backup and restore"), end to
//! end with the real broker and control plane: a backup taken while the broker and its
//! cluster serve, with a node rented from a provider machine and a Pod on it, the state
//! directory destroyed, restored, and the same kubeconfigs (the admin's and a user's through
//! the front) answer with the object created before, and the node reconnects by itself: Ready
//! again, the same Pod never restarted, its logs and exec through the tunnel.

use std::time::{Duration, Instant};

use serde_json::Value;
use testbed::broker::{Broker, BrokerOptions};
use testbed::ticker::Ticker;
use testbed::tmp::TempDir;
use testbed::user::User;
use testbed::world::World;

fn step(t: Instant, what: &str) {
    eprintln!("[{:>6.1}s] {what}", t.elapsed().as_secs_f64());
}

#[test]
fn a_backup_taken_while_serving_brings_the_cluster_back_into_an_empty_state_directory() {
    let t = Instant::now();
    let world = World::new(1).unwrap();
    let mut b = Broker::start(
        &world,
        BrokerOptions {
            providers: 1,
            max_nodes: 1,
            // The node stays through the broker's absence.
            hold: Duration::from_secs(600),
            ..Default::default()
        },
    )
    .unwrap();
    let dir = TempDir::new("backup").unwrap();
    let u = User::new(&b, dir.path(), "keep");
    b.kubectl(
        "keep",
        &["create", "configmap", "kept", "--from-literal=k=v"],
    )
    .unwrap();
    let admin = dir.path().join("admin.kubeconfig");
    std::fs::copy(b.kubeconfig("keep"), &admin).unwrap();
    let ticker = Ticker::start(&b, &u, dir.path());
    step(
        t,
        &format!("a cluster with a ConfigMap, a Pod on node {}", ticker.node),
    );

    // While it serves.
    let to = dir.path().join("b");
    let t0 = Instant::now();
    let m: Value = serde_json::from_str(
        &b.operator("backup", &["--to", to.to_str().unwrap(), "--json"])
            .unwrap(),
    )
    .unwrap();
    let took = t0.elapsed();
    assert_eq!(b.listed("keep")["state"], "ready", "it served on");
    let files: Vec<&str> = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    for want in [
        "broker.db",
        "tunnel.key",
        "front/ca.key",
        "/kine/state.db",
        "/pki/ca.key",
    ] {
        assert!(
            files.iter().any(|f| f.contains(want)),
            "{want} in {files:?}"
        );
    }
    assert!(
        !files
            .iter()
            .any(|f| f.ends_with(".log") || f.ends_with(".pid") || f.ends_with(".sock")),
        "{files:?}"
    );
    step(
        t,
        &format!(
            "backup: {} files, {} bytes in {took:.1?}",
            files.len(),
            m["bytes"]
        ),
    );

    b.stop_broker().unwrap();
    std::fs::remove_dir_all(&b.state).unwrap();
    let out = b
        .operator("restore", &["--from", to.to_str().unwrap()])
        .unwrap();
    assert!(out.contains("restored"), "{out}");
    let again = b
        .operator("restore", &["--from", to.to_str().unwrap()])
        .unwrap_err();
    assert!(
        format!("{again:#}").contains(&format!("{} is not empty", b.state.display())),
        "{again:#}"
    );
    step(t, "stopped, state directory removed, restored");

    b.start_broker().unwrap();
    b.wait_state("keep", "ready", Duration::from_secs(120));
    assert_eq!(
        std::fs::read(&admin).unwrap(),
        std::fs::read(b.kubeconfig("keep")).unwrap(),
        "the same admin kubeconfig"
    );
    let got = b
        .host
        .command(&testbed::k8s::binaries().unwrap().kube().to_string_lossy())
        .arg("kubectl")
        .arg(format!("--kubeconfig={}", admin.display()))
        .args(["get", "configmap", "kept", "-o", "jsonpath={.data.k}"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got.stdout),
        "v",
        "{}\n{}",
        String::from_utf8_lossy(&got.stderr),
        b.diagnostics()
    );
    let through_front = u.ok(&b, &["get", "configmap", "kept", "-o", "name"]);
    assert!(through_front.contains("configmap/kept"), "{through_front}");
    step(t, "the same kubeconfigs answer, the ConfigMap is there");

    // The node was never told anything: it dials the restored broker's tunnel endpoint (the
    // same key, so the same endpoint id its identity names) and is Ready again.
    ticker.assert_back(&b, &u, "keep");
    step(
        t,
        "the node reconnected by itself: Ready, the same Pod, logs and exec through the tunnel",
    );
}

/// An etcd datastore (`--datastore etcd`) is in a backup taken while it serves: a snapshot
/// of it, which the cluster's next start after the restore makes its data directory from --
/// with the object created before the backup, not the one after. A hibernating cluster's
/// etcd, stopped, is in it as its files, and serves them again when woken.
#[test]
fn an_etcd_datastore_comes_back_from_its_snapshot() {
    let t = Instant::now();
    let world = World::new(1).unwrap();
    let mut b = Broker::start(&world, BrokerOptions::default()).unwrap();
    let created = b
        .cli_json(&["cluster", "create", "kv", "--datastore", "etcd"])
        .unwrap();
    assert_eq!(created["state"], "ready", "{created}");
    b.kubectl("kv", &["create", "configmap", "kept", "--from-literal=k=v"])
        .unwrap();
    let sleepy = asleep_on_etcd(&b);
    let dir = TempDir::new("etcd-backup").unwrap();
    let to = dir.path().join("b");
    let m: Value = serde_json::from_str(
        &b.operator("backup", &["--to", to.to_str().unwrap(), "--json"])
            .unwrap(),
    )
    .unwrap();
    let snap = etcd_in(&m, &sleepy);
    b.kubectl(
        "kv",
        &["create", "configmap", "later", "--from-literal=k=v"],
    )
    .unwrap();
    step(t, &format!("backup taken while etcd served: {snap}"));

    b.stop_broker().unwrap();
    std::fs::remove_dir_all(&b.state).unwrap();
    b.operator("restore", &["--from", to.to_str().unwrap()])
        .unwrap();
    let cluster = b
        .state
        .join(snap["path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    assert!(cluster.join("etcd.snapshot").exists() && !cluster.join("etcd").exists());
    b.start_broker().unwrap();
    b.wait_state("kv", "ready", Duration::from_secs(120));
    assert_eq!(value_of(&b, "kv", "kept"), "v");
    let later = b.kubectl("kv", &["get", "configmap", "later"]).unwrap_err();
    assert!(format!("{later:#}").contains("NotFound"), "{later:#}");
    assert!(
        !cluster.join("etcd.snapshot").exists(),
        "the snapshot was used up"
    );
    assert!(cluster.join("etcd/member").is_dir());
    step(
        t,
        "restored: etcd made from the snapshot, the ConfigMap from before it and not the one after",
    );
    let woke = b.cli_json(&["cluster", "wake", "sleepy"]).unwrap();
    assert_eq!(woke["state"], "ready", "{woke}");
    assert_eq!(value_of(&b, "sleepy", "slept"), "v");
    step(
        t,
        "the hibernating cluster's etcd, backed up as its files, serves them woken",
    );
}

/// ConfigMap `name`'s `k` in cluster `cluster`'s `default` namespace.
fn value_of(b: &Broker<'_>, cluster: &str, name: &str) -> String {
    b.kubectl(
        cluster,
        &["get", "configmap", name, "-o", "jsonpath={.data.k}"],
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()))
}

/// The serving etcd's snapshot entry in backup manifest `m`, checked: a snapshot, none of
/// its data directory's files, and the stopped etcd of cluster directory `sleepy` as files.
fn etcd_in(m: &Value, sleepy: &str) -> Value {
    let files = m["files"].as_array().unwrap();
    let snap = files
        .iter()
        .find(|f| f["how"] == "etcd snapshot")
        .unwrap_or_else(|| panic!("no etcd snapshot in {m}"));
    assert!(
        snap["path"].as_str().unwrap().ends_with("/etcd.snapshot")
            && snap["size"].as_u64() > Some(0),
        "{snap}"
    );
    let kv = snap["path"]
        .as_str()
        .unwrap()
        .trim_end_matches("etcd.snapshot");
    assert!(
        !files.iter().any(|f| f["path"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{kv}etcd/"))),
        "a serving etcd's files are not copied: {m}"
    );
    assert!(m["skipped"].as_array().unwrap().is_empty(), "{m}");
    let stopped: Vec<&str> = files
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .filter(|p| p.contains(&format!("{sleepy}/etcd/member/")))
        .collect();
    assert!(
        stopped.iter().any(|p| p.ends_with("/snap/db"))
            && stopped.iter().any(|p| p.contains("/wal/")),
        "a stopped etcd's files: {m}"
    );
    snap.clone()
}

/// A cluster on etcd with a ConfigMap, hibernating (its etcd stopped): its directory's name.
fn asleep_on_etcd(b: &Broker<'_>) -> String {
    let c = b
        .cli_json(&[
            "cluster",
            "create",
            "sleepy",
            "--datastore",
            "etcd",
            "--hibernate-after",
            "2s",
        ])
        .unwrap();
    assert_eq!(c["state"], "ready", "{c}");
    b.kubectl(
        "sleepy",
        &["create", "configmap", "slept", "--from-literal=k=v"],
    )
    .unwrap();
    b.wait_state("sleepy", "hibernating", Duration::from_secs(90));
    b.cluster_dir("sleepy")
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// `[backup]`: the daemon backs up on its own every `interval`, keeps the newest `keep`, and
/// runs `command` on each finished backup (here, a copy off to another directory).
#[test]
fn scheduled_backups_run_keep_the_newest_and_are_copied_off() {
    let world = World::new(0).unwrap();
    let dir = TempDir::new("scheduled-backups").unwrap();
    let (backups, offsite) = (dir.path().join("backups"), dir.path().join("offsite"));
    std::fs::create_dir_all(&offsite).unwrap();
    // The operator's own file in the backup directory stays.
    std::fs::create_dir_all(&backups).unwrap();
    std::fs::write(backups.join("README"), "ours\n").unwrap();
    let b = Broker::start(
        &world,
        BrokerOptions {
            backup: Some(socialweb_broker::config::Backup {
                interval: Duration::from_secs(5),
                keep: 1,
                dir: backups.clone(),
                command: vec![
                    "sh".into(),
                    "-c".into(),
                    format!("cp -a \"$1\" {}/", offsite.display()),
                    "sh".into(),
                ],
            }),
            ..Default::default()
        },
    )
    .unwrap();
    b.cli_json(&["cluster", "create", "kept", "--hibernate-after", "0"])
        .unwrap();
    let copied = |n: usize| {
        testbed::k8s::wait_for(
            &format!("{n} backups copied off"),
            Duration::from_secs(60),
            || {
                // Whole copies only: `cp -a` makes the directory before it has copied the
                // manifest into it.
                let names: Vec<String> = names_in(&offsite)
                    .into_iter()
                    .filter(|x| socialweb_broker::backup::verify(&offsite.join(x)).is_ok())
                    .collect();
                Ok((names.len() >= n).then_some(names))
            },
        )
        .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()))
    };
    let first = copied(1);
    // A backup taken after the cluster was: the second.
    let all = copied(first.len() + 1);
    let newest = all.last().unwrap();
    // Keep 1: one finished backup stays (the newest, or one newer still by now), beside
    // the README and at most one being written.
    let ours = testbed::k8s::wait_for("one backup kept", Duration::from_secs(30), || {
        let finished: Vec<String> = names_in(&backups)
            .into_iter()
            .filter(|n| socialweb_broker_core::backups::is_backup(n))
            .collect();
        Ok((finished.len() == 1).then(|| finished[0].clone()))
    })
    .unwrap();
    assert!(backups.join("README").exists(), "{:?}", names_in(&backups));
    assert!(ours >= *newest, "{ours} is older than {newest}");
    for n in &all {
        assert!(socialweb_broker_core::backups::is_backup(n), "{n}");
    }
    let m = socialweb_broker::backup::verify(&backups.join(ours)).unwrap();
    assert!(
        m.files.iter().any(|f| f.path.ends_with("broker.db")),
        "{:?}",
        m.files.iter().map(|f| &f.path).collect::<Vec<_>>()
    );
    let off = socialweb_broker::backup::verify(&offsite.join(newest)).unwrap();
    assert!(
        off.files
            .iter()
            .any(|f| f.path.to_string_lossy().contains("kept")),
        "the copied-off backup has the cluster"
    );
}

/// The names in `dir`, sorted.
fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    v.sort();
    v
}

/// A PostgreSQL client program (`pg_dump`, `pg_restore`, `psql`) against the server on the
/// operator's loopback, as its `postgres` user: stdout, or panics with stderr.
fn pg(ns: &testbed::Netns, program: &str, args: &[&str]) -> String {
    let mut all = vec!["-h", "127.0.0.1", "-p", "5432", "-U", "postgres"];
    all.extend_from_slice(args);
    let out = ns.output(program, &all).unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The recipe of docs/operations.md ("A PostgreSQL store"): `backup` for the files, then
/// `pg_dump -Fc` of the store's database and of each cluster's; after losing the state
/// directory and every database, `restore`, `pg_restore -C` of each dump, and the broker
/// serves the cluster again with the same CA, its ConfigMap and the user's kubeconfig.
#[test]
fn a_postgresql_store_and_its_clusters_databases_come_back_from_pg_dump() {
    let t = Instant::now();
    let world = World::new(0).unwrap();
    let ns = &world.operator;
    let server = testbed::postgres::Postgres::start(ns).unwrap();
    let dir = TempDir::new("pg-backup").unwrap();
    let mut b = Broker::start(
        &world,
        BrokerOptions {
            store_url: Some(server.url.clone()),
            clusters: socialweb_broker::config::ClusterDefaults {
                datastore: socialweb_broker::config::DatastoreKind::Postgres,
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    let u = User::new(&b, dir.path(), "pgkeep");
    b.kubectl(
        "pgkeep",
        &["create", "configmap", "kept", "--from-literal=k=v"],
    )
    .unwrap();
    let ca = std::fs::read(b.cluster_dir("pgkeep").join("pki/ca.crt")).unwrap();
    step(t, "a cluster on PostgreSQL with a ConfigMap");

    // The backup: the files, then each database.
    let to = dir.path().join("b");
    let databases = backed_up_with_pg_dump(&b, ns, &to);
    // Made after the backup: gone with the restore.
    b.kubectl("pgkeep", &["create", "configmap", "later"])
        .unwrap();
    step(
        t,
        &format!("backed up: the files, and {databases:?} with pg_dump"),
    );

    // Everything lost: the state directory and every database.
    b.stop_broker().unwrap();
    std::fs::remove_dir_all(&b.state).unwrap();
    restored_with_pg_restore(&b, ns, &to, &databases);
    step(t, "state directory and databases removed; restored");

    b.start_broker().unwrap();
    b.wait_state("pgkeep", "ready", Duration::from_secs(120));
    assert_eq!(
        std::fs::read(b.cluster_dir("pgkeep").join("pki/ca.crt")).unwrap(),
        ca,
        "the same CA"
    );
    let names = u.ok(&b, &["get", "configmaps", "-o", "name"]);
    assert!(names.contains("configmap/kept"), "{names}");
    assert!(
        !names.contains("configmap/later"),
        "made after the backup: {names}"
    );
    step(
        t,
        "the cluster serves its ConfigMap to the user's kubeconfig, with the same CA",
    );
}

/// The recipe's backup: `socialweb-broker backup` into `to`, then `pg_dump -Fc` of the
/// store's database and each cluster's beside it. The databases' names.
fn backed_up_with_pg_dump(
    b: &Broker<'_>,
    ns: &testbed::Netns,
    to: &std::path::Path,
) -> Vec<String> {
    b.operator("backup", &["--to", to.to_str().unwrap()])
        .unwrap();
    let listed = pg(
        ns,
        "psql",
        &[
            "-d",
            "postgres",
            "-tA",
            "-c",
            "select datname from pg_database where datname like 'sw\\_%' or datname = 'broker' order by 1",
        ],
    );
    let databases: Vec<String> = listed.lines().map(str::to_string).collect();
    assert_eq!(
        databases.len(),
        2,
        "the store's and the cluster's: {databases:?}"
    );
    for db in &databases {
        let file = to.join(format!("{db}.pgdump"));
        pg(
            ns,
            "pg_dump",
            &["-Fc", "-d", db, "-f", file.to_str().unwrap()],
        );
    }
    databases
}

/// The recipe's restore, after every database is dropped: `socialweb-broker restore` from
/// `to`, then `pg_restore -C` of each dump.
fn restored_with_pg_restore(
    b: &Broker<'_>,
    ns: &testbed::Netns,
    to: &std::path::Path,
    databases: &[String],
) {
    for db in databases {
        pg(
            ns,
            "psql",
            &[
                "-d",
                "postgres",
                "-c",
                &format!("drop database {db} with (force)"),
            ],
        );
    }
    b.operator("restore", &["--from", to.to_str().unwrap()])
        .unwrap();
    for db in databases {
        let file = to.join(format!("{db}.pgdump"));
        pg(
            ns,
            "pg_restore",
            &["-C", "-d", "postgres", file.to_str().unwrap()],
        );
    }
}
