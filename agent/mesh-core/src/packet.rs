//! IP packets as the mesh sees them: just enough of the header to route and filter. Parsing
//! goes through `etherparse`'s zero-copy header slices.

use std::net::IpAddr;

use etherparse::{Ipv4HeaderSlice, Ipv6HeaderSlice};

/// The parts of an IP header the mesh uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// Total length claimed by the header.
    pub len: usize,
}

/// Reads the header of an IPv4 or IPv6 packet, or `None` if the bytes are not one (too
/// short, wrong version, a length that exceeds the buffer).
pub fn parse(buf: &[u8]) -> Option<Header> {
    match buf.first()? >> 4 {
        4 => {
            let h = Ipv4HeaderSlice::from_slice(buf).ok()?;
            let len = usize::from(h.total_len());
            if len > buf.len() || len < usize::from(h.ihl()) * 4 {
                return None;
            }
            Some(Header {
                src: IpAddr::V4(h.source_addr()),
                dst: IpAddr::V4(h.destination_addr()),
                len,
            })
        }
        6 => {
            let h = Ipv6HeaderSlice::from_slice(buf).ok()?;
            let len = 40 + usize::from(h.payload_length());
            if len > buf.len() {
                return None;
            }
            Some(Header {
                src: IpAddr::V6(h.source_addr()),
                dst: IpAddr::V6(h.destination_addr()),
                len,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod build {
    //! Packets for tests.
    use std::net::Ipv4Addr;

    pub fn udp4(src: Ipv4Addr, dst: Ipv4Addr, payload: usize) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ipv4(src.octets(), dst.octets(), 64).udp(1000, 2000);
        let data = vec![0xabu8; payload];
        let mut out = Vec::with_capacity(b.size(payload));
        b.write(&mut out, &data).unwrap();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn reads_v4_and_v6_headers() {
        let p = build::udp4(
            Ipv4Addr::new(10, 42, 1, 2),
            Ipv4Addr::new(10, 42, 2, 3),
            100,
        );
        let h = parse(&p).unwrap();
        assert_eq!(h.src, IpAddr::V4(Ipv4Addr::new(10, 42, 1, 2)));
        assert_eq!(h.len, p.len());

        let b = etherparse::PacketBuilder::ipv6([1; 16], [2; 16], 64).udp(1, 2);
        let mut v6 = Vec::new();
        b.write(&mut v6, &[0u8; 10]).unwrap();
        let h = parse(&v6).unwrap();
        assert_eq!(h.len, v6.len());
        assert!(h.dst.is_ipv6());
    }

    #[test]
    fn refuses_what_is_not_a_packet() {
        let p = build::udp4(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), 100);
        assert_eq!(parse(&[]), None);
        assert_eq!(parse(&p[..10]), None, "truncated header");
        assert_eq!(parse(&p[..p.len() - 1]), None, "length beyond the buffer");
        let mut bad = p.clone();
        bad[0] = 0x75;
        assert_eq!(parse(&bad), None, "version 7");
    }
}
