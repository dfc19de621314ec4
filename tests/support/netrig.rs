//! A registry behind a shaped link: its own network namespace, reached from the node (the root
//! namespace) through a second namespace, the wire, which shapes what it forwards; all made by
//! the test (root) and removed when the rig is dropped.
//!
//! ```text
//!  root namespace            wire: crimg-PID-N-wire             registry: crimg-PID-N
//!  HOST_IF  .1/30  ── veth ──  .2/30 A    B .5/30  ── veth ──  .6/30, docker-registry :5000
//! ```
//! The addresses are a /29 of 10.250.0.0/16 that no route of the machine covers (the default
//! route aside); the root namespace gets one route, to the registry's /30 through the wire.
//! In the wire:
//! - bandwidth: `tc` tbf on A's egress, so it shapes registry → node (pulls);
//! - loss: an iptables `statistic` drop of forwarded packets registry → node;
//! - delay: half the round trip each way, by a [`DelayLine`] on an NFQUEUE that every forwarded
//!   packet goes through. (`tc netem` would do it, but kernels built without `sch_netem`, like
//!   this project's CI, lack it.)
//!
//! The shaping sits in a namespace of its own because a packet held on its sender's way out
//! still counts against the sending socket's TCP Small Queues budget, which then throttles the
//! sender to a few packets per delay (netem avoids it by orphaning the packet; a queue cannot).
//! Forwarded packets belong to no socket.
//!
//! GSO is off at the registry's end (`gso_max_segs 1`): a dropped packet is one MTU-sized
//! segment, as on a real link, not a 64 KiB super-packet.
//!
//! `docker-registry` serves plain HTTP on `IP:5000` inside its namespace; a test can stop it
//! (connections are then refused at the same address) and start it again (its storage kept).
//! Images are pushed from a thread inside that namespace, which reaches the registry without
//! crossing the link: pushing costs no shaped time and leaves the link's byte counters alone.
// Real processes, polled on the real clock (no tokio here).
#![allow(clippy::disallowed_types)]

use std::{
    fs::{self, File, OpenOptions},
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use super::{
    delay_line::{self, DelayLine},
    oci_image,
    process::{in_ci, require_tool},
    registry_push,
    stack::LocalStack,
};

/// The registry's port in its namespace.
const PORT: u16 = 5000;
/// The range the rigs' /29s come from.
const RANGE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 0);
const RANGE_BITS: u32 = 16;
/// The NFQUEUE number of the delay line, in the wire's namespace.
const QUEUE: u16 = 0;
/// Held while a rig picks its addresses and makes its link, so that two rigs made at once (tests
/// in parallel processes) never take the same /29.
const LOCK: &str = "/run/lock/cri-imaged-netrig.lock";
/// How long the registry may take to answer `GET /v2/` after it is started.
const REGISTRY_START: Duration = Duration::from_secs(15);

/// How the link is shaped; the default is unshaped.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LinkShape {
    /// Bandwidth registry → node, in Mbit/s (10^6 bits); `None`: the veth's own speed.
    pub mbit: Option<f64>,
    /// Round-trip time added (half each way).
    pub rtt: Duration,
    /// Packets registry → node dropped, in percent.
    pub loss_percent: f64,
}

impl LinkShape {
    /// `mbit` Mbit/s, `rtt_ms` ms round trip, `loss_percent` % loss.
    pub fn new(mbit: f64, rtt_ms: u64, loss_percent: f64) -> Self {
        Self { mbit: Some(mbit), rtt: Duration::from_millis(rtt_ms), loss_percent }
    }

    /// The time `bytes` take at this bandwidth alone (zero when unshaped).
    pub fn transfer_time(&self, bytes: u64) -> Duration {
        self.mbit.map_or(Duration::ZERO, |mbit| Duration::from_secs_f64(bytes as f64 * 8.0 / (mbit * 1e6)))
    }
}

/// A running rig; everything it made is removed when it is dropped.
pub struct NetRig {
    /// The registry's network namespace, `crimg-PID-N`.
    pub netns: String,
    /// The wire's network namespace, `crimg-PID-N-wire`.
    pub wire: String,
    /// The link's end in the root namespace; its `rx_bytes` are the bytes registry → node.
    pub host_if: String,
    /// The registry's address on the link.
    pub registry_ip: Ipv4Addr,
    pub shape: LinkShape,
    dir: tempfile::TempDir,
    registry: Mutex<Option<Child>>,
    delay: Option<DelayLine>,
}

