//! The node side's one netlink implementation (rtnetlink, no `ip` subprocesses), shared by
//! the CNI plugin and the agent, so "a bridge with this gateway" or "a link by this name"
//! means the same thing to both.
//!
//! - [`link`]: links by name, MACs, bringing up, deleting, bridge ports, dummies.
//! - [`addr`]: IPv4 addresses on a link.
//! - [`bridge`]: the pods' bridge and its gateway address.
//! - [`veth`]: a pod's veth pair and its end inside the pod.
//! - [`route`]: the agent's routes (tagged with [`route::PROTO`]) and the default route's
//!   source.
//!
//! Each function takes a [`Handle`]: [`handle`] opens one on the caller's async runtime,
//! [`run`] on a thread of its own, in another network namespace if asked.

use std::fs::File;
use std::future::Future;

use nix::sched::{CloneFlags, setns};
pub use rtnetlink::Handle;

pub mod addr;
pub mod bridge;
pub mod link;
pub mod route;
pub mod veth;

/// What went wrong, naming the step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A network namespace that cannot be opened or entered.
    #[error("{what} network namespace {path}: {error}")]
    Namespace {
        what: &'static str,
        path: String,
        error: std::io::Error,
    },
    /// The kernel refused a request.
    #[error("{step}: {error}")]
    Kernel {
        step: String,
        error: rtnetlink::Error,
    },
    /// Something that had to be there was not (named).
    #[error("{0}")]
    Missing(String),
    /// The netlink socket or the thread's runtime could not be set up.
    #[error("{what}: {error}")]
    Setup {
        what: &'static str,
        error: std::io::Error,
    },
    #[error("the netlink thread panicked")]
    Panicked,
}

impl Error {
    pub(crate) fn kernel(step: impl Into<String>, error: rtnetlink::Error) -> Error {
        Error::Kernel {
            step: step.into(),
            error,
        }
    }

    /// Whether the kernel refused because a name or address is taken (EEXIST).
    pub fn already_exists(&self) -> bool {
        matches!(self, Error::Kernel { error, .. } if errno(error) == Some(libc::EEXIST))
    }
}

/// The errno of a netlink error, if it is one.
pub(crate) fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

/// A handle whose connection runs on the caller's (tokio) runtime, in the caller's namespace.
pub fn handle() -> Result<Handle, Error> {
    let (conn, handle, _) = rtnetlink::new_connection().map_err(|error| Error::Setup {
        what: "opening a netlink socket",
        error,
    })?;
    tokio::spawn(conn);
    Ok(handle)
}

/// Runs `f` with a netlink handle on a thread of its own (with its own runtime), in the
/// current network namespace or in `netns` (a path such as `/run/netns/x` or
/// `/proc/<pid>/ns/net`), which the thread enters. For callers without a runtime (the CNI
/// plugin) and for work inside a pod's namespace.
pub fn run<F, Fut, R, E>(netns: Option<&str>, f: F) -> Result<R, E>
where
    F: FnOnce(Handle) -> Fut + Send,
    Fut: Future<Output = Result<R, E>>,
    R: Send,
    E: From<Error> + Send,
{
    let ns_file = match netns {
        Some(path) => Some(File::open(path).map_err(|error| Error::Namespace {
            what: "opening",
            path: path.to_string(),
            error,
        })?),
        None => None,
    };
    std::thread::scope(|s| {
        s.spawn(move || {
            if let (Some(file), Some(path)) = (&ns_file, netns) {
                setns(file, CloneFlags::CLONE_NEWNET).map_err(|e| Error::Namespace {
                    what: "entering",
                    path: path.to_string(),
                    error: e.into(),
                })?;
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|error| Error::Setup {
                    what: "starting the runtime",
                    error,
                })?;
            rt.block_on(async {
                let handle = handle()?;
                f(handle).await
            })
        })
        .join()
        .unwrap_or_else(|_| Err(Error::Panicked.into()))
    })
}
