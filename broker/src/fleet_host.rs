//! What makes a broker one host of a fleet (`fleet.enabled`) beyond its clusters' leases
//! (`crate::cluster::ownership`): the fleet's shared authorities, its link
//! (`crate::front::link`) and its record in the store, and the certificate records the
//! other hosts make and revoke, and the nodes every host's relay admits.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use socialweb_broker_core::millis;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::access::records::Records;
use crate::config::Config;
use crate::pki::Pki;
use crate::front::Front;
use crate::front::hosts::{Hosts, LinkTls};
use crate::store::Store;
use crate::vault::{SealKey, Vault, host};

/// How often the certificate records other hosts made or revoked are read: the longest a
/// revocation made at another host takes to cut a connection here.
pub const RECORDS_EVERY: Duration = Duration::from_secs(1);

fn vault(cfg: &Config, store: &Store) -> Result<Vault> {
    let file = cfg
        .store
        .key_file
        .as_deref()
        .context("fleet.enabled needs store.key_file")?;
    Ok(Vault::new(
        store.clone(),
        SealKey::load(file).context("store.key_file")?,
    ))
}

fn fleet_dir(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("fleet")
}

/// Before the front loads its certificate: the front's CA is the fleet's (unless the
/// operator gives the front's certificate), so a kubeconfig is good at every host's front.
pub async fn share_front_ca(cfg: &Config, store: &Store, front_dir: &Path) -> Result<()> {
    if !cfg.fleet.enabled || cfg.front.tls_cert.is_some() {
        return Ok(());
    }
    vault(cfg, store)?
        .authority(host::FRONT, front_dir, "socialweb front CA")
        .await
}

/// Before the market is reached: the key towards providers is the fleet's one, so that
/// providers list one pin and any host can list and release the leases another rented.
/// `make` makes this host's when neither it nor the store has one.
pub async fn share_market_key(
    cfg: &Config,
    store: &Store,
    cert: &Path,
    key: &Path,
    make: impl FnOnce() -> Result<()>,
) -> Result<()> {
    if !cfg.fleet.enabled {
        return Ok(());
    }
    vault(cfg, store)?
        .pair(
            host::MARKET,
            cert,
            key,
            "the fleet's key towards providers",
            make,
        )
        .await?;
    Ok(())
}

/// The id the leases this host rents are tagged with (`broker`), and reconciled by: the
/// host's own id, or in a fleet the fleet's (`fleet-` and the start of the shared market
/// key's pin), so that the host running a cluster next takes its nodes' leases as its own.
pub fn renter(
    cfg: &Config,
    host_id: &str,
    market_identity: impl FnOnce() -> Result<socialweb_market_tls::Identity>,
) -> Result<String> {
    if !cfg.fleet.enabled {
        return Ok(host_id.to_string());
    }
    let pin = market_identity()?.pin();
    let hex: String = pin[..8].iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("fleet-{hex}"))
}

/// This host's link certificate, under the fleet CA (from the store), for the addresses
/// the other hosts reach it at.
async fn link_tls(cfg: &Config, store: &Store) -> Result<LinkTls> {
    let dir = fleet_dir(cfg);
    vault(cfg, store)?
        .authority(host::FLEET, &dir, "socialweb fleet CA")
        .await?;
    let pki = Pki::open_or_create(&dir, "socialweb fleet CA")?;
    let mut sans = vec![
        cfg.advertised_addr().to_string(),
        cfg.service_addr.to_string(),
    ];
    sans.dedup();
    let pair = pki.peer("link", &sans)?;
    let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    Ok(LinkTls {
        ca: pki.ca_pem().as_bytes().to_vec(),
        cert: read(&pair.cert)?,
        key: read(&pair.key)?,
    })
}

