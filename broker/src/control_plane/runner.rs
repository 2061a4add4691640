//! A tenant control plane, supervised: etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler from the Kubernetes we ship, started in order, each restarted with backoff
//! when it dies, stopped in reverse order. Everything listens on loopback only, on ports the
//! store leased to the cluster: nodes reach the apiserver through the broker's tunnel, and
//! the apiserver reaches them through its egress socket (contract 9). Its files (PKI, etcd's
//! data, logs) live in the cluster's directory and are removed with the cluster.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Apiserver, Credentials};
use crate::pki::Pki;
use crate::process;

/// The ports a control plane uses, leased from the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    pub api: u16,
    pub etcd_client: u16,
    pub etcd_peer: u16,
    pub controller_manager: u16,
    pub scheduler: u16,
    /// The broker's authorization webhook for this cluster (the guard).
    pub guard: u16,
}

/// Every component a control plane may run, in the order they start (a datastore first: kine
/// or etcd), each with its pidfile `run/<name>.pid`.
pub const COMPONENTS: [&str; 5] = [
    "kine",
    "etcd",
    "apiserver",
    "controller-manager",
    "scheduler",
];

/// The purposes ports are leased for, in [`Ports`] order.
pub const PORT_PURPOSES: [&str; 6] = [
    "api",
    "etcd-client",
    "etcd-peer",
    "controller-manager",
    "scheduler",
    "guard",
];

impl Ports {
    pub fn from_leased(leased: &[(String, u16)]) -> Result<Ports> {
        let get = |p: &str| {
            leased
                .iter()
                .find(|(x, _)| x == p)
                .map(|(_, port)| *port)
                .with_context(|| format!("no {p} port leased"))
        };
        Ok(Ports {
            api: get("api")?,
            etcd_client: get("etcd-client")?,
            etcd_peer: get("etcd-peer")?,
            controller_manager: get("controller-manager")?,
            scheduler: get("scheduler")?,
            guard: get("guard")?,
        })
    }
}

/// Everything a cluster's control plane is made from.
#[derive(Debug, Clone)]
pub struct Spec {
    pub cluster: String,
    /// `<state>/clusters/<name>`.
    pub dir: PathBuf,
    /// The multicall `kube` binary.
    pub kube: PathBuf,
    pub ports: Ports,
    /// Its Pods are kept off their nodes' host (namespace nodes): no privileged
    /// containers, and the node isolation policy (docs/security.md).
    pub isolated: bool,
    pub datastore: Datastore,
    /// `GOGC` for every component (Go's default is 100): how much garbage a component's
    /// heap may hold beyond its live objects, in percent (docs/hibernation.md measured it).
    pub gogc: u32,
    /// The memory, CPU and processes its components share (a cgroup of its own).
    pub budget: super::cgroup::Budget,
    /// Where that cgroup is made (`clusters.cgroup_parent`).
    pub cgroup_parent: socialweb_proc::cgroup::Parent,
    /// What its kine datastore may hold, in bytes (the broker's `quota` watch). etcd keeps
    /// its own default (2 GiB): the embedded etcd of `image-builder/kubernetes/main.go` takes
    /// no quota flag yet, and adding one rebuilds Kubernetes.
    pub datastore_quota: Option<u64>,
    /// Where the supervisor counts the components it restarts.
    pub metrics: crate::metrics::Metrics,
    /// Its components die with the broker (a fleet's: a broker that crashed renews no
    /// lease, and another host may start the cluster; nothing of it may run on here).
    pub tied: bool,
    /// `[certificates]`: its authorities' and leaves' lifetimes, and when a leaf is renewed.
    pub certificates: crate::pki::Lifetimes,
}

/// The most connections one cluster's kine opens to its PostgreSQL database. kine v0.17.5
/// inserts on PostgreSQL through its pool while holding a transaction's connection, so each
/// write in flight needs two: with every connection held by a transaction waiting for
/// another, the cluster's writes stall until their deadlines (10 stalled the conformance
/// suite). Writes in flight are bounded by the apiserver's `MAX_MUTATING_INFLIGHT` (64) plus
/// system:masters' and kine's own few, so 100 leaves room.
pub const KINE_MAX_OPEN: u32 = 100;
const _: () = assert!(KINE_MAX_OPEN >= super::MAX_MUTATING_INFLIGHT * 3 / 2);
/// The most it keeps open while idle. Under load a write returns two connections at once, so
/// an idle limit below the writes in flight closes and reopens connections (a PostgreSQL
/// process fork each): with 2, eight writers ran at 0.24x SQLite's rate, with 16 at 0.85x
/// (bench/fleet, docs/operations.md). `KINE_MAX_IDLE_TIME` gives them back once the burst is over.
pub const KINE_MAX_IDLE: u32 = 16;
/// How long a connection may stay idle before kine closes it (kine's default is 2 minutes):
/// a cluster at rest polls through one or two, so a burst's connections return to the
/// server's budget half a minute after it, not two.
pub const KINE_MAX_IDLE_TIME: &str = "30s";

