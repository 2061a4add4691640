//! What `socialweb-agent run` is configured with, one section per subsystem. The command line
//! is its only source: each section is a `clap` group flattened into `run`, so `main.rs`
//! builds the whole configuration in one parse and [`crate::agent`] hands each subsystem its
//! own section.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use crate::join::Machine;
use crate::join::proxy_mode::ProxyChoice;
use crate::node::PodNetwork;

/// The whole configuration of `run`.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentConfig {
    /// The node identity document the broker wrote (read-only identity disk on a node).
    #[arg(
        long,
        default_value = "/etc/socialweb/identity.json",
        env = "SOCIALWEB_IDENTITY"
    )]
    pub identity: PathBuf,
    /// A static peer directory (JSON: {"nodes": [{"node", "endpoint", "pod_cidr", "addrs"}]})
    /// for a node without Kubernetes: no join, only DNS, the mesh and the pod network.
    /// Re-read when it changes.
    #[arg(long)]
    pub peers: Option<PathBuf>,
    #[command(flatten)]
    pub ctl: CtlSection,
    #[command(flatten)]
    pub machine: Machine,
    #[command(flatten)]
    pub kubelet: KubeletSection,
    #[command(flatten)]
    pub mesh: MeshSection,
    #[command(flatten)]
    pub dns: DnsSection,
    #[command(flatten)]
    pub pod_network: PodNetworkSection,
}

impl AgentConfig {
    /// Whether this agent joins a cluster (no static directory).
    pub fn joins(&self) -> bool {
        self.peers.is_none()
    }

    /// How pods are wired; `None`: the bridge and the CNI configuration are left alone.
    pub fn pod_network(&self) -> Option<PodNetwork> {
        (!self.pod_network.no_pod_network).then(|| PodNetwork {
            conf_dir: self.machine.cni_conf_dir.clone(),
            mtu: self.mesh.mtu,
            portmap: !self.pod_network.no_portmap,
        })
    }
}

/// The owner-only control socket the CLI talks to.
#[derive(Debug, Clone, clap::Args)]
pub struct CtlSection {
    /// The control socket.
    #[arg(id = "ctl_socket", long = "ctl-socket", default_value = crate::ctl::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// What the kubelet and kube-proxy are started with beyond the identity.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Machine")]
pub struct KubeletSection {
    /// The kubelet's node IP [default: the identity's node_ip, else the address of the
    /// default route's interface].
    #[arg(long)]
    pub node_ip: Option<Ipv4Addr>,
    /// kube-proxy's backend.
    #[arg(long, value_enum, default_value_t = ProxyChoice::Auto)]
    pub proxy_mode: ProxyChoice,
}

/// The mesh: where it binds, its TUN device, its tuning.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Mesh")]
pub struct MeshSection {
    /// UDP address the mesh binds for direct paths.
    #[arg(
        id = "mesh_listen",
        long = "mesh-listen",
        default_value = "0.0.0.0:7443"
    )]
    pub listen: SocketAddr,
    /// Name of the mesh's TUN device.
    #[arg(long, default_value = "socialweb0")]
    pub tun: String,
    /// MTU of the TUN device and of pods (1280 fits a QUIC datagram on any sane path).
    #[arg(long, default_value_t = socialweb_wire::mesh::DEFAULT_MTU, value_parser = clap::value_parser!(u16).range(1280..=9000))]
    pub mtu: u16,
    #[command(flatten)]
    pub tuning: crate::mesh::transport::Tuning,
}

/// Node-local DNS.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Node-local DNS")]
pub struct DnsSection {
    /// Where node-local DNS listens (the address goes on a dummy interface, or on lo where
    /// the kernel has no dummy driver).
    #[arg(
        id = "dns_listen",
        long = "dns-listen",
        default_value = "169.254.20.10:53"
    )]
    pub listen: SocketAddr,
    /// UDP threads serving DNS.
    #[arg(id = "dns_threads", long = "dns-threads", default_value_t = 2)]
    pub threads: usize,
    /// Receive buffer asked for each DNS UDP socket, in bytes (the kernel doubles it and caps
    /// it at net.core.rmem_max); 0 leaves the kernel's default.
    #[arg(id = "dns_rcvbuf", long = "dns-rcvbuf", default_value_t = crate::dns::server::DEFAULT_RCVBUF, env = "SOCIALWEB_DNS_RCVBUF")]
    pub rcvbuf: usize,
    /// Do not serve node-local DNS.
    #[arg(long)]
    pub no_dns: bool,
}

impl DnsSection {
    /// Where DNS listens; `None`: no DNS in this agent.
    pub fn listen(&self) -> Option<SocketAddr> {
        (!self.no_dns).then_some(self.listen)
    }
}

/// This node's pod network: the bridge, the CNI configuration, the masquerade.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Pod network")]
pub struct PodNetworkSection {
    /// Do not masquerade pod traffic leaving the cluster.
    #[arg(long)]
    pub no_masquerade: bool,
    /// Leave the cni0 bridge and the CNI configuration alone.
    #[arg(long)]
    pub no_pod_network: bool,
    /// Do not chain Debian's portmap plugin after socialweb-cni.
    #[arg(long)]
    pub no_portmap: bool,
}

impl PodNetworkSection {
    pub fn masquerade(&self) -> bool {
        !self.no_masquerade
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Run {
        #[command(flatten)]
        config: AgentConfig,
    }

    #[test]
    fn the_command_line_defaults_are_the_node_images_layout() {
        let c = Run::try_parse_from(["run"]).expect("defaults parse").config;
        assert_eq!(c.machine, Machine::default());
        assert!(c.joins());
        assert_eq!(c.dns.listen(), Some("169.254.20.10:53".parse().unwrap()));
        assert!(c.pod_network.masquerade());
        let net = c.pod_network().expect("pod network on by default");
        assert_eq!(net.conf_dir, PathBuf::from("/etc/cni/net.d"));
        assert!(net.portmap);
    }

    #[test]
    fn each_flag_lands_in_its_section() {
        let c = Run::try_parse_from([
            "run",
            "--peers=/tmp/p.json",
            "--no-dns",
            "--no-pod-network",
            "--mtu=1400",
            "--child-log-dir=/tmp/logs",
            "--kubelet-config-patch={\"maxPods\": 30}",
            "--ctl-socket=/tmp/ctl.sock",
        ])
        .expect("parses")
        .config;
        assert!(!c.joins());
        assert_eq!(c.dns.listen(), None);
        assert!(c.pod_network().is_none());
        assert_eq!(c.mesh.mtu, 1400);
        assert_eq!(c.machine.log_dir, Some(PathBuf::from("/tmp/logs")));
        assert_eq!(c.ctl.socket, PathBuf::from("/tmp/ctl.sock"));
        let bad = Run::try_parse_from(["run", "--kubelet-config-patch=[1]"]).unwrap_err();
        assert!(bad.to_string().contains("must be a JSON object"), "{bad}");
    }
}
