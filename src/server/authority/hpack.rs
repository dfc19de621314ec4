//! HPACK (RFC 7541) as far as the rewrite needs it: decode a client's header blocks against a
//! mirror of the client's dynamic table and, from the first block that needs a field left out,
//! re-encode them against a mirror of the server's.
//!
//! Until then each block reaches the server as the client wrote it, and the server's table is the
//! client's. After it the tables part: what we drop never reaches the server, so its table holds
//! only what we sent it, and repeated fields still reach h2 as one-byte references.

use std::collections::VecDeque;

use bytes::{BufMut, Bytes, BytesMut};

use super::huffman::{self, HuffmanError};

/// The largest dynamic table a client may use: the HTTP/2 default of SETTINGS_HEADER_TABLE_SIZE,
/// which our server (hyper's defaults) never changes.
pub const MAX_TABLE_SIZE: usize = 4096;

/// The most fields decoded from one block. h2 refuses header lists over 16 KiB, which (32 bytes
/// of overhead a field) holds at most 512.
pub const MAX_FIELDS: usize = 1024;

/// Per-entry overhead that RFC 7541 §4.1 adds to the table size.
const ENTRY_OVERHEAD: usize = 32;

/// The static table (RFC 7541 Appendix A); index 1 is the first entry.
pub(super) const STATIC_TABLE: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

const AUTHORITY_INDEX: u8 = 1;

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

/// One decoded field's name: where it came from decides how it is re-encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Name {
    /// A static-table name, by index.
    Static(u8),
    /// Any other name.
    Literal(Bytes),
}

impl Name {
    fn is_authority(&self) -> bool {
        match self {
            Name::Static(index) => *index == AUTHORITY_INDEX,
            Name::Literal(name) => name.as_ref() == b":authority",
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Name::Static(index) => STATIC_TABLE[usize::from(*index) - 1].0.as_bytes(),
            Name::Literal(name) => name,
        }
    }

    fn len(&self) -> usize {
        self.as_bytes().len()
    }
}

/// A dynamic table, newest first: the client's as its encoder keeps it, or the server's as its
/// decoder keeps it.
#[derive(Debug)]
struct DynamicTable {
    entries: VecDeque<(Name, Bytes)>,
    size: usize,
    max_size: usize,
}

impl DynamicTable {
    fn new() -> Self {
        Self { entries: VecDeque::new(), size: 0, max_size: MAX_TABLE_SIZE }
    }

    fn get(&self, index: usize) -> Option<&(Name, Bytes)> {
        self.entries.get(index)
    }

    /// Where the exact field is, if the table holds it.
    fn position(&self, name: &Name, value: &[u8]) -> Option<usize> {
        self.entries
            .iter()
            .position(|(held, held_value)| held_value.as_ref() == value && held.as_bytes() == name.as_bytes())
    }

    fn insert(&mut self, name: Name, value: Bytes) {
        let entry_size = name.len() + value.len() + ENTRY_OVERHEAD;
        // An entry larger than the table empties it and is not added (RFC 7541 §4.4).
        self.evict_to(self.max_size.saturating_sub(entry_size));
        if entry_size <= self.max_size {
            self.size += entry_size;
            self.entries.push_front((name, value));
        }
    }

    fn resize(&mut self, max_size: usize) {
        self.max_size = max_size;
        self.evict_to(max_size);
    }

    fn evict_to(&mut self, target: usize) {
        while self.size > target {
            let Some((name, value)) = self.entries.pop_back() else { break };
            self.size -= name.len() + value.len() + ENTRY_OVERHEAD;
        }
    }
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

fn encode_string(value: &[u8], out: &mut BytesMut) {
    encode_integer(value.len(), 7, 0x00, out);
    out.put_slice(value);
}

/// RFC 7541 §5.1, with `flags` in the bits above the prefix.
pub fn encode_integer(mut value: usize, prefix_bits: u32, flags: u8, out: &mut BytesMut) {
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
fn decode_integer(input: &mut &[u8], prefix_bits: u32) -> Result<usize, HpackError> {
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
fn decode_string(input: &mut &[u8]) -> Result<Bytes, HpackError> {
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

#[cfg(test)]
mod tests;