/// What keeps a cluster's objects (docs/hibernation.md says how they compare): etcd, or kine
/// (the etcd API over SQLite in the cluster's directory, as k3s does). Either listens on the
/// cluster's `etcd-client` port with etcd's TLS and client-certificate check, so the
/// apiserver's flags are the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Datastore {
    Etcd,
    Kine {
        binary: PathBuf,
    },
    /// kine over the cluster's own database on a PostgreSQL server (`super::postgres`);
    /// `server` is `None` when `clusters.postgres_url` is not set (the start then fails,
    /// naming it).
    KinePostgres {
        binary: PathBuf,
        server: Option<super::postgres::Server>,
        database: String,
    },
}

impl Datastore {
    /// The component's name (its pidfile's and log's).
    pub fn component(&self) -> &'static str {
        match self {
            Datastore::Etcd => "etcd",
            Datastore::Kine { .. } | Datastore::KinePostgres { .. } => "kine",
        }
    }

    /// The PostgreSQL server and database, when the objects live there.
    pub fn postgres(&self) -> Option<(Option<&super::postgres::Server>, &str)> {
        match self {
            Datastore::KinePostgres {
                server, database, ..
            } => Some((server.as_ref(), database.as_str())),
            _ => None,
        }
    }
}

/// etcd's TLS: its own CA, its serving and peer certificates, the apiserver's client one.
#[derive(Debug, Clone)]
struct EtcdFiles {
    ca: PathBuf,
    server: crate::pki::Pair,
    peer: crate::pki::Pair,
    apiserver: crate::pki::Pair,
}

/// The files a control plane's components and its operator use.
#[derive(Debug, Clone)]
pub struct Files {
    /// The apiserver on loopback: the operator's, the front's, the broker's.
    pub url: String,
    /// The apiserver as nodes reach it: node-local, through the tunnel.
    pub node_url: String,
    pub admin_kubeconfig: PathBuf,
    pub ca_pem: String,
    /// The front's request-header client certificate (docs/api.md).
    pub front: crate::pki::Pair,
    /// The guard's serving certificate (of the cluster CA) and where the apiserver calls it.
    pub guard: crate::pki::Pair,
    pub guard_addr: std::net::SocketAddr,
    /// The apiserver's PodSecurity admission configuration (used on namespace nodes).
    admission_config: PathBuf,
    etcd: EtcdFiles,
    authorization_config: PathBuf,
    kcm_kubeconfig: PathBuf,
    scheduler_kubeconfig: PathBuf,
    creds: Credentials,
}

impl Spec {
    pub fn url(&self) -> String {
        format!("https://{}:{}", Ipv4Addr::LOCALHOST, self.ports.api)
    }

    /// The apiserver as nodes reach it (`server_url` in their identity).
    pub fn node_url(&self) -> String {
        format!(
            "https://{}:{}",
            socialweb_wire::tunnel::NODE_LOCAL_API_ADDR,
            self.ports.api
        )
    }

    /// The Unix socket the broker serves the apiserver's `cluster` egress on.
    pub fn egress_socket(&self) -> PathBuf {
        self.dir.join("run").join("egress.sock")
    }

    /// The Unix socket the broker serves the apiserver's `controlplane` egress on.
    pub fn controlplane_egress_socket(&self) -> PathBuf {
        self.dir.join("run").join("controlplane-egress.sock")
    }

    fn egress_config(&self) -> PathBuf {
        self.dir.join("run").join("egress-selector.yaml")
    }

    fn pki_dir(&self) -> PathBuf {
        self.dir.join("pki")
    }

    /// One of the cluster's authorities: its own (`sub` empty), `front-proxy` or `etcd`,
    /// named `socialweb <cluster> <what>`, with the configured lifetimes.
    fn authority(&self, sub: &str, what: &str) -> Result<Pki> {
        let dir = match sub {
            "" => self.pki_dir(),
            sub => self.pki_dir().join(sub),
        };
        Pki::open_with(
            &dir,
            &format!("socialweb {} {what}", self.cluster),
            self.certificates,
        )
    }

    /// The earliest ends of its certificates (its CAs', its leaves'), as kept on disk.
    pub fn expiry(&self) -> crate::pki::Expiry {
        let pki = self.pki_dir();
        crate::pki::earliest(&[pki.join("front-proxy"), pki.join("etcd"), pki])
    }

