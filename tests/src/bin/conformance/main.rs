//! `socialweb-conformance` (`./x conformance`): the upstream Kubernetes conformance suite
//! against a socialweb cluster made the way users get one: sig-network's tests by default,
//! every `[Conformance]` test with `--all`, one SIG's with `--sig`.
//!
//! The real topology ([`testbed::world`]): the operator's host, where `socialweb-broker run`
//! runs, and two provider machines, each running `socialweb-broker provider` with its nodes
//! behind NAT; the control plane reaches nodes and Pods only through the broker's tunnel, and
//! `socialweb-broker cluster create` makes the cluster. Pause pods, one per
//! node, keep the nodes rented for the whole run. Every node imports the suite's test images
//! at boot (built on this machine by `write_conformance_images`; nothing is pulled). Then
//! `ginkgo` runs `e2e.test` (both from image-builder/conformance/build.sh) from the host with
//! the cluster's admin kubeconfig, once per part of the run ([`parts::plan`]: the parallel
//! pass, then the `[Serial]` one), and this prints `passed=`, `failed=`, `skipped=` per part
//! and in all from their JUnit reports ([`report`]). Failures listed in docs/conformance.md
//! (with their reason) are known; any other makes the exit status 1.

mod images;
mod metrics;
mod parts;
mod report;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use testbed::broker::{Broker, BrokerOptions};
use testbed::k8s::wait_for;

use parts::{Part, Pass, Selection};
use report::{Outcome, PartTime, Totals};

/// The upstream Kubernetes conformance suite on a local cluster of nodes rented from two
/// providers behind NAT.
///
/// By default sig-network's conformance tests (the DNS ones among them) in one run; `--all`
/// runs every `[Conformance]` test of the pinned e2e.test in two passes, the parallel one and
/// then the `[Serial]` tests one at a time, as the upstream conformance image does; `--sig`
/// runs one SIG's tests the same way. Each part writes its JUnit report, log and results
/// under --report-dir/<part>/, and results.md (per-SIG totals, every test) beside them.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// The directory holding e2e.test, ginkgo and agnhost (image-builder/conformance/build.sh
    /// prints it).
    #[arg(long, env = "SOCIALWEB_CONFORMANCE_DIR")]
    suite_dir: PathBuf,
    /// The test images' root filesystem tarball (image-builder/conformance/rootfs.sh prints
    /// it).
    #[arg(long, env = "SOCIALWEB_CONFORMANCE_ROOTFS")]
    rootfs: PathBuf,
    /// The binaries and files of the test images beyond agnhost: busybox, nnp,
    /// sample-apiserver, etcd, nautilus/, httpd/ (image-builder/conformance/images.sh prints
    /// it).
    #[arg(long, env = "SOCIALWEB_CONFORMANCE_IMAGES")]
    images_dir: PathBuf,
    /// How many nodes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(2..=4))]
    nodes: u32,
    /// Every [Conformance] test: a parallel pass, then the [Serial] tests one at a time.
    #[arg(long, conflicts_with_all = ["focus", "skip", "sig"])]
    all: bool,
    /// One SIG's [Conformance] tests, in the same two passes (`apps` or `sig-apps`;
    /// docs/conformance.md gives the order that splits the whole suite).
    #[arg(long, value_parser = parts::sig_name, conflicts_with_all = ["focus", "skip"])]
    sig: Option<String>,
    /// With --all or --sig: only this pass.
    #[arg(long, value_enum)]
    pass: Option<Pass>,
    /// ginkgo's focus: which tests run (without --all or --sig).
    #[arg(long, default_value = parts::NETWORK)]
    focus: String,
    /// ginkgo's skip, if any (nothing is skipped by default: known failures run and are
    /// reported as such).
    #[arg(long)]
    skip: Option<String>,
    /// How many ginkgo processes run tests at once ([Serial] tests run alone).
    #[arg(long, default_value_t = 4)]
    parallel: u32,
    /// Each part's time limit.
    #[arg(long, default_value = "90m")]
    timeout: String,
    /// Where the parts' JUnit reports, logs and results go.
    #[arg(long, default_value = "target/conformance")]
    report_dir: PathBuf,
    /// The file listing the known failures and their reasons.
    #[arg(long, default_value = "docs/conformance.md")]
    known: PathBuf,
    /// Keep the cluster up after the suite until Ctrl-C, to look around.
    #[arg(long)]
    hold: bool,
    /// The cluster's datastore: kine on SQLite (the default), etcd, or kine on PostgreSQL
    /// (`postgres`: a server from Debian's packages started on the operator's host, the way
    /// a fleet keeps its clusters; docs/operations.md, "A fleet").
    #[arg(long, default_value = "kine", value_parser = ["kine", "etcd", "postgres"])]
    datastore: String,
    /// Run the suite as a tenant, not as the operator: the cluster is made for a DID of the
    /// runner's (`cluster create --owner`), and e2e.test uses the kubeconfig that DID gets
    /// from getKubeconfig, so every request goes through the front and holds the tenant's
    /// rights (docs/security.md, "A tenant's rights"); on namespace nodes the node isolation
    /// policy applies too, as on every DID's cluster.
    #[arg(long)]
    as_tenant: bool,
}

