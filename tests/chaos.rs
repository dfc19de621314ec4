//! Runtime chaos (issue 17) on a real containerd and registry: under steady EnsureImageExists and
//! CRI load, containerd is frozen (SIGSTOP) for 5 s, then killed (SIGKILL) and restarted; and a
//! registry stops answering in the middle of a pull. No request may outlive its deadline, every
//! failure is UNAVAILABLE or DEADLINE_EXCEEDED with the kubelet's reason, health goes NOT_SERVING
//! and back, the presence cache stops remembering while containerd's events are down, and the
//! recovery times are measured (and asserted loosely: these machines are noisy). The kubelet's
//! HTTP probes (`/readyz`, `/livez` on the metrics listener) follow containerd too.

mod support;

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use cri_imaged::api::{GetStatusRequest, PullPolicy, image_manager_client::ImageManagerClient};
use cri_imaged::cri::{ImageSpec, ImageStatusRequest};
use support::{
    call, ensure, h2_connection,
    process::{DaemonProcess, free_port, http_get, signal_process},
    raw_unary, reason,
    stack::LocalStack,
    throttle::ThrottleProxy,
    unix_channel, wait_for_health,
};
use tokio::time::Instant;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_types::StatusExt;

const IF_NOT_PRESENT: i32 = PullPolicy::IfNotPresent as i32;
/// Every call's own deadline (its `grpc-timeout`).
const DEADLINE: Duration = Duration::from_secs(3);
/// What a debug build on two busy cores may add to a deadline before the answer is late.
const SLACK: Duration = Duration::from_secs(1);
/// How long the frozen containerd stays frozen, and the killed one dead.
const OUTAGE: Duration = Duration::from_secs(5);

/// One call of the load: which, when it began, how long it took, and how it ended.
#[derive(Debug, Clone)]
struct Outcome {
    rpc: &'static str,
    began: Instant,
    took: Duration,
    /// `None` for an answer; the code and reason of a failure.
    failure: Option<(Code, String)>,
}

const ENSURE: &str = "/imagemanager.v1.ImageManager/EnsureImageExists";
const IMAGE_STATUS: &str = "/runtime.v1.ImageService/ImageStatus";

/// Steady load through cri-imaged: two EnsureImageExists callers of a present image and one CRI
/// ImageStatus caller, each call with [`DEADLINE`], until stopped. Raw HTTP/2 calls, so that what
/// is seen is the daemon's own answer (see [`raw_unary`]).
struct Load {
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    async fn start(socket: &std::path::Path, image: &str) -> Self {
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let ensure_message = prost::Message::encode_to_vec(&ensure(image, IF_NOT_PRESENT));
        let spec = ImageSpec { image: image.to_owned(), ..Default::default() };
        let status_message = prost::Message::encode_to_vec(&ImageStatusRequest { image: Some(spec), verbose: false });
        let mut tasks = Vec::new();
        for (rpc, message) in [(ENSURE, &ensure_message), (ENSURE, &ensure_message), (IMAGE_STATUS, &status_message)] {
            let (outcomes, stop, message) = (outcomes.clone(), stop.clone(), message.clone());
            let connection = h2_connection(socket).await;
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let began = Instant::now();
                    let status = bounded(raw_unary(connection.clone(), rpc, &message, &grpc_timeout(DEADLINE))).await;
                    let failure = (status.code() != Code::Ok).then(|| (status.code(), reason_of(&status)));
                    record(&outcomes, Outcome { rpc, began, took: began.elapsed(), failure });
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }));
        }
        Self { outcomes, stop, tasks }
    }

    async fn stop(self) -> Vec<Outcome> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("a load task");
        }
        self.outcomes.lock().expect("outcomes").clone()
    }

    /// The first answer to a call that began at or after `since`: when it ended.
    fn first_answer_since(&self, since: Instant) -> Option<Instant> {
        let outcomes = self.outcomes.lock().expect("outcomes");
        outcomes
            .iter()
            .filter(|outcome| outcome.began >= since && outcome.failure.is_none())
            .map(|outcome| outcome.began + outcome.took)
            .min()
    }
}

/// `deadline` as a `grpc-timeout` header value.
fn grpc_timeout(deadline: Duration) -> String {
    format!("{}m", deadline.as_millis())
}

/// The reason in a status's details; empty when it has none (the CRI pass-through's statuses are
/// the runtime's).
fn reason_of(status: &tonic::Status) -> String {
    status.get_error_details().error_info().map(|info| info.reason.clone()).unwrap_or_default()
}

fn record(outcomes: &Mutex<Vec<Outcome>>, outcome: Outcome) {
    outcomes.lock().expect("outcomes").push(outcome);
}

/// A call bounded on the client side too, well past its deadline: a call that outlives it shows
/// as taking this long instead of hanging the test.
async fn bounded(call: impl Future<Output = tonic::Status>) -> tonic::Status {
    tokio::time::timeout(DEADLINE * 4, call)
        .await
        .unwrap_or_else(|_| tonic::Status::new(Code::Unknown, "no answer within four times the deadline"))
}

