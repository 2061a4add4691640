//! A local node's network, as a rented guest behind user-mode NAT has it (pasta, slirp, a
//! cloud's NAT gateway): the node's namespace with `eth0` at 10.0.2.15/24 -- the same
//! address for every node, as slirp guests have -- behind a gateway namespace of its own at
//! 10.0.2.2 that masquerades it out of one link to the provider's machine
//! (`<a>.<b>.<i>.2/24` there, the machine `.1`). The gateway drops every new connection that
//! comes in from the machine's side: a node reaches out (the broker's public endpoints, other
//! nodes' NAT'd addresses, the internet through the machine), nothing reaches in. The
//! provider's machine masquerades its guests once more out of its own uplink.
//!
//! ```text
//!   node <prefix>n<i>          gateway <prefix>g<i>                 provider machine
//!   eth0 10.0.2.15/24 ──── lan 10.0.2.2/24 │ wan <a>.<b>.<i>.2 ──── swh<i> <a>.<b>.<i>.1
//!                          masquerade out of `wan`; new inbound on `wan` dropped
//! ```
//!
//! On a machine with an IPv6 default route the node is dual-stack, NAT'd the same way
//! (as slirp and pasta give guests IPv6 behind the host's address): `fd0a:2::15/64`
//! behind `fd0a:2::2`, the uplink `fd0b:<i>::2/64` to the machine's `fd0b:<i>::1`, and
//! the machine masquerades `fd0b::/16` out of its uplink. A node then reaches IPv6-only
//! and dual-stack endpoints (the broker's `service_addr_v6`) with no NAT64 in between.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// Where `ip netns` keeps its namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// The prefix of the machine's ends of its guests' links.
pub const HOST_LINK: &str = "swh";

/// Every guest's own address, and its gateway's (slirp's defaults).
pub const GUEST_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
pub const GUEST_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);

/// The same on a dual-stack machine (unique local addresses: never routed beyond it).
pub const GUEST_ADDR_V6: Ipv6Addr = Ipv6Addr::new(0xfd0a, 2, 0, 0, 0, 0, 0, 0x15);
pub const GUEST_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfd0a, 2, 0, 0, 0, 0, 0, 2);
/// The /16 the guests' IPv6 uplinks (`fd0b:<i>::/64`) are numbered from.
pub const UPLINKS_V6: Ipv6Addr = Ipv6Addr::new(0xfd0b, 0, 0, 0, 0, 0, 0, 0);

/// A node's network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeNet {
    /// The node's namespace (`<prefix>n<i>`).
    pub netns: String,
    /// Its NAT gateway's namespace (`<prefix>g<i>`).
    pub gateway: String,
    /// The machine's end of the gateway's uplink (`swh<i>`: one local provider per machine,
    /// and interface names are short).
    pub host_link: String,
    pub host_addr: Ipv4Addr,
    /// The gateway's address on the machine's side: the node as the provider's machine
    /// sees it (NAT'd).
    pub node_addr: Ipv4Addr,
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

