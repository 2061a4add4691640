//! Contract 1, the node identity: the small document the broker writes when a lease is
//! awarded and the node reads, read-only, from its identity disk (a file in tests).
//!
//! Version 3, JSON:
//!
//! ```json
//! {
//!   "version": 3,
//!   "cluster": "demo",
//!   "node": "demo-1",
//!   "server_url": "https://169.254.20.11:16443",
//!   "ca_cert_sha256": "sha256:<64 hex digits>",
//!   "join_token": "abcdef.0123456789abcdef",
//!   "broker": {"endpoint": "<64 hex digits>", "addrs": ["203.0.113.1:7443"]},
//!   "fleet": [{"endpoint": "<64 hex digits>", "addrs": ["203.0.113.2:7443"]}],
//!   "node_ip": "10.41.0.1",
//!   "relay_url": "https://203.0.113.1:3340",
//!   "fleet_relays": ["https://203.0.113.2:3340"],
//!   "relay_ca_cert": "-----BEGIN CERTIFICATE-----...",
//!   "mesh_secret_key": "<64 hex digits>",
//!   "cluster_cidr": "10.42.0.0/16",
//!   "service_cidr": "10.43.0.0/16",
//!   "cluster_domain": "cluster.local",
//!   "upstream_resolvers": ["172.31.255.1:53"],
//!   "labels": {"socialweb.computer/pool": "default"}
//! }
//! ```
//!
//! Every field is required except `upstream_resolvers` (empty: use the node's resolv.conf),
//! `labels`, `fleet` (the tunnel endpoints of the other broker hosts of a fleet, each like
//! `broker`: when `broker` does not take the node -- it does not run the node's cluster
//! now, or it is gone -- the node tries these in turn; it needs `broker`), and these three:
//! `fleet_relays` (the relays of the fleet's other hosts: the node keeps using the mesh
//! through them when `relay_url`'s host is gone, and dials peers and tunnels on every
//! relay), `broker`, the broker's tunnel endpoint (contract 9: the node
//! serves `server_url`, a node-local address, through it; absent: `server_url` is reached
//! directly, as the test harness's own control plane is), `node_ip`, the node's address,
//! unique in its cluster and reached over the mesh (absent: the agent's `--node-ip`), and
//! `relay_ca_cert`, the CA of the relay's TLS certificate when it is not one the node trusts
//! already. Exactly one of `ca_cert` (the control plane's CA, PEM) and `ca_cert_sha256` (a
//! pin of its public key, as kubeadm's `--discovery-token-ca-cert-hash`) is required;
//! unknown fields are refused. A malformed or partial document is an error that names the
//! field, and the agent refuses to start on it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde_json::{Map, Value};
use url::Url;

/// The version this code writes and reads.
pub const VERSION: u64 = 3;

/// What changed in each version, for the error an older document gets.
const CHANGES: &str = "version 2 added the control plane's CA (`ca_cert` or `ca_cert_sha256`) \
                       and made `join_token` a bootstrap token `<id>.<secret>`; version 3 \
                       added the broker's tunnel endpoint (`broker`), the node's address \
                       (`node_ip`) and the relay's CA (`relay_ca_cert`)";

/// A validated node identity.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    pub cluster: String,
    pub node: String,
    pub server_url: Url,
    /// How the node knows it talks to the real control plane.
    pub ca: CaTrust,
    pub join_token: BootstrapToken,
    /// The broker's tunnel endpoint, through which the node reaches `server_url`.
    pub broker: Option<BrokerEndpoint>,
    /// The other broker hosts' tunnel endpoints, tried when `broker` does not take the node.
    pub fleet: Vec<BrokerEndpoint>,
    /// The node's address in its cluster (the kubelet's `--node-ip`), reached over the mesh.
    pub node_ip: Option<IpAddr>,
    pub relay_url: Url,
    /// The relays of the fleet's other hosts, after `relay_url` (the renting host's).
    pub fleet_relays: Vec<Url>,
    /// The CA of the relay's certificate (PEM), when the node would not trust it otherwise.
    /// A fleet's hosts serve certificates from one CA, so one CA covers every relay.
    pub relay_ca: Option<String>,
    pub mesh_secret_key: MeshSecretKey,
    pub cluster_cidr: IpNet,
    pub service_cidr: IpNet,
    pub cluster_domain: String,
    pub upstream_resolvers: Vec<SocketAddr>,
    pub labels: BTreeMap<String, String>,
}

/// The broker's tunnel endpoint (contract 9): its endpoint id (64 hex digits) and the UDP
/// addresses it listens on (the relay is tried too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerEndpoint {
    pub endpoint: [u8; 32],
    pub addrs: Vec<SocketAddr>,
}

