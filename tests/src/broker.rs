//! The broker as the operator runs it, on the real topology ([`crate::world`]):
//! `socialweb-broker run` on the operator's host with a configuration file, renting from its
//! embedded local provider (nodes behind NAT on the operator's host) or from
//! `socialweb-broker provider` processes, one per provider machine, across the internet. The
//! harness only writes the configurations, runs the commands an operator (and a provider)
//! would, and asks the providers -- not the broker -- what is really leased.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::cni::workspace_bin;
use crate::k8s::{binaries, test_kubelet_patch, wait_for};
use crate::netns::Netns;
use crate::process::Spawned;
use crate::tmp::TempDir;
use crate::world::{OPERATOR_ADDR, RESOLVER_ADDR, World};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The port the front (and the gateway API) listens on in the host namespace.
pub const FRONT_PORT: u16 = 8443;

/// Where the embedded provider listens on the operator's host.
pub const PROVIDER_ADDR: &str = "127.0.0.1:7480";

/// The port a provider machine serves the market protocol on.
pub const PROVIDER_PORT: u16 = 7480;

/// Knobs a test sets.
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    pub max_nodes: u32,
    pub pods_per_node: u32,
    pub hold: Duration,
    pub bid_deadline: Duration,
    /// Provider machines to rent from, each running `socialweb-broker provider`; 0: the
    /// broker's embedded local provider (its nodes behind NAT on the operator's host).
    pub providers: u8,
    /// How many nodes each provider runs at most (its bids stop beyond it).
    pub provider_capacity: u32,
    /// `FAILPOINTS` for the broker process.
    pub broker_failpoints: Option<String>,
    /// `FAILPOINTS` for the provider processes.
    pub provider_failpoints: Option<String>,
    /// `sqlite` (default) or a `postgres://` URL.
    pub store_url: Option<String>,
    pub request_timeout: Duration,
    pub node_vcpu: u32,
    pub node_mem_mib: u64,
    /// Nodes run from this node image (`testbed::nodeimage`) instead of the host's binaries.
    pub image: Option<PathBuf>,
    /// Nodes are qemu guests booted from `image` (`machine = "vm"`), and the broker rents
    /// only VMs (`market.isolation = "vm"`).
    pub vm: bool,
    /// With `vm`: the guests unjailed (`local_provider.vm.jail = false`, `bench/vm`'s
    /// "before"), and the broker renting them as the namespace isolation they then bid.
    pub vm_unjailed: bool,
    /// Lines for the configuration's `[front]` section.
    pub front_toml: String,
    /// Lines for the `[access]` section. Default: registration open and the tenants trusted
    /// (the tests are the tenants); the product's default is closed and untrusted, which
    /// `tests/tests/hostile.rs` runs with `String::new()`.
    pub access_toml: String,
    /// More seed image archives every node imports at boot (the conformance suite's images).
    pub extra_seeds: Vec<PathBuf>,
    /// The broker's open-file limit (soft and hard), when not the harness's own.
    pub nofile: Option<u64>,
    /// More lines for the `[clusters]` section.
    pub clusters_toml: String,
    /// The shapes every provider rents, `(vCPUs, MiB, price a hour in millionths)`; empty:
    /// the `[node]` size at price 0.
    pub shapes: Vec<(u32, u64, u64)>,
}

impl Default for BrokerOptions {
    fn default() -> BrokerOptions {
        BrokerOptions {
            max_nodes: 5,
            pods_per_node: 1,
            hold: Duration::from_secs(3),
            bid_deadline: Duration::from_secs(2),
            providers: 0,
            provider_capacity: 8,
            broker_failpoints: None,
            provider_failpoints: None,
            store_url: None,
            request_timeout: Duration::from_secs(5),
            node_vcpu: 2,
            node_mem_mib: 2048,
            image: None,
            vm: false,
            vm_unjailed: false,
            front_toml: String::new(),
            access_toml: "registration = \"open\"\ntenants_trusted = true\n".into(),
            extra_seeds: Vec::new(),
            nofile: None,
            clusters_toml: String::new(),
            shapes: Vec::new(),
        }
    }
}

/// A provider machine's `socialweb-broker provider`.
#[derive(Debug)]
pub struct ProviderProc {
    proc: Spawned,
    /// 1-based, as the world numbers provider machines.
    pub index: u8,
    pub config: PathBuf,
    pub state: PathBuf,
    /// Prefix of its namespaces and cgroups.
    pub prefix: String,
    /// Its market URL, as the broker reaches it (mutual TLS).
    pub url: String,
    /// Its key, as `socialweb-broker provider-pin` prints it.
    pub pin: String,
}

