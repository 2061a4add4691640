//! `socialweb-conformance` (`./x conformance`): the upstream Kubernetes conformance suite for
//! networking and DNS against a socialweb cluster made the way users get one.
//!
//! The real topology ([`testbed::world`]): the operator's host, where `socialweb-broker run`
//! runs, and two provider machines, each running `socialweb-broker provider` with its nodes
//! behind NAT; the control plane reaches nodes and Pods only through the broker's tunnel, and
//! `socialweb-broker cluster create` makes the cluster. Pause pods, one per
//! node, keep the nodes rented for the whole run. Every node imports the suite's test images
//! at boot (built on this machine by `write_conformance_images`; nothing is pulled). Then
//! `ginkgo` runs `e2e.test` (both from image-builder/conformance/build.sh) from the host with
//! the cluster's admin kubeconfig, and this prints `passed=`, `failed=`, `skipped=` from its
//! JUnit report. Failures listed in docs/conformance.md (with their reason) are known; any
//! other makes the exit status 1.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use testbed::broker::{Broker, BrokerOptions};
use testbed::k8s::wait_for;

/// What `./x conformance` runs by default: sig-network's conformance tests (the DNS ones
/// among them).
const FOCUS: &str = r"\[sig-network\].*\[Conformance\]";

/// The upstream Kubernetes conformance suite for networking and DNS on a local cluster.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// The directory holding e2e.test, ginkgo and agnhost (image-builder/conformance/build.sh
    /// prints it).
    #[arg(long, env = "SOCIALWEB_CONFORMANCE_DIR")]
    suite_dir: PathBuf,
    /// The test images' root filesystem tarball (image-builder/conformance/rootfs.sh prints it).
    #[arg(long, env = "SOCIALWEB_CONFORMANCE_ROOTFS")]
    rootfs: PathBuf,
    /// How many nodes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(2..=4))]
    nodes: u32,
    /// ginkgo's focus: which tests run.
    #[arg(long, default_value = FOCUS)]
    focus: String,
    /// ginkgo's skip, if any (nothing is skipped by default: known failures run and are
    /// reported as such).
    #[arg(long)]
    skip: Option<String>,
    /// How many ginkgo processes run tests at once ([Serial] tests run alone).
    #[arg(long, default_value_t = 4)]
    parallel: u32,
    /// The suite's time limit.
    #[arg(long, default_value = "90m")]
    timeout: String,
    /// Where the JUnit report, the suite's log and the results list go.
    #[arg(long, default_value = "target/conformance")]
    report_dir: PathBuf,
    /// The file listing the known failures and their reasons.
    #[arg(long, default_value = "docs/conformance.md")]
    known: PathBuf,
    /// Keep the cluster up after the suite until Ctrl-C, to look around.
    #[arg(long)]
    hold: bool,
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
        testbed::images::CONFORMANCE_PAUSE_IMAGE
    )
}

/// One test case of the JUnit report.
#[derive(Debug)]
struct Case {
    name: String,
    status: String,
    /// The skip message (`skipped` alone when the focus filtered the test out).
    skipped: Option<String>,
    failure: Option<String>,
    seconds: f64,
}

fn attr(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    let end = tag[start..].find('"')? + start;
    Some(unescape(&tag[start..end]))
}

fn unescape(s: &str) -> String {
    s.replace("&#34;", "\"")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&apos;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#xA;", "\n")
        .replace("&#x9;", "\t")
        .replace("&amp;", "&")
}

