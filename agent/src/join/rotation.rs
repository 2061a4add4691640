//! Following a rotation of the cluster's CA (`socialweb-broker cluster rotate-ca`,
//! docs/operations.md "Rotating a cluster's CAs"). The broker publishes in
//! `kube-public/cluster-info` the CAs a node must trust, the one that signs now first. A node
//! adopts that bundle (read over TLS its current trust verified: the apiserver's certificate
//! chains to the old CA too while nodes move), has its kubelet's client and serving
//! certificates issued again by the signer, and then says so on its Node
//! ([`CLUSTER_CA_ANNOTATION`]): the broker retires the old CA once every Node does.
//!
//! Pure: what to do next, from what is published and what the node holds; the bring-up's
//! `ca` task carries it out.

use k8s_openapi::api::core::v1::ConfigMap;
pub use socialweb_wire::ca::CLUSTER_CA_ANNOTATION;
use socialweb_wire::ca::{PinnedCert, certificates, issued_by};

/// The CAs `cluster-info` publishes, the signer first. An error names what is missing.
pub fn published(cm: &ConfigMap) -> Result<Vec<PinnedCert>, String> {
    let kubeconfig = cm
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig"))
        .ok_or("cluster-info has no kubeconfig")?;
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig)
        .map_err(|e| format!("cluster-info kubeconfig: {e}"))?;
    let data = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.certificate_authority_data.clone())
        .ok_or("cluster-info kubeconfig has no certificate-authority-data")?;
    use base64::Engine;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| format!("cluster-info certificate-authority-data: {e}"))?;
    certificates(&pem).map_err(|e| format!("cluster-info CA: {e}"))
}

/// What the node holds: the CAs it trusts (`ca.crt`) and its kubelet's certificates (DER),
/// where the kubelet has them yet.
#[derive(Debug, Clone, Default)]
pub struct Held {
    pub trusted: Vec<PinnedCert>,
    pub client: Option<Vec<u8>>,
    pub serving: Option<Vec<u8>>,
}

/// The next step towards what is published; one at a time, in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Trust exactly the published CAs (`ca.crt`, the kubelet's kubeconfig), then restart
    /// the kubelet and kube-proxy so they read it.
    Adopt(String),
    /// A client certificate from the signer: a CSR as the node itself.
    RenewClient,
    /// A serving certificate from the signer: the kubelet asks for one when it has none.
    RenewServing,
    /// Nothing left: the Node says it trusts and holds the signer's certificates (the pin,
    /// `sha256:<hex>`).
    Moved(String),
}

/// What to do next, or `None` while the kubelet has no client certificate yet (it is still
/// joining, with the published CA: nothing to follow).
pub fn next(published: &[PinnedCert], held: &Held) -> Option<Step> {
    let signer = published.first()?;
    let client = held.client.as_ref()?;
    let pins = |c: &[PinnedCert]| {
        let mut p: Vec<[u8; 32]> = c.iter().map(|c| c.pin).collect();
        p.sort();
        p
    };
    if pins(published) != pins(&held.trusted) {
        return Some(Step::Adopt(published.iter().map(PinnedCert::pem).collect()));
    }
    if !issued_by(client, signer) {
        return Some(Step::RenewClient);
    }
    if held.serving.as_ref().is_some_and(|s| !issued_by(s, signer)) {
        return Some(Step::RenewServing);
    }
    Some(Step::Moved(socialweb_wire::CaTrust::pin_text(&signer.pin)))
}

/// `kubeconfig` (the kubelet's) with `pem` as every cluster's CA.
pub fn with_ca(mut kubeconfig: serde_json::Value, pem: &str) -> serde_json::Value {
    use base64::Engine;
    let data = base64::engine::general_purpose::STANDARD.encode(pem);
    if let Some(clusters) = kubeconfig["clusters"].as_array_mut() {
        for c in clusters {
            if let Some(cluster) = c["cluster"].as_object_mut() {
                cluster.remove("certificate-authority");
                cluster.insert("certificate-authority-data".into(), data.clone().into());
            }
        }
    }
    kubeconfig
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Ca {
        issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
        cert: PinnedCert,
    }

    fn ca() -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "kubernetes");
        let cert = p.self_signed(&key).unwrap();
        Ca {
            issuer: rcgen::Issuer::new(p, key),
            cert: certificates(cert.pem().as_bytes()).unwrap().remove(0),
        }
    }

    fn leaf(by: &Ca) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let p = rcgen::CertificateParams::new(vec!["n".to_string()]).unwrap();
        p.signed_by(&key, &by.issuer).unwrap().der().to_vec()
    }

    /// A rotation as a node lives it: the bundle adopted, the client then the serving
    /// certificate renewed, moved; then the old CA dropped from the bundle, adopted again.
    #[test]
    fn a_node_adopts_the_bundle_then_renews_then_says_it_moved() {
        let (old, new) = (ca(), ca());
        let mut held = Held {
            trusted: vec![old.cert.clone()],
            client: Some(leaf(&old)),
            serving: Some(leaf(&old)),
        };
        let before = [old.cert.clone()];
        let pin = |c: &Ca| socialweb_wire::CaTrust::pin_text(&c.cert.pin);
        assert_eq!(next(&before, &held), Some(Step::Moved(pin(&old))));
        let both = [new.cert.clone(), old.cert.clone()];
        let bundle = format!("{}{}", new.cert.pem(), old.cert.pem());
        assert_eq!(next(&both, &held), Some(Step::Adopt(bundle)));
        held.trusted = vec![old.cert.clone(), new.cert.clone()];
        assert_eq!(next(&both, &held), Some(Step::RenewClient));
        held.client = Some(leaf(&new));
        assert_eq!(next(&both, &held), Some(Step::RenewServing));
        held.serving = None;
        assert_eq!(
            next(&both, &held),
            Some(Step::Moved(pin(&new))),
            "asked for"
        );
        held.serving = Some(leaf(&new));
        assert_eq!(next(&both, &held), Some(Step::Moved(pin(&new))));
        let after = [new.cert.clone()];
        assert_eq!(next(&after, &held), Some(Step::Adopt(new.cert.pem())));
        held.trusted = vec![new.cert.clone()];
        assert_eq!(next(&after, &held), Some(Step::Moved(pin(&new))));
    }

    #[test]
    fn nothing_to_follow_before_the_kubelet_has_a_client_certificate() {
        let old = ca();
        let held = Held {
            trusted: vec![],
            client: None,
            serving: None,
        };
        assert_eq!(next(std::slice::from_ref(&old.cert), &held), None);
        assert_eq!(next(&[], &held), None);
    }

    #[test]
    fn the_kubeconfig_gets_the_bundle_as_data() {
        let kc = serde_json::json!({"clusters": [{"name": "c", "cluster": {
            "server": "https://x", "certificate-authority": "/old/ca.crt"}}]});
        let kc = with_ca(kc, "PEM");
        let c = &kc["clusters"][0]["cluster"];
        assert_eq!(c["certificate-authority-data"], "UEVN");
        assert!(c.get("certificate-authority").is_none());
        assert_eq!(c["server"], "https://x");
    }
}
