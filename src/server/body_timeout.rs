//! A request's body must arrive within `--request-body-timeout` of its headers. Until a message is
//! whole, tonic keeps what came of it, up to the largest message a service takes (16 MiB on the
//! CRI pass-through): a client that sends most of a body and stops would pin that memory for as
//! long as its connection lives. Past the timeout the request fails and its buffer goes.
//!
//! The clock starts when the request reaches the server and is read only if the body is still
//! incomplete when asked for: a body that came with its headers, as every real client's does over
//! a unix socket, costs no timer. Reflection's stream, the one RPC whose caller sends messages
//! over time (grpcurl, grpcui and evans keep it open between questions), is left unbounded: each
//! of its messages is small, read as it comes.

use std::{
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tonic::body::Body;
use tower::{Layer, Service};

/// The RPCs whose callers stream messages over time: their bodies are never whole.
const CLIENT_STREAMING: [&str; 2] = [
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// The body did not arrive in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the request's body did not arrive within {0:?} of its headers (--request-body-timeout); the request is abandoned"
)]
pub struct BodyTimedOut(pub Duration);

/// The layer; add it with `Server::builder().layer(BodyTimeoutLayer::new(timeout))`.
#[derive(Debug, Clone, Copy)]
pub struct BodyTimeoutLayer {
    timeout: Duration,
}

impl BodyTimeoutLayer {
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }
}

impl<S> Layer<S> for BodyTimeoutLayer {
    type Service = BodyTimeout<S>;

    fn layer(&self, inner: S) -> BodyTimeout<S> {
        BodyTimeout { inner, timeout: self.timeout }
    }
}

/// The service the layer makes.
#[derive(Debug, Clone)]
pub struct BodyTimeout<S> {
    inner: S,
    timeout: Duration,
}

impl<S: Service<http::Request<Body>>> Service<http::Request<Body>> for BodyTimeout<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> S::Future {
        if CLIENT_STREAMING.contains(&request.uri().path()) {
            return self.inner.call(request);
        }
        let timeout = self.timeout;
        let deadline = Instant::now() + timeout;
        self.inner.call(request.map(|body| Body::new(TimedBody { inner: body, deadline, timeout, timer: None })))
    }
}

/// A body that fails with [`BodyTimedOut`] if it is still incomplete at its deadline.
struct TimedBody {
    inner: Body,
    deadline: Instant,
    timeout: Duration,
    timer: Option<Pin<Box<Sleep>>>,
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match super::poll_deadline(&mut this.timer, this.deadline, cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(BodyTimedOut(this.timeout).into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    /// A service that reads the whole body and answers with how many bytes came, or the error.
    fn reader() -> impl Service<http::Request<Body>, Response = Result<usize, tonic::Status>, Error = Infallible> {
        tower::service_fn(|request: http::Request<Body>| async move {
            let mut body = request.into_body();
            let mut read = 0;
            while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                match frame {
                    Ok(frame) => read += frame.data_ref().map_or(0, Bytes::len),
                    Err(error) => return Ok(Err(error)),
                }
            }
            Ok(Ok(read))
        })
    }

    /// Part of a body, then nothing more, ever.
    struct Stalled(Option<Bytes>);

    impl HttpBody for Stalled {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            match self.get_mut().0.take() {
                Some(part) => Poll::Ready(Some(Ok(Frame::data(part)))),
                None => Poll::Pending,
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reflections_stream_is_never_timed() {
        let mut service = BodyTimeoutLayer::new(Duration::from_secs(10)).layer(reader());
        let mut request = http::Request::new(Body::new(Stalled(Some(Bytes::from_static(b"one question")))));
        *request.uri_mut() = http::Uri::from_static(CLIENT_STREAMING[0]);
        let reading = tokio::time::timeout(Duration::from_secs(3600), service.call(request)).await;
        assert!(reading.is_err(), "still open an hour later");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stalls_fails_at_the_timeout_and_a_whole_one_passes() {
        let mut service = BodyTimeoutLayer::new(Duration::from_secs(10)).layer(reader());
        let whole = service.call(http::Request::new(Body::new(String::from("whole")))).await.expect("answered");
        assert_eq!(whole.expect("read"), 5);

        let stalled = Body::new(Stalled(Some(Bytes::from_static(b"part of it"))));
        let started = Instant::now();
        let error = service.call(http::Request::new(stalled)).await.expect("answered").expect_err("timed out");
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert_eq!(error.code(), tonic::Code::DeadlineExceeded);
        assert_eq!(
            error.message(),
            "the request's body did not arrive within 10s of its headers (--request-body-timeout); the request is abandoned"
        );
    }
}
