//! The accept path: how many connections are served at once, and how soon each must start
//! speaking HTTP/2.
//!
//! - **A cap on connections** (`--max-connections`): each holds a slot until it closes. At the
//!   cap, a new connection takes the place of the oldest one that has not yet sent the HTTP/2
//!   preface (every gRPC client sends it the moment it connects, so such a connection is idle or
//!   abusive), else it is closed at once, counted and logged, so that the caller fails fast.
//! - **A handshake timeout** (`--connection-handshake-timeout`): a connection that has not sent
//!   the preface within it is closed, so connections that never send a byte cannot pile up.
//! - **Places kept for the kubelet** (`--reserved-connections`): of the cap, some places only
//!   root (or `--reserved-connection-uid`) may take, as the kernel names the caller
//!   (`SO_PEERCRED`), so that other callers cannot lock the kubelet out.
//! - **A share per client** (`--max-connections-per-client`): one unprivileged process holds at
//!   most that many connections that have begun HTTP/2; one more is closed as it begins. Root
//!   (and the reserved uid) is trusted with as many as it opens: it could stop the daemon anyway.
//!   A process is named across PID namespaces (see [`super::peer::ClientKey`]).
//! - **Accept failures**: tonic logs a failed accept at trace and tries again at once, which at
//!   the file-descriptor limit (EMFILE) spins a core and says nothing. Here a failure the next
//!   accept would repeat waits, doubling from 10 ms to 1 s, with a warning; one that ends only the
//!   connection being accepted is tried again at once.

