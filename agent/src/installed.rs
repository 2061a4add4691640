//! What the agent has put on the machine (addresses, the masquerade table, the mesh's device
//! and routes, children), each with how to take it away again. A step records what it
//! installed the moment it has; the shutdown undoes the records newest first, so the order
//! things went on is the order they come off in reverse, and a bring-up stopped midway undoes
//! exactly what it got to. Undoing is async (netlink, children's grace periods), which a
//! `Drop` cannot be, so the records are explicit and [`crate::agent`] undoes them on every way
//! out of `run`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tracing::{info, warn};

type Undo = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// One thing installed.
struct Record {
    what: String,
    undo: Undo,
}

/// The records, shared by the steps that add to them.
#[derive(Clone, Default)]
pub struct Installed {
    records: Arc<Mutex<Vec<Record>>>,
}

impl std::fmt::Debug for Installed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.list()).finish()
    }
}

impl Installed {
    /// Records that `what` is installed and how to remove it. Recording the same `what`
    /// again (a step retried) keeps its first place and the newest way to undo it.
    pub fn record<F>(&self, what: impl Into<String>, undo: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let what = what.into();
        let mut records = self.records.lock().expect("lock");
        match records.iter_mut().find(|r| r.what == what) {
            Some(r) => r.undo = Box::pin(undo),
            None => records.push(Record {
                what,
                undo: Box::pin(undo),
            }),
        }
    }

    /// What is installed, oldest first.
    pub fn list(&self) -> Vec<String> {
        let records = self.records.lock().expect("lock");
        records.iter().map(|r| r.what.clone()).collect()
    }

    /// Undoes everything, newest first; a failure is logged and the rest still undone.
    /// Returns what was undone, in that order.
    pub async fn undo_all(&self) -> Vec<String> {
        let records = std::mem::take(&mut *self.records.lock().expect("lock"));
        let mut undone = Vec::with_capacity(records.len());
        for r in records.into_iter().rev() {
            match r.undo.await {
                Ok(()) => info!("removed {}", r.what),
                Err(e) => warn!("removing {}: {e:#}", r.what),
            }
            undone.push(r.what);
        }
        undone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noting(
        log: &Arc<Mutex<Vec<String>>>,
        what: &str,
    ) -> impl Future<Output = anyhow::Result<()>> + Send + 'static {
        let (log, what) = (log.clone(), what.to_string());
        async move {
            log.lock().unwrap().push(what.clone());
            if what == "b" {
                anyhow::bail!("b will not go")
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn undone_newest_first_even_past_a_failure_and_a_retry_keeps_its_place() {
        let log = Arc::new(Mutex::new(vec![]));
        let installed = Installed::default();
        installed.record("a", noting(&log, "a"));
        installed.record("b", noting(&log, "b"));
        installed.record("c", noting(&log, "c"));
        installed.record("a", noting(&log, "a"));
        assert_eq!(installed.list(), ["a", "b", "c"]);
        assert_eq!(installed.undo_all().await, ["c", "b", "a"]);
        assert_eq!(*log.lock().unwrap(), ["c", "b", "a"]);
        assert!(installed.list().is_empty());
        assert!(installed.undo_all().await.is_empty());
    }
}
