//! `bench/fleet`, its first part: the datastores a fleet could keep clusters' objects in,
//! under the same churn. kine on PostgreSQL (`--datastore postgres`, the fleet's candidate)
//! against kine on SQLite (the default) and etcd.
//!
//! One `socialweb-broker run` (the release build) on the operator's host with a PostgreSQL
//! server (Debian's) beside it, three clusters, one per datastore, nothing else running.
//! Then rounds, interleaved (postgres, sqlite, etcd, postgres, ...). In each, for
//! `--seconds`, straight to the cluster's apiserver with a `system:masters` certificate of its
//! CA, from the operator's host:
//!
//! - `--writers` tasks each cycle through their own ConfigMaps: create, three updates (1 KiB
//!   of data each), delete. Every write's latency is kept. A write answered with anything
//!   but its success status, or not at all within 10 s, is a write error: the figure
//!   k0smotron's benchmark found at 9-15 % for kine on PostgreSQL under watch churn.
//! - `--watchers` tasks each watch the namespace's ConfigMaps from the round's start. Watch
//!   lag: the time from a write's answer to its event reaching a watcher. A watch that ends
//!   early or sends an `ERROR` event is a watch error.
//!
//! After each round, the datastore's size on disk (etcd's `member/snap/db`, kine's SQLite
//! file with its write-ahead log, the PostgreSQL database), and at the end the rows of kine's
//! table in PostgreSQL against the objects the cluster holds, then again after kine's next
//! compaction (`--compaction-wait`): how far compaction keeps the table bounded.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};
use testbed::broker::{Broker, BrokerOptions};
use testbed::postgres::Postgres;
use testbed::stats::summary_of as summary;

#[derive(Debug, Parser)]
#[command(about = "kine on PostgreSQL against kine on SQLite and etcd, under the same churn")]
struct Args {
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(1..=50))]
    rounds: u8,
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    #[arg(long, default_value_t = 8)]
    writers: usize,
    #[arg(long, default_value_t = 4)]
    watchers: usize,
    /// How long to wait after the rounds for kine's next compaction in PostgreSQL (it runs
    /// every 5 minutes); 0: do not wait.
    #[arg(long, default_value = "6m", value_parser = humantime::parse_duration)]
    compaction_wait: Duration,
}

/// The three datastores, in the order each round runs them.
const KINDS: [(&str, &str); 3] = [
    ("postgres", "postgres"),
    ("sqlite", "kine"),
    ("etcd", "etcd"),
];

/// The namespace the churn runs in.
const NS: &str = "churn";

/// One cluster: its name, the datastore, the client and URL straight to its apiserver.
struct Target {
    kind: &'static str,
    cluster: String,
    api: String,
    client: reqwest::Client,
}

fn client(
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
    timeout: Option<Duration>,
) -> Result<reqwest::Client> {
    let mut ident = cert_pem.to_vec();
    ident.extend_from_slice(key_pem);
    let mut b = reqwest::Client::builder()
        .tls_certs_only(reqwest::Certificate::from_pem_bundle(ca_pem)?)
        .identity(reqwest::Identity::from_pem(&ident)?);
    if let Some(t) = timeout {
        b = b.timeout(t);
    }
    Ok(b.build()?)
}

/// The cluster `name` on `datastore`, and a client to its apiserver as `system:masters`.
fn target(
    b: &Broker<'_>,
    kind: &'static str,
    datastore: &str,
) -> Result<(Target, reqwest::Client)> {
    let cluster = format!("churn-{kind}");
    let c = b.cli_json(&[
        "cluster",
        "create",
        &cluster,
        "--datastore",
        datastore,
        "--hibernate-after",
        "0",
    ])?;
    if c["state"] != "ready" || c["datastore"] != datastore {
        bail!("cluster {cluster}: {c}\n{}", b.diagnostics());
    }
    let pki_dir = b.cluster_dir(&cluster).join("pki");
    let pki = socialweb_broker::pki::Pki::open_or_create(&pki_dir, &cluster)?;
    let pair = pki.client("bench-fleet", "bench-fleet", &["system:masters"])?;
    let (ca, cert, key) = (
        std::fs::read(pki.ca_cert())?,
        std::fs::read(&pair.cert)?,
        std::fs::read(&pair.key)?,
    );
    let api = b.listed(&cluster)["server"]
        .as_str()
        .context("the cluster's apiserver URL")?
        .to_string();
    let writes = client(&ca, &cert, &key, Some(Duration::from_secs(10)))?;
    // Watches stay open for the round: no overall timeout.
    let watches = client(&ca, &cert, &key, None)?;
    Ok((
        Target {
            kind,
            cluster,
            api,
            client: writes,
        },
        watches,
    ))
}

