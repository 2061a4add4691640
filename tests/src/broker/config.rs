//! The configurations the harness runs the broker and its provider machines with, built as the
//! broker's own [`Config`] and written with `toml`: a key the broker renames breaks the harness
//! at compile time, not every broker test at run time.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use socialweb_broker::config::{
    Access, ClusterDefaults, Config, Front, LocalProvider, LocalShape, MachineKind, ProviderRef,
    Registration, Vm,
};
use socialweb_provider::AccelChoice;

use crate::cni::workspace_bin;
use crate::k8s::{binaries, test_kubelet_patch};
use crate::world::{OPERATOR_ADDR, OPERATOR_PRIVATE_ADDR, RESOLVER_ADDR};

/// The port the front (and the gateway API) listens on in the host namespace.
pub const FRONT_PORT: u16 = 8443;

/// Where the embedded provider listens on the operator's host.
pub const PROVIDER_ADDR: &str = "127.0.0.1:7480";

/// The port a provider machine serves the market protocol on.
pub const PROVIDER_PORT: u16 = 7480;

/// Every node's disk, in MiB.
const NODE_DISK_MIB: u64 = 20480;

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
    /// `store.key_file`: the clusters' CA material sealed into the store.
    pub store_key_file: Option<PathBuf>,
    /// Run on the world's broker host `i` ([`crate::world::World::fleet`]) instead of the
    /// operator's host.
    pub on_host: Option<u8>,
    /// `fleet.enabled` with this `fleet.lease_ttl`.
    pub fleet_lease_ttl: Option<Duration>,
    /// `fleet.max_awake`.
    pub fleet_max_awake: Option<u32>,
    /// The `[disk]` section (default: the broker's).
    pub disk: Option<socialweb_broker::config::Disk>,
    /// The `[backup]` section (default: none scheduled).
    pub backup: Option<socialweb_broker::config::Backup>,
    /// The `[certificates]` section (default: kubeadm's lifetimes).
    pub certificates: Option<socialweb_broker::config::Certificates>,
    /// The state directory on a tmpfs of its own of this many MiB (default: the test's
    /// temporary directory's filesystem).
    pub state_fs_mib: Option<u64>,
    /// Rent from these provider machines (another host's of the fleet:
    /// [`super::Broker::market_refs`]) instead of starting its own.
    pub rent_from: Vec<ProviderRef>,
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
    /// The configuration's `[front]` section; the harness sets `listen` and
    /// `did_web_nameservers` over it.
    pub front: Front,
    /// The `[access]` section. Default: registration open and the tenants trusted (the tests
    /// are the tenants); the product's default is closed and untrusted, which
    /// `tests/tests/hostile.rs` runs with `Access::default()`.
    pub access: Access,
    /// More seed image archives every node imports at boot (the conformance suite's images).
    pub extra_seeds: Vec<PathBuf>,
    /// The broker's open-file limit (soft and hard), when not the harness's own.
    pub nofile: Option<u64>,
    /// How far ahead of the machine's the daemon's wall clock runs (libfaketime; its
    /// monotonic clock is left alone): a fleet host with a wrong clock.
    pub clock_ahead: Option<Duration>,
    /// More environment for the daemon (`NOTIFY_SOCKET`, `WATCHDOG_USEC`: systemd's).
    pub env: Vec<(String, String)>,
    /// The `[clusters]` section; the harness sets `upstream_resolvers` and `kine_binary` over
    /// it.
    pub clusters: ClusterDefaults,
    /// The shapes every provider rents, `(vCPUs, MiB, price a hour in millionths)`; empty:
    /// the `[node]` size at price 0.
    pub shapes: Vec<(u32, u64, u64)>,
    /// The zone of each provider, in order (region `test`; the embedded provider takes the
    /// first); none: no region or zone.
    pub zones: Vec<String>,
    /// The `socialweb-broker` the daemon and the operator's commands run (another version's,
    /// for the upgrade test); default: this build's. Providers run this build's.
    pub broker_bin: Option<PathBuf>,
    /// The node software namespace nodes run (`socialweb-agent`, `socialweb-cni`), another
    /// version's; default: this build's.
    pub node_bins: Option<(PathBuf, PathBuf)>,
}

