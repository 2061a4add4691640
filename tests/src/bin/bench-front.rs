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
//!
//! Then the flood: the broker runs with an open-file limit of `--nofile`, and `--idle`
//! handshaken TLS connections that send nothing are opened to the front from `--sources`
//! addresses on the internet, more than that limit allows. The front's answer rate through it
//! is measured again (rounds of the front side), the connections it holds counted (at its
//! cap, each new one takes the place of the one idle longest), and how long until it closes
//! an idle one (its idle timeout, `--idle-timeout`, or the HTTP/2 keep-alive first: a ping
//! every 30 s, 20 s for the answer, which the flood never gives).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine;
use clap::Parser;
use serde_json::Value;
use testbed::broker::{Broker, BrokerOptions};
use testbed::stats::{Summary, summary_of as summary};

#[derive(Debug, Parser)]
#[command(about = "GET /api/v1/namespaces straight to the apiserver and through the front")]
struct Args {
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(1..=50))]
    rounds: u8,
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Idle TLS connections opened during the flood.
    #[arg(long, default_value_t = 5000)]
    idle: usize,
    /// Source addresses they come from.
    #[arg(long, default_value_t = 100)]
    sources: u32,
    /// The broker's open-file limit (below `--idle`).
    #[arg(long, default_value_t = 4096)]
    nofile: u64,
    /// The front's idle timeout for this run (longer than the flood's rounds, so that the
    /// connections stay open through them).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    idle_timeout: Duration,
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

