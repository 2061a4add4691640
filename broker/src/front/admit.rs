//! Whether a client certificate may reach a cluster: issued by that cluster's users CA, not
//! expired, and recorded, unrevoked, for that cluster and the DID it names. Each refusal
//! says which of these failed.

use std::time::SystemTime;

use rustls::pki_types::{CertificateDer, UnixTime};

use crate::access::certs::hex;
use crate::access::records::Records;
use crate::access::users_trust::UsersTrust;
use socialweb_broker_core::CertRecord;

/// A certificate admitted to a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    pub cluster: String,
    pub serial: String,
    pub did: String,
    /// Unix milliseconds; `None`: no expiry.
    pub not_after: Option<i64>,
    /// The users CA that issued it (lowercase hex of its SHA-256), as recorded: a connection
    /// stays admitted only while that CA is.
    pub ca_sha256: Option<String>,
}

/// What a certificate says about itself (unverified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Presented {
    pub serial: String,
    pub common_name: String,
}

pub fn read(leaf: &[u8]) -> Result<Presented, String> {
    let (_, x) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| format!("the client certificate is unreadable: {e}"))?;
    let common_name = x
        .subject()
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())
        .unwrap_or_default()
        .to_string();
    Ok(Presented {
        serial: hex(x.raw_serial()),
        common_name,
    })
}

fn when(ms: i64) -> String {
    humantime::format_rfc3339_seconds(socialweb_broker_core::from_millis(ms)).to_string()
}

/// Whether the record of an admitted certificate still stands at `now`.
pub fn still_good(r: &CertRecord, now: SystemTime) -> Result<(), String> {
    if let Some(at) = r.revoked_at {
        return Err(format!(
            "the client certificate {} was revoked at {}",
            r.serial,
            when(at)
        ));
    }
    if let Some(na) = r.not_after
        && socialweb_broker_core::millis(now) >= na
    {
        return Err(format!(
            "the client certificate {} expired at {}; download a new kubeconfig",
            r.serial,
            when(na)
        ));
    }
    Ok(())
}

/// Why a certificate is refused at a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Not a certificate of this cluster at all (another CA, another cluster's record): the
    /// front answers this as it answers a path with no cluster, so that strangers learn
    /// nothing of which clusters exist. The words are for the log.
    NotHere(String),
    /// This cluster's certificate, refused for a reason its holder should hear.
    Why(String),
}

impl Refused {
    pub fn contains(&self, s: &str) -> bool {
        match self {
            Refused::NotHere(m) | Refused::Why(m) => m.contains(s),
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::NotHere(m) | Refused::Why(m) => f.write_str(m),
        }
    }
}

/// Checks `leaf` for `cluster`, whose users CAs are `trust`.
pub fn admit(
    leaf: &[u8],
    cluster: &str,
    trust: &UsersTrust,
    records: &Records,
    now: SystemTime,
) -> Result<Admitted, Refused> {
    let p = read(leaf).map_err(Refused::Why)?;
    retired(&p, cluster, trust, records, now)?;
    chained(leaf, &p, cluster, trust, now)?;
    let r = records.get(&p.serial).ok_or_else(|| {
        Refused::Why(format!(
            "the client certificate {} has no record at this broker (its cluster was deleted?)",
            p.serial
        ))
    })?;
    // A record of a cluster's earlier incarnation (same name, another CA) is not this one's.
    let ca_matches = r
        .ca_sha256
        .as_deref()
        .is_none_or(|fp| trust.admits(fp, now));
    if r.cluster != cluster || r.did != p.common_name || !ca_matches {
        return Err(Refused::NotHere(format!(
            "the client certificate {} is not for cluster {cluster}",
            p.serial
        )));
    }
    still_good(&r, now).map_err(Refused::Why)?;
    Ok(Admitted {
        cluster: cluster.to_string(),
        serial: r.serial,
        did: r.did,
        not_after: r.not_after,
        ca_sha256: r.ca_sha256,
    })
}

