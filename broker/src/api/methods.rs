//! The gateway API's methods: each method's input (strict: an unknown field is an error that
//! names it) becomes a [`Command`], and each [`Reply`] the method's JSON view. A cluster of
//! another DID is answered as not found (by the services).

use serde::Deserialize;
use serde_json::{Value, json};
use socialweb_broker_core::names::{account_hash, mount_path};
use socialweb_broker_core::{CertRecord, from_millis};

use super::{
    ApiError, CREATE_CLUSTER, DELETE_CLUSTER, GET_KUBECONFIG, Gateway, REVOKE_CERTIFICATE,
};
use crate::access::certs;
use crate::command::{ClusterInfo, Command, IssuedKubeconfig, Reply};

fn parse<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ApiError> {
    serde_json::from_value(v).map_err(|e| ApiError::invalid(e.to_string()))
}

pub fn describe_server(g: &Gateway) -> Value {
    json!({
        "did": g.service_did,
        "url": g.public_url,
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
    /// An invite code, when registration is by invite.
    #[serde(default)]
    invite: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Named {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GetKubeconfig {
    name: String,
    lifetime_seconds: Option<u64>,
    #[serde(default)]
    no_expiry: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Revoke {
    serial: String,
}

/// The command a procedure's input asks for.
pub fn command(method: &str, input: Value) -> Result<Command, ApiError> {
    Ok(match method {
        CREATE_CLUSTER => {
            let i: CreateCluster = parse(input)?;
            Command::CreateCluster {
                name: i.name,
                owner: None,
                wait_secs: i.wait_seconds,
                invite: i.invite,
                hibernate_after_secs: None,
                datastore: None,
            }
        }
        DELETE_CLUSTER => Command::DeleteCluster {
            name: parse::<Named>(input)?.name,
        },
        GET_KUBECONFIG => {
            let i: GetKubeconfig = parse(input)?;
            Command::GetKubeconfig {
                name: i.name,
                lifetime_seconds: i.lifetime_seconds,
                no_expiry: i.no_expiry,
            }
        }
        REVOKE_CERTIFICATE => Command::RevokeCertificate {
            serial: parse::<Revoke>(input)?.serial,
        },
        other => unreachable!("{other} is a query, dispatched before"),
    })
}

/// What a user sees of a cluster.
fn view(g: &Gateway, owner: &str, c: &ClusterInfo) -> Value {
    let mut v = serde_json::to_value(&c.state).unwrap_or_default();
    v["name"] = c.name.clone().into();
    v["accountHash"] = account_hash(owner).into();
    v["mountPath"] = mount_path(owner, &c.name).into();
    v["server"] = g.services.access.server(owner, &c.name).into();
    v["nodes"] = c.nodes.into();
    v
}

fn rfc3339(ms: Option<i64>) -> Value {
    ms.map(|m| {
        humantime::format_rfc3339_seconds(from_millis(m))
            .to_string()
            .into()
    })
    .unwrap_or(Value::Null)
}

fn cert_view(c: &CertRecord) -> Value {
    json!({
        "serial": c.serial, "cluster": c.cluster, "did": c.did,
        "notAfter": rfc3339(c.not_after), "createdAt": rfc3339(Some(c.created_at)),
        "revokedAt": rfc3339(c.revoked_at),
    })
}

fn kubeconfig_view(k: &IssuedKubeconfig) -> Value {
    json!({
        "kubeconfig": k.kubeconfig,
        "serial": k.serial,
        "notAfter": rfc3339(k.not_after),
        "server": k.server,
        "accountHash": k.account_hash,
        "mountPath": k.mount_path,
    })
}

/// The method's answer for `did`.
pub fn answer(g: &Gateway, did: &str, reply: Reply) -> Value {
    match reply {
        Reply::Cluster(c) => view(g, did, &c),
        Reply::Clusters(cs) => {
            json!({"clusters": cs.iter().map(|c| view(g, did, c)).collect::<Vec<_>>()})
        }
        Reply::Deleted { deleted } => json!({"deleted": deleted}),
        Reply::Kubeconfig(k) => kubeconfig_view(&k),
        Reply::Certificates(cs) => {
            json!({"certificates": cs.iter().map(cert_view).collect::<Vec<_>>()})
        }
        Reply::Certificate(c) => cert_view(&c),
        // The services refuse these to users.
        Reply::Detail(_)
        | Reply::Leases(_)
        | Reply::Invite(_)
        | Reply::Invites(_)
        | Reply::InviteRevoked(_)
        | Reply::Rotated(_)
        | Reply::Drain { .. } => json!({}),
    }
}
