//! cri-imaged in front of an external CRI runtime named by `--crio-endpoint` (CRI-O, issue 58),
//! with the stack's loopback registry: the presence path with CRI-O's image store watched
//! against CRI-O's own ImageStatus, and healthy pods beside a hung registry. The runtime is not
//! started here (none is installable from a registry): with no endpoint named, the section says
//! it is skipped. CRI-O must pull plain HTTP from the stack's registry on 127.0.0.1 (any port),
//! e.g. `[[registry]] location = "127.0.0.1"` with `insecure = true` in its registries.conf.

use std::{path::PathBuf, sync::Arc, time::Duration};

use cri_imaged::{api::PullPolicy, presence::DEFAULT_MAX_STALENESS};
use cri_imaged::{
    api::{GetStatusRequest, image_manager_client::ImageManagerClient},
    cri::{
        ImageSpec, RemoveImageRequest, VersionRequest, image_service_client::ImageServiceClient,
        runtime_service_client::RuntimeServiceClient,
    },
    runtime::{CriClient, ImageRuntime, PullSpec, RuntimeEndpoint},
};
use tokio::time::Instant;

use crate::{
    Bench, Daemon, Findings, PresenceCall, ensure, ensure_request,
    events::median,
    registries::{BesideHung, HungPods, beside_a_hung_registry, healthy_alone},
    report::{self, Table, Verdict},
    rows_against_direct, straight_to_runtime,
    support::{registry_faults::HungRegistry, unix_channel},
    take_turns, through_daemon,
};

/// The targets on CRI-O: presence p50 at concurrency 1 and throughput at 16, both
/// against CRI-O's own ImageStatus; healthy pods beside a hung registry against alone.
const PRESENCE_P50_AT_MOST: f64 = 0.8;
const PRESENCE_THROUGHPUT_AT_LEAST: f64 = 1.5;
const BESIDE_HUNG_AT_MOST: f64 = 2.0;
const HUNG_ANSWERED_WITHIN: Duration = Duration::from_secs(60);

/// The hung-registry rows' sizes: the in a full run, tiny ones in a smoke run.
struct Shape {
    hung_pods: usize,
    hung_images: usize,
    healthy_pods: usize,
    healthy_bytes: u64,
    deadline: Duration,
    hung_first: Duration,
}

const FULL: Shape = Shape {
    hung_pods: 50,
    hung_images: 10,
    healthy_pods: 10,
    healthy_bytes: 1_000_000,
    deadline: Duration::from_secs(150),
    hung_first: Duration::from_secs(1),
};

const QUICK: Shape = Shape {
    hung_pods: 6,
    hung_images: 2,
    healthy_pods: 3,
    healthy_bytes: 100_000,
    deadline: Duration::from_secs(30),
    hung_first: Duration::from_millis(300),
};

/// The external runtime: its socket and a client of its own.
struct Runtime {
    socket: PathBuf,
    direct: Arc<CriClient>,
}

pub async fn run(bench: &Bench, findings: &mut Findings) {
    let Some(endpoint) = bench.crio_endpoint.as_deref() else {
        let line = "CRI-O: skipped, no external CRI runtime named (--crio-endpoint unix:///PATH/crio.sock)";
        progress!("{line}");
        let mut table = Table::new("CRI-O", &["skipped"]);
        table.row(vec![line.into()]);
        findings.tables.push(table);
        return;
    };
    let parsed = RuntimeEndpoint::parse(endpoint).unwrap_or_else(|error| panic!("--crio-endpoint {endpoint}: {error}"));
    let socket = PathBuf::from(endpoint.strip_prefix("unix://").unwrap_or(endpoint));
    let direct = Arc::new(CriClient::new(&parsed, Duration::from_secs(120)));
    let version = RuntimeServiceClient::new(unix_channel(&socket))
        .version(VersionRequest::default())
        .await
        .unwrap_or_else(|error| panic!("the runtime at {endpoint} does not answer Version: {error}"))
        .into_inner();
    let runtime = Runtime { socket, direct };
    progress!("CRI-O section: {} {} at {endpoint}", version.runtime_name, version.runtime_version);
    presence(bench, &runtime, &format!("{} {}", version.runtime_name, version.runtime_version), findings).await;
    staleness(bench, &runtime, findings).await;
    hung_registry(bench, &runtime, findings).await;
}

