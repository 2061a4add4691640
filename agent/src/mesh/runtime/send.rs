//! TUN to peers. One task reads the TUN, filters each packet, finds its peer and queues it
//! there, and never waits for a connection: one slow peer cannot hold up the others, and a
//! packet waits in its peer's queue, where CoDel sees how long. One task per connection
//! takes packets from that queue as fast as the connection has room, in batches of one call.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use iroh::endpoint::{Connection, SendDatagramError};
use socialweb_mesh_core::filter::{self, DropReason};
use socialweb_mesh_core::icmp;
use socialweb_mesh_core::sendbuf::SendBuffer;
use tokio_util::sync::CancellationToken;
use tracing::warn;
use tun_rs::GROTable;

use super::{Mesh, PeerSlot, State};
use crate::mesh::queue::Outbound;

/// Datagrams given to a connection in one call at most.
const SEND_BATCH: usize = 64;

/// Bytes the TUN reader's arena grows by: packets are carved from it, one allocation for
/// many packets (each keeps its slice alive until QUIC has sent it).
const ARENA: usize = 256 << 10;

/// How often a connection's largest datagram is read again (path MTU discovery moves it
/// rarely; reading it takes the connection's lock, which its driver holds while it works).
const MAX_SIZE_REFRESH: Duration = Duration::from_millis(100);

