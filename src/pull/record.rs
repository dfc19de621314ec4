//! Records a successful pull (KEP-2535) inside the shared pull, before its result reaches any
//! caller: a pod with the same credential asking the moment after finds the record.

use std::task::{Context, Poll};

use tower::Service;

use super::{Pull, PullError, PullFuture, Pulled};

/// Wraps a pull service; see the module docs.
#[derive(Clone)]
pub struct RecordPulls<S> {
    inner: S,
}

impl<S> RecordPulls<S> {
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S> Service<Pull> for RecordPulls<S>
where
    S: Service<Pull, Response = Pulled, Error = PullError>,
    S::Future: Send + 'static,
{
    type Response = Pulled;
    type Error = PullError;
    type Future = PullFuture;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), PullError>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, pull: Pull) -> Self::Future {
        let record = pull.record.clone();
        let pull = self.inner.call(pull);
        Box::pin(async move {
            let pulled = pull.await?;
            if let Some(to) = record
                && let Err(error) = to.records.merge(&pulled.image_ref, &to.name, to.pulled_with.clone()).await
            {
                // The caller records again and keeps the intent if that fails too.
                tracing::warn!(%error, "failed to write image pulled record");
            }
            Ok(pulled)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use tower::ServiceExt;

    use super::*;
    use crate::records::{PullRecords, RecordTo, format::PullCredentials, metrics::RecordsMetrics};

    #[tokio::test]
    async fn a_successful_pull_is_recorded_before_its_result_is_returned() {
        let root = tempfile::tempdir().expect("tempdir");
        let records = Arc::new(PullRecords::open(root.path(), Arc::new(RecordsMetrics::default())).expect("opens"));
        let pulled = Pulled { image_ref: "sha256:app".into(), image_size: 1, pull_duration: Duration::ZERO };
        let inner = tower::service_fn(move |_: Pull| {
            let pulled = pulled.clone();
            async move { Ok::<_, PullError>(pulled) }
        });
        let anyone = PullCredentials { node_pods_accessible: true, ..Default::default() };
        let to = RecordTo { records: records.clone(), name: "registry.local/app".into(), pulled_with: anyone.clone() };
        let pull = Pull { record: Some(Arc::new(to)), ..Pull::default() };
        RecordPulls::new(inner).oneshot(pull).await.expect("pulled");
        let record = records.record("sha256:app").await.expect("readable").expect("recorded by the pull itself");
        assert_eq!(record.credential_mapping["registry.local/app"], anyone);
    }
}