/// Whether `leaf` (read as `p`) chains to a users CA of `cluster` admitted at `now`.
fn chained(
    leaf: &[u8],
    p: &Presented,
    cluster: &str,
    trust: &UsersTrust,
    now: SystemTime,
) -> Result<(), Refused> {
    let cas: Vec<CertificateDer<'_>> = trust
        .anchors(now)
        .into_iter()
        .map(|der| CertificateDer::from(der.to_vec()))
        .collect();
    let anchors = cas
        .iter()
        .map(webpki::anchor_from_trusted_cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Refused::Why(format!("cluster {cluster}'s users CA is unreadable: {e}")))?;
    let leaf_der = CertificateDer::from(leaf.to_vec());
    let ee = webpki::EndEntityCert::try_from(&leaf_der)
        .map_err(|e| Refused::Why(format!("the client certificate is unreadable: {e}")))?;
    let t = UnixTime::since_unix_epoch(
        now.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    );
    ee.verify_for_usage(
        webpki::ALL_VERIFICATION_ALGS,
        &anchors,
        &[],
        t,
        webpki::KeyUsage::client_auth(),
        None,
        None,
    )
    .map_err(|e| match e {
        webpki::Error::CertExpired { .. } => Refused::Why(format!(
            "the client certificate {} has expired; download a new kubeconfig",
            p.serial
        )),
        webpki::Error::CertNotValidYet { .. } => Refused::Why(format!(
            "the client certificate {} is not valid yet (check this machine's clock)",
            p.serial
        )),
        webpki::Error::UnknownIssuer
        | webpki::Error::InvalidSignatureForPublicKey
        | webpki::Error::UnsupportedSignatureAlgorithmForPublicKeyContext(_) => {
            Refused::NotHere(format!(
                "the client certificate {} was not issued by cluster {cluster}'s CA",
                p.serial
            ))
        }
        other => Refused::Why(format!(
            "the client certificate {} is refused: {other}",
            p.serial
        )),
    })?;
    Ok(())
}