    /// When its earliest leaf is due to be issued again (`renew_before` ahead of its end).
    pub fn renewal_due_at(&self) -> Option<std::time::SystemTime> {
        self.expiry()
            .leaf
            .map(|end| end - self.certificates.renew_before)
    }

    fn log(&self, component: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{component}.log"))
    }

    fn pidfile(&self, component: &str) -> PathBuf {
        self.dir.join("run").join(format!("{component}.pid"))
    }

    /// The datastore's place in the cluster's directory: kine's (owner-only), the note
    /// naming its PostgreSQL database, or etcd's data directory (made from a restored
    /// backup's snapshot if one waits) and its endpoint for backups.
    fn prepare_datastore(&self) -> Result<()> {
        match &self.datastore {
            Datastore::Kine { .. } => Ok(socialweb_proc::owner_only::dir(&self.dir.join("kine"))?),
            Datastore::KinePostgres { database, .. } => super::postgres::mark(&self.dir, database),
            Datastore::Etcd => {
                let peer = format!("https://127.0.0.1:{}", self.ports.etcd_peer);
                if super::etcd_backup::restore_pending(&self.kube, &self.dir, &peer)? {
                    tracing::info!(cluster = %self.cluster, "etcd's data directory made from the restored backup's snapshot");
                }
                let client = format!("https://127.0.0.1:{}", self.ports.etcd_client);
                super::etcd_backup::record_endpoint(&self.dir, &client)
            }
        }
    }

    /// Creates the cluster's authorities where it has none (its CA and service-account
    /// key, the front-proxy CA, etcd's CA): what `vault` keeps, made before the first start
    /// so that they can be sealed before anything is signed with them.
    pub fn ensure_authorities(&self) -> Result<()> {
        let pki = self.authority("", "CA")?;
        pki.key("sa")?;
        self.authority("front-proxy", "front-proxy CA")?;
        self.authority("etcd", "etcd CA")?;
        Ok(())
    }

