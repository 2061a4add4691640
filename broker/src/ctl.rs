//! The daemon's control socket: the operator's `socialweb-broker cluster ...` commands talk
//! to the running daemon here, one [`Command`] and one typed answer (a [`Reply`] or a
//! [`ServiceError`]) per connection, as JSON lines. The socket is mode 0600 in a 0700
//! directory and every client's credentials are checked: root or the daemon's own user only.
//! Its caller is always [`Caller::Operator`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tracing::warn;

use crate::command::{Caller, Command, Reply, ServiceError};
use crate::services::Services;

/// The answer on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Answer {
    Ok(Reply),
    Error(ServiceError),
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

/// Serves the operator's commands on `path`.
pub fn serve(path: &Path, services: Services) -> Result<Socket> {
    let listener = socialweb_proc::owner_only::unix_listener(path)
        .with_context(|| format!("binding {}", path.display()))?;
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors, most likely: wait instead of spinning.
                    warn!("control socket: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if !socialweb_proc::owner_only::peer_is_owner(&stream) {
                warn!(
                    "control socket: refused a client that is neither root nor the broker's user"
                );
                continue;
            }
            let services = services.clone();
            tokio::spawn(async move {
                let _ = one(stream, services).await;
            });
        }
    });
    Ok(Socket(path.to_path_buf()))
}

async fn one(stream: UnixStream, services: Services) -> Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read.take(MAX_REQUEST))
        .read_line(&mut line)
        .await?;
    let answer = match serde_json::from_str::<Command>(&line) {
        Ok(cmd) => match services.execute(&Caller::Operator, cmd).await {
            Ok(r) => Answer::Ok(r),
            Err(e) => Answer::Error(e),
        },
        Err(e) => Answer::Error(ServiceError::Invalid(format!("bad request: {e}"))),
    };
    let mut out = serde_json::to_vec(&answer)?;
    out.push(b'\n');
    write.write_all(&out).await?;
    Ok(())
}

/// Sends one request to the daemon and returns its answer.
pub async fn call(socket: &Path, req: &Command, timeout: Duration) -> Result<Reply> {
    let run = async {
        let mut s = UnixStream::connect(socket).await.with_context(|| {
            format!("connecting to the broker at {} (is `socialweb-broker run` running, and are you root?)", socket.display())
        })?;
        let mut line = serde_json::to_vec(req)?;
        line.push(b'\n');
        s.write_all(&line).await?;
        let mut answer = String::new();
        BufReader::new(s).read_line(&mut answer).await?;
        match serde_json::from_str::<Answer>(&answer)
            .with_context(|| format!("unreadable answer {answer:?}"))?
        {
            Answer::Ok(r) => Ok(r),
            Answer::Error(e) => bail!("{e}"),
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .context("the broker did not answer in time")?
}
