//! A mesh of guests of provider machines behind NAT, without Kubernetes: the from-anywhere
//! topology (`crate::world`) with one node per provider, each behind its provider's NAT of a
//! chosen kind, and the relay on the operator's host serving HTTPS with QUIC address
//! discovery, as the broker serves it -- what iroh's NAT traversal needs to find direct paths
//! between providers.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::mesh::{MESH_PORT, MeshCluster, MeshOptions, RelayPlace, Spot};
use crate::tmp::TempDir;
use crate::world::{GUEST_SUBNET, Guest, Nat, OPERATOR_ADDR, World};

/// The address every guest has (slirp's), and so every node advertises.
const GUEST_MESH_ADDR: &str = "10.0.2.15";

/// Providers with the given NATs, one guest each, and a TLS relay on the operator's host.
#[derive(Debug)]
pub struct NatGround {
    // Field order is drop order: guests before their providers.
    pub guests: Vec<Guest>,
    pub nats: Vec<Nat>,
    pub world: World,
    tls: TempDir,
}

impl NatGround {
    pub fn new(nats: &[Nat]) -> Result<NatGround> {
        let world = World::new(u8::try_from(nats.len())?)?;
        let mut guests = Vec::new();
        for (i, nat) in nats.iter().enumerate() {
            let p = u8::try_from(i + 1)?;
            world.set_nat(p, *nat, GUEST_SUBNET)?;
            guests.push(world.guest(p, 1)?);
        }
        Ok(NatGround {
            guests,
            nats: nats.to_vec(),
            world,
            tls: TempDir::new("relay-tls")?,
        })
    }

    /// A mesh of every guest (node-<provider>), started, not yet connected.
    pub fn mesh(&self, opts: MeshOptions) -> Result<MeshCluster<'_>> {
        let addr: SocketAddr = format!("{GUEST_MESH_ADDR}:{MESH_PORT}").parse()?;
        let spots = self
            .guests
            .iter()
            .map(|g| Spot {
                index: g.provider,
                ns: &g.ns,
                addr: Some(addr),
            })
            .collect();
        let place = RelayPlace {
            listen: SocketAddr::new(OPERATOR_ADDR.into(), 3340),
            tls_dir: Some(self.tls.path().to_path_buf()),
        };
        MeshCluster::start_in(spots, &self.world.operator, place, opts)
    }
}

/// Waits until every node has a connection to every other, then up to `traversal` for NAT
/// traversal to make every path direct; returns
/// each unordered pair's path as the node with the smaller number sees it.
pub fn settle(mesh: &MeshCluster<'_>, n: u8, traversal: Duration) -> Result<Vec<(u8, u8, String)>> {
    mesh.wait_all_connected(Duration::from_secs(60))?;
    let started = Instant::now();
    loop {
        let mut out = Vec::new();
        for a in 1..=n {
            for b in a + 1..=n {
                let path = mesh.peer(a, b)?["path"].as_str().unwrap_or("").to_string();
                out.push((a, b, path));
            }
        }
        if out.iter().all(|(_, _, p)| p.starts_with("direct")) || started.elapsed() >= traversal {
            return Ok(out);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
