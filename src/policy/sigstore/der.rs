//! The little of DER a public key and a certificate's fields need: tag, definite length, value;
//! nothing else. Lengths up to 64 KiB (a key file's bound; a certificate is a few KiB), never
//! recursive, so any bytes read in linear time.

/// Why bytes are not the DER expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DerError {
    #[error("the DER ends early")]
    Truncated,
    #[error("a DER length is not in its shortest form, or is indefinite")]
    Length,
    #[error("expected DER tag {expected:#04x}, found {found:#04x}")]
    Tag { expected: u8, found: u8 },
    #[error("bytes follow the DER value")]
    Trailing,
}

pub const SEQUENCE: u8 = 0x30;
pub const OID: u8 = 0x06;
pub const NULL: u8 = 0x05;
pub const BIT_STRING: u8 = 0x03;
pub const INTEGER: u8 = 0x02;
pub const BOOLEAN: u8 = 0x01;
pub const OCTET_STRING: u8 = 0x04;
pub const UTF8_STRING: u8 = 0x0c;

/// A reader over DER values, front to back.
#[derive(Debug, Clone, Copy)]
pub struct Der<'a> {
    rest: &'a [u8],
}

impl<'a> Der<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    /// The next value, which must have `tag`: its contents.
    pub fn read(&mut self, tag: u8) -> Result<&'a [u8], DerError> {
        let (&found, after_tag) = self.rest.split_first().ok_or(DerError::Truncated)?;
        if found != tag {
            return Err(DerError::Tag { expected: tag, found });
        }
        let (&first, mut after_length) = after_tag.split_first().ok_or(DerError::Truncated)?;
        let length = if first < 0x80 {
            usize::from(first)
        } else {
            // Long form: 1 or 2 length bytes are enough for 64 KiB; 0x80 is BER's indefinite form.
            let count = usize::from(first & 0x7f);
            if !(1..=2).contains(&count) || after_length.len() < count {
                return Err(if count == 0 || count > 2 { DerError::Length } else { DerError::Truncated });
            }
            let (bytes, rest) = after_length.split_at(count);
            after_length = rest;
            let length = bytes.iter().fold(0usize, |length, byte| length << 8 | usize::from(*byte));
            // DER: the shortest form, so no leading zero byte and nothing under 0x80 in long form.
            if length < 0x80 || bytes[0] == 0 {
                return Err(DerError::Length);
            }
            length
        };
        if after_length.len() < length {
            return Err(DerError::Truncated);
        }
        let (contents, rest) = after_length.split_at(length);
        self.rest = rest;
        Ok(contents)
    }

    /// The next value, which must have `tag`: its whole encoding (tag, length and contents).
    pub fn read_encoded(&mut self, tag: u8) -> Result<&'a [u8], DerError> {
        let start = self.rest;
        self.read(tag)?;
        Ok(&start[..start.len() - self.rest.len()])
    }

    /// The next value's tag, if any is left.
    pub fn peek(&self) -> Option<u8> {
        self.rest.first().copied()
    }

    /// The next value if it has `tag` (an OPTIONAL or DEFAULT field): its contents.
    pub fn read_optional(&mut self, tag: u8) -> Result<Option<&'a [u8]>, DerError> {
        if self.peek() == Some(tag) { self.read(tag).map(Some) } else { Ok(None) }
    }

    /// The reader must be at its end.
    pub fn finish(&self) -> Result<(), DerError> {
        if self.rest.is_empty() { Ok(()) } else { Err(DerError::Trailing) }
    }
}

/// The whole of `bytes` as one value with `tag`: its contents.
pub fn only(bytes: &[u8], tag: u8) -> Result<&[u8], DerError> {
    let mut der = Der::new(bytes);
    let contents = der.read(tag)?;
    der.finish()?;
    Ok(contents)
}

/// An object identifier in dotted form, for a message (bounded: at most 16 arcs shown).
pub fn dotted(oid: &[u8]) -> String {
    let mut arcs: Vec<u128> = Vec::new();
    let mut value: u128 = 0;
    for byte in oid {
        value = value.saturating_mul(128).saturating_add(u128::from(byte & 0x7f));
        if byte & 0x80 == 0 {
            if arcs.is_empty() {
                let first = (value / 40).min(2);
                arcs.extend([first, value - first * 40]);
            } else {
                arcs.push(value);
            }
            value = 0;
            if arcs.len() >= 16 {
                break;
            }
        }
    }
    arcs.iter().map(u128::to_string).collect::<Vec<_>>().join(".")
}
