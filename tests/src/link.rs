//! Links, addresses, routes and sysctls inside harness namespaces. Every call names the
//! namespace it acts on (`ip -n`), so nothing here can touch the root namespace.

use anyhow::Result;

use crate::netns::Netns;

/// A veth pair with one end in each namespace, both ends up.
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) -> Result<()> {
    a.ip(&[
        "link",
        "add",
        a_if,
        "type",
        "veth",
        "peer",
        "name",
        b_if,
        "netns",
        b.name(),
    ])?;
    a.ip(&["link", "set", a_if, "up"])?;
    b.ip(&["link", "set", b_if, "up"])?;
    Ok(())
}

/// A bridge named `name`, up, with `addr` (CIDR notation) on it when given.
pub fn bridge(ns: &Netns, name: &str, addr: Option<&str>) -> Result<()> {
    ns.ip(&["link", "add", "name", name, "type", "bridge"])?;
    if let Some(addr) = addr {
        ns.ip(&["addr", "add", addr, "dev", name])?;
    }
    ns.ip(&["link", "set", name, "up"])?;
    Ok(())
}

/// Enslaves `port` to `bridge`.
pub fn attach(ns: &Netns, port: &str, bridge: &str) -> Result<()> {
    ns.ip(&["link", "set", "dev", port, "master", bridge])?;
    Ok(())
}

pub fn addr(ns: &Netns, dev: &str, cidr: &str) -> Result<()> {
    ns.ip(&["addr", "add", cidr, "dev", dev])?;
    Ok(())
}

/// Adds a route; `via` of `None` means on-link through `dev`.
pub fn route(ns: &Netns, dst: &str, via: Option<&str>, dev: Option<&str>) -> Result<()> {
    let mut args = vec!["route", "add", dst];
    if let Some(v) = via {
        args.extend(["via", v]);
    }
    if let Some(d) = dev {
        args.extend(["dev", d]);
    }
    ns.ip(&args)?;
    Ok(())
}

/// Sets a sysctl inside the namespace (net.* sysctls are per network namespace).
pub fn sysctl(ns: &Netns, key: &str, value: &str) -> Result<()> {
    ns.exec("sysctl", &["-q", "-w", &format!("{key}={value}")])?;
    Ok(())
}

/// Names of the interfaces in the namespace.
pub fn links(ns: &Netns) -> Result<Vec<String>> {
    let out = ns.ip(&["-o", "link", "show"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or("").to_string())
        .collect())
}
