//! What a VM guest may reach of its provider's machine: nothing but the internet. qemu runs
//! as an unprivileged user of its own ([`VM_USER`], `-runas`), and the machine's nftables
//! let that user's sockets -- which carry every connection the guest makes through qemu's
//! user-mode NAT -- reach only public unicast addresses of other machines, the machine's own
//! resolvers on port 53 (the guest's DNS), and what the operator adds
//! (`local_provider.vm.egress_allow`). Not the machine's own addresses (its loopback, which
//! slirp's 10.0.2.2 is, and its public ones: what listens there is behind no cloud firewall
//! from inside), its private networks, link-local (a cloud's metadata service at
//! 169.254.169.254), CGNAT or multicast. A provider that shares its machine with the broker
//! (the embedded one) lists the machine's public address in `egress_allow`.
//!
//! Firecracker's jailer also gives each guest its own network, mount namespace and cgroup;
//! those are not done yet (docs/security.md says what is).

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::{Context, Result, bail};
use ipnet::Ipv4Net;

/// The user qemu runs as after it has opened its disks and devices.
pub const VM_USER: &str = "socialweb-vm";

/// The nftables table of the rules (inet family, in the provider's network namespace).
pub const TABLE: &str = "socialweb-vm-egress";

/// IPv4 ranges that are not the public internet (RFC 6890's special-purpose registry, less
/// the documentation ranges, which stand for public addresses in examples and tests).
pub const NOT_PUBLIC: [&str; 10] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
];

/// The ruleset for `uid`, pure: replaces the table as a whole (one `nft -f` transaction).
pub fn ruleset(uid: u32, resolvers: &[Ipv4Addr], allow: &[Ipv4Net]) -> String {
    let set = |xs: Vec<String>| {
        if xs.is_empty() {
            String::new()
        } else {
            format!("elements = {{ {} }}", xs.join(", "))
        }
    };
    let resolvers = set(resolvers.iter().map(|r| r.to_string()).collect());
    let allow = set(allow.iter().map(|a| a.to_string()).collect());
    let not_public = set(NOT_PUBLIC.iter().map(|s| s.to_string()).collect());
    // Only the VMs' user's packets enter `guest`: a packet with no socket (a reset, an ICMP
    // error, neighbour discovery) has no owner, so `skuid != uid accept` would have sent it
    // down the refusals; `skuid uid jump` leaves it alone.
    format!(
        "table inet {TABLE}\n\
         delete table inet {TABLE}\n\
         table inet {TABLE} {{\n\
         \x20 set resolvers {{ type ipv4_addr; {resolvers} }}\n\
         \x20 set allowed {{ type ipv4_addr; flags interval; {allow} }}\n\
         \x20 set not_public {{ type ipv4_addr; flags interval; {not_public} }}\n\
         \x20 chain output {{\n\
         \x20   type filter hook output priority filter; policy accept;\n\
         \x20   meta skuid {uid} jump guest\n\
         \x20 }}\n\
         \x20 chain guest {{\n\
         \x20   ip daddr @resolvers udp dport 53 accept\n\
         \x20   ip daddr @resolvers tcp dport 53 accept\n\
         \x20   ip daddr @allowed accept\n\
         \x20   fib daddr type local goto refuse\n\
         \x20   ip daddr != @not_public accept\n\
         \x20   ip6 daddr 2000::/3 accept\n\
         \x20   goto refuse\n\
         \x20 }}\n\
         \x20 chain refuse {{\n\
         \x20   meta l4proto tcp reject with tcp reset\n\
         \x20   reject\n\
         \x20 }}\n\
         }}\n"
    )
}

/// The IPv4 nameservers of a resolv.conf.
pub fn nameservers(resolv_conf: &str) -> Vec<Ipv4Addr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse().ok())
        .collect()
}

/// [`VM_USER`]'s uid, the user made (a system user, no home, no shell) if it is missing.
pub fn vm_user() -> Result<u32> {
    let uid = || -> Option<u32> {
        let o = Command::new("id").args(["-u", VM_USER]).output().ok()?;
        String::from_utf8_lossy(&o.stdout).trim().parse().ok()
    };
    if let Some(u) = uid() {
        return Ok(u);
    }
    let o = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            VM_USER,
        ])
        .output()
        .context("running useradd to make the VMs' user")?;
    if !o.status.success() {
        bail!(
            "useradd {VM_USER}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    uid().with_context(|| format!("no uid for {VM_USER} after useradd"))
}

/// Installs the rules in this network namespace (replacing an earlier provider's).
pub fn install(uid: u32, allow: &[Ipv4Net]) -> Result<()> {
    let resolvers = nameservers(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default());
    crate::network::nft_apply(&ruleset(uid, &resolvers, allow), "the VMs' egress rules")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_let_the_vm_user_out_to_the_internet_only() {
        let r = ruleset(
            998,
            &["192.0.2.53".parse().unwrap()],
            &["10.1.2.0/24".parse().unwrap()],
        );
        assert!(r.contains("meta skuid 998 jump guest"), "{r}");
        assert!(r.contains("fib daddr type local goto refuse"), "{r}");
        assert!(r.contains("elements = { 192.0.2.53 }"), "{r}");
        assert!(r.contains("elements = { 10.1.2.0/24 }"), "{r}");
        assert!(
            r.contains("127.0.0.0/8") && r.contains("169.254.0.0/16"),
            "{r}"
        );
        // Empty sets have no elements clause (nft refuses `elements = { }`).
        let bare = ruleset(998, &[], &[]);
        assert!(!bare.contains("elements = {  }"), "{bare}");
        assert_eq!(bare.matches("elements").count(), 1, "{bare}");
    }

    #[test]
    fn nameservers_are_read_from_resolv_conf() {
        let conf =
            "# a comment\nnameserver 127.0.0.53\nnameserver  10.0.0.2\nnameserver ::1\nsearch x\n";
        assert_eq!(
            nameservers(conf),
            vec![
                "127.0.0.53".parse::<Ipv4Addr>().unwrap(),
                "10.0.0.2".parse().unwrap()
            ]
        );
    }
}
