//! The CLI's side of the control socket.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use serde::de::DeserializeOwned;

use super::protocol::{PingResult, Request, Response};
use crate::dns::stats::DnsStats;
use crate::mesh::stats::{MeshStatus, RouteStatus};
use crate::status::AgentStatus;

/// The running agent on the other end of its control socket, asked one request per call.
#[derive(Debug, Clone)]
pub struct Client {
    socket: std::path::PathBuf,
    timeout: Duration,
}

impl Client {
    pub fn new(socket: &Path, timeout: Duration) -> Client {
        Client {
            socket: socket.to_path_buf(),
            timeout,
        }
    }

    pub async fn status(&self) -> Result<AgentStatus> {
        call(&self.socket, &Request::Status, self.timeout).await
    }

    pub async fn mesh_status(&self) -> Result<MeshStatus> {
        call(&self.socket, &Request::MeshStatus, self.timeout).await
    }

    pub async fn mesh_routes(&self) -> Result<Vec<RouteStatus>> {
        call(&self.socket, &Request::MeshRoutes, self.timeout).await
    }

    pub async fn mesh_ping(&self, target: &str) -> Result<PingResult> {
        let req = Request::MeshPing {
            target: target.to_string(),
        };
        call(&self.socket, &req, self.timeout).await
    }

    pub async fn dns_stats(&self) -> Result<DnsStats> {
        call(&self.socket, &Request::DnsStats, self.timeout).await
    }
}

/// Sends one request and reads the data of a successful answer as `T`, the type the agent
/// answers `req` with (`protocol::Reply`).
pub async fn call<T: DeserializeOwned>(
    socket: &Path,
    req: &Request,
    timeout: Duration,
) -> Result<T> {
    let run = async {
        let mut stream = UnixStream::connect(socket).await.with_context(|| {
            format!("connecting to the agent at {} (is `socialweb-agent run` running, and are you root?)", socket.display())
        })?;
        let mut line = serde_json::to_vec(req)?;
        line.push(b'\n');
        stream.write_all(&line).await?;
        let mut answer = String::new();
        BufReader::new(stream).read_line(&mut answer).await?;
        let response: Response<T> = serde_json::from_str(&answer)
            .with_context(|| format!("the agent answered something unreadable: {answer:?}"))?;
        match response {
            Response::Ok(v) => Ok(v),
            Response::Error(e) => bail!("{e}"),
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .context("the agent did not answer in time")?
}
