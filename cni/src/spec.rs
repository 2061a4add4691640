//! The CNI protocol (spec 1.1.0), pure: verbs, the runtime's environment, result and error
//! formats, version negotiation. No I/O here; `main.rs` feeds it the process environment and
//! stdin and prints what it returns.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Versions this plugin reads configurations of and writes results for, oldest first.
/// 0.4.0 is the first with CHECK; older ones lack verbs the runtime may call.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.4.0", "1.0.0", "1.1.0"];

/// The newest version, reported by VERSION.
pub const CURRENT_VERSION: &str = "1.1.0";

/// Error codes from the spec's table, plus this plugin's own (100 and up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    IncompatibleVersion = 1,
    UnsupportedField = 2,
    ContainerUnknown = 3,
    InvalidEnvironment = 4,
    Io = 5,
    Decode = 6,
    InvalidConfig = 7,
    TryAgainLater = 11,
    NotAvailable = 50,
    LimitedConnectivity = 51,
    /// A kernel (netlink) operation failed.
    Netlink = 100,
    /// No address is free in the subnet.
    PoolExhausted = 101,
    /// CHECK found the container's network not as ADD left it.
    CheckFailed = 102,
    /// ADD for an attachment that exists: the container already has this interface (or the
    /// host end this attachment would get exists).
    AttachmentExists = 103,
}

/// An error result: printed as JSON on stdout, with a non-zero exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: Code,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: Code, msg: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> CniError {
        self.details = details.into();
        self
    }

    /// The JSON error object, in the version the caller asked for.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut v = serde_json::json!({
            "cniVersion": cni_version,
            "code": self.code as u32,
            "msg": self.msg,
        });
        if !self.details.is_empty() {
            v["details"] = self.details.clone().into();
        }
        v
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.msg, self.code as u32)?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

/// A namespace that cannot be opened or entered is the runtime's container gone (code 3);
/// anything else the kernel refused is code 100, naming the step.
impl From<socialweb_netlink::Error> for CniError {
    fn from(e: socialweb_netlink::Error) -> CniError {
        let code = match e {
            socialweb_netlink::Error::Namespace { .. } => Code::ContainerUnknown,
            _ => Code::Netlink,
        };
        CniError::new(code, e.to_string())
    }
}

/// The verbs of spec 1.1.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Verb {
    pub fn parse(s: &str) -> Result<Verb, CniError> {
        Ok(match s {
            "ADD" => Verb::Add,
            "DEL" => Verb::Del,
            "CHECK" => Verb::Check,
            "STATUS" => Verb::Status,
            "GC" => Verb::Gc,
            "VERSION" => Verb::Version,
            other => {
                return Err(CniError::new(
                    Code::InvalidEnvironment,
                    format!("CNI_COMMAND: unknown verb {other:?}"),
                )
                .with_details("expected one of ADD, DEL, CHECK, STATUS, GC, VERSION"));
            }
        })
    }

    /// The verbs a configuration version allows (STATUS and GC came with 1.1.0, CHECK with
    /// 0.4.0).
    fn minimum_version(self) -> &'static str {
        match self {
            Verb::Status | Verb::Gc => "1.1.0",
            Verb::Check => "0.4.0",
            _ => "0.1.0",
        }
    }
}

/// What the runtime passes in `CNI_*` variables, validated for the verb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Env {
    pub verb: Verb,
    pub container_id: String,
    pub netns: Option<String>,
    pub ifname: String,
    pub args: BTreeMap<String, String>,
}

