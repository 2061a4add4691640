//! Who may have a cluster (docs/security.md): the operator's choice, `[access]` in the
//! configuration. The gateway API serves users at all only when their nodes are isolated
//! from the provider's host or the operator trusts them; then a DID may create clusters
//! when it is on the allow list, registration is open, or it redeemed an invite. Each
//! refusal names the policy that refused and the key that would change it.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use socialweb_broker_core::millis;
use socialweb_market::Isolation;

use crate::command::{IssuedInvite, ServiceError};
use crate::config::Registration;
use crate::store::{Invite, Store};

/// The longest an invite may be good for.
pub const MAX_INVITE_LIFETIME: Duration = Duration::from_secs(90 * 24 * 3600);

/// The registration policy, with its store.
#[derive(Debug)]
pub struct Policy {
    pub registration: Registration,
    pub allowed: HashSet<String>,
    pub tenants_trusted: bool,
    /// What the broker's nodes are (`market.isolation`).
    pub isolation: Isolation,
    pub store: Store,
}

/// An invite code: `<id>.<secret>`.
fn split_code(code: &str) -> Option<(&str, &str)> {
    let (id, secret) = code.trim().split_once('.')?;
    let ok = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (ok(id, 8) && ok(secret, 32)).then_some((id, secret))
}

fn sha256(secret: &str) -> String {
    crate::access::certs::sha256_hex(secret.to_ascii_lowercase().as_bytes())
}

impl Policy {
    /// Whether the gateway API serves users: not on namespace nodes unless the tenants are
    /// trusted (a namespace node's Pods run on the provider host's kernel, as its root).
    pub fn serving(&self) -> Result<(), ServiceError> {
        if self.isolation == Isolation::Namespace && !self.tenants_trusted {
            return Err(ServiceError::Forbidden(
                "this broker rents namespace nodes (market.isolation = \"namespace\"), which \
                 share their provider's kernel and root; it serves users only when its \
                 operator trusts them (access.tenants_trusted = true, docs/security.md)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Whether `did` may create clusters; `invite` (a code) is redeemed when the policy
    /// takes invites and the DID is not admitted yet.
    pub async fn may_have_clusters(
        &self,
        did: &str,
        invite: Option<&str>,
    ) -> Result<(), ServiceError> {
        if self.allowed.contains(did) || self.registration == Registration::Open {
            return Ok(());
        }
        match self.registration {
            Registration::Open => Ok(()),
            Registration::Closed => Err(ServiceError::Forbidden(
                "registration at this broker is closed (access.registration = \"closed\"): only \
                 the DIDs of access.allowed_dids may create clusters; ask its operator"
                    .into(),
            )),
            Registration::Invite => {
                if self
                    .store
                    .admitted(did)
                    .await
                    .map_err(ServiceError::internal)?
                {
                    return Ok(());
                }
                let Some(code) = invite else {
                    return Err(ServiceError::Forbidden(
                        "registration at this broker is by invite (access.registration = \
                         \"invite\"): give the invite code its operator sent you as `invite`"
                            .into(),
                    ));
                };
                self.redeem(did, code).await
            }
        }
    }

    async fn redeem(&self, did: &str, code: &str) -> Result<(), ServiceError> {
        let bad = || {
            ServiceError::Forbidden(
                "invite: the code is not a good invite (unknown, used, revoked or expired); ask \
                 the operator for another"
                    .into(),
            )
        };
        let (id, secret) = split_code(code).ok_or_else(bad)?;
        let now = SystemTime::now();
        if self
            .store
            .redeem_invite(did, &id.to_ascii_lowercase(), &sha256(secret), now)
            .await
            .map_err(ServiceError::internal)?
        {
            tracing::info!(%did, invite = %id, "a DID was admitted by an invite");
            Ok(())
        } else {
            Err(bad())
        }
    }

    /// A new invite, good for `lifetime`; its code is shown once.
    pub async fn create_invite(
        &self,
        lifetime: Duration,
        note: &str,
    ) -> Result<IssuedInvite, ServiceError> {
        if lifetime.is_zero() || lifetime > MAX_INVITE_LIFETIME {
            return Err(ServiceError::Invalid(format!(
                "expires: {} is not within 1s and 90 days",
                humantime::format_duration(lifetime)
            )));
        }
        if note.len() > 200 {
            return Err(ServiceError::Invalid("note: over 200 bytes".into()));
        }
        let id = crate::access::certs::hex(&rand::random::<[u8; 4]>());
        let secret = crate::access::certs::hex(&rand::random::<[u8; 16]>());
        let now = SystemTime::now();
        let invite = self
            .store
            .create_invite(&id, &sha256(&secret), note, millis(now + lifetime), now)
            .await
            .map_err(ServiceError::internal)?;
        Ok(IssuedInvite {
            code: format!("{id}.{secret}"),
            invite,
        })
    }

    pub async fn invites(&self) -> Result<Vec<Invite>, ServiceError> {
        self.store.invites().await.map_err(ServiceError::internal)
    }

    pub async fn revoke_invite(&self, id: &str) -> Result<Invite, ServiceError> {
        let i = self
            .store
            .revoke_invite(id, SystemTime::now())
            .await
            .map_err(ServiceError::internal)?
            .ok_or_else(|| ServiceError::NotFound(format!("id: no invite {id:?}")))?;
        if i.used_by.is_some() {
            return Err(ServiceError::Conflict(format!(
                "id: invite {id} was used already; it admitted {}",
                i.used_by.unwrap_or_default()
            )));
        }
        Ok(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_codes_are_looked_up() {
        let good = format!("{}.{}", "0a1b2c3d", "f".repeat(32));
        assert_eq!(
            split_code(&good),
            Some(("0a1b2c3d", "f".repeat(32).as_str()))
        );
        assert_eq!(
            split_code(&format!(" {good}\n")).map(|c| c.0),
            Some("0a1b2c3d")
        );
        for bad in [
            "",
            ".",
            "0a1b2c3d",
            "0a1b2c3d.",
            "zz1b2c3d.ffff",
            "0a1b2c3d.'; DROP",
        ] {
            assert_eq!(split_code(bad), None, "{bad:?}");
        }
    }
}
