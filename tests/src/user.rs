//! A tenant as the tests play one: a DID of its own (`socialweb-broker api keygen`), a
//! cluster it owns, and a kubeconfig from the gateway API, used from the internet through the
//! front like any user's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::broker::Broker;

/// stdout and stderr of a command, for messages.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A user with a DID and a kubeconfig for its cluster.
#[derive(Debug)]
pub struct User {
    pub kubeconfig: PathBuf,
}

impl User {
    /// A new DID, cluster `cluster` created for it (asserted ready), and its kubeconfig.
    pub fn new(b: &Broker<'_>, dir: &Path, cluster: &str) -> User {
        Self::create(b, dir, cluster, &["ready"])
    }

    /// As `new`, at one host of a fleet: the cluster may be run by another host (the
    /// least loaded claims it first), which this host reports as `elsewhere`.
    pub fn in_fleet(b: &Broker<'_>, dir: &Path, cluster: &str) -> User {
        Self::create(b, dir, cluster, &["ready", "elsewhere"])
    }

    fn create(b: &Broker<'_>, dir: &Path, cluster: &str, states: &[&str]) -> User {
        let key = dir.join("user.key");
        let o = Command::new(crate::cni::workspace_bin("socialweb-broker"))
            .args(["api", "keygen", "--out"])
            .arg(&key)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let did = String::from_utf8_lossy(&o.stdout).trim().to_string();
        let created = b
            .cli_json(&["cluster", "create", cluster, "--owner", &did])
            .unwrap();
        assert!(
            states.iter().any(|s| created["state"] == *s),
            "{created}\n{}",
            b.diagnostics()
        );
        let kubeconfig = dir.join("user.kubeconfig");
        b.api(
            &key,
            &[
                "kubeconfig",
                cluster,
                "--lifetime",
                "2h",
                "--out",
                kubeconfig.to_str().unwrap(),
            ],
        )
        .unwrap();
        User { kubeconfig }
    }

    /// kubectl through the front, from the internet: stdout, or panics with everything.
    pub fn ok(&self, b: &Broker<'_>, args: &[&str]) -> String {
        let o = b.kubectl_as(&self.kubeconfig, &[], args).output().unwrap();
        assert!(
            o.status.success(),
            "kubectl {}: {}\n{}",
            args.join(" "),
            text(&o),
            b.diagnostics()
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub fn json(&self, b: &Broker<'_>, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(b, &a)).unwrap()
    }

    pub fn exec(&self, b: &Broker<'_>, pod: &str, cmd: &[&str]) -> Output {
        let mut args = vec!["exec", pod, "--"];
        args.extend_from_slice(cmd);
        b.kubectl_as(&self.kubeconfig, &[], &args).output().unwrap()
    }
}
