//! The broker's side of the market protocol (contract 6; its types are `socialweb-market`'s):
//! one HTTP client with a timeout on every call, answers parsed and checked, errors that say
//! which call failed and how. Waiting and retrying are the provisioner's business (it knows
//! which step it is at); every call here is safe to repeat, because the ids are the client's.

use std::time::Duration;

use reqwest::StatusCode;
use socialweb_market::{Accept, ErrorBody, Lease, LeaseList, Offer, PREFIX, Rfp, RfpRequest};
use url::Url;

/// Why a market call failed.
#[derive(Debug, thiserror::Error)]
pub enum MarketError {
    #[error("{call}: no answer within {timeout:?}")]
    Timeout { call: String, timeout: Duration },
    #[error("{call}: provider unreachable: {reason}")]
    Unreachable { call: String, reason: String },
    #[error("{call}: provider answered {status}: {message}")]
    Refused {
        call: String,
        status: u16,
        code: String,
        message: String,
    },
    #[error("{call}: provider answered something unreadable: {reason}")]
    Garbage { call: String, reason: String },
}

impl MarketError {
    /// Whether repeating the same call later may succeed (the provider was slow, away, or
    /// failed inside), as opposed to a refusal that will not change.
    /// What kind of failure, as the metrics label it.
    pub fn kind(&self) -> &'static str {
        match self {
            MarketError::Timeout { .. } => "timeout",
            MarketError::Unreachable { .. } => "unreachable",
            MarketError::Refused { .. } => "refused",
            MarketError::Garbage { .. } => "garbage",
        }
    }

    pub fn transient(&self) -> bool {
        match self {
            MarketError::Timeout { .. } | MarketError::Unreachable { .. } => true,
            MarketError::Garbage { .. } => true,
            MarketError::Refused { status, .. } => *status >= 500 || *status == 429,
        }
    }
}

enum Capped {
    Over,
    Read(reqwest::Error),
}

