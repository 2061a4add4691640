//! The mesh's own runtime: the data path (TUN reads and writes, QUIC's drivers, the
//! queues) runs on a thread of its own, apart from the agent's other work (the Kubernetes
//! watches, DNS forwarding, supervising the kubelet). With one thread every hand-off on the
//! path -- the TUN reader to the peer's sender, QUIC's endpoint driver to its connection
//! driver to our reader -- is a task switch, not a wake-up of another thread: on two cores
//! shared with the pods, cross-thread hand-offs and the connection lock they contend for cost
//! more than they parallelise (docs/mesh.md has the figures). The thread may run at a
//! better nice value than the pods, as the kernel's own network processing does.

use anyhow::{Context, Result};
use tokio::runtime::{Builder, Handle};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::warn;

/// A running mesh runtime; dropping the guard stops it (and every task on it).
#[derive(Debug)]
pub struct MeshRuntime {
    pub handle: Handle,
    _stop: DropGuard,
}

/// Starts the runtime on `threads` threads (1: a current-thread runtime on one thread), each
/// at nice value `nice`.
pub fn start(threads: u8, nice: i8) -> Result<MeshRuntime> {
    let stop = CancellationToken::new();
    let (tx, rx) = std::sync::mpsc::channel();
    let token = stop.clone();
    std::thread::Builder::new()
        .name("mesh".into())
        .spawn(move || {
            let mut builder = if threads <= 1 {
                Builder::new_current_thread()
            } else {
                let mut b = Builder::new_multi_thread();
                b.worker_threads(usize::from(threads))
                    .thread_name("mesh-worker")
                    .on_thread_start(move || set_nice(nice));
                b
            };
            set_nice(nice);
            match builder.enable_all().build() {
                Ok(rt) => {
                    let _ = tx.send(Ok(rt.handle().clone()));
                    rt.block_on(token.cancelled());
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        })
        .context("starting the mesh's thread")?;
    let handle = rx
        .recv()
        .context("the mesh's thread ended before its runtime started")?
        .context("building the mesh's runtime")?;
    Ok(MeshRuntime {
        handle,
        _stop: stop.drop_guard(),
    })
}

/// Sets the calling thread's nice value (per thread on Linux); a failure (no CAP_SYS_NICE
/// for a negative value) is logged, not fatal.
fn set_nice(nice: i8) {
    if nice == 0 {
        return;
    }
    if let Err(e) = rustix::process::setpriority_process(None, i32::from(nice)) {
        warn!("the mesh thread keeps its nice value: setting {nice}: {e}");
    }
}
