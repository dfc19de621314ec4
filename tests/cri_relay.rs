//! The calls of kubelets newer than cri-imaged, against a scripted runtime that has them: an image
//! service method cri-imaged has never heard of is relayed to the runtime whole, whatever its shape
//! (unary, streaming either way), with its metadata and deadline, and the runtime's answer, status,
//! details and metadata come back as it sent them; StreamImages (KEP-5825) is served, from what
//! ListImages would answer or, where nothing is remembered, from the runtime's own StreamImages.

mod support;

use std::{collections::BTreeSet, path::Path, time::Duration};

use base64::Engine;
use serde_json::Value;

use bytes::Bytes;
use cri_imaged::{
    cri::{
        Image, ImageFilter, ImageSpec, ListImagesRequest, StreamImagesRequest, image_service_client::ImageServiceClient,
    },
    runtime::passthrough::RawCodec,
};
use futures_util::StreamExt;
use support::{
    InProcessDaemon,
    clients::{Answer, Call, Client},
    fake_runtime::{FakeImageService, FakeRuntime},
    fake_runtime_methods::CALLER_METADATA,
    process::DaemonProcess,
    unix_channel,
};
use tonic::{Code, Request, codegen::http::uri::PathAndQuery, transport::Channel};

/// A runtime with methods of its own and cri-imaged in front of it; `events`: the runtime serves
/// containerd's events, so cri-imaged remembers answers (else, as with CRI-O, it asks every time).
async fn stack(events: bool) -> (FakeRuntime, InProcessDaemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("runtime.sock");
    let service = FakeImageService::default();
    let runtime =
        if events { FakeRuntime::start_with_events(&socket, service) } else { FakeRuntime::start(&socket, service) };
    let daemon = InProcessDaemon::start(&dir.path().join("cri-imaged.sock"), &runtime.socket).await;
    (runtime, daemon, dir)
}

async fn raw_client(socket: &Path) -> tonic::client::Grpc<Channel> {
    let mut grpc = tonic::client::Grpc::new(unix_channel(socket));
    grpc.ready().await.expect("ready");
    grpc
}

fn path(method: &str) -> PathAndQuery {
    format!("/runtime.v1.ImageService/{method}").parse().expect("a path")
}

/// What a unary call of `method` with `message` got, on `socket`: the answer's bytes and the two
/// headers the fake sets, or the status.
async fn unary(socket: &Path, method: &str, message: &[u8]) -> Result<(Bytes, String, String), tonic::Status> {
    let mut request = Request::new(Bytes::copy_from_slice(message));
    request.metadata_mut().insert(CALLER_METADATA, "from-the-caller".parse().expect("ascii"));
    request.set_timeout(Duration::from_secs(7));
    let answer = raw_client(socket).await.unary(request, path(method), RawCodec).await?;
    let header = |name: &str| answer.metadata().get(name).map(|value| value.to_str().unwrap_or("?").to_owned());
    let (saw_metadata, saw_timeout) = (header("x-fake-saw-metadata"), header("x-fake-saw-timeout"));
    Ok((answer.into_inner(), saw_metadata.unwrap_or_default(), saw_timeout.unwrap_or_default()))
}

#[tokio::test]
async fn a_unary_call_cri_imaged_does_not_know_reaches_the_runtime_with_its_metadata_and_deadline() {
    let (runtime, daemon, _dir) = stack(false).await;
    let request = b"\x0a\x05alpine\x20\x01";
    let (direct, through) = (
        unary(&runtime.socket, "PullSecurityProfile", request).await,
        unary(&daemon.socket, "PullSecurityProfile", request).await,
    );
    let (answer, metadata, timeout) = through.expect("relayed");
    assert_eq!(answer.as_ref(), request, "the runtime's answer, byte for byte");
    assert_eq!(metadata, "from-the-caller", "the caller's metadata reached the runtime");
    let (amount, unit) = timeout.split_at(timeout.len().saturating_sub(1));
    let amount: u64 = amount.parse().unwrap_or_else(|_| panic!("a grpc-timeout reached the runtime: {timeout:?}"));
    let told = match unit {
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        other => panic!("grpc-timeout unit {other:?}"),
    };
    assert!(told > Duration::from_secs(6) && told <= Duration::from_secs(7), "{timeout}");
    assert_eq!(timeout, direct.expect("direct").2, "the deadline as the caller sent it");
}

