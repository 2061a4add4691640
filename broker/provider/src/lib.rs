//! The local provider: the market protocol (contract 6) served on this machine, booting each
//! leased node as a machine here ([`machine`]) with its own network ([`network`]), where
//! `socialweb-agent run` starts from the identity the broker put in the acceptance and joins
//! by itself. `socialweb-broker provider` runs it as its own process; the broker embeds it as
//! its default and talks to it over HTTP like to any provider. It shares nothing with the
//! broker but the protocol's types (`socialweb-market`).
//!
//! - [`book`]: its records (`provider.json`) and the market's rules over them.
//! - [`nodes`]: a lease's machine made, its agent started and kept running, torn down.
//! - [`server`]: the protocol's HTTP surface.
//! - [`machine`], [`network`]: machines of namespaces and their links.
//! - [`vm`]: machines that are qemu guests booted from the node image (`machine = "vm"`).
//!
//! It keeps its own record of what it runs, so it can be asked what is really leased, and a
//! provider that restarts adopts the machines it left running instead of losing them.

mod book;
pub mod jail;
pub mod machine;
pub mod network;
mod nodes;
mod server;
pub mod vm;
mod vm_nodes;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use book::{Acceptance, Ledger, Offer, set_state};
use network::NodeNet;
use socialweb_market::{Accept, Lease, LeaseState, NodeSpec, Rfp, RfpRequest, Shape};

pub use server::{Listen, serve};
pub use vm::{AccelChoice, VmSettings};

/// How the local provider is set up.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    /// Its records and the machines' scratch directories.
    pub dir: PathBuf,
    /// Nodes it runs at most.
    pub capacity: u32,
    /// The node sizes it rents and their prices (at least one): it bids on an RFP at the
    /// price of the cheapest that holds the RFP's spec.
    pub shapes: Vec<Shape>,
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
    /// would ([`machine::Machine::create_from_image`]); `agent`, `kube_dir`'s node parts and
    /// `cni_bin_dir` are then not used. `None`: nodes run the host's binaries.
    pub image: Option<PathBuf>,
    /// What a node is: namespaces on this machine, or a VM booted from `image`.
    pub machine: MachineKind,
    /// Its name in bids.
    pub name: String,
    /// Where its nodes run, as its offer says.
    pub topology: socialweb_market::Topology,
}

/// What a lease's node is on this machine.
#[derive(Debug, Clone)]
pub enum MachineKind {
    /// Network namespaces (and a mount namespace) on this machine's kernel: for tenants the
    /// provider trusts (`Isolation::Namespace`).
    Namespace,
    /// A qemu guest booted from the node image: its own kernel (`Isolation::Vm`).
    Vm(vm::VmSettings),
}

impl ProviderConfig {
    /// Its records: every RFP and lease, and the machine that is each lease's node.
    pub fn records(&self) -> PathBuf {
        self.dir.join("provider.json")
    }

    /// The marker that drains this provider (`socialweb-broker provider-drain`): while it
    /// exists, RFPs get no bid and acceptances are refused; running leases run on until
    /// their clients release them.
    pub fn drain_file(&self) -> PathBuf {
        self.dir.join("draining")
    }

    /// The machines' scratch directories, `<this>/<lease id>` each (the agent's log and
    /// control socket, a guest's console).
    pub fn nodes_dir(&self) -> PathBuf {
        self.dir.join("nodes")
    }

    /// Its largest shape (by vCPUs, then memory): what a lease whose RFP is lost boots as.
    pub fn largest_shape(&self) -> NodeSpec {
        self.shapes
            .iter()
            .map(|s| s.spec)
            .max_by_key(|s| (s.vcpu, s.mem_mib, s.disk_mib))
            .expect("a provider rents at least one shape")
    }

    fn offer(&self) -> Offer {
        Offer {
            shapes: self.shapes.clone(),
            capacity: self.capacity,
            name: self.name.clone(),
            isolation: socialweb_market::Isolation::Namespace,
            machine: "namespace".into(),
            eta_ms: 3000,
        }
    }
}

/// Who is calling: the broker's pinned key (`sha256:<hex>`, mutual TLS) or, on the Unix
/// socket only its owner can open, the embedding broker ([`Client::local`]). Every RFP and
/// lease belongs to the client that made it; no other client sees or touches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client(pub String);