/// This host in the fleet, as the others and the nodes reach it.
#[derive(Debug)]
pub struct Joining<'a> {
    pub id: &'a str,
    pub front: &'a Arc<Front>,
    pub records: Arc<Records>,
    pub tunnels: crate::tunnel::Tunnels,
    /// Its tunnel endpoint, as nodes' identities name it.
    pub tunnel: &'a socialweb_wire::BrokerEndpoint,
    /// Its relay's URL, as nodes' identities name it.
    pub relay: &'a url::Url,
    pub limits: crate::front::listener::Limits,
}

/// Joins the fleet: the front carries requests to the other hosts' links, this host's link
/// serves theirs (within `limits`), its tunnel takes the nodes of the clusters it runs,
/// its link and tunnel endpoint are recorded, and the other hosts' certificate records are
/// followed.
pub async fn join(
    cfg: &Config,
    store: &Store,
    j: Joining<'_>,
    stop: &CancellationToken,
) -> Result<()> {
    if !cfg.fleet.enabled {
        return Ok(());
    }
    let Joining {
        id,
        front,
        records,
        tunnels,
        tunnel,
        relay,
        limits,
    } = j;
    let tls = link_tls(cfg, store).await?;
    let server = crate::front::link::server_config(&tls)?;
    front.join_fleet(Arc::new(Hosts::new(store.clone(), id.to_string(), tls)));
    // Every host's requests come from few addresses.
    let limits = crate::front::listener::Limits {
        max_per_source: limits.max_connections,
        ..limits
    };
    let bound =
        crate::front::link::serve(cfg.link_bind(), server, limits, front.clone(), stop.clone())
            .await?;
    let f = front.clone();
    tunnels.serve_only(Box::new(move |cluster| f.serves(cluster)));
    // The relay beside the tunnel endpoint: the other hosts name both in their nodes'
    // identities, so that a node keeps its mesh through this host's relay when its own
    // renting host is gone.
    let mut recorded = tunnel.to_json();
    recorded["relay_url"] = relay.as_str().into();
    store
        .register_host(id, &cfg.link_url(), &recorded.to_string())
        .await
        .context("recording this host's link in the store")?;
    info!(%bound, url = %cfg.link_url(), "this host joined the fleet");
    tokio::spawn(follow_records(store.clone(), records, stop.clone()));
    Ok(())
}

/// How often a fleet host's relay reads which nodes it admits: a node rented by another
/// host is admitted here at most this long after its provision is written.
pub const RELAY_CLIENTS_EVERY: Duration = Duration::from_secs(1);

/// Keeps the relay's allow list at every live node of the fleet (and this host's tunnel
/// endpoint), read from the store every [`RELAY_CLIENTS_EVERY`]: a node may make any host's
/// relay its home, and its peers reach it there. Outside a fleet the provisioner's changes
/// keep the list, since they are all there are.
pub fn follow_relay_clients(
    cfg: &Config,
    store: &Store,
    allow: crate::relay::Allow,
    tunnel: iroh::EndpointId,
    stop: &CancellationToken,
) {
    if !cfg.fleet.enabled {
        return;
    }
    let (store, stop) = (store.clone(), stop.clone());
    tokio::spawn(async move {
        loop {
            match store.live_endpoints().await {
                Ok(live) => allow.set(live.iter().filter_map(|e| e.parse().ok()).chain([tunnel])),
                Err(e) => warn!("reading the fleet's nodes for the relay: {e:#}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(RELAY_CLIENTS_EVERY) => {}
                _ = stop.cancelled() => return,
            }
        }
    });
}

/// Reads the certificate records made or revoked since the last look (a minute back: the
/// hosts' clocks differ a little) into `records`, every [`RECORDS_EVERY`].
async fn follow_records(store: Store, records: Arc<Records>, stop: CancellationToken) {
    let mut since = millis(SystemTime::now());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(RECORDS_EVERY) => {}
            _ = stop.cancelled() => return,
        }
        let now = millis(SystemTime::now());
        match store.certificates_since(since - 60_000).await {
            Ok(seen) => {
                records.merge(seen);
                since = now;
            }
            Err(e) => warn!("reading the fleet's certificate records: {e:#}"),
        }
    }
}
