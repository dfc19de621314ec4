//! The periodic passes: one every period until shutdown, restarted by a new configuration.

use std::sync::Arc;

use tokio::time::Instant;

use super::{ImageGc, PassRequest, pass_failure};
use crate::{
    events::{Event, EventType, reason as event_reason},
    gc::GcConfig,
    runtime::ImageRuntime,
    shutdown::Shutdown,
};

/// Why the periodic passes under one configuration ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    Reconfigured,
    Stop,
}

impl<R: ImageRuntime> ImageGc<R> {
    /// Learns the runtime's sandbox image, then makes a pass every period until `shutdown`, the
    /// first at once, as the kubelet does. A new configuration applies from the next pass, one
    /// new period after it came; a pass under way is never cut short, by a reload or by the
    /// shutdown.
    pub async fn run(self: Arc<Self>, shutdown: Shutdown) {
        // The sandbox image is reported pinned from the start, image GC on or off.
        self.learn_sandbox_image().await;
        let mut changes = self.config.subscribe();
        let stopping = shutdown.requested();
        tokio::pin!(stopping);
        let mut first_pass = Instant::now();
        loop {
            let config = changes.borrow_and_update().clone();
            let woken = self.collect_every_period(&config, first_pass, changes.changed(), stopping.as_mut());
            if woken.await == Wake::Stop {
                return;
            }
            first_pass = Instant::now() + self.config().period;
        }
    }

    /// The passes under one configuration, every period from `first_pass`, until the
    /// configuration `changed` or `stopping`; a failure after a failure is logged as an error (the
    /// kubelet's `ImageGCFailed`).
    async fn collect_every_period(
        &self,
        config: &GcConfig,
        first_pass: Instant,
        changed: impl Future<Output = Result<(), tokio::sync::watch::error::RecvError>>,
        mut stopping: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Wake {
        tokio::pin!(changed);
        let policy = config.policy;
        if policy.disabled() {
            tracing::info!("ImageGCHighThresholdPercent is set 100 and ImageMaximumGCAge is 0, Disable image GC");
        } else {
            tracing::info!(
                high_threshold = policy.high_threshold_percent,
                low_threshold = policy.low_threshold_percent,
                min_age = ?policy.min_age,
                max_age = ?policy.max_age,
                period = ?config.period,
                "image garbage collection every period"
            );
        }
        let mut ticks = tokio::time::interval_at(first_pass, config.period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failed_before = false;
        loop {
            tokio::select! {
                _ = ticks.tick(), if !policy.disabled() => {}
                _ = &mut changed => return Wake::Reconfigured,
                () = &mut stopping => return Wake::Stop,
            }
            let failure = match self.pass(PassRequest::default()).await {
                Ok(report) => pass_failure(&report),
                Err(error) => Some(error.to_string()),
            };
            match &failure {
                Some(error) if failed_before => {
                    self.parts.metrics.failed_again();
                    tracing::error!(%error, "Image garbage collection failed multiple times in a row");
                    let event = Event::new(EventType::Warning, event_reason::IMAGE_GC_FAILED, error.clone());
                    self.parts.events.publish(event);
                }
                Some(error) => {
                    tracing::warn!(%error, "Image garbage collection failed once. Stats initialization may not have completed yet");
                }
                None if failed_before => tracing::info!("Image garbage collection succeeded"),
                None => tracing::debug!("Image garbage collection succeeded"),
            }
            failed_before = failure.is_some();
        }
    }
}
