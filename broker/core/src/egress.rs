//! Where the apiserver's `cluster` egress goes (contract 9): every CONNECT the apiserver
//! makes (logs, exec, attach, port-forward, proxy, webhooks) names an address, and the broker
//! carries it over the tunnel of the one node that address belongs to -- a node's own
//! address to that node, a Pod IP to the node whose pod CIDR holds it, a Service IP to a
//! ready node (whose kube-proxy takes it on). Anything else is refused with the reason; there
//! is no other way to fall back to. Its `controlplane` egress (webhooks named by URL, and the
//! guard) goes where [`control_plane_route`] says: the cluster's guard, the cluster itself,
//! or a public network the operator lists; never the broker's host or its networks.

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

/// Where a CONNECT of the apiserver's `controlplane` egress may go: its webhooks and
/// conversion webhooks named by URL (and the guard, the one authorization webhook, named by
/// its kubeconfig). The apiserver passes a URL's host as written, so a target may be a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Addr(SocketAddr),
    /// A DNS name and a port: resolved by the broker, each address then judged alone.
    Name(String, u16),
}

/// The target of a `controlplane` CONNECT request head: an address, or a DNS name (letters,
/// digits, `-`, `.`, at most 253 characters) and a port.
pub fn parse_connect_target(head: &[u8]) -> Result<Target, String> {
    match parse_connect(head) {
        Ok(a) => Ok(Target::Addr(a)),
        Err(e) if !e.contains("not an ip:port") => Err(e),
        Err(_) => {
            let text = std::str::from_utf8(head).map_err(|_| "the request is not text")?;
            let target = text.split(' ').nth(1).unwrap_or_default();
            let (host, port) = target
                .rsplit_once(':')
                .ok_or_else(|| format!("CONNECT {target}: not a host:port"))?;
            let port: u16 = port
                .parse()
                .map_err(|_| format!("CONNECT {target}: {port:?} is not a port"))?;
            let name_ok = !host.is_empty()
                && host.len() <= 253
                && host.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if !name_ok {
                return Err(format!("CONNECT {target}: not a DNS name and port"));
            }
            Ok(Target::Name(host.to_ascii_lowercase(), port))
        }
    }
}

/// Where a `controlplane` CONNECT to one address goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlPlaneRoute {
    /// The cluster's guard: the one address on the broker's host its apiserver may reach.
    Guard,
    /// An address of the cluster (a node, a Pod, a Service): over the tunnel, as the
    /// `cluster` egress carries it.
    Cluster,
    /// A public address the operator allows: dialled from the broker's host.
    Public,
}

/// What the broker knows of an address beyond its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Facts {
    /// A public address: not loopback, private, link-local, CGNAT, multicast, reserved.
    pub public: bool,
    /// An address of the broker's own host (its public ones included).
    pub this_host: bool,
}

/// Where the apiserver's `controlplane` CONNECT to `dest` goes, or why nowhere. `cluster`:
/// the cluster's own networks (nodes', Pods', Services'); `allow`: the operator's
/// `clusters.webhook_egress_allow`.
pub fn control_plane_route(
    dest: SocketAddr,
    guard: SocketAddr,
    cluster: &[IpNet],
    facts: Facts,
    allow: &[IpNet],
) -> Result<ControlPlaneRoute, String> {
    if dest == guard {
        return Ok(ControlPlaneRoute::Guard);
    }
    let ip = dest.ip();
    if cluster.iter().any(|n| n.contains(&ip)) {
        return Ok(ControlPlaneRoute::Cluster);
    }
    if facts.this_host {
        return Err(format!(
            "{dest} is an address of the broker's host: a webhook by URL never reaches it"
        ));
    }
    if !facts.public {
        return Err(format!(
            "{dest} is not public (loopback, private, link-local or reserved) and not an address \
             of this cluster: a webhook by URL never reaches the broker's host or its networks"
        ));
    }
    if !allow.iter().any(|n| n.contains(&ip)) {
        return Err(format!(
            "{dest} is not in the operator's clusters.webhook_egress_allow: a webhook by URL \
             reaches only the public networks the operator lists"
        ));
    }
    Ok(ControlPlaneRoute::Public)
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
            let _ = parse_connect_target(&bytes);
        }

        #[test]
        fn a_target_read_is_a_name_or_an_address_as_written(host in "[a-z0-9-]{1,12}(\\.[a-z0-9-]{1,12}){0,3}", port in 1u16..) {
            let head = format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
            match parse_connect_target(head.as_bytes()).unwrap() {
                Target::Name(h, p) => proptest::prop_assert_eq!((h, p), (host, port)),
                Target::Addr(a) => proptest::prop_assert_eq!(a.port(), port),
            }
        }
    }

    #[test]
    fn a_controlplane_connect_may_name_a_host() {
        let head = |t: &str| format!("CONNECT {t} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        assert_eq!(
            parse_connect_target(head("127.0.0.1:9464").as_bytes()),
            Ok(Target::Addr("127.0.0.1:9464".parse().unwrap()))
        );
        assert_eq!(
            parse_connect_target(head("Hooks.Example.com:443").as_bytes()),
            Ok(Target::Name("hooks.example.com".into(), 443))
        );
        for bad in [
            "hooks.example.com",
            "a b:443",
            "x..y:443",
            "host:99999",
            "h_x:1",
            ":443",
        ] {
            assert!(parse_connect_target(head(bad).as_bytes()).is_err(), "{bad}");
        }
        assert!(parse_connect_target(b"GET / HTTP/1.1\r\n\r\n").is_err());
    }

    #[test]
    fn the_control_planes_egress_reaches_its_guard_its_cluster_and_listed_public_networks() {
        let guard: SocketAddr = "127.0.0.1:17001".parse().unwrap();
        let cluster: Vec<IpNet> = ["10.41.0.0/16", "10.42.0.0/16", "10.43.0.0/16"]
            .iter()
            .map(|n| n.parse().unwrap())
            .collect();
        let allow: Vec<IpNet> = vec!["198.51.100.0/24".parse().unwrap()];
        let facts = |public, this_host| Facts { public, this_host };
        let to =
            |d: &str, f: Facts| control_plane_route(d.parse().unwrap(), guard, &cluster, f, &allow);
        let (private, public) = (facts(false, false), facts(true, false));
        assert_eq!(
            to("127.0.0.1:17001", facts(false, true)),
            Ok(ControlPlaneRoute::Guard)
        );
        assert_eq!(
            to("10.42.1.7:8443", private),
            Ok(ControlPlaneRoute::Cluster)
        );
        assert_eq!(
            to("10.43.0.10:443", private),
            Ok(ControlPlaneRoute::Cluster)
        );
        assert_eq!(
            to("198.51.100.9:443", public),
            Ok(ControlPlaneRoute::Public)
        );
        for (d, f, needle) in [
            ("127.0.0.1:16443", facts(false, true), "broker's host"),
            ("127.0.0.1:9464", facts(false, true), "broker's host"),
            ("198.51.100.1:8443", facts(true, true), "broker's host"),
            ("10.0.2.2:22", private, "not public"),
            ("169.254.169.254:80", private, "not public"),
            ("203.0.113.5:443", public, "webhook_egress_allow"),
        ] {
            let e = to(d, f).unwrap_err();
            assert!(e.starts_with(d) && e.contains(needle), "{e}");
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
