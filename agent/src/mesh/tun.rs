//! The mesh's TUN device.

use anyhow::{Context, Result};
use tun_rs::{AsyncDevice, DeviceBuilder};

/// Creates (or takes over) the TUN device `name`, down, with `mtu`.
pub fn open(name: &str, mtu: u16) -> Result<AsyncDevice> {
    DeviceBuilder::new()
        .name(name)
        .mtu(mtu)
        // Down until the mesh has configured it (IPv6 off), then brought up over netlink.
        .enable(false)
        .build_async()
        .with_context(|| {
            format!("creating TUN device {name} (is /dev/net/tun there, and are we root?)")
        })
}
