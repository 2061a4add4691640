//! The pods' bridge: created if missing, up, holding the gateway address.

use std::net::Ipv4Addr;

use rtnetlink::{Handle, LinkBridge};

use crate::{Error, addr, errno, link};

/// Makes sure bridge `name` exists, is up and holds `gateway/prefix`; returns its index and
/// MAC. Safe against concurrent callers: "exists" answers from the kernel are not errors.
pub async fn ensure(
    h: &Handle,
    name: &str,
    gateway: Ipv4Addr,
    prefix: u8,
    mtu: u32,
) -> Result<(u32, String), Error> {
    if link::by_name(h, name).await?.is_none() {
        let msg = LinkBridge::new(name).mtu(mtu).build();
        if let Err(e) = h.link().add(msg).execute().await
            && errno(&e) != Some(libc::EEXIST)
        {
            return Err(Error::kernel(format!("creating bridge {name}"), e));
        }
    }
    let br = link::by_name(h, name)
        .await?
        .ok_or_else(|| Error::Missing(format!("bridge {name} vanished")))?;
    let index = br.header.index;
    addr::ensure_v4(h, index, gateway, prefix)
        .await
        .map_err(|e| in_bridge(name, e))?;
    link::set_up(h, index, name).await?;
    Ok((index, link::mac_of(&br)))
}

/// Removes every IPv4 address but `gateway` from the bridge at `index`: a gateway of a
/// previous pod CIDR would keep routing that CIDR to the bridge. Returns what it removed.
pub async fn drop_other_gateways(
    h: &Handle,
    name: &str,
    index: u32,
    gateway: Ipv4Addr,
) -> Result<Vec<Ipv4Addr>, Error> {
    addr::remove_v4_unless(h, index, |ip| ip == gateway)
        .await
        .map_err(|e| in_bridge(name, e))
}

fn in_bridge(name: &str, e: Error) -> Error {
    match e {
        Error::Kernel { step, error } => Error::Kernel {
            step: format!("{step} on {name}"),
            error,
        },
        other => other,
    }
}
