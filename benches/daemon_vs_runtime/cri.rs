//! The kubelet's hot path (issue 32): CRI ImageStatus, ListImages and ImageFsInfo through
//! cri-imaged's pass-through — as shipped (answered from memory) and strict (every call asked of
//! containerd) — against the same calls on containerd directly and through a byte relay (socat:
//! the least one more hop costs), with two callers: the project's Rust client and Python grpcio
//! (`tests/clients/cri_load.py`). Then the memory the remembered answers take for 1,000 images.
//! And newer kubelets' calls (issue 48), with the Rust client: StreamImages through cri-imaged
//! against ListImages where containerd has no StreamImages (what a kubelet with the gate on falls
//! back to), and a call cri-imaged does not know (Kubernetes 1.38's PullSecurityProfile), relayed
//! whole to containerd, whose UNIMPLEMENTED is the answer.

use std::{
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use cri_imaged::cri::{
    ImageFsInfoRequest, ImageSpec, ImageStatusRequest, ListImagesRequest, StreamImagesRequest,
    image_service_client::ImageServiceClient,
};
use futures_util::StreamExt;
use serde_json::json;

use crate::{
    Bench, Daemon, Findings, PresenceCall, Sizes,
    load::Run,
    memory,
    report::{self, Table, Verdict},
    support::{oci_image::Image, registry_push},
    take_turns, unix_channel,
};

/// Images on containerd for the larger ListImages rows (and the memory row) in a full run.
const MANY_IMAGES: usize = 1000;
/// The same, in a smoke run.
const MANY_IMAGES_QUICK: usize = 60;
/// Images for the other rows, at least.
const FEW_IMAGES: usize = 50;

/// One of the calls measured.
#[derive(Clone)]
enum Call {
    /// ImageStatus of a present image, not verbose.
    Status(String),
    List,
    FsInfo,
    /// StreamImages (KEP-5825); on containerd before 2.4 directly, ListImages.
    Stream,
    /// PullSecurityProfile, which cri-imaged relays; containerd answers UNIMPLEMENTED.
    Unknown,
}

impl Call {
    fn name(&self) -> &'static str {
        match self {
            Self::Status(_) => "ImageStatus",
            Self::List => "ListImages",
            Self::FsInfo => "ImageFsInfo",
            Self::Stream => "StreamImages",
            Self::Unknown => "PullSecurityProfile",
        }
    }

    /// The call on a path that is containerd (directly or through a relay): a kubelet with
    /// `CRIListStreaming` on gets UNIMPLEMENTED for StreamImages there, and lists instead.
    fn on_containerd(&self) -> Self {
        match self {
            Self::Stream => Self::List,
            other => other.clone(),
        }
    }

    /// Whether the Python caller makes this call too (`cri_load.py` makes unary calls of the
    /// proto).
    fn in_python(&self) -> bool {
        matches!(self, Self::Status(_) | Self::List | Self::FsInfo)
    }

    /// The call as `tests/clients/cri_load.py` takes it.
    fn json(&self) -> String {
        let request = match self {
            Self::Status(image) => json!({ "image": { "image": image } }),
            Self::List | Self::FsInfo | Self::Stream | Self::Unknown => json!({}),
        };
        json!({ "method": format!("runtime.v1.ImageService/{}", self.name()), "request": request }).to_string()
    }

    /// The call with the project's client on `socket`; a status must find the image.
    fn rust(&self, socket: &Path) -> PresenceCall {
        let channel = unix_channel(socket);
        let client = ImageServiceClient::new(channel.clone());
        let call = self.clone();
        Arc::new(move |_| {
            let (mut client, call, channel) = (client.clone(), call.clone(), channel.clone());
            Box::pin(async move {
                let failed = |status: tonic::Status| status.to_string();
                match call {
                    Call::Status(image) => {
                        let image = Some(ImageSpec { image, ..Default::default() });
                        let status = client.image_status(ImageStatusRequest { image, verbose: false }).await;
                        match status.map_err(failed)?.into_inner().image {
                            Some(_) => Ok(()),
                            None => Err("the image is absent".to_owned()),
                        }
                    }
                    Call::List => client.list_images(ListImagesRequest::default()).await.map(drop).map_err(failed),
                    Call::FsInfo => client.image_fs_info(ImageFsInfoRequest {}).await.map(drop).map_err(failed),
                    Call::Stream => {
                        let stream = client.stream_images(StreamImagesRequest::default()).await.map_err(failed)?;
                        let mut messages = stream.into_inner();
                        while let Some(message) = messages.next().await {
                            message.map_err(failed)?;
                        }
                        Ok(())
                    }
                    Call::Unknown => {
                        let mut grpc = tonic::client::Grpc::new(channel);
                        grpc.ready().await.map_err(|error| error.to_string())?;
                        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
                            "/runtime.v1.ImageService/PullSecurityProfile",
                        );
                        let request = tonic::Request::new(bytes::Bytes::from_static(b"\x0a\x08\x0a\x06alpine"));
                        match grpc.unary(request, path, cri_imaged::runtime::passthrough::RawCodec).await {
                            Err(status) if status.code() == tonic::Code::Unimplemented => Ok(()),
                            Err(status) => Err(failed(status)),
                            Ok(_) => Err("containerd answered PullSecurityProfile".to_owned()),
                        }
                    }
                }
            })
        })
    }
}

