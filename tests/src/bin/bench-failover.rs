//! `bench/fleet --only failover`: how long a fleet's cluster is down when the host running
//! it dies, and whether a write acknowledged before is still there (issue 40).
//!
//! Two broker hosts of a fleet (`World::fleet`: each its own namespace on the internet), the
//! release build, sharing the operator's host's PostgreSQL (store, the cluster's objects, its
//! sealed CAs), one cluster created on host 1. A writer on each host bumps one ConfigMap
//! every 100 ms straight at that host's apiserver (the fleet does not forward between hosts
//! yet, so only the owner's writer is answered). Then `--kills` rounds: the owner is killed
//! (`Broker::kill_host`: every process of it, its link down) and the time is taken until
//! the other host's apiserver answers `/readyz`; before its writer may go on, the
//! ConfigMap is read there and must hold at least the last value acknowledged before the
//! kill. The killed host is brought back (link up, broker started) and follows the cluster
//! again; the next round kills the new owner.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};
use testbed::broker::Broker;
use testbed::postgres::Postgres;
use testbed::world::{OPERATOR_ADDR, World};

#[derive(Debug, Parser)]
#[command(about = "failover time of a fleet's cluster when the host running it dies")]
struct Args {
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(1..=50))]
    kills: u8,
    /// `fleet.lease_ttl`.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    lease_ttl: Duration,
}

const BEAT: &str = "/api/v1/namespaces/default/configmaps/beat";

/// What the writers share.
#[derive(Default)]
struct Beat {
    next: AtomicU64,
    /// The highest value an apiserver acknowledged.
    acked: AtomicU64,
    /// Per host: may its writer write (paused while a takeover is checked).
    allowed: [AtomicBool; 2],
    stop: AtomicBool,
}

fn client(pki: &socialweb_broker::pki::Pki) -> Result<reqwest::Client> {
    let pair = pki.client("bench-failover", "bench-failover", &["system:masters"])?;
    let mut ident = std::fs::read(&pair.cert)?;
    ident.extend(std::fs::read(&pair.key)?);
    Ok(reqwest::Client::builder()
        .tls_certs_only(reqwest::Certificate::from_pem_bundle(
            pki.ca_pem().as_bytes(),
        )?)
        .identity(reqwest::Identity::from_pem(&ident)?)
        .timeout(Duration::from_secs(2))
        .build()?)
}

/// Host `i`'s writer, run in its namespace until `beat.stop`.
async fn writer(i: usize, api: &str, c: &reqwest::Client, beat: &Beat) {
    while !beat.stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if !beat.allowed[i].load(Ordering::SeqCst) {
            continue;
        }
        let n = beat.next.fetch_add(1, Ordering::SeqCst) + 1;
        let ok = c
            .patch(format!("{api}{BEAT}"))
            .header("content-type", "application/merge-patch+json")
            .body(json!({"data": {"n": n.to_string()}}).to_string())
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ok {
            beat.acked.fetch_max(n, Ordering::SeqCst);
        }
    }
}

/// GET `path` at host `ns`'s apiserver.
fn get(ns: &testbed::Netns, c: &reqwest::Client, url: &str) -> Result<Value> {
    ns.run(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(async {
                let r = c.get(url).send().await?;
                if !r.status().is_success() {
                    bail!("{url}: {}", r.status());
                }
                let text = r.text().await?;
                Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
            })
    })?
}

