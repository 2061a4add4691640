//! The hot path's reader against `hickory-proto`, the parser everything else uses, on
//! arbitrary packets. Declining is always safe (the full path decides), so the properties
//! are: whatever [`read_query`] accepts, hickory accepts and reads alike (id, name, type,
//! class, EDNS and its payload size); and every ordinary query, as hickory writes one, both
//! accept.

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query as HQuery};
use hickory_proto::rr::{DNSClass, Name, RecordType};
use hickory_proto::serialize::binary::BinEncodable;
use proptest::prelude::*;

use super::read_query;
use crate::answer::MAX_UDP_PAYLOAD;

/// A query-shaped packet, built by hand so that it can be wrong in every field.
#[derive(Debug, Clone)]
struct Raw {
    id: u16,
    flags: [u8; 2],
    counts: [u16; 4],
    labels: Vec<Vec<u8>>,
    qtype: u16,
    qclass: u16,
    /// OPT-like record: owner's first byte, type, class (payload), TTL, RDATA, and how far
    /// RDLENGTH lies about the RDATA.
    opt: Option<(u8, u16, u16, u32, Vec<u8>, i8)>,
    trailing: Vec<u8>,
}

impl Raw {
    fn bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(512);
        b.extend_from_slice(&self.id.to_be_bytes());
        b.extend_from_slice(&self.flags);
        for c in self.counts {
            b.extend_from_slice(&c.to_be_bytes());
        }
        for l in &self.labels {
            b.push(l.len() as u8);
            b.extend_from_slice(l);
        }
        b.push(0);
        b.extend_from_slice(&self.qtype.to_be_bytes());
        b.extend_from_slice(&self.qclass.to_be_bytes());
        if let Some((owner, rtype, class, ttl, rdata, lie)) = &self.opt {
            b.push(*owner);
            b.extend_from_slice(&rtype.to_be_bytes());
            b.extend_from_slice(&class.to_be_bytes());
            b.extend_from_slice(&ttl.to_be_bytes());
            let len = (rdata.len() as i32 + i32::from(*lie)).clamp(0, 0xffff) as u16;
            b.extend_from_slice(&len.to_be_bytes());
            b.extend_from_slice(rdata);
        }
        b.extend_from_slice(&self.trailing);
        b
    }
}

/// Labels: mostly hostname-like (mixed case, to check case folding), sometimes any bytes,
/// sometimes long enough together to pass the 255-octet limit.
fn label() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => "[a-zA-Z0-9_-]{1,20}".prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), 1..=63),
        1 => proptest::collection::vec(any::<u8>(), 60..=63),
    ]
}

/// EDNS options: well-formed ones (code, length, data) or any bytes.
fn rdata() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => proptest::collection::vec((any::<u16>(), proptest::collection::vec(any::<u8>(), 0..8)), 0..3)
            .prop_map(|opts| {
                let mut b = Vec::new();
                for (code, data) in opts {
                    b.extend_from_slice(&code.to_be_bytes());
                    b.extend_from_slice(&(data.len() as u16).to_be_bytes());
                    b.extend_from_slice(&data);
                }
                b
            }),
        1 => proptest::collection::vec(any::<u8>(), 0..12),
    ]
}

fn raw() -> impl Strategy<Value = Raw> {
    let flags = prop_oneof![
        // A query: QR 0, opcode 0, the other bits anything.
        3 => (any::<u8>(), any::<u8>()).prop_map(|(a, b)| [a & 0x07, b]),
        1 => any::<[u8; 2]>(),
    ];
    let counts = prop_oneof![
        3 => any::<bool>().prop_map(|opt| [1, 0, 0, u16::from(opt)]),
        1 => any::<[u16; 4]>().prop_map(|c| c.map(|n| n % 3)),
    ];
    let opt = prop_oneof![
        1 => Just(None),
        3 => (
            prop_oneof![4 => Just(0u8), 1 => any::<u8>()],
            prop_oneof![4 => Just(41u16), 1 => any::<u16>()],
            any::<u16>(),
            any::<u32>(),
            rdata(),
            prop_oneof![4 => Just(0i8), 1 => -3i8..3],
        )
            .prop_map(Some),
    ];
    // Names around the 255-octet limit: three full labels and one of 58 to 63 octets make
    // 252 to 257 octets with the root.
    let labels = prop_oneof![
        4 => proptest::collection::vec(label(), 0..8),
        1 => (58usize..=63).prop_map(|n| {
            let mut l = vec![b"Ab".repeat(32)[..63].to_vec(); 3];
            l.push(vec![b'z'; n]);
            l
        }),
    ];
    (
        any::<u16>(),
        flags,
        counts,
        labels,
        prop_oneof![3 => Just(1u16), 1 => any::<u16>()],
        prop_oneof![3 => Just(1u16), 1 => any::<u16>()],
        opt,
        prop_oneof![4 => Just(Vec::new()), 1 => proptest::collection::vec(any::<u8>(), 1..4)],
    )
        .prop_map(
            |(id, flags, counts, labels, qtype, qclass, opt, trailing)| Raw {
                id,
                flags,
                counts,
                labels,
                qtype,
                qclass,
                opt,
                trailing,
            },
        )
}

