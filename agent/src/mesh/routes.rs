//! Kernel routes for peers' pod CIDRs through the TUN device (`socialweb_netlink::route`,
//! tagged so the agent's own routes are told apart), and IPv4 forwarding.

use std::net::IpAddr;

use anyhow::{Context, Result};
use ipnet::IpNet;
use socialweb_netlink::{Handle, route};

/// A netlink handle in the agent's namespace, on the agent's runtime.
pub async fn handle() -> Result<Handle> {
    Ok(socialweb_netlink::handle()?)
}

/// The index of interface `name`, which must exist.
pub async fn link_index(h: &Handle, name: &str) -> Result<u32> {
    Ok(socialweb_netlink::link::require(h, name).await?)
}

/// Installs (or replaces) `cidr dev <oif> src <src>`.
pub async fn add(h: &Handle, cidr: &IpNet, oif: u32, src: Option<IpAddr>) -> Result<()> {
    Ok(route::add(h, cidr, oif, src).await?)
}

/// Removes the agent's route for `cidr`; a missing route is not an error.
pub async fn del(h: &Handle, cidr: &IpNet, oif: u32) -> Result<()> {
    Ok(route::del(h, cidr, oif).await?)
}

/// Destinations of the agent's routes now in the kernel (IPv4 main table).
pub async fn installed(h: &Handle) -> Result<Vec<IpNet>> {
    Ok(route::installed(h).await?)
}

/// Turns on IPv4 forwarding in this namespace (pods' packets cross from the bridge to the TUN).
pub fn enable_forwarding() -> Result<()> {
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").context("enabling net.ipv4.ip_forward")
}

/// The IPv4 address of the interface the default route leaves through: the address the mesh
/// binds when told to listen on 0.0.0.0. Binding the unspecified address would make the
/// endpoint offer every local address as a direct path, the pods' bridge among them, and a
/// path to a peer's bridge address runs through the mesh itself.
pub async fn default_source_v4(h: &Handle) -> Result<std::net::Ipv4Addr> {
    route::default_source_v4(h)
        .await
        .context("finding the address to bind; give --mesh-listen <address:port>")
}

/// The global IPv6 address of the IPv6 default route's interface, on a dual-stack machine:
/// the mesh binds it beside the IPv4 one (peers and the broker's tunnel endpoint are tried
/// on both families), for the same reason it binds no unspecified address.
pub async fn default_source_v6(h: &Handle) -> Result<Option<std::net::Ipv6Addr>> {
    route::default_source_v6(h)
        .await
        .context("finding the IPv6 address to bind")
}
