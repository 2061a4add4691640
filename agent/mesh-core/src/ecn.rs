//! What the queue discipline reads and writes in an inner IP packet: its flow (the 5-tuple
//! the fair queue hashes) and its ECN field (RFC 3168), which the queue sets to CE instead of
//! dropping when the packet's transport said it can take the signal. Pure; never panics on
//! short or malformed bytes (a packet the queue cannot read is one flow, and is dropped, not
//! marked).

use std::hash::{Hash, Hasher};

/// The ECN codepoint of an IP packet's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ecn {
    NotEct,
    Ect1,
    Ect0,
    Ce,
}

impl Ecn {
    fn from_bits(bits: u8) -> Ecn {
        match bits & 0b11 {
            0b00 => Ecn::NotEct,
            0b01 => Ecn::Ect1,
            0b10 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }

    /// Whether the sender's transport reacts to CE (ECT(0), ECT(1), or already CE).
    pub fn capable(self) -> bool {
        self != Ecn::NotEct
    }
}

/// The packet's ECN codepoint, or `None` if it is not an IPv4 or IPv6 packet.
pub fn ecn(packet: &[u8]) -> Option<Ecn> {
    match packet.first()? >> 4 {
        4 => Some(Ecn::from_bits(*packet.get(1)?)),
        6 => Some(Ecn::from_bits(packet.get(1)? >> 4)),
        _ => None,
    }
}

/// Sets the packet's ECN field to CE (Congestion Experienced) if it is ECN-capable, keeping
/// an IPv4 header's checksum right (RFC 1624's incremental update). Returns whether the
/// packet now carries CE: `false` means the packet is not ECN-capable (or not a packet), and
/// the queue must drop it instead.
pub fn mark_ce(packet: &mut [u8]) -> bool {
    match ecn(packet) {
        None | Some(Ecn::NotEct) => false,
        Some(Ecn::Ce) => true,
        Some(_) if packet[0] >> 4 == 4 => {
            if packet.len() < 20 {
                return false;
            }
            let old = u16::from_be_bytes([packet[0], packet[1]]);
            packet[1] |= 0b11;
            let new = u16::from_be_bytes([packet[0], packet[1]]);
            let sum = u16::from_be_bytes([packet[10], packet[11]]);
            packet[10..12].copy_from_slice(&checksum_update(sum, old, new).to_be_bytes());
            true
        }
        Some(_) => {
            // IPv6: the traffic class straddles bytes 0 and 1; ECN is its low two bits, the
            // high nibble's low two bits of byte 1. No header checksum.
            packet[1] |= 0b0011_0000;
            true
        }
    }
}

/// RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'), in one's complement.
fn checksum_update(sum: u16, old: u16, new: u16) -> u16 {
    let mut acc = u32::from(!sum) + u32::from(!old) + u32::from(new);
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// A hash of the packet's flow: addresses, protocol, and ports for TCP, UDP, SCTP and
/// UDP-Lite when the packet is not a later fragment (ICMP, fragments and anything else hash
/// by addresses and protocol). `seed` perturbs it, so no outsider can aim packets at
/// another flow's bucket.
pub fn flow_hash(packet: &[u8], seed: u64) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    seed.hash(&mut h);
    match packet.first().map(|b| b >> 4) {
        Some(4) if packet.len() >= 20 => {
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            let proto = packet[9];
            packet[12..20].hash(&mut h);
            proto.hash(&mut h);
            // Fragment offset zero: the transport header is here.
            let first = u16::from_be_bytes([packet[6], packet[7]]) & 0x1fff == 0;
            if first && has_ports(proto) {
                packet.get(ihl..ihl + 4).hash(&mut h);
            }
        }
        Some(6) if packet.len() >= 40 => {
            // Flows are told apart by the first next header only: an extension header makes
            // the packet hash by addresses and protocol, which keeps it in one flow.
            let proto = packet[6];
            packet[8..40].hash(&mut h);
            proto.hash(&mut h);
            if has_ports(proto) {
                packet.get(40..44).hash(&mut h);
            }
        }
        _ => {}
    }
    h.finish()
}

fn has_ports(proto: u8) -> bool {
    matches!(proto, 6 | 17 | 132 | 136)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn tcp4(tos_ecn: u8, sport: u16) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ipv4([10, 42, 1, 2], [10, 42, 2, 3], 64)
            .tcp(sport, 80, 1, 1000);
        let mut out = Vec::new();
        b.write(&mut out, &[0u8; 100]).unwrap();
        out[1] = (out[1] & !0b11) | tos_ecn;
        // Recompute the checksum for the new TOS, as the sender would have.
        out[10] = 0;
        out[11] = 0;
        let h = etherparse::Ipv4HeaderSlice::from_slice(&out)
            .unwrap()
            .to_header();
        out[10..12].copy_from_slice(&h.calc_header_checksum().to_be_bytes());
        out
    }

