//! IPv4 addresses on a link.

use std::net::{IpAddr, Ipv4Addr};

use futures_util::TryStreamExt;
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::Handle;

use crate::{Error, errno};

fn v4_of(m: &AddressMessage) -> Option<Ipv4Addr> {
    m.attributes.iter().find_map(|a| match a {
        AddressAttribute::Address(IpAddr::V4(ip)) => Some(*ip),
        _ => None,
    })
}

async fn messages(h: &Handle, index: u32) -> Result<Vec<AddressMessage>, Error> {
    h.address()
        .get()
        .set_link_index_filter(index)
        .execute()
        .try_collect()
        .await
        .map_err(|e| Error::kernel(format!("reading the addresses of link {index}"), e))
}

/// The IPv4 addresses (with prefix length) on link `index`.
pub async fn v4(h: &Handle, index: u32) -> Result<Vec<(Ipv4Addr, u8)>, Error> {
    Ok(messages(h, index)
        .await?
        .iter()
        .filter_map(|m| Some((v4_of(m)?, m.header.prefix_len)))
        .collect())
}

/// Adds `ip/prefix` to link `index`; already there is not an error.
pub async fn ensure_v4(h: &Handle, index: u32, ip: Ipv4Addr, prefix: u8) -> Result<(), Error> {
    if v4(h, index).await?.iter().any(|(a, _)| *a == ip) {
        return Ok(());
    }
    match h
        .address()
        .add(index, IpAddr::V4(ip), prefix)
        .execute()
        .await
    {
        Err(e) if errno(&e) != Some(libc::EEXIST) => {
            Err(Error::kernel(format!("adding {ip}/{prefix}"), e))
        }
        _ => Ok(()),
    }
}

/// Removes every IPv4 address on link `index` that `keep` refuses; returns those removed.
pub async fn remove_v4_unless(
    h: &Handle,
    index: u32,
    keep: impl Fn(Ipv4Addr) -> bool,
) -> Result<Vec<Ipv4Addr>, Error> {
    let mut removed = Vec::new();
    for m in messages(h, index).await? {
        let Some(ip) = v4_of(&m) else { continue };
        if keep(ip) {
            continue;
        }
        match h.address().del(m).execute().await {
            Err(e) if errno(&e) != Some(libc::EADDRNOTAVAIL) => {
                return Err(Error::kernel(format!("removing {ip}"), e));
            }
            _ => removed.push(ip),
        }
    }
    Ok(removed)
}
