//! The cluster zone as records, pure (contract 5; Kubernetes DNS-Based Service Discovery,
//! schema 1.1.0). Services and EndpointSlices go in as plain values (the watcher converts the
//! API objects); an immutable [`Snapshot`] comes out, indexed for lookups by lowercase name
//! and by address.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The schema version served at `dns-version.<zone>`.
pub const SCHEMA_VERSION: &str = "1.1.0";

/// A Service, as far as DNS cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub namespace: String,
    pub name: String,
    pub kind: ServiceKind,
    pub ports: Vec<Port>,
    /// `spec.publishNotReadyAddresses`: not-ready endpoints are published too.
    pub publish_not_ready: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceKind {
    /// A ClusterIP (or NodePort/LoadBalancer) Service with its cluster IPs.
    ClusterIp(Vec<IpAddr>),
    /// `clusterIP: None`: records for the endpoints.
    Headless,
    /// `type: ExternalName`: a CNAME.
    ExternalName(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    pub name: Option<String>,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    pub port: u16,
}

/// An EndpointSlice of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    pub namespace: String,
    pub service: String,
    pub ports: Vec<Port>,
    pub endpoints: Vec<Endpoint>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub addresses: Vec<IpAddr>,
    /// `conditions.ready` (unset counts as ready, as the API says).
    pub ready: bool,
    pub hostname: Option<String>,
}

/// SRV record data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Srv {
    pub priority: u16,
    pub weight: u16,
    pub port: u16,
    /// Target name, lowercase, without the trailing dot.
    pub target: String,
}

/// Records at one name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameData {
    pub a: Vec<Ipv4Addr>,
    pub aaaa: Vec<Ipv6Addr>,
    pub cname: Option<String>,
    pub srv: Vec<Srv>,
    pub txt: Vec<String>,
}

impl NameData {
    fn add_ip(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(v4) if !self.a.contains(&v4) => self.a.push(v4),
            IpAddr::V6(v6) if !self.aaaa.contains(&v6) => self.aaaa.push(v6),
            _ => {}
        }
    }
}

/// What a name is in the zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// The name has records.
    Found(&'a NameData),
    /// The name exists only as a parent of other names (`<ns>.svc.<zone>`): NODATA.
    EmptyNonTerminal,
    /// No such name: NXDOMAIN.
    NxDomain,
}

/// An immutable, indexed view of the zone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The zone, lowercase, no trailing dot (`cluster.local`).
    pub zone: String,
    names: HashMap<String, NameData>,
    nonterminals: HashSet<String>,
    ptr: HashMap<IpAddr, Vec<String>>,
}

impl Snapshot {
    /// `name`: lowercase, no trailing dot.
    pub fn lookup(&self, name: &str) -> Lookup<'_> {
        if let Some(d) = self.names.get(name) {
            return Lookup::Found(d);
        }
        if self.nonterminals.contains(name) {
            return Lookup::EmptyNonTerminal;
        }
        Lookup::NxDomain
    }

    /// Names an address points back to.
    pub fn reverse(&self, ip: &IpAddr) -> &[String] {
        self.ptr.get(ip).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Whether `name` (lowercase, no trailing dot) is in the zone.
    pub fn in_zone(&self, name: &str) -> bool {
        name == self.zone
            || name
                .strip_suffix(&self.zone)
                .is_some_and(|rest| rest.ends_with('.'))
    }

    pub fn names(&self) -> usize {
        self.names.len()
    }
}

/// Builds snapshots from the current Services and EndpointSlices.
#[derive(Debug, Clone, Default)]
pub struct Store {
    services: BTreeMap<(String, String), Service>,
    /// By (namespace, slice name).
    slices: BTreeMap<(String, String), Slice>,
}

impl Store {
    pub fn upsert_service(&mut self, s: Service) {
        self.services
            .insert((s.namespace.clone(), s.name.clone()), s);
    }

    pub fn remove_service(&mut self, namespace: &str, name: &str) {
        self.services
            .remove(&(namespace.to_string(), name.to_string()));
    }

    pub fn upsert_slice(&mut self, slice_name: &str, s: Slice) {
        self.slices
            .insert((s.namespace.clone(), slice_name.to_string()), s);
    }

    pub fn remove_slice(&mut self, namespace: &str, slice_name: &str) {
        self.slices
            .remove(&(namespace.to_string(), slice_name.to_string()));
    }

