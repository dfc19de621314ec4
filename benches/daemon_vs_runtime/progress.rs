//! Pull progress polling: what watching a pull's downloads on containerd's content service
//! (`--pull-progress`) costs containerd and the daemon, in alternating rounds of a throttled pull
//! with it off and on.

use std::{
    future::Future,
    io::Write,
    net::SocketAddr,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime},
};

use cri_imaged::cri::{ImageSpec, RemoveImageRequest, image_service_client::ImageServiceClient};
use cri_imaged::{api::WatchEventsRequest, events::reason, pull::progress::manifest_layers, runtime::ContentStore};
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

use crate::{
    Bench, Daemon, Findings, ensure,
    events::{cpu_time, median},
    report::{self, Table, Verdict},
    support::{process::require_tool, throttle::ThrottleProxy, unix_channel},
};

const MIB: u64 = 1 << 20;
/// The proxy's rate, which the pull's layer comes through: a 16 MiB image takes about 4 s.
const RATE: u64 = 4 * MIB;
/// Extra containerd CPU time per second of pull with polling, at most, in milliseconds: 2 % of one core.
const EXTRA_CPU_TARGET_MS: f64 = 20.0;
/// The health probe's interval as shipped; the harness's 100 ms would add ten ImageFsInfo calls a
/// second to containerd's CPU on both sides.
const HEALTH_PROBE_INTERVAL: &str = "5s";
/// After the daemon serves, until its start-up calls to containerd (the first probe, the event
/// subscription) are over.
const SETTLE: Duration = Duration::from_millis(500);
/// The largest manifest read, as the poller reads it.
const MANIFEST_LIMIT: usize = 4 * 1024 * 1024;
/// How long the round's event subscriber may take to read the pull's outcome after the answer.
const OUTCOME_LIMIT: Duration = Duration::from_secs(10);

/// The section's sizes.
struct Shape {
    /// Random bytes in the image's one layer.
    bytes: u64,
    /// Rounds of each side, in ABBA order: off, on, on, off, ...
    rounds: usize,
}

/// One pull, measured from the request to its answer.
struct Round {
    wall: Duration,
    containerd_cpu: Duration,
    daemon_cpu: Duration,
    /// `PullProgress` events a subscriber to the image read.
    progress_events: usize,
}

impl Round {
    /// containerd's CPU time per second of the pull, in milliseconds.
    fn containerd_ms_per_second(&self) -> f64 {
        self.containerd_cpu.as_secs_f64() * 1000.0 / self.wall.as_secs_f64()
    }
}

/// The section: the image behind a throttling proxy, then pulls with polling off and on, each by a
/// daemon of its own on the same containerd.
pub async fn run(bench: &Bench, findings: &mut Findings) {
    let full = bench.sizes.pairs > 1;
    let shape = Shape { bytes: if full { 16 * MIB } else { 2 * MIB }, rounds: if full { 8 } else { 1 } };
    progress!(
        "pull progress polling: {} rounds each of a {} MiB pull at {} MiB/s, --pull-progress false and true",
        shape.rounds,
        shape.bytes / MIB,
        RATE / MIB
    );
    let (repository, name) = ("bench/progress", "bench/progress:v1");
    bench.stack.seed_sized(name, shape.bytes);
    let registry: SocketAddr = bench.stack.registry.parse().expect("the registry's address");
    let proxy = ThrottleProxy::start(registry, RATE).await;
    bench.stack.route_through(proxy.addr.port());
    let image = proxy.image(name);
    let containerd = containerd_pid(bench);
    // The first pulls through the proxy (containerd reads its hosts.toml, dials it): not counted.
    for polling in [false, true] {
        pull_round(bench, &proxy, &image, &containerd, polling, &shape, &format!("warm-up-{polling}")).await;
    }
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..shape.rounds * 2 {
        let polling = round % 4 == 1 || round % 4 == 2;
        let result = pull_round(bench, &proxy, &image, &containerd, polling, &shape, &round.to_string()).await;
        if polling { on.push(result) } else { off.push(result) }
    }
    report(&shape, &off, &on, findings);
    let (count, filler) = if full { (1000, 1000) } else { (100, 10) };
    let host = proxy.addr.ip().to_string();
    findings.tables.push(calls(bench, &containerd, &host, repository, count, filler).await);
}