impl Runtime {
    /// cri-imaged at its defaults (the bench's own flags and `extra` aside) in front of this
    /// runtime, on `WORK/name.sock`.
    async fn daemon(&self, bench: &Bench, name: &str, extra: &[&str]) -> Daemon {
        Daemon::start_on(bench, name, &self.socket, extra).await
    }

    fn images(&self) -> ImageServiceClient<tonic::transport::Channel> {
        ImageServiceClient::new(unix_channel(&self.socket))
    }

    /// Removes `images` from the runtime, so that the next rows start cold; one that never
    /// arrived is no error.
    async fn remove(&self, images: &[String]) {
        let mut client = self.images();
        for image in images {
            let spec = Some(ImageSpec { image: image.clone(), ..Default::default() });
            let _ = client.remove_image(RemoveImageRequest { image: spec }).await;
        }
    }
}

/// The change signal the daemon behind `client` keeps its presence cache with (`status`'s
/// presence line).
async fn presence_signal(client: &ImageManagerClient<tonic::transport::Channel>) -> String {
    let mut client = client.clone();
    let status = client.get_status(GetStatusRequest::default()).await.expect("GetStatus").into_inner();
    status.presence_cache_signal
}

/// EnsureImageExists (IfNotPresent, present) through cri-imaged against ImageStatus on the
/// runtime, at each concurrency, turns alternating.
async fn presence(bench: &Bench, runtime: &Runtime, version: &str, findings: &mut Findings) {
    let image = bench.stack.image("crio/present:v1");
    bench.stack.seed("crio/present:v1", "present on CRI-O");
    let daemon = runtime.daemon(bench, "crio-presence", &[]).await;
    // What CRI-O users had before the store watcher: every check asks the runtime.
    let uncached = runtime.daemon(bench, "crio-uncached", &["--presence-cache=false"]).await;
    ensure(&daemon.client, &image, "warm-up").await.expect("the present image is pulled through cri-imaged");
    let signal = presence_signal(&daemon.client).await;
    let watched = signal.starts_with("image store");
    findings.verdicts.push(Verdict {
        what: "CRI-O: presence answered from memory by the image store watcher".into(),
        target: "image store".into(),
        measured: signal.clone(),
        met: watched,
    });
    let sides: [(&str, PresenceCall); 3] = [
        ("CRI-O directly (ImageStatus)", straight_to_runtime(&runtime.direct, &image)),
        ("cri-imaged (EnsureImageExists)", through_daemon(&daemon.client, &image)),
        ("cri-imaged --presence-cache=false", through_daemon(&uncached.client, &image)),
    ];
    let hits_before = daemon.metric("cri_imaged_presence_cache_hits_total");
    let mut table = Table::new(
        format!(
            "CRI-O ({version}): presence, EnsureImageExists (IfNotPresent, image present) through cri-imaged ({signal}) vs ImageStatus on CRI-O"
        ),
        &["concurrency", "path", "p50", "p99", "req/s", "p50 / direct", "req/s / direct"],
    );
    for &concurrency in bench.sizes.concurrencies {
        let runs = take_turns(&sides, concurrency, bench.sizes).await;
        let direct = rows_against_direct(&mut table, concurrency, &sides, &runs);
        let ours = &runs[1];
        if concurrency == 1 {
            let ratio = f64::from(ours.quantile_us(0.5)) / f64::from(direct.0);
            findings.verdicts.push(Verdict {
                what: "CRI-O: presence p50, cri-imaged / CRI-O's ImageStatus, concurrency 1".into(),
                target: format!("≤ {PRESENCE_P50_AT_MOST}"),
                measured: format!(
                    "{ratio:.2} ({} vs {})",
                    report::micros(ours.quantile_us(0.5)),
                    report::micros(direct.0)
                ),
                met: ratio <= PRESENCE_P50_AT_MOST,
            });
        }
        if concurrency == 16 {
            let ratio = ours.requests_per_second() / direct.1;
            findings.verdicts.push(Verdict {
                what: "CRI-O: presence throughput, cri-imaged / CRI-O's ImageStatus, concurrency 16".into(),
                target: format!("≥ {PRESENCE_THROUGHPUT_AT_LEAST}"),
                measured: format!("{ratio:.2} ({:.0} vs {:.0} req/s)", ours.requests_per_second(), direct.1),
                met: ratio >= PRESENCE_THROUGHPUT_AT_LEAST,
            });
        }
    }
    let hits = daemon.metric("cri_imaged_presence_cache_hits_total") - hits_before;
    let barriers = daemon.metric("cri_imaged_presence_cache_barriers_total");
    progress!("  CRI-O presence: {hits} answers from memory, {barriers} barriers (inotify queue read dry)");
    findings.tables.push(table);
}

