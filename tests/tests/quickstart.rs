//! docs/quickstart.md followed word for word (issue 39): the packages `./x package` builds,
//! installed on fresh machines of the real topology (the broker host, two provider machines,
//! a user's computer on the internet; `testbed::machine`), every `sh` block of the page run
//! on the machine it names, in the page's order, with nothing else given to the machines but
//! the packages (as `~/packages`), the addresses and names the page says the reader chooses,
//! and the values earlier blocks printed. The page's last block runs a Job on a VM node
//! rented for the user's cluster, and its log is the guest's.
//!
//! These machines' KVM does not run guests (nested guests hang), so the page's blocks for
//! providers without KVM run. systemd is not PID 1 here: `systemctl` is the machines' stand-in
//! (`testbed::machine::SYSTEMCTL`), which runs the packaged units' `ExecStart`. Needs root,
//! qemu, and the Kubernetes and kine builds (`./x test` makes them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use testbed::machine::Machine;
use testbed::quickstart::{Block, Place, blocks};
use testbed::tmp::TempDir;
use testbed::world::{OPERATOR_ADDR, World};

fn step(t: Instant, what: &str) {
    eprintln!("[{:>6.1}s] {what}", t.elapsed().as_secs_f64());
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The longest a block may take (the Job's block waits for a TCG guest to boot and join).
const BLOCK_LIMIT: Duration = Duration::from_secs(25 * 60);

struct Provider {
    machine: Machine,
    vars: BTreeMap<String, String>,
}

/// What the machines show when a block fails: the daemons' logs.
fn diagnostics(broker: &Machine, providers: &[Provider]) -> String {
    let log = |m: &Machine, unit: &str| {
        let text = m.read(&format!("/var/log/{unit}.log"));
        format!("--- {} {unit}.log\n{}\n", m.name, tail(&text, 60))
    };
    let mut out = log(broker, "socialweb-broker");
    for p in providers {
        out.push_str(&log(&p.machine, "socialweb-provider"));
    }
    out
}

/// The last `n` lines of `text`, saying how many were left out.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let cut = lines.len().saturating_sub(n);
    let mut out = String::new();
    if cut > 0 {
        out.push_str(&format!("[{cut} lines before these]\n"));
    }
    out.push_str(&lines[cut..].join("\n"));
    out
}

/// Runs `block` on `m` with `env`; returns its stdout, or panics with everything it said.
fn run(
    m: &Machine,
    block: &Block,
    env: &BTreeMap<String, String>,
    why: &dyn Fn() -> String,
) -> String {
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let out = m
        .bash(&block.script, &env, BLOCK_LIMIT)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // A block that worked shows its last lines only: apt's progress would push a failure's
    // message out of what CI keeps of the output (the failing block's assertion below
    // carries all it said).
    if out.status.success() {
        eprintln!(
            "--- {} (docs/quickstart.md:{})\n{}",
            m.name,
            block.line,
            tail(&format!("{stdout}{stderr}"), 6)
        );
    }
    assert!(
        out.status.success(),
        "docs/quickstart.md:{}: the block failed on {} ({}):\n{}\nstdout:\n{stdout}\nstderr:\n{stderr}\n{}",
        block.line,
        m.name,
        out.status,
        block.script,
        why()
    );
    stdout
}

/// Cgroups the guests' jails made (the providers' default prefix, `swn-`), which outlive
/// guests killed with their machine.
fn guest_cgroups() -> Vec<PathBuf> {
    let mut found = Vec::new();
    for h in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        for c in std::fs::read_dir(h.path()).into_iter().flatten().flatten() {
            if c.file_name().to_string_lossy().starts_with("swn-") {
                found.push(c.path());
            }
        }
    }
    found
}

/// Removes, when dropped (after the machines, so their guests are gone), the guests' cgroups
/// that were not there before the test, also when it fails.
struct GuestCgroups(Vec<PathBuf>);

impl Drop for GuestCgroups {
    fn drop(&mut self) {
        for c in guest_cgroups() {
            if !self.0.contains(&c) {
                let _ = std::fs::remove_dir(&c);
            }
        }
    }
}

