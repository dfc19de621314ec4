//! Event fan-out: a herd for one absent image with many `WatchEvents` subscribers, against the
//! same herd with none, in alternating rounds on the stack. The subscribers either read every
//! event (the worst case) or each watches one pod of the herd, as a node agent does. Those
//! reading every event either read as events come, or hold their streams open and read once the
//! herd is answered: the daemon sends them everything during the herd all the same (their
//! connections take it in), but their decoding of 200,000 messages is out of the herd's time.
//!
//! The subscribers are other programs on the node than the herd's caller (the kubelet): they run
//! on a runtime of their own whose threads are in the idle scheduling class, so that the herd's
//! callers do not queue behind them on one executor. Idle-class threads still take the cores'
//! spare time, and on a 2-core machine that costs the herd too; a control side measures how much:
//! the same readers decode the same messages (recorded by a subscriber in the warm-up) with no
//! watch at all, so the daemon does nothing for them.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    time::{Duration, Instant},
};

use cri_imaged::cri::{ImageSpec, RemoveImageRequest, image_service_client::ImageServiceClient};
use cri_imaged::{
    api::{Event as WatchedEvent, PullPolicy, WatchEventsRequest, image_manager_client::ImageManagerClient},
    events::reason,
};
use prost::Message;
use tokio::{runtime::Runtime, task::JoinHandle};

use crate::{
    Bench, Daemon, Findings, ensure, ensure_herd, ensure_request,
    progress::containerd_pid,
    report::{self, Table, Verdict},
    support::unix_channel,
};

/// The herd's wall time with the subscribers over that without (medians), at most.
const RATIO_TARGET: f64 = 1.10;
/// How long the subscribers may take to read the last event after the herd's answers.
const DELIVERY_LIMIT: Duration = Duration::from_secs(60);

/// The section's sizes: the herd section's largest herd; subscribers; rounds of each side.
struct Shape {
    herd: usize,
    subscribers: usize,
    /// Rounds rotate through the sides, then back in reverse order.
    pairs: usize,
}

/// Who watches a round's herd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watchers {
    None,
    /// Each subscriber reads every event as it comes.
    EveryEvent(usize),
    /// Each subscriber is sent every event as it comes, and reads them once the herd is answered.
    EveryEventAfterHerd(usize),
    /// Subscriber `i` watches the herd's pod `i` only.
    OnePodEach(usize),
    /// No watch: as many readers decode the warm-up's recorded events during the herd.
    DecodingAlone(usize),
    /// One subscriber reads every event and keeps each message's bytes (the warm-up).
    Recorder,
}

impl Watchers {
    fn count(self) -> usize {
        match self {
            Self::None | Self::DecodingAlone(_) => 0,
            Self::Recorder => 1,
            Self::EveryEvent(n) | Self::EveryEventAfterHerd(n) | Self::OnePodEach(n) => n,
        }
    }

    fn label(self) -> String {
        match self {
            Self::None => "none".to_owned(),
            Self::EveryEvent(n) => format!("{n} reading every event"),
            Self::EveryEventAfterHerd(n) => format!("{n} reading every event after the herd"),
            Self::OnePodEach(n) => format!("{n} watching one pod each"),
            Self::DecodingAlone(n) => format!("{n} decoding every event, not watching (control)"),
            Self::Recorder => "one recording every event".to_owned(),
        }
    }
}

/// One side's round.
struct Round {
    wall: Duration,
    /// From the herd's start until every subscriber had read the round's last event.
    delivered: Option<Duration>,
    upstream_pulls: f64,
    /// CPU time of the daemon and of this process (the herd's callers and the subscribers),
    /// from the herd's start until every event was read.
    daemon_cpu: Duration,
    bench_cpu: Duration,
    tallies: Vec<Tally>,
}

/// What one subscriber read during a round, the round's closing marker left out.
#[derive(Debug, Default)]
struct Tally {
    /// Events read, by reason (`Lagged` included).
    by_reason: BTreeMap<String, usize>,
    /// The events `Lagged` events said went by unread.
    dropped: u64,
    /// Each event's message, encoded again, for a `Recorder`.
    recorded: Vec<Vec<u8>>,
}