/// The staleness contract on the image store: removals on the runtime behind cri-imaged's back,
/// then EnsureImageExists(Never) until it answers absent; how long after each removal the image
/// was still called present, at the default `--presence-cache-max-staleness` and at `0s`.
async fn staleness(bench: &Bench, runtime: &Runtime, findings: &mut Findings) {
    let name = "crio/removed:v1";
    bench.stack.seed(name, "removed behind cri-imaged's back on CRI-O");
    let image = bench.stack.image(name);
    let spec = || ImageSpec { image: image.clone(), ..Default::default() };
    let removals = bench.sizes.removals;
    progress!("  CRI-O staleness: {removals} removals behind the daemon's back per setting");
    let mut table = Table::new(
        "CRI-O: removals behind cri-imaged's back (on CRI-O directly), then EnsureImageExists(Never) until absent",
        &[
            "--presence-cache-max-staleness",
            "removals",
            "removals answered present after",
            "stale answers",
            "window max",
            "target",
        ],
    );
    for (setting, limit) in
        [(format!("{}ms", DEFAULT_MAX_STALENESS.as_millis()), DEFAULT_MAX_STALENESS), ("0s".to_owned(), Duration::ZERO)]
    {
        let flag = format!("--presence-cache-max-staleness={setting}");
        let daemon = runtime.daemon(bench, &format!("crio-staleness-{setting}"), &[flag.as_str()]).await;
        let mut client = daemon.client.clone();
        let mut images = runtime.images();
        let (mut longest, mut stale_removals, mut stale_answers) = (Duration::ZERO, 0usize, 0usize);
        for _ in 0..removals {
            runtime.direct.pull_image(PullSpec { image: spec(), ..Default::default() }).await.expect("CRI-O pulls");
            for _ in 0..2 {
                ensure(&client, &image, "staleness").await.expect("present");
            }
            images.remove_image(RemoveImageRequest { image: Some(spec()) }).await.expect("CRI-O removes");
            let removed = Instant::now();
            let mut window = None;
            for _ in 0..100_000 {
                let asked = removed.elapsed();
                let mut never = ensure_request(&image, "staleness");
                never.pull_policy = PullPolicy::Never as i32;
                if client.ensure_image_exists(never).await.is_err() {
                    break;
                }
                stale_answers += 1;
                window = Some(asked);
            }
            if let Some(window) = window {
                stale_removals += 1;
                longest = longest.max(window);
            }
        }
        let met = if limit.is_zero() { stale_answers == 0 } else { longest <= limit };
        let target =
            if limit.is_zero() { "no stale answer".to_owned() } else { format!("≤ {}", report::duration(limit)) };
        table.row(vec![
            setting.clone(),
            removals.to_string(),
            stale_removals.to_string(),
            stale_answers.to_string(),
            report::duration(longest),
            target.clone(),
        ]);
        findings.verdicts.push(Verdict {
            what: format!("CRI-O: longest a removal behind cri-imaged's back was answered present ({flag})"),
            target,
            measured: format!("{} ({stale_answers} stale answers)", report::duration(longest)),
            met,
        });
    }
    findings.tables.push(table);
}

