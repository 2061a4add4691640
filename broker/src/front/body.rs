//! A request body as it arrives from the internet (docs/security.md, "The front"): under a
//! deadline, and marking its connection sheddable while it arrives.
//!
//! A client has `body_read_timeout` of waiting, plus one second for every
//! `min_body_bytes_per_sec` bytes it has sent; only time spent waiting for the client counts
//! (an apiserver that reads slowly costs the client nothing). Past it the body ends in an
//! error, which ends the request. One byte every five seconds, from however many addresses,
//! is cut after `body_read_timeout`; a large upload at any reasonable rate is not.
//!
//! Until the body has arrived, its request does not count as work in flight on its
//! connection ([`Activity::receiving`]): at `max_connections`, a connection whose every
//! request is still arriving may be shed for a new one.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

// Tokio's clock, which the deadline's timer uses (and tests can pause).
use tokio::time::Instant;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};

use super::listener::{Activity, Receiving};

/// How long a body may keep its reader waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    pub timeout: Duration,
    pub min_bytes_per_sec: u64,
}

impl Pace {
    /// The waiting allowed after `received` bytes.
    pub fn allowance(&self, received: u64) -> Duration {
        let earned = match self.min_bytes_per_sec {
            0 => Duration::ZERO,
            rate => Duration::from_secs_f64(received as f64 / rate as f64),
        };
        self.timeout.saturating_add(earned)
    }
}

/// The error a body ends with when its client is too slow.
#[derive(Debug, thiserror::Error)]
#[error("the request body arrived too slowly: {received} bytes in {waited:?} of waiting")]
pub struct TooSlow {
    pub received: u64,
    pub waited: Duration,
}

/// `inner` under `pace`, counted as arriving on `activity` until it ends.
pub fn paced(inner: Body, pace: Pace, activity: &Arc<Activity>) -> Body {
    if inner.is_end_stream() {
        return inner;
    }
    Body::new(Paced {
        inner,
        pace,
        received: 0,
        waited: Duration::ZERO,
        pending_since: None,
        sleep: Box::pin(tokio::time::sleep(pace.timeout)),
        unlimited: false,
        receiving: Some(activity.receiving()),
    })
}

struct Paced {
    inner: Body,
    pace: Pace,
    received: u64,
    /// Waiting for the client, before the current wait.
    waited: Duration,
    /// Since when the current wait for the client has lasted.
    pending_since: Option<Instant>,
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// The current wait has no deadline (an allowance past what the clock can hold).
    unlimited: bool,
    /// Dropped when the body has arrived (or failed).
    receiving: Option<Receiving>,
}

impl http_body::Body for Paced {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some(t) = this.pending_since.take() {
                    this.waited += t.elapsed();
                }
                match &frame {
                    Some(Ok(f)) => {
                        if let Some(d) = f.data_ref() {
                            this.received += d.len() as u64;
                        }
                        if this.inner.is_end_stream() {
                            this.receiving = None;
                        }
                    }
                    Some(Err(_)) | None => this.receiving = None,
                }
                Poll::Ready(frame)
            }
            Poll::Pending => {
                // The deadline is fixed for the whole wait (nothing arrives during it): the
                // timer is armed once, when the wait begins, not on every poll.
                let since = match this.pending_since {
                    Some(t) => t,
                    None => {
                        let now = Instant::now();
                        this.pending_since = Some(now);
                        let left = this
                            .pace
                            .allowance(this.received)
                            .saturating_sub(this.waited);
                        let deadline = now.checked_add(left);
                        this.unlimited = deadline.is_none();
                        if let Some(d) = deadline {
                            this.sleep.as_mut().reset(d);
                        }
                        now
                    }
                };
                let expired = !this.unlimited && this.sleep.as_mut().poll(cx).is_ready();
                if !expired {
                    return Poll::Pending;
                }
                this.receiving = None;
                let waited = this.waited + since.elapsed();
                this.pending_since = None;
                Poll::Ready(Some(Err(axum::Error::new(TooSlow {
                    received: this.received,
                    waited,
                }))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    const PACE: Pace = Pace {
        timeout: Duration::from_secs(10),
        min_bytes_per_sec: 1024,
    };

    #[test]
    fn each_byte_buys_time_at_the_minimum_rate() {
        assert_eq!(PACE.allowance(0), Duration::from_secs(10));
        assert_eq!(PACE.allowance(10 * 1024), Duration::from_secs(20));
        let no_rate = Pace {
            min_bytes_per_sec: 0,
            ..PACE
        };
        assert_eq!(no_rate.allowance(1 << 30), Duration::from_secs(10));
    }

    /// A body whose chunks are what `tx` sends, ending when it is dropped.
    fn channel_body() -> (Body, mpsc::Sender<Bytes>) {
        let (tx, rx) = mpsc::channel::<Bytes>(4);
        let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
        });
        (Body::from_stream(chunks), tx)
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_dribbles_is_cut_and_its_connection_is_sheddable_meanwhile() {
        let activity = Arc::new(Activity::default());
        let _request = activity.start();
        assert!(activity.sheddable_for().is_none(), "a request in flight");
        let (inner, tx) = channel_body();
        let body = paced(inner, PACE, &activity);
        assert!(
            activity.sheddable_for().is_some(),
            "a request whose body is arriving is no work in flight"
        );
        // The attack: one byte every five seconds.
        let sender = tokio::spawn(async move {
            while tx.send(Bytes::from_static(b"x")).await.is_ok() {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
        let t = tokio::time::Instant::now();
        let err = axum::body::to_bytes(body, usize::MAX)
            .await
            .expect_err("cut");
        let took = t.elapsed();
        assert!(err.to_string().contains("too slowly"), "{err}");
        assert!(
            took >= Duration::from_secs(10) && took < Duration::from_secs(11),
            "{took:?}"
        );
        assert!(
            activity.sheddable_for().is_none(),
            "the request is work in flight again (its answer)"
        );
        sender.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_at_twice_the_minimum_rate_arrives_whole() {
        let activity = Arc::new(Activity::default());
        let _request = activity.start();
        let (inner, tx) = channel_body();
        let body = paced(inner, PACE, &activity);
        tokio::spawn(async move {
            for _ in 0..30 {
                tx.send(Bytes::from(vec![0u8; 2048])).await.unwrap();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let all = axum::body::to_bytes(body, usize::MAX).await.expect("whole");
        assert_eq!(all.len(), 30 * 2048);
        assert!(activity.sheddable_for().is_none());
    }

    #[test]
    fn an_empty_body_is_not_arriving() {
        let activity = Arc::new(Activity::default());
        let _request = activity.start();
        let _body = paced(Body::empty(), PACE, &activity);
        assert!(activity.sheddable_for().is_none());
    }
}