/// The apiserver's storage figures ([`metrics::Storage`]); its whole `/metrics` kept in `to`.
fn storage(b: &Broker<'_>, to: &Path) -> Result<metrics::Storage> {
    let text = b.kubectl("conformance", &["get", "--raw", "/metrics"])?;
    std::fs::create_dir_all(to)?;
    std::fs::write(to.join("apiserver-metrics.txt"), &text)?;
    Ok(metrics::Storage::parse(&text))
}

/// Copies the control plane's logs (`<cluster dir>/logs`) into `to`, so that a failure can
/// be read after the run has taken the cluster down; and counts what kine says when its
/// watch stream stalls: SQL slower than its threshold (1 s) and revisions it gave up on
/// ("GAP").
fn keep_logs(b: &Broker<'_>, to: &Path) -> Result<(u64, u64)> {
    let from = b.cluster_dir("conformance").join("logs");
    std::fs::create_dir_all(to)?;
    let (mut slow, mut gaps) = (0, 0);
    for e in std::fs::read_dir(&from).with_context(|| format!("reading {}", from.display()))? {
        let e = e?;
        std::fs::copy(e.path(), to.join(e.file_name()))?;
        if e.file_name().to_string_lossy().starts_with("kine") {
            let text = String::from_utf8_lossy(&std::fs::read(e.path())?).into_owned();
            slow += text.lines().filter(|l| l.contains("Slow SQL")).count() as u64;
            gaps += text.lines().filter(|l| l.contains("GAP ")).count() as u64;
        }
    }
    Ok((slow, gaps))
}

fn step(t: Instant, what: &str) {
    println!("\n== [{:>6.1}s] {what}", t.elapsed().as_secs_f64());
}

/// A pause pod per node, in their own namespace, that keeps the node rented for the run.
fn keeper(i: u32) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: keep-{i}, namespace: socialweb-conformance, labels: {{app: keep}}}}
spec:
  terminationGracePeriodSeconds: 1
  affinity:
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector: {{matchLabels: {{app: keep}}}}
  containers:
  - name: pause
    image: {}
    imagePullPolicy: Never
    resources: {{requests: {{cpu: 10m, memory: 8Mi}}}}
"#,
        images::PAUSE_IMAGE
    )
}

/// Runs `cmd`, its stdout and stderr copied both to ours and to `log`.
fn run_teed(mut cmd: std::process::Command, log: &Path) -> Result<std::process::ExitStatus> {
    let file = Arc::new(Mutex::new(std::fs::File::create(log)?));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting ginkgo")?;
    let pipes: Vec<Box<dyn std::io::Read + Send>> = vec![
        Box::new(child.stdout.take().expect("piped")),
        Box::new(child.stderr.take().expect("piped")),
    ];
    let threads: Vec<_> = pipes
        .into_iter()
        .map(|p| {
            let file = file.clone();
            // Bytes, not UTF-8 lines: the suite logs raw responses (protobuf Status bodies),
            // and a reader that stopped at the first invalid line would leave ginkgo to die
            // of SIGPIPE on its next write.
            std::thread::spawn(move || {
                let mut r = BufReader::new(p);
                let mut line = Vec::new();
                while r.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                    let _ = std::io::stdout().lock().write_all(&line);
                    let _ = file.lock().expect("the log").write_all(&line);
                    line.clear();
                }
            })
        })
        .collect();
    let status = child.wait()?;
    for t in threads {
        let _ = t.join();
    }
    Ok(status)
}

