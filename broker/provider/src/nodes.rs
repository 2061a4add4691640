//! A lease's node on this host: its machine made and its agent started (on a blocking
//! thread: making namespaces and mounts waits for processes), its agent kept running as
//! systemd would on a guest, its state followed (running once the agent's readiness file is
//! there, failed when the machine dies), and everything removed when it is released.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use socialweb_market::{LeaseState, NodeSpec};
use socialweb_proc::same;
use tracing::{info, warn};

use crate::book::{LeaseEntry, set_state};
use crate::machine::{self, Machine, MachineRecord};
use crate::network::NodeNet;
use crate::{Provider, failpoint};

/// How often the monitor looks at every live lease's machine.
const MONITOR_EVERY: Duration = Duration::from_millis(250);

impl Provider {
    /// Adopts the machines that still run; returns the leases whose boot was cut short (to
    /// boot again: whatever the first attempt left is cleared first).
    pub(crate) fn adopt(&self) -> Vec<String> {
        self.inner.ledger.write(|b| {
            let mut resume = Vec::new();
            for e in b.leases.values_mut().filter(|e| e.lease.state.live()) {
                if let Some(g) = &e.guest {
                    if g.running() {
                        info!(lease = %e.lease.id, pid = g.pid, "local provider: adopted a running guest");
                    } else {
                        set_state(
                            &mut e.lease,
                            LeaseState::Failed,
                            Some("the guest ended while the provider was down".into()),
                        );
                    }
                    continue;
                }
                if e.lease.state == LeaseState::Booting
                    && e.machine.is_none()
                    && matches!(self.inner.cfg.machine, crate::MachineKind::Vm(_))
                {
                    resume.push(e.lease.id.clone());
                    continue;
                }
                let machine = e.machine.clone().and_then(Machine::adopt);
                match (e.lease.state, machine) {
                    (_, Some(_)) => {
                        info!(lease = %e.lease.id, "local provider: adopted a running machine")
                    }
                    (LeaseState::Booting, None) if e.machine.is_none() => {
                        resume.push(e.lease.id.clone())
                    }
                    (_, None) => set_state(
                        &mut e.lease,
                        LeaseState::Failed,
                        Some("the machine vanished while the provider was down".into()),
                    ),
                }
            }
            resume
        })
    }

    /// Makes the machine of a booting lease and starts its agent (blocking: runs on a
    /// blocking thread). A failure fails the lease with the reason.
    pub(crate) fn boot(&self, id: &str) {
        let Some(entry) = self.inner.ledger.entry(id) else {
            return;
        };
        let result = if failpoint("provider::fail_boot") {
            Err(anyhow::anyhow!(
                "injected boot failure (failpoint provider::fail_boot)"
            ))
        } else if let crate::MachineKind::Vm(_) = self.inner.cfg.machine {
            match self.boot_guest(&entry) {
                Ok(g) => {
                    self.inner.ledger.update(id, |e| e.guest = Some(g));
                    return;
                }
                Err(e) => Err(e),
            }
        } else {
            self.make_machine(&entry)
        };
        match result {
            Ok((record, agent)) => self.inner.ledger.update(id, |e| {
                e.machine = Some(record);
                e.agent = Some(agent);
            }),
            Err(err) => {
                warn!(lease = %id, "local provider: boot failed: {err:#}");
                self.inner.ledger.update(id, |e| {
                    set_state(
                        &mut e.lease,
                        LeaseState::Failed,
                        Some(format!("boot failed: {err:#}")),
                    )
                });
                if let Some(e) = self.inner.ledger.entry(id) {
                    self.teardown(&e);
                }
            }
        }
    }

    /// Kills the node's agent and machine, removes its network and scratch directory.
    pub(crate) fn teardown(&self, e: &LeaseEntry) {
        if let Some((pid, started)) = e.agent
            && same(pid, started)
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if let Some(m) = e.machine.clone() {
            Machine { record: m.clone() }.destroy();
            let _ = std::fs::remove_dir_all(&m.dir);
        }
        match &e.guest {
            Some(g) => self.remove_guest(e, g),
            None => self.net(e.slot).remove(),
        }
        if let crate::MachineKind::Vm(_) = self.inner.cfg.machine {
            // (A boot cut short before its record was written leaves a directory, and
            // maybe a qemu.)
            let files = crate::vm::GuestFiles {
                dir: self.node_dir(&e.lease.id),
            };
            crate::vm::kill_leftover(&files);
            self.jail_of(e).remove();
            let _ = std::fs::remove_dir_all(&files.dir);
        }
        self.inner.ledger.update(&e.lease.id, |x| {
            x.machine = None;
            x.agent = None;
            x.guest = None;
        });
    }

    pub(crate) fn node_dir(&self, lease: &str) -> PathBuf {
        self.inner.cfg.nodes_dir().join(lease)
    }

