//! The operator host's own network set-up: the service address tenant apiservers and the
//! relay listen on.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Puts `addr`/32 on `lo` unless it is there: the service address nodes reach the host on.
pub fn ensure_service_addr(addr: Ipv4Addr) -> Result<()> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "dev", "lo"])
        .output()
        .context("running ip (iproute2)")?;
    if String::from_utf8_lossy(&out.stdout).contains(&format!(" {addr}/32 ")) {
        return Ok(());
    }
    ip(&["addr", "add", &format!("{addr}/32"), "dev", "lo"])
}

/// Puts `addr`/128 on `lo` unless some interface has it (a cloud puts a host's IPv6
/// address on its interface; an address routed to the host is on none).
pub fn ensure_service_addr_v6(addr: Ipv6Addr) -> Result<()> {
    let out = Command::new("ip")
        .args(["-6", "-o", "addr", "show"])
        .output()
        .context("running ip (iproute2)")?;
    if String::from_utf8_lossy(&out.stdout).contains(&format!(" {addr}/")) {
        return Ok(());
    }
    ip(&["-6", "addr", "add", &format!("{addr}/128"), "dev", "lo"])
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