fn main() -> Result<std::process::ExitCode> {
    let args = Args::parse();
    let t = Instant::now();
    let n = args.nodes;
    let e2e = args.suite_dir.join("e2e.test");
    let ginkgo = args.suite_dir.join("ginkgo");
    let agnhost = args.suite_dir.join("agnhost");
    for p in [
        &e2e,
        &ginkgo,
        &agnhost,
        &args.rootfs,
        &args.images_dir.join("busybox"),
        &args.images_dir.join("nnp"),
    ] {
        if !p.is_file() {
            bail!(
                "{} is missing (image-builder/conformance/build.sh, images.sh and rootfs.sh make it)",
                p.display()
            );
        }
    }
    std::fs::create_dir_all(&args.report_dir)?;
    let report_dir = std::fs::canonicalize(&args.report_dir)?;
    let kube = testbed::k8s::binaries()?;

    step(t, "the suite's test images, built here");
    let work = testbed::tmp::TempDir::new("conformance")?;
    let seeds = write_images(&args, &kube, work.path())?;

    step(
        t,
        "the operator's host and two provider machines behind NAT; socialweb-broker run, a provider on each machine",
    );
    let world = testbed::world::World::new(2)?;
    let host = &world.operator;
    let pg = (args.datastore == "postgres")
        .then(|| testbed::postgres::Postgres::start(host))
        .transpose()?;
    let b = Broker::start(
        &world,
        BrokerOptions {
            max_nodes: n,
            pods_per_node: 1,
            // Never back to zero during the run.
            hold: Duration::from_secs(3600),
            extra_seeds: seeds,
            providers: 2,
            // The nodes spread over both providers.
            provider_capacity: n.div_ceil(2),
            // The operator's own cluster: some of the suite's tests run hostNetwork Pods,
            // which the node isolation policy (docs/security.md) refuses on DIDs' clusters.
            clusters: socialweb_broker::config::ClusterDefaults {
                isolate_operators_clusters: false,
                postgres_url: pg.as_ref().map(|p| p.url.clone()),
                ..Default::default()
            },
            ..Default::default()
        },
    )?;

    step(
        t,
        &format!(
            "socialweb-broker cluster create conformance --datastore {}; {n} keeper pods rent {n} nodes",
            args.datastore
        ),
    );
    let tenant = args.as_tenant.then(|| {
        socialweb_broker::auth::token::SigningKey::generate(atrium_crypto::Algorithm::P256)
    });
    let mut create = vec![
        "cluster",
        "create",
        "conformance",
        "--datastore",
        &args.datastore,
    ];
    let owner = tenant.as_ref().map(|k| k.did());
    if let Some(did) = &owner {
        create.extend(["--owner", did.as_str()]);
    }
    print!("{}", b.cli(&create)?);
    let manifest: String = std::iter::once(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: socialweb-conformance}\n---\n"
            .to_string(),
    )
    .chain((1..=n).map(|i| format!("{}---\n", keeper(i))))
    .collect();
    b.apply("conformance", &manifest)?;
    wait_for("every node Ready", Duration::from_secs(600), || {
        let ready = b.ready_nodes("conformance")?.len();
        Ok((ready == n as usize).then_some(()))
    })
    .with_context(|| b.diagnostics())?;
    wait_for("the keeper pods Running", Duration::from_secs(300), || {
        let v = b.kubectl_json(
            "conformance",
            &["get", "pods", "-n", "socialweb-conformance"],
        )?;
        let items = v["items"].as_array().cloned().unwrap_or_default();
        Ok(
            (items.len() == n as usize && items.iter().all(|p| p["status"]["phase"] == "Running"))
                .then_some(()),
        )
    })
    .with_context(|| b.diagnostics())?;
    print!(
        "{}",
        b.kubectl(
            "conformance",
            &["get", "nodes", "-o", "custom-columns=NODE:.metadata.name,POD-CIDR:.spec.podCIDR,ADDRESS:.status.addresses[0].address,VERSION:.status.nodeInfo.kubeletVersion"]
        )?
    );

    // No route from the host to any node or Pod: the control plane reaches them through the
    // broker's tunnel only (docs/tunnel.md).

    // kubectl for the tests that run it: a link named kubectl to the multicall binary.
    let bin = work.path().join("bin");
    std::fs::create_dir_all(&bin)?;
    std::os::unix::fs::symlink(kube.kube(), bin.join("kubectl"))?;

    let sel = Selection {
        all: args.all,
        sig: args.sig.as_deref(),
        focus: &args.focus,
        skip: args.skip.as_deref(),
        pass: args.pass,
        procs: args.parallel,
    };
    let known = report::known_failures(&std::fs::read_to_string(&args.known).unwrap_or_default());
    let kubeconfig = match &tenant {
        None => b.kubeconfig("conformance"),
        Some(key) => {
            let key_file = work.path().join("tenant.key");
            std::fs::write(&key_file, key.to_multibase())?;
            let out = work.path().join("tenant.kubeconfig");
            b.api(
                &key_file,
                &["kubeconfig", "conformance", "--out", &out.to_string_lossy()],
            )?;
            println!(
                "the suite runs as tenant {} (the owners' group, through the front)",
                key.did()
            );
            out
        }
    };
    let suite = Suite {
        ginkgo: &ginkgo,
        e2e: &e2e,
        kubectl: &bin.join("kubectl"),
        kubeconfig: &kubeconfig,
        timeout: &args.timeout,
        host,
    };
    let mut all: Vec<Outcome> = Vec::new();
    let mut times = Vec::new();
    for part in parts::plan(&sel) {
        step(
            t,
            &format!(
                "part {}: ginkgo e2e.test --focus '{}'{} ({} at once), from the host with the {} kubeconfig",
                part.name,
                part.focus,
                part.skip
                    .as_ref()
                    .map(|s| format!(" --skip '{s}'"))
                    .unwrap_or_default(),
                part.procs,
                if tenant.is_some() {
                    "tenant's"
                } else {
                    "admin"
                }
            ),
        );
        let dir = report_dir.join(&part.name);
        let (outcomes, seconds) = suite.run(&part, &dir, &known)?;
        print_part(&part, &outcomes, seconds, &args.known);
        times.push(PartTime {
            name: part.name.clone(),
            procs: part.procs,
            seconds,
        });
        all.extend(outcomes);
    }

    step(t, "results");
    let version = kube_version(&kube.kube());
    let totals = Totals::of(&all);
    for (sig, st) in report::by_sig(&all) {
        print!("{}", st.figures(&format!("{}_", sig.replace('-', "_"))));
    }
    let header = format!(
        "Kubernetes {version}, `e2e.test` of the same module, {n} nodes behind NAT on two provider machines, the cluster's datastore {}; {} tests in {} part(s).",
        args.datastore,
        totals.selected,
        times.len()
    );
    let md = report_dir.join("results.md");
    std::fs::write(&md, report::markdown(&header, &times, &all))?;
    println!("kubernetes_version={version}");
    println!("nodes={n}");
    println!("datastore={}", args.datastore);
    let logs = report_dir.join("logs");
    print!(
        "{}",
        storage(&b, &logs)
            .context("the apiserver's storage metrics")?
            .figures()
    );
    let (slow, gaps) = keep_logs(&b, &logs).context("keeping the control plane's logs")?;
    if args.datastore != "etcd" {
        println!("kine_slow_sql={slow}");
        println!("kine_gaps_skipped={gaps}");
    }
    println!("logs={}", logs.display());
    print!("{}", totals.figures(""));
    println!(
        "suite_seconds={:.0}",
        times.iter().map(|p| p.seconds).sum::<f64>()
    );
    println!("results={}", md.display());

    if args.hold {
        hold(host, &kube, &b)?;
    }
    // Returned, not `process::exit`ed: the broker, PostgreSQL, the machines' namespaces and
    // the work directory are dropped on the way out (an exit skipped them and left the whole
    // cluster running after a failed run).
    Ok(if totals.undocumented > 0 || totals.selected == 0 {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    })
}

