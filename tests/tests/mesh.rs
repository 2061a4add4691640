//! The mesh across node namespaces: direct, through the relay, across a node's death, under
//! attack, and out of the cluster.

use std::net::SocketAddr;
use std::time::Duration;

use testbed::mesh::{MeshCluster, MeshOptions};
use testbed::{Reach, Topology, probe};

#[test]
fn three_nodes_direct_every_pair_of_pods_talks_with_sources_kept() {
    let topo = Topology::new(3, Reach::Direct).unwrap();
    let mesh = MeshCluster::start(&topo, MeshOptions::default()).unwrap();
    let pods: Vec<_> = (1..=3).map(|n| mesh.pod(n, "p").unwrap()).collect();
    for a in &pods {
        for b in &pods {
            if a.node == b.node {
                continue;
            }
            probe::ping_until(&a.ns, &b.addr.to_string(), Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("{e:#}\n{}", mesh.logs_tail()));
            let server =
                probe::EchoServer::start(&b.ns, SocketAddr::new(b.addr.into(), 0)).unwrap();
            let payload = vec![0x5au8; 256 * 1024];
            probe::tcp_exchange(&a.ns, server.addr, &payload).unwrap();
            let peer = server.next_peer(Duration::from_secs(5)).unwrap();
            assert_eq!(
                peer.ip(),
                std::net::IpAddr::V4(a.addr),
                "the receiver sees the pod's own source"
            );
        }
    }
    for n in 1..=3u8 {
        for m in (1..=3u8).filter(|m| *m != n) {
            let p = mesh.peer(n, m).unwrap();
            assert!(
                p["path"].as_str().unwrap().starts_with("direct "),
                "node-{n} to node-{m}: {p}"
            );
        }
    }
}

#[test]
fn zz_print_status() {
    let topo = Topology::new(2, Reach::HostOnly).unwrap();
    let mesh = MeshCluster::start(&topo, MeshOptions::default()).unwrap();
    let a = mesh.pod(1, "p").unwrap();
    let b = mesh.pod(2, "p").unwrap();
    eprintln!("{}", mesh.cli(1, &["mesh", "status"]).unwrap());
    let r = probe::ping_until(&a.ns, &b.addr.to_string(), Duration::from_secs(10));
    eprintln!("ping: {r:?}");
    eprintln!("{}", mesh.cli(1, &["mesh", "status"]).unwrap());
    eprintln!("{}", mesh.cli(2, &["mesh", "status"]).unwrap());
    eprintln!("{}", mesh.cli(1, &["mesh", "routes"]).unwrap());
    eprintln!("{}", mesh.cli(1, &["mesh", "ping", "node-2"]).unwrap());
    eprintln!("{}", topo.node(1).ns.ip(&["route"]).unwrap());
}
