//! Kernel operations over rtnetlink: the bridge, the veth pair, the pod end's address, MAC and
//! default route. Operations inside a container's namespace run on a thread that entered it,
//! with a netlink socket opened there.

use std::fs::File;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;

use futures_util::TryStreamExt;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkMessage};
use netlink_packet_route::route::{RouteAddress, RouteAttribute};
use nix::sched::{CloneFlags, setns};
use rtnetlink::{
    Handle, LinkBridge, LinkBridgePort, LinkMessageBuilder, LinkUnspec, LinkVeth,
    RouteMessageBuilder,
};

use crate::spec::{CniError, Code};

fn nl(step: impl std::fmt::Display, e: rtnetlink::Error) -> CniError {
    CniError::new(Code::Netlink, format!("{step}: {e}"))
}

/// The errno of a netlink error, if it is one.
fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

/// Runs `f` with a netlink handle in the current namespace, or in `netns` (a path such as
/// `/run/netns/x` or `/proc/<pid>/ns/net`) on a thread that entered it.
pub fn run<F, Fut, R>(netns: Option<&str>, f: F) -> Result<R, CniError>
where
    F: FnOnce(Handle) -> Fut + Send,
    Fut: Future<Output = Result<R, CniError>>,
    R: Send,
{
    let ns_file = match netns {
        Some(path) => Some(File::open(path).map_err(|e| {
            CniError::new(
                Code::ContainerUnknown,
                format!("network namespace {path}: {e}"),
            )
        })?),
        None => None,
    };
    std::thread::scope(|s| {
        s.spawn(move || {
            if let Some(file) = &ns_file {
                setns(file, CloneFlags::CLONE_NEWNET).map_err(|e| {
                    CniError::new(Code::ContainerUnknown, format!("entering {netns:?}: {e}"))
                })?;
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| CniError::new(Code::Io, format!("starting the runtime: {e}")))?;
            rt.block_on(async {
                let (conn, handle, _) = rtnetlink::new_connection()
                    .map_err(|e| CniError::new(Code::Netlink, format!("netlink socket: {e}")))?;
                tokio::spawn(conn);
                f(handle).await
            })
        })
        .join()
        .unwrap_or_else(|_| Err(CniError::new(Code::Netlink, "the netlink thread panicked")))
    })
}

/// A link by name, or `None` if there is none.
pub async fn link_by_name(h: &Handle, name: &str) -> Result<Option<LinkMessage>, CniError> {
    match h
        .link()
        .get()
        .match_name(name.to_string())
        .execute()
        .try_next()
        .await
    {
        Ok(link) => Ok(link),
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(nl(format!("looking up {name}"), e)),
    }
}

/// The link's MAC as `aa:bb:..`.
pub fn mac_of(link: &LinkMessage) -> String {
    link.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Address(b) => Some(format_mac(b)),
            _ => None,
        })
        .unwrap_or_default()
}

fn controller_of(link: &LinkMessage) -> Option<u32> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Controller(i) => Some(*i),
        _ => None,
    })
}

