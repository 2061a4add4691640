//! Answers from the cluster zone, pure: a request and a snapshot in, a decision out. Names in
//! the cluster zone (and reverse names of the cluster's addresses) are answered here and never
//! leave the node; everything else is for the forwarder. The search-path shortcut answers a
//! pod's whole `ndots:5` walk in one round trip.

use std::net::IpAddr;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use ipnet::IpNet;

use crate::store::{Lookup, NameData, Snapshot};

/// TTL of every cluster record (CoreDNS's default).
pub const TTL: u32 = 5;

/// The largest UDP payload this server sends or asks for (the DNS flag day 2020 value).
pub const MAX_UDP_PAYLOAD: u16 = 1232;

/// What the server should do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Send this.
    Reply(Message),
    /// Send this: a pod's search walk answered in one round trip from the cluster zone.
    Shortcut(Message),
    /// Not ours: answer from the cache or the upstream resolvers.
    Forward,
    /// A pod's search walk found nothing in the cluster: resolve `external` upstream and, if it
    /// exists, answer the original name with a CNAME to it (the last step of the walk).
    Autopath { external: Name },
    /// An ExternalName Service asked for addresses: the CNAME, plus the target's records from
    /// upstream when they can be had (`fallback` is the CNAME alone).
    Chase { external: Name, fallback: Message },
}

/// What [`decide`] knows besides the request.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub snapshot: &'a Snapshot,
    /// The namespace of the pod that asked, when it runs on this node.
    pub pod_namespace: Option<&'a str>,
    /// Networks whose reverse names are answered here (cluster and service CIDRs).
    pub reverse_nets: &'a [IpNet],
}

/// The lowercase name without the trailing dot (the store's key form).
pub fn key(name: &Name) -> String {
    let mut s = name.to_lowercase().to_ascii();
    if s.ends_with('.') {
        s.pop();
    }
    s
}

fn fqdn(s: &str) -> Name {
    Name::from_ascii(format!("{s}.")).unwrap_or_else(|_| Name::root())
}

/// A response to `req` with its header, question and EDNS set up.
pub fn response_to(req: &Message) -> Message {
    let mut m = Message::new(req.metadata.id, MessageType::Response, req.metadata.op_code);
    m.metadata.recursion_desired = req.metadata.recursion_desired;
    m.metadata.checking_disabled = req.metadata.checking_disabled;
    m.metadata.recursion_available = true;
    m.queries = req.queries.clone();
    if req.edns.is_some() {
        let mut e = Edns::new();
        e.set_max_payload(MAX_UDP_PAYLOAD);
        m.edns = Some(e);
    }
    m
}

/// An error response.
pub fn error(req: &Message, code: ResponseCode) -> Message {
    let mut m = response_to(req);
    m.metadata.response_code = code;
    m
}

/// The zone's SOA, for negative answers (its minimum is the negative-caching TTL).
fn soa(zone: &str) -> Record {
    Record::from_rdata(
        fqdn(zone),
        TTL,
        RData::SOA(SOA::new(
            fqdn(&format!("ns.dns.{zone}")),
            fqdn(&format!("hostmaster.{zone}")),
            1,
            7200,
            1800,
            86400,
            TTL,
        )),
    )
}

/// Decides what to do with a request.
pub fn decide(req: &Message, ctx: &Context<'_>) -> Decision {
    if req.metadata.message_type != MessageType::Query || req.metadata.op_code != OpCode::Query {
        return Decision::Reply(error(req, ResponseCode::NotImp));
    }
    let [q] = req.queries.as_slice() else {
        return Decision::Reply(error(req, ResponseCode::FormErr));
    };
    if q.query_class != DNSClass::IN {
        return Decision::Reply(error(req, ResponseCode::Refused));
    }
    let name = key(&q.name);
    let snap = ctx.snapshot;
    if snap.in_zone(&name) {
        return zone_answer(req, snap, &name, q.query_type, ctx.pod_namespace);
    }
    if let Some(ip) = reverse_ip(&q.name)
        && let Some(net) = ctx.reverse_nets.iter().find(|n| n.contains(&ip))
    {
        return Decision::Reply(reverse_answer(req, snap, ip, net, q.query_type));
    }
    Decision::Forward
}