impl BrokerEndpoint {
    /// As the identity has it: `{"endpoint": "<64 hex>", "addrs": ["ip:port", ...]}`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "endpoint": hex(&self.endpoint),
            "addrs": self.addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        })
    }

    /// Reads one, as [`BrokerEndpoint::to_json`] writes it.
    pub fn from_json(v: &Value) -> Result<BrokerEndpoint, IdentityError> {
        broker_endpoint(v, "broker")
    }
}

/// The node's mesh secret key (an ed25519 key; its public half is the node's endpoint id).
#[derive(Clone, PartialEq, Eq)]
pub struct MeshSecretKey(pub [u8; 32]);

impl fmt::Debug for MeshSecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MeshSecretKey(<redacted>)")
    }
}

/// How the node trusts the control plane's certificate authority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaTrust {
    /// The CA certificate itself (PEM).
    Pem(String),
    /// SHA-256 of the CA certificate's SubjectPublicKeyInfo (DER), 32 bytes: the agent fetches
    /// the CA without credentials, checks it against this, and only then sends the token.
    Sha256Pin([u8; 32]),
}

impl CaTrust {
    /// The pin as the document spells it: `sha256:<64 hex digits>`.
    pub fn pin_text(pin: &[u8; 32]) -> String {
        format!("sha256:{}", hex(pin))
    }
}

/// A bootstrap token, `<id>.<secret>` (kubeadm's format: 6 and 16 characters of `[a-z0-9]`).
/// The id is public (it names the Secret `bootstrap-token-<id>`); the secret is never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    pub id: String,
    pub secret: String,
}

impl fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BootstrapToken({}.<redacted>)", self.id)
    }
}

impl BootstrapToken {
    /// Parses `<id>.<secret>`; the error never repeats the secret.
    pub fn parse(s: &str) -> Result<BootstrapToken, String> {
        let ok = |part: &str, len: usize| {
            part.len() == len
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        };
        match s.split_once('.') {
            Some((id, secret)) if ok(id, 6) && ok(secret, 16) => Ok(BootstrapToken {
                id: id.to_string(),
                secret: secret.to_string(),
            }),
            _ => Err(
                "must be a bootstrap token `<id>.<secret>`: 6 and 16 characters of a-z and 0-9"
                    .into(),
            ),
        }
    }

