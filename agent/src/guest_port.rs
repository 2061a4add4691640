//! The node's word to the VMM that boots it (`socialweb_wire::guest`): when the machine has
//! the status port (a provider's VM), the agent writes there that it started and when it is
//! ready or no longer so, so the provider follows the lease without reaching into the guest.
//! Without the port (a machine of namespaces, a VM of some other VMM) it does nothing.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use socialweb_wire::guest::{Event, GUEST_PATH, PORT_NAME, line};
use tracing::{debug, warn};

/// Writes `e` to the status port, if the machine has one. Never blocks: a port nobody reads
/// on the host loses the line rather than the agent's progress.
pub fn report(e: &Event) {
    if let Some(port) = find_port() {
        report_to(&port, e)
    }
}

/// Says `started` once the port is there: the agent may start before the guest's kernel has
/// loaded the virtio console driver (udev loads it), so it looks for the port for a minute
/// on a thread of its own. Without a port (a machine of namespaces), it finds none and ends.
pub fn report_started(node: &str) {
    let e = Event::Started(node.to_string());
    let spawned = std::thread::Builder::new()
        .name("guest-port".into())
        .spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                if let Some(port) = find_port() {
                    report_to(&port, &e);
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
    if let Err(err) = spawned {
        warn!("the status port's thread: {err}");
    }
}

/// The port's device: udev's `/dev/virtio-ports/<name>` link, or, before udev has made it
/// (the agent may start first), the `vport` device whose name sysfs gives as ours.
fn find_port() -> Option<PathBuf> {
    if Path::new(GUEST_PATH).exists() {
        return Some(PathBuf::from(GUEST_PATH));
    }
    std::fs::read_dir("/sys/class/virtio-ports")
        .ok()?
        .flatten()
        .find(|d| {
            std::fs::read_to_string(d.path().join("name")).is_ok_and(|n| n.trim() == PORT_NAME)
        })
        .map(|d| Path::new("/dev").join(d.file_name()))
        .filter(|p| p.exists())
}

fn report_to(port: &Path, e: &Event) {
    if !port.exists() {
        return;
    }
    // (Append: a character device ignores it; a file stands in for one in the tests.)
    let result = std::fs::OpenOptions::new()
        .append(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(port)
        .and_then(|mut f| f.write_all(line(e).as_bytes()));
    match result {
        Ok(()) => debug!(port = %port.display(), "told the VMM: {e:?}"),
        Err(err) => warn!(port = %port.display(), "telling the VMM {e:?}: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_go_to_the_port_as_lines_and_nowhere_without_one() {
        let dir = std::env::temp_dir().join(format!("sw-guest-port-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = dir.join("port");
        report_to(&port, &Event::Ready);
        assert!(!port.exists(), "no port: nothing written, nothing made");
        std::fs::write(&port, "").unwrap();
        report_to(&port, &Event::Started("n-1".into()));
        report_to(&port, &Event::Ready);
        let text = std::fs::read_to_string(&port).unwrap();
        assert_eq!(
            socialweb_wire::guest::events(&text),
            vec![Event::Started("n-1".into()), Event::Ready]
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
