//! HPACK's Huffman code (RFC 7541, Appendix B), decoding only.
//!
//! The code is canonical: sorting the symbols by (code length, symbol) and counting upwards gives
//! every code. So the table below holds only the lengths, and the decoder derives the rest once.

use std::sync::OnceLock;

/// Code length in bits of each symbol 0..=255 and of EOS (256), from RFC 7541 Appendix B.
const CODE_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28,
    28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12,
    10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6,
    5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22,
    22, 23, 22, 23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22, 21, 20,
    22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28,
    27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28,
    27, 27, 27, 27, 27, 26, 30,
];

const EOS: u16 = 256;
const MAX_CODE_LENGTH: usize = 30;

/// A Huffman-coded string that does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HuffmanError {
    #[error("Huffman-coded string contains the EOS symbol")]
    Eos,
    #[error("Huffman-coded string ends with invalid padding")]
    Padding,
}

/// Canonical decoding tables: for each length, the first code and where its symbols start.
struct Canonical {
    first_code: [u32; MAX_CODE_LENGTH + 1],
    count: [u32; MAX_CODE_LENGTH + 1],
    offset: [u16; MAX_CODE_LENGTH + 1],
    symbols: [u16; 257],
}

fn canonical() -> &'static Canonical {
    static TABLES: OnceLock<Canonical> = OnceLock::new();
    TABLES.get_or_init(|| {
        let mut count = [0u32; MAX_CODE_LENGTH + 1];
        for &length in &CODE_LENGTHS {
            count[usize::from(length)] += 1;
        }
        let mut first_code = [0u32; MAX_CODE_LENGTH + 1];
        let mut offset = [0u16; MAX_CODE_LENGTH + 1];
        let (mut code, mut index) = (0u32, 0u16);
        for length in 1..=MAX_CODE_LENGTH {
            first_code[length] = code;
            offset[length] = index;
            code = (code + count[length]) << 1;
            index += count[length] as u16;
        }
        let mut symbols = [0u16; 257];
        let mut next = offset;
        for length in 1..=MAX_CODE_LENGTH {
            for (symbol, &symbol_length) in (0u16..).zip(&CODE_LENGTHS) {
                if usize::from(symbol_length) == length {
                    symbols[usize::from(next[length])] = symbol;
                    next[length] += 1;
                }
            }
        }
        Canonical { first_code, count, offset, symbols }
    })
}

/// Decodes `input` into `out`.
pub fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), HuffmanError> {
    let tables = canonical();
    let (mut code, mut length) = (0u32, 0usize);
    for byte in input {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            length += 1;
            let rank = code.wrapping_sub(tables.first_code[length]);
            if rank < tables.count[length] {
                let symbol = tables.symbols[usize::from(tables.offset[length]) + rank as usize];
                if symbol == EOS {
                    return Err(HuffmanError::Eos);
                }
                out.push(symbol as u8);
                (code, length) = (0, 0);
            } else if length == MAX_CODE_LENGTH {
                // Every 30-bit pattern is a code or a prefix's continuation; unreachable, but bounded.
                return Err(HuffmanError::Padding);
            }
        }
    }
    // Padding is the most significant bits of EOS (all ones), shorter than a byte.
    if length > 7 || code != (1 << length) - 1 {
        return Err(HuffmanError::Padding);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