/// What one round of one datastore measured.
#[derive(Debug, Default)]
struct Round {
    writes: usize,
    write_errors: usize,
    write_ms: Vec<f64>,
    lag_ms: Vec<f64>,
    watch_errors: usize,
    first_errors: Vec<String>,
}

/// A write's key in the watch: the ConfigMap's name and its `seq` value.
type Key = (String, u64);

#[derive(Default)]
struct Shared {
    acked: Mutex<HashMap<Key, Instant>>,
    seen: Mutex<Vec<(Key, Instant)>>,
    watch_errors: Mutex<Vec<String>>,
}

fn configmap(name: &str, seq: u64) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS},
        "data": {"seq": seq.to_string(), "payload": "x".repeat(1024)},
    })
}

/// One write: its method, URL and body; the status it must answer with.
async fn write(t: &Target, step: u64, name: &str, seq: u64) -> Result<(), String> {
    let base = format!("{}/api/v1/namespaces/{NS}/configmaps", t.api);
    let (req, want) = match step % 5 {
        0 => (t.client.post(&base).json(&configmap(name, seq)), 201),
        4 => (t.client.delete(format!("{base}/{name}")), 200),
        _ => (
            t.client
                .put(format!("{base}/{name}"))
                .json(&configmap(name, seq)),
            200,
        ),
    };
    match req.send().await {
        Ok(r) if r.status().as_u16() == want => {
            r.bytes().await.map(|_| ()).map_err(|e| e.to_string())
        }
        Ok(r) => {
            let status = r.status();
            let body = r.text().await.unwrap_or_default();
            Err(format!(
                "{status}: {}",
                body.chars().take(300).collect::<String>()
            ))
        }
        Err(e) => Err(format!("{e}")),
    }
}

/// A writer: its own ConfigMaps, cycled until `end`.
async fn writer(t: Arc<Target>, id: String, end: Instant, shared: Arc<Shared>) -> Round {
    let mut r = Round::default();
    let mut step = 0u64;
    while Instant::now() < end {
        let name = format!("{id}-{}", step / 5);
        let seq = step;
        let t0 = Instant::now();
        let res = write(&t, step, &name, seq).await;
        let done = Instant::now();
        r.writes += 1;
        match res {
            Ok(()) => {
                r.write_ms.push((done - t0).as_secs_f64() * 1000.0);
                if step % 5 != 4 {
                    shared.acked.lock().expect("lock").insert((name, seq), done);
                }
                step += 1;
            }
            Err(e) => {
                r.write_errors += 1;
                if r.first_errors.is_empty() {
                    r.first_errors.push(e.chars().take(200).collect());
                }
                // Start a fresh object: the failed one's state is unknown.
                step = (step / 5 + 1) * 5;
            }
        }
    }
    r
}

/// A watcher: every ADDED and MODIFIED event's arrival, until `end`.
async fn watcher(
    t: Arc<Target>,
    watches: reqwest::Client,
    rv: String,
    end: Instant,
    shared: Arc<Shared>,
) {
    let url = format!(
        "{}/api/v1/namespaces/{NS}/configmaps?watch=1&resourceVersion={rv}&allowWatchBookmarks=false",
        t.api
    );
    let fail = |e: String| shared.watch_errors.lock().expect("lock").push(e);
    let mut resp = match watches.get(&url).send().await {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => return fail(format!("watch answered {}", r.status())),
        Err(e) => return fail(format!("watch: {e}")),
    };
    let mut buf = Vec::new();
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let chunk = match tokio::time::timeout(left, resp.chunk()).await {
            Err(_) => return,
            Ok(Ok(Some(c))) => c,
            Ok(Ok(None)) => return fail("the watch ended before the round did".into()),
            Ok(Err(e)) => return fail(format!("watch: {e}")),
        };
        let now = Instant::now();
        buf.extend_from_slice(&chunk);
        while let Some(at) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=at).collect();
            let Ok(ev) = serde_json::from_slice::<Value>(&line) else {
                fail(format!(
                    "an event that is not JSON: {}",
                    String::from_utf8_lossy(&line)
                ));
                continue;
            };
            match ev["type"].as_str() {
                Some("ADDED" | "MODIFIED") => {
                    let o = &ev["object"];
                    let name = o["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    let seq = o["data"]["seq"].as_str().and_then(|s| s.parse().ok());
                    if let Some(seq) = seq {
                        shared.seen.lock().expect("lock").push(((name, seq), now));
                    }
                }
                Some("ERROR") => fail(format!("watch ERROR event: {}", ev["object"])),
                _ => {}
            }
        }
    }
}

