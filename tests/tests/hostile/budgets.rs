//! Issue 58, "every input a tenant grows has a budget": what a tenant's Pods cost the broker
//! that watches them, and how many long-lived requests (watches, upgraded streams) one of
//! its certificates may hold at the front.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use socialweb_broker::config::Front;
use testbed::broker::{Broker, BrokerOptions};
use testbed::tmp::TempDir;
use testbed::world::World;

use super::{kubectl_with, tenant_cluster};

/// The broker's resident memory, in bytes.
fn rss(b: &Broker<'_>) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", b.broker_pid())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib << 10
}

/// A `kubectl get configmaps --watch` of the tenant's, running.
fn watcher(b: &Broker<'_>, kubeconfig: &std::path::Path) -> Child {
    b.kubectl_as(kubeconfig, &[], &["get", "configmaps", "--watch"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Whether `c` is still running after `wait`, else its stderr.
fn still_running(c: &mut Child, wait: Duration) -> Result<(), String> {
    let t = Instant::now();
    while t.elapsed() < wait {
        if c.try_wait().unwrap().is_some() {
            let mut err = String::new();
            use std::io::Read;
            c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return Err(err);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

#[test]
fn a_tenants_pods_and_streams_cost_the_broker_a_bounded_amount() {
    const STREAMS: usize = 4;
    let world = World::new(0).unwrap();
    let dir = TempDir::new("budgets").unwrap();
    let b = Broker::start(
        &world,
        BrokerOptions {
            front: Front {
                max_streams_per_certificate: STREAMS,
                ..Front::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    let kc = tenant_cluster(&b, dir.path(), "t");

    // Watches: a certificate holds so many; one more is refused with the reason; requests
    // that end are served meanwhile; a watch that ends gives its place back.
    let mut watches: Vec<Child> = (0..STREAMS).map(|_| watcher(&b, &kc)).collect();
    for w in &mut watches {
        still_running(w, Duration::from_secs(2)).expect("a watch within the cap");
    }
    let mut over = watcher(&b, &kc);
    let err = still_running(&mut over, Duration::from_secs(20))
        .expect_err("a watch past the cap was served");
    assert!(err.contains("max_streams_per_certificate"), "{err}");
    let (ok, out) = kubectl_with(&b, &kc, &["get", "configmaps"], None);
    assert!(ok, "a request that ends is served at the cap: {out}");
    let mut first = watches.remove(0);
    first.kill().unwrap();
    first.wait().unwrap();
    let mut again = watcher(&b, &kc);
    still_running(&mut again, Duration::from_secs(3)).expect("a watch once one ended");
    for mut w in watches.into_iter().chain([again]) {
        let _ = w.kill();
        let _ = w.wait();
    }

    // Pods: 256 of 256 KiB each (an environment variable), which no node can hold, so none is
    // rented. The broker keeps of them what its decision reads.
    let before = rss(&b);
    let env = "e".repeat(256 * 1024);
    for batch in 0..32 {
        let pods: Vec<String> = (0..8)
            .map(|i| {
                format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: big-{}, namespace: default}}\nspec:\n  nodeSelector: {{example.com/none: x}}\n  containers:\n  - name: c\n    image: socialweb.local/busybox:1\n    env: [{{name: BIG, value: {env}}}]\n",
                    batch * 8 + i
                )
            })
            .collect();
        let (ok, out) = kubectl_with(&b, &kc, &["create", "-f", "-"], Some(&pods.join("---\n")));
        assert!(ok, "{out}");
    }
    // The driver has seen them all once it has told the last one no node will be rented.
    let t = Instant::now();
    loop {
        let events = b
            .kubectl_json(
                "t",
                &[
                    "get",
                    "events",
                    "--field-selector",
                    "reason=NotTriggerScaleUp,involvedObject.name=big-255",
                ],
            )
            .unwrap();
        if !events["items"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "no NotTriggerScaleUp for big-255"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let after = rss(&b);
    let grew = after.saturating_sub(before);
    eprintln!(
        "64 MiB of Pods grew the broker's resident memory by {:.1} MiB ({:.1} -> {:.1} MiB)",
        grew as f64 / 1048576.0,
        before as f64 / 1048576.0,
        after as f64 / 1048576.0
    );
    assert!(
        grew < 12 << 20,
        "64 MiB of the tenant's Pods grew the broker by {grew} bytes"
    );
}
