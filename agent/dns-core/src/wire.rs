//! The hot path in wire format: a minimal reader for ordinary queries (one question, maybe an
//! OPT record) and a cache of finished answers as bytes, so that a repeated question costs a
//! hash lookup and a copy with the id, the RD/CD bits and the question's case patched in --
//! no parsing of records, no serialisation. Anything unusual takes the full path.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What a cached answer depends on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WireKey {
    /// The question name in wire format, lowercased.
    pub qname: Vec<u8>,
    pub qtype: u16,
    pub qclass: u16,
    /// Whether the query carried EDNS (the answer then carries OPT).
    pub edns: bool,
    /// The namespace of the asking pod (answers in the cluster zone depend on it).
    pub namespace: Option<Arc<str>>,
}

/// An ordinary query, read without a full parse.
#[derive(Debug)]
pub struct Query<'a> {
    pub id: [u8; 2],
    /// Byte 2 of the header (QR, opcode, AA, TC, RD).
    pub flags_hi: u8,
    /// Byte 3 (RA, Z, AD, CD, RCODE).
    pub flags_lo: u8,
    /// The question name as sent (case kept), wire format.
    pub qname: &'a [u8],
    pub key: WireKey,
    /// Largest UDP answer the client takes.
    pub udp_limit: usize,
}

/// Reads a plain query: QR=0, opcode QUERY, one question, no answers or authorities, and at
/// most one additional record which is an OPT at the root. `None` for anything else.
pub fn read_query(packet: &[u8], namespace: Option<Arc<str>>) -> Option<Query<'_>> {
    if packet.len() < 12 + 5 {
        return None;
    }
    let (flags_hi, flags_lo) = (packet[2], packet[3]);
    if flags_hi & 0x80 != 0 || (flags_hi >> 3) & 0x0f != 0 {
        return None;
    }
    let count = |i: usize| u16::from_be_bytes([packet[i], packet[i + 1]]);
    if count(4) != 1 || count(6) != 0 || count(8) != 0 || count(10) > 1 {
        return None;
    }
    let mut i = 12;
    let mut lower = Vec::with_capacity(64);
    loop {
        let len = usize::from(*packet.get(i)?);
        if len == 0 {
            lower.push(0);
            i += 1;
            break;
        }
        // At most 255 octets with the root's (RFC 1035, 3.1): this label and the root must fit.
        if len > 63 || lower.len() + len + 1 + 1 > 255 {
            return None; // compression pointers, too long, or nonsense: the full path decides
        }
        let label = packet.get(i + 1..i + 1 + len)?;
        lower.push(len as u8);
        lower.extend(label.iter().map(u8::to_ascii_lowercase));
        i += 1 + len;
    }
    let qname = &packet[12..i];
    let qtype = u16::from_be_bytes([*packet.get(i)?, *packet.get(i + 1)?]);
    let qclass = u16::from_be_bytes([*packet.get(i + 2)?, *packet.get(i + 3)?]);
    i += 4;
    let (edns, udp_limit) = if count(10) == 1 {
        // OPT: root name, type 41, class = payload size.
        let rr = packet.get(i..i + 11)?;
        if rr[0] != 0 || u16::from_be_bytes([rr[1], rr[2]]) != 41 {
            return None;
        }
        let payload = usize::from(u16::from_be_bytes([rr[3], rr[4]]));
        let rdlen = usize::from(u16::from_be_bytes([rr[9], rr[10]]));
        if i + 11 + rdlen != packet.len() || !plain_options(&packet[i + 11..]) {
            return None;
        }
        (
            true,
            payload.clamp(512, usize::from(crate::answer::MAX_UDP_PAYLOAD)),
        )
    } else {
        if i != packet.len() {
            return None;
        }
        (false, 512)
    };
    Some(Query {
        id: [packet[0], packet[1]],
        flags_hi,
        flags_lo,
        qname,
        key: WireKey {
            qname: lower,
            qtype,
            qclass,
            edns,
            namespace,
        },
        udp_limit,
    })
}

