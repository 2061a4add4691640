//! The gateway API's methods, on the daemon's cluster code. Inputs are strict (an unknown
//! field is an error that names it); a cluster of another DID is answered as not found.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiError;
use crate::access::certs::{self, Lifetime};
use crate::access::{kubeconfig, names};
use crate::daemon::{ClusterInfo, Daemon, valid_cluster_name};
use crate::store::CertRecord;

fn parse<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ApiError> {
    serde_json::from_value(v).map_err(|e| ApiError::invalid(e.to_string()))
}

/// What a user sees of a cluster.
fn view(d: &Daemon, owner: &str, c: &ClusterInfo) -> Value {
    let mut v = serde_json::to_value(&c.state).unwrap_or_default();
    v["name"] = c.name.clone().into();
    v["accountHash"] = names::account_hash(owner).into();
    v["mountPath"] = names::mount_path(owner, &c.name).into();
    v["server"] = server(d, owner, &c.name).into();
    v["nodes"] = c.nodes.into();
    v
}

fn server(d: &Daemon, owner: &str, cluster: &str) -> String {
    format!(
        "{}{}",
        d.front().public_url,
        names::mount_prefix(owner, cluster)
    )
}

/// The caller's cluster `name`, or not found.
async fn owned(d: &Daemon, did: &str, name: &str) -> Result<(), ApiError> {
    match d.store().cluster(name).await.map_err(ApiError::internal)? {
        Some(c) if c.owner.as_deref() == Some(did) => Ok(()),
        _ => Err(ApiError::not_found(format!(
            "name: you have no cluster {name:?}"
        ))),
    }
}