use std::{
    collections::{HashMap, VecDeque},
    io,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError, Weak,
        atomic::{AtomicU8, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use futures_util::{Stream, task::AtomicWaker};
use tokio::{
    io::{AsyncRead, ReadBuf},
    net::{UnixListener, UnixStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    time::{Instant, Sleep},
};

use super::{
    authority::PREFACE,
    metrics::{Closed, ConnectionMetrics},
    peer::{ClientKey, ConnectedPeer},
};
use crate::retry::Doubling;

/// The waits after a failed accept: from 10 ms, doubling up to 1 s.
const ACCEPT_WAITS: Doubling = Doubling::new(Duration::from_millis(10), Duration::from_secs(1));
/// How long a new connection waits for the place of the connection it displaced.
const DISPLACEMENT_WAIT: Duration = Duration::from_millis(200);
/// Refused connections are logged at most this often, with their count.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// How many connections at once, how soon each must send the HTTP/2 preface, and who may take
/// which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections served at once (`--max-connections`).
    pub max_connections: usize,
    /// From accepting a connection to its HTTP/2 preface (`--connection-handshake-timeout`).
    pub handshake_timeout: Duration,
    /// Of `max_connections`, the places only root and `reserved_uid` may take
    /// (`--reserved-connections`); at most all but one.
    pub reserved: usize,
    /// A caller besides root that may take a reserved place (`--reserved-connection-uid`).
    pub reserved_uid: Option<u32>,
    /// Connections one process holds once they have begun HTTP/2 (`--max-connections-per-client`).
    pub per_client: usize,
}

impl ConnectionLimits {
    /// The places any caller may take, and those only privileged ones may.
    fn places(&self) -> (usize, usize) {
        let reserved = self.reserved.min(self.max_connections.saturating_sub(1));
        (self.max_connections - reserved, reserved)
    }

    /// Whether a caller of `uid` may take a reserved place.
    fn privileged(&self, uid: Option<u32>) -> bool {
        uid.is_some_and(|uid| uid == 0 || Some(uid) == self.reserved_uid)
    }

    /// These limits within `open_files` (the soft `RLIMIT_NOFILE`): each connection takes a file,
    /// and `FILES_BESIDE_CONNECTIONS` stay for the rest. The cap lowered to fit, if it had to be.
    pub fn fitted_to(self, open_files: u64) -> (Self, Option<usize>) {
        let room = usize::try_from(open_files.saturating_sub(FILES_BESIDE_CONNECTIONS)).unwrap_or(usize::MAX).max(1);
        if self.max_connections <= room {
            return (self, None);
        }
        (Self { max_connections: room, ..self }, Some(room))
    }
}

/// Open files kept beside the connections: the listener, the runtime's connections, state and
/// config files, credential plugins' pipes, the metrics endpoint, logs.
pub const FILES_BESIDE_CONNECTIONS: u64 = 64;

/// Connections that have begun HTTP/2, by the process that holds them.
#[derive(Default)]
struct Clients {
    by_client: Mutex<HashMap<ClientKey, usize>>,
}

impl Clients {
    /// Counts one more connection of `client`, unless it holds `most` already.
    fn join(self: &Arc<Self>, client: ClientKey, most: usize) -> Option<ClientHold> {
        let mut by_client = self.by_client.lock().unwrap_or_else(PoisonError::into_inner);
        let held = by_client.entry(client).or_default();
        if *held >= most {
            return None;
        }
        *held += 1;
        Some(ClientHold { clients: self.clone(), client })
    }
}

/// One counted connection of a client; uncounted when it closes.
struct ClientHold {
    clients: Arc<Clients>,
    client: ClientKey,
}

impl Drop for ClientHold {
    fn drop(&mut self) {
        let mut by_client = self.clients.by_client.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = by_client.get_mut(&self.client) {
            *held -= 1;
            if *held == 0 {
                by_client.remove(&self.client);
            }
        }
    }
}

/// Where a connection's handshake stands, as both the connection and the accept loop see it: one
/// compare-and-swap decides whether its preface or its displacement came first.
#[derive(Default)]
struct Handshake {
    state: AtomicU8,
    waker: AtomicWaker,
}

const HANDSHAKING: u8 = 0;
/// The preface arrived (or the connection ended): it can no longer be displaced.
const SPOKE: u8 = 1;
const DISPLACED: u8 = 2;

impl Handshake {
    /// The connection spoke; false when it had been displaced first.
    fn finish(&self) -> bool {
        self.state.compare_exchange(HANDSHAKING, SPOKE, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Displaces the connection if it is still in its handshake, waking it to close.
    fn displace(&self) -> bool {
        let displaced =
            self.state.compare_exchange(HANDSHAKING, DISPLACED, Ordering::AcqRel, Ordering::Acquire).is_ok();
        if displaced {
            self.waker.wake();
        }
        displaced
    }

    fn in_progress(&self) -> bool {
        self.state.load(Ordering::Acquire) == HANDSHAKING
    }

    fn displaced(&self) -> bool {
        self.state.load(Ordering::Acquire) == DISPLACED
    }
}

/// An accepted connection: its slot under the cap, held until it closes, and its handshake.
pub struct Admitted<IO> {
    inner: IO,
    _slot: OwnedSemaphorePermit,
    handshake: Option<HandshakeWait>,
    /// Its place in its client's share, once it has begun HTTP/2.
    client: Option<ClientHold>,
    /// The caller's supplementary groups (see [`super::peer`]).
    groups: Arc<[u32]>,
}

struct HandshakeWait {
    shared: Arc<Handshake>,
    /// The calling process and the share it may hold, when the kernel named it.
    client: Option<(Arc<Clients>, ClientKey, usize)>,
    received: usize,
    deadline: Instant,
    /// Made only if the preface did not come with the first read.
    timer: Option<Pin<Box<Sleep>>>,
    timeout: Duration,
    /// Why the connection was closed, once it was: counted once, told on every later read.
    closed_for: Option<Closed>,
    metrics: Arc<ConnectionMetrics>,
}

impl HandshakeWait {
    fn new(timeout: Duration, metrics: Arc<ConnectionMetrics>) -> Self {
        let (shared, received, deadline) = (Arc::default(), 0, Instant::now() + timeout);
        Self { shared, client: None, received, deadline, timer: None, timeout, closed_for: None, metrics }
    }

    /// Registers for a displacement; why the connection must close, if it must.
    fn closing(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        self.shared.waker.register(cx.waker());
        match self.closed_for {
            Some(why) => Some(closed_error(why, self.timeout)),
            None if self.shared.displaced() => Some(self.close(Closed::Displaced)),
            None => None,
        }
    }

    /// Closes the connection for `why`, counted once.
    fn close(&mut self, why: Closed) -> io::Error {
        if self.closed_for.replace(why).is_none() {
            self.metrics.closed(why);
        }
        closed_error(why, self.timeout)
    }
}

/// What a connection's reader is told when the accept path closes it.
fn closed_error(why: Closed, handshake_timeout: Duration) -> io::Error {
    match why {
        Closed::Displaced => io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "closed before it began HTTP/2: its place was needed (--max-connections)",
        ),
        Closed::HandshakeTimeout => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no HTTP/2 preface within {handshake_timeout:?} (--connection-handshake-timeout)"),
        ),
        Closed::Refused => io::Error::new(io::ErrorKind::ConnectionRefused, "refused (--max-connections)"),
        Closed::ClientShare => io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "closed as it began HTTP/2: its process holds its share of connections (--max-connections-per-client)",
        ),
    }
}

struct AcceptLoop {
    listener: UnixListener,
    limits: ConnectionLimits,
    /// Places any caller may take, and those kept for privileged callers.
    slots: Arc<Semaphore>,
    reserved: Arc<Semaphore>,
    clients: Arc<Clients>,
    /// Connections still in their handshake, oldest first (some may have finished since).
    handshaking: VecDeque<Weak<Handshake>>,
    metrics: Arc<ConnectionMetrics>,
    refused_since_log: u64,
    last_refusal_log: Option<Instant>,
    /// The waits after a failed accept; `true` while failing.
    waits: (Doubling, bool),
}

/// Accepted connections within `limits`; never an error, so tonic never spins on one.
pub fn connections(
    listener: UnixListener,
    limits: ConnectionLimits,
    metrics: Arc<ConnectionMetrics>,
) -> impl Stream<Item = io::Result<Admitted<UnixStream>>> {
    let (open, reserved) = limits.places();
    let state = AcceptLoop {
        listener,
        limits,
        slots: Arc::new(Semaphore::new(open)),
        reserved: Arc::new(Semaphore::new(reserved)),
        clients: Arc::default(),
        handshaking: VecDeque::new(),
        metrics,
        refused_since_log: 0,
        last_refusal_log: None,
        waits: (ACCEPT_WAITS, false),
    };
    futures_util::stream::unfold(state, |mut state| async move {
        let admitted = state.next().await;
        Some((Ok(admitted), state))
    })
}

impl AcceptLoop {
    async fn next(&mut self) -> Admitted<UnixStream> {
        loop {
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) if only_this_connection(&error) => {
                    tracing::debug!(%error, "a connection ended while it was accepted");
                    continue;
                }
                Err(error) => {
                    let wait = self.waits.0.next_wait();
                    self.waits.1 = true;
                    tracing::warn!(%error, retry_in = ?wait, "cannot accept connections (at the open-file limit? see LimitNOFILE)");
                    tokio::time::sleep(wait).await;
                    continue;
                }
            };
            if std::mem::take(&mut self.waits.1) {
                self.waits.0.reset();
                tracing::info!("accepting connections again");
            }
            let caller = stream.peer_cred().ok();
            let privileged = self.limits.privileged(caller.map(|caller| caller.uid()));
            if let Some(slot) = self.slot(privileged).await {
                // Only unprivileged callers have a share to keep to.
                let client = caller.filter(|_| !privileged).map(|caller| {
                    let process = super::peer::peer_process(&stream).ok();
                    ClientKey::choose(process, caller.pid(), caller.uid())
                });
                // Read once here; a kernel that cannot say leaves roles by uid and gid only.
                let groups = super::peer::peer_groups(&stream).unwrap_or_else(|error| {
                    tracing::debug!(%error, "the caller's supplementary groups are unknown (SO_PEERGROUPS)");
                    Vec::new()
                });
                let mut admitted = self.admit(stream, slot, client);
                admitted.groups = groups.into();
                return admitted;
            }
            // Dropping it closes it: the caller fails at once instead of waiting in the backlog.
            self.refused();
            drop(stream);
        }
    }

    /// A place under the cap: a free one (a reserved one too for a `privileged` caller), or that
    /// of the oldest connection still in its handshake.
    async fn slot(&mut self, privileged: bool) -> Option<OwnedSemaphorePermit> {
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            return Some(slot);
        }
        if privileged && let Ok(slot) = self.reserved.clone().try_acquire_owned() {
            return Some(slot);
        }
        if !self.displace_oldest_handshake() {
            return None;
        }
        let (open, reserved) = (self.slots.clone(), self.reserved.clone());
        let freed = async move {
            tokio::select! {
                slot = open.acquire_owned() => slot.ok(),
                slot = reserved.acquire_owned(), if privileged => slot.ok(),
            }
        };
        tokio::time::timeout(DISPLACEMENT_WAIT, freed).await.ok()?
    }

    /// Displaces the oldest connection still in its handshake; false when there is none.
    fn displace_oldest_handshake(&mut self) -> bool {
        while let Some(oldest) = self.handshaking.pop_front() {
            if oldest.upgrade().is_some_and(|handshake| handshake.displace()) {
                return true;
            }
        }
        false
    }

    fn admit(
        &mut self,
        stream: UnixStream,
        slot: OwnedSemaphorePermit,
        client: Option<ClientKey>,
    ) -> Admitted<UnixStream> {
        // Those ended or done since are forgotten from the front; the rest are bounded by the
        // connections a handshake timeout lets through, and pruned whole past twice the cap.
        let finished =
            |handshake: &Weak<Handshake>| handshake.upgrade().is_none_or(|handshake| !handshake.in_progress());
        while self.handshaking.front().is_some_and(finished) {
            self.handshaking.pop_front();
        }
        if self.handshaking.len() > self.limits.max_connections.saturating_mul(2) {
            self.handshaking.retain(|handshake| !finished(handshake));
        }
        let mut handshake = HandshakeWait::new(self.limits.handshake_timeout, self.metrics.clone());
        handshake.client = client.map(|client| (self.clients.clone(), client, self.limits.per_client));
        self.handshaking.push_back(Arc::downgrade(&handshake.shared));
        Admitted { inner: stream, _slot: slot, handshake: Some(handshake), client: None, groups: Arc::default() }
    }

    fn refused(&mut self) {
        self.metrics.closed(Closed::Refused);
        self.refused_since_log += 1;
        let now = Instant::now();
        if self.last_refusal_log.is_none_or(|last| now.duration_since(last) >= REFUSAL_LOG_INTERVAL) {
            tracing::warn!(
                refused = self.refused_since_log,
                max_connections = self.limits.max_connections,
                "connections refused: every place is taken by a connection that has begun HTTP/2 (--max-connections)"
            );
            self.refused_since_log = 0;
            self.last_refusal_log = Some(now);
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Admitted<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(wait) = &mut this.handshake else { return Pin::new(&mut this.inner).poll_read(cx, buf) };
        if let Some(closed) = wait.closing(cx) {
            return Poll::Ready(Err(closed));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = buf.filled().len() - before;
                wait.received += read;
                // The preface, or the end of the connection: nothing left to wait for.
                if wait.received >= PREFACE.len() || read == 0 {
                    if !wait.shared.finish() {
                        return Poll::Ready(Err(wait.close(Closed::Displaced)));
                    }
                    if let Some((clients, client, most)) = &wait.client {
                        match clients.join(*client, *most) {
                            Some(hold) => this.client = Some(hold),
                            None => return Poll::Ready(Err(wait.close(Closed::ClientShare))),
                        }
                    }
                    this.handshake = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => match super::poll_deadline(&mut wait.timer, wait.deadline, cx) {
                Poll::Ready(()) => Poll::Ready(Err(wait.close(Closed::HandshakeTimeout))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

writes_pass_through!(Admitted, writes);

impl tonic::transport::server::Connected for Admitted<UnixStream> {
    type ConnectInfo = ConnectedPeer;

    fn connect_info(&self) -> ConnectedPeer {
        ConnectedPeer { uds: self.inner.connect_info(), groups: self.groups.clone() }
    }
}

/// Whether the failure ends only the connection being accepted (the next accept may succeed).
fn only_this_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionRefused
    )
}

#[cfg(test)]
mod tests;