    /// The bearer token the kubelet sends: `<id>.<secret>`.
    pub fn expose(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl MeshSecretKey {
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Secrets stay out of logs.
        f.debug_struct("NodeIdentity")
            .field("cluster", &self.cluster)
            .field("node", &self.node)
            .field("server_url", &self.server_url.as_str())
            .field("ca", &self.ca)
            .field("join_token", &self.join_token)
            .field("broker", &self.broker)
            .field("fleet", &self.fleet)
            .field("node_ip", &self.node_ip)
            .field("relay_url", &self.relay_url.as_str())
            .field(
                "fleet_relays",
                &self
                    .fleet_relays
                    .iter()
                    .map(Url::as_str)
                    .collect::<Vec<_>>(),
            )
            .field("mesh_secret_key", &self.mesh_secret_key)
            .field("cluster_cidr", &self.cluster_cidr)
            .field("service_cidr", &self.service_cidr)
            .field("cluster_domain", &self.cluster_domain)
            .field("upstream_resolvers", &self.upstream_resolvers)
            .field("labels", &self.labels)
            .finish()
    }
}

/// What is wrong with an identity document, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("identity document: {field}: {problem}")]
pub struct IdentityError {
    /// The field at fault (`labels."x"` for a map entry, `(document)` for the whole).
    pub field: String,
    pub problem: String,
}

fn err(field: &str, problem: impl Into<String>) -> IdentityError {
    IdentityError {
        field: field.to_string(),
        problem: problem.into(),
    }
}

const FIELDS: &[&str] = &[
    "version",
    "cluster",
    "node",
    "server_url",
    "ca_cert",
    "ca_cert_sha256",
    "join_token",
    "broker",
    "fleet",
    "node_ip",
    "relay_url",
    "fleet_relays",
    "relay_ca_cert",
    "mesh_secret_key",
    "cluster_cidr",
    "service_cidr",
    "cluster_domain",
    "upstream_resolvers",
    "labels",
];

fn string<'a>(doc: &'a Map<String, Value>, field: &str) -> Result<&'a str, IdentityError> {
    match doc.get(field) {
        None | Some(Value::Null) => Err(err(field, "is missing")),
        Some(Value::String(s)) if s.trim().is_empty() => Err(err(field, "is empty")),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(err(
            field,
            format!("must be a string, found {}", kind(other)),
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// RFC 1123 label: what Kubernetes accepts as a node name component.
fn dns_label(field: &str, s: &str) -> Result<(), IdentityError> {
    let ok = s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(err(
            field,
            format!("{s:?} is not a DNS label (a-z, 0-9, '-', at most 63)"),
        ))
    }
}

fn dns_name(field: &str, s: &str) -> Result<(), IdentityError> {
    if s.len() > 253
        || s.split('.')
            .any(|l| l.is_empty() || dns_label(field, l).is_err())
    {
        return Err(err(field, format!("{s:?} is not a DNS name")));
    }
    Ok(())
}

fn url(doc: &Map<String, Value>, field: &str, schemes: &[&str]) -> Result<Url, IdentityError> {
    let s = string(doc, field)?;
    let u = Url::parse(s).map_err(|e| err(field, format!("{s:?} is not a URL: {e}")))?;
    if !schemes.contains(&u.scheme()) {
        return Err(err(
            field,
            format!("{s:?} must use {}", schemes.join(" or ")),
        ));
    }
    if u.host().is_none() {
        return Err(err(field, format!("{s:?} has no host")));
    }
    Ok(u)
}

fn cidr(doc: &Map<String, Value>, field: &str) -> Result<IpNet, IdentityError> {
    let s = string(doc, field)?;
    let net: IpNet = s
        .parse()
        .map_err(|_| err(field, format!("{s:?} is not a CIDR")))?;
    if net.trunc() != net {
        return Err(err(
            field,
            format!("{s:?} has host bits set (did you mean {}?)", net.trunc()),
        ));
    }
    Ok(net)
}

impl NodeIdentity {
    /// Parses and validates a document.
    pub fn from_json(bytes: &[u8]) -> Result<NodeIdentity, IdentityError> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| err("(document)", format!("not valid JSON: {e}")))?;
        let Value::Object(doc) = value else {
            return Err(err(
                "(document)",
                format!("must be a JSON object, found {}", kind(&value)),
            ));
        };
        // The version first: an older document's unknown or missing fields would only
        // distract from the real problem.
        match doc.get("version") {
            Some(Value::Number(n)) if n.as_u64() == Some(VERSION) => {}
            Some(Value::Number(n)) => {
                return Err(err(
                    "version",
                    format!(
                        "{n} is not supported: this agent reads version {VERSION} ({CHANGES}); \
                         ask the broker for a current identity document"
                    ),
                ));
            }
            None => return Err(err("version", "is missing")),
            Some(other) => {
                return Err(err(
                    "version",
                    format!("must be a number, found {}", kind(other)),
                ));
            }
        }
        if let Some(unknown) = doc.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(err(
                unknown,
                format!("is not a field of identity version {VERSION}"),
            ));
        }
        let cluster = string(&doc, "cluster")?.to_string();
        dns_label("cluster", &cluster)?;
        let node = string(&doc, "node")?.to_string();
        dns_label("node", &node)?;
        let server_url = url(&doc, "server_url", &["https"])?;
        let ca = match (doc.get("ca_cert"), doc.get("ca_cert_sha256")) {
            (Some(_), Some(_)) => {
                return Err(err(
                    "ca_cert_sha256",
                    "give either ca_cert or ca_cert_sha256, not both",
                ));
            }
            (Some(_), None) => CaTrust::Pem(pem_certificate(&doc, "ca_cert")?),
            (None, Some(_)) => {
                let s = string(&doc, "ca_cert_sha256")?;
                CaTrust::Sha256Pin(parse_pin(s).map_err(|p| err("ca_cert_sha256", p))?)
            }
            (None, None) => {
                return Err(err(
                    "ca_cert",
                    "is missing (give ca_cert, the CA in PEM, or ca_cert_sha256, a pin of it)",
                ));
            }
        };
        let join_token =
            BootstrapToken::parse(string(&doc, "join_token")?).map_err(|p| err("join_token", p))?;
        let relay_url = url(&doc, "relay_url", &["http", "https"])?;
        let fleet_relays = fleet_relays(&doc)?;
        let relay_ca = match doc.get("relay_ca_cert") {
            None | Some(Value::Null) => None,
            Some(_) => Some(pem_certificate(&doc, "relay_ca_cert")?),
        };
        let broker = match doc.get("broker") {
            None | Some(Value::Null) => None,
            Some(b) => Some(broker_endpoint(b, "broker")?),
        };
        let fleet = match doc.get("fleet") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) if broker.is_some() => items
                .iter()
                .enumerate()
                .map(|(i, b)| broker_endpoint(b, &format!("fleet[{i}]")))
                .collect::<Result<_, _>>()?,
            Some(Value::Array(_)) => {
                return Err(err(
                    "fleet",
                    "needs broker: the fleet's other hosts are tried after it",
                ));
            }
            Some(other) => {
                return Err(err(
                    "fleet",
                    format!("must be an array, found {}", kind(other)),
                ));
            }
        };
        if broker.is_some()
            && server_url
                .host_str()
                .and_then(|h| h.trim_matches(['[', ']']).parse::<IpAddr>().ok())
                .is_none()
        {
            return Err(err(
                "server_url",
                "with a broker tunnel the node serves server_url itself: its host must be an IP address",
            ));
        }
        let key_hex = string(&doc, "mesh_secret_key")?;
        let mesh_secret_key = parse_key(key_hex).map_err(|p| err("mesh_secret_key", p))?;
        let cluster_cidr = cidr(&doc, "cluster_cidr")?;
        let service_cidr = cidr(&doc, "service_cidr")?;
        if cluster_cidr.contains(&service_cidr) || service_cidr.contains(&cluster_cidr) {
            return Err(err(
                "service_cidr",
                format!("{service_cidr} overlaps cluster_cidr {cluster_cidr}"),
            ));
        }
        let cluster_domain = string(&doc, "cluster_domain")?
            .trim_end_matches('.')
            .to_string();
        dns_name("cluster_domain", &cluster_domain)?;
        let node_ip = match doc.get("node_ip") {
            None | Some(Value::Null) => None,
            Some(_) => {
                let s = string(&doc, "node_ip")?;
                let ip: IpAddr = s
                    .parse()
                    .map_err(|_| err("node_ip", format!("{s:?} is not an IP address")))?;
                if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() {
                    return Err(err("node_ip", format!("{ip} cannot be a node's address")));
                }
                if cluster_cidr.contains(&ip) || service_cidr.contains(&ip) {
                    return Err(err(
                        "node_ip",
                        format!(
                            "{ip} is inside cluster_cidr {cluster_cidr} or service_cidr {service_cidr}"
                        ),
                    ));
                }
                Some(ip)
            }
        };

        let upstream_resolvers = match doc.get("upstream_resolvers") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let field = format!("upstream_resolvers[{i}]");
                    let s = v.as_str().ok_or_else(|| {
                        err(&field, format!("must be a string, found {}", kind(v)))
                    })?;
                    parse_resolver(s).ok_or_else(|| {
                        err(&field, format!("{s:?} is not an IP address or IP:port"))
                    })
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(err(
                    "upstream_resolvers",
                    format!("must be an array, found {}", kind(other)),
                ));
            }
        };
        let labels = match doc.get("labels") {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| {
                    let field = format!("labels.{k:?}");
                    let v = v.as_str().ok_or_else(|| {
                        err(&field, format!("must be a string, found {}", kind(v)))
                    })?;
                    validate_label(k, v).map_err(|p| err(&field, p))?;
                    Ok((k.clone(), v.to_string()))
                })
                .collect::<Result<_, IdentityError>>()?,
            Some(other) => {
                return Err(err(
                    "labels",
                    format!("must be an object, found {}", kind(other)),
                ));
            }
        };
        Ok(NodeIdentity {
            cluster,
            node,
            server_url,
            ca,
            join_token,
            broker,
            fleet,
            node_ip,
            relay_url,
            fleet_relays,
            relay_ca,
            mesh_secret_key,
            cluster_cidr,
            service_cidr,
            cluster_domain,
            upstream_resolvers,
            labels,
        })
    }

    /// The document, as the broker writes it.
    pub fn to_json(&self) -> Value {
        let mut doc = serde_json::json!({
            "version": VERSION,
            "cluster": self.cluster,
            "node": self.node,
            "server_url": self.server_url.as_str(),
            "join_token": self.join_token.expose(),
            "relay_url": self.relay_url.as_str(),
            "mesh_secret_key": self.mesh_secret_key.to_hex(),
            "cluster_cidr": self.cluster_cidr.to_string(),
            "service_cidr": self.service_cidr.to_string(),
            "cluster_domain": self.cluster_domain,
            "upstream_resolvers": self.upstream_resolvers.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
            "labels": self.labels,
        });
        match &self.ca {
            CaTrust::Pem(pem) => doc["ca_cert"] = pem.clone().into(),
            CaTrust::Sha256Pin(pin) => doc["ca_cert_sha256"] = CaTrust::pin_text(pin).into(),
        }
        if let Some(b) = &self.broker {
            doc["broker"] = b.to_json();
        }
        if !self.fleet.is_empty() {
            doc["fleet"] = self.fleet.iter().map(BrokerEndpoint::to_json).collect();
        }
        if let Some(ip) = self.node_ip {
            doc["node_ip"] = ip.to_string().into();
        }
        if !self.fleet_relays.is_empty() {
            doc["fleet_relays"] = self.fleet_relays.iter().map(Url::as_str).collect();
        }
        if let Some(ca) = &self.relay_ca {
            doc["relay_ca_cert"] = ca.clone().into();
        }
        doc
    }

    /// Every relay the node may use: the renting host's first, then the fleet's others.
    pub fn relays(&self) -> Vec<Url> {
        let mut all = vec![self.relay_url.clone()];
        for r in &self.fleet_relays {
            if !all.contains(r) {
                all.push(r.clone());
            }
        }
        all
    }
}