/// A Python grpcio caller (`tests/clients/cri_load.py`): one channel, one call, run on command.
struct PythonCaller {
    child: Child,
    commands: ChildStdin,
    answers: std::io::BufReader<ChildStdout>,
}

impl PythonCaller {
    fn spawn(socket: &Path, call: &Call) -> Self {
        let clients = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients");
        let mut child = Command::new("python3")
            .arg(Path::new(clients).join("cri_load.py"))
            .arg(socket)
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/proto"))
            .arg(call.json())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs tests/clients/cri_load.py");
        let commands = child.stdin.take().expect("stdin");
        let answers = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        Self { child, commands, answers }
    }

    /// The call back to back for `turn`.
    fn run(&mut self, turn: Duration) -> Run {
        use std::io::{BufRead, Write};
        writeln!(self.commands, "{}", turn.as_secs_f64()).expect("command cri_load.py");
        let mut line = String::new();
        self.answers.read_line(&mut line).expect("cri_load.py answers");
        let answer: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|error| panic!("cri_load.py printed {line:?}: {error}"));
        let latencies_us: Vec<u32> = answer["latencies_us"]
            .as_array()
            .map(|all| all.iter().filter_map(|us| us.as_u64()).map(|us| us as u32).collect())
            .unwrap_or_default();
        let errors = match answer["errors"].as_u64() {
            Some(0) | None => Vec::new(),
            Some(count) => vec![format!("{count} errors, first: {}", answer["first_error"]); count as usize],
        };
        Run { latencies_us, elapsed: turn, errors }
    }
}

impl Drop for PythonCaller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// As [`take_turns`], one Python caller per side: warmed, then in turns of alternating order.
fn python_turns(callers: &mut [PythonCaller], sizes: &Sizes) -> Vec<Run> {
    for caller in callers.iter_mut() {
        caller.run(sizes.turn / 2);
    }
    let mut runs: Vec<Run> = callers.iter().map(|_| Run::default()).collect();
    for round in 0..sizes.pairs * 2 {
        let order: Vec<usize> =
            if round % 2 == 0 { (0..callers.len()).collect() } else { (0..callers.len()).rev().collect() };
        for side in order {
            runs[side].absorb(callers[side].run(sizes.turn));
        }
    }
    for run in &mut runs {
        assert!(run.errors.is_empty(), "{}", run.errors[0]);
        assert!(!run.latencies_us.is_empty(), "no call completed");
        run.sort();
    }
    runs
}

/// The sides of every row: containerd directly, cri-imaged as shipped, cri-imaged strict, and a
/// relay that copies bytes to containerd and parses nothing: what one more hop costs at least.
const PATHS: [&str; 4] = ["containerd directly", "cri-imaged", "cri-imaged, strict", "a byte relay (socat)"];

/// `socat` relaying a unix socket's connections to containerd's, byte for byte.
struct ByteRelay {
    child: Child,
    socket: std::path::PathBuf,
}

impl ByteRelay {
    async fn start(bench: &Bench) -> Self {
        let socket = bench.work.path().join("byte-relay.sock");
        let listen = format!("UNIX-LISTEN:{},fork", socket.display());
        let connect = format!("UNIX-CONNECT:{}", bench.stack.containerd_socket.display());
        let child = Command::new("socat")
            .args([&listen, &connect])
            .spawn()
            .unwrap_or_else(|error| panic!("socat relays (scripts/install-deps.sh installs it): {error}"));
        let relay = Self { child, socket };
        crate::support::eventually("socat listens", Duration::from_secs(10), || relay.socket.exists()).await;
        relay
    }
}

impl Drop for ByteRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one row measured: a run per path.
struct Measured {
    call: &'static str,
    images: usize,
    caller: &'static str,
    concurrency: usize,
    runs: Vec<Run>,
}

