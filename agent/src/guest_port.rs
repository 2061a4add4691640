//! The node's word to the VMM that boots it (`socialweb_wire::guest`): when the machine has
//! the status port (a provider's VM), the agent writes there that it started and when it is
//! ready or no longer so, so the provider follows the lease without reaching into the guest.
//! Without the port (a machine of namespaces, a VM of some other VMM) it does nothing.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use socialweb_wire::guest::{Event, GUEST_PATH, line};
use tracing::{debug, warn};

/// Writes `e` to the status port, if the machine has one. Never blocks: a port nobody reads
/// on the host loses the line rather than the agent's progress.
pub fn report(e: &Event) {
    report_to(Path::new(GUEST_PATH), e)
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