/// `fleet_relays`: an array of relay URLs (http or https), each named `fleet_relays[i]` when
/// it is wrong.
fn fleet_relays(doc: &Map<String, Value>) -> Result<Vec<Url>, IdentityError> {
    match doc.get("fleet_relays") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let field = format!("fleet_relays[{i}]");
                let mut one = Map::new();
                one.insert(field.clone(), v.clone());
                url(&one, &field, &["http", "https"])
            })
            .collect(),
        Some(other) => Err(err(
            "fleet_relays",
            format!("must be an array, found {}", kind(other)),
        )),
    }
}

fn pem_certificate(doc: &Map<String, Value>, field: &str) -> Result<String, IdentityError> {
    let pem = string(doc, field)?;
    if !pem.contains("-----BEGIN CERTIFICATE-----") || !pem.contains("-----END CERTIFICATE-----") {
        return Err(err(
            field,
            "must be a PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(pem.to_string())
}

/// `broker` (or an entry of `fleet`, named `field`): `{"endpoint": "<64 hex>", "addrs":
/// ["ip:port", ...]}`.
fn broker_endpoint(v: &Value, field: &str) -> Result<BrokerEndpoint, IdentityError> {
    let b = match v {
        Value::Object(b) => b,
        other => {
            return Err(err(
                field,
                format!("must be an object, found {}", kind(other)),
            ));
        }
    };
    if let Some(k) = b
        .keys()
        .find(|k| !matches!(k.as_str(), "endpoint" | "addrs"))
    {
        return Err(err(
            &format!("{field}.{k}"),
            "is not a field of a broker endpoint",
        ));
    }
    let at = |f: &str| format!("{field}.{f}");
    let endpoint = string(b, "endpoint")
        .map_err(|e| err(&at("endpoint"), e.problem))
        .and_then(|s| {
            parse_key(s)
                .map(|k| k.0)
                .map_err(|p| err(&at("endpoint"), p))
        })?;
    let addrs = match b.get("addrs") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let field = format!("{field}.addrs[{i}]");
                v.as_str()
                    .and_then(|s| s.parse::<SocketAddr>().ok())
                    .ok_or_else(|| err(&field, format!("{v} is not an ip:port")))
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(err(
                &at("addrs"),
                format!("must be an array, found {}", kind(other)),
            ));
        }
    };
    Ok(BrokerEndpoint { endpoint, addrs })
}

fn parse_pin(s: &str) -> Result<[u8; 32], String> {
    let hex = s
        .strip_prefix("sha256:")
        .ok_or("must start with `sha256:` (kubeadm's --discovery-token-ca-cert-hash format)")?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("must be `sha256:` and 64 hexadecimal digits".into());
    }
    let mut pin = [0u8; 32];
    for (i, byte) in pin.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(pin)
}

