//! A cluster's control plane in a cgroup of its own (docs/security.md, "Budgets"): its
//! apiserver, datastore, controller-manager and scheduler share one budget
//! ([`socialweb_proc::cgroup`]), so a tenant that grows its cluster (Secrets by the
//! gigabyte, a watch storm) is stopped at its budget and not at the host's.

use std::path::Path;

pub use socialweb_proc::cgroup::{Budget, Cgroup};

/// The cgroup name of the cluster whose directory is `dir`: unique per directory, so two
/// brokers on one host (or a cluster re-created under its old name) never share one.
pub fn name_for(dir: &Path) -> String {
    use sha2::Digest;
    let h = sha2::Sha256::digest(dir.as_os_str().as_encoded_bytes());
    let hex: String = h.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("socialweb-cluster-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cluster_directory_has_its_own_cgroup() {
        let a = name_for(Path::new("/var/lib/socialweb/clusters/ci-0a1b2c3d"));
        let b = name_for(Path::new("/srv/other/clusters/ci-0a1b2c3d"));
        assert_ne!(a, b);
        assert!(
            a.starts_with("socialweb-cluster-") && a.len() == 18 + 16,
            "{a}"
        );
    }
}
