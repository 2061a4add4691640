//! `socialweb-agent`: everything that runs on a node.
//!
//! - [`mesh`]: other nodes' pod CIDRs routed as QUIC datagrams over iroh (contract 3), the peer
//!   directory (contract 2), the relay, egress masquerade, the diagnostics data.
//! - [`tunnel`]: the way to the control plane (contract 9): one QUIC connection to the
//!   broker carrying the apiserver to the node and the apiserver's egress to it.
//! - [`ctl`]: the owner-only control socket and the CLI's client side of it.
//! - [`join`]: containerd, the kubelet and kube-proxy from the identity alone (TLS
//!   bootstrapping), kept running by [`supervise`]; [`status`] is what the bring-up shows.
//!
//! - [`agent`]: `run`, the composition root: the configuration ([`config`], one section per
//!   subsystem) in, the bring-up ([`bringup`], named steps in order) run, what it put on the
//!   machine ([`installed`]) taken away at the end; [`cli`] prints the control socket's
//!   typed answers for the diagnostics subcommands.
//!
//! Pure cores (packet filter, ICMP Packet Too Big, directory diffs) do no I/O and are tested
//! without sockets; the modules that touch the kernel or the network are named for what they
//! touch.

pub mod agent;
pub mod backoff;
pub mod bringup;
pub mod cli;
pub mod config;
pub mod ctl;
pub mod directory;
pub mod dns;
pub mod guest_port;
pub mod installed;
pub mod join;
pub mod mesh;
pub mod node;
pub mod status;
pub mod supervise;
pub mod tunnel;
