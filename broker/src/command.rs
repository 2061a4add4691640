//! The command vocabulary both front doors speak: the operator's control socket ([`crate::ctl`])
//! and the users' gateway API ([`crate::api`]) turn what they receive into a [`Command`] from
//! a [`Caller`], [`crate::services`] executes it with the same rules whichever door it came
//! through, and the answer is a typed [`Reply`] (the CLI prints from these types; the API
//! shapes them into its JSON views). Nothing here knows how a command is carried out.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use socialweb_broker_core::{CertRecord, DecisionRow, Provision};
use socialweb_market::Lease;

/// Who asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Caller {
    /// The operator, at the control socket (root or the broker's own user).
    Operator,
    /// A user, by the DID a service-auth token proved.
    User(String),
}

/// What a caller asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// A new cluster (at zero nodes); answered once it is ready or `wait_secs` pass.
    CreateCluster {
        name: String,
        /// The DID it is for. The operator names one (or none: the operator's alone); a
        /// user's cluster is the user's.
        #[serde(default)]
        owner: Option<String>,
        wait_secs: u64,
        /// A user's invite code, redeemed when registration is by invite.
        #[serde(default)]
        invite: Option<String>,
        /// Its own idle time before hibernating, in seconds (0: never; `None`: the broker's
        /// `clusters.hibernate_after`). The operator's to give.
        #[serde(default)]
        hibernate_after_secs: Option<u64>,
        /// `etcd`, `kine` or `postgres` (`None`: the broker's `clusters.datastore`). The
        /// operator's.
        #[serde(default)]
        datastore: Option<String>,
    },
    /// Sets a cluster's own `hibernate_after` (`None`: back to the broker's).
    SetHibernateAfter {
        name: String,
        #[serde(default)]
        secs: Option<u64>,
    },
    /// Wakes a hibernating cluster (the operator's, whose admin kubeconfig reaches the
    /// apiserver directly, not through the front); answered once it is ready or `wait_secs`
    /// pass.
    WakeCluster {
        name: String,
        wait_secs: u64,
    },
    DeleteCluster {
        name: String,
    },
    /// New CAs for a cluster (the operator's): its users CA at once, the old one admitted
    /// for `overlap_secs` more; its own CAs at its control plane's next start (now, if it is
    /// awake: answered once it is ready again or `wait_secs` pass).
    RotateCa {
        name: String,
        overlap_secs: u64,
        wait_secs: u64,
    },
    ListClusters,
    /// A cluster's decisions and provisions (the operator's).
    ShowCluster {
        name: String,
    },
    /// The provider's own view of this broker's leases (the operator's).
    Leases,
    /// A kubeconfig with a new client certificate (a user's).
    GetKubeconfig {
        name: String,
        #[serde(default)]
        lifetime_seconds: Option<u64>,
        #[serde(default)]
        no_expiry: bool,
    },
    /// The caller's certificates (of one cluster).
    ListCertificates {
        #[serde(default)]
        cluster: Option<String>,
    },
    RevokeCertificate {
        serial: String,
    },
    /// A new invite (the operator's), good for `expires_secs`.
    CreateInvite {
        expires_secs: u64,
        #[serde(default)]
        note: String,
    },
    ListInvites,
    RevokeInvite {
        id: String,
    },
    /// Drains this fleet host (`undo`: undrains it): its clusters move to other hosts, and
    /// it claims none (the operator's).
    DrainHost {
        #[serde(default)]
        undo: bool,
    },
}

impl Command {
    /// Its name in messages.
    pub fn name(&self) -> &'static str {
        match self {
            Command::CreateCluster { .. } => "create a cluster",
            Command::DeleteCluster { .. } => "delete a cluster",
            Command::RotateCa { .. } => "rotate a cluster's CAs",
            Command::SetHibernateAfter { .. } => "set a cluster's hibernate_after",
            Command::WakeCluster { .. } => "wake a cluster",
            Command::ListClusters => "list clusters",
            Command::ShowCluster { .. } => "show a cluster",
            Command::Leases => "list the provider's leases",
            Command::GetKubeconfig { .. } => "get a kubeconfig",
            Command::ListCertificates { .. } => "list certificates",
            Command::RevokeCertificate { .. } => "revoke a certificate",
            Command::CreateInvite { .. } => "create an invite",
            Command::ListInvites => "list invites",
            Command::RevokeInvite { .. } => "revoke an invite",
            Command::DrainHost { .. } => "drain this host",
        }
    }
}

/// A cluster's life as the broker sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ClusterState {
    Starting {
        detail: String,
    },
    Ready,
    /// Its control plane stopped while idle, since `since` (Unix milliseconds); the first
    /// request at the front wakes it.
    Hibernating {
        since: i64,
    },
    Deleting,
    Failed {
        error: String,
    },
    /// Another broker host of the fleet runs it (`fleet.enabled`); this one takes it over
    /// if that host's lease expires.
    Elsewhere {
        host: String,
    },
}

