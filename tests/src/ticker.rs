//! A Pod that says it is alive every second, for tests that take the broker away (a restore,
//! an upgrade) and check that the node under it comes back by itself with the Pod untouched.

use std::path::Path;
use std::time::Duration;

use crate::broker::Broker;
use crate::k8s::wait_for;
use crate::user::{User, text};

const MANIFEST: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: ticker, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: socialweb.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "while true; do echo tick; sleep 1; done"]
"#;

/// The Pod `ticker`, running: its uid and the node it runs on.
#[derive(Debug, Clone)]
pub struct Ticker {
    pub uid: String,
    pub node: String,
}

impl Ticker {
    /// Applies it as `u` (the manifest written in `dir`) and waits until it is Ready.
    pub fn start(b: &Broker<'_>, u: &User, dir: &Path) -> Ticker {
        let manifest = dir.join("ticker.yaml");
        std::fs::write(&manifest, MANIFEST).unwrap();
        u.ok(b, &["apply", "-f", manifest.to_str().unwrap()]);
        u.ok(
            b,
            &[
                "wait",
                "--for=condition=Ready",
                "pod/ticker",
                "--timeout=240s",
            ],
        );
        let pod = u.json(b, &["get", "pod", "ticker"]);
        Ticker {
            uid: pod["metadata"]["uid"].as_str().unwrap().to_string(),
            node: pod["spec"]["nodeName"].as_str().unwrap().to_string(),
        }
    }

    /// Waits (2 minutes) until its node is Ready again in `cluster` and exec works through
    /// the tunnel, then asserts its log goes on, it is the same Pod, never restarted, and
    /// the broker still leases one node and no other.
    pub fn assert_back(&self, b: &Broker<'_>, u: &User, cluster: &str) {
        wait_for(
            "the node Ready again and exec working through the tunnel",
            Duration::from_secs(120),
            || {
                let ready = b
                    .ready_nodes(cluster)
                    .unwrap_or_default()
                    .contains(&self.node);
                let exec = u.exec(b, "ticker", &["echo", "back"]);
                Ok((ready && exec.status.success()).then_some(()))
            },
        )
        .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
        let logs = b
            .kubectl_as(&u.kubeconfig, &[], &["logs", "--tail=1", "ticker"])
            .output()
            .unwrap();
        assert!(text(&logs).starts_with("tick"), "{}", text(&logs));
        let pod = u.json(b, &["get", "pod", "ticker"]);
        assert_eq!(pod["metadata"]["uid"], self.uid.as_str(), "the same Pod");
        assert_eq!(
            pod["status"]["containerStatuses"][0]["restartCount"], 0,
            "never restarted"
        );
        assert_eq!(
            b.live_leases().unwrap().len(),
            1,
            "the same one lease, no other rented"
        );
    }
}
