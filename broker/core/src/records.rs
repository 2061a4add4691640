//! The domain types the broker keeps: what a cluster, a provision, a decision and a client
//! certificate are. The store (`socialweb-broker`'s `store`) reads and writes them; it does not
//! define them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Unix milliseconds, as the store keeps time.
pub fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The time a [`millis`] value stands for (negative values are the epoch).
pub fn from_millis(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

/// Where a cluster's record is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClusterPhase {
    Active,
    /// Being deleted: its leases are released and its data removed, also after a crash.
    Deleting,
    /// Its control plane stopped while idle (docs/hibernation.md); its ports stay leased,
    /// and the first request at the front wakes it.
    Hibernating,
}

impl ClusterPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterPhase::Active => "active",
            ClusterPhase::Deleting => "deleting",
            ClusterPhase::Hibernating => "hibernating",
        }
    }

    pub fn parse(s: &str) -> Option<ClusterPhase> {
        [
            ClusterPhase::Active,
            ClusterPhase::Deleting,
            ClusterPhase::Hibernating,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
    }
}

/// A cluster record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cluster {
    pub name: String,
    pub state: ClusterPhase,
    pub created_at: i64,
    pub last_intent_at: i64,
    pub next_node: i64,
    /// The DID the cluster belongs to (`None`: the operator's, reachable by no user).
    pub owner: Option<String>,
    /// Its directory under `<state_dir>/clusters` (`None`: made before directories were
    /// unique, at its name).
    pub dir: Option<String>,
    /// Since when it hibernates (Unix milliseconds; `None` while awake).
    pub hibernating_since: Option<i64>,
    /// Its own `hibernate_after` in seconds (0: never; `None`: the broker's
    /// `clusters.hibernate_after`).
    pub hibernate_after_secs: Option<i64>,
    /// What keeps its objects: `etcd` or `kine` (`None`: etcd, made before the choice).
    pub datastore: Option<String>,
}

impl Cluster {
    /// Its directory's name under `<state_dir>/clusters`.
    pub fn dir_name(&self) -> &str {
        self.dir.as_deref().unwrap_or(&self.name)
    }
}

/// Where a provision is. Forward only, except `failed` and `released`, which end it.
///
/// planned → rfp_sent → accepted → booting → running → joined, then releasing → released;
/// failed from any step, with the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Planned,
    RfpSent,
    Accepted,
    Booting,
    Running,
    Joined,
    Releasing,
    Released,
    Failed,
}

impl Step {
    pub const ALL: [Step; 9] = [
        Step::Planned,
        Step::RfpSent,
        Step::Accepted,
        Step::Booting,
        Step::Running,
        Step::Joined,
        Step::Releasing,
        Step::Released,
        Step::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Step::Planned => "planned",
            Step::RfpSent => "rfp_sent",
            Step::Accepted => "accepted",
            Step::Booting => "booting",
            Step::Running => "running",
            Step::Joined => "joined",
            Step::Releasing => "releasing",
            Step::Released => "released",
            Step::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Step> {
        Step::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// A node that exists or is on its way (counts against the target).
    pub fn live(self) -> bool {
        !matches!(self, Step::Releasing | Step::Released | Step::Failed)
    }

    /// Over: nothing more happens to it.
    pub fn ended(self) -> bool {
        matches!(self, Step::Released | Step::Failed)
    }

    /// Whether a lease may exist at the provider: from the acceptance on (it is written
    /// before the provider is asked), until the release is done.
    pub fn may_hold_lease(self) -> bool {
        matches!(
            self,
            Step::Accepted | Step::Booting | Step::Running | Step::Joined | Step::Releasing
        )
    }

    /// Whether the step is one the driver starts a task for (a step that moves on by
    /// itself); `joined` and the ended ones stay where they are until a decision moves them.
    pub fn in_progress(self) -> bool {
        !self.ended() && self != Step::Joined
    }
}

/// One node the broker rents. `Debug` leaves the secrets out (the join token's secret and
/// the mesh key), and so does `Serialize` (read back, they are empty): logs and the
/// operator's `cluster show` see ids.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provision {
    pub id: String,
    pub cluster: String,
    pub node: String,
    pub state: Step,
    pub rfp_id: String,
    pub bid_id: Option<String>,
    pub lease_id: String,
    pub provider: Option<String>,
    pub token_id: String,
    #[serde(skip)]
    pub token_secret: String,
    #[serde(skip)]
    pub mesh_key: String,
    pub endpoint: String,
    /// The node's address in its cluster (its InternalIP, reached over the mesh), chosen at
    /// planning ([`crate::names::free_node_ip`]).
    #[serde(default)]
    pub node_ip: Option<std::net::IpAddr>,
    /// The shape the node is rented as (the RFP's spec), chosen at planning; `None` in
    /// provisions planned before shapes were chosen (the broker's `[node]` size).
    #[serde(default)]
    pub spec: Option<socialweb_market::NodeSpec>,
    /// The region and zone it was planned in (an RFP goes to the providers there alone);
    /// empty: anywhere.
    #[serde(default)]
    pub topology: socialweb_market::Topology,
    pub reason: Option<String>,
    pub attempts: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

impl std::fmt::Debug for Provision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provision")
            .field("id", &self.id)
            .field("cluster", &self.cluster)
            .field("node", &self.node)
            .field("state", &self.state)
            .field("lease_id", &self.lease_id)
            .field("token_id", &self.token_id)
            .field("reason", &self.reason)
            .finish_non_exhaustive()
    }
}