fn main() -> Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let world = testbed::world::World::new(0)?;
    let host = &world.operator;
    let b = Broker::start(
        &world,
        BrokerOptions {
            nofile: Some(args.nofile),
            front: socialweb_broker::config::Front {
                idle_timeout: args.idle_timeout,
                ..Default::default()
            },
            ..Default::default()
        },
    )?;
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
    let pki = socialweb_broker::pki::Pki::open_or_create(&pki_dir, "bench")?;
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
    let (direct, front) = (&direct, &front);
    let results = host.run(move || -> Result<Vec<(&'static str, f64, f64)>> {
        let rt = tokio::runtime::Runtime::new()?;
        rt.block_on(async {
            // Warm both (connections, caches).
            round(direct, 1, conc).await?;
            round(front, 1, conc).await?;
            let mut out = Vec::new();
            for r in 0..rounds {
                for side in [direct, front] {
                    let (b0, a0) = (cpu_ms(broker_pid)?, cpu_ms(api_pid)?);
                    let (rps, mut lat) = round(side, secs, conc).await?;
                    let n = rps * secs as f64;
                    cpu_ref.lock().expect("lock").push((
                        side.name,
                        (cpu_ms(broker_pid)? - b0) / n,
                        (cpu_ms(api_pid)? - a0) / n,
                    ));
                    let p99 = testbed::stats::percentile(&mut lat, 0.99)
                        .context("no request answered in a round")?;
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
    let Summary {
        p50: d_rps,
        min: d_min,
        max: d_max,
    } = summary("direct req/s", pick("direct", |r| r.1))?;
    let Summary {
        p50: f_rps,
        min: f_min,
        max: f_max,
    } = summary("front req/s", pick("front", |r| r.1))?;
    let d_p99 = summary("direct p99", pick("direct", |r| r.2))?.p50;
    let f_p99 = summary("front p99", pick("front", |r| r.2))?.p50;
    let ratios: Vec<f64> = pick("front", |r| r.1)
        .iter()
        .zip(pick("direct", |r| r.1))
        .map(|(f, d)| f / d)
        .collect();
    let Summary {
        p50: ratio,
        min: r_min,
        max: r_max,
    } = summary("front/direct ratios", ratios)?;
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
    let per = |n: &str, f: fn(&(&str, f64, f64)) -> f64| -> Result<f64> {
        Ok(summary(n, cpu.iter().filter(|r| r.0 == n).map(f).collect())?.p50)
    };
    println!(
        "front_cpu_us_per_req={:.0}",
        per("front", |r| r.1)? * 1000.0
    );
    println!(
        "apiserver_cpu_us_per_req_direct={:.0}",
        per("direct", |r| r.2)? * 1000.0
    );
    println!(
        "apiserver_cpu_us_per_req_through_front={:.0}",
        per("front", |r| r.2)? * 1000.0
    );
    println!("ratio_rps_min={r_min:.3}");
    println!("ratio_rps_max={r_max:.3}");
    flood::run(&world, &b, front, &args, f_rps)?;
    Ok(())
}

mod flood {
    //! More idle TLS connections than the broker's open-file limit, from many addresses.

    use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use anyhow::{Context, Result};
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn, bind, connect, socket};

    use super::{Args, Side, round, summary};
    use testbed::stats::Summary;

    /// The flood's source addresses: 198.18.0.0/15, the benchmarking range.
    fn source(i: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 1)) + i)
    }

    /// A TCP connection from `from` to `to`, handshaken as a TLS client; `None` when refused.
    fn tls(
        cfg: &Arc<rustls::ClientConfig>,
        from: Ipv4Addr,
        to: SocketAddrV4,
    ) -> Option<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
        let fd = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .ok()?;
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &SockaddrIn::from(SocketAddrV4::new(from, 0)),
        )
        .ok()?;
        connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::from(to)).ok()?;
        let tcp = TcpStream::from(fd);
        tcp.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        let conn = rustls::ClientConnection::new(
            cfg.clone(),
            rustls::pki_types::ServerName::IpAddress((*to.ip()).into()),
        )
        .ok()?;
        let mut s = rustls::StreamOwned::new(conn, tcp);
        while s.conn.is_handshaking() {
            s.conn.complete_io(&mut s.sock).ok()?;
        }
        // HTTP/2's client preface and an empty SETTINGS frame, then nothing: a connection
        // that is up and idle (HTTP/1.1 would be closed at the header-read timeout first).
        std::io::Write::write_all(
            &mut s,
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0",
        )
        .ok()?;
        std::io::Write::flush(&mut s).ok()?;
        Some(s)
    }

    /// Connections the front holds now: established TCP on its port, in the host namespace.
    fn established(b: &testbed::broker::Broker<'_>, port: u16) -> Result<usize> {
        let o = b.host.output(
            "ss",
            &[
                "-Htn",
                "state",
                "established",
                &format!("( sport = :{port} )"),
            ],
        )?;
        Ok(String::from_utf8_lossy(&o.stdout).lines().count())
    }

    fn open_files(pid: u32) -> usize {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    pub fn run(
        world: &testbed::world::World,
        b: &testbed::broker::Broker<'_>,
        front: &Side,
        args: &Args,
        before_rps: f64,
    ) -> Result<()> {
        // The bench holds every connection itself.
        let _ = nix::sys::resource::setrlimit(
            nix::sys::resource::Resource::RLIMIT_NOFILE,
            65536,
            65536,
        );
        for i in 0..args.sources {
            testbed::link::addr(&world.internet, "lo", &format!("{}/32", source(i)))?;
        }
        let mut roots = rustls::RootCertStore::empty();
        for c in socialweb_wire::ca::certificates(&std::fs::read(b.front_ca())?)
            .map_err(anyhow::Error::msg)?
        {
            roots.add(rustls::pki_types::CertificateDer::from(c.der))?;
        }
        let mut cfg = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        let cfg = Arc::new(cfg);
        let to: SocketAddr = b.front_url().trim_start_matches("https://").parse()?;
        let SocketAddr::V4(to) = to else {
            anyhow::bail!("the front is not IPv4")
        };
        let (ready_tx, ready_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let ns = std::fs::File::open(world.internet.path())?;
        let (idle, sources) = (args.idle, args.sources);
        let flooder = std::thread::spawn(move || -> Result<Vec<f64>> {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
            let t = Instant::now();
            let held: Vec<_> = (0..idle)
                .filter_map(|i| tls(&cfg, source(i as u32 % sources), to))
                .collect();
            let _ = ready_tx.send((held.len(), t.elapsed()));
            let _ = done_rx.recv();
            drop(held);
            // Fresh connections left idle: how long from each one's handshake until the front
            // closes it (a read sees EOF).
            let fresh: Vec<_> = (0..20)
                .filter_map(|i| tls(&cfg, source(i), to).map(|s| (Instant::now(), s)))
                .collect();
            let mut closed = Vec::new();
            for (opened, mut s) in fresh {
                s.sock.set_read_timeout(Some(Duration::from_secs(600)))?;
                let mut buf = [0u8; 64];
                loop {
                    match std::io::Read::read(&mut s, &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                closed.push(opened.elapsed().as_secs_f64());
            }
            Ok(closed)
        });
        let (handshaken, took) = ready_rx.recv().context("the flood thread")?;
        let fds = open_files(b.broker_pid());
        let open = established(b, to.port())?;
        eprintln!(
            "flood: {handshaken} of {} connections handshaken ({:?}), {open} open at the front, \
             broker has {fds} files open",
            args.idle, took
        );
        let rps: Vec<f64> = b.host.run(|| -> Result<Vec<f64>> {
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(async {
                let mut v = Vec::new();
                for _ in 0..args.rounds {
                    v.push(round(front, args.seconds, args.concurrency).await?.0);
                }
                Ok(v)
            })
        })??;
        let _ = done_tx.send(());
        let closed = flooder
            .join()
            .map_err(|_| anyhow::anyhow!("the flood thread panicked"))??;
        let Summary {
            p50: during,
            min: lo,
            max: hi,
        } = summary("req/s during the flood", rps)?;
        println!("flood_idle_connections_tried={}", args.idle);
        println!("flood_sources={}", args.sources);
        println!("broker_nofile_limit={}", args.nofile);
        println!("flood_connections_handshaken={handshaken}");
        println!("flood_connections_open_at_front={open}");
        println!(
            "flood_connections_shed_or_refused={}",
            args.idle.saturating_sub(open)
        );
        println!("broker_open_files_during_flood={fds}");
        println!("front_rps_during_flood={during:.0}");
        println!("front_rps_during_flood_min={lo:.0}");
        println!("front_rps_during_flood_max={hi:.0}");
        println!(
            "ratio_rps_during_flood_vs_before={:.3}",
            during / before_rps
        );
        let Summary {
            p50: close,
            min: close_lo,
            max: close_hi,
        } = summary("idle connections closed", closed)?;
        println!("idle_timeout_s={}", args.idle_timeout.as_secs());
        println!("idle_connection_closed_after_s={close:.1}");
        println!("idle_connection_closed_after_s_range={close_lo:.1}..{close_hi:.1}");
        Ok(())
    }
}
