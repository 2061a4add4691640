//! `bench/fleet --only front`: requests lost through a fleet's fronts while its cluster
//! moves (issue 40): drained off its host, and its host killed.
//!
//! Two broker hosts of a fleet (`World::fleet`), the release build, sharing the operator's
//! host's PostgreSQL; a user's cluster created at host 1, with the user's kubeconfig from the
//! gateway. Two writers, one through each host's front (from the internet, with the
//! kubeconfig's certificate; the front of the host that does not run the cluster carries
//! the request over its link), each PATCHing one ConfigMap of its own every 100 ms. Then:
//!
//! - `--drains` rounds: the host running the cluster is drained, the other serves it, the
//!   drain is undone. Every request both writers sent from the drain until 2 s after the
//!   other host served counts; a failed one is lost.
//! - `--kills` rounds: the host running the cluster is killed (every process, its link
//!   down); only the other front's writer counts. The time until its first write is
//!   acknowledged again is the failover as a user sees it; its failed requests are those
//!   in flight at the dead host (sent, so not sent again: they may have been applied); the
//!   value read back must be at least the last acknowledged before the kill. The killed
//!   host comes back before the next round.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine;
use clap::Parser;
use serde_json::{Value, json};
use testbed::broker::Broker;
use testbed::postgres::Postgres;
use testbed::world::{OPERATOR_ADDR, World};

#[derive(Debug, Parser)]
#[command(about = "requests lost through a fleet's fronts while its cluster moves")]
struct Args {
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(1..=50))]
    drains: u8,
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(0..=50))]
    kills: u8,
    /// `fleet.lease_ttl`.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    lease_ttl: Duration,
}

/// One front's writer.
#[derive(Default)]
struct Writer {
    sent: AtomicU64,
    acked: AtomicU64,
    /// When each failed request was sent.
    failed: Mutex<Vec<Instant>>,
    /// When each acknowledged request was sent, and when it was answered.
    acks: Mutex<Vec<(Instant, Instant)>>,
    on: AtomicBool,
}

impl Writer {
    fn failed_between(&self, from: Instant, to: Instant) -> usize {
        let f = self.failed.lock().expect("lock");
        f.iter().filter(|t| **t >= from && **t <= to).count()
    }

    fn sent_between(&self, from: Instant, to: Instant) -> usize {
        let a = self.acks.lock().expect("lock");
        a.iter().filter(|(t, _)| *t >= from && *t <= to).count() + self.failed_between(from, to)
    }

    /// When the first request sent after `t` and acknowledged was sent, and answered.
    fn first_ack_after(&self, t: Instant) -> Option<(Instant, Instant)> {
        let a = self.acks.lock().expect("lock");
        a.iter().copied().find(|(sent, _)| *sent > t)
    }
}

/// PATCHes `url` every 100 ms while `w.on`, until `stop`.
async fn write(url: &str, c: &reqwest::Client, w: &Writer, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if !w.on.load(Ordering::SeqCst) {
            continue;
        }
        let n = w.sent.fetch_add(1, Ordering::SeqCst) + 1;
        let at = Instant::now();
        let ok = c
            .patch(url)
            .header("content-type", "application/merge-patch+json")
            .body(json!({"data": {"n": n.to_string()}}).to_string())
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ok {
            w.acked.fetch_max(n, Ordering::SeqCst);
            w.acks.lock().expect("lock").push((at, Instant::now()));
        } else {
            w.failed.lock().expect("lock").push(at);
        }
    }
}

