use super::{table::STATIC_TABLE, *};

const LIMIT: usize = 64 * 1024;

fn bytes(hex: &str) -> Vec<u8> {
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

/// The server's side of the connection, decoding what reaches it with a table of its own,
/// independently of the rewriter's code.
#[derive(Default)]
struct Server {
    table: Vec<(String, String)>,
    max_size: Option<usize>,
}

impl Server {
    fn read(&mut self, mut block: &[u8]) -> Vec<(String, String)> {
        let string = |input: &mut &[u8]| {
            let huffman = input[0] & 0x80 != 0;
            let length = decode_integer(input, 7).expect("length");
            let (raw, rest) = input.split_at(length);
            *input = rest;
            let mut decoded = Vec::new();
            if huffman {
                super::super::huffman::decode(raw, &mut decoded).expect("huffman");
            } else {
                decoded.extend_from_slice(raw);
            }
            String::from_utf8(decoded).expect("utf-8")
        };
        let mut out = Vec::new();
        while let Some(&first) = block.first() {
            if first & 0x80 != 0 {
                let index = decode_integer(&mut block, 7).expect("index");
                out.push(self.field(index));
                continue;
            }
            if first & 0xe0 == 0x20 {
                self.max_size = Some(decode_integer(&mut block, 5).expect("size"));
                self.evict();
                continue;
            }
            let (prefix, indexed) = if first & 0xc0 == 0x40 { (6, true) } else { (4, false) };
            let name = match decode_integer(&mut block, prefix).expect("name index") {
                0 => string(&mut block),
                index => self.field(index).0,
            };
            let field = (name, string(&mut block));
            if indexed {
                self.table.insert(0, field.clone());
                self.evict();
            }
            out.push(field);
        }
        out
    }

    fn evict(&mut self) {
        let size =
            |table: &[(String, String)]| table.iter().map(|(name, value)| name.len() + value.len() + 32).sum::<usize>();
        while size(&self.table) > self.max_size.unwrap_or(MAX_TABLE_SIZE) {
            self.table.pop();
        }
    }

    fn field(&self, index: usize) -> (String, String) {
        match index {
            1..=61 => (STATIC_TABLE[index - 1].0.to_owned(), STATIC_TABLE[index - 1].1.to_owned()),
            _ => self.table[index - 62].clone(),
        }
    }
}

/// One connection: the rewriter, and the server reading what reaches it.
#[derive(Default)]
struct Connection {
    rewriter: BlockRewriter,
    server: Server,
}

impl Connection {
    /// Rewrites a block; returns the fields the server reads and how many were left out.
    fn rewrite(&mut self, hex: &str) -> (Vec<(String, String)>, usize) {
        let block = bytes(hex);
        let mut out = BytesMut::new();
        match self.rewriter.rewrite(&block, &mut out, LIMIT).expect("valid block") {
            Rewrite::Verbatim => {
                assert!(out.is_empty());
                (self.server.read(&block), 0)
            }
            Rewrite::Rewritten { dropped } => (self.server.read(&out), dropped),
        }
    }
}

fn list(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect()
}

/// RFC 7541 C.3 (raw strings) and C.4 (Huffman): three requests on one connection, each
/// referring to what the ones before it put in the dynamic table.
#[test]
fn follows_the_rfc_request_examples_across_the_dynamic_table() {
    for blocks in [
        [
            "828684410f7777772e6578616d706c652e636f6d",
            "828684be58086e6f2d6361636865",
            "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565",
        ],
        [
            "828684418cf1e3c2e5f23a6ba0ab90f4ff",
            "828684be5886a8eb10649cbf",
            "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf",
        ],
    ] {
        let mut connection = Connection::default();
        let authority = (":authority", "www.example.com");
        let (first, _) = connection.rewrite(blocks[0]);
        assert_eq!(first, list(&[(":method", "GET"), (":scheme", "http"), (":path", "/"), authority]));
        assert_eq!(connection.rewriter.table.size, 57);
        let (second, _) = connection.rewrite(blocks[1]);
        assert_eq!(
            second,
            list(&[(":method", "GET"), (":scheme", "http"), (":path", "/"), authority, ("cache-control", "no-cache")])
        );
        assert_eq!(connection.rewriter.table.size, 110);
        let (third, dropped) = connection.rewrite(blocks[2]);
        assert_eq!(
            third,
            list(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                authority,
                ("custom-key", "custom-value")
            ])
        );
        assert_eq!((connection.rewriter.table.size, dropped), (164, 0), "a valid authority is kept");
    }
}

