//! Gives memory freed after a burst back to the system. glibc keeps what is freed in its heaps for
//! reuse and returns only what lies at their top, so after a flood of requests (10,000 open
//! streams hold about 110 MiB) the daemon's RSS would stay at its peak for good, though nothing
//! holds it. `malloc_trim` also releases the free pages inside the heaps; with nothing to give
//! back it costs microseconds.

use std::time::Duration;

use crate::shutdown::Shutdown;

/// How often freed memory is given back.
pub const TRIM_PERIOD: Duration = Duration::from_secs(5);

/// Trims every [`TRIM_PERIOD`] until `shutdown`.
pub async fn trim_periodically(shutdown: Shutdown) {
    let mut ticks = tokio::time::interval(TRIM_PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stopping = shutdown.requested();
    tokio::pin!(stopping);
    loop {
        tokio::select! {
            _ = ticks.tick() => trim(),
            () = &mut stopping => return,
        }
    }
}

/// Returns the free pages of every heap to the system.
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes a plain integer and only walks and releases the allocator's own
    // free memory, under the allocator's locks; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
