//! A cluster's objects in PostgreSQL (`clusters.datastore = "postgres"`): kine over one
//! database per cluster on the server `clusters.postgres_url` names, created before its
//! control plane first starts and dropped with the cluster. The cluster's directory then
//! holds no datastore: what a host loses with its disk is not the cluster's objects.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// The file in a cluster's directory naming its database (what a backup of the directory
/// says it does not hold), written at every start of its control plane.
pub const MARKER: &str = "postgres-database";

/// Writes [`MARKER`] into the cluster's directory `dir`.
pub fn mark(dir: &std::path::Path, database: &str) -> Result<()> {
    let path = dir.join(MARKER);
    std::fs::write(&path, format!("{database}\n"))
        .with_context(|| format!("writing {}", path.display()))
}

/// The server cluster databases are made on: a connection to the URL's own database (the
/// maintenance one: `CREATE DATABASE` runs from there), which needs the `CREATEDB` right.
#[derive(Clone)]
pub struct Server {
    url: url::Url,
    pool: PgPool,
}

impl PartialEq for Server {
    fn eq(&self, other: &Server) -> bool {
        self.url == other.url
    }
}

impl Eq for Server {}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Server").field(&self.redacted()).finish()
    }
}

/// The database a cluster's objects live in, named after its directory (`<name>-<8 hex>`:
/// never one an earlier cluster of the same name had).
pub fn database_name(dir: &str) -> String {
    format!("sw_{}", dir.replace('-', "_"))
}

impl Server {
    /// The server at `url` (`postgres://user[:password]@host[:port]/database`); nothing is
    /// connected until used.
    pub fn new(url: &str) -> Result<Server> {
        let parsed = url::Url::parse(url).context("clusters.postgres_url: not a URL")?;
        if !matches!(parsed.scheme(), "postgres" | "postgresql") {
            bail!(
                "clusters.postgres_url: {:?} is not postgres://",
                parsed.scheme()
            );
        }
        let opts: PgConnectOptions = url
            .parse()
            .context("clusters.postgres_url: not a PostgreSQL URL")?;
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(opts);
        Ok(Server { url: parsed, pool })
    }

    /// Creates `db` unless it exists (at every start: a crash between the cluster's record
    /// and its database leaves nothing to repair by hand).
    pub async fn ensure(&self, db: &str) -> Result<()> {
        let exists: Option<i32> =
            sqlx::query_scalar("select 1 from pg_database where datname = $1")
                .bind(db)
                .fetch_optional(&self.pool)
                .await
                .with_context(|| format!("looking for database {db} at {}", self.redacted()))?;
        if exists.is_none() {
            sqlx::query(&format!("create database {}", quote(db)))
                .execute(&self.pool)
                .await
                .with_context(|| format!("creating database {db} at {}", self.redacted()))?;
            tracing::info!(database = db, server = %self.redacted(), "cluster database created");
        }
        Ok(())
    }

    /// Drops `db`, closing what is still connected to it; a missing one is fine.
    pub async fn drop_database(&self, db: &str) -> Result<()> {
        sqlx::query(&format!(
            "drop database if exists {} with (force)",
            quote(db)
        ))
        .execute(&self.pool)
        .await
        .with_context(|| format!("dropping database {db} at {}", self.redacted()))?;
        Ok(())
    }

    /// Closes every connection to `db` but this pool's own: what a fleet's host does as it
    /// starts a cluster it holds the lease of, before its kine connects. No kine of the
    /// cluster may run anywhere then, so any connection is a former owner's that did not
    /// die (a paused VM, a host whose watchdog could not act): the store fences it. How
    /// many were closed.
    pub async fn fence_out(&self, db: &str) -> Result<u64> {
        let closed: i64 = sqlx::query_scalar(
            "select count(*) from (select pg_terminate_backend(pid) as t from pg_stat_activity \
             where datname = $1 and pid <> pg_backend_pid()) as k where k.t",
        )
        .bind(db)
        .fetch_one(&self.pool)
        .await
        .with_context(|| format!("closing the connections to database {db}"))?;
        Ok(closed.max(0) as u64)
    }

    /// What `db` takes on the server's disk, in bytes.
    pub async fn size(&self, db: &str) -> Result<u64> {
        let n: i64 = sqlx::query_scalar("select pg_database_size($1)")
            .bind(db)
            .fetch_one(&self.pool)
            .await
            .with_context(|| format!("measuring database {db}"))?;
        Ok(n.max(0) as u64)
    }

    /// kine's `--endpoint` for `db`, without the password (a process's arguments are
    /// readable by every local user), and the password, which kine's driver takes from
    /// `PGPASSWORD`.
    pub fn kine_endpoint(&self, db: &str) -> (String, Option<String>) {
        let mut u = self.url.clone();
        let password = u.password().map(percent_decode);
        let _ = u.set_password(None);
        u.set_path(&format!("/{db}"));
        if !u.query_pairs().any(|(k, _)| k == "sslmode") {
            u.query_pairs_mut().append_pair("sslmode", "disable");
        }
        (u.to_string(), password)
    }

    /// The URL without its password, for messages.
    pub fn redacted(&self) -> String {
        let mut u = self.url.clone();
        if u.password().is_some() {
            let _ = u.set_password(Some("***"));
        }
        u.to_string()
    }
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// A quoted identifier (the names made here are `[a-z0-9_]`; quoting keeps any other safe).
fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_endpoint_names_the_clusters_database_and_keeps_the_password_out() {
        let s = Server::new("postgres://kine:s%40cret@db.example:5433/fleet").unwrap();
        let (url, pw) = s.kine_endpoint(&database_name("web-0a1b2c3d"));
        assert_eq!(
            url,
            "postgres://kine@db.example:5433/sw_web_0a1b2c3d?sslmode=disable"
        );
        assert_eq!(pw.as_deref(), Some("s@cret"));
        assert_eq!(s.redacted(), "postgres://kine:***@db.example:5433/fleet");
        let s = Server::new("postgresql://db/fleet?sslmode=require").unwrap();
        assert_eq!(
            s.kine_endpoint("sw_a_00000000").0,
            "postgresql://db/sw_a_00000000?sslmode=require"
        );
        assert!(Server::new("mysql://db/x").is_err());
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
    }
}
