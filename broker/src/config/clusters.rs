//! `[clusters]`: what every tenant cluster gets, its control plane's datastore and budget,
//! its ports and DNS, and when it hibernates.

use std::path::PathBuf;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::durations::{HumanDuration, humantime_serde_compat};
use super::{ConfigError, err};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterDefaults {
    /// Resolvers node-local DNS forwards to (the identity's `upstream_resolvers`).
    pub upstream_resolvers: Vec<String>,
    /// First port of the range tenant control planes lease from.
    pub port_base: u16,
    /// How many ports the range has.
    pub port_count: u16,
    /// Whether the operator's own clusters (those no DID owns) get the node isolation policy
    /// on namespace nodes too, as every DID's cluster does (docs/security.md). The upstream
    /// conformance run turns it off: some of its tests run hostNetwork Pods.
    pub isolate_operators_clusters: bool,
    /// How long a cluster with no nodes, no lease, no request at the front and nothing
    /// inside it that will act by itself stays awake before its control plane stops
    /// (docs/hibernation.md); `0` never. A cluster's own (`cluster create
    /// --hibernate-after`, `cluster set`) overrides it.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub hibernate_after: Duration,
    /// What keeps a new cluster's objects: `etcd`, `kine` (SQLite through the etcd API, as
    /// k3s does, in the cluster's directory), or `postgres` (kine over a database of the
    /// cluster's own on `postgres_url`'s server, created with the cluster and dropped with
    /// it); `cluster create --datastore` chooses for one cluster.
    pub datastore: DatastoreKind,
    /// The PostgreSQL server `postgres` clusters' databases are made on
    /// (`postgres://user[:password]@host[:port]/database`; the role needs `CREATEDB`, and the
    /// database named is where it connects to create them). Default: `store.url` when the
    /// store is PostgreSQL.
    pub postgres_url: Option<String>,
    /// The `kine` binary (image-builder/kine/build.sh builds it).
    pub kine_binary: PathBuf,
    /// `GOGC` of every control-plane component: the garbage a Go heap may hold beyond its
    /// live objects, in percent. Lower is less memory for more collector CPU; Go's default
    /// is 100, ours 50 (docs/hibernation.md has the measurements behind it).
    pub gogc: u32,
    /// The memory each control plane (apiserver, datastore, controller-manager, scheduler
    /// together) may use, in MiB; past it the kernel reclaims and then kills within it.
    /// 0: no limit. An idle awake cluster uses about 400 MiB (docs/hibernation.md).
    pub memory_max_mib: u64,
    /// The processes and threads each control plane may have; 0: no limit.
    pub pids_max: u64,
    /// The CPUs each control plane may use (1.5: one and a half); 0: no limit.
    pub cpu_max: f64,
    /// Where each control plane's cgroup is made: `root`, under each hierarchy's root, or
    /// `own`, under the cgroup the broker was started in -- what systemd delegates to a
    /// unit with `Delegate=yes`, so that `systemctl stop`, the unit's limits and its
    /// accounting reach the control planes (the packaged unit sets `own`;
    /// docs/operations.md, "Under systemd").
    #[serde(skip_serializing_if = "CgroupParent::is_root")]
    pub cgroup_parent: CgroupParent,
    /// How much each kine cluster's datastore may hold, in MiB, etcd's semantics: past it,
    /// writes are refused and reads and deletes still served (docs/security.md, "Budgets").
    /// etcd clusters keep etcd's own 2048. 0: no quota.
    pub datastore_quota_mib: u64,
    /// Networks (`203.0.113.0/24`, `0.0.0.0/0` for every public address) a cluster's
    /// apiserver may reach for the webhooks and conversion webhooks its tenant names by URL
    /// (docs/security.md, "The control plane's own egress"). A URL that names the cluster's
    /// own nodes, Pods or Services goes through the tunnel as a Service-backed webhook does;
    /// any other address must be public and listed. Loopback, private, link-local and other
    /// non-public addresses are never dialled, listed or not. Default: none.
    pub webhook_egress_allow: Vec<String>,
}

/// The smallest datastore quota: a new cluster's objects, their history until kine's first
/// compaction, and room to work.
pub const MIN_DATASTORE_QUOTA_MIB: u64 = 32;

