//! The plugin's network configuration (stdin), parsed and validated without I/O. Every error
//! names the field it is about.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use ipnet::Ipv4Net;
use serde::Deserialize;

use crate::spec::{CniError, CniResult, Code, Verb, check_version};

/// Where allocations are kept unless `dataDir` says otherwise.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/socialweb";
/// The bridge unless `bridge` says otherwise.
pub const DEFAULT_BRIDGE: &str = "cni0";
/// The mesh carries 1280-byte packets (the IPv6 minimum), so pods default to it.
pub const DEFAULT_MTU: u32 = 1280;

/// Keys the spec defines for every plugin configuration, and the runtime-injected ones.
const STANDARD_KEYS: &[&str] = &[
    "cniVersion",
    "cniVersions",
    "name",
    "type",
    "args",
    "capabilities",
    "runtimeConfig",
    "prevResult",
    "dns",
    "disableCheck",
    "disableGC",
    "cni.dev/valid-attachments",
    "cni.dev/attachments",
];

/// Keys of this plugin.
const OWN_KEYS: &[&str] = &[
    "bridge",
    "subnet",
    "gateway",
    "mtu",
    "hairpinMode",
    "isDefaultGateway",
    "dataDir",
];

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConf {
    pub cni_version: String,
    /// The network's name; allocations are kept per network.
    pub name: String,
    pub bridge: String,
    pub subnet: Ipv4Net,
    pub gateway: Ipv4Addr,
    pub mtu: u32,
    pub hairpin: bool,
    pub default_route: bool,
    pub data_dir: PathBuf,
    pub prev_result: Option<CniResult>,
    /// GC only: the attachments the runtime still knows about.
    pub valid_attachments: Option<Vec<Attachment>>,
}

/// A (container, interface) pair the runtime vouches for.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    cni_version: Option<String>,
    name: Option<String>,
    bridge: Option<String>,
    subnet: Option<String>,
    gateway: Option<String>,
    mtu: Option<u32>,
    hairpin_mode: Option<bool>,
    is_default_gateway: Option<bool>,
    data_dir: Option<String>,
    prev_result: Option<serde_json::Value>,
    #[serde(rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<Attachment>>,
}

fn invalid(field: &str, msg: impl std::fmt::Display) -> CniError {
    CniError::new(Code::InvalidConfig, format!("{field}: {msg}"))
}

/// The `cniVersion` of a configuration, read before anything else so that even an error
/// about the rest of the document is written in the caller's version. Falls back to the
/// current version when the document has none or is not JSON.
pub fn peek_version(stdin: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()?
        .get("cniVersion")?
        .as_str()
        .map(str::to_string)
}

/// Parses and validates a configuration for `verb`.
pub fn parse(stdin: &[u8], verb: Verb) -> Result<NetConf, CniError> {
    let value: serde_json::Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            Code::Decode,
            "the network configuration on stdin is not valid JSON",
        )
        .with_details(e.to_string())
    })?;
    let object = value.as_object().ok_or_else(|| {
        CniError::new(
            Code::Decode,
            "the network configuration on stdin is not a JSON object",
        )
    })?;
    for (key, val) in object {
        if !STANDARD_KEYS.contains(&key.as_str()) && !OWN_KEYS.contains(&key.as_str()) {
            let hint = if key == "ipam" {
                "this plugin does its own IPAM from `subnet`; remove the ipam section".to_string()
            } else {
                format!("this plugin's keys are: {}", OWN_KEYS.join(", "))
            };
            return Err(CniError::new(
                Code::UnsupportedField,
                format!("unsupported field {key:?} (value {val})"),
            )
            .with_details(hint));
        }
    }
    let raw: Raw = serde_json::from_value(value).map_err(|e| {
        CniError::new(
            Code::Decode,
            "the network configuration has a field of the wrong type",
        )
        .with_details(e.to_string())
    })?;

    let cni_version = raw
        .cni_version
        .ok_or_else(|| invalid("cniVersion", "is required"))?;
    check_version(&cni_version, verb)?;
    let name = raw.name.ok_or_else(|| invalid("name", "is required"))?;
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(invalid(
            "name",
            format!("{name:?} is not a usable network name"),
        ));
    }
    let bridge = raw.bridge.unwrap_or_else(|| DEFAULT_BRIDGE.to_string());
    if bridge.is_empty() || bridge.len() > 15 || bridge.contains('/') {
        return Err(invalid(
            "bridge",
            format!("{bridge:?} is not a valid interface name"),
        ));
    }

    let subnet_text = raw.subnet.ok_or_else(|| invalid("subnet", "is required"))?;
    let subnet: Ipv4Net = subnet_text
        .parse()
        .map_err(|_| invalid("subnet", format!("{subnet_text:?} is not an IPv4 CIDR")))?;
    if subnet.network() != subnet.addr() {
        return Err(invalid(
            "subnet",
            format!(
                "{subnet_text:?} is not a network: host bits are set (did you mean {}?)",
                subnet.trunc()
            ),
        ));
    }
    if subnet.prefix_len() > 30 {
        return Err(invalid(
            "subnet",
            format!("{subnet_text:?} has no room for pods (/30 at most)"),
        ));
    }
    let gateway = match raw.gateway {
        Some(g) => {
            let gw: Ipv4Addr = g
                .parse()
                .map_err(|_| invalid("gateway", format!("{g:?} is not an IPv4 address")))?;
            if !subnet.contains(&gw) || gw == subnet.network() || gw == subnet.broadcast() {
                return Err(invalid(
                    "gateway",
                    format!("{g} is not a host address of {subnet}"),
                ));
            }
            gw
        }
        None => first_host(subnet),
    };
    let mtu = raw.mtu.unwrap_or(DEFAULT_MTU);
    if !(576..=65535).contains(&mtu) {
        return Err(invalid("mtu", format!("{mtu} is outside 576..=65535")));
    }
    let prev_result = match raw.prev_result {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(serde_json::from_value(v).map_err(|e| {
            CniError::new(Code::Decode, "prevResult is not a CNI result")
                .with_details(e.to_string())
        })?),
    };
    if verb == Verb::Gc && raw.valid_attachments.is_none() {
        return Err(invalid("cni.dev/valid-attachments", "is required for GC"));
    }
    Ok(NetConf {
        cni_version,
        name,
        bridge,
        subnet,
        gateway,
        mtu,
        hairpin: raw.hairpin_mode.unwrap_or(true),
        default_route: raw.is_default_gateway.unwrap_or(true),
        data_dir: PathBuf::from(raw.data_dir.unwrap_or_else(|| DEFAULT_DATA_DIR.to_string())),
        prev_result,
        valid_attachments: raw.valid_attachments,
    })
}

