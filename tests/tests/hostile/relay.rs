//! The relay's public listener against a stranger who holds connections open (issue 58): a
//! review kept 300 of 300 idle connections from one address open on it, and a client that
//! finished the WebSocket upgrade and then said nothing was held for ever. The relay's gate
//! (`broker/src/relay/gate.rs`) bounds them per address and in all, and cuts the silent.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::time::{Duration, Instant};

use testbed::broker::{Broker, BrokerOptions};
use testbed::world::World;

const PER_SOURCE: usize = 8;
const TOTAL: usize = 20;
const HANDSHAKE: Duration = Duration::from_secs(6);
const IDLE: Duration = Duration::from_secs(4);
/// How much earlier than the test's clock says a cut may come: a client reads its clock
/// after its last write returns, and the gate's idle clock starts when those bytes arrive,
/// which on a loaded machine can be a few milliseconds before (seen: 3.995 s for a 4 s
/// timeout). A cut that ignored the timeout would be seconds off.
const EARLY: Duration = Duration::from_millis(250);

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// The relay's public address.
fn relay_addr(b: &Broker<'_>) -> SocketAddrV4 {
    SocketAddrV4::new(b.public_addr, 3340)
}

/// A TCP connection to the relay from the internet's address `source`, and when it was made.
fn connect(b: &Broker<'_>, source: Ipv4Addr) -> (TcpStream, Instant) {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn, bind, connect, socket};
    use std::os::fd::AsRawFd;
    let to = relay_addr(b);
    let s = b
        .world
        .internet
        .run(|| -> nix::Result<TcpStream> {
            let fd = socket(
                AddressFamily::Inet,
                SockType::Stream,
                SockFlag::SOCK_CLOEXEC,
                None,
            )?;
            bind(
                fd.as_raw_fd(),
                &SockaddrIn::from(SocketAddrV4::new(source, 0)),
            )?;
            connect(fd.as_raw_fd(), &SockaddrIn::from(to))?;
            Ok(TcpStream::from(fd))
        })
        .unwrap()
        .unwrap();
    (s, Instant::now())
}

/// A TLS connection to the relay from `source`, its handshake done (the relay's certificate
/// is the front's, for the same address), and when it was last written to.
fn tls_from(b: &Broker<'_>, source: Ipv4Addr) -> (Tls, Instant) {
    let s = super::tls_over(b, connect(b, source).0);
    (s, Instant::now())
}

/// Whether the relay has closed `s`: what is there to read is read (and dropped), without
/// waiting.
fn is_closed(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match (&*s).read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    s.set_nonblocking(false).unwrap();
    closed
}

/// How many of `conns` the relay holds open.
fn held<'a>(conns: impl IntoIterator<Item = &'a TcpStream>) -> usize {
    conns.into_iter().filter(|c| !is_closed(c)).count()
}

/// How long after its time each of `conns` was closed by the relay: the least and the most
/// (waited for one after another, so a connection closed while another was waited for
/// counts as closed when its turn came).
fn cut_after<'a>(
    conns: impl IntoIterator<Item = (&'a TcpStream, Instant)>,
) -> (Duration, Duration) {
    let mut took: Vec<Duration> = conns
        .into_iter()
        .map(|(s, since)| {
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            super::closed_after(s);
            since.elapsed()
        })
        .collect();
    took.sort();
    (took[0], took[took.len() - 1])
}

/// `GET <path>` over HTTPS to the relay from `source`: its status.
fn get_from(b: &Broker<'_>, source: Ipv4Addr, path: &str) -> String {
    let url = format!("https://{}{path}", relay_addr(b));
    let source = source.to_string();
    let o = b
        .world
        .internet
        .output(
            "curl",
            &[
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "10",
                "--interface",
                &source,
                "--cacert",
                b.front_ca().to_str().unwrap(),
                &url,
            ],
        )
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The broker's `socialweb_broker_relay_connections*` samples, from its metrics endpoint.
fn relay_series(b: &Broker<'_>) -> Vec<String> {
    b.host
        .exec(
            "curl",
            &["-sf", "--max-time", "10", "http://127.0.0.1:9464/metrics"],
        )
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("socialweb_broker_relay_connections"))
        .map(str::to_string)
        .collect()
}

/// The value of sample `name` (labels included) in `series`.
fn value(series: &[String], name: &str) -> f64 {
    series
        .iter()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {series:#?}"))
}

/// A broker whose relay's gate has the test's small bounds.
fn broker(world: &World) -> Broker<'_> {
    let mut b = Broker::start(world, BrokerOptions::default()).unwrap();
    b.edit_config(|c| {
        c.relay.max_connections_per_source = PER_SOURCE;
        c.relay.max_connections = TOTAL;
        c.relay.handshake_timeout = HANDSHAKE;
        c.relay.idle_timeout = IDLE;
    })
    .unwrap();
    b.stop_broker().unwrap();
    b.start_broker().unwrap();
    b
}

/// A client that makes the WebSocket upgrade iroh's clients make, and then says nothing
/// (iroh-relay waits for the relay handshake that follows without a timeout).
fn upgraded_from(b: &Broker<'_>, source: Ipv4Addr) -> (Tls, Instant) {
    let (mut s, _) = tls_from(b, source);
    s.write_all(
        b"GET /relay HTTP/1.1\r\nHost: relay\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
          Sec-WebSocket-Protocol: iroh-relay-v1\r\n\r\n",
    )
    .unwrap();
    s.flush().unwrap();
    let at = Instant::now();
    let mut status = [0u8; 12];
    s.read_exact(&mut status).unwrap();
    assert_eq!(&status, b"HTTP/1.1 101", "the relay takes the upgrade");
    (s, at)
}