#[tokio::test]
async fn the_runtimes_refusal_and_its_unimplemented_come_back_as_it_sent_them() {
    let (runtime, daemon, _dir) = stack(false).await;
    for method in ["FakeRefuse", "NoSuchMethod"] {
        let direct = unary(&runtime.socket, method, b"").await.expect_err("refused");
        let through = unary(&daemon.socket, method, b"").await.expect_err("refused");
        assert_eq!((through.code(), through.message()), (direct.code(), direct.message()), "{method}");
        assert_eq!(through.details(), direct.details(), "{method}");
        assert_eq!(
            through.metadata().get("x-fake-why").map(|value| value.to_str().unwrap_or("?").to_owned()),
            direct.metadata().get("x-fake-why").map(|value| value.to_str().unwrap_or("?").to_owned()),
            "{method}"
        );
    }
    let refused = unary(&daemon.socket, "FakeRefuse", b"").await.expect_err("refused");
    assert_eq!(
        (refused.code(), refused.message(), refused.details()),
        (Code::FailedPrecondition, "refused by the fake", &b"\x08\x09"[..])
    );
    assert_eq!(unary(&daemon.socket, "NoSuchMethod", b"").await.expect_err("unknown").code(), Code::Unimplemented);
}

#[tokio::test]
async fn streaming_calls_cri_imaged_does_not_know_are_relayed_in_both_directions() {
    let (_runtime, daemon, _dir) = stack(false).await;
    let mut grpc = raw_client(&daemon.socket).await;
    // The runtime streams its answer.
    let counted = grpc.server_streaming(Request::new(Bytes::from_static(&[0x08, 5])), path("FakeCount"), RawCodec);
    let messages: Vec<Bytes> =
        counted.await.expect("answered").into_inner().map(|message| message.expect("a message")).collect().await;
    assert_eq!(messages, (0..5).map(|i| Bytes::from(vec![0x08, i])).collect::<Vec<_>>());
    // The caller streams its request: 300 messages of 1 KiB, more than one flow-control window of
    // the caller's frames held at once.
    let sent: Vec<Bytes> = (0..300u16).map(|i| Bytes::from(vec![(i % 251) as u8; 1024])).collect();
    let mut grpc = raw_client(&daemon.socket).await;
    let request = Request::new(futures_util::stream::iter(sent.clone()));
    let gathered = grpc.client_streaming(request, path("FakeGather"), RawCodec).await.expect("answered").into_inner();
    assert_eq!(gathered, sent.concat(), "every message, in order");
    // Both ways at once.
    let mut grpc = raw_client(&daemon.socket).await;
    let said = vec![Bytes::from_static(b"abc"), Bytes::from_static(b"hello")];
    let replies = grpc.streaming(Request::new(futures_util::stream::iter(said)), path("FakeChat"), RawCodec);
    let replies: Vec<Bytes> =
        replies.await.expect("answered").into_inner().map(|message| message.expect("a reply")).collect().await;
    assert_eq!(replies, vec![Bytes::from_static(b"cba"), Bytes::from_static(b"olleh")]);
}

fn images(n: usize, name_bytes: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("registry.test/app-{i:05}-{}:v1", "x".repeat(name_bytes)), format!("sha256:{i:064x}")))
        .collect()
}

async fn streamed(client: &mut ImageServiceClient<Channel>, filter: Option<&str>) -> (Vec<Vec<Image>>, usize) {
    let filter =
        filter.map(|image| ImageFilter { image: Some(ImageSpec { image: image.into(), ..Default::default() }) });
    let stream = client.stream_images(StreamImagesRequest { filter }).await.expect("StreamImages").into_inner();
    let messages: Vec<Vec<Image>> = stream.map(|message| message.expect("a message").images).collect().await;
    let count = messages.iter().map(Vec::len).sum();
    (messages, count)
}

fn ids(images: impl IntoIterator<Item = Image>) -> BTreeSet<String> {
    images.into_iter().map(|image| image.id).collect()
}

#[tokio::test]
async fn stream_images_is_every_image_list_images_has_once_in_messages_any_client_reads() {
    for events in [true, false] {
        let (runtime, daemon, _dir) = stack(events).await;
        // 3,000 images of about 1.2 KiB each: 3.6 MiB, past one message of 1 MiB.
        for (name, id) in images(3000, 1100) {
            runtime.service.add_image(&name, &id, 1);
        }
        // tonic's default limit for a message it receives is 4 MiB, as grpc-go's.
        let mut client = ImageServiceClient::new(unix_channel(&daemon.socket));
        let listed = if events { remembered_list(&mut client, &runtime).await } else { list(&mut client).await };
        let before = asked(&runtime);
        let (messages, count) = streamed(&mut client, None).await;
        assert_eq!(count, 3000, "events {events}: every image once");
        assert_eq!(ids(messages.concat()), ids(listed), "events {events}: the images ListImages has");
        assert!(messages.len() >= 4, "events {events}: {} messages", messages.len());
        let after = asked(&runtime);
        // Remembered (events): the stream is the remembered ListImages answer, cut; the runtime is
        // not asked. Not (CRI-O): the runtime's StreamImages is asked, has none, then its ListImages.
        let expected = if events { (0, 0) } else { (1, 1) };
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            expected,
            "events {events}: (StreamImages, ListImages) asked"
        );
    }
}

