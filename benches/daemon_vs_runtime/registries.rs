//! Registries over a shaped link (issue 31): the registry in a network namespace of its own
//! behind 100 Mbit, 50 ms of round trip and 0.1 % loss (`support::netrig`), images of realistic
//! shapes, a registry that hangs and one that answers 429 (`support::registry_faults`). What a
//! pod feels (time to pulled, time to an answer) and what a registry feels (requests, bytes),
//! through cri-imaged and straight to containerd, ratios from one run.

use std::{future::Future, time::Duration};

use cri_imaged::api::image_manager_client::ImageManagerClient;
use cri_imaged::cri::{ImageSpec, PullImageRequest, RemoveImageRequest, image_service_client::ImageServiceClient};
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::{
    Bench, Daemon, Findings, ensure_request,
    events::median,
    report::{self, Table, Verdict},
    support::{
        netrig::{LinkShape, NetRig},
        process::metric_with_label,
        reason,
        registry_faults::{HungRegistry, RateLimitProxy, Refusal},
        unix_channel,
    },
};

pub(crate) const MB: u64 = 1_000_000;

/// The section's sizes: the issue's in a full run, tiny ones in the smoke run.
struct Shape {
    link: LinkShape,
    /// Row 1: the image's (bytes, layers), and pulls of it per side (ABBA order).
    one: (u64, usize),
    one_rounds: usize,
    /// Rows 2–3: the big image, the small ones and how many of those.
    huge: (u64, usize),
    small: (u64, usize),
    smalls: usize,
    /// How long after the big pull the small ones are queued.
    queued_after: Duration,
    /// Rows 4–5: pods on the hung registry, over how many images; pods on the healthy one and
    /// their images' shape; each call's deadline; how long the hung pods go first.
    hung_pods: usize,
    hung_images: usize,
    healthy_pods: usize,
    healthy: (u64, usize),
    deadline: Duration,
    hung_first: Duration,
    /// Row 6: pods (one image each) pulling while the registry refuses every other request for
    /// `limit_window`, each retrying with the kubelet's backoff (first, longest).
    limited_pods: usize,
    limit_window: Duration,
    kubelet_backoff: (Duration, Duration),
    /// Row 7: pods of the herd.
    herd: usize,
    /// Issue 49's signed pull (`signed_link`): the signed image's (bytes, layers), and pulls of it per side (ABBA order).
    signed: (u64, usize),
    signed_rounds: usize,
}

const FULL: Shape = Shape {
    link: LinkShape { mbit: Some(100.0), rtt: Duration::from_millis(50), loss_percent: 0.1 },
    one: (100 * MB, 4),
    one_rounds: 4,
    huge: (1000 * MB, 4),
    small: (10 * MB, 1),
    smalls: 20,
    queued_after: Duration::from_millis(200),
    hung_pods: 50,
    hung_images: 10,
    healthy_pods: 10,
    healthy: (MB, 1),
    deadline: Duration::from_secs(150),
    hung_first: Duration::from_secs(1),
    limited_pods: 10,
    limit_window: Duration::from_secs(60),
    kubelet_backoff: (Duration::from_secs(10), Duration::from_secs(300)),
    herd: 100,
    signed: (10 * MB, 2),
    signed_rounds: 4,
};

const QUICK: Shape = Shape {
    link: LinkShape { mbit: Some(100.0), rtt: Duration::from_millis(10), loss_percent: 0.1 },
    one: (2 * MB, 2),
    one_rounds: 1,
    huge: (8 * MB, 2),
    small: (MB / 4, 1),
    smalls: 4,
    queued_after: Duration::from_millis(50),
    hung_pods: 6,
    hung_images: 2,
    healthy_pods: 3,
    healthy: (MB / 10, 1),
    deadline: Duration::from_secs(4),
    hung_first: Duration::from_millis(300),
    limited_pods: 2,
    limit_window: Duration::from_secs(2),
    kubelet_backoff: (Duration::from_millis(500), Duration::from_secs(2)),
    herd: 10,
    signed: (MB, 1),
    signed_rounds: 1,
};

/// Rows 2 and 3: pulls at once, through cri-imaged (`--max-parallel-image-pulls`) and for the
/// small pulls alone straight on containerd.
const PARALLEL_PULLS: usize = 4;

