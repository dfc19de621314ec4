//! Streaming responses end when the daemon stops. An idle stream (a health Watch an agent keeps
//! open) would otherwise hold the drain up until its deadline; instead it ends at once with
//! UNAVAILABLE, telling its client to watch again once the daemon is back.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame};
use tonic::{Status, body::Body as TonicBody, server::NamedService};
use tower::Service;

use crate::shutdown::Shutdown;

/// The daemon stopped while a stream was open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cri-imaged is shutting down; watch again when it is back")]
pub struct StreamShutDown;

/// A service whose response bodies end when shutdown is requested.
#[derive(Debug, Clone)]
pub struct EndOnShutdown<S> {
    inner: S,
    shutdown: Shutdown,
}

impl<S> EndOnShutdown<S> {
    pub fn new(inner: S, shutdown: Shutdown) -> Self {
        Self { inner, shutdown }
    }
}

impl<S: NamedService> NamedService for EndOnShutdown<S> {
    const NAME: &'static str = S::NAME;
}

type Response = http::Response<TonicBody>;

impl<S, B> Service<http::Request<B>> for EndOnShutdown<S>
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
        let response = self.inner.call(request);
        let shutdown = self.shutdown.clone();
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| {
                TonicBody::new(UntilShutdown { body, stopping: Box::pin(shutdown.requested()), ended: false })
            }))
        })
    }
}

/// A response body that ends, with [`StreamShutDown`] as its status, once shutdown is requested.
struct UntilShutdown {
    body: TonicBody,
    stopping: Pin<Box<dyn Future<Output = ()> + Send>>,
    ended: bool,
}

impl Body for UntilShutdown {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            this.ended = frame.is_none();
            return Poll::Ready(frame);
        }
        if this.stopping.as_mut().poll(cx).is_ready() {
            this.ended = true;
            return Poll::Ready(Some(Ok(Frame::trailers(trailers(StreamShutDown.into())))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.is_end_stream()
    }
}

/// The trailers that end a gRPC response with `status`.
pub fn trailers(status: Status) -> http::HeaderMap {
    let mut trailers = status.into_http::<()>().into_parts().0.headers;
    trailers.remove(http::header::CONTENT_TYPE);
    trailers
}