impl ClusterDefaults {
    /// The control planes' budget (a cgroup each).
    pub fn budget(&self) -> crate::control_plane::cgroup::Budget {
        crate::control_plane::cgroup::Budget {
            memory_bytes: (self.memory_max_mib > 0).then_some(self.memory_max_mib << 20),
            pids: (self.pids_max > 0).then_some(self.pids_max),
            cpu_millis: (self.cpu_max > 0.0).then(|| (self.cpu_max * 1000.0).round() as u64),
        }
    }

    /// The datastore quota in bytes, if there is one.
    pub fn datastore_quota(&self) -> Option<u64> {
        (self.datastore_quota_mib > 0).then_some(self.datastore_quota_mib << 20)
    }

    /// `webhook_egress_allow`, read (`validate` has refused what does not read).
    pub fn webhook_egress_allow(&self) -> Vec<ipnet::IpNet> {
        self.webhook_egress_allow
            .iter()
            .filter_map(|n| n.parse().ok())
            .collect()
    }

    /// When clusters hibernate, the networks and resolvers they are given, their control
    /// planes' budget and ports, and the server of their PostgreSQL datastores. Whether
    /// that server is known when it is needed is [`super::Config`]'s check (`store.url` may
    /// name it).
    pub(super) fn check(&self, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
        hibernate_after_ok(self.hibernate_after)
            .map_err(|e| err(&o("clusters.hibernate_after"), e))?;
        for (i, n) in self.webhook_egress_allow.iter().enumerate() {
            if n.parse::<ipnet::IpNet>().is_err() {
                return Err(err(
                    &format!("clusters.webhook_egress_allow[{i}]"),
                    format!("{n:?} is not a network (203.0.113.0/24, 2001:db8::/32, 0.0.0.0/0)"),
                ));
            }
        }
        for (i, r) in self.upstream_resolvers.iter().enumerate() {
            if socialweb_wire::identity::parse_resolver(r).is_none() {
                return Err(err(
                    &format!("clusters.upstream_resolvers[{i}]"),
                    format!("{r:?} is not an IP or IP:port"),
                ));
            }
        }
        self.check_budget(o)?;
        if u32::from(self.port_base) + u32::from(self.port_count) > 65535 {
            return Err(err("clusters.port_count", "the port range runs past 65535"));
        }
        if let Some(u) = &self.postgres_url
            && !url::Url::parse(u).is_ok_and(|u| matches!(u.scheme(), "postgres" | "postgresql"))
        {
            return Err(err(
                &o("clusters.postgres_url"),
                "is not a postgres://user@host/database URL",
            ));
        }
        Ok(())
    }

    /// GOGC and the control planes' cgroup and datastore quota: each 0 (none) or enough to
    /// run a control plane.
    fn check_budget(&self, o: &impl Fn(&str) -> String) -> Result<(), ConfigError> {
        if !(10..=1000).contains(&self.gogc) {
            return Err(err(
                &o("clusters.gogc"),
                format!("{} is not from 10 to 1000 (Go's default is 100)", self.gogc),
            ));
        }
        if !(self.cpu_max.is_finite() && self.cpu_max >= 0.0)
            || (self.cpu_max > 0.0 && self.cpu_max < 0.01)
        {
            return Err(err(
                &o("clusters.cpu_max"),
                format!("{} is not 0 (no limit) or at least 0.01 CPUs", self.cpu_max),
            ));
        }
        if self.memory_max_mib > 0 && self.memory_max_mib < 256 {
            return Err(err(
                &o("clusters.memory_max_mib"),
                format!(
                    "{} MiB is too little for a control plane (an idle one uses about 400); 0 is no limit",
                    self.memory_max_mib
                ),
            ));
        }
        if self.datastore_quota_mib > 0 && self.datastore_quota_mib < MIN_DATASTORE_QUOTA_MIB {
            return Err(err(
                &o("clusters.datastore_quota_mib"),
                format!(
                    "{} MiB is less than a new cluster's own objects take (at least \
                     {MIN_DATASTORE_QUOTA_MIB}); 0 is no quota",
                    self.datastore_quota_mib
                ),
            ));
        }
        Ok(())
    }
}

/// `clusters.cgroup_parent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CgroupParent {
    #[default]
    Root,
    Own,
}

impl CgroupParent {
    /// The default: what need not be written (an older broker knows no such key).
    pub fn is_root(&self) -> bool {
        *self == CgroupParent::Root
    }

