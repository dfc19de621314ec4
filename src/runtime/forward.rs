//! One unary CRI call's message bytes to the runtime and its answer's bytes back, over an HTTP/2
//! connection of its own, driven with `h2` directly; a server-streaming call's messages
//! (`server_stream`), and any call relayed whole (`relay`).
//!
//! tonic's channel hands each call through a buffer task, then hyper's connection task, then a
//! task per response: three task switches each way, on a path whose every microsecond the kubelet
//! waits for (the pass-through in strict mode, or a miss). Here the caller's task queues the
//! request's HEADERS and DATA itself (one write, not two), and the connection task wakes it when
//! the answer is in. The connection is made on first use and again after it fails (containerd
//! restarted), so the daemon can start before the runtime.

use std::{path::PathBuf, sync::Mutex, time::Duration};

use bytes::{Bytes, BytesMut};
use h2::client::SendRequest;
use tokio::net::UnixStream;

/// The windows hyper gives a client: a 16 MiB answer needs few WINDOW_UPDATEs.
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;

/// Forwards unary calls to the gRPC server on a unix socket.
pub struct Forwarder {
    socket: PathBuf,
    /// The live connection's sender; `None` until the first call, and after a failure.
    sender: Mutex<Option<SendRequest<Bytes>>>,
    /// Held while connecting, so that callers arriving together make one connection.
    connecting: tokio::sync::Mutex<()>,
    max_message_bytes: usize,
}

impl Forwarder {
    pub fn new(socket: PathBuf, max_message_bytes: usize) -> Self {
        Self { socket, sender: Mutex::new(None), connecting: tokio::sync::Mutex::new(()), max_message_bytes }
    }

    /// The runtime's answer to `path` with `message` (bounded by the server that read it), with
    /// `timeout` told to it (`grpc-timeout`); its gRPC error as it sent it, or UNAVAILABLE when
    /// the connection failed. The caller bounds the wait.
    pub async fn unary(&self, path: &str, message: Bytes, timeout: Duration) -> Result<Bytes, tonic::Status> {
        let (response, mut body) = self.send(self.request(path, timeout)?).await?;
        body.send_data(server_stream::frame(message), true).map_err(broken)?;
        let response = response.await.map_err(broken)?;
        self.answer(response).await
    }

    /// The headers of a call of `path`, with `timeout` told to the runtime (`grpc-timeout`).
    fn request(&self, path: &str, timeout: Duration) -> Result<http::Request<()>, tonic::Status> {
        http::Request::post(format!("http://localhost{path}"))
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .header("grpc-timeout", format!("{}m", timeout.as_millis().max(1)))
            .body(())
            .map_err(|error| tonic::Status::internal(format!("a request to the runtime: {error}")))
    }

    /// Sends the request's headers on the live connection, or on a new one when there is none or
    /// it has failed (nothing was sent on a failed one, so sending again is safe).
    async fn send(
        &self,
        request: http::Request<()>,
    ) -> Result<(h2::client::ResponseFuture, h2::SendStream<Bytes>), tonic::Status> {
        let current = self.sender.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        if let Some(sender) = current
            && let Ok(mut ready) = sender.ready().await
            && let Ok(sent) = ready.send_request(request.clone(), false)
        {
            return Ok(sent);
        }
        let mut ready = self.reconnect().await?.ready().await.map_err(broken)?;
        ready.send_request(request, false).map_err(broken)
    }

    /// A sender on a new connection, unless another caller made one meanwhile.
    async fn reconnect(&self) -> Result<SendRequest<Bytes>, tonic::Status> {
        let _connecting = self.connecting.lock().await;
        let current = self.sender.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        if let Some(mut sender) = current
            && std::future::poll_fn(|cx| sender.poll_ready(cx)).await.is_ok()
        {
            return Ok(sender);
        }
        let stream = UnixStream::connect(&self.socket)
            .await
            .map_err(|error| tonic::Status::unavailable(format!("the connection to the runtime failed: {error}")))?;
        let (sender, connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake::<_, Bytes>(stream)
            .await
            .map_err(broken)?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "the forwarding connection to the runtime ended");
            }
        });
        *self.sender.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(sender.clone());
        Ok(sender)
    }

    /// The message of a gRPC answer, or its status when it is an error.
    async fn answer(&self, response: http::Response<h2::RecvStream>) -> Result<Bytes, tonic::Status> {
        let (head, mut body) = response.into_parts();
        // A trailers-only answer (an error, mostly) carries its status in the headers.
        if let Some(status) = tonic::Status::from_header_map(&head.headers) {
            return Err(status);
        }
        if head.status != http::StatusCode::OK {
            return Err(tonic::Status::unknown(format!("the runtime answered HTTP {}", head.status)));
        }
        let mut data = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(broken)?;
            let _ = body.flow_control().release_capacity(chunk.len());
            if data.len() + chunk.len() > self.max_message_bytes + 5 {
                return Err(tonic::Status::resource_exhausted(format!(
                    "the runtime's answer is larger than {} bytes",
                    self.max_message_bytes
                )));
            }
            data.extend_from_slice(&chunk);
        }
        let trailers = body.trailers().await.map_err(broken)?.unwrap_or_default();
        match tonic::Status::from_header_map(&trailers) {
            Some(status) if status.code() != tonic::Code::Ok => return Err(status),
            Some(_) => {}
            None => return Err(tonic::Status::internal("the runtime's answer ended without a grpc-status")),
        }
        unframe(data.freeze())
    }
}

/// The one message of a unary answer's body: a 5-byte prefix (not compressed, its length), then
/// the message.
fn unframe(mut data: Bytes) -> Result<Bytes, tonic::Status> {
    if data.len() < 5 {
        return Err(tonic::Status::internal("the runtime's answer has no message"));
    }
    let (compressed, length) = (data[0], u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize);
    if compressed != 0 {
        return Err(tonic::Status::internal("the runtime's answer is compressed, which was not asked for"));
    }
    if data.len() != 5 + length {
        return Err(tonic::Status::internal("the runtime's answer is not one whole message"));
    }
    Ok(data.split_off(5))
}

/// A failure of the connection or the stream, not an answer of the runtime: UNAVAILABLE, with
/// the cause, as grpc-go reports it.
fn broken(error: h2::Error) -> tonic::Status {
    if let Some(reason) = error.reason()
        && error.is_remote()
        && reason == h2::Reason::CANCEL
    {
        return tonic::Status::cancelled(format!("the runtime cancelled the call: {error}"));
    }
    tonic::Status::unavailable(format!("the connection to the runtime failed: {error}"))
}

mod relay;
mod server_stream;

pub use server_stream::Messages;

#[cfg(test)]
mod tests;
