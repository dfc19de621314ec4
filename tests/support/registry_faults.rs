//! Registries that misbehave, on loopback: one that accepts connections and never answers a byte
//! (a wedged registry, a firewall that drops after the handshake), and a proxy in front of a
//! real registry that answers `429 Too Many Requests` as Docker Hub does when a pull limit is hit.
//!
//! containerd reaches either over plain HTTP once `LocalStack::route_through` names its port.

use std::{
    net::{Ipv4Addr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream, tcp::OwnedWriteHalf},
    task::{JoinHandle, JoinSet},
};

/// Docker Hub's answer to a pull over its limit (the message shortened).
pub const TOO_MANY_REQUESTS_BODY: &str = r#"{"errors":[{"code":"TOOMANYREQUESTS","message":"You have reached your pull rate limit. You may increase the limit by authenticating and upgrading: https://www.docker.com/increase-rate-limit"}]}"#;
/// The largest request head read, in bytes.
const MAX_HEAD: usize = 64 * 1024;

/// A listener that accepts every connection and holds it open, silent, until it is dropped.
pub struct HungRegistry {
    /// `127.0.0.1:PORT`.
    pub addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl HungRegistry {
    pub async fn start() -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind the hung registry");
        let addr = listener.local_addr().expect("its address");
        let accepted = Arc::new(AtomicU64::new(0));
        let task = {
            let accepted = accepted.clone();
            tokio::spawn(async move {
                let mut held = Vec::new();
                while let Ok((stream, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::Relaxed);
                    held.push(stream);
                }
            })
        };
        Self { addr, accepted, task }
    }

    /// `127.0.0.1:PORT/name`.
    pub fn image(&self, name: &str) -> String {
        format!("{}/{name}", self.addr)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for HungRegistry {
    fn drop(&mut self) {
        // The held connections are dropped with the task: their clients see them close.
        self.task.abort();
    }
}

/// Which requests the [`RateLimitProxy`] refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every request goes to the registry.
    Never,
    /// Every request is refused.
    Always,
    /// The 1st, (1+N)th, (1+2N)th … request since this policy was set is refused: `EveryNth(2)`
    /// refuses half, starting with the first.
    EveryNth(u64),
}

/// An HTTP/1.1 reverse proxy on loopback in front of a registry that answers some requests
/// `429` with [`TOO_MANY_REQUESTS_BODY`] and passes the others on, counting both.
///
/// Each client connection gets one upstream connection, opened at its first passed request;
/// keep-alive works across refused and passed requests alike. Requests are parsed (head, and a
/// body by `Content-Length`); responses are relayed as bytes, which is sound for clients that do
/// not pipeline (Go's, and so containerd's, never do: a request is sent only after the previous
/// response was read in full).
pub struct RateLimitProxy {
    /// `127.0.0.1:PORT`.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

struct Shared {
    upstream: SocketAddr,
    /// The policy and how many requests it has seen.
    refusal: Mutex<(Refusal, u64)>,
    passed: AtomicU64,
    refused: AtomicU64,
    connections: AtomicU64,
}

impl RateLimitProxy {
    /// Listens on `127.0.0.1:0` in front of the registry at `upstream`.
    pub async fn start(upstream: SocketAddr, refusal: Refusal) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind the 429 proxy");
        let addr = listener.local_addr().expect("its address");
        let shared = Arc::new(Shared {
            upstream,
            refusal: Mutex::new((refusal, 0)),
            passed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            connections: AtomicU64::new(0),
        });
        let task = tokio::spawn(serve(listener, shared.clone()));
        Self { addr, shared, task }
    }

    /// `127.0.0.1:PORT/name`: `name` of the upstream registry, through the proxy.
    pub fn image(&self, name: &str) -> String {
        format!("{}/{name}", self.addr)
    }

    /// Refuses by `refusal` from now on (its count starts again).
    pub fn set_refusal(&self, refusal: Refusal) {
        *self.shared.refusal.lock().expect("refusal lock") = (refusal, 0);
    }

    /// Requests passed on to the registry so far.
    pub fn passed(&self) -> u64 {
        self.shared.passed.load(Ordering::Relaxed)
    }

