//! A cgroup root per node, so each kubelet manages its own tree and everything in it can be
//! killed and removed when the node goes. The same cgroup roots the local provider gives its
//! machines (`socialweb_provider::machine`), from the same code.

use anyhow::Result;
use socialweb_provider::machine;

/// `/sys/fs/cgroup/<controller>/<name>` for every controller mounted.
#[derive(Debug)]
pub struct CgroupRoot {
    pub name: String,
}

impl CgroupRoot {
    pub fn create(name: &str) -> Result<CgroupRoot> {
        machine::create_cgroup(name)?;
        Ok(CgroupRoot {
            name: name.to_string(),
        })
    }

    /// Kills every process in the tree and removes the tree, deepest first.
    pub fn destroy(&self) {
        machine::destroy_cgroup(&self.name);
    }
}
