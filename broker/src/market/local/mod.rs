//! The local provider: the market protocol (contract 6) served on this machine, booting each
//! leased node as a machine here ([`machine`]) with its own network ([`network`]), where
//! `socialweb-agent run` starts from the identity the broker put in the acceptance and joins
//! by itself. It is the broker's embedded default and what the tests rent from; the broker
//! talks to it over HTTP like to any provider.
//!
//! It keeps its own record of what it runs (`provider.json` in its directory, rewritten
//! atomically on every change), so it can be asked what is really leased, and a provider that
//! restarts adopts the machines it left running instead of losing them.

pub mod machine;
pub mod network;
pub mod oci;
mod server;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::protocol::{Bid, Lease, LeaseState, NodeSpec, RfpRequest};
use machine::{Machine, MachineRecord, alive, start_time};
use network::NodeNet;

pub use server::serve;

/// How the local provider is set up.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    /// Its records and the machines' scratch directories.
    pub dir: PathBuf,
    /// Nodes it runs at most.
    pub capacity: u32,
    /// The largest node it offers.
    pub max_spec: NodeSpec,
    pub subnet: Ipv4Addr,
    /// Prefix of its network namespaces, links and cgroups.
    pub prefix: String,
    pub agent: PathBuf,
    /// The Kubernetes we ship (`kube`, `pause`).
    pub kube_dir: PathBuf,
    pub cni_bin_dir: PathBuf,
    pub seed_images: Vec<PathBuf>,
    pub kubelet_config_patch: Option<serde_json::Value>,
    /// A node image (`socialweb-image-builder`'s output directory): nodes boot from its
    /// `rootfs.ext4` and seed disk and run its agent, kubelet and containerd, as a rented VM
    /// would ([`Machine::create_from_image`]); `agent`, `kube_dir`'s node parts and
    /// `cni_bin_dir` are then not used. `None`: nodes run the host's binaries.
    pub image: Option<PathBuf>,
    /// Its name in bids.
    pub name: String,
    pub price_micros_per_hour: u64,
}

/// One RFP and what became of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RfpEntry {
    req: RfpRequest,
    bids: Vec<Bid>,
    accepted: Option<String>,
}

/// One lease and the machine that is its node.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LeaseEntry {
    lease: Lease,
    slot: u8,
    machine: Option<MachineRecord>,
    /// The agent's pid and start time.
    agent: Option<(u32, u64)>,
    /// The acceptance's identity, kept to start the agent again.
    identity: serde_json::Value,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Records {
    rfps: BTreeMap<String, RfpEntry>,
    leases: BTreeMap<String, LeaseEntry>,
}

/// The running provider.
#[derive(Debug, Clone)]
pub struct Provider {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: ProviderConfig,
    records: Mutex<Records>,
    stop: CancellationToken,
}

fn now_text() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Problems the server turns into error answers.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Expired(String),
    #[error("{0}")]
    Internal(String),
}

