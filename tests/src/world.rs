//! The real topology (blueprint, "What runs where in tests"): the operator's host and provider
//! machines, each its own network namespace, joined through an "internet" router; each
//! provider's nodes behind NAT inside it (the provider crate builds them: they reach out,
//! nothing reaches in). The broker's public address is the only thing on the operator's host
//! a node can reach; a resolver on the internet stands in for a public DNS server.
//!
//! ```text
//!   operator 203.0.113.1/24 ─┐                     ┌─ provider 1 198.51.100.11/24
//!                            ├── internet router ──┤  provider 2 198.51.100.12/24 ...
//!        203.0.113.254/24 ───┘   192.0.2.53 (DNS)  └── 198.51.100.254/24 (a bridge)
//! ```
//!
//! Documentation prefixes (RFC 5737) throughout, so no address here is anyone's on a real
//! network.

use std::net::Ipv4Addr;

use anyhow::Result;

use crate::link;
use crate::netns::Netns;
use crate::process::Spawned;

/// The operator's host: the broker's public address.
pub const OPERATOR_ADDR: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// The internet's resolver (dnsmasq, answering `example.test`).
pub const RESOLVER_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 53);
/// Where users' own servers are on the internet (a did:web document host): the resolver
/// answers `users.example.test` and every name under it with this.
pub const USERS_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 80);
pub const USERS_DOMAIN: &str = "users.example.test";
/// Names the resolver answers with addresses no DID document may be fetched from.
pub const LOOPBACK_NAME: &str = "loopback.example.test";
pub const PRIVATE_NAME: &str = "private.example.test";

/// What the resolver answers for `example.test`.
pub const EXAMPLE_A: &str = "192.0.2.10";
pub const EXAMPLE_AAAA: &str = "2001:db8::10";

/// Provider machine `i`'s public address (1-based).
pub fn provider_addr(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 51, 100, 10 + i)
}

/// A provider machine.
#[derive(Debug)]
pub struct ProviderMachine {
    pub ns: Netns,
    pub index: u8,
    pub addr: Ipv4Addr,
}

/// The whole world. Dropping it removes every namespace (providers first).
#[derive(Debug)]
pub struct World {
    // Field order is drop order.
    pub providers: Vec<ProviderMachine>,
    pub operator: Netns,
    _resolver: Spawned,
    pub internet: Netns,
}

impl World {
    /// The internet, the operator's host, and `providers` provider machines.
    pub fn new(providers: u8) -> Result<World> {
        let internet = Netns::new("internet")?;
        link::sysctl(&internet, "net.ipv4.ip_forward", "1")?;
        link::addr(&internet, "lo", &format!("{RESOLVER_ADDR}/32"))?;
        link::addr(&internet, "lo", &format!("{USERS_ADDR}/32"))?;
        let operator = Netns::new("operator")?;
        link::veth(&internet, "op", &operator, "eth0")?;
        link::addr(&internet, "op", "203.0.113.254/24")?;
        link::addr(&operator, "eth0", &format!("{OPERATOR_ADDR}/24"))?;
        link::route(&operator, "default", Some("203.0.113.254"), None)?;
        link::bridge(&internet, "pv", Some("198.51.100.254/24"))?;
        let mut machines = Vec::new();
        for index in 1..=providers {
            let ns = Netns::new(&format!("provider{index}"))?;
            let port = format!("p{index}");
            link::veth(&internet, &port, &ns, "eth0")?;
            link::attach(&internet, &port, "pv")?;
            let addr = provider_addr(index);
            link::addr(&ns, "eth0", &format!("{addr}/24"))?;
            link::route(&ns, "default", Some("198.51.100.254"), None)?;
            machines.push(ProviderMachine { ns, index, addr });
        }
        let resolver = crate::resolver::dnsmasq(
            &internet,
            RESOLVER_ADDR,
            &[
                &format!("--address=/example.test/{EXAMPLE_A}"),
                &format!("--address=/example.test/{EXAMPLE_AAAA}"),
                &format!("--address=/{USERS_DOMAIN}/{USERS_ADDR}"),
                &format!("--address=/{LOOPBACK_NAME}/127.0.0.1"),
                &format!("--address=/{LOOPBACK_NAME}/::1"),
                &format!("--address=/{PRIVATE_NAME}/10.1.2.3"),
                &format!("--address=/{PRIVATE_NAME}/fd00::1"),
            ],
        )?;
        Ok(World {
            providers: machines,
            operator,
            _resolver: resolver,
            internet,
        })
    }
}