/// The run's shape: the issue's in a full run, the tiny one in a smoke run.
fn shape(bench: &Bench) -> &'static Shape {
    if bench.sizes.pairs > 1 { &FULL } else { &QUICK }
}

/// A rig behind `link`, routed for the stack's containerd, with the section's title (`what`
/// over a shaped link, the link's figures); `None` where the rig cannot be made.
pub(crate) fn shaped_rig(bench: &Bench, what: &str, link: LinkShape) -> Option<(NetRig, String)> {
    let Some(rig) = NetRig::start(link) else {
        progress!("{what} over a shaped link: skipped, the rig cannot be made here");
        return None;
    };
    rig.route(&bench.stack);
    let title = format!(
        "{what} over a shaped link ({} Mbit, {} ms RTT, {} % loss)",
        link.mbit.unwrap_or(0.0),
        link.rtt.as_millis(),
        link.loss_percent
    );
    progress!("{title}: registry at {}", rig.registry());
    Some((rig, title))
}

pub async fn run(bench: &Bench, findings: &mut Findings) {
    let shape = shape(bench);
    let Some((rig, title)) = shaped_rig(bench, "Registries", shape.link) else { return };
    let mut table = Table::new(title, &["row", "cri-imaged", "baseline", "ratio", "target"]);
    let side = Side { bench, rig: &rig, section: "registries" };
    one_pull(&side, shape, &mut table, findings).await;
    small_behind_big(&side, shape, &mut table, findings).await;
    hung_registry(&side, shape, &[], &mut table, findings).await;
    // What CRI-O looks like to cri-imaged: no content service, so the registry is probed by us.
    hung_registry(&side, shape, &["--pull-progress=false"], &mut table, findings).await;
    // As the issue has it, and as a used-up quota (Docker Hub's) answers: every request.
    rate_limited(&side, shape, Refusal::EveryNth(2), &mut table, findings).await;
    rate_limited(&side, shape, Refusal::Always, &mut table, findings).await;
    herd_bytes(&side, shape, &mut table, findings).await;
    findings.tables.push(table);
}

/// Issue 49's row over the same link (`--only signed-link`; a section of its own, so that the
/// registries' rows run without cosign).
pub async fn signed_link(bench: &Bench, findings: &mut Findings) {
    let shape = shape(bench);
    let Some((rig, title)) = shaped_rig(bench, "Image signatures", shape.link) else { return };
    let mut table = Table::new(title, &["row", "verified", "not verified", "ratio", "target"]);
    signed_pull(&Side { bench, rig: &rig, section: "registries" }, shape, &mut table, findings).await;
    findings.tables.push(table);
}

/// What every row over a shaped link works with.
pub(crate) struct Side<'a> {
    pub(crate) bench: &'a Bench,
    pub(crate) rig: &'a NetRig,
    /// The section's name, its images' first path component.
    pub(crate) section: &'static str,
}

impl Side<'_> {
    /// Pushes `count` distinct images `SECTION/NAME-i:v1` of `(bytes, layers)`; their names.
    pub(crate) fn push(&self, name: &str, count: usize, (bytes, layers): (u64, usize)) -> Vec<String> {
        (0..count)
            .map(|index| {
                let name = format!("{}/{name}-{index}:v1", self.section);
                self.rig.push_image(&name, bytes, layers);
                self.rig.image(&name)
            })
            .collect()
    }

    fn containerd(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(unix_channel(&self.bench.stack.containerd_socket))
    }

    /// CRI PullImage straight on containerd, with no deadline (as a serial kubelet's pull).
    pub(crate) fn pull(&self, image: &str) -> impl Future<Output = Result<(), String>> + Send + use<> {
        let mut containerd = self.containerd();
        let request = PullImageRequest {
            image: Some(ImageSpec { image: image.into(), ..Default::default() }),
            ..Default::default()
        };
        async move { containerd.pull_image(request).await.map(drop).map_err(|status| status.message().to_owned()) }
    }

    /// CRI PullImage of each of `images` straight on containerd, at most `at_once` at a time, all
    /// asked for now: each one's time to pulled.
    async fn pulls_at_most(&self, images: &[String], at_once: usize) -> Vec<Duration> {
        let places = std::sync::Arc::new(tokio::sync::Semaphore::new(at_once));
        let calls: Vec<_> = images
            .iter()
            .map(|image| {
                let (pull, places) = (self.pull(image), places.clone());
                tokio::spawn(async move {
                    let asked = Instant::now();
                    let _place = places.acquire_owned().await.expect("never closed");
                    pull.await.map(|()| asked.elapsed())
                })
            })
            .collect();
        let mut took = Vec::new();
        for call in calls {
            took.push(call.await.expect("a pull's task").unwrap_or_else(|error| panic!("the pulls alone: {error}")));
        }
        took
    }

    /// Removes `images` from containerd (its content and snapshots with them), so that the
    /// next rows have the disk and start cold.
    pub(crate) async fn remove(&self, images: &[String]) {
        let mut containerd = self.containerd();
        for image in images {
            let spec = Some(ImageSpec { image: image.clone(), ..Default::default() });
            // An image that never arrived (a failed pull) is no error here.
            let _ = containerd.remove_image(RemoveImageRequest { image: spec }).await;
        }
    }
}

