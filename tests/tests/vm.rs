//! Rented nodes that are VMs (docs/market.md, "Machine kinds"): a provider machine on the
//! real topology boots each lease's node from the built node image as a qemu guest behind
//! user-mode NAT (KVM where it runs guests, TCG here, where nested guests hang), and the
//! guest joins through the broker's public endpoints alone. The one-node loop end to end --
//! zero nodes, a Pod, a guest, the Pod's log through the front, teardown with the guest gone
//! and its disks removed -- with the first guest's kernel panicking (its lease fails with the
//! console's last lines and the broker rents another), and a privileged Pod with the host's
//! PID namespace and `/` mounted that sees the guest's processes and files and nothing of the
//! machines outside it. Needs root, qemu-system-x86_64, qemu-img and mke2fs.

use std::time::{Duration, Instant};

use serde_json::Value;
use testbed::broker::{Broker, BrokerOptions};
use testbed::k8s::wait_for;
use testbed::tmp::TempDir;
use testbed::user::User;
use testbed::world::World;

fn step(t: Instant, what: &str) {
    eprintln!("[{:>6.1}s] {what}", t.elapsed().as_secs_f64());
}

/// Where the provider's machine listens for the guest's probes (issue 36, attack 4): on its
/// loopback (slirp's 10.0.2.2 is the host's 127.0.0.1) and its public address, the same
/// port; and as a cloud's metadata service. Another machine on the internet (the operator's)
/// listens on the same port: what the guest must reach.
const PROBE_PORT: u16 = 18080;
const METADATA: &str = "169.254.169.254";

/// A Pod with everything a tenant may ask of its node: privileged, the host's PID
/// namespace, the host's `/` at `/host`. It says what it sees and what of its provider's
/// machine it reaches (`own` the machine's public address, `internet` another's), then sleeps.
fn escape_pod(marker: &str, own: &str, internet: &str) -> String {
    let probe = |ip: &str, port: u16| {
        format!("$(nc -w 5 {ip} {port} </dev/null 2>&1 | head -1 | tr ' ' _)")
    };
    let probes = format!(
        "echo loopback={}; echo metadata={}; echo own={}; echo internet={};",
        probe("10.0.2.2", PROBE_PORT),
        probe(METADATA, 80),
        probe(own, PROBE_PORT),
        probe(internet, PROBE_PORT)
    );
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: escape, namespace: default}}
spec:
  hostPID: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: socialweb.local/busybox:1
    imagePullPolicy: Never
    securityContext: {{privileged: true}}
    volumeMounts: [{{name: root, mountPath: /host}}]
    command: ["sh", "-c", "echo started; if [ -e /host{marker} ]; then echo marker=seen; else echo marker=absent; fi; echo comms=$(cat /proc/[0-9]*/comm | sort -u | tr '\n' ','); echo fstab=$(grep -c socialweb-root /host/etc/fstab); echo root_mib=$(df -m /host | tail -1 | awk '{{print $2}}'); {probes} echo done; sleep 3600"]
  volumes: [{{name: root, hostPath: {{path: /}}}}]
"#
    )
}

/// What jails a guest's qemu, as the kernel shows it.
#[derive(Debug)]
struct Jail {
    uid: u32,
    root: std::path::PathBuf,
    /// Its v1 memory cgroup's directory.
    memory: std::path::PathBuf,
    memory_limit_mib: u64,
}

fn cgroup_mib(dir: &std::path::Path, file: &str) -> u64 {
    let bytes: u64 = std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}/{file}: {e}", dir.display()))
        .trim()
        .parse()
        .unwrap();
    bytes >> 20
}

