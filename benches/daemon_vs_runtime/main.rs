//! `make bench`: what cri-imaged costs against calling containerd directly, and what it saves,
//! on a real containerd and a loopback registry that this program starts itself.
//!
//! `cargo bench --bench daemon_vs_runtime` runs the full sizes on a release build, prints the
//! report and writes it to `bench/daemon_vs_runtime.md` in cargo's target directory (`target/`
//! unless `CARGO_TARGET_DIR` or `build.target-dir` says otherwise). `cargo test --bench
//! daemon_vs_runtime` (part of `make test`) runs the same code with small sizes, so the bench
//! cannot rot; its figures mean nothing, so it prints one line, `bench smoke: ok, report at PATH`
//! (`-- --tables` prints the report too).
//!
//! Sections: start-up (exec → SERVING), the presence path (EnsureImageExists on a present image
//! against ImageStatus, alternating), the herd (N callers for one absent image, both ways, with
//! the registry's and containerd's own counts), memory (idle, herd peak, backoff entries),
//! staleness (how long after an image is removed behind cri-imaged's back it may still be
//! called present), image GC (planning at scale in process, a dry-run pass on the stack), event
//! fan-out (a herd with and without WatchEvents subscribers), pull progress polling
//! (containerd's CPU over a throttled pull with `--pull-progress` off and on), hostile input
//! (idle connections, hostile records and a slow credential plugin at once), and registries over
//! a shaped link (a registry in a network namespace behind 100 Mbit, 50 ms and 0.1 % loss: pull
//! times, small pulls behind a big one, a hung registry, a 429 limit, a herd's bytes), and
//! pre-pulls (a pod's pull of a small image with none and with 8 big pre-pulls queued), and a
//! cold node (a big image's pod first, then 9 pods on small images, over a 100 Mbit link: the
//! kubelet's own pullers against the same in front of cri-imaged at its defaults).
// Wall time of real processes, in a program that never pauses tokio's clock.
#![allow(clippy::disallowed_types)]

/// A progress line on stderr, in a full run or when the tables are asked for; a smoke run in
/// `make test` stays quiet.
macro_rules! progress {
    ($($arg:tt)*) => {
        if crate::VERBOSE.load(std::sync::atomic::Ordering::Relaxed) {
            eprintln!($($arg)*);
        }
    };
}

#[path = "../../tests/support/mod.rs"]
mod support;

mod cold_node;
mod credentials;
mod cri;
mod crio;
mod events;
mod gc;
mod hostile;
mod load;
mod memory;
mod pre_pulls;
mod progress;
mod records;
mod registries;
mod report;
mod signatures;

use std::{
    path::{Path, PathBuf},
    pin::Pin,
    process::{Command, ExitCode},
    sync::{Arc, atomic::AtomicBool},
    time::{Duration, Instant},
};

use clap::Parser;
use cri_imaged::cri::{ImageSpec, RemoveImageRequest, image_service_client::ImageServiceClient};
use cri_imaged::presence::DEFAULT_MAX_STALENESS;
use cri_imaged::{
    api::{
        EnsureImageExistsRequest, EnsureImageExistsResponse, PodRef, PullPolicy,
        image_manager_client::ImageManagerClient,
    },
    runtime::{CriClient, ImageRuntime, PullSpec, RuntimeEndpoint},
    server::IMAGE_MANAGER_SERVICE,
};
use tonic::transport::Channel;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};

use crate::{
    load::Run,
    report::{Table, Verdict},
    support::{
        process::{DaemonProcess, metric, metrics_listen},
        stack::LocalStack,
        unix_channel,
    },
};

#[global_allocator]
static ALLOCATOR: memory::CountingAllocator = memory::CountingAllocator::new();

/// The daemon logs as it would under systemd: `info`.
const DAEMON_LOG: &str = "info";

/// Whether progress lines are printed (see [`progress!`]).
static VERBOSE: AtomicBool = AtomicBool::new(false);

#[derive(Parser)]
#[command(about = "cri-imaged against containerd directly: presence path, herd, memory, start-up")]
struct Args {
    /// Passed by `cargo bench`: run the full sizes. Without it, a quick smoke run.
    #[arg(long)]
    bench: bool,
    /// Write the report here (default: bench/daemon_vs_runtime.md, or .quick.md for a smoke run,
    /// in cargo's target directory).
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Print the report's tables and progress in a smoke run too (a full run always does).
    #[arg(long)]
    tables: bool,
    /// Run only these sections (repeatable), e.g. to profile one of them.
    #[arg(long, value_enum, value_name = "SECTION")]
    only: Vec<Section>,
    /// Extra flags for every cri-imaged started, e.g. --daemon-flag=--worker-threads=2.
    #[arg(long = "daemon-flag", value_name = "FLAG", allow_hyphen_values = true)]
    daemon_flags: Vec<String>,
    /// An external CRI runtime (CRI-O) for the `crio` section, e.g. unix:///run/crio/crio.sock;
    /// without it that section is skipped, saying so.
    #[arg(long, value_name = "ENDPOINT")]
    crio_endpoint: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Section {
    Startup,
    Presence,
    Herd,
    Backoff,
    Staleness,
    Credentials,
    Records,
    Gc,
    Events,
    Progress,
    Hostile,
    Cri,
    Registries,
    PrePulls,
    Signatures,
    SignedLink,
    ColdNode,
    /// cri-imaged in front of `--crio-endpoint` (not started here).
    Crio,
}

/// How much of everything to do.
struct Sizes {
    concurrencies: &'static [usize],
    /// Each side runs this long per turn; turns alternate `pairs` times (ABBA order).
    turn: Duration,
    pairs: usize,
    herds: &'static [usize],
    backoff_entries: usize,
    startups: usize,
    /// Removals behind the daemon's back, per staleness setting.
    removals: usize,
    /// Idle HTTP/2 connections held open in the hostile-input section.
    idle_connections: usize,
}

const FULL: Sizes = Sizes {
    concurrencies: &[1, 16, 64],
    turn: Duration::from_secs(1),
    pairs: 4,
    herds: &[200, 1000],
    backoff_entries: 100_000,
    startups: 20,
    removals: 300,
    idle_connections: 1000,
};

const QUICK: Sizes = Sizes {
    concurrencies: &[1, 16],
    turn: Duration::from_millis(200),
    pairs: 1,
    herds: &[20],
    backoff_entries: 1_000,
    startups: 3,
    removals: 3,
    idle_connections: 50,
};

fn main() -> ExitCode {
    let args = Args::parse();
    let (sizes, report_name) =
        if args.bench { (&FULL, "daemon_vs_runtime.md") } else { (&QUICK, "daemon_vs_runtime.quick.md") };
    let verbose = args.bench || args.tables;
    VERBOSE.store(verbose, std::sync::atomic::Ordering::Relaxed);
    let sections = if args.only.is_empty() {
        vec![
            Section::Startup,
            Section::Presence,
            Section::Herd,
            Section::Backoff,
            Section::Staleness,
            Section::Credentials,
            Section::Records,
            Section::Gc,
            Section::Events,
            Section::Progress,
            Section::Hostile,
            Section::Cri,
            Section::Registries,
            Section::PrePulls,
            Section::SignedLink,
            Section::ColdNode,
            Section::Crio,
        ]
    } else {
        args.only.clone()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let Some(report) = runtime.block_on(run(sizes, &sections, &args.daemon_flags, args.crio_endpoint.clone())) else {
        return ExitCode::SUCCESS;
    };
    let out = args.out.unwrap_or_else(|| target_dir().join("bench").join(report_name));
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).expect("report directory");
    }
    std::fs::write(&out, &report).expect("write the report");
    if verbose {
        print!("{report}");
        eprintln!("report written to {}", out.display());
    } else {
        println!("bench smoke: ok, report at {}", out.display());
    }
    ExitCode::SUCCESS
}

