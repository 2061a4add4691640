//! A Kubernetes control plane in a namespace: etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler from the pinned build, configured as the product runs k3s
//! (`--cluster-cidr=10.42.0.0/16`, node pod CIDRs allocated by the control plane, no overlay,
//! no addons).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use socialweb_broker::control_plane::{self as cpconf, Credentials};
use socialweb_wire::BootstrapToken;

use super::pki::Pki;
use super::{Binaries, binaries, tail, wait_for};
use crate::netns::Netns;
use crate::process::Spawned;
use crate::tmp::TempDir;

pub use cpconf::{CLUSTER_CIDR, SERVICE_CIDR};
pub const API_PORT: u16 = 6443;

/// A running control plane. Dropping it stops every component and removes its files.
#[derive(Debug)]
pub struct ControlPlane<'a> {
    // Field order is drop order: components stop before their files go.
    approver: Approver,
    scheduler: Spawned,
    controller_manager: Spawned,
    apiserver: Spawned,
    etcd: Spawned,
    pub pki: Pki,
    /// `https://<addr>:6443`
    pub url: String,
    pub addr: Ipv4Addr,
    pub admin_kubeconfig: PathBuf,
    pub bins: Binaries,
    pub ns: &'a Netns,
    /// Seconds each start step took: etcd, apiserver ready, controllers healthy.
    pub timings: Vec<(&'static str, Duration)>,
    dir: TempDir,
}

/// The broker's node-certificate approver (the controller-manager's is off), run against
/// the nodes this harness made tokens for, every 300 ms, until dropped.
#[derive(Debug)]
struct Approver {
    plans: std::sync::Arc<std::sync::Mutex<Vec<socialweb_broker::approver::Plan>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Approver {
    fn none() -> Approver {
        Approver {
            plans: Default::default(),
            stop: Default::default(),
            thread: None,
        }
    }

    /// Starts it in `ns` (where the apiserver is), with the admin kubeconfig.
    fn start(ns: &Netns, kubeconfig: PathBuf) -> Result<Approver> {
        let mut a = Approver::none();
        let file = std::fs::File::open(ns.path())?;
        let (plans, stop) = (a.plans.clone(), a.stop.clone());
        a.thread = Some(std::thread::spawn(move || {
            if nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).is_err() {
                return;
            }
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(client) = socialweb_broker::tenant::client(&kubeconfig).await else {
                    return;
                };
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let now = plans.lock().expect("lock").clone();
                    let _ = socialweb_broker::approver::decide_pending(&client, &now).await;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            });
        }));
        Ok(a)
    }
}

