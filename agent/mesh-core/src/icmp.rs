//! ICMP Packet Too Big for packets the mesh cannot carry (RFC 9484's rule for IP over QUIC
//! datagrams: drop, and tell the sender, never fall back to a stream). Pure.

use std::net::IpAddr;

use etherparse::{
    Icmpv4Type, Icmpv6Type, IpNumber, Ipv4HeaderSlice, Ipv6HeaderSlice, PacketBuilder,
    icmpv4::DestUnreachableHeader,
};

/// IPv4 routers quote at most enough of the original to keep the error within 576 bytes.
const V4_MAX_ERROR: usize = 576;
/// IPv6 errors must fit the minimum MTU.
const V6_MAX_ERROR: usize = 1280;

/// Builds the ICMP error telling the sender of `original` that packets larger than `mtu`
/// cannot pass, sent from `from` (an address of the router reporting it). Returns `None` when
/// no error may be sent: the original is not a packet, is itself an ICMP error, is a non-first
/// fragment, or came from an address one may not answer.
pub fn packet_too_big(original: &[u8], mtu: u16, from: IpAddr) -> Option<Vec<u8>> {
    match (original.first()? >> 4, from) {
        (4, IpAddr::V4(from)) => {
            let h = Ipv4HeaderSlice::from_slice(original).ok()?;
            if u16::from(h.fragments_offset()) != 0
                || h.source_addr().is_unspecified()
                || h.source_addr().is_broadcast()
                || h.source_addr().is_multicast()
            {
                return None;
            }
            if h.protocol() == IpNumber::ICMP && !is_v4_query(&original[usize::from(h.ihl()) * 4..])
            {
                return None;
            }
            let quote = &original[..original.len().min(V4_MAX_ERROR - 28)];
            let b = PacketBuilder::ipv4(from.octets(), h.source_addr().octets(), 64).icmpv4(
                Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded {
                    next_hop_mtu: mtu.max(576),
                }),
            );
            let mut out = Vec::with_capacity(b.size(quote.len()));
            b.write(&mut out, quote).ok()?;
            Some(out)
        }
        (6, IpAddr::V6(from)) => {
            let h = Ipv6HeaderSlice::from_slice(original).ok()?;
            if h.source_addr().is_unspecified() || h.source_addr().is_multicast() {
                return None;
            }
            if h.next_header() == IpNumber::IPV6_ICMP && original.get(40).is_some_and(|t| *t < 128)
            {
                return None;
            }
            let quote = &original[..original.len().min(V6_MAX_ERROR - 48)];
            let b = PacketBuilder::ipv6(from.octets(), h.source_addr().octets(), 64).icmpv6(
                Icmpv6Type::PacketTooBig {
                    mtu: u32::from(mtu.max(1280)),
                },
            );
            let mut out = Vec::with_capacity(b.size(quote.len()));
            b.write(&mut out, quote).ok()?;
            Some(out)
        }
        _ => None,
    }
}

/// ICMPv4 types that are queries (echo, timestamp...), which may be answered with an error;
/// every other type is an error or unknown and must not be.
fn is_v4_query(icmp: &[u8]) -> bool {
    matches!(icmp.first(), Some(0 | 8 | 13 | 14))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::build::udp4;
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};
    use std::net::Ipv4Addr;

    const POD: Ipv4Addr = Ipv4Addr::new(10, 42, 1, 5);
    const FAR: Ipv4Addr = Ipv4Addr::new(10, 42, 2, 7);
    const GW: Ipv4Addr = Ipv4Addr::new(10, 42, 2, 1);

    #[test]
    fn a_big_v4_packet_gets_fragmentation_needed_with_the_mtu() {
        let big = udp4(POD, FAR, 1400);
        let err = packet_too_big(&big, 1380, IpAddr::V4(GW)).unwrap();
        assert!(err.len() <= 576);
        let p = SlicedPacket::from_ip(&err).unwrap();
        let Some(NetSlice::Ipv4(ip)) = p.net else {
            panic!("not v4")
        };
        assert_eq!(ip.header().destination_addr(), POD);
        assert_eq!(ip.header().source_addr(), GW);
        let Some(TransportSlice::Icmpv4(icmp)) = p.transport else {
            panic!("not icmp")
        };
        assert_eq!(
            icmp.icmp_type(),
            Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded {
                next_hop_mtu: 1380
            })
        );
        // The quote starts with the original header, so the sender can match it.
        assert_eq!(&icmp.payload()[..20], &big[..20]);
    }

    #[test]
    fn a_big_v6_packet_gets_packet_too_big() {
        let b = PacketBuilder::ipv6(
            [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            [0xfd; 16],
            64,
        )
        .udp(1, 2);
        let mut big = Vec::new();
        b.write(&mut big, &[0u8; 1400]).unwrap();
        let err = packet_too_big(&big, 1280, "fd00::2".parse().unwrap()).unwrap();
        assert!(err.len() <= 1280);
        let p = SlicedPacket::from_ip(&err).unwrap();
        let Some(TransportSlice::Icmpv6(icmp)) = p.transport else {
            panic!("not icmpv6")
        };
        assert_eq!(icmp.icmp_type(), Icmpv6Type::PacketTooBig { mtu: 1280 });
    }

    #[test]
    fn errors_are_never_answered_with_errors() {
        let first = udp4(POD, FAR, 1400);
        let err = packet_too_big(&first, 1380, IpAddr::V4(GW)).unwrap();
        assert_eq!(packet_too_big(&err, 1000, IpAddr::V4(GW)), None);
        assert_eq!(packet_too_big(b"junk", 1000, IpAddr::V4(GW)), None);
        // An echo request is a query and may be answered.
        let b = PacketBuilder::ipv4(POD.octets(), FAR.octets(), 64).icmpv4_echo_request(1, 1);
        let mut ping = Vec::new();
        b.write(&mut ping, &[0u8; 1400]).unwrap();
        assert!(packet_too_big(&ping, 1380, IpAddr::V4(GW)).is_some());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1600), mtu in proptest::prelude::any::<u16>()) {
            if let Some(err) = packet_too_big(&bytes, mtu, IpAddr::V4(GW)) {
                proptest::prop_assert!(err.len() <= 576);
            }
        }
    }
}