/// Answers a name in the zone; for a pod's missed first search step, walks the rest of the
/// search path, ending at the forwarder when nothing in the cluster matches.
fn zone_answer(
    req: &Message,
    snap: &Snapshot,
    name: &str,
    qtype: RecordType,
    pod_namespace: Option<&str>,
) -> Decision {
    let q = &req.queries[0];
    let mut m = response_to(req);
    m.metadata.authoritative = true;
    match snap.lookup(name) {
        Lookup::Found(data) => {
            add_records(&mut m, snap, &q.name, data, qtype);
            if m.answers.is_empty() {
                m.authorities.push(soa(&snap.zone));
            }
            if let Some(target) = &data.cname
                && matches!(qtype, RecordType::A | RecordType::AAAA)
                && !snap.in_zone(target)
            {
                return Decision::Chase {
                    external: fqdn(target),
                    fallback: m,
                };
            }
        }
        Lookup::EmptyNonTerminal => m.authorities.push(soa(&snap.zone)),
        Lookup::NxDomain => {
            if let Some(ns) = pod_namespace
                && let Some(prefix) = name.strip_suffix(&format!(".{ns}.svc.{}", snap.zone))
            {
                // The first step of a pod's search walk missed: try the rest of the walk here.
                for candidate in [
                    format!("{prefix}.svc.{}", snap.zone),
                    format!("{prefix}.{}", snap.zone),
                ] {
                    if let Lookup::Found(data) = snap.lookup(&candidate) {
                        let target = fqdn(&candidate);
                        m.answers.push(Record::from_rdata(
                            q.name.clone(),
                            TTL,
                            RData::CNAME(CNAME(target.clone())),
                        ));
                        add_records(&mut m, snap, &target, data, qtype);
                        return Decision::Shortcut(m);
                    }
                }
                if !snap.in_zone(prefix) {
                    return Decision::Autopath {
                        external: fqdn(prefix),
                    };
                }
            }
            m.metadata.response_code = ResponseCode::NXDomain;
            m.authorities.push(soa(&snap.zone));
        }
    }
    Decision::Reply(m)
}

fn add_records(m: &mut Message, snap: &Snapshot, owner: &Name, data: &NameData, qtype: RecordType) {
    let any = qtype == RecordType::ANY;
    if let Some(target) = &data.cname {
        m.answers.push(Record::from_rdata(
            owner.clone(),
            TTL,
            RData::CNAME(CNAME(fqdn(target))),
        ));
        return;
    }
    if any || qtype == RecordType::A {
        m.answers.extend(
            data.a
                .iter()
                .map(|ip| Record::from_rdata(owner.clone(), TTL, RData::A(A(*ip)))),
        );
    }
    if any || qtype == RecordType::AAAA {
        m.answers.extend(
            data.aaaa
                .iter()
                .map(|ip| Record::from_rdata(owner.clone(), TTL, RData::AAAA(AAAA(*ip)))),
        );
    }
    if any || qtype == RecordType::TXT {
        m.answers.extend(data.txt.iter().map(|t| {
            Record::from_rdata(owner.clone(), TTL, RData::TXT(TXT::new(vec![t.clone()])))
        }));
    }
    if any || qtype == RecordType::SRV {
        for s in &data.srv {
            let target = fqdn(&s.target);
            m.answers.push(Record::from_rdata(
                owner.clone(),
                TTL,
                RData::SRV(SRV::new(s.priority, s.weight, s.port, target.clone())),
            ));
            // The targets' addresses, so the client needs no second query.
            if let Lookup::Found(t) = snap.lookup(&s.target) {
                m.additionals.extend(
                    t.a.iter()
                        .map(|ip| Record::from_rdata(target.clone(), TTL, RData::A(A(*ip)))),
                );
                m.additionals.extend(
                    t.aaaa
                        .iter()
                        .map(|ip| Record::from_rdata(target.clone(), TTL, RData::AAAA(AAAA(*ip)))),
                );
            }
        }
    }
}