    fn make_machine(&self, e: &LeaseEntry) -> Result<(MachineRecord, (u32, u64))> {
        let net = self.net(e.slot);
        net.create()?;
        let dir = self.node_dir(&e.lease.id);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let m = match &self.inner.cfg.image {
            Some(image) => self.image_machine(e, &net, &dir, image)?,
            None => self.host_machine(e, &net, &dir)?,
        };
        let agent = self.start_agent(&m, self.spec_of(e))?;
        Ok((m.record, agent))
    }

    /// More seed archives (the tests' busybox, the conformance images) hard-linked, or
    /// copied, into `dir`.
    fn seed(&self, dir: &Path) -> Result<()> {
        for (i, img) in self.inner.cfg.seed_images.iter().enumerate() {
            let to = dir.join(format!("seed-{i}.tar"));
            if std::fs::hard_link(img, &to).is_err() {
                std::fs::copy(img, &to).with_context(|| format!("seeding {}", img.display()))?;
            }
        }
        Ok(())
    }

    /// A machine running the node image, as a rented VM would.
    fn image_machine(
        &self,
        e: &LeaseEntry,
        net: &NodeNet,
        dir: &Path,
        image: &Path,
    ) -> Result<Machine> {
        let m = Machine::create_from_image(&net.netns_path(), dir, &net.netns, image)?;
        self.seed(&dir.join("seeds"))?;
        // The identity disk: read-only at /etc/socialweb, as the image's fstab mounts it.
        machine::write_secret(
            &dir.join("identity/identity.json"),
            &serde_json::to_vec_pretty(&e.identity)?,
        )?;
        Ok(m)
    }

    /// A machine running this host's agent, kubelet and CNI plugins.
    fn host_machine(&self, e: &LeaseEntry, net: &NodeNet, dir: &Path) -> Result<Machine> {
        let cfg = &self.inner.cfg;
        let m = Machine::create(&net.netns_path(), dir, &net.netns)?;
        let seeds = m.var_lib("socialweb/images");
        std::fs::create_dir_all(&seeds)?;
        socialweb_oci::write_pause(&seeds.join("pause.tar"), &cfg.kube_dir.join("pause"))?;
        self.seed(&seeds)?;
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin)?;
        for name in ["kubelet", "kube-proxy"] {
            std::os::unix::fs::symlink(cfg.kube_dir.join("kube"), bin.join(name))?;
        }
        machine::write_secret(
            &dir.join("identity.json"),
            &serde_json::to_vec_pretty(&e.identity)?,
        )?;
        Ok(m)
    }

    /// The agent's command line: the image's own agent with the image's defaults (its
    /// kubelet, containerd, CNI plugins, identity path), as its systemd unit starts it, or
    /// this host's agent pointed at the machine's files.
    fn agent_command(&self, m: &Machine, spec: NodeSpec) -> std::process::Command {
        let cfg = &self.inner.cfg;
        let dir = m.dir();
        let mut cmd = if cfg.image.is_some() {
            let mut cmd = m.daemon(Path::new("/usr/local/bin/socialweb-agent"));
            cmd.args(["--log", "stderr", "run", "--seed-disk"])
                .arg(machine::IMAGE_SEED_DISK);
            cmd
        } else {
            let mut cmd = m.daemon(&cfg.agent);
            cmd.args(["--log", "stderr", "run", "--identity"])
                .arg(dir.join("identity.json"))
                .arg("--ctl-socket")
                .arg(dir.join("agent.sock"))
                .arg("--kubelet")
                .arg(dir.join("bin/kubelet"))
                .arg("--kube-proxy")
                .arg(dir.join("bin/kube-proxy"))
                .arg("--cni-bin-dir")
                .arg(&cfg.cni_bin_dir);
            cmd
        };
        // (No --node-ip: the identity gives the node its cluster address; the guest's own,
        // 10.0.2.15 behind NAT, is every guest's.)
        cmd.arg("--cgroup-root")
            .arg(format!("/{}", m.record.cgroup))
            .args(["--child-log-dir", "/var/log/socialweb"]);
        if let Some(p) = kubelet_patch(spec, cfg.kubelet_config_patch.as_ref()) {
            cmd.arg("--kubelet-config-patch").arg(p.to_string());
        }
        cmd
    }

    fn start_agent(&self, m: &Machine, spec: NodeSpec) -> Result<(u32, u64)> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(m.dir().join("agent.log"))?;
        let mut cmd = self.agent_command(m, spec);
        cmd.env("SOCIALWEB_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let mut child = cmd
            .spawn()
            .context("starting socialweb-agent in the machine")?;
        let pid = child.id();
        std::thread::spawn(move || {
            let _ = child.wait();
        });
        // nsenter and setsid exec: the pid is the agent's.
        std::thread::sleep(Duration::from_millis(20));
        Ok((pid, socialweb_proc::start_time(pid).unwrap_or(0)))
    }

    /// Where a node's readiness file is, seen from the host.
    fn ready_file(m: &MachineRecord) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root/run/socialweb/ready", m.holder_pid))
    }

    /// Every [`MONITOR_EVERY`]: booting leases whose agent is ready become running; dead
    /// agents are started again; vanished machines fail their lease.
    pub(crate) async fn monitor(self) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(MONITOR_EVERY) => {}
                _ = self.inner.stop.cancelled() => return,
            }
            let entries: Vec<LeaseEntry> = self.inner.ledger.read(|b| {
                b.leases
                    .values()
                    .filter(|e| e.lease.state.live() && (e.machine.is_some() || e.guest.is_some()))
                    .cloned()
                    .collect()
            });
            for e in entries {
                self.look_at(e).await;
            }
            *self.inner.turned.lock().expect("lock") = std::time::Instant::now();
        }
    }

    async fn look_at(&self, e: LeaseEntry) {
        if let Some(g) = &e.guest {
            self.look_at_guest(&e, g);
            return;
        }
        let Some(record) = e.machine.clone() else {
            return;
        };
        let id = e.lease.id.clone();
        let Some(m) = Machine::adopt(record.clone()) else {
            self.inner.ledger.update(&id, |x| {
                set_state(
                    &mut x.lease,
                    LeaseState::Failed,
                    Some("the machine died".into()),
                )
            });
            return;
        };
        // The agent's log, appended to for the node's life: kept to a size.
        let log = m.dir().join("agent.log");
        if let Err(err) = socialweb_proc::log::rotate(&log, socialweb_proc::log::LOG_MAX_BYTES) {
            warn!(lease = %id, "rotating {}: {err}", log.display());
        }
        if e.lease.state == LeaseState::Booting && Self::ready_file(&record).exists() {
            info!(lease = %id, "local provider: node ready, lease running");
            self.inner
                .ledger
                .update(&id, |x| set_state(&mut x.lease, LeaseState::Running, None));
        }
        if !e.agent.is_some_and(|(pid, started)| same(pid, started)) {
            warn!(lease = %id, "local provider: the node's agent is not running; starting it again");
            let p = self.clone();
            let spec = self.spec_of(&e);
            let started = tokio::task::spawn_blocking(move || p.start_agent(&m, spec)).await;
            if let Ok(Ok(agent)) = started {
                self.inner.ledger.update(&id, |x| x.agent = Some(agent));
            }
        }
    }
}

