//! A VM guest's jail, as Firecracker's jailer builds one, for qemu. Each guest's qemu runs
//!
//! - as a uid of its own ([`UID_BASE`] + the lease's slot, `-runas uid:gid`; no passwd
//!   entry), once it has opened its disks and devices: a guest that escaped qemu cannot
//!   signal, trace or open another guest's qemu;
//! - chrooted (`-chroot`) into an empty directory of root's, in a mount namespace of its
//!   own: the only file there is the resolv.conf slirp reads for the guest's DNS;
//! - in a network namespace of its own, whose one link is a veth to the provider's machine
//!   (the uplink of a namespace machine's gateway, [`crate::network::NodeNet`]): its
//!   loopback -- slirp's 10.0.2.2 -- its abstract sockets and its interfaces are its own,
//!   and nothing listens there;
//! - in a cgroup with the RFP's memory (and qemu's own), its CPUs and a pids budget
//!   ([`budget`]);
//! - under qemu's seccomp filter (`-sandbox`, [`crate::vm::qemu_args`]).
//!
//! The machine's nftables let what comes in on the guests' links reach only public unicast
//! addresses of other machines, the machine's resolvers on port 53, and what the operator
//! adds (`local_provider.vm.egress_allow`). Not the machine's own addresses (what listens
//! there is behind no cloud firewall from inside), other guests, private networks,
//! link-local (a cloud's metadata service at 169.254.169.254), CGNAT or multicast. A
//! provider that shares its machine with the broker (the embedded one) lists the machine's
//! public address in `egress_allow`.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use ipnet::Ipv4Net;
use socialweb_market::NodeSpec;
use socialweb_proc::cgroup::{Budget, Cgroup};

use crate::network::{HOST_LINK, NodeNet};

/// The first of the guests' uids (slot 1 is `UID_BASE + 1`): far above any range a
/// distribution or a container runtime hands out.
pub const UID_BASE: u32 = 2_000_000_000;

/// The nftables table of the rules (inet family, in the provider's network namespace).
pub const TABLE: &str = "socialweb-vm-egress";

/// What qemu itself takes beside the guest's memory: its own heap and, under TCG, the
/// translated code (`-accel tcg,tb-size`, [`TCG_TB_MIB`]).
pub const OVERHEAD_MIB: u64 = 256;

/// TCG's translation cache, bounded so the budget holds it (qemu's default is 1 GiB on a
/// large host).
pub const TCG_TB_MIB: u64 = 256;

/// Processes and threads in a guest's cgroup: qemu's vCPU, I/O and worker threads.
pub const PIDS_MAX: u64 = 256;

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

/// The budget of a guest of `spec`: its memory and qemu's, its vCPUs and a quarter of a
/// CPU for qemu's I/O thread and slirp, [`PIDS_MAX`].
pub fn budget(spec: &NodeSpec, tcg: bool) -> Budget {
    let tb = if tcg { TCG_TB_MIB } else { 0 };
    Budget {
        memory_bytes: Some((spec.mem_mib + OVERHEAD_MIB + tb) << 20),
        pids: Some(PIDS_MAX),
        cpu_millis: Some(spec.vcpu as u64 * 1000 + 250),
    }
}

