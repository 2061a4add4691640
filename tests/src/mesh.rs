//! A mesh cluster on this machine without Kubernetes: the relay in the host namespace, a
//! `socialweb-agent run --peers` in each node namespace with a static peer directory, and pods
//! attached by `socialweb-cni` from the configuration each agent writes. Used by the mesh
//! tests and the benchmark; [`Relay`] is also the relay of the Kubernetes clusters.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::cni::{Call, result_ip, workspace_bin};
use crate::netns::Netns;
use crate::process::Spawned;
use crate::tmp::TempDir;
use crate::topology::{CLUSTER_CIDR, HOST_SERVICE_ADDR, Topology};
use crate::wait::wait_for;

/// The relay's port on the host's service address.
pub const RELAY_PORT: u16 = 3340;
/// The agents' UDP port for direct paths.
pub const MESH_PORT: u16 = 7443;

/// Knobs for a mesh cluster.
#[derive(Debug, Clone)]
pub struct MeshOptions {
    pub mtu: u16,
    /// Restrict the relay to the cluster's endpoints (as the broker does).
    pub relay_allow_list: bool,
    pub masquerade: bool,
    /// More arguments for every agent's `run` (the benchmark's tuning variants).
    pub agent_args: Vec<String>,
    /// Another `socialweb-agent` binary than the workspace's (the benchmark's baseline).
    pub agent_bin: Option<PathBuf>,
    /// More relays beside the first, as a fleet's other hosts serve them (on the next
    /// ports): node i's identity names relay (i - 1) mod n as its renting host's and the
    /// others as `fleet_relays`.
    pub more_relays: u16,
}

impl Default for MeshOptions {
    fn default() -> Self {
        MeshOptions {
            mtu: 1280,
            relay_allow_list: true,
            masquerade: true,
            agent_args: Vec::new(),
            agent_bin: None,
            more_relays: 0,
        }
    }
}

/// One node's agent.
#[derive(Debug)]
pub struct Agent {
    pub index: u8,
    pub name: String,
    pub secret_key: String,
    pub endpoint: String,
    pub identity: PathBuf,
    pub ctl: PathBuf,
    pub cni_conf_dir: PathBuf,
    pub log: PathBuf,
    process: Spawned,
}

impl Agent {
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }
}

/// A pod attached through the agent's CNI configuration.
#[derive(Debug)]
pub struct MeshPod {
    pub ns: Netns,
    pub addr: Ipv4Addr,
    pub node: u8,
}

/// The mesh relay on the host, as the broker hosts it: plain HTTP on the host's service
/// address, admitting only the endpoints it is given (or anyone, for tests of that).
#[derive(Debug)]
pub struct Relay {
    process: Spawned,
    pub log: PathBuf,
}

impl Relay {
    /// Starts the relay (`socialweb-broker relay`, the broker's relay on its own) in `host`,
    /// logging to `log`, and waits until it listens.
    pub fn start(host: &Netns, allow: Option<&[String]>, log: &Path) -> Result<Relay> {
        Relay::start_at(host, &RelayPlace::plain(), allow, log)
    }

    /// Starts the relay where `place` says.
    pub fn start_at(
        host: &Netns,
        place: &RelayPlace,
        allow: Option<&[String]>,
        log: &Path,
    ) -> Result<Relay> {
        let mut cmd = host.command(&workspace_bin("socialweb-broker").to_string_lossy());
        cmd.args(["relay", "--listen", &place.listen.to_string()]);
        if let Some(dir) = &place.tls_dir {
            cmd.arg("--tls-dir").arg(dir);
        }
        match allow {
            Some(endpoints) => {
                for ep in endpoints {
                    cmd.args(["--allow", ep]);
                }
            }
            None => {
                cmd.arg("--open");
            }
        }
        let process = Spawned::start_logged(cmd, "relay", log)?;
        let listen = place.listen;
        wait_for("the relay to listen", Duration::from_secs(10), || {
            Ok(host
                .run(|| std::net::TcpStream::connect(listen).is_ok())?
                .then_some(()))
        })?;
        Ok(Relay {
            process,
            log: log.to_path_buf(),
        })
    }

    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    pub fn pid(&self) -> u32 {
        self.process.id()
    }
}

/// Where the relay listens, and how: plain HTTP (the mesh tests' relay), or HTTPS with QUIC
/// address discovery beside it, as the broker serves it (what NAT traversal needs).
#[derive(Debug, Clone)]
pub struct RelayPlace {
    pub listen: SocketAddr,
    /// With TLS: the directory of its CA (`ca.crt`, which nodes trust).
    pub tls_dir: Option<PathBuf>,
}

