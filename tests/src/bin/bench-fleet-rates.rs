//! `bench/fleet --only rates`: how fast a fleet creates and wakes clusters with one host and
//! with three (issue 40).
//!
//! Each round builds a fleet (`World::fleet`, the release build, the operator's host's
//! PostgreSQL as the store and the clusters' datastore) of one host, then one of three
//! (interleaved: 1, 3, 1, 3, ...), and on it:
//!
//! - creates `--clusters` clusters at once, cluster `i` at host `i mod hosts` (`cluster
//!   create`, which answers once the control plane is ready): clusters per minute, from the
//!   first call to the last answer;
//! - waits until every one hibernated (`hibernate_after` 5 s);
//! - wakes them all at once at the same hosts (`cluster wake`): wakes per minute, likewise.
//!
//! Every host runs on this one machine, so three hosts share its cores as one does: what
//! this measures is the fleet's own overhead (leases, claims, followers), not added capacity.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Parser;
use testbed::broker::Broker;
use testbed::postgres::Postgres;
use testbed::world::{OPERATOR_ADDR, World};

#[derive(Debug, Parser)]
#[command(about = "cluster creates and wakes per minute with one fleet host and with three")]
struct Args {
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(1..=20))]
    rounds: u8,
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=12))]
    clusters: u8,
}

/// Runs `what` on host `i mod hosts` for each cluster at once; the wall time until all
/// answered `ready`.
fn all_at_once(hosts: &[Broker<'_>], n: u8, what: &[&str], wait: &str) -> Result<Duration> {
    let t = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let calls: Vec<_> = (0..n)
            .map(|i| {
                let host = &hosts[usize::from(i) % hosts.len()];
                let name = format!("c{i}");
                s.spawn(move || -> Result<()> {
                    let mut args: Vec<&str> = what.to_vec();
                    args.extend([name.as_str(), "--wait", wait]);
                    let v = host.cli_json(&args)?;
                    if v["state"] != "ready" {
                        bail!("{name}: {v}\n{}", host.diagnostics());
                    }
                    Ok(())
                })
            })
            .collect();
        for c in calls {
            c.join().expect("a call")?;
        }
        Ok(())
    })?;
    Ok(t.elapsed())
}

/// One round with `n` hosts: creates and wakes per minute.
fn round(n: u8, args: &Args) -> Result<(f64, f64)> {
    let world = World::fleet(n, 0)?;
    let pg = Postgres::start_on(&world.operator, Some(OPERATOR_ADDR))?;
    let keys = testbed::tmp::TempDir::new("bench-fleet-rates")?;
    let key = testbed::fleet::store_key(keys.path())?;
    let hosts = (1..=n)
        .map(|host| {
            Broker::start(
                &world,
                testbed::fleet::host(
                    &pg,
                    &key,
                    host,
                    Duration::from_secs(10),
                    Duration::from_secs(5),
                ),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let per_min = |d: Duration| f64::from(args.clusters) * 60.0 / d.as_secs_f64();
    let created = all_at_once(&hosts, args.clusters, &["cluster", "create"], "600s")?;
    for i in 0..args.clusters {
        hosts[0].wait_state(&format!("c{i}"), "hibernating", Duration::from_secs(300));
    }
    let woken = all_at_once(&hosts, args.clusters, &["cluster", "wake"], "600s")?;
    eprintln!(
        "{n} host(s): {} clusters created in {:.1} s, woken in {:.1} s",
        args.clusters,
        created.as_secs_f64(),
        woken.as_secs_f64()
    );
    Ok((per_min(created), per_min(woken)))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (mut creates, mut wakes) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for r in 0..args.rounds {
        for (k, n) in [1u8, 3].into_iter().enumerate() {
            let (c, w) = round(n, &args)?;
            eprintln!("round {r}, {n} host(s): {c:.1} creates/min, {w:.1} wakes/min");
            creates[k].push(c);
            wakes[k].push(w);
        }
    }
    println!("rounds={}", args.rounds);
    println!("clusters={}", args.clusters);
    let mut p50 = [[None; 2]; 2];
    for (k, n) in ["1", "3"].into_iter().enumerate() {
        p50[0][k] = testbed::stats::print_summary(
            &format!("creates_{n}_hosts"),
            "_per_min",
            1,
            &mut creates[k],
        );
        p50[1][k] = testbed::stats::print_summary(
            &format!("wakes_{n}_hosts"),
            "_per_min",
            1,
            &mut wakes[k],
        );
    }
    for (i, what) in ["creates", "wakes"].into_iter().enumerate() {
        let ratio = p50[i][0].zip(p50[i][1]).map(|(one, three)| three / one);
        println!(
            "{what}_ratio_3_vs_1_hosts={}",
            testbed::stats::show(ratio, 2)
        );
    }
    Ok(())
}