/// containerd's process id, as `/proc` names it: the stack's only process named `containerd`.
pub fn containerd_pid(bench: &Bench) -> String {
    let found: Vec<u32> =
        bench.stack.processes().into_iter().filter(|(_, name)| name == "containerd").map(|(pid, _)| pid).collect();
    assert_eq!(found.len(), 1, "one containerd in the stack, found {found:?}");
    found[0].to_string()
}

/// Removes `image` on containerd (its content and snapshot go with it), starts a daemon with
/// `--pull-progress` set to `polling`, and has it pull `image` for one pod, measuring the CPU time of
/// containerd and of the daemon over the pull; then stops the daemon.
async fn pull_round(
    bench: &Bench,
    proxy: &ThrottleProxy,
    image: &str,
    containerd: &str,
    polling: bool,
    shape: &Shape,
    round: &str,
) -> Round {
    let mut runtime = ImageServiceClient::new(unix_channel(&bench.stack.containerd_socket));
    let spec = ImageSpec { image: image.to_owned(), ..Default::default() };
    runtime.remove_image(RemoveImageRequest { image: Some(spec) }).await.expect("containerd removes the image");
    let progress = format!("--pull-progress={polling}");
    let flags = [progress.as_str(), "--health-probe-interval", HEALTH_PROBE_INTERVAL];
    let daemon = Daemon::start(bench, &format!("progress-{round}"), &flags).await;
    let watcher = watch(&daemon, image).await;
    tokio::time::sleep(SETTLE).await;

    let forwarded = proxy.bytes_forwarded();
    let daemon_pid = daemon.pid().to_string();
    let before = (cpu_time(containerd), cpu_time(&daemon_pid));
    let started = Instant::now();
    let answer = ensure(&daemon.client, image, &format!("progress-{round}")).await;
    let wall = started.elapsed();
    let (containerd_cpu, daemon_cpu) = (cpu_time(containerd) - before.0, cpu_time(&daemon_pid) - before.1);
    let answer = answer.unwrap_or_else(|status| panic!("progress round {round}: the pull failed: {status:?}"));
    assert!(answer.pulled, "progress round {round}: the image was found present, not pulled");
    let downloaded = proxy.bytes_forwarded() - forwarded;
    assert!(downloaded >= shape.bytes, "progress round {round}: only {downloaded} bytes came through the proxy");

    let reasons = tokio::time::timeout(OUTCOME_LIMIT, watcher)
        .await
        .unwrap_or_else(|_| panic!("progress round {round}: the pull's outcome event within {OUTCOME_LIMIT:?}"))
        .expect("the subscriber panicked");
    let progress_events = reasons.iter().filter(|reason| *reason == reason::PULL_PROGRESS).count();
    if !polling {
        assert_eq!(progress_events, 0, "progress round {round}: progress events with --pull-progress=false");
    } else if shape.bytes >= 8 * MIB {
        // Seconds of download: a polling daemon must have seen it (small pulls may end first).
        assert!(progress_events > 0, "progress round {round}: no progress events with --pull-progress=true");
    }
    let (status, log) = daemon.process.terminate().await;
    assert!(status.success(), "progress round {round}: the daemon exited with {status}; log:\n{log}");
    Round { wall, containerd_cpu, daemon_cpu, progress_events }
}

