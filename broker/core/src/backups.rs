//! Scheduled backups' retention (`[backup]`): which of the broker's own backups in its
//! backup directory go when a new one is finished. Each is a directory named by the UTC
//! second it was begun (`20261207T135000Z`), so names sort as times; anything else in the
//! directory (the operator's own files, a backup still being written, `*.partial`) is not
//! the broker's to remove. Pure: the broker's `backup_schedule` lists and removes.

/// Whether `name` is one of the broker's finished backups: `YYYYMMDDTHHMMSSZ`.
pub fn is_backup(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 16
        && b[8] == b'T'
        && b[15] == b'Z'
        && b[..8].iter().chain(&b[9..15]).all(u8::is_ascii_digit)
}

/// The backups among `names` to remove so that the newest `keep` stay (at least one is
/// always kept), oldest first.
pub fn to_prune(names: &[String], keep: usize) -> Vec<String> {
    let mut ours: Vec<&String> = names.iter().filter(|n| is_backup(n)).collect();
    ours.sort();
    let extra = ours.len().saturating_sub(keep.max(1));
    ours.into_iter().take(extra).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_newest_stay_and_nothing_else_is_touched() {
        let dir = v(&[
            "20261207T120000Z",
            "notes.txt",
            "20261205T120000Z",
            "20261207T130000Z.partial",
            "20261206T120000Z",
            "2026120T120000Z",
            "20261206T12000xZ",
        ]);
        let cases: &[(usize, &[&str])] = &[
            (3, &[]),
            (2, &["20261205T120000Z"]),
            (1, &["20261205T120000Z", "20261206T120000Z"]),
            // Never none: the one just finished stays.
            (0, &["20261205T120000Z", "20261206T120000Z"]),
            (10, &[]),
        ];
        for (keep, want) in cases {
            assert_eq!(to_prune(&dir, *keep), v(want), "keep {keep}");
        }
        assert!(is_backup("20261207T135000Z"));
        assert!(!is_backup("20261207T135000Z.partial") && !is_backup("x"));
    }
}