/// Cargo's target directory, as this bench was built for: `CARGO_TARGET_TMPDIR` is its `tmp/`.
fn target_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).to_owned()
}

/// Writes out what pushes left to write back, which would otherwise slow containerd's fsyncs
/// (and so its pulls) in what is measured next.
fn write_back() {
    let synced = Command::new("sync").status().expect("sync runs");
    assert!(synced.success(), "sync: {synced}");
}

/// Images pushed for this run; each herd gets images of its own so that each starts cold.
struct Images {
    present: String,
    absent: String,
    /// (herd size, through cri-imaged, straight to containerd)
    herds: Vec<(usize, String, String)>,
}

impl Images {
    fn seed(stack: &LocalStack, sizes: &Sizes) -> Self {
        stack.seed("bench/present:v1", "present");
        stack.seed("bench/removed:v1", "removed behind the daemon's back");
        let mut herds = Vec::new();
        for &size in sizes.herds {
            let through = format!("bench/herd-{size}-through:v1");
            let direct = format!("bench/herd-{size}-direct:v1");
            stack.seed(&through, &through);
            stack.seed(&direct, &direct);
            herds.push((size, stack.image(&through), stack.image(&direct)));
        }
        Self { present: stack.image("bench/present:v1"), absent: stack.image("bench/absent:v1"), herds }
    }
}

/// What every section works with.
struct Bench {
    stack: LocalStack,
    work: tempfile::TempDir,
    images: Images,
    sizes: &'static Sizes,
    /// containerd, called directly with the project's own CRI client.
    direct: Arc<CriClient>,
    daemon_flags: Vec<String>,
    /// The external CRI runtime of the `crio` section, if one was named.
    crio_endpoint: Option<String>,
}

/// What the sections found so far.
struct Findings {
    tables: Vec<Table>,
    memory: Table,
    verdicts: Vec<Verdict>,
}

async fn run(
    sizes: &'static Sizes,
    sections: &[Section],
    daemon_flags: &[String],
    crio_endpoint: Option<String>,
) -> Option<String> {
    let stack = LocalStack::start()?;
    let work = tempfile::Builder::new().prefix("cri-bench").tempdir_in("/tmp").expect("work dir");
    let images = Images::seed(&stack, sizes);
    let endpoint = RuntimeEndpoint::parse(&stack.containerd_socket.to_string_lossy()).expect("containerd socket");
    let direct = Arc::new(CriClient::new(&endpoint, Duration::from_secs(120)));
    let bench = Bench { stack, work, images, sizes, direct, daemon_flags: daemon_flags.to_vec(), crio_endpoint };
    let mut findings = Findings {
        tables: Vec::new(),
        memory: Table::new("Memory of the daemon", &["when", "resident", "peak resident", "target"]),
        verdicts: Vec::new(),
    };
    if sections.contains(&Section::Startup) {
        progress!("start-up: {} runs", sizes.startups);
        startup(&bench, &mut findings).await;
    }
    if sections.contains(&Section::Presence) || sections.contains(&Section::Herd) {
        let daemon = Daemon::start(&bench, "bench", &[]).await;
        idle(&daemon, &mut findings);
        if sections.contains(&Section::Presence) {
            progress!("presence path: concurrency {:?}", sizes.concurrencies);
            presence(&bench, &daemon, &mut findings).await;
        }
        if sections.contains(&Section::Herd) {
            herds(&bench, &daemon, &mut findings).await;
        }
    }
    if sections.contains(&Section::Signatures) {
        let daemon = Daemon::start(&bench, "unsigned", &[]).await;
        signatures::run(&bench, &daemon, &mut findings).await;
    }
    if sections.contains(&Section::Backoff) {
        progress!("backoff store: {} entries", sizes.backoff_entries);
        backoff(&bench, &mut findings).await;
    }
    if sections.contains(&Section::Staleness) {
        progress!("staleness: {} removals behind the daemon's back per setting", sizes.removals);
        staleness(&bench, &mut findings).await;
    }
    if sections.contains(&Section::Credentials) {
        progress!("credentials: {} secrets of {} registries", credentials::SECRETS, credentials::ENTRIES);
        pull_credentials(&bench, &mut findings).await;
    }
    if sections.contains(&Section::Records) {
        progress!("pull records: {} on disk", records::RECORDS);
        pull_records(&bench, &mut findings).await;
    }
    if sections.contains(&Section::Gc) {
        progress!(
            "image GC: planning for {} images and {} containers, then a pass on the stack",
            gc::IMAGES,
            gc::CONTAINERS
        );
        gc::run(&bench, &mut findings).await;
    }
    if sections.contains(&Section::Events) {
        events::run(&bench, &mut findings).await;
    }
    if sections.contains(&Section::Progress) {
        progress::run(&bench, &mut findings).await;
    }
    if sections.contains(&Section::Hostile) {
        progress!("hostile input: {} idle connections, hostile records, a slow plugin", sizes.idle_connections);
        hostile::run(&bench, &mut findings).await;
    }
    if sections.contains(&Section::Cri) {
        cri::run(&bench, &mut findings).await;
    }
    if sections.contains(&Section::Registries) {
        registries::run(&bench, &mut findings).await;
    }
    if sections.contains(&Section::PrePulls) {
        pre_pulls::run(&bench, &mut findings).await;
    }
    if sections.contains(&Section::SignedLink) {
        registries::signed_link(&bench, &mut findings).await;
    }
    if sections.contains(&Section::ColdNode) {
        cold_node::run(&bench, &mut findings).await;
    }
    if sections.contains(&Section::Crio) {
        crio::run(&bench, &mut findings).await;
    }
    let Findings { mut tables, memory, verdicts } = findings;
    tables.push(memory);
    Some(report::render(&machine(), &tables, &verdicts))
}