#[test]
fn the_relay_bounds_connections_per_source_and_in_all() {
    let world = World::new(0).unwrap();
    let b = broker(&world);
    let [a, c, d, e]: [Ipv4Addr; 4] = [1, 2, 3, 4].map(|i| Ipv4Addr::new(192, 0, 2, i));
    for s in [a, c, d, e] {
        testbed::link::addr(&world.internet, "lo", &format!("{s}/32")).unwrap();
    }
    assert_eq!(
        get_from(&b, a, "/ping"),
        "200",
        "the relay answers its probe"
    );

    // One address: an upgraded client that says nothing more, three connections that finish
    // TLS and say nothing more, then eight that send nothing at all. Past the eighth, each
    // is closed at once.
    let t0 = Instant::now();
    let upgraded = upgraded_from(&b, a);
    let tls: Vec<_> = (0..3).map(|_| tls_from(&b, a)).collect();
    let silent_a: Vec<_> = (0..8).map(|_| connect(&b, a)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let early = held(std::iter::once(&upgraded.0.sock).chain(tls.iter().map(|(s, _)| &s.sock)));
    let silent_held = held(silent_a.iter().map(|(s, _)| s));
    eprintln!(
        "one address: {early} of 4 upgraded or TLS connections and {silent_held} of 8 silent \
         ones held ({:?} in)",
        t0.elapsed()
    );
    assert_eq!(
        early + silent_held,
        PER_SOURCE,
        "one address holds relay.max_connections_per_source ({PER_SOURCE})"
    );
    assert_eq!(early, 4, "the first eight are held");
    assert_eq!(get_from(&b, c, "/ping"), "200", "another address is served");
    assert_eq!(get_from(&b, c, "/healthz"), "200");

    // Two more addresses fill the relay: 8 (a) + 8 (c) + some of d's (the broker's own
    // endpoint may hold one). Past relay.max_connections each new one is closed at once.
    let silent_c: Vec<_> = (0..8).map(|_| connect(&b, c)).collect();
    let silent_d: Vec<_> = (0..8).map(|_| connect(&b, d)).collect();
    let late_e: Vec<_> = (0..2).map(|_| connect(&b, e)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let series = relay_series(&b);
    let by_a = held(
        std::iter::once(&upgraded.0.sock)
            .chain(tls.iter().map(|(s, _)| &s.sock))
            .chain(silent_a.iter().map(|(s, _)| s)),
    );
    let by = |v: &[(TcpStream, Instant)]| held(v.iter().map(|(s, _)| s));
    let (by_c, by_d, by_e) = (by(&silent_c), by(&silent_d), by(&late_e));
    eprintln!(
        "full: held from a {by_a}, c {by_c}, d {by_d}, e {by_e} ({:?} in); {series:#?}",
        t0.elapsed()
    );
    assert!(
        t0.elapsed() < IDLE,
        "the counts were taken before any connection could be cut"
    );
    assert_eq!(
        value(&series, "socialweb_broker_relay_connections"),
        TOTAL as f64,
        "the relay holds relay.max_connections ({TOTAL}), and no more"
    );
    assert_eq!((by_a, by_c, by_e), (PER_SOURCE, PER_SOURCE, 0));
    assert!(by_d <= TOTAL - 2 * PER_SOURCE, "{by_d} from d");
    // The silent connections held, while all still are.
    let silent_held: Vec<(&TcpStream, Instant)> = silent_a
        .iter()
        .chain(&silent_c)
        .chain(&silent_d)
        .filter(|(s, _)| !is_closed(s))
        .map(|(s, at)| (s, *at))
        .collect();
    let refused = |why: &str| {
        value(
            &series,
            &format!("socialweb_broker_relay_connections_refused_total{{reason=\"{why}\"}}"),
        )
    };
    assert!(refused("per_source") >= 4.0 && refused("total") >= 6.0);

    // The upgraded and TLS ones are cut at relay.idle_timeout after they last sent (iroh
    // alone would hold the upgraded one for ever, the others 30 s), the silent ones at
    // relay.handshake_timeout; and the relay has room again.
    let (upgraded_cut, _) = cut_after([(&upgraded.0.sock, upgraded.1)]);
    let tls_cut = cut_after(tls.iter().map(|(s, at)| (&s.sock, *at)));
    let silent_cuts = silent_held.len() as f64;
    let silent_cut = cut_after(silent_held);
    eprintln!(
        "cut after: the upgraded client {upgraded_cut:?}, TLS only {tls_cut:?}, silent \
         {silent_cut:?} (least, most)"
    );
    let slack = Duration::from_secs(3);
    assert!(upgraded_cut >= IDLE - EARLY && upgraded_cut < IDLE + slack);
    assert!(tls_cut.0 >= IDLE - EARLY && tls_cut.1 < IDLE + slack);
    assert!(silent_cut.0 >= HANDSHAKE - Duration::from_millis(500));
    assert!(silent_cut.1 < HANDSHAKE + slack);
    assert_eq!(get_from(&b, e, "/ping"), "200", "room again");
    let series = relay_series(&b);
    let cut = |why: &str| {
        value(
            &series,
            &format!("socialweb_broker_relay_connections_cut_total{{reason=\"{why}\"}}"),
        )
    };
    assert!(
        cut("handshake") >= silent_cuts && cut("idle") >= 4.0,
        "{series:#?}"
    );
}
