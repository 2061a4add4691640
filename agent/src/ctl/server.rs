//! Serving the control socket. The socket is created mode 0600 in a directory of mode 0700,
//! and every connection's peer credentials are checked as well (the file mode alone would not
//! survive someone loosening the directory).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tracing::{debug, warn};

use super::protocol::{MAX_REQUEST, Request, Response};

/// Something that answers requests.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, req: Request) -> impl std::future::Future<Output = Response> + Send;
}

/// A bound control socket; the file is removed on drop.
#[derive(Debug)]
pub struct Socket {
    path: PathBuf,
}

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds `path` and serves requests with `handler` until the process ends.
pub fn serve<H: Handler>(path: &Path, handler: Arc<H>) -> Result<Socket> {
    // A socket file left by a killed agent is replaced.
    let listener = socialweb_proc::owner_only::unix_listener(path)
        .with_context(|| format!("binding {}", path.display()))?;
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    warn!("control socket accept: {e}");
                    continue;
                }
            };
            if !socialweb_proc::owner_only::peer_is_owner(&stream) {
                warn!("control socket: refused a client that is neither root nor the agent's user");
                continue;
            }
            let handler = handler.clone();
            tokio::spawn(async move {
                if let Err(e) = one(stream, handler).await {
                    debug!("control socket client: {e:#}");
                }
            });
        }
    });
    Ok(Socket {
        path: path.to_path_buf(),
    })
}

async fn one<H: Handler>(stream: UnixStream, handler: Arc<H>) -> Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let n = BufReader::new(read.take(MAX_REQUEST as u64 + 1))
        .read_line(&mut line)
        .await?;
    let response = if n > MAX_REQUEST {
        Response::Error(format!("request larger than {MAX_REQUEST} bytes"))
    } else {
        match serde_json::from_str::<Request>(&line) {
            Ok(req) => handler.handle(req).await,
            Err(e) => Response::Error(format!("bad request: {e}")),
        }
    };
    let mut out = serde_json::to_vec(&response)?;
    out.push(b'\n');
    write.write_all(&out).await?;
    Ok(())
}
