//! A pod's veth pair: the host end on the bridge, the pod's end created straight inside the
//! pod's namespace under its final name, and that end's address, MAC and default route.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;

use futures_util::TryStreamExt;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute};
use netlink_packet_route::route::{RouteAddress, RouteAttribute};
use rtnetlink::{
    Handle, LinkBridgePort, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder,
};

use crate::link::{self, format_mac, mac_of};
use crate::{Error, errno, run};

/// The MAC a pod interface gets: `0a:58` followed by its IPv4 address, so the same address
/// always has the same MAC (neighbours' caches stay right across pod restarts).
pub fn mac_for(ip: Ipv4Addr) -> [u8; 6] {
    let o = ip.octets();
    [0x0a, 0x58, o[0], o[1], o[2], o[3]]
}

/// Creates the veth pair `host` (here, down) and `ifname` (inside the namespace open as
/// `netns`), both with `mtu`; returns the host end's index. Either both ends exist afterwards
/// or, on an error, neither was made by this call.
pub async fn create(
    h: &Handle,
    host: &str,
    mtu: u32,
    netns: &File,
    ifname: &str,
) -> Result<u32, Error> {
    // The peer is created directly inside the container's namespace under its final name
    // (IFLA_NET_NS_FD on the peer): moving a device between namespaces afterwards costs an RCU
    // grace period, which doubled ADD's latency when this created it here and moved it.
    let peer = LinkMessageBuilder::<LinkUnspec>::new()
        .name(ifname.to_string())
        .mtu(mtu)
        .setns_by_fd(netns.as_raw_fd())
        .build();
    let msg = LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
        .name(host.to_string())
        .mtu(mtu)
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
        .build();
    if let Err(e) = h.link().add(msg).execute().await {
        let hint = if errno(&e) == Some(libc::EEXIST) {
            " (an interface of one of those names exists)"
        } else {
            ""
        };
        return Err(Error::kernel(
            format!("creating veth {host} with {ifname} in the container{hint}"),
            e,
        ));
    }
    link::index(h, host)
        .await?
        .ok_or_else(|| Error::Missing(format!("veth {host} vanished")))
}

/// Puts the host end (link `index`, named `host`) on the bridge, up, with hairpin as asked;
/// returns its MAC.
pub async fn attach(
    h: &Handle,
    host: &str,
    index: u32,
    bridge_index: u32,
    hairpin: bool,
) -> Result<String, Error> {
    h.link()
        .set(
            LinkUnspec::new_with_index(index)
                .controller(bridge_index)
                .up()
                .build(),
        )
        .execute()
        .await
        .map_err(|e| Error::kernel(format!("attaching {host} to the bridge"), e))?;
    h.link()
        .set_port(LinkBridgePort::new(index).hairpin(hairpin).build())
        .execute()
        .await
        .map_err(|e| Error::kernel(format!("setting hairpin on {host}"), e))?;
    let link = link::by_name(h, host)
        .await?
        .ok_or_else(|| Error::Missing(format!("veth {host} vanished")))?;
    Ok(mac_of(&link))
}

/// Inside the container: sets the MAC and MTU (a veth peer does not inherit the MTU the pair
/// was created with), brings `ifname` up, adds the address and, if asked,
/// the default route. Returns the interface's MAC.
pub async fn configure_pod_end(
    h: &Handle,
    ifname: &str,
    ip: Ipv4Addr,
    prefix: u8,
    gateway: Ipv4Addr,
    default_route: bool,
    mtu: u32,
) -> Result<String, Error> {
    let link = link::by_name(h, ifname)
        .await?
        .ok_or_else(|| Error::Missing(format!("{ifname} is not in the container")))?;
    let index = link.header.index;
    let mac = mac_for(ip);
    h.link()
        .set(
            LinkUnspec::new_with_index(index)
                .address(mac.to_vec())
                .mtu(mtu)
                .up()
                .build(),
        )
        .execute()
        .await
        .map_err(|e| Error::kernel(format!("setting {ifname} up"), e))?;
    h.address()
        .add(index, IpAddr::V4(ip), prefix)
        .execute()
        .await
        .map_err(|e| Error::kernel(format!("adding {ip}/{prefix} to {ifname}"), e))?;
    if default_route {
        let route = RouteMessageBuilder::<Ipv4Addr>::new()
            .output_interface(index)
            .gateway(gateway)
            .build();
        h.route()
            .add(route)
            .execute()
            .await
            .map_err(|e| Error::kernel(format!("adding the default route via {gateway}"), e))?;
    }
    Ok(format_mac(&mac))
}

/// What CHECK finds inside the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEnd {
    pub mac: String,
    pub mtu: Option<u32>,
    pub up: bool,
    pub addrs: Vec<(Ipv4Addr, u8)>,
    pub default_gateway: Option<Ipv4Addr>,
}

/// Reads `ifname` inside the container (called from a namespace thread).
pub async fn read_pod_end(h: &Handle, ifname: &str) -> Result<Option<PodEnd>, Error> {
    let Some(link) = link::by_name(h, ifname).await? else {
        return Ok(None);
    };
    let index = link.header.index;
    let mtu = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Mtu(m) => Some(*m),
        _ => None,
    });
    let up = link
        .header
        .flags
        .contains(netlink_packet_route::link::LinkFlags::Up);
    let addrs = h
        .address()
        .get()
        .set_link_index_filter(index)
        .execute()
        .try_collect::<Vec<_>>()
        .await
        .map_err(|e| Error::kernel(format!("reading addresses of {ifname}"), e))?
        .into_iter()
        .filter_map(|m| {
            let prefix = m.header.prefix_len;
            m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(IpAddr::V4(ip)) => Some((*ip, prefix)),
                _ => None,
            })
        })
        .collect();
    let routes = h
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute()
        .try_collect::<Vec<_>>()
        .await
        .map_err(|e| Error::kernel("reading routes", e))?;
    let default_gateway = routes.iter().find_map(|r| {
        if r.header.destination_prefix_length != 0 {
            return None;
        }
        let oif = r
            .attributes
            .iter()
            .any(|a| matches!(a, RouteAttribute::Oif(i) if *i == index));
        let gw = r.attributes.iter().find_map(|a| match a {
            RouteAttribute::Gateway(RouteAddress::Inet(g)) => Some(*g),
            _ => None,
        });
        if oif { gw } else { None }
    });
    Ok(Some(PodEnd {
        mac: mac_of(&link),
        mtu,
        up,
        addrs,
        default_gateway,
    }))
}

/// Whether the namespace at `netns` exists and its `ifname` holds `ip` (best effort: any
/// failure to look is "no").
pub fn netns_holds(netns: &str, ifname: &str, ip: Ipv4Addr) -> bool {
    run::<_, _, _, Error>(
        Some(netns),
        |h| async move { read_pod_end(&h, ifname).await },
    )
    .ok()
    .flatten()
    .is_some_and(|end| end.addrs.iter().any(|(a, _)| *a == ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_follow_the_address() {
        assert_eq!(
            format_mac(&mac_for(Ipv4Addr::new(10, 42, 1, 5))),
            "0a:58:0a:2a:01:05"
        );
    }
}
