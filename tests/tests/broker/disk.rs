//! The disk guard (`[disk]`, issue 62; docs/operations.md, "The disk guard"): the state
//! directory on a small filesystem of its own, filled under a serving broker. Below the floor
//! no cluster is created and none woken, each refusal naming the floor, while the awake
//! cluster goes on; filled to the last byte, nothing is lost; freed, everything goes on.

use std::path::Path;
use std::time::Duration;

use socialweb_broker::config::{ClusterDefaults, DatastoreKind, Disk};
use testbed::broker::{Broker, BrokerOptions};
use testbed::tmp::TempDir;
use testbed::user::User;
use testbed::world::World;

const MIB: u64 = 1 << 20;

/// What the broker may still write on the filesystem of `dir`.
fn free_bytes(dir: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(dir).unwrap();
    s.blocks_available() * s.fragment_size()
}

/// Every SQLite database under `dir` (the broker's store, each kine datastore) passes
/// SQLite's own integrity check.
fn sqlite_intact(dir: &Path) -> usize {
    let out = std::process::Command::new("find")
        .arg(dir)
        .args(["-name", "*.db", "-type", "f"])
        .output()
        .unwrap();
    let files: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    for f in &files {
        let o = std::process::Command::new("sqlite3")
            .args([f.as_str(), "PRAGMA integrity_check"])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            said.trim(),
            "ok",
            "{f}: {said}{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    files.len()
}

/// A GET of `path` through the front with user `u`'s kubeconfig, from the internet, by
/// curl (kubectl retries a 503 and reports its own words): the status and the body.
fn front_get(b: &Broker<'_>, u: &User, dir: &Path, path: &str) -> (u16, String) {
    let view = |what: &str| {
        let o = b
            .kubectl_as(
                &u.kubeconfig,
                &[],
                &[
                    "config",
                    "view",
                    "--raw",
                    "-o",
                    &format!("jsonpath={{{what}}}"),
                ],
            )
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let decoded = |what: &str, file: &str| {
        let pem =
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, view(what)).unwrap();
        let f = dir.join(file);
        std::fs::write(&f, pem).unwrap();
        f.display().to_string()
    };
    let cert = decoded(".users[0].user.client-certificate-data", "user.crt");
    let key = decoded(".users[0].user.client-key-data", "user.pem");
    let ca = decoded(".clusters[0].cluster.certificate-authority-data", "ca.crt");
    let url = format!("{}{path}", view(".clusters[0].cluster.server"));
    let out = b
        .world
        .internet
        .exec(
            "curl",
            &[
                "-s",
                "--max-time",
                "20",
                "--cacert",
                &ca,
                "--cert",
                &cert,
                "--key",
                &key,
                "-w",
                "\n%{http_code}",
                &url,
            ],
        )
        .unwrap();
    let (body, code) = out.trim_end().rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_string())
}

/// Fills the filesystem of `dir` until `leave` bytes are free, in `file`.
fn fill(dir: &Path, file: &str, leave: u64) {
    let len = free_bytes(dir).saturating_sub(leave);
    let o = std::process::Command::new("fallocate")
        .args(["-l", &len.to_string()])
        .arg(dir.join(file))
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
}

