//! A Kubernetes node on this machine, joined the way a rented guest joins: a "machine" (a
//! node network namespace, a private mount namespace with its own `/run`, `/var/lib`,
//! `/var/log` and a copy-on-write `/etc`, and a cgroup root) in which the harness starts only
//! `socialweb-agent run` with an identity document, as the node image's systemd unit does.
//! The agent brings up containerd, the kubelet (TLS-bootstrapped with the identity's token)
//! and kube-proxy itself; the harness plays the broker (it writes the identity) and the
//! machine (it provides the filesystem view), nothing else.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::cgroup::CgroupRoot;
use super::control_plane::ControlPlane;
use super::{tail, wait_for};
use crate::cni::workspace_bin;
use crate::images;
use crate::netns::Netns;
use crate::process::Spawned;
use crate::tmp::TempDir;

/// How the identity names the control plane's CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaMode {
    /// `ca_cert_sha256`: the agent fetches the CA and checks the pin (the broker's default).
    Pin,
    /// `ca_cert`: the CA itself.
    Pem,
}

/// What a node is started with.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub name: String,
    /// The node's address (the kubelet's `--node-ip`, where the apiserver reaches it).
    pub node_ip: Ipv4Addr,
    /// Directory with the CNI plugins containerd may run (`socialweb-cni`, `loopback`,
    /// `portmap`).
    pub cni_bin_dir: PathBuf,
    /// The upstream resolver in the identity.
    pub upstream_dns: Ipv4Addr,
    /// The mesh relay in the identity.
    pub relay_url: String,
    /// The mesh key (hex) and endpoint id; `None`: a fresh one.
    pub mesh_key: Option<(String, String)>,
    pub ca: CaMode,
    /// Identity fields to replace (a wrong pin, token or server for the negative tests).
    pub identity_overrides: BTreeMap<String, Value>,
    pub mtu: u16,
}

