//! Links: by name, their MAC, up, deleted, the ports of a bridge, dummies.

use futures_util::TryStreamExt;
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::{Handle, LinkDummy, LinkUnspec};

use crate::{Error, errno};

/// A link by name, or `None` if there is none.
pub async fn by_name(h: &Handle, name: &str) -> Result<Option<LinkMessage>, Error> {
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
        Err(e) => Err(Error::kernel(format!("looking up {name}"), e)),
    }
}

/// The index of link `name`, or `None` if there is none.
pub async fn index(h: &Handle, name: &str) -> Result<Option<u32>, Error> {
    Ok(by_name(h, name).await?.map(|l| l.header.index))
}

/// The index of link `name`, which must exist.
pub async fn require(h: &Handle, name: &str) -> Result<u32, Error> {
    index(h, name)
        .await?
        .ok_or_else(|| Error::Missing(format!("no interface {name}")))
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

pub fn format_mac(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(":")
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

/// Sets link `index` up (`what` names it in the error).
pub async fn set_up(h: &Handle, index: u32, what: &str) -> Result<(), Error> {
    h.link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(|e| Error::kernel(format!("setting {what} up"), e))
}

/// Deletes a link by name; a missing link is not an error. Returns whether it existed.
pub async fn delete(h: &Handle, name: &str) -> Result<bool, Error> {
    let Some(link) = by_name(h, name).await? else {
        return Ok(false);
    };
    match h.link().del(link.header.index).execute().await {
        Ok(()) => Ok(true),
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(false),
        Err(e) => Err(Error::kernel(format!("deleting {name}"), e)),
    }
}

/// Names of the links enslaved to the bridge `bridge` (none if there is no such bridge).
pub async fn bridge_ports(h: &Handle, bridge: &str) -> Result<Vec<String>, Error> {
    let Some(br) = by_name(h, bridge).await? else {
        return Ok(Vec::new());
    };
    let links: Vec<LinkMessage> = h
        .link()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(|e| Error::kernel("listing links", e))?;
    Ok(links
        .iter()
        .filter(|l| controller_of(l) == Some(br.header.index))
        .map(name_of)
        .collect())
}

/// Creates a dummy link `name` and returns its index. Fails where the kernel has no dummy
/// driver (some VMs' kernels).
pub async fn add_dummy(h: &Handle, name: &str) -> Result<u32, Error> {
    h.link()
        .add(LinkDummy::new(name).build())
        .execute()
        .await
        .map_err(|e| Error::kernel(format!("creating dummy {name}"), e))?;
    index(h, name)
        .await?
        .ok_or_else(|| Error::Missing(format!("dummy {name} vanished")))
}

/// Deletes link `index`.
pub async fn delete_index(h: &Handle, index: u32, what: &str) -> Result<(), Error> {
    h.link()
        .del(index)
        .execute()
        .await
        .map_err(|e| Error::kernel(format!("deleting {what}"), e))
}
