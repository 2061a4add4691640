//! Where a [`Command`] is carried out, for whichever door it came through: who may give it
//! (the operator, or a user for their own clusters), then the cluster service or the access
//! service with the same rules either way.

use std::sync::Arc;
use std::time::Duration;

use crate::access::certs::Lifetime;
use crate::access::registration::Policy;
use crate::access::service::Access;
use crate::cluster::Clusters;
use crate::command::{Caller, Command, Reply, ServiceError};
use crate::provision::Provisioner;

/// The longest a create may wait for its cluster to be ready.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// The services, as the front doors hold them.
#[derive(Debug, Clone)]
pub struct Services {
    pub clusters: Arc<Clusters>,
    pub access: Arc<Access>,
    pub policy: Arc<Policy>,
    provisioner: Arc<Provisioner>,
}

impl Services {
    pub fn new(
        clusters: Arc<Clusters>,
        access: Arc<Access>,
        policy: Arc<Policy>,
        provisioner: Arc<Provisioner>,
    ) -> Services {
        Services {
            clusters,
            access,
            policy,
            provisioner,
        }
    }

    /// Carries out `cmd` for `caller`.
    pub async fn execute(&self, caller: &Caller, cmd: Command) -> Result<Reply, ServiceError> {
        match caller {
            Caller::Operator => self.operator(cmd).await,
            Caller::User(did) => self.user(did, cmd).await,
        }
    }

    async fn operator(&self, cmd: Command) -> Result<Reply, ServiceError> {
        let c = &self.clusters;
        match cmd {
            Command::CreateCluster {
                name,
                owner,
                wait_secs,
                hibernate_after_secs,
                datastore,
                ..
            } => {
                let wait = Duration::from_secs(wait_secs);
                let new = crate::cluster::New {
                    name: &name,
                    owner: owner.as_deref(),
                    user: false,
                    hibernate_after_secs,
                    datastore: datastore.as_deref(),
                };
                Ok(Reply::Cluster(c.create(&new, wait).await?))
            }
            Command::SetHibernateAfter { name, secs } => {
                Ok(Reply::Cluster(c.set_hibernate_after(&name, secs).await?))
            }
            Command::WakeCluster { name, wait_secs } => Ok(Reply::Cluster(
                c.wake(&name, Duration::from_secs(wait_secs)).await?,
            )),
            Command::DeleteCluster { name } => {
                c.delete(&name).await?;
                Ok(Reply::Deleted { deleted: name })
            }
            Command::RotateCa {
                name,
                overlap_secs,
                wait_secs,
            } => {
                let secs = Duration::from_secs;
                let r = c
                    .rotate_ca(&name, secs(overlap_secs), secs(wait_secs))
                    .await?;
                Ok(Reply::Rotated(Box::new(r)))
            }
            Command::ListClusters => Ok(Reply::Clusters(c.list(None).await?)),
            Command::ShowCluster { name } => Ok(Reply::Detail(Box::new(c.show(&name).await?))),
            Command::Leases => self.leases().await,
            Command::CreateInvite { expires_secs, note } => Ok(Reply::Invite(Box::new(
                self.policy
                    .create_invite(Duration::from_secs(expires_secs), &note)
                    .await?,
            ))),
            Command::ListInvites => Ok(Reply::Invites(self.policy.invites().await?)),
            Command::RevokeInvite { id } => {
                Ok(Reply::InviteRevoked(self.policy.revoke_invite(&id).await?))
            }
            Command::DrainHost { undo } => Ok(Reply::Drain {
                drained: !undo,
                moving: c.drain(undo).await?,
            }),
            other => Err(ServiceError::Forbidden(format!(
                "the operator cannot {}: that is a user's (the operator has each cluster's \
                 admin kubeconfig, which `cluster create` names)",
                other.name()
            ))),
        }
    }

    /// The provider's own view of this broker's leases, each tagged with the provider it is
    /// at, as this broker names it.
    async fn leases(&self) -> Result<Reply, ServiceError> {
        let leases = self
            .provisioner
            .leases(crate::provision::Scope::Broker)
            .await
            .map_err(|e| ServiceError::internal(anyhow::anyhow!(e)))?;
        Ok(Reply::Leases(
            leases
                .into_iter()
                .map(|(provider, mut l)| {
                    l.tags.insert("provider".into(), provider);
                    l
                })
                .collect(),
        ))
    }

    async fn user(&self, did: &str, cmd: Command) -> Result<Reply, ServiceError> {
        self.policy.serving()?;
        let c = &self.clusters;
        match cmd {
            Command::CreateCluster {
                name,
                wait_secs,
                invite,
                hibernate_after_secs,
                datastore,
                ..
            } => {
                if hibernate_after_secs.is_some() || datastore.is_some() {
                    return Err(ServiceError::Forbidden(
                        "only the operator sets a cluster's hibernation and datastore".into(),
                    ));
                }
                if Duration::from_secs(wait_secs) > MAX_WAIT {
                    return Err(ServiceError::Invalid(format!(
                        "waitSeconds: {wait_secs} is over {}",
                        MAX_WAIT.as_secs()
                    )));
                }
                self.policy
                    .may_have_clusters(did, invite.as_deref())
                    .await?;
                c.may_create(did, &name).await?;
                let wait = Duration::from_secs(wait_secs);
                let new = crate::cluster::New {
                    name: &name,
                    owner: Some(did),
                    user: true,
                    hibernate_after_secs: None,
                    datastore: None,
                };
                Ok(Reply::Cluster(c.create(&new, wait).await?))
            }
            Command::DeleteCluster { name } => {
                c.owned_by(did, &name).await?;
                c.delete(&name).await?;
                Ok(Reply::Deleted { deleted: name })
            }
            Command::ListClusters => Ok(Reply::Clusters(c.list(Some(did)).await?)),
            Command::GetKubeconfig {
                name,
                lifetime_seconds,
                no_expiry,
            } => {
                let lifetime = Lifetime::from_request(lifetime_seconds, no_expiry)
                    .map_err(|e| ServiceError::Invalid(e.to_string()))?;
                let kc = c.kubeconfig(did, &name, lifetime).await?;
                Ok(Reply::Kubeconfig(Box::new(kc)))
            }
            Command::ListCertificates { cluster } => Ok(Reply::Certificates(
                self.access.certificates(did, cluster.as_deref()),
            )),
            Command::RevokeCertificate { serial } => {
                Ok(Reply::Certificate(self.access.revoke(did, &serial).await?))
            }
            other @ (Command::ShowCluster { .. }
            | Command::SetHibernateAfter { .. }
            | Command::WakeCluster { .. }
            | Command::RotateCa { .. }
            | Command::Leases
            | Command::CreateInvite { .. }
            | Command::ListInvites
            | Command::RevokeInvite { .. }
            | Command::DrainHost { .. }) => Err(ServiceError::Forbidden(format!(
                "only the operator can {}",
                other.name()
            ))),
        }
    }
}