impl RelayPlace {
    /// Plain HTTP on the host's service address (a [`Topology`]'s).
    pub fn plain() -> RelayPlace {
        RelayPlace {
            listen: SocketAddr::new(HOST_SERVICE_ADDR.into(), RELAY_PORT),
            tls_dir: None,
        }
    }

    /// The URL nodes use.
    pub fn url(&self) -> String {
        let scheme = if self.tls_dir.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.listen)
    }
}

/// A node of a mesh cluster: its namespace, its number (node-<index>, pod CIDR
/// 10.42.<index>.0/24) and the direct addresses the peer directory gives for it.
#[derive(Debug, Clone, Copy)]
pub struct Spot<'t> {
    pub index: u8,
    pub ns: &'t Netns,
    pub addr: Option<SocketAddr>,
}

/// The relay and the agents of a [`Topology`] (or of any set of node namespaces).
#[derive(Debug)]
pub struct MeshCluster<'t> {
    pub agents: Vec<Agent>,
    relay: Relay,
    /// The further relays (`MeshOptions::more_relays`) and where they listen.
    more_relays: Vec<(RelayPlace, Relay)>,
    spots: Vec<Spot<'t>>,
    relay_place: RelayPlace,
    pub opts: MeshOptions,
    pub peers_file: PathBuf,
    dir: TempDir,
}

/// The relay URL nodes of a [`Topology`] use.
pub fn relay_url() -> String {
    RelayPlace::plain().url()
}

