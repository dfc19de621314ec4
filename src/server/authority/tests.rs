use bytes::BufMut;
use http::{HeaderMap, HeaderValue, Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;

/// An h2 server reading through the rewriter until the client goes away; yields each request's
/// authority, path and headers.
async fn serve(io: DuplexStream) -> Vec<(Option<String>, String, HeaderMap)> {
    let mut connection = h2::server::handshake(AuthorityTolerant::new(io)).await.expect("server handshake");
    let mut seen = Vec::new();
    while let Some(accepted) = connection.accept().await {
        let (request, mut respond) = accepted.expect("a well-formed request");
        let (parts, _body) = request.into_parts();
        seen.push((parts.uri.authority().map(ToString::to_string), parts.uri.path().to_owned(), parts.headers));
        respond.send_response(Response::new(()), true).expect("respond");
    }
    seen
}

/// A small deterministic generator, so a failure can be replayed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % below
    }
}

/// h2's own encoder (Huffman where shorter, incremental indexing, eviction, never-indexed
/// values) against h2's own decoder, with the rewriter between them: every field arrives as sent.
#[tokio::test]
async fn every_header_h2_encodes_reaches_h2_unchanged() {
    const REQUESTS: usize = 300;
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    let server = tokio::spawn(serve(server_io));
    let (mut client, connection) = h2::client::handshake(client_io).await.expect("client handshake");
    tokio::spawn(connection);

    let value_bytes: Vec<u8> = (0x20..=0x7e).chain(0x80..=0xff).chain([b'\t']).collect();
    let mut random = Lcg(7);
    let mut sent = Vec::new();
    for n in 0..REQUESTS {
        let mut request = Request::post(format!("http://localhost/svc/{}", n % 7)).body(()).expect("request");
        // Few names, many values: the table fills, repeats are indexed, old entries are evicted.
        for field in 0..random.next(6) {
            let longest = if random.next(10) == 0 { 600 } else { 40 };
            let length = random.next(longest);
            let value: Vec<u8> = (0..length).map(|_| value_bytes[random.next(value_bytes.len())]).collect();
            let mut value = HeaderValue::from_bytes(&value).expect("valid value");
            value.set_sensitive(field == 0 && n % 5 == 0);
            let name = http::HeaderName::try_from(format!("x-field-{}", random.next(9))).expect("valid name");
            request.headers_mut().append(name, value);
        }
        sent.push(request.headers().clone());
        let (response, _) = client.send_request(request, true).expect("send");
        let _ = response.await.expect("response");
        client = client.ready().await.expect("ready");
    }
    drop(client);
    let received = server.await.expect("server task");
    for (n, ((authority, path, headers), sent)) in received.into_iter().zip(sent).enumerate() {
        assert_eq!(authority.as_deref(), Some("localhost"), "request {n}: a valid authority is kept");
        assert_eq!(path, format!("/svc/{}", n % 7));
        assert_eq!(headers, sent, "request {n}");
    }
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream_id: u32, payload: &[u8]) {
    out.put_uint(payload.len() as u64, 3);
    out.extend_from_slice(&[kind, flags]);
    out.put_u32(stream_id);
    out.extend_from_slice(payload);
}

/// What grpc-go 1.51, grpcio and grpcurl send over a unix socket: the path as `:authority`,
/// incrementally indexed and referred to again by the next request. Here the header block is also
/// split over CONTINUATIONs and padded.
#[tokio::test]
async fn a_socket_path_authority_is_served_on_every_request_of_a_connection() {
    let (mut client_io, server_io) = tokio::io::duplex(1 << 16);
    let server = tokio::spawn(serve(server_io));

    let mut first_block = vec![0x83, 0x86, 0x41, 20];
    first_block.extend_from_slice(b"/run/cri-imaged.sock");
    first_block.extend_from_slice(&[0x44, 0x05]);
    first_block.extend_from_slice(b"/a/b1");
    let mut bytes = frames::PREFACE.to_vec();
    frame(&mut bytes, 0x4, 0, 0, &[]); // SETTINGS
    let mut padded = vec![4];
    padded.extend_from_slice(&first_block[..3]);
    padded.extend_from_slice(&[0; 4]);
    frame(&mut bytes, 0x1, 0x8 | 0x1, 1, &padded); // HEADERS, PADDED, END_STREAM
    frame(&mut bytes, 0x9, 0, 1, &first_block[3..10]);
    frame(&mut bytes, 0x9, 0x4, 1, &first_block[10..]); // END_HEADERS
    // The second request names the path by dynamic index 62, the authority by 63.
    frame(&mut bytes, 0x1, 0x4 | 0x1, 3, &[0x83, 0x86, 0xbf, 0xbe]);
    frame(&mut bytes, 0x7, 0, 0, &[0; 8]); // GOAWAY: no more requests
    client_io.write_all(&bytes).await.expect("write");

    let received = server.await.expect("server task");
    assert_eq!(received.len(), 2);
    for (authority, path, _) in received {
        assert_eq!(authority, None, "the socket path is left out");
        assert_eq!(path, "/a/b1");
    }
}

/// A malformed header block ends only its own connection: the server sees the stream fail.
#[tokio::test]
async fn a_malformed_header_block_ends_the_connection_with_an_error() {
    let (mut client_io, server_io) = tokio::io::duplex(1 << 16);
    let mut bytes = frames::PREFACE.to_vec();
    frame(&mut bytes, 0x4, 0, 0, &[]);
    frame(&mut bytes, 0x1, 0x4, 1, &[0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
    client_io.write_all(&bytes).await.expect("write");
    let mut stream = AuthorityTolerant::new(server_io);
    let mut read = Vec::new();
    let error = stream.read_to_end(&mut read).await.expect_err("the rewrite fails");
    assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    assert!(error.to_string().contains("integer in header block is too large"), "{error}");
    assert_eq!(read, bytes[..frames::PREFACE.len() + 9], "the preface and SETTINGS were forwarded first");
}
