//! The broker's configuration: a TOML file, then environment variables over it, then
//! validation. Every error names the file key or the variable and the value that was wrong.
//! The scale variables keep the names operators know from the seeds
//! (`SOCIALWEB_CLUSTERPROVIDER_SCALE_*`).
//!
//! Each subsystem gets its own section (or a value built from the few it needs, in
//! `daemon`), never the whole [`Config`]. Each section is a module here, with its type, its
//! defaults and the checks of its own keys; this file composes them into [`Config`], reads
//! the file and the variables, and checks what spans sections.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
pub use socialweb_broker_core::scale::NodeSize;

pub mod check;
pub mod reference;

mod access;
mod addresses;
mod backup;
mod certificates;
mod clusters;
mod disk;
mod durations;
mod fleet;
mod front;
mod local_provider;
mod market;
mod metrics;
mod node;
mod provider_file;
mod relay;
mod scale;
mod store;
mod tunnel;

pub use access::{Access, Registration};
pub use backup::Backup;
pub use certificates::Certificates;
pub use clusters::{
    CgroupParent, ClusterDefaults, DatastoreKind, MIN_DATASTORE_QUOTA_MIB, hibernate_after_ok,
};
pub use disk::Disk;
pub use fleet::Fleet;
pub use front::{DEFAULT_MAX_STREAMS_PER_CERTIFICATE, Front};
pub use local_provider::{LocalProvider, LocalShape, MachineKind, Vm};
pub use market::{Market, ProviderRef};
pub use metrics::Metrics;
pub use provider_file::ProviderFile;
pub use relay::Relay;
pub use scale::Scale;
pub use store::Store;
pub use tunnel::Tunnel;

use node::NodeSection;

/// A configuration problem, naming where it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}: {problem}")]
pub struct ConfigError {
    /// `SOCIALWEB_CLUSTERPROVIDER_SCALE_HOLD`, or `scale.hold` in the file.
    pub source_name: String,
    pub problem: String,
}

fn err(source: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        source_name: source.to_string(),
        problem: problem.into(),
    }
}

/// Everything the daemon is told.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the store (SQLite by default), the clusters' PKI and data, and the provider's
    /// records live.
    pub state_dir: PathBuf,
    /// The address the broker's tunnel endpoint and relay listen on, and, unless
    /// `advertise_addr` says otherwise, where nodes reach them (and users the front, unless
    /// `front.public_url` says otherwise). Put on `lo` when no interface has it. Tenant
    /// control planes listen on loopback only.
    pub service_addr: Ipv4Addr,
    /// The address nodes and users are told to reach the broker at, when it is not
    /// `service_addr`: a public address on no interface of this host, forwarded to
    /// `service_addr` (a cloud's 1:1 NAT: an elastic or floating IP). Identities name it for
    /// the tunnel endpoint and the relay, the front's default URL and serving certificate
    /// carry it. Default: `service_addr`.
    pub advertise_addr: Option<Ipv4Addr>,
    /// The host's IPv6 address, where it has one: the tunnel endpoint listens on it beside
    /// `service_addr`, identities name it too (a node tries both families and keeps the path
    /// that answers), and the front's self-made certificate carries it. Put on `lo` when no
    /// interface has it. Default: none (IPv4 only). The relay stays on `service_addr`: it is
    /// one server at one URL.
    pub service_addr_v6: Option<Ipv6Addr>,
    /// The IPv6 address nodes are told, when it is not `service_addr_v6` (a prefix
    /// translated on the way in). Default: `service_addr_v6`.
    pub advertise_addr_v6: Option<Ipv6Addr>,
    /// The Kubernetes we ship: a directory with `kube` and `pause`.
    pub kube_dir: PathBuf,
    /// The owner-only control socket the `cluster` commands use.
    pub ctl_socket: PathBuf,
    /// The broker's own records: clusters, provisions, decisions, certificates, accounts.
    pub store: Store,
    /// The scale decision's knobs (docs/scale.md).
    pub scale: Scale,
    /// The node size rented when no provider says its shapes.
    #[schemars(with = "NodeSection")]
    pub node: NodeSize,
    /// Whom the broker rents nodes from (docs/market.md).
    pub market: Market,
    /// The embedded provider (when `[market]` names none) and, on a provider machine,
    /// `socialweb-broker provider`: how it makes nodes.
    pub local_provider: LocalProvider,
    /// The mesh relay: a public listener on `service_addr`.
    pub relay: Relay,
    /// The tunnel endpoint nodes reach their control plane through.
    pub tunnel: Tunnel,
    /// The Prometheus endpoint.
    pub metrics: Metrics,
    /// What every tenant cluster gets: its control plane's datastore and budget, ports, DNS.
    pub clusters: ClusterDefaults,
    /// The way in for users: the certificate front and the gateway API (docs/api.md).
    pub front: Front,
    /// Who may have clusters, and how much of the broker a user may take (docs/security.md).
    pub access: Access,
    /// Several broker hosts sharing one PostgreSQL store (docs/operations.md, "A fleet").
    // Left out of a written configuration while off: a previous release's broker reads
    // the files this one writes (the upgrade test), and knows no `[fleet]`.
    #[serde(skip_serializing_if = "Fleet::is_off")]
    pub fleet: Fleet,
    /// The disk guard: the free space and inodes the state directory's filesystem keeps
    /// (docs/operations.md, "The disk guard").
    #[serde(skip_serializing_if = "Disk::is_default")]
    pub disk: Disk,
    /// Backups of the state directory on a schedule (docs/operations.md, "Backup and
    /// restore").
    #[serde(skip_serializing_if = "Backup::is_default")]
    pub backup: Backup,
    /// How long certificates live, and when they are issued again (docs/operations.md,
    /// "Certificates").
    #[serde(skip_serializing_if = "Certificates::is_default")]
    pub certificates: Certificates,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            state_dir: "/var/lib/socialweb-broker".into(),
            service_addr: Ipv4Addr::new(10, 255, 255, 1),
            advertise_addr: None,
            service_addr_v6: None,
            advertise_addr_v6: None,
            kube_dir: "/usr/lib/socialweb/kubernetes".into(),
            ctl_socket: "/run/socialweb-broker/broker.sock".into(),
            store: Store::default(),
            scale: Scale::default(),
            node: NodeSize::default(),
            market: Market::default(),
            local_provider: LocalProvider::default(),
            relay: Relay::default(),
            tunnel: Tunnel::default(),
            metrics: Metrics::default(),
            clusters: ClusterDefaults::default(),
            front: Front::default(),
            access: Access::default(),
            fleet: Fleet::default(),
            disk: Disk::default(),
            backup: Backup::default(),
            certificates: Certificates::default(),
        }
    }
}

