//! A cold node (issue 57): one big image whose pod comes up first, then pods on small images one
//! by one, every image absent, over a shaped link. A client that pulls as the kubelet does (one
//! CRI PullImage per pod as its sandbox comes up: serially, or in parallel with and without
//! `maxParallelImagePulls`) straight to containerd, against the same client in front of
//! cri-imaged at its defaults; every row cold, ratios from one run, and the link's floor. Then
//! the choice of the default cap: more pods than it, through cri-imaged at three caps.

use std::{sync::Arc, time::Duration};

use cri_imaged::cri::{
    ImageSpec, PodSandboxConfig, PodSandboxMetadata, PullImageRequest, image_service_client::ImageServiceClient,
};
use cri_imaged::pull::scheduler::DEFAULT_MAX_PARALLEL;
use tokio::{sync::Semaphore, time::Instant};
use tonic::transport::Channel;

use crate::{
    Bench, Daemon, Findings,
    registries::{MB, Side, shaped_rig},
    report::{self, Table, Verdict},
    support::{netrig::LinkShape, unix_channel},
    write_back,
};

/// The section's sizes: the in a full run, tiny ones in the smoke run.
#[derive(Clone, Copy)]
struct Shape {
    link: LinkShape,
    /// The big image's (bytes, layers); its pod comes up first.
    big: (u64, usize),
    /// Each small image's (bytes, layers), and how many pods (one image each) come up after.
    small: (u64, usize),
    smalls: usize,
    /// Pods come up this far apart, the big one's at once.
    gap: Duration,
    /// Choosing the cap: small pods after the big one on a wider node, and a rollout's pods
    /// (each image's bytes, layers; how many) coming up at once.
    wide_smalls: usize,
    rollout: ((u64, usize), usize),
}

/// The node: 100 Mbit/s with 25 ms added to every request, which a 25 ms round trip is
/// (a request waits one round trip for its answer); no loss was reported.
const LINK: LinkShape = LinkShape { mbit: Some(100.0), rtt: Duration::from_millis(25), loss_percent: 0.0 };

const FULL: Shape = Shape {
    link: LINK,
    big: (150 * MB, 2),
    small: (2 * MB, 1),
    smalls: 9,
    gap: Duration::from_millis(100),
    wide_smalls: 29,
    rollout: ((10 * MB, 2), 20),
};

/// A shorter round trip: the serial rows wait several for every pull.
const QUICK: Shape = Shape {
    link: LinkShape { rtt: Duration::from_millis(10), ..LINK },
    big: (4 * MB, 2),
    small: (MB / 5, 1),
    smalls: 3,
    gap: Duration::from_millis(50),
    wide_smalls: 5,
    rollout: ((MB / 5, 1), 5),
};

/// How the kubelet's image puller sends a node's pulls.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Puller {
    /// `serializeImagePulls: true`: one PullImage at a time, in the order the pods came up.
    Serial,
    /// `serializeImagePulls: false`: each pod's PullImage as it comes up, at most
    /// `maxParallelImagePulls` at once (`None`: no cap), the rest waiting in the order they came.
    Parallel(Option<usize>),
}

impl Puller {
    /// The most pulls under way at once; `None`: no cap.
    fn at_once(self) -> Option<usize> {
        match self {
            Self::Serial => Some(1),
            Self::Parallel(cap) => cap,
        }
    }

    fn label(self) -> String {
        match self {
            Self::Serial => "serial".into(),
            Self::Parallel(Some(cap)) => format!("parallel, maxParallelImagePulls {cap}"),
            Self::Parallel(None) => "parallel, no cap".into(),
        }
    }
}

/// Where a row's kubelet sends its pulls.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Endpoint {
    Containerd,
    /// cri-imaged at its defaults, with these flags only.
    CriImaged(&'static [&'static str]),
}

/// One row: a kubelet's puller and where it sends its pulls; whether the targets judge it.
struct Row {
    puller: Puller,
    endpoint: Endpoint,
    judged: bool,
}

/// The caps tried for the default, by the flags that set them (5 is the default).
const CAPS: [(usize, &[&str]); 3] =
    [(5, &[]), (10, &["--max-parallel-image-pulls=10"]), (20, &["--max-parallel-image-pulls=20"])];

/// The row every cri-imaged row is compared with: what a kubelet can do on its own.
const BASELINE: usize = 1;

