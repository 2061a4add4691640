//! Logs of processes a daemon starts, kept to a size: moved aside to `<log>.1` once over it.
//! The broker's control-plane components, a provider's node agents and an agent's children
//! (containerd, kubelet, kube-proxy with `--child-log-dir`) write theirs with `O_APPEND`,
//! which is what lets [`rotate`] empty a file under a writer that keeps its descriptor.

use std::path::Path;

/// The most a component's log holds before [`rotate`] moves it aside (and the one before
/// it, `<log>.1`, holds as much): a component's logs take at most twice this.
pub const LOG_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// Moves `log` to `<log>.1` (replacing the one before) and empties it, if it holds more than
/// `max` bytes; whether it did. Copied and truncated, not renamed: the component keeps its
/// descriptor, opened with `O_APPEND` (the spawner), so its next line lands at the start of the
/// emptied file. A line written between the copy and the truncation is lost, as with
/// logrotate's `copytruncate`.
pub fn rotate(log: &Path, max: u64) -> std::io::Result<bool> {
    let len = match std::fs::metadata(log) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if len <= max {
        return Ok(false);
    }
    let mut old = log.as_os_str().to_owned();
    old.push(".1");
    std::fs::copy(log, &old)?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(log)?
        .set_len(0)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_log_over_its_size_is_moved_aside_and_its_writer_starts_it_again() {
        let dir = std::env::temp_dir().join(format!("rotate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("apiserver.log");
        // The component's descriptor, as spawn opens it.
        let mut writer = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        writer.write_all(&[b'a'; 100]).unwrap();
        assert!(!rotate(&log, 100).unwrap(), "at the limit, kept");
        writer.write_all(b"b").unwrap();
        assert!(rotate(&log, 100).unwrap());
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        assert_eq!(
            std::fs::read(dir.join("apiserver.log.1")).unwrap().len(),
            101
        );
        writer.write_all(b"next line\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "next line\n",
            "no hole where the old bytes were"
        );
        assert!(!rotate(&dir.join("absent.log"), 1).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
