//! Kernel routes for peers' pod CIDRs through the TUN device, over rtnetlink.

use std::net::IpAddr;

use anyhow::{Context, Result, anyhow};
use futures_util::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::route::{RouteAttribute, RouteProtocol};
use rtnetlink::{Handle, RouteMessageBuilder};

/// Routes are tagged with this protocol number so the agent can tell its own routes apart
/// (and remove leftovers of a crashed run) without touching anyone else's.
pub const PROTO: u8 = 0x53; // 'S'

/// A netlink handle in the agent's namespace.
pub async fn handle() -> Result<Handle> {
    let (conn, handle, _) = rtnetlink::new_connection().context("opening a netlink socket")?;
    tokio::spawn(conn);
    Ok(handle)
}

/// The index of interface `name`, or `None` if there is none (one lookup for the whole
/// node side: the CNI plugin's).
pub async fn find_link(h: &Handle, name: &str) -> Result<Option<u32>> {
    socialweb_cni::netlink::link_by_name(h, name)
        .await
        .map(|l| l.map(|l| l.header.index))
        .map_err(|e| anyhow!("{e}"))
}

/// The index of interface `name`, which must exist.
pub async fn link_index(h: &Handle, name: &str) -> Result<u32> {
    find_link(h, name)
        .await?
        .ok_or_else(|| anyhow!("no interface {name}"))
}

fn message(
    cidr: &IpNet,
    oif: u32,
    src: Option<IpAddr>,
) -> netlink_packet_route::route::RouteMessage {
    match (cidr, src) {
        (IpNet::V4(n), src) => {
            let mut b = RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .destination_prefix(n.network(), n.prefix_len())
                .output_interface(oif)
                .protocol(RouteProtocol::Other(PROTO));
            if let Some(IpAddr::V4(s)) = src {
                b = b.pref_source(s);
            }
            b.build()
        }
        (IpNet::V6(n), src) => {
            let mut b = RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .destination_prefix(n.network(), n.prefix_len())
                .output_interface(oif)
                .protocol(RouteProtocol::Other(PROTO));
            if let Some(IpAddr::V6(s)) = src {
                b = b.pref_source(s);
            }
            b.build()
        }
    }
}

/// Installs (or replaces) `cidr dev <oif> src <src>`.
pub async fn add(h: &Handle, cidr: &IpNet, oif: u32, src: Option<IpAddr>) -> Result<()> {
    h.route()
        .add(message(cidr, oif, src))
        .replace()
        .execute()
        .await
        .with_context(|| format!("adding route {cidr}"))
}

/// Removes the agent's route for `cidr`; a missing route is not an error.
pub async fn del(h: &Handle, cidr: &IpNet, oif: u32) -> Result<()> {
    match h.route().del(message(cidr, oif, None)).execute().await {
        Ok(()) => Ok(()),
        Err(rtnetlink::Error::NetlinkError(m)) if m.code.map(|c| -c.get()) == Some(libc::ESRCH) => {
            Ok(())
        }
        Err(e) => Err(anyhow!("deleting route {cidr}: {e}")),
    }
}

/// Destinations of the agent's routes now in the kernel (IPv4 main table).
pub async fn installed(h: &Handle) -> Result<Vec<IpNet>> {
    let routes: Vec<_> = h
        .route()
        .get(RouteMessageBuilder::<std::net::Ipv4Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .context("listing routes")?;
    Ok(routes
        .into_iter()
        .filter(|r| r.header.protocol == RouteProtocol::Other(PROTO))
        .filter_map(|r| {
            let len = r.header.destination_prefix_length;
            r.attributes.iter().find_map(|a| match a {
                RouteAttribute::Destination(netlink_packet_route::route::RouteAddress::Inet(
                    ip,
                )) => IpNet::new(IpAddr::V4(*ip), len).ok(),
                _ => None,
            })
        })
        .collect())
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
    use netlink_packet_route::address::AddressAttribute;
    let routes: Vec<_> = h
        .route()
        .get(RouteMessageBuilder::<std::net::Ipv4Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .context("listing routes")?;
    let oif = routes
        .iter()
        .filter(|r| r.header.destination_prefix_length == 0 && r.header.table == 254)
        .find_map(|r| {
            r.attributes.iter().find_map(|a| match a {
                RouteAttribute::Oif(i) => Some(*i),
                _ => None,
            })
        })
        .ok_or_else(|| anyhow!("no IPv4 default route; give --mesh-listen <address:port>"))?;
    let addrs: Vec<_> = h
        .address()
        .get()
        .set_link_index_filter(oif)
        .execute()
        .try_collect()
        .await
        .context("listing addresses")?;
    addrs
        .iter()
        .find_map(|m| {
            m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(IpAddr::V4(ip)) => Some(*ip),
                _ => None,
            })
        })
        .ok_or_else(|| anyhow!("the default route's interface has no IPv4 address; give --mesh-listen <address:port>"))
}