impl Env {
    /// Reads the `CNI_*` variables from `get` (the process environment in production, a map in
    /// tests). The spec's rules: ADD and CHECK need all of CNI_CONTAINERID, CNI_NETNS,
    /// CNI_IFNAME; DEL needs CNI_CONTAINERID and CNI_IFNAME and tolerates a missing
    /// CNI_NETNS; STATUS, GC and VERSION need none of them.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Env, CniError> {
        let verb =
            Verb::parse(&get("CNI_COMMAND").ok_or_else(|| {
                CniError::new(Code::InvalidEnvironment, "CNI_COMMAND is not set")
            })?)?;
        let need = |name: &str| -> Result<String, CniError> {
            match get(name) {
                Some(v) if !v.is_empty() => Ok(v),
                _ => Err(CniError::new(
                    Code::InvalidEnvironment,
                    format!("{name} is required for {verb:?} and is not set"),
                )),
            }
        };
        let (container_id, netns, ifname) = match verb {
            Verb::Add | Verb::Check => (
                need("CNI_CONTAINERID")?,
                Some(need("CNI_NETNS")?),
                need("CNI_IFNAME")?,
            ),
            Verb::Del => (
                need("CNI_CONTAINERID")?,
                get("CNI_NETNS").filter(|s| !s.is_empty()),
                need("CNI_IFNAME")?,
            ),
            Verb::Status | Verb::Gc | Verb::Version => (String::new(), None, String::new()),
        };
        if !container_id.is_empty() && !valid_container_id(&container_id) {
            return Err(CniError::new(
                Code::InvalidEnvironment,
                format!("CNI_CONTAINERID {container_id:?} is not a valid container id"),
            )
            .with_details("it must start with a letter or digit and contain only letters, digits, '_', '.' and '-'"));
        }
        if !ifname.is_empty() {
            validate_ifname(&ifname)?;
        }
        let args = parse_cni_args(&get("CNI_ARGS").unwrap_or_default())?;
        Ok(Env {
            verb,
            container_id,
            netns,
            ifname,
            args,
        })
    }
}

/// The spec's rule for container ids: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
fn valid_container_id(id: &str) -> bool {
    let mut chars = id.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Interface names: 1..=15 bytes, not `.` or `..`, no `/`, `:` or white space.
fn validate_ifname(name: &str) -> Result<(), CniError> {
    let bad = name.is_empty()
        || name.len() > 15
        || name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace());
    if bad {
        return Err(CniError::new(
            Code::InvalidEnvironment,
            format!("CNI_IFNAME {name:?} is not a valid interface name"),
        )
        .with_details("1 to 15 characters, no '/', ':' or white space"));
    }
    Ok(())
}

/// `CNI_ARGS`: `K1=V1;K2=V2`.
fn parse_cni_args(s: &str) -> Result<BTreeMap<String, String>, CniError> {
    let mut out = BTreeMap::new();
    for pair in s.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            CniError::new(
                Code::InvalidEnvironment,
                format!("CNI_ARGS: {pair:?} is not KEY=VALUE"),
            )
        })?;
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

/// Checks the configuration's `cniVersion` against what this plugin supports and what the
/// verb needs.
pub fn check_version(cni_version: &str, verb: Verb) -> Result<(), CniError> {
    if !SUPPORTED_VERSIONS.contains(&cni_version) {
        return Err(CniError::new(
            Code::IncompatibleVersion,
            format!("cniVersion {cni_version:?} is not supported"),
        )
        .with_details(format!(
            "supported versions: {}",
            SUPPORTED_VERSIONS.join(", ")
        )));
    }
    if version_lt(cni_version, verb.minimum_version()) {
        return Err(CniError::new(
            Code::IncompatibleVersion,
            format!(
                "{verb:?} needs cniVersion {} or newer; the configuration says {cni_version}",
                verb.minimum_version()
            ),
        ));
    }
    Ok(())
}

fn version_lt(a: &str, b: &str) -> bool {
    let parse = |s: &str| -> Vec<u32> { s.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parse(a) < parse(b)
}

/// The VERSION verb's answer.
pub fn version_result() -> serde_json::Value {
    serde_json::json!({
        "cniVersion": CURRENT_VERSION,
        "supportedVersions": SUPPORTED_VERSIONS,
    })
}

/// An interface in a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
}

/// An address in a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// Address with prefix length, `10.42.1.5/24`.
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
    /// Only in results for versions before 1.0.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
}

/// The success result of ADD, and the `prevResult` CHECK and chained plugins receive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CniResult {
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub dns: serde_json::Value,
}

impl CniResult {
    /// Appends this plugin's interfaces, addresses and routes to a previous plugin's result,
    /// renumbering interface indices, as the spec asks of a plugin in a chain.
    pub fn append_to(self, prev: Option<CniResult>) -> CniResult {
        let Some(mut prev) = prev else {
            return self;
        };
        let offset = prev.interfaces.len();
        prev.interfaces.extend(self.interfaces);
        prev.ips.extend(self.ips.into_iter().map(|mut ip| {
            ip.interface = ip.interface.map(|i| i + offset);
            ip
        }));
        prev.routes.extend(self.routes);
        prev.cni_version = self.cni_version;
        prev
    }