/// The test cases of a Ginkgo JUnit report (testcase elements with `name` and `status`, a
/// `skipped` or `failure` child).
fn parse_junit(xml: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find("<testcase ") {
        rest = &rest[i..];
        let tag_end = rest.find('>').unwrap_or(rest.len());
        let tag = &rest[..tag_end];
        let body_end = if tag.ends_with('/') {
            tag_end
        } else {
            rest.find("</testcase>").unwrap_or(rest.len())
        };
        let body = &rest[tag_end..body_end];
        // A child element's message, or its text when the message is empty (Ginkgo puts
        // the failure's text there).
        let child = |name: &str| -> Option<String> {
            let open = format!("<{name}");
            let at = body.find(&open)?;
            let t = &body[at..];
            let tag_end = t.find('>').unwrap_or(t.len());
            let message = attr(&t[..tag_end], "message").unwrap_or_default();
            if !message.is_empty() {
                return Some(message);
            }
            let text = &t[(tag_end + 1).min(t.len())..];
            let text = &text[..text.find(&format!("</{name}>")).unwrap_or(0)];
            Some(unescape(text.trim()))
        };
        cases.push(Case {
            name: attr(tag, "name").unwrap_or_default(),
            status: attr(tag, "status").unwrap_or_default(),
            skipped: child("skipped"),
            failure: child("failure").or_else(|| child("error")),
            seconds: attr(tag, "time")
                .and_then(|t| t.parse().ok())
                .unwrap_or(0.0),
        });
        rest = &rest[body_end.min(rest.len())..];
        if rest.starts_with("<testcase ") {
            rest = &rest[1..];
        }
    }
    cases
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

fn main() -> Result<()> {
    let args = Args::parse();
    let t = Instant::now();
    let n = args.nodes;
    let e2e = args.suite_dir.join("e2e.test");
    let ginkgo = args.suite_dir.join("ginkgo");
    let agnhost = args.suite_dir.join("agnhost");
    for p in [&e2e, &ginkgo, &agnhost, &args.rootfs] {
        if !p.is_file() {
            bail!(
                "{} is missing (image-builder/conformance/build.sh and rootfs.sh make it)",
                p.display()
            );
        }
    }
    std::fs::create_dir_all(&args.report_dir)?;
    let report_dir = std::fs::canonicalize(&args.report_dir)?;
    let kube = testbed::k8s::binaries()?;

    step(
        t,
        "the suite's test images (agnhost, jessie-dnsutils, busybox, nginx, httpd, pause), built here",
    );
    let work = testbed::tmp::TempDir::new("conformance")?;
    let images = work.path().join("conformance-images.tar");
    testbed::images::write_conformance_images(&images, &args.rootfs, &agnhost, work.path())?;
    let pause = work.path().join("conformance-pause.tar");
    testbed::images::write_conformance_pause(&pause, &kube.pause())?;
    for (name, _, _) in testbed::images::CONFORMANCE_IMAGES {
        println!("{name}");
    }
    println!(
        "{}  ({} MiB archive, imported by every node at boot)",
        testbed::images::CONFORMANCE_PAUSE_IMAGE,
        std::fs::metadata(&images)?.len() >> 20
    );

    step(
        t,
        "the operator's host and two provider machines behind NAT; socialweb-broker run, a provider on each machine",
    );
    let world = testbed::world::World::new(2)?;
    let host = &world.operator;
    let b = Broker::start(
        &world,
        BrokerOptions {
            max_nodes: n,
            pods_per_node: 1,
            // Never back to zero during the run.
            hold: Duration::from_secs(3600),
            extra_seeds: vec![images.clone(), pause.clone()],
            providers: 2,
            // The nodes spread over both providers.
            provider_capacity: n.div_ceil(2),
            // The operator's own cluster: some of the suite's tests run hostNetwork Pods,
            // which the node isolation policy (docs/security.md) refuses on DIDs' clusters.
            clusters_toml: "isolate_operators_clusters = false\n".into(),
            ..Default::default()
        },
    )?;

    step(
        t,
        &format!("socialweb-broker cluster create conformance; {n} keeper pods rent {n} nodes"),
    );
    print!("{}", b.cli(&["cluster", "create", "conformance"])?);
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
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    step(
        t,
        &format!(
            "ginkgo e2e.test --focus '{}' ({} at once), from the host with the admin kubeconfig",
            args.focus, args.parallel
        ),
    );
    let junit = report_dir.join("junit_01.xml");
    let _ = std::fs::remove_file(&junit);
    let log = report_dir.join("e2e.log");
    println!("log: {}", log.display());
    let mut cmd = host.command(&ginkgo.to_string_lossy());
    cmd.arg(format!("--nodes={}", args.parallel))
        .arg(format!("--focus={}", args.focus))
        .arg(format!("--timeout={}", args.timeout))
        .arg("--no-color");
    if let Some(skip) = &args.skip {
        cmd.arg(format!("--skip={skip}"));
    }
    cmd.arg(&e2e)
        .arg("--")
        .arg(format!(
            "--kubeconfig={}",
            b.kubeconfig("conformance").display()
        ))
        .arg("--provider=skeleton")
        .arg(format!("--kubectl-path={}", bin.join("kubectl").display()))
        .arg(format!("--report-dir={}", report_dir.display()))
        .arg("--dns-domain=cluster.local")
        .env("PATH", &path);
    let suite_start = Instant::now();
    let status = run_teed(cmd, &log)?;
    let suite_secs = suite_start.elapsed().as_secs_f64();

    step(t, "results");
    let xml = std::fs::read_to_string(&junit).with_context(|| {
        format!(
            "reading the JUnit report {} (ginkgo exited {status})",
            junit.display()
        )
    })?;
    let cases = parse_junit(&xml);
    // Ginkgo lists every spec of the suite; those the focus filtered out are "skipped" with
    // no reason. What ran, or was skipped by the test itself, is the selection.
    let selected: Vec<&Case> = cases
        .iter()
        .filter(|c| c.status != "skipped" || c.skipped.as_deref().is_some_and(|m| m != "skipped"))
        // Suite-level nodes ([SynchronizedBeforeSuite], [ReportBeforeSuite], ...) are not tests.
        .filter(|c| !c.name.starts_with('[') || c.name.starts_with("[It] "))
        .collect();
    let known = known_failures(&std::fs::read_to_string(&args.known).unwrap_or_default());
    let mut results = String::new();
    let (mut passed, mut failed, mut skipped, mut undocumented) = (0, 0, 0, Vec::new());
    for c in &selected {
        let verdict = match c.status.as_str() {
            "passed" => {
                passed += 1;
                "PASS"
            }
            "skipped" => {
                skipped += 1;
                "SKIP"
            }
            _ => {
                failed += 1;
                let short = c.name.trim_start_matches("[It] ");
                if !known.iter().any(|k| k == short) {
                    undocumented.push(c);
                }
                "FAIL"
            }
        };
        results.push_str(&format!("{verdict} {:>7.1}s {}\n", c.seconds, c.name));
    }
    std::fs::write(report_dir.join("results.txt"), &results)?;
    print!("{results}");
    for c in &undocumented {
        println!(
            "\nFAIL (not in {}): {}\n  {}",
            args.known.display(),
            c.name,
            c.failure
                .as_deref()
                .unwrap_or("")
                .lines()
                .take(6)
                .collect::<Vec<_>>()
                .join("\n  ")
        );
    }
    println!();
    println!("kubernetes_version={}", kube_version(&kube.kube()));
    println!("nodes={n}");
    println!("selected={}", selected.len());
    println!("passed={passed}");
    println!("failed={failed}");
    println!("skipped={skipped}");
    println!("failed_undocumented={}", undocumented.len());
    println!("suite_seconds={suite_secs:.0}");
    println!("junit={}", junit.display());

    if args.hold {
        step(t, "holding the cluster; Ctrl-C ends it");
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
    }
    drop(b);
    if !undocumented.is_empty() || selected.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

/// The tests the document lists as known failures: the `- <test name>` lines of its
/// `## Known failures` section.
fn known_failures(doc: &str) -> Vec<String> {
    doc.split_once("\n## Known failures")
        .map(|(_, rest)| rest.split("\n## ").next().unwrap_or(""))
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.strip_prefix("- "))
        .map(|l| l.trim().to_string())
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn junit_cases_are_read_with_their_status_and_failure_text() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="3" disabled="0" errors="0" failures="1" time="1">
  <testsuite name="Kubernetes e2e suite" package="/x" tests="3">
    <testcase name="[ReportBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="0.01"></testcase>
    <testcase name="[It] [sig-network] DNS should provide DNS for services [Conformance]" classname="Kubernetes e2e suite" status="passed" time="4.8"></testcase>
    <testcase name="[It] [sig-network] Services should be able to create a functioning NodePort service [Conformance]" classname="Kubernetes e2e suite" status="failed" time="131.7">
      <failure message="" type="failed">[FAILED] service is not reachable within 2m0s timeout on endpoint 172.30.1.2:30546 over TCP protocol&#xA;In [It] at: service.go:1312</failure>
    </testcase>
    <testcase name="[It] [sig-apps] Deployment should run [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
  </testsuite>
</testsuites>"#;
        let cases = parse_junit(xml);
        assert_eq!(cases.len(), 4);
        assert_eq!(cases[1].status, "passed");
        assert!((cases[1].seconds - 4.8).abs() < 1e-9);
        assert_eq!(cases[2].status, "failed");
        assert_eq!(
            cases[2].failure.as_deref().unwrap().lines().next(),
            Some(
                "[FAILED] service is not reachable within 2m0s timeout on endpoint 172.30.1.2:30546 over TCP protocol"
            )
        );
        assert_eq!(cases[3].skipped.as_deref(), Some("skipped"));
        assert!(cases[1].failure.is_none());
    }

    #[test]
    fn known_failures_are_the_list_items_of_their_section_only() {
        let doc = "# T\n\n## Results\n\n- [sig-network] A passes [Conformance]\n\n## Known failures\n\nWhy.\n\n- [sig-network] B fails [Conformance]\n- [sig-network] C fails [Conformance]\n\n## Later\n\n- D\n";
        assert_eq!(
            known_failures(doc),
            [
                "[sig-network] B fails [Conformance]",
                "[sig-network] C fails [Conformance]"
            ]
        );
    }
}
