//! The throttling proxy (`support::throttle`): against a loopback server, and in front of the
//! real stack's registry, where containerd pulls through it at its rate and waits while it stalls.

mod support;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use support::{stack::LocalStack, throttle::ThrottleProxy};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
    time::{Instant, sleep, timeout},
};

const MIB: u64 = 1 << 20;

/// A loopback server that answers each line it reads on a connection with `reply_bytes` bytes,
/// keeping the connection open for the next line (as HTTP keep-alive does).
async fn upstream(reply_bytes: usize) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.expect("accept");
            tokio::spawn(async move {
                let mut byte = [0u8];
                while stream.read_exact(&mut byte).await.is_ok() {
                    if byte[0] == b'\n' && stream.write_all(&vec![7u8; reply_bytes]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, task)
}

/// Sends a request line on `stream` and reads the `bytes` of its answer.
async fn ask(stream: &mut TcpStream, bytes: usize) {
    stream.write_all(b"GET\n").await.expect("send");
    let mut answer = vec![0u8; bytes];
    stream.read_exact(&mut answer).await.expect("answer");
}

/// Waits, at most `limit`, until `done`.
async fn wait_until(limit: Duration, what: &str, done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "not within {limit:?}: {what}");
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn concurrent_keep_alive_connections_share_the_rate() {
    let (addr, _server) = upstream(128 * 1024).await;
    let proxy = ThrottleProxy::start(addr, 512 * 1024).await;
    let started = Instant::now();
    let client = |proxy_addr| async move {
        let mut stream = TcpStream::connect(proxy_addr).await.expect("connect");
        // Two answers on one connection.
        ask(&mut stream, 128 * 1024).await;
        ask(&mut stream, 128 * 1024).await;
    };
    tokio::join!(client(proxy.addr), client(proxy.addr));
    let took = started.elapsed();
    // 512 KiB at 512 KiB/s, less the bucket's first chunk.
    assert!(took >= Duration::from_millis(850) && took < Duration::from_secs(3), "took {took:?}");
    assert_eq!(proxy.bytes_forwarded(), 512 * 1024);
    assert_eq!(proxy.connections(), 2);
}

#[tokio::test]
async fn a_stalled_proxy_holds_its_connections_open_until_resumed() {
    let (addr, _server) = upstream(256 * 1024).await;
    let proxy = ThrottleProxy::start(addr, 256 * 1024).await;
    let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
    stream.write_all(b"GET\n").await.expect("send");
    wait_until(Duration::from_secs(2), "some bytes forwarded", || proxy.bytes_forwarded() >= 64 * 1024).await;
    proxy.stall();
    let at_stall = proxy.bytes_forwarded();
    sleep(Duration::from_millis(500)).await;
    assert!(proxy.bytes_forwarded() - at_stall <= 64 * 1024, "at most the chunk being written");
    let stalled = proxy.bytes_forwarded();
    sleep(Duration::from_millis(500)).await;
    assert_eq!(proxy.bytes_forwarded(), stalled, "nothing more while stalled");

    proxy.resume();
    let mut answer = vec![0u8; 256 * 1024];
    timeout(Duration::from_secs(3), stream.read_exact(&mut answer)).await.expect("resumed").expect("answer");
    assert_eq!(proxy.bytes_forwarded(), 256 * 1024);
    // The same connection carries the next request.
    timeout(Duration::from_secs(3), ask(&mut stream, 256 * 1024)).await.expect("second answer");
}

#[tokio::test]
async fn dropping_the_proxy_closes_its_connections() {
    let (addr, _server) = upstream(1024).await;
    let proxy = ThrottleProxy::start(addr, MIB).await;
    let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
    ask(&mut stream, 1024).await;
    let proxy_addr = proxy.addr;
    drop(proxy);
    let mut buffer = [0u8; 16];
    let read = timeout(Duration::from_secs(2), stream.read(&mut buffer)).await.expect("closed promptly");
    assert!(matches!(read, Ok(0) | Err(_)), "the connection is closed: {read:?}");
    assert!(TcpStream::connect(proxy_addr).await.is_err(), "the listener is gone");
}

// ---- the real stack ----

const IMAGE: &str = "progress/app:v1";
const IMAGE_BYTES: u64 = 8 * MIB;
const RATE: u64 = 2 * MIB;

/// The stack with an 8 MiB image and a 2 MiB/s proxy in front of its registry, containerd routed
/// through it.
async fn throttled_stack() -> Option<(Arc<LocalStack>, ThrottleProxy)> {
    let stack = LocalStack::start()?;
    stack.seed_sized(IMAGE, IMAGE_BYTES);
    let registry: SocketAddr = stack.registry.parse().expect("the registry's address");
    let proxy = ThrottleProxy::start(registry, RATE).await;
    stack.route_through(proxy.addr.port());
    Some((Arc::new(stack), proxy))
}

/// How many times containerd has failed to parse a hosts.toml (it then falls back to defaults).
fn hosts_toml_errors(stack: &LocalStack) -> usize {
    let log = std::fs::read_to_string(&stack.containerd_log).expect("containerd log");
    log.matches("failed to decode hosts.toml").count()
}

/// CRI PullImage of `image` straight on containerd, on a blocking thread.
fn pull(stack: &Arc<LocalStack>, image: String) -> JoinHandle<String> {
    let stack = stack.clone();
    tokio::task::spawn_blocking(move || stack.pull(&image))
}

#[tokio::test]
async fn containerd_pulls_through_the_proxy_at_its_rate() {
    let Some((stack, proxy)) = throttled_stack().await else { return };
    let decode_errors_before = hosts_toml_errors(&stack);
    let started = Instant::now();
    let id = timeout(Duration::from_secs(12), pull(&stack, proxy.image(IMAGE))).await.expect("pulled").expect("pull");
    let took = started.elapsed();
    let forwarded = proxy.bytes_forwarded();
    eprintln!(
        "pulled {id} through the proxy in {took:?}: {forwarded} bytes, {:.2} MiB/s, {} connections",
        forwarded as f64 / MIB as f64 / took.as_secs_f64(),
        proxy.connections()
    );
    assert!(took >= Duration::from_secs(3), "8 MiB at 2 MiB/s took only {took:?}");
    assert!(forwarded >= IMAGE_BYTES, "only {forwarded} bytes came through the proxy");
    assert_eq!(hosts_toml_errors(&stack), decode_errors_before, "containerd could not parse the proxy's hosts.toml");
}

#[tokio::test]
async fn a_pull_waits_while_the_proxy_stalls_and_completes_once_resumed() {
    let Some((stack, proxy)) = throttled_stack().await else { return };
    let started = Instant::now();
    let pulling = pull(&stack, proxy.image(IMAGE));
    wait_until(Duration::from_secs(5), "2 MiB through the proxy", || proxy.bytes_forwarded() >= 2 * MIB).await;
    proxy.stall();
    // A chunk being written when stalled may still land.
    sleep(Duration::from_millis(200)).await;
    let at_stall = proxy.bytes_forwarded();
    let connections_at_stall = proxy.connections();
    sleep(Duration::from_secs(2)).await;
    assert_eq!(proxy.bytes_forwarded(), at_stall, "bytes came through a stalled proxy");
    assert!(!pulling.is_finished(), "the pull ended while the proxy was stalled");
    assert_eq!(proxy.connections(), connections_at_stall, "containerd does not reconnect to a stalled registry");
    eprintln!("stalled at {at_stall} bytes for 2.2 s over {connections_at_stall} connections");

    proxy.resume();
    timeout(Duration::from_secs(8), pulling).await.expect("pulled after resume").expect("pull");
    let forwarded = proxy.bytes_forwarded();
    eprintln!("pulled in {:?} in all, {forwarded} bytes, {} connections", started.elapsed(), proxy.connections());
    assert!(forwarded >= IMAGE_BYTES, "only {forwarded} bytes came through the proxy");
}