    /// Requests answered 429 so far.
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// Every request so far, passed or refused.
    pub fn requests(&self) -> u64 {
        self.passed() + self.refused()
    }

    /// Client connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }
}

impl Drop for RateLimitProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Shared {
    /// Whether the next request is refused, counting it.
    fn refuse_next(&self) -> bool {
        let mut refusal = self.refusal.lock().expect("refusal lock");
        refusal.1 += 1;
        let refuse = match refusal.0 {
            Refusal::Never => false,
            Refusal::Always => true,
            Refusal::EveryNth(n) => n > 0 && (refusal.1 - 1).is_multiple_of(n),
        };
        let counter = if refuse { &self.refused } else { &self.passed };
        counter.fetch_add(1, Ordering::Relaxed);
        refuse
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((client, _)) = accepted {
                    shared.connections.fetch_add(1, Ordering::Relaxed);
                    connections.spawn(proxy(client, shared.clone()));
                }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Serves one client connection until either side closes it.
async fn proxy(client: TcpStream, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let mut client_read = BufReader::new(client_read);
    let client_write = Arc::new(tokio::sync::Mutex::new(client_write));
    let mut upstream: Option<(OwnedWriteHalf, JoinHandle<()>)> = None;
    while let Some((head, body_length)) = read_head(&mut client_read).await {
        let mut body = vec![0u8; body_length];
        if client_read.read_exact(&mut body).await.is_err() {
            break;
        }
        if shared.refuse_next() {
            // An answer to HEAD has no body, though its length is told: a client reuses the
            // connection and would read the body as the next answer (containerd 2.x does).
            let body = if head.starts_with(b"HEAD ") { "" } else { TOO_MANY_REQUESTS_BODY };
            let answer = format!(
                "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                TOO_MANY_REQUESTS_BODY.len(),
            );
            if client_write.lock().await.write_all(answer.as_bytes()).await.is_err() {
                break;
            }
            continue;
        }
        if upstream.as_ref().is_none_or(|(_, relay)| relay.is_finished()) {
            // A registry that refuses the connection closes the client's, as it would itself.
            let Ok(stream) = TcpStream::connect(shared.upstream).await else { break };
            let _ = stream.set_nodelay(true);
            let (upstream_read, upstream_write) = stream.into_split();
            upstream = Some((upstream_write, tokio::spawn(relay(upstream_read, client_write.clone()))));
        }
        let Some((upstream_write, _)) = upstream.as_mut() else { break };
        if upstream_write.write_all(&head).await.is_err() || upstream_write.write_all(&body).await.is_err() {
            break;
        }
    }
    if let Some((_, relay)) = upstream {
        relay.abort();
    }
}

/// Copies the registry's bytes to the client until the registry closes, then closes the client.
async fn relay(mut upstream: tokio::net::tcp::OwnedReadHalf, client: Arc<tokio::sync::Mutex<OwnedWriteHalf>>) {
    let mut buffer = vec![0u8; 64 * 1024];
    while let Ok(read) = upstream.read(&mut buffer).await {
        if read == 0 || client.lock().await.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    let _ = client.lock().await.shutdown().await;
}

/// Reads one request head (through the blank line); returns it and its body's length, or `None`
/// at the end of the connection or on a head this proxy does not take.
async fn read_head(reader: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> Option<(Vec<u8>, usize)> {
    let mut head = Vec::new();
    let mut body_length = 0;
    loop {
        let start = head.len();
        if reader.read_until(b'\n', &mut head).await.ok()? == 0 || head.len() > MAX_HEAD {
            return None;
        }
        let line = String::from_utf8_lossy(&head[start..]).trim_end().to_owned();
        if line.is_empty() {
            // Blank lines before a request line are allowed (RFC 9112, 2.2).
            if start == 0 {
                head.clear();
                continue;
            }
            return Some((head, body_length));
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                body_length = value.trim().parse().ok()?;
            }
            // Chunked request bodies never come from a puller.
            if name.eq_ignore_ascii_case("transfer-encoding") {
                return None;
            }
        }
    }
}