    /// Replaces everything (a watcher's relist).
    pub fn replace(&mut self, services: Vec<Service>, slices: Vec<(String, Slice)>) {
        self.services = services
            .into_iter()
            .map(|s| ((s.namespace.clone(), s.name.clone()), s))
            .collect();
        self.slices = slices
            .into_iter()
            .map(|(n, s)| ((s.namespace.clone(), n), s))
            .collect();
    }

    /// The zone `zone` (e.g. `cluster.local`) as records.
    pub fn snapshot(&self, zone: &str) -> Snapshot {
        let zone = zone.trim_end_matches('.').to_ascii_lowercase();
        let mut b = Builder {
            snap: Snapshot {
                zone: zone.clone(),
                ..Snapshot::default()
            },
        };
        b.name(&format!("dns-version.{zone}"))
            .txt
            .push(SCHEMA_VERSION.to_string());
        b.nonterminal(&format!("svc.{zone}"));
        for s in self.services.values() {
            let ns = s.namespace.to_ascii_lowercase();
            let base = format!("{}.{ns}.svc.{zone}", s.name.to_ascii_lowercase());
            b.nonterminal(&format!("{ns}.svc.{zone}"));
            match &s.kind {
                ServiceKind::ClusterIp(ips) => {
                    for ip in ips {
                        b.name(&base).add_ip(*ip);
                        b.ptr(*ip, &base);
                    }
                    for p in s.ports.iter().filter(|p| p.name.is_some()) {
                        let srv = Srv {
                            priority: 0,
                            weight: 100,
                            port: p.port,
                            target: base.clone(),
                        };
                        b.name(&srv_name(p, &base)).srv.push(srv);
                    }
                }
                ServiceKind::ExternalName(target) => {
                    b.name(&base).cname = Some(target.trim_end_matches('.').to_ascii_lowercase());
                }
                ServiceKind::Headless => self.headless(&mut b, s, &base),
            }
        }
        b.snap
    }

    fn headless(&self, b: &mut Builder, s: &Service, base: &str) {
        let slices: Vec<&Slice> = self
            .slices
            .values()
            .filter(|sl| sl.namespace == s.namespace && sl.service == s.name)
            .collect();
        // Endpoints that may be published: ready ones, or all with publishNotReadyAddresses
        // (the tolerate-unready rule).
        let eligible: Vec<(&Slice, &Endpoint)> = slices
            .iter()
            .flat_map(|sl| sl.endpoints.iter().map(move |e| (*sl, e)))
            .filter(|(_, e)| (e.ready || s.publish_not_ready) && !e.addresses.is_empty())
            .collect();
        if eligible.is_empty() {
            // No records at the name: NXDOMAIN, as the spec and CoreDNS answer.
            return;
        }
        let mut targets: Vec<(String, &Slice)> = Vec::new();
        for (sl, e) in &eligible {
            for ip in &e.addresses {
                b.name(base).add_ip(*ip);
            }
            let host = match &e.hostname {
                Some(h) => {
                    let host = format!("{}.{base}", h.to_ascii_lowercase());
                    for ip in &e.addresses {
                        b.name(&host).add_ip(*ip);
                        b.ptr(*ip, &host);
                    }
                    host
                }
                // No hostname: the system-assigned one, made from the address as CoreDNS
                // does; it has the A (or AAAA), the SRV targets and the PTR a hostname would.
                None => {
                    let ip = e.addresses[0];
                    let host = format!("{}.{base}", dashed(&ip));
                    b.name(&host).add_ip(ip);
                    b.ptr(ip, &host);
                    host
                }
            };
            targets.push((host, sl));
        }
        let weight = (100 / targets.len()).max(1) as u16;
        for (host, sl) in &targets {
            for p in sl.ports.iter().filter(|p| p.name.is_some()) {
                let srv = Srv {
                    priority: 0,
                    weight,
                    port: p.port,
                    target: host.clone(),
                };
                let name = srv_name(p, base);
                let entry = b.name(&name);
                if !entry.srv.contains(&srv) {
                    entry.srv.push(srv);
                }
            }
        }
    }
}

fn srv_name(p: &Port, base: &str) -> String {
    format!(
        "_{}._{}.{base}",
        p.name.as_deref().unwrap_or_default().to_ascii_lowercase(),
        p.protocol.to_ascii_lowercase()
    )
}

/// `10.42.1.5` -> `10-42-1-5`; `fd00::5` -> `fd00--5`.
fn dashed(ip: &IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}