#[test]
fn the_quickstart_installs_a_broker_and_two_providers_and_a_users_job_runs_on_a_vm_node() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the quickstart test makes machines and runs qemu: run as root (./x test)"
    );
    let t = Instant::now();
    // Declared first, dropped last: after every machine.
    let _cgroups = GuestCgroups(guest_cgroups());
    let packages = TempDir::new("packages").unwrap();
    let built = testbed::package::build(packages.path(), &mut |what| step(t, what)).unwrap();
    step(t, &format!("packages built: {:?}", built.all()));
    let page = std::fs::read_to_string(repo().join("docs/quickstart.md")).unwrap();
    let page = blocks(&page).unwrap();

    let world = World::new(2).unwrap();
    // What this host has that a fresh server would not: this checkout (and the target
    // directory in it), the caches of the builds.
    let cache = testbed::nodeimage::cache_dir();
    let hide: Vec<&Path> = vec![Path::new("/work"), cache.as_path()];
    let fresh = |ns, name: &str| {
        let m = Machine::fresh(ns, name, &hide).unwrap();
        assert_eq!(
            m.socialweb_files(),
            Vec::<&str>::new(),
            "{name} is not fresh"
        );
        m.bind_read_only(packages.path(), "/root/packages").unwrap();
        m
    };
    let broker = fresh(&world.operator, "broker");
    let mut providers: Vec<Provider> = world
        .providers
        .iter()
        .zip(["east", "west"])
        .map(|(pm, name)| Provider {
            machine: fresh(&pm.ns, &format!("provider-{name}")),
            vars: BTreeMap::from([
                ("PROVIDER_NAME".to_string(), name.to_string()),
                ("PROVIDER_ADDR".to_string(), pm.addr.to_string()),
            ]),
        })
        .collect();
    let user = fresh(&world.internet, "user");
    step(
        t,
        "four fresh machines: the broker host, two providers, a user's computer",
    );

    let mut noted = BTreeMap::from([("BROKER_ADDR".to_string(), OPERATOR_ADDR.to_string())]);
    let mut last_user = String::new();
    for block in &page {
        let why = || diagnostics(&broker, &providers);
        match block.place {
            Place::BrokerHost | Place::User => {
                let m = if block.place == Place::User {
                    &user
                } else {
                    &broker
                };
                let out = run(m, block, &noted, &why);
                if let Some(name) = &block.prints {
                    noted.insert(name.clone(), out.trim().to_string());
                }
                if block.place == Place::User {
                    last_user = out;
                }
            }
            Place::EachProvider | Place::BrokerHostForEachProvider => {
                let mut printed = Vec::new();
                for p in &providers {
                    let mut env = noted.clone();
                    env.extend(p.vars.clone());
                    let m = if block.place == Place::EachProvider {
                        &p.machine
                    } else {
                        &broker
                    };
                    printed.push(run(m, block, &env, &why));
                }
                if let Some(name) = &block.prints {
                    for (p, out) in providers.iter_mut().zip(printed) {
                        p.vars.insert(name.clone(), out.trim().to_string());
                    }
                }
            }
        }
        step(
            t,
            &format!(
                "docs/quickstart.md:{} done{}",
                block.line,
                block
                    .prints
                    .as_ref()
                    .map(|n| format!(" ({n} noted)"))
                    .unwrap_or_default()
            ),
        );
    }

    for name in ["BROKER_PIN", "INVITE", "FRONT_CA"] {
        assert!(
            noted.get(name).is_some_and(|v| !v.is_empty()),
            "the page printed no {name}: {noted:?}"
        );
    }
    // The Job's log is the guest's: Debian's cloud kernel, not this host's.
    let host_kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let host_kernel = host_kernel.trim();
    let said = last_user
        .lines()
        .find_map(|l| l.strip_prefix("hello from a node with kernel "))
        .unwrap_or_else(|| panic!("no hello in the last block's output:\n{last_user}"));
    assert!(
        said.contains("cloud-amd64") && said != host_kernel,
        "the Job ran on the guest's kernel ({said}), not this host's ({host_kernel})"
    );
    // One node, rented from one of the two providers: `kubectl get nodes` lists it with the
    // guest's kernel, and one provider runs one qemu guest.
    let nodes: Vec<&str> = last_user
        .lines()
        .skip_while(|l| !l.starts_with("NAME "))
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(
        nodes.len() == 1 && nodes[0].contains(" Ready ") && nodes[0].contains(said),
        "one Ready node with the guest's kernel: {nodes:?}"
    );
    let guests: Vec<String> = providers
        .iter()
        .flat_map(|p| {
            let out = p
                .machine
                .command("pgrep")
                .args(["-a", "qemu-system"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| format!("{}: {}", p.machine.name, &l[..l.len().min(160)]))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        guests.len(),
        1,
        "one qemu guest among the providers: {guests:#?}"
    );
    step(t, &format!("the Job ran on a VM node (kernel {said})"));
    under_the_packaged_unit(&broker, t);
}

/// What the packaged unit holds the broker to: its cgroup, its sandboxing.
fn under_the_packaged_unit(broker: &Machine, t: Instant) {
    control_plane_under_the_unit(broker, t);
    sandboxed_as_the_unit_says(broker, t);
}

/// The packaged unit's sandboxing held the broker all along (the page ran to its end under
/// it): the capabilities it drops are out of its bounding set, and so of every process it
/// starts. And real systemd (`systemd-analyze`, no PID 1 needed) finds nothing wrong with
/// the unit and rates its exposure.
fn sandboxed_as_the_unit_says(broker: &Machine, t: Instant) {
    let pid = broker.read("/run/systemctl-standin/socialweb-broker.pid");
    let out = broker
        .command("cat")
        .arg(format!("/proc/{}/status", pid.trim()))
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&out.stdout).into_owned();
    let bounding = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no CapBnd: {status}"));
    // capability(7): CAP_SYS_BOOT 22, CAP_SYS_TIME 25; CAP_NET_ADMIN 12 and CAP_SYS_ADMIN 21
    // stay (network namespaces, cgroups).
    for (cap, bit, kept) in [
        ("SYS_BOOT", 22, false),
        ("SYS_TIME", 25, false),
        ("NET_ADMIN", 12, true),
        ("SYS_ADMIN", 21, true),
    ] {
        assert_eq!(
            bounding & (1 << bit) != 0,
            kept,
            "CAP_{cap} in {bounding:x}"
        );
    }
    let unit = "/lib/systemd/system/socialweb-broker.service";
    let verify = broker
        .command("systemd-analyze")
        .args(["verify", unit])
        .output()
        .unwrap();
    assert!(
        verify.status.success()
            && !String::from_utf8_lossy(&verify.stderr).contains("socialweb-broker.service"),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&verify.stderr)
    );
    let security = broker
        .command("systemd-analyze")
        .args(["security", "--offline=yes", unit])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&security.stdout);
    let exposure = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("systemd-analyze security: {text}"));
    step(
        t,
        &format!(
            "the broker ran sandboxed as its unit says; {}",
            exposure.trim()
        ),
    );
}