/// Checks qemu `pid`'s jail (`status` its /proc status; `provider_netns` the provider
/// machine's network namespace) and says what it is.
fn jail_of(pid: u32, status: &str, provider_netns: &std::path::Path) -> Jail {
    use std::os::unix::fs::MetadataExt;
    let uid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|u| u.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .expect("qemu's Uid");
    assert!(
        uid > socialweb_provider::jail::UID_BASE,
        "qemu runs as a guest's own uid, not {uid}"
    );
    let proc_ = |what: &str| format!("/proc/{pid}/{what}");
    let ino = |p: &str| {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{p}: {e}"))
            .ino()
    };
    assert_ne!(
        ino(&proc_("ns/net")),
        std::fs::metadata(provider_netns).unwrap().ino(),
        "qemu in the provider machine's network namespace"
    );
    assert_ne!(
        ino(&proc_("ns/mnt")),
        ino("/proc/self/ns/mnt"),
        "qemu in the host's mount namespace"
    );
    let root = std::fs::read_link(proc_("root")).unwrap();
    assert!(
        root.ends_with("root") && root != std::path::Path::new("/"),
        "qemu chrooted: {root:?}"
    );
    assert_eq!(
        std::fs::read_dir(&root).unwrap().count(),
        1,
        "the chroot holds etc/ alone: {root:?}"
    );
    let cgroups = std::fs::read_to_string(proc_("cgroup")).unwrap();
    let under = |hierarchy: &str| {
        let path = cgroups
            .lines()
            .find_map(|l| l.split_once(&format!(":{hierarchy}:")).map(|(_, p)| p))
            .unwrap_or_else(|| panic!("no {hierarchy} cgroup: {cgroups}"));
        assert!(path.contains("vm"), "qemu in its guest's cgroup: {path}");
        std::path::Path::new("/sys/fs/cgroup")
            .join(hierarchy)
            .join(path.trim_start_matches('/'))
    };
    let memory = under("memory");
    let memory_limit_mib = cgroup_mib(&memory, "memory.limit_in_bytes");
    assert!(
        memory_limit_mib < 64 << 10,
        "a memory budget: {memory_limit_mib} MiB"
    );
    let pids = std::fs::read_to_string(under("pids").join("pids.max")).unwrap();
    assert_eq!(pids.trim(), "256");
    // (`cpu` is its own hierarchy here; elsewhere `cpu,cpuacct`, with `cpu` a link to it.)
    let cpu = if cgroups.contains(":cpu,cpuacct:") {
        "cpu,cpuacct"
    } else {
        "cpu"
    };
    let quota = std::fs::read_to_string(under(cpu).join("cpu.cfs_quota_us")).unwrap();
    assert!(
        quota.trim().parse::<i64>().unwrap() > 0,
        "a CPU budget: {quota}"
    );
    Jail {
        uid,
        root,
        memory,
        memory_limit_mib,
    }
}

/// The provider's own view of its leases.
fn leases(b: &Broker<'_>) -> Vec<Value> {
    let url = format!("{}/v1/leases", b.providers[0].url);
    let auth = b.provider_curl_args();
    let mut args: Vec<&str> = vec!["-sf", "--max-time", "5"];
    args.extend(auth.iter().map(String::as_str));
    args.push(&url);
    let out = b.host.exec("curl", &args).unwrap_or_default();
    serde_json::from_str::<Value>(&out).unwrap_or_default()["leases"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn field<'a>(log: &'a str, key: &str) -> &'a str {
    log.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in the Pod's log:\n{log}"))
}