/// EnsureImageExists for `image` by pod `pod` with a deadline of `deadline` (sent as
/// grpc-timeout, and enforced here too): the time to its answer and the answer.
pub(crate) fn ensure_within(
    client: &ImageManagerClient<Channel>,
    image: &str,
    pod: &str,
    deadline: Duration,
) -> impl Future<Output = (Duration, Result<(), tonic::Status>)> + Send + use<> {
    let mut client = client.clone();
    let mut request = tonic::Request::new(ensure_request(image, pod));
    request.set_timeout(deadline);
    async move {
        let sent = Instant::now();
        let call = tokio::time::timeout(deadline + Duration::from_secs(5), client.ensure_image_exists(request));
        let answer = match call.await {
            Ok(answer) => answer.map(drop),
            Err(_) => Err(tonic::Status::deadline_exceeded("no answer, even after the deadline")),
        };
        (sent.elapsed(), answer)
    }
}

/// Pods on a hung registry: how many, over how many images, and how long before the healthy pods
/// beside them ask.
pub(crate) struct HungPods {
    pub pods: usize,
    pub images: usize,
    pub first: Duration,
}

/// What the healthy pods beside a hung registry's pods got, and what the hung pods got.
pub(crate) struct BesideHung {
    /// Each healthy pod's time to its answer, and how many were answered OK.
    pub beside: Vec<Duration>,
    pub beside_answered: usize,
    /// The longest a hung pod waited, how many were answered before their deadline, and how many
    /// of those with `RegistryUnavailable`.
    pub last_hung: Duration,
    pub hung_answered: usize,
    pub unavailable: usize,
}

/// The hung registry's pods ask first; `hung.first` later the healthy pods ask for `healthy`,
/// every call with `deadline`; waits for all their answers.
pub(crate) async fn beside_a_hung_registry(
    client: &ImageManagerClient<Channel>,
    registry: &HungRegistry,
    hung: HungPods,
    healthy: &[String],
    deadline: Duration,
) -> BesideHung {
    let hung_calls: Vec<_> = (0..hung.pods)
        .map(|pod| {
            let image = registry.image(&format!("hung/app-{}:v1", pod % hung.images));
            tokio::spawn(ensure_within(client, &image, &format!("hung-{pod}"), deadline))
        })
        .collect();
    tokio::time::sleep(hung.first).await;
    let healthy_calls: Vec<_> = healthy
        .iter()
        .enumerate()
        .map(|(pod, image)| tokio::spawn(ensure_within(client, image, &format!("healthy-{pod}"), deadline)))
        .collect();
    let (mut beside, mut beside_answered) = (Vec::new(), 0);
    for call in healthy_calls {
        let (took, answer) = call.await.expect("a healthy pod's task");
        beside_answered += usize::from(answer.is_ok());
        beside.push(took);
    }
    let (mut last_hung, mut hung_answered, mut unavailable) = (Duration::ZERO, 0, 0);
    for call in hung_calls {
        let (took, answer) = call.await.expect("a hung pod's task");
        if answered(&answer) {
            hung_answered += 1;
            unavailable += usize::from(answer.is_err_and(|status| reason(&status) == "RegistryUnavailable"));
        }
        last_hung = last_hung.max(took);
    }
    BesideHung { beside, beside_answered, last_hung, hung_answered, unavailable }
}