    /// Creates (or loads) the cluster's PKI and kubeconfigs; new authorities first when
    /// `cluster rotate-ca` asked for them ([`super::rotate`]).
    pub fn prepare(&self) -> Result<Files> {
        if let Some(how) = super::rotate::apply_pending(&self.dir)? {
            tracing::info!(cluster = %self.cluster, ?how, "new CAs made, as `cluster rotate-ca` asked; everything they sign is issued again");
        }
        let pki = self.authority("", "CA")?;
        super::rotate::cross_sign(&self.dir, &pki)?;
        let (trust, trust_pem) = self.trust(&pki)?;
        let url = self.url();
        let serving = self.serving(&pki)?;
        std::fs::create_dir_all(self.dir.join("run"))?;
        self.prepare_datastore()?;
        std::fs::write(
            self.egress_config(),
            super::egress_selector(&self.egress_socket(), &self.controlplane_egress_socket()),
        )
        .with_context(|| format!("writing {}", self.egress_config().display()))?;
        let kubelet_client = pki.client(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            &[],
        )?;
        let sa_key = pki.key("sa")?;
        let admin = pki.client("admin", "socialweb:broker", &["system:masters"])?;
        let kcm = pki.client("kcm", "system:kube-controller-manager", &[])?;
        let sched = pki.client("scheduler", "system:kube-scheduler", &[])?;
        let front_proxy = self.authority("front-proxy", "front-proxy CA")?;
        let front = front_proxy.client("front", super::FRONT_PROXY_NAME, &[])?;
        let aggregator = front_proxy.client("aggregator", super::AGGREGATOR_NAME, &[])?;
        let etcd = self.etcd_pki()?;
        let guard_addr =
            std::net::SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), self.ports.guard);
        let guard = pki.server("guard", &["127.0.0.1".to_string()])?;
        let guard_kc = self.pki_dir().join("guard.kubeconfig");
        std::fs::write(
            &guard_kc,
            super::guard_kubeconfig(&format!("https://{guard_addr}/"), &pki.ca_cert()),
        )?;
        let authorization_config = self.pki_dir().join("authorization.json");
        std::fs::write(
            &authorization_config,
            super::authorization_config(&guard_kc),
        )?;
        let admission_config = self.pki_dir().join("admission.json");
        std::fs::write(&admission_config, super::pod_security_admission())
            .with_context(|| format!("writing {}", admission_config.display()))?;
        Ok(Files {
            admission_config,
            front,
            guard,
            guard_addr,
            etcd,
            authorization_config,
            admin_kubeconfig: pki.kubeconfig("admin", &url, &admin)?,
            kcm_kubeconfig: pki.kubeconfig("kcm", &url, &kcm)?,
            scheduler_kubeconfig: pki.kubeconfig("scheduler", &url, &sched)?,
            ca_pem: trust_pem,
            node_url: self.node_url(),
            creds: Credentials {
                trust,
                ca_cert: pki.ca_cert(),
                ca_key: pki.ca_key(),
                serving_cert: serving.cert,
                serving_key: serving.key,
                kubelet_client_cert: kubelet_client.cert,
                kubelet_client_key: kubelet_client.key,
                sa_pub: sa_key.with_extension("pub"),
                sa_key,
                front_proxy: Some(super::FrontProxy {
                    ca: front_proxy.ca_cert(),
                    aggregator_cert: aggregator.cert,
                    aggregator_key: aggregator.key,
                }),
            },
            url,
        })
    }

    /// The CAs whose certificates the cluster accepts, as a file and as PEM (the signer
    /// first): the cluster CA, and while nodes move after `cluster rotate-ca` the old one
    /// beside it (`pki/ca-bundle.crt`, [`super::rotate`]).
    fn trust(&self, pki: &Pki) -> Result<(PathBuf, String)> {
        let Some(old) = super::rotate::overlapping(&self.dir) else {
            return Ok((pki.ca_cert(), pki.ca_pem().to_string()));
        };
        let pem = format!("{}{old}", pki.ca_pem());
        let path = self.pki_dir().join("ca-bundle.crt");
        crate::pki::write_private(&path, pem.as_bytes(), 0o644)?;
        Ok((path, pem))
    }

    /// The apiserver's serving certificate; while nodes move, with the new CA cross-signed by
    /// the old one after it (`pki/apiserver-chain.crt`), so that a node that trusts only the
    /// old CA still verifies it.
    fn serving(&self, pki: &Pki) -> Result<crate::pki::Pair> {
        let mut serving = pki.server(
            "apiserver",
            &super::serving_names(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        )?;
        if let (Some(cross), Some(_)) = (
            super::rotate::cross(&self.dir),
            super::rotate::overlapping(&self.dir),
        ) {
            let leaf = std::fs::read_to_string(&serving.cert)
                .with_context(|| format!("reading {}", serving.cert.display()))?;
            let chain = self.pki_dir().join("apiserver-chain.crt");
            crate::pki::write_private(&chain, format!("{leaf}{cross}").as_bytes(), 0o644)?;
            serving.cert = chain;
        }
        Ok(serving)
    }

    /// etcd's own CA and certificates (`pki/etcd`).
    fn etcd_pki(&self) -> Result<EtcdFiles> {
        let ca = self.authority("etcd", "etcd CA")?;
        let names = ["127.0.0.1".to_string(), "localhost".to_string()];
        Ok(EtcdFiles {
            // Server and client: etcd's own HTTP gateway calls its gRPC port with it.
            server: ca.peer("server", &names)?,
            peer: ca.peer("peer", &names)?,
            apiserver: ca.client("apiserver", "kube-apiserver-etcd-client", &[])?,
            ca: ca.ca_cert(),
        })
    }

    /// kine's database, when the datastore is kine.
    pub fn kine_db(&self) -> Option<PathBuf> {
        matches!(self.datastore, Datastore::Kine { .. })
            .then(|| self.dir.join("kine").join("state.db"))
    }

    /// kine's `--endpoint`: SQLite in the cluster's directory, or its PostgreSQL database
    /// (the password apart: [`Spec::kine_env`]).
    fn kine_endpoint(&self) -> String {
        match &self.datastore {
            Datastore::KinePostgres {
                server: Some(server),
                database,
                ..
            } => server.kine_endpoint(database).0,
            _ => {
                let db = self.dir.join("kine").join("state.db");
                // WAL: readers never wait for the writer; a busy timeout rather than errors.
                format!(
                    "sqlite://{}?_journal=WAL&cache=shared&_busy_timeout=30000",
                    db.display()
                )
            }
        }
    }

    /// What a component's environment has beyond `GOGC`: kine's PostgreSQL password.
    fn kine_env(&self, component: &str) -> Vec<(&'static str, String)> {
        match &self.datastore {
            Datastore::KinePostgres {
                server: Some(server),
                database,
                ..
            } if component == "kine" => server
                .kine_endpoint(database)
                .1
                .map(|p| ("PGPASSWORD", p))
                .into_iter()
                .collect(),
            _ => Vec::new(),
        }
    }

    fn kine_args(&self, e: &EtcdFiles) -> Vec<OsString> {
        let mut args = vec![
            OsString::from(format!(
                "--listen-address=127.0.0.1:{}",
                self.ports.etcd_client
            )),
            OsString::from(format!("--endpoint={}", self.kine_endpoint())),
            super::arg("server-cert-file", &e.server.cert),
            super::arg("server-key-file", &e.server.key),
            super::arg("trusted-ca-file", &e.ca),
            // Its metrics would listen on :8080 of every address.
            OsString::from("--metrics-bind-address=0"),
            // The apiserver decides what is compacted, as on etcd (every 4 minutes here, to
            // the revision it saw 4 minutes before: `apiserver_args`). kine's default floor of 1,000 revisions
            // kept a quiet cluster from compacting what the apiserver asked: the
            // conformance test of a continue token whose revision was compacted away
            // waited 10 minutes for it on SQLite and failed (docs/conformance.md).
            OsString::from("--compact-min-retain=0"),
        ];
        if matches!(self.datastore, Datastore::KinePostgres { .. }) {
            // A budget of the server's connections per cluster: kine opens as many as the
            // apiserver's requests want otherwise, and a shared PostgreSQL refuses every
            // cluster's once its max_connections is reached (docs/operations.md).
            args.extend([
                OsString::from(format!("--datastore-max-open-connections={KINE_MAX_OPEN}")),
                OsString::from(format!("--datastore-max-idle-connections={KINE_MAX_IDLE}")),
                OsString::from(format!(
                    "--datastore-connection-max-idle-time={KINE_MAX_IDLE_TIME}"
                )),
            ]);
        }
        args
    }

    /// The program a component runs, and the arguments before its flags.
    fn program(&self, component: &str) -> (PathBuf, Vec<OsString>) {
        let (program, before) = match (&self.datastore, component) {
            (Datastore::Kine { binary } | Datastore::KinePostgres { binary, .. }, "kine") => {
                (binary.clone(), Vec::new())
            }
            _ => (self.kube.clone(), vec![OsString::from(component)]),
        };
        if !self.tied {
            return (program, before);
        }
        // util-linux's setpriv sets the parent-death signal and execs the component (the
        // same pid, so the pidfile and adoption are unchanged): no unsafe pre_exec here.
        let mut tied = vec![
            OsString::from("--pdeathsig"),
            OsString::from("KILL"),
            OsString::from("--"),
            program.into_os_string(),
        ];
        tied.extend(before);
        (PathBuf::from("setpriv"), tied)
    }

    fn etcd_args(&self, e: &EtcdFiles) -> Vec<OsString> {
        let arg = |k: &str, v: &dyn AsRef<std::ffi::OsStr>| {
            let mut s = OsString::from(format!("--{k}="));
            s.push(v.as_ref());
            s
        };
        vec![
            arg("data-dir", &self.dir.join("etcd")),
            arg(
                "listen-client-url",
                &format!("https://127.0.0.1:{}", self.ports.etcd_client),
            ),
            arg(
                "listen-peer-url",
                &format!("https://127.0.0.1:{}", self.ports.etcd_peer),
            ),
            arg("cert-file", &e.server.cert),
            arg("key-file", &e.server.key),
            arg("trusted-ca-file", &e.ca),
            arg("peer-cert-file", &e.peer.cert),
            arg("peer-key-file", &e.peer.key),
            arg("peer-trusted-ca-file", &e.ca),
        ]
    }

    fn components(&self, f: &Files) -> Vec<(&'static str, Vec<OsString>)> {
        let arg = |k: &str, v: &dyn AsRef<std::ffi::OsStr>| {
            let mut s = OsString::from(format!("--{k}="));
            s.push(v.as_ref());
            s
        };
        let mut kcm = super::controller_manager_args(&f.kcm_kubeconfig, &f.creds);
        kcm.push(arg(
            "secure-port",
            &self.ports.controller_manager.to_string(),
        ));
        let mut sched = super::scheduler_args(&f.scheduler_kubeconfig);
        sched.push(arg("secure-port", &self.ports.scheduler.to_string()));
        let store = match self.datastore {
            Datastore::Etcd => self.etcd_args(&f.etcd),
            Datastore::Kine { .. } | Datastore::KinePostgres { .. } => self.kine_args(&f.etcd),
        };
        vec![
            (self.datastore.component(), store),
            (
                "apiserver",
                super::apiserver_args(
                    &Apiserver {
                        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
                        port: self.ports.api,
                        etcd_url: format!("https://127.0.0.1:{}", self.ports.etcd_client),
                        advertise: Some(IpAddr::V4(
                            socialweb_wire::tunnel::KUBERNETES_ENDPOINT_ADDR,
                        )),
                        egress_selector: Some(self.egress_config()),
                        hardening: Some(super::Hardening {
                            authorization_config: f.authorization_config.clone(),
                            allow_privileged: !self.isolated,
                            admission_config: self.isolated.then(|| f.admission_config.clone()),
                            etcd: super::EtcdClient {
                                ca: f.etcd.ca.clone(),
                                cert: f.etcd.apiserver.cert.clone(),
                                key: f.etcd.apiserver.key.clone(),
                            },
                            kubelet_ca: f.creds.trust.clone(),
                        }),
                    },
                    &f.creds,
                ),
            ),
            ("controller-manager", kcm),
            ("scheduler", sched),
        ]
    }

    /// What says a component is up: a TCP port answering, or an HTTPS health endpoint.
    fn probe(&self, component: &str) -> (IpAddr, u16, Option<&'static str>) {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        match component {
            "etcd" | "kine" => (lo, self.ports.etcd_client, None),
            "apiserver" => (lo, self.ports.api, Some("/readyz")),
            "controller-manager" => (lo, self.ports.controller_manager, Some("/healthz")),
            _ => (lo, self.ports.scheduler, Some("/healthz")),
        }
    }
}

