//! What belongs to which test run: every name the harness gives (network namespaces,
//! scratch directories, cgroup roots) starts with [`PREFIX`] and the creating process's id,
//! so that a later run can tell a killed run's leftovers (their process is gone) from those
//! of a run still going, and sweep only the former. The bottom of the harness: it imports
//! none of it.

use std::path::Path;

use socialweb_provider::machine;

/// Every name the harness gives starts with this; nothing else does.
pub const PREFIX: &str = "swt-";

/// The process that made `name` (`swt-<pid>-...`), if the harness named it.
pub fn owner_pid(name: &str) -> Option<i32> {
    name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

/// Whether `name` is the harness's and the run that made it is gone.
pub fn of_a_dead_run(name: &str) -> bool {
    owner_pid(name).is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// Removes cgroup roots left by dead runs (nodes' and machines' trees).
pub fn sweep_cgroups() {
    for name in machine::cgroups_with_prefix(PREFIX) {
        if of_a_dead_run(&name) {
            machine::destroy_cgroup(&name);
        }
    }
}
