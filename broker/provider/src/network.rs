//! A local node's network, as a guest behind user-mode NAT sees it: a network namespace of its
//! own with one link to the host, a /24 per node (`<a>.<b>.<i>.0/24`: the host `.1`, the node
//! `.2`), its default route through the host. The host does not forward between node links,
//! so a node reaches the host's addresses (the service address with the apiserver and the
//! relay) and nothing else, which forces the mesh through the relay, as between real guests.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Where `ip netns` keeps its namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// A node's network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeNet {
    /// The namespace's name (`<prefix>n<i>`).
    pub netns: String,
    /// The host's end of the link (`<prefix>h<i>`).
    pub host_link: String,
    pub host_addr: Ipv4Addr,
    pub node_addr: Ipv4Addr,
}

impl NodeNet {
    /// The network of node slot `i` (1-254) under `prefix` in `subnet` (a /16's base).
    pub fn plan(prefix: &str, subnet: Ipv4Addr, i: u8) -> NodeNet {
        let [a, b, _, _] = subnet.octets();
        NodeNet {
            netns: format!("{prefix}n{i}"),
            host_link: format!("{prefix}h{i}"),
            host_addr: Ipv4Addr::new(a, b, i, 1),
            node_addr: Ipv4Addr::new(a, b, i, 2),
        }
    }

    pub fn netns_path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.netns)
    }

    /// Creates it (replacing a leftover of the same name).
    pub fn create(&self) -> Result<()> {
        if self.host_link.len() > 15 {
            bail!(
                "interface name {:?} is longer than 15 characters: use a shorter local_provider.prefix",
                self.host_link
            );
        }
        self.remove();
        ip(&["netns", "add", &self.netns])?;
        let steps: Vec<Vec<String>> = vec![
            vec![
                "link".into(),
                "add".into(),
                self.host_link.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                "eth0".into(),
                "netns".into(),
                self.netns.clone(),
            ],
            vec![
                "addr".into(),
                "add".into(),
                format!("{}/24", self.host_addr),
                "dev".into(),
                self.host_link.clone(),
            ],
            vec![
                "link".into(),
                "set".into(),
                self.host_link.clone(),
                "up".into(),
            ],
            vec![
                "-n".into(),
                self.netns.clone(),
                "link".into(),
                "set".into(),
                "lo".into(),
                "up".into(),
            ],
            vec![
                "-n".into(),
                self.netns.clone(),
                "addr".into(),
                "add".into(),
                format!("{}/24", self.node_addr),
                "dev".into(),
                "eth0".into(),
            ],
            vec![
                "-n".into(),
                self.netns.clone(),
                "link".into(),
                "set".into(),
                "eth0".into(),
                "up".into(),
            ],
            vec![
                "-n".into(),
                self.netns.clone(),
                "route".into(),
                "add".into(),
                "default".into(),
                "via".into(),
                self.host_addr.to_string(),
            ],
        ];
        for s in steps {
            let args: Vec<&str> = s.iter().map(String::as_str).collect();
            if let Err(e) = ip(&args) {
                self.remove();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Removes the namespace (its end of the link goes with it, and the host's end with
    /// that). Missing is fine.
    pub fn remove(&self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_link])
            .output();
    }

    /// Whether the namespace exists.
    pub fn exists(&self) -> bool {
        self.netns_path().exists()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_get_their_own_slash_24() {
        let n = NodeNet::plan("swn-", Ipv4Addr::new(172, 30, 0, 0), 7);
        assert_eq!(n.netns, "swn-n7");
        assert_eq!(n.host_link, "swn-h7");
        assert_eq!(n.host_addr, Ipv4Addr::new(172, 30, 7, 1));
        assert_eq!(n.node_addr, Ipv4Addr::new(172, 30, 7, 2));
    }
}
