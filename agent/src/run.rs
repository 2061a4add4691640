//! `socialweb-agent run`: the agent's life on a node, as the one process the node's init
//! starts. It reads the identity (refusing a bad one), then brings the node up in order, each
//! step retried on a timer until it holds:
//!
//! sysctls → node-local DNS → the mesh → the tunnel to the broker → containerd → seed images
//! → trust in the control plane → the kubelet (TLS bootstrap) → the Node registered with a pod
//! CIDR (and marked `NetworkUnavailable`) → the bridge and the CNI configuration → the mesh
//! annotation → a live path to every peer (the Node schedulable) → kube-proxy.
//!
//! With `--peers` (a static directory, for nodes without Kubernetes) only the first three and
//! the pod network run. Afterwards it follows the peer directory, keeps the children running,
//! and on SIGTERM or Ctrl-C stops them in order and removes what it installed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use ipnet::IpNet;
use socialweb_wire::NodeIdentity;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::backoff::Backoff;
use crate::ctl::protocol::{PingResult, Request, Response};
use crate::directory::static_file;
use crate::join::config as files;
use crate::join::proxy_mode::{self, ProxyChoice};
use crate::join::{self, Machine, images, sysctl, trust, write_file, write_json};
use crate::mesh::{self, Mesh, MeshConfig, egress};
use crate::node::{self, PodNetwork};
use crate::status::{AgentStatus, Steps};
use crate::supervise::{ChildSpec, Supervisor};
use socialweb_mesh_core::directory::{self as peer_directory, NodeEntry};

/// What `run` is told on its command line.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub identity: PathBuf,
    /// A static peer directory: no Kubernetes, no join.
    pub peers: Option<PathBuf>,
    pub machine: Machine,
    /// The kubelet's `--node-ip`; `None`: the address of the default route's interface.
    pub node_ip: Option<Ipv4Addr>,
    pub proxy: ProxyChoice,
    pub ctl_socket: PathBuf,
    pub mesh_listen: SocketAddr,
    pub tun: String,
    pub mtu: u16,
    pub mesh_tuning: mesh::transport::Tuning,
    pub masquerade: bool,
    /// `None`: leave the bridge and the CNI configuration alone.
    pub pod_network: Option<PodNetwork>,
    /// Where node-local DNS listens; `None`: no DNS.
    pub dns_listen: Option<SocketAddr>,
    /// UDP serving threads for DNS.
    pub dns_threads: usize,
    /// Receive buffer of each DNS UDP socket; 0: the kernel's default.
    pub dns_rcvbuf: usize,
}

/// The bring-up steps, in order.
pub const JOIN_STEPS: &[&str] = &[
    "sysctls",
    "dns",
    "mesh",
    "tunnel",
    "containerd",
    "images",
    "trust",
    "kubelet",
    "node",
    "pod-network",
    "mesh-annotation",
    "mesh-paths",
    "kube-proxy",
];
/// The steps of a node with a static directory.
pub const STATIC_STEPS: &[&str] = &["sysctls", "dns", "mesh", "pod-network"];

/// Reads and validates the identity document.
pub fn read_identity(path: &std::path::Path) -> Result<NodeIdentity> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("reading the identity document {}", path.display()))?;
    NodeIdentity::from_json(&bytes).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// What the control socket and the shutdown see of the running agent.
#[derive(Debug)]
struct Shared {
    id: NodeIdentity,
    opts: RunOptions,
    steps: Steps,
    children: Supervisor,
    mesh: OnceLock<Mesh>,
    tunnel: OnceLock<crate::tunnel::Tunnel>,
    dns: OnceLock<(Arc<crate::dns::Dns>, crate::dns::bind::Placement)>,
    /// Whether the masquerade table was installed (to remove it on shutdown).
    masquerade_installed: Mutex<bool>,
}

struct Handler(Arc<Shared>);

