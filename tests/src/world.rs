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
//! [`World::dual_stack`] adds IPv6 beside it: `2001:db8:203::1` for the operator, `::fe` the
//! router, and `2001:db8:198::/64` on the providers' bridge.
//!
//! Documentation prefixes (RFC 5737, RFC 3849) throughout, so no address here is anyone's on
//! a real network.

use std::net::{Ipv4Addr, Ipv6Addr};

use anyhow::{Context, Result};

use crate::link;
use crate::netns::Netns;
use crate::process::Spawned;

/// The operator's host: the broker's public address.
pub const OPERATOR_ADDR: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// The operator's host's own address behind a 1:1 NAT ([`World::behind_one_to_one_nat`]):
/// the only one on its interface; the internet maps [`OPERATOR_ADDR`] to it.
pub const OPERATOR_PRIVATE_ADDR: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
/// The operator's host's IPv6 address in a dual-stack world ([`World::dual_stack`]), on its
/// interface as clouds give one (RFC 3849's documentation prefix).
pub const OPERATOR_ADDR_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x203, 0, 0, 0, 0, 1);
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

/// Provider machine `i`'s IPv6 address in a dual-stack world.
pub fn provider_addr_v6(i: u8) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0x198, 0, 0, 0, 0, 10 + u16::from(i))
}

/// Broker host `i`'s address (1-based) in a fleet ([`World::fleet`]): RFC 2544's
/// benchmarking range, the documentation ranges being taken.
pub fn host_addr(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, 10 + i)
}

/// Another broker host of the operator's, on the internet ([`World::fleet`]).
#[derive(Debug)]
pub struct HostMachine {
    pub ns: Netns,
    pub index: u8,
    pub addr: Ipv4Addr,
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
    pub hosts: Vec<HostMachine>,
    pub providers: Vec<ProviderMachine>,
    pub operator: Netns,
    /// The address the operator's host has on its interface: [`OPERATOR_ADDR`], or
    /// [`OPERATOR_PRIVATE_ADDR`] behind a 1:1 NAT.
    pub operator_addr: Ipv4Addr,
    /// [`OPERATOR_ADDR_V6`] in a dual-stack world.
    pub operator_addr_v6: Option<Ipv6Addr>,
    _resolver: Spawned,
    pub internet: Netns,
}

impl World {
    /// The internet, the operator's host, and `providers` provider machines.
    pub fn new(providers: u8) -> Result<World> {
        World::build(providers, false, false)
    }

    /// The same world with IPv6 beside IPv4 on the internet: the operator's host has
    /// [`OPERATOR_ADDR_V6`] on its interface, each provider machine [`provider_addr_v6`],
    /// and every one an IPv6 default route (so the providers' nodes are dual-stack).
    pub fn dual_stack(providers: u8) -> Result<World> {
        World::build(providers, false, true)
    }

    /// The same world with the operator's host behind a cloud's 1:1 NAT (an elastic or
    /// floating IP): its interface has [`OPERATOR_PRIVATE_ADDR`] only, and the internet maps
    /// [`OPERATOR_ADDR`] to it both ways (destination in, source out). Nothing reaches the
    /// private address except through the mapping, as from outside a cloud.
    pub fn behind_one_to_one_nat(providers: u8) -> Result<World> {
        World::build(providers, true, false)
    }

    /// The same world with `hosts` more broker hosts of the operator's, each its own
    /// namespace on a link of the internet's (`198.18.0.0/24`, [`host_addr`]): a fleet
    /// sharing the operator's host's PostgreSQL.
    pub fn fleet(hosts: u8, providers: u8) -> Result<World> {
        let mut world = World::build(providers, false, false)?;
        link::bridge(&world.internet, "hb", Some("198.18.0.254/24"))?;
        for index in 1..=hosts {
            let ns = Netns::new(&format!("host{index}"))?;
            let port = format!("h{index}");
            link::veth(&world.internet, &port, &ns, "eth0")?;
            link::attach(&world.internet, &port, "hb")?;
            let addr = host_addr(index);
            link::addr(&ns, "eth0", &format!("{addr}/24"))?;
            link::route(&ns, "default", Some("198.18.0.254"), None)?;
            world.hosts.push(HostMachine { ns, index, addr });
        }
        Ok(world)
    }

