//! Tells systemd (`Type=notify`) what the daemon is doing: `READY=1` once the socket is served
//! and the runtime was probed (and again after a reload, with `RELOADING=1` before it),
//! `STOPPING=1` when the drain begins, each with a status line that
//! `systemctl status` shows. Without `NOTIFY_SOCKET` (not under systemd) nothing is sent.

use sd_notify::NotifyState;

/// Serving: systemd may start what is ordered after us (the kubelet).
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Reading the configuration again; [`ready`] follows.
pub fn reloading(status: &str) {
    send(&[NotifyState::Reloading, NotifyState::Status(status)]);
}

/// Draining before exit.
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

fn send(states: &[NotifyState<'_>]) {
    // A failed notice costs systemd's view of us, never the service: logged, not fatal.
    if let Err(error) = sd_notify::notify(false, states) {
        tracing::warn!(%error, "cannot notify systemd");
    }
}