/// Runs `program args` in namespace `ns`, with `input` on its stdin.
fn in_netns(ns: &str, program: &str, args: &[&str], input: Option<&str>) -> Result<()> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, program])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program} in {ns}"))?;
    if let Some(text) = input {
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(text.as_bytes())?;
    }
    drop(child.stdin.take());
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{program} {} in {ns}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The gateway's NAT, both families: masquerade out of `wan`, and nothing new in from it.
const GATEWAY_NFT: &str = "table inet socialweb-nat {
  chain postrouting { type nat hook postrouting priority srcnat; policy accept; oifname \"wan\" masquerade; }
  chain forward { type filter hook forward priority filter; policy accept; iifname \"wan\" ct state new drop; }
  chain input { type filter hook input priority filter; policy accept; iifname \"wan\" ct state new drop; }
}
";

impl NodeNet {
    /// The network of node slot `i` (1-254) under `prefix` in `subnet` (a /16's base).
    pub fn plan(prefix: &str, subnet: Ipv4Addr, i: u8) -> NodeNet {
        let [a, b, _, _] = subnet.octets();
        NodeNet {
            netns: format!("{prefix}n{i}"),
            gateway: format!("{prefix}g{i}"),
            host_link: format!("{HOST_LINK}{i}"),
            host_addr: Ipv4Addr::new(a, b, i, 1),
            node_addr: Ipv4Addr::new(a, b, i, 2),
        }
    }

    pub fn netns_path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.netns)
    }

    /// Creates it (replacing a leftover of the same name).
    pub fn create(&self) -> Result<()> {
        self.remove();
        let r = self.build();
        if r.is_err() {
            self.remove();
        }
        r
    }

    /// Creates the gateway's namespace alone, with its uplink to the machine and its NAT
    /// table (nothing new in from the machine's side), for a process that is its own NAT
    /// (a VM guest's qemu, whose slirp is the guest's gateway: [`crate::jail`]). Replaces a
    /// leftover of the same name.
    pub fn create_uplink(&self) -> Result<()> {
        self.remove();
        let r = self.build_uplink();
        if r.is_err() {
            self.remove();
        }
        r
    }

    /// The gateway's namespace path.
    pub fn gateway_path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.gateway)
    }

    fn build(&self) -> Result<()> {
        self.build_uplink()?;
        let (g, n) = (self.gateway.as_str(), self.netns.as_str());
        ip(&["netns", "add", n])?;
        let guest_gw = format!("{GUEST_GATEWAY}/24");
        let guest = format!("{GUEST_ADDR}/24");
        let gw = GUEST_GATEWAY.to_string();
        let steps: [&[&str]; 7] = [
            &[
                "-n", g, "link", "add", "lan", "type", "veth", "peer", "name", "eth0", "netns", n,
            ],
            &["-n", g, "addr", "add", &guest_gw, "dev", "lan"],
            &["-n", g, "link", "set", "lan", "up"],
            &["-n", n, "link", "set", "lo", "up"],
            &["-n", n, "addr", "add", &guest, "dev", "eth0"],
            &["-n", n, "link", "set", "eth0", "up"],
            &["-n", n, "route", "add", "default", "via", &gw],
        ];
        for s in steps {
            ip(s)?;
        }
        in_netns(g, "sysctl", &["-q", "-w", "net.ipv4.ip_forward=1"], None)?;
        if machine_has_v6() {
            self.build_v6()?;
        }
        Ok(())
    }

    /// The node's IPv6 side (module docs). Addresses without duplicate detection: the
    /// links are point-to-point and ours, and an address still tentative when the agent
    /// starts would not be bound.
    fn build_v6(&self) -> Result<()> {
        let (g, n, h) = (
            self.gateway.as_str(),
            self.netns.as_str(),
            self.host_link.as_str(),
        );
        let [u, ..] = UPLINKS_V6.segments();
        let slot = self.host_addr.octets()[2] as u16;
        let host = Ipv6Addr::new(u, slot, 0, 0, 0, 0, 0, 1);
        let wan = Ipv6Addr::new(u, slot, 0, 0, 0, 0, 0, 2);
        let (host, wan, hg) = (format!("{host}/64"), format!("{wan}/64"), host.to_string());
        let (guest_gw, guest) = (
            format!("{GUEST_GATEWAY_V6}/64"),
            format!("{GUEST_ADDR_V6}/64"),
        );
        let gw = GUEST_GATEWAY_V6.to_string();
        let steps: [&[&str]; 6] = [
            &["-6", "addr", "add", &host, "dev", h, "nodad"],
            &["-n", g, "-6", "addr", "add", &wan, "dev", "wan", "nodad"],
            &[
                "-n", g, "-6", "route", "add", "default", "via", &hg, "dev", "wan",
            ],
            &[
                "-n", g, "-6", "addr", "add", &guest_gw, "dev", "lan", "nodad",
            ],
            &["-n", n, "-6", "addr", "add", &guest, "dev", "eth0", "nodad"],
            &[
                "-n", n, "-6", "route", "add", "default", "via", &gw, "dev", "eth0",
            ],
        ];
        for s in steps {
            ip(s).context("the node's IPv6")?;
        }
        in_netns(
            g,
            "sysctl",
            &["-q", "-w", "net.ipv6.conf.all.forwarding=1"],
            None,
        )
    }

    /// The gateway's namespace, its uplink and its NAT table.
    fn build_uplink(&self) -> Result<()> {
        let g = self.gateway.as_str();
        ip(&["netns", "add", g])?;
        let host = format!("{}/24", self.host_addr);
        let wan = format!("{}/24", self.node_addr);
        let hg = self.host_addr.to_string();
        let h = self.host_link.as_str();
        let steps: [&[&str]; 7] = [
            &[
                "link", "add", h, "type", "veth", "peer", "name", "wan", "netns", g,
            ],
            &["addr", "add", &host, "dev", h],
            &["link", "set", h, "up"],
            &["-n", g, "link", "set", "lo", "up"],
            &["-n", g, "addr", "add", &wan, "dev", "wan"],
            &["-n", g, "link", "set", "wan", "up"],
            &["-n", g, "route", "add", "default", "via", &hg],
        ];
        for s in steps {
            ip(s)?;
        }
        in_netns(g, "nft", &["-f", "-"], Some(GATEWAY_NFT)).context("the gateway's NAT")
    }

    /// Removes both namespaces (their links go with them, the machine's end with those).
    /// Missing is fine.
    pub fn remove(&self) {
        for ns in [&self.netns, &self.gateway] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_link])
            .output();
    }

    /// Whether the node's namespace exists.
    pub fn exists(&self) -> bool {
        self.netns_path().exists()
    }
}