/// A packet, then a few bytes flipped or the end cut off (or neither).
fn packet() -> impl Strategy<Value = Vec<u8>> {
    (
        raw(),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        prop_oneof![3 => Just(None), 1 => any::<prop::sample::Index>().prop_map(Some)],
    )
        .prop_map(|(raw, flips, cut)| {
            let mut b = raw.bytes();
            for (at, x) in flips {
                let i = at.index(b.len());
                b[i] ^= x;
            }
            if let Some(at) = cut {
                b.truncate(at.index(b.len() + 1));
            }
            b
        })
}

/// What hickory reads matches what the hot path read.
fn agrees(packet: &[u8]) -> Result<(), TestCaseError> {
    let Some(q) = read_query(packet, None) else {
        return Ok(());
    };
    let m = Message::from_vec(packet).map_err(|e| {
        TestCaseError::fail(format!(
            "the hot path accepted what hickory refuses ({e}): {packet:02x?}"
        ))
    })?;
    prop_assert_eq!(m.metadata.id, u16::from_be_bytes(q.id));
    prop_assert_eq!(m.metadata.message_type, MessageType::Query);
    prop_assert_eq!(m.metadata.op_code, OpCode::Query);
    prop_assert_eq!(m.queries.len(), 1);
    prop_assert!(m.answers.is_empty() && m.authorities.is_empty() && m.additionals.is_empty());
    let hq = &m.queries[0];
    let name = hq
        .name
        .to_lowercase()
        .to_bytes()
        .expect("a name read encodes");
    prop_assert_eq!(&q.key.qname, &name, "name");
    prop_assert_eq!(q.key.qtype, u16::from(hq.query_type), "type");
    prop_assert_eq!(q.key.qclass, u16::from(hq.query_class), "class");
    prop_assert_eq!(q.key.edns, m.edns.is_some(), "EDNS");
    let limit = m.edns.as_ref().map_or(512, |e| {
        usize::from(e.max_payload().clamp(512, MAX_UDP_PAYLOAD))
    });
    prop_assert_eq!(q.udp_limit, limit, "UDP payload limit");
    Ok(())
}

/// Ordinary queries as hickory writes them.
fn ordinary() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<u16>(),
        proptest::collection::vec("[a-zA-Z0-9_-]{1,30}", 0..6),
        any::<u16>(),
        prop_oneof![
            Just(DNSClass::IN),
            Just(DNSClass::CH),
            any::<u16>().prop_map(DNSClass::from)
        ],
        any::<(bool, bool, bool)>(),
        proptest::option::of(any::<u16>()),
    )
        .prop_filter_map(
            "a name hickory can make",
            |(id, labels, qtype, class, (rd, cd, ad), edns)| {
                let name = Name::from_labels(labels.iter().map(String::as_bytes)).ok()?;
                let mut m = Message::new(id, MessageType::Query, OpCode::Query);
                m.metadata.recursion_desired = rd;
                m.metadata.checking_disabled = cd;
                m.metadata.authentic_data = ad;
                let mut query = HQuery::query(name, RecordType::from(qtype));
                query.query_class = class;
                m.queries.push(query);
                if let Some(payload) = edns {
                    let mut e = Edns::new();
                    e.set_max_payload(payload);
                    m.edns = Some(e);
                }
                m.to_vec().ok()
            },
        )
}

/// 4096 cases a run in the suite; `PROPTEST_CASES` for a longer search.
fn config() -> ProptestConfig {
    match std::env::var("PROPTEST_CASES") {
        Ok(_) => ProptestConfig::default(),
        Err(_) => ProptestConfig::with_cases(4096),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn what_the_hot_path_accepts_hickory_reads_alike(p in packet()) {
        agrees(&p)?;
    }

    #[test]
    fn ordinary_queries_are_accepted_by_both(p in ordinary()) {
        prop_assert!(read_query(&p, None).is_some(), "declined: {:02x?}", p);
        agrees(&p)?;
    }
}
