//! The store's list of a fleet's hosts: where each one's link is (`crate::front::link`), and
//! its tunnel endpoint (`crate::tunnel`), which nodes' identities list.

use anyhow::Result;
use sqlx::Row;

use super::Store;

impl Store {
    /// Records that host `id` serves its link at `link` and its tunnel endpoint as `tunnel`
    /// (a restarted host may have moved).
    pub async fn register_host(&self, id: &str, link: &str, tunnel: &str, now: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO fleet_hosts (id, link, tunnel, seen_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (id) DO UPDATE SET link = excluded.link, tunnel = excluded.tunnel, \
             seen_at = excluded.seen_at",
        )
        .bind(id)
        .bind(link)
        .bind(tunnel)
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

    /// Every host's tunnel endpoint, as recorded, in the order the hosts joined.
    pub async fn fleet_tunnels(&self) -> Result<Vec<String>> {
        Ok(
            sqlx::query("SELECT tunnel FROM fleet_hosts ORDER BY seen_at, id")
                .fetch_all(&self.pool)
                .await?
                .iter()
                .map(|r| r.get::<String, _>("tunnel"))
                .collect(),
        )
    }
}
