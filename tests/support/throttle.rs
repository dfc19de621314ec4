//! A loopback TCP proxy in front of a registry that throttles, stalls and counts what it sends back.
//!
//! Client → upstream bytes pass freely; upstream → client bytes pass through one token bucket
//! shared by every connection, so their total rate is about the proxy's `bytes_per_second`. It
//! knows nothing of HTTP: keep-alive and concurrent connections (one upstream connection per
//! client connection) work as they would without it.

use std::{
    io,
    net::{Ipv4Addr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpListener, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::watch,
    task::{JoinHandle, JoinSet},
    time::Instant,
};

/// Most client connections relayed at once; more wait in the listen backlog until one closes.
const MAX_CONNECTIONS: usize = 64;
/// Largest chunk read and written in one go, in bytes.
const MAX_CHUNK: usize = 64 * 1024;

/// A running proxy; its listener and every connection it relays are aborted when it is dropped.
pub struct ThrottleProxy {
    /// Where clients connect: `127.0.0.1:PORT`.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl ThrottleProxy {
    /// Listens on `127.0.0.1:0` and relays each connection to `upstream` (a loopback address),
    /// sending upstream's bytes back at about `bytes_per_second` in total (at least 1).
    pub async fn start(upstream: SocketAddr, bytes_per_second: u64) -> Self {
        assert!(upstream.ip().is_loopback(), "the proxy relays to loopback only, not {upstream}");
        assert!(bytes_per_second > 0, "a rate of 0 bytes per second would never send anything");
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind the proxy on loopback");
        let addr = listener.local_addr().expect("the proxy's address");
        // A tenth of a second's worth per chunk keeps the flow smooth at low rates.
        let chunk = usize::try_from(bytes_per_second / 10).unwrap_or(MAX_CHUNK).clamp(1, MAX_CHUNK);
        let shared = Arc::new(Shared {
            upstream,
            chunk,
            bucket: Mutex::new(Bucket::new(bytes_per_second, chunk, Instant::now())),
            stalled: watch::Sender::new(false),
            forwarded: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
        });
        let task = tokio::spawn(serve(listener, shared.clone()));
        Self { addr, shared, task }
    }

    /// `127.0.0.1:PORT/name`: `name` (`repository:tag`) of the upstream registry, through the proxy.
    pub fn image(&self, name: &str) -> String {
        format!("{}/{name}", self.addr)
    }

    /// Stops forwarding in both directions, keeping every connection open (new ones are accepted
    /// and held too). A chunk already being written when this is called may still arrive: at most
    /// one chunk (64 KiB) per connection.
    pub fn stall(&self) {
        self.shared.stalled.send_replace(true);
    }

    /// Forwards again after [`ThrottleProxy::stall`], at the same rate (no burst for the pause).
    pub fn resume(&self) {
        self.shared.stalled.send_replace(false);
    }

    /// Bytes written to clients so far (upstream → client, all connections).
    pub fn bytes_forwarded(&self) -> u64 {
        self.shared.forwarded.load(Ordering::Relaxed)
    }

    /// Client connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for ThrottleProxy {
    fn drop(&mut self) {
        // Dropping the serving task drops its JoinSet, which aborts every connection.
        self.task.abort();
    }
}

/// What the listener and every connection share.
struct Shared {
    upstream: SocketAddr,
    /// Bytes read and written in one go.
    chunk: usize,
    bucket: Mutex<Bucket>,
    stalled: watch::Sender<bool>,
    forwarded: AtomicU64,
    accepted: AtomicU64,
}

impl Shared {
    /// Returns at once unless stalled, else when resumed.
    async fn unstalled(&self) {
        let mut stalled = self.stalled.subscribe();
        // The sender lives as long as `self`, so this only ends when not stalled.
        let _ = stalled.wait_for(|stalled| !stalled).await;
    }
}

/// A token bucket of bytes, which may go into debt: a taker reserves its bytes at once and waits
/// until the debt is paid, so concurrent takers share the rate in the order they came.
struct Bucket {
    /// Tokens added per second.
    rate: f64,
    /// Most tokens held (the largest burst), in bytes.
    capacity: f64,
    /// Tokens now; negative while in debt.
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(bytes_per_second: u64, capacity: usize, now: Instant) -> Self {
        Self { rate: bytes_per_second as f64, capacity: capacity as f64, tokens: capacity as f64, last: now }
    }

    /// Takes `bytes` tokens at `now`; returns how long to wait before sending them.
    fn take(&mut self, bytes: usize, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity) - bytes as f64;
        if self.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-self.tokens / self.rate) }
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        while connections.len() >= MAX_CONNECTIONS {
            connections.join_next().await;
        }
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    shared.accepted.fetch_add(1, Ordering::Relaxed);
                    connections.spawn(relay(shared.clone(), client));
                }
                // Out of file descriptors and the like: try again shortly.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Relays one client connection until both sides have closed or either fails.
async fn relay(shared: Arc<Shared>, client: TcpStream) {
    // A refused upstream closes the client's connection, as the registry being down would.
    let Ok(upstream) = TcpStream::connect(shared.upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    let _ = tokio::try_join!(
        forward(&shared, client_read, upstream_write, false),
        forward(&shared, upstream_read, client_write, true),
    );
}

/// Copies `from` to `to` chunk by chunk, waiting while stalled and, if `throttled`, for the
/// bucket (and counting what it writes); passes end of stream on as a shutdown of `to`.
async fn forward(shared: &Shared, mut from: OwnedReadHalf, mut to: OwnedWriteHalf, throttled: bool) -> io::Result<()> {
    let mut buffer = vec![0; shared.chunk];
    loop {
        shared.unstalled().await;
        let read = from.read(&mut buffer).await?;
        if read == 0 {
            return to.shutdown().await;
        }
        if throttled {
            let wait = shared.bucket.lock().expect("bucket lock").take(read, Instant::now());
            tokio::time::sleep(wait).await;
        }
        shared.unstalled().await;
        to.write_all(&buffer[..read]).await?;
        if throttled {
            shared.forwarded.fetch_add(read as u64, Ordering::Relaxed);
        }
    }
}