/// Whether OPT's RDATA is a well-formed list of options (code, length, data) that fills it
/// exactly, none of them one whose content a full parse would judge (NSID, Client Subnet).
/// Cookies, padding and the like pass: the answer does not depend on them.
fn plain_options(mut rdata: &[u8]) -> bool {
    const NSID: u16 = 3;
    const CLIENT_SUBNET: u16 = 8;
    while !rdata.is_empty() {
        let [c0, c1, l0, l1, rest @ ..] = rdata else {
            return false;
        };
        let len = usize::from(u16::from_be_bytes([*l0, *l1]));
        if matches!(u16::from_be_bytes([*c0, *c1]), NSID | CLIENT_SUBNET) || len > rest.len() {
            return false;
        }
        rdata = &rest[len..];
    }
    true
}

/// The answer to `q` from a cached answer: its id, its RD and CD bits, its question's case.
pub fn patch(cached: &[u8], q: &Query<'_>) -> Vec<u8> {
    let mut out = cached.to_vec();
    out[0] = q.id[0];
    out[1] = q.id[1];
    out[2] = (out[2] & !0x01) | (q.flags_hi & 0x01);
    out[3] = (out[3] & !0x10) | (q.flags_lo & 0x10);
    out[12..12 + q.qname.len()].copy_from_slice(q.qname);
    out
}

#[derive(Debug)]
struct Entry {
    bytes: Vec<u8>,
    /// The caller's tag (where the answer came from, for its counters).
    from: u8,
    /// Served until then (TTLs in the bytes are right for one second; cluster answers for as
    /// long as the snapshot they came from).
    until: Instant,
    generation: u64,
}

/// Finished answers by question. Sharded so the serving threads rarely meet on a lock.
#[derive(Debug)]
pub struct WireCache {
    shards: Vec<Mutex<HashMap<WireKey, Entry>>>,
    per_shard: usize,
}

const SHARDS: usize = 16;

impl WireCache {
    pub fn new(capacity: usize) -> WireCache {
        WireCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: capacity / SHARDS + 1,
        }
    }

    fn shard(&self, key: &WireKey) -> &Mutex<HashMap<WireKey, Entry>> {
        use std::hash::{BuildHasher, RandomState};
        thread_local!(static HASHER: RandomState = RandomState::new());
        // One hasher per process would do; per thread is as good and needs no sync.
        let h = HASHER.with(|s| s.hash_one(key)) as usize;
        &self.shards[h % SHARDS]
    }

    /// The cached answer for `q` and its tag, if still good for `generation` at `now`.
    pub fn get(&self, q: &Query<'_>, generation: u64, now: Instant) -> Option<(Vec<u8>, u8)> {
        let shard = self.shard(&q.key).lock().expect("lock");
        let e = shard.get(&q.key)?;
        (e.generation == generation && now < e.until && e.bytes.len() >= 12 + q.qname.len())
            .then(|| (patch(&e.bytes, q), e.from))
    }

    /// Keeps `bytes` as the answer to `key` until `until`. A full shard first drops what is
    /// stale at `now`, and everything if that frees nothing.
    pub fn put(
        &self,
        key: WireKey,
        bytes: Vec<u8>,
        generation: u64,
        now: Instant,
        until: Instant,
        from: u8,
    ) {
        let mut shard = self.shard(&key).lock().expect("lock");
        if shard.len() >= self.per_shard {
            shard.retain(|_, e| e.until > now && e.generation == generation);
            if shard.len() >= self.per_shard {
                shard.clear();
            }
        }
        shard.insert(
            key,
            Entry {
                bytes,
                from,
                until,
                generation,
            },
        );
    }
}

/// Whether `src` asks from a pod on this node (the key then carries its namespace).
pub fn namespace_of(pods: &HashMap<IpAddr, String>, src: &IpAddr) -> Option<Arc<str>> {
    pods.get(src).map(|s| Arc::from(s.as_str()))
}