impl Client {
    /// The one client of the owner-only Unix socket.
    pub fn local() -> Client {
        Client("local".into())
    }

    /// A mutual-TLS client, by the pin of the key it proved.
    pub fn pinned(pin: &[u8; 32]) -> Client {
        Client(socialweb_wire::CaTrust::pin_text(pin))
    }
}

/// The running provider.
#[derive(Debug, Clone)]
pub struct Provider {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: ProviderConfig,
    ledger: Ledger,
    stop: CancellationToken,
    /// The node image it holds (read and checked at start), if any.
    image: Option<vm::NodeImage>,
    /// Its VMs' accelerator and why (a VM provider only).
    accel: Option<(vm::Accel, String)>,
    /// When the monitor loop last finished a pass (`/healthz`).
    turned: std::sync::Mutex<std::time::Instant>,
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
    /// An RFP for a node image this provider does not hold.
    #[error("{0}")]
    ImageNotHeld(String),
    #[error("{0}")]
    Expired(String),
    #[error("{0}")]
    Internal(String),
}

/// Whether a failpoint named `name` is set (the tests' misbehaving provider).
fn failpoint(name: &str) -> bool {
    let _ = name; // (unused in a build without failpoints)
    (|| {
        fail::fail_point!(name, |_| true);
        false
    })()
}

