//! The mesh's TUN device, with offload: the kernel hands us TCP segments up to 64 KiB at a
//! time (TSO, split here into MTU-sized packets) and takes coalesced segments back (GRO), so
//! a bulk transfer costs a few syscalls per 64 KiB instead of one per packet. Writes always
//! go through [`Tun::write`], which leaves room for the virtio-net header the offload needs.

use std::io;

use anyhow::{Context, Result};
use bytes::BytesMut;
use tun_rs::{AsyncDevice, DeviceBuilder, GROTable, IDEAL_BATCH_SIZE, VIRTIO_NET_HDR_LEN};

/// Bytes to leave in front of every packet handed to [`Tun::write`].
pub const HEADROOM: usize = VIRTIO_NET_HDR_LEN;

/// The device.
pub struct Tun {
    dev: AsyncDevice,
    mtu: u16,
}

impl std::fmt::Debug for Tun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tun").field("mtu", &self.mtu).finish()
    }
}

/// Creates (or takes over) the TUN device `name`, down, with `mtu` and offload on.
pub fn open(name: &str, mtu: u16) -> Result<Tun> {
    let dev = DeviceBuilder::new()
        .name(name)
        .mtu(mtu)
        .offload(true)
        // Down until the mesh has configured it (IPv6 off), then brought up over netlink.
        .enable(false)
        .build_async()
        .with_context(|| {
            format!("creating TUN device {name} (is /dev/net/tun there, and are we root?)")
        })?;
    Ok(Tun { dev, mtu })
}

/// The largest packet the TUN's GRO builds: a whole coalesced TCP segment.
const GRO_MAX: usize = 65535;

/// An empty write buffer: with `gro_room`, room for the TUN's GRO to grow a coalesced
/// segment in (it appends to a buffer only within its capacity: a buffer sized for one
/// packet of `mtu` never coalesces).
pub fn write_buffer(gro_room: bool, mtu: u16) -> BytesMut {
    let packet = if gro_room { GRO_MAX } else { usize::from(mtu) };
    BytesMut::with_capacity(2 * HEADROOM + packet)
}

/// A packet buffer with [`HEADROOM`] free bytes in front of `packet`.
pub fn with_headroom(packet: &[u8]) -> BytesMut {
    let mut b = BytesMut::with_capacity(HEADROOM + packet.len());
    b.resize(HEADROOM, 0);
    b.extend_from_slice(packet);
    b
}

impl Tun {
    /// Writes packets (each with [`HEADROOM`] in front), coalescing TCP segments of one flow.
    pub async fn write(&self, gro: &mut GROTable, packets: &mut [BytesMut]) -> io::Result<usize> {
        self.dev.send_multiple(gro, packets, HEADROOM).await
    }

    /// A reader with its own buffers (one per task that reads).
    pub fn reader(&self) -> TunReader<'_> {
        let packet_size = usize::from(self.mtu) + 64;
        TunReader {
            tun: self,
            original: vec![0u8; VIRTIO_NET_HDR_LEN + 65535],
            bufs: (0..IDEAL_BATCH_SIZE)
                .map(|_| vec![0u8; packet_size])
                .collect(),
            sizes: vec![0; IDEAL_BATCH_SIZE],
            count: 0,
        }
    }
}

/// Reads batches of packets: one read may return many (a split TSO segment).
#[allow(missing_debug_implementations)]
pub struct TunReader<'t> {
    tun: &'t Tun,
    original: Vec<u8>,
    bufs: Vec<Vec<u8>>,
    sizes: Vec<usize>,
    count: usize,
}

impl TunReader<'_> {
    /// Waits for the next batch; returns how many packets it holds.
    pub async fn read(&mut self) -> io::Result<usize> {
        self.count = self
            .tun
            .dev
            .recv_multiple(&mut self.original, &mut self.bufs, &mut self.sizes, 0)
            .await?;
        Ok(self.count)
    }

    /// Packet `i` of the last batch.
    pub fn packet(&self, i: usize) -> &[u8] {
        &self.bufs[i][..self.sizes[i]]
    }
}
