//! The daemon's control socket: the operator's `socialweb-broker cluster ...` commands talk
//! to the running daemon here, one JSON request and one JSON answer per connection. The
//! socket is mode 0600 in a 0700 directory and every client's credentials are checked: root
//! or the daemon's own user only.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::warn;

use crate::daemon::Daemon;

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    ClusterCreate {
        name: String,
        wait_secs: u64,
        /// The DID the cluster is for (reachable through the gateway API); `None`: the
        /// operator's own.
        #[serde(default)]
        owner: Option<String>,
    },
    ClusterDelete {
        name: String,
    },
    ClusterList,
    ClusterShow {
        name: String,
    },
    /// The provider's own view of this broker's leases.
    Leases,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Response {
    Ok(serde_json::Value),
    Error(String),
}

const MAX_REQUEST: u64 = 64 * 1024;

/// The socket file, removed when dropped.
#[derive(Debug)]
pub struct Socket(PathBuf);

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Serves `d` on `path`.
pub fn serve(path: &Path, d: Arc<Daemon>) -> Result<Socket> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(path);
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let me = nix::unistd::geteuid().as_raw();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            if !stream
                .peer_cred()
                .is_ok_and(|c| c.uid() == 0 || c.uid() == me)
            {
                warn!(
                    "control socket: refused a client that is neither root nor the broker's user"
                );
                continue;
            }
            let d = d.clone();
            tokio::spawn(async move {
                let _ = one(stream, d).await;
            });
        }
    });
    Ok(Socket(path.to_path_buf()))
}

async fn one(stream: UnixStream, d: Arc<Daemon>) -> Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read.take(MAX_REQUEST))
        .read_line(&mut line)
        .await?;
    let result: Result<serde_json::Value> = async {
        match serde_json::from_str::<Request>(&line).context("bad request")? {
            Request::ClusterCreate {
                name,
                wait_secs,
                owner,
            } => Ok(serde_json::to_value(
                d.create_cluster(&name, owner.as_deref(), Duration::from_secs(wait_secs))
                    .await?,
            )?),
            Request::ClusterDelete { name } => {
                d.delete_cluster(&name).await?;
                Ok(serde_json::json!({"deleted": name}))
            }
            Request::ClusterList => Ok(serde_json::to_value(d.list().await?)?),
            Request::ClusterShow { name } => d.show(&name).await,
            Request::Leases => d.leases().await,
        }
    }
    .await;
    let resp = match result {
        Ok(v) => Response::Ok(v),
        Err(e) => Response::Error(format!("{e:#}")),
    };
    let mut out = serde_json::to_vec(&resp)?;
    out.push(b'\n');
    write.write_all(&out).await?;
    Ok(())
}

/// Sends one request to the daemon and returns its answer.
pub async fn call(socket: &Path, req: &Request, timeout: Duration) -> Result<serde_json::Value> {
    let run = async {
        let mut s = UnixStream::connect(socket).await.with_context(|| {
            format!("connecting to the broker at {} (is `socialweb-broker run` running, and are you root?)", socket.display())
        })?;
        let mut line = serde_json::to_vec(req)?;
        line.push(b'\n');
        s.write_all(&line).await?;
        let mut answer = String::new();
        BufReader::new(s).read_line(&mut answer).await?;
        match serde_json::from_str::<Response>(&answer)
            .with_context(|| format!("unreadable answer {answer:?}"))?
        {
            Response::Ok(v) => Ok(v),
            Response::Error(e) => bail!("{e}"),
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .context("the broker did not answer in time")?
}