/// RFC 7541 C.5: a 256-byte table (set by a size update) that evicts its oldest entries.
#[test]
fn evicts_the_oldest_entries_as_the_rfc_response_examples_do() {
    let mut connection = Connection::default();
    let date = ("date", "Mon, 21 Oct 2013 20:13:21 GMT");
    let location = ("location", "https://www.example.com");
    let (first, _) = connection.rewrite("3fe1014803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a323120474d546e1768747470733a2f2f7777772e6578616d706c652e636f6d",
    );
    assert_eq!(first, list(&[(":status", "302"), ("cache-control", "private"), date, location]));
    assert_eq!(connection.rewriter.table.size, 222);
    let (second, _) = connection.rewrite("4803333037c1c0bf");
    assert_eq!(second, list(&[(":status", "307"), ("cache-control", "private"), date, location]));
    assert_eq!(
        (connection.rewriter.table.size, connection.rewriter.table.entries.len()),
        (222, 4),
        ":status 302 was evicted"
    );
    let (third, _) = connection.rewrite("88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69707738666f6f3d4153444a4b48514b425a584f5157454f50495541585157454f49553b206d61782d6167653d333630303b2076657273696f6e3d31",
    );
    assert_eq!(
        third,
        list(&[
            (":status", "200"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
            location,
            ("content-encoding", "gzip"),
            ("set-cookie", "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"),
        ])
    );
    assert_eq!(connection.rewriter.table.size, 215);
}

/// `:authority /run/cri-imaged/cri-imaged.sock`, with incremental indexing by static name.
const SOCKET_AUTHORITY: &str = "411f2f72756e2f6372692d696d616765642f6372692d696d616765642e736f636b";

#[test]
fn leaves_out_a_socket_path_authority_and_every_later_reference_to_it() {
    let mut connection = Connection::default();
    let (first, dropped) = connection.rewrite(&format!("8386{SOCKET_AUTHORITY}84"));
    assert_eq!(first, list(&[(":method", "POST"), (":scheme", "http"), (":path", "/")]));
    assert_eq!(dropped, 1);
    assert_eq!(connection.rewriter.table.size, 10 + 31 + 32, "the client's table still holds it, so ours does");
    // The second request names it by its dynamic index, 62.
    let (second, dropped) = connection.rewrite("8386be84");
    assert_eq!(second, list(&[(":method", "POST"), (":scheme", "http"), (":path", "/")]));
    assert_eq!(dropped, 1);
}

#[test]
fn leaves_out_an_empty_authority_however_it_is_written() {
    let mut connection = Connection::default();
    // Static entry 1 (`:authority` with no value), then a literal name with an empty value.
    let (fields, dropped) = connection.rewrite("838681000a3a617574686f726974790084");
    assert_eq!(fields, list(&[(":method", "POST"), (":scheme", "http"), (":path", "/")]));
    assert_eq!(dropped, 2);
}

#[test]
fn a_block_with_nothing_to_leave_out_reaches_the_server_as_written() {
    let mut connection = Connection::default();
    // `:authority localhost` literal without indexing; `authorization secret` never indexed.
    let (fields, dropped) = connection.rewrite("01096c6f63616c686f73741f0806736563726574");
    assert_eq!((fields, dropped), (list(&[(":authority", "localhost"), ("authorization", "secret")]), 0));
    let mut out = BytesMut::new();
    assert_eq!(connection.rewriter.rewrite(&bytes("82"), &mut out, LIMIT), Ok(Rewrite::Verbatim));
}

#[test]
fn after_the_first_rewrite_every_block_is_re_encoded_and_keeps_never_indexed_fields_so() {
    let mut connection = Connection::default();
    connection.rewrite(&format!("8386{SOCKET_AUTHORITY}84"));
    let mut out = BytesMut::new();
    let block = bytes("01096c6f63616c686f73741f0806736563726574");
    assert_eq!(connection.rewriter.rewrite(&block, &mut out, LIMIT), Ok(Rewrite::Rewritten { dropped: 0 }));
    assert_eq!(connection.server.read(&out), list(&[(":authority", "localhost"), ("authorization", "secret")]));
    assert_eq!(out[out.len() - 9] & 0xf0, 0x10, "authorization stays never-indexed");
}

#[test]
fn once_re_encoding_repeated_fields_reach_the_server_as_references_to_its_own_table() {
    let mut connection = Connection::default();
    let (first, _) = connection.rewrite(&format!("8386{SOCKET_AUTHORITY}4005782d6170700176"));
    assert_eq!(first, list(&[(":method", "POST"), (":scheme", "http"), ("x-app", "v")]));
    // The same request again, by the client's dynamic indexes: one byte per field for the server.
    let mut again = BytesMut::new();
    connection.rewriter.rewrite(&bytes("8386bfbe"), &mut again, LIMIT).expect("valid");
    assert_eq!(again.as_ref(), [0x82 + 1, 0x86, 0xbe]);
    assert_eq!(connection.server.read(&again), first);
}

#[test]
fn refuses_invalid_blocks() {
    let cases: [(&str, HpackError); 7] = [
        ("be", HpackError::BadIndex(62)),
        ("80", HpackError::BadIndex(0)),
        ("41", HpackError::Truncated),
        ("4105616263", HpackError::Truncated),
        ("3fe21f", HpackError::TableSizeTooLarge(4097)),
        ("823f00", HpackError::LateTableSizeUpdate),
        ("ffffffffff7f", HpackError::IntegerOverflow),
    ];
    for (hex, expected) in cases {
        let mut out = BytesMut::new();
        assert_eq!(BlockRewriter::default().rewrite(&bytes(hex), &mut out, LIMIT), Err(expected), "{hex}");
    }
}

#[test]
fn a_smaller_table_evicts_and_an_entry_larger_than_the_table_empties_it() {
    let mut connection = Connection::default();
    connection.rewrite("828684410f7777772e6578616d706c652e636f6d");
    assert_eq!(connection.rewriter.table.entries.len(), 1);
    // Size update to 40: the 57-byte entry goes; then a 64-byte entry is not kept.
    connection.rewrite("3f0940046e616d650a6c6f6e672076616c7565");
    assert_eq!((connection.rewriter.table.size, connection.rewriter.table.entries.len()), (0, 0));
    let stale = connection.rewriter.rewrite(&bytes("be"), &mut BytesMut::new(), LIMIT);
    assert_eq!(stale, Err(HpackError::BadIndex(62)));
}

#[test]
fn integers_round_trip_at_every_prefix() {
    for prefix in 1..=8 {
        for value in [0, 1, 30, 31, 126, 127, 128, 255, 1337, 16_383, 1 << 20] {
            let mut out = BytesMut::new();
            encode_integer(value, prefix, 0, &mut out);
            let mut input = &out[..];
            assert_eq!(decode_integer(&mut input, prefix), Ok(value), "prefix {prefix}");
            assert!(input.is_empty());
        }
    }
}

#[test]
fn a_small_block_that_names_a_large_entry_many_times_is_refused_before_it_grows() {
    let mut connection = Connection::default();
    // Re-encoding from here on; then one 4,000-byte entry, then 1,024 one-byte references to it:
    // 4 MB re-encoded.
    connection.rewrite(&format!("8386{SOCKET_AUTHORITY}84"));
    let mut insert = vec![0x40, 0x03, b'x', b'-', b'a', 0x7f, 0xa1, 0x1e];
    insert.extend_from_slice(&[b'v'; 4000]);
    connection.rewriter.rewrite(&insert, &mut BytesMut::new(), LIMIT).expect("one large entry is fine");
    let mut out = BytesMut::new();
    let references = vec![0xbe; MAX_FIELDS];
    assert_eq!(connection.rewriter.rewrite(&references, &mut out, LIMIT), Err(HpackError::TooLarge(LIMIT)));
    assert!(out.len() <= LIMIT + 4100, "stopped at the limit: {} bytes", out.len());
}

#[test]
fn a_block_of_more_fields_than_any_server_accepts_is_refused() {
    let block = vec![0x82; MAX_FIELDS + 1];
    let result = BlockRewriter::default().rewrite(&block, &mut BytesMut::new(), LIMIT);
    assert_eq!(result, Err(HpackError::TooManyFields));
}

#[test]
fn a_connection_that_starts_verbatim_re_encodes_against_the_table_the_server_built() {
    let mut connection = Connection::default();
    // RFC 7541 C.4's first two requests reach the server as written and fill its table.
    connection.rewrite("828684418cf1e3c2e5f23a6ba0ab90f4ff");
    connection.rewrite("828684be5886a8eb10649cbf");
    // Then a socket-path authority, and `cache-control: no-cache` by the client's index 63.
    let (fields, dropped) = connection.rewrite(&format!("8386{SOCKET_AUTHORITY}bf"));
    assert_eq!(dropped, 1);
    assert_eq!(fields, list(&[(":method", "POST"), (":scheme", "http"), ("cache-control", "no-cache")]));
    // And later blocks refer to entries from both eras.
    let (fields, dropped) = connection.rewrite("8286c0bf");
    assert_eq!(dropped, 0);
    assert_eq!(
        fields,
        list(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache")
        ])
    );
}