fn parse_key(s: &str) -> Result<MeshSecretKey, String> {
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("must be 64 hexadecimal digits (32 bytes)".into());
    }
    let mut key = [0u8; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    if key == [0u8; 32] {
        return Err("is all zeroes".into());
    }
    Ok(MeshSecretKey(key))
}

/// `1.2.3.4`, `1.2.3.4:5353`, `::1`, `[::1]:53`.
pub fn parse_resolver(s: &str) -> Option<SocketAddr> {
    s.parse::<SocketAddr>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)))
}

/// Whether a kubelet may set a label with this prefix on its own Node (`--node-labels`):
/// outside kubernetes.io and k8s.io anything; inside, only the kubelet's and node's own
/// namespaces and the well-known keys (kubelet's `KnownLabels`).
fn kubelet_may_set(key: &str, prefix: &str) -> bool {
    const KNOWN: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
    ];
    let reserved = |d: &str| prefix == d || prefix.ends_with(&format!(".{d}"));
    if !reserved("kubernetes.io") && !reserved("k8s.io") {
        return true;
    }
    KNOWN.contains(&key)
        || ["kubelet.kubernetes.io", "node.kubernetes.io"]
            .iter()
            .any(|ns| prefix == *ns || prefix.ends_with(&format!(".{ns}")))
}

