//! HPACK (RFC 7541) as far as the rewrite needs it: decode a client's header blocks against a
//! mirror of the client's dynamic table and, from the first block that needs a field left out,
//! re-encode them against a mirror of the server's.
//!
//! Until then each block reaches the server as the client wrote it, and the server's table is the
//! client's. After it the tables part: what we drop never reaches the server, so its table holds
//! only what we sent it, and repeated fields still reach h2 as one-byte references.

mod primitives;
mod table;

use bytes::{BufMut, Bytes, BytesMut};

use self::{
    primitives::{decode_integer, decode_string, encode_integer, encode_string},
    table::{AUTHORITY_INDEX, DynamicTable, ENTRY_OVERHEAD, Name},
};
use super::huffman::HuffmanError;

/// The largest dynamic table a client may use: the HTTP/2 default of SETTINGS_HEADER_TABLE_SIZE,
/// which our server (hyper's defaults) never changes.
pub const MAX_TABLE_SIZE: usize = 4096;

/// The most fields decoded from one block. h2 refuses header lists over 16 KiB, which (32 bytes
/// of overhead a field) holds at most 512.
pub const MAX_FIELDS: usize = 1024;

/// A header block that is not valid HPACK.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("header block ends inside a field")]
    Truncated,
    #[error("integer in header block is too large")]
    IntegerOverflow,
    #[error("header field index {0} is not in the table")]
    BadIndex(usize),
    #[error("dynamic table size update to {0} exceeds {MAX_TABLE_SIZE}")]
    TableSizeTooLarge(usize),
    #[error("dynamic table size update after the first header field")]
    LateTableSizeUpdate,
    /// Fields named by index re-encode as literals: a small block can grow large.
    #[error("re-encoded header block exceeds {0} bytes")]
    TooLarge(usize),
    #[error("header block has more than {MAX_FIELDS} fields")]
    TooManyFields,
    #[error(transparent)]
    Huffman(#[from] HuffmanError),
}

/// Decodes one connection's header blocks, in order, and passes or re-encodes each for the server.
#[derive(Debug)]
pub struct BlockRewriter {
    /// The client's table: what its blocks refer to.
    table: DynamicTable,
    /// The server's table: what the blocks it read have put in it. Once we re-encode, its size
    /// stays where the client last left it (at most the HTTP/2 default, which our server never
    /// changes), so we send no size update.
    server_table: DynamicTable,
    /// Whether a block has been re-encoded on this connection: from then on every block is.
    reencoding: bool,
    /// The block being decoded, kept between blocks to save allocations.
    fields: Vec<Decoded>,
}

impl Default for BlockRewriter {
    fn default() -> Self {
        Self { table: DynamicTable::new(), server_table: DynamicTable::new(), reencoding: false, fields: Vec::new() }
    }
}

/// What became of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewrite {
    /// The server may read the block as the client wrote it.
    Verbatim,
    /// The block was re-encoded into the output, with this many fields left out.
    Rewritten { dropped: usize },
}

/// One representation of a decoded block.
#[derive(Debug)]
enum Decoded {
    SizeUpdate(usize),
    /// A static-table entry, name and value.
    Static(usize),
    Field {
        name: Name,
        value: Bytes,
        indexing: Indexing,
    },
    /// An `:authority` h2 would reset the stream for.
    Dropped,
}

/// How a literal field asks intermediaries to treat it (RFC 7541 §6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Indexing {
    Incremental,
    Without,
    Never,
}

impl BlockRewriter {
    /// Decodes `block`. When no field needs leaving out and nothing has been re-encoded on this
    /// connection, the server may read the block as written; otherwise its re-encoding, without an
    /// `:authority` that is not a valid URI authority (h2 would reset the stream for it), is
    /// appended to `out`, failing once `out` would hold more than `limit` bytes.
    pub fn rewrite(&mut self, block: &[u8], out: &mut BytesMut, limit: usize) -> Result<Rewrite, HpackError> {
        let mut fields = std::mem::take(&mut self.fields);
        fields.clear();
        let result = self.decode(block, &mut fields).and_then(|()| self.pass_or_reencode(&fields, out, limit));
        self.fields = fields;
        result
    }