/// The seed archives of the suite's images ([`images`]), written into `work`.
fn write_images(args: &Args, kube: &testbed::k8s::Binaries, work: &Path) -> Result<Vec<PathBuf>> {
    let debian = work.join("conformance-debian.tar");
    let inputs = images::Inputs {
        rootfs: &args.rootfs,
        suite: &args.suite_dir,
        images: &args.images_dir,
    };
    images::write_debian_images(&debian, &inputs, work)?;
    let busybox = work.join("conformance-busybox.tar");
    images::write_busybox(&busybox, &args.images_dir.join("busybox"))?;
    let pause = work.join("conformance-pause.tar");
    images::write_pause(&pause, &kube.pause())?;
    let seeds = vec![debian, busybox, pause];
    for i in images::DEBIAN_IMAGES {
        println!("{}", i.reference);
    }
    println!("{}\n{}", images::BUSYBOX_IMAGE, images::PAUSE_IMAGE);
    let mib: u64 = seeds
        .iter()
        .map(|s| std::fs::metadata(s).map(|m| m.len()).unwrap_or(0))
        .sum::<u64>()
        >> 20;
    println!("({mib} MiB of archives, imported by every node at boot)");
    Ok(seeds)
}

/// What every part runs: ginkgo and e2e.test from the host against the cluster.
struct Suite<'a> {
    ginkgo: &'a Path,
    e2e: &'a Path,
    kubectl: &'a Path,
    kubeconfig: &'a Path,
    timeout: &'a str,
    host: &'a testbed::netns::Netns,
}

