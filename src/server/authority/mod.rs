//! Serving clients that send a socket path as `:authority`.
//!
//! grpc-go before kubernetes/kubernetes#123463 (every kubelet and crictl of that era), Python
//! grpcio, grpc-java and grpcurl send the unix socket's path, or nothing usable, as the HTTP/2
//! `:authority`, and h2 resets any stream whose `:authority` is not a URI authority. A unix socket
//! has no authority to check, so each accepted connection's incoming bytes are read before h2
//! reads them: header blocks are decoded, and from the first one that carries such a field they
//! are re-encoded without it (see [`hpack`]); a connection that never sends one reaches h2 as
//! written. Every other frame passes through untouched, and so does what the server writes back.

mod frames;
mod hpack;
mod huffman;

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};

pub(super) use self::frames::PREFACE;
use self::frames::{FrameError, FrameRewriter};

/// How much is read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;

/// An accepted connection whose incoming HTTP/2 is rewritten so that h2 serves every request,
/// whatever its `:authority`.
#[derive(Debug)]
pub struct AuthorityTolerant<IO> {
    inner: IO,
    rewriter: FrameRewriter,
    /// Read from the socket, not yet rewritten (an incomplete frame).
    input: BytesMut,
    /// Rewritten, not yet read by the server.
    output: BytesMut,
    /// The rewrite failed: the connection ends with this error at the next read.
    failed: Option<FrameError>,
}

impl<IO> AuthorityTolerant<IO> {
    /// Wraps a freshly accepted connection.
    pub fn new(inner: IO) -> Self {
        Self {
            inner,
            rewriter: FrameRewriter::default(),
            input: BytesMut::new(),
            output: BytesMut::new(),
            failed: None,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for AuthorityTolerant<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.output.is_empty() {
                let n = this.output.len().min(buf.remaining());
                buf.put_slice(&this.output[..n]);
                this.output.advance(n);
                return Poll::Ready(Ok(()));
            }
            if let Some(error) = &this.failed {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, error.clone())));
            }
            this.input.reserve(READ_CHUNK);
            if ready!(tokio_util::io::poll_read_buf(Pin::new(&mut this.inner), cx, &mut this.input))? == 0 {
                // End of stream: whatever incomplete frame is left, the server sees it end.
                return Poll::Ready(Ok(()));
            }
            if let Err(error) = this.rewriter.process(&mut this.input, &mut this.output) {
                tracing::debug!(%error, "ending a connection whose HTTP/2 cannot be read");
                this.failed = Some(error);
            }
        }
    }
}

writes_pass_through!(AuthorityTolerant);

#[cfg(test)]
mod tests;
