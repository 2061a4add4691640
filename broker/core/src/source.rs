//! What counts as one source for the limits per address (the front's and the relay's
//! connection caps, the gateway API's request rate): an IPv4 address, or an IPv6 /64.

use std::net::{IpAddr, Ipv6Addr};

/// The key of a source address: an IPv4-mapped address as the IPv4 one (a listener on `[::]`
/// sees IPv4 clients so), an IPv6 address by its /64 (one host's share of a network: a host
/// with one has all of its addresses).
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_an_ipv4_address_or_an_ipv6_slash_64() {
        let key = |s: &str| source_key(s.parse().unwrap()).to_string();
        assert_eq!(key("192.0.2.1"), "192.0.2.1");
        // What a [::] listener sees of an IPv4 client is that client.
        assert_eq!(key("::ffff:192.0.2.1"), "192.0.2.1");
        assert_eq!(key("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::");
        assert_eq!(key("2001:db8:1:2:bbbb::9"), key("2001:db8:1:2:aaaa::1"));
        assert_ne!(key("2001:db8:1:3::1"), key("2001:db8:1:2::1"));
    }
}
