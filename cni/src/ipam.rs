//! Address management, pure: the allocation table and every decision about it. The table is
//! loaded and saved under a lock by `store`; questions about the world (which boot is this,
//! is that process alive, does that namespace hold that address) come in through [`World`].
//!
//! Why this beats the reference host-local plugin: host-local writes one file per address and
//! forgets nothing, so an address reserved by an ADD that crashed before attaching it, or held
//! by a container that vanished with a reboot, stays taken until someone calls DEL for it.
//! Here an allocation records the boot it was made in and, until the interface is attached,
//! the process making it; an allocation from an earlier boot, or a reservation whose process
//! died without attaching the address, is reclaimed by the next ADD or GC.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::config::Attachment;
use crate::spec::{CniError, Code};

/// The table's format version, bumped on incompatible changes.
pub const FORMAT: u32 = 1;

/// Everything allocated in one network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Table {
    pub format: u32,
    /// The address handed out last: allocation continues after it, so a released address is
    /// not reused at once (a peer may still have it in its ARP cache or conntrack).
    pub last: Option<Ipv4Addr>,
    pub allocations: Vec<Allocation>,
}

impl Default for Table {
    fn default() -> Table {
        Table {
            format: FORMAT,
            last: None,
            allocations: Vec::new(),
        }
    }
}

/// One address and who holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub ip: Ipv4Addr,
    pub container_id: String,
    pub ifname: String,
    #[serde(default)]
    pub netns: Option<String>,
    /// `/proc/sys/kernel/random/boot_id` when the allocation was made.
    pub boot_id: String,
    pub phase: Phase,
}

/// Whether the address is already on an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "lowercase")]
pub enum Phase {
    /// Reserved by a running ADD that has not attached it yet.
    Reserved { owner: Owner },
    /// On the container's interface.
    Attached,
}

/// A process, identified across pid reuse by its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks since boot).
    pub start_time: u64,
}

/// What the table needs to know about the machine.
pub trait World {
    fn boot_id(&self) -> &str;
    fn alive(&self, owner: Owner) -> bool;
    /// Whether `netns` exists and its `ifname` holds `ip` (an ADD that died after attaching
    /// but before recording it).
    fn holds(&self, netns: &str, ifname: &str, ip: Ipv4Addr) -> bool;
}

/// Why an allocation was dropped without a DEL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaimed {
    EarlierBoot,
    AbandonedReservation,
    NotValid,
}

impl Table {
    fn find(&self, container_id: &str, ifname: &str) -> Option<usize> {
        self.allocations
            .iter()
            .position(|a| a.container_id == container_id && a.ifname == ifname)
    }

    /// The allocation of a (container, interface), if any.
    pub fn get(&self, container_id: &str, ifname: &str) -> Option<&Allocation> {
        self.find(container_id, ifname)
            .map(|i| &self.allocations[i])
    }

    /// Drops allocations that cannot be in use: made in an earlier boot, or reserved by a
    /// process that died before attaching the address. A dead reservation whose namespace does
    /// hold the address is promoted to attached instead (the ADD finished its work and died
    /// before saying so).
    pub fn reclaim(&mut self, world: &dyn World) -> Vec<(Allocation, Reclaimed)> {
        let mut dropped = Vec::new();
        let mut kept = Vec::with_capacity(self.allocations.len());
        for mut a in std::mem::take(&mut self.allocations) {
            if a.boot_id != world.boot_id() {
                dropped.push((a, Reclaimed::EarlierBoot));
                continue;
            }
            if let Phase::Reserved { owner } = a.phase
                && !world.alive(owner)
            {
                let attached = a
                    .netns
                    .as_deref()
                    .is_some_and(|ns| world.holds(ns, &a.ifname, a.ip));
                if !attached {
                    dropped.push((a, Reclaimed::AbandonedReservation));
                    continue;
                }
                a.phase = Phase::Attached;
            }
            kept.push(a);
        }
        self.allocations = kept;
        dropped
    }

