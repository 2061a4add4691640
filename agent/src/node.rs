//! This node's own network: the `cni0` bridge on its pod CIDR and the CNI configuration
//! containerd reads (contract 4).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use ipnet::{IpNet, Ipv4Net};
use serde_json::json;

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
    use futures_util::TryStreamExt;
    use netlink_packet_route::address::AddressAttribute;
    let net = v4(pod_cidr)?;
    let gateway = socialweb_cni::config::first_host(net);
    socialweb_cni::netlink::run(None, |h| async move {
        let (index, _) = socialweb_cni::netlink::ensure_bridge(
            &h,
            BRIDGE,
            gateway,
            net.prefix_len(),
            u32::from(mtu),
        )
        .await?;
        let addrs: Vec<_> = h
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .map_err(|e| {
                socialweb_cni::spec::CniError::new(
                    socialweb_cni::spec::Code::Netlink,
                    format!("reading addresses of {BRIDGE}: {e}"),
                )
            })?;
        for a in addrs {
            let stale = a.attributes.iter().any(|x| {
                matches!(x, AddressAttribute::Address(std::net::IpAddr::V4(ip)) if *ip != gateway)
            });
            if stale {
                tracing::info!(
                    bridge = BRIDGE,
                    "removing a previous pod CIDR's gateway: {:?}",
                    a.attributes
                );
                h.address().del(a).execute().await.map_err(|e| {
                    socialweb_cni::spec::CniError::new(
                        socialweb_cni::spec::Code::Netlink,
                        format!("removing a stale address from {BRIDGE}: {e}"),
                    )
                })?;
            }
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
