//! The machine as the IPAM core sees it: the boot id, whether a process is alive, and whether
//! a namespace holds an address.

use std::net::Ipv4Addr;

use crate::ipam::{Owner, World};

/// The real machine.
#[derive(Debug)]
pub struct Os {
    boot_id: String,
}

impl Os {
    pub fn new() -> Os {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Os { boot_id }
    }

    pub fn boot_id_str(&self) -> &str {
        &self.boot_id
    }

    /// This process, as an allocation owner.
    pub fn me(&self) -> Owner {
        let pid = std::process::id();
        Owner {
            pid,
            start_time: start_time(pid).unwrap_or(0),
        }
    }
}

impl Default for Os {
    fn default() -> Os {
        Os::new()
    }
}

impl World for Os {
    fn boot_id(&self) -> &str {
        &self.boot_id
    }

    fn alive(&self, owner: Owner) -> bool {
        start_time(owner.pid) == Some(owner.start_time)
    }

    fn holds(&self, netns: &str, ifname: &str, ip: Ipv4Addr) -> bool {
        socialweb_netlink::veth::netns_holds(netns, ifname, ip)
    }
}

/// Start time of a running (not zombie) process: field 22 of `/proc/<pid>/stat`.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state).
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(22 - 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_changed_start_time_is_not() {
        let os = Os::new();
        let me = os.me();
        assert!(os.alive(me));
        assert!(!os.alive(Owner {
            pid: me.pid,
            start_time: me.start_time + 1
        }));
        assert!(!os.boot_id().is_empty());
    }
}