impl crate::ctl::server::Handler for Handler {
    async fn handle(&self, req: Request) -> Response {
        let s = &self.0;
        let not_yet = |what: &str| {
            let step = s.steps.snapshot().into_iter().find(|st| st.name == what);
            anyhow!(
                "the {what} is not up yet (step {what}: {})",
                step.map(|st| format!(
                    "{:?}{}",
                    st.state,
                    st.last_error.map(|e| format!(", {e}")).unwrap_or_default()
                ))
                .unwrap_or_else(|| "not part of this agent".into())
            )
        };
        let result: Result<serde_json::Value> = async {
            Ok(match req {
                Request::Status => serde_json::to_value(AgentStatus {
                    node: s.id.node.clone(),
                    cluster: s.id.cluster.clone(),
                    ready: s.steps.all_done(),
                    steps: s.steps.snapshot(),
                    children: s.children.status(),
                    tunnel: s.tunnel.get().map(|t| t.status()),
                })?,
                Request::MeshStatus => {
                    serde_json::to_value(s.mesh.get().ok_or_else(|| not_yet("mesh"))?.status())?
                }
                Request::MeshRoutes => serde_json::to_value(
                    s.mesh
                        .get()
                        .ok_or_else(|| not_yet("mesh"))?
                        .routes()
                        .await?,
                )?,
                Request::MeshPing { target } => {
                    let mesh = s.mesh.get().ok_or_else(|| not_yet("mesh"))?;
                    let (node, rtt, path) = mesh.ping(&target).await?;
                    serde_json::to_value(PingResult {
                        node,
                        rtt_ms: rtt.as_secs_f64() * 1e3,
                        path,
                    })?
                }
                Request::DnsStats => match (&s.opts.dns_listen, s.dns.get()) {
                    (None, _) => {
                        bail!("node-local DNS is not running in this agent (started with --no-dns)")
                    }
                    (Some(_), None) => return Err(not_yet("dns")),
                    (Some(_), Some((dns, _))) => serde_json::to_value(dns.stats())?,
                },
            })
        }
        .await;
        match result {
            Ok(v) => Response::Ok(v),
            Err(e) => Response::Error(format!("{e:#}")),
        }
    }
}

fn retry() -> Backoff {
    Backoff::new(Duration::from_millis(500), Duration::from_secs(15))
}

pub async fn run(opts: RunOptions) -> Result<()> {
    let id = read_identity(&opts.identity)?;
    info!(node = %id.node, cluster = %id.cluster, "identity read");
    crate::guest_port::report_started(&id.node);
    let join = opts.peers.is_none();
    let m = &opts.machine;
    let steps = Steps::new(
        if join { JOIN_STEPS } else { STATIC_STEPS },
        Some(m.ready_file()),
    );
    let shared = Arc::new(Shared {
        id,
        children: Supervisor::new(&m.run_dir),
        opts: opts.clone(),
        steps,
        mesh: OnceLock::new(),
        tunnel: OnceLock::new(),
        dns: OnceLock::new(),
        masquerade_installed: Mutex::new(false),
    });
    let _ctl = crate::ctl::server::serve(&opts.ctl_socket, Arc::new(Handler(shared.clone())))?;
    info!(socket = %opts.ctl_socket.display(), "control socket ready");

    let stop = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let result = tokio::select! {
        r = bring_up(shared.clone(), stop.clone()) => r,
        _ = tokio::signal::ctrl_c() => Ok(()),
        _ = term.recv() => Ok(()),
    };
    stop.cancel();
    if let Err(e) = &result {
        error!("{e:#}");
    }
    info!("shutting down");
    teardown(&shared).await;
    result
}