    fn checksum_ok(p: &[u8]) -> bool {
        let h = etherparse::Ipv4HeaderSlice::from_slice(p).unwrap();
        h.header_checksum() == h.to_header().calc_header_checksum()
    }

    #[test]
    fn marks_ect_packets_and_keeps_the_ipv4_checksum() {
        for ect in [0b01, 0b10] {
            let mut p = tcp4(ect, 1000);
            assert!(checksum_ok(&p));
            assert!(ecn(&p).unwrap().capable());
            assert!(mark_ce(&mut p));
            assert_eq!(ecn(&p), Some(Ecn::Ce));
            assert!(checksum_ok(&p), "checksum after marking {ect:#b}");
        }
    }

    #[test]
    fn does_not_mark_what_cannot_take_it() {
        let mut p = tcp4(0, 1000);
        let before = p.clone();
        assert!(!mark_ce(&mut p));
        assert_eq!(
            p, before,
            "a Not-ECT packet is left alone (the queue drops it)"
        );
        assert!(!mark_ce(&mut []));
        assert!(!mark_ce(&mut [0x45]));
        let mut garbage = [0x75u8; 40];
        assert!(!mark_ce(&mut garbage));
        let mut ce = tcp4(0b11, 1000);
        assert!(mark_ce(&mut ce), "CE stays CE");
    }

    #[test]
    fn marks_ipv6() {
        let b = etherparse::PacketBuilder::ipv6([1; 16], [2; 16], 64).udp(1, 2);
        let mut p = Vec::new();
        b.write(&mut p, &[0u8; 10]).unwrap();
        assert_eq!(ecn(&p), Some(Ecn::NotEct));
        assert!(!mark_ce(&mut p));
        p[1] |= 0b0010_0000; // ECT(0)
        assert_eq!(ecn(&p), Some(Ecn::Ect0));
        assert!(mark_ce(&mut p));
        assert_eq!(ecn(&p), Some(Ecn::Ce));
        assert_eq!(p[0] >> 4, 6, "the version is untouched");
    }

    #[test]
    fn flows_differ_by_port_and_fragments_stay_with_their_addresses() {
        let a = tcp4(0, 1000);
        let b = tcp4(0, 1001);
        assert_eq!(flow_hash(&a, 7), flow_hash(&a.clone(), 7));
        assert_ne!(flow_hash(&a, 7), flow_hash(&b, 7));
        assert_ne!(flow_hash(&a, 7), flow_hash(&a, 8), "the seed perturbs");
        let mut frag = tcp4(0, 1000);
        frag[6] = 0;
        frag[7] = 10; // a later fragment: no ports in it
        let mut frag2 = tcp4(0, 1001);
        frag2[6] = 0;
        frag2[7] = 10;
        assert_eq!(flow_hash(&frag, 7), flow_hash(&frag2, 7));
        let udp =
            crate::packet::build::udp4(Ipv4Addr::new(10, 42, 1, 2), Ipv4Addr::new(10, 42, 2, 3), 3);
        let _ = flow_hash(&udp, 1);
        let _ = flow_hash(&[], 1);
        let _ = flow_hash(&[0x45, 0, 0], 1);
    }
}