impl Suite<'_> {
    /// Runs one part with its report in `dir`; its selected tests' outcomes and how long it
    /// took.
    fn run(&self, part: &Part, dir: &Path, known: &[String]) -> Result<(Vec<Outcome>, f64)> {
        std::fs::create_dir_all(dir)?;
        let junit = dir.join("junit_01.xml");
        let _ = std::fs::remove_file(&junit);
        let log = dir.join("e2e.log");
        println!("log: {}", log.display());
        let bin = self.kubectl.parent().unwrap_or(Path::new("."));
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = self.host.command(&self.ginkgo.to_string_lossy());
        cmd.arg(format!("--nodes={}", part.procs))
            .arg(format!("--focus={}", part.focus))
            .arg(format!("--timeout={}", self.timeout))
            .arg("--no-color");
        if let Some(skip) = &part.skip {
            cmd.arg(format!("--skip={skip}"));
        }
        cmd.arg(self.e2e)
            .arg("--")
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg("--provider=skeleton")
            .arg(format!("--kubectl-path={}", self.kubectl.display()))
            .arg(format!("--report-dir={}", dir.display()))
            .arg("--dns-domain=cluster.local")
            .env("PATH", &path);
        let start = Instant::now();
        let status = run_teed(cmd, &log)?;
        let seconds = start.elapsed().as_secs_f64();
        let xml = std::fs::read_to_string(&junit).with_context(|| {
            format!(
                "reading the JUnit report {} (ginkgo exited {status})",
                junit.display()
            )
        })?;
        let cases = report::selected(report::parse_junit(&xml)?);
        let outcomes = report::outcomes(&part.name, cases, known);
        let results: String = outcomes.iter().map(|o| o.line() + "\n").collect();
        std::fs::write(dir.join("results.txt"), &results)?;
        Ok((outcomes, seconds))
    }
}

/// A part's results: every test, the failures the doc does not list with their first lines,
/// and its figures.
fn print_part(part: &Part, outcomes: &[Outcome], seconds: f64, known: &Path) {
    for o in outcomes {
        println!("{}", o.line());
    }
    for o in outcomes
        .iter()
        .filter(|o| o.verdict == report::Verdict::Fail && !o.known)
    {
        println!(
            "\nFAIL (not in {}): {}\n  {}",
            known.display(),
            o.case.name,
            o.case
                .failure
                .as_deref()
                .unwrap_or("")
                .lines()
                .take(6)
                .collect::<Vec<_>>()
                .join("\n  ")
        );
    }
    println!();
    let prefix = format!("{}_", part.name.replace('-', "_"));
    print!("{}", Totals::of(outcomes).figures(&prefix));
    println!("{prefix}seconds={seconds:.0}");
}

fn hold(host: &testbed::netns::Netns, kube: &testbed::k8s::Binaries, b: &Broker) -> Result<()> {
    println!("\n== holding the cluster; Ctrl-C ends it");
    println!(
        "kubectl:  ip netns exec {} {} kubectl --kubeconfig {} get nodes",
        host.name(),
        kube.kube().display(),
        b.kubeconfig("conformance").display()
    );
    let mut signals = nix::sys::signal::SigSet::empty();
    signals.add(nix::sys::signal::Signal::SIGINT);
    signals.add(nix::sys::signal::Signal::SIGTERM);
    signals.thread_block()?;
    signals.wait()?;
    Ok(())
}

fn kube_version(kube: &Path) -> String {
    std::process::Command::new(kube)
        .args(["kubectl", "version", "--client", "-o", "json"])
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .and_then(|v| {
            v["clientVersion"]["gitVersion"]
                .as_str()
                .map(str::to_string)
        })
        .unwrap_or_default()
}
