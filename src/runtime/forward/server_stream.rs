//! One server-streaming call's request bytes to the runtime, and its answer's messages back one
//! by one as they come, each bounded, none decoded.

use std::{pin::Pin, time::Duration};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use tokio::time::Instant;

use super::{Forwarder, broken};

/// The messages of a streamed answer, then its status: an error ends it.
pub type Messages = Pin<Box<dyn Stream<Item = Result<Bytes, tonic::Status>> + Send>>;

impl Forwarder {
    /// The runtime's messages in answer to `path` with `message`; all of them within `timeout`
    /// (told to the runtime as `grpc-timeout` too). An error before any message is the runtime's
    /// status as it sent it (UNIMPLEMENTED from a runtime without the call), or UNAVAILABLE when
    /// the connection failed.
    pub async fn server_stream(
        &self,
        path: &str,
        message: Bytes,
        timeout: Duration,
    ) -> Result<Messages, tonic::Status> {
        let deadline = Instant::now() + timeout;
        let (response, mut body) = self.send(self.request(path, timeout)?).await?;
        body.send_data(frame(message), true).map_err(broken)?;
        let response =
            tokio::time::timeout_at(deadline, response).await.map_err(|_| timed_out(timeout))?.map_err(broken)?;
        let (head, received) = response.into_parts();
        if let Some(status) = tonic::Status::from_header_map(&head.headers) {
            return Err(status);
        }
        if head.status != http::StatusCode::OK {
            return Err(tonic::Status::unknown(format!("the runtime answered HTTP {}", head.status)));
        }
        let limit = self.max_message_bytes;
        let state = Deframing { received, buffer: BytesMut::new(), ended: false };
        // Fused: whoever reads it may poll it again once it has ended.
        let messages = futures_util::stream::unfold(state, move |mut state| async move {
            if state.ended {
                return None;
            }
            let next = match tokio::time::timeout_at(deadline, state.next(limit)).await {
                Ok(next) => next,
                Err(_) => Some(Err(timed_out(timeout))),
            };
            state.ended = !matches!(next, Some(Ok(_)));
            next.map(|item| (item, state))
        });
        Ok(Box::pin(messages.fuse()))
    }
}

/// A message as gRPC frames it: not compressed, its length, its bytes.
pub(super) fn frame(message: Bytes) -> Bytes {
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(0);
    framed.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    framed.put(message);
    framed.freeze()
}

fn timed_out(timeout: Duration) -> tonic::Status {
    tonic::Status::deadline_exceeded(format!("the runtime did not finish its answer within {timeout:?}"))
}

/// The messages of an answer's body as they arrive.
struct Deframing {
    received: h2::RecvStream,
    buffer: BytesMut,
    ended: bool,
}

impl Deframing {
    /// The next whole message; the answer's status when there is none left (`None` for OK).
    async fn next(&mut self, limit: usize) -> Option<Result<Bytes, tonic::Status>> {
        loop {
            match self.whole_message(limit) {
                Ok(Some(message)) => return Some(Ok(message)),
                Ok(None) => {}
                Err(status) => return Some(Err(status)),
            }
            match self.received.data().await {
                Some(Ok(chunk)) => {
                    let _ = self.received.flow_control().release_capacity(chunk.len());
                    self.buffer.extend_from_slice(&chunk);
                }
                Some(Err(error)) => return Some(Err(broken(error))),
                None => return self.status().await,
            }
        }
    }

    /// The first message in the buffer once it is all there.
    fn whole_message(&mut self, limit: usize) -> Result<Option<Bytes>, tonic::Status> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        if self.buffer[0] != 0 {
            return Err(tonic::Status::internal("the runtime's answer is compressed, which was not asked for"));
        }
        let length = u32::from_be_bytes([self.buffer[1], self.buffer[2], self.buffer[3], self.buffer[4]]) as usize;
        if length > limit {
            return Err(tonic::Status::resource_exhausted(format!(
                "a message of the runtime's answer is larger than {limit} bytes"
            )));
        }
        if self.buffer.len() < 5 + length {
            return Ok(None);
        }
        self.buffer.advance(5);
        Ok(Some(self.buffer.split_to(length).freeze()))
    }

    /// The answer's end: its trailers' status, after no half message.
    async fn status(&mut self) -> Option<Result<Bytes, tonic::Status>> {
        if !self.buffer.is_empty() {
            return Some(Err(tonic::Status::internal("the runtime's answer ended within a message")));
        }
        let trailers = match self.received.trailers().await {
            Ok(trailers) => trailers.unwrap_or_default(),
            Err(error) => return Some(Err(broken(error))),
        };
        match tonic::Status::from_header_map(&trailers) {
            Some(status) if status.code() == tonic::Code::Ok => None,
            Some(status) => Some(Err(status)),
            None => Some(Err(tonic::Status::internal("the runtime's answer ended without a grpc-status"))),
        }
    }
}
