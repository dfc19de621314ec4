//! The HTTP/2 `:authority` handling (`server::authority`): a client's byte stream through the
//! frame and HPACK rewriter, whole and in pieces, checked against an independent HPACK decoder:
//! every frame that is not a header block reaches the server byte for byte, and every header
//! block decodes, with the server's table, to the client's fields less each `:authority` that is
//! not a URI authority.
//!
//! `server::authority` is private to `server`, so its three modules are compiled in here from
//! the main crate's sources, unchanged; the decoder below is the target's own but for HPACK's
//! static table (RFC 7541, Appendix A) and the frame types and flags, which it takes from them.
//!
//! Input: one byte (bit 7: prepend the client preface; bits 0-6: deliver in pieces of that many
//! bytes, 0 for one piece), then the client's bytes.
#![no_main]

#[path = "../../src/server/authority/frames.rs"]
#[allow(dead_code)]
mod frames;
#[path = "../../src/server/authority/hpack.rs"]
#[allow(dead_code)]
mod hpack;
#[path = "../../src/server/authority/huffman.rs"]
#[allow(dead_code)]
mod huffman;

use std::collections::VecDeque;

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;

use self::frames::{
    CONTINUATION, END_HEADERS, END_STREAM, FrameRewriter, HEADERS, MAX_FRAME_SIZE, PADDED, PREFACE, PRIORITY,
};

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else { return };
    let mut input = Vec::with_capacity(PREFACE.len() + rest.len());
    if control & 0x80 != 0 {
        input.extend_from_slice(PREFACE);
    }
    input.extend_from_slice(rest);
    let step = usize::from(control & 0x7f);

    let whole = run(&input, input.len().max(1));
    let pieces = run(&input, if step == 0 { input.len().max(1) } else { step });
    assert_eq!(whole, pieces, "the rewrite does not depend on how the bytes arrive");
    let Ok((out, left)) = whole else { return };

    let matched = input.len().min(PREFACE.len());
    if input[..matched] != PREFACE[..matched] {
        assert_eq!((out.as_slice(), left.as_slice()), (input.as_slice(), &[][..]), "not HTTP/2: untouched");
        return;
    }
    assert_eq!(out[..matched], PREFACE[..matched]);
    assert_eq!(&input[input.len() - left.len()..], left.as_slice(), "what is left is the input's tail");
    if input.len() < PREFACE.len() {
        return;
    }
    let sent = walk(&input[PREFACE.len()..], &mut Decoder::default(), true);
    let received = walk(&out[PREFACE.len()..], &mut Decoder::default(), false);
    assert_eq!(received, sent, "the server reads what the client sent, less unusable authorities");
});

/// Feeds `input` in pieces of `step` bytes; the output and what is left unprocessed.
fn run(input: &[u8], step: usize) -> Result<(Vec<u8>, Vec<u8>), frames::FrameError> {
    let mut rewriter = FrameRewriter::default();
    let (mut pending, mut out) = (BytesMut::new(), BytesMut::new());
    for piece in input.chunks(step) {
        pending.extend_from_slice(piece);
        rewriter.process(&mut pending, &mut out)?;
    }
    Ok((out.to_vec(), pending.to_vec()))
}

/// One frame, or one whole header block decoded.
#[derive(Debug, PartialEq, Eq)]
enum Item {
    /// Any other frame: its header and as much of its payload as there is.
    Frame(Vec<u8>),
    Block {
        stream: u32,
        end_stream: bool,
        priority: Option<Vec<u8>>,
        fields: Vec<(Vec<u8>, Vec<u8>)>,
    },
}

/// A header block being gathered: its HEADERS frame's stream, flag and priority, and its bytes.
struct Pending {
    stream: u32,
    end_stream: bool,
    priority: Option<Vec<u8>>,
    block: Vec<u8>,
}