    /// Decodes every representation of `block` into `fields`, keeping the client's table.
    fn decode(&mut self, block: &[u8], fields: &mut Vec<Decoded>) -> Result<(), HpackError> {
        let mut input = block;
        while let Some(&first) = input.first() {
            if fields.len() == MAX_FIELDS {
                return Err(HpackError::TooManyFields);
            }
            if first & 0x80 != 0 {
                fields.push(self.indexed(decode_integer(&mut input, 7)?)?);
            } else if first & 0xe0 == 0x20 {
                if fields.iter().any(|field| !matches!(field, Decoded::SizeUpdate(_))) {
                    return Err(HpackError::LateTableSizeUpdate);
                }
                let size = decode_integer(&mut input, 5)?;
                if size > MAX_TABLE_SIZE {
                    return Err(HpackError::TableSizeTooLarge(size));
                }
                self.table.resize(size);
                fields.push(Decoded::SizeUpdate(size));
            } else {
                let (indexing, prefix) = match first {
                    _ if first & 0xc0 == 0x40 => (Indexing::Incremental, 6),
                    _ if first & 0xf0 == 0x10 => (Indexing::Never, 4),
                    _ => (Indexing::Without, 4),
                };
                let name = match decode_integer(&mut input, prefix)? {
                    0 => Name::Literal(decode_string(&mut input)?),
                    index => self.name_at(index)?,
                };
                let value = decode_string(&mut input)?;
                if indexing == Indexing::Incremental {
                    self.table.insert(name.clone(), value.clone());
                }
                if name.is_authority() && !is_valid_authority(&value) {
                    fields.push(Decoded::Dropped);
                } else {
                    fields.push(Decoded::Field { name, value, indexing });
                }
            }
        }
        Ok(())
    }

    /// A field named by its index in the static or the client's dynamic table.
    fn indexed(&self, index: usize) -> Result<Decoded, HpackError> {
        match index {
            0 => Err(HpackError::BadIndex(0)),
            // `:authority` with an empty value is the static entry 1, which h2 rejects too.
            _ if index == usize::from(AUTHORITY_INDEX) => Ok(Decoded::Dropped),
            1..=61 => Ok(Decoded::Static(index)),
            _ => {
                let (name, value) = self.table.get(index - 62).ok_or(HpackError::BadIndex(index))?.clone();
                if name.is_authority() && !is_valid_authority(&value) {
                    Ok(Decoded::Dropped)
                } else {
                    Ok(Decoded::Field { name, value, indexing: Indexing::Without })
                }
            }
        }
    }

    /// Lets the server read the block as written, keeping our mirror of its table, or re-encodes
    /// it into `out`.
    fn pass_or_reencode(
        &mut self,
        fields: &[Decoded],
        out: &mut BytesMut,
        limit: usize,
    ) -> Result<Rewrite, HpackError> {
        let dropped = fields.iter().filter(|field| matches!(field, Decoded::Dropped)).count();
        if !self.reencoding && dropped == 0 {
            // The server reads what the client wrote, so its table changes as the client's did.
            for field in fields {
                match field {
                    Decoded::SizeUpdate(size) => self.server_table.resize(*size),
                    Decoded::Field { name, value, indexing: Indexing::Incremental } => {
                        self.server_table.insert(name.clone(), value.clone());
                    }
                    _ => {}
                }
            }
            return Ok(Rewrite::Verbatim);
        }
        self.reencoding = true;
        for field in fields {
            if out.len() > limit {
                return Err(HpackError::TooLarge(limit));
            }
            match field {
                Decoded::SizeUpdate(_) | Decoded::Dropped => {}
                Decoded::Static(index) => encode_integer(*index, 7, 0x80, out),
                Decoded::Field { name, value, indexing } => self.emit(name, value, *indexing == Indexing::Never, out),
            }
        }
        if out.len() > limit {
            return Err(HpackError::TooLarge(limit));
        }
        Ok(Rewrite::Rewritten { dropped })
    }

    /// Writes one field for the server: by reference when its table holds it; else as a literal
    /// that it adds (a never-indexed field, or one too large to keep, stays out of its table).
    fn emit(&mut self, name: &Name, value: &Bytes, never_indexed: bool, out: &mut BytesMut) {
        if never_indexed || name.len() + value.len() + ENTRY_OVERHEAD > MAX_TABLE_SIZE / 2 {
            return write_literal(name, value, never_indexed, out);
        }
        if let Some(position) = self.server_table.position(name, value) {
            return encode_integer(62 + position, 7, 0x80, out);
        }
        match name {
            Name::Static(index) => encode_integer(usize::from(*index), 6, 0x40, out),
            Name::Literal(name) => {
                out.put_u8(0x40);
                encode_string(name, out);
            }
        }
        encode_string(value, out);
        self.server_table.insert(name.clone(), value.clone());
    }

    fn name_at(&self, index: usize) -> Result<Name, HpackError> {
        match index {
            1..=61 => Ok(Name::Static(index as u8)),
            _ => {
                let (name, _) = self.table.get(index - 62).ok_or(HpackError::BadIndex(index))?;
                Ok(name.clone())
            }
        }
    }
}

/// What h2 accepts as `:authority`.
fn is_valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// A literal without indexing (or never indexed, kept so), its name by static index when it has
/// one, both strings raw.
fn write_literal(name: &Name, value: &[u8], never_indexed: bool, out: &mut BytesMut) {
    let flags = if never_indexed { 0x10 } else { 0x00 };
    match name {
        Name::Static(index) => encode_integer(usize::from(*index), 4, flags, out),
        Name::Literal(name) => {
            out.put_u8(flags);
            encode_string(name, out);
        }
    }
    encode_string(value, out);
}

#[cfg(test)]
mod tests;
