//! `bench/vm`: how long a rented node that is a VM takes, from the provider accepting the
//! lease to the Node Ready, phase by phase, against the same node image run as a machine of
//! namespaces by the same provider (no VM), on the real topology (one provider machine); and
//! the same guest unjailed (`local_provider.vm.jail = false`), for what the jail costs.
//!
//! Each boot is a fresh broker and cluster on the same world, a Pod applied at zero nodes:
//!
//! - `accepted`: the provider's lease `created_at`;
//! - `vmm`: qemu started (the provider's guest record);
//! - `agent`: the guest's agent said `started` on the status port;
//! - `guest_ready`: it said `ready` (every bring-up step done);
//! - `node_ready`: the Node's Ready condition seen true through the front (polled, 200 ms).
//!
//! The provider sees the status port every 250 ms, so the guest's phases are that coarse.
//! Rounds interleave (vm, vm_unjailed, namespace, vm, ...). The seeds' firecracker guest reached Ready
//! 5.5 s after its VMM started (a quoted figure: no firecracker here, and KVM, which it needs,
//! hangs nested guests on this machine).

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::Value;
use testbed::broker::{Broker, BrokerOptions};
use testbed::stats::{print_summary, show};
use testbed::tmp::TempDir;
use testbed::user::User;
use testbed::world::World;

/// The seeds' firecracker guest: VMM start to Node Ready.
const FIRECRACKER_SEED_READY_MS: f64 = 5500.0;

#[derive(Debug, Parser)]
#[command(about = "A VM node's boot, phase by phase, against the same image as namespaces")]
struct Args {
    /// Boots of each kind (interleaved: jailed VM, unjailed VM, namespaces).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(1..=20))]
    rounds: u8,
}

const POD: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: work, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: socialweb.local/busybox:1
    imagePullPolicy: Never
    command: ["sleep", "3600"]
"#;

fn ms_of(rfc3339: &str) -> Result<f64> {
    let t = humantime::parse_rfc3339(rfc3339).with_context(|| format!("a time: {rfc3339}"))?;
    Ok(t.duration_since(SystemTime::UNIX_EPOCH)?.as_secs_f64() * 1e3)
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0)
}

/// One boot's phases, milliseconds since 1970.
#[derive(Debug, Default)]
struct Boot {
    applied: f64,
    accepted: f64,
    vmm: Option<f64>,
    agent: Option<f64>,
    guest_ready: Option<f64>,
    node_ready: f64,
    accel: Option<String>,
}

fn node_ready(u: &User, b: &Broker<'_>) -> bool {
    let out = b
        .kubectl_as(&u.kubeconfig, &[], &["get", "nodes", "-o", "json"])
        .output();
    let Ok(out) = out else { return false };
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["items"].as_array().is_some_and(|items| {
        items.iter().any(|n| {
            n["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
    })
}

/// The provider's book, as it keeps it.
fn book(b: &Broker<'_>) -> Result<Value> {
    let path = &b.providers[0].paths.provider_records;
    Ok(serde_json::from_slice(&std::fs::read(path)?)?)
}

/// What a round boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A qemu guest, jailed as providers run them.
    Vm,
    /// A qemu guest without the jail (`local_provider.vm.jail = false`): the "before".
    VmUnjailed,
    /// The same image as a machine of namespaces.
    Namespace,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Vm => "vm",
            Kind::VmUnjailed => "vm_unjailed",
            Kind::Namespace => "namespace",
        }
    }
}

