//! The store's part of the way in: cluster owners, client certificate records, and used
//! token nonces.

use anyhow::Result;
use socialweb_broker_core::CertRecord;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::Store;

fn cert_of(r: &AnyRow) -> Result<CertRecord> {
    Ok(CertRecord {
        serial: r.try_get("serial")?,
        cluster: r.try_get("cluster")?,
        did: r.try_get("did")?,
        not_after: r.try_get("not_after")?,
        created_at: r.try_get("created_at")?,
        revoked_at: r.try_get("revoked_at")?,
        ca_sha256: r.try_get("ca_sha256")?,
    })
}

impl Store {
    /// Records a certificate; written before the kubeconfig holding it is handed out.
    pub async fn insert_certificate(&self, c: &CertRecord) -> Result<()> {
        sqlx::query(
            "INSERT INTO certificates (serial, cluster, did, not_after, created_at, revoked_at, \
             ca_sha256) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&c.serial)
        .bind(&c.cluster)
        .bind(&c.did)
        .bind(c.not_after)
        .bind(c.created_at)
        .bind(c.revoked_at)
        .bind(&c.ca_sha256)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every certificate record (the front's cache is loaded from this at start).
    pub async fn certificates(&self) -> Result<Vec<CertRecord>> {
        sqlx::query("SELECT * FROM certificates ORDER BY created_at, serial")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(cert_of)
            .collect()
    }

    /// The certificate records made or revoked at or after `since` (Unix ms): what a fleet
    /// host reads to learn of the certificates other hosts issued and revoked.
    pub async fn certificates_since(&self, since: i64) -> Result<Vec<CertRecord>> {
        sqlx::query(
            "SELECT * FROM certificates WHERE created_at >= $1 OR revoked_at >= $1 \
             ORDER BY created_at, serial",
        )
        .bind(since)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(cert_of)
        .collect()
    }

    /// Marks a certificate revoked at `at` (Unix ms); the first revocation's time stays.
    /// `None` when there is no such certificate.
    pub async fn revoke_certificate(&self, serial: &str, at: i64) -> Result<Option<CertRecord>> {
        sqlx::query(
            "UPDATE certificates SET revoked_at = $1 WHERE serial = $2 AND revoked_at IS NULL",
        )
        .bind(at)
        .bind(serial)
        .execute(&self.pool)
        .await?;
        sqlx::query("SELECT * FROM certificates WHERE serial = $1")
            .bind(serial)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(cert_of)
            .transpose()
    }

    /// Records a token nonce; `false` when it was used before (a replay). Expired nonces
    /// are swept by [`Store::sweep`], not here (one indexed INSERT per call).
    pub async fn use_nonce(&self, nonce: &str, expires_at: i64) -> Result<bool> {
        let r = sqlx::query(
            "INSERT INTO token_nonces (nonce, expires_at) VALUES ($1, $2) \
             ON CONFLICT (nonce) DO NOTHING",
        )
        .bind(nonce)
        .bind(expires_at)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Deletes the nonces of tokens expired by `now` (a replay of one is refused as expired
    /// anyway) and the records of certificates expired before `certs_before`; how many of
    /// each went. Both by index.
    pub async fn sweep(&self, now: i64, certs_before: i64) -> Result<(u64, u64)> {
        let nonces = sqlx::query("DELETE FROM token_nonces WHERE expires_at < $1")
            .bind(now)
            .execute(&self.pool)
            .await?
            .rows_affected();
        let certs =
            sqlx::query("DELETE FROM certificates WHERE not_after IS NOT NULL AND not_after < $1")
                .bind(certs_before)
                .execute(&self.pool)
                .await?
                .rows_affected();
        Ok((nonces, certs))
    }
}
