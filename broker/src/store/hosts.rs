//! The store's list of a fleet's hosts: where each one's link is (`crate::front::link`), and
//! its tunnel endpoint (`crate::tunnel`), which nodes' identities list -- those of the hosts
//! alive: each host's `seen_at` is PostgreSQL's clock at its last heartbeat (once a renewal
//! period), and a host not seen for [`ALIVE_WITHIN`] leaves new identities.

use std::time::Duration;

use anyhow::Result;
use sqlx::Row;

use super::Store;

/// How long after its last heartbeat a host still counts as one of the fleet's.
pub const ALIVE_WITHIN: Duration = Duration::from_secs(60);

/// The fleet's reachability, as [`Store::reach`] read it.
#[derive(Debug, Clone)]
pub struct Reach {
    /// The live hosts: id and link URL.
    pub live: Vec<(String, String)>,
    pub reached: Vec<socialweb_broker_core::reach::Reached>,
    /// The store's clock at the reading (Unix ms).
    pub now: i64,
}

impl Store {
    /// Records that host `id` serves its link at `link` and its tunnel endpoint as `tunnel`
    /// (a restarted host may have moved), seen now.
    pub async fn register_host(&self, id: &str, link: &str, tunnel: &str) -> Result<()> {
        let now = self.now_sql();
        sqlx::query(&format!(
            "INSERT INTO fleet_hosts (id, link, tunnel, seen_at) VALUES ($1, $2, $3, {now}) \
             ON CONFLICT (id) DO UPDATE SET link = excluded.link, tunnel = excluded.tunnel, \
             seen_at = excluded.seen_at"
        ))
        .bind(id)
        .bind(link)
        .bind(tunnel)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Host `id` is alive now.
    pub async fn heartbeat(&self, id: &str) -> Result<()> {
        let now = self.now_sql();
        sqlx::query(&format!(
            "UPDATE fleet_hosts SET seen_at = {now} WHERE id = $1"
        ))
        .bind(id)
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

    /// Host `prober` reached each of `targets` now.
    pub async fn reached(&self, prober: &str, targets: &[String]) -> Result<()> {
        if targets.is_empty() {
            return Ok(());
        }
        let now = self.now_sql();
        // `$n` by hand: the store's `Any` driver numbers no placeholders of a QueryBuilder.
        let rows: Vec<String> = (0..targets.len())
            .map(|i| format!("($1, ${}, {now})", i + 2))
            .collect();
        let sql = format!(
            "INSERT INTO fleet_reach (prober, target, reached_at) VALUES {} \
             ON CONFLICT (prober, target) DO UPDATE SET reached_at = excluded.reached_at",
            rows.join(", ")
        );
        let mut q = sqlx::query(&sql).bind(prober);
        for t in targets {
            q = q.bind(t);
        }
        q.execute(&self.pool).await?;
        Ok(())
    }

    /// The fleet's reachability as of now: every host seen within `live_within` with its
    /// link, every pair's last success, and the store's clock.
    pub async fn reach(&self, live_within: Duration) -> Result<Reach> {
        let now_sql = self.now_sql();
        let within = i64::try_from(live_within.as_millis()).unwrap_or(i64::MAX);
        // One row even when no host is live, for the store's clock.
        let hosts = sqlx::query(&format!(
            "SELECT h.id, h.link, n.now FROM (SELECT {now_sql} AS now) AS n \
             LEFT JOIN fleet_hosts h ON h.seen_at >= n.now - $1 ORDER BY h.id"
        ))
        .bind(within)
        .fetch_all(&self.pool)
        .await?;
        let reached = sqlx::query("SELECT prober, target, reached_at FROM fleet_reach")
            .fetch_all(&self.pool)
            .await?;
        let now = hosts
            .first()
            .map_or(Ok(0), |r| r.try_get::<i64, _>("now"))?;
        let mut live = Vec::with_capacity(hosts.len());
        for r in &hosts {
            if let Some(id) = r.try_get::<Option<String>, _>("id")? {
                live.push((id, r.try_get::<String, _>("link")?));
            }
        }
        Ok(Reach {
            live,
            reached: reached
                .iter()
                .map(|r| socialweb_broker_core::reach::Reached {
                    prober: r.get("prober"),
                    target: r.get("target"),
                    at: r.get("reached_at"),
                })
                .collect(),
            now,
        })
    }

    /// The tunnel endpoint of every host seen within [`ALIVE_WITHIN`], as recorded, by id.
    pub async fn fleet_tunnels(&self) -> Result<Vec<String>> {
        let now = self.now_sql();
        let within = i64::try_from(ALIVE_WITHIN.as_millis()).unwrap_or(i64::MAX);
        Ok(sqlx::query(&format!(
            "SELECT tunnel FROM fleet_hosts WHERE seen_at >= {now} - $1 ORDER BY id"
        ))
        .bind(within)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| r.get::<String, _>("tunnel"))
        .collect())
    }
}
