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
use crate::front::Front;
use crate::front::hosts::{Hosts, LinkTls};
use crate::pki::Pki;
use crate::store::Store;
use crate::vault::{Vault, host};

/// How often the certificate records other hosts made or revoked are read: the longest a
/// revocation made at another host takes to cut a connection here.
pub const RECORDS_EVERY: Duration = Duration::from_secs(1);

/// This broker as one host of a fleet, built once from `[fleet]` (and the store's key, its
/// addresses and its state directory): what it shares with the other hosts through the
/// store, and how it joins them. Outside a fleet there is none.
#[derive(Debug)]
pub struct FleetHost {
    store: Store,
    vault: Vault,
    /// Where its link certificate and the fleet CA's copy are (`<state_dir>/fleet`).
    dir: PathBuf,
    /// The addresses the other hosts reach its link at.
    sans: Vec<String>,
    link_bind: std::net::SocketAddr,
    link_url: String,
    /// The operator gives the front's certificate: no CA of the fleet's for it.
    own_front_cert: bool,
    /// `[certificates]`: its link certificate's lifetime.
    certificates: crate::pki::Lifetimes,
}

impl FleetHost {
    /// This host's part in a fleet, when `fleet.enabled`.
    pub fn of(cfg: &Config, store: &Store) -> Result<Option<FleetHost>> {
        if !cfg.fleet.enabled {
            return Ok(None);
        }
        let key = cfg
            .store
            .seal_key()?
            .context("fleet.enabled needs store.key_file")?;
        let mut sans = vec![
            cfg.advertised_addr().to_string(),
            cfg.service_addr.to_string(),
        ];
        sans.dedup();
        Ok(Some(FleetHost {
            store: store.clone(),
            vault: Vault::new(store.clone(), key),
            dir: cfg.state_dir.join("fleet"),
            sans,
            link_bind: cfg.link_bind(),
            link_url: cfg.link_url(),
            own_front_cert: cfg.front.tls_cert.is_some(),
            certificates: cfg.certificates.lifetimes(),
        }))
    }

    /// Before the front loads its certificate: the front's CA is the fleet's (unless the
    /// operator gives the front's certificate), so a kubeconfig is good at every host's
    /// front.
    pub async fn share_front_ca(&self, front_dir: &Path) -> Result<()> {
        if self.own_front_cert {
            return Ok(());
        }
        self.vault
            .authority(host::FRONT, front_dir, "socialweb front CA")
            .await
    }

    /// Before the market is reached: the key towards providers is the fleet's one, so that
    /// providers list one pin and any host can list and release the leases another rented.
    /// `make` makes this host's when neither it nor the store has one. The id the leases
    /// this host rents are tagged with (`broker`), and reconciled by, is then the fleet's
    /// (`fleet-` and the start of that key's pin), so that the host running a cluster next
    /// takes its nodes' leases as its own.
    pub async fn share_market_key(
        &self,
        cert: &Path,
        key: &Path,
        make: impl FnOnce() -> Result<()>,
        market_identity: impl FnOnce() -> Result<socialweb_market_tls::Identity>,
    ) -> Result<String> {
        self.vault
            .pair(
                host::MARKET,
                cert,
                key,
                "the fleet's key towards providers",
                make,
            )
            .await?;
        let pin = market_identity()?.pin();
        let hex: String = pin[..8].iter().map(|b| format!("{b:02x}")).collect();
        Ok(format!("fleet-{hex}"))
    }

    /// This host's link certificate, under the fleet CA (from the store), for the
    /// addresses the other hosts reach it at.
    async fn link_tls(&self) -> Result<LinkTls> {
        self.vault
            .authority(host::FLEET, &self.dir, "socialweb fleet CA")
            .await?;
        let pki = Pki::open_with(&self.dir, "socialweb fleet CA", self.certificates)?;
        let pair = pki.peer("link", &self.sans)?;
        let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        Ok(LinkTls {
            ca: pki.ca_pem().as_bytes().to_vec(),
            cert: read(&pair.cert)?,
            key: read(&pair.key)?,
        })
    }
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

/// How often a fleet host's relay reads which nodes it admits: a node rented by another
/// host is admitted here at most this long after its provision is written.
pub const RELAY_CLIENTS_EVERY: Duration = Duration::from_secs(1);

impl FleetHost {
    /// Joins the fleet: the front carries requests to the other hosts' links, this host's link
    /// serves theirs (within `limits`), its tunnel takes the nodes of the clusters it runs,
    /// its link and tunnel endpoint are recorded, and the other hosts' certificate records are
    /// followed.
    pub async fn join(&self, j: Joining<'_>, stop: &CancellationToken) -> Result<()> {
        let Joining {
            id,
            front,
            records,
            tunnels,
            tunnel,
            relay,
            limits,
        } = j;
        let tls = self.link_tls().await?;
        let server = crate::front::link::server_config(&tls)?;
        front.join_fleet(Arc::new(Hosts::new(
            self.store.clone(),
            id.to_string(),
            tls,
        )));
        // Every host's requests come from few addresses.
        let limits = crate::front::listener::Limits {
            max_per_source: limits.max_connections,
            ..limits
        };
        let bound =
            crate::front::link::serve(self.link_bind, server, limits, front.clone(), stop.clone())
                .await?;
        let f = front.clone();
        tunnels.serve_only(Box::new(move |cluster| f.serves(cluster)));
        // The relay beside the tunnel endpoint: the other hosts name both in their nodes'
        // identities, so that a node keeps its mesh through this host's relay when its own
        // renting host is gone.
        let mut recorded = tunnel.to_json();
        recorded["relay_url"] = relay.as_str().into();
        self.store
            .register_host(id, &self.link_url, &recorded.to_string())
            .await
            .context("recording this host's link in the store")?;
        info!(%bound, url = %self.link_url, "this host joined the fleet");
        tokio::spawn(follow_records(self.store.clone(), records, stop.clone()));
        Ok(())
    }

    /// Keeps the relay's allow list at every live node of the fleet (and this host's tunnel
    /// endpoint), read from the store every [`RELAY_CLIENTS_EVERY`]: a node may make any host's
    /// relay its home, and its peers reach it there. Outside a fleet the provisioner's changes
    /// keep the list, since they are all there are.
    pub fn follow_relay_clients(
        &self,
        allow: crate::relay::Allow,
        tunnel: iroh::EndpointId,
        stop: &CancellationToken,
    ) {
        let (store, stop) = (self.store.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                match store.live_endpoints().await {
                    Ok(live) => {
                        allow.set(live.iter().filter_map(|e| e.parse().ok()).chain([tunnel]))
                    }
                    Err(e) => warn!("reading the fleet's nodes for the relay: {e:#}"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(RELAY_CLIENTS_EVERY) => {}
                    _ = stop.cancelled() => return,
                }
            }
        });
    }
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
