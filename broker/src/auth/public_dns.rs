//! Name resolution for `did:web` fetches: only public addresses come back, so a DID cannot
//! make the broker fetch from its own loopback, the operator's private networks, link-local
//! metadata services or carrier-grade NAT (docs/security.md). reqwest connects only to the
//! addresses this returns, so there is no gap between the check and the connection for DNS
//! rebinding to use. Address literals never get here: `did_web_url` refuses them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;

/// Whether `ip` is an address on the public internet: not loopback, private (RFC 1918, ULA),
/// link-local, CGNAT, unspecified, broadcast, multicast, reserved (0/8, 240/4, 192.0.0/24,
/// 198.18/15), nor such an address inside IPv4-mapped, NAT64 or 6to4 form. The
/// documentation ranges are public here (they route nowhere; the test world uses them).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => public_v4(v4),
        IpAddr::V6(v6) => public_v6(v6),
    }
}

fn public_v4(a: Ipv4Addr) -> bool {
    let o = a.octets();
    !(a.is_private()
        || a.is_loopback()
        || a.is_link_local()
        || a.is_broadcast()
        || a.is_unspecified()
        || a.is_multicast()
        || o[0] == 0
        || o[0] >= 240
        || (o[0] == 100 && (o[1] & 0xc0) == 64)
        || (o[0] == 192 && o[1] == 0 && o[2] == 0)
        || (o[0] == 198 && (o[1] & 0xfe) == 18))
}

fn public_v6(a: Ipv6Addr) -> bool {
    if let Some(v4) = a.to_ipv4_mapped() {
        return public_v4(v4);
    }
    let s = a.segments();
    let embedded =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) carry an IPv4 address.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        return public_v4(embedded(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return public_v4(embedded(s[1], s[2]));
    }
    !(a.is_loopback()
        || a.is_unspecified()
        || a.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xffc0) == 0xfec0
        || (s[0] == 0x100 && s[1..4] == [0, 0, 0]))
}

/// reqwest's resolver for `did:web` hosts.
#[derive(Debug)]
pub struct PublicOnly {
    /// `Some`: ask these nameservers (`front.did_web_nameservers`); `None`: the system's.
    dns: Option<hickory_resolver::TokioResolver>,
}

impl PublicOnly {
    pub fn new(nameservers: &[SocketAddr]) -> PublicOnly {
        if nameservers.is_empty() {
            return PublicOnly { dns: None };
        }
        let servers = nameservers
            .iter()
            .map(|ns| {
                let mut udp = ConnectionConfig::udp();
                udp.port = ns.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = ns.port();
                NameServerConfig::new(ns.ip(), true, vec![udp, tcp])
            })
            .collect();
        let config = ResolverConfig::from_parts(None, Vec::new(), servers);
        let dns = hickory_resolver::Resolver::builder_with_config(
            config,
            TokioRuntimeProvider::default(),
        )
        .build()
        .ok();
        PublicOnly { dns }
    }

    /// The public addresses of `host`, or why there are none.
    pub async fn lookup(&self, host: &str) -> Result<Vec<IpAddr>, String> {
        let all: Vec<IpAddr> = match &self.dns {
            Some(r) => r
                .lookup_ip(format!("{host}."))
                .await
                .map_err(|e| format!("resolving {host}: {e}"))?
                .iter()
                .collect(),
            None => tokio::net::lookup_host((host, 0))
                .await
                .map_err(|e| format!("resolving {host}: {e}"))?
                .map(|a| a.ip())
                .collect(),
        };
        let public: Vec<IpAddr> = all.iter().copied().filter(|ip| is_public(*ip)).collect();
        if public.is_empty() {
            return Err(if all.is_empty() {
                format!("{host} has no address")
            } else {
                format!(
                    "{host} resolves to no public address; did:web documents are fetched only from the internet"
                )
            });
        }
        Ok(public)
    }
}

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        let dns = self.dns.clone();
        Box::pin(async move {
            let me = PublicOnly { dns };
            let ips = me
                .lookup(&host)
                .await
                .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { e.into() })?;
            let addrs: reqwest::dns::Addrs =
                Box::new(ips.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_internet_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "240.0.0.1",
            "224.0.0.1",
            "192.0.0.8",
            "198.18.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "2002:a00:1::",
            "100::1",
            "169.254.20.10",
            "10.255.255.1",
        ] {
            assert!(
                !is_public(private.parse().unwrap()),
                "{private} counted as public"
            );
        }
        for public in [
            "1.1.1.1",
            "203.0.113.7",
            "198.51.100.11",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2001:db8::10",
        ] {
            assert!(
                is_public(public.parse().unwrap()),
                "{public} counted as private"
            );
        }
    }
}
