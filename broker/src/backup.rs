//! `socialweb-broker backup` and `restore` (docs/operations.md, "Backup and restore"): a
//! consistent copy of what a broker needs from its state directory, taken while it serves,
//! and its way back into an empty state directory.
//!
//! SQLite databases (the store, each kine cluster's datastore) are copied with `VACUUM INTO`
//! through a read-only connection: a consistent snapshot of the last commit, the write-ahead
//! log's included, while the broker and kine keep writing. Every other file the broker keeps
//! (PKI, kubeconfigs, the users CAs, the front's CA, the tunnel key, the market keys, the
//! embedded provider's records) is written whole (atomically or once) and copied as it is.
//! Sockets, pidfiles, logs, SQLite's side files and the embedded provider's machines'
//! scratch directories are not state. A PostgreSQL store is `pg_dump`'s. An etcd datastore
//! is its snapshot while it serves, its files while it is stopped
//! (`control_plane::etcd_backup`). `manifest.json` names every file with its size, mode and
//! sha256; `restore` checks them all before it writes anything.

use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::ConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;

/// The manifest's name in a backup directory.
pub const MANIFEST: &str = "manifest.json";
/// Where the copied files are in a backup directory: `<backup>/state/<path in state_dir>`.
const FILES: &str = "state";
/// Where an SQLite store kept outside the state directory is in `<backup>/state`.
const OUTSIDE: &str = "@store";

/// Where a broker keeps its files, as `socialweb-broker paths` says (built from it by the
/// caller: this module does not reach into the daemon).
#[derive(Debug, Clone)]
pub struct Layout {
    pub state_dir: PathBuf,
    /// The store's URL.
    pub store: String,
    /// The directory of the clusters' directories.
    pub clusters: PathBuf,
    /// Directories that are not state (the embedded provider's machines, the sockets').
    pub skip: Vec<PathBuf>,
    /// The multicall `kube` binary: snapshots of serving etcd datastores.
    pub kube: PathBuf,
}

impl Layout {
    /// The store's database file when the store is SQLite.
    fn sqlite_store(&self) -> Option<PathBuf> {
        let rest = self.store.strip_prefix("sqlite://")?;
        Some(PathBuf::from(rest.split('?').next().unwrap_or(rest)))
    }
}

/// One file of a backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Relative to the state directory (and to `<backup>/state`).
    pub path: PathBuf,
    pub size: u64,
    /// Its permission bits, as the broker left them (restored as they were).
    pub mode: u32,
    pub sha256: String,
    /// `sqlite snapshot` (VACUUM INTO), `etcd snapshot` or `file`.
    pub how: String,
}

/// Something a backup does not hold, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    pub what: String,
    pub why: String,
}

/// `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// `socialweb-broker --version` of the broker that made it (with its commit).
    pub broker_version: String,
    /// When it was made (RFC 3339, UTC).
    pub created_at: String,
    /// The state directory it was taken from.
    pub state_dir: PathBuf,
    /// `sqlite` or `postgres`.
    pub store: String,
    pub files: Vec<Entry>,
    pub skipped: Vec<Skipped>,
    /// Total bytes of `files`.
    pub bytes: u64,
}

/// `backup --to`: empty or absent, made 0700.
fn fresh_dir(dir: &Path, what: &str) -> Result<()> {
    if dir.exists() {
        let mut entries =
            std::fs::read_dir(dir).with_context(|| format!("{what} {}", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "{what} {} is not empty: give an empty or absent directory",
                dir.display()
            );
        }
    }
    socialweb_proc::owner_only::dir(dir).with_context(|| format!("creating {}", dir.display()))
}

/// The sha256 of a file, in hex, and its size.
pub fn digest(path: &Path) -> Result<(String, u64)> {
    let mut f = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok((crate::access::certs::hex(&h.finalize()), size))
}

fn mode_of(path: &Path) -> Result<u32> {
    Ok(std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .permissions()
        .mode()
        & 0o7777)
}

/// A consistent snapshot of the SQLite database `db` at `to` (which must not exist).
async fn sqlite_snapshot(db: &Path, to: &Path) -> Result<()> {
    let mut conn = SqliteConnectOptions::new()
        .filename(db)
        .busy_timeout(std::time::Duration::from_secs(30))
        .connect()
        .await
        .with_context(|| format!("opening {}", db.display()))?;
    let into = to.to_string_lossy().replace('\'', "''");
    sqlx::query(&format!("VACUUM INTO '{into}'"))
        .execute(&mut conn)
        .await
        .with_context(|| format!("VACUUM INTO a snapshot of {}", db.display()))?;
    Ok(())
}