pub async fn run(bench: &Bench, findings: &mut Findings) {
    let many = if bench.sizes.pairs > 1 { MANY_IMAGES } else { MANY_IMAGES_QUICK };
    progress!("CRI hot path: ImageStatus, ListImages and ImageFsInfo at {FEW_IMAGES} and {many} images");
    let cached = Daemon::start(bench, "cri-cached", &[]).await;
    let strict_flags = ["--presence-cache-max-staleness=0s", "--image-fs-info-max-age=0s"];
    let strict = Daemon::start(bench, "cri-strict", &strict_flags).await;
    crate::support::eventually("cri-imaged watches containerd's events", Duration::from_secs(10), || {
        cached.metric("cri_imaged_presence_cache_watching") == 1.0
    })
    .await;
    let relay = ByteRelay::start(bench).await;
    let sockets = [bench.stack.containerd_socket.as_path(), cached.socket(), strict.socket(), &relay.socket];
    let present = bench.images.present.clone();
    pull(bench, &present).await;
    // At least that many: the sections before may have left more.
    let few = fill(bench, FEW_IMAGES).await.len();
    let mut measured = Vec::new();
    for call in [Call::Status(present.clone()), Call::List, Call::FsInfo, Call::Stream, Call::Unknown] {
        measured.push(measure(bench, &call, few, &sockets, 1).await);
        if let Call::Status(_) = call {
            measured.push(measure(bench, &call, few, &sockets, 16).await);
        }
    }
    let images = fill(bench, many).await;
    let before = memory::resident(cached.pid());
    let remembered = remember_all(cached.socket(), &images).await;
    let after = memory::resident(cached.pid());
    measured.push(measure(bench, &Call::List, images.len(), &sockets, 1).await);
    measured.push(measure(bench, &Call::Stream, images.len(), &sockets, 1).await);
    tabulate(measured, findings);

    let growth_mib = (after.now_kib.saturating_sub(before.now_kib)) as f64 / 1024.0;
    findings.memory.row(vec![
        format!("{} images' CRI answers remembered ({remembered} answers)", images.len()),
        report::mib(after.now_kib),
        report::mib(after.peak_kib),
        "reported".into(),
    ]);
    findings.verdicts.push(Verdict {
        what: format!("memory of the remembered CRI answers for {} images (resident growth)", images.len()),
        target: "reported".into(),
        measured: format!("{growth_mib:.2} MiB"),
        met: true,
    });
}

/// Pushes and pulls small images until containerd lists `count`; returns their names.
async fn fill(bench: &Bench, count: usize) -> Vec<String> {
    let registry = bench.stack.registry.parse().expect("the registry's address");
    let mut images: Vec<String> = listed(bench).await;
    let mut index = images.len();
    while images.len() < count {
        let batch: Vec<String> = (0..(count - images.len()).min(16))
            .map(|_| {
                index += 1;
                let repository = format!("bench/listed-{index}");
                registry_push::push(registry, &repository, "v1", &Image::new(&repository, 1024, 1)).expect("push");
                bench.stack.image(&format!("{repository}:v1"))
            })
            .collect();
        futures_util::future::join_all(batch.iter().map(|image| pull(bench, image))).await;
        images = listed(bench).await;
    }
    images
}

/// `image` pulled on containerd directly.
async fn pull(bench: &Bench, image: &str) {
    let image = ImageSpec { image: image.to_owned(), ..Default::default() };
    let spec = cri_imaged::runtime::PullSpec { image, ..Default::default() };
    cri_imaged::runtime::ImageRuntime::pull_image(&*bench.direct, spec).await.expect("containerd pulls");
}

/// One name of every image containerd lists.
async fn listed(bench: &Bench) -> Vec<String> {
    let images = cri_imaged::runtime::ImageRuntime::list_images(&*bench.direct).await.expect("list");
    images.into_iter().filter_map(|image| image.names.into_iter().next()).collect()
}

/// Asks cri-imaged for ListImages and each image's status, so that all are remembered; returns
/// how many answers were asked for.
async fn remember_all(socket: &Path, images: &[String]) -> usize {
    let mut client = ImageServiceClient::new(unix_channel(socket));
    client.list_images(ListImagesRequest::default()).await.expect("ListImages");
    for image in images {
        let image = Some(ImageSpec { image: image.clone(), ..Default::default() });
        client.image_status(ImageStatusRequest { image, verbose: false }).await.expect("ImageStatus");
    }
    images.len() + 1
}

