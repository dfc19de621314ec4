use super::*;

fn decoded(hex: &str) -> Result<String, HuffmanError> {
    let input: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
    let mut out = Vec::new();
    decode(&input, &mut out)?;
    Ok(String::from_utf8(out).expect("utf-8"))
}

/// The Huffman-coded strings of RFC 7541 Appendix C.4 and C.6.
#[test]
fn decodes_the_rfc_examples() {
    let examples = [
        ("f1e3c2e5f23a6ba0ab90f4ff", "www.example.com"),
        ("a8eb10649cbf", "no-cache"),
        ("25a849e95ba97d7f", "custom-key"),
        ("25a849e95bb8e8b4bf", "custom-value"),
        ("6402", "302"),
        ("aec3771a4b", "private"),
        ("d07abe941054d444a8200595040b8166e082a62d1bff", "Mon, 21 Oct 2013 20:13:21 GMT"),
        ("9d29ad171863c78f0b97c8e9ae82ae43d3", "https://www.example.com"),
        ("9bd9ab", "gzip"),
    ];
    for (hex, text) in examples {
        assert_eq!(decoded(hex).as_deref(), Ok(text), "{hex}");
    }
}

#[test]
fn the_code_lengths_make_a_complete_prefix_code() {
    // Kraft's sum is exactly one: every bit pattern starts with some code, so decoding never stalls.
    let sum: u64 = CODE_LENGTHS.iter().map(|&length| 1u64 << (MAX_CODE_LENGTH - usize::from(length))).sum();
    assert_eq!(sum, 1 << MAX_CODE_LENGTH);
    assert_eq!(CODE_LENGTHS[usize::from(EOS)], 30);
}

#[test]
fn every_byte_value_survives_a_round_trip() {
    let input: Vec<u8> = (0..=255).collect();
    let mut out = Vec::new();
    decode(&encode(&input), &mut out).expect("decodes");
    assert_eq!(out, input);
}

#[test]
fn the_empty_string_decodes_to_nothing() {
    assert_eq!(decoded(""), Ok(String::new()));
}

#[test]
fn refuses_padding_that_is_not_ones_or_longer_than_seven_bits() {
    // "0" is the 5-bit code 00000; three 0 bits of padding are not EOS's prefix.
    assert_eq!(decoded("00"), Err(HuffmanError::Padding));
    // "0" then a whole byte of ones: padding longer than seven bits.
    assert_eq!(decoded("07ff"), Err(HuffmanError::Padding));
}

#[test]
fn refuses_an_encoded_eos() {
    // Thirty one bits then two of padding: EOS itself.
    assert_eq!(decoded("ffffffff"), Err(HuffmanError::Eos));
}

/// Test-only encoder from the canonical codes, independent of the decoder's tables.
fn encode(input: &[u8]) -> Vec<u8> {
    let mut codes = [(0u32, 0u8); 257];
    let mut order: Vec<usize> = (0..257).collect();
    order.sort_by_key(|&symbol| (CODE_LENGTHS[symbol], symbol));
    let (mut code, mut previous_length) = (0u32, CODE_LENGTHS[order[0]]);
    for (rank, &symbol) in order.iter().enumerate() {
        if rank > 0 {
            code = (code + 1) << (CODE_LENGTHS[symbol] - previous_length);
            previous_length = CODE_LENGTHS[symbol];
        }
        codes[symbol] = (code, CODE_LENGTHS[symbol]);
    }
    let (mut out, mut bits, mut pending) = (Vec::new(), 0u32, 0u64);
    for &byte in input {
        let (code, length) = codes[usize::from(byte)];
        pending = (pending << length) | u64::from(code);
        bits += u32::from(length);
        while bits >= 8 {
            bits -= 8;
            out.push((pending >> bits) as u8);
        }
    }
    if bits > 0 {
        out.push(((pending << (8 - bits)) as u8) | (0xff >> bits));
    }
    out
}