    /// Reserves an address in `subnet` for (container, interface). Never hands out the
    /// network, gateway or broadcast address. A pair that already holds an address is refused
    /// and the table left as it is: attached, it is a live attachment (code 103; the spec
    /// wants ADD of an existing interface to fail); reserved, another ADD of the same pair is
    /// still running (code 11; call [`Table::reclaim`] first so that only live ones remain).
    pub fn allocate(
        &mut self,
        subnet: Ipv4Net,
        gateway: Ipv4Addr,
        request: Request<'_>,
        owner: Owner,
        boot_id: &str,
    ) -> Result<Ipv4Addr, CniError> {
        if let Some(a) = self.get(request.container_id, request.ifname) {
            let (id, ifname, ip) = (request.container_id, request.ifname, a.ip);
            return Err(match a.phase {
                Phase::Attached => CniError::new(
                    Code::AttachmentExists,
                    format!("container {id} already has {ifname}, with {ip}"),
                )
                .with_details("an ADD for an attachment that exists; DEL it first"),
                Phase::Reserved { owner } => CniError::new(
                    Code::TryAgainLater,
                    format!(
                        "an ADD of {ifname} for container {id} is already running (pid {})",
                        owner.pid
                    ),
                ),
            });
        }
        let first = u32::from(subnet.network()) + 1;
        let last = u32::from(subnet.broadcast()) - 1;
        let size = last - first + 1;
        let start = match self.last {
            Some(ip) if subnet.contains(&ip) => u32::from(ip) + 1,
            _ => first,
        };
        let used: std::collections::HashSet<Ipv4Addr> =
            self.allocations.iter().map(|a| a.ip).collect();
        for step in 0..size {
            let candidate = Ipv4Addr::from(first + (start - first + step) % size);
            if candidate == gateway || used.contains(&candidate) {
                continue;
            }
            self.allocations.push(Allocation {
                ip: candidate,
                container_id: request.container_id.to_string(),
                ifname: request.ifname.to_string(),
                netns: request.netns.map(str::to_string),
                boot_id: boot_id.to_string(),
                phase: Phase::Reserved { owner },
            });
            self.last = Some(candidate);
            return Ok(candidate);
        }
        Err(
            CniError::new(Code::PoolExhausted, format!("no free address in {subnet}"))
                .with_details(format!(
                    "{} of {} host addresses are allocated and the gateway {gateway} is reserved; \
                 delete pods, or give the node a larger pod CIDR",
                    used.len(),
                    size
                )),
        )
    }

    /// Marks the allocation of (container, interface) as attached.
    pub fn mark_attached(&mut self, container_id: &str, ifname: &str) -> bool {
        match self.find(container_id, ifname) {
            Some(i) => {
                self.allocations[i].phase = Phase::Attached;
                true
            }
            None => false,
        }
    }

    /// Releases the allocation of (container, interface) if it is still the reservation
    /// `owner` made: what a failed ADD gives back, and nothing else.
    pub fn release_reservation(
        &mut self,
        container_id: &str,
        ifname: &str,
        owner: Owner,
    ) -> Option<Allocation> {
        let i = self.find(container_id, ifname)?;
        (self.allocations[i].phase == Phase::Reserved { owner }).then(|| self.allocations.remove(i))
    }

    /// Releases the allocation of (container, interface); releasing twice is not an error.
    pub fn release(&mut self, container_id: &str, ifname: &str) -> Option<Allocation> {
        self.find(container_id, ifname)
            .map(|i| self.allocations.remove(i))
    }

    /// Releases every allocation the runtime no longer vouches for, except reservations of
    /// ADDs still running (the runtime cannot list an attachment it has not been told of).
    pub fn gc(&mut self, valid: &[Attachment], world: &dyn World) -> Vec<Allocation> {
        let (keep, drop): (Vec<Allocation>, Vec<Allocation>) =
            std::mem::take(&mut self.allocations)
                .into_iter()
                .partition(|a| {
                    valid
                        .iter()
                        .any(|v| v.container_id == a.container_id && v.ifname == a.ifname)
                        || matches!(a.phase, Phase::Reserved { owner } if world.alive(owner))
                });
        self.allocations = keep;
        drop
    }

    /// Host addresses still free in `subnet`.
    pub fn free(&self, subnet: Ipv4Net, gateway: Ipv4Addr) -> u32 {
        let size = u32::from(subnet.broadcast()) - u32::from(subnet.network()) - 1;
        let used = self
            .allocations
            .iter()
            .filter(|a| subnet.contains(&a.ip) && a.ip != gateway)
            .count() as u32;
        let gw = u32::from(subnet.contains(&gateway));
        size.saturating_sub(used + gw)
    }
}

