//! Whether a client certificate may reach a cluster: issued by that cluster's users CA, not
//! expired, and recorded, unrevoked, for that cluster and the DID it names. Each refusal
//! says which of these failed.

use std::time::SystemTime;

use rustls::pki_types::{CertificateDer, UnixTime};

use crate::access::certs::hex;
use crate::access::records::Records;
use socialweb_broker_core::CertRecord;

/// A certificate admitted to a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    pub cluster: String,
    pub serial: String,
    pub did: String,
    /// Unix milliseconds; `None`: no expiry.
    pub not_after: Option<i64>,
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

/// Checks `leaf` for `cluster`, whose users CA is `ca_der`.
pub fn admit(
    leaf: &[u8],
    cluster: &str,
    ca_der: &[u8],
    records: &Records,
    now: SystemTime,
) -> Result<Admitted, String> {
    let p = read(leaf)?;
    let ca = CertificateDer::from(ca_der.to_vec());
    let anchor = webpki::anchor_from_trusted_cert(&ca)
        .map_err(|e| format!("cluster {cluster}'s users CA is unreadable: {e}"))?;
    let leaf_der = CertificateDer::from(leaf.to_vec());
    let ee = webpki::EndEntityCert::try_from(&leaf_der)
        .map_err(|e| format!("the client certificate is unreadable: {e}"))?;
    let t = UnixTime::since_unix_epoch(
        now.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    );
    ee.verify_for_usage(
        webpki::ALL_VERIFICATION_ALGS,
        &[anchor],
        &[],
        t,
        webpki::KeyUsage::client_auth(),
        None,
        None,
    )
    .map_err(|e| match e {
        webpki::Error::CertExpired { .. } => format!(
            "the client certificate {} has expired; download a new kubeconfig",
            p.serial
        ),
        webpki::Error::CertNotValidYet { .. } => format!(
            "the client certificate {} is not valid yet (check this machine's clock)",
            p.serial
        ),
        webpki::Error::UnknownIssuer
        | webpki::Error::InvalidSignatureForPublicKey
        | webpki::Error::UnsupportedSignatureAlgorithmForPublicKeyContext(_) => format!(
            "the client certificate {} was not issued by cluster {cluster}'s CA",
            p.serial
        ),
        other => format!("the client certificate {} is refused: {other}", p.serial),
    })?;
    let r = records.get(&p.serial).ok_or_else(|| {
        format!(
            "the client certificate {} has no record at this broker (its cluster was deleted?)",
            p.serial
        )
    })?;
    if r.cluster != cluster || r.did != p.common_name {
        return Err(format!(
            "the client certificate {} is not for cluster {cluster}",
            p.serial
        ));
    }
    still_good(&r, now)?;
    Ok(Admitted {
        cluster: cluster.to_string(),
        serial: r.serial,
        did: r.did,
        not_after: r.not_after,
    })
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
        };
        let records = Records::new(vec![record(&good, "c1"), record(&other, "c2")]);
        let a = admit(&der(&good.cert_pem), "c1", &ca1_der, &records, now).unwrap();
        assert_eq!((a.cluster.as_str(), a.did.as_str()), ("c1", did));

        let e = admit(&der(&other.cert_pem), "c1", &ca1_der, &records, now).unwrap_err();
        assert!(e.contains("not issued by cluster c1's CA"), "{e}");
        let later = now + Duration::from_secs(120);
        let e = admit(&der(&good.cert_pem), "c1", &ca1_der, &records, later).unwrap_err();
        assert!(e.contains("expired"), "{e}");
        let unrecorded = issue(&ca1, did, Lifetime::Never, now).unwrap();
        let e = admit(&der(&unrecorded.cert_pem), "c1", &ca1_der, &records, now).unwrap_err();
        assert!(e.contains("no record"), "{e}");
        let mut revoked = record(&good, "c1");
        revoked.revoked_at = Some(socialweb_broker_core::millis(now));
        records.revoked(revoked);
        let e = admit(&der(&good.cert_pem), "c1", &ca1_der, &records, now).unwrap_err();
        assert!(e.contains("revoked at"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
