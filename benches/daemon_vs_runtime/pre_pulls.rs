//! Pre-pulls behind pods' pulls (issue 34): how long a pod's pull of a small absent image takes
//! with no pre-pull, and with 8 pre-pulls of big images submitted first (as many downloading as
//! may, through a throttling proxy so that none ends, the rest queued), trials alternating on one
//! daemon per set of flags. The pod's pull goes straight to the registry; only the pre-pulls are
//! throttled, so what the pod's pull may wait for is the daemon: a slot taken back from a
//! pre-pull, and the cancelled pull's end on containerd.

use std::{
    collections::HashSet,
    net::SocketAddr,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use cri_imaged::api::{
    CancelPrePullRequest, GetStatusRequest, GetStatusResponse, SubmitPrePullRequest,
    image_manager_client::ImageManagerClient,
};
use tonic::transport::Channel;

use crate::{
    Bench, Daemon, Findings, ensure,
    report::{self, Table, Verdict},
    support::{process::metric_with_label, throttle::ThrottleProxy},
    write_back,
};

const MIB: u64 = 1 << 20;
/// A pod's pull with the pre-pulls queued over the same without, p50, at most (the issue's).
const RATIO_TARGET: f64 = 1.10;
/// How long a side may take to get ready (pre-pulls cancelled, or downloading).
const READY_LIMIT: Duration = Duration::from_secs(60);
/// How long one pod's pull may take.
const PULL_LIMIT: Duration = Duration::from_secs(60);
/// Every row's daemon: the health probe at its shipped interval (the harness's 100 ms adds ten
/// ImageFsInfo calls a second), and no registry rate limit: the trials start pulls faster than
/// the kubelet's 5 a second would let them, and a refused pull fails at once, so the limit could
/// only fail a trial, never slow one.
const COMMON_FLAGS: [&str; 4] = ["--health-probe-interval", "5s", "--registry-qps", "0"];

/// The section's sizes.
struct Shape {
    /// Pre-pulls submitted, of one image each.
    pre_pulls: usize,
    /// Random bytes in each pre-pulled image's layer.
    big: u64,
    /// The proxy's rate, shared by every pre-pull downloading: slow enough that none ends while
    /// the section runs (containerd resumes a cancelled download where it stopped).
    rate: u64,
    /// Trials of each side per row, in ABBA order.
    trials: usize,
    /// Both sides wait this long once ready, before the pod's pull.
    settle: Duration,
}

const FULL: Shape =
    Shape { pre_pulls: 8, big: 64 * MIB, rate: MIB / 2, trials: 24, settle: Duration::from_millis(250) };

const QUICK: Shape = Shape { pre_pulls: 2, big: MIB, rate: 64 * 1024, trials: 1, settle: Duration::from_millis(50) };

/// One row: the daemon's flags beside [`COMMON_FLAGS`], and how many pre-pulls download at once.
struct Row {
    flags: &'static [&'static str],
    pre_pulls_at_once: usize,
}

const ROWS: [Row; 3] = [
    Row { flags: &[], pre_pulls_at_once: 1 },
    Row {
        flags: &["--serialize-image-pulls=false", "--max-parallel-image-pulls", "4", "--max-parallel-pre-pulls", "4"],
        pre_pulls_at_once: 4,
    },
    Row { flags: &["--serialize-image-pulls=false", "--max-parallel-image-pulls", "4"], pre_pulls_at_once: 1 },
];

/// One side's trials: each pod's pull from the request to its answer and, from containerd's log
/// (when its lines could be read), to containerd's `PullImage` and that call's own time.
#[derive(Default)]
struct Trials {
    answered: Vec<Duration>,
    upstream: Vec<Duration>,
    in_containerd: Vec<Duration>,
}

