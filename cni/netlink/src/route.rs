//! The agent's kernel routes (peers' pod CIDRs through the TUN device), tagged with
//! [`PROTO`] so they are told apart from anyone else's, and the default route's source.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures_util::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage, AddressScope};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol};
use rtnetlink::{Handle, RouteMessageBuilder};

use crate::{Error, errno};

/// The protocol number on every route the agent installs ('S').
pub const PROTO: u8 = 0x53;

fn message(cidr: &IpNet, oif: u32, src: Option<IpAddr>) -> RouteMessage {
    match cidr {
        IpNet::V4(n) => {
            let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(n.network(), n.prefix_len())
                .output_interface(oif)
                .protocol(RouteProtocol::Other(PROTO));
            if let Some(IpAddr::V4(s)) = src {
                b = b.pref_source(s);
            }
            b.build()
        }
        IpNet::V6(n) => {
            let mut b = RouteMessageBuilder::<Ipv6Addr>::new()
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

/// Installs (or replaces) `cidr dev <oif> [src <src>]`.
pub async fn add(h: &Handle, cidr: &IpNet, oif: u32, src: Option<IpAddr>) -> Result<(), Error> {
    h.route()
        .add(message(cidr, oif, src))
        .replace()
        .execute()
        .await
        .map_err(|e| Error::kernel(format!("adding route {cidr}"), e))
}

/// Removes the route for `cidr` through `oif`; a missing route is not an error.
pub async fn del(h: &Handle, cidr: &IpNet, oif: u32) -> Result<(), Error> {
    match h.route().del(message(cidr, oif, None)).execute().await {
        Err(e) if errno(&e) != Some(libc::ESRCH) => {
            Err(Error::kernel(format!("deleting route {cidr}"), e))
        }
        _ => Ok(()),
    }
}

async fn v4_routes(h: &Handle) -> Result<Vec<RouteMessage>, Error> {
    h.route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .map_err(|e| Error::kernel("listing routes", e))
}

/// Destinations of the [`PROTO`] routes now in the kernel (IPv4).
pub async fn installed(h: &Handle) -> Result<Vec<IpNet>, Error> {
    Ok(v4_routes(h)
        .await?
        .into_iter()
        .filter(|r| r.header.protocol == RouteProtocol::Other(PROTO))
        .filter_map(|r| {
            let len = r.header.destination_prefix_length;
            r.attributes.iter().find_map(|a| match a {
                RouteAttribute::Destination(RouteAddress::Inet(ip)) => {
                    IpNet::new(IpAddr::V4(*ip), len).ok()
                }
                _ => None,
            })
        })
        .collect())
}

/// The output interface of the main table's default route among `routes`.
fn default_oif(routes: &[RouteMessage]) -> Option<u32> {
    routes
        .iter()
        .filter(|r| r.header.destination_prefix_length == 0 && r.header.table == 254)
        .find_map(|r| {
            r.attributes.iter().find_map(|a| match a {
                RouteAttribute::Oif(i) => Some(*i),
                _ => None,
            })
        })
}

/// The addresses on interface `oif`.
async fn addresses_of(h: &Handle, oif: u32) -> Result<Vec<AddressMessage>, Error> {
    h.address()
        .get()
        .set_link_index_filter(oif)
        .execute()
        .try_collect()
        .await
        .map_err(|e| Error::kernel("listing addresses", e))
}

/// The IPv4 address of the interface the main table's default route leaves through.
pub async fn default_source_v4(h: &Handle) -> Result<Ipv4Addr, Error> {
    let oif = default_oif(&v4_routes(h).await?)
        .ok_or_else(|| Error::Missing("no IPv4 default route".into()))?;
    addresses_of(h, oif)
        .await?
        .iter()
        .find_map(|m| {
            m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(IpAddr::V4(ip)) => Some(*ip),
                _ => None,
            })
        })
        .ok_or_else(|| Error::Missing("the default route's interface has no IPv4 address".into()))
}

/// The global IPv6 address of the interface the main table's IPv6 default route leaves
/// through, if there is such a route (a dual-stack machine); `None` on an IPv4-only one.
/// Link-local and tentative addresses are not offered: a peer elsewhere cannot use them.
pub async fn default_source_v6(h: &Handle) -> Result<Option<Ipv6Addr>, Error> {
    let routes: Vec<RouteMessage> = h
        .route()
        .get(RouteMessageBuilder::<Ipv6Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .map_err(|e| Error::kernel("listing IPv6 routes", e))?;
    let Some(oif) = default_oif(&routes) else {
        return Ok(None);
    };
    Ok(addresses_of(h, oif)
        .await?
        .iter()
        .filter(|m| m.header.scope == AddressScope::Universe)
        .filter(|m| {
            !m.attributes.iter().any(
                |a| matches!(a, AddressAttribute::Flags(f) if f.contains(AddressFlags::Tentative)),
            )
        })
        .find_map(|m| {
            m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(IpAddr::V6(ip)) => Some(*ip),
                _ => None,
            })
        }))
}
