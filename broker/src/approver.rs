//! The node certificate approver, in each cluster's life: it watches the cluster's
//! CertificateSigningRequests and approves or denies the node signers' requests by the
//! core's rules (`socialweb_broker_core::csr`) against the nodes the store has planned.
//! The controller-manager signs what is approved, for [`SIGNING_DURATION`], and kubelets
//! renew before it runs out (their renewals come here too).

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use socialweb_broker_core::csr::{Planned, Request, Verdict, judge};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::store::Store;

/// How long node certificates are signed for (the controller-manager's
/// `--cluster-signing-duration`): a node's credentials end within a day of its lease.
pub const SIGNING_DURATION: Duration = Duration::from_secs(24 * 3600);

/// What a CSR asks for, read from its PEM request and its spec.
pub fn request_of(csr: &CertificateSigningRequest) -> Result<Request> {
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    use x509_parser::prelude::FromDer;
    let spec = &csr.spec;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&spec.request.0)
        .map_err(|e| anyhow::anyhow!("the request is not PEM: {e}"))?;
    let (_, req) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
            .map_err(|e| anyhow::anyhow!("the request is not a PKCS#10 request: {e}"))?;
    let subject = &req.certification_request_info.subject;
    let text = |a: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        a.as_str().map(str::to_string).unwrap_or_default()
    };
    let mut r = Request {
        signer: spec.signer_name.clone(),
        username: spec.username.clone().unwrap_or_default(),
        groups: spec.groups.clone().unwrap_or_default(),
        usages: spec.usages.clone().unwrap_or_default(),
        common_name: subject
            .iter_common_name()
            .next()
            .map(text)
            .unwrap_or_default(),
        organizations: subject.iter_organization().map(text).collect(),
        ..Default::default()
    };
    for ext in req.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(d) => r.dns_names.push(d.to_string()),
                    GeneralName::IPAddress(b) => match b.len() {
                        4 => r.ip_addresses.push(IpAddr::from(<[u8; 4]>::try_from(*b)?)),
                        16 => r.ip_addresses.push(IpAddr::from(<[u8; 16]>::try_from(*b)?)),
                        _ => r.other_names = true,
                    },
                    _ => r.other_names = true,
                }
            }
        }
    }
    Ok(r)
}

/// Whether the CSR has been approved or denied already.
fn decided(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Approved" || c.type_ == "Denied")
        })
}

/// Where a bootstrap token's first use is claimed: the store (a broker's clusters), or
/// nowhere (the test harness's own control plane, whose tokens it makes itself).
pub type Uses<'a> = Option<(&'a Store, &'a str)>;

/// Why a bootstrap request for `plan` may not be approved, or `None`: the token's Secret is
/// the one made for it, with its secret, and this CSR is its first use (claimed in `uses`).
async fn first_use(
    client: &kube::Client,
    csr: &str,
    plan: &Plan,
    uses: Uses<'_>,
) -> Result<Option<String>> {
    let name = format!("bootstrap-token-{}", plan.token_id);
    let secret = Api::<Secret>::namespaced(client.clone(), "kube-system")
        .get_opt(&name)
        .await
        .with_context(|| format!("reading Secret kube-system/{name}"))?;
    let theirs = secret
        .as_ref()
        .and_then(|s| s.data.as_ref()?.get("token-secret"))
        .map(|b| b.0.as_slice());
    if plan.token_secret.is_some() && theirs != plan.token_secret.as_deref().map(str::as_bytes) {
        return Ok(Some(format!(
            "the Secret of the bootstrap token made for {} is gone or not the broker's",
            plan.node
        )));
    }
    let Some((store, cluster)) = uses else {
        return Ok(None);
    };
    let at = socialweb_broker_core::millis(std::time::SystemTime::now());
    Ok(store
        .claim_bootstrap(cluster, &plan.node, &plan.token_id, csr, at)
        .await?
        .map(|other| {
            format!(
                "the bootstrap token made for {} was used already (CSR {other}): a token \
                 joins one node, once",
                plan.node
            )
        }))
}

/// Approves or denies one CSR (nothing when it is decided or not a node signer's).
pub async fn decide(
    client: &kube::Client,
    csr: &CertificateSigningRequest,
    plans: &[Plan],
    uses: Uses<'_>,
) -> Result<()> {
    if decided(csr) {
        return Ok(());
    }
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let name = csr.metadata.name.clone().unwrap_or_default();
    let planned: Vec<Planned<'_>> = plans
        .iter()
        .map(|p| Planned {
            node: &p.node,
            token_id: &p.token_id,
            node_ip: p.node_ip,
        })
        .collect();
    let (kind, why) = match request_of(csr) {
        Ok(r) => match judge(&r, &planned) {
            Verdict::Approve(why) => ("Approved", why),
            Verdict::ApproveFirstUse(why) => {
                let node = r.common_name.trim_start_matches("system:node:");
                let plan = plans
                    .iter()
                    .find(|p| p.node == node)
                    .context("the verdict's node is planned")?;
                match first_use(client, &name, plan, uses).await? {
                    None => ("Approved", why),
                    Some(not) => ("Denied", not),
                }
            }
            Verdict::Deny(why) => ("Denied", why),
            Verdict::Ignore => return Ok(()),
        },
        Err(e) if csr.spec.signer_name.starts_with("kubernetes.io/kube") => {
            ("Denied", format!("{e:#}"))
        }
        Err(_) => return Ok(()),
    };
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": kind, "status": "True", "reason": "SocialwebBroker", "message": why,
        "lastUpdateTime": now, "lastTransitionTime": now,
    }]}});
    api.patch_approval(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("{kind} CSR {name}"))?;
    if kind == "Approved" {
        info!(csr = %name, "approved: {why}");
    } else {
        warn!(csr = %name, "denied: {why}");
    }
    Ok(())
}

/// A planned node, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub node: String,
    pub token_id: String,
    /// The secret of the token made for it: a bootstrap request is approved only while the
    /// token's Secret holds it (`None`: not checked, the harness's tokens).
    pub token_secret: Option<String>,
    pub node_ip: Option<IpAddr>,
}

/// Decides every pending CSR against `plans`, once (the test harness's own control plane).
pub async fn decide_pending(client: &kube::Client, plans: &[Plan]) -> Result<()> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    for csr in api.list(&Default::default()).await? {
        decide(client, &csr, plans, None).await?;
    }
    Ok(())
}

/// Watches `cluster`'s CSRs until `stop`, deciding each against the store's live provisions.
pub async fn run(client: kube::Client, cluster: String, store: Store, stop: CancellationToken) {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let events = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects();
    futures_util::pin_mut!(events);
    loop {
        let csr = tokio::select! {
            e = events.next() => match e {
                Some(Ok(c)) => c,
                Some(Err(e)) => { warn!(%cluster, "watching CSRs: {e}"); continue }
                None => return,
            },
            _ = stop.cancelled() => return,
        };
        let provisions = match store.provisions(Some(&cluster)).await {
            Ok(p) => p,
            Err(e) => {
                warn!(%cluster, "reading the provisions for a CSR: {e:#}");
                continue;
            }
        };
        let plans: Vec<Plan> = provisions
            .iter()
            .filter(|p| p.state.live())
            .map(|p| Plan {
                node: p.node.clone(),
                token_id: p.token_id.clone(),
                token_secret: Some(p.token_secret.clone()),
                node_ip: p.node_ip,
            })
            .collect();
        if let Err(e) = decide(&client, &csr, &plans, Some((&store, &cluster))).await {
            warn!(%cluster, "{e:#}");
        }
    }
}
