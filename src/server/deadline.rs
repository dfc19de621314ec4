//! Answers a request whose time is up with a gRPC status: the caller's `grpc-timeout` with
//! DEADLINE_EXCEEDED, and the daemon's drain deadline with UNAVAILABLE, so that a caller still
//! waiting when the daemon exits learns why instead of seeing its connection reset.
//!
//! tonic enforces the header too, but answers CANCELLED ("Timeout expired"). Its timer starts
//! after it calls the inner service and its future polls the inner one first, so this layer,
//! which fixes its deadline inside `call`, always answers first.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use tokio::{sync::watch, time::Instant};
use tower::{Layer, Service};

/// The caller's deadline passed before the answer was ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the caller's deadline ({0:?}) passed before the request finished; a pull no other caller waits for is cancelled"
)]
pub struct CallerDeadline(pub Duration);

/// The daemon's drain deadline passed before the answer was ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "cri-imaged is shutting down: its drain deadline ({0:?}) passed before this request finished; \
     retry when it is back"
)]
pub struct DrainDeadline(pub Duration);

/// Parses a `grpc-timeout` header value: up to 8 digits and a unit (H, M, S, m, u, n).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let split = value.len().checked_sub(1)?;
    let (digits, unit) = value.split_at(split);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// How many requests wait for their answer. A stream counts only until its response starts, so
/// the drain waits for answers, never for a watcher (one that stops reading would otherwise hold
/// the connection, and the exit, until the drain deadline).
#[derive(Debug, Clone)]
pub struct Unanswered(Arc<watch::Sender<usize>>);

impl Default for Unanswered {
    fn default() -> Self {
        Self(Arc::new(watch::channel(0).0))
    }
}

impl Unanswered {
    fn begin(&self) -> Answering {
        self.0.send_modify(|count| *count += 1);
        Answering(self.0.clone())
    }

    /// Resolves once no request waits for its answer.
    pub async fn all_answered(&self) {
        let _ = self.0.subscribe().wait_for(|count| *count == 0).await;
    }
}

/// One request waiting for its answer; counted down when its future ends, answered or dropped.
struct Answering(Arc<watch::Sender<usize>>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.send_modify(|count| *count = count.saturating_sub(1));
    }
}

/// The layer; add it with `Server::builder().layer(DeadlineLayer::new(drained, unanswered))`.
#[derive(Debug, Clone)]
pub struct DeadlineLayer {
    drained: watch::Receiver<Option<DrainDeadline>>,
    unanswered: Unanswered,
}

impl DeadlineLayer {
    /// Requests still running when `drained` holds a [`DrainDeadline`] are answered with it;
    /// `unanswered` counts the requests waiting.
    pub fn new(drained: watch::Receiver<Option<DrainDeadline>>, unanswered: Unanswered) -> Self {
        Self { drained, unanswered }
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline { inner, drained: self.drained.clone(), unanswered: self.unanswered.clone() }
    }
}

/// The service the layer makes.
#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
    drained: watch::Receiver<Option<DrainDeadline>>,
    unanswered: Unanswered,
}

type Response = http::Response<tonic::body::Body>;

impl<S, B> Service<http::Request<B>> for Deadline<S>
where
    S: Service<http::Request<B>, Response = Response>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let timeout =
            request.headers().get("grpc-timeout").and_then(|value| value.to_str().ok()).and_then(parse_grpc_timeout);
        let deadline = timeout.map(|timeout| (Instant::now() + timeout, timeout));
        let answer = self.inner.call(request);
        let mut drained = self.drained.clone();
        let answering = self.unanswered.begin();
        Box::pin(async move {
            let _answering = answering;
            let in_time = async {
                let Some((deadline, timeout)) = deadline else { return answer.await };
                match tokio::time::timeout_at(deadline, answer).await {
                    Ok(answer) => answer,
                    Err(_) => Ok(tonic::Status::from(CallerDeadline(timeout)).into_http()),
                }
            };
            tokio::select! {
                answer = in_time => answer,
                Ok(drained) = drained.wait_for(Option::is_some) => {
                    let drain = (*drained).unwrap_or(DrainDeadline(Duration::ZERO));
                    Ok(tonic::Status::from(drain).into_http())
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    fn request(timeout: Option<&str>) -> http::Request<()> {
        let mut request = http::Request::new(());
        if let Some(timeout) = timeout {
            request.headers_mut().insert("grpc-timeout", timeout.parse().expect("header value"));
        }
        request
    }

    fn grpc_status(response: &Response) -> tonic::Status {
        tonic::Status::from_header_map(response.headers()).expect("a grpc-status header")
    }

    fn layer() -> (DeadlineLayer, watch::Sender<Option<DrainDeadline>>) {
        let (drain, drained) = watch::channel(None);
        (DeadlineLayer::new(drained, Unanswered::default()), drain)
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_caller_deadline_is_answered_with_deadline_exceeded() {
        let never = tower::service_fn(|_: http::Request<()>| std::future::pending::<Result<Response, Infallible>>());
        let (layer, _drain) = layer();
        let mut service = layer.layer(never);
        let response = service.call(request(Some("200m"))).await.expect("answered");
        let status = grpc_status(&response);
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert!(status.message().contains("200ms"), "{}", status.message());
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_within_its_deadline_or_without_one_gets_the_inner_answer() {
        let answer = tower::service_fn(|_: http::Request<()>| async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, Infallible>(tonic::Status::not_found("inner").into_http())
        });
        let (layer, _drain) = layer();
        let mut service = layer.layer(answer);
        for timeout in [Some("1S"), None] {
            let response = service.call(request(timeout)).await.expect("answered");
            assert_eq!(grpc_status(&response).code(), tonic::Code::NotFound, "{timeout:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_running_at_the_drain_deadline_is_told_the_daemon_is_shutting_down() {
        let never = tower::service_fn(|_: http::Request<()>| std::future::pending::<Result<Response, Infallible>>());
        let (layer, drain) = layer();
        let mut service = layer.layer(never);
        let waiting = tokio::spawn(service.call(request(Some("1H"))));
        tokio::time::sleep(Duration::from_secs(1)).await;
        drain.send_replace(Some(DrainDeadline(Duration::from_secs(30))));
        let response = waiting.await.expect("task").expect("answered");
        let status = grpc_status(&response);
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(status.message().starts_with("cri-imaged is shutting down: its drain deadline (30s)"), "{status:?}");
    }

    #[test]
    fn grpc_timeout_headers_parse_in_every_unit() {
        let cases = [
            ("2H", Duration::from_secs(7200)),
            ("3M", Duration::from_secs(180)),
            ("1S", Duration::from_secs(1)),
            ("250m", Duration::from_millis(250)),
            ("1500u", Duration::from_micros(1500)),
            ("99999999n", Duration::from_nanos(99_999_999)),
        ];
        for (header, expected) in cases {
            assert_eq!(parse_grpc_timeout(header), Some(expected), "{header}");
        }
    }

    #[test]
    fn malformed_grpc_timeouts_are_ignored() {
        for header in ["", "S", "10", "10x", "123456789S", "-1S", "1.5S"] {
            assert_eq!(parse_grpc_timeout(header), None, "{header:?}");
        }
    }
}