/// How a control plane is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Starting(String),
    Ready,
    Degraded(String),
    Stopped,
}

/// A running control plane; stop it with [`Running::stop`].
#[derive(Debug)]
pub struct Running {
    pub health: watch::Receiver<Health>,
    /// True once the apiserver answers `/readyz` (before the controller-manager and the
    /// scheduler are up): what a request held at the front waits for.
    pub api_ready: watch::Receiver<bool>,
    pub files: Files,
    /// Where the broker serves the apiserver's `cluster` egress.
    pub egress_socket: PathBuf,
    stop: CancellationToken,
    /// Set by [`Running::kill`]: no grace for any component.
    at_once: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

async fn healthy(http: &reqwest::Client, addr: IpAddr, port: u16, path: Option<&str>) -> bool {
    match path {
        None => tokio::net::TcpStream::connect((addr, port)).await.is_ok(),
        Some(p) => http
            .get(format!("https://{addr}:{port}{p}"))
            .send()
            .await
            .map(|r| r.status().is_success())
            .unwrap_or(false),
    }
}

impl Running {
    /// Starts the control plane of `spec` with the `files` its [`Spec::prepare`] made; its
    /// health says when it is ready.
    pub fn start(spec: Spec, files: Files) -> Result<Running> {
        let egress_socket = spec.egress_socket();
        let (tx, rx) = watch::channel(Health::Starting("starting the datastore".into()));
        let (api_tx, api_rx) = watch::channel(false);
        let stop = CancellationToken::new();
        let cgroup = if spec.budget.is_none() {
            None
        } else {
            Some(
                super::cgroup::Cgroup::create_under(
                    spec.cgroup_parent,
                    &super::cgroup::name_for(&spec.dir),
                    &spec.budget,
                )
                .context(
                    "the cluster's budget (clusters.memory_max_mib, pids_max and cpu_max = 0 \
                         run control planes without one)",
                )?,
            )
        };
        let at_once = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(supervise(
            spec,
            files.clone(),
            cgroup,
            (tx, api_tx),
            (stop.clone(), at_once.clone()),
        ));
        Ok(Running {
            health: rx,
            api_ready: api_rx,
            files,
            egress_socket,
            stop,
            at_once,
            task,
        })
    }

