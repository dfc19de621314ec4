//! A gRPC codec that passes message bytes through untouched.
//!
//! Forwarding with it instead of decoding and re-encoding keeps fields that our CRI bindings do
//! not know: prost drops unknown fields, so a newer kubelet or runtime would silently lose data.

use bytes::{Buf, BufMut, Bytes};
use tonic::{
    Status,
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
};

/// The codec: `Bytes` in, `Bytes` out.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

/// Writes a message's bytes as they are.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawEncoder;

/// Reads a message's bytes as they are.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