/// The daemon's memory before it has served anything.
fn idle(daemon: &Daemon, findings: &mut Findings) {
    let idle = memory::resident(daemon.pid());
    findings.memory.row(vec![
        "idle, after start-up".into(),
        report::mib(idle.now_kib),
        report::mib(idle.peak_kib),
        "≤ 20 MiB".into(),
    ]);
    findings.verdicts.push(Verdict {
        what: "idle peak resident".into(),
        target: "≤ 20 MiB".into(),
        measured: report::mib(idle.peak_kib),
        met: idle.peak_kib <= 20 * 1024,
    });
}

/// Herds of each size, both ways, alternating which side goes first.
async fn herds(bench: &Bench, daemon: &Daemon, findings: &mut Findings) {
    let mut table = Table::new(
        "Herd: N concurrent requests for one absent image",
        &["N", "path", "wall time", "manifest resolutions", "containerd PullImage calls"],
    );
    for (turn, (size, through_image, direct_image)) in bench.images.herds.iter().enumerate() {
        progress!("herd of {size}");
        // Neither side always meets the warmer containerd.
        let ((through, resident), direct) = if turn % 2 == 0 {
            let through = herd_through(bench, daemon, *size, through_image).await;
            (through, herd_direct(bench, *size, direct_image).await)
        } else {
            let direct = herd_direct(bench, *size, direct_image).await;
            (herd_through(bench, daemon, *size, through_image).await, direct)
        };
        findings.verdicts.push(Verdict {
            what: format!("manifest resolutions, herd of {size} through cri-imaged"),
            target: "1 (containerd alone: N)".into(),
            measured: format!("{} (containerd alone: {})", through.resolutions, direct.resolutions),
            met: through.resolutions == 1,
        });
        table.row(through.cells(*size, "cri-imaged"));
        table.row(direct.cells(*size, "containerd directly"));
        findings.memory.row(vec![
            format!("herd of {size}"),
            report::mib(resident.now_kib),
            report::mib(resident.peak_kib),
            "≤ 64 MiB at 1,000".into(),
        ]);
        if Some(size) == bench.sizes.herds.last() {
            findings.verdicts.push(Verdict {
                what: format!("peak resident during the herd of {size}"),
                target: "≤ 64 MiB".into(),
                measured: report::mib(resident.peak_kib),
                met: resident.peak_kib <= 64 * 1024,
            });
        }
    }
    findings.tables.push(table);
}

impl Bench {
    /// `cri-imaged serve` on `socket`, logging as under systemd, not yet waited for.
    fn spawn_daemon(&self, socket: &Path, flags: &[&str]) -> DaemonProcess {
        self.spawn_daemon_on(socket, &self.stack.containerd_socket, flags)
    }

    /// As [`Bench::spawn_daemon`], in front of the runtime on `runtime_socket`.
    fn spawn_daemon_on(&self, socket: &Path, runtime_socket: &Path, flags: &[&str]) -> DaemonProcess {
        let mut flags = flags.to_vec();
        flags.extend(self.daemon_flags.iter().map(String::as_str));
        DaemonProcess::spawn_logging(socket, runtime_socket, &flags, DAEMON_LOG)
    }
}

/// cri-imaged as a child process, with its metrics on a loopback port.
struct Daemon {
    process: DaemonProcess,
    metrics_port: u16,
    client: ImageManagerClient<Channel>,
}

impl Daemon {
    /// Starts cri-imaged on `WORK/name.sock` (its root dir `WORK/name-root`) with `extra` and the
    /// bench's own daemon flags.
    async fn start(bench: &Bench, name: &str, extra: &[&str]) -> Self {
        // A root dir of its own unless given one: several serve at once, and a root dir takes one.
        let root = bench.work.path().join(format!("{name}-root"));
        let mut extra = extra.to_vec();
        if !extra.contains(&"--root-dir") {
            extra.extend(["--root-dir", root.to_str().expect("utf-8 path")]);
        }
        Self::start_at(bench, &bench.work.path().join(format!("{name}.sock")), &extra).await
    }

    /// As [`Daemon::start`], on `socket` (its root dir, `root`, beside it).
    async fn start_at(bench: &Bench, socket: &Path, extra: &[&str]) -> Self {
        Self::start_at_on(bench, socket, &bench.stack.containerd_socket, extra).await
    }

    /// As [`Daemon::start`], in front of the runtime on `runtime_socket` instead of the stack's
    /// containerd.
    async fn start_on(bench: &Bench, name: &str, runtime_socket: &Path, extra: &[&str]) -> Self {
        let root = bench.work.path().join(format!("{name}-root"));
        let mut extra = extra.to_vec();
        extra.extend(["--root-dir", root.to_str().expect("utf-8 path")]);
        Self::start_at_on(bench, &bench.work.path().join(format!("{name}.sock")), runtime_socket, &extra).await
    }