/// Every step in order, then follows the directory until cancelled. Returns only on an error
/// no retry can fix.
async fn bring_up(s: Arc<Shared>, stop: CancellationToken) -> Result<()> {
    let id = &s.id;
    let opts = &s.opts;
    let m = &opts.machine;

    s.steps
        .until_done("sysctls", retry(), || async {
            let missing = sysctl::apply()?;
            Ok((
                (),
                (!missing.is_empty()).then(|| format!("not available: {}", missing.join(", "))),
            ))
        })
        .await;

    if let Some(addr) = opts.dns_listen {
        s.steps
            .until_done("dns", retry(), || async {
                let (dns, placement, ups) = start_dns(id, addr, opts).await?;
                let detail = format!("{addr} on {placement:?}, upstreams {ups:?}");
                let _ = s.dns.set((dns, placement));
                Ok(((), Some(detail)))
            })
            .await;
    } else {
        s.steps.done("dns", Some("disabled (--no-dns)".into()));
    }

    let mesh = s
        .steps
        .until_done("mesh", retry(), || async {
            let mesh = Mesh::start(MeshConfig {
                node: id.node.clone(),
                endpoint: mesh::transport::EndpointConfig {
                    secret_key: id.mesh_secret_key.0,
                    relay_url: id.relay_url.clone(),
                    bind: opts.mesh_listen,
                    pod_mtu: opts.mtu,
                    tuning: opts.mesh_tuning,
                    relay_ca: relay_ca(id)?,
                },
                tun_name: opts.tun.clone(),
                mtu: opts.mtu,
                node_ip: id.node_ip,
            })
            .await?;
            let detail = format!(
                "endpoint {} on {:?}{}",
                mesh.endpoint_id(),
                mesh.bound_addrs(),
                id.node_ip
                    .map(|ip| format!(", node address {ip}"))
                    .unwrap_or_default()
            );
            Ok((mesh, Some(detail)))
        })
        .await;
    let _ = s.mesh.set(mesh.clone());

    if let Some(peers) = &opts.peers {
        let directory = static_file::watch(peers.clone(), Duration::from_millis(500))?;
        return follow_directory(s.clone(), directory, None, stop).await;
    }
    tunnel_up(&s, &mesh).await;

    // containerd, then the images it should have before any Pod starts.
    s.steps
        .until_done("containerd", retry(), || async {
            write_file(
                &m.containerd_config(),
                files::containerd_toml(m).as_bytes(),
                0o644,
            )?;
            s.children
                .start(ChildSpec {
                    name: "containerd".into(),
                    program: m.containerd.clone(),
                    args: vec!["--config".into(), m.containerd_config().into()],
                    log: m.log("containerd"),
                })
                .await?;
            join::wait_socket(&m.containerd_socket(), Duration::from_secs(30)).await?;
            Ok((
                (),
                Some(format!("serving {}", m.containerd_socket().display())),
            ))
        })
        .await;
    s.steps
        .until_done("images", retry(), || async {
            let n = images::import_new(
                &m.ctr,
                &m.containerd_socket(),
                &m.seed_images,
                &m.images_record(),
                |line| s.steps.detail("images", line),
            )
            .await?;
            let total = images::archives(&m.seed_images)?.len();
            let (ctr, socket, disk, record) = (
                m.ctr.clone(),
                m.containerd_socket(),
                m.seed_disk.clone(),
                m.images_record(),
            );
            let shared = s.clone();
            let (from_disk, on_disk) = tokio::task::spawn_blocking(move || {
                images::import_disk(&ctr, &socket, &disk, &record, |line| {
                    shared.steps.detail("images", line)
                })
            })
            .await??;
            let disk = if on_disk > 0 {
                format!(
                    "; {on_disk} on the seed disk {}, {from_disk} imported now",
                    m.seed_disk.display()
                )
            } else {
                String::new()
            };
            Ok((
                (),
                Some(format!(
                    "{total} seed archives in {}, {n} imported now{disk}",
                    m.seed_images.display()
                )),
            ))
        })
        .await;

    // Trust before any secret is sent, then the token.
    s.steps
        .until_done("trust", retry(), || async {
            let ca = trust::trusted_ca(&id.server_url, &id.ca).await?;
            write_file(&m.ca_file(), ca.as_bytes(), 0o644)?;
            if join::kubelet_joined(m, &ca)? {
                return Ok((
                    (),
                    Some("already joined: the kubelet holds its client certificate".into()),
                ));
            }
            let user = trust::check_token(&id.server_url, &ca, &id.join_token).await?;
            write_json(
                &m.bootstrap_kubeconfig(),
                &files::bootstrap_kubeconfig(id, &ca),
                0o600,
            )?;
            Ok((
                (),
                Some(format!("CA verified; join token accepted as {user}")),
            ))
        })
        .await;

    let node_ip = s
        .steps
        .until_done("kubelet", retry(), || async {
            let ip = match (id.node_ip, opts.node_ip) {
                (Some(IpAddr::V4(ip)), _) | (None, Some(ip)) => ip,
                (Some(IpAddr::V6(ip)), _) => {
                    bail!("node_ip {ip}: IPv6 node addresses are not supported yet")
                }
                (None, None) => {
                    mesh::routes::default_source_v4(&mesh::routes::handle().await?).await?
                }
            };
            let upstreams = join::upstreams(
                id,
                opts.dns_listen
                    .map(|a| a.ip())
                    .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            );
            write_file(
                &m.resolv_conf(),
                files::resolv_conf(&upstreams).as_bytes(),
                0o644,
            )?;
            write_json(
                &m.kubelet_config_file(),
                &files::kubelet_config(id, m, ip, m.kubelet_config_patch.as_ref()),
                0o644,
            )?;
            s.children
                .start(ChildSpec {
                    name: "kubelet".into(),
                    program: m.kubelet.clone(),
                    args: files::kubelet_args(id, m, ip)
                        .into_iter()
                        .map(Into::into)
                        .collect(),
                    log: m.log("kubelet"),
                })
                .await?;
            Ok((ip, Some(format!("node IP {ip}"))))
        })
        .await;

    // The Node, through the kubelet's own credentials once they exist.
    let client = wait_registered(&s).await;
    if let Some((dns, _)) = s.dns.get() {
        crate::dns::kube::watch(
            client.clone(),
            id.node.clone(),
            id.cluster_domain.clone(),
            dns.clone(),
        );
    }
    tokio::spawn(label_own(client.clone(), id.clone()));
    let endpoint = mesh.endpoint_id().to_string();
    let directory = crate::directory::kube::watch(
        client.clone(),
        id.node.clone(),
        endpoint.clone(),
        id.node_ip,
    );
    let (net_tx, mut net_rx) = watch::channel(false);
    tokio::spawn(follow_directory(
        s.clone(),
        directory,
        Some(net_tx),
        stop.clone(),
    ));
    // The rest waits for the pod network, as the order says.
    while !*net_rx.borrow_and_update() {
        if net_rx.changed().await.is_err() {
            bail!("the directory follower ended");
        }
    }

    s.steps
        .until_done("mesh-annotation", retry(), || async {
            crate::directory::kube::annotate_own(&client, &id.node, &endpoint, &mesh.bound_addrs())
                .await?;
            Ok(((), Some(format!("endpoint {endpoint}"))))
        })
        .await;
    paths_to_every_peer(&s, &mesh, &client, &m.kubelet_cert_dir()).await;

    let mode = proxy_mode::resolve(opts.proxy).await;
    s.steps
        .until_done("kube-proxy", retry(), || async {
            write_json(
                &m.kube_proxy_config_file(),
                &files::kube_proxy_config(id, m, mode),
                0o644,
            )?;
            s.children
                .start(ChildSpec {
                    name: "kube-proxy".into(),
                    program: m.kube_proxy.clone(),
                    args: vec![format!("--config={}", m.kube_proxy_config_file().display()).into()],
                    log: m.log("kube-proxy"),
                })
                .await?;
            Ok((
                (),
                Some(format!("{} mode, node IP {node_ip}", mode.as_str())),
            ))
        })
        .await;

    stop.cancelled().await;
    Ok(())
}

