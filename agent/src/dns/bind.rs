//! Where node-local DNS listens: 169.254.20.10 on a dummy interface `socialweb-dns`, as
//! NodeLocal DNSCache does; where the kernel has no dummy driver, a /32 on `lo` instead (and
//! the log says so).

use std::net::{IpAddr, Ipv4Addr};

use anyhow::{Context, Result};
use futures_util::TryStreamExt;
use netlink_packet_route::address::AddressAttribute;
use rtnetlink::{Handle, LinkDummy, LinkUnspec};
use tracing::{info, warn};

/// The dummy interface's name.
pub const DUMMY: &str = "socialweb-dns";

/// Where the address ended up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Dummy,
    Loopback,
}

async fn index(h: &Handle, name: &str) -> Result<Option<u32>> {
    crate::mesh::routes::find_link(h, name).await
}

async fn has_addr(h: &Handle, idx: u32, ip: Ipv4Addr) -> Result<bool> {
    let addrs: Vec<_> = h
        .address()
        .get()
        .set_link_index_filter(idx)
        .execute()
        .try_collect()
        .await?;
    Ok(addrs.iter().any(|m| {
        m.attributes
            .iter()
            .any(|a| matches!(a, AddressAttribute::Address(IpAddr::V4(x)) if *x == ip))
    }))
}

/// Puts `ip`/32 on the dummy interface (created if missing), or on `lo` without the driver.
pub async fn ensure(h: &Handle, ip: Ipv4Addr) -> Result<Placement> {
    let (idx, placement) = match index(h, DUMMY).await? {
        Some(i) => (i, Placement::Dummy),
        None => match h.link().add(LinkDummy::new(DUMMY).build()).execute().await {
            Ok(()) => (
                index(h, DUMMY).await?.context("dummy interface vanished")?,
                Placement::Dummy,
            ),
            Err(e) => {
                warn!("no dummy interface ({e}); putting {ip}/32 on lo instead");
                (index(h, "lo").await?.context("no lo")?, Placement::Loopback)
            }
        },
    };
    if placement == Placement::Dummy {
        h.link()
            .set(LinkUnspec::new_with_index(idx).up().build())
            .execute()
            .await
            .context("bringing the dummy up")?;
    }
    if !has_addr(h, idx, ip).await? {
        h.address()
            .add(idx, IpAddr::V4(ip), 32)
            .execute()
            .await
            .with_context(|| format!("adding {ip}/32"))?;
    }
    info!(%ip, ?placement, "node-local DNS address in place");
    Ok(placement)
}

/// Undoes [`ensure`].
pub async fn remove(h: &Handle, ip: Ipv4Addr, placement: &Placement) -> Result<()> {
    match placement {
        Placement::Dummy => {
            if let Some(i) = index(h, DUMMY).await? {
                h.link().del(i).execute().await?;
            }
        }
        Placement::Loopback => {
            if let Some(i) = index(h, "lo").await? {
                let addrs: Vec<_> = h
                    .address()
                    .get()
                    .set_link_index_filter(i)
                    .execute()
                    .try_collect()
                    .await?;
                for m in addrs {
                    if m.attributes
                        .iter()
                        .any(|a| matches!(a, AddressAttribute::Address(IpAddr::V4(x)) if *x == ip))
                    {
                        h.address().del(m).execute().await?;
                    }
                }
            }
        }
    }
    Ok(())
}