/// Refuses, in words its holder should hear, a certificate this cluster's previous users CA
/// issued once `cluster rotate-ca`'s overlap has ended (webpki would only say "unknown
/// issuer"): its record names the cluster, the DID it carries and that CA.
fn retired(
    p: &Presented,
    cluster: &str,
    trust: &UsersTrust,
    records: &Records,
    now: SystemTime,
) -> Result<(), Refused> {
    let Some(r) = records.get(&p.serial) else {
        return Ok(());
    };
    let ended = r
        .ca_sha256
        .as_deref()
        .and_then(|fp| trust.retired(fp))
        .filter(|until| now >= *until);
    match ended {
        Some(until) if r.cluster == cluster && r.did == p.common_name => {
            Err(Refused::Why(format!(
                "the client certificate {} was issued by cluster {cluster}'s previous users CA, \
                 retired at {} by `cluster rotate-ca`; download a new kubeconfig",
                p.serial,
                when(socialweb_broker_core::millis(until))
            )))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::certs::{Lifetime, issue, users_ca};
    use std::time::Duration;

    fn der(pem: &str) -> Vec<u8> {
        socialweb_wire::ca::certificates(pem.as_bytes()).unwrap()[0]
            .der
            .clone()
    }

    #[test]
    fn only_a_recorded_unrevoked_unexpired_certificate_of_this_clusters_ca_is_admitted() {
        let dir = std::env::temp_dir().join(format!("sw-admit-{}", std::process::id()));
        let ca1 = users_ca(&dir.join("c1"), "c1").unwrap();
        let ca2 = users_ca(&dir.join("c2"), "c2").unwrap();
        let ca1_der = der(ca1.ca_pem());
        let trust1 = UsersTrust {
            current: ca1_der.clone(),
            previous: None,
        };
        let now = SystemTime::now();
        let did = "did:key:zAlice";
        let good = issue(&ca1, did, Lifetime::For(Duration::from_secs(60)), now).unwrap();
        let other = issue(&ca2, did, Lifetime::Never, now).unwrap();
        let record = |i: &crate::access::certs::Issued, cluster: &str| CertRecord {
            serial: i.serial.clone(),
            cluster: cluster.into(),
            did: did.into(),
            not_after: i.not_after,
            created_at: 0,
            revoked_at: None,
            ca_sha256: Some(crate::access::certs::sha256_hex(&der(if cluster == "c1" {
                ca1.ca_pem()
            } else {
                ca2.ca_pem()
            }))),
        };
        let records = Records::new(vec![record(&good, "c1"), record(&other, "c2")]);
        let a = admit(&der(&good.cert_pem), "c1", &trust1, &records, now).unwrap();
        assert_eq!((a.cluster.as_str(), a.did.as_str()), ("c1", did));

        let e = admit(&der(&other.cert_pem), "c1", &trust1, &records, now).unwrap_err();
        assert!(e.contains("not issued by cluster c1's CA"), "{e}");
        let later = now + Duration::from_secs(120);
        let e = admit(&der(&good.cert_pem), "c1", &trust1, &records, later).unwrap_err();
        assert!(e.contains("expired"), "{e}");
        // The record of a certificate from an earlier CA of a cluster of the same name.
        let reborn = issue(&ca1, did, Lifetime::Never, now).unwrap();
        let mut r = record(&reborn, "c1");
        r.ca_sha256 = Some("00".repeat(32));
        records.insert(r);
        let e = admit(&der(&reborn.cert_pem), "c1", &trust1, &records, now).unwrap_err();
        assert!(e.contains("is not for cluster c1"), "{e}");
        let unrecorded = issue(&ca1, did, Lifetime::Never, now).unwrap();
        let e = admit(&der(&unrecorded.cert_pem), "c1", &trust1, &records, now).unwrap_err();
        assert!(e.contains("no record"), "{e}");
        let mut revoked = record(&good, "c1");
        revoked.revoked_at = Some(socialweb_broker_core::millis(now));
        records.revoked(revoked);
        let e = admit(&der(&good.cert_pem), "c1", &trust1, &records, now).unwrap_err();
        assert!(e.contains("revoked at"), "{e}");

        // c1's users CA rotated: what the old one issued is admitted until the overlap ends,
        // then refused naming the rotation; the new one's certificates are admitted.
        let ca3 = users_ca(&dir.join("c3"), "c1").unwrap();
        let until = now + Duration::from_secs(30);
        let rotated = UsersTrust {
            current: der(ca3.ca_pem()),
            previous: Some((ca1_der.clone(), until)),
        };
        let kept = issue(&ca1, did, Lifetime::Never, now).unwrap();
        records.insert(record(&kept, "c1"));
        let a = admit(&der(&kept.cert_pem), "c1", &rotated, &records, now).unwrap();
        assert_eq!(
            a.ca_sha256.as_deref(),
            Some(crate::access::certs::sha256_hex(&ca1_der).as_str())
        );
        let e = admit(&der(&kept.cert_pem), "c1", &rotated, &records, until).unwrap_err();
        assert!(e.contains("previous users CA, retired at"), "{e}");
        assert!(matches!(e, Refused::Why(_)));
        let fresh = issue(&ca3, did, Lifetime::Never, now).unwrap();
        let mut r = record(&fresh, "c1");
        r.ca_sha256 = Some(crate::access::certs::sha256_hex(&der(ca3.ca_pem())));
        records.insert(r);
        admit(&der(&fresh.cert_pem), "c1", &rotated, &records, until).unwrap();
        // The new CA's certificate is no good where only the old one is trusted.
        let e = admit(&der(&fresh.cert_pem), "c1", &trust1, &records, now).unwrap_err();
        assert!(
            e.contains("is not for cluster c1") || e.contains("not issued by"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
