//! A Kubernetes node inside a node namespace: containerd and a kubelet sharing a private mount
//! namespace (a fresh tmpfs on `/run`, and `/var/lib` and `/var/log` bound to the node's
//! scratch directory, so `/run/containerd`,
//! `/var/lib/kubelet`, `/var/lib/containerd`, `/var/lib/rancher`, `/var/log/pods` are the
//! node's own) and their own cgroup root. Pods get their network from the CNI configuration
//! in [`KubeNode::cni_conf_dir`], run by containerd exactly as on a real node.

use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::cgroup::CgroupRoot;
use super::control_plane::ControlPlane;
use super::{tail, wait_for};
use crate::images;
use crate::netns::Netns;
use crate::process::Spawned;
use crate::tmp::TempDir;

/// What a node is started with.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub name: String,
    /// The node's address (the kubelet's `--node-ip`, where the apiserver reaches it).
    pub node_ip: Ipv4Addr,
    /// Directory with the CNI plugins containerd may run (`socialweb-cni`, `loopback`).
    pub cni_bin_dir: PathBuf,
    /// kubelet `--cluster-dns`.
    pub cluster_dns: Ipv4Addr,
    /// The resolver pods with `dnsPolicy: Default` and the node itself use.
    pub upstream_dns: Ipv4Addr,
}