/// A provider's answer, read up to [`MAX_ANSWER`] (a provider is another party).
async fn read_capped(mut resp: reqwest::Response) -> Result<Vec<u8>, Capped> {
    if resp.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
        return Err(Capped::Over);
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(Capped::Read)? {
        if body.len() + chunk.len() > MAX_ANSWER {
            return Err(Capped::Over);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A client for one provider.
#[derive(Debug, Clone)]
pub struct MarketClient {
    base: Url,
    http: reqwest::Client,
    timeout: Duration,
}

/// How a client reaches its provider (docs/market.md).
#[derive(Debug, Clone)]
pub enum Transport {
    /// Mutual TLS, the provider's key pinned (`socialweb_market_tls::client_config`).
    Pinned(Box<rustls::ClientConfig>),
    /// The embedded provider's owner-only Unix socket.
    Unix(std::path::PathBuf),
    /// Plain HTTP (loopback only; the configuration refuses it elsewhere).
    Plain,
}

/// The largest answer read from a provider.
const MAX_ANSWER: usize = 4 << 20;

impl MarketClient {
    pub fn new(
        base: &str,
        timeout: Duration,
        transport: Transport,
    ) -> Result<MarketClient, String> {
        let base = Url::parse(base).map_err(|e| format!("market URL {base:?}: {e}"))?;
        crate::crypto_provider();
        let mut b = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none());
        b = match transport {
            Transport::Pinned(tls) => b.tls_backend_preconfigured(*tls),
            Transport::Unix(path) => b.unix_socket(path),
            Transport::Plain => b,
        };
        let http = b.build().map_err(|e| e.to_string())?;
        Ok(MarketClient {
            base,
            http,
            timeout,
        })
    }

    pub fn base(&self) -> &Url {
        &self.base
    }

    fn url(&self, path: &str) -> Url {
        let mut u = self.base.clone();
        u.set_path(&format!(
            "{}{PREFIX}{path}",
            self.base.path().trim_end_matches('/')
        ));
        u
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        call: &str,
        req: reqwest::RequestBuilder,
    ) -> Result<Option<T>, MarketError> {
        let c = || call.to_string();
        let resp = req.send().await.map_err(|e| {
            if e.is_timeout() {
                MarketError::Timeout {
                    call: c(),
                    timeout: self.timeout,
                }
            } else {
                MarketError::Unreachable {
                    call: c(),
                    reason: error_chain(&e),
                }
            }
        })?;
        let status = resp.status();
        let body = read_capped(resp).await.map_err(|e| match e {
            Capped::Over => MarketError::Garbage {
                call: c(),
                reason: format!("the answer is over {} MiB", MAX_ANSWER >> 20),
            },
            Capped::Read(e) if e.is_timeout() => MarketError::Timeout {
                call: c(),
                timeout: self.timeout,
            },
            Capped::Read(e) => MarketError::Garbage {
                call: c(),
                reason: e.to_string(),
            },
        })?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            let (code, message) = match serde_json::from_slice::<ErrorBody>(&body) {
                Ok(b) => (b.error.code, b.error.message),
                Err(_) => (
                    "unknown".into(),
                    String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
                ),
            };
            return Err(MarketError::Refused {
                call: c(),
                status: status.as_u16(),
                code,
                message,
            });
        }
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| MarketError::Garbage {
                call: c(),
                reason: format!(
                    "{e} in {:?}",
                    String::from_utf8_lossy(&body[..body.len().min(120)])
                ),
            })
    }

    /// Sends an RFP (idempotent by its id).
    pub async fn post_rfp(&self, r: &RfpRequest) -> Result<Rfp, MarketError> {
        let call = format!("POST /rfps {}", r.id);
        self.call(&call, self.http.post(self.url("/rfps")).json(r))
            .await?
            .ok_or_else(|| MarketError::Garbage {
                call,
                reason: "404 for a new RFP".into(),
            })
    }

    pub async fn rfp(&self, id: &str) -> Result<Option<Rfp>, MarketError> {
        self.call(
            &format!("GET /rfps/{id}"),
            self.http.get(self.url(&format!("/rfps/{id}"))),
        )
        .await
    }

    /// Accepts a bid (idempotent by the lease id).
    pub async fn accept(&self, bid_id: &str, a: &Accept) -> Result<Lease, MarketError> {
        if !socialweb_market::valid_id(bid_id) {
            return Err(MarketError::Garbage {
                call: "POST /bids/<id>/accept".into(),
                reason: format!("the bid id is not {}", socialweb_market::ID_RULE),
            });
        }
        let call = format!("POST /bids/{bid_id}/accept");
        self.call(
            &call,
            self.http
                .post(self.url(&format!("/bids/{bid_id}/accept")))
                .json(a),
        )
        .await?
        .ok_or_else(|| MarketError::Refused {
            call,
            status: 404,
            code: "not_found".into(),
            message: "no such bid".into(),
        })
    }

    pub async fn lease(&self, id: &str) -> Result<Option<Lease>, MarketError> {
        self.call(
            &format!("GET /leases/{id}"),
            self.http.get(self.url(&format!("/leases/{id}"))),
        )
        .await
    }

    /// Every lease carrying tag `key=value`.
    pub async fn leases(&self, key: &str, value: &str) -> Result<Vec<Lease>, MarketError> {
        let mut u = self.url("/leases");
        u.query_pairs_mut()
            .append_pair("tag", &format!("{key}={value}"));
        Ok(self
            .call::<LeaseList>("GET /leases", self.http.get(u))
            .await?
            .map(|l| l.leases)
            .unwrap_or_default())
    }

    /// What the provider rents (`GET /v1/offer`), checked.
    pub async fn offer(&self) -> Result<Offer, MarketError> {
        let call = "GET /offer";
        let o: Offer = self
            .call(call, self.http.get(self.url("/offer")))
            .await?
            .ok_or_else(|| MarketError::Refused {
                call: call.into(),
                status: 404,
                code: "not_found".into(),
                message: "no offer (a provider older than GET /v1/offer)".into(),
            })?;
        o.validate().map_err(|reason| MarketError::Garbage {
            call: call.into(),
            reason,
        })?;
        Ok(o)
    }

    /// Releases a lease; releasing a released or unknown lease is not an error.
    pub async fn release(&self, id: &str) -> Result<Option<Lease>, MarketError> {
        self.call(
            &format!("DELETE /leases/{id}"),
            self.http.delete(self.url(&format!("/leases/{id}"))),
        )
        .await
    }
}