#[test]
fn a_filling_disk_stops_new_clusters_and_wakes_keeps_what_runs_and_loses_nothing() {
    let world = World::new(0).unwrap();
    let b = Broker::start(
        &world,
        BrokerOptions {
            state_fs_mib: Some(320),
            disk: Some(Disk {
                min_free_mib: 96,
                min_free_inodes: 1_000,
            }),
            clusters: ClusterDefaults {
                datastore: DatastoreKind::Kine,
                hibernate_after: Duration::from_secs(3),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    let awake = b
        .cli_json(&["cluster", "create", "awake", "--hibernate-after", "0"])
        .unwrap();
    assert_eq!(awake["state"], "ready", "{awake}\n{}", b.diagnostics());
    b.kubectl(
        "awake",
        &["create", "configmap", "one", "--from-literal=k=1"],
    )
    .unwrap();
    let dir = TempDir::new("disk-guard").unwrap();
    let u = User::new(&b, dir.path(), "sleepy");
    u.ok(&b, &["create", "configmap", "s1", "--from-literal=k=s1"]);
    b.wait_state("sleepy", "hibernating", Duration::from_secs(60));

    under_the_floor(&b, &u, dir.path());
    full_to_the_last_byte(&b);
    freed(&b, &u);
}

/// Under the floor, not full: a create and both wakes refused naming it; the awake cluster
/// goes on.
fn under_the_floor(b: &Broker<'_>, u: &User, dir: &Path) {
    let state = &b.state;
    fill(state, "filler", 48 * MIB);
    let e = b
        .cli(&["cluster", "create", "third", "--hibernate-after", "0"])
        .unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("no new cluster") && e.contains("disk.min_free_mib (96 MiB)"),
        "{e}"
    );
    assert!(b.listed("third").is_null(), "nothing of it recorded");
    let (code, said) = front_get(b, u, dir, "/api/v1/namespaces/default/configmaps/s1");
    assert_eq!(code, 503, "{said}");
    assert!(
        said.contains("not woken") && said.contains("disk.min_free_mib"),
        "{said}"
    );
    let e = b.cli(&["cluster", "wake", "sleepy"]).unwrap_err();
    assert!(format!("{e:#}").contains("disk.min_free_mib"), "{e:#}");
    assert_eq!(b.listed("sleepy")["state"], "hibernating");
    b.kubectl(
        "awake",
        &["create", "configmap", "two", "--from-literal=k=2"],
    )
    .unwrap();
    assert_eq!(
        b.metric("socialweb_broker_state_disk_low").unwrap_or(0.0),
        1.0
    );
    assert!(
        b.metric("socialweb_broker_disk_refusals_total")
            .unwrap_or(0.0)
            >= 3.0
    );
    assert!(
        b.metric("socialweb_broker_state_disk_free_bytes")
            .unwrap_or(0.0)
            < (96 * MIB) as f64
    );
}

/// Full to the last byte for a while: writes fail where they must; the broker still
/// answers from its store.
fn full_to_the_last_byte(b: &Broker<'_>) {
    let state = &b.state;
    let o = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=1M"])
        .arg(format!("of={}", state.join("filler-2").display()))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("No space left"),
        "{o:?}"
    );
    assert_eq!(free_bytes(state), 0);
    let _ = b.kubectl(
        "awake",
        &["create", "configmap", "full", "--from-literal=k=f"],
    );
    std::thread::sleep(Duration::from_secs(5));
    let listed = b.cli_json(&["cluster", "list"]).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
}

/// Freed: everything goes on, with what was written.
fn freed(b: &Broker<'_>, u: &User) {
    let state = &b.state;
    std::fs::remove_file(state.join("filler")).unwrap();
    std::fs::remove_file(state.join("filler-2")).unwrap();
    let third = b
        .cli_json(&["cluster", "create", "third", "--hibernate-after", "0"])
        .unwrap();
    assert_eq!(third["state"], "ready", "{third}\n{}", b.diagnostics());
    assert_eq!(
        u.ok(b, &["get", "configmap", "s1", "-o", "jsonpath={.data.k}"]),
        "s1",
        "woken with what it had"
    );
    for (cm, v) in [("one", "1"), ("two", "2")] {
        testbed::k8s::wait_for(&format!("configmap {cm}"), Duration::from_secs(60), || {
            Ok(b.kubectl(
                "awake",
                &["get", "configmap", cm, "-o", "jsonpath={.data.k}"],
            )
            .ok()
            .filter(|got| got == v))
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    }
    b.kubectl(
        "awake",
        &["create", "configmap", "after", "--from-literal=k=a"],
    )
    .unwrap();
    testbed::k8s::wait_for("the disk no longer low", Duration::from_secs(30), || {
        Ok((b.metric("socialweb_broker_state_disk_low").unwrap_or(0.0) == 0.0).then_some(()))
    })
    .unwrap();
    let checked = sqlite_intact(state);
    assert!(
        checked >= 4,
        "the store and three kine datastores: {checked}"
    );
}
