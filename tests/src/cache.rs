//! The suite's cache (`~/.cache/socialweb`, or `$SOCIALWEB_CACHE`): entries built on first use
//! and kept across runs, shared by every test process. `./x test` runs two test binaries at
//! once, so an entry is built under a lock that holds across processes, and a file in it is
//! replaced whole (written aside, then renamed) and only when its bytes change: a process
//! that reads it never sees it half-written, and one that hashes it (the image builder's
//! fingerprint) never sees it change under it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The cache directory.
pub fn dir() -> PathBuf {
    std::env::var_os("SOCIALWEB_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/socialweb")
        })
}

/// An exclusive lock on the cache entry `name`, held until the returned file is dropped. It
/// is `flock(2)` on `.lock-<name>`: it excludes other processes and other threads of this
/// one alike (each call opens the file anew), and the kernel lets it go with a killed
/// process. Taking a second lock on the same name in one thread while holding the first
/// deadlocks.
pub fn lock(name: &str) -> Result<File> {
    let dir = dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!(".lock-{name}"));
    let file = File::create(&path).with_context(|| format!("opening {}", path.display()))?;
    file.lock()
        .with_context(|| format!("locking {}", path.display()))?;
    Ok(file)
}

/// A name beside `path` for writing its next contents: this process's id and a sequence
/// number, so concurrent writers never share one.
pub fn aside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}-{seq}", std::process::id()))
}

/// Moves `written` (made by [`aside`]) to `path`, unless `path` already holds the same bytes:
/// then `written` is removed and `path` is left as it is.
pub fn replace_if_changed(written: &Path, path: &Path) -> Result<()> {
    let new = std::fs::read(written).with_context(|| format!("reading {}", written.display()))?;
    if std::fs::read(path).is_ok_and(|old| old == new) {
        let _ = std::fs::remove_file(written);
        return Ok(());
    }
    std::fs::rename(written, path)
        .with_context(|| format!("moving {} to {}", written.display(), path.display()))
}

/// Writes `bytes` to `path` the way [`replace_if_changed`] does.
pub fn write_if_changed(path: &Path, bytes: impl AsRef<[u8]>) -> Result<()> {
    let bytes = bytes.as_ref();
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    let written = aside(path);
    std::fs::write(&written, bytes).with_context(|| format!("writing {}", written.display()))?;
    std::fs::rename(&written, path)
        .with_context(|| format!("moving {} to {}", written.display(), path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_replaced_only_when_its_bytes_change() {
        let dir = crate::tmp::TempDir::new("cache-unit").unwrap();
        let path = dir.path().join("input");
        write_if_changed(&path, "one").unwrap();
        let first = std::fs::metadata(&path).unwrap();
        write_if_changed(&path, "one").unwrap();
        let same = std::fs::metadata(&path).unwrap();
        assert_eq!(
            std::os::unix::fs::MetadataExt::ino(&first),
            std::os::unix::fs::MetadataExt::ino(&same),
            "the same bytes must leave the file as it was"
        );
        write_if_changed(&path, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("input")],
            "nothing left aside"
        );
    }

    #[test]
    fn a_lock_excludes_another_holder_until_dropped() {
        let name = format!("unit-{}", std::process::id());
        let held = lock(&name).unwrap();
        let path = dir().join(format!(".lock-{name}"));
        let other = File::open(&path).unwrap();
        assert!(
            matches!(other.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
            "a second holder must wait while the lock is held"
        );
        drop(held);
        other.try_lock().expect("free once the holder is gone");
        drop(other);
        let _ = std::fs::remove_file(path);
    }
}