const ROWS: [Row; 6] = [
    Row { puller: Puller::Serial, endpoint: Endpoint::Containerd, judged: false },
    Row { puller: Puller::Parallel(Some(5)), endpoint: Endpoint::Containerd, judged: false },
    Row { puller: Puller::Parallel(None), endpoint: Endpoint::Containerd, judged: false },
    // The serial puller sends one pull at a time: nothing underneath can reorder them.
    Row { puller: Puller::Serial, endpoint: Endpoint::CriImaged(&[]), judged: false },
    Row { puller: Puller::Parallel(None), endpoint: Endpoint::CriImaged(&[]), judged: true },
    // containerd's content service unused: what cri-imaged knows of a pull on CRI-O.
    Row { puller: Puller::Parallel(None), endpoint: Endpoint::CriImaged(&["--pull-progress=false"]), judged: true },
];

/// A kubelet's image puller on one node: each pod's one PullImage, as its sandbox comes up.
struct Kubelet {
    puller: Puller,
    /// The CRI image service it calls: containerd's, or cri-imaged's in front of it.
    images: ImageServiceClient<Channel>,
    /// Pods come up this far apart.
    gap: Duration,
}

impl Kubelet {
    /// Pods `POD-i`, on `images[i]`, come up `gap` apart from now, the first at once; each one's
    /// time from now to its PullImage answered.
    async fn start_pods(&self, pod: &str, images: &[String]) -> Vec<Duration> {
        let places = self.puller.at_once().map(|places| Arc::new(Semaphore::new(places)));
        let started = Instant::now();
        let pods: Vec<_> = images
            .iter()
            .enumerate()
            .map(|(index, image)| {
                let (mut client, places) = (self.images.clone(), places.clone());
                let comes_up = started + self.gap * index as u32;
                let request = pull_request(image, &format!("{pod}-{index}"));
                tokio::spawn(async move {
                    tokio::time::sleep_until(comes_up).await;
                    // tokio's semaphore is fair: pods wait for a place in the order they came up.
                    let _place = match places {
                        Some(places) => Some(places.acquire_owned().await.expect("never closed")),
                        None => None,
                    };
                    client.pull_image(request).await.map(|_| started.elapsed())
                })
            })
            .collect();
        let mut pulled = Vec::with_capacity(pods.len());
        for (index, pod_task) in pods.into_iter().enumerate() {
            let answer = pod_task.await.expect("a pod's task");
            pulled.push(answer.unwrap_or_else(|status| panic!("cold node, {pod}-{index}'s PullImage: {status:?}")));
        }
        pulled
    }
}

/// CRI PullImage of `image` for the pod `name`, as the kubelet sends it: with its sandbox's
/// config, no credentials (the registry is anonymous).
fn pull_request(image: &str, name: &str) -> PullImageRequest {
    let metadata =
        PodSandboxMetadata { name: name.into(), uid: format!("{name}-uid"), namespace: "cold-node".into(), attempt: 0 };
    PullImageRequest {
        image: Some(ImageSpec { image: image.into(), ..Default::default() }),
        auth: None,
        sandbox_config: Some(PodSandboxConfig { metadata: Some(metadata), ..Default::default() }),
    }
}

/// A row's figures: every pod's time from the big pod coming up to its image pulled, big first.
struct Pulled(Vec<Duration>);

impl Pulled {
    fn smalls(&self) -> Duration {
        self.0[1..].iter().copied().max().unwrap_or_default()
    }

    fn mean(&self) -> Duration {
        self.0.iter().sum::<Duration>() / self.0.len() as u32
    }

    fn all(&self) -> Duration {
        self.0.iter().copied().max().unwrap_or_default()
    }
}

