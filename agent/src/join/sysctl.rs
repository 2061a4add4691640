//! Kernel settings a node needs: forwarding between the pod bridge, the mesh and the uplink,
//! and bridged pod traffic through netfilter so kube-proxy's rules see a Pod talking to a
//! Service whose endpoint sits on the same bridge (without it the reply skips the reverse
//! NAT and the connection hangs).

use anyhow::{Context, Result};

/// `(path under /proc/sys, value, required)`. All are per network namespace.
const SETTINGS: &[(&str, &str, bool)] = &[
    ("net/ipv4/ip_forward", "1", true),
    ("net/ipv4/conf/all/forwarding", "1", true),
    // br_netfilter: built in or a module; where it is missing Services still work between
    // nodes, only same-node hairpins do not, and `status` says so.
    ("net/bridge/bridge-nf-call-iptables", "1", false),
    ("net/bridge/bridge-nf-call-ip6tables", "1", false),
];

/// Applies every setting; returns the optional ones that could not be set.
pub fn apply() -> Result<Vec<String>> {
    let mut missing = Vec::new();
    for (path, value, required) in SETTINGS {
        let full = format!("/proc/sys/{path}");
        if std::fs::read_to_string(&full)
            .map(|v| v.trim() == *value)
            .unwrap_or(false)
        {
            continue;
        }
        match std::fs::write(&full, value) {
            Ok(()) => {}
            Err(e) if !required => missing.push(format!("{} ({e})", path.replace('/', "."))),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("setting {} = {value}", path.replace('/', ".")));
            }
        }
    }
    Ok(missing)
}