/// The relay's CA from the identity, as DER.
fn relay_ca(id: &NodeIdentity) -> Result<Option<Vec<u8>>> {
    id.relay_ca
        .as_deref()
        .map(|pem| {
            socialweb_wire::ca::certificates(pem.as_bytes())
                .map_err(|e| anyhow!("relay_ca_cert: {e}"))
                .and_then(|mut c| {
                    if c.is_empty() {
                        bail!("relay_ca_cert holds no certificate")
                    }
                    Ok(c.remove(0).der)
                })
        })
        .transpose()
}

/// The tunnel to the broker (contract 9): `server_url`'s address placed on the node and
/// served through it. Without a broker in the identity the node reaches `server_url` itself.
async fn tunnel_up(s: &Arc<Shared>, mesh: &Mesh) {
    let id = &s.id;
    let Some(broker) = id.broker.clone() else {
        s.steps.done(
            "tunnel",
            Some(format!("none: {} is reached directly", id.server_url)),
        );
        return;
    };
    let t = s
        .steps
        .until_done("tunnel", retry(), || async {
            let node_local = api_listen_addr(&id.server_url)?;
            // The `kubernetes` Service's endpoint, on the same port (the apiserver's).
            let endpoint = SocketAddr::new(
                socialweb_wire::tunnel::KUBERNETES_ENDPOINT_ADDR.into(),
                node_local.port(),
            );
            let listen = vec![node_local, endpoint];
            for a in &listen {
                if let std::net::IpAddr::V4(ip) = a.ip() {
                    crate::dns::bind::ensure(&mesh::routes::handle().await?, ip).await?;
                }
            }
            let node_ip = id
                .node_ip
                .context("the identity names a broker but no node_ip")?;
            let t = match s.tunnel.get() {
                Some(t) => t.clone(),
                None => {
                    let t = crate::tunnel::Tunnel::start(
                        mesh.endpoint(),
                        crate::tunnel::TunnelConfig {
                            broker: broker.clone(),
                            relay_url: id.relay_url.clone(),
                            listen,
                            node_ip,
                            service_cidr: id.service_cidr,
                        },
                    )
                    .await?;
                    let _ = s.tunnel.set(t.clone());
                    t
                }
            };
            t.wait_connected(Duration::from_secs(20)).await?;
            let st = t.status();
            Ok((
                t,
                Some(format!(
                    "the apiserver on {node_local} and {endpoint} through the broker, {}",
                    st.path
                )),
            ))
        })
        .await;
    let _ = t;
}

