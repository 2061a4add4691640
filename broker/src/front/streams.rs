//! Long-lived requests per client certificate (docs/security.md, "Budgets"): a watch, a
//! followed log, an upgraded stream (exec, attach, port-forward) holds a request in flight
//! at its cluster and keeps its connection busy (never shed at the front's cap) for as long
//! as its client likes, and HTTP/2 carries any number of them on one connection. A
//! certificate holds at most `front.max_streams_per_certificate` of them at once; one more is
//! answered 429 with the reason, and each is given back when it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http::Request;

/// The long-lived requests each certificate (by serial) holds now.
#[derive(Debug)]
pub struct Streams {
    max: usize,
    held: Mutex<HashMap<String, usize>>,
}

/// One long-lived request of a certificate's, until dropped.
#[derive(Debug)]
pub struct StreamPermit {
    streams: Arc<Streams>,
    serial: String,
}

impl Streams {
    pub fn new(max: usize) -> Arc<Streams> {
        Arc::new(Streams {
            max,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// The most a certificate holds.
    pub fn max(&self) -> usize {
        self.max
    }

    /// A permit for one more long-lived request of `serial`'s, or `None` at the cap.
    pub fn acquire(self: &Arc<Self>, serial: &str) -> Option<StreamPermit> {
        let mut held = self.held.lock().expect("lock");
        let n = held.entry(serial.to_string()).or_default();
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(StreamPermit {
            streams: self.clone(),
            serial: serial.to_string(),
        })
    }

    /// How many `serial` holds now.
    pub fn held(&self, serial: &str) -> usize {
        self.held
            .lock()
            .expect("lock")
            .get(serial)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut held = self.streams.held.lock().expect("lock");
        if let Some(n) = held.get_mut(&self.serial) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.serial);
            }
        }
    }
}

/// Whether `req` will last as long as its client likes: an Upgrade, a watch (`watch=true`,
/// or the old `/watch/` paths), a followed log.
pub fn long_lived<B>(req: &Request<B>, tail: &str) -> bool {
    let query_says = |key: &str| {
        req.uri().query().is_some_and(|q| {
            q.split('&').any(|kv| {
                kv.split_once('=').map_or(kv == key, |(k, v)| {
                    k == key && matches!(v, "true" | "1" | "True" | "TRUE")
                })
            })
        })
    };
    req.headers().contains_key(http::header::UPGRADE)
        || query_says("watch")
        || query_says("follow")
        || tail.starts_with("/api/v1/watch/")
        || (tail.starts_with("/apis/") && tail.split('/').nth(4) == Some("watch"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uri: &str, upgrade: bool) -> Request<()> {
        let mut b = Request::get(uri);
        if upgrade {
            b = b
                .header("connection", "Upgrade")
                .header("upgrade", "SPDY/3.1");
        }
        b.body(()).unwrap()
    }

    #[test]
    fn watches_logs_followed_and_upgrades_are_long_lived() {
        for (uri, tail, upgrade) in [
            ("/api/v1/pods?watch=true", "/api/v1/pods", false),
            (
                "/api/v1/pods?labelSelector=a&watch=1",
                "/api/v1/pods",
                false,
            ),
            (
                "/api/v1/namespaces/ci/pods/p/log?follow=true",
                "/api/v1/namespaces/ci/pods/p/log",
                false,
            ),
            ("/api/v1/watch/pods", "/api/v1/watch/pods", false),
            (
                "/apis/apps/v1/watch/deployments",
                "/apis/apps/v1/watch/deployments",
                false,
            ),
            (
                "/api/v1/namespaces/ci/pods/p/exec?command=sh",
                "/api/v1/namespaces/ci/pods/p/exec",
                true,
            ),
        ] {
            assert!(long_lived(&req(uri, upgrade), tail), "{uri}");
        }
        for (uri, tail) in [
            ("/api/v1/pods", "/api/v1/pods"),
            ("/api/v1/pods?watch=false", "/api/v1/pods"),
            (
                "/api/v1/namespaces/ci/pods/p/log",
                "/api/v1/namespaces/ci/pods/p/log",
            ),
            (
                "/apis/watch.example.com/v1/things",
                "/apis/watch.example.com/v1/things",
            ),
            (
                "/api/v1/namespaces/watch/pods?x=watch",
                "/api/v1/namespaces/watch/pods",
            ),
        ] {
            assert!(!long_lived(&req(uri, false), tail), "{uri}");
        }
    }

    #[test]
    fn a_certificate_holds_at_most_its_cap_and_gets_each_back() {
        let s = Streams::new(2);
        let a = s.acquire("01").unwrap();
        let _b = s.acquire("01").unwrap();
        assert!(s.acquire("01").is_none());
        assert!(s.acquire("02").is_some(), "another certificate has its own");
        drop(a);
        assert_eq!(s.held("01"), 1);
        assert!(s.acquire("01").is_some());
    }
}