fn main() -> Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let world = World::fleet(2, 0)?;
    let pg = Postgres::start_on(&world.operator, Some(OPERATOR_ADDR))?;
    let keys = testbed::tmp::TempDir::new("bench-failover")?;
    let key = testbed::fleet::store_key(keys.path())?;
    let opts = |host| testbed::fleet::host(&pg, &key, host, args.lease_ttl, Duration::ZERO);
    let mut hosts = [
        Broker::start(&world, opts(1))?,
        Broker::start(&world, opts(2))?,
    ];
    let c = hosts[0].cli_json(&["cluster", "create", "ha"])?;
    if c["state"] != "ready" {
        bail!("cluster ha: {c}\n{}", hosts[0].diagnostics());
    }
    let api = c["server"]
        .as_str()
        .context("the apiserver's URL")?
        .to_string();
    hosts[0].kubectl("ha", &["create", "configmap", "beat", "--from-literal=n=0"])?;
    let pki = socialweb_broker::pki::Pki::open_or_create(
        &hosts[0].cluster_dir("ha").join("pki"),
        "unused",
    )?;
    let clients = [client(&pki)?, client(&pki)?];
    let beat = Beat::default();
    beat.allowed[0].store(true, Ordering::SeqCst);
    beat.allowed[1].store(true, Ordering::SeqCst);
    let mut failover_ms = Vec::new();
    let mut lost = 0u32;
    std::thread::scope(|s| -> Result<()> {
        for (i, (host, c)) in world.hosts.iter().zip(&clients).enumerate() {
            let (ns, api, beat) = (&host.ns, &api, &beat);
            s.spawn(move || {
                ns.run(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("a runtime")
                        .block_on(writer(i, api, c, beat))
                })
            });
        }
        let result = rounds(
            &args,
            &world,
            &mut hosts,
            &api,
            &clients,
            &beat,
            &mut failover_ms,
            &mut lost,
        );
        beat.stop.store(true, Ordering::SeqCst);
        result
    })?;
    println!("kills={}", args.kills);
    println!("lease_ttl_s={}", args.lease_ttl.as_secs_f64());
    testbed::stats::print_summary("failover", "_ms", 0, &mut failover_ms);
    println!(
        "failover_p99_ms={}",
        testbed::stats::show(testbed::stats::percentile(&mut failover_ms, 0.99), 0)
    );
    println!("acknowledged_writes_lost={lost}");
    println!("writes_acknowledged={}", beat.acked.load(Ordering::SeqCst));
    Ok(())
}

/// The kills, alternating between the hosts.
#[allow(clippy::too_many_arguments)]
fn rounds(
    args: &Args,
    world: &World,
    hosts: &mut [Broker<'_>; 2],
    api: &str,
    clients: &[reqwest::Client; 2],
    beat: &Beat,
    failover_ms: &mut Vec<f64>,
    lost: &mut u32,
) -> Result<()> {
    let mut owner = 0;
    for r in 0..args.kills {
        let other = 1 - owner;
        // The owner serves and the writer is acknowledged before each kill.
        let seen = beat.acked.load(Ordering::SeqCst);
        let t = Instant::now();
        while beat.acked.load(Ordering::SeqCst) <= seen + 5 {
            if t.elapsed() > Duration::from_secs(120) {
                bail!("round {r}: no write acknowledged for 120 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        beat.allowed[other].store(false, Ordering::SeqCst);
        hosts[owner].kill_host()?;
        let killed = Instant::now();
        let before = beat.acked.load(Ordering::SeqCst);
        let ns = &world.hosts[other].ns;
        while get(ns, &clients[other], &format!("{api}/readyz")).is_err() {
            if killed.elapsed() > Duration::from_secs(180) {
                bail!(
                    "round {r}: host {} never served the cluster\n{}",
                    other + 1,
                    hosts[other].diagnostics()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let took = killed.elapsed();
        let found: u64 = get(ns, &clients[other], &format!("{api}{BEAT}"))?["data"]["n"]
            .as_str()
            .and_then(|n| n.parse().ok())
            .context("the ConfigMap's value")?;
        if found < before {
            *lost += 1;
        }
        beat.allowed[other].store(true, Ordering::SeqCst);
        eprintln!(
            "kill {r}: host {} died; host {} served after {:.1} s, holding {found} (acknowledged {before})",
            owner + 1,
            other + 1,
            took.as_secs_f64()
        );
        failover_ms.push(took.as_secs_f64() * 1000.0);
        hosts[owner].revive_host()?;
        hosts[owner].wait_state("ha", "elsewhere", Duration::from_secs(60));
        owner = other;
    }
    Ok(())
}