    /// Waits until ready or `timeout`.
    pub async fn ready(&mut self, timeout: Duration) -> Result<()> {
        let ok = matches!(
            tokio::time::timeout(timeout, self.health.wait_for(|h| *h == Health::Ready)).await,
            Ok(Ok(_))
        );
        if !ok {
            bail!(
                "control plane not ready after {timeout:?}: {:?}",
                *self.health.borrow()
            );
        }
        Ok(())
    }

    /// Stops every component, the last started first.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }

    /// Kills every component at once (SIGKILL, no grace): a host that lost the cluster's
    /// lease must be down before another host may start it.
    pub async fn kill(self) {
        self.at_once.store(true, Ordering::SeqCst);
        self.stop().await;
    }
}

/// A component's process: one this broker started, or one a previous broker did.
enum Proc {
    Own(tokio::process::Child),
    Adopted { pid: u32, started: u64 },
}

impl Proc {
    /// How it ended, if it has.
    fn exited(&mut self) -> Option<String> {
        match self {
            Proc::Own(c) => c.try_wait().ok().flatten().map(|s| s.to_string()),
            Proc::Adopted { pid, started } => (process::start_time(*pid) != Some(*started))
                .then(|| format!("adopted process {pid} is gone")),
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            Proc::Own(c) => c.id(),
            Proc::Adopted { pid, .. } => Some(*pid),
        }
    }
}

/// The supervisor's memory of each component: its process, its restarts, when to try next.
struct Supervisor {
    spec: Spec,
    files: Files,
    health: watch::Sender<Health>,
    api_ready: watch::Sender<bool>,
    http: reqwest::Client,
    components: Vec<(&'static str, Vec<OsString>)>,
    children: Vec<Option<Proc>>,
    restarts: Vec<u32>,
    next_try: Vec<tokio::time::Instant>,
    /// The cluster's cgroup, which every component enters as it starts.
    cgroup: Option<super::cgroup::Cgroup>,
}

impl Supervisor {
    fn new(
        spec: Spec,
        files: Files,
        (health, api_ready): (watch::Sender<Health>, watch::Sender<bool>),
    ) -> Supervisor {
        crate::crypto_provider();
        let http = reqwest::Client::builder()
            .danger_accept_invalid_certs(true) // loopback health checks only; no credentials sent
            .timeout(Duration::from_secs(2))
            .build()
            .expect("an HTTP client");
        let components = spec.components(&files);
        // What a broker that crashed left running is adopted, not started twice: the
        // tenant's API stays up through a broker crash.
        let children: Vec<Option<Proc>> = components
            .iter()
            .map(|(name, _)| {
                process::adopt(&spec.pidfile(name)).map(|(pid, started)| {
                    info!(cluster = %spec.cluster, component = name, pid, "{name} adopted");
                    Proc::Adopted { pid, started }
                })
            })
            .collect();
        let n = components.len();
        Supervisor {
            spec,
            files,
            health,
            api_ready,
            http,
            components,
            children,
            restarts: vec![0; n],
            next_try: vec![tokio::time::Instant::now(); n],
            cgroup: None,
        }
    }