pub async fn run(bench: &Bench, findings: &mut Findings) {
    let started = Instant::now();
    let shape = if bench.sizes.pairs > 1 { &FULL } else { &QUICK };
    progress!(
        "pre-pulls: a pod's pull of a small image with none and with {} pre-pulls of {} MiB ({} KiB/s in all), \
         {} trials a side, {} rows",
        shape.pre_pulls,
        shape.big / MIB,
        shape.rate / 1024,
        shape.trials,
        ROWS.len()
    );
    let registry: SocketAddr = bench.stack.registry.parse().expect("the registry's address");
    let proxy = ThrottleProxy::start(registry, shape.rate).await;
    bench.stack.route_through(proxy.addr.port());
    let big: Vec<String> = (0..shape.pre_pulls)
        .map(|index| {
            let name = format!("bench/pre-pulls-big-{index}:v1");
            bench.stack.seed_sized(&name, shape.big);
            proxy.image(&name)
        })
        .collect();
    // A small image of its own for every pod's pull (each row's two warm-ups' included): each is absent.
    let smalls: Vec<Vec<String>> = (0..ROWS.len())
        .map(|row| {
            (0..shape.trials * 2 + 2)
                .map(|trial| {
                    let name = format!("bench/pre-pulls-small-{row}-{trial}:v1");
                    bench.stack.seed(&name, &format!("a pod's small image, row {row}, trial {trial}"));
                    bench.stack.image(&name)
                })
                .collect()
        })
        .collect();
    // The pushes leave hundreds of MiB to write back, which would slow containerd's fsyncs (and
    // so its pulls) for the first row's trials: written out before any.
    write_back();
    progress!("  images pushed and written out after {}", report::duration(started.elapsed()));
    let mut table = Table::new(
        format!(
            "Pre-pulls: a pod's pull of a small absent image (EnsureImageExists, IfNotPresent) with no pre-pull and \
             with {} pre-pulls of {} MiB submitted first (downloading through a {} KiB/s proxy, the rest queued), \
             trials alternating; flags beside --registry-qps 0 --health-probe-interval 5s",
            shape.pre_pulls,
            shape.big / MIB,
            shape.rate / 1024
        ),
        &[
            "daemon flags",
            "pre-pulls",
            "downloading",
            "trials",
            "to answer p50",
            "to answer p90",
            "p50 / none",
            "p90 / none",
            "to containerd's PullImage p50",
            "p90",
            "containerd's PullImage p50",
            "pre-pulls preempted",
        ],
    );
    for (index, (row, smalls)) in ROWS.iter().zip(&smalls).enumerate() {
        measure_row(bench, shape, (&big, smalls), index, row, &mut table, findings).await;
    }
    findings.tables.push(table);
    progress!("  pre-pulls: done in {}", report::duration(started.elapsed()));
}

/// One row: a daemon with the row's flags, warmed up, then the pod's pulls of `smalls` with and
/// without the pre-pulls of `big`, alternating; its two lines of the table and its verdict.
async fn measure_row(
    bench: &Bench,
    shape: &Shape,
    (big, smalls): (&[String], &[String]),
    index: usize,
    row: &Row,
    table: &mut Table,
    findings: &mut Findings,
) {
    let label = if row.flags.is_empty() { "(none: serial pulls)".to_owned() } else { row.flags.join(" ") };
    progress!("  row {}: {label}", index + 1);
    let downloading = row.pre_pulls_at_once.min(big.len());
    let flags: Vec<&str> = COMMON_FLAGS.iter().chain(row.flags).copied().collect();
    let daemon = Daemon::start(bench, &format!("pre-pulls-{index}"), &flags).await;
    let preempted_before = preempted(&daemon).await;
    let (mut none, mut queued) = (Trials::default(), Trials::default());
    // The first of each side warms up (connections, the proxy's hosts.toml): not counted.
    for (round, small) in smalls.iter().enumerate() {
        let with_pre_pulls = match round {
            0 => false,
            1 => true,
            _ => matches!((round - 2) % 4, 1 | 2),
        };
        if with_pre_pulls {
            pre_pulls_downloading(&daemon, big, downloading).await;
        } else {
            no_pre_pull(&daemon).await;
        }
        tokio::time::sleep(shape.settle).await;
        let (answered, sent) = pod_pull(&daemon, small, &format!("pre-pulls-{index}-{round}")).await;
        if round >= 2 {
            let trials = if with_pre_pulls { &mut queued } else { &mut none };
            trials.answered.push(answered);
            if let Some((upstream, in_containerd)) = upstream_call(bench, small, sent) {
                trials.upstream.push(upstream);
                trials.in_containerd.push(in_containerd);
            }
        }
    }
    no_pre_pull(&daemon).await;
    let preempted = preempted(&daemon).await - preempted_before;
    drop(daemon);

    let (none_p50, none_p90) = (quantile(&mut none.answered, 0.5), quantile(&mut none.answered, 0.9));
    for (pre_pulls, trials) in [(0, &mut none), (big.len(), &mut queued)] {
        let (p50, p90) = (quantile(&mut trials.answered, 0.5), quantile(&mut trials.answered, 0.9));
        // Every trial's log lines, or none of the figures.
        let complete = trials.upstream.len() == trials.answered.len();
        let logged = |times: &mut Vec<Duration>, q| {
            if complete { report::duration(quantile(times, q)) } else { "-".to_owned() }
        };
        let (up50, up90) = (logged(&mut trials.upstream, 0.5), logged(&mut trials.upstream, 0.9));
        let in_containerd = logged(&mut trials.in_containerd, 0.5);
        table.row(vec![
            label.clone(),
            pre_pulls.to_string(),
            if pre_pulls == 0 { "0".into() } else { downloading.to_string() },
            trials.answered.len().to_string(),
            report::duration(p50),
            report::duration(p90),
            report::ratio(p50.as_secs_f64(), none_p50.as_secs_f64()),
            report::ratio(p90.as_secs_f64(), none_p90.as_secs_f64()),
            up50,
            up90,
            in_containerd,
            if pre_pulls == 0 { "-".into() } else { format!("{preempted:.0}") },
        ]);
    }
    let (p50, p90) = (quantile(&mut queued.answered, 0.5), quantile(&mut queued.answered, 0.9));
    let ratio = p50.as_secs_f64() / none_p50.as_secs_f64();
    findings.verdicts.push(Verdict {
        what: format!("a pod's pull of a small image, {} pre-pulls queued / none, p50, {label}", big.len()),
        target: format!("≤ {RATIO_TARGET:.2}"),
        measured: format!(
            "{ratio:.2} ({} vs {}; p90 {} vs {})",
            report::duration(p50),
            report::duration(none_p50),
            report::duration(p90),
            report::duration(none_p90)
        ),
        met: ratio <= RATIO_TARGET,
    });
}