pub async fn run(bench: &Bench, findings: &mut Findings) {
    let started = Instant::now();
    let shape = if bench.sizes.pairs > 1 { &FULL } else { &QUICK };
    let Some((rig, link)) = shaped_rig(bench, "Cold node", shape.link) else { return };
    let side = Side { bench, rig: &rig, section: "cold-node" };
    let (big_mb, small_mb, smalls) = (shape.big.0 as f64 / MB as f64, shape.small.0 as f64 / MB as f64, shape.smalls);
    progress!(
        "  one {big_mb} MB image ({} layers) first, then {smalls} × {small_mb} MB, pods {} apart; {} rows, each cold",
        shape.big.1,
        report::duration(shape.gap),
        ROWS.len()
    );

    // The link's rate as a pull sees it: the big image alone, straight to containerd.
    let alone = side.push("floor-big", 1, shape.big);
    write_back();
    let pulling = Instant::now();
    side.pull(&alone[0]).await.unwrap_or_else(|error| panic!("cold node, the big image alone: {error}"));
    let rate = shape.big.0 as f64 / pulling.elapsed().as_secs_f64();
    side.remove(&alone).await;
    let small_bytes = shape.small.0 * smalls as u64;
    let floor = Duration::from_secs_f64((shape.big.0 + small_bytes) as f64 / rate);
    let small_floor = Duration::from_secs_f64(small_bytes as f64 / rate);
    progress!(
        "  the link: {:.1} MB/s; the floor: {} for all, {} for the small images",
        rate / MB as f64,
        report::duration(floor),
        report::duration(small_floor)
    );

    let mut rows = Vec::with_capacity(ROWS.len());
    for (index, row) in ROWS.iter().enumerate() {
        rows.push(measure_row(&side, shape, &format!("row-{index}"), row).await);
    }

    let mut table = Table::new(
        format!(
            "{link}: one {big_mb} MB image ({} layers) whose pod comes up first, then {smalls} pods on \
             {small_mb} MB images, {} apart; one CRI PullImage a pod, times from the first pod coming up; link \
             measured at {:.1} MB/s (the big image alone on containerd): floor {} for all {:.0} MB, {} for the \
             small ones alone",
            shape.big.1,
            report::duration(shape.gap),
            rate / MB as f64,
            report::duration(floor),
            (shape.big.0 + small_bytes) as f64 / MB as f64,
            report::duration(small_floor),
        ),
        &[
            "kubelet's puller",
            "pulls sent to",
            "small pods all pulled",
            "mean, all pods",
            "all pods pulled",
            "small / parallel-5",
            "mean / parallel-5",
            "all / floor",
        ],
    );
    let baseline = &rows[BASELINE];
    for (row, pulled) in ROWS.iter().zip(&rows) {
        let compared = |of: fn(&Pulled) -> Duration| match row.endpoint {
            Endpoint::Containerd => "-".to_owned(),
            Endpoint::CriImaged(_) => report::ratio(of(pulled).as_secs_f64(), of(baseline).as_secs_f64()),
        };
        table.row(vec![
            row.puller.label(),
            endpoint_label(row.endpoint),
            report::duration(pulled.smalls()),
            report::duration(pulled.mean()),
            report::duration(pulled.all()),
            compared(Pulled::smalls),
            compared(Pulled::mean),
            report::ratio(pulled.all().as_secs_f64(), floor.as_secs_f64()),
        ]);
        if row.judged {
            judge(findings, row, pulled, baseline, floor);
        }
    }
    findings.tables.push(table);
    choose_the_cap(&side, shape, rate, findings).await;
    progress!("  cold node: done in {}", report::duration(started.elapsed()));
}

/// The default cap, chosen by measurement: nodes with more pods than the cap, behind a kubelet
/// pulling in parallel without a cap of its own, through cri-imaged at each of [`CAPS`].
async fn choose_the_cap(side: &Side<'_>, shape: &Shape, rate: f64, findings: &mut Findings) {
    let ((rollout_image, rollout_pods), mb) = (shape.rollout, |bytes: u64| bytes as f64 / MB as f64);
    let workloads = [
        Shape { smalls: shape.wide_smalls, ..*shape },
        Shape { big: rollout_image, small: rollout_image, smalls: rollout_pods - 1, gap: Duration::ZERO, ..*shape },
    ];
    let labels = [
        format!(
            "{} pods: one {} MB image first, then {} MB ones, {} apart",
            shape.wide_smalls + 1,
            mb(shape.big.0),
            mb(shape.small.0),
            report::duration(shape.gap)
        ),
        format!("a rollout: {rollout_pods} pods on {} MB images, all at once", mb(rollout_image.0)),
    ];
    let mut table = Table::new(
        "Choosing the default cap (`--max-parallel-image-pulls`) on the same link: more pods than the cap, \
         kubelet pulling in parallel without a cap of its own → cri-imaged"
            .to_owned(),
        &["node", "cap", "small pods all pulled", "mean, all pods", "all pods pulled", "all / floor"],
    );
    for (index, (load, label)) in workloads.iter().zip(&labels).enumerate() {
        let bytes = load.big.0 + load.small.0 * load.smalls as u64;
        let floor = Duration::from_secs_f64(bytes as f64 / rate);
        let mut means = Vec::with_capacity(CAPS.len());
        for (cap, flags) in CAPS {
            let row = Row { puller: Puller::Parallel(None), endpoint: Endpoint::CriImaged(flags), judged: false };
            let pulled = measure_row(side, load, &format!("cap-{cap}-{index}"), &row).await;
            table.row(vec![
                label.clone(),
                cap.to_string(),
                report::duration(pulled.smalls()),
                report::duration(pulled.mean()),
                report::duration(pulled.all()),
                report::ratio(pulled.all().as_secs_f64(), floor.as_secs_f64()),
            ]);
            means.push((cap, pulled.mean()));
        }
        let best = means.iter().map(|(_, mean)| *mean).min().unwrap_or_default();
        let default = DEFAULT_MAX_PARALLEL.get();
        let default = means.iter().find(|(cap, _)| *cap == default).map(|(_, mean)| *mean).unwrap_or_default();
        let ratio = default.as_secs_f64() / best.as_secs_f64().max(f64::EPSILON);
        findings.verdicts.push(Verdict {
            what: format!("choosing the cap, {label}: the default cap's mean time to pulled / the best cap's"),
            target: "≤ 1.10".into(),
            measured: format!("{ratio:.2} ({} vs {})", report::duration(default), report::duration(best)),
            met: ratio <= 1.1,
        });
    }
    findings.tables.push(table);
}