/// The address a reverse (`in-addr.arpa` / `ip6.arpa`) name stands for, if it is a whole one.
pub fn reverse_ip(name: &Name) -> Option<IpAddr> {
    let net = name.parse_arpa_name().ok()?;
    (net.prefix_len() == net.max_prefix_len()).then(|| net.addr())
}

/// The reverse zone of a network, for the SOA of negative answers (whole octets only).
fn reverse_zone(net: &IpNet) -> String {
    match net {
        IpNet::V4(n) => {
            let octets = n.network().octets();
            let keep = usize::from(n.prefix_len() / 8);
            let mut labels: Vec<String> = octets[..keep].iter().rev().map(u8::to_string).collect();
            labels.push("in-addr.arpa".into());
            labels.join(".")
        }
        IpNet::V6(_) => "ip6.arpa".into(),
    }
}

fn reverse_answer(
    req: &Message,
    snap: &Snapshot,
    ip: IpAddr,
    net: &IpNet,
    qtype: RecordType,
) -> Message {
    let q = &req.queries[0];
    let mut m = response_to(req);
    m.metadata.authoritative = true;
    let names = snap.reverse(&ip);
    if names.is_empty() {
        m.metadata.response_code = ResponseCode::NXDomain;
    } else if qtype == RecordType::PTR || qtype == RecordType::ANY {
        m.answers.extend(
            names
                .iter()
                .map(|n| Record::from_rdata(q.name.clone(), TTL, RData::PTR(PTR(fqdn(n))))),
        );
    }
    if m.answers.is_empty() {
        m.authorities.push(soa(&reverse_zone(net)));
    }
    m
}

