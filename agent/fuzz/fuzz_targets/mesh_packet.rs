//! The mesh's packet filter and ICMP Packet Too Big on arbitrary bytes: never a panic, never
//! an accepted packet that breaks the contract.
#![no_main]

use ipnet::IpNet;
use libfuzzer_sys::fuzz_target;
use socialweb_mesh_core::{filter, icmp};

fuzz_target!(|data: &[u8]| {
    let peer: IpNet = "10.42.1.0/24".parse().unwrap();
    let ours: IpNet = "10.42.2.0/24".parse().unwrap();
    let (pa, oa) = (filter::NodeAddrs::pods(peer), filter::NodeAddrs::pods(ours));
    if let Ok(h) = filter::ingress(data, &pa, &oa) {
        assert!(peer.contains(&h.src) && ours.contains(&h.dst) && h.len <= data.len());
    }
    let routes = filter::Routes::new([(peer, 1u8)]);
    if let Ok((h, _)) = filter::egress(data, &oa, &routes) {
        assert!(ours.contains(&h.src) && peer.contains(&h.dst));
    }
    if let Some(err) = icmp::packet_too_big(data, 1280, "10.42.1.1".parse().unwrap()) {
        assert!(err.len() <= 576);
    }
});