    /// The result as the given version writes it (0.4.0 results carry `version` on each IP).
    pub fn for_version(mut self, cni_version: &str) -> CniResult {
        self.cni_version = cni_version.to_string();
        let legacy = version_lt(cni_version, "1.0.0");
        for ip in &mut self.ips {
            ip.version = if legacy {
                Some(if ip.address.contains(':') { "6" } else { "4" }.to_string())
            } else {
                None
            };
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Result<Env, CniError> {
        let map: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn add_needs_every_variable_and_names_the_missing_one() {
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
        ])
        .unwrap_err();
        assert_eq!(e.code, Code::InvalidEnvironment);
        assert!(e.msg.contains("CNI_NETNS"), "{e}");
    }

    #[test]
    fn del_tolerates_a_missing_netns() {
        let e = env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
        ])
        .unwrap();
        assert_eq!(e.netns, None);
    }

    #[test]
    fn status_gc_and_version_need_no_container() {
        for verb in ["STATUS", "GC", "VERSION"] {
            assert!(env(&[("CNI_COMMAND", verb)]).is_ok(), "{verb}");
        }
    }

    #[test]
    fn bad_names_are_refused() {
        let base = [("CNI_COMMAND", "ADD"), ("CNI_NETNS", "/run/netns/x")];
        let e = env(&[
            base[0],
            base[1],
            ("CNI_CONTAINERID", "-bad"),
            ("CNI_IFNAME", "eth0"),
        ])
        .unwrap_err();
        assert!(e.msg.contains("CNI_CONTAINERID"));
        let e = env(&[
            base[0],
            base[1],
            ("CNI_CONTAINERID", "ok"),
            ("CNI_IFNAME", "a/b"),
        ])
        .unwrap_err();
        assert!(e.msg.contains("CNI_IFNAME"));
        let e = env(&[("CNI_COMMAND", "FROB")]).unwrap_err();
        assert!(e.msg.contains("FROB"));
    }

    #[test]
    fn cni_args_are_split() {
        let e = env(&[
            ("CNI_COMMAND", "VERSION"),
            ("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=p"),
        ])
        .unwrap();
        assert_eq!(e.args.get("K8S_POD_NAME").map(String::as_str), Some("p"));
        assert!(env(&[("CNI_COMMAND", "VERSION"), ("CNI_ARGS", "novalue")]).is_err());
    }

    #[test]
    fn versions_are_checked_per_verb() {
        assert!(check_version("1.1.0", Verb::Gc).is_ok());
        assert_eq!(
            check_version("1.0.0", Verb::Gc).unwrap_err().code,
            Code::IncompatibleVersion
        );
        assert!(check_version("1.0.0", Verb::Check).is_ok());
        assert!(check_version("0.4.0", Verb::Add).is_ok());
        assert_eq!(
            check_version("0.3.1", Verb::Add).unwrap_err().code,
            Code::IncompatibleVersion
        );
        assert_eq!(
            check_version("9.9.9", Verb::Add).unwrap_err().code,
            Code::IncompatibleVersion
        );
    }

    #[test]
    fn chained_results_renumber_interfaces() {
        let prev = CniResult {
            interfaces: vec![Interface {
                name: "x".into(),
                mac: String::new(),
                mtu: None,
                sandbox: String::new(),
            }],
            ..Default::default()
        };
        let ours = CniResult {
            cni_version: "1.1.0".into(),
            interfaces: vec![Interface {
                name: "eth0".into(),
                mac: String::new(),
                mtu: None,
                sandbox: String::new(),
            }],
            ips: vec![IpConfig {
                address: "10.0.0.2/24".into(),
                gateway: None,
                interface: Some(0),
                version: None,
            }],
            ..Default::default()
        };
        let merged = ours.append_to(Some(prev));
        assert_eq!(merged.interfaces.len(), 2);
        assert_eq!(merged.ips[0].interface, Some(1));
    }

    #[test]
    fn legacy_results_carry_the_ip_version() {
        let r = CniResult {
            ips: vec![IpConfig {
                address: "10.0.0.2/24".into(),
                gateway: None,
                interface: Some(0),
                version: None,
            }],
            ..Default::default()
        };
        assert_eq!(
            r.clone().for_version("0.4.0").ips[0].version.as_deref(),
            Some("4")
        );
        assert_eq!(r.for_version("1.1.0").ips[0].version, None);
    }

    #[test]
    fn errors_serialise_with_code_and_details() {
        let e = CniError::new(Code::InvalidConfig, "subnet: bad").with_details("why");
        let v = e.to_json("1.1.0");
        assert_eq!(v["code"], 7);
        assert_eq!(v["msg"], "subnet: bad");
        assert_eq!(v["details"], "why");
    }
}