impl Tally {
    /// Events read, `Lagged` ones left out.
    fn events(&self) -> usize {
        self.by_reason.iter().filter(|(reason, _)| *reason != reason::LAGGED).map(|(_, count)| count).sum()
    }

    fn of(&self, reason: &str) -> usize {
        self.by_reason.get(reason).copied().unwrap_or(0)
    }

    fn count(&mut self, event: &WatchedEvent) {
        self.dropped += event.dropped;
        *self.by_reason.entry(event.reason.clone()).or_default() += 1;
    }
}

/// What a round needs besides who watches: the same for every round.
struct Stage<'a> {
    bench: &'a Bench,
    daemon: &'a Daemon,
    socket: PathBuf,
    image: String,
    shape: Shape,
    /// The subscribers' runtime.
    readers: Runtime,
    /// containerd's and the daemon's process ids: a round starts once they are idle.
    quiet: [String; 2],
}

/// The section: alternating herds without and with subscribers, on a daemon of its own.
pub async fn run(bench: &Bench, findings: &mut Findings) {
    let full = bench.sizes.pairs > 1;
    let shape = Shape {
        herd: bench.sizes.herds.last().copied().unwrap_or(20),
        subscribers: if full { 100 } else { 5 },
        pairs: if full { 20 } else { 1 },
    };
    progress!(
        "event fan-out: herds of {} with 0 and {} subscribers, {} rounds each",
        shape.herd,
        shape.subscribers,
        shape.pairs
    );
    let name = "bench/events:v1";
    bench.stack.seed(name, "event fan-out");
    let image = bench.stack.image(name);
    let daemon = Daemon::start(bench, "events", &[]).await;
    let socket = bench.work.path().join("events.sock");
    let quiet = [containerd_pid(bench), daemon.pid().to_string()];
    let stage = Stage { bench, daemon: &daemon, socket, image, shape, readers: idle_runtime(), quiet };
    // Connections, the first pull's set-up: not counted.
    let mut warm_up = stage.round(Watchers::Recorder, "warm-up", &[]).await;
    let recorded = warm_up.tallies.pop().map(|tally| tally.recorded).unwrap_or_default();
    assert!(recorded.len() >= stage.shape.herd, "the warm-up's subscriber recorded the herd's events");
    let subscribers = stage.shape.subscribers;
    let sides = [
        Watchers::None,
        Watchers::EveryEvent(subscribers),
        Watchers::EveryEventAfterHerd(subscribers),
        Watchers::OnePodEach(subscribers),
        Watchers::DecodingAlone(subscribers),
    ];
    let mut rounds: Vec<Vec<Round>> = sides.iter().map(|_| Vec::new()).collect();
    for round in 0..stage.shape.pairs * sides.len() {
        // A, B, C, D, D, C, B, A, ...: each side as often early as late.
        let step = round % (2 * sides.len());
        let side = if step < sides.len() { step } else { 2 * sides.len() - 1 - step };
        rounds[side].push(stage.round(sides[side], &round.to_string(), &recorded).await);
    }
    let Stage { shape, readers, .. } = stage;
    readers.shutdown_background();
    report(&shape, &sides, &rounds, findings);
}

/// The subscribers' runtime: two threads in the idle scheduling class (`SCHED_IDLE`), which run
/// when nothing else wants the cores.
fn idle_runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("idle-subscriber")
        .on_thread_start(|| {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: sets the calling thread's policy; `param` outlives the call.
            let set = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
            assert_eq!(set, 0, "SCHED_IDLE for a subscriber thread: {}", std::io::Error::last_os_error());
        })
        .enable_all()
        .build()
        .expect("the subscribers' runtime")
}