/// The answer to a pod whose search walk ended outside the cluster: a CNAME from the name it
/// asked to the external name, and the upstream's records for that name.
pub fn autopath_answer(req: &Message, upstream: &Message) -> Message {
    let q = &req.queries[0];
    let mut m = response_to(req);
    let external = upstream
        .queries
        .first()
        .map(|u| u.name.clone())
        .unwrap_or_else(Name::root);
    let ttl = upstream
        .answers
        .iter()
        .map(|r| r.ttl)
        .min()
        .unwrap_or(TTL)
        .min(TTL);
    m.answers.push(Record::from_rdata(
        q.name.clone(),
        ttl,
        RData::CNAME(CNAME(external)),
    ));
    m.answers.extend(upstream.answers.iter().cloned());
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fixtures::store;
    use hickory_proto::op::Query;

    fn ask(name: &str, t: RecordType) -> Message {
        let mut m = Message::new(7, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.queries
            .push(Query::query(Name::from_ascii(name).unwrap(), t));
        m
    }

    fn run(name: &str, t: RecordType, ns: Option<&str>) -> Decision {
        let snap = store().snapshot("cluster.local");
        let nets: Vec<IpNet> = vec![
            "10.42.0.0/16".parse().unwrap(),
            "10.43.0.0/16".parse().unwrap(),
        ];
        decide(
            &ask(name, t),
            &Context {
                snapshot: &snap,
                pod_namespace: ns,
                reverse_nets: &nets,
            },
        )
    }

    fn reply(name: &str, t: RecordType) -> Message {
        match run(name, t, None) {
            Decision::Reply(m) => m,
            d => panic!("{name}: {d:?}"),
        }
    }

    fn rdata(m: &Message) -> Vec<String> {
        m.answers.iter().map(|r| r.data.to_string()).collect()
    }

    #[test]
    fn a_srv_txt_and_ptr() {
        let m = reply("web.default.svc.cluster.local.", RecordType::A);
        assert_eq!(rdata(&m), ["10.43.0.10"]);
        assert!(m.metadata.authoritative && m.metadata.recursion_available);
        assert_eq!(m.answers[0].ttl, TTL);
        let m = reply("_http._tcp.web.default.svc.cluster.local.", RecordType::SRV);
        assert_eq!(rdata(&m), ["0 100 80 web.default.svc.cluster.local."]);
        assert_eq!(m.additionals.len(), 1, "the target's address rides along");
        assert_eq!(
            rdata(&reply("dns-version.cluster.local.", RecordType::TXT)),
            ["1.1.0"]
        );
        assert_eq!(
            rdata(&reply("10.0.43.10.in-addr.arpa.", RecordType::PTR)),
            ["web.default.svc.cluster.local."]
        );
    }

    #[test]
    fn nxdomain_and_nodata_are_told_apart() {
        let m = reply("nope.default.svc.cluster.local.", RecordType::A);
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(m.authorities[0].record_type(), RecordType::SOA);
        let m = reply("web.default.svc.cluster.local.", RecordType::AAAA);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.answers.is_empty() && m.authorities[0].record_type() == RecordType::SOA);
        let m = reply("default.svc.cluster.local.", RecordType::A);
        assert_eq!(
            m.metadata.response_code,
            ResponseCode::NoError,
            "an empty non-terminal is NODATA"
        );
        let m = reply("99.99.42.10.in-addr.arpa.", RecordType::PTR);
        assert_eq!(
            m.metadata.response_code,
            ResponseCode::NXDomain,
            "unknown cluster address"
        );
    }

    #[test]
    fn case_is_ignored_and_kept() {
        let m = reply("WEB.Default.SVC.cluster.LOCAL.", RecordType::A);
        assert_eq!(rdata(&m), ["10.43.0.10"]);
        assert_eq!(
            m.answers[0].name.to_ascii(),
            "WEB.Default.SVC.cluster.LOCAL."
        );
    }

    #[test]
    fn external_names_are_cnames_and_other_names_are_forwarded() {
        let Decision::Chase { external, fallback } =
            run("ext.default.svc.cluster.local.", RecordType::A, None)
        else {
            panic!()
        };
        assert_eq!(external.to_ascii(), "example.test.");
        assert_eq!(rdata(&fallback), ["example.test."]);
        assert_eq!(
            rdata(&reply("ext.default.svc.cluster.local.", RecordType::CNAME)),
            ["example.test."]
        );
        assert_eq!(run("example.com.", RecordType::A, None), Decision::Forward);
        assert_eq!(
            run("8.8.8.8.in-addr.arpa.", RecordType::PTR, None),
            Decision::Forward
        );
    }

    #[test]
    fn the_search_walk_is_answered_in_one_round_trip() {
        // A pod in `other` asks for web.default (short name): its first search step is
        // web.default.other.svc.cluster.local.
        let Decision::Shortcut(m) = run(
            "web.default.other.svc.cluster.local.",
            RecordType::A,
            Some("other"),
        ) else {
            panic!()
        };
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert_eq!(rdata(&m), ["web.default.svc.cluster.local.", "10.43.0.10"]);
        // An external name's walk ends at the forwarder.
        assert_eq!(
            run(
                "example.com.other.svc.cluster.local.",
                RecordType::A,
                Some("other")
            ),
            Decision::Autopath {
                external: Name::from_ascii("example.com.").unwrap()
            }
        );
        // Without knowing the pod, or for another namespace's suffix: a plain NXDOMAIN.
        let Decision::Reply(m) = run("example.com.other.svc.cluster.local.", RecordType::A, None)
        else {
            panic!()
        };
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        let Decision::Reply(m) = run(
            "example.com.default.svc.cluster.local.",
            RecordType::A,
            Some("other"),
        ) else {
            panic!()
        };
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    }

    #[test]
    fn bad_requests_get_errors() {
        let mut m = ask("a.", RecordType::A);
        m.queries.clear();
        let snap = Snapshot::default();
        let ctx = Context {
            snapshot: &snap,
            pod_namespace: None,
            reverse_nets: &[],
        };
        assert!(
            matches!(decide(&m, &ctx), Decision::Reply(r) if r.metadata.response_code == ResponseCode::FormErr)
        );
        let mut m = ask("a.", RecordType::A);
        m.queries[0].query_class = DNSClass::CH;
        assert!(
            matches!(decide(&m, &ctx), Decision::Reply(r) if r.metadata.response_code == ResponseCode::Refused)
        );
    }
}