/// What the walk does with one file or directory of the state directory.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    /// Copy it as it is.
    File,
    /// Snapshot it (a SQLite database).
    Sqlite,
    /// Not state (a socket, pidfile, log, SQLite side file, temporary file).
    Ignore,
    /// An etcd data directory: its snapshot, or its files when stopped.
    Etcd,
    /// A cluster's note that its objects are in PostgreSQL (`control_plane::postgres::MARKER`): copied,
    /// and the database named as not in the backup.
    PostgresMarker,
    Dir,
}

fn kind(layout: &Layout, path: &Path, meta: &std::fs::Metadata) -> Kind {
    use std::os::unix::fs::FileTypeExt;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let in_cluster = path.parent().and_then(Path::parent) == Some(layout.clusters.as_path());
    if layout.skip.iter().any(|s| s == path) {
        return Kind::Ignore;
    }
    if meta.is_dir() {
        return match name {
            "run" | "logs" if in_cluster || path.parent() == Some(&layout.state_dir) => {
                Kind::Ignore
            }
            "etcd" if in_cluster => Kind::Etcd,
            _ => Kind::Dir,
        };
    }
    let ft = meta.file_type();
    if !ft.is_file() || ft.is_socket() || ft.is_fifo() {
        return Kind::Ignore;
    }
    let not_state = [
        ".pid", ".log", ".log.1", "-wal", "-shm", "-journal", ".tmp", ".sock",
    ];
    if not_state.iter().any(|s| name.ends_with(s)) {
        return Kind::Ignore;
    }
    if name == crate::control_plane::postgres::MARKER
        && path.parent().and_then(Path::parent) == Some(layout.clusters.as_path())
    {
        return Kind::PostgresMarker;
    }
    let kine_db = name == "state.db"
        && path.parent().and_then(Path::file_name) == Some("kine".as_ref())
        && path.parent().and_then(Path::parent).and_then(Path::parent)
            == Some(layout.clusters.as_path());
    if kine_db || layout.sqlite_store().as_deref() == Some(path) {
        return Kind::Sqlite;
    }
    Kind::File
}

/// The cluster a directory under `clusters` is for (`<name>-<8 hex>`).
fn cluster_name(dir: &Path) -> String {
    let n = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match n.rsplit_once('-') {
        Some((name, id)) if id.len() == 8 && id.bytes().all(|b| b.is_ascii_hexdigit()) => {
            name.to_string()
        }
        _ => n,
    }
}

/// Every path under `dir` the backup takes, depth first, and what it skips.
fn walk(
    layout: &Layout,
    dir: &Path,
    out: &mut Vec<(PathBuf, Kind)>,
    skipped: &mut Vec<Skipped>,
) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue; // gone meanwhile (a temporary file)
        };
        match kind(layout, &path, &meta) {
            Kind::Dir => walk(layout, &path, out, skipped)?,
            Kind::Ignore => {}
            Kind::PostgresMarker => {
                let db = std::fs::read_to_string(&path).unwrap_or_default();
                skipped.push(Skipped {
                    what: format!("cluster {}: its objects", cluster_name(dir)),
                    why: format!(
                        "they are in PostgreSQL, database {}: pg_dump's (or the server's own \
                         backups); its PKI and kubeconfigs are in this backup",
                        db.trim()
                    ),
                });
                out.push((path, Kind::File));
            }
            k => out.push((path, k)),
        }
    }
    Ok(())
}

/// Copies (or snapshots) one file into the backup and describes it.
async fn take(layout: &Layout, path: &Path, k: Kind, files: &Path) -> Result<Entry> {
    let rel = match path.strip_prefix(&layout.state_dir) {
        Ok(rel) => rel.to_path_buf(),
        // An SQLite store outside the state directory.
        Err(_) => Path::new(OUTSIDE).join(path.file_name().unwrap_or_default()),
    };
    let to = files.join(&rel);
    if let Some(parent) = to.parent() {
        socialweb_proc::owner_only::dir(parent)?;
    }
    let mode = mode_of(path)?;
    let how = if k == Kind::Sqlite {
        sqlite_snapshot(path, &to).await?;
        "sqlite snapshot"
    } else {
        copy_private(path, &to)?;
        "file"
    };
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode & 0o700))?;
    let (sha256, size) = digest(&to)?;
    Ok(Entry {
        path: rel,
        size,
        mode,
        sha256,
        how: how.into(),
    })
}

