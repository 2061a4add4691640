//! The mesh's own runtime: the data path (TUN reads and writes, QUIC's drivers, the
//! queues) runs on a thread of its own, apart from the agent's other work (the Kubernetes
//! watches, DNS forwarding, supervising the kubelet). With one thread every hand-off on the
//! path -- the TUN reader to the peer's sender, QUIC's endpoint driver to its connection
//! driver to our reader -- is a task switch, not a wake-up of another thread: on two cores
//! shared with the pods, cross-thread hand-offs and the connection lock they contend for cost
//! more than they parallelise (docs/mesh.md has the figures).
//!
//! The thread runs under SCHED_FIFO by default (`--mesh-realtime 1`), ahead of every
//! normally scheduled thread, as the kernel's own network processing runs ahead of user
//! space: on two cores shared with the pods, the mesh's thread otherwise spent 20-25 % of a
//! bulk transfer runnable but waiting for a CPU, and every packet of every flow -- a ping
//! beside the transfer too -- waited with it. It sleeps whenever no packet is waiting, and the
//! kernel's RT throttling (`kernel.sched_rt_runtime_us`, 95 % by default) leaves the rest a
//! share even if it never did.

use anyhow::{Context, Result};
use thread_priority::{
    RealtimeThreadSchedulePolicy, ThreadPriority, ThreadPriorityValue, ThreadSchedulePolicy,
};
use tokio::runtime::{Builder, Handle};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::warn;

/// A running mesh runtime; dropping the guard stops it (and every task on it).
#[derive(Debug)]
pub struct MeshRuntime {
    pub handle: Handle,
    /// How the mesh's thread is scheduled, as `mesh status` shows it.
    pub scheduling: String,
    _stop: DropGuard,
}

/// How the mesh's threads ask to be scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduling {
    /// SCHED_FIFO priority (1-99); 0: the normal scheduler.
    pub realtime: u8,
    /// Nice value under the normal scheduler (and if SCHED_FIFO is refused).
    pub nice: i8,
}

/// Starts the runtime on `threads` threads (1: a current-thread runtime on one thread), each
/// scheduled as `sched` asks.
pub fn start(threads: u8, sched: Scheduling) -> Result<MeshRuntime> {
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
                    .on_thread_start(move || {
                        apply(sched);
                    });
                b
            };
            let scheduling = apply(sched);
            match builder.enable_all().build() {
                Ok(rt) => {
                    let _ = tx.send(Ok((rt.handle().clone(), scheduling)));
                    rt.block_on(token.cancelled());
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        })
        .context("starting the mesh's thread")?;
    let (handle, scheduling) = rx
        .recv()
        .context("the mesh's thread ended before its runtime started")?
        .context("building the mesh's runtime")?;
    Ok(MeshRuntime {
        handle,
        scheduling,
        _stop: stop.drop_guard(),
    })
}

/// Schedules the calling thread as `sched` asks and says how it ended up. SCHED_FIFO needs
/// CAP_SYS_NICE and, under cgroup v1 with RT group scheduling, a cgroup with an RT budget: a
/// refusal is logged and the thread falls back to the normal scheduler at `nice`, never
/// fatal (the mesh works either way, only with more delay under load).
fn apply(sched: Scheduling) -> String {
    let mut fell_back = None;
    if sched.realtime > 0 {
        let fifo = ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Fifo);
        let set = ThreadPriorityValue::try_from(sched.realtime)
            .map_err(|e| e.to_string())
            .and_then(|p| {
                thread_priority::set_thread_priority_and_policy(
                    thread_priority::thread_native_id(),
                    ThreadPriority::Crossplatform(p),
                    fifo,
                )
                .map_err(|e| match e {
                    // errno, as the kernel's words (EPERM: "Operation not permitted").
                    thread_priority::Error::OS(n) => {
                        std::io::Error::from_raw_os_error(n).to_string()
                    }
                    e => e.to_string(),
                })
            });
        match set {
            Ok(()) => return format!("SCHED_FIFO {}", sched.realtime),
            Err(e) => {
                warn!(
                    "the mesh thread runs under the normal scheduler: SCHED_FIFO {} was refused: {e}",
                    sched.realtime
                );
                fell_back = Some(e);
            }
        }
    }
    if sched.nice != 0
        && let Err(e) = rustix::process::setpriority_process(None, i32::from(sched.nice))
    {
        warn!(
            "the mesh thread keeps its nice value: setting {}: {e}",
            sched.nice
        );
    }
    let nice = rustix::process::getpriority_process(None).unwrap_or(0);
    match fell_back {
        Some(e) => format!(
            "normal, nice {nice} (SCHED_FIFO {} refused: {e})",
            sched.realtime
        ),
        None => format!("normal, nice {nice}"),
    }
}
