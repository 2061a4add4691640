//! The CLI's side of the control socket.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::protocol::{Request, Response};

/// Sends one request and returns the data of a successful answer.
pub async fn call(socket: &Path, req: &Request, timeout: Duration) -> Result<serde_json::Value> {
    let run = async {
        let mut stream = UnixStream::connect(socket).await.with_context(|| {
            format!("connecting to the agent at {} (is `socialweb-agent run` running, and are you root?)", socket.display())
        })?;
        let mut line = serde_json::to_vec(req)?;
        line.push(b'\n');
        stream.write_all(&line).await?;
        let mut answer = String::new();
        BufReader::new(stream).read_line(&mut answer).await?;
        let response: Response = serde_json::from_str(&answer)
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
