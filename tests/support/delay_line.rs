//! A delay line for a network namespace: every packet iptables sends to NFQUEUE queue `Q` there is
//! held for a fixed time, then let through.
//!
//! It stands in for `tc netem delay`, which kernels built without `sch_netem` lack: the packets
//! wait in the kernel, and this side only reads their ids (nfnetlink_queue, copy mode "meta", no
//! payload) and, once each is due, accepts it with a batch verdict. One delay for every packet of
//! the queue keeps them in order: the oldest is always due first.
// A plain thread on the real clock: tokio's clock has nothing to do with packets in the kernel.
#![allow(clippy::disallowed_types)]

use std::{
    collections::VecDeque,
    fs::File,
    io,
    mem::size_of,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

const NETLINK_NETFILTER: libc::c_int = 12;
const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQNL_MSG_VERDICT_BATCH: u16 = 3;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQA_CFG_MASK: u16 = 4;
const NFQA_CFG_FLAGS: u16 = 5;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_META: u8 = 1;
/// Hand GSO packets over whole: nothing here looks inside them.
const NFQA_CFG_F_GSO: u32 = 4;
const NF_ACCEPT: u32 = 1;
const SOL_NETLINK: libc::c_int = 270;
const NETLINK_NO_ENOBUFS: libc::c_int = 5;
/// Packets the kernel holds for the queue at most (a second of 100 Mbit in 1500-byte packets is
/// about 8,500).
const QUEUE_MAXLEN: u32 = 65_536;
/// How often the thread looks at its stop flag while idle.
const IDLE_WAKE: Duration = Duration::from_millis(20);

/// A running delay line; stopped (its queue unbound, held packets dropped) when dropped.
pub struct DelayLine {
    stop: Arc<AtomicBool>,
    delayed: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl DelayLine {
    /// Binds NFQUEUE `queue` in the network namespace `/run/netns/NETNS` and holds each of its
    /// packets for `delay`. Returns once the queue is bound, or the reason it could not be.
    pub fn start(netns: &str, queue: u16, delay: Duration) -> io::Result<Self> {
        let namespace = File::open(format!("/run/netns/{netns}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let delayed = Arc::new(AtomicU64::new(0));
        let (bound, is_bound) = mpsc::channel();
        let thread = {
            let (stop, delayed) = (stop.clone(), delayed.clone());
            std::thread::Builder::new().name(format!("delay-{netns}")).spawn(move || {
                // This thread alone enters the namespace; the socket stays in it.
                let socket = enter(&namespace).and_then(|()| QueueSocket::bind(queue));
                match socket {
                    Ok(socket) => {
                        let _ = bound.send(Ok(()));
                        socket.run(delay, &stop, &delayed);
                    }
                    Err(error) => {
                        let _ = bound.send(Err(error));
                    }
                }
            })?
        };
        let line = Self { stop, delayed, thread: Some(thread) };
        is_bound.recv().map_err(|_| io::Error::other("the delay line's thread ended before binding"))??;
        Ok(line)
    }

    /// Packets held and let through so far.
    pub fn delayed(&self) -> u64 {
        self.delayed.load(Ordering::Relaxed)
    }
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Moves the calling thread into the network namespace `namespace` (a `/run/netns/NAME` file).
pub fn enter(namespace: &File) -> io::Result<()> {
    // SAFETY: setns on a valid descriptor changes only this thread's network namespace.
    if unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A netlink socket bound to one nfnetlink queue.
struct QueueSocket {
    fd: OwnedFd,
    queue: u16,
}

impl QueueSocket {
    fn bind(queue: u16) -> io::Result<Self> {
        // SAFETY: plain socket(2); the descriptor is owned at once.
        let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_NETFILTER) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let socket = Self { fd: unsafe { OwnedFd::from_raw_fd(raw) }, queue };
        // A burst of packets must not overflow the socket: a lost notice only delays that packet
        // until the next batch verdict, but ENOBUFS would end a read.
        socket.set_option(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 32 << 20)?;
        socket.set_option(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)?;
        // SAFETY: a zeroed sockaddr_nl is the kernel-assigned port id, no groups.
        let mut address: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        address.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: `address` is a valid sockaddr_nl of the size given.
        let bound = unsafe {
            libc::bind(
                socket.fd.as_raw_fd(),
                (&raw const address).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if bound != 0 {
            return Err(io::Error::last_os_error());
        }
        socket.configure(&attribute(NFQA_CFG_CMD, &[NFQNL_CFG_CMD_BIND, 0, 0, 0]))?;
        let mut params = 0u32.to_be_bytes().to_vec();
        params.push(NFQNL_COPY_META);
        socket.configure(&attribute(NFQA_CFG_PARAMS, &params))?;
        socket.configure(&attribute(NFQA_CFG_QUEUE_MAXLEN, &QUEUE_MAXLEN.to_be_bytes()))?;
        let mut flags = attribute(NFQA_CFG_MASK, &NFQA_CFG_F_GSO.to_be_bytes());
        flags.extend(attribute(NFQA_CFG_FLAGS, &NFQA_CFG_F_GSO.to_be_bytes()));
        socket.configure(&flags)?;
        Ok(socket)
    }

    fn set_option(&self, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
        // SAFETY: `value` is a c_int, of the size given.
        let set = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                (&raw const value).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if set != 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    /// Sends a config message of `attributes` and waits for the kernel's acknowledgement.
    fn configure(&self, attributes: &[u8]) -> io::Result<()> {
        let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
        self.send(&message(NFQNL_MSG_CONFIG, flags, self.queue, attributes))?;
        let mut buffer = vec![0u8; 8192];
        let read = self.receive(&mut buffer, 0)?;
        for (kind, body) in messages(&buffer[..read]) {
            if kind == libc::NLMSG_ERROR as u16 && body.len() >= 4 {
                let code = i32::from_ne_bytes([body[0], body[1], body[2], body[3]]);
                return if code == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(-code)) };
            }
        }
        Err(io::Error::other("no acknowledgement for an nfqueue config message"))
    }

    fn send(&self, bytes: &[u8]) -> io::Result<()> {
        // SAFETY: `bytes` is a valid buffer of the length given; netlink needs no address.
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
        if sent < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    fn receive(&self, buffer: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
        // SAFETY: `buffer` is valid for writes of its length.
        let read = unsafe { libc::recv(self.fd.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len(), flags) };
        if read < 0 { Err(io::Error::last_os_error()) } else { Ok(read as usize) }
    }

    /// Until `stop`: notes each queued packet with the time it is due, and accepts every packet
    /// that is due with one batch verdict (all ids up to the newest due one).
    fn run(&self, delay: Duration, stop: &AtomicBool, delayed: &AtomicU64) {
        let mut held: VecDeque<(u32, Instant)> = VecDeque::new();
        let mut buffer = vec![0u8; 1 << 20];
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            let mut release = None;
            while held.front().is_some_and(|(_, due)| *due <= now) {
                release = held.pop_front().map(|(id, _)| id);
                delayed.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(id) = release {
                let mut verdict = NF_ACCEPT.to_be_bytes().to_vec();
                verdict.extend(id.to_be_bytes());
                let batch = attribute(NFQA_VERDICT_HDR, &verdict);
                // A failed send leaves the packets queued; the next batch covers them.
                let _ = self.send(&message(NFQNL_MSG_VERDICT_BATCH, libc::NLM_F_REQUEST as u16, self.queue, &batch));
            }
            let wait = held.front().map_or(IDLE_WAKE, |(_, due)| due.saturating_duration_since(now).min(IDLE_WAKE));
            if !self.readable_within(wait) {
                continue;
            }
            while let Ok(read) = self.receive(&mut buffer, libc::MSG_DONTWAIT) {
                let arrived = Instant::now();
                for (kind, body) in messages(&buffer[..read]) {
                    if kind == (NFNL_SUBSYS_QUEUE << 8 | NFQNL_MSG_PACKET)
                        && let Some(id) = packet_id(body)
                    {
                        held.push_back((id, arrived + delay));
                    }
                }
            }
        }
    }

    /// Whether the socket has something to read within `wait` (to the microsecond).
    fn readable_within(&self, wait: Duration) -> bool {
        let mut poll = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let timeout = libc::timespec {
            tv_sec: wait.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(wait.subsec_nanos() as i32),
        };
        // SAFETY: one valid pollfd and a valid timespec; no signal mask.
        unsafe { libc::ppoll(&raw mut poll, 1, &raw const timeout, std::ptr::null()) > 0 }
    }
}

/// A netlink message of nfnetlink_queue: header, nfgenmsg (AF_UNSPEC, version 0, `queue`), then
/// `attributes`.
fn message(kind: u16, flags: u16, queue: u16, attributes: &[u8]) -> Vec<u8> {
    let length = 16 + 4 + attributes.len();
    let mut bytes = Vec::with_capacity(length);
    bytes.extend((length as u32).to_ne_bytes());
    bytes.extend((NFNL_SUBSYS_QUEUE << 8 | kind).to_ne_bytes());
    bytes.extend(flags.to_ne_bytes());
    bytes.extend(0u32.to_ne_bytes()); // sequence
    bytes.extend(0u32.to_ne_bytes()); // port id: the kernel
    bytes.extend([libc::AF_UNSPEC as u8, 0]);
    bytes.extend(queue.to_be_bytes());
    bytes.extend(attributes);
    bytes
}

/// One netlink attribute, padded to 4 bytes.
fn attribute(kind: u16, payload: &[u8]) -> Vec<u8> {
    let mut bytes = ((4 + payload.len()) as u16).to_ne_bytes().to_vec();
    bytes.extend(kind.to_ne_bytes());
    bytes.extend(payload);
    bytes.resize(bytes.len().next_multiple_of(4), 0);
    bytes
}

/// The (type, body after the netlink header) of each message in `bytes`.
fn messages(mut bytes: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if bytes.len() < 16 {
            return None;
        }
        let length = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        if length < 16 || length > bytes.len() {
            return None;
        }
        let kind = u16::from_ne_bytes([bytes[4], bytes[5]]);
        let body = &bytes[16..length];
        bytes = &bytes[length.next_multiple_of(4).min(bytes.len())..];
        Some((kind, body))
    })
}

/// The packet id of a queued packet's message body (nfgenmsg, then attributes).
fn packet_id(body: &[u8]) -> Option<u32> {
    let mut attributes = body.get(4..)?;
    while attributes.len() >= 4 {
        let length = usize::from(u16::from_ne_bytes([attributes[0], attributes[1]]));
        let kind = u16::from_ne_bytes([attributes[2], attributes[3]]) & 0x3fff;
        if length < 4 || length > attributes.len() {
            return None;
        }
        if kind == NFQA_PACKET_HDR && length >= 8 {
            return Some(u32::from_be_bytes([attributes[4], attributes[5], attributes[6], attributes[7]]));
        }
        attributes = &attributes[length.next_multiple_of(4).min(attributes.len())..];
    }
    None
}