/// A cluster's etcd data directory `data`: a snapshot of the etcd serving it, or its files
/// as they are while it is stopped -- and a snapshot after all if it started meanwhile (a
/// copy of a data directory in use may be torn).
async fn take_etcd(layout: &Layout, data: &Path, files: &Path) -> Result<Vec<Entry>> {
    use crate::control_plane::etcd_backup::serving;
    let cluster = data
        .parent()
        .context("an etcd data directory is in a cluster's")?;
    if !serving(cluster) {
        let mut found = Vec::new();
        files_under(data, &mut found)?;
        let mut entries = Vec::new();
        for f in found {
            entries.push(take(layout, &f, Kind::File, files).await?);
        }
        if !serving(cluster) {
            return Ok(entries);
        }
        for e in &entries {
            std::fs::remove_file(files.join(&e.path))?;
        }
    }
    Ok(vec![etcd_snapshot(layout, cluster, files).await?])
}

/// Every regular file under `dir`, depth first.
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let t = e.file_type()?;
        if t.is_dir() {
            files_under(&e.path(), out)?;
        } else if t.is_file() {
            out.push(e.path());
        }
    }
    Ok(())
}

/// A snapshot of the etcd serving the cluster in `cluster`, as `<cluster>/etcd.snapshot`.
async fn etcd_snapshot(layout: &Layout, cluster: &Path, files: &Path) -> Result<Entry> {
    use crate::control_plane::etcd_backup::{SNAPSHOT, save};
    let rel = cluster
        .strip_prefix(&layout.state_dir)
        .context("a cluster's directory is in the state directory")?
        .join(SNAPSHOT);
    let to = files.join(&rel);
    if let Some(parent) = to.parent() {
        socialweb_proc::owner_only::dir(parent)?;
    }
    save(&layout.kube, cluster, &to)
        .await
        .with_context(|| format!("cluster {}: its etcd's snapshot", cluster_name(cluster)))?;
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))?;
    let (sha256, size) = digest(&to)?;
    Ok(Entry {
        path: rel,
        size,
        mode: 0o600,
        sha256,
        how: "etcd snapshot".into(),
    })
}

/// Copies `from` to a new file `to`, made 0600 before a byte is in it.
fn copy_private(from: &Path, to: &Path) -> Result<()> {
    let mut src =
        std::fs::File::open(from).with_context(|| format!("reading {}", from.display()))?;
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .with_context(|| format!("creating {}", to.display()))?;
    std::io::copy(&mut src, &mut dst).with_context(|| format!("copying {}", from.display()))?;
    dst.sync_all()?;
    Ok(())
}

/// `socialweb-broker backup`: everything the broker needs from `layout.state_dir`, into
/// `to` (empty or absent), while it serves; `version` is the broker's `--version`.
pub async fn backup(layout: &Layout, to: &Path, version: &str) -> Result<Manifest> {
    if !layout.state_dir.is_dir() {
        bail!(
            "the state directory {} is not there",
            layout.state_dir.display()
        );
    }
    fresh_dir(to, "the backup directory")?;
    let files = to.join(FILES);
    socialweb_proc::owner_only::dir(&files)?;
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    walk(layout, &layout.state_dir, &mut found, &mut skipped)?;
    let store = match layout.sqlite_store() {
        Some(db) if db.starts_with(&layout.state_dir) => "sqlite",
        Some(db) => {
            found.push((db, Kind::Sqlite));
            "sqlite"
        }
        None => {
            skipped.push(Skipped {
                what: "the store (PostgreSQL)".into(),
                why: "the database is the operator's: back it up with pg_dump (it holds the \
                      store only; this backup holds every file)"
                    .into(),
            });
            "postgres"
        }
    };
    let mut entries = Vec::new();
    for (path, k) in found {
        match k {
            Kind::Etcd => entries.extend(take_etcd(layout, &path, &files).await?),
            k => entries.push(take(layout, &path, k, &files).await?),
        }
    }
    let manifest = Manifest {
        format: 1,
        broker_version: version.to_string(),
        created_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        state_dir: layout.state_dir.clone(),
        store: store.into(),
        bytes: entries.iter().map(|e| e.size).sum(),
        files: entries,
        skipped,
    };
    socialweb_proc::owner_only::write_atomic(
        &to.join(MANIFEST),
        serde_json::to_string_pretty(&manifest)?.as_bytes(),
    )?;
    Ok(manifest)
}