fn name_of(link: &LinkMessage) -> String {
    link.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

pub fn format_mac(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The MAC a pod interface gets: `0a:58` followed by its IPv4 address, so the same address
/// always has the same MAC (neighbours' caches stay right across pod restarts).
pub fn mac_for(ip: Ipv4Addr) -> [u8; 6] {
    let o = ip.octets();
    [0x0a, 0x58, o[0], o[1], o[2], o[3]]
}

/// Makes sure the bridge exists, is up and holds `gateway/prefix`; returns its index and MAC.
/// Safe against concurrent callers: "exists" answers from the kernel are not errors.
pub async fn ensure_bridge(
    h: &Handle,
    name: &str,
    gateway: Ipv4Addr,
    prefix: u8,
    mtu: u32,
) -> Result<(u32, String), CniError> {
    if link_by_name(h, name).await?.is_none() {
        let msg = LinkBridge::new(name).mtu(mtu).build();
        if let Err(e) = h.link().add(msg).execute().await
            && errno(&e) != Some(libc::EEXIST)
        {
            return Err(nl(format!("creating bridge {name}"), e));
        }
    }
    let link = link_by_name(h, name)
        .await?
        .ok_or_else(|| CniError::new(Code::Netlink, format!("bridge {name} vanished")))?;
    let index = link.header.index;
    let has_gw =
        h.address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_filter(|m| {
                let found = m.attributes.iter().any(
                    |a| matches!(a, AddressAttribute::Address(IpAddr::V4(ip)) if *ip == gateway),
                );
                std::future::ready(found)
            })
            .try_next()
            .await
            .map_err(|e| nl(format!("reading addresses of {name}"), e))?
            .is_some();
    if !has_gw
        && let Err(e) = h
            .address()
            .add(index, IpAddr::V4(gateway), prefix)
            .execute()
            .await
        && errno(&e) != Some(libc::EEXIST)
    {
        return Err(nl(format!("adding {gateway}/{prefix} to {name}"), e));
    }
    h.link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(|e| nl(format!("setting {name} up"), e))?;
    Ok((index, mac_of(&link)))
}

/// Creates the veth pair: `host` stays here, on the bridge, up, with hairpin as asked; the
/// other end is `ifname` in the namespace open as `netns`.
/// Returns the host end's MAC.
pub async fn create_veth(
    h: &Handle,
    host: &str,
    bridge_index: u32,
    hairpin: bool,
    mtu: u32,
    netns: &File,
    ifname: &str,
) -> Result<String, CniError> {
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
            " (an interface of that name exists: a DEL for this container was missed?)"
        } else {
            ""
        };
        return Err(nl(
            format!("creating veth {host} with {ifname} in the container{hint}"),
            e,
        ));
    }
    let host_link = link_by_name(h, host)
        .await?
        .ok_or_else(|| CniError::new(Code::Netlink, format!("veth {host} vanished")))?;
    let index = host_link.header.index;
    h.link()
        .set(
            LinkUnspec::new_with_index(index)
                .controller(bridge_index)
                .up()
                .build(),
        )
        .execute()
        .await
        .map_err(|e| nl(format!("attaching {host} to the bridge"), e))?;
    h.link()
        .set_port(LinkBridgePort::new(index).hairpin(hairpin).build())
        .execute()
        .await
        .map_err(|e| nl(format!("setting hairpin on {host}"), e))?;
    Ok(mac_of(&host_link))
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
) -> Result<String, CniError> {
    let link = link_by_name(h, ifname)
        .await?
        .ok_or_else(|| CniError::new(Code::Netlink, format!("{ifname} is not in the container")))?;
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
        .map_err(|e| nl(format!("setting {ifname} up"), e))?;
    h.address()
        .add(index, IpAddr::V4(ip), prefix)
        .execute()
        .await
        .map_err(|e| nl(format!("adding {ip}/{prefix} to {ifname}"), e))?;
    if default_route {
        let route = RouteMessageBuilder::<Ipv4Addr>::new()
            .output_interface(index)
            .gateway(gateway)
            .build();
        h.route()
            .add(route)
            .execute()
            .await
            .map_err(|e| nl(format!("adding the default route via {gateway}"), e))?;
    }
    Ok(format_mac(&mac))
}

/// Deletes a link by name; a missing link is not an error. Returns whether it existed.
pub async fn delete_link(h: &Handle, name: &str) -> Result<bool, CniError> {
    let Some(link) = link_by_name(h, name).await? else {
        return Ok(false);
    };
    match h.link().del(link.header.index).execute().await {
        Ok(()) => Ok(true),
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(false),
        Err(e) => Err(nl(format!("deleting {name}"), e)),
    }
}

/// Names of the links enslaved to the bridge `bridge`.
pub async fn bridge_ports(h: &Handle, bridge: &str) -> Result<Vec<String>, CniError> {
    let Some(br) = link_by_name(h, bridge).await? else {
        return Ok(Vec::new());
    };
    let links: Vec<LinkMessage> = h
        .link()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(|e| nl("listing links", e))?;
    Ok(links
        .iter()
        .filter(|l| controller_of(l) == Some(br.header.index))
        .map(name_of)
        .collect())
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
pub async fn read_pod_end(h: &Handle, ifname: &str) -> Result<Option<PodEnd>, CniError> {
    let Some(link) = link_by_name(h, ifname).await? else {
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
        .map_err(|e| nl(format!("reading addresses of {ifname}"), e))?
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
        .map_err(|e| nl("reading routes", e))?;
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
    run(
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