impl Drop for Approver {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn arg(k: &str, v: impl AsRef<std::ffi::OsStr>) -> std::ffi::OsString {
    let mut s = std::ffi::OsString::from(format!("--{k}="));
    s.push(v.as_ref());
    s
}

impl<'a> ControlPlane<'a> {
    /// Starts a control plane inside `ns`, the apiserver listening on `addr:6443` and
    /// everything else on the namespace's loopback. Returns once the apiserver is ready and
    /// the controller manager and scheduler are healthy.
    pub fn start(ns: &'a Netns, addr: Ipv4Addr) -> Result<ControlPlane<'a>> {
        let bins = binaries()?;
        let dir = TempDir::new("cp")?;
        let pki = Pki::new(&dir.path().join("pki"))?;
        let url = format!("https://{addr}:{API_PORT}");
        let serving = pki.server("apiserver", &cpconf::serving_names(addr.into()))?;
        let kubelet_client = pki.client(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            &["system:masters"],
        )?;
        let sa_key = pki.key("sa")?;
        let admin = pki.client("admin", "admin", &["system:masters"])?;
        let admin_kubeconfig = pki.kubeconfig("admin", &url, &admin)?;
        let kcm = pki.client("kcm", "system:kube-controller-manager", &[])?;
        let kcm_kubeconfig = pki.kubeconfig("kcm", &url, &kcm)?;
        let sched = pki.client("scheduler", "system:kube-scheduler", &[])?;
        let sched_kubeconfig = pki.kubeconfig("scheduler", &url, &sched)?;
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs)?;
        let kube = bins.kube();
        let mut timings = Vec::new();
        let t = Instant::now();

        let start = |name: &str, args: Vec<std::ffi::OsString>| -> Result<Spawned> {
            let mut cmd = ns.command(&kube.to_string_lossy());
            cmd.arg(name).args(args);
            Spawned::start_logged(cmd, name, &logs.join(format!("{name}.log")))
        };

        let etcd = start(
            "etcd",
            vec![
                arg("data-dir", dir.path().join("etcd")),
                arg("listen-client-url", "http://127.0.0.1:2379"),
                arg("listen-peer-url", "http://127.0.0.1:2380"),
            ],
        )?;
        wait_for("etcd to listen", Duration::from_secs(30), || {
            Ok(ns
                .run(|| std::net::TcpStream::connect(("127.0.0.1", 2379)).is_ok())?
                .then_some(()))
        })
        .with_context(|| tail(&logs.join("etcd.log"), 20))?;
        timings.push(("etcd", t.elapsed()));

        let creds = credentials(&pki, &serving, &kubelet_client, &sa_key);
        let apiserver = start(
            "apiserver",
            cpconf::apiserver_args(
                &cpconf::Apiserver {
                    bind: addr.into(),
                    port: API_PORT,
                    etcd_url: "http://127.0.0.1:2379".into(),
                    // The harness's nodes reach it directly, on the host's address.
                    advertise: None,
                    egress_selector: None,
                    hardening: None,
                },
                &creds,
            ),
        )?;
        let mut cp = ControlPlane {
            approver: Approver::none(),
            scheduler: Spawned::none("scheduler"),
            controller_manager: Spawned::none("controller-manager"),
            apiserver,
            etcd,
            pki,
            url,
            addr,
            admin_kubeconfig,
            bins,
            ns,
            timings,
            dir,
        };
        wait_for("the apiserver to be ready", Duration::from_secs(60), || {
            Ok(cp
                .kubectl(&["get", "--raw", "/readyz"])
                .ok()
                .filter(|s| s.trim() == "ok"))
        })
        .with_context(|| tail(&cp.log("apiserver"), 30))?;
        cp.timings.push(("apiserver ready", t.elapsed()));

        let kcm_args = cpconf::controller_manager_args(&kcm_kubeconfig, &creds);
        let logs = cp.dir.path().join("logs");
        let start = |name: &str, args: Vec<std::ffi::OsString>| -> Result<Spawned> {
            let mut cmd = ns.command(&cp.bins.kube().to_string_lossy());
            cmd.arg(name).args(args);
            Spawned::start_logged(cmd, name, &logs.join(format!("{name}.log")))
        };
        let kcm_proc = start("controller-manager", kcm_args)?;
        let sched_args = cpconf::scheduler_args(&sched_kubeconfig);
        let sched_proc = start("scheduler", sched_args)?;
        cp.controller_manager = kcm_proc;
        cp.scheduler = sched_proc;
        for (name, port) in [("controller-manager", 10257), ("scheduler", 10259)] {
            wait_for(
                &format!("the {name} to be healthy"),
                Duration::from_secs(60),
                || {
                    let out = ns.output(
                        "curl",
                        &[
                            "-sk",
                            "--max-time",
                            "2",
                            &format!("https://127.0.0.1:{port}/healthz"),
                        ],
                    )?;
                    Ok((String::from_utf8_lossy(&out.stdout).trim() == "ok").then_some(()))
                },
            )
            .with_context(|| tail(&cp.log(name), 30))?;
        }
        cp.timings.push(("controllers healthy", t.elapsed()));
        // What the broker applies to every tenant cluster: what nodes need to join
        // (bootstrap-token RBAC, the cluster-info ConfigMap a pinned CA is read from) and
        // what the node agent and kube-proxy read with the node's credentials.
        cp.apply(cpconf::BOOTSTRAP_MANIFEST)?;
        cp.apply(&cpconf::cluster_info(&cp.url, cp.pki.ca_pem()).to_string())?;
        cp.apply(cpconf::AGENT_RBAC)?;
        cp.approver = Approver::start(ns, cp.admin_kubeconfig.clone())?;
        cp.timings.push(("join configuration applied", t.elapsed()));
        Ok(cp)
    }