/// What a namespace node's kubelet is told beside the operator's patch: the host's CPUs and
/// memory beyond the lease's shape as `systemReserved`, so that the Node's allocatable is
/// the shape that was rented (a namespace machine sees the whole host), as the scale
/// decision planned it. The operator's patch is merged over it (theirs wins).
fn kubelet_patch(
    spec: NodeSpec,
    operator: Option<&serde_json::Value>,
) -> Option<serde_json::Value> {
    let host = host_size();
    let mut patch = serde_json::Map::new();
    if let Some((cpus, mem_mib)) = host {
        let cpu = (u64::from(cpus) * 1000).saturating_sub(u64::from(spec.vcpu) * 1000);
        let mem = mem_mib.saturating_sub(spec.mem_mib);
        let mut reserved = serde_json::Map::new();
        if cpu > 0 {
            reserved.insert("cpu".into(), format!("{cpu}m").into());
        }
        if mem > 0 {
            reserved.insert("memory".into(), format!("{mem}Mi").into());
        }
        if !reserved.is_empty() {
            patch.insert("systemReserved".into(), reserved.into());
        }
    }
    if let Some(serde_json::Value::Object(o)) = operator {
        patch.extend(o.clone());
    }
    (!patch.is_empty()).then_some(serde_json::Value::Object(patch))
}

/// The host's online CPUs and memory in MiB, as the kubelet counts its capacity.
fn host_size() -> Option<(u32, u64)> {
    let cpus = std::thread::available_parallelism().ok()?.get() as u32;
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some((cpus, kib / 1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_node_reserves_the_host_beyond_its_shape() {
        let (cpus, mem) = host_size().expect("this host's size");
        let spec = NodeSpec {
            vcpu: 1,
            mem_mib: 512,
            disk_mib: 20480,
        };
        let p = kubelet_patch(spec, None).expect("a patch");
        let r = &p["systemReserved"];
        if cpus > 1 {
            assert_eq!(r["cpu"], format!("{}m", (cpus - 1) * 1000));
        }
        assert_eq!(r["memory"], format!("{}Mi", mem - 512));
        // The operator's patch wins; a shape as large as the host reserves nothing.
        let op = serde_json::json!({"systemReserved": {"cpu": "100m"}, "maxPods": 30});
        let p = kubelet_patch(spec, Some(&op)).unwrap();
        assert_eq!(p["systemReserved"], serde_json::json!({"cpu": "100m"}));
        assert_eq!(p["maxPods"], 30);
        let whole = NodeSpec {
            vcpu: cpus,
            mem_mib: mem,
            disk_mib: 20480,
        };
        assert_eq!(kubelet_patch(whole, None), None);
    }
}