impl Stage<'_> {
    /// Removes the image on containerd, waits until cri-imaged answers it absent, opens the
    /// watches on the readers' runtime, then `shape.herd` pods ask for it at once. `recorded`
    /// is what a `DecodingAlone` side decodes.
    async fn round(&self, watching: Watchers, round: &str, recorded: &[Vec<u8>]) -> Round {
        let Self { bench, daemon, socket, image, shape, readers, quiet } = self;
        remove(bench, daemon, image, round).await;
        quiesce(quiet).await;
        let marker = format!("events-{round}-marker");
        let mut watchers = Vec::with_capacity(watching.count());
        let (answered, herd_answered) = tokio::sync::watch::channel(false);
        for index in 0..watching.count() {
            let pod = match watching {
                Watchers::OnePodEach(_) => Some(format!("events-{round}-{index}")),
                _ => None,
            };
            let read_from = matches!(watching, Watchers::EveryEventAfterHerd(_)).then(|| herd_answered.clone());
            let record = watching == Watchers::Recorder;
            let subscribed = readers.spawn(subscribe(socket.clone(), marker.clone(), pod, read_from, record));
            watchers.push(subscribed.await.expect("a subscriber's set-up"));
        }
        let pulls_before = daemon.metric("cri_imaged_pulls_total");
        let cpu_before = (cpu_time(&daemon.pid().to_string()), cpu_time("self"));
        let started = Instant::now();
        let decoders = match watching {
            Watchers::DecodingAlone(readers_count) => decode_alone(readers, recorded, readers_count),
            _ => Vec::new(),
        };
        let herd = ensure_herd(&daemon.client, image, shape.herd, &format!("events-{round}")).await;
        assert!(herd.errors.is_empty(), "events herd {round}: {} errors, first: {}", herd.errors.len(), herd.errors[0]);
        let upstream_pulls = daemon.metric("cri_imaged_pulls_total") - pulls_before;
        assert!(upstream_pulls >= 1.0, "events herd {round}: the image was pulled, not found present");
        answered.send_replace(true);
        // The image is present now: one more pod's answer is an event after every one of the herd's.
        ensure(&daemon.client, image, &marker).await.expect("the marker's answer");
        let mut tallies = Vec::with_capacity(watching.count());
        for watcher in watchers {
            let tally = tokio::time::timeout(DELIVERY_LIMIT, watcher).await;
            let tally = tally
                .unwrap_or_else(|_| panic!("events herd {round}: a subscriber's events within {DELIVERY_LIMIT:?}"));
            tallies.push(tally.expect("a subscriber panicked"));
        }
        for decoder in decoders {
            tallies.extend(decoder.await.expect("a decoder panicked"));
        }
        let delivered = (!tallies.is_empty()).then(|| started.elapsed());
        let daemon_cpu = cpu_time(&daemon.pid().to_string()) - cpu_before.0;
        let bench_cpu = cpu_time("self") - cpu_before.1;
        Round { wall: herd.wall, delivered, upstream_pulls, daemon_cpu, bench_cpu, tallies }
    }
}

/// Waits until `pids` have used no CPU for 100 ms (containerd collects the removed image's
/// content and snapshots after the removal is answered), at most 3 s.
async fn quiesce(pids: &[String]) {
    let used = || pids.iter().map(|pid| cpu_time(pid)).sum::<Duration>();
    for _ in 0..30 {
        let before = used();
        tokio::time::sleep(Duration::from_millis(100)).await;
        if used() == before {
            return;
        }
    }
}

/// `readers` tasks on the readers' runtime, between them decoding `recorded` once per reader and
/// yielding between passes, as watchers would decode what they read: a tally for each reader.
fn decode_alone(readers: &Runtime, recorded: &[Vec<u8>], reader_count: usize) -> Vec<JoinHandle<Vec<Tally>>> {
    let recorded = std::sync::Arc::new(recorded.to_vec());
    // One task for each of the runtime's threads.
    let tasks = 2;
    (0..tasks)
        .map(|task| {
            let recorded = recorded.clone();
            let passes = (task..reader_count).step_by(tasks).count();
            readers.spawn(async move {
                let mut tallies = Vec::with_capacity(passes);
                for _ in 0..passes {
                    let mut tally = Tally::default();
                    for message in recorded.iter() {
                        tally.count(&WatchedEvent::decode(message.as_slice()).expect("a recorded event decodes"));
                    }
                    tallies.push(tally);
                    tokio::task::yield_now().await;
                }
                tallies
            })
        })
        .collect()
}