/// `call` on each path, with the Rust client at `concurrency` and, at concurrency 1, Python too.
async fn measure(bench: &Bench, call: &Call, images: usize, sockets: &[&Path; 4], concurrency: usize) -> Vec<Measured> {
    progress!("  {} at {images} images, concurrency {concurrency}", call.name());
    let on_containerd = |path: &str| path == PATHS[0] || path == PATHS[3];
    let sides: Vec<(&str, PresenceCall)> = PATHS
        .iter()
        .zip(sockets)
        .map(|(path, socket)| {
            let call = if on_containerd(path) { call.on_containerd() } else { call.clone() };
            (*path, call.rust(socket))
        })
        .collect();
    let rust = take_turns(&sides, concurrency, bench.sizes).await;
    let mut measured = vec![Measured { call: call.name(), images, caller: "Rust (tonic)", concurrency, runs: rust }];
    if concurrency == 1 && call.in_python() {
        let sizes = bench.sizes;
        let sockets: Vec<_> = sockets.iter().map(|socket| socket.to_path_buf()).collect();
        let call = call.clone();
        let python = tokio::task::spawn_blocking(move || {
            let mut callers: Vec<PythonCaller> =
                sockets.iter().map(|socket| PythonCaller::spawn(socket, &call)).collect();
            python_turns(&mut callers, sizes)
        })
        .await
        .expect("the Python caller");
        measured.push(Measured { call: measured[0].call, images, caller: "Python grpcio", concurrency, runs: python });
    }
    measured
}

/// The table and the targets.
fn tabulate(measured: Vec<Vec<Measured>>, findings: &mut Findings) {
    let mut table = Table::new(
        "CRI hot path: ImageStatus, ListImages and ImageFsInfo through cri-imaged (as shipped: from memory; strict: --presence-cache-max-staleness=0s --image-fs-info-max-age=0s) vs containerd directly; StreamImages (where containerd, which has none before 2.4, is asked its ListImages, as a kubelet falls back) and PullSecurityProfile (relayed; containerd answers UNIMPLEMENTED)",
        &["call", "images", "caller", "concurrency", "path", "p50", "p99", "req/s", "p50 / direct", "req/s / direct"],
    );
    for row in measured.iter().flatten() {
        let direct = &row.runs[0];
        for (path, run) in PATHS.iter().zip(&row.runs) {
            let [p50, p99, per_second] = report::latency_cells(run);
            table.row(vec![
                row.call.to_owned(),
                row.images.to_string(),
                row.caller.to_owned(),
                row.concurrency.to_string(),
                (*path).to_owned(),
                p50,
                p99,
                per_second,
                report::ratio(run.quantile_us(0.5).into(), direct.quantile_us(0.5).into()),
                report::ratio(run.requests_per_second(), direct.requests_per_second()),
            ]);
        }
        let p50 = |side: usize| f64::from(row.runs[side].quantile_us(0.5));
        let p50_ratio = |side: usize| p50(side) / p50(0);
        let shown = |side: usize| {
            let (us, direct) = (row.runs[side].quantile_us(0.5), row.runs[0].quantile_us(0.5));
            format!("{:.2} ({} vs {})", p50_ratio(side), report::micros(us), report::micros(direct))
        };
        let what = format!("CRI {} at {} images, {}", row.call, row.images, row.caller);
        if row.call == "PullSecurityProfile" {
            // Relayed whole: one more hop, measured beside the least one costs (socat).
            for (side, how) in [(1, "relayed by cri-imaged"), (3, "a byte relay (socat)")] {
                findings.verdicts.push(Verdict {
                    what: format!("{what} (containerd: UNIMPLEMENTED): p50, {how} / direct"),
                    target: "reported".into(),
                    measured: shown(side),
                    met: true,
                });
            }
            continue;
        }
        if row.concurrency == 1 {
            findings.verdicts.push(Verdict {
                what: format!("{what}: p50, cri-imaged / direct, concurrency 1"),
                target: "≤ 0.80".into(),
                measured: shown(1),
                met: p50_ratio(1) <= 0.8,
            });
            if row.call == "ImageStatus" {
                findings.verdicts.push(Verdict {
                    what: format!("{what}: p50, cri-imaged strict / direct, concurrency 1"),
                    target: "≤ 1.30".into(),
                    measured: shown(2),
                    met: p50_ratio(2) <= 1.3,
                });
                findings.verdicts.push(Verdict {
                    what: format!("{what}: p50, a byte relay (socat) / direct, concurrency 1"),
                    target: "reported".into(),
                    measured: shown(3),
                    met: true,
                });
            }
        } else {
            let rps = |side: usize| row.runs[side].requests_per_second();
            let ratio = rps(1) / rps(0);
            findings.verdicts.push(Verdict {
                what: format!("{what}: throughput, cri-imaged / direct, concurrency {}", row.concurrency),
                target: "≥ 1.20".into(),
                measured: format!("{ratio:.2} ({:.0} vs {:.0} req/s)", rps(1), rps(0)),
                met: ratio >= 1.2,
            });
        }
    }
    findings.tables.push(table);
}