pub fn describe_server(d: &Daemon) -> Value {
    json!({
        "did": d.config().service_did(),
        "url": d.front().public_url,
        "methods": super::METHODS.iter().map(|(m, _)| *m).collect::<Vec<_>>(),
        "certificateLifetimeSeconds": {"min": certs::MIN_LIFETIME.as_secs(),
                                       "max": certs::MAX_LIFETIME.as_secs(),
                                       "default": certs::DEFAULT_LIFETIME.as_secs()},
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateCluster {
    name: String,
    /// Answer once the cluster is ready, or after this many seconds (at most 300).
    #[serde(default)]
    wait_seconds: u64,
}

pub async fn create_cluster(d: &Arc<Daemon>, did: &str, input: Value) -> Result<Value, ApiError> {
    let i: CreateCluster = parse(input)?;
    valid_cluster_name(&i.name).map_err(|e| ApiError::invalid(format!("name: {e}")))?;
    if i.wait_seconds > 300 {
        return Err(ApiError::invalid(format!(
            "waitSeconds: {} is over 300",
            i.wait_seconds
        )));
    }
    if let Some(c) = d
        .store()
        .cluster(&i.name)
        .await
        .map_err(ApiError::internal)?
    {
        return Err(ApiError::conflict(if c.owner.as_deref() == Some(did) {
            format!("name: you have a cluster {:?} already", i.name)
        } else {
            format!(
                "name: the cluster name {:?} is taken; choose another",
                i.name
            )
        }));
    }
    let mine = d
        .store()
        .clusters()
        .await
        .map_err(ApiError::internal)?
        .iter()
        .filter(|c| c.owner.as_deref() == Some(did))
        .count();
    let max = d.config().front.max_clusters_per_did as usize;
    if mine >= max {
        return Err(ApiError::conflict(format!(
            "you have {mine} clusters, the most this broker allows one DID; delete one first"
        )));
    }
    let info = d
        .create_cluster(&i.name, Some(did), Duration::from_secs(i.wait_seconds))
        .await
        .map_err(ApiError::internal)?;
    Ok(view(d, did, &info))
}

pub async fn list_clusters(d: &Arc<Daemon>, did: &str) -> Result<Value, ApiError> {
    let mut out = Vec::new();
    for c in d.store().clusters().await.map_err(ApiError::internal)? {
        if c.owner.as_deref() == Some(did) {
            let info = d.info(&c.name).await.map_err(ApiError::internal)?;
            out.push(view(d, did, &info));
        }
    }
    Ok(json!({"clusters": out}))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Named {
    name: String,
}

pub async fn delete_cluster(d: &Arc<Daemon>, did: &str, input: Value) -> Result<Value, ApiError> {
    let i: Named = parse(input)?;
    owned(d, did, &i.name).await?;
    d.delete_cluster(&i.name)
        .await
        .map_err(ApiError::internal)?;
    Ok(json!({"deleted": i.name}))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GetKubeconfig {
    name: String,
    lifetime_seconds: Option<u64>,
    #[serde(default)]
    no_expiry: bool,
}

fn rfc3339(ms: Option<i64>) -> Value {
    ms.map(|m| {
        humantime::format_rfc3339_seconds(crate::store::from_millis(m))
            .to_string()
            .into()
    })
    .unwrap_or(Value::Null)
}

pub async fn get_kubeconfig(d: &Arc<Daemon>, did: &str, input: Value) -> Result<Value, ApiError> {
    let i: GetKubeconfig = parse(input)?;
    let lifetime = Lifetime::from_request(i.lifetime_seconds, i.no_expiry)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    owned(d, did, &i.name).await?;
    let ca = d.users_ca(&i.name).map_err(ApiError::internal)?;
    let now = SystemTime::now();
    let issued = certs::issue(&ca, did, lifetime, now).map_err(ApiError::internal)?;
    let record = CertRecord {
        serial: issued.serial.clone(),
        cluster: i.name.clone(),
        did: did.to_string(),
        not_after: issued.not_after,
        created_at: crate::store::millis(now),
        revoked_at: None,
    };
    // Recorded before it is handed out: a certificate the store does not know is never
    // admitted, so a crash here loses nothing but this answer.
    d.store()
        .insert_certificate(&record)
        .await
        .map_err(ApiError::internal)?;
    d.front().records.insert(record);
    let server = server(d, did, &i.name);
    let kc = kubeconfig::render(&i.name, &server, d.front().ca_pem.as_deref(), &issued);
    Ok(json!({
        "kubeconfig": kc,
        "serial": issued.serial,
        "notAfter": rfc3339(issued.not_after),
        "server": server,
        "accountHash": names::account_hash(did),
        "mountPath": names::mount_path(did, &i.name),
    }))
}

fn cert_view(c: &CertRecord) -> Value {
    json!({
        "serial": c.serial, "cluster": c.cluster, "did": c.did,
        "notAfter": rfc3339(c.not_after), "createdAt": rfc3339(Some(c.created_at)),
        "revokedAt": rfc3339(c.revoked_at),
    })
}

pub fn list_certificates(
    d: &Arc<Daemon>,
    did: &str,
    cluster: Option<&String>,
) -> Result<Value, ApiError> {
    let certs: Vec<Value> = d
        .front()
        .records
        .of(did, cluster.map(String::as_str))
        .iter()
        .map(cert_view)
        .collect();
    Ok(json!({"certificates": certs}))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Revoke {
    serial: String,
}

pub async fn revoke_certificate(
    d: &Arc<Daemon>,
    did: &str,
    input: Value,
) -> Result<Value, ApiError> {
    let i: Revoke = parse(input)?;
    let serial = i.serial.trim().to_ascii_lowercase().replace(':', "");
    match d.front().records.get(&serial) {
        Some(r) if r.did == did => {}
        _ => {
            return Err(ApiError::not_found(format!(
                "serial: you have no certificate {serial}"
            )));
        }
    }
    let now = crate::store::millis(SystemTime::now());
    let r = d
        .store()
        .revoke_certificate(&serial, now)
        .await
        .map_err(ApiError::internal)?
        .ok_or_else(|| ApiError::not_found(format!("serial: no certificate {serial}")))?;
    d.front().records.revoked(r.clone());
    Ok(cert_view(&r))
}