    fn build(providers: u8, nat: bool, v6: bool) -> Result<World> {
        let internet = Netns::new("internet")?;
        link::sysctl(&internet, "net.ipv4.ip_forward", "1")?;
        link::addr(&internet, "lo", &format!("{RESOLVER_ADDR}/32"))?;
        link::addr(&internet, "lo", &format!("{USERS_ADDR}/32"))?;
        let operator = Netns::new("operator")?;
        link::veth(&internet, "op", &operator, "eth0")?;
        let operator_addr = if nat {
            link::addr(&internet, "op", "10.200.0.254/24")?;
            link::addr(&operator, "eth0", &format!("{OPERATOR_PRIVATE_ADDR}/24"))?;
            link::route(&operator, "default", Some("10.200.0.254"), None)?;
            // The cloud's router knows where the public address lives (its own sockets need
            // a route before the mapping rewrites their destination).
            link::route(&internet, &format!("{OPERATOR_ADDR}/32"), None, Some("op"))?;
            let (public, private) = (OPERATOR_ADDR, OPERATOR_PRIVATE_ADDR);
            let rules = format!(
                "table ip one_to_one {{\n\
                 chain prerouting {{ type nat hook prerouting priority -100; ip daddr {public} dnat to {private}; }}\n\
                 chain output {{ type nat hook output priority -100; ip daddr {public} dnat to {private}; }}\n\
                 chain postrouting {{ type nat hook postrouting priority 100; ip saddr {private} snat to {public}; }}\n\
                 chain forward {{ type filter hook forward priority 0; policy accept; \
                 oifname \"op\" ct status dnat accept; oifname \"op\" ct state established,related accept; \
                 oifname \"op\" drop; }}\n\
                 }}\n"
            );
            internet
                .exec_with_stdin("nft", &["-f", "-"], rules.as_bytes())
                .context("the 1:1 NAT's rules")?;
            private
        } else {
            link::addr(&internet, "op", "203.0.113.254/24")?;
            link::addr(&operator, "eth0", &format!("{OPERATOR_ADDR}/24"))?;
            link::route(&operator, "default", Some("203.0.113.254"), None)?;
            OPERATOR_ADDR
        };
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
        if v6 {
            World::add_v6(&internet, &operator, &machines)?;
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
        let world = World {
            hosts: Vec::new(),
            providers: machines,
            operator,
            operator_addr,
            operator_addr_v6: v6.then_some(OPERATOR_ADDR_V6),
            _resolver: resolver,
            internet,
        };
        // Provider machines NAT their guests as the common kinds of NAT do: odd ones like a
        // home router, even ones like a cloud's NAT gateway.
        for p in 1..=providers {
            let nat = if p % 2 == 1 {
                Nat::EndpointIndependent
            } else {
                Nat::Symmetric
            };
            world.set_nat(p, nat, GUEST_SUBNET)?;
        }
        Ok(world)
    }
}

impl World {
    /// IPv6 on the internet's links: `2001:db8:203::/64` to the operator's host,
    /// `2001:db8:198::/64` on the providers' bridge, the router `::fe` on each. No duplicate
    /// address detection: the links are ours, and a tentative address cannot be bound.
    fn add_v6(internet: &Netns, operator: &Netns, machines: &[ProviderMachine]) -> Result<()> {
        link::sysctl(internet, "net.ipv6.conf.all.forwarding", "1")?;
        let addr = |ns: &Netns, dev: &str, a: String| {
            ns.ip(&["-6", "addr", "add", &a, "dev", dev, "nodad"])
        };
        addr(internet, "op", "2001:db8:203::fe/64".into())?;
        addr(operator, "eth0", format!("{OPERATOR_ADDR_V6}/64"))?;
        operator.ip(&["-6", "route", "add", "default", "via", "2001:db8:203::fe"])?;
        addr(internet, "pv", "2001:db8:198::fe/64".into())?;
        for m in machines {
            addr(&m.ns, "eth0", format!("{}/64", provider_addr_v6(m.index)))?;
            m.ns.ip(&["-6", "route", "add", "default", "via", "2001:db8:198::fe"])?;
        }
        Ok(())
    }
}

/// How a provider machine's NAT maps and filters its guests' flows (RFC 4787's terms).
/// Either way new inbound UDP is dropped (filtering is address- and port-dependent: a reply
/// passes only to a mapping that sent to its source), as a NAT that serves nothing does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nat {
    /// Endpoint-independent mapping, as most home routers and some cloud NATs do: a guest's
    /// flows from one port leave from one public address and port whatever their destination
    /// (the guest's port is kept), so the address a relay observes is the one a peer can
    /// answer to. Emulated with a public address of its own per guest slot.
    EndpointIndependent,
    /// Endpoint-dependent ("symmetric") mapping, as AWS's NAT gateway does: every new
    /// destination gets a new random public port, so the address a relay observes is not the
    /// one a peer's packets would have to reach.
    Symmetric,
}

