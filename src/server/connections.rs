//! Serving each admitted connection with hyper's HTTP/2, as tonic's own server does, and what it
//! lacks: a connection with no request under way for `--connection-idle-timeout` is sent GOAWAY
//! and closed, so that connections that answer PINGs but never ask hold no place for long. At
//! shutdown every connection is sent GOAWAY, finishes what it serves, and closes.

use std::{
    convert::Infallible,
    pin::{Pin, pin},
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures_util::{Stream, StreamExt};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    sync::watch,
};
use tonic::{body::Body, transport::server::Connected};
use tower::{Service, ServiceExt};

/// HTTP/2 as each connection speaks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Settings {
    /// Streams open at once on one connection (SETTINGS_MAX_CONCURRENT_STREAMS).
    pub max_concurrent_streams: u32,
    /// A PING on a connection quiet this long, and how long it may go unanswered.
    pub keepalive: (Duration, Duration),
    /// No request under way this long: GOAWAY. `None` keeps a quiet connection open.
    pub idle_timeout: Option<Duration>,
}

/// Serves every connection `incoming` yields with `service` until `stop` completes; then sends
/// each GOAWAY and resolves once all have closed.
pub async fn serve<IO, S>(
    incoming: impl Stream<Item = std::io::Result<IO>>,
    service: S,
    settings: Http2Settings,
    stop: impl Future<Output = ()>,
) where
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(settings.max_concurrent_streams)
        .keep_alive_interval(settings.keepalive.0)
        .keep_alive_timeout(settings.keepalive.1);
    // Every connection holds a receiver: all have closed once the sender sees none.
    let (closing, close) = watch::channel(false);
    {
        // Dropped when the loop ends: the listener closes, and new callers are refused at once.
        let (mut incoming, mut stop) = (pin!(incoming), pin!(stop));
        loop {
            tokio::select! {
                () = &mut stop => break,
                next = incoming.next() => match next {
                    Some(Ok(io)) => {
                        let idle = settings.idle_timeout;
                        tokio::spawn(connection(io, service.clone(), builder.clone(), idle, close.clone()));
                    }
                    // The accept path yields no errors; a stream that ends has no more to serve.
                    Some(Err(error)) => tracing::debug!(%error, "a connection could not be served"),
                    None => break,
                },
            }
        }
    }
    drop(close);
    closing.send_replace(true);
    closing.closed().await;
}

/// Serves one connection until it closes, is idle past `idle_timeout`, or `close` says so.
async fn connection<IO, S>(
    io: IO,
    service: S,
    builder: hyper::server::conn::http2::Builder<TokioExecutor>,
    idle_timeout: Option<Duration>,
    mut close: watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let connect_info = io.connect_info();
    let (in_flight, watching) = watch::channel(0usize);
    let in_flight = Arc::new(in_flight);
    let per_request = tower::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
        // What tonic's own server gives each request: who connected (SO_PEERCRED).
        request.extensions_mut().insert(connect_info.clone());
        let under_way = UnderWay::begin(&in_flight);
        let answer = service.clone().oneshot(request.map(Body::new));
        async move {
            let response = answer.await?;
            // Under way until its body ends: a stream (WatchEvents) keeps the connection busy.
            Ok::<_, Infallible>(response.map(|body| Body::new(Tracked { inner: body, _under_way: under_way })))
        }
    });
    let mut served = pin!(builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(per_request)));
    let mut idle = pin!(idle_past(watching, idle_timeout));
    let mut going_away = false;
    loop {
        tokio::select! {
            result = &mut served => {
                if let Err(error) = result {
                    tracing::debug!(%error, "connection ended");
                }
                return;
            }
            () = &mut idle, if !going_away => {
                tracing::debug!(timeout = ?idle_timeout, "connection idle; GOAWAY (--connection-idle-timeout)");
                going_away = true;
                served.as_mut().graceful_shutdown();
            }
            _ = close.wait_for(|close| *close), if !going_away => {
                going_away = true;
                served.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Resolves once no request has been under way for `timeout`; never without one.
async fn idle_past(mut in_flight: watch::Receiver<usize>, timeout: Option<Duration>) {
    let Some(timeout) = timeout else { return std::future::pending().await };
    loop {
        if in_flight.wait_for(|count| *count == 0).await.is_err() {
            return std::future::pending().await;
        }
        tokio::select! {
            () = tokio::time::sleep(timeout) => return,
            // A request came (and maybe went): the quiet starts again.
            _ = in_flight.changed() => {}
        }
    }
}

/// A request under way on its connection, counted until dropped.
struct UnderWay(Arc<watch::Sender<usize>>);

impl UnderWay {
    fn begin(in_flight: &Arc<watch::Sender<usize>>) -> Self {
        in_flight.send_modify(|count| *count += 1);
        Self(in_flight.clone())
    }
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        self.0.send_modify(|count| *count -= 1);
    }
}

/// A response body that keeps its request counted as under way until it ends or is dropped.
struct Tracked {
    inner: Body,
    _under_way: UnderWay,
}

impl HttpBody for Tracked {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
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
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_once_nothing_has_been_under_way_for_the_timeout() {
        let (in_flight, watching) = watch::channel(0usize);
        let in_flight = Arc::new(in_flight);
        let mut idle = tokio::spawn(idle_past(watching, Some(Duration::from_secs(60))));
        let request = UnderWay::begin(&in_flight);
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!idle.is_finished(), "a request under way for 10 minutes: busy");
        drop(request);
        tokio::time::sleep(Duration::from_secs(59)).await;
        let brief = UnderWay::begin(&in_flight);
        drop(brief);
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert!(!idle.is_finished(), "a request came within the minute: the quiet started again");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!((&mut idle).await.is_ok(), "idle a minute after the last request");
        let never = tokio::spawn(idle_past(in_flight.subscribe(), None));
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!never.is_finished(), "no timeout: never idle");
    }
}
