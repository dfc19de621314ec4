use super::*;

fn frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    put_frame_header(&mut out, payload.len(), kind, flags, stream_id);
    out.put_slice(payload);
    out.to_vec()
}

fn hex(hex: &str) -> Vec<u8> {
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

/// `:method POST`, `:scheme http`, `:authority /run/x.sock` (literal, incrementally indexed),
/// `:path /`.
fn request_block() -> Vec<u8> {
    let mut block = hex("8386410b");
    block.extend_from_slice(b"/run/x.sock");
    block.push(0x84);
    block
}

/// The same fields without `:authority`, as the rewriter writes them.
const REWRITTEN: [u8; 3] = [0x83, 0x86, 0x84];

const SETTINGS: u8 = 0x4;
const DATA: u8 = 0x0;

/// Feeds `input` in pieces of `step` bytes, as a socket might deliver it.
fn run(input: &[u8], step: usize) -> Result<Vec<u8>, FrameError> {
    let mut rewriter = FrameRewriter::default();
    let (mut pending, mut out) = (BytesMut::new(), BytesMut::new());
    for piece in input.chunks(step) {
        pending.extend_from_slice(piece);
        rewriter.process(&mut pending, &mut out)?;
    }
    assert!(pending.is_empty(), "nothing left unprocessed");
    Ok(out.to_vec())
}

fn connection(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = PREFACE.to_vec();
    frames.iter().for_each(|frame| bytes.extend_from_slice(frame));
    bytes
}

#[test]
fn rewrites_header_blocks_and_passes_every_other_frame_through() {
    let settings = frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0xff, 0xff]);
    let data = frame(DATA, END_STREAM, 1, b"\0\0\0\0\x05hello");
    let input = connection(&[settings.clone(), frame(HEADERS, END_HEADERS, 1, &request_block()), data.clone()]);
    let expected = connection(&[settings, frame(HEADERS, END_HEADERS, 1, &REWRITTEN), data]);
    for step in [1, 2, 7, 9, 10, 64, input.len()] {
        assert_eq!(run(&input, step), Ok(expected.clone()), "delivered {step} bytes at a time");
    }
}

#[test]
fn gathers_continuations_and_strips_padding_keeping_priority_and_end_stream() {
    let block = request_block();
    let (head, tail) = block.split_at(5);
    let mut headers_payload = vec![3]; // pad length
    headers_payload.extend_from_slice(&[0x80, 0, 0, 0, 15]); // exclusive dependency on stream 0, weight 16
    headers_payload.extend_from_slice(head);
    headers_payload.extend_from_slice(&[0, 0, 0]);
    let input = connection(&[
        frame(HEADERS, PADDED | PRIORITY | END_STREAM, 3, &headers_payload),
        frame(CONTINUATION, 0, 3, &tail[..4]),
        frame(CONTINUATION, END_HEADERS, 3, &tail[4..]),
    ]);
    let mut rewritten = vec![0x80, 0, 0, 0, 15];
    rewritten.extend_from_slice(&REWRITTEN);
    let expected = connection(&[frame(HEADERS, PRIORITY | END_STREAM | END_HEADERS, 3, &rewritten)]);
    assert_eq!(run(&input, 1), Ok(expected.clone()));
    assert_eq!(run(&input, input.len()), Ok(expected));
}

#[test]
fn splits_a_large_rewritten_block_into_continuations() {
    // Two 10,000-byte values: the raw re-encoding needs more than one frame.
    let mut block = REWRITTEN.to_vec();
    for name in [b"x-a", b"x-b"] {
        block.extend_from_slice(&[0x00, 0x03]);
        block.extend_from_slice(name);
        block.extend_from_slice(&[0x7f, 0x91, 0x4d]); // 127 + 9873 = 10,000
        block.extend_from_slice(&[b'v'; 10_000]);
    }
    let input = connection(&[
        frame(HEADERS, 0, 1, &block[..MAX_FRAME_SIZE]),
        frame(CONTINUATION, END_HEADERS, 1, &block[MAX_FRAME_SIZE..]),
    ]);
    let out = run(&input, 4096).expect("valid");
    let first = &out[PREFACE.len()..];
    assert_eq!(
        (&first[..3], first[3], first[4]),
        (&[0x00, 0x40, 0x00][..], HEADERS, 0),
        "16,384 bytes, no END_HEADERS"
    );
    let second = &first[FRAME_HEADER_LEN + MAX_FRAME_SIZE..];
    assert_eq!((second[3], second[4]), (CONTINUATION, END_HEADERS));
    let mut reassembled = first[FRAME_HEADER_LEN..FRAME_HEADER_LEN + MAX_FRAME_SIZE].to_vec();
    reassembled.extend_from_slice(&second[FRAME_HEADER_LEN..]);
    assert_eq!(reassembled, block, "nothing to drop: the same fields, the same bytes");
}

#[test]
fn a_connection_that_is_not_http2_passes_through_untouched() {
    let input = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_eq!(run(input, 3), Ok(input.to_vec()));
}

#[test]
fn refuses_what_would_be_a_protocol_error_anyway() {
    let headers = |flags| frame(HEADERS, flags, 1, &request_block());
    let cases = [
        (vec![headers(0), frame(DATA, 0, 1, b"x")], FrameError::InterruptedHeaderBlock(DATA)),
        (vec![headers(0), frame(CONTINUATION, END_HEADERS, 3, &[])], FrameError::InterruptedHeaderBlock(CONTINUATION)),
        (vec![frame(CONTINUATION, END_HEADERS, 1, &[0x82])], FrameError::UnexpectedContinuation),
        (vec![frame(PUSH_PROMISE, END_HEADERS, 1, &[0, 0, 0, 2, 0x82])], FrameError::PushPromise),
        (vec![frame(HEADERS, PADDED | END_HEADERS, 1, &[9, 0x82])], FrameError::BadPadding),
        (vec![frame(HEADERS, PRIORITY | END_HEADERS, 1, &[0, 0])], FrameError::BadPadding),
        (vec![frame(HEADERS, END_HEADERS, 1, &[0xbe])], FrameError::Hpack(HpackError::BadIndex(62))),
        (
            vec![frame(HEADERS, 0, 1, &vec![0; MAX_FRAME_SIZE + 1])],
            FrameError::FrameTooLarge { kind: "HEADERS", len: MAX_FRAME_SIZE + 1 },
        ),
    ];
    for (frames, expected) in cases {
        assert_eq!(run(&connection(&frames), 5), Err(expected.clone()), "{expected}");
    }
}

#[test]
fn bounds_the_header_block_it_gathers() {
    let mut frames = vec![frame(HEADERS, 0, 1, &[0x82])];
    let continuation = frame(CONTINUATION, 0, 1, &vec![0x82; MAX_FRAME_SIZE]);
    frames.extend(std::iter::repeat_n(continuation, MAX_HEADER_BLOCK / MAX_FRAME_SIZE));
    assert_eq!(run(&connection(&frames), MAX_FRAME_SIZE), Err(FrameError::HeaderBlockTooLarge));
}
