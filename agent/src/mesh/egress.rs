//! Egress masquerade (contract 3): traffic from this node's pods to addresses outside the
//! cluster leaves with the node's address; traffic between pods keeps its pod source. One
//! nftables table owned by the agent, replaced atomically, deleted on shutdown.

use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use ipnet::IpNet;

/// The agent's table (family `ip`).
pub const TABLE: &str = "socialweb";

/// The ruleset for `pod_cidr` in a cluster whose pods live in `cluster_cidr`.
pub fn ruleset(pod_cidr: &IpNet, cluster_cidr: &IpNet) -> String {
    format!(
        "table ip {TABLE} {{\n  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    \
         ip saddr {pod_cidr} ip daddr != {cluster_cidr} masquerade\n  }}\n}}\n"
    )
}

fn nft(script: &str) -> Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft (package nftables)")?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("nft: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Installs (or replaces) the table in one transaction.
pub fn install(pod_cidr: &IpNet, cluster_cidr: &IpNet) -> Result<()> {
    // `add table` makes the delete valid when the table does not exist yet; all three lines
    // apply atomically.
    nft(&format!(
        "add table ip {TABLE}\ndelete table ip {TABLE}\n{}",
        ruleset(pod_cidr, cluster_cidr)
    ))
}

/// Removes the table; a missing table is not an error.
pub fn remove() -> Result<()> {
    nft(&format!("add table ip {TABLE}\ndelete table ip {TABLE}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_masquerades_only_traffic_leaving_the_cluster() {
        let r = ruleset(
            &"10.42.1.0/24".parse().unwrap(),
            &"10.42.0.0/16".parse().unwrap(),
        );
        assert!(r.contains("ip saddr 10.42.1.0/24 ip daddr != 10.42.0.0/16 masquerade"));
        assert!(r.contains("type nat hook postrouting"));
    }
}