/// A cluster, as `cluster list` and `cluster create` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterInfo {
    pub name: String,
    #[serde(flatten)]
    pub state: ClusterState,
    /// The apiserver (reachable from this host and from the nodes).
    pub server: String,
    /// The admin kubeconfig (owner-only).
    pub kubeconfig: PathBuf,
    /// Its directory (owner-only): PKI, datastore, logs and pid files. Each cluster of a
    /// name has its own, so a name deleted and created again gets a new one.
    pub dir: PathBuf,
    /// Live nodes (rented or being rented).
    pub nodes: usize,
    /// The DID it belongs to (`None`: the operator's).
    pub owner: Option<String>,
    /// Its idle time before hibernating, in seconds, its own or the broker's (0: never).
    pub hibernate_after_secs: u64,
    /// What keeps its objects: `etcd` or `kine`.
    pub datastore: String,
}

/// A cluster with its decisions and provisions, as `cluster show` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterDetail {
    pub cluster: ClusterInfo,
    pub decisions: Vec<DecisionRow>,
    pub provisions: Vec<Provision>,
}

/// What `cluster rotate-ca` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RotatedCa {
    pub cluster: String,
    /// The users CA that signs kubeconfigs from now on, and the one it replaced (lowercase
    /// hex of each certificate's SHA-256, as `listCertificates` records them).
    pub users_ca_sha256: String,
    pub previous_users_ca_sha256: String,
    /// Unix ms: until when the previous users CA's certificates are admitted.
    pub previous_admitted_until: i64,
    /// The cluster's own CAs (its CA, front-proxy's, etcd's): `made` (it was awake and its
    /// control plane started again with them), `overlap` (made, the old cluster CA still
    /// trusted until every one of `nodes` has moved to the new one) or `at_next_start`
    /// (hibernating, or not ready again within the wait).
    pub cluster_cas: String,
    /// The nodes that were to move to the new cluster CA (none: it was made at once).
    #[serde(default)]
    pub nodes: Vec<String>,
    /// The cluster as it is now.
    pub info: ClusterInfo,
}

/// A kubeconfig issued to a user: handed out once, its key never kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedKubeconfig {
    pub kubeconfig: String,
    pub serial: String,
    /// Unix milliseconds; `None`: no expiry.
    pub not_after: Option<i64>,
    /// The cluster's URL at the front.
    pub server: String,
    pub account_hash: String,
    pub mount_path: String,
}

/// An invite made: its code is shown this once (only its hash is kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedInvite {
    pub code: String,
    #[serde(flatten)]
    pub invite: crate::store::Invite,
}

/// What a command answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Cluster(ClusterInfo),
    Clusters(Vec<ClusterInfo>),
    Detail(Box<ClusterDetail>),
    Deleted {
        deleted: String,
    },
    Leases(Vec<Lease>),
    Kubeconfig(Box<IssuedKubeconfig>),
    Certificates(Vec<CertRecord>),
    Certificate(CertRecord),
    Invite(Box<IssuedInvite>),
    Invites(Vec<crate::store::Invite>),
    InviteRevoked(crate::store::Invite),
    /// `cluster rotate-ca` done.
    Rotated(Box<RotatedCa>),
    /// A drain or an undrain: the clusters this host gives up.
    Drain {
        drained: bool,
        moving: Vec<String>,
    },
}

/// Why a command was refused, by kind (each door maps kinds to its own statuses); the
/// message says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", content = "message", rename_all = "snake_case")]
pub enum ServiceError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// Not a command this caller may give.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Internal(String),
    /// Not now: the broker lacks what it needs (the disk guard's floor); the message names
    /// it, and a later try may pass.
    #[error("{0}")]
    Unavailable(String),
}

impl ServiceError {
    /// An error from below the services (the store, the market, a file): internal, with an
    /// id the log has it under. The operator's door shows it whole; the gateway API only
    /// the id ([`ServiceError::public`]): no paths, SQL or provider's words to strangers.
    pub fn internal(e: anyhow::Error) -> ServiceError {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let id = &id[..12];
        tracing::error!(error_id = %id, "{e:#}");
        ServiceError::Internal(format!("internal error {id}: {e:#}"))
    }

    /// The message a user may see: an internal error's id, never its cause.
    pub fn public(&self) -> String {
        match self {
            ServiceError::Internal(m) => {
                let id = m
                    .strip_prefix("internal error ")
                    .and_then(|r| r.split(':').next())
                    .unwrap_or("?");
                format!(
                    "internal error {id}; the broker's log has its cause (quote the id to its operator)"
                )
            }
            other => other.to_string(),
        }
    }
}