/// The healthy pods asking for `images` alone, at once, each with `deadline`: each one's time to
/// its answer; any failure ends the bench, naming `what`.
pub(crate) async fn healthy_alone(
    client: &ImageManagerClient<Channel>,
    images: &[String],
    deadline: Duration,
    what: &str,
) -> Vec<Duration> {
    let calls: Vec<_> = images
        .iter()
        .enumerate()
        .map(|(pod, image)| tokio::spawn(ensure_within(client, image, &format!("alone-{pod}"), deadline)))
        .collect();
    let mut alone = Vec::new();
    for call in calls {
        let (took, answer) = call.await.expect("a healthy pod's task");
        answer.unwrap_or_else(|status| panic!("{what}, the healthy pods alone: {status:?}"));
        alone.push(took);
    }
    alone
}

/// Whether `answer` is a real answer, not the deadline running out.
pub(crate) fn answered(answer: &Result<(), tonic::Status>) -> bool {
    !matches!(answer, Err(status) if matches!(status.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled))
}

fn verdict(findings: &mut Findings, what: &str, target: &str, measured: String, met: bool) {
    findings.verdicts.push(Verdict { what: what.into(), target: target.into(), measured, met });
}

/// Row 1: one pull of the 100 MB image, through cri-imaged and straight to containerd, in ABBA
/// order, a fresh image each time; the medians.
async fn one_pull(side: &Side<'_>, shape: &Shape, table: &mut Table, findings: &mut Findings) {
    progress!("  row 1: one {} MB pull, {} per side", shape.one.0 / MB, shape.one_rounds);
    let images = side.push("one", 2 * shape.one_rounds, shape.one);
    let daemon = Daemon::start(side.bench, "registries-one", &[]).await;
    let (mut through, mut direct) = (Vec::new(), Vec::new());
    for (round, pair) in images.chunks(2).enumerate() {
        for (turn, image) in pair.iter().enumerate() {
            let started = Instant::now();
            if (round + turn).is_multiple_of(2) {
                let (_, answer) = ensure_within(&daemon.client, image, "one", Duration::from_secs(3600)).await;
                answer.unwrap_or_else(|status| panic!("row 1 through cri-imaged: {status:?}"));
                through.push(started.elapsed());
            } else {
                side.pull(image).await.unwrap_or_else(|error| panic!("row 1 on containerd: {error}"));
                direct.push(started.elapsed());
            }
        }
    }
    drop(daemon);
    side.remove(&images).await;
    let (through, direct) = (median(through), median(direct));
    let ratio = through.as_secs_f64() / direct.as_secs_f64();
    let what = format!("one {} MB pull ({} layers), median", shape.one.0 / MB, shape.one.1);
    table.row(vec![
        what.clone(),
        report::duration(through),
        format!("{} (containerd directly)", report::duration(direct)),
        format!("{ratio:.2}"),
        "≤ 1.02".into(),
    ]);
    verdict(findings, &format!("{what}, cri-imaged / direct"), "≤ 1.02", format!("{ratio:.2}"), ratio <= 1.02);
}

