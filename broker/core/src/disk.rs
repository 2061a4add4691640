//! The disk guard's rule (`[disk]`): whether the state directory's filesystem has room for
//! new work -- a new cluster, a wake -- given what it has free and the operator's floors.
//! Below a floor the broker starts nothing new; what runs goes on, and nothing already
//! written is touched, so a filling disk costs new work, never the store or a cluster's
//! data. Pure: the broker's `disk` samples `statvfs` and carries it out.

/// What a filesystem has free for an unprivileged writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    pub free_bytes: u64,
    pub free_inodes: u64,
}

/// The operator's floors (`disk.min_free_mib`, `disk.min_free_inodes`); 0: no floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Floor {
    pub min_free_bytes: u64,
    pub min_free_inodes: u64,
}

const MIB: u64 = 1 << 20;

/// Why `space` is below `floor`, naming the setting (`None`: there is room).
pub fn short(space: Space, floor: Floor) -> Option<String> {
    if space.free_bytes < floor.min_free_bytes {
        return Some(format!(
            "the state directory's filesystem has {} MiB free, under disk.min_free_mib ({} MiB)",
            space.free_bytes / MIB,
            floor.min_free_bytes / MIB
        ));
    }
    if space.free_inodes < floor.min_free_inodes {
        return Some(format!(
            "the state directory's filesystem has {} inodes free, under disk.min_free_inodes ({})",
            space.free_inodes, floor.min_free_inodes
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_work_waits_below_either_floor_and_names_it() {
        let floor = Floor {
            min_free_bytes: 64 * MIB,
            min_free_inodes: 1_000,
        };
        let s = |mib: u64, inodes: u64| Space {
            free_bytes: mib * MIB,
            free_inodes: inodes,
        };
        let cases: &[(Space, Floor, Option<&str>)] = &[
            (s(64, 1_000), floor, None),
            (s(1_000, 50_000), floor, None),
            (
                s(63, 50_000),
                floor,
                Some("63 MiB free, under disk.min_free_mib (64 MiB)"),
            ),
            (
                s(1_000, 999),
                floor,
                Some("999 inodes free, under disk.min_free_inodes (1000)"),
            ),
            // Both short: space is named first.
            (s(0, 0), floor, Some("0 MiB free, under disk.min_free_mib")),
            // No floors: never short, even when full.
            (s(0, 0), Floor::default(), None),
        ];
        for (space, floor, want) in cases {
            let got = short(*space, *floor);
            match want {
                None => assert_eq!(got, None, "{space:?}"),
                Some(w) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(w)),
                    "{space:?}: {got:?}, wanted {w:?}"
                ),
            }
        }
    }
}
