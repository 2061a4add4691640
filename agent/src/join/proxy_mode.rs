//! Which kube-proxy backend a node runs: nftables (GA since Kubernetes 1.33) where the `nft`
//! tool and the kernel's nf_tables work, iptables otherwise.

use std::process::Stdio;

use super::config::ProxyMode;

/// What `--proxy-mode` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProxyChoice {
    /// nftables where it works, else iptables.
    Auto,
    Nftables,
    Iptables,
}

/// Resolves `auto` by trying nftables: listing tables needs both the tool and the kernel.
pub async fn resolve(choice: ProxyChoice) -> ProxyMode {
    match choice {
        ProxyChoice::Nftables => ProxyMode::Nftables,
        ProxyChoice::Iptables => ProxyMode::Iptables,
        ProxyChoice::Auto => {
            let ok = tokio::process::Command::new("nft")
                .args(["list", "tables"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .await
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                ProxyMode::Nftables
            } else {
                tracing::warn!(
                    "nftables unavailable (no working `nft`); kube-proxy runs in iptables mode"
                );
                ProxyMode::Iptables
            }
        }
    }
}