/// The user's client and the cluster's URL at host `to`'s front, from the kubeconfig.
fn front_client(kc: &Value, from: &str, to: &str) -> Result<(reqwest::Client, String)> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let field = |p: &str| -> Result<Vec<u8>> {
        let v = kc
            .pointer(p)
            .and_then(Value::as_str)
            .context(p.to_string())?;
        Ok(b64.decode(v)?)
    };
    let mut ident = field("/users/0/user/client-certificate-data")?;
    ident.extend(field("/users/0/user/client-key-data")?);
    let client = reqwest::Client::builder()
        .tls_certs_only(reqwest::Certificate::from_pem_bundle(&field(
            "/clusters/0/cluster/certificate-authority-data",
        )?)?)
        .identity(reqwest::Identity::from_pem(&ident)?)
        // Longer than the front holds a request (90 s): the front answers first.
        .timeout(Duration::from_secs(120))
        .build()?;
    let server = kc
        .pointer("/clusters/0/cluster/server")
        .and_then(Value::as_str)
        .context("the kubeconfig's server")?
        .replace(from, to);
    Ok((client, server))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let world = World::fleet(2, 0)?;
    let pg = Postgres::start_on(&world.operator, Some(OPERATOR_ADDR))?;
    let keys = testbed::tmp::TempDir::new("bench-fleet-front")?;
    let key = testbed::fleet::store_key(keys.path())?;
    let opts = |host| testbed::fleet::host(&pg, &key, host, args.lease_ttl, Duration::ZERO);
    let mut hosts = [
        Broker::start(&world, opts(1))?,
        Broker::start(&world, opts(2))?,
    ];
    let user = keys.path().join("user.key");
    let out = std::process::Command::new(testbed::cni::workspace_bin("socialweb-broker"))
        .args(["api", "keygen", "--out"])
        .arg(&user)
        .output()?;
    if !out.status.success() {
        bail!("keygen: {}", String::from_utf8_lossy(&out.stderr));
    }
    let c = hosts[0].api(&user, &["create-cluster", "ha", "--wait", "150s"])?;
    if c["state"] != "ready" {
        bail!("cluster ha: {c}\n{}", hosts[0].diagnostics());
    }
    let kc_path = keys.path().join("kc");
    hosts[0].api(
        &user,
        &["kubeconfig", "ha", "--out", kc_path.to_str().unwrap()],
    )?;
    let kc: Value = serde_json::from_str(&std::fs::read_to_string(&kc_path)?)?;
    let fronts = [hosts[0].front_url(), hosts[1].front_url()];
    let sides = [
        front_client(&kc, &fronts[0], &fronts[0])?,
        front_client(&kc, &fronts[0], &fronts[1])?,
    ];
    for (i, (client, server)) in sides.iter().enumerate() {
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("w{i}")}, "data": {"n": "0"}});
        let url = format!("{server}/api/v1/namespaces/default/configmaps");
        world.internet.run(|| -> Result<()> {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(async {
                    // The other host learns of the certificate within a second.
                    for _ in 0..40 {
                        let r = client.post(&url).json(&body).send().await?;
                        if r.status().is_success() {
                            return Ok(());
                        }
                        if r.status() != reqwest::StatusCode::UNAUTHORIZED {
                            bail!(
                                "creating w{i} through host {}'s front: {}",
                                i + 1,
                                r.status()
                            );
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    bail!(
                        "creating w{i}: host {}'s front never admitted the user",
                        i + 1
                    )
                })
        })??;
    }
    let writers = [Writer::default(), Writer::default()];
    let stop = AtomicBool::new(false);
    let figures = std::thread::scope(|s| {
        for (i, ((client, server), w)) in sides.iter().zip(&writers).enumerate() {
            w.on.store(true, Ordering::SeqCst);
            let (ns, stop) = (&world.internet, &stop);
            let url = format!("{server}/api/v1/namespaces/default/configmaps/w{i}");
            s.spawn(move || {
                ns.run(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("a runtime")
                        .block_on(write(&url, client, w, stop))
                })
            });
        }
        let r = rounds(&args, &world, &mut hosts, &sides, &writers);
        stop.store(true, Ordering::SeqCst);
        r
    })?;
    figures.print(&args);
    Ok(())
}

/// What the rounds measured.
#[derive(Default)]
struct Figures {
    drain_sent: usize,
    drain_failed: usize,
    drain_ms: Vec<f64>,
    kill_sent: usize,
    kill_failed: usize,
    failover_ms: Vec<f64>,
    lost: u32,
}

