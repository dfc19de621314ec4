use bytes::BufMut;
use std::{convert::Infallible, path::Path};

use http_body_util::StreamBody;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixListener;

use super::*;

type Answer =
    http::Response<StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>>;

/// A gRPC server on `socket` that answers every call with `answer(path, message)`: the message
/// framed with an OK status, or an error as trailers only. Serves until aborted, connections and
/// all, as a runtime that dies.
fn serve(
    socket: &Path,
    answer: impl Fn(&str, Bytes) -> Result<Bytes, tonic::Status> + Clone + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    let listener = UnixListener::bind(socket).expect("bind");
    tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let answer = answer.clone();
            let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let answer = answer.clone();
                async move {
                    let path = request.uri().path().to_owned();
                    let body = http_body_util::BodyExt::collect(request.into_body()).await.expect("body").to_bytes();
                    let frames = match answer(&path, body.slice(5..)) {
                        Ok(message) => {
                            let mut framed = BytesMut::new();
                            framed.put_u8(0);
                            framed.put_u32(message.len() as u32);
                            framed.put(message);
                            let mut trailers = http::HeaderMap::new();
                            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                            vec![Ok(Frame::data(framed.freeze())), Ok(Frame::trailers(trailers))]
                        }
                        Err(status) => {
                            let mut trailers = http::HeaderMap::new();
                            status.add_header(&mut trailers).expect("a status as headers");
                            vec![Ok(Frame::trailers(trailers))]
                        }
                    };
                    let response: Answer = http::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(StreamBody::new(futures_util::stream::iter(frames)))
                        .expect("response");
                    Ok::<_, Infallible>(response)
                }
            });
            connections.spawn(async move {
                let served = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                drop(served);
            });
        }
    })
}

const TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn an_answer_larger_than_the_windows_comes_back_whole_and_the_path_and_message_arrive() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("runtime.sock");
    let _server = serve(&socket, |path, message| {
        assert_eq!(path, "/runtime.v1.ImageService/ListImages");
        assert_eq!(message, Bytes::from_static(b"question"));
        Ok(Bytes::from(vec![7u8; 9 << 20]))
    });
    let forwarder = Forwarder::new(socket, 16 << 20);
    for _ in 0..3 {
        let answer = forwarder
            .unary("/runtime.v1.ImageService/ListImages", Bytes::from_static(b"question"), TIMEOUT)
            .await
            .expect("answered");
        assert_eq!(answer.len(), 9 << 20, "more than the connection's window, on one connection, three times");
        assert!(answer.iter().all(|byte| *byte == 7));
    }
}

#[tokio::test]
async fn the_runtimes_error_comes_back_with_its_code_message_and_details() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("runtime.sock");
    let _server = serve(&socket, |_, _| {
        Err(tonic::Status::with_details(
            tonic::Code::NotFound,
            "image \"app:v1\" not found: 100% gone",
            Bytes::from_static(b"details"),
        ))
    });
    let forwarder = Forwarder::new(socket, 16 << 20);
    let error =
        forwarder.unary("/runtime.v1.ImageService/ImageStatus", Bytes::new(), TIMEOUT).await.expect_err("an error");
    assert_eq!(error.code(), tonic::Code::NotFound);
    assert_eq!(error.message(), "image \"app:v1\" not found: 100% gone");
    assert_eq!(error.details(), b"details");
}

#[tokio::test]
async fn a_runtime_that_is_gone_is_unavailable_and_one_that_is_back_is_reconnected_to() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("runtime.sock");
    let forwarder = Forwarder::new(socket.clone(), 16 << 20);
    let call = || forwarder.unary("/runtime.v1.ImageService/ImageFsInfo", Bytes::new(), TIMEOUT);
    let error = call().await.expect_err("nobody listens");
    assert_eq!(error.code(), tonic::Code::Unavailable);
    assert!(error.message().starts_with("the connection to the runtime failed"), "{error:?}");

    let server = serve(&socket, |_, _| Ok(Bytes::from_static(b"first")));
    assert_eq!(call().await.expect("answered"), Bytes::from_static(b"first"));
    server.abort();
    let _ = server.await;
    std::fs::remove_file(&socket).expect("the old socket removed");
    let _restarted = serve(&socket, |_, _| Ok(Bytes::from_static(b"second")));
    // The old connection may still look open to us until its close is read: at most one call
    // fails on it; the next is made on a new connection.
    let answered = match call().await {
        Ok(answer) => answer,
        Err(error) => {
            assert_eq!(error.code(), tonic::Code::Unavailable, "{error:?}");
            call().await.expect("answered on a new connection")
        }
    };
    assert_eq!(answered, Bytes::from_static(b"second"));
}

#[test]
fn an_answer_is_its_one_uncompressed_message() {
    let framed = |compressed: u8, length: u32, message: &[u8]| {
        let mut data = vec![compressed];
        data.extend_from_slice(&length.to_be_bytes());
        data.extend_from_slice(message);
        Bytes::from(data)
    };
    assert_eq!(unframe(framed(0, 3, b"abc")).expect("one message"), Bytes::from_static(b"abc"));
    assert_eq!(unframe(framed(0, 0, b"")).expect("an empty message"), Bytes::new());
    for (data, why) in [
        (Bytes::from_static(b"\0\0"), "no message"),
        (framed(1, 3, b"abc"), "compressed"),
        (framed(0, 4, b"abc"), "not one whole message"),
        (framed(0, 2, b"abc"), "not one whole message"),
    ] {
        let error = unframe(data).expect_err(why);
        assert!(error.message().contains(why), "{error:?}");
    }
}
