//! `[backup]`: backups the broker takes of its own state on a schedule while it runs.

use std::path::PathBuf;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::durations::{HumanDuration, humantime_serde_compat};
use super::{ConfigError, err};

/// `[backup]`: every `interval` the broker writes what `socialweb-broker backup` would into
/// a directory of its own under `dir` (named by the UTC second it began,
/// `20261207T135000Z`), keeps the newest `keep`, and runs `command` on each finished one
/// (docs/operations.md, "Backup and restore").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Backup {
    /// How often it backs up (at least 5s); `0s`: never (back up by hand or from a timer
    /// with `socialweb-broker backup`).
    #[serde(with = "humantime_serde_compat")]
    #[schemars(with = "HumanDuration")]
    pub interval: Duration,
    /// How many of its own backups it keeps in `dir`, the oldest removed first (at least
    /// 1). Nothing else in `dir` is touched.
    pub keep: u32,
    /// Where the backups go: outside the state directory, ideally on another disk.
    pub dir: PathBuf,
    /// A command run on each finished backup, with the backup's directory as its last
    /// argument (e.g. `["rsync", "-a", "--", "backups.example.net:/srv/broker/"]` to copy it
    /// off the host); its failure is logged and counted, and the backup is kept. Empty: none.
    pub command: Vec<String>,
}

impl Backup {
    /// Off and nothing else set: what need not be written (an older broker knows no
    /// `[backup]`).
    pub fn is_default(&self) -> bool {
        *self == Backup::default()
    }

    /// On: an interval, `keep`, a `dir` outside `state_dir`, a command with a program.
    pub(super) fn check(
        &self,
        state_dir: &std::path::Path,
        o: &impl Fn(&str) -> String,
    ) -> Result<(), ConfigError> {
        if self.interval.is_zero() {
            return Ok(());
        }
        if self.interval < Duration::from_secs(5) {
            return Err(err(
                &o("backup.interval"),
                "must be 0s (never) or at least 5s",
            ));
        }
        if self.keep == 0 {
            return Err(err(&o("backup.keep"), "must be at least 1"));
        }
        if !self.dir.is_absolute() || self.dir.starts_with(state_dir) {
            return Err(err(
                &o("backup.dir"),
                format!(
                    "{} must be an absolute path outside state_dir ({}): a backup must not \
                     back up the backups",
                    self.dir.display(),
                    state_dir.display()
                ),
            ));
        }
        if self.command.first().is_some_and(|c| c.trim().is_empty()) {
            return Err(err(
                &o("backup.command"),
                "its first item must name a program",
            ));
        }
        Ok(())
    }
}

impl Default for Backup {
    fn default() -> Backup {
        Backup {
            interval: Duration::ZERO,
            keep: 7,
            dir: "/var/backups/socialweb-broker".into(),
            command: Vec::new(),
        }
    }
}