impl Provider {
    /// Loads the records in `cfg.dir` (adopting machines that still run) and starts the
    /// monitor that boots, watches and restarts agents.
    pub fn start(cfg: ProviderConfig) -> Result<Provider> {
        let image = cfg
            .image
            .as_deref()
            .map(vm::NodeImage::load)
            .transpose()
            .context("local_provider.image")?;
        let accel = match (&cfg.machine, &image) {
            (MachineKind::Namespace, _) => {
                machine::check_cgroups()?;
                network::machine_nat(&cfg.prefix, cfg.subnet)?;
                None
            }
            (MachineKind::Vm(_), None) => {
                anyhow::bail!(
                    "local_provider.image: required with machine = \"vm\" (the node image its guests boot)"
                )
            }
            (MachineKind::Vm(s), Some(image)) => {
                if s.jail {
                    machine::check_cgroups()?;
                    network::machine_nat(&cfg.prefix, cfg.subnet)?;
                    jail::install(cfg.subnet, &s.egress_allow)?;
                    info!(allowed = ?s.egress_allow,
                          "local provider: each guest jailed, reaching the internet only (nftables table {})", jail::TABLE);
                } else {
                    warn!(
                        "local provider: guests run unjailed (local_provider.vm.jail = false): they bid as namespace isolation"
                    );
                }
                let (accel, why) = vm::choose_accel(s, image)?;
                info!(accel = accel.as_str(), image = %image.name, "local provider: VMs run under {} ({why})", accel.as_str().to_uppercase());
                Some((accel, why))
            }
        };
        socialweb_proc::owner_only::dir(&cfg.dir)
            .with_context(|| format!("creating {} (owner-only)", cfg.dir.display()))?;
        let ledger = Ledger::open(&cfg.records())?;
        let p = Provider {
            inner: Arc::new(Inner {
                cfg,
                ledger,
                stop: CancellationToken::new(),
                image,
                accel,
                turned: std::sync::Mutex::new(std::time::Instant::now()),
            }),
        };
        for id in p.adopt() {
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

    /// Alive (`/healthz`): not stopping, and its monitor loop (which boots, watches and
    /// restarts the nodes every 250 ms) finished a pass within the last 10 s.
    pub fn alive(&self) -> Result<String, String> {
        if self.inner.stop.is_cancelled() {
            return Err("the provider is stopping".into());
        }
        let ago = self.inner.turned.lock().expect("lock").elapsed();
        if ago > std::time::Duration::from_secs(10) {
            return Err(format!(
                "the monitor loop last finished a pass {:.1} s ago (it turns every 250 ms)",
                ago.as_secs_f64()
            ));
        }
        Ok(format!(
            "the monitor loop finished a pass {:.1} s ago",
            ago.as_secs_f64()
        ))
    }

    /// Ready to take leases (`/readyz`): alive, and its records' directory is there (every
    /// lease is written to it before it is answered); says how many slots are free.
    pub fn ready(&self) -> Result<String, String> {
        self.alive()?;
        let dir = &self.inner.cfg.dir;
        if !dir.is_dir() {
            return Err(format!("its records' directory {} is gone", dir.display()));
        }
        let o = self.offer_view();
        let draining = if self.draining() {
            " (draining: no new leases)"
        } else {
            ""
        };
        Ok(format!(
            "{} of {} slots free{draining}, records in {}",
            o.free,
            self.inner.cfg.capacity,
            self.inner.cfg.records().display()
        ))
    }

    /// What it bids with: its config's offer, the isolation of its machines, what they are.
    fn offer(&self) -> Offer {
        let base = self.inner.cfg.offer();
        let mut offer = match (&self.inner.accel, &self.inner.cfg.machine) {
            (Some((accel, _)), MachineKind::Vm(s)) => vm_offer(base, *accel, s.tcg_as_vm, s.jail),
            _ => base,
        };
        if self.draining() {
            // No slot for anything new: no bid, no acceptance, no free slot on offer.
            offer.capacity = 0;
        }
        offer
    }

    /// Whether the operator drains this provider ([`ProviderConfig::drain_file`]).
    pub fn draining(&self) -> bool {
        self.inner.cfg.drain_file().exists()
    }

    /// Refuses an RFP for an image it does not hold: a provider with a node image boots that
    /// one (by fingerprint or name), one without runs this machine's binaries (`local`).
    fn holds(&self, wanted: &str) -> Result<(), ProviderError> {
        let ok = match &self.inner.image {
            Some(image) => image.is(wanted),
            None => wanted == "local",
        };
        if ok {
            return Ok(());
        }
        Err(ProviderError::ImageNotHeld(match &self.inner.image {
            Some(image) => format!(
                "image: {wanted:?} is not held here; this provider boots {} ({})",
                image.fingerprint, image.name
            ),
            None => format!(
                "image: {wanted:?} is not held here; this provider runs its machine's own binaries (\"local\") and holds no node image"
            ),
        }))
    }

    fn net(&self, slot: u8) -> NodeNet {
        NodeNet::plan(&self.inner.cfg.prefix, self.inner.cfg.subnet, slot)
    }

    /// The client's leases, for `GET /v1/leases` (filtered by a `key=value` tag).
    pub fn leases(&self, client: &Client, tag: Option<(&str, &str)>) -> Vec<Lease> {
        self.inner.ledger.read(|b| {
            b.leases
                .values()
                .filter(|e| e.owned_by(&client.0))
                .map(|e| e.lease.clone())
                .filter(|l| tag.is_none_or(|(k, v)| l.tags.get(k).is_some_and(|x| x == v)))
                .collect()
        })
    }

    pub fn lease(&self, client: &Client, id: &str) -> Option<Lease> {
        self.inner
            .ledger
            .read(|b| b.lease_of(&client.0, id).map(|e| e.lease.clone()))
    }

    /// Takes an RFP; bids at once if it can run the node.
    pub fn rfp(&self, client: &Client, req: RfpRequest) -> Result<Rfp, ProviderError> {
        req.validate().map_err(ProviderError::BadRequest)?;
        self.holds(&req.image)?;
        let bid = !failpoint("provider::no_bid");
        let offer = self.offer();
        self.inner
            .ledger
            .write(|b| b.rfp(&client.0, req, &offer, bid))
    }

    /// What it rents now, for `GET /v1/offer`: its shapes, its isolation, its free slots.
    pub fn offer_view(&self) -> socialweb_market::Offer {
        let o = self.offer();
        let live = self
            .inner
            .ledger
            .read(|b| b.leases.values().filter(|e| e.lease.state.live()).count())
            as u32;
        socialweb_market::Offer {
            provider: o.name,
            isolation: o.isolation,
            machine: Some(o.machine),
            shapes: o.shapes,
            free: o.capacity.saturating_sub(live),
            topology: self.inner.cfg.topology.clone(),
        }
    }

    pub fn get_rfp(&self, client: &Client, id: &str) -> Option<Rfp> {
        self.inner.ledger.read(|b| b.rfp_view(&client.0, id))
    }

    /// Accepts a bid: a lease in `booting`, its machine made on a blocking thread.
    pub fn accept(&self, client: &Client, bid_id: &str, a: Accept) -> Result<Lease, ProviderError> {
        // The lease id names the machine's directory: never a path component of its own.
        if !socialweb_market::valid_id(&a.lease_id) {
            return Err(ProviderError::BadRequest(format!(
                "lease_id: {:?} is not {}",
                a.lease_id,
                socialweb_market::ID_RULE
            )));
        }
        // The identity is untrusted input to this provider too: parsed where it is defined.
        let id = socialweb_wire::NodeIdentity::from_json(a.identity.to_string().as_bytes())
            .map_err(|e| ProviderError::BadRequest(format!("identity: {e}")))?;
        if self.draining() {
            return Err(ProviderError::Conflict(
                "this provider is draining: it takes no new lease".into(),
            ));
        }
        let offer = self.offer();
        let acceptance = Acceptance {
            owner: &client.0,
            bid_id,
            lease_id: &a.lease_id,
            node: &id.node,
            identity: a.identity.clone(),
        };
        let (lease, new) = self.inner.ledger.write(|b| {
            b.accept(acceptance, &offer, |slot| match self.inner.cfg.machine {
                // Every user-mode NAT guest is 10.0.2.15 behind this machine.
                MachineKind::Vm(_) => network::GUEST_ADDR.to_string(),
                MachineKind::Namespace => self.net(slot).node_addr.to_string(),
            })
        })?;
        if new {
            info!(lease = %lease.id, node = %id.node, "local provider: lease accepted, booting");
            let p = self.clone();
            let lease_id = lease.id.clone();
            tokio::task::spawn_blocking(move || p.boot(&lease_id));
        }
        Ok(lease)
    }

    /// Releases one of the client's leases: its machine destroyed, its network removed.
    /// Idempotent. Another client's lease is not found.
    pub fn release(&self, client: &Client, id: &str) -> Option<Lease> {
        let (entry, was_live) = self.inner.ledger.write(|b| {
            let e = b.leases.get_mut(id).filter(|e| e.owned_by(&client.0))?;
            let was_live = e.lease.state.live();
            if was_live {
                set_state(
                    &mut e.lease,
                    LeaseState::Released,
                    Some("released by the client".into()),
                );
            }
            Some((e.clone(), was_live))
        })?;
        if was_live || entry.machine.is_some() || entry.guest.is_some() {
            self.teardown(&entry);
            info!(lease = %id, "local provider: released");
        }
        Some(entry.lease)
    }
}

/// A VM provider's offer: its guests are `vm` isolation under KVM, and under TCG only when
/// the operator says so (`tcg_as_vm`): QEMU's security policy counts hardware
/// virtualization, not TCG, as a boundary. An unjailed guest (`jailed` false: measuring
/// the jail) is never `vm`.
fn vm_offer(mut o: Offer, accel: vm::Accel, tcg_as_vm: bool, jailed: bool) -> Offer {
    if jailed && (accel == vm::Accel::Kvm || tcg_as_vm) {
        o.isolation = socialweb_market::Isolation::Vm;
    }
    o.machine = format!("vm/{}", accel.as_str());
    // A guest under TCG boots in minutes, under KVM in seconds.
    o.eta_ms = if accel == vm::Accel::Kvm {
        10_000
    } else {
        120_000
    };
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tcg_guest_is_vm_isolation_only_when_the_operator_says_so() {
        let base = Offer {
            shapes: vec![socialweb_market::Shape {
                spec: NodeSpec {
                    vcpu: 2,
                    mem_mib: 2048,
                    disk_mib: 20480,
                },
                price_micros_per_hour: 0,
            }],
            capacity: 1,
            name: "p".into(),
            isolation: socialweb_market::Isolation::Namespace,
            machine: "namespace".into(),
            eta_ms: 3000,
        };
        let kvm = vm_offer(base.clone(), vm::Accel::Kvm, false, true);
        assert_eq!(kvm.isolation, socialweb_market::Isolation::Vm);
        assert_eq!(kvm.machine, "vm/kvm");
        let tcg = vm_offer(base.clone(), vm::Accel::Tcg, false, true);
        assert_eq!(tcg.isolation, socialweb_market::Isolation::Namespace);
        assert_eq!(tcg.machine, "vm/tcg");
        let opted = vm_offer(base.clone(), vm::Accel::Tcg, true, true);
        assert_eq!(opted.isolation, socialweb_market::Isolation::Vm);
        let unjailed = vm_offer(base, vm::Accel::Kvm, true, false);
        assert_eq!(unjailed.isolation, socialweb_market::Isolation::Namespace);
    }
}
