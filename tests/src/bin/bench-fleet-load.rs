//! `bench/fleet --only load`: the store's load with a fleet's clusters at rest (issue 61),
//! this build against a baseline commit (by default the last one before the fleet read the
//! store once a period for all its clusters and renewed its leases in one statement).
//!
//! Each round builds a fleet of `--hosts` hosts on one PostgreSQL (the operator's host's,
//! as the fleet tests do), creates `--clusters` clusters at once round-robin over the hosts,
//! waits until every one hibernated (`hibernate_after` 5 s), then counts the store's
//! transactions (`pg_stat_database`, database `broker`: each of the broker's statements is
//! one) over `--seconds`. Rounds interleave ours and the baseline's (ours, baseline, ours,
//! ...). What is compared is a count of statements, which the build profile does not change:
//! ours runs the release build, the baseline its debug build (built once, cached in
//! `~/.cache/socialweb`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use testbed::broker::{Broker, BrokerOptions};
use testbed::postgres::Postgres;
use testbed::world::{OPERATOR_ADDR, World};

/// The last commit before issue 61's load work.
const BASELINE: &str = "557d9ae85d454254bb0fd2b448acd6b014eaf713";

#[derive(Debug, Parser)]
#[command(
    about = "the store's statements per second with a fleet's clusters hibernated, ours against a baseline commit"
)]
struct Args {
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(1..=20))]
    rounds: u8,
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u8).range(1..=24))]
    clusters: u8,
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=3))]
    hosts: u8,
    /// How long the store's transactions are counted, in seconds.
    #[arg(long, default_value_t = 40)]
    seconds: u64,
    /// The commit compared with (full hash).
    #[arg(long, default_value = BASELINE)]
    baseline: String,
}

/// The store database's transactions so far, and its connections now.
fn store_counts(pg: &testbed::Netns) -> Result<(f64, f64)> {
    let row = testbed::postgres::query(
        pg,
        "broker",
        "select xact_commit + xact_rollback, numbackends from pg_stat_database \
         where datname = 'broker'",
    )?;
    let (x, c) = row
        .trim()
        .split_once('|')
        .with_context(|| format!("pg_stat_database said {row:?}"))?;
    Ok((x.parse()?, c.parse()?))
}

/// One round with `broker_bin` (`None`: this build's): statements per second at rest, and
/// the store's connections.
fn round(args: &Args, broker_bin: Option<&std::path::Path>) -> Result<(f64, f64)> {
    let world = World::fleet(args.hosts, 0)?;
    let pg = Postgres::start_on(&world.operator, Some(OPERATOR_ADDR))?;
    let keys = testbed::tmp::TempDir::new("bench-fleet-load")?;
    let key = testbed::fleet::store_key(keys.path())?;
    let hosts = (1..=args.hosts)
        .map(|host| {
            Broker::start(
                &world,
                BrokerOptions {
                    broker_bin: broker_bin.map(std::path::Path::to_path_buf),
                    ..testbed::fleet::host(
                        &pg,
                        &key,
                        host,
                        Duration::from_secs(10),
                        Duration::from_secs(5),
                    )
                },
            )
        })
        .collect::<Result<Vec<_>>>()?;
    std::thread::scope(|s| -> Result<()> {
        let calls: Vec<_> = (0..args.clusters)
            .map(|i| {
                let host = &hosts[usize::from(i) % hosts.len()];
                s.spawn(move || -> Result<()> {
                    let name = format!("c{i}");
                    let v = host.cli_json(&["cluster", "create", &name, "--wait", "600s"])?;
                    if v["state"] != "ready" {
                        bail!("{name}: {v}\n{}", host.diagnostics());
                    }
                    Ok(())
                })
            })
            .collect();
        calls
            .into_iter()
            .try_for_each(|c| c.join().expect("a call"))
    })?;
    for i in 0..args.clusters {
        for h in &hosts {
            h.wait_state(&format!("c{i}"), "hibernating", Duration::from_secs(300));
        }
    }
    // Let the hibernations' own writes pass before counting.
    std::thread::sleep(Duration::from_secs(5));
    let (x0, _) = store_counts(&world.operator)?;
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(args.seconds));
    let (x1, connections) = store_counts(&world.operator)?;
    Ok(((x1 - x0) / t.elapsed().as_secs_f64(), connections))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let baseline = testbed::release::built_at("baseline", &args.baseline)?;
    let (mut rate, mut conns) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for r in 0..args.rounds {
        for (k, bin) in [None, Some(baseline.broker.as_path())]
            .into_iter()
            .enumerate()
        {
            let (x, c) = round(&args, bin)?;
            let who = ["ours", "baseline"][k];
            eprintln!("round {r}, {who}: {x:.2} store statements/s at rest, {c} connections");
            rate[k].push(x);
            conns[k].push(c);
        }
    }
    println!("rounds={}", args.rounds);
    println!("clusters={}", args.clusters);
    println!("hosts={}", args.hosts);
    println!("baseline_commit={}", args.baseline);
    let mut p50 = [None; 2];
    for (k, who) in ["ours", "baseline"].into_iter().enumerate() {
        p50[k] = testbed::stats::print_summary(
            &format!("store_statements_at_rest_{who}"),
            "_per_s",
            2,
            &mut rate[k],
        );
        testbed::stats::print_summary(&format!("store_connections_{who}"), "", 0, &mut conns[k]);
    }
    let ratio = p50[0].zip(p50[1]).map(|(ours, base)| ours / base);
    println!("ratio_vs_baseline={}", testbed::stats::show(ratio, 3));
    Ok(())
}
