//! Where the broker is reached: the top-level `service_addr`, `advertise_addr` and their
//! IPv6 twins, what they must be, and the addresses and URLs made from them (the front's,
//! the fleet link's, the broker's DID).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::{Config, ConfigError, err};

/// Whether a node elsewhere can reach `a`: not unspecified, loopback, link-local (it needs
/// a zone) or multicast.
fn reachable_v6(a: Ipv6Addr) -> bool {
    !(a.is_unspecified() || a.is_loopback() || a.is_unicast_link_local() || a.is_multicast())
}

impl Config {
    /// The addresses nodes are told the broker is at, both families.
    pub(super) fn check_service_addrs(
        &self,
        o: &impl Fn(&str) -> String,
    ) -> Result<(), ConfigError> {
        if IpAddr::V4(self.service_addr).is_unspecified() {
            return Err(err(
                &o("service_addr"),
                "must be a specific address nodes can reach",
            ));
        }
        if let Some(a) = self.advertise_addr
            && (a.is_unspecified() || a.is_loopback())
        {
            return Err(err(
                &o("advertise_addr"),
                format!("{a} is not an address nodes can reach"),
            ));
        }
        for (key, a) in [
            ("service_addr_v6", self.service_addr_v6),
            ("advertise_addr_v6", self.advertise_addr_v6),
        ] {
            if let Some(a) = a
                && !reachable_v6(a)
            {
                return Err(err(
                    &o(key),
                    format!(
                        "{a} is not an address nodes can reach (unspecified, loopback, \
                         link-local or multicast)"
                    ),
                ));
            }
        }
        if self.advertise_addr_v6.is_some() && self.service_addr_v6.is_none() {
            return Err(err(
                &o("advertise_addr_v6"),
                "is set without service_addr_v6, the address it is forwarded to",
            ));
        }
        Ok(())
    }

    /// Where the front binds: `front.listen`, except that all IPv4 addresses become all
    /// addresses of both families when the host has `service_addr_v6`.
    pub fn front_bind(&self) -> SocketAddr {
        match self.front.listen {
            SocketAddr::V4(a) if a.ip().is_unspecified() && self.service_addr_v6.is_some() => {
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), a.port())
            }
            a => a,
        }
    }

    /// Where this host's fleet link listens (`fleet.link_port` on `service_addr`).
    pub fn link_bind(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.service_addr), self.fleet.link_port)
    }

    /// The URL other hosts of the fleet reach this host's link at.
    pub fn link_url(&self) -> String {
        format!(
            "https://{}:{}",
            self.advertised_addr(),
            self.fleet.link_port
        )
    }

    /// The URL kubeconfigs name the front by.
    pub fn front_url(&self) -> String {
        self.front.public_url.clone().unwrap_or_else(|| {
            format!(
                "https://{}:{}",
                self.advertised_addr(),
                self.front.listen.port()
            )
        })
    }

    /// Where nodes and users are told the broker is: `advertise_addr`, else `service_addr`.
    pub fn advertised_addr(&self) -> Ipv4Addr {
        self.advertise_addr.unwrap_or(self.service_addr)
    }

    /// The IPv6 address nodes are told, if the host has one: `advertise_addr_v6`, else
    /// `service_addr_v6`.
    pub fn advertised_addr_v6(&self) -> Option<Ipv6Addr> {
        self.advertise_addr_v6.or(self.service_addr_v6)
    }

    /// The DID service-auth tokens must be addressed to.
    pub fn service_did(&self) -> String {
        self.front.service_did.clone().unwrap_or_else(|| {
            let host = url::Url::parse(&self.front_url())
                .ok()
                .and_then(|u| {
                    u.host_str().map(|h| match u.port() {
                        Some(p) => format!("{h}%3A{p}"),
                        None => h.to_string(),
                    })
                })
                .unwrap_or_default();
            format!("did:web:{host}")
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn ipv6_addresses_must_be_reachable_and_make_the_front_listen_on_both_families() {
        let dir = std::env::temp_dir().join(format!("sw-cfg6-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("broker.toml");
        let load = |text: &str| {
            std::fs::write(&f, text).unwrap();
            Config::load(Some(&f), |_| None)
        };
        let c = load("service_addr_v6 = \"2001:db8::1\"\n").unwrap();
        assert_eq!(c.advertised_addr_v6(), Some("2001:db8::1".parse().unwrap()));
        assert_eq!(c.front_bind(), "[::]:8443".parse().unwrap());
        let c = load("service_addr_v6 = \"2001:db8::1\"\n[front]\nlisten = \"192.0.2.1:443\"\n");
        assert_eq!(c.unwrap().front_bind(), "192.0.2.1:443".parse().unwrap());
        assert_eq!(
            Config::default().front_bind(),
            "0.0.0.0:8443".parse().unwrap()
        );
        for bad in ["::", "::1", "fe80::1", "ff02::1"] {
            let e = load(&format!("service_addr_v6 = \"{bad}\"\n")).unwrap_err();
            assert_eq!(e.source_name, "service_addr_v6", "{bad}: {e}");
            assert!(e.problem.contains(bad), "{e}");
        }
        let e = load("advertise_addr_v6 = \"2001:db8::9\"\n").unwrap_err();
        assert_eq!(e.source_name, "advertise_addr_v6", "{e}");
        let c = load("service_addr_v6 = \"fd00::1\"\nadvertise_addr_v6 = \"2001:db8::9\"\n");
        assert_eq!(
            c.unwrap().advertised_addr_v6(),
            Some("2001:db8::9".parse().unwrap())
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