/// Pods on a registry that accepts connections and never answers, then healthy pods on the
/// loopback registry: the healthy pods' p50 against the same pods alone, and how every hung pod
/// was answered. Images are new each time, and removed from the runtime after.
async fn hung_registry(bench: &Bench, runtime: &Runtime, findings: &mut Findings) {
    let shape = if bench.sizes.pairs > 1 { &FULL } else { &QUICK };
    progress!(
        "  CRI-O: {} pods on the loopback registry behind {} pods ({} images) on a hung one, deadline {}",
        shape.healthy_pods,
        shape.hung_pods,
        shape.hung_images,
        report::duration(shape.deadline)
    );
    let push = |name: &str| -> Vec<String> {
        (0..shape.healthy_pods)
            .map(|pod| {
                let name = format!("crio/{name}-{pod}:v1");
                bench.stack.seed_sized(&name, shape.healthy_bytes);
                bench.stack.image(&name)
            })
            .collect()
    };
    let hung = HungRegistry::start().await;
    let healthy = push("healthy-beside");
    let daemon = runtime.daemon(bench, "crio-hung", &[]).await;
    let started = Instant::now();
    let hung_pods = HungPods { pods: shape.hung_pods, images: shape.hung_images, first: shape.hung_first };
    let BesideHung { beside, beside_answered, last_hung, hung_answered, unavailable } =
        beside_a_hung_registry(&daemon.client, &hung, hung_pods, &healthy, shape.deadline).await;
    progress!("  CRI-O: hung pods answered within {}", report::duration(started.elapsed()));
    drop(daemon);
    drop(hung);
    runtime.remove(&healthy).await;

    let alone_images = push("healthy-alone");
    let daemon = runtime.daemon(bench, "crio-alone", &[]).await;
    let alone = healthy_alone(&daemon.client, &alone_images, shape.deadline, "CRI-O").await;
    drop(daemon);
    runtime.remove(&alone_images).await;

    let (beside, alone) = (median(beside), median(alone));
    let ratio = beside.as_secs_f64() / alone.as_secs_f64();
    let pods = shape.healthy_pods;
    let mut table = Table::new(
        format!(
            "CRI-O: a hung registry ({} pods, {} images) beside {pods} healthy pods",
            shape.hung_pods, shape.hung_images
        ),
        &["row", "cri-imaged", "baseline", "ratio", "target"],
    );
    table.row(vec![
        format!("p50 time to answer, {pods} pods beside {} on a hung registry", shape.hung_pods),
        format!("{} ({beside_answered} of {pods} answered)", report::duration(beside)),
        format!("{} (the same pods alone)", report::duration(alone)),
        format!("{ratio:.2}"),
        format!("≤ {BESIDE_HUNG_AT_MOST}"),
    ]);
    findings.verdicts.push(Verdict {
        what: "CRI-O: p50 time to answer of healthy pods beside a hung registry / alone".into(),
        target: format!("≤ {BESIDE_HUNG_AT_MOST}, all answered"),
        measured: format!("{ratio:.2} ({beside_answered} of {pods} answered)"),
        met: ratio <= BESIDE_HUNG_AT_MOST && beside_answered == pods,
    });
    let limit = HUNG_ANSWERED_WITHIN.min(shape.deadline / 2);
    let measured = format!(
        "{} ({hung_answered} of {} answered, {unavailable} RegistryUnavailable)",
        report::duration(last_hung),
        shape.hung_pods
    );
    table.row(vec![
        format!(
            "time until every pod on the hung registry has its answer (deadline {})",
            report::duration(shape.deadline)
        ),
        measured.clone(),
        "-".into(),
        "-".into(),
        format!("≤ {}, all RegistryUnavailable", report::duration(limit)),
    ]);
    findings.verdicts.push(Verdict {
        what: "CRI-O: time until every pod on a hung registry has RegistryUnavailable".into(),
        target: format!("≤ {}, all RegistryUnavailable", report::duration(limit)),
        measured,
        met: unavailable == shape.hung_pods && last_hung <= limit,
    });
    findings.tables.push(table);
}