impl<'t> MeshCluster<'t> {
    /// Starts the relay and one agent per node with a static peer directory, and waits until
    /// every pair is connected.
    pub fn start(topo: &'t Topology, opts: MeshOptions) -> Result<MeshCluster<'t>> {
        let spots = topo
            .nodes
            .iter()
            .map(|n| Spot {
                index: n.index,
                ns: &n.ns,
                addr: Some(SocketAddr::new(n.addr.into(), MESH_PORT)),
            })
            .collect();
        let cluster = MeshCluster::start_in(spots, &topo.host, RelayPlace::plain(), opts)?;
        cluster.wait_all_connected(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// Starts the relay in `relay_host` at `place` and an agent in each of `spots`; returns
    /// once the agents run (connections come when they come: NAT'd nodes first meet through
    /// the relay).
    pub fn start_in(
        spots: Vec<Spot<'t>>,
        relay_host: &Netns,
        place: RelayPlace,
        opts: MeshOptions,
    ) -> Result<MeshCluster<'t>> {
        let dir = TempDir::new("mesh")?;
        let mut keys = Vec::new();
        for _ in &spots {
            keys.push(mesh_keygen()?);
        }
        let peers_file = dir.path().join("peers.json");
        let nodes: Vec<Value> = spots
            .iter()
            .zip(&keys)
            .map(|(n, (_, ep))| {
                let addrs: Vec<String> = n.addr.iter().map(|a| a.to_string()).collect();
                json!({"node": format!("node-{}", n.index), "endpoint": ep,
                       "pod_cidr": format!("10.42.{}.0/24", n.index), "addrs": addrs})
            })
            .collect();
        std::fs::write(&peers_file, json!({ "nodes": nodes }).to_string())?;
        let endpoints: Vec<String> = keys.iter().map(|(_, ep)| ep.clone()).collect();
        let relay = Relay::start_at(
            relay_host,
            &place,
            opts.relay_allow_list.then_some(endpoints.as_slice()),
            &dir.path().join("relay.log"),
        )?;
        let mut more_relays = Vec::new();
        for i in 1..=opts.more_relays {
            let mut at = place.clone();
            at.listen.set_port(place.listen.port() + i);
            let log = dir.path().join(format!("relay-{i}.log"));
            let allow = opts.relay_allow_list.then_some(endpoints.as_slice());
            let r = Relay::start_at(relay_host, &at, allow, &log)?;
            more_relays.push((at, r));
        }
        let mut cluster = MeshCluster {
            agents: Vec::new(),
            relay,
            more_relays,
            spots,
            relay_place: place,
            opts,
            peers_file,
            dir,
        };
        for (i, (secret, endpoint)) in keys.into_iter().enumerate() {
            let spot = cluster.spots[i];
            let agent = cluster.spawn_agent(&spot, secret, endpoint)?;
            cluster.agents.push(agent);
        }
        Ok(cluster)
    }

    fn spot(&self, node: u8) -> &Spot<'t> {
        self.spots
            .iter()
            .find(|s| s.index == node)
            .unwrap_or_else(|| panic!("no node {node} in this mesh"))
    }

    fn spawn_agent(&self, node: &Spot<'t>, secret_key: String, endpoint: String) -> Result<Agent> {
        let name = format!("node-{}", node.index);
        let base = self.dir.path().join(&name);
        std::fs::create_dir_all(&base)?;
        let identity = base.join("identity.json");
        let (relay, fleet_relays) = self.relays_of(node.index);
        // A static-directory agent does not join: the CA pin and the token are never used.
        std::fs::write(
            &identity,
            json!({
                "version": 3, "cluster": "test", "node": name,
                "server_url": format!("https://{HOST_SERVICE_ADDR}:6443"),
                "ca_cert_sha256": format!("sha256:{}", "00".repeat(32)),
                "join_token": "unused.0000000000000000",
                "relay_url": relay, "fleet_relays": fleet_relays, "mesh_secret_key": secret_key,
                "relay_ca_cert": self.relay_ca()?,
                "cluster_cidr": CLUSTER_CIDR, "service_cidr": "10.43.0.0/16",
                "cluster_domain": "cluster.local", "upstream_resolvers": [format!("{HOST_SERVICE_ADDR}")],
            })
            .to_string(),
        )?;
        let ctl = base.join("agent.sock");
        let cni_conf_dir = base.join("net.d");
        let log = base.join("agent.log");
        let bin = self
            .opts
            .agent_bin
            .clone()
            .unwrap_or_else(|| workspace_bin("socialweb-agent"));
        let mut cmd = node.ns.command(&bin.to_string_lossy());
        cmd.args(["--log", "stderr", "run"])
            .arg("--identity")
            .arg(&identity)
            .arg("--ctl-socket")
            .arg(&ctl)
            .arg("--cni-conf-dir")
            .arg(&cni_conf_dir)
            .arg("--state-dir")
            .arg(base.join("state"))
            .arg("--run-dir")
            .arg(base.join("run"))
            .arg("--peers")
            .arg(&self.peers_file)
            .arg("--no-portmap")
            .arg("--mtu")
            .arg(self.opts.mtu.to_string())
            .env(
                "SOCIALWEB_LOG",
                // A run may ask for more (the benchmark's diagnostics).
                std::env::var("SOCIALWEB_MESH_AGENT_LOG")
                    .unwrap_or_else(|_| "info,socialweb_agent=debug,iroh=warn".into()),
            );
        if !self.opts.masquerade {
            cmd.arg("--no-masquerade");
        }
        cmd.args(&self.opts.agent_args);
        let process = Spawned::start_logged(cmd, &format!("agent {name}"), &log)?;
        Ok(Agent {
            index: node.index,
            name,
            secret_key,
            endpoint,
            identity,
            ctl,
            cni_conf_dir,
            log,
            process,
        })
    }

    /// Every relay's URL, the first relay's first.
    pub fn relay_urls(&self) -> Vec<String> {
        std::iter::once(self.relay_place.url())
            .chain(self.more_relays.iter().map(|(p, _)| p.url()))
            .collect()
    }

    /// Node `index`'s renting host's relay ((index - 1) mod n) and the fleet's others.
    fn relays_of(&self, index: u8) -> (String, Vec<String>) {
        let mut all = self.relay_urls();
        let own = all.remove((usize::from(index) - 1) % all.len());
        (own, all)
    }

    /// Kills relay `i` (0: the first) with SIGKILL, as a host that is lost.
    pub fn kill_relay(&mut self, i: usize) {
        match i {
            0 => self.relay.process.kill_now(),
            i => self.more_relays[i - 1].1.process.kill_now(),
        }
    }

    /// The relay's CA (PEM) for identities, when it serves TLS.
    fn relay_ca(&self) -> Result<Value> {
        Ok(match &self.relay_place.tls_dir {
            Some(dir) => Value::String(
                std::fs::read_to_string(dir.join("ca.crt")).context("the relay's CA")?,
            ),
            None => Value::Null,
        })
    }

    pub fn agent(&self, node: u8) -> &Agent {
        &self.agents[usize::from(node) - 1]
    }

    /// Runs `socialweb-agent <args> --ctl-socket <node's>`.
    pub fn cli(&self, node: u8, args: &[&str]) -> Result<String> {
        let out = std::process::Command::new(workspace_bin("socialweb-agent"))
            .args(args)
            .arg("--ctl-socket")
            .arg(&self.agent(node).ctl)
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

    /// `mesh status --json` of a node.
    pub fn status(&self, node: u8) -> Result<Value> {
        Ok(serde_json::from_str(
            &self.cli(node, &["mesh", "status", "--json"])?,
        )?)
    }

    /// The status entry node `from` has for peer `to`.
    pub fn peer(&self, from: u8, to: u8) -> Result<Value> {
        let s = self.status(from)?;
        s["peers"]
            .as_array()
            .and_then(|ps| {
                ps.iter()
                    .find(|p| p["node"] == format!("node-{to}"))
                    .cloned()
            })
            .with_context(|| format!("node-{from} has no peer node-{to}: {s}"))
    }

    /// Waits until every agent reports every other node connected.
    pub fn wait_all_connected(&self, timeout: Duration) -> Result<()> {
        let n = self.agents.len();
        wait_for("every pair of agents to connect", timeout, || {
            for a in &self.agents {
                let s = self.status(a.index)?;
                let connected = s["peers"]
                    .as_array()
                    .map(|p| p.iter().filter(|p| p["connected"] == true).count())
                    .unwrap_or(0);
                if connected != n - 1 {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        })
        .with_context(|| self.logs_tail())
    }

    /// Last lines of every agent's log and the relay's (for failure messages).
    pub fn logs_tail(&self) -> String {
        let mut out = String::new();
        for a in &self.agents {
            out.push_str(&format!(
                "--- {} ---\n{}\n",
                a.name,
                crate::wait::tail_of(&a.log, 15)
            ));
        }
        out.push_str(&format!(
            "--- relay ---\n{}\n",
            crate::wait::tail_of(&self.relay.log, 10)
        ));
        for (i, (_, r)) in self.more_relays.iter().enumerate() {
            out.push_str(&format!(
                "--- relay {} ---\n{}\n",
                i + 1,
                crate::wait::tail_of(&r.log, 10)
            ));
        }
        out
    }

    /// Attaches a pod on `node` with `socialweb-cni` and the configuration the node's agent
    /// wrote, exactly as containerd would.
    pub fn pod(&self, node: u8, name: &str) -> Result<MeshPod> {
        let agent = self.agent(node);
        let conflist_path = agent.cni_conf_dir.join("10-socialweb.conflist");
        let conflist: Value = wait_for(
            "the agent's CNI configuration",
            Duration::from_secs(10),
            || {
                Ok(std::fs::read(&conflist_path)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Value>(&b).ok()))
            },
        )?;
        let mut conf = conflist["plugins"][0].clone();
        conf["cniVersion"] = conflist["cniVersion"].clone();
        conf["name"] = conflist["name"].clone();
        conf["dataDir"] = json!(self.dir.path().join(&agent.name).join("ipam"));
        let ns = Netns::new(&format!("{name}-n{node}"))?;
        let id = format!("{}-{}", agent.name, name);
        let node_ns = self.spot(node).ns;
        let out =
            Call::for_pod("ADD", &id, &ns).run(node_ns, &workspace_bin("socialweb-cni"), &conf)?;
        let out = out.expect_ok("CNI ADD")?;
        let addr: Ipv4Addr = result_ip(&out.json, "eth0")
            .context("no address in the CNI result")?
            .parse()?;
        Ok(MeshPod { ns, addr, node })
    }

    /// Kills a node's agent (SIGKILL: no cleanup, as a crash or a lost VM).
    pub fn kill_agent(&mut self, node: u8) {
        self.agents[usize::from(node) - 1].process.kill_now();
    }

    /// Stops a node's agent with SIGTERM and waits for it to clean up.
    pub fn stop_agent(&mut self, node: u8) -> Result<()> {
        let a = &mut self.agents[usize::from(node) - 1];
        let pid = nix::unistd::Pid::from_raw(a.process.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        wait_for("the agent to exit", Duration::from_secs(10), || {
            Ok((!a.process.is_running()).then_some(()))
        })
    }

    /// Starts a node's agent again with the same identity.
    pub fn restart_agent(&mut self, node: u8) -> Result<()> {
        let i = usize::from(node) - 1;
        let (secret, endpoint) = (
            self.agents[i].secret_key.clone(),
            self.agents[i].endpoint.clone(),
        );
        self.agents[i].process.kill_now();
        let spot = *self.spot(node);
        let agent = self.spawn_agent(&spot, secret, endpoint)?;
        self.agents[i] = agent;
        Ok(())
    }

    /// The scratch directory (peer file, logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The relay's process id.
    pub fn relay_pid(&self) -> u32 {
        self.relay.pid()
    }

    /// Whether the relay still runs.
    pub fn relay_running(&mut self) -> bool {
        self.relay.is_running()
    }

    /// Whether node `i`'s agent says every step is done.
    pub fn agent_ready(&self, node: u8) -> Result<bool> {
        let s: Value = serde_json::from_str(&self.cli(node, &["status", "--json"])?)?;
        Ok(s["ready"] == true)
    }
}

/// A fresh mesh key pair `(secret hex, endpoint id)`, from `socialweb-agent keygen`.
pub fn mesh_keygen() -> Result<(String, String)> {
    let out = std::process::Command::new(crate::cni::workspace_bin("socialweb-agent"))
        .args(["keygen", "--json"])
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("keygen output")?;
    Ok((
        v["secret_key"].as_str().unwrap_or_default().into(),
        v["endpoint"].as_str().unwrap_or_default().into(),
    ))
}