/// Puts a provider in region `test`, zone `zone` (none: neither).
pub(super) fn set_zone(lp: &mut LocalProvider, zone: Option<&String>) {
    lp.region = zone.map(|_| "test".to_string());
    lp.zone = zone.cloned();
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
            store_key_file: None,
            on_host: None,
            fleet_lease_ttl: None,
            fleet_max_awake: None,
            disk: None,
            backup: None,
            certificates: None,
            state_fs_mib: None,
            rent_from: Vec::new(),
            request_timeout: Duration::from_secs(5),
            node_vcpu: 2,
            node_mem_mib: 2048,
            image: None,
            vm: false,
            vm_unjailed: false,
            front: Front::default(),
            access: Access {
                registration: Registration::Open,
                tenants_trusted: true,
                ..Access::default()
            },
            extra_seeds: Vec::new(),
            nofile: None,
            clock_ahead: None,
            env: Vec::new(),
            clusters: ClusterDefaults::default(),
            shapes: Vec::new(),
            zones: Vec::new(),
            broker_bin: None,
            node_bins: None,
        }
    }
}

/// What every node of this broker's providers runs and imports, and where the broker's
/// clusters find their Kubernetes and kine.
#[derive(Debug)]
pub(super) struct NodeSoftware {
    kube: PathBuf,
    /// The broker's kine (its clusters' default datastore).
    kine: PathBuf,
    agent: PathBuf,
    cni: PathBuf,
    seeds: Vec<PathBuf>,
}

impl NodeSoftware {
    pub(super) fn new(opts: &BrokerOptions, dir: &Path, cni: &Path) -> Result<NodeSoftware> {
        let bins = binaries()?;
        let seeds = dir.join("seeds");
        std::fs::create_dir_all(&seeds)?;
        crate::images::write_busybox(&seeds.join("busybox.tar"))?;
        Ok(NodeSoftware {
            kube: bins.dir.clone(),
            kine: crate::k8s::kine()?,
            agent: opts
                .node_bins
                .as_ref()
                .map(|(agent, _)| agent.clone())
                .unwrap_or_else(|| workspace_bin("socialweb-agent")),
            cni: cni.to_path_buf(),
            // A node image brings its own seeds (busybox among the suite image's).
            seeds: if opts.image.is_some() {
                None
            } else {
                Some(seeds.join("busybox.tar"))
            }
            .into_iter()
            .chain(opts.extra_seeds.iter().cloned())
            .collect(),
        })
    }

    /// The `[local_provider]` section: listening on `listen` with `prefix`, serving `brokers`.
    fn local_provider(
        &self,
        opts: &BrokerOptions,
        listen: SocketAddr,
        prefix: &str,
        brokers: Vec<String>,
    ) -> LocalProvider {
        let mut lp = LocalProvider {
            listen,
            brokers,
            capacity: opts.provider_capacity,
            shapes: opts
                .shapes
                .iter()
                .map(|&(vcpu, mem_mib, price)| LocalShape {
                    vcpu,
                    mem_mib,
                    disk_mib: NODE_DISK_MIB,
                    price_micros_per_hour: price,
                })
                .collect(),
            prefix: prefix.to_string(),
            agent: self.agent.clone(),
            cni_bin_dir: self.cni.clone(),
            seed_images: self.seeds.clone(),
            // A guest's agent runs as the image's unit starts it: no patch to give.
            kubelet_config_patch: (!opts.vm).then(test_kubelet_patch),
            image: opts.image.clone(),
            ..LocalProvider::default()
        };
        if opts.image.is_some() && opts.vm {
            lp.machine = MachineKind::Vm;
            lp.vm = Vm {
                accel: AccelChoice::Auto,
                boot_timeout: Duration::from_secs(15 * 60),
                // This machine has no working KVM (nested guests hang): its TCG guests stand
                // for VMs.
                tcg_as_vm: true,
                jail: !opts.vm_unjailed,
                ..Vm::default()
            };
        }
        lp
    }

    /// What the broker and every provider machine share: the state directory, the
    /// Kubernetes we ship, the node size.
    fn base(&self, opts: &BrokerOptions, state: &Path) -> Config {
        let mut c = Config {
            state_dir: state.to_path_buf(),
            kube_dir: self.kube.clone(),
            ..Config::default()
        };
        c.node.vcpu = opts.node_vcpu;
        c.node.mem_mib = opts.node_mem_mib;
        c.node.disk_mib = NODE_DISK_MIB;
        c
    }