/// The provider machine's side of its guests' NAT: forwarding on, and the guests' uplinks
/// (`subnet`/16) masqueraded out of every other interface. Idempotent (the table is
/// replaced).
pub fn machine_nat(prefix: &str, subnet: Ipv4Addr) -> Result<()> {
    let links = HOST_LINK;
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
        .context("enabling net.ipv4.ip_forward on the provider's machine")?;
    let table = format!(
        "sw_provider_{}",
        prefix
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect::<String>()
    );
    let rules = format!(
        "table ip {table} {{}}\ndelete table ip {table}\ntable ip {table} {{\n  chain postrouting {{ type nat hook postrouting priority srcnat; policy accept; ip saddr {subnet}/16 oifname != \"{links}*\" masquerade; }}\n}}\n"
    );
    nft_apply(&rules, "the guests' NAT")?;
    if machine_has_v6() {
        machine_nat_v6(&table)?;
    }
    Ok(())
}

/// Whether this machine has an IPv6 default route: its namespace nodes are then dual-stack.
pub fn machine_has_v6() -> bool {
    Command::new("ip")
        .args(["-6", "route", "show", "default"])
        .output()
        .is_ok_and(|o| o.status.success() && !o.stdout.trim_ascii().is_empty())
}

/// The IPv6 side of [`machine_nat`]: forwarding on, and the guests' IPv6 uplinks
/// masqueraded out of every other interface. Forwarding makes the kernel ignore router
/// advertisements on interfaces that took them (`accept_ra` 1), which would cost a machine
/// configured by SLAAC its own default route: those are set to 2 (take them anyway) first.
fn machine_nat_v6(table: &str) -> Result<()> {
    let conf = std::path::Path::new("/proc/sys/net/ipv6/conf");
    for e in std::fs::read_dir(conf).context("reading /proc/sys/net/ipv6/conf")? {
        let ra = e?.path().join("accept_ra");
        if std::fs::read_to_string(&ra).is_ok_and(|v| v.trim() == "1") {
            std::fs::write(&ra, "2").with_context(|| format!("setting {}", ra.display()))?;
        }
    }
    std::fs::write("/proc/sys/net/ipv6/conf/all/forwarding", "1")
        .context("enabling IPv6 forwarding on the provider's machine")?;
    let links = HOST_LINK;
    let rules = format!(
        "table ip6 {table} {{}}\ndelete table ip6 {table}\ntable ip6 {table} {{\n  chain postrouting {{ type nat hook postrouting priority srcnat; policy accept; ip6 saddr {UPLINKS_V6}/16 oifname != \"{links}*\" masquerade; }}\n}}\n"
    );
    nft_apply(&rules, "the guests' IPv6 NAT")
}

/// Applies an nftables ruleset in this network namespace (`nft -f -`, one transaction);
/// `what` names it in errors.
pub fn nft_apply(rules: &str, what: &str) -> Result<()> {
    use std::io::Write;
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running nft (nftables) for {what}"))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(rules.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft: {what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_get_their_own_uplink_and_share_the_guest_address() {
        let n = NodeNet::plan("swn-", Ipv4Addr::new(172, 30, 0, 0), 7);
        assert_eq!(n.netns, "swn-n7");
        assert_eq!(n.gateway, "swn-g7");
        assert_eq!(n.host_link, "swh7");
        assert_eq!(n.host_addr, Ipv4Addr::new(172, 30, 7, 1));
        assert_eq!(n.node_addr, Ipv4Addr::new(172, 30, 7, 2));
        assert_eq!(GUEST_ADDR, Ipv4Addr::new(10, 0, 2, 15));
    }
}
