//! Forwarding to a tenant apiserver as the admitted user: the request goes on with the
//! front's own client certificate (of the cluster's front-proxy CA) and
//! `X-Remote-User`/`X-Remote-Group` headers, which the apiserver trusts from that certificate
//! only (request-header authentication); what the client sent to claim an identity is
//! dropped. Bodies stream both ways (watches and
//! `logs -f` are never buffered), and an HTTP/1.1 Upgrade (SPDY/3.1 or websocket, for exec,
//! attach and port-forward) becomes a byte tunnel that lives until either side closes or the
//! certificate stops being good.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::body::Body;
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::CertificateDer;
use tracing::debug;

use super::listener::InFlight;
use crate::access::OWNERS_GROUP;

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// One tenant apiserver, as the front reaches it.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// `https://<addr>:<port>`, no trailing slash.
    pub base: String,
    /// Requests: HTTP/2 where the apiserver offers it, pooled.
    pub pooled: Client<Https, Body>,
    /// Upgrades: HTTP/1.1 only (an Upgrade does not exist in HTTP/2).
    pub upgrades: Client<Https, Body>,
}

impl Upstream {
    /// A client for `base`, trusting `ca_pem` and authenticating with the front's pair.
    pub fn new(base: &str, ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Result<Upstream> {
        Upstream::build(
            base,
            ca_pem,
            cert_pem,
            key_pem,
            Duration::from_secs(5),
            None,
        )
    }

    /// A client of another fleet host's link: a connection not taken within
    /// `connect_timeout`, or an HTTP/2 connection that answers no ping for twice
    /// `keepalive`, is given up on (a host that died with its link sends nothing, not even
    /// a reset), and its requests go to the cluster's next owner or fail.
    pub fn link(
        base: &str,
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
        connect_timeout: Duration,
        keepalive: Duration,
    ) -> Result<Upstream> {
        Upstream::build(
            base,
            ca_pem,
            cert_pem,
            key_pem,
            connect_timeout,
            Some(keepalive),
        )
    }

    fn build(
        base: &str,
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
        connect_timeout: Duration,
        keepalive: Option<Duration>,
    ) -> Result<Upstream> {
        let mut roots = rustls::RootCertStore::empty();
        for c in socialweb_wire::ca::certificates(ca_pem).map_err(anyhow::Error::msg)? {
            roots.add(CertificateDer::from(c.der))?;
        }
        let chain: Vec<CertificateDer<'static>> = socialweb_wire::ca::certificates(cert_pem)
            .map_err(anyhow::Error::msg)?
            .into_iter()
            .map(|c| CertificateDer::from(c.der))
            .collect();
        let key = super::tls::rustls_pki_key(key_pem)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .context("the front's client certificate")?;
        let connector = |h2: bool| {
            let mut http = HttpConnector::new();
            http.enforce_http(false);
            http.set_connect_timeout(Some(connect_timeout));
            http.set_nodelay(true);
            let b = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls.clone())
                .https_only();
            if h2 {
                b.enable_all_versions().wrap_connector(http)
            } else {
                b.enable_http1().wrap_connector(http)
            }
        };
        Ok(Upstream {
            base: base.trim_end_matches('/').to_string(),
            pooled: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(90))
                .timer(hyper_util::rt::TokioTimer::new())
                .http2_keep_alive_interval(keepalive)
                .http2_keep_alive_timeout(keepalive.unwrap_or(Duration::from_secs(20)) * 2)
                .build(connector(true)),
            upgrades: Client::builder(TokioExecutor::new()).build(connector(false)),
        })
    }
}

/// The header of a fleet link's answer that says the request went no further than the link:
/// that host does not run the cluster (any more), or its apiserver took no connection. It
/// may be sent again, to whichever host runs the cluster now.
pub const NOT_HERE: &str = "socialweb-not-here";

/// Headers that belong to one hop, or that claim an identity: never forwarded.
fn dropped(name: &HeaderName) -> bool {
    let n = name.as_str();
    matches!(
        n,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "authorization"
            | NOT_HERE
    ) || n.starts_with("impersonate-")
        || n.starts_with("x-remote-")
}

fn is_upgrade(h: &HeaderMap) -> Option<HeaderValue> {
    let wants = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if wants {
        h.get(header::UPGRADE).cloned()
    } else {
        None
    }
}

/// A request the front refuses: the status, the Kubernetes reason, the message; answered
/// with [`status`].
#[derive(Debug)]
pub struct Refusal(pub StatusCode, pub &'static str, pub String);

impl Refusal {
    pub fn answer(self) -> Response<Body> {
        status(self.0, self.1, &self.2)
    }
}

/// A Kubernetes `Status` answer, which kubectl prints the message of.
pub fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16(),
    });
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("response")
}

/// The request to send upstream for `req`, as `did`: the apiserver's URL, the headers
/// that are not one hop's or an identity claim, request-header authentication, and the
/// Upgrade when there is one. (The body is added by the caller.)
fn outbound(
    up: &Upstream,
    req: &Request<Body>,
    tail: &str,
    did: &str,
    upgrade: Option<&HeaderValue>,
) -> Result<http::request::Builder, Refusal> {
    let pq = match req.uri().query() {
        Some(q) => format!("{tail}?{q}"),
        None => tail.to_string(),
    };
    let uri: Uri = format!("{}{pq}", up.base).parse().map_err(|_| {
        Refusal(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "unparsable path".into(),
        )
    })?;
    let mut out = Request::builder()
        .method(req.method().clone())
        .uri(uri)
        .version(http::Version::HTTP_11);
    let h = out.headers_mut().expect("builder");
    for (k, v) in req.headers() {
        if !dropped(k) {
            h.append(k.clone(), v.clone());
        }
    }
    let user = HeaderValue::from_str(did)
        .map_err(|_| Refusal(StatusCode::BAD_REQUEST, "BadRequest", "unusable DID".into()))?;
    // Request-header authentication (the apiserver trusts these only from the front's
    // certificate); what the client sent under these names was dropped above.
    h.insert("x-remote-user", user);
    h.insert("x-remote-group", HeaderValue::from_static(OWNERS_GROUP));
    if let Some(u) = upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, u.clone());
    }
    Ok(out)
}