/// A running node: a machine and its agent. Dropping it kills the agent and everything in
/// the machine (containerd, kubelet, kube-proxy, every container), and removes its cgroups
/// and files.
#[derive(Debug)]
pub struct KubeNode {
    agent: Spawned,
    holder: Spawned,
    holder_pid: u32,
    cgroup: CgroupRoot,
    pub name: String,
    /// The mesh endpoint id (public key) of the node.
    pub endpoint: String,
    /// The bootstrap token's secret half (tests check it never reaches a log).
    pub token_secret: String,
    pub identity: PathBuf,
    pub ctl: PathBuf,
    agent_args: Vec<OsString>,
    pub timings: Vec<(&'static str, Duration)>,
    dir: TempDir,
}

/// The kubelet configuration the test machines need on top of the agent's: they share one
/// host disk, whose fill level says nothing about a node, so disk-pressure eviction and image
/// garbage collection are off; cAdvisor cannot size a machine's bind-mounted filesystems.
pub fn test_kubelet_patch() -> Value {
    json!({
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "0%",
                         "nodefs.inodesFree": "0%", "imagefs.available": "0%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "localStorageCapacityIsolation": false,
    })
}

impl KubeNode {
    /// Builds the machine in `ns`, writes the identity (with a new bootstrap token from `cp`)
    /// and the seed images, and starts `socialweb-agent run`. Returns at once: the node joins
    /// by itself (see [`KubeNode::wait_ready`]).
    pub fn start(cp: &ControlPlane<'_>, ns: &Netns, opts: NodeOptions) -> Result<KubeNode> {
        let t = Instant::now();
        let mut timings = Vec::new();
        let dir = TempDir::new(&format!("node-{}", opts.name))?;
        let d = dir.path();
        let cgroup = CgroupRoot::create(&format!("swt-{}-{}", std::process::id(), dir_seq(d)))?;

        // The holder creates the mount namespace and keeps it alive; the agent enters it.
        let ready = d.join("holder.ready");
        // /sys is remounted so that it shows this network namespace's devices (as
        // `ip netns exec` does), with the cgroup hierarchies carried over, which the kubelet
        // and runc need and `ip netns exec` would lose.
        // /var/lib and /var/log are bind mounts of directories on the host's disk rather than
        // tmpfs: cAdvisor cannot tell tmpfs mounts apart and the kubelet's eviction manager
        // then fails to find the image filesystem.
        // /etc is an overlay on the host's: the machine writes /etc/cni/net.d and whatever
        // else a node writes there without touching the host's.
        for sub in ["var-lib", "var-log", "etc-up", "etc-work"] {
            std::fs::create_dir_all(d.join(sub))?;
        }
        let script = format!(
            "set -e; mount -t tmpfs tmpfs /run; mkdir -p /run/netns /run/.cgroup; \
             mount --rbind /sys/fs/cgroup /run/.cgroup; mount -t sysfs sysfs /sys; \
             mount --rbind /run/.cgroup /sys/fs/cgroup; umount -l /run/.cgroup; \
             mount --bind {d}/var-lib /var/lib; mount --bind {d}/var-log /var/log; \
             mount -t overlay overlay -o lowerdir=/etc,upperdir={d}/etc-up,workdir={d}/etc-work /etc; \
             touch {ready}; exec sleep 2147483647",
            d = d.display(),
            ready = ready.display()
        );
        let mut hcmd = Command::new("nsenter");
        hcmd.arg(format!("--net={}", ns.path().display())).args([
            "--",
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            &script,
        ]);
        let holder = Spawned::start_logged(hcmd, "machine holder", &d.join("holder.log"))?;
        wait_for(
            "the machine's mount namespace",
            Duration::from_secs(10),
            || Ok(ready.exists().then_some(())),
        )
        .with_context(|| tail(&d.join("holder.log"), 10))?;
        // nsenter, unshare and sh exec one another: the holder's pid ends up running `sleep`.
        let holder_pid = socialweb_provider::machine::find_sleep_child(holder.id())
            .context("finding the holder's process")?;
        timings.push(("machine", t.elapsed()));

        // What the node image carries: the seed images and the Kubernetes node binaries.
        let seeds = d.join("var-lib/socialweb/images");
        std::fs::create_dir_all(&seeds)?;
        images::write_pause(&seeds.join("pause.tar"), &cp.bins.pause())?;
        images::write_busybox(&seeds.join("busybox.tar"))?;
        let bin = d.join("bin");
        std::fs::create_dir_all(&bin)?;
        for name in ["kubelet", "kube-proxy"] {
            std::os::unix::fs::symlink(cp.bins.kube(), bin.join(name))?;
        }

        // What the broker writes: the identity.
        let (secret, endpoint) = match &opts.mesh_key {
            Some(k) => k.clone(),
            None => crate::mesh::mesh_keygen()?,
        };
        let token = cp.new_token(&opts.name, Some(opts.node_ip.into()))?;
        let mut identity = json!({
            "version": 3, "cluster": "test", "node": opts.name,
            "server_url": cp.url, "join_token": token.expose(),
            "relay_url": opts.relay_url, "mesh_secret_key": secret,
            "cluster_cidr": super::control_plane::CLUSTER_CIDR,
            "service_cidr": super::control_plane::SERVICE_CIDR,
            "cluster_domain": "cluster.local",
            "upstream_resolvers": [opts.upstream_dns.to_string()],
            "labels": {"socialweb.computer/pool": "test"},
        });
        match opts.ca {
            CaMode::Pin => {
                identity["ca_cert_sha256"] = socialweb_wire::CaTrust::pin_text(&cp.ca_pin()?).into()
            }
            CaMode::Pem => identity["ca_cert"] = cp.pki.ca_pem().into(),
        }
        for (k, v) in &opts.identity_overrides {
            identity[k] = v.clone();
        }
        let identity_path = d.join("identity.json");
        std::fs::write(&identity_path, serde_json::to_vec_pretty(&identity)?)?;

        let ctl = d.join("agent.sock");
        let agent_args: Vec<OsString> = vec![
            "--log".into(),
            "stderr".into(),
            "run".into(),
            "--identity".into(),
            identity_path.clone().into(),
            "--ctl-socket".into(),
            ctl.clone().into(),
            "--kubelet".into(),
            bin.join("kubelet").into(),
            "--kube-proxy".into(),
            bin.join("kube-proxy").into(),
            "--cni-bin-dir".into(),
            opts.cni_bin_dir.clone().into(),
            "--cgroup-root".into(),
            format!("/{}", cgroup.name).into(),
            "--node-ip".into(),
            opts.node_ip.to_string().into(),
            "--child-log-dir".into(),
            "/var/log/socialweb".into(),
            "--kubelet-config-patch".into(),
            test_kubelet_patch().to_string().into(),
            "--mtu".into(),
            opts.mtu.to_string().into(),
        ];
        let mut node = KubeNode {
            agent: Spawned::none("agent"),
            holder,
            holder_pid,
            cgroup,
            name: opts.name.clone(),
            endpoint,
            token_secret: token.secret.clone(),
            identity: identity_path,
            ctl,
            agent_args,
            timings,
            dir,
        };
        node.start_agent()?;
        node.timings.push(("agent started", t.elapsed()));
        Ok(node)
    }

