//! The mesh across providers behind NAT, the from-anywhere topology: each node a guest behind
//! its provider machine's NAT, the relay (with QUIC address discovery, as the broker serves
//! it) on the operator's host. How often iroh's NAT traversal finds a direct path between
//! providers, by the kind of NAT at each end, and what crossing providers costs when it does
//! and when it does not.

use std::time::Duration;

use anyhow::Result;
use testbed::mesh::MeshOptions;
use testbed::natmesh::{NatGround, settle};
use testbed::world::Nat;

use crate::variant::Variant;

/// How long NAT traversal gets to find direct paths once every pair is connected through the
/// relay: iroh punches when a connection comes up and when its address discovery reports
/// (every 20-26 s), and retries a pair without a good direct path every 60 s.
const TRAVERSAL_TIME: Duration = Duration::from_secs(45);

/// Every pair of four providers -- two with endpoint-independent NAT, two symmetric -- one
/// node each: prints which pairs went direct, by the NATs at their ends.
pub(crate) fn direct_ratio(opts: MeshOptions) -> Result<()> {
    use Nat::{EndpointIndependent as Eim, Symmetric as Sym};
    let ground = NatGround::new(&[Eim, Eim, Sym, Sym])?;
    let mesh = ground.mesh(opts)?;
    let paths = settle(&mesh, 4, TRAVERSAL_TIME)?;
    let mut by_kind: std::collections::BTreeMap<String, (u32, u32)> = Default::default();
    for (a, b, path) in &paths {
        let (na, nb) = (
            ground.nats[usize::from(*a) - 1],
            ground.nats[usize::from(*b) - 1],
        );
        let kind = format!("{}_{}", na.label(), nb.label());
        eprintln!("bench: nat: node-{a} ({na:?}) - node-{b} ({nb:?}): {path}");
        let e = by_kind.entry(kind).or_default();
        e.1 += 1;
        if path.starts_with("direct") {
            e.0 += 1;
        }
    }
    let direct: u32 = by_kind.values().map(|v| v.0).sum();
    let all: u32 = by_kind.values().map(|v| v.1).sum();
    println!("cross_provider_pairs={all}");
    println!(
        "cross_provider_direct_ratio={:.3}",
        f64::from(direct) / f64::from(all)
    );
    for (kind, (d, n)) in &by_kind {
        println!(
            "cross_provider_direct_ratio_{kind}={:.3}",
            f64::from(*d) / f64::from(*n)
        );
    }
    Ok(())
}

/// A throughput variant across two providers (node 1 sending to node 2), waiting for NAT
/// traversal as [`direct_ratio`] does.
pub(crate) fn variant<'t>(
    name: &'static str,
    ground: &'t NatGround,
    opts: MeshOptions,
) -> Result<Variant<'t>> {
    let mesh = ground.mesh(opts)?;
    let paths = settle(&mesh, 2, TRAVERSAL_TIME)?;
    eprintln!(
        "bench: {name}: {:?} - {:?}: {}",
        ground.nats[0], ground.nats[1], paths[0].2
    );
    crate::mesh_variant(
        name,
        mesh,
        [&ground.guests[0].ns, &ground.guests[1].ns],
        false,
    )
}