    async fn start_at_on(bench: &Bench, socket: &Path, runtime_socket: &Path, extra: &[&str]) -> Self {
        let (metrics_port, metrics_listen) = metrics_listen();
        let mut flags = vec!["--metrics-listen", &metrics_listen];
        flags.extend_from_slice(extra);
        let process = bench.spawn_daemon_on(socket, runtime_socket, &flags);
        process.wait_until_serving().await;
        let client = ImageManagerClient::new(unix_channel(socket));
        Self { process, metrics_port, client }
    }

    fn pid(&self) -> u32 {
        self.process.pid()
    }

    fn socket(&self) -> &Path {
        &self.process.socket
    }

    /// The sum of every series of the metric `name` on `/metrics`.
    fn metric(&self, name: &str) -> f64 {
        metric(self.metrics_port, name)
    }
}

/// EnsureImageExists(IfNotPresent) for `image` on behalf of pod `pod_uid`.
fn ensure(
    client: &ImageManagerClient<Channel>,
    image: &str,
    pod_uid: &str,
) -> impl Future<Output = Result<EnsureImageExistsResponse, tonic::Status>> + Send + use<> {
    let mut client = client.clone();
    let request = ensure_request(image, pod_uid);
    async move { client.ensure_image_exists(request).await.map(tonic::Response::into_inner) }
}

fn ensure_request(image: &str, pod_uid: &str) -> EnsureImageExistsRequest {
    EnsureImageExistsRequest {
        image: image.into(),
        pull_policy: PullPolicy::IfNotPresent as i32,
        pod: Some(PodRef {
            namespace: "bench".into(),
            name: format!("pod-{pod_uid}"),
            uid: pod_uid.into(),
            annotations: Default::default(),
        }),
        container_name: "app".into(),
        ..Default::default()
    }
}

/// Exec to a SERVING answer for the image manager, `runs` times; with `CRI_IMAGED_BASELINE_BIN`
/// (another build of cri-imaged), that build's too, runs alternating, and the ratio.
async fn startup(bench: &Bench, findings: &mut Findings) {
    let runs = bench.sizes.startups;
    let (median, max) = startup_times(bench, "startup", &[]).await;
    let mut table = Table::new("Start-up: exec to a SERVING health answer", &["runs", "median", "max", "target"]);
    table.row(vec![runs.to_string(), report::duration(median), report::duration(max), "≤ 100 ms".into()]);
    findings.tables.push(table);
    findings.verdicts.push(Verdict {
        what: "start-up, exec to SERVING (median)".into(),
        target: "≤ 100 ms".into(),
        measured: format!("{} (max {})", report::duration(median), report::duration(max)),
        met: median <= Duration::from_millis(100),
    });
    if let Some(baseline) = std::env::var_os("CRI_IMAGED_BASELINE_BIN") {
        startup_against(bench, findings, Path::new(&baseline)).await;
    }
}

/// This build's start-up against `baseline`'s, runs alternating so that both see the same
/// machine: what a change costs `serve` before it answers.
async fn startup_against(bench: &Bench, findings: &mut Findings, baseline: &Path) {
    let runs = bench.sizes.startups * 2;
    let (mut ours, mut theirs) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for run in 0..runs {
        for (times, program) in [(&mut ours, None), (&mut theirs, Some(baseline))] {
            let side = if program.is_some() { "baseline" } else { "ours" };
            let socket = bench.work.path().join(format!("against-{run}-{side}.sock"));
            let exec = Instant::now();
            let process = match program {
                None => bench.spawn_daemon(&socket, &[]),
                Some(program) => {
                    let flags: Vec<&str> = bench.daemon_flags.iter().map(String::as_str).collect();
                    DaemonProcess::spawn_program(program, &socket, &bench.stack.containerd_socket, &flags, DAEMON_LOG)
                }
            };
            let time = until_serving(&socket, exec)
                .await
                .unwrap_or_else(|| panic!("cri-imaged did not report SERVING within 5s; log:\n{}", process.log_text()));
            times.push(time);
        }
    }
    let median = |times: &mut Vec<Duration>| {
        times.sort_unstable();
        times[times.len() / 2]
    };
    let (ours, theirs) = (median(&mut ours), median(&mut theirs));
    let ratio = ours.as_secs_f64() / theirs.as_secs_f64();
    let mut table = Table::new(
        format!("Start-up against another build ({}), runs alternating", baseline.display()),
        &["runs each", "this build", "baseline", "ratio", "target"],
    );
    let measured = format!("{ratio:.2}");
    table.row(vec![
        runs.to_string(),
        report::duration(ours),
        report::duration(theirs),
        measured.clone(),
        "≤ 1.10".into(),
    ]);
    findings.tables.push(table);
    findings.verdicts.push(Verdict {
        what: "start-up against the baseline build (median ratio)".into(),
        target: "≤ 1.10".into(),
        measured,
        met: ratio <= 1.10,
    });
}

/// Polls the image manager's health every millisecond, for at most 5 s.
/// Exec to SERVING, `runs` times with `flags`: the median and the longest.
async fn startup_times(bench: &Bench, name: &str, flags: &[&str]) -> (Duration, Duration) {
    let runs = bench.sizes.startups;
    let mut times = Vec::with_capacity(runs);
    for run in 0..runs {
        let socket = bench.work.path().join(format!("{name}-{run}.sock"));
        let exec = Instant::now();
        let process = bench.spawn_daemon(&socket, flags);
        times.push(
            until_serving(&socket, exec)
                .await
                .unwrap_or_else(|| panic!("cri-imaged did not report SERVING within 5s; log:\n{}", process.log_text())),
        );
    }
    times.sort_unstable();
    (times[times.len() / 2], times[times.len() - 1])
}