async fn list(client: &mut ImageServiceClient<Channel>) -> Vec<Image> {
    client.list_images(ListImagesRequest::default()).await.expect("list").into_inner().images
}

/// ListImages once cri-imaged answers it from memory (it watches the runtime's events from a
/// moment after it starts).
async fn remembered_list(client: &mut ImageServiceClient<Channel>, runtime: &FakeRuntime) -> Vec<Image> {
    for _ in 0..100 {
        let listed = list(client).await;
        let before = asked(runtime);
        list(client).await;
        if asked(runtime) == before {
            return listed;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("ListImages was never answered from memory");
}

/// How often the runtime was asked StreamImages and ListImages.
fn asked(runtime: &FakeRuntime) -> (usize, usize) {
    let script = runtime.service.script.lock().unwrap();
    (script.stream_calls, script.list_calls)
}

#[tokio::test]
async fn where_nothing_is_remembered_the_runtimes_own_stream_is_passed_on() {
    let (runtime, daemon, _dir) = stack(false).await;
    runtime.service.script.lock().unwrap().stream_images = Some(4);
    let mut client = ImageServiceClient::new(unix_channel(&daemon.socket));
    assert_eq!(streamed(&mut client, None).await.1, 0, "no image: the runtime's empty stream, ended well");
    for (name, id) in images(10, 10) {
        runtime.service.add_image(&name, &id, 1);
    }
    let before = asked(&runtime);
    let (messages, count) = streamed(&mut client, None).await;
    assert_eq!(
        (messages.iter().map(Vec::len).collect::<Vec<_>>(), count),
        (vec![4, 4, 2], 10),
        "as the runtime sent it"
    );
    // Its messages as it cut them: a ListImages answer cut here would be one message of 10.
    assert_eq!(asked(&runtime).0 - before.0, 1, "its StreamImages asked once");
}

#[tokio::test]
async fn a_filtered_stream_and_an_empty_one_are_what_list_images_says() {
    let (runtime, daemon, _dir) = stack(true).await;
    let mut client = ImageServiceClient::new(unix_channel(&daemon.socket));
    let (messages, count) = streamed(&mut client, None).await;
    assert_eq!((messages.len(), count), (0, 0), "no image: no message, and the stream ends well");
    runtime.service.add_image("registry.test/a:v1", "sha256:a", 1);
    let (_, count) = streamed(&mut client, Some("registry.test/a:v1")).await;
    let filter = ListImagesRequest {
        filter: Some(ImageFilter {
            image: Some(ImageSpec { image: "registry.test/a:v1".into(), ..Default::default() }),
        }),
    };
    let listed = client.list_images(filter).await.expect("list").into_inner().images;
    assert_eq!(count, listed.len(), "the same filter, the same answer");
}

/// grpcio and grpc-js through a cri-imaged process: the runtime's answers to calls of each shape
/// they can make that cri-imaged does not know. (Not straight to the fake runtime: its h2 server
/// resets grpcio's streams, whose `:authority` is the socket's path.)
#[tokio::test]
async fn real_clients_get_the_runtimes_answers_to_calls_cri_imaged_does_not_know() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]).await;
    let method = |name: &str| format!("runtime.v1.ImageService/{name}");
    let calls = vec![
        Call::raw(&method("PullSecurityProfile"), b"\x0a\x08\x0a\x06alpine").metadata(CALLER_METADATA, "grpc"),
        Call::raw(&method("FakeCount"), &[0x08, 3]).streaming(),
        Call::raw(&method("FakeRefuse"), b""),
        Call::raw(&method("NoSuchMethod"), b""),
        Call::raw(&method("NoSuchStream"), b"").streaming(),
    ];
    let base64 = |bytes: &[u8]| Value::from(base64::engine::general_purpose::STANDARD.encode(bytes));
    let expected = vec![
        Answer::Ok(base64(b"\x0a\x08\x0a\x06alpine")),
        Answer::Ok(Value::Array((0..3u8).map(|i| base64(&[0x08, i])).collect())),
        Answer::Error { code: "FAILED_PRECONDITION".into(), message: "refused by the fake".into() },
        // tonic's generated server names no method it does not have.
        Answer::Error { code: "UNIMPLEMENTED".into(), message: String::new() },
        Answer::Error { code: "UNIMPLEMENTED".into(), message: String::new() },
    ];
    let clients = Client::available();
    for &client in &clients {
        let (socket, calls) = (daemon.socket.clone(), calls.clone());
        let through = tokio::task::spawn_blocking(move || client.run(&socket, &calls)).await.expect("runner");
        assert_eq!(through, expected, "{client:?}");
    }
    assert_eq!(clients.len(), 2, "grpcio and grpc-js both ran");
}
