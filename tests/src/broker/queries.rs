//! What the harness asks of a running broker and its providers: the operator's commands and
//! kubectl, where a cluster's files are, what the providers lease, where each node runs, and
//! the logs to show when a test fails.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use socialweb_broker::command::{ClusterDetail, ClusterInfo};
use socialweb_broker::daemon::Paths;

use super::{Broker, FRONT_PORT};
use crate::cni::workspace_bin;
use crate::k8s::{binaries, wait_for};

impl Broker<'_> {
    /// The broker's paths, then each provider machine's.
    fn all_paths(&self) -> impl Iterator<Item = &Paths> {
        std::iter::once(&self.paths).chain(self.providers.iter().map(|p| &p.paths))
    }

    /// The gateway's URL (the front), as users reach it from the host namespace.
    pub fn front_url(&self) -> String {
        format!("https://{}:{FRONT_PORT}", self.public_addr)
    }

    /// The front's self-made CA (what kubeconfigs carry).
    pub fn front_ca(&self) -> PathBuf {
        self.paths
            .front_ca
            .clone()
            .expect("the harness's brokers make their own front CA")
    }

    /// `socialweb-broker api <args>` as a user with `key`, from the internet: its output
    /// (JSON), or its error message.
    pub fn api(&self, key: &std::path::Path, args: &[&str]) -> Result<Value> {
        let out = self
            .world
            .internet
            .command(&workspace_bin("socialweb-broker").to_string_lossy())
            .arg("api")
            .args(args)
            .arg("--gateway")
            .arg(self.front_url())
            .arg("--ca")
            .arg(self.front_ca())
            .arg("--key")
            .arg(key)
            .env_remove("SOCIALWEB_DID")
            .output()?;
        if !out.status.success() {
            bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// kubectl with `kubeconfig` (a user's), from the internet; `env` set for it.
    pub fn kubectl_as(
        &self,
        kubeconfig: &std::path::Path,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Command {
        let bins = binaries().expect("the Kubernetes binaries");
        let mut c = self.world.internet.command(&bins.kube().to_string_lossy());
        c.arg("kubectl")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        c
    }

    /// What the broker says of cluster `name` (`cluster list --json`); when it does not
    /// answer (killed, restarting), what it said last.
    pub fn cluster(&self, name: &str) -> Option<ClusterInfo> {
        let mut known = self.known.lock().expect("lock");
        let answer = self
            .cli(&["cluster", "list", "--json"])
            .and_then(|out| Ok(serde_json::from_str::<Vec<ClusterInfo>>(&out)?));
        match answer {
            Ok(all) => {
                let this = all.into_iter().find(|c| c.name == name);
                match &this {
                    Some(c) => known.insert(name.to_string(), c.clone()),
                    None => known.remove(name),
                };
                this
            }
            Err(_) => known.get(name).cloned(),
        }
    }

    /// Cluster `name` as `cluster list --json` has it; `null` when it is not listed or the
    /// broker does not answer.
    pub fn listed(&self, name: &str) -> Value {
        let all = self.cli_json(&["cluster", "list"]).unwrap_or(Value::Null);
        all.as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// A series' value at the broker's metrics address (one without labels; `None`: not
    /// served, or the broker did not answer).
    pub fn metric(&self, name: &str) -> Option<f64> {
        let text = self
            .host
            .exec(
                "curl",
                &["-sf", "--max-time", "10", "http://127.0.0.1:9464/metrics"],
            )
            .ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    /// Waits until cluster `name` is listed in `state`, and returns it as listed; panics
    /// with the diagnostics past `within`.
    pub fn wait_state(&self, name: &str, state: &str, within: Duration) -> Value {
        wait_for(&format!("cluster {name} {state}"), within, || {
            let c = self.listed(name);
            Ok((c["state"] == state).then_some(c))
        })
        .unwrap_or_else(|e| panic!("{e:#}: {}\n{}", self.listed(name), self.diagnostics()))
    }

    /// A cluster's directory, as the broker says (each cluster of a name has its own), or
    /// `<clusters>/<name>`, which does not exist, when there is none.
    pub fn cluster_dir(&self, cluster: &str) -> PathBuf {
        self.cluster(cluster)
            .map(|c| c.dir)
            .unwrap_or_else(|| self.paths.clusters.join(cluster))
    }

    /// The admin kubeconfig of a cluster, as the broker says.
    pub fn kubeconfig(&self, cluster: &str) -> PathBuf {
        self.cluster(cluster)
            .map(|c| c.kubeconfig)
            .unwrap_or_else(|| self.paths.clusters.join(cluster))
    }

    /// kubectl as the cluster's admin, from the host namespace.
    pub fn kubectl(&self, cluster: &str, args: &[&str]) -> Result<String> {
        let bins = binaries()?;
        let out = self
            .host
            .command(&bins.kube().to_string_lossy())
            .arg("kubectl")
            .arg(format!(
                "--kubeconfig={}",
                self.kubeconfig(cluster).display()
            ))
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn kubectl_json(&self, cluster: &str, args: &[&str]) -> Result<Value> {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.kubectl(cluster, &a)?)?)
    }

    /// The names of the cluster's Nodes that report Ready.
    pub fn ready_nodes(&self, cluster: &str) -> Result<Vec<String>> {
        let v = self.kubectl_json(cluster, &["get", "nodes"])?;
        Ok(v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| crate::k8s::node_is_ready(n))
            .map(|n| n["metadata"]["name"].as_str().unwrap_or("").to_string())
            .collect())
    }

    /// `kubectl apply -f -`.
    pub fn apply(&self, cluster: &str, manifest: &str) -> Result<()> {
        crate::k8s::kubectl_apply(self.host, &self.kubeconfig(cluster), manifest).map(|_| ())
    }

    /// The market URLs of the providers, as the operator's host reaches them (the embedded
    /// provider's is on its socket, [`Broker::provider_socket`]).
    pub fn provider_urls(&self) -> Vec<String> {
        if !self.opts.rent_from.is_empty() {
            self.opts.rent_from.iter().map(|p| p.url.clone()).collect()
        } else if self.providers.is_empty() {
            vec!["http://local-provider".to_string()]
        } else {
            self.providers.iter().map(|p| p.url.clone()).collect()
        }
    }

    /// The embedded provider's owner-only socket.
    pub fn provider_socket(&self) -> PathBuf {
        self.paths.provider_socket.clone()
    }

    /// curl's arguments to reach the providers as the broker does: its socket, or mutual TLS
    /// with the broker's key (the harness checks the providers, not their certificates: -k).
    pub fn provider_curl_args(&self) -> Vec<String> {
        if self.providers.is_empty() && self.opts.rent_from.is_empty() {
            vec![
                "--unix-socket".into(),
                self.provider_socket().display().to_string(),
            ]
        } else {
            vec![
                "-k".into(),
                "--cert".into(),
                self.paths.market_cert.display().to_string(),
                "--key".into(),
                self.paths.market_key.display().to_string(),
            ]
        }
    }

    /// The providers' own view: every lease they hold, asked over the market protocol.
    pub fn provider_leases(&self) -> Result<Vec<Value>> {
        let mut all = Vec::new();
        let auth = self.provider_curl_args();
        for url in self.provider_urls() {
            let mut args: Vec<&str> = vec!["-sf", "--max-time", "5"];
            args.extend(auth.iter().map(String::as_str));
            let leases = format!("{url}/v1/leases");
            args.push(&leases);
            let out = self
                .host
                .exec("curl", &args)
                .with_context(|| format!("asking the provider at {url} for its leases"))?;
            let v: Value = serde_json::from_str(&out)?;
            all.extend(v["leases"].as_array().cloned().unwrap_or_default());
        }
        Ok(all)
    }

    /// Leases the provider holds live (booting or running).
    pub fn live_leases(&self) -> Result<Vec<Value>> {
        Ok(self
            .provider_leases()?
            .into_iter()
            .filter(|l| matches!(l["state"].as_str(), Some("booting" | "running")))
            .collect())
    }

    /// `cluster show --json`'s decisions, as `(action, target, reason)`.
    pub fn decisions(&self, cluster: &str) -> Result<Vec<(String, i64, String)>> {
        let out = self.cli(&["cluster", "show", cluster, "--json"])?;
        let detail: ClusterDetail = serde_json::from_str(&out)?;
        Ok(detail
            .decisions
            .into_iter()
            .map(|d| (d.action, d.target, d.reason))
            .collect())
    }

    /// Waits for a decision `action` with `target` nodes, returns the reason of the first
    /// one: the loop records a new decision when its reason changes (a node leased turns
    /// "intent and no node" into "5 pods wait, 1 fit ..."), and callers assert on why the
    /// target was first set, which a later poll must not replace.
    pub fn wait_decision(
        &self,
        cluster: &str,
        action: &str,
        target: i64,
        timeout: Duration,
    ) -> Result<String> {
        wait_for(
            &format!("decision {action} nodes={target}"),
            timeout,
            || {
                Ok(self
                    .decisions(cluster)?
                    .into_iter()
                    .find(|(a, t, _)| a == action && *t == target)
                    .map(|(_, _, r)| r))
            },
        )
        .with_context(|| self.diagnostics())
    }

    /// The scratch directory of a node's machine (its agent's and children's logs).
    pub fn node_dirs(&self) -> Vec<PathBuf> {
        self.all_paths()
            .flat_map(|p| std::fs::read_dir(&p.provider_nodes).into_iter().flatten())
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect()
    }

    /// The network namespace node `node` runs in (as its provider recorded it).
    pub fn node_netns(&self, node: &str) -> Result<String> {
        for paths in self.all_paths() {
            let Ok(text) = std::fs::read_to_string(&paths.provider_records) else {
                continue;
            };
            let v: Value = serde_json::from_str(&text)?;
            for e in v["leases"].as_object().into_iter().flat_map(|m| m.values()) {
                let live = matches!(e["lease"]["state"].as_str(), Some("booting" | "running"));
                if live && e["lease"]["tags"]["node"] == node {
                    let path = e["machine"]["netns"].as_str().unwrap_or_default();
                    if let Some(name) = path.rsplit('/').next().filter(|n| !n.is_empty()) {
                        return Ok(name.to_string());
                    }
                }
            }
        }
        bail!("no provider runs node {node}")
    }

    /// The agent's control socket of node `node`.
    pub fn agent_socket(&self, node: &str) -> Result<PathBuf> {
        for d in self.node_dirs() {
            let identity = d.join("identity.json");
            let id: Value = match std::fs::read(&identity) {
                Ok(b) => serde_json::from_slice(&b)?,
                Err(_) => continue,
            };
            if id["node"] == node {
                return Ok(d.join("agent.sock"));
            }
        }
        bail!("no machine of node {node}")
    }

    /// `program args` inside node `node`'s network namespace (its guest side, behind NAT).
    pub fn on_node(
        &self,
        node: &str,
        program: &str,
        args: &[&str],
    ) -> Result<std::process::Output> {
        let ns = self.node_netns(node)?;
        Ok(Command::new("ip")
            .args(["netns", "exec", &ns, program])
            .args(args)
            .output()?)
    }

    /// `socialweb-agent <args> --ctl-socket <node's>` (`mesh status --json`, say), stdout.
    pub fn agent_cli(&self, node: &str, args: &[&str]) -> Result<String> {
        let out = Command::new(workspace_bin("socialweb-agent"))
            .args(args)
            .arg("--ctl-socket")
            .arg(self.agent_socket(node)?)
            .output()?;
        if !out.status.success() {
            bail!(
                "socialweb-agent {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The broker's and provider's log tails, and every node's agent log tail.
    pub fn diagnostics(&self) -> String {
        let mut out = format!(
            "--- broker ---\n{}\n",
            crate::k8s::tail_of(&self.log("broker"), 40)
        );
        // Each control plane that never became ready says why in its own logs.
        let starting = self
            .cli_json(&["cluster", "list"])
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default();
        for c in starting.iter().filter(|c| c["state"] == "starting") {
            let dir = std::path::PathBuf::from(c["dir"].as_str().unwrap_or_default());
            for component in ["kine", "apiserver"] {
                out.push_str(&format!(
                    "--- cluster {} {component} (starting) ---\n{}\n",
                    c["name"],
                    crate::k8s::tail_of(&dir.join("logs").join(format!("{component}.log")), 15)
                ));
            }
        }
        for p in &self.providers {
            let log = self.log(&format!("provider-{}", p.index));
            out.push_str(&format!(
                "--- provider {} ---\n{}\n",
                p.index,
                crate::k8s::tail_of(&log, 20)
            ));
        }
        for d in self.node_dirs() {
            out.push_str(&format!(
                "--- node {} agent ---\n{}\n",
                d.display(),
                crate::k8s::tail_of(&d.join("agent.log"), 15)
            ));
            for child in ["containerd", "kubelet", "kube-proxy"] {
                let log = d.join("var-log/socialweb").join(format!("{child}.log"));
                if log.exists() {
                    out.push_str(&format!(
                        "--- {child} ---\n{}\n",
                        crate::k8s::tail_of(&log, 10)
                    ));
                }
            }
        }
        out
    }

    /// Every provider's guest directories (`<provider_nodes>/<lease>`) that
    /// exist, with the pid of the qemu running there, if one still does.
    pub fn guests(&self) -> Vec<(PathBuf, Option<u32>)> {
        let mut out = Vec::new();
        for paths in self.all_paths() {
            for dir in std::fs::read_dir(&paths.provider_nodes)
                .into_iter()
                .flatten()
                .flatten()
            {
                let dir = dir.path();
                let pid = std::fs::read_to_string(dir.join("qemu.pid"))
                    .ok()
                    .and_then(|p| p.trim().parse::<u32>().ok())
                    .filter(|pid| {
                        // Its qemu, not a pid reused since.
                        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                            String::from_utf8_lossy(&c).contains(&*dir.to_string_lossy())
                        })
                    });
                out.push((dir, pid));
            }
        }
        out
    }
}