/// EnsureImageExists(IfNotPresent) of the absent `image` by `pod`: the time to its answer, and
/// the wall clock when it was sent (to find containerd's PullImage after it).
async fn pod_pull(daemon: &Daemon, image: &str, pod: &str) -> (Duration, SystemTime) {
    let call = ensure(&daemon.client, image, pod);
    let (sent, started) = (SystemTime::now(), Instant::now());
    let answer = tokio::time::timeout(PULL_LIMIT, call).await;
    let answered = started.elapsed();
    match answer {
        Ok(Ok(response)) if response.pulled => (answered, sent),
        Ok(Ok(_)) => panic!("pre-pulls: {image} was found present, not pulled"),
        Ok(Err(status)) => panic!("pre-pulls: the pod's pull of {image} failed: {status:?}"),
        Err(_) => panic!("pre-pulls: no answer for {image} within {PULL_LIMIT:?}; log:\n{}", daemon.process.log_text()),
    }
}

/// Cancels every pre-pull not ended, and waits until no pull is in flight.
async fn no_pre_pull(daemon: &Daemon) {
    let mut client = daemon.client.clone();
    for pre_pull in status(&mut client).await.pre_pulls {
        if matches!(pre_pull.state.as_str(), "queued" | "pulling") {
            client.cancel_pre_pull(CancelPrePullRequest { id: pre_pull.id }).await.expect("CancelPrePull");
        }
    }
    wait_until(daemon, "no pre-pull and no pull in flight", |status| {
        status.pulls.is_empty()
            && !status.pre_pulls.iter().any(|pre_pull| matches!(pre_pull.state.as_str(), "queued" | "pulling"))
    })
    .await;
}

