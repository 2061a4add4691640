//! The other hosts of a fleet, as this host's front reaches them: each one's link
//! ([`super::link`]), at the URL it recorded in the store, through mutual TLS under the
//! fleet CA with this host's link certificate.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::proxy::Upstream;
use crate::store::Store;

/// How long a host's link URL is used before it is read again (a restarted host may move).
const FRESH_FOR: Duration = Duration::from_secs(30);
/// A link that takes no connection within this is given up on, and the request waits for
/// the next owner (a host that died with its link: no answer at all).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a link's connection is pinged while requests are in flight on it.
const KEEPALIVE: Duration = Duration::from_secs(2);

/// This host's certificate towards the others, and the fleet CA it trusts them by (PEM).
#[derive(Debug, Clone)]
pub struct LinkTls {
    pub ca: Vec<u8>,
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

/// The fleet's hosts: their links, as clients (kept per host: one pool of connections each).
#[derive(Debug)]
pub struct Hosts {
    store: Store,
    /// This host's id: never a link to itself.
    pub me: String,
    tls: LinkTls,
    known: Mutex<HashMap<String, (Upstream, Instant)>>,
}

impl Hosts {
    pub fn new(store: Store, me: String, tls: LinkTls) -> Hosts {
        Hosts {
            store,
            me,
            tls,
            known: Mutex::new(HashMap::new()),
        }
    }

    /// The way to `cluster`'s apiserver through host `host`'s link.
    pub async fn upstream(&self, host: &str, cluster: &str) -> Result<Upstream> {
        let link = self.link(host).await?;
        Ok(Upstream {
            base: format!("{}/link/{cluster}", link.base),
            ..link
        })
    }

    /// A client of host `host`'s link: the one kept while its URL is fresh or unchanged.
    async fn link(&self, host: &str) -> Result<Upstream> {
        let kept = self.known.lock().expect("lock").get(host).cloned();
        if let Some((u, at)) = &kept
            && at.elapsed() < FRESH_FOR
        {
            return Ok(u.clone());
        }
        let url = self
            .store
            .host_link(host)
            .await?
            .with_context(|| format!("host {host} of the fleet recorded no link"))?;
        let u = match kept {
            Some((u, _)) if u.base == url.trim_end_matches('/') => u,
            _ => Upstream::link(
                &url,
                &self.tls.ca,
                &self.tls.cert,
                &self.tls.key,
                CONNECT_TIMEOUT,
                KEEPALIVE,
            )
            .with_context(|| format!("a client for host {host}'s link at {url}"))?,
        };
        self.known
            .lock()
            .expect("lock")
            .insert(host.to_string(), (u.clone(), Instant::now()));
        Ok(u)
    }
}