/// A `WatchEvents` for `image`, subscribed once this returns: the reasons of its events until the
/// pull's outcome.
async fn watch(daemon: &Daemon, image: &str) -> JoinHandle<Vec<String>> {
    let mut client = daemon.client.clone();
    let request = WatchEventsRequest { image: image.to_owned(), ..Default::default() };
    let mut events = client.watch_events(request).await.expect("watching events").into_inner();
    tokio::spawn(async move {
        let _client = client;
        let mut reasons = Vec::new();
        while let Some(event) = events.message().await.expect("the event stream") {
            let outcome = event.reason == reason::PULLED || event.reason == reason::FAILED;
            reasons.push(event.reason);
            if outcome {
                return reasons;
            }
        }
        panic!("the event stream ended before the pull's outcome");
    })
}

/// One side's figures. CPU times are read in 10 ms ticks, so next to each median is the mean,
/// which the ticks' truncation does not bias.
struct Side {
    wall: Duration,
    /// Milliseconds of containerd CPU per pull: the median and the mean.
    containerd_ms: (f64, f64),
    /// Milliseconds of containerd CPU per second of pull: the median, the mean, the least and the most.
    ms_per_second: (f64, f64, f64, f64),
    /// Milliseconds of daemon CPU per pull: the median and the mean.
    daemon_ms: (f64, f64),
    progress_events: usize,
}

impl Side {
    fn of(rounds: &[Round]) -> Self {
        let per_second = stats(rounds.iter().map(Round::containerd_ms_per_second).collect());
        let mut events: Vec<usize> = rounds.iter().map(|round| round.progress_events).collect();
        events.sort_unstable();
        let containerd = stats(rounds.iter().map(|round| millis(round.containerd_cpu)).collect());
        let daemon = stats(rounds.iter().map(|round| millis(round.daemon_cpu)).collect());
        Self {
            wall: median(rounds.iter().map(|round| round.wall).collect()),
            containerd_ms: (containerd.0, containerd.1),
            ms_per_second: per_second,
            daemon_ms: (daemon.0, daemon.1),
            progress_events: events[events.len() / 2],
        }
    }
}

/// The median, the mean, the least and the most of `values` (not empty).
fn stats(mut values: Vec<f64>) -> (f64, f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    let median =
        if values.len().is_multiple_of(2) { (values[middle - 1] + values[middle]) / 2.0 } else { values[middle] };
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    (median, mean, values[0], values[values.len() - 1])
}