/// The variables read over the file, and what each sets.
pub const ENV: &[(&str, &str)] = &[
    (
        "SOCIALWEB_CLUSTERPROVIDER_SCALE_MAX_NODES",
        "scale.max_nodes",
    ),
    (
        "SOCIALWEB_CLUSTERPROVIDER_SCALE_PODS_PER_NODE",
        "scale.pods_per_node",
    ),
    ("SOCIALWEB_CLUSTERPROVIDER_SCALE_HOLD", "scale.hold"),
    (
        "SOCIALWEB_CLUSTERPROVIDER_SCALE_EXPENDABLE_PRIORITY_CUTOFF",
        "scale.expendable_priority_cutoff",
    ),
    ("SOCIALWEB_CLUSTERPROVIDER_NODE_VCPU", "node.vcpu"),
    ("SOCIALWEB_CLUSTERPROVIDER_NODE_MEM_MIB", "node.memMiB"),
    ("SOCIALWEB_CLUSTERPROVIDER_NODE_DISK_MIB", "node.diskMiB"),
    ("SOCIALWEB_BROKER_STATE_DIR", "state_dir"),
    ("SOCIALWEB_BROKER_STORE_URL", "store.url"),
    ("SOCIALWEB_BROKER_MARKET_URL", "market.url"),
    ("SOCIALWEB_BROKER_SERVICE_ADDR", "service_addr"),
    ("SOCIALWEB_BROKER_ADVERTISE_ADDR", "advertise_addr"),
    ("SOCIALWEB_BROKER_KUBE_DIR", "kube_dir"),
    (
        "SOCIALWEB_BROKER_HIBERNATE_AFTER",
        "clusters.hibernate_after",
    ),
    ("SOCIALWEB_BROKER_DATASTORE", "clusters.datastore"),
    ("SOCIALWEB_BROKER_KINE_BINARY", "clusters.kine_binary"),
    ("SOCIALWEB_BROKER_CGROUP_PARENT", "clusters.cgroup_parent"),
];