/// A recorded scale decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRow {
    pub cluster: String,
    pub at: i64,
    pub action: String,
    pub target: i64,
    pub nodes: i64,
    pub intent: i64,
    pub reason: String,
}

/// A client certificate the broker issued: the front admits it while this exists and
/// `revoked_at` is empty (and it has not expired).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertRecord {
    /// Lowercase hex, as `openssl x509 -serial` prints it.
    pub serial: String,
    pub cluster: String,
    pub did: String,
    /// Unix milliseconds; `None`: no expiry.
    pub not_after: Option<i64>,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    /// The SHA-256 (hex) of the users CA certificate that signed it: the front admits it
    /// only at the cluster whose CA that is (a later cluster of the same name has another).
    /// `None`: issued before this was kept.
    #[serde(default)]
    pub ca_sha256: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_and_phases_read_back_from_their_names() {
        for s in Step::ALL {
            assert_eq!(Step::parse(s.as_str()), Some(s));
        }
        assert_eq!(Step::parse("done"), None);
        for p in [
            ClusterPhase::Active,
            ClusterPhase::Deleting,
            ClusterPhase::Hibernating,
        ] {
            assert_eq!(ClusterPhase::parse(p.as_str()), Some(p));
        }
    }

    #[test]
    fn which_steps_may_hold_a_lease() {
        let holding: Vec<Step> = Step::ALL
            .into_iter()
            .filter(|s| s.may_hold_lease())
            .collect();
        assert_eq!(
            holding,
            [
                Step::Accepted,
                Step::Booting,
                Step::Running,
                Step::Joined,
                Step::Releasing
            ]
        );
        assert!(!Step::Joined.in_progress() && Step::Releasing.in_progress());
    }

    #[test]
    fn debug_leaves_the_secrets_out() {
        let p = Provision {
            id: "p".into(),
            cluster: "c".into(),
            node: "c-1".into(),
            state: Step::Planned,
            rfp_id: "r".into(),
            bid_id: None,
            lease_id: "l".into(),
            provider: None,
            token_id: "abcdef".into(),
            token_secret: "very-secret-token".into(),
            mesh_key: "secret-mesh-key".into(),
            endpoint: "e".into(),
            node_ip: None,
            spec: None,
            topology: Default::default(),
            reason: None,
            attempts: 0,
            created_at: 0,
            updated_at: 0,
        };
        let text = format!("{p:?}");
        assert!(
            !text.contains("very-secret") && !text.contains("secret-mesh"),
            "{text}"
        );
        assert!(text.contains("abcdef"));
    }

    #[test]
    fn millis_round_trip() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(from_millis(millis(t)), t);
        assert_eq!(from_millis(-5), UNIX_EPOCH);
    }
}