/// Every provider the broker rents from, by the name its configuration gives it: an RFP goes
/// to each, bids come from all, and each lease is asked of the provider that holds it.
#[derive(Debug, Clone)]
pub struct Market {
    providers: Vec<(String, MarketClient)>,
    observer: Observer,
    /// Where the operator says each provider's nodes run (`market.providers[].region`,
    /// `.zone`), by name: it stands for what the provider's offer says.
    topology: std::collections::HashMap<String, socialweb_market::Topology>,
}

/// What is told of every call to a provider: the provider's name, the call (`post_rfp`,
/// `get_rfp`, `accept`, `get_lease`, `list_leases`, `offer`, `release`) and how it failed
/// ([`MarketError::kind`]; `None`: it did not). The daemon counts them in the metrics.
#[derive(Clone, Default)]
pub struct Observer(Option<Observe>);

/// `(provider, call, how it failed)`.
type Observe = std::sync::Arc<dyn Fn(&str, &str, Option<&str>) + Send + Sync>;

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Observer(set)"
        } else {
            "Observer(none)"
        })
    }
}

impl Market {
    pub fn new(providers: Vec<(String, MarketClient)>) -> Market {
        Market {
            providers,
            observer: Observer::default(),
            topology: Default::default(),
        }
    }

    /// The same market, with the operator's word on where providers' nodes run.
    pub fn with_topology(
        self,
        topology: std::collections::HashMap<String, socialweb_market::Topology>,
    ) -> Market {
        Market { topology, ..self }
    }

    /// The same market, telling `f` of every call ([`Observer`]).
    pub fn observed(self, f: impl Fn(&str, &str, Option<&str>) + Send + Sync + 'static) -> Market {
        let f: Observe = std::sync::Arc::new(f);
        Market {
            observer: Observer(Some(f)),
            ..self
        }
    }

    fn note<T>(
        &self,
        provider: &str,
        call: &str,
        r: Result<T, MarketError>,
    ) -> Result<T, MarketError> {
        if let Some(f) = &self.observer.0 {
            f(provider, call, r.as_ref().err().map(MarketError::kind));
        }
        r
    }

    pub fn names(&self) -> Vec<&str> {
        self.providers.iter().map(|(n, _)| n.as_str()).collect()
    }

    fn client(&self, provider: &str) -> Result<&MarketClient, MarketError> {
        self.providers
            .iter()
            .find(|(n, _)| n == provider)
            .map(|(_, c)| c)
            .ok_or_else(|| MarketError::Refused {
                call: format!("provider {provider}"),
                status: 404,
                code: "not_found".into(),
                message: format!(
                    "no provider {provider:?} is configured (market.providers has {:?})",
                    self.names()
                ),
            })
    }

    /// Sends the RFP to every provider ([`Market::post_rfp_to`]).
    pub async fn post_rfp(&self, r: &RfpRequest) -> Result<(), MarketError> {
        self.post_rfp_to(r, None).await
    }

    /// The bids on RFP `id` from every provider that answers (an error only when none does).
    /// Each bid's `provider` is the name this broker gives the provider (what it asks for the
    /// lease by), not the one the provider calls itself.
    pub async fn bids(&self, id: &str) -> Result<Vec<socialweb_market::Bid>, MarketError> {
        let mut out = Vec::new();
        let mut last = None;
        let mut answered = 0;
        for (name, c) in &self.providers {
            match self.note(name, "get_rfp", c.rfp(id).await) {
                Ok(r) => {
                    answered += 1;
                    // A bid's id goes into a URL path: one that is not a protocol id is
                    // the provider's garbage, not ours to send back.
                    out.extend(
                        r.into_iter()
                            .flat_map(|r| r.bids)
                            .filter(|b| {
                                let ok = socialweb_market::valid_id(&b.id);
                                if !ok {
                                    tracing::warn!(provider = %name, "a bid with an invalid id was ignored");
                                }
                                ok
                            })
                            .map(|mut bid| {
                                bid.provider = name.clone();
                                bid
                            }),
                    );
                }
                Err(e) => {
                    tracing::warn!(provider = %name, "{e}");
                    last = Some(e);
                }
            }
        }
        match (answered, last) {
            (0, Some(e)) => Err(e),
            _ => Ok(out),
        }
    }

