//! The node's own addresses: where node-local DNS listens (169.254.20.10), the node-local
//! apiserver (169.254.20.11) and the node's cluster address, on a dummy interface
//! `socialweb-dns`, as NodeLocal DNSCache does; where the kernel has no dummy driver, /32s on
//! `lo` instead (and the log says so).

use std::net::Ipv4Addr;

use anyhow::{Context, Result};
use socialweb_netlink::{Handle, addr, link};
use tracing::{info, warn};

/// The dummy interface's name.
pub const DUMMY: &str = "socialweb-dns";

/// Where the address ended up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Dummy,
    Loopback,
}

/// Puts `ip`/32 on the dummy interface (created if missing), or on `lo` without the driver.
pub async fn ensure(h: &Handle, ip: Ipv4Addr) -> Result<Placement> {
    let (idx, placement) = match link::index(h, DUMMY).await? {
        Some(i) => (i, Placement::Dummy),
        None => match link::add_dummy(h, DUMMY).await {
            Ok(i) => (i, Placement::Dummy),
            Err(e) => {
                warn!("no dummy interface ({e}); putting {ip}/32 on lo instead");
                (link::require(h, "lo").await?, Placement::Loopback)
            }
        },
    };
    if placement == Placement::Dummy {
        link::set_up(h, idx, DUMMY).await?;
    }
    addr::ensure_v4(h, idx, ip, 32)
        .await
        .with_context(|| format!("placing {ip}/32"))?;
    info!(%ip, ?placement, "node address in place");
    Ok(placement)
}

/// Undoes [`ensure`] for `ip`: takes the address away, and the dummy interface with its last
/// address (several node addresses share it: each is undone on its own).
pub async fn remove(h: &Handle, ip: Ipv4Addr, placement: &Placement) -> Result<()> {
    let name = match placement {
        Placement::Dummy => DUMMY,
        Placement::Loopback => "lo",
    };
    let Some(i) = link::index(h, name).await? else {
        return Ok(());
    };
    addr::remove_v4_unless(h, i, |a| a != ip)
        .await
        .with_context(|| format!("removing {ip}/32 from {name}"))?;
    if *placement == Placement::Dummy && addr::v4(h, i).await?.is_empty() {
        link::delete_index(h, i, DUMMY).await?;
    }
    Ok(())
}
