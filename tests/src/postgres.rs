//! A real PostgreSQL server for the broker's store tests: Debian's `postgresql` package,
//! a private cluster made with `initdb` in a scratch directory, run as the `postgres` user on
//! loopback inside a test namespace, removed with the test.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::k8s::wait_for;
use crate::netns::Netns;
use crate::process::{Spawned, run_checked};
use crate::tmp::TempDir;

/// A running server with one database, `broker`.
#[derive(Debug)]
pub struct Postgres {
    server: Spawned,
    /// `postgres://postgres@127.0.0.1:5432/broker` (inside the namespace).
    pub url: String,
    bin: PathBuf,
    dir: TempDir,
}

fn bin_dir() -> Result<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .context("no /usr/lib/postgresql: install Debian's postgresql package (./x deps does)")?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").is_file())
        .collect();
    dirs.sort();
    dirs.pop()
        .context("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
}

impl Postgres {
    /// Starts a server in `ns`, listening on 127.0.0.1:5432 there.
    pub fn start(ns: &Netns) -> Result<Postgres> {
        Postgres::start_on(ns, None)
    }

    /// Starts a server in `ns` listening on 127.0.0.1:5432 and, with `public`, on that
    /// address too, trusting every client there (a fleet's hosts reach it); `url` names
    /// the public address then.
    pub fn start_on(ns: &Netns, public: Option<std::net::Ipv4Addr>) -> Result<Postgres> {
        let bin = bin_dir()?;
        let dir = TempDir::new("pg")?;
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data)?;
        run_checked(
            Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path()),
        )?;
        run_checked(
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(bin.join("initdb"))
                .args(["--auth=trust", "-U", "postgres", "-E", "UTF8", "-D"])
                .arg(&data),
        )
        .context("initdb")?;
        if public.is_some() {
            use std::io::Write;
            std::fs::OpenOptions::new()
                .append(true)
                .open(data.join("pg_hba.conf"))?
                .write_all(b"host all all 0.0.0.0/0 trust\n")?;
        }
        let listen = match public {
            Some(a) => format!("127.0.0.1,{a}"),
            None => "127.0.0.1".into(),
        };
        std::fs::write(dir.path().join("listen"), &listen)?;
        let server = serve(ns, &bin, &dir)?;
        let out = psql(ns, "create database broker")?;
        if !out.status.success() {
            bail!("create database: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(Postgres {
            server,
            url: format!(
                "postgres://postgres@{}:5432/broker",
                public.map_or("127.0.0.1".to_string(), |a| a.to_string())
            ),
            bin,
            dir,
        })
    }

    /// Stops the server as an outage of the database does: a fast shutdown (SIGINT to the
    /// postmaster, whose pid its `postmaster.pid` names: `runuser` would follow a SIGTERM
    /// with a SIGKILL 2 s later, and a postmaster killed leaves its backends holding the
    /// shared memory a new one needs).
    pub fn stop(&mut self) -> Result<()> {
        let pidfile = self.dir.path().join("data/postmaster.pid");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .with_context(|| format!("reading {}", pidfile.display()))?
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .with_context(|| format!("no pid in {}", pidfile.display()))?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGINT,
        )
        .context("signalling the postmaster")?;
        std::mem::replace(&mut self.server, Spawned::none("postgres"))
            .finish(Duration::from_secs(60))
            .map(|_| ())
    }

    /// Starts the stopped server again on the same data.
    pub fn start_again(&mut self, ns: &Netns) -> Result<()> {
        self.server = serve(ns, &self.bin, &self.dir)?;
        Ok(())
    }
}

/// Runs the server on `dir`'s data until it accepts connections.
fn serve(ns: &Netns, bin: &std::path::Path, dir: &TempDir) -> Result<Spawned> {
    let mut cmd = ns.command("runuser");
    cmd.args(["-u", "postgres", "--"])
        .arg(bin.join("postgres"))
        .arg("-D")
        .arg(dir.path().join("data"))
        .arg("-h")
        .arg(std::fs::read_to_string(dir.path().join("listen"))?)
        .args(["-p", "5432", "-k"])
        .arg(dir.path())
        .args(["-c", "fsync=on"])
        // A fleet's test runs six clusters' kine pools and three brokers' stores on it
        // (docs/operations.md sizes max_connections).
        .args(["-c", "max_connections=300"]);
    let server = Spawned::start_logged(cmd, "postgres", &dir.path().join("postgres.log"))?;
    wait_for(
        "PostgreSQL to accept connections",
        Duration::from_secs(30),
        || {
            let out = psql(ns, "select 1")?;
            Ok(out.status.success().then_some(()))
        },
    )
    .with_context(|| crate::k8s::tail_of(&dir.path().join("postgres.log"), 20))?;
    Ok(server)
}

/// The rows `sql` returns in database `db` of the server on the namespace's loopback, one
/// line each, columns apart by `|` (`psql -tA`).
pub fn query(ns: &Netns, db: &str, sql: &str) -> Result<String> {
    let out = psql_in(ns, db, sql)?;
    if !out.status.success() {
        bail!(
            "psql -d {db} -c {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `psql -c <sql>` as the `postgres` user against the server on the namespace's loopback,
/// in its `postgres` database.
fn psql(ns: &Netns, sql: &str) -> Result<std::process::Output> {
    psql_in(ns, "postgres", sql)
}

/// `psql -tA -c <sql>` in database `db`, stopping at the first error.
fn psql_in(ns: &Netns, db: &str, sql: &str) -> Result<std::process::Output> {
    ns.output(
        "runuser",
        &[
            "-u",
            "postgres",
            "--",
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            "5432",
            "-U",
            "postgres",
            "-d",
            db,
            "-tA",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ],
    )
}