/// A broker (and its providers) on `world`. Dropping it kills them all and destroys every
/// machine the providers made.
#[derive(Debug)]
pub struct Broker<'w> {
    broker: Spawned,
    pub providers: Vec<ProviderProc>,
    pub world: &'w World,
    /// The operator's host, where the broker runs.
    pub host: &'w Netns,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub state: PathBuf,
    /// Prefix of the embedded provider's namespaces and cgroups.
    pub prefix: String,
    pub opts: BrokerOptions,
    _cni: TempDir,
    dir: TempDir,
}

/// What every node of this broker's providers runs and imports.
struct NodeSoftware {
    kube: PathBuf,
    /// The broker's kine (its clusters' default datastore).
    kine: PathBuf,
    agent: PathBuf,
    cni: PathBuf,
    seeds: String,
    patch: String,
    image: String,
    /// `local_provider.shapes`, or nothing (the `[node]` size).
    shapes: String,
}

impl NodeSoftware {
    fn new(
        opts: &BrokerOptions,
        dir: &std::path::Path,
        cni: &std::path::Path,
    ) -> Result<NodeSoftware> {
        let bins = binaries()?;
        let seeds = dir.join("seeds");
        std::fs::create_dir_all(&seeds)?;
        crate::images::write_busybox(&seeds.join("busybox.tar"))?;
        Ok(NodeSoftware {
            kube: bins.dir.clone(),
            kine: crate::k8s::kine()?,
            agent: workspace_bin("socialweb-agent"),
            cni: cni.to_path_buf(),
            // A node image brings its own seeds (busybox among the suite image's).
            seeds: if opts.image.is_some() {
                None
            } else {
                Some(seeds.join("busybox.tar"))
            }
            .iter()
            .chain(&opts.extra_seeds)
            .map(|p| format!("{p:?}"))
            .collect::<Vec<_>>()
            .join(", "),
            // A guest's agent runs as the image's unit starts it: no patch to give.
            patch: if opts.vm {
                String::new()
            } else {
                format!(
                    "kubelet_config_patch = {}\n",
                    toml_inline(&test_kubelet_patch())
                )
            },
            shapes: if opts.shapes.is_empty() {
                String::new()
            } else {
                format!(
                    "shapes = [{}]\n",
                    opts.shapes
                        .iter()
                        .map(|(vcpu, mem, price)| format!(
                            "{{ vcpu = {vcpu}, memMiB = {mem}, diskMiB = 20480, price_micros_per_hour = {price} }}"
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
            image: match (&opts.image, opts.vm) {
                (Some(i), true) => format!(
                    "image = {i:?}\nmachine = \"vm\"\n[local_provider.vm]\naccel = \"auto\"\nboot_timeout = \"15m\"\n# This machine has no working KVM (nested guests hang): its TCG guests stand for VMs.\ntcg_as_vm = true\n{}",
                    if opts.vm_unjailed {
                        "jail = false\n"
                    } else {
                        ""
                    }
                ),
                (Some(i), false) => format!("image = {i:?}\n"),
                (None, _) => String::new(),
            },
        })
    }

    /// A `[local_provider]` section listening on `listen` with `prefix`.
    fn section(&self, listen: &str, prefix: &str, capacity: u32, brokers: &[String]) -> String {
        format!(
            "[local_provider]\nlisten = \"{listen}\"\ncapacity = {capacity}\n{shapes}prefix = \"{prefix}\"\nagent = {agent:?}\ncni_bin_dir = {cni:?}\nseed_images = [{seeds}]\n{patch}brokers = {brokers:?}\n{image}",
            agent = self.agent,
            cni = self.cni,
            seeds = self.seeds,
            patch = self.patch,
            image = self.image,
            shapes = self.shapes,
        )
    }
}

fn prefix(tag: &str) -> String {
    format!(
        "swt-{}-{}{tag}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

impl<'w> Broker<'w> {
    pub fn start(world: &'w World, opts: BrokerOptions) -> Result<Broker<'w>> {
        let dir = TempDir::new("broker")?;
        let d = dir.path();
        let cni = crate::k8s::cni_bin_dir()?;
        let sw = NodeSoftware::new(&opts, d, cni.path())?;
        let prefix = prefix("");
        // The broker's key towards providers, made before it starts (as `market-pin` would),
        // so that each provider machine's configuration can list it.
        let broker_pin =
            socialweb_market_tls::Identity::load_or_create(&d.join("state/market-tls"), &[])?
                .pin_text();
        let mut providers = Vec::new();
        for m in world.providers.iter().take(usize::from(opts.providers)) {
            let p = prefix_for(&prefix, m.index);
            let state = d.join(format!("provider-{}", m.index));
            let config = d.join(format!("provider-{}.toml", m.index));
            let listen = format!("{}:{PROVIDER_PORT}", m.addr);
            let capacity = opts.provider_capacity;
            std::fs::write(
                &config,
                format!(
                    "state_dir = {state:?}\nkube_dir = {kube:?}\n\n[node]\nvcpu = {vcpu}\nmemMiB = {mem}\ndiskMiB = 20480\n\n{section}",
                    kube = sw.kube,
                    vcpu = opts.node_vcpu,
                    mem = opts.node_mem_mib,
                    section = sw.section(&listen, &p, capacity, std::slice::from_ref(&broker_pin)),
                ),
            )?;
            let pin = socialweb_market_tls::Identity::load_or_create(
                &state.join("provider-tls"),
                &[m.addr.to_string()],
            )?
            .pin_text();
            providers.push(ProviderProc {
                proc: Spawned::none("provider"),
                index: m.index,
                config,
                state,
                prefix: p,
                url: format!("https://{listen}"),
                pin,
            });
        }
        let config = broker_config(&opts, d, &sw, &prefix, &providers);
        let config_path = d.join("broker.toml");
        std::fs::write(&config_path, config)?;
        let mut b = Broker {
            broker: Spawned::none("broker"),
            providers,
            world,
            host: &world.operator,
            config: config_path,
            socket: d.join("broker.sock"),
            state: d.join("state"),
            prefix,
            opts,
            _cni: cni,
            dir,
        };
        for i in 0..b.providers.len() {
            b.start_provider(i)?;
        }
        b.start_broker()?;
        Ok(b)
    }

    /// A log of the harness's: `broker`, or `provider-<i>`.
    pub fn log(&self, what: &str) -> PathBuf {
        self.dir.path().join(format!("{what}.log"))
    }

    fn command(
        &self,
        ns: &Netns,
        sub: &str,
        config: &std::path::Path,
        failpoints: Option<&str>,
    ) -> Command {
        let mut cmd =
            ns.command_keeping_mounts(&workspace_bin("socialweb-broker").to_string_lossy());
        cmd.arg(sub).arg("--config").arg(config).env(
            "SOCIALWEB_LOG",
            "info,socialweb_broker=debug,iroh=warn,sqlx=warn,kube=warn",
        );
        if let Some(fp) = failpoints {
            cmd.env("FAILPOINTS", fp);
        }
        if let Some(n) = self.opts.nofile.filter(|_| sub == "run") {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            #[allow(unsafe_code)]
            unsafe {
                cmd.pre_exec(move || {
                    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, n, n)
                        .map_err(std::io::Error::from)
                });
            }
        }
        cmd
    }

    /// Starts (or starts again) the broker daemon and waits for its control socket.
    pub fn start_broker(&mut self) -> Result<()> {
        let cmd = self.command(
            self.host,
            "run",
            &self.config,
            self.opts.broker_failpoints.as_deref(),
        );
        self.broker = Spawned::start_logged(cmd, "broker", &self.log("broker"))?;
        let socket = self.socket.clone();
        let broker = &mut self.broker;
        let log = self.dir.path().join("broker.log");
        wait_for(
            "the broker's control socket",
            Duration::from_secs(60),
            || {
                if !broker.is_running() {
                    bail!("the broker exited: {}", crate::k8s::tail_of(&log, 20));
                }
                Ok(std::os::unix::net::UnixStream::connect(&socket)
                    .is_ok()
                    .then_some(()))
            },
        )
    }

    /// Starts (or starts again) provider `i` on its machine and waits until it answers.
    pub fn start_provider(&mut self, i: usize) -> Result<()> {
        let m = &self.world.providers[usize::from(self.providers[i].index) - 1];
        let cmd = self.command(
            &m.ns,
            "provider",
            &self.providers[i].config,
            self.opts.provider_failpoints.as_deref(),
        );
        let log = self.log(&format!("provider-{}", m.index));
        self.providers[i].proc = Spawned::start_logged(cmd, "provider", &log)?;
        let addr = std::net::SocketAddr::new(m.addr.into(), PROVIDER_PORT);
        wait_for("a provider to listen", Duration::from_secs(30), || {
            Ok(m.ns
                .run(|| std::net::TcpStream::connect(addr).is_ok())?
                .then_some(()))
        })
    }

    /// SIGKILLs provider `i` (its nodes keep running).
    pub fn kill_provider(&mut self, i: usize) {
        self.providers[i].proc.kill_now();
    }

    /// Runs the broker with other failpoints from now on (after a crash).
    pub fn set_failpoints(&mut self, fp: Option<&str>) {
        self.opts.broker_failpoints = fp.map(str::to_string);
    }

    /// SIGKILLs the broker (the provider and the nodes keep running).
    pub fn kill_broker(&mut self) {
        self.broker.kill_now();
    }

    /// Waits for the broker process to end by itself (a failpoint killed it).
    pub fn wait_broker_exit(&mut self, timeout: Duration) -> Result<()> {
        let broker = &mut self.broker;
        wait_for("the broker to exit", timeout, || {
            Ok((!broker.is_running()).then_some(()))
        })
    }

    pub fn broker_running(&mut self) -> bool {
        self.broker.is_running()
    }

    /// `socialweb-broker <args> --ctl-socket ...` (an operator command), stdout.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(workspace_bin("socialweb-broker"))
            .args(args)
            .arg("--ctl-socket")
            .arg(&self.socket)
            .output()?;
        if !out.status.success() {
            bail!(
                "socialweb-broker {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn cli_json(&self, args: &[&str]) -> Result<Value> {
        let mut a = args.to_vec();
        a.push("--json");
        Ok(serde_json::from_str(&self.cli(&a)?)?)
    }

    /// The broker daemon's process id (nsenter execs it in place).
    pub fn broker_pid(&self) -> u32 {
        self.broker.id()
    }

    /// The gateway's URL (the front), as users reach it from the host namespace.
    pub fn front_url(&self) -> String {
        format!("https://{OPERATOR_ADDR}:{FRONT_PORT}")
    }

    /// The front's self-made CA (what kubeconfigs carry).
    pub fn front_ca(&self) -> PathBuf {
        self.state.join("front/ca.crt")
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

    /// A cluster's directory: `<state>/clusters/<name>-<8 hex>` (each cluster of a name has
    /// its own), or `<state>/clusters/<name>`, which does not exist, when there is none.
    pub fn cluster_dir(&self, cluster: &str) -> PathBuf {
        let base = self.state.join("clusters");
        let ours = |n: &str| {
            n.strip_prefix(cluster)
                .and_then(|r| r.strip_prefix('-'))
                .is_some_and(|h| h.len() == 8 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        };
        std::fs::read_dir(&base)
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| ours(&e.file_name().to_string_lossy()))
            .map(|e| e.path())
            .unwrap_or_else(|| base.join(cluster))
    }

    /// The admin kubeconfig of a cluster.
    pub fn kubeconfig(&self, cluster: &str) -> PathBuf {
        self.cluster_dir(cluster).join("pki/admin.kubeconfig")
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
        if self.providers.is_empty() {
            vec!["http://local-provider".to_string()]
        } else {
            self.providers.iter().map(|p| p.url.clone()).collect()
        }
    }

    /// The embedded provider's owner-only socket.
    pub fn provider_socket(&self) -> PathBuf {
        self.state.join("run/provider.sock")
    }

    /// curl's arguments to reach the providers as the broker does: its socket, or mutual TLS
    /// with the broker's key (the harness checks the providers, not their certificates: -k).
    pub fn provider_curl_args(&self) -> Vec<String> {
        if self.providers.is_empty() {
            vec![
                "--unix-socket".into(),
                self.provider_socket().display().to_string(),
            ]
        } else {
            let tls = self.state.join("market-tls");
            vec![
                "-k".into(),
                "--cert".into(),
                tls.join("cert.pem").display().to_string(),
                "--key".into(),
                tls.join("key.pem").display().to_string(),
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
        let v = self.cli_json(&["cluster", "show", cluster])?;
        Ok(v["decisions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| {
                (
                    d["action"].as_str().unwrap_or("").to_string(),
                    d["target"].as_i64().unwrap_or(-1),
                    d["reason"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect())
    }

    /// Waits for a decision `action` with `target` nodes, returns its reason.
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
                    .rev()
                    .find(|(a, t, _)| a == action && *t == target)
                    .map(|(_, _, r)| r))
            },
        )
        .with_context(|| self.diagnostics())
    }

    /// The scratch directory of a node's machine (its agent's and children's logs).
    pub fn node_dirs(&self) -> Vec<PathBuf> {
        std::iter::once(self.state.clone())
            .chain(self.providers.iter().map(|p| p.state.clone()))
            .flat_map(|s| {
                std::fs::read_dir(s.join("local-provider/nodes"))
                    .into_iter()
                    .flatten()
            })
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect()
    }

    /// The network namespace node `node` runs in (as its provider recorded it).
    pub fn node_netns(&self, node: &str) -> Result<String> {
        for state in std::iter::once(&self.state).chain(self.providers.iter().map(|p| &p.state)) {
            let Ok(text) = std::fs::read_to_string(state.join("local-provider/provider.json"))
            else {
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

    /// Destroys every machine the provider made (their network namespaces and cgroups).
    /// Every provider's guest directories (`<state>/local-provider/nodes/<lease>`) that
    /// exist, with the pid of the qemu running there, if one still does.
    pub fn guests(&self) -> Vec<(PathBuf, Option<u32>)> {
        let states = std::iter::once(&self.state).chain(self.providers.iter().map(|p| &p.state));
        let mut out = Vec::new();
        for state in states {
            let nodes = state.join("local-provider/nodes");
            for dir in std::fs::read_dir(&nodes).into_iter().flatten().flatten() {
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

    fn destroy_machines(&self) {
        for (_, pid) in self.guests() {
            if let Some(pid) = pid {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let prefixes: Vec<&str> = std::iter::once(self.prefix.as_str())
            .chain(self.providers.iter().map(|p| p.prefix.as_str()))
            .collect();
        for prefix in prefixes {
            for cg in socialweb_provider::machine::cgroups_with_prefix(prefix) {
                socialweb_provider::machine::destroy_cgroup(&cg);
            }
            for ns in crate::netns::list() {
                if ns.starts_with(&format!("{prefix}n")) || ns.starts_with(&format!("{prefix}g")) {
                    let _ = crate::netns::remove(&ns);
                }
            }
        }
    }
}

impl Drop for Broker<'_> {
    fn drop(&mut self) {
        self.broker.kill_now();
        for p in &mut self.providers {
            p.proc.kill_now();
        }
        self.destroy_machines();
    }
}

/// Provider `i`'s prefix beside the broker's own (`<prefix>p<i>`).
fn prefix_for(prefix: &str, i: u8) -> String {
    format!("{prefix}p{i}")
}

/// The broker's configuration file.
fn broker_config(
    opts: &BrokerOptions,
    d: &std::path::Path,
    sw: &NodeSoftware,
    prefix: &str,
    providers: &[ProviderProc],
) -> String {
    let store = match &opts.store_url {
        Some(u) => format!("url = {u:?}\n"),
        None => String::new(),
    };
    let market: String = providers
        .iter()
        .map(|p| {
            format!(
                "[[market.providers]]\nname = \"p{}\"\nurl = \"{}\"\npin = \"{}\"\n",
                p.index, p.url, p.pin
            )
        })
        .collect();
    format!(
        r#"state_dir = {state:?}
service_addr = "{OPERATOR_ADDR}"
kube_dir = {kube:?}
ctl_socket = {socket:?}

[store]
{store}
[scale]
max_nodes = {max}
pods_per_node = {ppn}
hold = "{hold}"

[node]
vcpu = {vcpu}
memMiB = {mem}
diskMiB = 20480

[market]
bid_deadline = "{deadline}"
boot_timeout = "{boot}"
request_timeout = "{timeout}"
{isolation}
{market}
{local}
[clusters]
upstream_resolvers = ["{RESOLVER_ADDR}"]
kine_binary = {kine:?}
{clusters}

[front]
listen = "0.0.0.0:{FRONT_PORT}"
did_web_nameservers = ["{RESOLVER_ADDR}:53"]
{front}
[access]
{access}
"#,
        state = d.join("state"),
        socket = d.join("broker.sock"),
        front = opts.front_toml,
        access = opts.access_toml,
        clusters = opts.clusters_toml,
        kine = sw.kine,
        kube = sw.kube,
        max = opts.max_nodes,
        ppn = opts.pods_per_node,
        hold = humantime::format_duration(opts.hold),
        vcpu = opts.node_vcpu,
        mem = opts.node_mem_mib,
        deadline = humantime::format_duration(opts.bid_deadline),
        timeout = humantime::format_duration(opts.request_timeout),
        // A guest under TCG boots and joins in minutes.
        boot = if opts.vm { "15m" } else { "120s" },
        isolation = if opts.vm && !opts.vm_unjailed {
            "isolation = \"vm\"\n"
        } else {
            ""
        },
        local = sw.section(PROVIDER_ADDR, prefix, opts.provider_capacity, &[]),
    )
}

/// A JSON value as a TOML inline value (objects become inline tables).
fn toml_inline(v: &Value) -> String {
    match v {
        Value::Object(m) => format!(
            "{{ {} }}",
            m.iter()
                .map(|(k, v)| format!("{k:?} = {}", toml_inline(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(toml_inline).collect::<Vec<_>>().join(", ")
        ),
        Value::Null => "\"\"".into(),
        other => other.to_string(),
    }
}