/// Who asks for an address.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub container_id: &'a str,
    pub ifname: &'a str,
    pub netns: Option<&'a str>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    struct FakeWorld {
        boot: String,
        alive: HashSet<u32>,
        holds: HashSet<Ipv4Addr>,
    }

    impl World for FakeWorld {
        fn boot_id(&self) -> &str {
            &self.boot
        }
        fn alive(&self, owner: Owner) -> bool {
            self.alive.contains(&owner.pid)
        }
        fn holds(&self, _: &str, _: &str, ip: Ipv4Addr) -> bool {
            self.holds.contains(&ip)
        }
    }

    fn world(alive: &[u32]) -> FakeWorld {
        FakeWorld {
            boot: "b1".into(),
            alive: alive.iter().copied().collect(),
            holds: HashSet::new(),
        }
    }

    const ME: Owner = Owner {
        pid: 1,
        start_time: 1,
    };

    fn req(id: &str) -> Request<'_> {
        Request {
            container_id: id,
            ifname: "eth0",
            netns: Some("/run/netns/x"),
        }
    }

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn never_hands_out_network_gateway_or_broadcast() {
        let subnet = net("10.0.0.0/29"); // .1 gateway, .2-.6 usable, .7 broadcast
        let gw = Ipv4Addr::new(10, 0, 0, 1);
        let mut t = Table::default();
        let mut got = Vec::new();
        for i in 0..5 {
            got.push(
                t.allocate(subnet, gw, req(&format!("c{i}")), ME, "b1")
                    .unwrap(),
            );
        }
        let want: Vec<Ipv4Addr> = (2..=6).map(|h| Ipv4Addr::new(10, 0, 0, h)).collect();
        assert_eq!(got, want);
        let e = t.allocate(subnet, gw, req("c5"), ME, "b1").unwrap_err();
        assert_eq!(e.code, Code::PoolExhausted);
        assert!(e.msg.contains("10.0.0.0/29"));
        assert_eq!(t.free(subnet, gw), 0);
    }

    #[test]
    fn a_gateway_in_the_middle_is_skipped() {
        let subnet = net("10.0.0.0/29");
        let gw = Ipv4Addr::new(10, 0, 0, 3);
        let mut t = Table::default();
        let got: Vec<_> = (0..5)
            .map(|i| {
                t.allocate(subnet, gw, req(&format!("c{i}")), ME, "b1")
                    .unwrap()
            })
            .collect();
        assert!(!got.contains(&gw));
        assert!(got.contains(&Ipv4Addr::new(10, 0, 0, 1)));
    }

    #[test]
    fn a_second_allocation_for_an_attachment_is_refused_and_changes_nothing() {
        let mut t = Table::default();
        let s = net("10.0.0.0/24");
        let gw = Ipv4Addr::new(10, 0, 0, 1);
        t.allocate(s, gw, req("c"), ME, "b1").unwrap();
        let running = t.clone();
        let e = t.allocate(s, gw, req("c"), ME, "b1").unwrap_err();
        assert_eq!(e.code, Code::TryAgainLater, "the first ADD still runs");
        assert_eq!(t, running);
        t.mark_attached("c", "eth0");
        let attached = t.clone();
        let e = t.allocate(s, gw, req("c"), ME, "b1").unwrap_err();
        assert_eq!(e.code, Code::AttachmentExists);
        assert!(e.msg.contains("already has eth0"), "{}", e.msg);
        assert_eq!(t, attached);
    }

    #[test]
    fn a_failed_add_gives_back_only_its_own_reservation() {
        let mut t = Table::default();
        let s = net("10.0.0.0/24");
        let gw = Ipv4Addr::new(10, 0, 0, 1);
        let other = Owner {
            pid: 2,
            start_time: 9,
        };
        t.allocate(s, gw, req("mine"), ME, "b1").unwrap();
        t.allocate(s, gw, req("theirs"), other, "b1").unwrap();
        t.allocate(s, gw, req("done"), ME, "b1").unwrap();
        t.mark_attached("done", "eth0");
        assert!(t.release_reservation("theirs", "eth0", ME).is_none());
        assert!(t.release_reservation("done", "eth0", ME).is_none());
        assert!(t.release_reservation("mine", "eth0", ME).is_some());
        assert_eq!(t.allocations.len(), 2);
    }

    #[test]
    fn released_addresses_are_not_reused_at_once() {
        let mut t = Table::default();
        let s = net("10.0.0.0/24");
        let gw = Ipv4Addr::new(10, 0, 0, 1);
        let a = t.allocate(s, gw, req("a"), ME, "b1").unwrap();
        assert!(t.release("a", "eth0").is_some());
        assert!(
            t.release("a", "eth0").is_none(),
            "a second release is a no-op"
        );
        let b = t.allocate(s, gw, req("b"), ME, "b1").unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn allocations_of_an_earlier_boot_are_reclaimed() {
        let mut t = Table::default();
        let s = net("10.0.0.0/24");
        let gw = Ipv4Addr::new(10, 0, 0, 1);
        t.allocate(s, gw, req("old"), ME, "b0").unwrap();
        t.mark_attached("old", "eth0");
        let dropped = t.reclaim(&world(&[1]));
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].1, Reclaimed::EarlierBoot);
        assert!(t.allocations.is_empty());
    }

    #[test]
    fn a_dead_reservation_is_reclaimed_unless_its_namespace_holds_the_address() {
        let mut t = Table::default();
        let s = net("10.0.0.0/24");
        let gw = Ipv4Addr::new(10, 0, 0, 1);
        let dead = Owner {
            pid: 99,
            start_time: 5,
        };
        let lost = t.allocate(s, gw, req("crashed-early"), dead, "b1").unwrap();
        let held = t.allocate(s, gw, req("crashed-late"), dead, "b1").unwrap();
        let mut w = world(&[1]);
        w.holds.insert(held);
        let dropped = t.reclaim(&w);
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].0.ip, lost);
        assert_eq!(dropped[0].1, Reclaimed::AbandonedReservation);
        assert_eq!(
            t.get("crashed-late", "eth0").unwrap().phase,
            Phase::Attached
        );
    }

    #[test]
    fn live_reservations_survive_reclaim_and_gc() {
        let mut t = Table::default();
        let s = net("10.0.0.0/24");
        let gw = Ipv4Addr::new(10, 0, 0, 1);
        let busy = Owner {
            pid: 7,
            start_time: 1,
        };
        t.allocate(s, gw, req("in-flight"), busy, "b1").unwrap();
        t.allocate(s, gw, req("valid"), ME, "b1").unwrap();
        t.mark_attached("valid", "eth0");
        t.allocate(s, gw, req("stale"), ME, "b1").unwrap();
        t.mark_attached("stale", "eth0");
        let w = world(&[1, 7]);
        assert!(t.reclaim(&w).is_empty());
        let valid = [Attachment {
            container_id: "valid".into(),
            ifname: "eth0".into(),
        }];
        let dropped = t.gc(&valid, &w);
        assert_eq!(
            dropped
                .iter()
                .map(|a| a.container_id.as_str())
                .collect::<Vec<_>>(),
            ["stale"]
        );
        assert_eq!(t.allocations.len(), 2);
    }

    #[test]
    fn the_table_round_trips_through_json() {
        let mut t = Table::default();
        t.allocate(
            net("10.0.0.0/24"),
            Ipv4Addr::new(10, 0, 0, 1),
            req("c"),
            ME,
            "b1",
        )
        .unwrap();
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<Table>(&text).unwrap(), t);
    }

    proptest::proptest! {
        /// Whatever sequence of allocations and releases, no address is held twice and none is
        /// the network, gateway or broadcast address.
        #[test]
        fn addresses_stay_unique(ops in proptest::collection::vec((0u8..40, proptest::bool::ANY), 1..300)) {
            let s = net("10.9.0.0/27");
            let gw = Ipv4Addr::new(10, 9, 0, 1);
            let mut t = Table::default();
            for (id, add) in ops {
                let id = format!("c{id}");
                if add {
                    let _ = t.allocate(s, gw, req(&id), ME, "b1");
                } else {
                    t.release(&id, "eth0");
                }
                let ips: HashSet<_> = t.allocations.iter().map(|a| a.ip).collect();
                proptest::prop_assert_eq!(ips.len(), t.allocations.len());
                for ip in ips {
                    proptest::prop_assert!(ip != gw && ip != s.network() && ip != s.broadcast());
                }
            }
        }
    }
}