/// KEP-2535 at scale: 10,000 pull records on disk. Start-up with them, reading them all, and the
/// presence path under AlwaysVerify (every present image checked against its record) against
/// the policy off and against containerd directly.
async fn pull_records(bench: &Bench, findings: &mut Findings) {
    let (image, sizes) = (bench.images.present.as_str(), bench.sizes);
    let root = bench.work.path().join("records-root");
    records::fill(&root, records::RECORDS);
    let root_flag = root.to_str().expect("utf-8 path");
    let (median, max) = startup_times(bench, "records-startup", &["--root-dir", root_flag]).await;
    let warm = records::warm_time(&root);
    let mut startup = Table::new(format!("Pull records: {} on disk", records::RECORDS), &["measure", "value"]);
    startup.row(vec!["start-up, exec to SERVING (median)".into(), report::duration(median)]);
    startup.row(vec!["start-up, exec to SERVING (max)".into(), report::duration(max)]);
    startup.row(vec!["reading them all into memory, in process (done while serving)".into(), report::duration(warm)]);
    findings.tables.push(startup);
    findings.verdicts.push(Verdict {
        what: format!("start-up with {} pull records on disk (median)", records::RECORDS),
        target: "≤ 100 ms".into(),
        measured: format!("{} (max {})", report::duration(median), report::duration(max)),
        met: median <= Duration::from_millis(100),
    });

    let off =
        Daemon::start(bench, "records-off", &["--image-pull-credentials-verification-policy", "NeverVerify"]).await;
    let always = Daemon::start(
        bench,
        "records-always",
        &["--image-pull-credentials-verification-policy", "AlwaysVerify", "--root-dir", root_flag],
    )
    .await;
    // Under AlwaysVerify an image cri-imaged has no record of is pulled once (anonymously: a
    // record that lets every pod use it); from then on each check reads that record.
    for client in [&off.client, &always.client] {
        ensure(client, image, "warm-up").await.expect("the present image");
    }
    let sides: [(&str, PresenceCall); 3] = [
        ("containerd directly", straight_to_runtime(&bench.direct, image)),
        ("cri-imaged, NeverVerify", through_daemon(&off.client, image)),
        ("cri-imaged, AlwaysVerify, 10,000 records", through_daemon(&always.client, image)),
    ];
    let mut table = Table::new(
        "Presence path with pull records: EnsureImageExists (IfNotPresent, present) under each policy",
        &["concurrency", "path", "p50", "p99", "req/s", "p50 / direct", "p50 / NeverVerify"],
    );
    for &concurrency in sizes.concurrencies {
        let runs = take_turns(&sides, concurrency, sizes).await;
        let off = runs[1].quantile_us(0.5);
        for ((path, _), run) in sides.iter().zip(&runs) {
            table.row(report::side_row(concurrency, path, run, &[&runs[0], &runs[1]]));
        }
        if concurrency == 1 {
            let ratio = f64::from(runs[2].quantile_us(0.5)) / f64::from(off);
            findings.verdicts.push(Verdict {
                what: "presence path p50, AlwaysVerify with 10,000 records / NeverVerify, concurrency 1".into(),
                target: "≤ 1.10".into(),
                measured: format!(
                    "{ratio:.2} ({} vs {})",
                    report::micros(runs[2].quantile_us(0.5)),
                    report::micros(off)
                ),
                met: ratio <= 1.10,
            });
        }
    }
    let checks = always.metric("cri_imaged_imagemanager_image_mustpull_checks_total");
    assert!(checks > 0.0, "every AlwaysVerify presence answer was checked against the records");
    findings.tables.push(table);
}