#[cfg(test)]
mod agreement;

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query as HQuery};
    use hickory_proto::rr::{Name, RecordType};

    fn query(name: &str, edns: bool) -> Vec<u8> {
        let mut m = Message::new(0x1234, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.queries.push(HQuery::query(
            Name::from_ascii(name).unwrap(),
            RecordType::A,
        ));
        if edns {
            let mut e = Edns::new();
            e.set_max_payload(4096);
            m.edns = Some(e);
        }
        m.to_vec().unwrap()
    }

    #[test]
    fn reads_plain_queries_and_keys_ignore_case() {
        let a = query("Web.Default.svc.cluster.local.", false);
        let q = read_query(&a, None).unwrap();
        assert_eq!(q.id, [0x12, 0x34]);
        assert_eq!(q.key.qtype, 1);
        assert_eq!(q.udp_limit, 512);
        let b = query("web.default.svc.cluster.local.", true);
        let r = read_query(&b, None).unwrap();
        assert_eq!(q.key.qname, r.key.qname);
        assert!(r.key.edns && r.udp_limit == 1232);
    }

    #[test]
    fn patches_id_flags_and_case() {
        let asked = query("WEB.default.svc.cluster.local.", false);
        let q = read_query(&asked, None).unwrap();
        let mut stored = Message::new(0, MessageType::Response, OpCode::Query);
        stored.queries.push(HQuery::query(
            Name::from_ascii("web.default.svc.cluster.local.").unwrap(),
            RecordType::A,
        ));
        let out = patch(&stored.to_vec().unwrap(), &q);
        let m = Message::from_vec(&out).unwrap();
        assert_eq!(m.metadata.id, 0x1234);
        assert!(m.metadata.recursion_desired);
        assert_eq!(
            m.queries[0].name.to_ascii(),
            "WEB.default.svc.cluster.local."
        );
    }

    #[test]
    fn unusual_packets_take_the_full_path() {
        let mut two = query("a.b.", false);
        two[5] = 2;
        assert!(read_query(&two, None).is_none());
        let mut response = query("a.b.", false);
        response[2] |= 0x80;
        assert!(read_query(&response, None).is_none());
        let mut trailing = query("a.b.", false);
        trailing.push(0);
        assert!(read_query(&trailing, None).is_none());
    }

    #[test]
    fn names_of_255_octets_are_read_and_longer_ones_declined() {
        let full = "a".repeat(63);
        // 3 x 64 + 62 + the root = 255 octets; one more is too long (RFC 1035, 3.1).
        let longest = format!("{full}.{full}.{full}.{}.", "b".repeat(61));
        let q = query(&longest, false);
        assert_eq!(read_query(&q, None).unwrap().key.qname.len(), 255);
        let mut too_long = q.clone();
        too_long[12 + 3 * 64] = 62; // the last label claims one more octet...
        too_long.insert(12 + 3 * 64 + 1, b'b'); // ...and has it
        assert!(read_query(&too_long, None).is_none());
    }

    #[test]
    fn edns_options_are_read_only_when_well_formed() {
        let mut q = query("a.b.", true);
        let at = q.len();
        // A cookie (code 10, 8 octets): fine.
        q.extend_from_slice(&[0, 10, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8]);
        q[at - 1] = 12; // RDLENGTH
        assert!(read_query(&q, None).is_some());
        let mut overrun = q.clone();
        overrun[at + 3] = 9; // the option claims more than RDATA holds
        assert!(read_query(&overrun, None).is_none());
        let mut subnet = q.clone();
        subnet[at + 1] = 8; // Client Subnet: the full path reads it
        assert!(read_query(&subnet, None).is_none());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            if let Some(q) = read_query(&bytes, None) {
                let _ = patch(&bytes, &q);
            }
        }
    }
}