    pub fn parse(s: &str) -> Result<CgroupParent, String> {
        match s {
            "root" => Ok(CgroupParent::Root),
            "own" => Ok(CgroupParent::Own),
            other => Err(format!("{other:?} is neither root nor own")),
        }
    }

    /// As the cgroup module takes it.
    pub fn parent(self) -> socialweb_proc::cgroup::Parent {
        match self {
            CgroupParent::Root => socialweb_proc::cgroup::Parent::Root,
            CgroupParent::Own => socialweb_proc::cgroup::Parent::Own,
        }
    }
}

/// `clusters.datastore`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DatastoreKind {
    Etcd,
    Kine,
    // kine over a database of the cluster's own on `clusters.postgres_url`'s server. (A
    // plain comment: a doc comment would make the schema's values a oneOf.)
    Postgres,
}

impl DatastoreKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DatastoreKind::Etcd => "etcd",
            DatastoreKind::Kine => "kine",
            DatastoreKind::Postgres => "postgres",
        }
    }

    /// A name as the store and `cluster create --datastore` have it.
    pub fn parse(s: &str) -> Result<DatastoreKind, String> {
        match s {
            "etcd" => Ok(DatastoreKind::Etcd),
            "kine" => Ok(DatastoreKind::Kine),
            "postgres" => Ok(DatastoreKind::Postgres),
            other => Err(format!("{other:?} is none of etcd, kine, postgres")),
        }
    }

    /// Whether kine runs it (and `clusters.kine_binary` must be there).
    pub fn uses_kine(self) -> bool {
        matches!(self, DatastoreKind::Kine | DatastoreKind::Postgres)
    }
}

impl Default for ClusterDefaults {
    fn default() -> ClusterDefaults {
        ClusterDefaults {
            upstream_resolvers: Vec::new(),
            port_base: 16443,
            port_count: 1000,
            isolate_operators_clusters: true,
            hibernate_after: Duration::from_secs(600),
            datastore: DatastoreKind::Kine,
            postgres_url: None,
            kine_binary: "/usr/lib/socialweb/kine/kine".into(),
            gogc: 50,
            memory_max_mib: 2048,
            pids_max: 8192,
            cpu_max: 2.0,
            cgroup_parent: CgroupParent::Root,
            datastore_quota_mib: 2048,
            webhook_egress_allow: Vec::new(),
        }
    }
}

/// A cluster's idle time before it hibernates: `0` (never), or from a second to a year (a
/// shorter one would stop and start a control plane between a client's requests).
pub fn hibernate_after_ok(d: Duration) -> Result<(), String> {
    if d.is_zero() {
        return Ok(());
    }
    if d < Duration::from_secs(1) {
        return Err(format!(
            "{} is too short: give 0 (never) or at least 1s",
            humantime::format_duration(d)
        ));
    }
    if d > Duration::from_secs(365 * 86400) {
        return Err(format!(
            "{} is longer than a year: give 0 for never",
            humantime::format_duration(d)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::Config;
    use crate::config::tests::load;

    #[test]
    fn hibernate_after_is_zero_or_a_sane_time_and_errors_name_the_key() {
        let var = "SOCIALWEB_BROKER_HIBERNATE_AFTER";
        assert_eq!(
            load(&[(var, "0")]).unwrap().clusters.hibernate_after,
            Duration::ZERO
        );
        assert_eq!(
            load(&[(var, "30m")]).unwrap().clusters.hibernate_after,
            Duration::from_secs(1800)
        );
        for (v, needle) in [
            ("200ms", "too short"),
            ("400days", "longer than a year"),
            ("later", "not a duration"),
        ] {
            let e = load(&[(var, v)]).unwrap_err();
            assert_eq!(e.source_name, var, "{e}");
            assert!(e.problem.contains(needle), "{v}: {e}");
        }
        let e = toml::from_str::<Config>("[clusters]\nhibernate_after = \"5s\"\n")
            .map(|c| c.validate(&|_| None));
        assert!(matches!(e, Ok(Ok(()))), "{e:?}");
        let e = toml::from_str::<Config>("[clusters]\nhibernate_after = \"10ms\"\n")
            .unwrap()
            .validate(&|_| None)
            .unwrap_err();
        assert_eq!(e.source_name, "clusters.hibernate_after", "{e}");
    }
}
