//! The HTTP/2 `:authority` handling (`server::authority`): a client's byte stream through the
//! frame and HPACK rewriter, whole and in pieces, checked against an independent HPACK decoder:
//! every frame that is not a header block reaches the server byte for byte, and every header
//! block decodes, with the server's table, to the client's fields less each `:authority` that is
//! not a URI authority.
//!
//! `server::authority` is private to `server`, so its modules (`frames`, `hpack` with its
//! submodules, `huffman`) are compiled in here from the main crate's sources, unchanged; its
//! `mod.rs`, the connection wrapper, is left out. The frame walk below is the target's own but for
//! the frame types and flags, which it takes from `frames`; the HPACK decoder is loona-hpack,
//! which shares nothing with the rewriter (static table, Huffman code, integers, dynamic table).
//!
//! Input: one byte (bit 7: prepend the client preface; bits 0-6: deliver in pieces of that many
//! bytes, 0 for one piece), then the client's bytes.
#![no_main]

// An inline module with the directory as its path, so that each file (and `hpack`'s own
// submodules, in `hpack/`) is found where the main crate finds it.
#[path = "../../src/server/authority"]
#[allow(dead_code)]
mod authority {
    pub mod frames;
    mod hpack;
    mod huffman;
}

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use loona_hpack::{Decoder, decoder::DecoderError};

use self::authority::frames::{
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
    let sent = walk(&input[PREFACE.len()..], &mut reference_decoder(), true);
    let received = walk(&out[PREFACE.len()..], &mut reference_decoder(), false);
    assert_eq!(received, sent, "the server reads what the client sent, less unusable authorities");
});

/// Feeds `input` in pieces of `step` bytes; the output and what is left unprocessed.
fn run(input: &[u8], step: usize) -> Result<(Vec<u8>, Vec<u8>), authority::frames::FrameError> {
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
fn walk(mut bytes: &[u8], decoder: &mut Decoder<'_>, client: bool) -> Vec<Item> {
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
            let mut fields = decode(decoder, &block).unwrap_or_else(|error| panic!("block {block:02x?}: {error}"));
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

/// The dynamic table size a client may set: SETTINGS_HEADER_TABLE_SIZE's default, which our
/// server (hyper's defaults) never changes, so h2 refuses a size update past it.
const SERVER_TABLE_SIZE: usize = 4096;

/// An HPACK decoder maintained apart from the rewriter's (loona-hpack, its own tables and Huffman
/// code), with the limit h2 sets.
fn reference_decoder() -> Decoder<'static> {
    let mut decoder = Decoder::new();
    decoder.set_max_allowed_table_size(SERVER_TABLE_SIZE);
    decoder
}

/// One header block's fields. loona-hpack refuses a block that ends with a size update (h2spec's
/// reading of RFC 7541, section 4.2), but only once it has applied the whole block to its table;
/// h2, the server behind the rewriter, takes such a block, so that refusal alone counts as decoded.
fn decode(decoder: &mut Decoder<'_>, block: &[u8]) -> Result<Vec<Field>, DecoderError> {
    let mut fields = Vec::new();
    match decoder.decode_with_cb(block, |name, value| fields.push((name.into_owned(), value.into_owned()))) {
        Ok(()) | Err(DecoderError::SizeUpdateAtEnd) => Ok(fields),
        Err(error) => Err(error),
    }
}