struct Builder {
    snap: Snapshot,
}

impl Builder {
    fn name(&mut self, name: &str) -> &mut NameData {
        self.parents(name);
        self.snap.names.entry(name.to_string()).or_default()
    }

    fn nonterminal(&mut self, name: &str) {
        self.parents(name);
        if !self.snap.names.contains_key(name) {
            self.snap.nonterminals.insert(name.to_string());
        }
    }

    /// Every ancestor of `name` down to the zone exists (empty non-terminals).
    fn parents(&mut self, name: &str) {
        let mut rest = name;
        while let Some((_, parent)) = rest.split_once('.') {
            if parent.len() < self.snap.zone.len() {
                break;
            }
            if !self.snap.names.contains_key(parent) {
                self.snap.nonterminals.insert(parent.to_string());
            }
            rest = parent;
        }
        self.snap.nonterminals.remove(name);
    }

    fn ptr(&mut self, ip: IpAddr, name: &str) {
        let names = self.snap.ptr.entry(ip).or_default();
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    pub fn port(name: Option<&str>, protocol: &str, port: u16) -> Port {
        Port {
            name: name.map(str::to_string),
            protocol: protocol.into(),
            port,
        }
    }

    /// The table the DNS tests run: every kind of record the spec names.
    pub fn store() -> Store {
        let mut s = Store::default();
        s.upsert_service(Service {
            namespace: "default".into(),
            name: "web".into(),
            kind: ServiceKind::ClusterIp(vec!["10.43.0.10".parse().unwrap()]),
            ports: vec![port(Some("http"), "TCP", 80), port(None, "TCP", 8080)],
            publish_not_ready: false,
        });
        s.upsert_service(Service {
            namespace: "default".into(),
            name: "db".into(),
            kind: ServiceKind::Headless,
            ports: vec![port(Some("pg"), "TCP", 5432)],
            publish_not_ready: false,
        });
        s.upsert_slice(
            "db-abc",
            Slice {
                namespace: "default".into(),
                service: "db".into(),
                ports: vec![port(Some("pg"), "TCP", 5432)],
                endpoints: vec![
                    Endpoint {
                        addresses: vec!["10.42.1.5".parse().unwrap()],
                        ready: true,
                        hostname: Some("db-0".into()),
                    },
                    Endpoint {
                        addresses: vec!["10.42.2.6".parse().unwrap()],
                        ready: true,
                        hostname: None,
                    },
                    Endpoint {
                        addresses: vec!["10.42.2.7".parse().unwrap()],
                        ready: false,
                        hostname: Some("db-2".into()),
                    },
                ],
            },
        );
        s.upsert_service(Service {
            namespace: "default".into(),
            name: "empty".into(),
            kind: ServiceKind::Headless,
            ports: vec![],
            publish_not_ready: false,
        });
        s.upsert_service(Service {
            namespace: "other".into(),
            name: "tolerant".into(),
            kind: ServiceKind::Headless,
            ports: vec![],
            publish_not_ready: true,
        });
        s.upsert_slice(
            "tolerant-1",
            Slice {
                namespace: "other".into(),
                service: "tolerant".into(),
                ports: vec![],
                endpoints: vec![Endpoint {
                    addresses: vec!["10.42.3.3".parse().unwrap()],
                    ready: false,
                    hostname: None,
                }],
            },
        );
        s.upsert_service(Service {
            namespace: "default".into(),
            name: "ext".into(),
            kind: ServiceKind::ExternalName("example.test.".into()),
            ports: vec![],
            publish_not_ready: false,
        });
        s
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    fn snap() -> Snapshot {
        store().snapshot("cluster.local")
    }

    fn found<'a>(s: &'a Snapshot, name: &str) -> &'a NameData {
        match s.lookup(name) {
            Lookup::Found(d) => d,
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn cluster_ip_services_have_a_srv_and_ptr() {
        let s = snap();
        assert_eq!(
            found(&s, "web.default.svc.cluster.local").a,
            vec![Ipv4Addr::new(10, 43, 0, 10)]
        );
        let srv = &found(&s, "_http._tcp.web.default.svc.cluster.local").srv;
        assert_eq!(
            srv,
            &vec![Srv {
                priority: 0,
                weight: 100,
                port: 80,
                target: "web.default.svc.cluster.local".into()
            }]
        );
        assert_eq!(
            s.reverse(&"10.43.0.10".parse().unwrap()),
            ["web.default.svc.cluster.local"]
        );
        assert_eq!(found(&s, "dns-version.cluster.local").txt, vec!["1.1.0"]);
    }

    #[test]
    fn headless_services_publish_ready_endpoints_hostnames_and_srv_per_endpoint() {
        let s = snap();
        let base = found(&s, "db.default.svc.cluster.local");
        assert_eq!(
            base.a,
            vec![Ipv4Addr::new(10, 42, 1, 5), Ipv4Addr::new(10, 42, 2, 6)],
            "not-ready db-2 left out"
        );
        assert_eq!(
            found(&s, "db-0.db.default.svc.cluster.local").a,
            vec![Ipv4Addr::new(10, 42, 1, 5)]
        );
        assert_eq!(
            s.lookup("db-2.db.default.svc.cluster.local"),
            Lookup::NxDomain
        );
        let srv = &found(&s, "_pg._tcp.db.default.svc.cluster.local").srv;
        let targets: Vec<&str> = srv.iter().map(|r| r.target.as_str()).collect();
        assert_eq!(
            targets,
            [
                "db-0.db.default.svc.cluster.local",
                "10-42-2-6.db.default.svc.cluster.local"
            ]
        );
        assert!(srv.iter().all(|r| r.port == 5432 && r.weight == 50));
        assert_eq!(
            found(&s, "10-42-2-6.db.default.svc.cluster.local").a,
            vec![Ipv4Addr::new(10, 42, 2, 6)]
        );
        assert_eq!(
            s.reverse(&"10.42.1.5".parse().unwrap()),
            ["db-0.db.default.svc.cluster.local"]
        );
    }

    #[test]
    fn endpoints_without_a_hostname_have_a_ptr_to_their_assigned_name() {
        // Spec 1.1.0, 2.4.3: a PTR for every ready endpoint's hostname, which without a
        // `hostname` is the system-assigned one its A and SRV records use.
        let s = snap();
        assert_eq!(
            s.reverse(&"10.42.2.6".parse().unwrap()),
            ["10-42-2-6.db.default.svc.cluster.local"]
        );
        assert_eq!(
            s.reverse(&"10.42.3.3".parse().unwrap()),
            ["10-42-3-3.tolerant.other.svc.cluster.local"],
            "publishNotReadyAddresses makes the endpoint eligible"
        );
        assert!(
            s.reverse(&"10.42.2.7".parse().unwrap()).is_empty(),
            "a not-ready endpoint has no name to point back to"
        );
    }

    #[test]
    fn tolerate_unready_and_empty_headless() {
        let s = snap();
        assert_eq!(
            found(&s, "tolerant.other.svc.cluster.local").a,
            vec![Ipv4Addr::new(10, 42, 3, 3)]
        );
        assert_eq!(
            s.lookup("empty.default.svc.cluster.local"),
            Lookup::NxDomain
        );
    }

    #[test]
    fn external_names_and_the_tree_above_services() {
        let s = snap();
        assert_eq!(
            found(&s, "ext.default.svc.cluster.local").cname.as_deref(),
            Some("example.test")
        );
        for nt in [
            "default.svc.cluster.local",
            "svc.cluster.local",
            "_tcp.web.default.svc.cluster.local",
        ] {
            assert_eq!(s.lookup(nt), Lookup::EmptyNonTerminal, "{nt}");
        }
        assert_eq!(s.lookup("cluster.local"), Lookup::EmptyNonTerminal);
        assert_eq!(s.lookup("nope.default.svc.cluster.local"), Lookup::NxDomain);
        assert_eq!(s.lookup("example.com.svc.cluster.local"), Lookup::NxDomain);
        assert!(s.in_zone("a.cluster.local") && s.in_zone("cluster.local"));
        assert!(!s.in_zone("xcluster.local") && !s.in_zone("example.com"));
    }

    #[test]
    fn names_are_case_insensitive_in_the_store() {
        let mut st = Store::default();
        st.upsert_service(Service {
            namespace: "Default".into(),
            name: "Web".into(),
            kind: ServiceKind::ClusterIp(vec!["10.43.0.9".parse().unwrap()]),
            ports: vec![],
            publish_not_ready: false,
        });
        let s = st.snapshot("Cluster.Local.");
        assert!(matches!(
            s.lookup("web.default.svc.cluster.local"),
            Lookup::Found(_)
        ));
    }
}
