//! grpc.health.v1 per service: the image service is SERVING only while the runtime answers.

use std::{sync::Arc, time::Duration};

use tonic_health::{ServingStatus, server::HealthReporter};

use crate::{
    readiness::{Health, Readiness},
    runtime::{ImageRuntime, probe_within},
    shutdown::Shutdown,
};

/// The health service name of our API.
pub const IMAGE_MANAGER_SERVICE: &str = "imagemanager.v1.ImageManager";

/// Probes the runtime every `interval`, each probe bounded by `timeout` (a frozen runtime is
/// not a serving one), and reports the image service's health, logging changes, to the gRPC
/// health service and to `readiness` (the HTTP `/readyz`); until shutdown.
pub async fn probe_runtime<R: ImageRuntime>(
    runtime: Arc<R>,
    (reporter, readiness): (HealthReporter, Arc<Readiness>),
    (interval, timeout): (Duration, Duration),
    shutdown: Shutdown,
) {
    let mut last: Option<ServingStatus> = None;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stopping = shutdown.requested();
    tokio::pin!(stopping);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = &mut stopping => return,
        }
        let result = probe_within(&*runtime, timeout).await;
        let status = if result.is_ok() { ServingStatus::Serving } else { ServingStatus::NotServing };
        let health = match &result {
            Ok(()) => Health::Serving,
            Err(error) => Health::NotServing(format!("the container runtime is unreachable: {error}")),
        };
        readiness.set(health, tokio::time::Instant::now());
        if last != Some(status) {
            match &result {
                Ok(()) => tracing::info!("container runtime is reachable; image service SERVING"),
                Err(error) => tracing::warn!(%error, "container runtime is unreachable; image service NOT_SERVING"),
            }
            for service in [IMAGE_MANAGER_SERVICE, super::CRI_IMAGE_SERVICE] {
                reporter.set_service_status(service, status).await;
            }
            last = Some(status);
        }
    }
}