/// The first host address of a subnet: the bridge's address by default.
pub fn first_host(subnet: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(json: &str) -> Result<NetConf, CniError> {
        parse(json.as_bytes(), Verb::Add)
    }

    #[test]
    fn a_minimal_configuration_gets_the_defaults() {
        let c = conf(r#"{"cniVersion":"1.1.0","name":"pods","type":"socialweb-cni","subnet":"10.42.3.0/24"}"#)
            .unwrap();
        assert_eq!(c.bridge, "cni0");
        assert_eq!(c.gateway, Ipv4Addr::new(10, 42, 3, 1));
        assert_eq!(c.mtu, 1280);
        assert!(c.hairpin && c.default_route);
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                r#"{"cniVersion":"1.1.0","name":"p","subnet":"10.42.3.7/24"}"#,
                Code::InvalidConfig,
                "subnet",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"p","subnet":"banana"}"#,
                Code::InvalidConfig,
                "subnet",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"p"}"#,
                Code::InvalidConfig,
                "subnet",
            ),
            (
                r#"{"cniVersion":"1.1.0","subnet":"10.0.0.0/24"}"#,
                Code::InvalidConfig,
                "name",
            ),
            (
                r#"{"name":"p","subnet":"10.0.0.0/24"}"#,
                Code::InvalidConfig,
                "cniVersion",
            ),
            (
                r#"{"cniVersion":"0.2.0","name":"p","subnet":"10.0.0.0/24"}"#,
                Code::IncompatibleVersion,
                "0.2.0",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"p","subnet":"10.0.0.0/24","gateway":"10.0.1.1"}"#,
                Code::InvalidConfig,
                "gateway",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"p","subnet":"10.0.0.0/24","mtu":100}"#,
                Code::InvalidConfig,
                "mtu",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"p","subnet":"10.0.0.0/24","subnett":"x"}"#,
                Code::UnsupportedField,
                "subnett",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"p","subnet":"10.0.0.0/24","ipam":{}}"#,
                Code::UnsupportedField,
                "ipam",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"p","subnet":"10.0.0.0/24","mtu":"big"}"#,
                Code::Decode,
                "type",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"p","subnet":"10.0.0.0/31"}"#,
                Code::InvalidConfig,
                "subnet",
            ),
            ("{not json", Code::Decode, "JSON"),
            ("[1,2]", Code::Decode, "object"),
        ];
        for (json, code, needle) in cases {
            let e = conf(json).unwrap_err();
            assert_eq!(e.code, code, "{json}: {e}");
            assert!(
                e.to_string().contains(needle),
                "{json}: {e} should mention {needle}"
            );
        }
    }

    #[test]
    fn gc_needs_the_valid_attachments() {
        let base = r#"{"cniVersion":"1.1.0","name":"p","subnet":"10.0.0.0/24""#;
        let e = parse(format!("{base}}}").as_bytes(), Verb::Gc).unwrap_err();
        assert!(e.msg.contains("cni.dev/valid-attachments"));
        let c = parse(
            format!(
                r#"{base},"cni.dev/valid-attachments":[{{"containerID":"a","ifname":"eth0"}}]}}"#
            )
            .as_bytes(),
            Verb::Gc,
        )
        .unwrap();
        assert_eq!(c.valid_attachments.unwrap()[0].container_id, "a");
    }

    #[test]
    fn the_version_is_read_even_from_a_broken_document() {
        assert_eq!(
            peek_version(br#"{"cniVersion":"1.0.0","subnet":7}"#).as_deref(),
            Some("1.0.0")
        );
        assert_eq!(peek_version(b"{nope"), None);
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Arbitrary bytes on stdin: an error result, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            for verb in [Verb::Add, Verb::Del, Verb::Check, Verb::Status, Verb::Gc] {
                let _ = parse(&bytes, verb);
            }
            let _ = peek_version(&bytes);
        }

        /// Structurally valid JSON with arbitrary values in our fields.
        #[test]
        fn arbitrary_field_values_never_panic(
            subnet in ".{0,24}", gateway in ".{0,20}", mtu in any::<i64>(),
            bridge in ".{0,20}", name in ".{0,20}",
        ) {
            let doc = serde_json::json!({
                "cniVersion": "1.1.0", "name": name, "subnet": subnet, "gateway": gateway,
                "mtu": mtu, "bridge": bridge,
            });
            let _ = parse(doc.to_string().as_bytes(), Verb::Add);
        }
    }
}
