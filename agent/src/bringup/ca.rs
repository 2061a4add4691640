//! The node's side of a CA rotation: every few seconds, `kube-public/cluster-info` read (as
//! the join reads it: anonymously, verified by the CAs the node trusts), and the next step [`crate::join::rotation::next`] names carried
//! out -- the bundle adopted (and the kubelet and kube-proxy restarted to read it), the
//! kubelet's certificates issued again by the signer, the Node annotated.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Ctx;
use super::join::CHILD_GRACE;
use crate::join::rotation::{self, CLUSTER_CA_ANNOTATION, Held, Step};
use crate::join::{Machine, write_file};

/// How often the published CAs are looked at while nothing is to be done.
const EVERY: Duration = Duration::from_secs(5);
/// How long a CSR may wait for the broker's approval and the controller-manager's signature.
const ISSUED_WITHIN: Duration = Duration::from_secs(120);

/// Follows the published CAs until `stop`.
pub async fn follow(cx: Arc<Ctx>, client: kube::Client, stop: CancellationToken) {
    let mut said: Option<String> = None;
    let mut reader = Reader::default();
    // A failure is said when it changes, not every few seconds (a cluster whose
    // `cluster-info` is not public has nothing to follow).
    let mut failing: Option<String> = None;
    loop {
        let delay = match step(&cx, &client, &mut reader, &mut said).await {
            Ok(s) => {
                failing = None;
                match s {
                    Some(Step::Moved(_)) | None => EVERY,
                    Some(_) => Duration::from_millis(500),
                }
            }
            Err(e) => {
                let e = format!("{e:#}");
                if failing.as_ref() != Some(&e) {
                    warn!("following the cluster's CA: {e} (said again when it changes)");
                    failing = Some(e);
                }
                EVERY
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// The anonymous client `cluster-info` is read with, kept while the node trusts the same CAs
/// (one connection kept open, not a handshake every look).
#[derive(Default)]
struct Reader {
    trusting: Vec<[u8; 32]>,
    client: Option<kube::Client>,
}

impl Reader {
    fn for_trust(&mut self, cx: &Ctx, held: &Held) -> Result<kube::Client> {
        let pins: Vec<[u8; 32]> = held.trusted.iter().map(|c| c.pin).collect();
        if self.trusting != pins || self.client.is_none() {
            let c = crate::join::trust::anonymous_client(&cx.id.server_url, &held.trusted)?;
            (self.trusting, self.client) = (pins, Some(c));
        }
        Ok(self.client.clone().expect("made above"))
    }
}

/// One look, and the step it calls for carried out.
async fn step(
    cx: &Ctx,
    client: &kube::Client,
    reader: &mut Reader,
    said: &mut Option<String>,
) -> Result<Option<Step>> {
    let m = &cx.config.machine;
    let held = held(m)?;
    let anonymous = reader.for_trust(cx, &held)?;
    let published = crate::join::trust::published_cas(&cx.id.server_url, &anonymous)
        .await
        .context("reading kube-public/cluster-info")?;
    let Some(step) = rotation::next(&published, &held) else {
        return Ok(None);
    };
    match &step {
        Step::Adopt(pem) => {
            info!(
                "the cluster publishes new CAs; trusting them and restarting the kubelet and kube-proxy"
            );
            adopt(m, pem)?;
            restart(cx, &["kubelet", "kube-proxy"]).await?;
        }
        Step::RenewClient => {
            info!("the kubelet's client certificate is the old CA's; asking the signer for one");
            renew_client(cx, client).await?;
            restart(cx, &["kubelet", "kube-proxy"]).await?;
        }
        Step::RenewServing => {
            info!(
                "the kubelet's serving certificate is the old CA's; the kubelet asks for another"
            );
            socialweb_proc::gone::file(&m.kubelet_cert_dir().join("kubelet-server-current.pem"))?;
            restart(cx, &["kubelet"]).await?;
        }
        Step::Moved(pin) if said.as_deref() != Some(pin) => {
            annotate(client, &cx.id.node, pin).await?;
            info!(ca = %pin, "the node trusts the cluster's signing CA and holds its certificates");
            *said = Some(pin.clone());
        }
        Step::Moved(_) => {}
    }
    Ok(Some(step))
}

/// What the node holds now.
fn held(m: &Machine) -> Result<Held> {
    let ca =
        std::fs::read(m.ca_file()).with_context(|| format!("reading {}", m.ca_file().display()))?;
    let trusted = socialweb_wire::ca::certificates(&ca)
        .map_err(|e| anyhow!("{}: {e}", m.ca_file().display()))?;
    let first = |name: &str| -> Option<Vec<u8>> {
        let pem = std::fs::read(m.kubelet_cert_dir().join(name)).ok()?;
        socialweb_wire::ca::certificates(&pem)
            .ok()
            .map(|mut c| c.remove(0).der)
    };
    Ok(Held {
        trusted,
        client: first("kubelet-client-current.pem"),
        serving: first("kubelet-server-current.pem"),
    })
}

/// `pem` as the CAs the node trusts: `ca.crt` (the kubelet's client CA) and the kubelet's
/// kubeconfig (which the agent's client follows, and kube-proxy uses).
fn adopt(m: &Machine, pem: &str) -> Result<()> {
    write_file(&m.ca_file(), pem.as_bytes(), 0o644)?;
    let path = m.kubelet_kubeconfig();
    let kc = kube::config::Kubeconfig::read_from(&path)
        .with_context(|| format!("reading {}", path.display()))?;
    let kc = rotation::with_ca(serde_json::to_value(kc)?, pem);
    crate::join::write_json(&path, &kc, 0o600)
}

async fn restart(cx: &Ctx, names: &[&str]) -> Result<()> {
    for name in names {
        cx.children.restart(name, CHILD_GRACE).await?;
    }
    Ok(())
}

/// A new client certificate for the kubelet, as the kubelet's own renewal gets one: a CSR
/// made by the node with its current certificate (the broker approves a node's renewal for
/// itself, `broker-core::csr`), written where the kubelet reads it at its start.
async fn renew_client(cx: &Ctx, client: &kube::Client) -> Result<()> {
    let node = &cx.id.node;
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    let request = params.serialize_request(&key)?.pem()?;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let name = format!("{node}-ca-{}", stamp.as_secs());
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.into_bytes()),
            signer_name: "kubernetes.io/kube-apiserver-client-kubelet".into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            ..Default::default()
        },
        status: None,
    };
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    api.create(&PostParams::default(), &csr)
        .await
        .with_context(|| format!("creating CertificateSigningRequest {name}"))?;
    let cert = issued(&api, &name).await?;
    let dir = cx.config.machine.kubelet_cert_dir();
    let file = dir.join(format!("kubelet-client-ca-{}.pem", stamp.as_secs()));
    let both = format!("{}{}", String::from_utf8_lossy(&cert), key.serialize_pem());
    write_file(&file, both.as_bytes(), 0o600)?;
    relink(&file, &dir.join("kubelet-client-current.pem"))
}

/// The certificate issued for CSR `name`; an error if it is denied or takes too long.
async fn issued(api: &Api<CertificateSigningRequest>, name: &str) -> Result<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + ISSUED_WITHIN;
    loop {
        let csr = api.get(name).await?;
        let status = csr.status.unwrap_or_default();
        if let Some(c) = status.certificate.filter(|c| !c.0.is_empty()) {
            return Ok(c.0);
        }
        if let Some(c) = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Denied" || c.type_ == "Failed")
        {
            bail!(
                "CertificateSigningRequest {name} {}: {}",
                c.type_,
                c.message.unwrap_or_default()
            );
        }
        if tokio::time::Instant::now() > deadline {
            bail!("CertificateSigningRequest {name} not issued within {ISSUED_WITHIN:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Points the symlink `link` at `target`, replacing it in one rename (as the kubelet does).
fn relink(target: &Path, link: &Path) -> Result<()> {
    let tmp: PathBuf = link.with_extension("pem.new");
    socialweb_proc::gone::file(&tmp)?;
    std::os::unix::fs::symlink(target, &tmp)
        .with_context(|| format!("linking {}", tmp.display()))?;
    std::fs::rename(&tmp, link).with_context(|| format!("replacing {}", link.display()))
}

async fn annotate(client: &kube::Client, node: &str, pin: &str) -> Result<()> {
    let patch = serde_json::json!({"metadata": {"annotations": {CLUSTER_CA_ANNOTATION: pin}}});
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating Node {node} with {CLUSTER_CA_ANNOTATION}"))?;
    Ok(())
}
