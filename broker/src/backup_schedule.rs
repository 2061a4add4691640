//! Backups on a schedule (`[backup]`; docs/operations.md, "Backup and restore"): every
//! `backup.interval` the daemon takes what `socialweb-broker backup` takes ([`crate::backup`])
//! into `<backup.dir>/<YYYYMMDDTHHMMSSZ>`, written as `<name>.partial` and renamed once
//! whole (a crash leaves a `.partial`, never a backup that looks finished), keeps the newest
//! `backup.keep` (the core's [`socialweb_broker_core::backups`] says which go), then runs
//! `backup.command` on it. Each is logged and counted; a failure waits for the next turn.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::backup::Layout;
use crate::config::Backup;

/// How long `backup.command` may run before it is killed and counted as failed.
const COMMAND_WITHIN: Duration = Duration::from_secs(3600);

/// Starts the schedule of `settings` over the state `layout` describes when
/// `backup.interval` is set; nothing otherwise.
pub fn spawn(
    layout: Layout,
    settings: &Backup,
    metrics: &crate::metrics::Metrics,
    stop: &CancellationToken,
) {
    if settings.interval.is_zero() {
        return;
    }
    let metrics = metrics.backups.clone();
    metrics.scheduled(settings.interval, unix_secs(SystemTime::now()));
    let (settings, stop) = (settings.clone(), stop.clone());
    info!(every = ?settings.interval, dir = %settings.dir.display(), keep = settings.keep, "scheduled backups");
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(settings.interval) => {}
                _ = stop.cancelled() => return,
            }
            match once(&layout, &settings).await {
                Ok(done) => {
                    info!(backup = %done.display(), "scheduled backup finished");
                    metrics.taken(unix_secs(SystemTime::now()));
                }
                Err(e) => {
                    warn!("scheduled backup: {e:#}");
                    metrics.failed();
                }
            }
        }
    });
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A backup's name for `t`: the UTC second, `YYYYMMDDTHHMMSSZ`.
fn name_at(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect()
}

/// One scheduled backup, its retention and its command: the finished backup's directory.
async fn once(layout: &Layout, settings: &Backup) -> Result<PathBuf> {
    socialweb_proc::owner_only::dir(&settings.dir)
        .with_context(|| format!("backup.dir {}", settings.dir.display()))?;
    let name = name_at(SystemTime::now());
    let done = settings.dir.join(&name);
    if done.exists() {
        bail!("{} exists already", done.display());
    }
    let partial = settings.dir.join(format!("{name}.partial"));
    let _ = std::fs::remove_dir_all(&partial);
    crate::backup::backup(layout, &partial, crate::VERSION)
        .await
        .with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, &done)
        .with_context(|| format!("renaming {} to {name}", partial.display()))?;
    prune(&settings.dir, settings.keep)?;
    if !settings.command.is_empty() {
        run_command(&settings.command, &done).await?;
    }
    Ok(done)
}

/// Removes the broker's own backups in `dir` past the newest `keep`, and partial ones a
/// crash left (none is being written: one backup runs at a time).
fn prune(dir: &Path, keep: u32) -> Result<()> {
    let names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    let partial = names.iter().filter(|n| {
        n.strip_suffix(".partial")
            .is_some_and(socialweb_broker_core::backups::is_backup)
    });
    let old = socialweb_broker_core::backups::to_prune(&names, keep as usize);
    for n in old.iter().chain(partial) {
        std::fs::remove_dir_all(dir.join(n))
            .with_context(|| format!("removing the old backup {}", dir.join(n).display()))?;
        info!(backup = %n, "old backup removed");
    }
    Ok(())
}

/// Runs `command` with `backup` as its last argument; an error names its exit and stderr.
async fn run_command(command: &[String], backup: &Path) -> Result<()> {
    let out = tokio::time::timeout(
        COMMAND_WITHIN,
        tokio::process::Command::new(&command[0])
            .args(&command[1..])
            .arg(backup)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("backup.command {command:?} ran past {COMMAND_WITHIN:?}"))?
    .with_context(|| format!("starting backup.command {command:?}"))?;
    if !out.status.success() {
        bail!(
            "backup.command {command:?} on {}: {}: {}",
            backup.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_is_named_by_its_utc_second() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_651_400);
        let name = name_at(t);
        assert_eq!(name, "20261207T135000Z");
        assert!(socialweb_broker_core::backups::is_backup(&name));
    }

    #[tokio::test]
    async fn old_and_partial_backups_go_and_a_failed_command_is_named() {
        let dir = std::env::temp_dir().join(format!("sw-backup-schedule-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for n in [
            "20261201T000000Z",
            "20261202T000000Z",
            "20261203T000000Z",
            "20261204T000000Z.partial",
            "mine",
        ] {
            std::fs::create_dir_all(dir.join(n)).unwrap();
        }
        prune(&dir, 2).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["20261202T000000Z", "20261203T000000Z", "mine"]);
        let e = run_command(&["false".to_string()], &dir).await.unwrap_err();
        assert!(format!("{e:#}").contains("exit status: 1"), "{e:#}");
        run_command(&["test".into(), "-d".into()], &dir)
            .await
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
