//! What a node in a VM tells the provider that boots it (docs/image.md, "Booting it"): one
//! line per event on a virtio serial port named [`PORT_NAME`], which the guest sees as
//! `/dev/virtio-ports/<name>` and the VMM writes to a file on the provider's machine. The
//! provider follows the lease's state from it (booting until `ready`) without reaching into
//! the guest; nothing flows the other way.
//!
//! A line is `socialweb-guest <event> [<detail>]`, at most [`MAX_LINE`] bytes. The guest is
//! untrusted: the provider parses with [`parse`], which takes nothing but these events, and
//! uses them only for the lease's state and reason.

/// The virtio serial port's name.
pub const PORT_NAME: &str = "org.socialweb.status";

/// Where the guest writes it.
pub const GUEST_PATH: &str = "/dev/virtio-ports/org.socialweb.status";

/// The longest line taken (a longer one is ignored, not truncated into meaning).
pub const MAX_LINE: usize = 512;

const TAG: &str = "socialweb-guest";

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The agent started (its node name).
    Started(String),
    /// Every bring-up step is done: the node is ready.
    Ready,
    /// A step is no longer done (its name).
    NotReady(String),
}

fn clean(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_control())
        .take(MAX_LINE - 64)
        .collect()
}

/// The line for `e` (with its newline).
pub fn line(e: &Event) -> String {
    match e {
        Event::Started(node) => format!("{TAG} started {}\n", clean(node)),
        Event::Ready => format!("{TAG} ready\n"),
        Event::NotReady(step) => format!("{TAG} not-ready {}\n", clean(step)),
    }
}

/// The event a line is, if it is one.
pub fn parse(line: &str) -> Option<Event> {
    let line = line.trim_end_matches(['\n', '\r']);
    if line.len() > MAX_LINE {
        return None;
    }
    let rest = line.strip_prefix(TAG)?.strip_prefix(' ')?;
    let (event, detail) = rest.split_once(' ').unwrap_or((rest, ""));
    if detail.chars().any(char::is_control) {
        return None;
    }
    match (event, detail) {
        ("started", d) if !d.is_empty() => Some(Event::Started(d.to_string())),
        ("ready", "") => Some(Event::Ready),
        ("not-ready", d) if !d.is_empty() => Some(Event::NotReady(d.to_string())),
        _ => None,
    }
}

/// The events in a port's whole output so far, in order (garbage lines skipped).
pub fn events(text: &str) -> Vec<Event> {
    text.lines().filter_map(parse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lines_round_trip_and_garbage_is_no_event() {
        for e in [
            Event::Started("n-1".into()),
            Event::Ready,
            Event::NotReady("kubelet".into()),
        ] {
            assert_eq!(parse(&line(&e)), Some(e));
        }
        for bad in [
            "",
            "socialweb-guest",
            "socialweb-guest ready now",
            "socialweb-guest started",
            "socialweb-guestready",
            "xsocialweb-guest ready",
            "socialweb-guest started a\u{1b}[2Jb",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(parse(&format!("{TAG} started {}", "x".repeat(600))), None);
        assert_eq!(
            events("boot noise\nsocialweb-guest started n\n\0\0\nsocialweb-guest ready\n"),
            vec![Event::Started("n".into()), Event::Ready]
        );
    }

    proptest! {
        #[test]
        fn any_text_parses_without_panicking(s in "\\PC*") {
            let _ = events(&s);
        }

        #[test]
        fn a_started_line_gives_back_its_name(node in "[a-z0-9.-]{1,63}") {
            prop_assert_eq!(parse(&line(&Event::Started(node.clone()))), Some(Event::Started(node)));
        }
    }
}