/// One round of churn against `t`.
/// Round `n`'s writers name their ConfigMaps `r<n>w<writer>-<i>`: a round cut short leaves
/// objects a later round must not try to create again.
async fn round(t: &Arc<Target>, watches: &reqwest::Client, args: &Args, n: u8) -> Result<Round> {
    // Watch from now: the list's resource version.
    let list: Value = t
        .client
        .get(format!(
            "{}/api/v1/namespaces/{NS}/configmaps?limit=1",
            t.api
        ))
        .send()
        .await?
        .json()
        .await?;
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .context("the list's resourceVersion")?
        .to_string();
    let shared = Arc::new(Shared::default());
    let start = Instant::now();
    let end = start + Duration::from_secs(args.seconds);
    // Watchers get a second more, for the last writes' events.
    let watch_end = end + Duration::from_secs(1);
    let mut watching = Vec::new();
    for _ in 0..args.watchers {
        watching.push(tokio::spawn(watcher(
            t.clone(),
            watches.clone(),
            rv.clone(),
            watch_end,
            shared.clone(),
        )));
    }
    let mut writing = Vec::new();
    for id in 0..args.writers {
        writing.push(tokio::spawn(writer(
            t.clone(),
            format!("r{n}w{id}"),
            end,
            shared.clone(),
        )));
    }
    let mut total = Round::default();
    for w in writing {
        let r = w.await?;
        total.writes += r.writes;
        total.write_errors += r.write_errors;
        total.write_ms.extend(r.write_ms);
        total.first_errors.extend(r.first_errors);
    }
    for w in watching {
        w.await?;
    }
    let acked = shared.acked.lock().expect("lock");
    for (key, at) in shared.seen.lock().expect("lock").iter() {
        if let Some(ack) = acked.get(key) {
            // An event may beat the writer's own answer: no lag then.
            total
                .lag_ms
                .push(at.saturating_duration_since(*ack).as_secs_f64() * 1000.0);
        }
    }
    let errors = shared.watch_errors.lock().expect("lock");
    total.watch_errors = errors.len();
    total.first_errors.extend(errors.iter().take(1).cloned());
    Ok(total)
}

/// The datastore's bytes on disk.
fn size(b: &Broker<'_>, ns: &testbed::Netns, t: &Target) -> Result<u64> {
    let dir = b.cluster_dir(&t.cluster);
    let file = |p: PathBuf| std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
    Ok(match t.kind {
        "etcd" => file(dir.join("etcd/member/snap/db")),
        "sqlite" => file(dir.join("kine/state.db")) + file(dir.join("kine/state.db-wal")),
        _ => {
            let db = database(&dir)?;
            testbed::postgres::query(ns, "postgres", &format!("select pg_database_size('{db}')"))?
                .parse()?
        }
    })
}

/// The PostgreSQL database of a cluster's directory, named as the broker names it.
fn database(dir: &Path) -> Result<String> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .context("the cluster's directory name")?;
    Ok(socialweb_broker::control_plane::postgres::database_name(
        name,
    ))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let world = testbed::world::World::new(0)?;
    let host = &world.operator;
    let pg = Postgres::start(host)?;
    let b = Broker::start(
        &world,
        BrokerOptions {
            clusters: socialweb_broker::config::ClusterDefaults {
                postgres_url: Some(pg.url.clone()),
                ..Default::default()
            },
            ..Default::default()
        },
    )?;
    let mut targets = Vec::new();
    for (kind, datastore) in KINDS {
        let (t, w) = target(&b, kind, datastore)?;
        b.kubectl(&t.cluster, &["create", "namespace", NS])?;
        targets.push((Arc::new(t), w));
    }
    eprintln!(
        "clusters ready; {} rounds of {} s, {} writers, {} watchers",
        args.rounds, args.seconds, args.writers, args.watchers
    );
    let mut results: Vec<(&'static str, Round, u64)> = Vec::new();
    for r in 0..args.rounds {
        for (t, watches) in &targets {
            let got = host.run(|| -> Result<Round> {
                tokio::runtime::Runtime::new()?.block_on(round(t, watches, &args, r))
            })??;
            let bytes = size(&b, host, t)?;
            let p99 =
                testbed::stats::percentile(&mut got.write_ms.clone(), 0.99).unwrap_or(f64::NAN);
            eprintln!(
                "round {r} {}: {} writes ({} errors), p99 {p99:.1} ms, watch errors {}, size {} MiB {:?}",
                t.kind,
                got.writes,
                got.write_errors,
                got.watch_errors,
                bytes >> 20,
                got.first_errors
            );
            results.push((t.kind, got, bytes));
        }
    }
    report(&args, &results)?;
    compaction(&b, host, &targets, args.compaction_wait)?;
    Ok(())
}

