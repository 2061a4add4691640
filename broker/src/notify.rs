//! The broker under systemd (`Type=notify`, `WatchdogSec`, docs/operations.md, "Installing
//! it"): it says when it serves and when it stops, and while its runtime turns it says it is
//! alive, from the same heartbeat `/healthz` reads ([`crate::metrics::Health`]). A broker that
//! is frozen or whose runtime is stuck stops saying so, and systemd kills and restarts it
//! after `WatchdogSec` (its control planes die with it on a fleet host, and the lease
//! watchdog has killed them already). Outside systemd (no `NOTIFY_SOCKET`) each call is a
//! no-op.

use sd_notify::NotifyState;
use tracing::warn;

fn tell(state: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(state) {
        warn!("telling the service manager {state:?}: {e}");
    }
}

/// The daemon serves (its control socket is up).
pub fn ready() {
    tell(&[NotifyState::Ready, NotifyState::Status("serving")]);
}

/// The daemon stops its clusters.
pub fn stopping() {
    tell(&[
        NotifyState::Stopping,
        NotifyState::Status("stopping its clusters"),
    ]);
}

/// Whether the service manager watches for [`alive`] (`WatchdogSec`).
pub fn watchdog_enabled() -> bool {
    sd_notify::watchdog_enabled().is_some()
}

/// The runtime turned: one heartbeat for the service manager's watchdog.
pub fn alive() {
    tell(&[NotifyState::Watchdog]);
}