/// Joins the two upgraded sides into a byte tunnel in the connection's tunnels, until either
/// closes or the connection is cut; answers the client's Upgrade with the apiserver's
/// headers. A tunnel counts as a request in flight: its connection is never idle.
fn tunnel(
    mut resp: Response<hyper::body::Incoming>,
    client_side: hyper::upgrade::OnUpgrade,
    conn: &super::Conn,
    at_cluster: InFlight,
) -> Response<Body> {
    let server_side = hyper::upgrade::on(&mut resp);
    let (cut, busy) = (conn.cut.clone(), conn.activity.start());
    conn.tunnels.spawn(async move {
        let _busy = (busy, at_cluster);
        let (c, s) = tokio::join!(client_side, server_side);
        let (Ok(c), Ok(s)) = (c, s) else {
            debug!("an upgrade did not complete on one side");
            return;
        };
        let (mut c, mut s) = (TokioIo::new(c), TokioIo::new(s));
        tokio::select! {
            r = tokio::io::copy_bidirectional(&mut c, &mut s) => {
                debug!("upgraded stream ended: {r:?}");
            }
            _ = cut.cancelled() => debug!("upgraded stream cut"),
        }
    });
    let mut b = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (k, v) in resp.headers() {
        b = b.header(k, v);
    }
    b.body(Body::empty()).expect("response")
}

/// A request that did not reach an apiserver: no connection to the upstream, or a fleet link
/// that answered [`NOT_HERE`]. It may be sent again; what it needs for that is given back.
#[derive(Debug)]
pub struct Unsent {
    pub why: String,
    /// The client's side of an Upgrade it asked for.
    pub upgrade: Option<hyper::upgrade::OnUpgrade>,
    pub busy: InFlight,
}

impl Unsent {
    /// The answer when it is sent no more.
    pub fn answer(self) -> Response<Body> {
        status(
            StatusCode::BAD_GATEWAY,
            "ServiceUnavailable",
            &format!("the cluster's apiserver did not answer: {}", self.why),
        )
    }
}

/// Forwards `req` (whose apiserver path is `tail`) to `up` as `did`; an upgraded stream
/// runs in `conn`'s tunnels until either side closes or the connection is cut. `busy` (the
/// request in flight at its cluster) lives as long as the response body or the stream.
pub(super) async fn forward(
    up: &Upstream,
    mut req: Request<Body>,
    tail: &str,
    did: &str,
    conn: &super::Conn,
    busy: InFlight,
) -> Result<Response<Body>, Unsent> {
    let upgrade = is_upgrade(req.headers());
    let out = match outbound(up, &req, tail, did, upgrade.as_ref()) {
        Ok(b) => b,
        Err(refused) => return Ok(refused.answer()),
    };
    let client_side = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
    let out = match out.body(Body::new(req.into_body())) {
        Ok(r) => r,
        Err(e) => {
            return Ok(status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &e.to_string(),
            ));
        }
    };
    let client = if upgrade.is_some() {
        &up.upgrades
    } else {
        &up.pooled
    };
    let resp = match client.request(out).await {
        Ok(r) => r,
        Err(e) if e.is_connect() => {
            return Err(Unsent {
                why: format!("{e}"),
                upgrade: client_side,
                busy,
            });
        }
        Err(e) => {
            return Ok(status(
                StatusCode::BAD_GATEWAY,
                "ServiceUnavailable",
                &format!("the cluster's apiserver did not answer: {e}"),
            ));
        }
    };
    if resp.status() == StatusCode::SERVICE_UNAVAILABLE
        && let Some(why) = resp.headers().get(NOT_HERE)
    {
        return Err(Unsent {
            why: why.to_str().unwrap_or("not here").to_string(),
            upgrade: client_side,
            busy,
        });
    }
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_side) = client_side
    {
        let protocol = upgrade
            .as_ref()
            .and_then(|u| u.to_str().ok())
            .unwrap_or("?");
        tracing::info!(did, "upgrade to {protocol} through the front");
        return Ok(tunnel(resp, client_side, conn, busy));
    }
    let (mut parts, body) = resp.into_parts();
    let names: Vec<HeaderName> = parts.headers.keys().cloned().collect();
    for k in names {
        if dropped(&k) && k != header::HOST && k != header::AUTHORIZATION {
            parts.headers.remove(&k);
        }
    }
    Ok(super::listener::tracked(
        Response::from_parts(parts, Body::new(body)),
        busy,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_and_hop_headers_are_never_forwarded() {
        for h in [
            "authorization",
            "impersonate-user",
            "impersonate-group",
            "impersonate-extra-scopes",
            "x-remote-user",
            "connection",
            "upgrade",
            "host",
        ] {
            assert!(dropped(&HeaderName::from_static(h)), "{h}");
        }
        for h in [
            "accept",
            "content-type",
            "x-stream-protocol-version",
            "sec-websocket-protocol",
        ] {
            assert!(!dropped(&HeaderName::from_static(h)), "{h}");
        }
    }

    #[test]
    fn an_upgrade_is_connection_upgrade_with_a_protocol() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
        assert_eq!(is_upgrade(&h).unwrap(), "SPDY/3.1");
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        assert!(is_upgrade(&h).is_none());
    }
}