/// Where the node serves the apiserver: `server_url`'s address and port.
fn api_listen_addr(server: &url::Url) -> Result<SocketAddr> {
    let host = server.host_str().context("server_url has no host")?;
    let ip: IpAddr = host
        .trim_matches(['[', ']'])
        .parse()
        .with_context(|| format!("server_url's host {host} is not an IP address"))?;
    Ok(SocketAddr::new(
        ip,
        server.port_or_known_default().unwrap_or(443),
    ))
}

/// Keeps the Node unschedulable (`NetworkUnavailable`) until the mesh has a live connection
/// to every peer in the directory, so that a Pod placed on it reaches every other node's Pods
/// from its first packet (the convention CNIs follow; the node lifecycle controller taints
/// and untaints the Node from the condition), and until the kubelet has its serving
/// certificate (the broker approves it; until then the apiserver, which verifies kubelets,
/// could not exec, attach or read logs on this node -- GitLab Runner's
/// FF_WAIT_FOR_POD_TO_BE_REACHABLE is the symptom elsewhere).
async fn paths_to_every_peer(
    s: &Arc<Shared>,
    mesh: &Mesh,
    client: &kube::Client,
    cert_dir: &std::path::Path,
) {
    let serving = cert_dir.join("kubelet-server-current.pem");
    s.steps
        .until_done("mesh-paths", retry(), || async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                if !serving.exists() {
                    s.steps.detail(
                        "mesh-paths",
                        "waiting for the kubelet's serving certificate (the broker approves it)"
                            .into(),
                    );
                    if tokio::time::Instant::now() > deadline {
                        bail!(
                            "no kubelet serving certificate after 60 s: {} is missing",
                            serving.display()
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                let st = mesh.status();
                let waiting: Vec<&str> = st
                    .peers
                    .iter()
                    .filter(|p| !p.connected)
                    .map(|p| p.node.as_str())
                    .collect();
                if waiting.is_empty() {
                    set_network_available(client, &s.id.node, true).await?;
                    let n = st.peers.len();
                    return Ok(((), Some(format!("connected to all {n} peers; schedulable"))));
                }
                s.steps
                    .detail("mesh-paths", format!("waiting for {}", waiting.join(", ")));
                if tokio::time::Instant::now() > deadline {
                    bail!("no connection to {} after 60 s", waiting.join(", "));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
}

/// Sets this Node's `NetworkUnavailable` condition (a node may patch its own status).
async fn set_network_available(client: &kube::Client, node: &str, up: bool) -> Result<()> {
    use kube::api::{Api, Patch, PatchParams};
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let (status, reason, message) = if up {
        (
            "False",
            "SocialwebMeshUp",
            "the mesh has a live path to every peer",
        )
    } else {
        (
            "True",
            "SocialwebMeshConnecting",
            "the mesh is connecting to its peers",
        )
    };
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": "NetworkUnavailable", "status": status, "reason": reason, "message": message,
        "lastTransitionTime": now, "lastHeartbeatTime": now,
    }]}});
    Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .with_context(|| format!("setting NetworkUnavailable={status} on Node {node}"))?;
    Ok(())
}

