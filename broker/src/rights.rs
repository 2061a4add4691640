//! A tenant's rights in its cluster, kept by the broker (docs/security.md, "A tenant's
//! rights"): the ClusterRole the owners' group is bound to, made by the core
//! ([`socialweb_broker_core::rights`]) from what the apiserver serves (its aggregated
//! discovery) and which API groups are the tenant's (the APIServices not made at the
//! apiserver's start). Written at the start of every awake period, before the front serves a
//! request, and again within a second of an APIService's change (a CRD registers one): a
//! tenant's new kind is writable to it once its group is in the role.

use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::StreamExt;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use socialweb_broker_core::rights::{
    ApiServiceView, ROLE, Rule, Served, tenant_groups, tenant_rules,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The binding of the owners' group to cluster-admin that brokers before the role made
/// (`broker/deploy/access.yaml` then): removed at every start, since a binding's role cannot
/// be changed in place.
const LEGACY_BINDING: &str = "socialweb:cluster-owners";

/// How long the role waits for APIService changes to settle before it is written again.
const SETTLE: Duration = Duration::from_millis(200);
/// How often the role is made again with nothing seen changing (a watch that missed a change).
const EVERY: Duration = Duration::from_secs(300);

/// What the apiserver serves, from its aggregated discovery (`/api` and `/apis`).
async fn served(client: &kube::Client) -> Result<Vec<Served>> {
    let mut lists = vec![
        client
            .list_core_api_versions_aggregated()
            .await
            .context("reading the core group's discovery")?,
    ];
    lists.push(
        client
            .list_api_groups_aggregated()
            .await
            .context("reading the API groups' discovery")?,
    );
    let mut out: Vec<Served> = Vec::new();
    for group in lists.iter().flat_map(|l| &l.items) {
        let name = group
            .metadata
            .as_ref()
            .and_then(|m| m.name.clone())
            .unwrap_or_default();
        for r in group.versions.iter().flat_map(|v| &v.resources) {
            let Some(resource) = r.resource.clone() else {
                continue;
            };
            let subresources: Vec<String> = r
                .subresources
                .iter()
                .filter_map(|s| s.subresource.clone())
                .collect();
            let namespaced = r.scope.as_deref() == Some("Namespaced");
            match out
                .iter_mut()
                .find(|s| s.group == name && s.resource == resource)
            {
                Some(s) => {
                    for sub in subresources {
                        if !s.subresources.contains(&sub) {
                            s.subresources.push(sub);
                        }
                    }
                }
                None => out.push(Served {
                    group: name.clone(),
                    resource,
                    namespaced,
                    subresources,
                }),
            }
        }
    }
    Ok(out)
}

/// Every APIService, as the core reads them (listed in pages).
async fn apiservices(client: &kube::Client) -> Result<Vec<ApiServiceView>> {
    let api: Api<APIService> = Api::all(client.clone());
    let mut out = Vec::new();
    let mut lp = ListParams::default().limit(500);
    loop {
        let page = api.list(&lp).await.context("listing APIServices")?;
        out.extend(page.items.iter().map(|a| {
            ApiServiceView {
                name: a.metadata.name.clone().unwrap_or_default(),
                automanaged: a
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kube-aggregator.kubernetes.io/automanaged").cloned()),
            }
        }));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => return Ok(out),
        }
    }
}

/// The tenant's rules as the cluster serves now, and how many of the tenant's groups were
/// left out of them (past `MAX_TENANT_GROUPS`).
pub async fn desired(client: &kube::Client) -> Result<(Vec<Rule>, usize)> {
    let (tenant, left_out) = tenant_groups(&apiservices(client).await?);
    Ok((tenant_rules(&served(client).await?, &tenant), left_out))
}

fn policy_rule(r: &Rule) -> PolicyRule {
    let some = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
    PolicyRule {
        api_groups: if r.non_resource_urls.is_empty() {
            Some(r.api_groups.clone())
        } else {
            None
        },
        resources: some(&r.resources),
        verbs: r.verbs.clone(),
        non_resource_urls: some(&r.non_resource_urls),
        resource_names: None,
    }
}

/// Writes the role (server-side apply, the broker's field manager, forced).
pub async fn apply(client: &kube::Client, rules: &[Rule]) -> Result<()> {
    let role = ClusterRole {
        metadata: kube::api::ObjectMeta {
            name: Some(ROLE.to_string()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "socialweb".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        rules: Some(rules.iter().map(policy_rule).collect()),
        aggregation_rule: None,
    };
    let mut value = serde_json::to_value(&role)?;
    value["apiVersion"] = "rbac.authorization.k8s.io/v1".into();
    value["kind"] = "ClusterRole".into();
    Api::<ClusterRole>::all(client.clone())
        .patch(
            ROLE,
            &PatchParams::apply("socialweb-broker").force(),
            &Patch::Apply(&value),
        )
        .await
        .with_context(|| format!("writing the ClusterRole {ROLE}"))?;
    Ok(())
}

/// Removes an older broker's binding of the owners to cluster-admin (gone already is fine).
async fn forget_cluster_admin(client: &kube::Client) -> Result<()> {
    match Api::<ClusterRoleBinding>::all(client.clone())
        .delete(LEGACY_BINDING, &DeleteParams::default())
        .await
    {
        Ok(_) => {
            info!("the owners' binding to cluster-admin removed: they hold {ROLE} now");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("deleting ClusterRoleBinding {LEGACY_BINDING}")),
    }
}

/// Makes and writes the role once, and again whenever it changes, until `stop`. The first
/// writing is done when this returns (or has failed, said in the log and retried).
pub async fn keep(client: kube::Client, cluster: String, stop: CancellationToken) {
    if let Err(e) = forget_cluster_admin(&client).await {
        warn!(%cluster, "{e:#}");
    }
    let mut written = once(&client, &cluster, None).await;
    tokio::spawn(async move {
        let changes = watcher(
            Api::<APIService>::all(client.clone()),
            watcher::Config::default(),
        );
        futures_util::pin_mut!(changes);
        loop {
            tokio::select! {
                e = changes.next() => match e {
                    None => return,
                    Some(Err(e)) => {
                        warn!(%cluster, "watching APIServices: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                    // A relist, or a change: whatever follows within SETTLE of the last
                    // one is taken in the same look.
                    Some(Ok(_)) => loop {
                        tokio::select! {
                            e = changes.next() => if e.is_none() { return },
                            _ = tokio::time::sleep(SETTLE) => break,
                            _ = stop.cancelled() => return,
                        }
                    },
                },
                _ = tokio::time::sleep(EVERY) => {}
                _ = stop.cancelled() => return,
            }
            written = once(&client, &cluster, written).await;
        }
    });
}

/// Makes the role and writes it when it is not `written`; what is written now.
async fn once(
    client: &kube::Client,
    cluster: &str,
    written: Option<Vec<Rule>>,
) -> Option<Vec<Rule>> {
    let (rules, left_out) = match desired(client).await {
        Ok(d) => d,
        Err(e) => {
            warn!(%cluster, "making the tenant's role: {e:#}");
            return written;
        }
    };
    if written.as_ref() == Some(&rules) {
        return written;
    }
    if left_out > 0 {
        warn!(%cluster, left_out, "the tenant has more API groups than its role lists; the rest are not its to write");
    }
    match apply(client, &rules).await {
        Ok(()) => {
            info!(%cluster, rules = rules.len(), "the tenant's role written");
            Some(rules)
        }
        Err(e) => {
            warn!(%cluster, "{e:#}");
            written
        }
    }
}
