//! The cache of upstream answers, pure (time is passed in): positive answers for their
//! smallest TTL, negative ones (NXDOMAIN, NODATA) for their SOA minimum (RFC 2308), and every
//! entry kept past expiry for the stale window, to be served when the upstreams fail
//! (RFC 8767; what NodeLocal DNSCache users ask for in kubernetes#136171 and dns#747).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};

/// TTL put on stale answers (RFC 8767 suggests 30 s).
pub const STALE_TTL: u32 = 30;
/// Longest a positive answer is kept fresh, whatever its TTL.
pub const MAX_TTL: u32 = 3600;
/// Longest a negative answer is kept fresh.
pub const MAX_NEGATIVE_TTL: u32 = 300;

/// What a cached answer is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    /// Lowercase, with the trailing dot.
    pub name: String,
    pub qtype: RecordType,
    pub qclass: DNSClass,
}

impl Key {
    pub fn new(name: &Name, qtype: RecordType, qclass: DNSClass) -> Key {
        Key {
            name: name.to_lowercase().to_ascii(),
            qtype,
            qclass,
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    response: Message,
    stored: Instant,
    ttl: u32,
}

/// A cache hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hit {
    /// Within its TTL: the response with TTLs counted down.
    Fresh(Message),
    /// Expired but within the stale window: the response with [`STALE_TTL`].
    Stale(Message),
}

/// The cache.
#[derive(Debug)]
pub struct Cache {
    map: HashMap<Key, Entry>,
    capacity: usize,
    stale_window: Duration,
}

/// How long `response` may be cached, or `None` if it may not (errors other than NXDOMAIN,
/// truncated answers).
pub fn cacheable_ttl(response: &Message) -> Option<u32> {
    if response.metadata.truncation {
        return None;
    }
    let soa_min = || {
        response.authorities.iter().find_map(|r| match &r.data {
            RData::SOA(soa) => Some(soa.minimum.min(r.ttl)),
            _ => None,
        })
    };
    match response.metadata.response_code {
        ResponseCode::NoError if !response.answers.is_empty() => Some(
            response
                .answers
                .iter()
                .map(|r| r.ttl)
                .min()
                .unwrap_or(0)
                .min(MAX_TTL),
        ),
        // NODATA and NXDOMAIN: the SOA's minimum, or a short default without one.
        ResponseCode::NoError | ResponseCode::NXDomain => {
            Some(soa_min().unwrap_or(5).min(MAX_NEGATIVE_TTL))
        }
        _ => None,
    }
}

/// Counts TTLs down by `elapsed`, or sets them all to `floor` (stale answers).
fn age(mut m: Message, elapsed: u32, floor: Option<u32>) -> Message {
    for r in m
        .answers
        .iter_mut()
        .chain(m.authorities.iter_mut())
        .chain(m.additionals.iter_mut())
    {
        r.ttl = match floor {
            Some(f) => f,
            None => r.ttl.saturating_sub(elapsed),
        };
    }
    m
}

impl Cache {
    pub fn new(capacity: usize, stale_window: Duration) -> Cache {
        Cache {
            map: HashMap::with_capacity(capacity.min(1 << 16)),
            capacity,
            stale_window,
        }
    }

    /// Looks `key` up at `now`.
    pub fn get(&self, key: &Key, now: Instant) -> Option<Hit> {
        let e = self.map.get(key)?;
        let elapsed = now.saturating_duration_since(e.stored);
        let ttl = Duration::from_secs(u64::from(e.ttl));
        if elapsed < ttl {
            Some(Hit::Fresh(age(
                e.response.clone(),
                elapsed.as_secs() as u32,
                None,
            )))
        } else if elapsed < ttl + self.stale_window {
            Some(Hit::Stale(age(e.response.clone(), 0, Some(STALE_TTL))))
        } else {
            None
        }
    }