impl NetRig {
    /// Makes the rig and starts its registry. Outside CI returns `None` (saying why) when this
    /// machine cannot: not root, or `ip`, `tc`, `iptables` or `docker-registry` missing. As root, anything that fails to be made fails the test.
    pub fn start(shape: LinkShape) -> Option<Self> {
        for tool in ["ip", "tc", "iptables", "docker-registry"] {
            require_tool(tool)?;
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(!in_ci(), "the network rig needs root in CI");
            eprintln!("SKIPPED: the network rig needs root (outside CI)");
            return None;
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let (pid, n) = (std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let netns = format!("crimg-{pid}-{n}");
        let wire = format!("{netns}-wire");
        // Interface names hold 15 bytes at most.
        let name = |end: &str| format!("crg{pid}-{n}{end}");
        let (host_if, wire_a, wire_b, registry_if) = (name("h"), name("a"), name("b"), name("r"));
        let dir = tempfile::Builder::new().prefix("cri-netrig").tempdir_in("/tmp").expect("the rig's directory");
        let mut rig = Self {
            netns: netns.clone(),
            wire: wire.clone(),
            host_if: host_if.clone(),
            registry_ip: Ipv4Addr::UNSPECIFIED,
            shape,
            dir,
            registry: Mutex::new(None),
            delay: None,
        };
        let in_ns = |ns: &str, args: &[&str]| run("ip", &[&["netns", "exec", ns], args].concat());
        let network = {
            let _lock = Lock::take();
            remove_stale_rigs();
            let network = free_subnet();
            run("ip", &["netns", "add", &netns]);
            run("ip", &["netns", "add", &wire]);
            run("ip", &["link", "add", &host_if, "type", "veth", "peer", "name", &wire_a, "netns", &wire]);
            run("ip", &["addr", "add", &format!("{}/30", network.host), "dev", &host_if]);
            run("ip", &["link", "set", &host_if, "up"]);
            run("ip", &["route", "add", &format!("{}/30", network.registry_net), "via", &network.wire_a.to_string()]);
            network
        };
        rig.registry_ip = network.registry;
        in_ns(&wire, &["ip", "link", "add", &wire_b, "type", "veth", "peer", "name", &registry_if, "netns", &netns]);
        in_ns(&wire, &["ip", "addr", "add", &format!("{}/30", network.wire_a), "dev", &wire_a]);
        in_ns(&wire, &["ip", "addr", "add", &format!("{}/30", network.wire_b), "dev", &wire_b]);
        for end in [&wire_a, &wire_b] {
            in_ns(&wire, &["ip", "link", "set", end, "up"]);
        }
        in_ns(&wire, &["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]);
        in_ns(&netns, &["ip", "addr", "add", &format!("{}/30", network.registry), "dev", &registry_if]);
        in_ns(&netns, &["ip", "link", "set", &registry_if, "gso_max_segs", "1", "up"]);
        in_ns(&netns, &["ip", "link", "set", "lo", "up"]);
        in_ns(&netns, &["ip", "route", "add", "default", "via", &network.wire_b.to_string()]);
        if let Some(mbit) = shape.mbit {
            let rate = format!("{}kbit", (mbit * 1000.0).round() as u64);
            // A burst of 10 ms at the rate (at least 32 KiB), a queue of 100 ms.
            let burst = ((mbit * 1e6 / 8.0 / 100.0) as u64).max(32 * 1024).to_string();
            let tbf = ["rate", &rate, "burst", &burst, "latency", "100ms"];
            in_ns(&wire, &[&["tc", "qdisc", "add", "dev", &wire_a, "root", "tbf"], &tbf[..]].concat());
        }
        if shape.loss_percent > 0.0 {
            let probability = format!("{}", shape.loss_percent / 100.0);
            let lose =
                ["-i", &wire_b, "-m", "statistic", "--mode", "random", "--probability", &probability, "-j", "DROP"];
            in_ns(&wire, &[&["iptables", "-A", "FORWARD"], &lose[..]].concat());
        }
        if !shape.rtt.is_zero() {
            let line = DelayLine::start(&wire, QUEUE, shape.rtt / 2)
                .unwrap_or_else(|error| panic!("the delay line in {wire}: {error}"));
            rig.delay = Some(line);
            in_ns(&wire, &["iptables", "-A", "FORWARD", "-j", "NFQUEUE", "--queue-num", &QUEUE.to_string()]);
        }
        fs::create_dir_all(rig.dir.path().join("data")).expect("the registry's storage");
        fs::write(rig.config(), rig.registry_config()).expect("the registry's config");
        rig.start_registry();
        Some(rig)
    }

    /// `IP:PORT` of the registry, as image names and containerd's certs.d use it.
    pub fn registry(&self) -> String {
        format!("{}:{PORT}", self.registry_ip)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((self.registry_ip, PORT))
    }

    /// `IP:PORT/name`.
    pub fn image(&self, name: &str) -> String {
        format!("{}/{name}", self.registry())
    }

    /// The registry's log (its access log included); kept across stops and starts.
    pub fn registry_log(&self) -> PathBuf {
        self.dir.path().join("registry.log")
    }

    /// Makes the containerd of `stack` pull from this rig's registry over plain HTTP.
    pub fn route(&self, stack: &LocalStack) {
        stack.route_host(&self.registry());
    }

    /// Bytes that came over the link from the registry's side so far (the node end's `rx_bytes`:
    /// frames, headers included).
    pub fn bytes_to_node(&self) -> u64 {
        let path = format!("/sys/class/net/{}/statistics/rx_bytes", self.host_if);
        let text = fs::read_to_string(&path).unwrap_or_else(|error| panic!("{path}: {error}"));
        text.trim().parse().unwrap_or_else(|_| panic!("{path} holds {text:?}"))
    }

    /// Packets the delay line has held and let through so far (0 without delay).
    pub fn delayed_packets(&self) -> u64 {
        self.delay.as_ref().map_or(0, DelayLine::delayed)
    }

    /// Starts the registry (again), with the same storage and address; returns once it answers
    /// `GET /v2/` across the link. Panics if it is running.
    pub fn start_registry(&self) {
        let mut registry = self.registry.lock().expect("registry lock");
        assert!(registry.is_none(), "the registry of {} is running already", self.netns);
        let log = OpenOptions::new().create(true).append(true).open(self.registry_log()).expect("the registry's log");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.netns, "docker-registry", "serve"])
            .arg(self.config())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log, twice"))
            .stderr(log)
            .spawn()
            .expect("ip netns exec docker-registry starts");
        *registry = Some(child);
        let started = std::time::Instant::now();
        while !registry_answers(self.addr()) {
            if let Some(Some(status)) = registry.as_mut().map(|child| child.try_wait().ok().flatten()) {
                panic!("the registry of {} exited ({status}): {}", self.netns, self.log_tail());
            }
            assert!(
                started.elapsed() < REGISTRY_START,
                "the registry of {} did not answer: {}",
                self.netns,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the registry (SIGKILL, as a crash would) and waits for it; from then on, connections
    /// to [`NetRig::registry`] are refused. Panics if it is not running.
    pub fn stop_registry(&self) {
        let mut child = self.registry.lock().expect("registry lock").take().expect("the registry is running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Pushes `name:tag` to the registry: `bytes` in `layers` uncompressed layers of zeros (see
    /// `support::oci_image`), distinct from every other image; returns its manifest digest. The
    /// push runs inside the namespace and never crosses the link.
    pub fn push_image(&self, name_and_tag: &str, bytes: u64, layers: usize) -> String {
        static PUSHED: AtomicU32 = AtomicU32::new(0);
        let (repository, tag) = name_and_tag.rsplit_once(':').expect("NAME:TAG");
        let label = format!("{} {name_and_tag} {}", self.netns, PUSHED.fetch_add(1, Ordering::Relaxed));
        let image = oci_image::Image::new(&label, bytes, layers);
        let (netns, addr) = (self.netns.as_str(), self.addr());
        let pushed = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let namespace = File::open(format!("/run/netns/{netns}"))?;
                    delay_line::enter(&namespace)?;
                    registry_push::push(addr, repository, tag, &image)
                })
                .join()
                .expect("the push thread")
        });
        let digest = pushed.unwrap_or_else(|error| panic!("push {name_and_tag} to {}: {error}", self.netns));
        assert_eq!(digest, image.manifest.1, "the registry stored the manifest as built");
        digest
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("registry.yml")
    }

    fn registry_config(&self) -> String {
        let data = self.dir.path().join("data");
        format!(
            "version: 0.1\nlog:\n  level: info\n  formatter: text\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: {}\n",
            data.display(),
            self.registry()
        )
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.registry_log()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for NetRig {
    fn drop(&mut self) {
        if let Some(mut child) = self.registry.lock().map(|mut registry| registry.take()).unwrap_or_default() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The delay line's thread is in the namespace: it ends first, so the namespace can go.
        self.delay = None;
        remove_rig(&self.netns);
        remove_rig(&self.wire);
        let _ = Command::new("ip").args(["link", "del", &self.host_if]).stderr(Stdio::null()).status();
    }
}

/// Whether `GET /v2/` at `addr` answers 200 within a second.
fn registry_answers(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let request = format!("GET /v2/ HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = [0u8; 12];
    stream.read_exact(&mut answer).is_ok() && answer.starts_with(b"HTTP/1.1 200")
}

/// Runs `program args`; panics with its output if it fails.
fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().unwrap_or_else(|error| panic!("{program}: {error}"));
    assert!(
        output.status.success(),
        "{program} {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Kills whatever runs in the namespace `netns` and deletes it (its veth pair goes with it).
fn remove_rig(netns: &str) {
    if let Ok(output) = Command::new("ip").args(["netns", "pids", netns]).output() {
        for pid in String::from_utf8_lossy(&output.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
    }
    let _ = Command::new("ip").args(["netns", "del", netns]).stderr(Stdio::null()).status();
}

/// Removes the rigs of processes that are gone (a test killed before its rig was dropped).
fn remove_stale_rigs() {
    let list = run("ip", &["netns", "list"]);
    for netns in list.lines().filter_map(|line| line.split_whitespace().next()) {
        let Some(pid) = netns.strip_prefix("crimg-").and_then(|rest| rest.split('-').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !Path::new(&format!("/proc/{pid}")).exists() {
            remove_rig(netns);
        }
    }
}

/// The addresses of one rig: a /29 cut in two /30s.
struct Network {
    host: Ipv4Addr,
    wire_a: Ipv4Addr,
    registry_net: Ipv4Addr,
    wire_b: Ipv4Addr,
    registry: Ipv4Addr,
}

/// A /29 of [`RANGE`] that no route covers (the default route aside) and no address is in.
fn free_subnet() -> Network {
    let routes = run("ip", &["-4", "route", "show", "table", "all"]);
    let addresses = run("ip", &["-4", "-o", "addr", "show"]);
    let taken: Vec<(u32, u32)> = routes
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let first = words.next()?;
            // Routes of the local table begin with their type.
            let types = ["local", "broadcast", "unicast", "multicast", "anycast"];
            let prefix = if types.contains(&first) { words.next()? } else { first };
            (prefix != "default").then(|| parse_prefix(prefix)).flatten()
        })
        .chain(addresses.lines().filter_map(|line| {
            let mut words = line.split_whitespace().skip_while(|word| *word != "inet");
            words.nth(1).and_then(parse_prefix)
        }))
        .collect();
    let base = u32::from(RANGE);
    let blocks = 1u32 << (32 - RANGE_BITS - 3);
    // Start somewhere of this process's own: parallel test processes rarely even look at the same /29.
    let start = std::process::id().wrapping_mul(2_654_435_761) % blocks;
    let network = (0..blocks)
        .map(|offset| base + ((start + offset) % blocks) * 8)
        .find(|network| !taken.iter().any(|&(other, bits)| overlaps((*network, 29), (other, bits))))
        .expect("a free /29 in 10.250.0.0/16");
    Network {
        host: Ipv4Addr::from(network + 1),
        wire_a: Ipv4Addr::from(network + 2),
        registry_net: Ipv4Addr::from(network + 4),
        wire_b: Ipv4Addr::from(network + 5),
        registry: Ipv4Addr::from(network + 6),
    }
}

/// `A.B.C.D/N` or `A.B.C.D` (a /32) as (network, bits).
fn parse_prefix(text: &str) -> Option<(u32, u32)> {
    let (address, bits) = text.split_once('/').unwrap_or((text, "32"));
    Some((u32::from(address.parse::<Ipv4Addr>().ok()?), bits.parse().ok().filter(|bits| *bits <= 32)?))
}

fn overlaps((a, a_bits): (u32, u32), (b, b_bits): (u32, u32)) -> bool {
    let bits = a_bits.min(b_bits);
    let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
    a & mask == b & mask
}

/// An exclusive lock on [`LOCK`], released when dropped (or when the process dies).
struct Lock(File);

impl Lock {
    fn take() -> Self {
        let file = OpenOptions::new().create(true).truncate(false).write(true).open(LOCK).expect("the rig lock file");
        // SAFETY: flock on a descriptor this process owns.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(locked, 0, "flock {LOCK}: {}", std::io::Error::last_os_error());
        Self(file)
    }
}