impl Provider {
    /// Loads the records in `cfg.dir` (adopting machines that still run) and starts the
    /// monitor that boots, watches and restarts agents.
    pub fn start(cfg: ProviderConfig) -> Result<Provider> {
        machine::check_cgroups()?;
        std::fs::create_dir_all(&cfg.dir)
            .with_context(|| format!("creating {}", cfg.dir.display()))?;
        let path = cfg.dir.join("provider.json");
        let records: Records = match std::fs::read(&path) {
            Ok(b) => {
                serde_json::from_slice(&b).with_context(|| format!("reading {}", path.display()))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Records::default(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let p = Provider {
            inner: Arc::new(Inner {
                cfg,
                records: Mutex::new(records),
                stop: CancellationToken::new(),
            }),
        };
        let resume = p.adopt();
        for id in resume {
            let q = p.clone();
            tokio::task::spawn_blocking(move || q.boot(&id));
        }
        tokio::spawn(p.clone().monitor());
        Ok(p)
    }

    /// Stops watching (machines keep running; a later start adopts them).
    pub fn stop(&self) {
        self.inner.stop.cancel();
    }

    fn save(&self, r: &Records) {
        let path = self.inner.cfg.dir.join("provider.json");
        let tmp = path.with_extension("json.tmp");
        let res = serde_json::to_vec_pretty(r)
            .map_err(anyhow::Error::from)
            .and_then(|b| Ok(std::fs::write(&tmp, b)?))
            .and_then(|()| Ok(std::fs::rename(&tmp, &path)?));
        if let Err(e) = res {
            warn!("local provider: saving {}: {e:#}", path.display());
        }
    }

    /// Adopts the machines that still run; returns the leases whose boot was cut short (to
    /// boot again: whatever the first attempt left is cleared first).
    fn adopt(&self) -> Vec<String> {
        let mut r = self.inner.records.lock().expect("lock");
        let mut changed = false;
        let mut resume = Vec::new();
        for e in r.leases.values_mut().filter(|e| e.lease.state.live()) {
            let machine = e.machine.clone().and_then(Machine::adopt);
            match (e.lease.state, machine) {
                (_, Some(_)) => {
                    info!(lease = %e.lease.id, "local provider: adopted a running machine")
                }
                (LeaseState::Booting, None) if e.machine.is_none() => {
                    resume.push(e.lease.id.clone())
                }
                (_, None) => {
                    set_state(
                        &mut e.lease,
                        LeaseState::Failed,
                        Some("the machine vanished while the provider was down".into()),
                    );
                    changed = true;
                }
            }
        }
        if changed {
            self.save(&r);
        }
        resume
    }

    /// Every lease, for `GET /v1/leases` (filtered by a `key=value` tag).
    pub fn leases(&self, tag: Option<(&str, &str)>) -> Vec<Lease> {
        let r = self.inner.records.lock().expect("lock");
        r.leases
            .values()
            .map(|e| e.lease.clone())
            .filter(|l| tag.is_none_or(|(k, v)| l.tags.get(k).is_some_and(|x| x == v)))
            .collect()
    }

    pub fn lease(&self, id: &str) -> Option<Lease> {
        self.inner
            .records
            .lock()
            .expect("lock")
            .leases
            .get(id)
            .map(|e| e.lease.clone())
    }

    /// Takes an RFP; bids at once if it can run the node.
    pub fn rfp(&self, req: RfpRequest) -> Result<super::protocol::Rfp, ProviderError> {
        req.validate().map_err(ProviderError::BadRequest)?;
        let mut r = self.inner.records.lock().expect("lock");
        if let Some(e) = r.rfps.get(&req.id) {
            if e.req != req {
                return Err(ProviderError::Conflict(format!(
                    "RFP {} exists with other terms",
                    req.id
                )));
            }
            return Ok(rfp_view(e));
        }
        let max = &self.inner.cfg.max_spec;
        let fits = req.spec.vcpu <= max.vcpu
            && req.spec.mem_mib <= max.mem_mib
            && req.spec.disk_mib <= max.disk_mib;
        let live = r.leases.values().filter(|e| e.lease.state.live()).count() as u32;
        let mut bids = Vec::new();
        let no_bid = (|| {
            fail::fail_point!("provider::no_bid", |_| true);
            false
        })();
        if fits && live < self.inner.cfg.capacity && !no_bid {
            let expires = SystemTime::now()
                + Duration::from_millis(req.bid_deadline_ms)
                + Duration::from_secs(60);
            bids.push(Bid {
                id: format!("{}-b1", req.id),
                rfp_id: req.id.clone(),
                provider: self.inner.cfg.name.clone(),
                price_micros_per_hour: self.inner.cfg.price_micros_per_hour,
                eta_ms: 3000,
                expires_at: humantime::format_rfc3339_seconds(expires).to_string(),
            });
        } else {
            info!(rfp = %req.id, fits, live, "local provider: no bid");
        }
        let e = RfpEntry {
            req,
            bids,
            accepted: None,
        };
        let view = rfp_view(&e);
        r.rfps.insert(e.req.id.clone(), e);
        self.save(&r);
        Ok(view)
    }

    pub fn get_rfp(&self, id: &str) -> Option<super::protocol::Rfp> {
        self.inner
            .records
            .lock()
            .expect("lock")
            .rfps
            .get(id)
            .map(rfp_view)
    }

    /// Accepts a bid: a lease in `booting`, the machine made by the monitor.
    pub fn accept(&self, bid_id: &str, a: super::protocol::Accept) -> Result<Lease, ProviderError> {
        if !super::protocol::valid_id(&a.lease_id) {
            return Err(ProviderError::BadRequest(format!(
                "lease_id: {:?} is not 1-64 of [A-Za-z0-9._-]",
                a.lease_id
            )));
        }
        // The identity is untrusted input to this provider too: parsed where it is defined.
        let id = socialweb_wire::NodeIdentity::from_json(a.identity.to_string().as_bytes())
            .map_err(|e| ProviderError::BadRequest(format!("identity: {e}")))?;
        let mut r = self.inner.records.lock().expect("lock");
        if let Some(e) = r.leases.get(&a.lease_id) {
            if e.lease.bid_id != bid_id {
                return Err(ProviderError::Conflict(format!(
                    "lease {} exists for another bid",
                    a.lease_id
                )));
            }
            return Ok(e.lease.clone());
        }
        let rfp_id = r
            .rfps
            .values()
            .find(|e| e.bids.iter().any(|b| b.id == bid_id))
            .map(|e| e.req.id.clone())
            .ok_or_else(|| ProviderError::NotFound(format!("no bid {bid_id}")))?;
        let entry = r.rfps.get(&rfp_id).expect("found above");
        if let Some(other) = &entry.accepted {
            return Err(ProviderError::Conflict(format!(
                "RFP {rfp_id} was accepted already (lease {other})"
            )));
        }
        let bid = entry
            .bids
            .iter()
            .find(|b| b.id == bid_id)
            .expect("found above")
            .clone();
        if humantime::parse_rfc3339(&bid.expires_at).is_ok_and(|t| t < SystemTime::now()) {
            return Err(ProviderError::Expired(format!(
                "bid {bid_id} expired at {}",
                bid.expires_at
            )));
        }
        let used: Vec<u8> = r
            .leases
            .values()
            .filter(|e| e.lease.state.live())
            .map(|e| e.slot)
            .collect();
        let slot = (1..=254u8)
            .take(self.inner.cfg.capacity as usize)
            .find(|s| !used.contains(s))
            .ok_or_else(|| ProviderError::Conflict("no capacity left".into()))?;
        let now = now_text();
        let mut tags = entry.req.tags.clone();
        tags.insert("node".into(), id.node.clone());
        let lease = Lease {
            id: a.lease_id.clone(),
            rfp_id: rfp_id.clone(),
            bid_id: bid_id.to_string(),
            state: LeaseState::Booting,
            reason: None,
            tags,
            node_addr: Some(
                NodeNet::plan(&self.inner.cfg.prefix, self.inner.cfg.subnet, slot)
                    .node_addr
                    .to_string(),
            ),
            created_at: now.clone(),
            updated_at: now,
        };
        r.rfps.get_mut(&rfp_id).expect("found above").accepted = Some(a.lease_id.clone());
        r.leases.insert(
            a.lease_id.clone(),
            LeaseEntry {
                lease: lease.clone(),
                slot,
                machine: None,
                agent: None,
                identity: a.identity,
            },
        );
        self.save(&r);
        info!(lease = %lease.id, node = %id.node, slot, "local provider: lease accepted, booting");
        let p = self.clone();
        let lease_id = lease.id.clone();
        tokio::task::spawn_blocking(move || p.boot(&lease_id));
        Ok(lease)
    }

    /// Releases a lease: its machine destroyed, its network removed. Idempotent.
    pub fn release(&self, id: &str) -> Option<Lease> {
        let (entry, was_live) = {
            let mut r = self.inner.records.lock().expect("lock");
            let e = r.leases.get_mut(id)?;
            let was_live = e.lease.state.live();
            if was_live {
                set_state(
                    &mut e.lease,
                    LeaseState::Released,
                    Some("released by the client".into()),
                );
            }
            let snapshot = e.clone();
            self.save(&r);
            (snapshot, was_live)
        };
        if was_live || entry.machine.is_some() {
            self.teardown(&entry);
            info!(lease = %id, "local provider: released");
        }
        Some(entry.lease)
    }

    fn net(&self, slot: u8) -> NodeNet {
        NodeNet::plan(&self.inner.cfg.prefix, self.inner.cfg.subnet, slot)
    }

    fn teardown(&self, e: &LeaseEntry) {
        if let Some((pid, started)) = e.agent
            && alive(pid)
            && start_time(pid) == Some(started)
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
        self.net(e.slot).remove();
        let mut r = self.inner.records.lock().expect("lock");
        if let Some(x) = r.leases.get_mut(&e.lease.id) {
            x.machine = None;
            x.agent = None;
        }
        self.save(&r);
    }

    fn update(&self, id: &str, f: impl FnOnce(&mut LeaseEntry)) {
        let mut r = self.inner.records.lock().expect("lock");
        if let Some(e) = r.leases.get_mut(id) {
            f(e);
        }
        self.save(&r);
    }

    /// Makes the machine of a booting lease and starts its agent (blocking: runs on a
    /// blocking thread). A failure fails the lease with the reason.
    fn boot(&self, id: &str) {
        let Some(entry) = self
            .inner
            .records
            .lock()
            .expect("lock")
            .leases
            .get(id)
            .cloned()
        else {
            return;
        };
        let fail_boot = (|| {
            fail::fail_point!("provider::fail_boot", |_| true);
            false
        })();
        let result = if fail_boot {
            Err(anyhow::anyhow!(
                "injected boot failure (failpoint provider::fail_boot)"
            ))
        } else {
            self.make_machine(&entry)
        };
        match result {
            Ok((record, agent)) => self.update(id, |e| {
                e.machine = Some(record);
                e.agent = Some(agent);
            }),
            Err(err) => {
                warn!(lease = %id, "local provider: boot failed: {err:#}");
                self.update(id, |e| {
                    set_state(
                        &mut e.lease,
                        LeaseState::Failed,
                        Some(format!("boot failed: {err:#}")),
                    )
                });
                let e = self
                    .inner
                    .records
                    .lock()
                    .expect("lock")
                    .leases
                    .get(id)
                    .cloned();
                if let Some(e) = e {
                    self.teardown(&e);
                }
            }
        }
    }

    fn node_dir(&self, lease: &str) -> PathBuf {
        self.inner.cfg.dir.join("nodes").join(lease)
    }

    fn make_machine(&self, e: &LeaseEntry) -> Result<(MachineRecord, (u32, u64))> {
        let cfg = &self.inner.cfg;
        let net = self.net(e.slot);
        net.create()?;
        let dir = self.node_dir(&e.lease.id);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        if let Some(image) = &cfg.image {
            let m = Machine::create_from_image(&net.netns_path(), &dir, &net.netns, image)?;
            // More seed archives beside the image's seed disk (the tests' busybox).
            for (i, img) in cfg.seed_images.iter().enumerate() {
                let to = dir.join("seeds").join(format!("seed-{i}.tar"));
                if std::fs::hard_link(img, &to).is_err() {
                    std::fs::copy(img, &to)
                        .with_context(|| format!("seeding {}", img.display()))?;
                }
            }
            // The identity disk: read-only at /etc/socialweb, as the image's fstab mounts it.
            machine::write_secret(
                &dir.join("identity/identity.json"),
                &serde_json::to_vec_pretty(&e.identity)?,
            )?;
            let agent = self.start_agent(&m, e, &net)?;
            return Ok((m.record, agent));
        }
        let m = Machine::create(&net.netns_path(), &dir, &net.netns)?;
        let seeds = m.var_lib("socialweb/images");
        std::fs::create_dir_all(&seeds)?;
        oci::write_pause(&seeds.join("pause.tar"), &cfg.kube_dir.join("pause"))?;
        for (i, img) in cfg.seed_images.iter().enumerate() {
            let to = seeds.join(format!("seed-{i}.tar"));
            if std::fs::hard_link(img, &to).is_err() {
                std::fs::copy(img, &to).with_context(|| format!("seeding {}", img.display()))?;
            }
        }
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin)?;
        for name in ["kubelet", "kube-proxy"] {
            std::os::unix::fs::symlink(cfg.kube_dir.join("kube"), bin.join(name))?;
        }
        machine::write_secret(
            &dir.join("identity.json"),
            &serde_json::to_vec_pretty(&e.identity)?,
        )?;
        let agent = self.start_agent(&m, e, &net)?;
        Ok((m.record, agent))
    }

    fn start_agent(&self, m: &Machine, e: &LeaseEntry, net: &NodeNet) -> Result<(u32, u64)> {
        let cfg = &self.inner.cfg;
        let dir = m.dir();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("agent.log"))?;
        let mut cmd = if cfg.image.is_some() {
            // The image's own agent with the image's defaults (its kubelet, containerd, CNI
            // plugins, identity path), as its systemd unit starts it; only what differs
            // between this host's machines and a VM is given.
            let mut cmd = m.daemon(Path::new("/usr/local/bin/socialweb-agent"));
            cmd.args([
                "--log",
                "stderr",
                "run",
                "--seed-disk",
                machine::IMAGE_SEED_DISK,
            ]);
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
        cmd.arg("--cgroup-root")
            .arg(format!("/{}", m.record.cgroup))
            .arg("--node-ip")
            .arg(net.node_addr.to_string())
            .args(["--child-log-dir", "/var/log/socialweb"]);
        if let Some(p) = &cfg.kubelet_config_patch {
            cmd.arg("--kubelet-config-patch").arg(p.to_string());
        }
        let _ = e;
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
        Ok((pid, start_time(pid).unwrap_or(0)))
    }

    /// Where a node's readiness file is, seen from the host.
    fn ready_file(m: &MachineRecord) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root/run/socialweb/ready", m.holder_pid))
    }

    /// Every second: booting leases whose agent is ready become running; dead agents are
    /// started again (as systemd would on a guest); vanished machines fail their lease.
    async fn monitor(self) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = self.inner.stop.cancelled() => return,
            }
            let entries: Vec<LeaseEntry> = self
                .inner
                .records
                .lock()
                .expect("lock")
                .leases
                .values()
                .filter(|e| e.lease.state.live() && e.machine.is_some())
                .cloned()
                .collect();
            for e in entries {
                let Some(record) = e.machine.clone() else {
                    continue;
                };
                let Some(m) = Machine::adopt(record.clone()) else {
                    self.update(&e.lease.id, |x| {
                        set_state(
                            &mut x.lease,
                            LeaseState::Failed,
                            Some("the machine died".into()),
                        )
                    });
                    continue;
                };
                if e.lease.state == LeaseState::Booting && Self::ready_file(&record).exists() {
                    info!(lease = %e.lease.id, "local provider: node ready, lease running");
                    self.update(&e.lease.id, |x| {
                        set_state(&mut x.lease, LeaseState::Running, None)
                    });
                }
                let agent_alive = e
                    .agent
                    .is_some_and(|(pid, started)| alive(pid) && start_time(pid) == Some(started));
                if !agent_alive {
                    warn!(lease = %e.lease.id, "local provider: the node's agent is not running; starting it again");
                    let p = self.clone();
                    let net = self.net(e.slot);
                    let id = e.lease.id.clone();
                    let started =
                        tokio::task::spawn_blocking(move || p.start_agent(&m, &e, &net)).await;
                    if let Ok(Ok(agent)) = started {
                        self.update(&id, |x| x.agent = Some(agent));
                    }
                }
            }
        }
    }
}

fn set_state(l: &mut Lease, state: LeaseState, reason: Option<String>) {
    l.state = state;
    l.reason = reason;
    l.updated_at = now_text();
}

fn rfp_view(e: &RfpEntry) -> super::protocol::Rfp {
    super::protocol::Rfp {
        id: e.req.id.clone(),
        state: if e.accepted.is_some() {
            "closed"
        } else {
            "open"
        }
        .into(),
        bids: e.bids.clone(),
    }
}
