//! The byte plumbing of the tunnel's streams (contract 9, docs/tunnel.md), one copy for the
//! agent's end and the broker's: a header or reply line read with a bound on its length and
//! its time, byte by byte because what follows it is the stream's payload, and both ways
//! copied until both ends are done.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Reads one line (newline included) of at most `max` bytes within `within`.
pub async fn read_line<R>(recv: &mut R, max: usize, within: Duration) -> Result<Vec<u8>>
where
    R: AsyncRead + Unpin,
{
    let read = async {
        let mut line = Vec::with_capacity(64);
        let mut byte = [0u8; 1];
        while line.len() < max {
            if recv.read(&mut byte).await? == 0 {
                bail!("the stream ended before its line");
            }
            line.push(byte[0]);
            if byte[0] == b'\n' {
                return Ok(line);
            }
        }
        bail!("the line is longer than {max} bytes")
    };
    tokio::time::timeout(within, read)
        .await
        .with_context(|| format!("no line within {} s", within.as_secs()))?
}

/// Copies both ways between `conn` and a stream's two halves until both ends are done, then
/// shuts the stream's sending half.
pub async fn splice<C, R, W>(mut conn: C, recv: R, send: W) -> std::io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut stream = tokio::io::join(recv, send);
    let copied = tokio::io::copy_bidirectional(&mut conn, &mut stream).await;
    let _ = stream.shutdown().await;
    copied.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_read_up_to_its_newline_and_no_further() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut r: &[u8] = b"api\npayload";
            let line = read_line(&mut r, 16, Duration::from_secs(1)).await.unwrap();
            assert_eq!(line, b"api\n");
            assert_eq!(r, b"payload", "the payload is left for the splice");
            let mut long: &[u8] = b"0123456789abcdef\n";
            let e = read_line(&mut long, 8, Duration::from_secs(1))
                .await
                .unwrap_err();
            assert_eq!(e.to_string(), "the line is longer than 8 bytes");
            let mut cut: &[u8] = b"ap";
            let e = read_line(&mut cut, 8, Duration::from_secs(1))
                .await
                .unwrap_err();
            assert_eq!(e.to_string(), "the stream ended before its line");
        });
    }
}