    /// Bounds each component's log (its output, appended forever otherwise).
    fn rotate_logs(&self) {
        for (name, _) in &self.components {
            let log = self.spec.log(name);
            match process::rotate(&log, process::LOG_MAX_BYTES) {
                Ok(true) => info!(cluster = %self.spec.cluster, component = name,
                                  "{} moved to .1 at {} MiB", log.display(), process::LOG_MAX_BYTES >> 20),
                Ok(false) => {}
                Err(e) => warn!(cluster = %self.spec.cluster, "rotating {}: {e}", log.display()),
            }
        }
    }

    /// Reaps component `i` if it died (its restart backed off).
    fn reap(&mut self, i: usize) {
        let name = self.components[i].0;
        if let Some(c) = self.children[i].as_mut()
            && let Some(status) = c.exited()
        {
            warn!(cluster = %self.spec.cluster, component = name, "{name} exited ({status}); restarting");
            self.children[i] = None;
            self.restarts[i] += 1;
            self.spec
                .metrics
                .component_restarted(&self.spec.cluster, name);
            let delay = Duration::from_millis(500 * 2u64.pow(self.restarts[i].min(6)));
            self.next_try[i] = tokio::time::Instant::now() + delay;
            let _ = self
                .health
                .send(Health::Degraded(format!("{name} exited ({status})")));
        }
    }

    /// Starts component `i` if it is not running and its time has come; whether it runs.
    fn start(&mut self, i: usize) -> bool {
        if self.children[i].is_some() {
            return true;
        }
        if tokio::time::Instant::now() < self.next_try[i] {
            return false;
        }
        let (name, args) = &self.components[i];
        let (program, before) = self.spec.program(name);
        match process::spawn(
            &program,
            &[before.as_slice(), args.as_slice()].concat(),
            &[
                vec![("GOGC", self.spec.gogc.to_string())],
                self.spec.kine_env(name),
            ]
            .concat(),
            &self.spec.log(name),
            &self.spec.pidfile(name),
        ) {
            Ok(c) => {
                // Into the budget before it has done much: at most what a process does
                // between exec and here runs outside it.
                if let (Some(cg), Some(pid)) = (&self.cgroup, c.id())
                    && let Err(e) = cg.enter(pid)
                {
                    warn!(cluster = %self.spec.cluster, component = name, "{e:#}");
                }
                info!(cluster = %self.spec.cluster, component = name, "{name} started");
                self.children[i] = Some(Proc::Own(c));
                true
            }
            Err(e) => {
                warn!(cluster = %self.spec.cluster, "starting {name}: {e:#}");
                self.next_try[i] = tokio::time::Instant::now() + Duration::from_secs(5);
                false
            }
        }
    }

    /// One pass over the components in order, each started once the one before is healthy;
    /// whether all are.
    async fn pass(&mut self) -> bool {
        for i in 0..self.components.len() {
            self.reap(i);
            if !self.start(i) {
                return false;
            }
            let name = self.components[i].0;
            let (addr, port, path) = self.spec.probe(name);
            if !healthy(&self.http, addr, port, path).await {
                if !matches!(*self.health.borrow(), Health::Degraded(_)) {
                    let _ = self
                        .health
                        .send(Health::Starting(format!("waiting for {name}")));
                }
                // Later components wait for this one.
                return false;
            }
            if name == "apiserver" {
                self.api_ready
                    .send_if_modified(|r| !std::mem::replace(r, true));
            }
        }
        if *self.health.borrow() != Health::Ready {
            info!(cluster = %self.spec.cluster, url = %self.files.url, "control plane ready");
            let _ = self.health.send(Health::Ready);
        }
        true
    }

