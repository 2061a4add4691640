//! This node's own network: the `cni0` bridge on its pod CIDR and the CNI configuration
//! containerd reads (contract 4).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use ipnet::{IpNet, Ipv4Net};
use serde_json::json;
use socialweb_netlink::{self as netlink, bridge};

/// Name of the configuration file the agent writes.
pub const CONFLIST: &str = "10-socialweb.conflist";
pub const BRIDGE: &str = "cni0";

/// How pods are wired.
#[derive(Debug, Clone)]
pub struct PodNetwork {
    pub conf_dir: PathBuf,
    pub mtu: u16,
    /// Chain Debian's `portmap` after our plugin (hostPort support).
    pub portmap: bool,
}

fn v4(cidr: &IpNet) -> Result<Ipv4Net> {
    match cidr {
        IpNet::V4(n) => Ok(*n),
        IpNet::V6(_) => Err(anyhow!(
            "pod CIDR {cidr}: only IPv4 pod CIDRs are supported"
        )),
    }
}

/// Creates the bridge with the pod CIDR's first address, if missing, and removes any other
/// IPv4 address from it: a gateway of a previous pod CIDR would keep routing that CIDR to the
/// bridge, shadowing the mesh's route to whichever node holds it now.
pub fn ensure_bridge(pod_cidr: &IpNet, mtu: u16) -> Result<()> {
    let net = v4(pod_cidr)?;
    let gateway = Ipv4Addr::from(u32::from(net.network()) + 1);
    netlink::run::<_, _, _, netlink::Error>(None, |h| async move {
        let (index, _) =
            bridge::ensure(&h, BRIDGE, gateway, net.prefix_len(), u32::from(mtu)).await?;
        for old in bridge::drop_other_gateways(&h, BRIDGE, index, gateway).await? {
            tracing::info!(bridge = BRIDGE, %old, "removed a previous pod CIDR's gateway");
        }
        Ok(())
    })
    .map_err(|e| anyhow!("bridge {BRIDGE}: {e}"))
}

/// The conflist for `pod_cidr`. cniVersion 1.0.0: the newest both containerd 1.6's libcni and
/// Debian's portmap speak.
pub fn conflist(pod_cidr: &IpNet, net: &PodNetwork) -> serde_json::Value {
    let mut plugins = vec![json!({
        "type": "socialweb-cni",
        "bridge": BRIDGE,
        "subnet": pod_cidr.to_string(),
        "mtu": net.mtu,
    })];
    if net.portmap {
        plugins.push(json!({"type": "portmap", "capabilities": {"portMappings": true}}));
    }
    json!({"cniVersion": "1.0.0", "name": "socialweb", "plugins": plugins})
}

/// Writes the conflist atomically (containerd watches the directory and must never read half
/// a file).
pub fn write_conflist(pod_cidr: &IpNet, net: &PodNetwork) -> Result<PathBuf> {
    std::fs::create_dir_all(&net.conf_dir)
        .with_context(|| format!("creating {}", net.conf_dir.display()))?;
    let path = net.conf_dir.join(CONFLIST);
    let tmp = net.conf_dir.join(format!(".{CONFLIST}.tmp"));
    let text = serde_json::to_vec_pretty(&conflist(pod_cidr, net))?;
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(path)
}

/// Whether a path is the agent's conflist (for cleanup).
pub fn is_ours(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == CONFLIST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conflist_carries_the_pod_cidr_and_chains_portmap() {
        let net = PodNetwork {
            conf_dir: "/x".into(),
            mtu: 1280,
            portmap: true,
        };
        let c = conflist(&"10.42.3.0/24".parse().unwrap(), &net);
        assert_eq!(c["plugins"][0]["subnet"], "10.42.3.0/24");
        assert_eq!(c["plugins"][0]["mtu"], 1280);
        assert_eq!(c["plugins"][1]["type"], "portmap");
        assert!(v4(&"fd00::/64".parse().unwrap()).is_err());
    }
}