/// Waits for the kubelet's client certificate and the Node with its pod CIDR; returns a
/// client with the node's credentials.
async fn wait_registered(s: &Shared) -> kube::Client {
    use k8s_openapi::api::core::v1::Node;
    let m = &s.opts.machine;
    let me = &s.id.node;
    let mut backoff = retry();
    s.steps.running(
        "node",
        Some("waiting for the kubelet's client certificate (CSR approval)".into()),
    );
    loop {
        let attempt: Result<Option<kube::Client>> = async {
            if !m.kubelet_kubeconfig().exists() {
                s.steps.detail(
                    "node",
                    "waiting for the kubelet's client certificate (CSR approval)".into(),
                );
                return Ok(None);
            }
            let client = crate::directory::kube::client(&m.kubelet_kubeconfig()).await?;
            let api: kube::Api<Node> = kube::Api::all(client.clone());
            match api
                .get_opt(me)
                .await
                .with_context(|| format!("reading Node {me}"))?
            {
                None => {
                    s.steps.detail(
                        "node",
                        format!("waiting for the kubelet to register Node {me}"),
                    );
                    Ok(None)
                }
                Some(n) => match n.spec.and_then(|sp| sp.pod_cidr) {
                    None => {
                        s.steps.detail(
                            "node",
                            "waiting for the control plane to allocate a pod CIDR".into(),
                        );
                        Ok(None)
                    }
                    Some(cidr) => {
                        // Unschedulable until the mesh reaches every peer (mesh-paths).
                        set_network_available(&client, me, false).await?;
                        s.steps.done(
                            "node",
                            Some(format!("Node {me} registered, pod CIDR {cidr}")),
                        );
                        Ok(Some(client))
                    }
                },
            }
        }
        .await;
        match attempt {
            Ok(Some(c)) => return c,
            Ok(None) => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => {
                let delay = backoff.next_delay();
                s.steps.failed("node", format!("{e:#}"), delay);
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Follows the peer directory: the mesh's peers, and this node's own pod network (bridge, CNI
/// configuration, masquerade), retried on a timer while it fails and redone when the pod CIDR
/// changes. Says on `net_done` when the pod network first holds.
async fn follow_directory(
    s: Arc<Shared>,
    mut directory: watch::Receiver<Vec<NodeEntry>>,
    net_done: Option<watch::Sender<bool>>,
    stop: CancellationToken,
) -> Result<()> {
    let mesh = s
        .mesh
        .get()
        .expect("the mesh starts before the directory")
        .clone();
    let mut own: Option<IpNet> = None;
    let mut backoff = retry();
    let mut retry_at: Option<tokio::time::Instant> = None;
    s.steps.running(
        "pod-network",
        Some("waiting for this node's pod CIDR".into()),
    );
    loop {
        let entries = directory.borrow_and_update().clone();
        let view = peer_directory::view(
            &entries,
            &s.id.node,
            &s.id.cluster_cidr,
            &socialweb_wire::mesh::node_range(),
        );
        let cidr = view.own.as_ref().map(|o| o.pod_cidr);
        let due = retry_at.is_some_and(|t| t <= tokio::time::Instant::now());
        if cidr != own || due {
            match cidr {
                Some(cidr) => {
                    s.steps.running("pod-network", None); // counts the attempt
                    if let Some(t) = s.tunnel.get() {
                        t.set_pod_cidr(cidr);
                    }
                    match own_network(&cidr, &s) {
                        Ok(detail) => {
                            own = Some(cidr);
                            retry_at = None;
                            backoff.reset();
                            s.steps.done("pod-network", Some(detail));
                            if let Some(tx) = &net_done {
                                let _ = tx.send(true);
                            }
                        }
                        Err(e) => {
                            let delay = backoff.next_delay();
                            s.steps.failed("pod-network", format!("{e:#}"), delay);
                            retry_at = Some(tokio::time::Instant::now() + delay);
                        }
                    }
                }
                None => {
                    warn!(node = %s.id.node, "this node is not in the peer directory yet; no pod CIDR")
                }
            }
        }
        if let Err(e) = mesh.apply(&view).await {
            warn!("applying the peer directory to the mesh: {e:#}");
        }
        let sleep_until =
            retry_at.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            changed = directory.changed() => if changed.is_err() { bail!("the peer directory source ended") },
            _ = tokio::time::sleep_until(sleep_until) => {}
            _ = stop.cancelled() => return Ok(()),
        }
    }
}

/// Puts this node's pod CIDR on the bridge (dropping a previous one's gateway), writes the CNI
/// configuration and installs the masquerade. Idempotent.
fn own_network(cidr: &IpNet, s: &Shared) -> Result<String> {
    info!(pod_cidr = %cidr, "this node's pod CIDR");
    let opts = &s.opts;
    let mut done = vec![];
    if let Some(net) = &opts.pod_network {
        node::ensure_bridge(cidr, net.mtu)?;
        let path = node::write_conflist(cidr, net)?;
        done.push(format!("{} on {}, {}", cidr, node::BRIDGE, path.display()));
    }
    if opts.masquerade {
        egress::install(cidr, &s.id.cluster_cidr)?;
        *s.masquerade_installed.lock().expect("lock") = true;
        done.push(format!("masquerade table {}", egress::TABLE));
    }
    Ok(done.join("; "))
}

/// Stops the children in order and removes what the agent installed.
async fn teardown(s: &Shared) {
    s.steps.clear_ready();
    let had_proxy = s.children.has("kube-proxy");
    s.children.stop_all(Duration::from_secs(10)).await;
    if had_proxy {
        // kube-proxy's own rules: its --cleanup removes them for every mode.
        match tokio::process::Command::new(&s.opts.machine.kube_proxy)
            .arg("--cleanup")
            .output()
            .await
        {
            Ok(o) if o.status.success() => info!("kube-proxy rules removed"),
            Ok(o) => warn!(
                "kube-proxy --cleanup: {}",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ),
            Err(e) => warn!("kube-proxy --cleanup: {e}"),
        }
    }
    if let Some(t) = s.tunnel.get() {
        t.shutdown();
    }
    if let Some(mesh) = s.mesh.get() {
        mesh.shutdown().await;
    }
    if let (Some(addr), Some((_, placement))) = (s.opts.dns_listen, s.dns.get())
        && let (IpAddr::V4(ip), Ok(h)) = (addr.ip(), mesh::routes::handle().await)
        && let Err(e) = crate::dns::bind::remove(&h, ip, placement).await
    {
        warn!("removing the DNS address: {e:#}");
    }
    if *s.masquerade_installed.lock().expect("lock")
        && let Err(e) = egress::remove()
    {
        warn!("removing the masquerade table: {e:#}");
    }
    info!("stopped");
}

/// Starts node-local DNS: its address (a dummy interface, or lo) and the server. The cluster
/// zone's watch starts once the node has credentials.
async fn start_dns(
    id: &NodeIdentity,
    addr: SocketAddr,
    opts: &RunOptions,
) -> Result<(
    Arc<crate::dns::Dns>,
    crate::dns::bind::Placement,
    Vec<SocketAddr>,
)> {
    let placement = match addr.ip() {
        IpAddr::V4(ip) if !ip.is_unspecified() && !ip.is_loopback() => {
            crate::dns::bind::ensure(&mesh::routes::handle().await?, ip).await?
        }
        _ => crate::dns::bind::Placement::Loopback,
    };
    let ups = join::upstreams(id, addr.ip());
    if ups.is_empty() {
        warn!(
            "no upstream resolvers (identity and /etc/resolv.conf have none): only cluster names will resolve"
        );
    }
    let dns = Arc::new(crate::dns::Dns::new(
        &id.cluster_domain,
        vec![id.cluster_cidr, id.service_cidr],
        ups.clone(),
    ));
    crate::dns::server::serve(dns.clone(), addr, opts.dns_threads, opts.dns_rcvbuf).await?;
    info!(%addr, zone = %id.cluster_domain, upstreams = ?ups, "node-local DNS up");
    Ok((dns, placement, ups))
}

/// Labels this node `socialweb.computer/node-local-dns=true` (contract 5) and with the
/// identity's labels, retrying until it holds. The kubelet sets them when it registers the
/// Node; this covers a Node that existed before.
async fn label_own(client: kube::Client, id: NodeIdentity) {
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
    let me = id.node;
    let mut labels = id.labels;
    labels.insert(
        socialweb_wire::mesh::NODE_LOCAL_DNS_LABEL.into(),
        "true".into(),
    );
    let patch = serde_json::json!({"metadata": {"labels": labels}});
    let mut delay = Duration::from_millis(500);
    loop {
        match api
            .patch(&me, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return,
            Err(e) => warn!("labelling Node {me}: {e}; retrying in {delay:?}"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}