impl Nat {
    pub fn label(self) -> &'static str {
        match self {
            Nat::EndpointIndependent => "eim",
            Nat::Symmetric => "symmetric",
        }
    }
}

/// Guest slots a provider machine's NAT is set up for (its nodes' uplinks `<subnet>.<slot>.2`).
pub const NAT_SLOTS: u8 = 16;

/// The public address [`Nat::EndpointIndependent`] gives provider `provider`'s guest slot.
pub fn nat_addr(provider: u8, slot: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 51, 100, 100 + 20 * (provider - 1) + slot)
}

impl World {
    /// Makes provider machine `provider`'s NAT behave as `nat` for guests whose uplinks are
    /// in `subnet`/16 (a local provider's node slots, `socialweb_provider::network`): a
    /// table that maps before the provider's own masquerade does (a NAT chain of higher
    /// priority binds a flow first), and drops new inbound UDP.
    pub fn set_nat(&self, provider: u8, nat: Nat, subnet: Ipv4Addr) -> Result<()> {
        let m = &self.providers[usize::from(provider) - 1];
        let [a, b, _, _] = subnet.octets();
        let mapping = match nat {
            Nat::Symmetric => {
                format!("ip saddr {subnet}/16 oifname \"eth0\" masquerade fully-random\n")
            }
            Nat::EndpointIndependent => {
                let mut rules = String::new();
                for slot in 1..=NAT_SLOTS {
                    let public = nat_addr(provider, slot);
                    m.ns.ip(&["addr", "replace", &format!("{public}/24"), "dev", "eth0"])?;
                    rules.push_str(&format!(
                        "ip saddr {a}.{b}.{slot}.2 oifname \"eth0\" snat ip to {public}\n"
                    ));
                }
                rules
            }
        };
        let script = format!(
            "table ip sw-world-nat {{}}\ndelete table ip sw-world-nat\n\
             table ip sw-world-nat {{\n\
             chain postrouting {{ type nat hook postrouting priority srcnat - 10; policy accept;\n{mapping} }}\n\
             chain input {{ type filter hook input priority filter; policy accept; iifname \"eth0\" meta l4proto udp ct state new drop; }}\n\
             chain forward {{ type filter hook forward priority filter; policy accept; iifname \"eth0\" meta l4proto udp ct state new drop; }}\n\
             }}\n"
        );
        m.ns.exec_with_stdin("nft", &["-f", "-"], script.as_bytes())
            .with_context(|| format!("provider {provider}'s NAT ({nat:?})"))?;
        Ok(())
    }
}

/// A node's network behind a provider machine, as the provider's local nodes have it
/// (`socialweb_provider::network`: the guest at 10.0.2.15 behind a NAT gateway of its own,
/// behind the machine's NAT), for a mesh without Kubernetes. Dropping it removes it.
#[derive(Debug)]
pub struct Guest {
    // Field order is drop order: the node, then its gateway (the machine's end of the
    // uplink goes with the gateway).
    pub ns: Netns,
    _gateway: Netns,
    pub provider: u8,
    pub slot: u8,
}

/// The guests' uplink subnet (`<a>.<b>.<slot>.0/24` per slot), the local provider's default.
pub const GUEST_SUBNET: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 0);

impl World {
    /// Builds guest slot `slot` behind provider machine `provider`, with the machine's side
    /// of the guests' NAT (forwarding, masquerade) as the provider does it.
    pub fn guest(&self, provider: u8, slot: u8) -> Result<Guest> {
        use socialweb_provider::network::{NodeNet, machine_nat};
        let m = &self.providers[usize::from(provider) - 1];
        let prefix = format!("{}-", crate::netns::unique_name(&format!("p{provider}")));
        let net = NodeNet::plan(&prefix, GUEST_SUBNET, slot);
        m.ns.run(|| -> Result<()> {
            machine_nat(&prefix, GUEST_SUBNET)?;
            net.create()
        })?
        .with_context(|| format!("guest {slot} of provider {provider}"))?;
        Ok(Guest {
            ns: Netns::adopt(&net.netns)?,
            _gateway: Netns::adopt(&net.gateway)?,
            provider,
            slot,
        })
    }
}