    /// Starts the agent in the machine (again, after [`KubeNode::kill_agent`]).
    pub fn start_agent(&mut self) -> Result<()> {
        let mut cmd = self.enter_cmd(&workspace_bin("socialweb-agent").to_string_lossy());
        cmd.args(&self.agent_args)
            .env("SOCIALWEB_LOG", "info,socialweb_agent=debug,iroh=warn");
        self.agent =
            Spawned::start_logged(cmd, &format!("agent on {}", self.name), &self.log("agent"))?;
        Ok(())
    }

    /// Kills the agent with SIGKILL (a crash: no cleanup).
    pub fn kill_agent(&mut self) {
        self.agent.kill_now();
    }

    /// Stops the agent with SIGTERM and waits until it has exited.
    pub fn stop_agent(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let pid = nix::unistd::Pid::from_raw(self.agent.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        let agent = &mut self.agent;
        wait_for("the agent to exit after SIGTERM", timeout, || {
            agent.try_status()
        })
    }

    /// The agent's pid (0 when not running).
    pub fn agent_pid(&self) -> u32 {
        self.agent.id()
    }

    /// Runs `socialweb-agent <args> --ctl-socket <this node's>` and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(workspace_bin("socialweb-agent"))
            .args(args)
            .arg("--ctl-socket")
            .arg(&self.ctl)
            .output()?;
        if !out.status.success() {
            bail!(
                "socialweb-agent {} on {}: {}",
                args.join(" "),
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `socialweb-agent status --json`.
    pub fn status(&self) -> Result<Value> {
        Ok(serde_json::from_str(&self.cli(&["status", "--json"])?)?)
    }

    /// The state of one bring-up step and its last error.
    pub fn step(&self, name: &str) -> Result<Value> {
        let s = self.status()?;
        s["steps"]
            .as_array()
            .and_then(|st| st.iter().find(|x| x["name"] == name).cloned())
            .with_context(|| format!("no step {name} in {s}"))
    }

    /// The pid of a child the agent runs (`containerd`, `kubelet`, `kube-proxy`).
    pub fn child_pid(&self, name: &str) -> Result<Option<u32>> {
        let s = self.status()?;
        Ok(s["children"]
            .as_array()
            .and_then(|c| c.iter().find(|x| x["name"] == name && x["running"] == true))
            .and_then(|c| c["pid"].as_u64())
            .map(|p| p as u32))
    }

    /// Waits until the agent says every step is done (the node joined, the pod network is up,
    /// kube-proxy runs).
    pub fn wait_ready(&self, timeout: Duration) -> Result<()> {
        wait_for(
            &format!("{}'s agent to be ready", self.name),
            timeout,
            || {
                Ok(self
                    .status()
                    .ok()
                    .filter(|s| s["ready"] == true)
                    .map(|_| ()))
            },
        )
        .with_context(|| self.diagnostics())
    }

    /// The agent's status and the tails of its and its children's logs (for failures).
    pub fn diagnostics(&self) -> String {
        let mut out = format!(
            "--- {} status ---\n{}\n",
            self.name,
            self.cli(&["status"]).unwrap_or_else(|e| format!("{e:#}"))
        );
        for c in ["agent", "containerd", "kubelet", "kube-proxy"] {
            out.push_str(&format!(
                "--- {} {c} ---\n{}\n",
                self.name,
                tail(&self.log(c), 15)
            ));
        }
        out
    }

    /// Every log line the node wrote so far: the agent's and its children's.
    pub fn all_logs(&self) -> String {
        ["agent", "containerd", "kubelet", "kube-proxy"]
            .iter()
            .map(|c| std::fs::read_to_string(self.log(c)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Pids of the processes named `comm` running in this machine (its mount namespace).
    pub fn pids_of(&self, comm: &str) -> Vec<u32> {
        let Ok(target) =
            std::fs::metadata(format!("/proc/{}/ns/mnt", self.holder_pid)).map(|m| m.ino())
        else {
            return Vec::new();
        };
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_string_lossy().parse::<u32>().ok())
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm)
                    && std::fs::metadata(format!("/proc/{p}/ns/mnt"))
                        .is_ok_and(|m| m.ino() == target)
                    && !std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                        s.rsplit(')')
                            .next()
                            .is_some_and(|r| r.trim_start().starts_with('Z'))
                    })
            })
            .collect()
    }

