//! Where the apiserver's `cluster` egress goes (contract 9): every CONNECT the apiserver
//! makes (logs, exec, attach, port-forward, proxy, webhooks) names an address, and the broker
//! carries it over the tunnel of the one node that address belongs to -- a node's own
//! address to that node, a Pod IP to the node whose pod CIDR holds it, a Service IP to a
//! ready node (whose kube-proxy takes it on). Anything else is refused with the reason; there
//! is no other way to fall back to.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

/// The longest CONNECT request head the broker reads.
pub const MAX_HEAD: usize = 8 * 1024;

/// The destination of an HTTP CONNECT request head (`CONNECT <ip>:<port> HTTP/1.1`, headers,
/// an empty line), as the apiserver's HTTPConnect egress sends it; or what is wrong with it.
pub fn parse_connect(head: &[u8]) -> Result<SocketAddr, String> {
    let text = std::str::from_utf8(head).map_err(|_| "the request is not text".to_string())?;
    let line = text.split("\r\n").next().unwrap_or_default();
    let mut parts = line.split(' ');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("CONNECT"), Some(target), Some(v), None) if v.starts_with("HTTP/1.") => {
            target.parse::<SocketAddr>().map_err(|_| {
                format!("CONNECT {target}: not an ip:port (the broker routes addresses, not names)")
            })
        }
        (Some(m), ..) if m != "CONNECT" => Err(format!("{m}: only CONNECT is served here")),
        _ => Err(format!(
            "not a CONNECT request line: {:?}",
            line.chars().take(80).collect::<String>()
        )),
    }
}

/// The status line the broker answers a refused CONNECT with: the reason goes in the reason
/// phrase, which the apiserver quotes in its error (`proxy error ... code 502: 502 <reason>`).
pub fn refusal_head(reason: &str) -> String {
    let phrase: String = reason
        .chars()
        .map(|c| {
            if c.is_ascii() && !c.is_ascii_control() {
                c
            } else {
                ' '
            }
        })
        .take(400)
        .collect();
    format!("HTTP/1.1 502 {phrase}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
}

/// What routing needs of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRoute {
    pub node: String,
    /// Its address in the cluster (from the broker's own records, not what the node says).
    pub node_ip: Option<IpAddr>,
    /// Its pod CIDR (allocated by the controller-manager).
    pub pod_cidr: Option<IpNet>,
    /// Whether its tunnel is up now.
    pub connected: bool,
    /// Whether its Node is Ready.
    pub ready: bool,
}

/// The node `dest` goes to, or why none.
pub fn route<'a>(
    dest: IpAddr,
    nodes: &'a [NodeRoute],
    service_cidr: &IpNet,
    cluster: &str,
) -> Result<&'a NodeRoute, String> {
    let owner = nodes.iter().find(|n| n.node_ip == Some(dest)).or_else(|| {
        nodes
            .iter()
            .find(|n| n.pod_cidr.is_some_and(|c| c.contains(&dest)))
    });
    if let Some(n) = owner {
        return if n.connected {
            Ok(n)
        } else {
            Err(format!(
                "{dest} is node {}'s, and its tunnel to the broker is down",
                n.node
            ))
        };
    }
    if service_cidr.contains(&dest) {
        return nodes
            .iter()
            .filter(|n| n.connected)
            .min_by_key(|n| (!n.ready, n.node.as_str()))
            .ok_or_else(|| {
                format!("{dest} is a Service address of cluster {cluster}, and no node of it is connected")
            });
    }
    Err(format!(
        "{dest} is neither a node, a Pod nor a Service address of cluster {cluster}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(node: &str, ip: &str, cidr: &str, connected: bool, ready: bool) -> NodeRoute {
        NodeRoute {
            node: node.into(),
            node_ip: Some(ip.parse().unwrap()),
            pod_cidr: Some(cidr.parse().unwrap()),
            connected,
            ready,
        }
    }

    #[test]
    fn connect_requests_are_read_strictly() {
        let ok = b"CONNECT 10.41.0.2:10250 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
        assert_eq!(parse_connect(ok), Ok("10.41.0.2:10250".parse().unwrap()));
        for (bad, needle) in [
            (&b"GET / HTTP/1.1\r\n\r\n"[..], "only CONNECT"),
            (b"CONNECT kubelet:10250 HTTP/1.1\r\n\r\n", "not an ip:port"),
            (
                b"CONNECT 10.41.0.2:10250\r\n\r\n",
                "not a CONNECT request line",
            ),
            (b"\xff\xfe", "not text"),
        ] {
            let e = parse_connect(bad).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
        let head = refusal_head("10.0.2.2:22 is neither\r\nX-Evil: 1");
        assert!(
            head.starts_with("HTTP/1.1 502 10.0.2.2:22 is neither  X-Evil: 1\r\n"),
            "{head}"
        );
        assert_eq!(head.matches("\r\n").count(), 4);
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_heads_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = parse_connect(&bytes);
        }
    }

    #[test]
    fn the_routing_table() {
        let svc: IpNet = "10.43.0.0/16".parse().unwrap();
        let nodes = [
            n("c-1", "10.41.0.1", "10.42.1.0/24", true, false),
            n("c-2", "10.41.0.2", "10.42.2.0/24", true, true),
            n("c-3", "10.41.0.3", "10.42.3.0/24", false, true),
        ];
        let to = |ip: &str| route(ip.parse().unwrap(), &nodes, &svc, "c").map(|n| n.node.as_str());
        assert_eq!(to("10.41.0.1"), Ok("c-1"), "a node's kubelet");
        assert_eq!(to("10.42.2.9"), Ok("c-2"), "a Pod");
        assert_eq!(to("10.43.0.10"), Ok("c-2"), "a Service: a ready node first");
        let down = to("10.42.3.4").unwrap_err();
        assert!(
            down.contains("c-3") && down.contains("tunnel to the broker is down"),
            "{down}"
        );
        for nowhere in ["10.42.9.1", "127.0.0.1", "203.0.113.1", "10.0.2.15"] {
            let e = to(nowhere).unwrap_err();
            assert!(e.starts_with(nowhere) && e.contains("neither"), "{e}");
        }
        assert!(
            route("10.43.0.1".parse().unwrap(), &nodes[2..], &svc, "c")
                .unwrap_err()
                .contains("no node of it is connected")
        );
    }
}
