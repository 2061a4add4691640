//! The peers the mesh is measured against, each set up on its own two nodes: kernel vxlan,
//! boringtun (userspace WireGuard, configured with `wg`) and quincy (a QUIC VPN on quinn).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use testbed::link;
use testbed::process::Spawned;
use testbed::topology::{CLUSTER_CIDR, Node, manual_pod};
use testbed::{Netns, Topology};

use crate::variant::Variant;

/// The same masquerade table the agent installs, on a peer's node (so conntrack and the nat
/// hook cost every variant the same), plus `extra` rules.
pub(crate) fn nft_table(node: &Node, extra: &str) -> Result<()> {
    let script = format!(
        "table ip socialweb {{\n chain postrouting {{\n  type nat hook postrouting priority srcnat; policy accept;\n  ip saddr {} ip daddr != {CLUSTER_CIDR} masquerade\n  {extra}\n }}\n}}\n",
        node.pod_cidr()
    );
    node.ns
        .exec_with_stdin("nft", &["-f", "-"], script.as_bytes())?;
    Ok(())
}

/// Pods wired by hand behind each node's bridge, with `mtu`.
pub(crate) fn manual_pods(topo: &Topology, mtu: u16) -> Result<(testbed::Pod, testbed::Pod)> {
    let a = manual_pod(topo.node(1), 10)?;
    let b = manual_pod(topo.node(2), 10)?;
    for p in [&a, &b] {
        p.ns.ip(&["link", "set", "eth0", "mtu", &mtu.to_string()])?;
    }
    Ok((a, b))
}

pub(crate) fn both(topo: &Topology) -> [&Node; 2] {
    [topo.node(1), topo.node(2)]
}

pub(crate) fn vxlan(topo: &Topology, mtu: u16) -> Result<Variant<'_>> {
    let nodes = both(topo);
    for (i, n) in nodes.iter().enumerate() {
        let other = nodes[1 - i];
        n.ns.ip(&[
            "link",
            "add",
            "vx0",
            "type",
            "vxlan",
            "id",
            "42",
            "local",
            &n.addr.to_string(),
            "remote",
            &other.addr.to_string(),
            "dstport",
            "4789",
            "dev",
            "eth0",
        ])?;
        n.ns.ip(&["link", "set", "vx0", "mtu", "1450", "up"])?;
        link::addr(&n.ns, "vx0", &format!("10.99.0.{}/24", n.index))?;
        link::route(
            &n.ns,
            &other.pod_cidr(),
            Some(&format!("10.99.0.{}", other.index)),
            Some("vx0"),
        )?;
        nft_table(n, "")?;
    }
    Ok(Variant::peer(
        "vxlan",
        [&nodes[0].ns, &nodes[1].ns],
        manual_pods(topo, mtu)?,
        Vec::new(),
        Vec::new(),
        None,
    ))
}

/// A WireGuard-style key pair from `wg` (X25519, base64): (private, public).
pub(crate) fn x25519_pair(ns: &Netns) -> Result<(String, String)> {
    let private = ns.exec("wg", &["genkey"])?.trim().to_string();
    let public = ns.exec_with_stdin("wg", &["pubkey"], private.as_bytes())?;
    Ok((private, public.trim().to_string()))
}

/// A peer daemon's command in `ns`; with `realtime`, under SCHED_FIFO 1 (every thread it
/// starts inherits it), the scheduling the mesh's thread asks for by default: the variants
/// `boringtun_rt` and `quincy_rt` compare like with like.
fn daemon(ns: &Netns, bin: &Path, realtime: bool) -> std::process::Command {
    if realtime {
        let mut c = ns.command("chrt");
        c.args(["--fifo", "1"]).arg(bin);
        c
    } else {
        ns.command(&bin.to_string_lossy())
    }
}

/// boringtun-cli on both nodes, configured with `wg` (a peer each, the other's pod CIDR).
pub(crate) fn boringtun<'t>(
    name: &'static str,
    bin: &Path,
    topo: &'t Topology,
    mtu: u16,
    realtime: bool,
) -> Result<Variant<'t>> {
    let dir = testbed::tmp::TempDir::new("boringtun")?;
    let nodes = both(topo);
    let mut keys = Vec::new();
    for n in &nodes {
        let (private, public) = x25519_pair(&n.ns)?;
        let key_file = dir.path().join(format!("wg{}.key", n.index));
        std::fs::write(&key_file, &private)?;
        keys.push((key_file, public));
    }
    let mut daemons: Vec<Spawned> = Vec::new();
    let mut procs = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        // Interface names differ per node: boringtun's control socket is
        // /var/run/wireguard/<name>.sock, one filesystem for all namespaces.
        let ifname = format!("swtwg{}", n.index);
        let _ = std::fs::remove_file(format!("/var/run/wireguard/{ifname}.sock"));
        let mut cmd = daemon(&n.ns, bin, realtime);
        cmd.args([&ifname, "--foreground", "--disable-drop-privileges"])
            .env("WG_SUDO", "1");
        let d = Spawned::start_logged(cmd, "boringtun", &dir.path().join(format!("{ifname}.log")))?;
        procs.push((format!("boringtun{}", n.index), d.id()));
        daemons.push(d);
        let sock = PathBuf::from(format!("/var/run/wireguard/{ifname}.sock"));
        testbed::k8s::wait_for("boringtun's socket", Duration::from_secs(10), || {
            Ok(sock.exists().then_some(()))
        })?;
        let other = nodes[1 - i];
        n.ns.exec(
            "wg",
            &[
                "set",
                &ifname,
                "private-key",
                &keys[i].0.to_string_lossy(),
                "listen-port",
                "51820",
                "peer",
                &keys[1 - i].1,
                "endpoint",
                &format!("{}:51820", other.addr),
                "allowed-ips",
                &other.pod_cidr(),
            ],
        )?;
        n.ns.ip(&["link", "set", &ifname, "mtu", "1420", "up"])?;
        link::route(&n.ns, &other.pod_cidr(), None, Some(&ifname))?;
        nft_table(n, "")?;
    }
    Ok(Variant::peer(
        name,
        [&nodes[0].ns, &nodes[1].ns],
        manual_pods(topo, mtu)?,
        procs,
        daemons,
        Some(dir),
    ))
}