impl Figures {
    fn print(mut self, args: &Args) {
        println!("drains={}", args.drains);
        println!("drain_requests={}", self.drain_sent);
        println!("drain_requests_failed={}", self.drain_failed);
        testbed::stats::print_summary("drain_move", "_ms", 0, &mut self.drain_ms);
        println!("kills={}", args.kills);
        println!("lease_ttl_s={}", args.lease_ttl.as_secs_f64());
        println!("failover_requests={}", self.kill_sent);
        println!("failover_requests_failed={}", self.kill_failed);
        testbed::stats::print_summary("failover_front", "_ms", 0, &mut self.failover_ms);
        println!(
            "failover_front_p99_ms={}",
            testbed::stats::show(testbed::stats::percentile(&mut self.failover_ms, 0.99), 0)
        );
        println!("acknowledged_writes_lost={}", self.lost);
    }
}

/// The value of ConfigMap `w<i>` through front `i`'s client.
fn read(world: &World, side: &(reqwest::Client, String), i: usize) -> Result<u64> {
    let url = format!("{}/api/v1/namespaces/default/configmaps/w{i}", side.1);
    let v: Value = world.internet.run(|| -> Result<Value> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(async { Ok(side.0.get(&url).send().await?.json().await?) })
    })??;
    v["data"]["n"]
        .as_str()
        .and_then(|n| n.parse().ok())
        .context("the ConfigMap's value")
}

fn rounds(
    args: &Args,
    world: &World,
    hosts: &mut [Broker<'_>; 2],
    sides: &[(reqwest::Client, String); 2],
    writers: &[Writer; 2],
) -> Result<Figures> {
    let mut f = Figures::default();
    let mut owner = 0;
    for r in 0..args.drains {
        let other = 1 - owner;
        std::thread::sleep(Duration::from_secs(2));
        let from = Instant::now();
        hosts[owner].cli_json(&["drain"])?;
        hosts[other].wait_state("ha", "ready", Duration::from_secs(120));
        f.drain_ms.push(from.elapsed().as_secs_f64() * 1000.0);
        std::thread::sleep(Duration::from_secs(2));
        let to = Instant::now();
        let (sent, failed) = writers.iter().fold((0, 0), |(s, x), w| {
            (s + w.sent_between(from, to), x + w.failed_between(from, to))
        });
        eprintln!(
            "drain {r}: host {} drained, host {} served after {:.1} s; {sent} requests, {failed} failed",
            owner + 1,
            other + 1,
            f.drain_ms.last().copied().unwrap_or_default() / 1000.0
        );
        f.drain_sent += sent;
        f.drain_failed += failed;
        hosts[owner].cli(&["drain", "--undo"])?;
        owner = other;
    }
    for r in 0..args.kills {
        let other = 1 - owner;
        std::thread::sleep(Duration::from_secs(2));
        let before = writers[other].acked.load(Ordering::SeqCst);
        writers[owner].on.store(false, Ordering::SeqCst);
        hosts[owner].kill_host()?;
        let killed = Instant::now();
        let (back, answered) = loop {
            if let Some(t) = writers[other].first_ack_after(killed) {
                break t;
            }
            if killed.elapsed() > Duration::from_secs(180) {
                bail!(
                    "kill {r}: no write through host {}'s front for 180 s",
                    other + 1
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The first write sent after the kill was held at the front until the cluster
        // answered again: its answer is when users are served again.
        let took = answered.duration_since(killed);
        let found = read(world, &sides[other], other)?;
        if found < before {
            f.lost += 1;
        }
        let (sent, failed) = (
            writers[other].sent_between(killed - Duration::from_secs(1), back),
            writers[other].failed_between(killed - Duration::from_secs(1), back),
        );
        eprintln!(
            "kill {r}: host {} died; through host {}'s front a write was acknowledged again after {:.1} s; {sent} requests, {failed} failed; holding {found} (acknowledged {before})",
            owner + 1,
            other + 1,
            took.as_secs_f64()
        );
        f.kill_sent += sent;
        f.kill_failed += failed;
        f.failover_ms.push(took.as_secs_f64() * 1000.0);
        hosts[owner].revive_host()?;
        hosts[owner].wait_state("ha", "elsewhere", Duration::from_secs(60));
        writers[owner].on.store(true, Ordering::SeqCst);
        owner = other;
    }
    Ok(f)
}
