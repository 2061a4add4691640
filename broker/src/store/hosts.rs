//! The store's list of a fleet's hosts: where each one's link is (`crate::front::link`).

use anyhow::Result;
use sqlx::Row;

use super::Store;

impl Store {
    /// Records that host `id` serves its link at `link` (a restarted host may have moved).
    pub async fn register_host(&self, id: &str, link: &str, now: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO fleet_hosts (id, link, seen_at) VALUES ($1, $2, $3) \
             ON CONFLICT (id) DO UPDATE SET link = excluded.link, seen_at = excluded.seen_at",
        )
        .bind(id)
        .bind(link)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Where host `id`'s link is, if it ever said.
    pub async fn host_link(&self, id: &str) -> Result<Option<String>> {
        Ok(sqlx::query("SELECT link FROM fleet_hosts WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| r.get::<String, _>("link")))
    }
}
