//! The node-local DNS query path on arbitrary datagrams: never a panic, and an answer that is
//! at least a header.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use socialweb_agent::dns::Dns;
use socialweb_agent::dns::server::Fast;
use socialweb_dns_core::store::{Endpoint, Port, Service, ServiceKind, Slice, Store};

fn dns() -> &'static Dns {
    static DNS: OnceLock<Dns> = OnceLock::new();
    DNS.get_or_init(|| {
        let mut s = Store::default();
        s.upsert_service(Service {
            namespace: "default".into(),
            name: "web".into(),
            kind: ServiceKind::ClusterIp(vec!["10.43.0.10".parse().unwrap()]),
            ports: vec![Port { name: Some("http".into()), protocol: "TCP".into(), port: 80 }],
            publish_not_ready: false,
        });
        s.upsert_service(Service {
            namespace: "default".into(),
            name: "db".into(),
            kind: ServiceKind::Headless,
            ports: vec![],
            publish_not_ready: false,
        });
        s.upsert_slice(
            "db-1",
            Slice {
                namespace: "default".into(),
                service: "db".into(),
                ports: vec![Port { name: Some("pg".into()), protocol: "TCP".into(), port: 5432 }],
                endpoints: vec![Endpoint { addresses: vec!["10.42.1.5".parse().unwrap()], ready: true, hostname: Some("db-0".into()) }],
            },
        );
        let d = Dns::new("cluster.local", vec!["10.42.0.0/16".parse().unwrap(), "10.43.0.0/16".parse().unwrap()], vec![]);
        d.set_snapshot(s.snapshot("cluster.local"));
        d
    })
}

fuzz_target!(|data: &[u8]| {
    for udp in [true, false] {
        if let Fast::Reply(out) = dns().fast(data, "10.42.1.9".parse().unwrap(), udp) {
            assert!(out.len() >= 12);
        }
    }
});