fn parse_num<T: std::str::FromStr>(var: &str, v: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    v.trim()
        .parse()
        .map_err(|e| err(var, format!("{v:?} is not a number: {e}")))
}

fn parse_duration(var: &str, v: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(v.trim()).map_err(|e| {
        err(
            var,
            format!("{v:?} is not a duration such as 2m or 90s: {e}"),
        )
    })
}

impl Config {
    /// Reads the file (none: the defaults), applies `env` over it and validates.
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut c = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| err(&path.display().to_string(), e.to_string()))?;
                toml::from_str(&text).map_err(|e| {
                    err(
                        &path.display().to_string(),
                        e.to_string().trim().replace('\n', " "),
                    )
                })?
            }
            None => Config::default(),
        };
        for (var, _) in ENV {
            let Some(v) = env(var) else { continue };
            match *var {
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_MAX_NODES" => {
                    c.scale.max_nodes = parse_num(var, &v).and_then(|n: i64| {
                        u32::try_from(n).map_err(|_| {
                            err(
                                var,
                                format!("{n} must be at least 1; it is refused, not clamped"),
                            )
                        })
                    })?
                }
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_PODS_PER_NODE" => {
                    c.scale.pods_per_node = parse_num::<i64>(var, &v).and_then(|n| {
                        u32::try_from(n).map_err(|_| err(var, format!("{n} must be at least 1")))
                    })?
                }
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_HOLD" => c.scale.hold = parse_duration(var, &v)?,
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_EXPENDABLE_PRIORITY_CUTOFF" => {
                    c.scale.expendable_priority_cutoff = parse_num(var, &v)?
                }
                "SOCIALWEB_CLUSTERPROVIDER_NODE_VCPU" => c.node.vcpu = parse_num(var, &v)?,
                "SOCIALWEB_CLUSTERPROVIDER_NODE_MEM_MIB" => c.node.mem_mib = parse_num(var, &v)?,
                "SOCIALWEB_CLUSTERPROVIDER_NODE_DISK_MIB" => c.node.disk_mib = parse_num(var, &v)?,
                "SOCIALWEB_BROKER_STATE_DIR" => c.state_dir = v.into(),
                "SOCIALWEB_BROKER_STORE_URL" => c.store.url = Some(v).filter(|s| !s.is_empty()),
                "SOCIALWEB_BROKER_MARKET_URL" => c.market.url = Some(v).filter(|s| !s.is_empty()),
                "SOCIALWEB_BROKER_SERVICE_ADDR" => {
                    c.service_addr = v
                        .trim()
                        .parse()
                        .map_err(|e| err(var, format!("{v:?}: {e}")))?
                }
                "SOCIALWEB_BROKER_ADVERTISE_ADDR" => {
                    c.advertise_addr = Some(v.trim())
                        .filter(|s| !s.is_empty())
                        .map(|s| s.parse().map_err(|e| err(var, format!("{v:?}: {e}"))))
                        .transpose()?
                }
                "SOCIALWEB_BROKER_KUBE_DIR" => c.kube_dir = v.into(),
                "SOCIALWEB_BROKER_HIBERNATE_AFTER" => {
                    c.clusters.hibernate_after = parse_duration(var, &v)?
                }
                "SOCIALWEB_BROKER_DATASTORE" => {
                    c.clusters.datastore =
                        DatastoreKind::parse(v.trim()).map_err(|e| err(var, e))?
                }
                "SOCIALWEB_BROKER_KINE_BINARY" => c.clusters.kine_binary = v.into(),
                "SOCIALWEB_BROKER_CGROUP_PARENT" => {
                    c.clusters.cgroup_parent =
                        CgroupParent::parse(v.trim()).map_err(|e| err(var, e))?
                }
                _ => {}
            }
        }
        c.validate(&env)?;
        Ok(c)
    }

    /// Where a setting came from, for errors: the variable if it was set, else the file key.
    fn origin(key: &str, env: &impl Fn(&str) -> Option<String>) -> String {
        ENV.iter()
            .find(|(var, k)| *k == key && env(var).is_some())
            .map(|(var, _)| var.to_string())
            .unwrap_or_else(|| key.to_string())
    }

    /// Each section's own keys, then what spans sections; `o` names a key by where its value
    /// came from. The first problem found is the error, so a file with several shows one at
    /// a time.
    fn validate(&self, env: &impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let o = |k: &str| Self::origin(k, env);
        self.scale.check(&o)?;
        node::check(&self.node, &o)?;
        self.local_provider.check()?;
        self.store.check(&o)?;
        self.market.check(&o)?;
        self.check_service_addrs(&o)?;
        self.clusters.check(&o)?;
        self.check_datastore_server(&o)?;
        self.fleet.check(&o)?;
        self.check_fleet_homes(&o)?;
        self.front.check()?;
        self.relay.check()?;
        self.backup.check(&self.state_dir, &o)?;
        self.certificates.check(&o)?;
        self.access.check()
    }

    /// A `postgres` datastore needs a server: `clusters.postgres_url`, else a PostgreSQL
    /// `store.url`.
    fn check_datastore_server(&self, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
        if self.clusters.datastore == DatastoreKind::Postgres
            && self.clusters_postgres_url().is_none()
        {
            return Err(err(
                &o("clusters.datastore"),
                "is postgres, and neither clusters.postgres_url nor a PostgreSQL store.url says which server",
            ));
        }
        Ok(())
    }

    /// A fleet keeps nothing a cluster needs on one host's disk.
    fn check_fleet_homes(&self, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
        if !self.fleet.enabled {
            return Ok(());
        }
        if !self
            .store
            .url
            .as_deref()
            .is_some_and(|u| u.starts_with("postgres"))
        {
            return Err(err(
                &o("fleet.enabled"),
                "needs a PostgreSQL store.url: the hosts of a fleet share their store",
            ));
        }
        if self.store.key_file.is_none() {
            return Err(err(
                &o("fleet.enabled"),
                "needs store.key_file: the clusters' CAs must be in the store for another host to serve them",
            ));
        }
        if self.clusters.datastore != DatastoreKind::Postgres {
            return Err(err(
                &o("fleet.enabled"),
                "needs clusters.datastore = \"postgres\": a cluster's objects must be where every host reaches them",
            ));
        }
        Ok(())
    }

    /// The server `postgres` clusters' databases are made on: `clusters.postgres_url`, else
    /// the store's URL when the store is PostgreSQL.
    pub fn clusters_postgres_url(&self) -> Option<String> {
        self.clusters.postgres_url.clone().or_else(|| {
            self.store
                .url
                .clone()
                .filter(|u| u.starts_with("postgres://") || u.starts_with("postgresql://"))
        })
    }

    /// The providers to rent from: `market.providers`, or `market.url` as one named `market`;
    /// empty: the embedded local provider.
    pub fn providers(&self) -> Vec<ProviderRef> {
        self.market.providers()
    }

    /// The store's URL: the configured one, or SQLite in the state directory.
    pub fn store_url(&self) -> String {
        self.store.url.clone().unwrap_or_else(|| {
            format!(
                "sqlite://{}?mode=rwc",
                self.state_dir.join("broker.db").display()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The configuration the defaults and these variables make, validated.
    pub(super) fn load(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::load(None, |k| m.get(k).cloned())
    }

    /// What the harness (and `check-config`) write, read back, is the same configuration.
    #[test]
    fn a_configuration_written_out_reads_back_the_same() {
        let mut c = Config::default();
        c.store.url = Some("postgres://u@db/broker".into());
        c.scale.hold = Duration::from_millis(2500);
        c.market.providers.push(ProviderRef {
            name: "east".into(),
            url: "https://198.51.100.11:7480".into(),
            pin: Some("sha256:00".into()),
            region: None,
            zone: None,
        });
        c.market.isolation = socialweb_market::Isolation::Vm;
        c.local_provider.shapes.push(LocalShape {
            vcpu: 2,
            mem_mib: 4096,
            disk_mib: 20480,
            price_micros_per_hour: 20000,
        });
        c.local_provider.kubelet_config_patch =
            Some(serde_json::json!({"evictionHard": {"memory.available": "1Mi"}, "n": 100}));
        c.local_provider.machine = MachineKind::Vm;
        c.local_provider.vm.jail = false;
        c.local_provider.vm.egress_allow = vec!["10.1.0.0/16".parse().unwrap()];
        c.front.did_web_nameservers = vec!["192.0.2.53:53".parse().unwrap()];
        c.access.registration = Registration::Open;
        c.clusters.cpu_max = 1.5;
        let text = toml::to_string_pretty(&c).unwrap();
        let back: Config = toml::from_str(&text).unwrap();
        assert_eq!(toml::to_string_pretty(&back).unwrap(), text);
        assert_eq!(back.scale.hold, Duration::from_millis(2500));
        assert_eq!(
            back.local_provider.kubelet_config_patch,
            c.local_provider.kubelet_config_patch
        );
    }

    #[test]
    fn the_seeds_defaults() {
        let c = load(&[]).unwrap();
        assert_eq!(c.scale.max_nodes, 10);
        assert_eq!(c.scale.pods_per_node, 8);
        assert_eq!(c.scale.hold, Duration::from_secs(120));
        assert_eq!(c.scale.expendable_priority_cutoff, -10);
        assert_eq!(c.clusters.hibernate_after, Duration::from_secs(600));
    }

    #[test]
    fn schedulers_and_zones_are_checked_and_errors_name_the_key() {
        let check = |toml: &str| toml::from_str::<Config>(toml).unwrap().validate(&|_| None);
        assert!(check("[scale]\nschedulers = [\"default-scheduler\", \"gitlab\"]\n").is_ok());
        let e = check("[scale]\nschedulers = []\n").unwrap_err();
        assert_eq!(e.source_name, "scale.schedulers", "{e}");
        assert!(check("[local_provider]\nregion = \"eu\"\nzone = \"eu-1a\"\n").is_ok());
        let e = check("[local_provider]\nzone = \"eu 1a\"\n").unwrap_err();
        assert_eq!(e.source_name, "local_provider.zone", "{e}");
        assert!(e.problem.contains("not a label value"), "{e}");
        let provider = "[[market.providers]]\nname = \"p1\"\nurl = \"http://127.0.0.1:7480\"\n";
        assert!(check(&format!("{provider}zone = \"eu-1b\"\n")).is_ok());
        let e = check(&format!("{provider}region = \"-eu\"\n")).unwrap_err();
        assert_eq!(e.source_name, "market.providers[0].region", "{e}");
    }

    #[test]
    fn variables_override_and_bad_ones_are_named() {
        let c = load(&[
            ("SOCIALWEB_CLUSTERPROVIDER_SCALE_MAX_NODES", "5"),
            ("SOCIALWEB_CLUSTERPROVIDER_SCALE_PODS_PER_NODE", "1"),
            ("SOCIALWEB_CLUSTERPROVIDER_SCALE_HOLD", "1m"),
        ])
        .unwrap();
        assert_eq!((c.scale.max_nodes, c.scale.pods_per_node), (5, 1));
        assert_eq!(c.scale.hold, Duration::from_secs(60));
        for (var, value, needle) in [
            (
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_MAX_NODES",
                "0",
                "refused, not clamped",
            ),
            (
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_MAX_NODES",
                "-3",
                "refused, not clamped",
            ),
            (
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_MAX_NODES",
                "many",
                "not a number",
            ),
            (
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_PODS_PER_NODE",
                "0",
                "at least 1",
            ),
            (
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_HOLD",
                "soon",
                "not a duration",
            ),
            (
                "SOCIALWEB_CLUSTERPROVIDER_SCALE_HOLD",
                "0s",
                "longer than 0s",
            ),
            ("SOCIALWEB_CLUSTERPROVIDER_NODE_MEM_MIB", "16", "too small"),
            ("SOCIALWEB_BROKER_STORE_URL", "mysql://x", "neither"),
        ] {
            let e = load(&[(var, value)]).unwrap_err();
            assert_eq!(e.source_name, var, "{e}");
            assert!(e.problem.contains(needle), "{e}");
        }
    }

    #[test]
    fn the_file_is_strict_and_errors_name_it() {
        let dir = std::env::temp_dir().join(format!("sw-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("broker.toml");
        std::fs::write(
            &f,
            "[scale]\nmax_nodes = 3\nhold = \"30s\"\n[node]\nvcpu = 4\nmemMiB = 8192\n",
        )
        .unwrap();
        let c = Config::load(Some(&f), |_| None).unwrap();
        assert_eq!(
            (c.scale.max_nodes, c.node.vcpu, c.node.mem_mib),
            (3, 4, 8192)
        );
        std::fs::write(&f, "[scale]\nmax_nodse = 3\n").unwrap();
        let e = Config::load(Some(&f), |_| None).unwrap_err();
        assert!(e.problem.contains("max_nodse"), "{e}");
        std::fs::write(&f, "[scale]\nmax_nodes = 0\n").unwrap();
        assert_eq!(
            Config::load(Some(&f), |_| None).unwrap_err().source_name,
            "scale.max_nodes"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
