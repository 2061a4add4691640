//! A real DNS server for tests, the demo and benchmarks: dnsmasq in a namespace, answering
//! from its command line only (no resolv.conf, no hosts file, no daemon), every answer from
//! the extra arguments (`--address=/name/ip`, `--txt-record=...`, `--server=...`).

use std::net::Ipv4Addr;

use anyhow::Result;

use crate::netns::Netns;
use crate::process::Spawned;

/// Starts dnsmasq in `ns`, listening on `listen`, with `extra` arguments. It stops with the
/// returned handle.
pub fn dnsmasq(ns: &Netns, listen: Ipv4Addr, extra: &[&str]) -> Result<Spawned> {
    let listen = format!("--listen-address={listen}");
    let mut args = vec![
        "--no-daemon",
        "--no-resolv",
        "--no-hosts",
        "--bind-interfaces",
        listen.as_str(),
        "--pid-file=",
        "--user=root",
    ];
    args.extend_from_slice(extra);
    ns.spawn("dnsmasq", &args)
}
