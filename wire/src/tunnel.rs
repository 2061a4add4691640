//! Contract 9, the way between nodes and their control plane (docs/tunnel.md): each node
//! holds one QUIC connection to the broker's tunnel endpoint (ALPN [`ALPN`], the node's mesh
//! key as its identity), and every TCP connection either side wants becomes one bidirectional
//! stream on it, opened with a one-line header:
//!
//! - node → broker: `api\n` -- to this node's cluster's apiserver. The broker answers with a
//!   [`Reply`] line, then the stream carries the bytes (TLS end to end between the kubelet
//!   and the apiserver; the broker sees bytes, not credentials).
//! - broker → node: `connect <ip>:<port>\n` -- the apiserver's `cluster` egress (logs, exec,
//!   attach, port-forward, proxy, webhooks). The node dials it only if its rules allow
//!   ([`Allow`]) and answers with a [`Reply`] line naming the reason when it does not.
//!
//! Headers are short ASCII lines, read with a limit ([`MAX_LINE`]); anything else is refused.
//! Types and parsing only.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

/// ALPN of tunnel connections (node to broker).
pub const ALPN: &[u8] = b"socialweb/tunnel/1";

/// The longest header or reply line, newline included.
pub const MAX_LINE: usize = 256;

/// The node-local address the agent serves the apiserver on to the node (the kubelet,
/// kube-proxy, the agent), beside node-local DNS at 169.254.20.10.
pub const NODE_LOCAL_API_ADDR: std::net::Ipv4Addr = std::net::Ipv4Addr::new(169, 254, 20, 11);

/// The `kubernetes` Service's endpoint, which the agent serves the apiserver on as well:
/// Endpoints and EndpointSlices refuse link-local (and loopback) addresses, so the apiserver
/// cannot advertise [`NODE_LOCAL_API_ADDR`]. An address of the shared range (RFC 6598) that
/// no node routes elsewhere, node-local on every node, as Tailscale's 100.100.100.100 is.
pub const KUBERNETES_ENDPOINT_ADDR: std::net::Ipv4Addr = std::net::Ipv4Addr::new(100, 100, 20, 11);

/// The kubelet's port, which the apiserver reaches for logs, exec, attach and port-forward.
pub const KUBELET_PORT: u16 = 10250;

/// What a stream is opened for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    /// Node to broker: the cluster's apiserver.
    Api,
    /// Broker to node: dial this address on the node.
    Connect(SocketAddr),
}

/// Why a header or reply line is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("the line is longer than {MAX_LINE} bytes or has no newline")]
    TooLong,
    #[error("the line is not ASCII text")]
    NotText,
    #[error("unknown stream kind {0:?} (expected `api` or `connect <ip>:<port>`)")]
    UnknownKind(String),
    #[error("{0:?} is not an ip:port")]
    BadAddress(String),
    #[error("unknown reply {0:?} (expected `ok` or `refused <reason>`)")]
    BadReply(String),
}

/// The text of `line` without its newline, if it is one whole short ASCII line.
fn text(line: &[u8]) -> Result<&str, LineError> {
    let body = line
        .strip_suffix(b"\n")
        .filter(|b| line.len() <= MAX_LINE && !b.contains(&b'\n'))
        .ok_or(LineError::TooLong)?;
    if !body.iter().all(|b| b.is_ascii() && !b.is_ascii_control()) {
        return Err(LineError::NotText);
    }
    Ok(std::str::from_utf8(body).expect("ASCII"))
}

impl Open {
    /// The header line, newline included.
    pub fn line(&self) -> String {
        match self {
            Open::Api => "api\n".into(),
            Open::Connect(a) => format!("connect {a}\n"),
        }
    }

    /// Reads a header line (newline included).
    pub fn parse(line: &[u8]) -> Result<Open, LineError> {
        let t = text(line)?;
        if t == "api" {
            return Ok(Open::Api);
        }
        match t.strip_prefix("connect ") {
            Some(a) => a
                .parse::<SocketAddr>()
                .map(Open::Connect)
                .map_err(|_| LineError::BadAddress(a.to_string())),
            None => Err(LineError::UnknownKind(t.chars().take(32).collect())),
        }
    }
}

/// The answer to a stream's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Connected: the stream carries the bytes from here on.
    Ok,
    /// Not connected, and why (names the destination and the reason).
    Refused(String),
}