    /// A command run inside the machine's mount and network namespaces.
    fn enter_cmd(&self, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount=/proc/{}/ns/mnt", self.holder_pid))
            .arg(format!("--net=/proc/{}/ns/net", self.holder_pid))
            .arg("--")
            .arg(program);
        cmd
    }

    /// A command run inside the machine's mount and network namespaces.
    pub fn enter(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = self.enter_cmd(program);
        cmd.args(args);
        cmd
    }

    /// Runs `ctr` against the node's containerd, in the `k8s.io` namespace the CRI uses.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        let mut full = vec![
            "--address",
            "/run/containerd/containerd.sock",
            "-n",
            "k8s.io",
        ];
        full.extend(args);
        let out = self.enter("ctr", &full).output()?;
        if !out.status.success() {
            bail!(
                "ctr {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The host PID of a running container of pod `namespace/name` (to enter its namespaces).
    pub fn pod_pid(&self, namespace: &str, name: &str) -> Result<u32> {
        let ids = self.ctr(&["containers", "ls", "-q"])?;
        let tasks = self.ctr(&["tasks", "ls"])?;
        for id in ids.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let info: serde_json::Value =
                serde_json::from_str(&self.ctr(&["containers", "info", id])?)?;
            let labels = &info["Labels"];
            if labels["io.kubernetes.pod.name"] == name
                && labels["io.kubernetes.pod.namespace"] == namespace
                && labels["io.cri-containerd.kind"] == "container"
                && let Some(pid) = tasks
                    .lines()
                    .find(|l| l.starts_with(id))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|p| p.parse().ok())
            {
                return Ok(pid);
            }
        }
        bail!(
            "no running container of pod {namespace}/{name} on {}",
            self.name
        )
    }

    /// A command run in pod `namespace/name`'s network namespace with the pod's own
    /// `/etc/resolv.conf` (the one the kubelet wrote), so host tools like `dig` and `getent`
    /// resolve exactly as the pod would.
    pub fn pod_command(
        &self,
        namespace: &str,
        name: &str,
        program: &str,
        args: &[&str],
    ) -> Result<Command> {
        let pid = self.pod_pid(namespace, name)?;
        let resolv = self
            .dir
            .path()
            .join(format!("resolv-{namespace}-{name}.conf"));
        std::fs::copy(format!("/proc/{pid}/root/etc/resolv.conf"), &resolv)
            .with_context(|| format!("reading the resolv.conf of pod {namespace}/{name}"))?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/proc/{pid}/ns/net"))
            .args([
                "--",
                "unshare",
                "--mount",
                "--",
                "sh",
                "-c",
                "mount --bind \"$0\" /etc/resolv.conf && exec \"$@\"",
            ])
            .arg(&resolv)
            .arg(program)
            .args(args);
        Ok(cmd)
    }

    /// Where containerd reads CNI configurations from (the node agent writes there), as seen
    /// from the host.
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.dir.path().join("etc-up/cni/net.d")
    }

    /// Waits until the Node object exists and returns its `spec.podCIDR` once allocated.
    pub fn wait_registered(&self, cp: &ControlPlane<'_>, timeout: Duration) -> Result<String> {
        wait_for(
            &format!("node {} to register and get a pod CIDR", self.name),
            timeout,
            || {
                let v = cp.kubectl_json(&["get", "node", &self.name])?;
                Ok(v["spec"]["podCIDR"].as_str().map(str::to_string))
            },
        )
        .with_context(|| self.diagnostics())
    }

    /// A log: `agent`, or a child's (`containerd`, `kubelet`, `kube-proxy`).
    pub fn log(&self, component: &str) -> PathBuf {
        match component {
            "agent" => self.dir.path().join("agent.log"),
            c => self.dir.path().join(format!("var-log/socialweb/{c}.log")),
        }
    }

    /// Stops the node as a lost VM would: the agent, its children and every container killed.
    fn stop(&mut self) {
        self.agent.kill_now();
        self.cgroup.destroy();
        // containerd-shims left the cgroup tree (they live beside containerd); kill whatever
        // still runs in the node's mount namespace, then the holder, which ends it.
        socialweb_provider::machine::kill_mount_namespace(self.holder_pid);
        self.holder.kill_now();
    }
}

impl Drop for KubeNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The sequence number of a scratch dir (`swt-<pid>-<seq>-...`), to name the cgroup alike.
fn dir_seq(dir: &Path) -> String {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.split('-').nth(2).unwrap_or("0").to_string()
}
