//! The network rig (`support::netrig`) and the misbehaving registries (`support::registry_faults`):
//! the link has the round trip and bandwidth asked for, containerd pulls across it, a stopped
//! registry refuses and a started one serves, a hung registry hangs a pull, and a 429 answer
//! fails one with Docker Hub's words.

mod support;

use std::{net::SocketAddr, time::Duration};

use cri_imaged::cri::{ImageSpec, PullImageRequest, image_service_client::ImageServiceClient};
use support::{
    netrig::{LinkShape, NetRig},
    registry_faults::{HungRegistry, RateLimitProxy, Refusal},
    stack::LocalStack,
    unix_channel,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    time::{Instant, timeout},
};

const MB: u64 = 1_000_000;

/// CRI PullImage of `image` straight on the stack's containerd: its image ref, or its error.
async fn cri_pull(stack: &LocalStack, image: &str) -> Result<String, tonic::Status> {
    let mut containerd = ImageServiceClient::new(unix_channel(&stack.containerd_socket));
    let request =
        PullImageRequest { image: Some(ImageSpec { image: image.into(), ..Default::default() }), ..Default::default() };
    containerd.pull_image(request).await.map(|response| response.into_inner().image_ref)
}

/// The median time of `tries` TCP handshakes with `addr`.
async fn handshake_time(addr: SocketAddr, tries: usize) -> Duration {
    let mut times = Vec::new();
    for _ in 0..tries {
        let started = Instant::now();
        let stream = TcpStream::connect(addr).await.expect("connect across the link");
        times.push(started.elapsed());
        drop(stream);
    }
    times.sort();
    times[times.len() / 2]
}

#[tokio::test]
async fn the_link_adds_the_round_trip_asked_for() {
    let Some(rig) = NetRig::start(LinkShape { rtt: Duration::from_millis(100), ..Default::default() }) else { return };
    let rtt = handshake_time(rig.addr(), 5).await;
    eprintln!("TCP handshake across a 100 ms link: {rtt:?}, {} packets delayed", rig.delayed_packets());
    assert!(rtt >= Duration::from_millis(98) && rtt < Duration::from_millis(150), "handshake took {rtt:?}");
    assert!(rig.delayed_packets() > 0, "the delay line held the packets");
}

#[tokio::test]
async fn containerd_pulls_over_the_shaped_link_at_its_bandwidth() {
    let shape = LinkShape::new(50.0, 20, 0.0);
    let Some(rig) = NetRig::start(shape) else { return };
    let Some(stack) = LocalStack::start() else { return };
    rig.route(&stack);
    let bytes = 10 * MB;
    rig.push_image("rig/ten:v1", bytes, 1);
    let (before, started) = (rig.bytes_to_node(), Instant::now());
    let image_ref = timeout(Duration::from_secs(20), cri_pull(&stack, &rig.image("rig/ten:v1")))
        .await
        .expect("the pull ends")
        .expect("containerd pulls across the link");
    let (took, moved) = (started.elapsed(), rig.bytes_to_node() - before);
    let floor = shape.transfer_time(bytes);
    eprintln!("pulled {image_ref} over 50 Mbit / 20 ms in {took:?} ({floor:?} at the bandwidth alone), {moved} bytes");
    assert!(moved >= bytes, "the uncompressed layer crossed the link in full: only {moved} bytes");
    assert!(took >= floor.mul_f64(0.9), "{bytes} bytes at 50 Mbit took only {took:?}");
    assert!(took <= floor * 3 + Duration::from_secs(1), "{bytes} bytes at 50 Mbit took {took:?}");
}

#[tokio::test]
async fn a_stopped_registry_refuses_connections_and_serves_again_once_started() {
    let Some(rig) = NetRig::start(LinkShape { rtt: Duration::from_millis(10), ..Default::default() }) else { return };
    let Some(stack) = LocalStack::start() else { return };
    rig.route(&stack);
    rig.push_image("rig/small:v1", 100_000, 1);
    rig.stop_registry();
    let refused = TcpStream::connect(rig.addr()).await.expect_err("nothing listens");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused, "{refused}");
    let failed = timeout(Duration::from_secs(20), cri_pull(&stack, &rig.image("rig/small:v1")))
        .await
        .expect("a pull from a stopped registry ends")
        .expect_err("a pull from a stopped registry fails");
    eprintln!("containerd on a stopped registry: {:?}: {}", failed.code(), failed.message());
    assert!(failed.message().contains("connection refused"), "{}", failed.message());

    rig.start_registry();
    let image_ref = timeout(Duration::from_secs(20), cri_pull(&stack, &rig.image("rig/small:v1")))
        .await
        .expect("the pull ends")
        .expect("the started registry serves the image it had");
    assert!(image_ref.starts_with("sha256:"), "{image_ref}");
}