/// Kubernetes label rules: optional DNS-name prefix and `/`, a name of at most 63 of
/// `[A-Za-z0-9._-]` starting and ending alphanumeric; values likewise (or empty).
fn validate_label(key: &str, value: &str) -> Result<(), String> {
    fn name_ok(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
    }
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if dns_name("labels", prefix).is_err() {
                return Err(format!("key prefix {prefix:?} is not a DNS name"));
            }
            name
        }
        None => key,
    };
    if !name_ok(name) {
        return Err(format!("key {key:?} is not a valid label name"));
    }
    if let Some((prefix, _)) = key.split_once('/')
        && !kubelet_may_set(key, prefix)
    {
        return Err(format!(
            "key {key:?}: a kubelet may not set labels under {prefix:?} (the kubelet refuses \
             to start with it; NodeRestriction reserves kubernetes.io and k8s.io)"
        ));
    }
    if !value.is_empty() && !name_ok(value) {
        return Err(format!("value {value:?} is not a valid label value"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> Value {
        serde_json::json!({
            "version": 3,
            "cluster": "demo",
            "node": "node-1",
            "server_url": "https://172.31.255.1:6443",
            "ca_cert_sha256": format!("sha256:{}", "ab".repeat(32)),
            "join_token": "abcdef.0123456789abcdef",
            "relay_url": "http://172.31.255.1:3340",
            "mesh_secret_key": "11".repeat(32),
            "cluster_cidr": "10.42.0.0/16",
            "service_cidr": "10.43.0.0/16",
            "cluster_domain": "cluster.local",
            "upstream_resolvers": ["172.31.255.1", "[::1]:5353"],
            "labels": {"socialweb.computer/pool": "default"},
        })
    }

    fn parse(v: &Value) -> Result<NodeIdentity, IdentityError> {
        NodeIdentity::from_json(v.to_string().as_bytes())
    }

    #[test]
    fn a_good_document_round_trips() {
        let id = parse(&good()).unwrap();
        assert_eq!(id.node, "node-1");
        assert_eq!(id.upstream_resolvers[0], "172.31.255.1:53".parse().unwrap());
        assert_eq!(id.upstream_resolvers[1], "[::1]:5353".parse().unwrap());
        assert_eq!(parse(&id.to_json()).unwrap(), id);
        let debug = format!("{id:?}");
        assert!(
            !debug.contains("0123456789abcdef") && !debug.contains(&"11".repeat(32)),
            "{debug}"
        );
        assert!(debug.contains("abcdef.<redacted>"), "{debug}");
        assert_eq!(id.ca, CaTrust::Sha256Pin([0xab; 32]));
        let mut pem = good();
        pem.as_object_mut().unwrap().remove("ca_cert_sha256");
        pem["ca_cert"] = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into();
        let id = parse(&pem).unwrap();
        assert!(matches!(id.ca, CaTrust::Pem(_)));
        assert_eq!(parse(&id.to_json()).unwrap(), id);
    }

    #[test]
    fn the_tunnel_node_address_and_relay_ca_round_trip() {
        let mut doc = good();
        doc["server_url"] = "https://169.254.20.11:16443".into();
        doc["broker"] =
            serde_json::json!({"endpoint": "cd".repeat(32), "addrs": ["203.0.113.1:7443"]});
        doc["node_ip"] = "10.41.0.7".into();
        doc["relay_ca_cert"] =
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into();
        let id = parse(&doc).unwrap();
        let b = id.broker.as_ref().unwrap();
        assert_eq!(b.endpoint, [0xcd; 32]);
        assert_eq!(b.addrs, ["203.0.113.1:7443".parse::<SocketAddr>().unwrap()]);
        assert_eq!(id.node_ip, Some("10.41.0.7".parse().unwrap()));
        assert!(id.relay_ca.is_some());
        assert_eq!(parse(&id.to_json()).unwrap(), id);
        let mut named = doc.clone();
        named["server_url"] = "https://api.example:16443".into();
        assert_eq!(
            parse(&named).unwrap_err().field,
            "server_url",
            "the node binds it"
        );
        for (b, field) in [
            (serde_json::json!({"endpoint": "zz"}), "broker.endpoint"),
            (
                serde_json::json!({"endpoint": "cd".repeat(32), "addrs": ["nope"]}),
                "broker.addrs[0]",
            ),
            (
                serde_json::json!({"endpoint": "cd".repeat(32), "port": 1}),
                "broker.port",
            ),
        ] {
            let mut bad = doc.clone();
            bad["broker"] = b;
            assert_eq!(parse(&bad).unwrap_err().field, field);
        }
    }

    #[test]
    fn the_fleets_other_hosts_round_trip_and_need_a_broker() {
        let mut doc = good();
        doc["server_url"] = "https://169.254.20.11:16443".into();
        doc["broker"] =
            serde_json::json!({"endpoint": "cd".repeat(32), "addrs": ["203.0.113.1:7443"]});
        doc["fleet"] = serde_json::json!([
            {"endpoint": "ef".repeat(32), "addrs": ["203.0.113.2:7443"]},
            {"endpoint": "01".repeat(32)},
        ]);
        let id = parse(&doc).unwrap();
        assert_eq!(id.fleet.len(), 2);
        assert_eq!(id.fleet[0].endpoint, [0xef; 32]);
        assert!(id.fleet[1].addrs.is_empty());
        assert_eq!(parse(&id.to_json()).unwrap(), id);
        for (fleet, field) in [
            (serde_json::json!({"endpoint": "ef"}), "fleet"),
            (serde_json::json!([{"endpoint": "zz"}]), "fleet[0].endpoint"),
            (
                serde_json::json!([{"endpoint": "ef".repeat(32)}, {"endpoint": "ef".repeat(32), "addrs": [1]}]),
                "fleet[1].addrs[0]",
            ),
        ] {
            let mut bad = doc.clone();
            bad["fleet"] = fleet;
            assert_eq!(parse(&bad).unwrap_err().field, field);
        }
        let mut alone = doc.clone();
        alone.as_object_mut().unwrap().remove("broker");
        assert_eq!(parse(&alone).unwrap_err().field, "fleet");
    }

    #[test]
    fn the_fleets_relays_round_trip_after_the_renting_hosts_and_each_bad_one_is_named() {
        let mut doc = good();
        doc["fleet_relays"] = serde_json::json!([
            "https://203.0.113.2:3340",
            "http://172.31.255.1:3340",
            "https://203.0.113.3:3340"
        ]);
        let id = parse(&doc).unwrap();
        assert_eq!(parse(&id.to_json()).unwrap(), id);
        // The renting host's relay first, each once (the second entry repeats it).
        let relays: Vec<String> = id.relays().iter().map(|u| u.to_string()).collect();
        assert_eq!(
            relays,
            [
                "http://172.31.255.1:3340/",
                "https://203.0.113.2:3340/",
                "https://203.0.113.3:3340/"
            ]
        );
        // Without any: the renting host's relay alone, and the document does not name them.
        let single = parse(&good()).unwrap();
        assert_eq!(single.relays(), std::slice::from_ref(&single.relay_url));
        assert!(single.to_json().get("fleet_relays").is_none());
        for (bad, field) in [
            (
                serde_json::json!("https://203.0.113.2:3340"),
                "fleet_relays",
            ),
            (serde_json::json!(["https://a:1", 7]), "fleet_relays[1]"),
            (serde_json::json!(["ftp://a:1"]), "fleet_relays[0]"),
            (serde_json::json!(["not a url"]), "fleet_relays[0]"),
        ] {
            let mut d = doc.clone();
            d["fleet_relays"] = bad;
            assert_eq!(parse(&d).unwrap_err().field, field);
        }
    }

    #[test]
    fn an_older_version_is_told_which_version_is_expected() {
        let mut doc = good();
        doc["version"] = 1.into();
        doc.as_object_mut().unwrap().remove("ca_cert_sha256");
        let e = parse(&doc).unwrap_err();
        assert_eq!(e.field, "version");
        assert!(e.problem.contains("reads version 3"), "{e}");
        assert!(e.problem.contains("ca_cert"), "{e}");
    }

    #[test]
    fn the_ca_is_required_once() {
        let mut doc = good();
        doc.as_object_mut().unwrap().remove("ca_cert_sha256");
        let e = parse(&doc).unwrap_err();
        assert_eq!(e.field, "ca_cert");
        assert!(e.problem.contains("missing"), "{e}");
        let mut doc = good();
        doc["ca_cert"] = "x".into();
        assert!(parse(&doc).unwrap_err().problem.contains("not both"));
        let mut doc = good();
        doc.as_object_mut().unwrap().remove("ca_cert_sha256");
        doc["ca_cert"] = "not pem".into();
        assert_eq!(parse(&doc).unwrap_err().field, "ca_cert");
    }

    #[test]
    fn a_bad_token_is_refused_without_repeating_it() {
        for bad in [
            "secret-token",
            "abcdef.short",
            "ABCDEF.0123456789abcdef",
            "abcdef0123456789abcdef",
        ] {
            let mut doc = good();
            doc["join_token"] = bad.into();
            let e = parse(&doc).unwrap_err();
            assert_eq!(e.field, "join_token", "{bad}");
            assert!(!e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn labels_the_kubelet_would_refuse_are_refused_here() {
        for (key, ok) in [
            ("socialweb.computer/pool", true),
            ("node.kubernetes.io/instance-type", true),
            ("topology.kubernetes.io/zone", true),
            ("kubelet.kubernetes.io/x", true),
            ("node-role.kubernetes.io/worker", false),
            ("kubernetes.io/role", false),
            ("example.k8s.io/x", false),
        ] {
            let mut doc = good();
            doc["labels"] = serde_json::json!({ key: "v" });
            assert_eq!(parse(&doc).is_ok(), ok, "{key}");
        }
    }

    #[test]
    fn every_required_field_is_named_when_missing() {
        for field in FIELDS.iter().filter(|f| {
            !matches!(
                **f,
                "upstream_resolvers"
                    | "labels"
                    | "ca_cert"
                    | "ca_cert_sha256"
                    | "broker"
                    | "fleet"
                    | "fleet_relays"
                    | "node_ip"
                    | "relay_ca_cert"
            )
        }) {
            let mut doc = good();
            doc.as_object_mut().unwrap().remove(*field);
            let e = parse(&doc).unwrap_err();
            assert_eq!(e.field, *field, "{e}");
            assert!(e.problem.contains("missing"), "{e}");
        }
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases: &[(&str, Value, &str)] = &[
            ("version", 4.into(), "not supported"),
            ("node_ip", "10.42.0.9".into(), "inside cluster_cidr"),
            ("node_ip", "127.0.0.1".into(), "cannot be a node's address"),
            ("node_ip", "node-1".into(), "not an IP address"),
            ("broker", "x".into(), "must be an object"),
            ("relay_ca_cert", "not pem".into(), "PEM certificate"),
            ("ca_cert_sha256", "ab".repeat(32).into(), "sha256:"),
            ("ca_cert_sha256", "sha256:abc".into(), "64 hexadecimal"),
            ("node", "Node_1".into(), "DNS label"),
            ("server_url", "http://x:6443".into(), "https"),
            ("relay_url", "not a url".into(), "not a URL"),
            ("mesh_secret_key", "abc".into(), "64 hexadecimal"),
            ("mesh_secret_key", "00".repeat(32).into(), "zeroes"),
            ("cluster_cidr", "10.42.0.1/16".into(), "host bits"),
            ("service_cidr", "10.42.128.0/17".into(), "overlaps"),
            ("cluster_domain", "bad..domain".into(), "DNS name"),
            ("join_token", 5.into(), "must be a string"),
            ("join_token", "  ".into(), "empty"),
            ("join_token", "abc.def".into(), "bootstrap token"),
        ];
        for (field, value, needle) in cases {
            let mut doc = good();
            doc[*field] = value.clone();
            let e = parse(&doc).unwrap_err();
            assert_eq!(e.field, *field, "{e}");
            assert!(e.problem.contains(needle), "{e}");
        }
        let mut doc = good();
        doc["upstream_resolvers"] = serde_json::json!(["1.1.1.1", "nope"]);
        assert_eq!(parse(&doc).unwrap_err().field, "upstream_resolvers[1]");
        let mut doc = good();
        doc["labels"] = serde_json::json!({"bad key!": "x"});
        assert!(parse(&doc).unwrap_err().field.starts_with("labels."));
        let mut doc = good();
        doc["surprise"] = true.into();
        assert_eq!(parse(&doc).unwrap_err().field, "surprise");
        assert_eq!(
            NodeIdentity::from_json(b"[1]").unwrap_err().field,
            "(document)"
        );
        assert_eq!(
            NodeIdentity::from_json(b"{").unwrap_err().field,
            "(document)"
        );
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            let _ = NodeIdentity::from_json(&bytes);
        }

        #[test]
        fn arbitrary_strings_in_every_field_never_panic(field in 0..FIELDS.len(), s in ".{0,80}") {
            let mut doc = good();
            doc[FIELDS[field]] = s.into();
            let _ = parse(&doc);
        }
    }
}