impl Mesh {
    /// Reads the TUN until shutdown, queueing each packet on its peer.
    pub(super) async fn tun_loop(self) {
        let mut reader = self.inner.tun.reader();
        let mut gro = GROTable::new();
        let mut arena = BytesMut::new();
        let mut batches: Vec<(Arc<PeerSlot>, Vec<Outbound>)> = Vec::new();
        loop {
            let n = tokio::select! {
                r = reader.read() => match r {
                    Ok(n) => n,
                    Err(e) => {
                        warn!("reading the TUN: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = self.inner.shutdown.cancelled() => return,
            };
            let state = self.inner.state.load();
            for i in 0..n {
                if let Some((slot, packet)) = self
                    .route(&state, reader.packet(i), &mut gro, &mut arena)
                    .await
                {
                    match batches.iter_mut().find(|(s, _)| Arc::ptr_eq(s, &slot)) {
                        Some((_, b)) => b.push(packet),
                        None => batches.push((slot, vec![packet])),
                    }
                }
            }
            let now = self.inner.clock.now();
            for (slot, packets) in batches.drain(..) {
                slot.out_q.push(packets, now);
            }
        }
    }

    /// Filters one packet from the TUN and finds its peer; answers a packet too big for the
    /// peer's path with ICMP Packet Too Big. `None`: dropped (and counted).
    async fn route(
        &self,
        state: &State,
        packet: &[u8],
        gro: &mut GROTable,
        arena: &mut BytesMut,
    ) -> Option<(Arc<PeerSlot>, Outbound)> {
        let Some(own) = state.own.as_ref() else {
            self.inner.drops.count(DropReason::NoRoute);
            return None;
        };
        let (h, slot) = match filter::egress(packet, &own.addrs(), &state.routes) {
            Ok(x) => x,
            Err(reason) => {
                self.inner.drops.count(reason);
                return None;
            }
        };
        let mut max = slot.max_datagram.load(Ordering::Relaxed);
        if max == 0 {
            slot.drops.count(DropReason::NoConnection);
            return None;
        }
        let packet = &packet[..h.len];
        if packet.len() > max {
            // The kept size is read again only while packets flow, and path MTU discovery
            // moves it in between: refuse against what the path carries now, and say so in
            // the Packet Too Big (a stale size made the kernel keep a smaller path MTU than
            // the path's, and disagreed with `mesh status`).
            max = slot.current_max_datagram();
            if packet.len() > max {
                self.refuse_too_big(slot, packet, max, gro).await;
                return None;
            }
        }
        if arena.capacity() < packet.len() {
            // Earlier packets keep the old allocation alive until sent; a fresh one here.
            arena.reserve(ARENA.max(packet.len()));
        }
        arena.extend_from_slice(packet);
        Some((slot.clone(), Outbound(arena.split())))
    }

    /// Drops a packet the peer's path cannot carry as one datagram, answering its sender
    /// with ICMP Packet Too Big carrying `max` (RFC 9484: never split onto a stream).
    async fn refuse_too_big(&self, slot: &PeerSlot, packet: &[u8], max: usize, gro: &mut GROTable) {
        slot.drops.count(DropReason::TooBig);
        if max == 0 {
            return; // no connection: nothing to size the answer by
        }
        let mtu = max.clamp(576, usize::from(u16::MAX)) as u16;
        if let Some(err) = icmp::packet_too_big(packet, mtu, slot.entry.gateway()) {
            let _ = self
                .inner
                .tun
                .write(gro, &mut [crate::mesh::tun::with_headroom(&err)])
                .await;
        }
    }

    /// Carries a peer's queue into its connection until the connection fails or `stop`.
    /// Fills the connection's datagram buffer in one call per batch, counted the way the
    /// connection counts it so it never drops an older datagram for room; when the buffer is
    /// full, waits for room with the next packet in hand (packets behind it wait in the
    /// queue, managed).
    pub(super) async fn send_loop(
        &self,
        slot: &PeerSlot,
        conn: &Connection,
        stop: &CancellationToken,
    ) {
        let tuning = &self.inner.cfg.endpoint.tuning;
        let mut model = SendBuffer::new(tuning.send_buffer_bytes());
        let mut batch: Vec<Bytes> = Vec::with_capacity(SEND_BATCH);
        let mut held: Option<Bytes> = None;
        let mut max_size_read = Instant::now();
        // Packets the path shrank under after they were queued (answered, not lost silently).
        let mut too_big: Vec<Bytes> = Vec::new();
        let mut gro = GROTable::new();
        loop {
            if held.is_none() && slot.out_q.lock().is_empty() {
                tokio::select! {
                    _ = slot.out_q.wait() => {}
                    _ = stop.cancelled() => return,
                }
                continue;
            }
            if max_size_read.elapsed() >= MAX_SIZE_REFRESH {
                slot.refresh_max_datagram(conn);
                self.follow_path(slot, conn);
                max_size_read = Instant::now();
            }
            model.sync(model.payload_from_space(conn.datagram_send_buffer_space()));
            let full = self.fill(slot, &mut model, &mut batch, &mut held);
            if !batch.is_empty() {
                let alive = self.send_many(slot, conn, &mut batch, &mut too_big);
                for p in too_big.drain(..) {
                    let max = slot.max_datagram.load(Ordering::Relaxed);
                    self.refuse_too_big(slot, &p, max, &mut gro).await;
                }
                if !alive {
                    return;
                }
                // A sender that always finds room never waits: let the thread's other
                // tasks (the connection's driver among them) run between batches.
                tokio::task::yield_now().await;
            }
            if full && let Some(p) = held.take() {
                slot.send_waits.fetch_add(1, Ordering::Relaxed);
                let len = p.len();
                tokio::select! {
                    r = conn.send_datagram_wait(p) => match r {
                        Ok(()) => {
                            model.push(len);
                            slot.tx.add(len);
                        }
                        Err(e) => {
                            slot.drops.count(DropReason::SendFailed);
                            slot.set_error(format!("send: {e}"));
                            if matches!(e, SendDatagramError::ConnectionLost(_)) {
                                return;
                            }
                        }
                    },
                    _ = stop.cancelled() => return,
                }
            }
        }
    }

    /// Sets both of the peer's queues' CoDel from the selected path's round trip, unless the
    /// operator fixed them.
    fn follow_path(&self, slot: &PeerSlot, conn: &Connection) {
        let tuning = &self.inner.cfg.endpoint.tuning;
        if !tuning.codel_follows_path() {
            return;
        }
        let paths = conn.paths();
        let Some(rtt) = paths
            .iter()
            .find(|p| p.is_selected())
            .map(|p| p.stats().rtt)
        else {
            return;
        };
        let params = tuning.codel_for(Some(rtt), usize::from(self.inner.cfg.mtu));
        slot.out_q.lock().set_codel(params);
        slot.in_q.lock().set_codel(params);
    }

    /// Takes packets from the peer's queue while the connection's buffer has room for them
    /// (and the batch has room). Returns whether it stopped because the buffer is full, with
    /// the packet that did not fit in `held`.
    fn fill(
        &self,
        slot: &PeerSlot,
        model: &mut SendBuffer,
        batch: &mut Vec<Bytes>,
        held: &mut Option<Bytes>,
    ) -> bool {
        let now = self.inner.clock.now();
        let mut q = slot.out_q.lock();
        while batch.len() < SEND_BATCH {
            let Some(p) = held.take().or_else(|| q.dequeue(now).map(|p| p.0.freeze())) else {
                return false;
            };
            if !model.fits(p.len()) {
                *held = Some(p);
                return true;
            }
            model.push(p.len());
            batch.push(p);
        }
        false
    }

    /// Queues a batch on the connection (it fits: `fill` made sure). Packets the path has
    /// shrunk under since they were queued go to `too_big`, for the caller to answer. Returns
    /// `false` when the connection is gone.
    fn send_many(
        &self,
        slot: &PeerSlot,
        conn: &Connection,
        batch: &mut Vec<Bytes>,
        too_big: &mut Vec<Bytes>,
    ) -> bool {
        let result = conn.send_many_datagrams(batch);
        let alive = match result {
            Ok(_) => {
                for p in batch.iter() {
                    slot.tx.add(p.len());
                }
                true
            }
            Err(SendDatagramError::TooLarge) => {
                // The path shrank since the size was last read: send what still fits.
                let max = slot.refresh_max_datagram(conn);
                for p in batch.drain(..) {
                    if p.len() > max {
                        too_big.push(p);
                    } else if conn.send_datagram(p.clone()).is_ok() {
                        slot.tx.add(p.len());
                    } else {
                        slot.drops.count(DropReason::SendFailed);
                    }
                }
                true
            }
            Err(e) => {
                for _ in batch.iter() {
                    slot.drops.count(DropReason::SendFailed);
                }
                slot.set_error(format!("send: {e}"));
                !matches!(e, SendDatagramError::ConnectionLost(_))
            }
        };
        batch.clear();
        alive
    }
}
