//! HPACK's primitive types (RFC 7541, section 5): integers with a prefix, and strings, raw or
//! Huffman-coded.

use bytes::{BufMut, Bytes, BytesMut};

use super::{super::huffman, HpackError};

/// RFC 7541 §5.2, raw: the rewrite never Huffman-codes.
pub(super) fn encode_string(value: &[u8], out: &mut BytesMut) {
    encode_integer(value.len(), 7, 0x00, out);
    out.put_slice(value);
}

/// RFC 7541 §5.1, with `flags` in the bits above the prefix.
pub(super) fn encode_integer(mut value: usize, prefix_bits: u32, flags: u8, out: &mut BytesMut) {
    let max_prefix = (1usize << prefix_bits) - 1;
    if value < max_prefix {
        out.put_u8(flags | value as u8);
        return;
    }
    out.put_u8(flags | max_prefix as u8);
    value -= max_prefix;
    while value >= 0x80 {
        out.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

/// RFC 7541 §5.1. Values are bounded well below `usize` (frames are at most 16 MiB).
pub(super) fn decode_integer(input: &mut &[u8], prefix_bits: u32) -> Result<usize, HpackError> {
    let (&first, rest) = input.split_first().ok_or(HpackError::Truncated)?;
    *input = rest;
    let max_prefix = (1usize << prefix_bits) - 1;
    let mut value = usize::from(first) & max_prefix;
    if value < max_prefix {
        return Ok(value);
    }
    for shift in (0..).step_by(7) {
        let (&byte, rest) = input.split_first().ok_or(HpackError::Truncated)?;
        *input = rest;
        if shift > 21 {
            return Err(HpackError::IntegerOverflow);
        }
        value += usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
    }
    Ok(value)
}

/// RFC 7541 §5.2.
pub(super) fn decode_string(input: &mut &[u8]) -> Result<Bytes, HpackError> {
    let huffman = input.first().ok_or(HpackError::Truncated)? & 0x80 != 0;
    let length = decode_integer(input, 7)?;
    if length > input.len() {
        return Err(HpackError::Truncated);
    }
    let (raw, rest) = input.split_at(length);
    *input = rest;
    if huffman {
        let mut decoded = Vec::with_capacity(length * 8 / 5);
        huffman::decode(raw, &mut decoded)?;
        Ok(Bytes::from(decoded))
    } else {
        Ok(Bytes::copy_from_slice(raw))
    }
}