#[test]
fn a_pod_runs_on_a_vm_node_that_a_panicking_guest_did_not_stop_and_sees_only_the_guest() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the VM test builds the node image and runs qemu: run as root (./x test)"
    );
    let t = Instant::now();
    let image_dir = testbed::nodeimage::test_image().unwrap();
    let image = image_dir.clone();
    step(t, "the node image is built");
    // A file the operator's host and the provider's machine have (they share this
    // filesystem here) and no guest has.
    let marker = format!("/var/lib/socialweb-host-marker-{}", std::process::id());
    std::fs::write(&marker, "the host's\n").unwrap();
    let world = World::new(1).unwrap();
    // What the guest must not reach on its provider's machine, and the control it must.
    let pm = &world.providers[0];
    pm.ns
        .exec(
            "ip",
            &["addr", "add", &format!("{METADATA}/32"), "dev", "lo"],
        )
        .unwrap();
    let _servers = [
        format!("TCP-LISTEN:{PROBE_PORT},fork,reuseaddr"),
        format!("TCP-LISTEN:80,bind={METADATA},fork,reuseaddr"),
    ]
    .map(|listen| {
        pm.ns
            .spawn("socat", &[&listen, "SYSTEM:echo provider-machine-answers"])
            .unwrap()
    });
    let _internet = world
        .operator
        .spawn(
            "socat",
            &[
                &format!("TCP-LISTEN:{PROBE_PORT},fork,reuseaddr"),
                "SYSTEM:echo the-internet-answers",
            ],
        )
        .unwrap();
    let mut b = Broker::start(
        &world,
        BrokerOptions {
            providers: 1,
            provider_capacity: 2,
            max_nodes: 1,
            hold: Duration::from_secs(5),
            image: Some(image),
            vm: true,
            // The first guest's kernel panics (its init exits): a guest that never reports.
            provider_failpoints: Some("provider::guest_panics=1*return".into()),
            ..Default::default()
        },
    )
    .unwrap();
    let dir = TempDir::new("vm").unwrap();
    let u = User::new(&b, dir.path(), "vm");
    assert!(
        b.guests().is_empty(),
        "zero nodes before a Pod: {:?}",
        b.guests()
    );
    let provider_log = std::fs::read_to_string(b.log("provider-1")).unwrap_or_default();
    assert!(
        provider_log.contains("VMs run under"),
        "the provider says its accelerator: {provider_log}"
    );
    // An RFP for an image it does not hold is refused, naming the one it boots.
    let held = std::fs::read_to_string(image_dir.join("nodeimage.json")).unwrap();
    let held: Value = serde_json::from_str(&held).unwrap();
    let other = format!("sha256:{}", "0".repeat(64));
    let rfp = serde_json::json!({"id": "wrong-image", "spec": {"vcpu": 1, "memMiB": 1024, "diskMiB": 4096},
        "image": other, "bid_deadline_ms": 1000, "isolation": "vm"});
    let url = format!("{}/v1/rfps", b.providers[0].url);
    let auth = b.provider_curl_args();
    let body = rfp.to_string();
    let mut args: Vec<&str> = vec![
        "-s",
        "--max-time",
        "5",
        "-w",
        "\n%{http_code}",
        "-H",
        "content-type: application/json",
        "-d",
        &body,
    ];
    args.extend(auth.iter().map(String::as_str));
    args.push(&url);
    let answer = b.host.exec("curl", &args).unwrap();
    assert!(answer.ends_with("\n422"), "{answer}");
    assert!(
        answer.contains("image_not_held")
            && answer.contains(&other)
            && answer.contains(held["fingerprint"].as_str().unwrap()),
        "{answer}"
    );
    let manifest = dir.path().join("escape.yaml");
    std::fs::write(
        &manifest,
        escape_pod(
            &marker,
            &pm.addr.to_string(),
            &testbed::world::OPERATOR_ADDR.to_string(),
        ),
    )
    .unwrap();
    u.ok(&b, &["apply", "-f", manifest.to_str().unwrap()]);
    step(t, "a cluster at zero nodes, a privileged Pod applied");

    // The first lease fails with the panic on the console as its reason.
    let failed = wait_for(
        "the panicking guest's lease to fail",
        Duration::from_secs(300),
        || Ok(leases(&b).into_iter().find(|l| l["state"] == "failed")),
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    let reason = failed["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("the guest ended before it reported ready")
            && reason.contains("console's last lines")
            && reason.contains("Kernel panic"),
        "{failed}"
    );
    step(
        t,
        "the first guest panicked; its lease failed with the console's last lines",
    );

    let out = b
        .kubectl_as(
            &u.kubeconfig,
            &[],
            &[
                "wait",
                "--for=condition=Ready",
                "pod/escape",
                "--timeout=900s",
            ],
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Pod on a VM node: {}\n{}",
        testbed::user::text(&out),
        b.diagnostics()
    );
    let running: Vec<Value> = leases(&b)
        .into_iter()
        .filter(|l| l["state"] == "running")
        .collect();
    assert_eq!(running.len(), 1, "another lease, running: {:?}", leases(&b));
    let guests: Vec<_> = b
        .guests()
        .into_iter()
        .filter(|(_, p)| p.is_some())
        .collect();
    assert_eq!(guests.len(), 1, "one qemu runs the node: {guests:?}");
    // qemu runs under its own seccomp filter (-sandbox on): mode 2.
    let qemu_status =
        std::fs::read_to_string(format!("/proc/{}/status", guests[0].1.unwrap())).unwrap();
    assert!(
        qemu_status.lines().any(|l| l == "Seccomp:\t2"),
        "qemu without its sandbox: {}",
        qemu_status
            .lines()
            .find(|l| l.starts_with("Seccomp"))
            .unwrap_or("no Seccomp line")
    );
    // ... and jailed: as a uid of its own, not root; in a network and a mount namespace of
    // its own, chrooted; in a cgroup with a budget.
    let qemu_pid = guests[0].1.unwrap();
    let jail = jail_of(qemu_pid, &qemu_status, &pm.ns.path());
    eprintln!("the jail: {jail:?}");
    step(t, &format!("qemu runs jailed, as uid {}", jail.uid));
    // The guest said `started` and `ready` on its status port, in that order, after qemu
    // started (the provider's book; the lease is running by `ready` alone).
    let book: Value =
        serde_json::from_slice(&std::fs::read(&b.providers[0].paths.provider_records).unwrap())
            .unwrap();
    let guest = &book["leases"][running[0]["id"].as_str().unwrap()]["guest"];
    let at = |k: &str| {
        guest[k]
            .as_u64()
            .unwrap_or_else(|| panic!("no {k}: {guest}"))
    };
    assert!(
        at("vmm_started_ms") <= at("agent_started_ms") && at("agent_started_ms") <= at("ready_ms"),
        "{guest}"
    );
    eprintln!(
        "qemu to agent started {} ms, to ready {} ms ({})",
        at("agent_started_ms") - at("vmm_started_ms"),
        at("ready_ms") - at("vmm_started_ms"),
        guest["accel"]
    );
    step(t, "another guest booted and joined; the Pod is Ready");

    // Its log, through the front.
    // (The kubelet of a guest under TCG may be slow to answer its first TLS handshake
    // through the tunnel, and the Pod's shell slow to write: a failed read is tried again,
    // for up to 180 s -- 60 s was too short once in five runs on this machine, 83 s after a
    // TCG guest took 83 s to be ready -- and what kubectl last said is kept for the failure.)
    let log = wait_for("the Pod's report", Duration::from_secs(180), || {
        let o = b
            .kubectl_as(&u.kubeconfig, &[], &["logs", "escape"])
            .output()?;
        let log = String::from_utf8_lossy(&o.stdout).into_owned();
        if !o.status.success() {
            anyhow::bail!("kubectl logs: {}", testbed::user::text(&o));
        }
        if !log.contains("done") {
            anyhow::bail!("the log so far: {log:?}");
        }
        Ok(Some(log))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.diagnostics()));
    eprintln!("{log}");
    assert_eq!(
        field(&log, "marker"),
        "absent",
        "the host's file is not the guest's"
    );
    let comms = field(&log, "comms");
    for inside in ["socialweb-agent", "kubelet", "containerd", "systemd"] {
        assert!(comms.contains(inside), "the guest's {inside} seen: {comms}");
    }
    for outside in [
        "socialweb-broke",
        "qemu-system-x86",
        "kube-apiserver",
        "etcd",
    ] {
        assert!(
            !comms.split(',').any(|c| c == outside),
            "{outside} is the host's, seen from the guest: {comms}"
        );
    }
    assert_eq!(field(&log, "fstab"), "1", "the guest's own files at /host");
    // Another machine on the internet answers (the probe is real); the provider's machine
    // does not, on its loopback, its own public address or a metadata address (the jail:
    // the VMs' user reaches other machines' public addresses only).
    assert_eq!(field(&log, "internet"), "the-internet-answers", "{log}");
    let answers = "provider-machine-answers";
    for private in ["loopback", "own", "metadata"] {
        assert!(
            !field(&log, private).contains(answers),
            "the guest reached the provider machine's {private}: {log}"
        );
    }
    eprintln!(
        "the guest's qemu used at most {} MiB of its cgroup's {} MiB",
        cgroup_mib(&jail.memory, "memory.max_usage_in_bytes"),
        jail.memory_limit_mib
    );
    let root_mib: u64 = field(&log, "root_mib").parse().unwrap();
    assert!(
        root_mib > 10_000,
        "the root grew to the RFP's 20 GiB disk: {root_mib} MiB"
    );
    step(
        t,
        "the privileged Pod saw the guest's processes and files, nothing outside, and reached \
         the internet but not its provider machine's loopback, public address or a metadata address",
    );

    // A provider that restarts adopts the guest that still runs: the same qemu, the lease
    // still running, the Pod untouched.
    b.kill_provider(0);
    b.start_provider(0).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let after: Vec<_> = b
        .guests()
        .into_iter()
        .filter(|(_, p)| p.is_some())
        .collect();
    assert_eq!(after, guests, "the same guest after the provider's restart");
    let lease = &running[0]["id"];
    assert!(
        leases(&b)
            .iter()
            .any(|l| &l["id"] == lease && l["state"] == "running"),
        "{:?}",
        leases(&b)
    );
    assert!(u.ok(&b, &["get", "pod", "escape"]).contains("Running"));
    step(t, "the provider restarted and adopted the running guest");

    // Teardown: the work stops, the node goes, the guest is powered off, its disks removed.
    u.ok(&b, &["delete", "pod", "escape", "--wait=true"]);
    wait_for("the guest to be gone", Duration::from_secs(180), || {
        Ok(b.guests().is_empty().then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}: {:?}\n{}", b.guests(), b.diagnostics()));
    assert!(
        leases(&b)
            .iter()
            .all(|l| l["state"] != "running" && l["state"] != "booting"),
        "{:?}",
        leases(&b)
    );
    assert!(
        !jail.memory.exists() && !jail.root.exists(),
        "the guest's cgroup and chroot outlived it: {jail:?}"
    );
    step(t, "teardown: no guest, no disks, no jail");

    let _ = std::fs::remove_file(&marker);
}