/// The frames after the preface, each header block decoded with `decoder`; `client`: the fields
/// h2 would refuse are left out. A header block not yet complete is not listed.
fn walk(mut bytes: &[u8], decoder: &mut Decoder, client: bool) -> Vec<Item> {
    let mut items = Vec::new();
    let mut pending: Option<Pending> = None;
    while bytes.len() >= 9 {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        let (kind, flags) = (bytes[3], bytes[4]);
        let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
        if kind != HEADERS && kind != CONTINUATION {
            let end = bytes.len().min(9 + len);
            items.push(Item::Frame(bytes[..end].to_vec()));
            bytes = &bytes[end..];
            continue;
        }
        assert!(len <= MAX_FRAME_SIZE, "a header frame of {len} bytes");
        if bytes.len() < 9 + len {
            break;
        }
        let mut payload = &bytes[9..9 + len];
        bytes = &bytes[9 + len..];
        if kind == HEADERS {
            assert!(pending.is_none(), "a header block interrupted");
            let padding = if flags & PADDED != 0 {
                let padding = usize::from(payload[0]);
                payload = &payload[1..];
                padding
            } else {
                0
            };
            let priority = (flags & PRIORITY != 0).then(|| {
                let (fields, rest) = payload.split_at(5);
                payload = rest;
                fields.to_vec()
            });
            let fragment = payload[..payload.len() - padding].to_vec();
            pending = Some(Pending { stream, end_stream: flags & END_STREAM != 0, priority, block: fragment });
        } else {
            let block = pending.as_mut().expect("a CONTINUATION follows a HEADERS");
            assert_eq!(block.stream, stream, "a CONTINUATION of the same stream");
            block.block.extend_from_slice(payload);
        }
        if flags & END_HEADERS != 0 {
            let Pending { stream, end_stream, priority, block } = pending.take().expect("a block in progress");
            let mut fields = decoder.decode(&block).unwrap_or_else(|error| panic!("block {block:02x?}: {error}"));
            if client {
                fields.retain(|(name, value)| {
                    name != b":authority" || http::uri::Authority::try_from(&value[..]).is_ok()
                });
            }
            items.push(Item::Block { stream, end_stream, priority, fields });
        }
    }
    items
}

type Field = (Vec<u8>, Vec<u8>);

/// A plain HPACK decoder (RFC 7541), written apart from the rewriter's, as h2's would read.
struct Decoder {
    table: VecDeque<Field>,
    size: usize,
    max_size: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Self { table: VecDeque::new(), size: 0, max_size: 4096 }
    }
}

impl Decoder {
    fn decode(&mut self, mut block: &[u8]) -> Result<Vec<Field>, String> {
        let mut fields = Vec::new();
        while let Some(&first) = block.first() {
            if first & 0x80 != 0 {
                let index = integer(&mut block, 7)?;
                fields.push(self.get(index)?);
            } else if first & 0xe0 == 0x20 {
                if !fields.is_empty() {
                    return Err("a size update after a field".into());
                }
                let size = integer(&mut block, 5)?;
                if size > 4096 {
                    return Err(format!("a size update to {size}"));
                }
                self.max_size = size;
                self.evict(size);
            } else {
                let prefix = if first & 0x40 != 0 { 6 } else { 4 };
                let name = match integer(&mut block, prefix)? {
                    0 => string(&mut block)?,
                    index => self.get(index)?.0,
                };
                let field = (name, string(&mut block)?);
                if first & 0x40 != 0 {
                    self.insert(field.clone());
                }
                fields.push(field);
            }
        }
        Ok(fields)
    }

    fn get(&self, index: usize) -> Result<Field, String> {
        match index {
            1..=61 => {
                let (name, value) = hpack::STATIC_TABLE[index - 1];
                Ok((name.as_bytes().to_vec(), value.as_bytes().to_vec()))
            }
            _ => index.checked_sub(62).and_then(|at| self.table.get(at)).cloned().ok_or(format!("index {index}")),
        }
    }

    fn insert(&mut self, field: Field) {
        let size = field.0.len() + field.1.len() + 32;
        if size > self.max_size {
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict(self.max_size - size);
        self.size += size;
        self.table.push_front(field);
    }

    fn evict(&mut self, to: usize) {
        while self.size > to {
            let (name, value) = self.table.pop_back().expect("entries while the size is positive");
            self.size -= name.len() + value.len() + 32;
        }
    }
}

fn integer(input: &mut &[u8], prefix: u32) -> Result<usize, String> {
    let (&first, rest) = input.split_first().ok_or("truncated integer")?;
    *input = rest;
    let max = (1usize << prefix) - 1;
    let mut value = usize::from(first) & max;
    if value < max {
        return Ok(value);
    }
    let mut shift = 0;
    loop {
        let (&byte, rest) = input.split_first().ok_or("truncated integer")?;
        *input = rest;
        value = value
            .checked_add(usize::from(byte & 0x7f).checked_shl(shift).ok_or("huge integer")?)
            .ok_or("huge integer")?;
        if shift > 28 {
            return Err("huge integer".into());
        }
        if byte & 0x80 == 0 {
            return Ok(value);
        }
        shift += 7;
    }
}

fn string(input: &mut &[u8]) -> Result<Vec<u8>, String> {
    let huffman = input.first().ok_or("truncated string")? & 0x80 != 0;
    let len = integer(input, 7)?;
    if len > input.len() {
        return Err("truncated string".into());
    }
    let (raw, rest) = input.split_at(len);
    *input = rest;
    if !huffman {
        return Ok(raw.to_vec());
    }
    let mut decoded = Vec::new();
    huffman::decode(raw, &mut decoded).map_err(|error| error.to_string())?;
    Ok(decoded)
}