#[tokio::test]
async fn a_pull_from_a_hung_registry_hangs() {
    let Some(stack) = LocalStack::start() else { return };
    let hung = HungRegistry::start().await;
    stack.route_through(hung.addr.port());
    let pull = timeout(Duration::from_secs(3), cri_pull(&stack, &hung.image("hung/app:v1"))).await;
    assert!(pull.is_err(), "the pull ended: {pull:?}");
    assert!(hung.connections() >= 1, "containerd connected to the hung registry");
}

#[tokio::test]
async fn a_429_answer_fails_a_containerd_pull_with_toomanyrequests() {
    let Some(stack) = LocalStack::start() else { return };
    stack.seed("limited/app:v1", "behind a pull limit");
    let registry: SocketAddr = stack.registry.parse().expect("the registry's address");
    let proxy = RateLimitProxy::start(registry, Refusal::Always).await;
    stack.route_through(proxy.addr.port());
    let failed = timeout(Duration::from_secs(20), cri_pull(&stack, &proxy.image("limited/app:v1")))
        .await
        .expect("the pull ends")
        .expect_err("a pull answered 429 fails");
    eprintln!("containerd on a 429: {:?}: {}", failed.code(), failed.message());
    let message = failed.message().to_lowercase();
    assert!(message.contains("429") || message.contains("toomanyrequests"), "{}", failed.message());
    assert!(proxy.refused() >= 1 && proxy.passed() == 0, "{} refused, {} passed", proxy.refused(), proxy.passed());

    proxy.set_refusal(Refusal::Never);
    let image_ref = timeout(Duration::from_secs(20), cri_pull(&stack, &proxy.image("limited/app:v1")))
        .await
        .expect("the pull ends")
        .expect("the same pull passes once the limit is lifted");
    assert!(image_ref.starts_with("sha256:"), "{image_ref}");
    assert!(proxy.passed() >= 2, "the manifest and its blobs came through: {}", proxy.passed());
}

/// A loopback HTTP/1.1 server answering every request `200` with a 2-byte body, keep-alive.
async fn ok_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut byte = [0u8];
                while stream.read_exact(&mut byte).await.is_ok() {
                    request.push(byte[0]);
                    if request.ends_with(b"\r\n\r\n") {
                        request.clear();
                        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
                        if stream.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// Sends `GET /v2/` on `stream` and reads the answer's status code and body (by Content-Length).
async fn get(stream: &mut TcpStream) -> (u16, String) {
    stream.write_all(b"GET /v2/ HTTP/1.1\r\nHost: registry\r\n\r\n").await.expect("send");
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.expect("an answer");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).expect("a text head");
    let status = head[9..12].parse().expect("a status code");
    let length: usize = head
        .lines()
        .find_map(|line| line.to_lowercase().strip_prefix("content-length:").map(|value| value.trim().to_owned()))
        .expect("a Content-Length")
        .parse()
        .expect("a length");
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.expect("the body");
    (status, String::from_utf8(body).expect("a text body"))
}

#[tokio::test]
async fn the_429_proxy_refuses_every_other_request_on_one_keep_alive_connection() {
    let proxy = RateLimitProxy::start(ok_server().await, Refusal::EveryNth(2)).await;
    let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let (status, body) = get(&mut stream).await;
        if status == 429 {
            assert!(body.contains("TOOMANYREQUESTS"), "{body}");
        }
        statuses.push(status);
    }
    assert_eq!(statuses, [429, 200, 429, 200]);
    assert_eq!((proxy.refused(), proxy.passed(), proxy.connections()), (2, 2, 1));

    proxy.set_refusal(Refusal::Always);
    assert_eq!(get(&mut stream).await.0, 429);
    proxy.set_refusal(Refusal::Never);
    assert_eq!(get(&mut stream).await.0, 200);
}