/// Reads `<from>/manifest.json` and checks every file it names against it: present, the
/// same size, the same sha256. The first that differs is named.
pub fn verify(from: &Path) -> Result<Manifest> {
    let path = from.join(MANIFEST);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let m: Manifest =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    if m.format != 1 {
        bail!(
            "{}: format {} is not one this broker reads (1)",
            path.display(),
            m.format
        );
    }
    for e in &m.files {
        if e.path.is_absolute() || e.path.components().any(|c| c.as_os_str() == "..") {
            bail!(
                "{}: {} is not a path inside the state directory",
                path.display(),
                e.path.display()
            );
        }
        let file = from.join(FILES).join(&e.path);
        let (sha256, size) = digest(&file).with_context(|| {
            format!("the backup's {} is missing or unreadable", e.path.display())
        })?;
        if (sha256.as_str(), size) != (e.sha256.as_str(), e.size) {
            bail!(
                "the backup's {} does not match its manifest: sha256 {sha256} ({size} bytes), the manifest says {} ({} bytes); refusing to restore from {}",
                e.path.display(),
                e.sha256,
                e.size,
                from.display()
            );
        }
    }
    Ok(m)
}

/// `socialweb-broker restore`: checks the backup `from`, then writes it into
/// `layout.state_dir`, which must be empty or absent (and, for an SQLite store outside it,
/// so must the store's file). Directories 0700, files in the modes they had.
pub fn restore(layout: &Layout, from: &Path) -> Result<Manifest> {
    let m = verify(from)?;
    let state = &layout.state_dir;
    if state.exists() && std::fs::read_dir(state)?.next().is_some() {
        bail!(
            "the state directory {} is not empty: restore only into an empty or absent one",
            state.display()
        );
    }
    let store_file = layout.sqlite_store().filter(|db| !db.starts_with(state));
    if let Some(db) = &store_file
        && db.exists()
    {
        bail!(
            "the store {} exists: restore would overwrite it",
            db.display()
        );
    }
    socialweb_proc::owner_only::dir(state)?;
    for e in &m.files {
        let to = match &store_file {
            // The store taken from outside the state directory goes back where it is now.
            Some(db) if e.path.starts_with(OUTSIDE) => db.clone(),
            _ if e.path.starts_with(OUTSIDE) => bail!(
                "the backup holds a store from outside its state directory ({}), and the store configured now is not an SQLite file outside {}",
                e.path.display(),
                state.display()
            ),
            _ => state.join(&e.path),
        };
        if let Some(parent) = to.parent() {
            socialweb_proc::owner_only::dir(parent)?;
        }
        copy_private(&from.join(FILES).join(&e.path), &to)?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(e.mode & 0o7777))?;
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(dir: &Path) -> Layout {
        let state = dir.join("state");
        Layout {
            store: format!("sqlite://{}?mode=rwc", state.join("broker.db").display()),
            clusters: state.join("clusters"),
            skip: vec![state.join("local-provider/nodes")],
            state_dir: state,
            // No etcd serves in these tests: never run.
            kube: PathBuf::from("/nonexistent/kube"),
        }
    }

    fn base(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sw-backup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    async fn sqlite(db: &Path, value: &str) {
        let mut c = SqliteConnectOptions::new()
            .filename(db)
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .connect()
            .await
            .unwrap();
        sqlx::query("CREATE TABLE IF NOT EXISTS t (v TEXT)")
            .execute(&mut c)
            .await
            .unwrap();
        sqlx::query("INSERT INTO t VALUES ($1)")
            .bind(value)
            .execute(&mut c)
            .await
            .unwrap();
        std::mem::forget(c); // open, as the broker's would be: its WAL not checkpointed
    }

    fn write(p: &Path, bytes: &str, mode: u32) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A state directory with a store, a kine cluster, an etcd cluster and the files around.
    async fn state(l: &Layout) {
        let s = &l.state_dir;
        socialweb_proc::owner_only::dir(s).unwrap();
        sqlite(&s.join("broker.db"), "store").await;
        let c = l.clusters.join("ci-0123abcd");
        write(&c.join("pki/ca.key"), "key", 0o600);
        write(&c.join("pki/ca.crt"), "crt", 0o644);
        write(&c.join("logs/apiserver.log"), "log", 0o644);
        write(&c.join("run/kine.pid"), "1", 0o644);
        socialweb_proc::owner_only::dir(&c.join("kine")).unwrap();
        sqlite(&c.join("kine/state.db"), "object").await;
        write(
            &l.clusters.join("kv-89abcdef/etcd/member/snap/db"),
            "bolt",
            0o600,
        );
        write(
            &l.clusters.join("kv-89abcdef/etcd/member/wal/0.wal"),
            "wal",
            0o600,
        );
        write(&s.join("tunnel.key"), "tk", 0o600);
        write(&s.join("local-provider/provider.json"), "{}", 0o600);
        write(&s.join("local-provider/nodes/x/agent.log"), "x", 0o644);
    }

    #[tokio::test]
    async fn a_backup_holds_the_state_and_restores_it_with_its_modes() {
        let d = base("round");
        let l = layout(&d);
        state(&l).await;
        let m = backup(&l, &d.join("b"), "test").await.unwrap();
        let paths: Vec<String> = m
            .files
            .iter()
            .map(|e| e.path.display().to_string())
            .collect();
        assert_eq!(
            paths,
            [
                "broker.db",
                "clusters/ci-0123abcd/kine/state.db",
                "clusters/ci-0123abcd/pki/ca.crt",
                "clusters/ci-0123abcd/pki/ca.key",
                // A stopped etcd (no live pidfile): its files as they are.
                "clusters/kv-89abcdef/etcd/member/snap/db",
                "clusters/kv-89abcdef/etcd/member/wal/0.wal",
                "local-provider/provider.json",
                "tunnel.key"
            ]
        );
        assert!(m.skipped.is_empty(), "{:?}", m.skipped);
        let to = layout(&d.join("restored"));
        restore(&to, &d.join("b")).unwrap();
        let key = to.clusters.join("ci-0123abcd/pki/ca.key");
        assert_eq!(mode_of(&key).unwrap(), 0o600);
        let wal = to.clusters.join("kv-89abcdef/etcd/member/wal/0.wal");
        assert_eq!(std::fs::read_to_string(wal).unwrap(), "wal");
        assert_eq!(
            mode_of(&to.clusters.join("ci-0123abcd/pki")).unwrap(),
            0o700
        );
        let mut c = SqliteConnectOptions::new()
            .filename(to.clusters.join("ci-0123abcd/kine/state.db"))
            .connect()
            .await
            .unwrap();
        let v: String = sqlx::query_scalar("SELECT v FROM t")
            .fetch_one(&mut c)
            .await
            .unwrap();
        assert_eq!(
            v, "object",
            "the snapshot holds the last commit, its WAL's included"
        );
        let again = restore(&to, &d.join("b")).unwrap_err();
        assert!(format!("{again:#}").contains("is not empty"), "{again:#}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[tokio::test]
    async fn a_corrupted_backup_is_refused_naming_the_file() {
        let d = base("corrupt");
        let l = layout(&d);
        state(&l).await;
        backup(&l, &d.join("b"), "test").await.unwrap();
        std::fs::write(d.join("b/state/tunnel.key"), "tX").unwrap();
        let to = layout(&d.join("restored"));
        let e = format!("{:#}", restore(&to, &d.join("b")).unwrap_err());
        assert!(e.contains("tunnel.key does not match its manifest"), "{e}");
        assert!(!to.state_dir.exists(), "nothing written");
        std::fs::remove_file(d.join("b/state/tunnel.key")).unwrap();
        let e = format!("{:#}", verify(&d.join("b")).unwrap_err());
        assert!(e.contains("tunnel.key is missing"), "{e}");
        let busy = backup(&l, &d.join("b"), "test").await.unwrap_err();
        assert!(format!("{busy:#}").contains("is not empty"), "{busy:#}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