impl Reply {
    pub fn line(&self) -> String {
        match self {
            Reply::Ok => "ok\n".into(),
            Reply::Refused(why) => {
                // One short line whatever the reason says.
                let why: String = why
                    .chars()
                    .map(|c| {
                        if c.is_ascii() && !c.is_ascii_control() {
                            c
                        } else {
                            ' '
                        }
                    })
                    .take(MAX_LINE - "refused \n".len())
                    .collect();
                format!("refused {why}\n")
            }
        }
    }

    pub fn parse(line: &[u8]) -> Result<Reply, LineError> {
        let t = text(line)?;
        if t == "ok" {
            return Ok(Reply::Ok);
        }
        match t.strip_prefix("refused ") {
            Some(why) => Ok(Reply::Refused(why.to_string())),
            None => Err(LineError::BadReply(t.chars().take(32).collect())),
        }
    }
}

/// What a node lets the broker dial on it (k3s's `pod` mode): its own node address (the
/// kubelet and hostNetwork ports), its own pod CIDR, and the service CIDR (through its
/// kube-proxy). Nothing else: not loopback, not the node's private network, not the internet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow {
    pub node_ip: IpAddr,
    pub pod_cidr: Option<IpNet>,
    pub service_cidr: IpNet,
}

impl Allow {
    /// `Ok` when `to` may be dialled, else why not.
    pub fn check(&self, to: SocketAddr) -> Result<(), String> {
        let ip = to.ip();
        if ip == self.node_ip {
            return Ok(());
        }
        if self.pod_cidr.is_some_and(|c| c.contains(&ip)) {
            return Ok(());
        }
        if self.service_cidr.contains(&ip) {
            return Ok(());
        }
        Err(format!(
            "{to} is outside this node's address {}, its pod CIDR {} and the service CIDR {}",
            self.node_ip,
            self.pod_cidr
                .map(|c| c.to_string())
                .unwrap_or_else(|| "(not allocated yet)".into()),
            self.service_cidr
        ))
    }
}

impl fmt::Display for Open {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.line().trim_end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_strangers_are_refused() {
        for o in [Open::Api, Open::Connect("10.41.0.3:10250".parse().unwrap())] {
            assert_eq!(Open::parse(o.line().as_bytes()), Ok(o));
        }
        assert_eq!(
            Open::parse(b"connect [fd00::1]:443\n"),
            Ok(Open::Connect("[fd00::1]:443".parse().unwrap()))
        );
        assert_eq!(Open::parse(b"api"), Err(LineError::TooLong), "no newline");
        assert_eq!(
            Open::parse(format!("connect {}\n", "9".repeat(300)).as_bytes()),
            Err(LineError::TooLong)
        );
        assert!(matches!(
            Open::parse(b"shell\n"),
            Err(LineError::UnknownKind(_))
        ));
        assert!(matches!(
            Open::parse(b"connect example.com:80\n"),
            Err(LineError::BadAddress(_))
        ));
        assert_eq!(Open::parse(b"api\x00\n"), Err(LineError::NotText));
    }

    #[test]
    fn replies_round_trip_and_a_reason_stays_one_line() {
        assert_eq!(Reply::parse(b"ok\n"), Ok(Reply::Ok));
        let r = Reply::Refused("10.0.2.2:22 is outside\nthis node".into());
        let line = r.line();
        assert_eq!(line.matches('\n').count(), 1);
        assert_eq!(
            Reply::parse(line.as_bytes()),
            Ok(Reply::Refused("10.0.2.2:22 is outside this node".into()))
        );
        let long = Reply::Refused("x".repeat(1000)).line();
        assert!(long.len() <= MAX_LINE);
        assert!(Reply::parse(long.as_bytes()).is_ok());
    }

    #[test]
    fn a_node_lets_the_broker_dial_only_its_own_addresses_pods_and_services() {
        let a = Allow {
            node_ip: "10.41.0.2".parse().unwrap(),
            pod_cidr: Some("10.42.2.0/24".parse().unwrap()),
            service_cidr: "10.43.0.0/16".parse().unwrap(),
        };
        for ok in [
            "10.41.0.2:10250",
            "10.41.0.2:30080",
            "10.42.2.9:8080",
            "10.43.0.10:53",
        ] {
            assert!(a.check(ok.parse().unwrap()).is_ok(), "{ok}");
        }
        for no in [
            "127.0.0.1:10250",
            "10.0.2.2:22",
            "10.41.0.3:10250",
            "10.42.3.9:80",
            "169.254.169.254:80",
        ] {
            let e = a.check(no.parse().unwrap()).unwrap_err();
            assert!(e.starts_with(no), "{e}");
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_lines_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = Open::parse(&bytes);
            let _ = Reply::parse(&bytes);
        }
    }
}