/// Rows 2 and 3: the small images queued just after the big one, through cri-imaged (parallel
/// pulls, at most [`PARALLEL_PULLS`]), by a serial puller (one pull at a time, in order, as the
/// kubelet's default), and all sent to containerd at once; the p50 of the small ones' time to
/// pulled. Then the small ones alone, no big pull before them, as many at a time straight on
/// containerd: what the link gives them with nothing in their way, the floor of any scheduler.
async fn small_behind_big(side: &Side<'_>, shape: &Shape, table: &mut Table, findings: &mut Findings) {
    let (huge_mb, small_mb) = (shape.huge.0 / MB, shape.small.0 as f64 / MB as f64);
    progress!(
        "  rows 2-3: {} × {small_mb} MB queued behind {huge_mb} MB, three ways, then the small ones alone",
        shape.smalls
    );
    let forever = Duration::from_secs(3600);

    let huge = side.push("huge-through", 1, shape.huge);
    let smalls = side.push("small-through", shape.smalls, shape.small);
    let parallel = PARALLEL_PULLS.to_string();
    let flags = ["--serialize-image-pulls=false", "--max-parallel-image-pulls", &parallel];
    let daemon = Daemon::start(side.bench, "registries-parallel", &flags).await;
    let big = tokio::spawn(ensure_within(&daemon.client, &huge[0], "huge", forever));
    tokio::time::sleep(shape.queued_after).await;
    let calls: Vec<_> = smalls
        .iter()
        .enumerate()
        .map(|(index, image)| tokio::spawn(ensure_within(&daemon.client, image, &format!("small-{index}"), forever)))
        .collect();
    let mut through = Vec::new();
    for call in calls {
        let (took, answer) = call.await.expect("a small pull's task");
        answer.unwrap_or_else(|status| panic!("row 2 through cri-imaged: {status:?}"));
        through.push(took);
    }
    let (big_took, answer) = big.await.expect("the big pull's task");
    answer.unwrap_or_else(|status| panic!("row 2, the big pull through cri-imaged: {status:?}"));
    let port = daemon.metrics_port;
    let yields =
        tokio::task::spawn_blocking(move || metric_with_label(port, "cri_imaged_pulls_total", r#"result="yielded""#))
            .await
            .expect("the metrics read");
    drop(daemon);
    side.remove(&[huge, smalls].concat()).await;
    progress!("    through cri-imaged: the big pull took {}, its yields: {yields}", report::duration(big_took));

    let huge = side.push("huge-serial", 1, shape.huge);
    let smalls = side.push("small-serial", shape.smalls, shape.small);
    let queued = Instant::now() + shape.queued_after;
    let mut serial = Vec::new();
    side.pull(&huge[0]).await.unwrap_or_else(|error| panic!("row 2, the serial puller's big pull: {error}"));
    for image in &smalls {
        side.pull(image).await.unwrap_or_else(|error| panic!("row 2, the serial puller: {error}"));
        serial.push(queued.elapsed());
    }
    side.remove(&[huge, smalls].concat()).await;

    let huge = side.push("huge-direct", 1, shape.huge);
    let smalls = side.push("small-direct", shape.smalls, shape.small);
    let big = tokio::spawn(side.pull(&huge[0]));
    tokio::time::sleep(shape.queued_after).await;
    let calls: Vec<_> = smalls
        .iter()
        .map(|image| {
            let pull = side.pull(image);
            tokio::spawn(async move {
                let started = Instant::now();
                pull.await.map(|()| started.elapsed())
            })
        })
        .collect();
    let mut at_once = Vec::new();
    for call in calls {
        at_once.push(call.await.expect("a small pull's task").unwrap_or_else(|error| panic!("row 3: {error}")));
    }
    big.await.expect("the big pull's task").unwrap_or_else(|error| panic!("row 3, the big pull: {error}"));
    side.remove(&[huge, smalls].concat()).await;

    let smalls = side.push("small-alone", shape.smalls, shape.small);
    let alone = side.pulls_at_most(&smalls, PARALLEL_PULLS).await;
    side.remove(&smalls).await;

    let (through, serial, at_once, alone) = (median(through), median(serial), median(at_once), median(alone));
    let what = format!("p50 time to pulled, {} × {small_mb} MB behind {huge_mb} MB", shape.smalls);
    let all = shape.smalls + 1;
    let alone_name = format!("the {} alone, {PARALLEL_PULLS} at a time on containerd", shape.smalls);
    for (baseline, name, target, limit) in [
        (serial, "a serial puller".to_owned(), "≤ 0.10", 0.1),
        (at_once, format!("all {all} at once on containerd"), "≤ 1.00", 1.0),
        // Not the issue's: what the big pull still costs the small ones.
        (alone, alone_name, "≤ 1.10", 1.1),
    ] {
        let ratio = through.as_secs_f64() / baseline.as_secs_f64();
        table.row(vec![
            format!("{what} (--max-parallel-image-pulls {PARALLEL_PULLS}; the big pull's yields: {yields})"),
            report::duration(through),
            format!("{} ({name})", report::duration(baseline)),
            format!("{ratio:.3}"),
            target.into(),
        ]);
        verdict(findings, &format!("{what}, cri-imaged / {name}"), target, format!("{ratio:.3}"), ratio <= limit);
    }
}

/// Rows 4 and 5: with the daemon's default flags but `flags`, pods on a hung registry first,
/// then pods on the healthy one; the healthy pods' p50 time to an answer against the same pods
/// alone, and the time until every pod on the hung registry has had an answer.
async fn hung_registry(side: &Side<'_>, shape: &Shape, flags: &[&str], table: &mut Table, findings: &mut Findings) {
    let with = match flags {
        [] => "default flags".to_owned(),
        flags => format!("defaults but {}: the runtime's progress unused, as on CRI-O", flags.join(" ")),
    };
    progress!(
        "  rows 4-5: {} pods on a healthy registry behind {} pods ({} images) on a hung one, deadline {}",
        shape.healthy_pods,
        shape.hung_pods,
        shape.hung_images,
        report::duration(shape.deadline)
    );
    let hung = HungRegistry::start().await;
    side.bench.stack.route_through(hung.addr.port());
    let healthy = side.push("healthy-beside", shape.healthy_pods, shape.healthy);
    let daemon = Daemon::start(side.bench, "registries-hung", flags).await;
    let hung_pods = HungPods { pods: shape.hung_pods, images: shape.hung_images, first: shape.hung_first };
    let BesideHung { beside, beside_answered, last_hung, hung_answered, unavailable } =
        beside_a_hung_registry(&daemon.client, &hung, hung_pods, &healthy, shape.deadline).await;
    drop(daemon);
    drop(hung);
    side.remove(&healthy).await;

    let alone_images = side.push("healthy-alone", shape.healthy_pods, shape.healthy);
    let daemon = Daemon::start(side.bench, "registries-alone", flags).await;
    let alone = healthy_alone(&daemon.client, &alone_images, shape.deadline, "row 4").await;
    drop(daemon);
    side.remove(&alone_images).await;

    let (beside, alone) = (median(beside), median(alone));
    let ratio = beside.as_secs_f64() / alone.as_secs_f64();
    let pods = shape.healthy_pods;
    table.row(vec![
        format!("p50 time to answer, {pods} pods beside {} on a hung registry ({with})", shape.hung_pods),
        format!("{} ({beside_answered} of {pods} answered)", report::duration(beside)),
        format!("{} (the same pods alone)", report::duration(alone)),
        format!("{ratio:.2}"),
        "≤ 2".into(),
    ]);
    verdict(
        findings,
        &format!("p50 time to answer of healthy pods beside a hung registry / alone ({with})"),
        "≤ 2",
        format!("{ratio:.2} ({beside_answered} of {pods} answered)"),
        // A pod refused (say, over the registry rate limit) is no answer that counts.
        ratio <= 2.0 && beside_answered == pods,
    );
    // 60 s in the full run; within half the deadline in the smoke run's short one.
    let limit = Duration::from_secs(60).min(shape.deadline / 2);
    let met = hung_answered == shape.hung_pods && last_hung <= limit;
    let measured = format!(
        "{} ({hung_answered} of {} answered, {unavailable} RegistryUnavailable)",
        report::duration(last_hung),
        shape.hung_pods
    );
    table.row(vec![
        format!(
            "time until every pod on the hung registry has its answer (deadline {}; {with})",
            report::duration(shape.deadline)
        ),
        measured.clone(),
        "-".into(),
        "-".into(),
        format!("≤ {}", report::duration(limit)),
    ]);
    let target = format!("≤ {}", report::duration(limit));
    verdict(
        findings,
        &format!("time until every pod on a hung registry has an answer ({with})"),
        &target,
        measured,
        met,
    );
}

/// Pulls by `pull` until it succeeds, waiting the kubelet's backoff between failures (first,
/// doubling to longest), for at most `limit`; whether it succeeded.
async fn kubelet_retries<F, Fut>(pull: F, (first, longest): (Duration, Duration), limit: Duration) -> bool
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    let mut backoff = first;
    loop {
        if pull().await {
            return true;
        }
        if started.elapsed() + backoff > limit {
            return false;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(longest);
    }
}

/// Row 6: the registry answers 429 to the requests `refusal` picks for a while; pods (one image
/// each) retry with the kubelet's backoff, through cri-imaged (default flags) and straight to
/// containerd; the requests the registry got while it answered 429 (what burns a pull quota),
/// and in all until every pod had its image.
///
/// containerd itself sends a request refused with 429 again, up to five times at once: a
/// registry refusing every other request never fails a pull, so nothing reaches cri-imaged to
/// adapt to.
async fn rate_limited(side: &Side<'_>, shape: &Shape, refusal: Refusal, table: &mut Table, findings: &mut Findings) {
    let which = if refusal == Refusal::Always { "all" } else { "half" };
    progress!(
        "  row 6: {} pods while the registry refuses {which} of the requests for {}",
        shape.limited_pods,
        report::duration(shape.limit_window)
    );
    let proxy = RateLimitProxy::start(side.rig.addr(), Refusal::Never).await;
    side.bench.stack.route_through(proxy.addr.port());
    let limit = shape.limit_window + shape.kubelet_backoff.1 * 2;
    let mut sides = Vec::new();
    for through in [true, false] {
        let name = format!("limited-{which}-{}", if through { "through" } else { "direct" });
        // The rig's images, named through the proxy.
        let images: Vec<String> = side
            .push(&name, shape.limited_pods, shape.healthy)
            .iter()
            .map(|image| proxy.image(image.split_once('/').map_or(image.as_str(), |(_, path)| path)))
            .collect();
        let daemon = if through { Some(Daemon::start(side.bench, "registries-limited", &[]).await) } else { None };
        let before = proxy.requests();
        proxy.set_refusal(refusal);
        let lift = async {
            tokio::time::sleep(shape.limit_window).await;
            proxy.set_refusal(Refusal::Never);
            proxy.requests() - before
        };
        let pods = images.iter().enumerate().map(|(pod, image)| {
            let client = daemon.as_ref().map(|daemon| daemon.client.clone());
            let pull = move || -> std::pin::Pin<Box<dyn Future<Output = bool>>> {
                match &client {
                    Some(client) => {
                        let call = ensure_within(client, image, &format!("limited-{pod}"), Duration::from_secs(120));
                        Box::pin(async move { call.await.1.is_ok() })
                    }
                    None => {
                        let call = side.pull(image);
                        Box::pin(async move { call.await.is_ok() })
                    }
                }
            };
            kubelet_retries(pull, shape.kubelet_backoff, limit)
        });
        let (limited, pulled) = tokio::join!(lift, futures_util::future::join_all(pods));
        let pulled = pulled.into_iter().filter(|pulled| *pulled).count();
        sides.push((limited, proxy.requests() - before, pulled));
        drop(daemon);
        side.remove(&images).await;
    }
    let ((through, through_all, through_pulled), (direct, direct_all, direct_pulled)) = (sides[0], sides[1]);
    let ratio = through as f64 / direct as f64;
    let pods = shape.limited_pods;
    table.row(vec![
        format!(
            "registry requests while it answers 429 to {which} of them for {}, {pods} pods",
            report::duration(shape.limit_window)
        ),
        format!("{through} ({through_all} until {through_pulled} of {pods} pulled)"),
        format!("{direct} ({direct_all} until {direct_pulled} of {pods} pulled; kubelet backoff on containerd)"),
        format!("{ratio:.2}"),
        "≤ 0.3".into(),
    ]);
    verdict(
        findings,
        &format!("registry requests while it answers 429 to {which} of them, cri-imaged / direct"),
        "≤ 0.3",
        format!("{ratio:.2} ({through} vs {direct})"),
        ratio <= 0.3,
    );
}

/// Row 7: a herd of pods on one absent image through cri-imaged: the bytes that crossed the
/// link, in images.
async fn herd_bytes(side: &Side<'_>, shape: &Shape, table: &mut Table, findings: &mut Findings) {
    progress!("  row 7: a herd of {} pods on one {} MB image", shape.herd, shape.one.0 / MB);
    let image = side.push("herd", 1, shape.one).remove(0);
    let daemon = Daemon::start(side.bench, "registries-herd", &[]).await;
    let before = side.rig.bytes_to_node();
    let calls: Vec<_> = (0..shape.herd)
        .map(|pod| {
            tokio::spawn(ensure_within(&daemon.client, &image, &format!("herd-{pod}"), Duration::from_secs(3600)))
        })
        .collect();
    for call in calls {
        call.await.expect("a herd pod's task").1.unwrap_or_else(|status| panic!("row 7: {status:?}"));
    }
    let moved = side.rig.bytes_to_node() - before;
    drop(daemon);
    side.remove(std::slice::from_ref(&image)).await;
    // Frames carry about 4.5 % of Ethernet, IP and TCP headers: anything under 1.5 is one image.
    let images = moved as f64 / shape.one.0 as f64;
    table.row(vec![
        format!("bytes over the link, herd of {} on one {} MB image", shape.herd, shape.one.0 / MB),
        format!("{:.1} MB ({images:.2} images)", moved as f64 / MB as f64),
        "-".into(),
        "-".into(),
        "= 1 image".into(),
    ]);
    verdict(
        findings,
        &format!("bytes over the link for a herd of {}, in images", shape.herd),
        "= 1 image",
        format!("{images:.2}"),
        images < 1.5,
    );
}

/// Issue 49: one pull of a cosign-signed image through cri-imaged with a policy that
/// requires its signature (the tag resolved, the signature manifest and its payload read over the
/// link, then the pull by that digest) against the same daemon build with no policy, in ABBA
/// order, a fresh image each time; the medians.
async fn signed_pull(side: &Side<'_>, shape: &Shape, table: &mut Table, findings: &mut Findings) {
    use crate::support::cosign::{cosign, key_pair, sign};
    let Some(cosign) = cosign() else {
        progress!("  signed pull: skipped, cosign is not installed (make deps installs it)");
        return;
    };
    let (bytes, layers) = shape.signed;
    progress!("  one signed {} MB pull, verified and not, {} per side", bytes / MB, shape.signed_rounds);
    let keys = key_pair(&cosign, &side.bench.work.path().join("registries-cosign"));
    let images: Vec<String> = (0..2 * shape.signed_rounds)
        .map(|index| {
            let name = format!("registries/signed-{index}");
            let digest = side.rig.push_image(&format!("{name}:v1"), bytes, layers);
            sign(&cosign, &keys, &format!("{}@{digest}", side.rig.image(&name)));
            side.rig.image(&format!("{name}:v1"))
        })
        .collect();
    let policy = serde_json::json!({
        "default": [{ "type": "insecureAcceptAnything" }],
        "transports": { "docker": { format!("{}/registries", side.rig.registry()): [{
            "type": "sigstoreSigned",
            "keyPath": keys.join("cosign.pub"),
            "signedIdentity": { "type": "matchRepository" },
        }] } }
    });
    let file = side.bench.work.path().join("registries-signed-policy.json");
    std::fs::write(&file, policy.to_string()).expect("the policy file");
    let flag = format!("--signature-policy={}", file.display());
    // Signatures are read where containerd pulls from: the rig's registry over plain HTTP.
    let hosts = format!("--registry-config-path={}", side.bench.stack.registry_config_path().display());
    let plain = Daemon::start(side.bench, "registries-unsigned", &[]).await;
    let verifying = Daemon::start(side.bench, "registries-signed", &[flag.as_str(), hosts.as_str()]).await;
    let (mut verified, mut not) = (Vec::new(), Vec::new());
    for (round, pair) in images.chunks(2).enumerate() {
        for (turn, image) in pair.iter().enumerate() {
            let verify = (round + turn).is_multiple_of(2);
            let client = if verify { &verifying.client } else { &plain.client };
            let (took, answer) = ensure_within(client, image, "signed", Duration::from_secs(3600)).await;
            answer.unwrap_or_else(|status| panic!("signed pull (verified: {verify}): {status:?}"));
            if verify { verified.push(took) } else { not.push(took) }
        }
    }
    // What the verifications themselves took (the tag resolved, the signature and its payload
    // read over the link, checked), as the daemon measured them.
    let checks = verifying.metric("cri_imaged_signature_verification_seconds_count");
    let checked = verifying.metric("cri_imaged_signature_verification_seconds_sum") / checks.max(1.0);
    drop((plain, verifying));
    side.remove(&images).await;
    let (verified, not) = (median(verified), median(not));
    let ratio = verified.as_secs_f64() / not.as_secs_f64();
    let what = format!("one signed {} MB pull ({layers} layers), median", bytes / MB);
    table.row(vec![
        what.clone(),
        format!(
            "{} ({:.0} ms of it reading and checking signatures, mean)",
            report::duration(verified),
            checked * 1000.0
        ),
        format!("{} (no policy)", report::duration(not)),
        format!("{ratio:.2}"),
        "≤ 1.25".into(),
    ]);
    verdict(findings, &format!("{what}, verified / not verified"), "≤ 1.25", format!("{ratio:.2}"), ratio <= 1.25);
}