/// Polls GetStatus until the presence cache's watching is `wanted`, at most `limit`.
async fn wait_for_watching(socket: &std::path::Path, wanted: bool, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut client = ImageManagerClient::new(unix_channel(socket));
    while Instant::now() < deadline {
        let mut request = tonic::Request::new(GetStatusRequest::default());
        request.set_timeout(Duration::from_secs(1));
        if let Ok(status) = client.get_status(request).await
            && status.into_inner().presence_cache_watching == wanted
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the presence cache's watching did not become {wanted} within {limit:?}");
}

/// `GET path` on the metrics port: the status line's code and the body.
async fn probe(port: u16, path: &'static str) -> (u16, String) {
    let response = tokio::task::spawn_blocking(move || http_get(port, path)).await.expect("the GET ran");
    let code = response.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    (code, body)
}

/// Polls `/readyz` until it answers `code`, at most `limit`; how long that took.
async fn readyz_turns(port: u16, code: u16, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let (answered, body) = probe(port, "/readyz").await;
        if answered == code {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "/readyz still {answered} ({body:?}) after {limit:?}, not {code}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The DaemonSet's probes are `httpGet`s the kubelet makes itself: `/readyz` is 503 within a
/// health probe interval of containerd dying, saying why, and 200 again once it is back, while
/// `/livez` stays 200 (the pod is never restarted for the runtime's sake).
#[tokio::test]
async fn readyz_follows_containerd_over_http_while_livez_stays_ok() {
    let Some(stack) = LocalStack::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let interval = Duration::from_secs(1);
    let flags = ["--health-probe-interval", "1s", "--health-probe-timeout", "1s", "--metrics-listen", &metrics];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;
    readyz_turns(port, 200, Duration::from_secs(5)).await;
    assert_eq!(probe(port, "/readyz").await, (200, "ok\n".to_owned()));
    assert_eq!(probe(port, "/livez").await, (200, "ok\n".to_owned()));

    signal_process("-KILL", stack.containerd_pid());
    // A probe's interval, its timeout, and a second for a busy machine.
    let noticed = readyz_turns(port, 503, interval * 2 + Duration::from_secs(1)).await;
    let (_, why) = probe(port, "/readyz").await;
    assert!(why.starts_with("not ready: image service NOT_SERVING: the container runtime is unreachable"), "{why}");
    assert_eq!(probe(port, "/livez").await, (200, "ok\n".to_owned()), "live without containerd");

    stack.restart_containerd();
    let back = readyz_turns(port, 200, interval * 2 + Duration::from_secs(1)).await;
    eprintln!("/readyz: 503 {noticed:?} after containerd was killed, 200 {back:?} after it answered again");
    let (status, log) = daemon.terminate().await;
    assert!(status.success(), "{log}");
}

#[tokio::test]
async fn containerd_frozen_then_killed_and_restarted_under_load() {
    let Some(stack) = LocalStack::start() else { return };
    stack.seed("chaos/app:v1", "present all along");
    let image = stack.image("chaos/app:v1");
    let dir = tempfile::tempdir().expect("tempdir");
    let flags =
        ["--health-probe-interval", "250ms", "--health-probe-timeout", "500ms", "--runtime-request-timeout", "2s"];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;
    let socket = daemon.socket.clone();
    let health = cri_imaged::server::IMAGE_MANAGER_SERVICE;
    call(&mut ImageManagerClient::new(unix_channel(&socket)), ensure(&image, IF_NOT_PRESENT)).await.expect("pulled");
    wait_for_watching(&socket, true, Duration::from_secs(10)).await;

    let load = Load::start(&socket, &image).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Frozen: nothing answers on containerd's socket.
    let pid = stack.containerd_pid();
    signal_process("-STOP", pid);
    let frozen = Instant::now();
    wait_for_health(&socket, health, ServingStatus::NotServing, Duration::from_secs(3)).await;
    let noticed_frozen = frozen.elapsed();
    tokio::time::sleep(OUTAGE.saturating_sub(frozen.elapsed())).await;
    signal_process("-CONT", pid);
    let thawed = Instant::now();
    wait_for_health(&socket, health, ServingStatus::Serving, Duration::from_secs(5)).await;
    let serving_after_thaw = thawed.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let answered_after_thaw = load.first_answer_since(thawed).map(|at| at.saturating_duration_since(thawed));

    // Killed: the socket refuses, the event stream breaks; then containerd comes back.
    signal_process("-KILL", stack.containerd_pid());
    let killed = Instant::now();
    wait_for_health(&socket, health, ServingStatus::NotServing, Duration::from_secs(3)).await;
    let noticed_killed = killed.elapsed();
    wait_for_watching(&socket, false, Duration::from_secs(5)).await;
    tokio::time::sleep(OUTAGE.saturating_sub(killed.elapsed())).await;
    stack.restart_containerd();
    let restarted = Instant::now();
    wait_for_health(&socket, health, ServingStatus::Serving, Duration::from_secs(10)).await;
    let serving_after_restart = restarted.elapsed();
    wait_for_watching(&socket, true, Duration::from_secs(10)).await;
    let watching_after_restart = restarted.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let answered_after_restart = load.first_answer_since(restarted).map(|at| at.saturating_duration_since(restarted));
    let outcomes = load.stop().await;

    let failures: Vec<&Outcome> = outcomes.iter().filter(|outcome| outcome.failure.is_some()).collect();
    let late: Vec<&Outcome> = outcomes.iter().filter(|outcome| outcome.took > DEADLINE + SLACK).collect();
    let longest = outcomes.iter().map(|outcome| outcome.took).max().unwrap_or_default();
    eprintln!(
        "{} calls, {} failed, longest {longest:?}; frozen: NOT_SERVING after {noticed_frozen:?}, SERVING {serving_after_thaw:?} \
         and the first answer {answered_after_thaw:?} after the thaw; killed: NOT_SERVING after {noticed_killed:?}, \
         SERVING {serving_after_restart:?}, events watched again {watching_after_restart:?} and the first answer \
         {answered_after_restart:?} after the restart",
        outcomes.len(),
        failures.len(),
    );
    assert!(late.is_empty(), "calls outlived their {DEADLINE:?} deadline: {late:?}");
    for outcome in &failures {
        let (code, reason) = outcome.failure.as_ref().expect("a failure");
        assert!(matches!(code, Code::Unavailable | Code::DeadlineExceeded), "{outcome:?}");
        // The runtime's own deadline or refusal is the kubelet's ImageInspectError; a call whose
        // own deadline came first (waiting behind the frozen runtime) is answered at it.
        if outcome.rpc == ENSURE {
            assert!(
                (code, reason.as_str()) == (&Code::DeadlineExceeded, "DeadlineExceeded")
                    || reason == "ImageInspectError",
                "the kubelet's reason for a runtime that does not answer: {outcome:?}"
            );
        }
    }
    assert!(!failures.is_empty(), "the outages were felt");
    let inspect_errors = failures
        .iter()
        .filter(|outcome| outcome.failure.as_ref().is_some_and(|(_, reason)| reason == "ImageInspectError"));
    assert!(inspect_errors.count() > 0, "the runtime's failures reached callers as ImageInspectError");
    let recovered = |after: Option<Duration>| after.is_some_and(|after| after < Duration::from_secs(5));
    assert!(recovered(answered_after_thaw), "no answer within 5 s of the thaw");
    assert!(recovered(answered_after_restart), "no answer within 5 s of the restart");
    let recovered_at = restarted + serving_after_restart + Duration::from_secs(1);
    let after_recovery: Vec<&Outcome> = outcomes.iter().filter(|outcome| outcome.began > recovered_at).collect();
    assert!(!after_recovery.is_empty(), "no call was made after the recovery");
    let failed_after: Vec<&&Outcome> = after_recovery.iter().filter(|outcome| outcome.failure.is_some()).collect();
    assert!(failed_after.is_empty(), "calls failed a second after health came back: {failed_after:?}");
    let log = daemon.log_text();
    assert!(!log.contains("panicked"), "{log}");
}

#[tokio::test]
async fn a_registry_that_stops_answering_mid_pull_never_holds_a_caller_past_its_deadline() {
    let Some(stack) = LocalStack::start() else { return };
    stack.seed_sized("chaos/big:v1", 8 << 20);
    let registry: SocketAddr = stack.registry.parse().expect("the registry's address");
    // Unstalled, the 8 MiB would arrive in about 2 s, within the caller's deadline.
    let proxy = ThrottleProxy::start(registry, 4 << 20).await;
    stack.route_through(proxy.addr.port());
    let dir = tempfile::tempdir().expect("tempdir");
    // No stall timeout: the caller's own deadline is what must end the wait.
    let flags = ["--image-pull-progress-timeout", "0s"];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;
    let image = proxy.image("chaos/big:v1");
    let connection = h2_connection(&daemon.socket).await;
    let message = prost::Message::encode_to_vec(&ensure(&image, IF_NOT_PRESENT));
    let began = Instant::now();
    let pulling =
        tokio::spawn(async move { bounded(raw_unary(connection, ENSURE, &message, &grpc_timeout(DEADLINE))).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.stall();
    let forwarded = proxy.bytes_forwarded();
    assert!(forwarded < 8 << 20, "the stall came mid-pull: {forwarded} bytes forwarded");
    let status = pulling.await.expect("the call's task");
    let took = began.elapsed();
    eprintln!("a pull stalled at the registry: {:?} after {took:?}: {}", status.code(), status.message());
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(reason(&status), "DeadlineExceeded", "{status:?}");
    assert!(took <= DEADLINE + SLACK, "answered {took:?} after a {DEADLINE:?} deadline");

    // The pull was cancelled with its only caller; once the registry answers again, the next
    // caller's pull brings the image.
    proxy.resume();
    let mut client = ImageManagerClient::new(unix_channel(&daemon.socket));
    let mut present = None;
    for _ in 0..60 {
        let mut request = tonic::Request::new(ensure(&image, IF_NOT_PRESENT));
        request.set_timeout(Duration::from_secs(10));
        if let Ok(answer) = client.ensure_image_exists(request).await {
            present = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(present.is_some(), "the image never arrived after the registry resumed:\n{}", daemon.log_text());
}