/// The memory cgroup of the machine's process `pid`, as its `/proc/<pid>/cgroup` says (v2:
/// its one cgroup); `None`: no such process.
fn memory_cgroup(m: &Machine, pid: &str) -> Option<String> {
    let out = m
        .command("cat")
        .arg(format!("/proc/{pid}/cgroup"))
        .output()
        .unwrap();
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Some(
        text.lines()
            .find_map(|l| {
                let (_, rest) = l.split_once(':')?;
                let (controllers, path) = rest.split_once(':')?;
                (controllers.is_empty() || controllers.split(',').any(|c| c == "memory"))
                    .then(|| path.to_string())
            })
            .unwrap_or_else(|| panic!("no memory cgroup in /proc/{pid}/cgroup: {text}")),
    )
}

/// The packaged unit runs with `Delegate=yes` and `clusters.cgroup_parent = own`: the awake
/// cluster's apiserver is in a cgroup under the broker's own (the unit's), not at the root.
fn control_plane_under_the_unit(broker: &Machine, t: Instant) {
    let pid = broker.read("/run/systemctl-standin/socialweb-broker.pid");
    let unit = memory_cgroup(broker, pid.trim()).expect("the broker runs");
    assert!(
        unit.ends_with("/socialweb-broker.service") || unit.ends_with("/supervisor"),
        "the broker runs in its unit's cgroup: {unit}"
    );
    let unit = unit.trim_end_matches("/supervisor").to_string();
    let clusters = broker.path("/var/lib/socialweb-broker/clusters");
    let apiservers: Vec<String> = std::fs::read_dir(&clusters)
        .unwrap()
        .flatten()
        .filter_map(|d| std::fs::read_to_string(d.path().join("run/apiserver.pid")).ok())
        .filter_map(|p| p.split_whitespace().next().map(str::to_string))
        .filter_map(|p| memory_cgroup(broker, &p))
        .collect();
    assert!(
        !apiservers.is_empty(),
        "an awake cluster's apiserver under {}",
        clusters.display()
    );
    let apiserver = apiservers[0].clone();
    assert!(
        apiserver.starts_with(&format!("{unit}/socialweb-cluster-")),
        "the apiserver's cgroup {apiserver} is under the unit's {unit}"
    );
    step(
        t,
        &format!("the packaged unit's delegated cgroup {unit} holds the apiserver's {apiserver}"),
    );
}
