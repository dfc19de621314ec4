//! HPACK's tables (RFC 7541, section 2.3): the static table, and a dynamic table as an encoder or
//! a decoder keeps it.

use std::collections::VecDeque;

use bytes::Bytes;

use super::MAX_TABLE_SIZE;

/// Per-entry overhead that RFC 7541 §4.1 adds to the table size.
pub(super) const ENTRY_OVERHEAD: usize = 32;

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

pub(super) const AUTHORITY_INDEX: u8 = 1;

/// One decoded field's name: where it came from decides how it is re-encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Name {
    /// A static-table name, by index.
    Static(u8),
    /// Any other name.
    Literal(Bytes),
}

impl Name {
    pub(super) fn is_authority(&self) -> bool {
        match self {
            Name::Static(index) => *index == AUTHORITY_INDEX,
            Name::Literal(name) => name.as_ref() == b":authority",
        }
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        match self {
            Name::Static(index) => STATIC_TABLE[usize::from(*index) - 1].0.as_bytes(),
            Name::Literal(name) => name,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.as_bytes().len()
    }
}

/// A dynamic table, newest first: the client's as its encoder keeps it, or the server's as its
/// decoder keeps it.
#[derive(Debug)]
pub(super) struct DynamicTable {
    pub(super) entries: VecDeque<(Name, Bytes)>,
    pub(super) size: usize,
    max_size: usize,
}

impl DynamicTable {
    pub(super) fn new() -> Self {
        Self { entries: VecDeque::new(), size: 0, max_size: MAX_TABLE_SIZE }
    }

    pub(super) fn get(&self, index: usize) -> Option<&(Name, Bytes)> {
        self.entries.get(index)
    }

    /// Where the exact field is, if the table holds it.
    pub(super) fn position(&self, name: &Name, value: &[u8]) -> Option<usize> {
        self.entries
            .iter()
            .position(|(held, held_value)| held_value.as_ref() == value && held.as_bytes() == name.as_bytes())
    }

    pub(super) fn insert(&mut self, name: Name, value: Bytes) {
        let entry_size = name.len() + value.len() + ENTRY_OVERHEAD;
        // An entry larger than the table empties it and is not added (RFC 7541 §4.4).
        self.evict_to(self.max_size.saturating_sub(entry_size));
        if entry_size <= self.max_size {
            self.size += entry_size;
            self.entries.push_front((name, value));
        }
    }

    pub(super) fn resize(&mut self, max_size: usize) {
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