/// One row, cold: its images pushed (fresh names), its kubelet's pods, its images removed.
async fn measure_row(side: &Side<'_>, shape: &Shape, name: &str, row: &Row) -> Pulled {
    let images = [side.push(&format!("{name}-big"), 1, shape.big), side.push(name, shape.smalls, shape.small)].concat();
    write_back();
    let daemon = match row.endpoint {
        Endpoint::Containerd => None,
        Endpoint::CriImaged(flags) => {
            // Where the stack's containerd reads its registry hosts, as a node's reads the
            // default that cri-imaged reads too (/etc/containerd/certs.d).
            let hosts = format!("--registry-config-path={}", side.bench.stack.registry_config_path().display());
            let flags: Vec<&str> = flags.iter().copied().chain([hosts.as_str()]).collect();
            Some(Daemon::start(side.bench, &format!("cold-node-{name}"), &flags).await)
        }
    };
    let socket = daemon.as_ref().map_or(side.bench.stack.containerd_socket.as_path(), Daemon::socket);
    let kubelet = Kubelet { puller: row.puller, images: ImageServiceClient::new(unix_channel(socket)), gap: shape.gap };
    let pulled = Pulled(kubelet.start_pods(name, &images).await);
    drop(daemon);
    side.remove(&images).await;
    progress!(
        "  {name}: kubelet {} → {}: small ones {}, mean {}, all {}",
        row.puller.label(),
        endpoint_label(row.endpoint),
        report::duration(pulled.smalls()),
        report::duration(pulled.mean()),
        report::duration(pulled.all())
    );
    pulled
}

fn endpoint_label(endpoint: Endpoint) -> String {
    match endpoint {
        Endpoint::Containerd => "containerd".into(),
        Endpoint::CriImaged([]) => "cri-imaged, defaults".into(),
        Endpoint::CriImaged(flags) => format!("cri-imaged, defaults but {}", flags.join(" ")),
    }
}

/// The three targets for a cri-imaged row: against the kubelet alone at
/// `maxParallelImagePulls: 5` (`baseline`), and against the link's floor.
fn judge(findings: &mut Findings, row: &Row, pulled: &Pulled, baseline: &Pulled, floor: Duration) {
    let who = format!("cold node, kubelet {} → {}", row.puller.label(), endpoint_label(row.endpoint));
    let versus = format!("kubelet {} → containerd", ROWS[BASELINE].puller.label());
    for (what, of, limit) in [
        ("the small pods all pulled", Pulled::smalls as fn(&Pulled) -> Duration, 0.6),
        ("mean time to pulled", Pulled::mean, 0.7),
    ] {
        let (ours, theirs) = (of(pulled), of(baseline));
        let ratio = ours.as_secs_f64() / theirs.as_secs_f64();
        findings.verdicts.push(Verdict {
            what: format!("{who}: {what} / {versus}"),
            target: format!("≤ {limit:.2}"),
            measured: format!("{ratio:.2} ({} vs {})", report::duration(ours), report::duration(theirs)),
            met: ratio <= limit,
        });
    }
    let ratio = pulled.all().as_secs_f64() / floor.as_secs_f64();
    findings.verdicts.push(Verdict {
        what: format!("{who}: all pods pulled / the link's floor"),
        target: "≤ 1.10".into(),
        measured: format!("{ratio:.2} ({} vs {})", report::duration(pulled.all()), report::duration(floor)),
        met: ratio <= 1.1,
    });
}