async fn until_serving(socket: &Path, since: Instant) -> Option<Duration> {
    let request = HealthCheckRequest { service: IMAGE_MANAGER_SERVICE.into() };
    while since.elapsed() < Duration::from_secs(5) {
        let mut client = HealthClient::new(unix_channel(socket));
        if let Ok(answer) = client.check(request.clone()).await
            && answer.into_inner().status == ServingStatus::Serving as i32
        {
            return Some(since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    None
}

/// One call of a presence-path side, boxed so that sides of different kinds share a loop.
type PresenceCall = Arc<dyn Fn(usize) -> PresenceFuture + Send + Sync>;
type PresenceFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// EnsureImageExists(IfNotPresent) for a present image through `client`.
fn through_daemon(client: &ImageManagerClient<Channel>, image: &str) -> PresenceCall {
    calling(client, ensure_request(image, "presence"), false)
}

/// `request` through `client`, each caller as a pod of its own; every answer must say whether
/// the image was `pulled`.
fn calling(client: &ImageManagerClient<Channel>, request: EnsureImageExistsRequest, pulled: bool) -> PresenceCall {
    let client = client.clone();
    Arc::new(move |caller| {
        let mut request = request.clone();
        if let Some(pod) = &mut request.pod {
            pod.uid = format!("{}-{caller}", pod.uid);
        }
        let mut client = client.clone();
        Box::pin(async move {
            let response = client.ensure_image_exists(request).await.map_err(|status| status.to_string())?;
            match (response.into_inner().pulled, pulled) {
                (true, false) => Err("pulled an image that was present".to_owned()),
                (false, true) => Err("did not pull with policy Always".to_owned()),
                _ => Ok(()),
            }
        })
    })
}

/// A pod's 100 pull secrets of 50 registries each, against none: on the presence path (carried,
/// never read), on the pull path (Always: read and matched, then a real pull); then the presence
/// path reading them (see [`credentials::verified_presence`]) and the lookup alone, in process.
async fn pull_credentials(bench: &Bench, findings: &mut Findings) {
    let (image, sizes) = (bench.images.present.as_str(), bench.sizes);
    // No registry limit: every Always call must reach containerd.
    let daemon = Daemon::start(bench, "credentials", &["--registry-qps", "0"]).await;
    ensure(&daemon.client, image, "warm-up").await.expect("the present image is pulled");
    let secrets = credentials::pull_secrets(&bench.stack.registry);
    let request = ensure_request(image, "credentials");
    let with_secrets = EnsureImageExistsRequest { pull_secrets: secrets.clone(), ..request.clone() };
    let always = |request: &EnsureImageExistsRequest| EnsureImageExistsRequest {
        pull_policy: PullPolicy::Always as i32,
        ..request.clone()
    };
    let secrets_label = format!("{} secrets × {} registries", credentials::SECRETS, credentials::ENTRIES);
    let request_kib = prost::Message::encoded_len(&with_secrets) / 1024;
    let mut table = Table::new(
        format!(
            "Pull credentials: EnsureImageExists with a pod's pull secrets ({request_kib} KiB a request) against the same call without"
        ),
        &["path", "concurrency", "secrets", "p50", "p99", "req/s", "p50 / no secrets"],
    );
    let paths = [
        ("presence (IfNotPresent, present)", request.clone(), with_secrets.clone(), false, sizes.concurrencies),
        ("pull (Always, warm)", always(&request), always(&with_secrets), true, &sizes.concurrencies[..1]),
    ];
    let mut presence_without_us = None;
    for (path, without, with, pulled, concurrencies) in paths {
        let sides = [
            ("none", calling(&daemon.client, without, pulled)),
            (secrets_label.as_str(), calling(&daemon.client, with, pulled)),
        ];
        for &concurrency in concurrencies {
            let runs = take_turns(&sides, concurrency, sizes).await;
            let baseline = runs[0].quantile_us(0.5);
            if !pulled && concurrency == 1 {
                presence_without_us = Some(baseline);
            }
            for ((label, _), run) in sides.iter().zip(&runs) {
                let [p50, p99, per_second] = report::latency_cells(run);
                table.row(vec![
                    path.to_owned(),
                    concurrency.to_string(),
                    (*label).to_owned(),
                    p50,
                    p99,
                    per_second,
                    report::ratio(run.quantile_us(0.5).into(), baseline.into()),
                ]);
            }
            if !pulled && (concurrency == 1 || concurrency == 64) {
                findings.verdicts.push(credentials::ratio_verdict(
                    format!(
                        "presence p50 with {secrets_label} / without (carried, not read), concurrency {concurrency}"
                    ),
                    &runs[1],
                    &runs[0],
                ));
            }
        }
    }
    findings.tables.push(table);
    let rounds = if sizes.pairs > 1 { 1000 } else { 10 };
    let without_us = presence_without_us.expect("the presence path is measured at one caller");
    credentials::request_bytes(&with_secrets, without_us, rounds, findings);
    credentials::verified_presence(bench, &secrets, findings).await;
    credentials::lookup(bench, &ALLOCATOR, &secrets, findings).await;
}

/// CRI ImageStatus for a present image, straight to the runtime (containerd, or the CRI-O the
/// crio section is named), with the project's CRI client.
fn straight_to_runtime(direct: &Arc<CriClient>, image: &str) -> PresenceCall {
    let (direct, image) = (direct.clone(), image.to_owned());
    Arc::new(move |_| {
        let (direct, spec) = (direct.clone(), ImageSpec { image: image.clone(), ..Default::default() });
        Box::pin(async move {
            match direct.image_status(spec).await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err("the runtime says the image is absent".to_owned()),
                Err(error) => Err(error.to_string()),
            }
        })
    })
}

/// EnsureImageExists on a present image through cri-imaged (as shipped, and asking containerd
/// every time as the kubelet does) against ImageStatus on containerd directly.
async fn presence(bench: &Bench, daemon: &Daemon, findings: &mut Findings) {
    let (image, sizes) = (bench.images.present.as_str(), bench.sizes);
    let uncached = Daemon::start(bench, "uncached", &["--presence-cache=false"]).await;
    let strict = Daemon::start(bench, "strict", &["--presence-cache-max-staleness=0s"]).await;
    // The node's image policy (issue 49): everything refused but the bench's registry, whose
    // scope the image is judged under at every request.
    let policy_file = bench.work.path().join("policy.json");
    let policy = serde_json::json!({
        "default": [{ "type": "reject" }],
        "transports": { "docker": { bench.stack.registry.as_str(): [{ "type": "insecureAcceptAnything" }] } }
    });
    std::fs::write(&policy_file, policy.to_string()).expect("the policy file");
    let policy_flag = format!("--signature-policy={}", policy_file.display());
    let with_policy = Daemon::start(bench, "policy", &[policy_flag.as_str()]).await;
    for client in [&daemon.client, &uncached.client, &strict.client, &with_policy.client] {
        ensure(client, image, "warm-up").await.expect("the present image is pulled");
    }
    let sides: [(&str, PresenceCall); 5] = [
        ("containerd directly", straight_to_runtime(&bench.direct, image)),
        ("cri-imaged", through_daemon(&daemon.client, image)),
        ("cri-imaged --presence-cache=false", through_daemon(&uncached.client, image)),
        ("cri-imaged --presence-cache-max-staleness=0s", through_daemon(&strict.client, image)),
        ("cri-imaged --signature-policy (scope accepted)", through_daemon(&with_policy.client, image)),
    ];
    let mut table = Table::new(
        "Presence path: EnsureImageExists (IfNotPresent, image present) through cri-imaged vs ImageStatus on containerd",
        &["concurrency", "path", "p50", "p99", "req/s", "p50 / direct", "req/s / direct"],
    );
    for &concurrency in sizes.concurrencies {
        let runs = take_turns(&sides, concurrency, sizes).await;
        let direct = rows_against_direct(&mut table, concurrency, &sides, &runs);
        let shipped = &runs[1];
        let p50_ratio = f64::from(shipped.quantile_us(0.5)) / f64::from(direct.0);
        let rps_ratio = shipped.requests_per_second() / direct.1;
        if concurrency == 1 {
            findings.verdicts.push(Verdict {
                what: "presence path p50, cri-imaged / direct, concurrency 1".into(),
                target: "≤ 1.15".into(),
                measured: format!(
                    "{p50_ratio:.2} ({} vs {})",
                    report::micros(shipped.quantile_us(0.5)),
                    report::micros(direct.0)
                ),
                met: p50_ratio <= 1.15,
            });
            let judged = f64::from(runs[4].quantile_us(0.5)) / f64::from(shipped.quantile_us(0.5));
            findings.verdicts.push(Verdict {
                what: "presence path p50, with an image policy / without, concurrency 1".into(),
                target: "≤ 1.05".into(),
                measured: format!(
                    "{judged:.2} ({} vs {})",
                    report::micros(runs[4].quantile_us(0.5)),
                    report::micros(shipped.quantile_us(0.5))
                ),
                met: judged <= 1.05,
            });
        }
        if concurrency == 16 {
            findings.verdicts.push(Verdict {
                what: "presence path throughput, cri-imaged / direct, concurrency 16".into(),
                target: "≥ 0.90".into(),
                measured: format!("{rps_ratio:.2} ({:.0} vs {:.0} req/s)", shipped.requests_per_second(), direct.1),
                met: rps_ratio >= 0.9,
            });
        }
    }
    findings.tables.push(table);
}

/// For each staleness setting: an image is pulled on containerd, answered from cri-imaged's
/// memory, removed on containerd directly (behind cri-imaged's back), and then asked about with
/// policy Never, back to back, until cri-imaged says it is absent. The window is how long after
/// the removal returned the last "present" answer was asked.
async fn staleness(bench: &Bench, findings: &mut Findings) {
    let image = bench.stack.image("bench/removed:v1");
    let spec = || cri_imaged::cri::ImageSpec { image: image.clone(), ..Default::default() };
    let mut containerd = ImageServiceClient::new(unix_channel(&bench.stack.containerd_socket));
    let mut table = Table::new(
        "Staleness: removals behind cri-imaged's back (on containerd directly), then EnsureImageExists(Never) until absent",
        &[
            "--presence-cache-max-staleness",
            "removals",
            "removals answered present after",
            "stale answers",
            "window p99",
            "window max",
        ],
    );
    for setting in [format!("{}ms", DEFAULT_MAX_STALENESS.as_millis()), "0s".to_owned()] {
        let daemon = Daemon::start(
            bench,
            &format!("staleness-{setting}"),
            &[&format!("--presence-cache-max-staleness={setting}")],
        )
        .await;
        let mut client = daemon.client.clone();
        let (mut windows, mut stale_answers) = (Vec::new(), 0usize);
        for _ in 0..bench.sizes.removals {
            let pull = PullSpec { image: spec(), ..Default::default() };
            bench.direct.pull_image(pull).await.expect("containerd pulls");
            for _ in 0..2 {
                ensure(&client, &image, "staleness").await.expect("present");
            }
            containerd.remove_image(RemoveImageRequest { image: Some(spec()) }).await.expect("containerd removes");
            let removed = Instant::now();
            let mut window = Duration::ZERO;
            for _ in 0..100_000 {
                let asked = removed.elapsed();
                let mut never = ensure_request(&image, "staleness");
                never.pull_policy = PullPolicy::Never as i32;
                if client.ensure_image_exists(never).await.is_err() {
                    break;
                }
                stale_answers += 1;
                window = asked;
            }
            windows.push(window);
        }
        windows.sort();
        let stale_removals = windows.iter().filter(|window| !window.is_zero()).count();
        let quantile = |q: f64| windows[((windows.len() - 1) as f64 * q).round() as usize];
        table.row(vec![
            setting,
            windows.len().to_string(),
            stale_removals.to_string(),
            stale_answers.to_string(),
            report::duration(quantile(0.99)),
            report::duration(quantile(1.0)),
        ]);
    }
    findings.tables.push(table);
}

/// Runs each side in a closed loop of `concurrency` callers, taking turns: every side is warmed
/// (connections, caches) first, then the order reverses each round (A B C C B A ...) so that
/// drift over time falls on every side alike. Each side's run, sorted, without errors.
/// A row per side at `concurrency` (p50, p99, req/s, and both against the first side, the runtime
/// asked directly); the first side's p50 and req/s.
fn rows_against_direct(
    table: &mut report::Table,
    concurrency: usize,
    sides: &[(&str, PresenceCall)],
    runs: &[Run],
) -> (u32, f64) {
    let direct = (runs[0].quantile_us(0.5), runs[0].requests_per_second());
    for ((path, _), run) in sides.iter().zip(runs) {
        let [p50, p99, per_second] = report::latency_cells(run);
        table.row(vec![
            concurrency.to_string(),
            (*path).to_owned(),
            p50,
            p99,
            per_second,
            report::ratio(run.quantile_us(0.5).into(), direct.0.into()),
            report::ratio(run.requests_per_second(), direct.1),
        ]);
    }
    direct
}

async fn take_turns(sides: &[(&str, PresenceCall)], concurrency: usize, sizes: &Sizes) -> Vec<Run> {
    let mut runs: Vec<Run> = sides.iter().map(|_| Run::default()).collect();
    for (_, call) in sides {
        load::closed_loop(concurrency, sizes.turn / 2, call_of(call)).await;
    }
    for round in 0..sizes.pairs * 2 {
        let order: Vec<usize> =
            if round % 2 == 0 { (0..sides.len()).collect() } else { (0..sides.len()).rev().collect() };
        for side in order {
            runs[side].absorb(load::closed_loop(concurrency, sizes.turn, call_of(&sides[side].1)).await);
        }
    }
    for ((path, _), run) in sides.iter().zip(&mut runs) {
        assert!(run.errors.is_empty(), "{path}: {} errors, first: {}", run.errors.len(), run.errors[0]);
        assert!(!run.latencies_us.is_empty(), "{path}: no call completed");
        run.sort();
    }
    runs
}

/// A presence call in the shape the closed loop takes.
fn call_of(call: &PresenceCall) -> impl Fn(usize) -> PresenceFuture + Clone + use<> {
    let call = call.clone();
    move |caller| call(caller)
}

/// One side of a herd.
struct HerdRow {
    herd: load::Herd,
    resolutions: usize,
    runtime_pulls: usize,
}

impl HerdRow {
    fn cells(&self, size: usize, path: &str) -> Vec<String> {
        vec![
            size.to_string(),
            path.into(),
            report::duration(self.herd.wall),
            self.resolutions.to_string(),
            self.runtime_pulls.to_string(),
        ]
    }
}

/// `size` pods ask cri-imaged for `image` at once; also the daemon's memory, peak included.
async fn herd_through(bench: &Bench, daemon: &Daemon, size: usize, image: &str) -> (HerdRow, memory::Resident) {
    memory::reset_peak(daemon.pid());
    let pulls_before = daemon.metric("cri_imaged_pulls_total");
    let herd = ensure_herd(&daemon.client, image, size, &format!("herd-{size}")).await;
    assert!(herd.errors.is_empty(), "herd through cri-imaged: {} errors, first: {}", herd.errors.len(), herd.errors[0]);
    let resident = memory::resident(daemon.pid());
    let row = herd_row(&bench.stack, herd, image);
    let upstream = daemon.metric("cri_imaged_pulls_total") - pulls_before;
    assert_eq!(upstream as usize, row.runtime_pulls, "cri-imaged's pull count agrees with containerd's log");
    (row, resident)
}

/// `size` pods (uids `PODS-0`, `PODS-1`, ...) ask cri-imaged for `image` at once; an answer
/// without an image ref is an error.
async fn ensure_herd(client: &ImageManagerClient<Channel>, image: &str, size: usize, pods: &str) -> load::Herd {
    let (client, image, pods) = (client.clone(), image.to_owned(), pods.to_owned());
    load::herd(size, move |index| {
        let call = ensure(&client, &image, &format!("{pods}-{index}"));
        async move {
            let response = call.await.map_err(|status| status.to_string())?;
            if response.image_ref.is_empty() { Err("no image ref".to_owned()) } else { Ok(()) }
        }
    })
    .await
}

/// `size` CRI PullImage calls for `image` straight to containerd at once.
async fn herd_direct(bench: &Bench, size: usize, image: &str) -> HerdRow {
    let herd = {
        let (direct, image) = (bench.direct.clone(), image.to_owned());
        load::herd(size, move |_| {
            let direct = direct.clone();
            let spec =
                PullSpec { image: ImageSpec { image: image.clone(), ..Default::default() }, ..Default::default() };
            async move { direct.pull_image(spec).await.map(drop).map_err(|error| error.to_string()) }
        })
        .await
    };
    assert!(herd.errors.is_empty(), "herd on containerd: {} errors, first: {}", herd.errors.len(), herd.errors[0]);
    herd_row(&bench.stack, herd, image)
}

/// A herd's figures with what the registry and containerd counted for `image`.
fn herd_row(stack: &LocalStack, herd: load::Herd, image: &str) -> HerdRow {
    let repository = image.split_once('/').map(|(_, path)| path).unwrap_or(image);
    let (repository, tag) = repository.rsplit_once(':').expect("a tagged image");
    HerdRow {
        herd,
        resolutions: stack.manifest_resolutions(repository, tag),
        runtime_pulls: stack.runtime_pulls(image),
    }
}

/// A daemon that remembers `entries` failed (pod, image) pulls: its resident growth per entry,
/// and the store's own heap counted exactly.
async fn backoff(bench: &Bench, findings: &mut Findings) {
    let (absent, entries) = (bench.images.absent.as_str(), bench.sizes.backoff_entries);
    let warm_up = entries / 100;
    let capacity = (warm_up + entries).to_string();
    let daemon = Daemon::start(bench, "backoff", &["--image-pull-backoff-max-entries", &capacity]).await;
    let fail = |range: std::ops::Range<usize>| {
        let client = daemon.client.clone();
        let absent = absent.to_owned();
        load::for_each(range, 64, move |index| {
            let call = ensure(&client, &absent, &memory::pod_uid(index));
            async move {
                match call.await {
                    Ok(_) => Err("an absent image was pulled".to_owned()),
                    Err(status) if support::reason(&status) == "ErrImagePull" => Ok(()),
                    Err(status) => Err(format!("unexpected answer: {status:?}")),
                }
            }
        })
    };
    // The first requests grow connection buffers and task slabs; only the entries after them count.
    let errors = fail(0..warm_up).await;
    assert!(errors.is_empty(), "warm-up: {} errors, first: {}", errors.len(), errors[0]);
    let before = memory::resident(daemon.pid());
    let errors = fail(warm_up..warm_up + entries).await;
    assert!(errors.is_empty(), "backoff fill: {} errors, first: {}", errors.len(), errors[0]);
    let after = memory::resident(daemon.pid());
    let remembered = daemon.metric("cri_imaged_backoff_entries") as usize;
    assert_eq!(remembered, warm_up + entries, "the daemon remembers every (pod, image)");

    let growth_per_entry = after.now_kib.saturating_sub(before.now_kib) as f64 * 1024.0 / entries as f64;
    findings.memory.row(vec![
        format!("after {entries} backoff entries"),
        report::mib(after.now_kib),
        report::mib(after.peak_kib),
        "≤ 200 B per entry".into(),
    ]);
    let exact = memory::backoff_store_cost(&ALLOCATOR, entries, absent);
    let mut table = Table::new(
        format!("Backoff store: {entries} distinct (pod, image) entries"),
        &["measure", "bytes per entry", "allocations per entry"],
    );
    table.row(vec!["daemon resident growth".into(), format!("{growth_per_entry:.0}"), "-".into()]);
    table.row(vec![
        "store heap, counted by allocator".into(),
        format!("{:.0}", exact.bytes_per_entry),
        format!("{:.2}", exact.allocations_per_entry),
    ]);
    findings.tables.push(table);
    findings.verdicts.push(Verdict {
        what: "backoff store memory per (pod, image) entry (daemon resident growth)".into(),
        target: "≤ 200 B".into(),
        measured: format!("{growth_per_entry:.0} B (heap counted: {:.0} B)", exact.bytes_per_entry),
        met: growth_per_entry <= 200.0,
    });
}

/// What the figures were measured on.
fn machine() -> Vec<(&'static str, String)> {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let output = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
            .unwrap_or_else(|error| format!("({program}: {error})"))
    };
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .map(|rest| rest.trim_start_matches([' ', '\t', ':']));
    let meminfo = read("/proc/meminfo");
    let memory_kib = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    let os = read("/etc/os-release")
        .lines()
        .find_map(|line| line.strip_prefix("PRETTY_NAME=").map(|name| name.trim_matches('"').to_owned()))
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    vec![
        ("date", output("date", &["-u", "+%Y-%m-%d %H:%M UTC"])),
        ("cores", cores.to_string()),
        ("cpu", cpu.unwrap_or("unknown").to_owned()),
        ("memory", format!("{:.1} GiB", memory_kib as f64 / 1024.0 / 1024.0)),
        ("os", format!("{os}, kernel {}", read("/proc/sys/kernel/osrelease").trim())),
        ("containerd", output("containerd", &["--version"])),
        (
            "build",
            if cfg!(debug_assertions) { "debug: a smoke run, figures mean nothing".into() } else { "release".into() },
        ),
        (
            "note",
            "load generator, cri-imaged and containerd share the same cores; absolute figures vary between machines, \
             the ratios much less"
                .into(),
        ),
    ]
}