fn one_boot(world: &World, image: &Path, kind: Kind, round: u8) -> Result<Boot> {
    let b = Broker::start(
        world,
        BrokerOptions {
            providers: 1,
            provider_capacity: 1,
            max_nodes: 1,
            hold: Duration::from_secs(600),
            image: Some(image.to_path_buf()),
            vm: kind != Kind::Namespace,
            vm_unjailed: kind == Kind::VmUnjailed,
            ..Default::default()
        },
    )?;
    let dir = TempDir::new("bench-vm")?;
    let u = User::new(&b, dir.path(), &format!("bench{round}"));
    let manifest = dir.path().join("pod.yaml");
    std::fs::write(&manifest, POD)?;
    let mut boot = Boot {
        applied: now_ms(),
        ..Default::default()
    };
    u.ok(&b, &["apply", "-f", manifest.to_str().unwrap_or_default()]);
    let deadline = Instant::now() + Duration::from_secs(900);
    while !node_ready(&u, &b) {
        if Instant::now() > deadline {
            bail!("no Node Ready after 900 s:\n{}", b.diagnostics());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    boot.node_ready = now_ms();
    // The Node is Ready before the agent's last steps (DNS, the mesh) are done: wait for the
    // provider to see the guest's `ready` too.
    let lease = loop {
        let book = book(&b)?;
        let running = book["leases"]
            .as_object()
            .and_then(|l| l.values().find(|e| e["lease"]["state"] == "running"))
            .cloned();
        if let Some(l) = running {
            break l;
        }
        if Instant::now() > deadline {
            bail!("no running lease in the provider's book:\n{book}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    boot.accepted = ms_of(lease["lease"]["created_at"].as_str().unwrap_or_default())?;
    let g = &lease["guest"];
    boot.vmm = g["vmm_started_ms"].as_f64();
    boot.agent = g["agent_started_ms"].as_f64();
    boot.guest_ready = g["ready_ms"].as_f64();
    boot.accel = g["accel"].as_str().map(str::to_string);
    Ok(boot)
}

/// Prints a phase's median and spread (`testbed::stats`), `none` when no boot recorded it.
fn print(name: &str, mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        eprintln!("{name}: no boot recorded this phase");
    }
    print_summary(name, "_ms", 0, &mut v)
}

/// `a / b` with two decimals, `none` when either is missing.
fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    show(a.zip(b).map(|(a, b)| a / b), 2)
}

/// A VM kind's phases, printed under `prefix`; returns the p50s of VMM start to Node Ready
/// and of accepted to Node Ready.
fn print_vm(prefix: &str, vms: &[Boot]) -> (Option<f64>, Option<f64>) {
    let phase =
        |f: &dyn Fn(&Boot) -> Option<f64>| -> Vec<f64> { vms.iter().filter_map(f).collect() };
    let p = |name: &str| format!("{prefix}_{name}");
    print(&p("accepted_to_vmm"), phase(&|b| Some(b.vmm? - b.accepted)));
    print(&p("vmm_to_agent"), phase(&|b| Some(b.agent? - b.vmm?)));
    print(
        &p("agent_to_guest_ready"),
        phase(&|b| Some(b.guest_ready? - b.agent?)),
    );
    print(
        &p("agent_to_node_ready"),
        phase(&|b| Some(b.node_ready - b.agent?)),
    );
    let vmm_ready = print(
        &p("vmm_to_node_ready"),
        phase(&|b| Some(b.node_ready - b.vmm?)),
    );
    let total = print(
        &p("accepted_to_node_ready"),
        phase(&|b| Some(b.node_ready - b.accepted)),
    );
    print(
        &p("pod_applied_to_node_ready"),
        phase(&|b| Some(b.node_ready - b.applied)),
    );
    (vmm_ready, total)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let image = testbed::nodeimage::test_image()?;
    let world = World::new(1)?;
    let (mut vms, mut unjailed, mut nss) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        for kind in [Kind::Vm, Kind::VmUnjailed, Kind::Namespace] {
            eprintln!("round {round}/{}: a {} node", args.rounds, kind.name());
            let boot = one_boot(&world, &image, kind, round)?;
            eprintln!(
                "  {}: accepted to Node Ready {:.1} s",
                kind.name(),
                (boot.node_ready - boot.accepted) / 1e3
            );
            match kind {
                Kind::Vm => &mut vms,
                Kind::VmUnjailed => &mut unjailed,
                Kind::Namespace => &mut nss,
            }
            .push(boot);
        }
    }
    let accel = vms[0].accel.clone().unwrap_or_else(|| "unknown".into());
    println!("vm_accel={accel}");
    println!("rounds={}", args.rounds);
    let (vmm_ready, vm_total) = print_vm("vm", &vms);
    let (unjailed_vmm_ready, unjailed_total) = print_vm("vm_unjailed", &unjailed);
    let ns_total = print(
        "namespace_accepted_to_node_ready",
        nss.iter().map(|b| b.node_ready - b.accepted).collect(),
    );
    println!("ratio_vm_vs_namespace={}", ratio(vm_total, ns_total));
    // The jail's cost: the same guest, jailed over unjailed.
    println!(
        "ratio_jailed_vs_unjailed_vmm_to_node_ready={}",
        ratio(vmm_ready, unjailed_vmm_ready)
    );
    println!(
        "ratio_jailed_vs_unjailed_accepted_to_node_ready={}",
        ratio(vm_total, unjailed_total)
    );
    println!("firecracker_seed_vmm_to_ready_ms={FIRECRACKER_SEED_READY_MS:.0}");
    println!(
        "ratio_vm_vs_firecracker_seed={}",
        ratio(vmm_ready, Some(FIRECRACKER_SEED_READY_MS))
    );
    Ok(())
}
