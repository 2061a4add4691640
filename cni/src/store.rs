//! The allocation table on disk: one JSON file per network, changed only under an exclusive
//! `flock` and replaced atomically (write a temporary file, rename it over the table), so
//! concurrent ADDs from separate processes serialise and a process killed at any point leaves
//! either the old table or the new one, never a torn file.
//!
//! No fsync: allocations only mean something within one boot (the table records the boot id
//! and the next ADD drops everything from an earlier boot), and a killed process cannot lose
//! what it wrote to the page cache. Only a kernel crash could, and that is a reboot, after
//! which the lost writes would have been reclaimed anyway.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::ipam::{FORMAT, Table};
use crate::spec::{CniError, Code};

/// The table of one network: `<dataDir>/<network>/allocations.json`, locked through
/// `<dataDir>/<network>/lock`.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
}

fn io(what: impl std::fmt::Display, e: impl std::fmt::Display) -> CniError {
    CniError::new(Code::Io, format!("{what}: {e}"))
}

impl Store {
    pub fn new(data_dir: &Path, network: &str) -> Store {
        Store {
            dir: data_dir.join(network),
        }
    }

    pub fn table_path(&self) -> PathBuf {
        self.dir.join("allocations.json")
    }

    /// Reads the table under the lock without changing it.
    pub fn read(&self) -> Result<Table, CniError> {
        self.update(|t| Ok(t.clone()))
    }

    /// Runs `f` on the table under the exclusive lock and saves the table if `f` changed it.
    /// If `f` fails nothing is saved.
    pub fn update<R>(
        &self,
        f: impl FnOnce(&mut Table) -> Result<R, CniError>,
    ) -> Result<R, CniError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| io(format!("creating {}", self.dir.display()), e))?;
        let lock_path = self.dir.join("lock");
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| io(format!("opening {}", lock_path.display()), e))?;
        let _lock = Flock::lock(lock_file, FlockArg::LockExclusive)
            .map_err(|(_, e)| io(format!("locking {}", lock_path.display()), e))?;

        let path = self.table_path();
        let before = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<Table>(&bytes).map_err(|e| {
                CniError::new(
                    Code::Io,
                    format!("{} is not a valid allocation table", path.display()),
                )
                .with_details(format!(
                    "{e}; it is left as it is: move it aside to start over (addresses it \
                         records may then be handed out twice)"
                ))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Table::default(),
            Err(e) => return Err(io(format!("reading {}", path.display()), e)),
        };
        if before.format != FORMAT {
            return Err(CniError::new(
                Code::Io,
                format!(
                    "{} has format {}, this plugin reads format {FORMAT}",
                    path.display(),
                    before.format
                ),
            ));
        }
        let mut table = before.clone();
        let result = f(&mut table)?;
        if table != before {
            self.save(&table)?;
        }
        Ok(result)
    }

    fn save(&self, table: &Table) -> Result<(), CniError> {
        let path = self.table_path();
        let tmp = self.dir.join("allocations.json.tmp");
        let text = serde_json::to_vec_pretty(table).map_err(|e| io("encoding the table", e))?;
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io(format!("writing {}", tmp.display()), e))?;
        f.write_all(&text)
            .map_err(|e| io(format!("writing {}", tmp.display()), e))?;
        fs::rename(&tmp, &path).map_err(|e| io(format!("replacing {}", path.display()), e))?;
        Ok(())
    }
}