/// Removes `image` on containerd directly; then asks cri-imaged with policy Never until it
/// answers absent (its presence cache learns of the removal from containerd's events).
async fn remove(bench: &Bench, daemon: &Daemon, image: &str, round: &str) {
    let mut containerd = ImageServiceClient::new(unix_channel(&bench.stack.containerd_socket));
    let spec = ImageSpec { image: image.to_owned(), ..Default::default() };
    containerd.remove_image(RemoveImageRequest { image: Some(spec) }).await.expect("containerd removes");
    let mut client = daemon.client.clone();
    for _ in 0..1000 {
        let mut never = ensure_request(image, &format!("events-{round}-absent"));
        never.pull_policy = PullPolicy::Never as i32;
        if client.ensure_image_exists(never).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("cri-imaged still calls {image} present after its removal");
}

/// A `WatchEvents` on a connection of its own, subscribed once this returns: with an empty
/// filter, read until `marker`'s event; for one `pod`, until its pod's `Pulled`. Reads as the
/// events come, or from when `read_from` turns true if given, and keeps each message's bytes if
/// `record`. Runs on the runtime it is spawned on, with its connection's tasks.
async fn subscribe(
    socket: PathBuf,
    marker: String,
    pod: Option<String>,
    read_from: Option<tokio::sync::watch::Receiver<bool>>,
    record: bool,
) -> JoinHandle<Tally> {
    let mut client = ImageManagerClient::new(unix_channel(&socket));
    let request = WatchEventsRequest { pod_uid: pod.clone().unwrap_or_default(), ..Default::default() };
    let mut events = client.watch_events(request).await.expect("watching events").into_inner();
    tokio::spawn(async move {
        let _client = client;
        let mut tally = Tally::default();
        if let Some(mut read_from) = read_from {
            read_from.wait_for(|go| *go).await.expect("the herd's round");
        }
        while let Some(event) = events.message().await.expect("the event stream") {
            if event.pod.as_ref().is_some_and(|pod| pod.uid == marker) {
                return tally;
            }
            tally.count(&event);
            if record {
                tally.recorded.push(event.encode_to_vec());
            }
            if pod.is_some() && event.reason == reason::PULLED {
                return tally;
            }
        }
        panic!("the event stream ended before the marker");
    })
}

/// User and system CPU time of process `pid` (or `self`) so far, from `/proc/PID/stat` (in
/// USER_HZ ticks, 100 a second on Linux).
pub fn cpu_time(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // The fields after the command name, which is in parentheses and may hold spaces.
    let (_, fields) = stat.rsplit_once(") ").expect("a /proc/PID/stat line");
    let ticks: u64 = fields.split(' ').skip(11).take(2).map(|field| field.parse::<u64>().expect("a tick count")).sum();
    Duration::from_millis(ticks * 10)
}

/// The median of `times` (the mean of the middle two for an even count).
pub fn median(mut times: Vec<Duration>) -> Duration {
    times.sort_unstable();
    let middle = times.len() / 2;
    if times.len().is_multiple_of(2) { (times[middle - 1] + times[middle]) / 2 } else { times[middle] }
}

/// The herds' table and the subscribers' tables, and the verdicts.
fn report(shape: &Shape, sides: &[Watchers], rounds: &[Vec<Round>], findings: &mut Findings) {
    let none = &rounds[0];
    let baseline = median(none.iter().map(|round| round.wall).collect());
    let mut herds = Table::new(
        format!(
            "Event fan-out: a herd of {} for one absent image, without and with {} WatchEvents subscribers (rounds rotating)",
            shape.herd, shape.subscribers
        ),
        &[
            "subscribers",
            "herds",
            "herd wall time (median)",
            "min – max",
            "median / none",
            "upstream pulls",
            "daemon CPU (median)",
            "load generator CPU (median)",
        ],
    );
    for (side, rounds) in sides.iter().zip(rounds) {
        let walls: Vec<Duration> = rounds.iter().map(|round| round.wall).collect();
        let (least, most) =
            (walls.iter().min().copied().unwrap_or_default(), walls.iter().max().copied().unwrap_or_default());
        herds.row(vec![
            side.label(),
            rounds.len().to_string(),
            report::duration(median(walls.clone())),
            format!("{} – {}", report::duration(least), report::duration(most)),
            report::ratio(median(walls).as_secs_f64(), baseline.as_secs_f64()),
            rounds.iter().map(|round| round.upstream_pulls).sum::<f64>().to_string(),
            report::duration(median(rounds.iter().map(|round| round.daemon_cpu).collect())),
            report::duration(median(rounds.iter().map(|round| round.bench_cpu).collect())),
        ]);
    }
    findings.tables.push(herds);
    let baseline_cpu = median(none.iter().map(|round| round.daemon_cpu).collect());
    for (side, subscribed) in sides.iter().zip(rounds).skip(1) {
        findings.tables.push(subscribers_table(shape, *side, subscribed, baseline_cpu));
        // The control is the readers' own cost on these cores: the daemon does nothing for it.
        if matches!(side, Watchers::DecodingAlone(_)) {
            continue;
        }
        let watched = median(subscribed.iter().map(|round| round.wall).collect());
        let ratio = watched.as_secs_f64() / baseline.as_secs_f64();
        findings.verdicts.push(Verdict {
            what: format!(
                "herd of {} wall time with {} (WatchEvents) / without (median of {} each)",
                shape.herd,
                side.label(),
                subscribed.len()
            ),
            target: format!("≤ {RATIO_TARGET:.2}"),
            measured: format!("{ratio:.2} ({} vs {})", report::duration(watched), report::duration(baseline)),
            met: ratio <= RATIO_TARGET,
        });
    }
}

/// What each subscriber read in a herd, by reason, how long until all of them had read it, and
/// the daemon's CPU for each event read (beyond `baseline_cpu`, its median without subscribers).
fn subscribers_table(shape: &Shape, side: Watchers, subscribed: &[Round], baseline_cpu: Duration) -> Table {
    let tallies: Vec<&Tally> = subscribed.iter().flat_map(|round| &round.tallies).collect();
    let span = |counts: Vec<usize>| {
        let (least, most) = (counts.iter().min().copied().unwrap_or(0), counts.iter().max().copied().unwrap_or(0));
        vec![least.to_string(), most.to_string()]
    };
    let mut table = Table::new(
        format!(
            "Event fan-out: what each of {} read of a herd of {} ({} herds)",
            side.label(),
            shape.herd,
            subscribed.len()
        ),
        &["measure", "min", "max"],
    );
    let mut row = |measure: String, cells: Vec<String>| table.row([vec![measure], cells].concat());
    row("events per subscriber".into(), span(tallies.iter().map(|tally| tally.events()).collect()));
    let reasons: BTreeSet<&String> = tallies.iter().flat_map(|tally| tally.by_reason.keys()).collect();
    for reason in reasons {
        row(format!("of which {reason}"), span(tallies.iter().map(|tally| tally.of(reason)).collect()));
    }
    let dropped: Vec<usize> = tallies.iter().map(|tally| tally.dropped as usize).collect();
    row("dropped, as Lagged events told".into(), span(dropped));
    let delivered: Vec<Duration> = subscribed.iter().filter_map(|round| round.delivered).collect();
    let (least, most) =
        (delivered.iter().min().copied().unwrap_or_default(), delivered.iter().max().copied().unwrap_or_default());
    row(
        "every event read by every subscriber, from the herd's start".into(),
        vec![report::duration(least), report::duration(most)],
    );
    // A pod's two events each: the daemon's CPU over so few says nothing of a delivery's cost.
    if matches!(side, Watchers::EveryEvent(_) | Watchers::EveryEventAfterHerd(_)) {
        // CPU is counted in 10 ms ticks: over a round's thousands of deliveries, a fair figure.
        let per_delivery: Vec<f64> = subscribed
            .iter()
            .map(|round| {
                let read: usize = round.tallies.iter().map(Tally::events).sum();
                round.daemon_cpu.saturating_sub(baseline_cpu).as_secs_f64() * 1e6 / read.max(1) as f64
            })
            .collect();
        let least = per_delivery.iter().copied().fold(f64::INFINITY, f64::min);
        let most = per_delivery.iter().copied().fold(0.0, f64::max);
        row("daemon CPU per event read, beyond none's (µs)".into(), vec![format!("{least:.2}"), format!("{most:.2}")]);
    }
    table
}