    pub async fn accept(
        &self,
        provider: &str,
        bid: &str,
        a: &Accept,
    ) -> Result<Lease, MarketError> {
        let r = self.client(provider)?.accept(bid, a).await;
        self.note(provider, "accept", r)
    }

    pub async fn lease(&self, provider: &str, id: &str) -> Result<Option<Lease>, MarketError> {
        let r = self.client(provider)?.lease(id).await;
        self.note(provider, "get_lease", r)
    }

    pub async fn release(&self, provider: &str, id: &str) -> Result<Option<Lease>, MarketError> {
        let r = self.client(provider)?.release(id).await;
        self.note(provider, "release", r)
    }

    /// The offers of the providers that rent at `isolation` or more, by the names this
    /// broker gives them; a provider that does not answer (or offers less isolation) is
    /// left out.
    pub async fn offers(&self, isolation: socialweb_market::Isolation) -> Vec<(String, Offer)> {
        let mut out = Vec::new();
        for (name, c) in &self.providers {
            match self.note(name, "offer", c.offer().await) {
                Ok(mut o) if o.isolation >= isolation => {
                    if let Some(pin) = self.topology.get(name) {
                        let t = socialweb_broker_core::offers::pinned(&o.topology, pin);
                        let differs = |a: &Option<String>, b: &Option<String>| {
                            a.is_some() && b.is_some() && a != b
                        };
                        if differs(&pin.region, &o.topology.region)
                            || differs(&pin.zone, &o.topology.zone)
                        {
                            tracing::warn!(provider = %name, offer = %o.topology, operator = %t,
                                           "the provider's offer names another region or zone; the operator's is kept");
                        }
                        o.topology = t;
                    }
                    out.push((name.clone(), o))
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(provider = %name, "its offer: {e}"),
            }
        }
        out
    }

    /// Sends the RFP to the providers named in `only` (every one when `None`); fine when at
    /// least one took it (the others' errors are logged), else the last error.
    pub async fn post_rfp_to(
        &self,
        r: &RfpRequest,
        only: Option<&[String]>,
    ) -> Result<(), MarketError> {
        let mut last = None;
        let mut taken = 0;
        for (name, c) in &self.providers {
            if only.is_some_and(|o| !o.contains(name)) {
                continue;
            }
            match self.note(name, "post_rfp", c.post_rfp(r).await) {
                Ok(_) => taken += 1,
                Err(e) => {
                    tracing::warn!(provider = %name, "{e}");
                    last = Some(e);
                }
            }
        }
        match (taken, last) {
            (0, Some(e)) => Err(e),
            (0, None) => Err(MarketError::Refused {
                call: "POST /rfps".into(),
                status: 404,
                code: "not_found".into(),
                message: format!("no configured provider is among {only:?}"),
            }),
            _ => Ok(()),
        }
    }

    /// Every lease with tag `key=value`, from every provider, with the provider's name; an
    /// error when any provider does not answer (a reconcile must see the whole picture).
    pub async fn leases(
        &self,
        key: &str,
        value: &str,
    ) -> Result<Vec<(String, Lease)>, MarketError> {
        let mut out = Vec::new();
        for (name, c) in &self.providers {
            out.extend(
                self.note(name, "list_leases", c.leases(key, value).await)?
                    .into_iter()
                    .map(|l| (name.clone(), l)),
            );
        }
        Ok(out)
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_the_base_path() {
        let c = MarketClient::new(
            "http://127.0.0.1:7480/market/",
            Duration::from_secs(1),
            Transport::Plain,
        )
        .unwrap();
        assert_eq!(
            c.url("/rfps").as_str(),
            "http://127.0.0.1:7480/market/v1/rfps"
        );
    }
}
