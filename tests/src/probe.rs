//! Probes a test reads the network with: ping, a TCP echo exchange, dig.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::netns::Netns;

/// Pings `addr` from inside `ns`: `count` echo requests, each waiting up to a second.
/// Returns ping's output; fails if no reply came back.
pub fn ping(ns: &Netns, addr: &str, count: u32) -> Result<String> {
    let count = count.to_string();
    let out = ns.output("ping", &["-n", "-c", &count, "-W", "1", "-i", "0.2", addr])?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!("ping {addr} from {} failed: {}", ns.name(), text.trim());
    }
    Ok(text)
}

/// Pings until a reply arrives or `timeout` passes (for paths that take a moment to form).
pub fn ping_until(ns: &Netns, addr: &str, timeout: Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match ping(ns, addr, 1) {
            Ok(_) => return Ok(()),
            Err(e) if std::time::Instant::now() > deadline => return Err(e),
            Err(_) => {}
        }
    }
}

/// A TCP server inside a namespace that answers each connection with the bytes it received
/// and reports the peer address it saw (so tests can check source addresses survive).
#[derive(Debug)]
pub struct EchoServer {
    pub addr: SocketAddr,
    seen: std::sync::mpsc::Receiver<SocketAddr>,
}

impl EchoServer {
    /// Binds `bind` (use port 0 for any) inside `ns` and serves connections on a thread that
    /// stays in the namespace for the life of the process.
    pub fn start(ns: &Netns, bind: SocketAddr) -> Result<EchoServer> {
        let listener = ns.run(move || TcpListener::bind(bind))??;
        let addr = listener.local_addr()?;
        let (tx, seen) = std::sync::mpsc::channel();
        // The listening socket already belongs to the namespace; accepting and echoing does
        // not need the thread to be in it.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { break };
                if let Ok(peer) = s.peer_addr() {
                    let _ = tx.send(peer);
                }
                let mut buf = Vec::new();
                let _ = s.read_to_end(&mut buf);
                let _ = s.write_all(&buf);
            }
        });
        Ok(EchoServer { addr, seen })
    }

    /// The peer address of the next connection accepted.
    pub fn next_peer(&self, timeout: Duration) -> Result<SocketAddr> {
        self.seen
            .recv_timeout(timeout)
            .context("no connection reached the echo server")
    }
}

/// Connects from inside `ns` to `server`, sends `payload`, half-closes and reads the echo.
/// Fails unless exactly the same bytes come back.
pub fn tcp_exchange(ns: &Netns, server: SocketAddr, payload: &[u8]) -> Result<()> {
    let payload = payload.to_vec();
    ns.run(move || -> Result<()> {
        let mut s = TcpStream::connect_timeout(&server, Duration::from_secs(5))
            .with_context(|| format!("connecting to {server}"))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(&payload)?;
        s.shutdown(std::net::Shutdown::Write)?;
        let mut back = Vec::with_capacity(payload.len());
        s.read_to_end(&mut back)?;
        if back != payload {
            bail!(
                "echo from {server} returned {} bytes, sent {}",
                back.len(),
                payload.len()
            );
        }
        Ok(())
    })?
}

/// `dig +short` from inside `ns` against `server`; the answer lines, or an error if dig itself
/// failed (timeout, no server).
pub fn dig(ns: &Netns, server: &str, name: &str, rtype: &str) -> Result<Vec<String>> {
    let at = format!("@{server}");
    let out = ns.output("dig", &["+short", "+time=2", "+tries=1", &at, name, rtype])?;
    if !out.status.success() {
        bail!(
            "dig {name} {rtype} @{server} from {} failed: {}",
            ns.name(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect())
}

/// The response code dig reports (`NOERROR`, `NXDOMAIN`, ...) for a query from inside `ns`.
pub fn dig_status(ns: &Netns, server: &str, name: &str, rtype: &str) -> Result<String> {
    let at = format!("@{server}");
    let out = ns.output("dig", &["+time=2", "+tries=1", &at, name, rtype])?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.split("status: ").nth(1))
        .map(|s| s.split(',').next().unwrap_or("").to_string())
        .with_context(|| format!("no status in dig output: {text}"))
}