    /// Gives up the stopped controller-manager's leader lease (it keeps it when stopped,
    /// unlike the scheduler), while the apiserver still runs: the next start's
    /// controller-manager -- a wake, or another host of a fleet -- acts at once instead of
    /// after the lease's 15 s. Best effort: the lease expires by itself.
    async fn release_leader_lease(&self) {
        let deleted = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::process::Command::new(&self.spec.kube)
                .arg("kubectl")
                .arg(format!(
                    "--kubeconfig={}",
                    self.files.admin_kubeconfig.display()
                ))
                .args([
                    "--request-timeout=5s",
                    "--namespace=kube-system",
                    "delete",
                    "lease",
                    "kube-controller-manager",
                    "--ignore-not-found",
                ])
                .stdin(std::process::Stdio::null())
                .output(),
        )
        .await;
        match deleted {
            Ok(Ok(o)) if o.status.success() => {}
            Ok(Ok(o)) => {
                warn!(cluster = %self.spec.cluster, "releasing the controller-manager's lease: {}", String::from_utf8_lossy(&o.stderr).trim())
            }
            Ok(Err(e)) => {
                warn!(cluster = %self.spec.cluster, "releasing the controller-manager's lease: {e}")
            }
            Err(_) => {
                warn!(cluster = %self.spec.cluster, "releasing the controller-manager's lease: no answer in 10s")
            }
        }
    }

    /// Stops every component, the last started first.
    async fn stop_all(&mut self, grace: Duration) {
        for i in (0..self.components.len()).rev() {
            let name = self.components[i].0;
            if let Some(c) = self.children[i].take()
                && let Some(pid) = c.pid()
            {
                process::terminate(pid, grace).await;
                let _ = std::fs::remove_file(self.spec.pidfile(name));
                if name == "controller-manager" && !grace.is_zero() {
                    self.release_leader_lease().await;
                }
            }
        }
        if let Some(cg) = &self.cgroup {
            cg.remove();
        }
        let _ = self.health.send(Health::Stopped);
        info!(cluster = %self.spec.cluster, "control plane stopped");
    }
}

/// Starts the components in order (each once the previous is healthy), restarts any that
/// dies with backoff, reports health, and stops them in reverse on cancel.
async fn supervise(
    spec: Spec,
    files: Files,
    cgroup: Option<super::cgroup::Cgroup>,
    health: (watch::Sender<Health>, watch::Sender<bool>),
    (stop, at_once): (CancellationToken, Arc<AtomicBool>),
) {
    let mut s = Supervisor::new(spec, files, health);
    s.cgroup = cgroup;
    // What a previous broker left running joins the budget too (a no-op if it is in).
    if let Some(cg) = &s.cgroup {
        for pid in s.children.iter().flatten().filter_map(Proc::pid) {
            if let Err(e) = cg.enter(pid) {
                warn!(cluster = %s.spec.cluster, "{e:#}");
            }
        }
    }
    loop {
        let all_ready = s.pass().await;
        s.rotate_logs();
        let again = Duration::from_millis(if all_ready { 1000 } else { 100 });
        tokio::select! {
            _ = tokio::time::sleep(again) => {}
            _ = stop.cancelled() => break,
        }
    }
    let grace = if at_once.load(Ordering::SeqCst) {
        Duration::ZERO
    } else {
        Duration::from_secs(10)
    };
    s.stop_all(grace).await;
}

/// Stops what a previous broker left running of `spec`'s control plane (a cluster that
/// hibernates runs nothing), last component first.
pub async fn stop_leftovers(spec: &Spec) {
    for name in COMPONENTS.iter().rev() {
        let pidfile = spec.pidfile(name);
        if let Some((pid, _)) = process::adopt(&pidfile) {
            warn!(cluster = %spec.cluster, component = name, pid, "stopping a leftover {name} a previous broker left running");
            process::terminate(pid, Duration::from_secs(10)).await;
        }
        let _ = std::fs::remove_file(pidfile);
    }
}

/// Applies `manifest` (YAML or JSON) with `kube kubectl apply`, as the cluster's admin.
pub async fn apply(kube: &Path, admin_kubeconfig: &Path, manifest: &str) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(kube)
        .arg("kubectl")
        .arg(format!("--kubeconfig={}", admin_kubeconfig.display()))
        .args(["apply", "--server-side", "--force-conflicts", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running kubectl apply")?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(manifest.as_bytes())
        .await?;
    let out = child.wait_with_output().await?;
    if !out.status.success() {
        bail!(
            "kubectl apply: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
