//! `bench/front`: what the certificate front costs a tenant cluster's API.
//!
//! One `socialweb-broker run` (the release build), one cluster created through the gateway
//! API, one kubeconfig from getKubeconfig. Then rounds, interleaved (direct, front, direct,
//! ...): `--concurrency` workers issue `GET /api/v1/namespaces` for `--seconds`, over one
//! pooled client each side, from the host namespace:
//!
//! - direct: to the apiserver, with a client certificate of the cluster CA for the same user
//!   and group the front forwards as (so RBAC does the same work; the front adds its TLS,
//!   admission and one hop, and the apiserver its request-header check);
//! - front: to the front's mount URL with the kubeconfig's certificate.
//!
//! Both clients are the same reqwest build with the same settings (HTTP/2 by ALPN, one
//! connection pool, no timeouts beyond 10 s per request).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine;
use clap::Parser;
use serde_json::Value;
use testbed::broker::{Broker, BrokerOptions};

#[derive(Debug, Parser)]
#[command(about = "GET /api/v1/namespaces straight to the apiserver and through the front")]
struct Args {
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(1..=50))]
    rounds: u8,
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
}

/// CPU time (user + system, ms) a process has used so far, all its threads.
fn cpu_ms(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = &stat[stat.rfind(')').context("stat")? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    // USER_HZ is 100 on Linux.
    Ok(ticks * 10.0)
}

/// The cluster's apiserver process, from its pidfile.
fn apiserver_pid(run_dir: &std::path::Path) -> Result<u32> {
    for e in std::fs::read_dir(run_dir)? {
        let path = e?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.contains("apiserver") && name.ends_with(".pid") {
            return Ok(std::fs::read_to_string(&path)?
                .split_whitespace()
                .next()
                .context("an empty pidfile")?
                .parse()?);
        }
    }
    bail!("no apiserver pidfile in {}", run_dir.display())
}

struct Side {
    name: &'static str,
    url: String,
    client: reqwest::Client,
}

fn client(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Result<reqwest::Client> {
    let mut ident = cert_pem.to_vec();
    ident.extend_from_slice(key_pem);
    Ok(reqwest::Client::builder()
        .tls_certs_only(reqwest::Certificate::from_pem_bundle(ca_pem)?)
        .identity(reqwest::Identity::from_pem(&ident)?)
        .timeout(Duration::from_secs(10))
        .build()?)
}

/// One round: requests/s and latencies (ms).
async fn round(side: &Side, secs: u64, concurrency: usize) -> Result<(f64, Vec<f64>)> {
    let end = Instant::now() + Duration::from_secs(secs);
    let side = Arc::new((side.url.clone(), side.client.clone()));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let side = side.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < end {
                let t = Instant::now();
                let r = side.1.get(&side.0).send().await?;
                if !r.status().is_success() {
                    bail!("{} answered {}", side.0, r.status());
                }
                r.bytes().await?;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok((all.len() as f64 / secs as f64, all))
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() -> Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let world = testbed::world::World::new(0)?;
    let host = &world.operator;
    let b = Broker::start(&world, BrokerOptions::default())?;
    let dir = testbed::tmp::TempDir::new("bench-front")?;
    let key = dir.path().join("user.key");
    let out = std::process::Command::new(testbed::cni::workspace_bin("socialweb-broker"))
        .args(["api", "keygen", "--out"])
        .arg(&key)
        .output()?;
    if !out.status.success() {
        bail!("keygen: {}", String::from_utf8_lossy(&out.stderr));
    }
    let did = String::from_utf8(out.stdout)?.trim().to_string();
    let c = b.api(&key, &["create-cluster", "bench", "--wait", "150s"])?;
    if c["state"] != "ready" {
        bail!("the cluster is not ready: {c}\n{}", b.diagnostics());
    }
    let kc_path = dir.path().join("kc");
    b.api(
        &key,
        &["kubeconfig", "bench", "--out", kc_path.to_str().unwrap()],
    )?;
    let kc: Value = serde_json::from_str(&std::fs::read_to_string(&kc_path)?)?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let field = |p: &str| -> Result<Vec<u8>> {
        let v = kc
            .pointer(p)
            .and_then(Value::as_str)
            .context("kubeconfig field")?;
        Ok(b64.decode(v)?)
    };
    let front = Side {
        name: "front",
        url: format!(
            "{}/api/v1/namespaces",
            kc.pointer("/clusters/0/cluster/server")
                .and_then(Value::as_str)
                .unwrap()
        ),
        client: client(
            &field("/clusters/0/cluster/certificate-authority-data")?,
            &field("/users/0/user/client-certificate-data")?,
            &field("/users/0/user/client-key-data")?,
        )?,
    };
    // The same user and group, straight to the apiserver with a cluster-CA certificate.
    let pki_dir = b.cluster_dir("bench").join("pki");
    let pki = socialweb_broker::control_plane::pki::Pki::open_or_create(&pki_dir, "bench")?;
    let pair = pki.client(
        "bench-direct",
        &did,
        &[socialweb_broker::access::OWNERS_GROUP],
    )?;
    let server = c["server"].as_str().unwrap_or_default().to_string();
    let info = b.cli_json(&["cluster", "list"])?;
    let api = info
        .as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == "bench"))
        .and_then(|x| x["server"].as_str())
        .context("the cluster's apiserver")?
        .to_string();
    let direct = Side {
        name: "direct",
        url: format!("{api}/api/v1/namespaces"),
        client: client(
            &std::fs::read(pki.ca_cert())?,
            &std::fs::read(&pair.cert)?,
            &std::fs::read(&pair.key)?,
        )?,
    };
    eprintln!("front {server}, direct {api}");
    let (secs, conc, rounds) = (args.seconds, args.concurrency, args.rounds);
    let (broker_pid, api_pid) = (
        b.broker_pid(),
        apiserver_pid(&b.cluster_dir("bench").join("run"))?,
    );
    // CPU per request: the front's (the broker process), and the apiserver's, per side.
    let cpu = std::sync::Mutex::new(Vec::<(&'static str, f64, f64)>::new());
    let cpu_ref = &cpu;
    let results = host.run(move || -> Result<Vec<(&'static str, f64, f64)>> {
        let rt = tokio::runtime::Runtime::new()?;
        rt.block_on(async {
            // Warm both (connections, caches).
            round(&direct, 1, conc).await?;
            round(&front, 1, conc).await?;
            let mut out = Vec::new();
            for r in 0..rounds {
                for side in [&direct, &front] {
                    let (b0, a0) = (cpu_ms(broker_pid)?, cpu_ms(api_pid)?);
                    let (rps, mut lat) = round(side, secs, conc).await?;
                    let n = rps * secs as f64;
                    cpu_ref.lock().expect("lock").push((
                        side.name,
                        (cpu_ms(broker_pid)? - b0) / n,
                        (cpu_ms(api_pid)? - a0) / n,
                    ));
                    let p99 = pct(&mut lat, 0.99);
                    eprintln!("round {r} {}: {rps:.0} req/s, p99 {p99:.2} ms", side.name);
                    out.push((side.name, rps, p99));
                }
            }
            Ok(out)
        })
    })??;
    let pick = |n: &str, f: fn(&(&str, f64, f64)) -> f64| -> Vec<f64> {
        results.iter().filter(|r| r.0 == n).map(f).collect()
    };
    let (d_rps, d_min, d_max) = median(pick("direct", |r| r.1));
    let (f_rps, f_min, f_max) = median(pick("front", |r| r.1));
    let (d_p99, _, _) = median(pick("direct", |r| r.2));
    let (f_p99, _, _) = median(pick("front", |r| r.2));
    let ratios: Vec<f64> = pick("front", |r| r.1)
        .iter()
        .zip(pick("direct", |r| r.1))
        .map(|(f, d)| f / d)
        .collect();
    let (ratio, r_min, r_max) = median(ratios);
    println!("rounds={rounds}");
    println!("concurrency={conc}");
    println!("direct_rps={d_rps:.0}");
    println!("direct_rps_min={d_min:.0}");
    println!("direct_rps_max={d_max:.0}");
    println!("front_rps={f_rps:.0}");
    println!("front_rps_min={f_min:.0}");
    println!("front_rps_max={f_max:.0}");
    println!("direct_p99_ms={d_p99:.2}");
    println!("front_p99_ms={f_p99:.2}");
    println!("ratio_rps_front_vs_direct={ratio:.3}");
    let cpu = cpu.into_inner().expect("lock");
    let per = |n: &str, f: fn(&(&str, f64, f64)) -> f64| -> f64 {
        median(cpu.iter().filter(|r| r.0 == n).map(f).collect()).0
    };
    println!("front_cpu_us_per_req={:.0}", per("front", |r| r.1) * 1000.0);
    println!(
        "apiserver_cpu_us_per_req_direct={:.0}",
        per("direct", |r| r.2) * 1000.0
    );
    println!(
        "apiserver_cpu_us_per_req_through_front={:.0}",
        per("front", |r| r.2) * 1000.0
    );
    println!("ratio_rps_min={r_min:.3}");
    println!("ratio_rps_max={r_max:.3}");
    Ok(())
}
