//! The steps every node runs first: sysctls, node-local DNS, the mesh, and (joining nodes)
//! the tunnel to the broker.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use socialweb_wire::NodeIdentity;
use tracing::{info, warn};

use super::{Ctx, retry};
use crate::dns::{self, Dns};
use crate::join::{self, sysctl};
use crate::mesh::{self, Mesh, MeshConfig};
use crate::tunnel::{Tunnel, TunnelConfig};

pub async fn sysctls(cx: &Ctx) {
    cx.steps
        .until_done("sysctls", retry(), || async {
            let missing = sysctl::apply()?;
            let detail =
                (!missing.is_empty()).then(|| format!("not available: {}", missing.join(", ")));
            Ok(((), detail))
        })
        .await;
}

/// Node-local DNS: its address (a dummy interface, or lo) and the server. The cluster zone's
/// watch starts once the node has credentials ([`super::node::watch_own`]).
pub async fn dns(cx: &Ctx) -> Option<Arc<Dns>> {
    let Some(addr) = cx.config.dns.listen() else {
        cx.steps.done("dns", Some("disabled (--no-dns)".into()));
        return None;
    };
    let dns = cx
        .steps
        .until_done("dns", retry(), || async {
            let placement = match addr.ip() {
                IpAddr::V4(ip) if !ip.is_unspecified() && !ip.is_loopback() => {
                    node_address(cx, "the DNS address", ip).await?
                }
                _ => dns::bind::Placement::Loopback,
            };
            let ups = join::upstreams(&cx.id, addr.ip());
            if ups.is_empty() {
                warn!(
                    "no upstream resolvers (identity and /etc/resolv.conf have none): only cluster names will resolve"
                );
            }
            let id = &cx.id;
            let domain = &id.cluster_domain;
            let dns = Arc::new(Dns::new(
                domain,
                vec![id.cluster_cidr, id.service_cidr],
                ups.clone(),
            ));
            let section = &cx.config.dns;
            dns::server::serve(dns.clone(), addr, section.threads, section.rcvbuf).await?;
            info!(%addr, zone = %domain, upstreams = ?ups, "node-local DNS up");
            let detail = format!("{addr} on {placement:?}, upstreams {ups:?}");
            Ok((dns, Some(detail)))
        })
        .await;
    cx.published.dns(&dns);
    Some(dns)
}

/// Puts one of the node's own addresses in place (`dns::bind`) and records its removal.
async fn node_address(cx: &Ctx, what: &str, ip: Ipv4Addr) -> Result<dns::bind::Placement> {
    let placement = dns::bind::ensure(&mesh::routes::handle().await?, ip).await?;
    let undo = placement.clone();
    cx.installed
        .record(format!("{what} {ip} on {undo:?}"), async move {
            dns::bind::remove(&mesh::routes::handle().await?, ip, &undo).await
        });
    Ok(placement)
}

/// The mesh: its endpoint, the TUN device and its routes.
pub async fn mesh(cx: &Ctx) -> Mesh {
    let (id, section) = (&cx.id, &cx.config.mesh);
    let mesh = cx
        .steps
        .until_done("mesh", retry(), || async {
            let mesh = Mesh::start(MeshConfig {
                node: id.node.clone(),
                endpoint: mesh::transport::EndpointConfig {
                    secret_key: id.mesh_secret_key.0,
                    relays: id.relays(),
                    bind: section.listen,
                    bind_v6: None,
                    pod_mtu: section.mtu,
                    tuning: section.tuning,
                    relay_ca: relay_ca(id)?,
                },
                tun_name: section.tun.clone(),
                mtu: section.mtu,
                node_ip: id.node_ip,
            })
            .await?;
            let node_ip = id.node_ip.map(|ip| format!(", node address {ip}"));
            let detail = format!(
                "endpoint {} on {:?}{}",
                mesh.endpoint_id(),
                mesh.bound_addrs(),
                node_ip.unwrap_or_default()
            );
            Ok((mesh, Some(detail)))
        })
        .await;
    let undo = mesh.clone();
    cx.installed
        .record(format!("the mesh ({})", section.tun), async move {
            undo.shutdown().await;
            Ok(())
        });
    cx.published.mesh(&mesh);
    mesh
}

/// The relay's CA from the identity, as DER.
fn relay_ca(id: &NodeIdentity) -> Result<Option<Vec<u8>>> {
    let Some(pem) = id.relay_ca.as_deref() else {
        return Ok(None);
    };
    let mut certs = socialweb_wire::ca::certificates(pem.as_bytes())
        .map_err(|e| anyhow!("relay_ca_cert: {e}"))?;
    if certs.is_empty() {
        bail!("relay_ca_cert holds no certificate")
    }
    Ok(Some(certs.remove(0).der))
}

/// The tunnel to the broker (contract 9): `server_url`'s address placed on the node and
/// served through it. Without a broker in the identity the node reaches `server_url` itself.
pub async fn tunnel(cx: &Ctx, mesh: &Mesh) -> Option<Tunnel> {
    let id = &cx.id;
    let Some(broker) = id.broker.clone() else {
        let detail = format!("none: {} is reached directly", id.server_url);
        cx.steps.done("tunnel", Some(detail));
        return None;
    };
    let started: std::sync::Mutex<Option<Tunnel>> = Default::default();
    let t = cx
        .steps
        .until_done("tunnel", retry(), || async {
            let node_local = api_listen_addr(&id.server_url)?;
            // The `kubernetes` Service's endpoint, on the same port (the apiserver's).
            let endpoint = SocketAddr::new(
                socialweb_wire::tunnel::KUBERNETES_ENDPOINT_ADDR.into(),
                node_local.port(),
            );
            let listen = vec![node_local, endpoint];
            for a in &listen {
                if let IpAddr::V4(ip) = a.ip() {
                    node_address(cx, "the tunnel's address", ip).await?;
                }
            }
            let node_ip = id
                .node_ip
                .context("the identity names a broker but no node_ip")?;
            let existing = started.lock().expect("lock").clone();
            let t = match existing {
                Some(t) => t,
                None => {
                    let config = TunnelConfig {
                        brokers: std::iter::once(broker.clone())
                            .chain(id.fleet.iter().cloned())
                            .collect(),
                        relays: id.relays(),
                        listen,
                        node_ip,
                        service_cidr: id.service_cidr,
                    };
                    let t = Tunnel::start(mesh.endpoint(), config).await?;
                    let undo = t.clone();
                    cx.installed.record("the tunnel", async move {
                        undo.shutdown();
                        Ok(())
                    });
                    cx.published.tunnel(&t);
                    *started.lock().expect("lock") = Some(t.clone());
                    t
                }
            };
            t.wait_connected(Duration::from_secs(20)).await?;
            let path = t.status().path;
            let detail =
                format!("the apiserver on {node_local} and {endpoint} through the broker, {path}");
            Ok((t, Some(detail)))
        })
        .await;
    Some(t)
}

/// Where the node serves the apiserver: `server_url`'s address and port.
fn api_listen_addr(server: &url::Url) -> Result<SocketAddr> {
    let host = server.host_str().context("server_url has no host")?;
    let ip: IpAddr = host
        .trim_matches(['[', ']'])
        .parse()
        .with_context(|| format!("server_url's host {host} is not an IP address"))?;
    Ok(SocketAddr::new(
        ip,
        server.port_or_known_default().unwrap_or(443),
    ))
}