    /// A component's log file.
    pub fn log(&self, component: &str) -> PathBuf {
        self.dir
            .path()
            .join("logs")
            .join(format!("{component}.log"))
    }

    /// Runs kubectl as the cluster admin, inside the control plane's namespace.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = self
            .ns
            .command(&self.bins.kube().to_string_lossy())
            .arg("kubectl")
            .arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
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

    /// `kubectl ... -o json`, parsed.
    pub fn kubectl_json(&self, args: &[&str]) -> Result<serde_json::Value> {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.kubectl(&a)?)?)
    }

    /// `kubectl apply -f -` with `manifest` on stdin.
    pub fn apply(&self, manifest: &str) -> Result<String> {
        super::kubectl_apply(self.ns, &self.admin_kubeconfig, manifest)
    }

    /// Names of the Nodes the cluster has.
    pub fn node_names(&self) -> Result<Vec<String>> {
        let v = self.kubectl_json(&["get", "nodes"])?;
        Ok(v["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// A kubeconfig a node's kubelet joins with: a client certificate for
    /// `system:node:<name>` in `system:nodes`, as the join hands out.
    pub fn node_kubeconfig(&self, name: &str) -> Result<PathBuf> {
        let pair = self.pki.client(
            &format!("node-{name}"),
            &format!("system:node:{name}"),
            &["system:nodes"],
        )?;
        self.pki
            .kubeconfig(&format!("node-{name}"), &self.url, &pair)
    }

    /// A new bootstrap token for a joining node at `node_ip` (as the broker makes one per
    /// lease), valid for an hour; the approver approves that node's certificates.
    pub fn new_token(
        &self,
        node: &str,
        node_ip: Option<std::net::IpAddr>,
    ) -> Result<BootstrapToken> {
        let token = cpconf::new_bootstrap_token();
        self.approver
            .plans
            .lock()
            .expect("lock")
            .push(socialweb_broker::approver::Plan {
                node: node.to_string(),
                token_id: token.id.clone(),
                token_secret: Some(token.secret.clone()),
                node_ip,
            });
        let expires = humantime::format_rfc3339_seconds(
            std::time::SystemTime::now() + Duration::from_secs(3600),
        )
        .to_string();
        self.apply(
            &cpconf::bootstrap_token_secret(&token, &format!("join {node}"), Some(&expires))
                .to_string(),
        )?;
        Ok(token)
    }

    /// The pin of the cluster CA (identity field `ca_cert_sha256`).
    pub fn ca_pin(&self) -> Result<[u8; 32]> {
        socialweb_wire::ca::pin(self.pki.ca_pem().as_bytes()).map_err(anyhow::Error::msg)
    }

    /// A scratch directory that lives as long as the control plane.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Whether every component still runs (for diagnosing a failure).
    pub fn running(&mut self) -> Vec<(&'static str, bool)> {
        vec![
            ("etcd", self.etcd.is_running()),
            ("apiserver", self.apiserver.is_running()),
            ("controller-manager", self.controller_manager.is_running()),
            ("scheduler", self.scheduler.is_running()),
        ]
    }
}

/// The control plane's credentials from its PKI (no front proxy: no aggregation here).
fn credentials(
    pki: &Pki,
    serving: &socialweb_broker::pki::Pair,
    kubelet_client: &socialweb_broker::pki::Pair,
    sa_key: &std::path::Path,
) -> Credentials {
    Credentials {
        trust: pki.ca_cert(),
        ca_cert: pki.ca_cert(),
        ca_key: pki.ca_key(),
        serving_cert: serving.cert.clone(),
        serving_key: serving.key.clone(),
        kubelet_client_cert: kubelet_client.cert.clone(),
        kubelet_client_key: kubelet_client.key.clone(),
        sa_pub: sa_key.with_extension("pub"),
        sa_key: sa_key.to_path_buf(),
        front_proxy: None,
    }
}