/// A running node. Dropping it stops the kubelet and containerd, kills every container, and
/// removes its cgroups and files.
#[derive(Debug)]
pub struct KubeNode {
    kubelet: Spawned,
    containerd: Spawned,
    holder: Spawned,
    holder_pid: u32,
    cgroup: CgroupRoot,
    pub name: String,
    pub timings: Vec<(&'static str, Duration)>,
    dir: TempDir,
}

impl KubeNode {
    /// Starts containerd and a kubelet in `ns`, joined to `cp`. Returns once the kubelet runs;
    /// the Node object appears in the cluster moments later (see [`KubeNode::wait_registered`]).
    pub fn start(cp: &ControlPlane<'_>, ns: &Netns, opts: NodeOptions) -> Result<KubeNode> {
        let t = Instant::now();
        let mut timings = Vec::new();
        let dir = TempDir::new(&format!("kubelet-{}", opts.name))?;
        let d = dir.path();
        let cgroup = CgroupRoot::create(&format!("swt-{}-{}", std::process::id(), dir_seq(d)))?;

        // The holder creates the mount namespace and keeps it alive; containerd and the
        // kubelet enter it.
        let ready = d.join("holder.ready");
        // /sys is remounted so that it shows this network namespace's devices (as
        // `ip netns exec` does), with the cgroup hierarchies carried over, which the kubelet
        // and runc need and `ip netns exec` would lose.
        // /var/lib and /var/log are bind mounts of directories on the host's disk rather than
        // tmpfs: cAdvisor cannot tell tmpfs mounts apart and the kubelet's eviction manager
        // then fails to find the image filesystem.
        for sub in ["var-lib", "var-log"] {
            std::fs::create_dir_all(d.join(sub))?;
        }
        let script = format!(
            "set -e; mount -t tmpfs tmpfs /run; mkdir -p /run/netns /run/.cgroup; \
             mount --rbind /sys/fs/cgroup /run/.cgroup; mount -t sysfs sysfs /sys; \
             mount --rbind /run/.cgroup /sys/fs/cgroup; umount -l /run/.cgroup; \
             mount --bind {d}/var-lib /var/lib; mount --bind {d}/var-log /var/log; \
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
        let holder = Spawned::start_logged(hcmd, "mount namespace holder", &d.join("holder.log"))?;
        wait_for(
            "the node's mount namespace",
            Duration::from_secs(10),
            || Ok(ready.exists().then_some(())),
        )
        .with_context(|| tail(&d.join("holder.log"), 10))?;
        // nsenter, unshare and sh exec one another: the holder's pid ends up running `sleep`.
        let holder_pid = find_sleep_child(holder.id()).context("finding the holder's process")?;

        let mut node = KubeNode {
            kubelet: Spawned::none("kubelet"),
            containerd: Spawned::none("containerd"),
            holder,
            holder_pid,
            cgroup,
            name: opts.name.clone(),
            timings: Vec::new(),
            dir,
        };
        let d = node.dir.path().to_path_buf();

        std::fs::create_dir_all(d.join("net.d"))?;
        std::fs::write(
            d.join("resolv.conf"),
            format!("nameserver {}\n", opts.upstream_dns),
        )?;
        std::fs::write(
            d.join("containerd.toml"),
            containerd_config(&opts.cni_bin_dir, &d.join("net.d")),
        )?;
        let containerd = Spawned::start_logged(
            node.enter(
                "containerd",
                &["--config", &d.join("containerd.toml").to_string_lossy()],
            ),
            "containerd",
            &d.join("containerd.log"),
        )?;
        node.containerd = containerd;
        wait_for("containerd's socket", Duration::from_secs(30), || {
            Ok(node
                .enter("test", &["-S", "/run/containerd/containerd.sock"])
                .status()?
                .success()
                .then_some(()))
        })
        .with_context(|| tail(&d.join("containerd.log"), 20))?;
        timings.push(("containerd", t.elapsed()));

        let pause_tar = d.join("pause.tar");
        let busybox_tar = d.join("busybox.tar");
        images::write_pause(&pause_tar, &cp.bins.pause())?;
        images::write_busybox(&busybox_tar)?;
        for tar in [&pause_tar, &busybox_tar] {
            node.ctr(&["images", "import", &tar.to_string_lossy()])?;
        }
        timings.push(("images imported", t.elapsed()));

        let kubeconfig = cp.node_kubeconfig(&opts.name)?;
        std::fs::write(
            d.join("kubelet.yaml"),
            kubelet_config(
                &cp.pki.ca_cert(),
                &node.cgroup.name,
                &opts,
                &d.join("resolv.conf"),
            ),
        )?;
        let kube = cp.bins.kube();
        let kubelet = Spawned::start_logged(
            node.enter(
                &kube.to_string_lossy(),
                &[
                    "kubelet",
                    &format!("--config={}", d.join("kubelet.yaml").display()),
                    &format!("--kubeconfig={}", kubeconfig.display()),
                    "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
                    &format!("--hostname-override={}", opts.name),
                    &format!("--node-ip={}", opts.node_ip),
                    "--node-labels=socialweb.computer/node-local-dns=true",
                    "--v=1",
                ],
            ),
            "kubelet",
            &d.join("kubelet.log"),
        )?;
        node.kubelet = kubelet;
        timings.push(("kubelet started", t.elapsed()));
        node.timings = timings;
        Ok(node)
    }

    /// A command run inside the node's mount and network namespaces.
    pub fn enter(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount=/proc/{}/ns/mnt", self.holder_pid))
            .arg(format!("--net=/proc/{}/ns/net", self.holder_pid))
            .arg("--")
            .arg(program)
            .args(args);
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

    /// Where containerd reads CNI configurations from (the node agent writes there).
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.dir.path().join("net.d")
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
        .with_context(|| tail(&self.log("kubelet"), 30))
    }

    /// A component's log: `kubelet` or `containerd`.
    pub fn log(&self, component: &str) -> PathBuf {
        self.dir.path().join(format!("{component}.log"))
    }

    /// Stops the node as a crash would: kubelet, containerd and every container killed.
    fn stop(&mut self) {
        self.kubelet.kill_now();
        self.containerd.kill_now();
        self.cgroup.destroy();
        // containerd-shims left the cgroup tree (they live beside containerd); kill whatever
        // still runs in the node's mount namespace, then the holder, which ends it.
        kill_mount_namespace(self.holder_pid);
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

/// The `sleep` descendant of `pid` (the holder's actual process after `ip netns exec` and
/// `unshare` have exec'd or forked).
fn find_sleep_child(pid: u32) -> Result<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut stack = vec![pid];
        while let Some(p) = stack.pop() {
            if std::fs::read_to_string(format!("/proc/{p}/comm"))
                .map(|c| c.trim() == "sleep")
                .unwrap_or(false)
            {
                return Ok(p);
            }
            let children =
                std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
            stack.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
        if Instant::now() > deadline {
            bail!("no sleep process below {pid}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills every process whose mount namespace is that of `pid`, except `pid` itself.
fn kill_mount_namespace(pid: u32) {
    let Ok(target) = std::fs::metadata(format!("/proc/{pid}/ns/mnt")).map(|m| m.ino()) else {
        return;
    };
    for _ in 0..50 {
        let mut found = false;
        for entry in std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
        {
            let Ok(p) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if p as u32 == pid {
                continue;
            }
            if std::fs::metadata(format!("/proc/{p}/ns/mnt"))
                .map(|m| m.ino())
                .ok()
                == Some(target)
            {
                found = true;
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        if !found {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn containerd_config(cni_bin: &Path, cni_conf: &Path) -> String {
    format!(
        r#"version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  disable_apparmor = true
  enable_selinux = false
  # This machine grants root no CAP_SYS_RESOURCE, so a sandbox's oom_score_adj of -998 could
  # not be set and every pod would fail in runc init; keep scores at or above containerd's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
    max_conf_num = 1
"#,
        pause = images::PAUSE_IMAGE,
        bin = cni_bin.display(),
        conf = cni_conf.display(),
    )
}

fn kubelet_config(ca: &Path, cgroup_root: &str, opts: &NodeOptions, resolv: &Path) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: {ca}
authorization:
  mode: AlwaysAllow
address: {ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
clusterDNS:
- {dns}
clusterDomain: cluster.local
resolvConf: {resolv}
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
localStorageCapacityIsolation: false
protectKernelDefaults: false
"#,
        ca = ca.display(),
        ip = opts.node_ip,
        dns = opts.cluster_dns,
        resolv = resolv.display(),
    )
}
