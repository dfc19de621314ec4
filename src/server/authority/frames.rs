//! The client-to-server byte stream of one HTTP/2 connection, frame by frame: header blocks
//! (HEADERS and their CONTINUATIONs) are gathered and rewritten, everything else passes through.

use bytes::{Buf, BufMut, BytesMut};

use super::hpack::{BlockRewriter, HpackError, Rewrite};

/// What every HTTP/2 client sends first (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The largest frame a client may send us: SETTINGS_MAX_FRAME_SIZE, which our server (hyper's
/// defaults) leaves at the protocol's initial value. Also the size of the frames we write.
pub const MAX_FRAME_SIZE: usize = 16_384;

/// The most header-block bytes gathered for one request, and the most the re-encoding may grow
/// to, before the connection is ended. hyper refuses header lists over 16 KiB per stream (431),
/// so this only bounds what a client can make us hold; and four frames stay under h2's limit of
/// five CONTINUATION frames per block, so such a request still gets its own 431.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;

const FRAME_HEADER_LEN: usize = 9;
// Frame types and flags (RFC 9113, section 6). The fuzz target's frame walk takes them from here,
// through the module it compiles in; `frames` itself is private to `authority`.
pub const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
pub const CONTINUATION: u8 = 0x9;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

/// Why a connection's byte stream cannot be rewritten: each ends that connection only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("{kind} frame of {len} bytes exceeds the maximum frame size {MAX_FRAME_SIZE}")]
    FrameTooLarge { kind: &'static str, len: usize },
    #[error("HEADERS frame's padding or priority is longer than the frame")]
    BadPadding,
    #[error("CONTINUATION frame without a header block in progress")]
    UnexpectedContinuation,
    #[error("frame of type {0:#x} inside a header block (a CONTINUATION of the same stream must follow)")]
    InterruptedHeaderBlock(u8),
    #[error("a client may not send PUSH_PROMISE")]
    PushPromise,
    #[error("header block exceeds {MAX_HEADER_BLOCK} bytes")]
    HeaderBlockTooLarge,
    #[error("invalid header block: {0}")]
    Hpack(#[from] HpackError),
}

/// A header block being gathered from a HEADERS frame and its CONTINUATIONs.
#[derive(Debug)]
struct PendingBlock {
    stream_id: u32,
    end_stream: bool,
    /// Stream dependency and weight, when the HEADERS frame carried them.
    priority: Option<[u8; 5]>,
    /// The block itself, padding removed.
    fragment: BytesMut,
    /// The frames as received, for a block the server may read as written.
    frames: BytesMut,
}

#[derive(Debug)]
enum State {
    /// Reading the client preface; `matched` bytes of it seen so far.
    Preface { matched: usize },
    /// At a frame boundary.
    FrameHeader,
    /// Forwarding the rest of a frame we do not change.
    Payload { remaining: usize },
    /// Not HTTP/2 with prior knowledge: forwarded untouched, for the server to refuse.
    Opaque,
}

/// Rewrites one connection's client-to-server bytes.
#[derive(Debug)]
pub struct FrameRewriter {
    state: State,
    pending: Option<PendingBlock>,
    hpack: BlockRewriter,
}

impl Default for FrameRewriter {
    fn default() -> Self {
        Self { state: State::Preface { matched: 0 }, pending: None, hpack: BlockRewriter::default() }
    }
}

impl FrameRewriter {
    /// Consumes what it can of `input` and appends the bytes for the server to `out`. Bytes of an
    /// incomplete frame header or header frame stay in `input` until more arrive.
    pub fn process(&mut self, input: &mut BytesMut, out: &mut BytesMut) -> Result<(), FrameError> {
        loop {
            match self.state {
                State::Opaque => {
                    out.put(input.split());
                    return Ok(());
                }
                State::Preface { matched } => {
                    let wanted = &PREFACE[matched..];
                    let available = input.len().min(wanted.len());
                    if input[..available] != wanted[..available] {
                        self.state = State::Opaque;
                        continue;
                    }
                    out.put(input.split_to(available));
                    if available < wanted.len() {
                        self.state = State::Preface { matched: matched + available };
                        return Ok(());
                    }
                    self.state = State::FrameHeader;
                }
                State::Payload { remaining } => {
                    let available = input.len().min(remaining);
                    out.put(input.split_to(available));
                    if available < remaining {
                        self.state = State::Payload { remaining: remaining - available };
                        return Ok(());
                    }
                    self.state = State::FrameHeader;
                }
                State::FrameHeader => {
                    if input.len() < FRAME_HEADER_LEN {
                        return Ok(());
                    }
                    let len = (usize::from(input[0]) << 16) | (usize::from(input[1]) << 8) | usize::from(input[2]);
                    let (kind, flags) = (input[3], input[4]);
                    let stream_id = u32::from_be_bytes([input[5], input[6], input[7], input[8]]) & 0x7fff_ffff;
                    if let Some(pending) = &self.pending
                        && (kind != CONTINUATION || stream_id != pending.stream_id)
                    {
                        return Err(FrameError::InterruptedHeaderBlock(kind));
                    }
                    match kind {
                        HEADERS | CONTINUATION => {
                            if len > MAX_FRAME_SIZE {
                                let kind = if kind == HEADERS { "HEADERS" } else { "CONTINUATION" };
                                return Err(FrameError::FrameTooLarge { kind, len });
                            }
                            if input.len() < FRAME_HEADER_LEN + len {
                                input.reserve(FRAME_HEADER_LEN + len - input.len());
                                return Ok(());
                            }
                            let frame = input.split_to(FRAME_HEADER_LEN + len);
                            if kind == HEADERS {
                                self.start_block(stream_id, flags, frame)?;
                            } else {
                                self.continue_block(frame)?;
                            }
                            if flags & END_HEADERS != 0 {
                                self.finish_block(out)?;
                            }
                        }
                        PUSH_PROMISE => return Err(FrameError::PushPromise),
                        _ => {
                            out.put(input.split_to(FRAME_HEADER_LEN));
                            self.state = State::Payload { remaining: len };
                        }
                    }
                }
            }
        }
    }

    fn start_block(&mut self, stream_id: u32, flags: u8, frame: BytesMut) -> Result<(), FrameError> {
        let mut payload = &frame[FRAME_HEADER_LEN..];
        let padding = if flags & PADDED != 0 {
            if payload.is_empty() {
                return Err(FrameError::BadPadding);
            }
            usize::from(payload.get_u8())
        } else {
            0
        };
        let priority = if flags & PRIORITY != 0 {
            if payload.len() < 5 {
                return Err(FrameError::BadPadding);
            }
            let mut fields = [0u8; 5];
            payload.copy_to_slice(&mut fields);
            Some(fields)
        } else {
            None
        };
        if padding > payload.len() {
            return Err(FrameError::BadPadding);
        }
        let fragment = BytesMut::from(&payload[..payload.len() - padding]);
        let end_stream = flags & END_STREAM != 0;
        self.pending = Some(PendingBlock { stream_id, end_stream, priority, fragment, frames: frame });
        Ok(())
    }

    fn continue_block(&mut self, frame: BytesMut) -> Result<(), FrameError> {
        let pending = self.pending.as_mut().ok_or(FrameError::UnexpectedContinuation)?;
        if pending.fragment.len() + frame.len() - FRAME_HEADER_LEN > MAX_HEADER_BLOCK {
            return Err(FrameError::HeaderBlockTooLarge);
        }
        pending.fragment.extend_from_slice(&frame[FRAME_HEADER_LEN..]);
        pending.frames.unsplit(frame);
        Ok(())
    }

    /// Writes the block as received, or rewritten as one HEADERS frame and as many CONTINUATIONs
    /// as it needs.
    fn finish_block(&mut self, out: &mut BytesMut) -> Result<(), FrameError> {
        let Some(pending) = self.pending.take() else { return Err(FrameError::UnexpectedContinuation) };
        let mut rewritten = BytesMut::new();
        let rewrite =
            self.hpack.rewrite(&pending.fragment, &mut rewritten, MAX_HEADER_BLOCK).map_err(|error| match error {
                HpackError::TooLarge(_) => FrameError::HeaderBlockTooLarge,
                other => FrameError::Hpack(other),
            })?;
        if rewrite == Rewrite::Verbatim {
            out.put(pending.frames);
            return Ok(());
        }
        let mut block = match pending.priority {
            Some(priority) => {
                let mut block = BytesMut::from(&priority[..]);
                block.put(rewritten);
                block
            }
            None => rewritten,
        };

        let mut flags = if pending.end_stream { END_STREAM } else { 0 };
        if pending.priority.is_some() {
            flags |= PRIORITY;
        }
        let mut kind = HEADERS;
        loop {
            let chunk = block.split_to(block.len().min(MAX_FRAME_SIZE));
            let last = block.is_empty();
            if last {
                flags |= END_HEADERS;
            }
            put_frame_header(out, chunk.len(), kind, flags, pending.stream_id);
            out.put(chunk);
            if last {
                return Ok(());
            }
            (kind, flags) = (CONTINUATION, 0);
        }
    }
}

fn put_frame_header(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream_id: u32) {
    out.put_uint(len as u64, 3);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream_id);
}

#[cfg(test)]
mod tests;
