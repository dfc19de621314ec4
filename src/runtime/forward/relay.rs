//! A whole call of any shape (unary, or streaming either way) relayed to the runtime as it came:
//! its headers (the caller's metadata and `grpc-timeout` included) and its frames, and the
//! runtime's headers, frames and trailers back. Nothing is decoded, so a method added to the CRI
//! after us reaches a runtime that has it, and the runtime's UNIMPLEMENTED reaches the caller of
//! one it has not.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use tonic::body::Body;

use super::{Forwarder, broken};

/// Headers that belong to one HTTP/2 hop, not to the call.
const HOP_BY_HOP: [http::HeaderName; 6] = [
    http::header::CONNECTION,
    http::header::HOST,
    http::header::TE,
    http::header::TRANSFER_ENCODING,
    http::header::UPGRADE,
    http::header::CONTENT_LENGTH,
];

impl Forwarder {
    /// The runtime's answer to `request`, streamed back as it comes; UNAVAILABLE when the
    /// connection to the runtime failed before it answered. The caller's frames are sent as the
    /// runtime's flow control lets them, and the runtime is told to stop (RST_STREAM) when the
    /// answer is dropped: the caller went away.
    pub async fn relay(&self, request: http::Request<Body>) -> Result<http::Response<Body>, tonic::Status> {
        let (head, body) = request.into_parts();
        let path = head.uri.path_and_query().map_or("/", http::uri::PathAndQuery::as_str);
        let mut outgoing = http::Request::post(format!("http://localhost{path}"))
            .body(())
            .map_err(|error| tonic::Status::internal(format!("a request to the runtime: {error}")))?;
        *outgoing.headers_mut() = without_hop_by_hop(head.headers);
        outgoing.headers_mut().insert(http::header::TE, http::HeaderValue::from_static("trailers"));
        let (response, sending) = self.send(outgoing).await?;
        let pump = tokio::spawn(pump(body, sending));
        let response = match response.await {
            Ok(response) => response,
            Err(error) => {
                pump.abort();
                return Err(broken(error));
            }
        };
        let (mut head, received) = response.into_parts();
        head.headers = without_hop_by_hop(head.headers);
        let body = Relayed { received, state: State::Data, pump: pump.abort_handle() };
        Ok(http::Response::from_parts(head, Body::new(body)))
    }
}

fn without_hop_by_hop(mut headers: http::HeaderMap) -> http::HeaderMap {
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers
}

/// The caller's frames to the runtime, as its flow control allows; a caller that breaks off
/// resets the runtime's stream.
async fn pump(mut body: Body, mut sending: SendStream<Bytes>) {
    loop {
        match body.frame().await {
            None => {
                let _ = sending.send_data(Bytes::new(), true);
                return;
            }
            Some(Err(_)) => {
                sending.send_reset(h2::Reason::CANCEL);
                return;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(mut data) => {
                    while !data.is_empty() {
                        sending.reserve_capacity(data.len());
                        match std::future::poll_fn(|cx| sending.poll_capacity(cx)).await {
                            Some(Ok(0)) => {}
                            Some(Ok(room)) => {
                                let chunk = data.split_to(room.min(data.len()));
                                if sending.send_data(chunk, false).is_err() {
                                    return;
                                }
                            }
                            // The runtime reset the stream, or the connection is gone: the answer
                            // says so.
                            Some(Err(_)) | None => return,
                        }
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        let _ = sending.send_trailers(trailers);
                        return;
                    }
                }
            },
        }
    }
}

/// The runtime's answer as a body: its data frames, then its trailers.
struct Relayed {
    received: RecvStream,
    state: State,
    /// The caller's frames still being sent: stopped when the answer is dropped.
    pump: tokio::task::AbortHandle,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Data,
    Trailers,
    Done,
}

impl Drop for Relayed {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

impl HttpBody for Relayed {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        if this.state == State::Data {
            match std::task::ready!(this.received.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = this.received.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(error)) => return this.end(error),
                None => this.state = State::Trailers,
            }
        }
        if this.state == State::Done {
            return Poll::Ready(None);
        }
        let trailers = std::task::ready!(this.received.poll_trailers(cx));
        this.state = State::Done;
        match trailers {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(without_hop_by_hop(trailers))))),
            Ok(None) => Poll::Ready(None),
            Err(error) => this.end(error),
        }
    }

    /// True at once for a trailers-only answer (an error, mostly), whose END_STREAM came with its
    /// headers: the caller then gets it trailers-only too, as gRPC clients require (grpcio refuses
    /// a stream ended by an empty DATA frame after the status).
    fn is_end_stream(&self) -> bool {
        self.state == State::Done || (self.state == State::Data && self.received.is_end_stream())
    }
}

impl Relayed {
    /// The stream broke off (the runtime reset it, or the connection failed): the caller gets
    /// trailers saying so, as a gRPC client of the runtime would have seen it.
    fn end(&mut self, error: h2::Error) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        self.state = State::Done;
        let mut trailers = http::HeaderMap::new();
        match broken(error).add_header(&mut trailers) {
            Ok(()) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Err(status) => Poll::Ready(Some(Err(status))),
        }
    }
}