/// A median and a mean in `unit`, the mean in parentheses.
fn median_mean((median, mean): (f64, f64), unit: &str) -> String {
    format!("{median:.1} {unit} ({mean:.1})")
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// The table (both sides and their difference) and the verdict.
fn report(shape: &Shape, off: &[Round], on: &[Round], findings: &mut Findings) {
    let (without, with) = (Side::of(off), Side::of(on));
    let mut table = Table::new(
        format!(
            "Pull progress polling: EnsureImageExists of an absent {} MiB image through a {} MiB/s proxy, \
             --pull-progress false and true (a daemon of its own per pull, rounds alternating); CPU: median (mean)",
            shape.bytes / MIB,
            RATE / MIB
        ),
        &[
            "--pull-progress",
            "rounds",
            "pull wall time (median)",
            "containerd CPU per pull",
            "containerd CPU per second of pull",
            "min – max",
            "daemon CPU per pull",
            "PullProgress events (median)",
        ],
    );
    for (mode, rounds, side) in [("false", off, &without), ("true", on, &with)] {
        let (median, mean, least, most) = side.ms_per_second;
        table.row(vec![
            mode.into(),
            rounds.len().to_string(),
            report::duration(side.wall),
            median_mean(side.containerd_ms, "ms"),
            median_mean((median, mean), "ms/s"),
            format!("{least:.1} – {most:.1} ms/s"),
            median_mean(side.daemon_ms, "ms"),
            side.progress_events.to_string(),
        ]);
    }
    let difference = |with: (f64, f64), without: (f64, f64)| (with.0 - without.0, with.1 - without.1);
    let signed = |(median, mean): (f64, f64), unit: &str| format!("{median:+.1} {unit} ({mean:+.1})");
    let per_second = |side: &Side| (side.ms_per_second.0, side.ms_per_second.1);
    let extra = difference(per_second(&with), per_second(&without));
    table.row(vec![
        "true − false".into(),
        "-".into(),
        format!("{:+.1} ms", millis(with.wall) - millis(without.wall)),
        signed(difference(with.containerd_ms, without.containerd_ms), "ms"),
        signed(extra, "ms/s"),
        "-".into(),
        signed(difference(with.daemon_ms, without.daemon_ms), "ms"),
        "-".into(),
    ]);
    findings.tables.push(table);
    findings.verdicts.push(Verdict {
        what: format!("extra containerd CPU per second of pull with --pull-progress (medians of {})", on.len()),
        target: format!("≤ {EXTRA_CPU_TARGET_MS:.0} ms/s"),
        measured: format!(
            "{:.1} ms/s (ratio {}: {:.1} vs {:.1}; means {:+.1})",
            extra.0,
            report::ratio(with.ms_per_second.0, without.ms_per_second.0),
            with.ms_per_second.0,
            without.ms_per_second.0,
            extra.1
        ),
        met: extra.0 <= EXTRA_CPU_TARGET_MS,
    });
}

/// containerd's CPU time for each content-service call the poller makes, `count` back to back
/// from the bench with no pull under way (the image pulled: its manifest and layer stored); then
/// the calls whose cost may grow with the content store again, with `filler` more blobs in it.
async fn calls(bench: &Bench, containerd: &str, host: &str, repository: &str, count: usize, filler: usize) -> Table {
    let runtime = &bench.direct;
    let manifest = runtime.find_manifest(host, repository, SystemTime::UNIX_EPOCH).await.expect("List answers");
    let manifest = manifest.unwrap_or_else(|| panic!("no manifest of {host}/{repository} found in containerd"));
    let blob = runtime.read_blob(&manifest, MANIFEST_LIMIT).await.expect("the manifest is read");
    let layer = manifest_layers(&blob).and_then(|layers| layers.into_iter().next()).expect("a layer").digest;
    let mut table = Table::new(
        format!(
            "Pull progress polling, per call: containerd's CPU for each content-service call the poller makes \
             ({count} back to back from the bench, no pull under way)"
        ),
        &[
            "content store",
            "call",
            "the poller makes it",
            "containerd CPU per call",
            "wall per call",
            "at 4 calls a second",
        ],
    );
    let list_statuses = || async { runtime.list_ingests().await.map(drop) };
    let list = || async { runtime.find_manifest(host, repository, SystemTime::UNIX_EPOCH).await.map(drop) };
    let store = content_blobs(bench);
    let row = |table: &mut Table, store: &str, call: &str, when: &str, (cpu, wall): (Duration, Duration)| {
        let per_call = cpu / count as u32;
        table.row(vec![
            store.to_owned(),
            call.into(),
            when.into(),
            report::micros((per_call.as_nanos() / 1000) as u32),
            report::micros(((wall / count as u32).as_nanos() / 1000) as u32),
            format!("{:.2} ms/s", millis(per_call) * 4.0),
        ]);
    };
    // The two listings, whose cost may grow with the store: measured on it as it is, and full.
    macro_rules! listing_rows {
        ($store:expr) => {{
            let store = $store;
            let calls = time_calls(containerd, count, &list_statuses).await;
            row(&mut table, &store, "ListStatuses (every ingest)", "every 250 ms while a pull runs", calls);
            let calls = time_calls(containerd, count, &list).await;
            let when = "until the pull's manifest is found, while a download no pull accounts for runs";
            row(&mut table, &store, "List (the repository's manifests, by label)", when, calls);
        }};
    }
    listing_rows!(store.clone());
    let read = || async { runtime.read_blob(&manifest, MANIFEST_LIMIT).await.map(drop) };
    row(&mut table, &store, "Read (the manifest)", "once a pull", time_calls(containerd, count, &read).await);
    let info = || async { runtime.has_blob(&layer).await.map(drop) };
    let when = "once a layer when found, once when its download ends";
    row(&mut table, &store, "Info (a layer)", when, time_calls(containerd, count, &info).await);

    let Some(ctr_path) = require_tool("ctr") else { return table };
    progress!("pull progress polling: {filler} more blobs in containerd's content store");
    let added = fill_store(bench, &ctr_path, filler);
    listing_rows!(content_blobs(bench));
    empty_store(bench, &ctr_path, &added);
    table
}

/// containerd's CPU time and the wall time for `count` calls of `call`, one after another.
async fn time_calls<F, E>(containerd: &str, count: usize, call: &dyn Fn() -> F) -> (Duration, Duration)
where
    F: Future<Output = Result<(), E>>,
    E: std::fmt::Debug,
{
    call().await.expect("the call answers");
    let (cpu, started) = (cpu_time(containerd), Instant::now());
    for _ in 0..count {
        call().await.expect("the call answers");
    }
    (cpu_time(containerd) - cpu, started.elapsed())
}

/// `ctr ARGS` on the stack's containerd in the CRI namespace, `input` on its standard input;
/// whether it succeeded.
fn ctr(bench: &Bench, program: &Path, args: &[&str], input: &[u8]) -> bool {
    let mut child = Command::new(program)
        .arg("--address")
        .arg(&bench.stack.containerd_socket)
        .args(["--namespace", "k8s.io"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ctr runs");
    let mut stdin = child.stdin.take().expect("ctr's stdin");
    let written = stdin.write_all(input).is_ok();
    drop(stdin);
    child.wait().is_ok_and(|status| status.success()) && written
}

/// Adds `count` small blobs of their own to containerd's content store, each labelled a GC root
/// (containerd's GC, which runs every 100 changes, would take them otherwise; the few it takes
/// between a blob's write and its label are left out); their digests.
fn fill_store(bench: &Bench, ctr_path: &Path, count: usize) -> Vec<String> {
    let run = format!("{:?}", SystemTime::now());
    (0..count)
        .filter_map(|index| {
            let content = format!("cri-imaged bench: a filler blob, {index} of run {run}");
            let digest = format!("sha256:{:x}", Sha256::digest(content.as_bytes()));
            let reference = format!("cri-imaged-bench-filler-{index}");
            let ingest = ["content", "ingest", "--expected-digest", &digest, &reference];
            let label = ["content", "label", &digest, "containerd.io/gc.root=cri-imaged-bench"];
            (ctr(bench, ctr_path, &ingest, content.as_bytes()) && ctr(bench, ctr_path, &label, &[])).then_some(digest)
        })
        .collect()
}

/// Removes the blobs [`fill_store`] added.
fn empty_store(bench: &Bench, ctr_path: &Path, digests: &[String]) {
    for chunk in digests.chunks(200) {
        let args: Vec<&str> = ["content", "rm"].into_iter().chain(chunk.iter().map(String::as_str)).collect();
        assert!(ctr(bench, ctr_path, &args, &[]), "ctr content rm removes the filler blobs");
    }
}

/// How many blobs containerd's content store holds in the CRI namespace, as `ctr` lists them.
fn content_blobs(bench: &Bench) -> String {
    let listed = Command::new("ctr")
        .arg("--address")
        .arg(&bench.stack.containerd_socket)
        .args(["--namespace", "k8s.io", "content", "ls", "--quiet"])
        .output();
    match listed {
        Ok(output) if output.status.success() => {
            let lines = output.stdout.split(|byte| *byte == b'\n').filter(|line| !line.is_empty()).count();
            format!("{lines} blobs")
        }
        _ => "? blobs (no ctr)".to_owned(),
    }
}
