//! `[local_provider]`: the provider embedded in the broker (when `[market]` names none) and,
//! on a provider machine, `socialweb-broker provider`: the nodes it offers and how it makes
//! them, as namespaces on its host or as qemu guests.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::durations::{HumanDuration, humantime_serde_compat};
use super::{ConfigError, err};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LocalProvider {
    /// Where `socialweb-broker provider` (on a provider machine) serves the market protocol,
    /// mutual TLS. The embedded provider serves the broker on an owner-only Unix socket in
    /// the state directory instead, and listens on no port.
    pub listen: SocketAddr,
    /// The brokers `socialweb-broker provider` serves: their keys, as `socialweb-broker
    /// market-pin` prints them on each broker's host. No other client gets past TLS.
    pub brokers: Vec<String>,
    /// How many nodes it may run at once.
    pub capacity: u32,
    /// The node sizes it rents and their prices (`[[local_provider.shapes]]`); none: the
    /// `[node]` size at price 0. The broker sizes each node it rents from the shapes its
    /// providers offer (docs/scale.md).
    pub shapes: Vec<LocalShape>,
    /// Node links are carved from this /16: node `i` gets `<a>.<b>.<i>.0/24`.
    pub subnet: Ipv4Addr,
    /// Prefix of the network namespaces, links and cgroups it creates.
    pub prefix: String,
    /// The node's software: `socialweb-agent`, the CNI plugins, the seed images.
    pub agent: PathBuf,
    /// The CNI plugins nodes use: `socialweb-cni`, `loopback` and `portmap`.
    pub cni_bin_dir: PathBuf,
    /// Extra image archives every node imports (the pause image is always there).
    pub seed_images: Vec<PathBuf>,
    /// Merged over each node's kubelet configuration.
    pub kubelet_config_patch: Option<serde_json::Value>,
    /// A node image directory (`socialweb-image-builder build --out`): nodes run from its
    /// root filesystem, as rented VMs do, instead of the host's `agent` and CNI plugins.
    pub image: Option<PathBuf>,
    /// What a node is: `namespace` (namespaces on this machine: trusted tenants only) or
    /// `vm` (a qemu guest booted from `image`, its own kernel).
    pub machine: MachineKind,
    /// How VMs run (`machine = "vm"`).
    pub vm: Vm,
    /// The region its offer names (a label value): its nodes carry it as
    /// `topology.kubernetes.io/region` (docs/scale.md, "Zones"). Unset: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The zone its offer names (a label value): its nodes carry it as
    /// `topology.kubernetes.io/zone`, so that Pods spread over zones or kept in one can run
    /// on them (docs/scale.md, "Zones"). Unset: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

impl Default for LocalProvider {
    fn default() -> LocalProvider {
        LocalProvider {
            listen: "127.0.0.1:7480".parse().expect("address"),
            capacity: 16,
            shapes: Vec::new(),
            subnet: Ipv4Addr::new(172, 30, 0, 0),
            prefix: "swn-".into(),
            agent: "/usr/local/bin/socialweb-agent".into(),
            cni_bin_dir: "/usr/lib/cni".into(),
            seed_images: Vec::new(),
            kubelet_config_patch: None,
            brokers: Vec::new(),
            image: None,
            machine: MachineKind::Namespace,
            vm: Vm::default(),
            region: None,
            zone: None,
        }
    }
}

impl LocalProvider {
    /// Its region and zone, its shapes, the brokers' keys it serves, and what its kind of
    /// machine takes.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        self.check_labels()?;
        self.check_shapes()?;
        for (i, pin) in self.brokers.iter().enumerate() {
            socialweb_market_tls::parse_pin(pin)
                .map_err(|e| err(&format!("local_provider.brokers[{i}]"), e.to_string()))?;
        }
        self.check_machines()
    }

    /// The region and zone its offer names are label values: its nodes carry them as labels.
    fn check_labels(&self) -> Result<(), ConfigError> {
        for (field, v) in [
            ("local_provider.region", &self.region),
            ("local_provider.zone", &self.zone),
        ] {
            if let Some(v) = v
                && !socialweb_market::valid_label_value(v)
            {
                return Err(err(
                    field,
                    format!(
                        "{v:?} is not a label value (1-63 of A-Z a-z 0-9 - _ ., alphanumeric \
                         at both ends)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Each shape is a node size the market takes.
    fn check_shapes(&self) -> Result<(), ConfigError> {
        for (i, s) in self.shapes.iter().enumerate() {
            let at = format!("local_provider.shapes[{i}]");
            // The spec's check names the field after the shape: `...shapes[1].vcpu`.
            socialweb_market::Shape::from(*s)
                .spec
                .validate(&at)
                .map_err(|e| match e.split_once(": ") {
                    Some((field, problem)) => err(field, problem),
                    None => err(&at, e),
                })?;
        }
        Ok(())
    }

    /// A VM provider boots a node image, and what only a machine of namespaces can be given
    /// (the host's seed archives, a kubelet patch on the agent's command line) is refused by
    /// name rather than ignored.
    fn check_machines(&self) -> Result<(), ConfigError> {
        if self.machine != MachineKind::Vm {
            return Ok(());
        }
        if self.image.is_none() {
            return Err(err(
                "local_provider.image",
                "required with machine = \"vm\": the node image directory its guests boot",
            ));
        }
        if !self.seed_images.is_empty() {
            return Err(err(
                "local_provider.seed_images",
                "not taken with machine = \"vm\": a guest imports the node image's seed disk (put the archives in the image config's `images`)",
            ));
        }
        if self.kubelet_config_patch.is_some() {
            return Err(err(
                "local_provider.kubelet_config_patch",
                "not taken with machine = \"vm\": a guest's agent runs as the node image's unit starts it",
            ));
        }
        if self.vm.boot_timeout < Duration::from_secs(10) {
            return Err(err(
                "local_provider.vm.boot_timeout",
                "must be at least 10s (a guest boots its kernel, systemd and the agent)",
            ));
        }
        Ok(())
    }
}

/// `[[local_provider.shapes]]`: a node size and its price.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LocalShape {
    /// Virtual CPUs.
    pub vcpu: u32,
    /// Memory in MiB.
    #[serde(rename = "memMiB")]
    pub mem_mib: u64,
    /// Disk in MiB.
    #[serde(rename = "diskMiB")]
    pub disk_mib: u64,
    /// Millionths of a currency unit per hour.
    #[serde(default)]
    pub price_micros_per_hour: u64,
}

impl From<LocalShape> for socialweb_market::Shape {
    fn from(s: LocalShape) -> socialweb_market::Shape {
        socialweb_market::Shape {
            spec: socialweb_market::NodeSpec {
                vcpu: s.vcpu,
                mem_mib: s.mem_mib,
                disk_mib: s.disk_mib,
            },
            price_micros_per_hour: s.price_micros_per_hour,
        }
    }
}

/// `local_provider.machine`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MachineKind {
    #[default]
    Namespace,
    Vm,
}

/// `[local_provider.vm]`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Vm {
    /// `auto` (KVM when a probe guest runs under it within 5 s, else TCG), `kvm` or `tcg`.
    #[schemars(with = "String")]
    pub accel: socialweb_provider::AccelChoice,
    /// A guest that has not reported ready by then fails its lease, with its console's last
    /// lines as the reason.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub boot_timeout: Duration,
    /// The emulator guests run in: a path, or a name looked up on `PATH`.
    pub qemu: PathBuf,
    /// What makes each guest's disk over the image's: a path, or a name on `PATH`.
    pub qemu_img: PathBuf,
    /// Whether guests under TCG (no KVM) bid as `vm` isolation. QEMU's security policy
    /// counts only hardware virtualization (KVM) as a boundary, so by default a TCG guest
    /// bids as `namespace`.
    pub tcg_as_vm: bool,
    /// Private IPv4 networks guests may reach besides the public internet (a registry or a
    /// proxy of the operator's, say). Loopback, RFC 1918, link-local (cloud metadata),
    /// CGNAT and multicast are refused otherwise (docs/security.md).
    #[schemars(with = "Vec<String>")]
    pub egress_allow: Vec<ipnet::Ipv4Net>,
    /// Whether each guest's qemu runs jailed: its own uid, network namespace, mount
    /// namespace (chrooted) and cgroup with the RFP's budget (docs/security.md). `false`
    /// only to measure what the jail costs (`bench/vm`): unjailed guests never bid as `vm`.
    pub jail: bool,
}

impl Default for Vm {
    fn default() -> Vm {
        Vm {
            accel: Default::default(),
            boot_timeout: Duration::from_secs(600),
            qemu: "qemu-system-x86_64".into(),
            qemu_img: "qemu-img".into(),
            tcg_as_vm: false,
            egress_allow: Vec::new(),
            jail: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn shapes_are_checked_and_errors_name_the_field() {
        let ok = "[local_provider]\nshapes = [{ vcpu = 1, memMiB = 2048, diskMiB = 20480 }, \
                  { vcpu = 2, memMiB = 4096, diskMiB = 20480, price_micros_per_hour = 20000 }]\n";
        let c = toml::from_str::<Config>(ok).unwrap();
        assert!(c.validate(&|_| None).is_ok());
        assert_eq!(c.local_provider.shapes[1].price_micros_per_hour, 20000);
        let bad = ok.replace("vcpu = 2", "vcpu = 0");
        let e = toml::from_str::<Config>(&bad)
            .unwrap()
            .validate(&|_| None)
            .unwrap_err();
        assert_eq!(e.source_name, "local_provider.shapes[1].vcpu", "{e}");
        assert!(e.problem.contains("0 is not 1-1024"), "{e}");
        let unknown = ok.replace("diskMiB = 20480 }", "diskMiB = 20480, gpu = 1 }");
        let e = toml::from_str::<Config>(&unknown).unwrap_err().to_string();
        assert!(e.contains("gpu"), "{e}");
    }
}