/// Submits the pre-pulls of `images` (again: a cancelled one is queued again), and waits until
/// `downloading` of them download (a slot, their downloads seen, and no registry that has not
/// answered yet: such a pull gives its slot back) and the rest are queued.
async fn pre_pulls_downloading(daemon: &Daemon, images: &[String], downloading: usize) {
    let mut client = daemon.client.clone();
    let request = SubmitPrePullRequest { images: images.to_vec(), ..Default::default() };
    client.submit_pre_pull(request).await.expect("SubmitPrePull");
    let images: HashSet<&str> = images.iter().map(String::as_str).collect();
    let what = format!("{downloading} pre-pulls downloading, {} queued", images.len() - downloading);
    wait_until(daemon, &what, |status| {
        let states = |state: &str| status.pre_pulls.iter().filter(|pre_pull| pre_pull.state == state).count();
        if let Some(ended) =
            status.pre_pulls.iter().find(|pre_pull| matches!(pre_pull.state.as_str(), "done" | "failed"))
        {
            panic!(
                "pre-pulls: the pre-pull of {} ended ({}: {} {}); the proxy must be slower",
                ended.image, ended.state, ended.reason, ended.message
            );
        }
        let moving = status
            .pulls
            .iter()
            .filter(|pull| images.contains(pull.image.as_str()) && pull.started.is_some() && pull.progress.is_some())
            .count();
        let unanswered = status.registries.iter().any(|registry| registry.unanswered);
        moving == downloading
            && !unanswered
            && states("pulling") == downloading
            && states("queued") == images.len() - downloading
    })
    .await;
}

/// Polls GetStatus until `ready` holds, for at most [`READY_LIMIT`].
async fn wait_until(daemon: &Daemon, what: &str, mut ready: impl FnMut(&GetStatusResponse) -> bool) {
    let mut client = daemon.client.clone();
    let since = Instant::now();
    loop {
        let status = status(&mut client).await;
        if ready(&status) {
            return;
        }
        if since.elapsed() > READY_LIMIT {
            panic!(
                "pre-pulls: not {what} within {READY_LIMIT:?}: pulls {:?}, pre-pulls {:?}; log:\n{}",
                status.pulls,
                status.pre_pulls.iter().map(|pre_pull| (&pre_pull.image, &pre_pull.state)).collect::<Vec<_>>(),
                daemon.process.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn status(client: &mut ImageManagerClient<Channel>) -> GetStatusResponse {
    client.get_status(GetStatusRequest::default()).await.expect("GetStatus").into_inner()
}

/// Pre-pulls that gave their slot to a pod's pull, so far.
async fn preempted(daemon: &Daemon) -> f64 {
    let port = daemon.metrics_port;
    tokio::task::spawn_blocking(move || metric_with_label(port, "cri_imaged_pulls_total", r#"result="preempted""#))
        .await
        .expect("the metrics read")
}

/// From containerd's log: from `sent` to the first CRI PullImage of `image` it received after
/// it, and how long that call took (to its "returns image reference" line); `None` when the
/// lines could not be read.
fn upstream_call(bench: &Bench, image: &str, sent: SystemTime) -> Option<(Duration, Duration)> {
    let log = std::fs::read_to_string(&bench.stack.containerd_log).ok()?;
    let asked = format!(r#"msg="PullImage \"{image}\"""#);
    let returned = format!(r#"msg="PullImage \"{image}\" returns "#);
    let first_after_sent = |needle: &str| {
        log.lines().filter(|line| line.contains(needle)).filter_map(log_time).filter(|time| *time >= sent).min()
    };
    let (asked, returned) = (first_after_sent(&asked)?, first_after_sent(&returned)?);
    Some((asked.duration_since(sent).ok()?, returned.duration_since(asked).ok()?))
}

/// The `time="2026-11-26T10:05:24.475804492Z"` of a containerd log line (UTC only).
fn log_time(line: &str) -> Option<SystemTime> {
    let stamp = line.strip_prefix("time=\"")?.split('"').next()?.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut date = date.splitn(3, '-').map(|part| part.parse::<i64>().ok());
    let (year, month, day) = (date.next()??, date.next()??, date.next()??);
    let (clock, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let mut clock = clock.splitn(3, ':').map(|part| part.parse::<u64>().ok());
    let (hours, minutes, seconds) = (clock.next()??, clock.next()??, clock.next()??);
    let nanos: u32 = format!("{fraction:0<9}").get(..9)?.parse().ok()?;
    let days = u64::try_from(days_from_civil(year, month, day)).ok()?;
    let seconds = days * 86_400 + hours * 3600 + minutes * 60 + seconds;
    Some(UNIX_EPOCH + Duration::new(seconds, nanos))
}

/// Days from 1970-01-01 to the proleptic Gregorian `year-month-day` (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The nearest-rank quantile `q` of `times` (not empty), as `load::Run` computes its own.
fn quantile(times: &mut [Duration], q: f64) -> Duration {
    times.sort_unstable();
    let rank = (q * times.len() as f64).ceil() as usize;
    times[rank.clamp(1, times.len()) - 1]
}