/// quincy 3.x in Noise mode (X25519, its benchmark's mode): the server on node 1, the client
/// on node 2. Quincy routes to a client by the tunnel address the server gave it and drops
/// client packets from any other source, so node 2 masquerades its pods' traffic into the
/// tunnel (a conntrack lookup per packet on an established flow).
pub(crate) fn quincy<'t>(
    name: &'static str,
    dir_bin: &Path,
    topo: &'t Topology,
    mtu: u16,
    realtime: bool,
) -> Result<Variant<'t>> {
    let dir = testbed::tmp::TempDir::new("quincy")?;
    let nodes = both(topo);
    let (server_key, server_pub) = x25519_pair(&nodes[0].ns)?;
    let (client_key, client_pub) = x25519_pair(&nodes[1].ns)?;
    let users = dir.path().join("users.toml");
    std::fs::write(
        &users,
        format!("[users.node2]\nauthorized_keys = [\"{client_pub}\"]\nauthorized_certs = []\n"),
    )?;
    // quincy's MTU is its TUN's; 1420 leaves a 1280-byte pod packet room, as for boringtun.
    let connection = "[connection]\nmtu = 1420\n";
    let server_conf = dir.path().join("server.toml");
    std::fs::write(
        &server_conf,
        format!(
            "name = \"bench\"\ninterface_name = \"swq0\"\nbind_address = \"{}\"\nbind_port = 55555\n\
             tunnel_network = \"10.98.0.1/24\"\nusers_file = \"{}\"\n\
             [protocol]\nmode = \"noise\"\nkey_exchange = \"standard\"\nprivate_key = \"{server_key}\"\n\
             {connection}[log]\nlevel = \"warn\"\n",
            nodes[0].addr,
            users.display()
        ),
    )?;
    let client_conf = dir.path().join("client.toml");
    std::fs::write(
        &client_conf,
        format!(
            "connection_string = \"{}:55555\"\n\
             [protocol]\nmode = \"noise\"\nkey_exchange = \"standard\"\nserver_public_key = \"{server_pub}\"\nprivate_key = \"{client_key}\"\n\
             {connection}[network]\ninterface_name = \"swq1\"\nroutes = [\"{}\"]\n[log]\nlevel = \"warn\"\n",
            nodes[0].addr,
            nodes[0].pod_cidr()
        ),
    )?;
    let mut daemons = Vec::new();
    let mut procs = Vec::new();
    for (i, (role, conf)) in [("server", &server_conf), ("client", &client_conf)]
        .into_iter()
        .enumerate()
    {
        let bin = dir_bin.join("bin").join(format!("quincy-{role}"));
        let mut cmd = daemon(&nodes[i].ns, &bin, realtime);
        cmd.arg("--config-path").arg(conf);
        let d = Spawned::start_logged(cmd, role, &dir.path().join(format!("{role}.log")))?;
        procs.push((format!("quincy-{role}"), d.id()));
        daemons.push(d);
        let dev = if role == "server" { "swq0" } else { "swq1" };
        let log = dir.path().join(format!("{role}.log"));
        testbed::k8s::wait_for(
            &format!("quincy's {role} to bring {dev} up"),
            Duration::from_secs(20),
            || {
                Ok(link::links(&nodes[i].ns)?
                    .iter()
                    .any(|l| l == dev)
                    .then_some(()))
            },
        )
        .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;
    }
    nft_table(nodes[0], "")?;
    nft_table(
        nodes[1],
        &format!(
            "oifname \"swq1\" ip saddr {} masquerade",
            nodes[1].pod_cidr()
        ),
    )?;
    let (server_pod, client_pod) = manual_pods(topo, mtu)?;
    // The client's route to node 1's pods may come a moment after its device.
    testbed::k8s::wait_for("quincy's route", Duration::from_secs(10), || {
        let routes = nodes[1].ns.ip(&["route", "show", &nodes[0].pod_cidr()])?;
        Ok((!routes.trim().is_empty()).then_some(()))
    })?;
    // Traffic goes from the client side's pod (node 2) to the server side's (node 1).
    Ok(Variant::peer(
        name,
        [&nodes[1].ns, &nodes[0].ns],
        (client_pod, server_pod),
        procs,
        daemons,
        Some(dir),
    ))
}