    /// Stores `response` if it may be cached. Returns whether it was.
    pub fn insert(&mut self, key: Key, response: &Message, now: Instant) -> bool {
        let Some(ttl) = cacheable_ttl(response) else {
            return false;
        };
        if self.map.len() >= self.capacity && !self.map.contains_key(&key) {
            self.evict(now);
        }
        let mut stored = response.clone();
        stored.metadata.id = 0;
        stored.edns = None;
        self.map.insert(
            key,
            Entry {
                response: stored,
                stored: now,
                ttl,
            },
        );
        true
    }

    /// Drops entries past their stale window; if that frees nothing, the oldest tenth.
    fn evict(&mut self, now: Instant) {
        let window = self.stale_window;
        self.map.retain(|_, e| {
            now.saturating_duration_since(e.stored) < Duration::from_secs(u64::from(e.ttl)) + window
        });
        if self.map.len() >= self.capacity {
            let mut ages: Vec<Instant> = self.map.values().map(|e| e.stored).collect();
            ages.sort();
            let cutoff = ages[ages.len() / 10];
            self.map.retain(|_, e| e.stored > cutoff);
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{MessageType, OpCode, Query};
    use hickory_proto::rr::Record;
    use hickory_proto::rr::rdata::{A, SOA};

    fn name(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn answer(ttl: u32) -> Message {
        let mut m = Message::new(1, MessageType::Response, OpCode::Query);
        m.queries
            .push(Query::query(name("example.test."), RecordType::A));
        m.answers.push(Record::from_rdata(
            name("example.test."),
            ttl,
            RData::A(A::new(192, 0, 2, 1)),
        ));
        m
    }

    fn nxdomain(soa_min: u32) -> Message {
        let mut m = Message::new(1, MessageType::Response, OpCode::Query);
        m.metadata.response_code = ResponseCode::NXDomain;
        let soa = SOA::new(name("ns.test."), name("h.test."), 1, 1, 1, 1, soa_min);
        m.authorities
            .push(Record::from_rdata(name("test."), 600, RData::SOA(soa)));
        m
    }

    fn key() -> Key {
        Key::new(&name("Example.TEST."), RecordType::A, DNSClass::IN)
    }

    #[test]
    fn fresh_then_stale_then_gone() {
        let t0 = Instant::now();
        let mut c = Cache::new(100, Duration::from_secs(60));
        assert!(c.insert(key(), &answer(10), t0));
        let Some(Hit::Fresh(m)) = c.get(&key(), t0 + Duration::from_secs(4)) else {
            panic!()
        };
        assert_eq!(m.answers[0].ttl, 6, "TTL counts down");
        let Some(Hit::Stale(m)) = c.get(&key(), t0 + Duration::from_secs(30)) else {
            panic!()
        };
        assert_eq!(m.answers[0].ttl, STALE_TTL);
        assert_eq!(c.get(&key(), t0 + Duration::from_secs(71)), None);
    }

    #[test]
    fn keys_ignore_case() {
        assert_eq!(
            key(),
            Key::new(&name("example.test."), RecordType::A, DNSClass::IN)
        );
    }

    #[test]
    fn negative_answers_live_for_the_soa_minimum_and_errors_not_at_all() {
        assert_eq!(cacheable_ttl(&nxdomain(30)), Some(30));
        assert_eq!(
            cacheable_ttl(&nxdomain(100_000)),
            Some(600.min(MAX_NEGATIVE_TTL))
        );
        let mut fail = answer(10);
        fail.metadata.response_code = ResponseCode::ServFail;
        assert_eq!(cacheable_ttl(&fail), None);
        let mut tc = answer(10);
        tc.metadata.truncation = true;
        assert_eq!(cacheable_ttl(&tc), None);
        assert_eq!(cacheable_ttl(&answer(1_000_000)), Some(MAX_TTL));
    }

    #[test]
    fn a_full_cache_evicts() {
        let t0 = Instant::now();
        let mut c = Cache::new(10, Duration::from_secs(1));
        for i in 0..50 {
            let k = Key::new(&name(&format!("n{i}.test.")), RecordType::A, DNSClass::IN);
            c.insert(k, &answer(1), t0 + Duration::from_millis(i * 10));
        }
        assert!(c.len() <= 10, "{}", c.len());
    }
}