/// The figures, per datastore, then the ratios.
fn report(args: &Args, results: &[(&'static str, Round, u64)]) -> Result<()> {
    println!("rounds={}", args.rounds);
    println!("seconds_per_round={}", args.seconds);
    println!("writers={}", args.writers);
    println!("watchers={}", args.watchers);
    let mut rate = HashMap::new();
    let mut p99 = HashMap::new();
    for (kind, _) in KINDS {
        let mine: Vec<&(&str, Round, u64)> = results.iter().filter(|r| r.0 == kind).collect();
        let rates: Vec<f64> = mine
            .iter()
            .map(|r| r.1.writes as f64 / args.seconds as f64)
            .collect();
        let p99s: Vec<f64> = mine
            .iter()
            .filter_map(|r| testbed::stats::percentile(&mut r.1.write_ms.clone(), 0.99))
            .collect();
        let lags: Vec<f64> = mine
            .iter()
            .filter_map(|r| testbed::stats::percentile(&mut r.1.lag_ms.clone(), 0.99))
            .collect();
        let errors: usize = mine.iter().map(|r| r.1.write_errors).sum();
        let writes: usize = mine.iter().map(|r| r.1.writes).sum();
        let watch_errors: usize = mine.iter().map(|r| r.1.watch_errors).sum();
        let s = summary("writes/s", rates)?;
        println!("{kind}_writes_per_s={:.0}", s.p50);
        println!("{kind}_writes_per_s_min={:.0}", s.min);
        println!("{kind}_writes_per_s_max={:.0}", s.max);
        println!("{kind}_writes={writes}");
        println!("{kind}_write_errors={errors}");
        let w = summary("write p99", p99s)?;
        println!("{kind}_write_p99_ms={:.1}", w.p50);
        println!("{kind}_write_p99_ms_min={:.1}", w.min);
        println!("{kind}_write_p99_ms_max={:.1}", w.max);
        let l = summary("watch lag p99", lags)?;
        println!("{kind}_watch_lag_p99_ms={:.1}", l.p50);
        println!("{kind}_watch_lag_p99_ms_min={:.1}", l.min);
        println!("{kind}_watch_lag_p99_ms_max={:.1}", l.max);
        println!("{kind}_watch_errors={watch_errors}");
        let sizes: Vec<u64> = mine.iter().map(|r| r.2).collect();
        println!(
            "{kind}_size_after_first_round_mib={:.1}",
            sizes[0] as f64 / 1048576.0
        );
        println!(
            "{kind}_size_after_last_round_mib={:.1}",
            sizes[sizes.len() - 1] as f64 / 1048576.0
        );
        rate.insert(kind, s.p50);
        p99.insert(kind, w.p50);
    }
    for other in ["sqlite", "etcd"] {
        println!(
            "ratio_writes_postgres_vs_{other}={:.3}",
            rate["postgres"] / rate[other]
        );
        println!(
            "ratio_write_p99_postgres_vs_{other}={:.3}",
            p99["postgres"] / p99[other]
        );
    }
    Ok(())
}

/// kine's rows in PostgreSQL against the objects the cluster holds: what compaction (every
/// 5 minutes, keeping the last 1,000 revisions) leaves of the churn's history.
fn compaction(
    b: &Broker<'_>,
    ns: &testbed::Netns,
    targets: &[(Arc<Target>, reqwest::Client)],
    wait: Duration,
) -> Result<()> {
    let t = &targets[0].0;
    let db = database(&b.cluster_dir(&t.cluster))?;
    let q = |sql: &str| -> Result<u64> { Ok(testbed::postgres::query(ns, &db, sql)?.parse()?) };
    let rows = q("select count(*) from kine")?;
    let revisions = q("select coalesce(max(id), 0) from kine")?;
    let live = q(
        "select count(*) from kine k where k.id = (select max(id) from kine where name = k.name) and k.deleted = 0",
    )?;
    println!("postgres_kine_rows={rows}");
    println!("postgres_kine_revisions={revisions}");
    println!("postgres_kine_live_keys={live}");
    let start = Instant::now();
    while start.elapsed() < wait {
        std::thread::sleep(Duration::from_secs(10));
        let now = q("select count(*) from kine")?;
        if now < rows {
            println!("postgres_kine_rows_after_compaction={now}");
            println!(
                "postgres_compaction_seen_after_s={}",
                start.elapsed().as_secs()
            );
            let mib = size(b, ns, t)? as f64 / 1048576.0;
            println!("postgres_size_after_compaction_mib={mib:.1}");
            return Ok(());
        }
    }
    if !wait.is_zero() {
        println!("postgres_compaction_seen_after_s=none");
    }
    Ok(())
}