    /// The broker's configuration: listening on `bind` (the operator host's address, told to
    /// nodes as [`OPERATOR_ADDR`] when it is another: a 1:1 NAT), renting from `providers`
    /// (their names, URLs and pins), or from its embedded provider (with `prefix`) when there
    /// are none.
    pub(super) fn broker(
        &self,
        opts: &BrokerOptions,
        dir: &Path,
        prefix: &str,
        bind: std::net::Ipv4Addr,
        bind_v6: Option<std::net::Ipv6Addr>,
        providers: Vec<ProviderRef>,
    ) -> Config {
        let mut c = self.base(opts, &dir.join("state"));
        c.service_addr = bind;
        c.service_addr_v6 = bind_v6;
        c.advertise_addr = (bind == OPERATOR_PRIVATE_ADDR).then_some(OPERATOR_ADDR);
        c.ctl_socket = dir.join("broker.sock");
        c.store.url = opts.store_url.clone();
        c.store.key_file = opts.store_key_file.clone();
        if let Some(ttl) = opts.fleet_lease_ttl {
            c.fleet.enabled = true;
            c.fleet.lease_ttl = ttl;
            c.fleet.max_awake = opts.fleet_max_awake;
        }
        if let Some(d) = &opts.disk {
            c.disk = d.clone();
        }
        if let Some(bk) = &opts.backup {
            c.backup = bk.clone();
        }
        if let Some(certs) = &opts.certificates {
            c.certificates = certs.clone();
        }
        c.scale.max_nodes = opts.max_nodes;
        c.scale.pods_per_node = opts.pods_per_node;
        c.scale.hold = opts.hold;
        c.market.bid_deadline = opts.bid_deadline;
        // A guest under TCG boots and joins in minutes.
        c.market.boot_timeout = Duration::from_secs(if opts.vm { 15 * 60 } else { 120 });
        c.market.request_timeout = opts.request_timeout;
        if opts.vm && !opts.vm_unjailed {
            c.market.isolation = socialweb_market::Isolation::Vm;
        }
        c.market.providers = providers;
        let listen = PROVIDER_ADDR.parse().expect("an address");
        c.local_provider = self.local_provider(opts, listen, prefix, Vec::new());
        set_zone(&mut c.local_provider, opts.zones.first());
        c.clusters = ClusterDefaults {
            upstream_resolvers: vec![RESOLVER_ADDR.to_string()],
            kine_binary: self.kine.clone(),
            ..opts.clusters.clone()
        };
        c.front = Front {
            listen: SocketAddr::from(([0, 0, 0, 0], FRONT_PORT)),
            did_web_nameservers: vec![SocketAddr::from((RESOLVER_ADDR, 53))],
            ..opts.front.clone()
        };
        c.access = opts.access.clone();
        c
    }

    /// A provider machine's configuration: listening on `listen` with `prefix`, keeping its
    /// state in `state`, serving the broker whose key is `broker_pin`.
    pub(super) fn provider(
        &self,
        opts: &BrokerOptions,
        state: &Path,
        listen: SocketAddr,
        prefix: &str,
        broker_pin: &str,
    ) -> Config {
        let mut c = self.base(opts, state);
        c.local_provider = self.local_provider(opts, listen, prefix, vec![broker_pin.to_string()]);
        c
    }
}

/// Reads a configuration file as the broker does (the file alone: no variables over it).
pub fn read_config(path: &Path) -> Result<Config> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Writes `config` to `path` as the broker reads it: only what differs from the defaults, as
/// an operator writes one. So the file also reads in another version of the broker that has
/// fewer settings (the upgrade test's previous release), which refuses any key it does not
/// know, and takes its own defaults for the rest.
pub fn write_config(path: &Path, config: &Config) -> Result<()> {
    let mut value = toml::Value::try_from(config).context("a configuration as TOML")?;
    let defaults = toml::Value::try_from(Config::default()).context("the defaults as TOML")?;
    without_defaults(&mut value, &defaults);
    let text = toml::to_string_pretty(&value).context("writing a configuration as TOML")?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Removes from the table `v` every key whose value is `defaults`' (tables key by key).
fn without_defaults(v: &mut toml::Value, defaults: &toml::Value) {
    let (toml::Value::Table(t), toml::Value::Table(d)) = (v, defaults) else {
        return;
    };
    t.retain(|k, value| match d.get(k) {
        Some(def @ toml::Value::Table(_)) => {
            without_defaults(value, def);
            value.as_table().is_none_or(|t| !t.is_empty())
        }
        Some(def) => value != def,
        None => true,
    });
}
