//! Peer to TUN. One task per connection drains what QUIC received into the peer's inbound
//! queue (filtered: only the peer's sources, only our destinations) and writes the queue to
//! the TUN in batches, consecutive TCP segments coalesced. It waits on the connection only
//! when its queue is empty, so a backlog builds in the queue, where CoDel sees it, rather
//! than in QUIC's datagram buffer, where nothing does.

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use iroh::endpoint::{Connection, ConnectionError};
use socialweb_mesh_core::filter::{self, DropReason};
use tracing::debug;
use tun_rs::GROTable;

use super::{Mesh, PeerSlot, peer_addrs};
use crate::mesh::queue::Inbound;
use crate::mesh::tun::{self, HEADROOM};

/// Datagrams taken from a connection, and packets written to the TUN, at once.
const BATCH: usize = 64;
/// Batches drained from the connection before the next TUN write, at most.
const DRAIN: usize = 4;

impl Mesh {
    /// Runs until the connection fails, returning why.
    pub(super) async fn datagram_loop(
        &self,
        slot: &PeerSlot,
        conn: &Connection,
    ) -> ConnectionError {
        let mut batch: Vec<Bytes> = vec![Bytes::new(); BATCH];
        // Written packets go through buffers kept from batch to batch, each with room for a
        // whole coalesced TCP segment: the TUN's GRO appends a flow's next packets to the
        // first one's buffer only when it has that room.
        let gro_room = !self.inner.cfg.endpoint.tuning.no_tun_gro;
        let mut out: Vec<BytesMut> = (0..BATCH)
            .map(|_| tun::write_buffer(gro_room, self.inner.cfg.mtu))
            .collect();
        let mut gro = GROTable::new();
        loop {
            let idle = slot.in_q.lock().is_empty();
            for round in 0..DRAIN {
                let n = if idle && round == 0 {
                    match conn.read_many_datagrams(&mut batch).await {
                        Ok(n) => n,
                        Err(e) => return e,
                    }
                } else {
                    match conn.read_many_datagrams(&mut batch).now_or_never() {
                        Some(Ok(n)) => n,
                        Some(Err(e)) => return e,
                        None => 0,
                    }
                };
                self.admit(slot, &batch[..n]);
                if n < BATCH {
                    break;
                }
            }
            self.write_out(slot, &mut out, &mut gro).await;
            // Draining QUIC never waits while datagrams keep coming, and a loop that never
            // waits starves the TUN reader on the same thread (the ACKs going back).
            tokio::task::yield_now().await;
        }
    }

    /// Filters datagrams from a peer and queues them for the TUN.
    fn admit(&self, slot: &PeerSlot, datagrams: &[Bytes]) {
        if datagrams.is_empty() {
            return;
        }
        let state = self.inner.state.load();
        let (Some(own), Some(peer)) = (state.own.as_ref(), state.by_endpoint.get(&slot.id)) else {
            for _ in datagrams {
                slot.drops.count(DropReason::UnknownPeer);
            }
            return;
        };
        let (peer, own) = (peer_addrs(&peer.entry), own.addrs());
        let packets = datagrams
            .iter()
            .filter_map(|d| match filter::ingress(d, &peer, &own) {
                Ok(h) => {
                    slot.rx.add(h.len);
                    Some(Inbound(d.slice(..h.len)))
                }
                Err(reason) => {
                    slot.drops.count(reason);
                    None
                }
            });
        slot.in_q.push(packets, self.inner.clock.now());
    }

    /// Writes up to a batch of the inbound queue to the TUN.
    async fn write_out(&self, slot: &PeerSlot, out: &mut [BytesMut], gro: &mut GROTable) {
        let mut n = 0;
        {
            let now = self.inner.clock.now();
            let mut q = slot.in_q.lock();
            while n < out.len() {
                let Some(Inbound(p)) = q.dequeue(now) else {
                    break;
                };
                let buf = &mut out[n];
                buf.clear();
                buf.resize(HEADROOM, 0);
                buf.extend_from_slice(&p);
                n += 1;
            }
        }
        if n > 0
            && let Err(e) = self.inner.tun.write(gro, &mut out[..n]).await
        {
            slot.drops.count(DropReason::TunWriteFailed);
            debug!("writing to the TUN: {e}");
        }
    }
}
