//! The QUIC connection's datagram send buffer, counted the way the connection counts it, so
//! the mesh can fill it in one call without the connection silently dropping older
//! datagrams to make room.
//!
//! noq (iroh's QUIC) charges each queued datagram its length plus a fixed overhead, and a
//! batch call (`send_many_datagrams`) drops the oldest queued datagrams when the batch does
//! not fit -- uncounted. The space it reports (`datagram_send_buffer_space`) leaves out the
//! overhead of the datagrams already queued, so a batch sized by it overflows by that
//! overhead (about ten full-size packets when the buffer is near full). The connection sends
//! datagrams in the order they were queued, so the ones still queued are always the newest
//! the mesh gave it: the sizes of recent sends, matched against the payload bytes the
//! connection still holds, tell exactly how many are queued. Pure.

use std::collections::VecDeque;

/// What noq-proto 1.4 charges per queued datagram besides its bytes (`size_of::<Datagram>()`,
/// one `Bytes`).
pub const PER_DATAGRAM: usize = 32;

/// The mesh's model of one connection's datagram send buffer.
#[derive(Debug, Clone)]
pub struct SendBuffer {
    capacity: usize,
    /// Sizes of the datagrams still queued, oldest first.
    queued: VecDeque<usize>,
    bytes: usize,
}

impl SendBuffer {
    /// An empty buffer of `capacity` bytes (the connection's `datagram_send_buffer_size`).
    pub fn new(capacity: usize) -> SendBuffer {
        SendBuffer {
            capacity,
            queued: VecDeque::new(),
            bytes: 0,
        }
    }

    /// The payload bytes the connection still holds, from the space it reports.
    pub fn payload_from_space(&self, space: usize) -> usize {
        self.capacity
            .saturating_sub(PER_DATAGRAM)
            .saturating_sub(space)
    }

    /// Catches up with the connection, which still holds `payload` bytes of datagrams: the
    /// oldest ones beyond that have been sent.
    pub fn sync(&mut self, payload: usize) {
        while self.bytes > payload {
            match self.queued.pop_front() {
                Some(n) => self.bytes -= n,
                None => break,
            }
        }
    }

    /// Whether a datagram of `len` bytes can be queued now without the connection dropping
    /// an older one.
    pub fn fits(&self, len: usize) -> bool {
        self.bytes + self.queued.len() * PER_DATAGRAM + len <= self.capacity
    }

    /// Records a datagram of `len` bytes queued on the connection.
    pub fn push(&mut self, len: usize) {
        self.queued.push_back(len);
        self.bytes += len;
    }

    /// Datagrams queued (as of the last [`SendBuffer::sync`]).
    pub fn len(&self) -> usize {
        self.queued.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    /// Payload bytes queued (as of the last sync).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// noq-proto 1.4's buffer, as its source has it: memory = payload + 32 per datagram; a
    /// dropping send evicts the oldest until `memory + len <= capacity`.
    struct Noq {
        capacity: usize,
        q: VecDeque<usize>,
        dropped: usize,
    }

    impl Noq {
        fn memory(&self) -> usize {
            self.q.iter().sum::<usize>() + self.q.len() * PER_DATAGRAM
        }
        fn space(&self) -> usize {
            self.capacity
                .saturating_sub(self.q.iter().sum::<usize>())
                .saturating_sub(PER_DATAGRAM)
        }
        fn send(&mut self, len: usize) {
            while self.memory() + len > self.capacity && self.q.pop_front().is_some() {
                self.dropped += 1;
            }
            self.q.push_back(len);
        }
        fn transmit(&mut self, n: usize) {
            for _ in 0..n {
                self.q.pop_front();
            }
        }
    }

    #[test]
    fn a_batch_sized_by_the_reported_space_alone_loses_datagrams() {
        let mut noq = Noq {
            capacity: 64 << 10,
            q: VecDeque::new(),
            dropped: 0,
        };
        for _ in 0..40 {
            noq.send(1280);
        }
        let space = noq.space();
        for _ in 0..space / 1280 {
            noq.send(1280);
        }
        assert!(noq.dropped > 0, "the bug this module exists for");
    }

    #[test]
    fn the_model_fills_the_buffer_without_a_single_drop() {
        let cap = 64 << 10;
        let mut noq = Noq {
            capacity: cap,
            q: VecDeque::new(),
            dropped: 0,
        };
        let mut model = SendBuffer::new(cap);
        let sizes = [1280usize, 52, 1280, 1280, 600, 40, 1280];
        let mut k = 0;
        for round in 0..500 {
            model.sync(model.payload_from_space(noq.space()));
            assert_eq!(model.len(), noq.q.len(), "round {round}");
            // Fill as far as it goes.
            loop {
                let len = sizes[k % sizes.len()];
                if !model.fits(len) {
                    break;
                }
                model.push(len);
                noq.send(len);
                k += 1;
            }
            assert!(noq.memory() <= cap + PER_DATAGRAM);
            noq.transmit(round % 37);
        }
        assert_eq!(noq.dropped, 0);
    }

    #[test]
    fn sync_with_an_empty_connection_forgets_everything() {
        let mut m = SendBuffer::new(10_000);
        m.push(1000);
        m.push(1000);
        m.sync(0);
        assert!(m.is_empty());
        assert_eq!(m.bytes(), 0);
        assert_eq!(m.payload_from_space(10_000 - PER_DATAGRAM), 0);
        assert!(m.fits(10_000));
        assert!(!m.fits(10_001));
    }
}