/// The ruleset, pure: replaces the table as a whole (one `nft -f` transaction). `subnet`
/// is the guests' uplinks' /16 (other guests).
pub fn ruleset(subnet: Ipv4Net, resolvers: &[Ipv4Addr], allow: &[Ipv4Net]) -> String {
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
    // Input (to the machine) and forward (through it) alike: what a guest sends reaches
    // the machine on its link. IPv6 falls to the refusals (the guests' links carry none).
    format!(
        "table inet {TABLE}\n\
         delete table inet {TABLE}\n\
         table inet {TABLE} {{\n\
         \x20 set resolvers {{ type ipv4_addr; {resolvers} }}\n\
         \x20 set allowed {{ type ipv4_addr; flags interval; {allow} }}\n\
         \x20 set not_public {{ type ipv4_addr; flags interval; {not_public} }}\n\
         \x20 chain input {{\n\
         \x20   type filter hook input priority filter; policy accept;\n\
         \x20   iifname \"{HOST_LINK}*\" jump guest\n\
         \x20 }}\n\
         \x20 chain forward {{\n\
         \x20   type filter hook forward priority filter; policy accept;\n\
         \x20   iifname \"{HOST_LINK}*\" jump guest\n\
         \x20 }}\n\
         \x20 chain guest {{\n\
         \x20   ip daddr @resolvers udp dport 53 accept\n\
         \x20   ip daddr @resolvers tcp dport 53 accept\n\
         \x20   ip daddr {subnet} goto refuse\n\
         \x20   ip daddr @allowed accept\n\
         \x20   fib daddr type local goto refuse\n\
         \x20   ip daddr != @not_public accept\n\
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

/// The resolv.conf guests get (slirp forwards their DNS to its nameservers from their own
/// network namespace): the machine's, unless it names only loopback resolvers, which a
/// guest's namespace does not have; then systemd-resolved's list of its upstreams, where
/// there is one.
pub fn guest_resolv_conf() -> String {
    let main = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let ns = nameservers(&main);
    if !ns.is_empty()
        && ns.iter().all(|a| a.is_loopback())
        && let Ok(upstream) = std::fs::read_to_string("/run/systemd/resolve/resolv.conf")
    {
        return upstream;
    }
    main
}

/// Installs the rules in this network namespace (replacing an earlier provider's).
pub fn install(subnet: Ipv4Addr, allow: &[Ipv4Net]) -> Result<()> {
    let subnet = Ipv4Net::new(subnet, 16).context("the provider's subnet")?;
    let resolvers = nameservers(&guest_resolv_conf());
    crate::network::nft_apply(&ruleset(subnet, &resolvers, allow), "the VMs' egress rules")
}

/// One guest's jail: where and as whom its qemu runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jail {
    /// qemu runs in the gateway namespace of this network (its uplink only).
    pub net: NodeNet,
    /// Its cgroup's name (under every hierarchy the budget needs).
    pub cgroup: String,
    pub uid: u32,
    /// The directory qemu is chrooted into.
    pub root: PathBuf,
}

impl Jail {
    /// The jail of the guest in slot `slot`, whose files are in `dir`.
    pub fn plan(prefix: &str, subnet: Ipv4Addr, slot: u8, dir: &Path) -> Jail {
        Jail {
            net: NodeNet::plan(prefix, subnet, slot),
            cgroup: format!("{prefix}vm{slot}"),
            uid: UID_BASE + slot as u32,
            root: dir.join("root"),
        }
    }

    /// Makes its network, its root and its cgroup (replacing leftovers).
    pub fn create(&self, budget: &Budget) -> Result<Cgroup> {
        self.net.create_uplink().context("the guest's network")?;
        let etc = self.root.join("etc");
        std::fs::create_dir_all(&etc)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(0o755))?;
        std::fs::write(etc.join("resolv.conf"), guest_resolv_conf())?;
        crate::machine::destroy_cgroup(&self.cgroup);
        Cgroup::create(&self.cgroup, budget).context("the guest's cgroup")
    }

    /// qemu's own options for it (after its disks are opened, qemu chroots and drops to
    /// the guest's uid).
    pub fn qemu_args(&self) -> Vec<String> {
        vec![
            "-runas".into(),
            format!("{0}:{0}", self.uid),
            "-chroot".into(),
            self.root.display().to_string(),
        ]
    }

    /// A command that runs `qemu` in the jail's network namespace, a mount namespace of its
    /// own (the machine's mounts and unmounts reach it, nothing goes back) and its cgroup
    /// (entered before qemu starts, so nothing of it runs outside).
    pub fn command(&self, qemu: &Path, cgroup: &Cgroup) -> Command {
        let enter: String = cgroup
            .dirs()
            .iter()
            .map(|d| format!("echo $$ > {}/cgroup.procs && ", d.display()))
            .collect();
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.net.gateway_path().display()))
            .args(["--", "unshare", "--mount", "--propagation", "slave", "--"])
            .args(["sh", "-c", &format!("{enter}exec \"$0\" \"$@\"")])
            .arg(qemu);
        c
    }

    /// Kills what is left in its cgroup and removes the cgroup and the network.
    pub fn remove(&self) {
        crate::machine::destroy_cgroup(&self.cgroup);
        self.net.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_let_the_guests_links_out_to_the_internet_only() {
        let r = ruleset(
            "172.30.0.0/16".parse().unwrap(),
            &["192.0.2.53".parse().unwrap()],
            &["10.1.2.0/24".parse().unwrap()],
        );
        assert!(r.contains("iifname \"swh*\" jump guest"), "{r}");
        assert_eq!(r.matches("jump guest").count(), 2, "input and forward: {r}");
        assert!(r.contains("fib daddr type local goto refuse"), "{r}");
        assert!(r.contains("ip daddr 172.30.0.0/16 goto refuse"), "{r}");
        assert!(r.contains("elements = { 192.0.2.53 }"), "{r}");
        assert!(r.contains("elements = { 10.1.2.0/24 }"), "{r}");
        assert!(
            r.contains("127.0.0.0/8") && r.contains("169.254.0.0/16"),
            "{r}"
        );
        // Other guests are refused before the operator's allow-list is read.
        assert!(r.find("172.30.0.0/16").unwrap() < r.find("@allowed accept").unwrap());
        // Empty sets have no elements clause (nft refuses `elements = { }`).
        let bare = ruleset("172.30.0.0/16".parse().unwrap(), &[], &[]);
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

    #[test]
    fn each_guest_has_its_own_uid_network_and_cgroup_and_a_budget_from_its_rfp() {
        let dir = Path::new("/var/lib/p/nodes/l1");
        let a = Jail::plan("swp-", "172.30.0.0".parse().unwrap(), 3, dir);
        let b = Jail::plan("swp-", "172.30.0.0".parse().unwrap(), 4, dir);
        assert_eq!(a.uid, UID_BASE + 3);
        assert_ne!(a.uid, b.uid);
        assert_eq!(a.net.gateway, "swp-g3");
        assert_eq!(a.cgroup, "swp-vm3");
        assert_eq!(a.root, dir.join("root"));
        assert_eq!(
            a.qemu_args(),
            [
                "-runas",
                "2000000003:2000000003",
                "-chroot",
                "/var/lib/p/nodes/l1/root"
            ]
        );
        let spec = NodeSpec {
            vcpu: 2,
            mem_mib: 2048,
            disk_mib: 10240,
        };
        let kvm = budget(&spec, false);
        assert_eq!(kvm.memory_bytes, Some((2048 + OVERHEAD_MIB) << 20));
        assert_eq!(kvm.cpu_millis, Some(2250));
        assert_eq!(kvm.pids, Some(PIDS_MAX));
        let tcg = budget(&spec, true);
        assert_eq!(
            tcg.memory_bytes,
            Some((2048 + OVERHEAD_MIB + TCG_TB_MIB) << 20)
        );
    }
}
