//! Owner-only places on disk: the broker's and the provider's state hold bootstrap-token
//! secrets, mesh keys, CA keys and identity documents (docs/security.md), so their
//! directories are 0700 and their record files 0600, made so and kept so (a directory an
//! older version left 0755 is tightened at start); their control sockets are 0600 and check
//! who connects.

use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Creates `dir` (and its parents) mode 0700, or tightens it to 0700 if it exists.
pub fn dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    tighten(dir, 0o700)
}

/// A Unix socket at `path` that only this process's user (and root) may connect to: its
/// directory made 0700 when missing (an existing one is left as it is: it may be `/run`), a
/// socket a killed process left removed, the new one bound and made 0600. The one way the
/// agent's and the broker's control sockets, an apiserver's egress sockets and the embedded
/// provider's socket are made.
pub fn unix_listener(path: &Path) -> io::Result<tokio::net::UnixListener> {
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
    }
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Whether the peer of `stream` is root or this process's own user: a control socket's
/// check beyond its file's mode (a mode loosened by hand, a descriptor passed on).
pub fn peer_is_owner(stream: &tokio::net::UnixStream) -> bool {
    let me = nix::unistd::geteuid().as_raw();
    stream
        .peer_cred()
        .is_ok_and(|c| c.uid() == 0 || c.uid() == me)
}

/// Creates `file` empty, mode 0600, if it does not exist; tightens it to 0600 if it does.
pub fn file(file: &Path) -> io::Result<()> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => tighten(file, 0o600),
        Err(e) => Err(e),
    }
}

/// Writes `bytes` to `path` through a 0600 temporary file renamed over it: never a moment
/// with the contents readable by others, never a half-written file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_mode(path, bytes, 0o600)
}

/// [`write_atomic`] with the file's `mode` (made so from the start, never wider): the one
/// way the broker and the provider write a secret or a record.
pub fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn tighten(path: &Path, mode: u32) -> io::Result<()> {
    let m = std::fs::metadata(path)?.permissions().mode() & 0o7777;
    if m & !mode != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(m & mode))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_socket_is_owner_only_and_replaces_a_stale_one() {
        let d = std::env::temp_dir().join(format!("sw-owner-sock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let path = d.join("run/ctl.sock");
        drop(unix_listener(&path).unwrap());
        // A socket file left behind does not stop the next bind.
        let l = unix_listener(&path).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        let client = tokio::net::UnixStream::connect(&path).await.unwrap();
        let (server, _) = l.accept().await.unwrap();
        assert!(peer_is_owner(&server) && peer_is_owner(&client));
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn places_are_made_owner_only_and_wider_ones_are_tightened() {
        let base = std::env::temp_dir().join(format!("sw-owner-only-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let d = base.join("state");
        dir(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir(&d).unwrap();
        assert_eq!(mode(&d), 0o700, "a 0755 directory is tightened");
        let f = d.join("broker.db");
        file(&f).unwrap();
        assert_eq!(mode(&f), 0o600);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        file(&f).unwrap();
        assert_eq!(mode(&f), 0o600);
        let j = d.join("provider.json");
        write_atomic(&j, b"{}").unwrap();
        assert_eq!(
            (mode(&j), std::fs::read(&j).unwrap()),
            (0o600, b"{}".to_vec())
        );
        std::fs::remove_dir_all(&base).unwrap();
    }
}
