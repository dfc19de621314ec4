//! Registries that hang, go away or answer 429, on the real stack with the daemon's default
//! flags: a registry that accepts connections and never answers does not hold the pods of a
//! healthy one and its own pods get `RegistryUnavailable` at the resolve timeout; a registry
//! stopped in its network namespace refuses connections, so its pods get `RegistryUnavailable`
//! from the first pull, and opens its breaker, which lets one pull test it once cooled down and
//! closes when the registry is back; a registry answering 429 has its rate lowered until it stops.
//! With `--pull-progress=false` (what CRI-O, without a content service, looks like to us) the hung
//! registry's spec holds as well, the registry asked itself, through the mirror a registries.conf names.

mod support;

use std::time::Duration;

use cri_imaged::api::{
    GetStatusRequest, PodRef, PullPolicy, RateLimitBucket, WatchEventsRequest, image_manager_client::ImageManagerClient,
};
use serde_json::json;
use support::{
    call,
    clients::{Answer, Client},
    ensure,
    netrig::{LinkShape, NetRig},
    process::{DaemonProcess, grpcurl, require_tool},
    reason,
    registry_faults::{HungRegistry, RateLimitProxy, Refusal},
    stack::LocalStack,
    unix_channel,
};
use tokio::{task::JoinHandle, time::Instant};
use tonic::Code;

fn pod(uid: &str) -> PodRef {
    PodRef { namespace: "default".into(), name: format!("pod-{uid}"), uid: uid.into(), ..Default::default() }
}

/// EnsureImageExists of `image` for pod `uid` in a task: its answer and how long it took.
fn ask(
    socket: &std::path::Path,
    image: &str,
    uid: &str,
) -> JoinHandle<(Result<cri_imaged::api::EnsureImageExistsResponse, tonic::Status>, Duration)> {
    let mut client = ImageManagerClient::new(unix_channel(socket));
    let mut request = ensure(image, PullPolicy::IfNotPresent as i32);
    request.pod = Some(pod(uid));
    let asked = Instant::now();
    tokio::spawn(async move {
        let answer = tokio::time::timeout(Duration::from_secs(150), call(&mut client, request)).await;
        (answer.unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("no answer in 150 s"))), asked.elapsed())
    })
}

async fn registries(socket: &std::path::Path) -> Vec<cri_imaged::api::RegistryHealth> {
    let mut client = ImageManagerClient::new(unix_channel(socket));
    let status = client.get_status(GetStatusRequest::default()).await.expect("GetStatus answers");
    status.into_inner().registries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_registry_holds_neither_a_healthy_registrys_pods_nor_its_own_past_the_resolve_timeout() {
    hung_registry_holds_nothing_past_the_resolve_timeout(&[]).await;
}

/// The same where the runtime says nothing of a pull while it runs, as CRI-O (no content
/// service): the registry itself is asked whether it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_runtimes_progress_a_hung_registry_holds_nothing_past_the_resolve_timeout() {
    hung_registry_holds_nothing_past_the_resolve_timeout(&["--pull-progress=false"]).await;
}

async fn hung_registry_holds_nothing_past_the_resolve_timeout(flags: &[&str]) {
    let Some(stack) = LocalStack::start() else { return };
    let healthy: Vec<String> = (0..3).map(|i| format!("{}:1", stack.image(&format!("healthy-{i}")))).collect();
    for i in 0..healthy.len() {
        stack.seed(&format!("healthy-{i}:1"), &format!("healthy {i}"));
    }
    let hung = HungRegistry::start().await;
    stack.route_through(hung.addr.port());
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, flags).await;

    // Ten pods on five images of the hung registry, pulls in parallel (the default).
    let started = Instant::now();
    let stuck: Vec<_> = (0..10)
        .map(|i| ask(&daemon.socket, &format!("{}/hung-{}:1", hung.addr, i % 5), &format!("stuck-{i}")))
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let fine: Vec<_> =
        healthy.iter().enumerate().map(|(i, image)| ask(&daemon.socket, image, &format!("fine-{i}"))).collect();
    for pod in fine {
        let (answer, took) = pod.await.expect("joined");
        answer.expect("a healthy registry's pod is pulled");
        assert!(took < Duration::from_secs(5), "a healthy registry's pod waited {took:?} behind the hung one");
    }
    let unanswered = registries(&daemon.socket).await;
    let host = hung.addr.to_string();
    assert!(unanswered.iter().any(|registry| registry.host == host && registry.unanswered), "{unanswered:?}");

    for pod in stuck {
        let (answer, _) = pod.await.expect("joined");
        let status = answer.expect_err("the hung registry never answers");
        assert_eq!((status.code(), reason(&status)), (Code::Unavailable, "RegistryUnavailable".to_owned()));
        assert!(
            status.message().contains(&format!(
                r#"because the registry is unavailable: registry "{host}" did not answer within 20s"#
            )),
            "{}",
            status.message()
        );
    }
    let all_answered = started.elapsed();
    assert!(all_answered < Duration::from_secs(30), "every pod of the hung registry answered by {all_answered:?}");

    // Five images failed to reach it: its breaker is open, a new pod fails at once.
    let open = registries(&daemon.socket).await;
    let entry = open.iter().find(|registry| registry.host == host).expect("the hung registry is reported");
    assert_eq!((entry.breaker.as_str(), entry.failures), ("open", 5), "{entry:?}");
    let (answer, took) = ask(&daemon.socket, &format!("{host}/hung-9:1"), "late").await.expect("joined");
    let status = answer.expect_err("the breaker is open");
    assert!(took < Duration::from_secs(2), "refused at once, not after {took:?}");
    assert!(status.message().contains("is unavailable after 5 failed pulls in a row"), "{}", status.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_registry_is_unavailable_from_the_first_pull_opens_its_breaker_and_closes_it_once_back() {
    let Some(stack) = LocalStack::start() else { return };
    // The registry in a network namespace of its own, over an unshaped link: stopped, its
    // address refuses connections as a registry that went down does.
    let Some(rig) = NetRig::start(LinkShape::default()) else { return };
    rig.route(&stack);
    rig.push_image("back:1", 100_000, 1);
    let dir = tempfile::tempdir().expect("tempdir");
    let flags = ["--registry-breaker-failures", "2", "--registry-breaker-cooldown", "3s"];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;
    let image = rig.image("back:1");
    let host = rig.registry();

    tokio::task::block_in_place(|| rig.stop_registry());
    // Each pull, the first too, is RegistryUnavailable around containerd's own words, as cri-imaged
    // names a network-level failure; the breaker counts them as before.
    for uid in ["a", "b"] {
        let (answer, _) = ask(&daemon.socket, &image, uid).await.expect("joined");
        let status = answer.expect_err("nothing listens");
        assert_eq!((status.code(), reason(&status).as_str()), (Code::Unavailable, "RegistryUnavailable"), "{uid}");
        let kubelets = format!("image pull failed for {image} because the registry is unavailable: failed to pull");
        assert!(status.message().starts_with(&kubelets), "{}", status.message());
        assert!(status.message().ends_with("connect: connection refused"), "{}", status.message());
    }
    let open = registries(&daemon.socket).await;
    assert_eq!(open.iter().find(|r| r.host == host).map(|r| r.breaker.as_str()), Some("open"), "{open:?}");
    // As grpcurl (its default flags) shows it to a person at the node.
    let grpcurl_bin = require_tool("grpcurl").expect("grpcurl is installed by scripts/install-deps.sh");
    let socket = daemon.socket.clone();
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        grpcurl(&grpcurl_bin, &socket, &[], &["imagemanager.v1.ImageManager/GetStatus"])
    })
    .await
    .expect("grpcurl ran");
    assert!(ok, "{stderr}");
    let status: serde_json::Value = serde_json::from_str(&stdout).expect("GetStatus as JSON");
    let entry = status["registries"].as_array().and_then(|all| all.iter().find(|r| r["host"] == host.as_str()));
    let entry = entry.unwrap_or_else(|| panic!("the stopped registry in grpcurl's GetStatus: {stdout}"));
    assert_eq!((entry["breaker"].as_str(), entry["failures"].as_u64()), (Some("open"), Some(2)), "{stdout}");
    // containerd's words, not named again inside the breaker's own RegistryUnavailable.
    assert!(
        entry["openUntil"].is_string()
            && entry["lastFailure"]
                .as_str()
                .is_some_and(|last| last.contains("connection refused") && !last.contains("RegistryUnavailable")),
        "{stdout}"
    );
    let (answer, took) = ask(&daemon.socket, &image, "c").await.expect("joined");
    let status = answer.expect_err("open: refused without trying");
    assert_eq!(reason(&status), "RegistryUnavailable");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // A kubelet pulling through CRI: UNKNOWN with the prefix, the only form whose message its CRI
    // client hands to its prefix test, so the pod gets the kubelet's own RegistryUnavailable.
    let pull = json!({ "image": { "image": image } });
    let socket = daemon.socket.clone();
    let answer =
        tokio::task::spawn_blocking(move || Client::Grpcio.call(&socket, "runtime.v1.ImageService/PullImage", pull))
            .await
            .expect("grpcio ran");
    let Answer::Error { code, message } = answer else { panic!("refused: {answer:?}") };
    assert_eq!(code, "UNKNOWN", "{message}");
    assert!(message.starts_with("RegistryUnavailable: "), "{message}");

    // Back, and cooled down: half-open, the next pull tests it and closes the breaker.
    tokio::task::block_in_place(|| rig.start_registry());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let half_open = registries(&daemon.socket).await;
    assert_eq!(half_open.iter().find(|r| r.host == host).map(|r| r.breaker.as_str()), Some("half-open"));
    let (answer, _) = ask(&daemon.socket, &image, "d").await.expect("joined");
    answer.expect("the probe pulls from the registry that is back");
    assert!(registries(&daemon.socket).await.iter().all(|r| r.host != host), "closed: nothing to report");
}

/// The bucket GetStatus shows for `host`, if it has one of its own.
async fn bucket(socket: &std::path::Path, host: &str) -> Option<RateLimitBucket> {
    let mut client = ImageManagerClient::new(unix_channel(socket));
    let status = client.get_status(GetStatusRequest::default()).await.expect("GetStatus answers");
    status.into_inner().rate_limits.into_iter().find(|bucket| bucket.host == host)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_answering_429_has_its_rate_halved_at_each_and_raised_again_once_it_stops() {
    let Some(stack) = LocalStack::start() else { return };
    stack.seed("limited:1", "limited");
    let upstream = stack.registry.parse().expect("the registry's address");
    let proxy = RateLimitProxy::start(upstream, Refusal::Always).await;
    stack.route_through(proxy.addr.port());
    let dir = tempfile::tempdir().expect("tempdir");
    // The default rate (5 a second) and floor; a recovery quick enough for the test to see a step.
    let flags = ["--registry-qps-recovery", "2s"];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;
    let mut client = ImageManagerClient::new(unix_channel(&daemon.socket));
    let mut events = client.watch_events(WatchEventsRequest::default()).await.expect("watching").into_inner();
    let (image, host) = (proxy.image("limited:1"), proxy.addr.to_string());

    let (answer, _) = ask(&daemon.socket, &image, "a").await.expect("joined");
    let status = answer.expect_err("every request is refused");
    assert!(status.message().contains("429 Too Many Requests"), "{}", status.message());
    let lowered = bucket(&daemon.socket, &host).await.expect("a bucket of its own once it answered 429");
    assert_eq!((lowered.qps, lowered.burst, lowered.lowered_from_qps), (2.5, 1, 5.0), "{lowered:?}");
    let throttled = loop {
        let event = tokio::time::timeout(Duration::from_secs(5), events.message())
            .await
            .expect("an event within 5 s")
            .expect("the stream goes on")
            .expect("an event");
        if event.reason == "RegistryThrottled" {
            break event;
        }
    };
    assert_eq!(throttled.r#type, "Warning");
    assert!(
        throttled.message.contains(&format!(
            r#"registry "{host}" answered 429 Too Many Requests: its pulls are limited to 2.50 a second (was 5.00)"#
        )),
        "{}",
        throttled.message
    );

    // Another 429 a second later halves it again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (answer, _) = ask(&daemon.socket, &image, "b").await.expect("joined");
    answer.expect_err("still refused");
    let lower = bucket(&daemon.socket, &host).await.expect("still lowered");
    assert_eq!((lower.qps, lower.lowered_from_qps), (1.25, 5.0), "{lower:?}");

    // The registry stops refusing: the next pull (once a token is back) goes through, and after
    // a quiet period the rate is up a tenth of 5.
    proxy.set_refusal(Refusal::Never);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (answer, _) = ask(&daemon.socket, &image, "c").await.expect("joined");
    answer.expect("pulled once the registry lets it");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let step = bucket(&daemon.socket, &host).await.expect("still lowered: it rises a step at a time");
    assert_eq!((step.qps, step.lowered_from_qps), (1.75, 5.0), "{step:?}");
}

/// Without the runtime's progress, on a node configured as CRI-O's (a registries.conf, no
/// hosts.toml directory), the registry is asked where the file sends its pulls: its mirror first.
/// The mirror hangs too: the pod is RegistryUnavailable at the resolve timeout, and the mirror
/// was asked, one probe at a time however many pods wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_runtimes_progress_a_registry_is_asked_through_the_mirror_its_registries_conf_names() {
    let Some(stack) = LocalStack::start() else { return };
    let (hung, mirror) = (HungRegistry::start().await, HungRegistry::start().await);
    stack.route_through(hung.addr.port());
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("registries.conf");
    let text = format!(
        "[[registry]]\nprefix = \"{hung}\"\nlocation = \"{hung}\"\n\n[[registry.mirror]]\nlocation = \"{mirror}\"\n",
        hung = hung.addr,
        mirror = mirror.addr
    );
    std::fs::write(&conf, text).expect("registries.conf written");
    let registries_conf = format!("--registries-conf={}", conf.display());
    let flags = ["--pull-progress=false", "--registry-config-path=", &registries_conf, "--registry-resolve-timeout=4s"];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;

    let pods: Vec<_> =
        (0..4).map(|i| ask(&daemon.socket, &hung.image(&format!("app-{i}:1")), &format!("p{i}"))).collect();
    for pod in pods {
        let (answer, took) = pod.await.expect("joined");
        let status = answer.expect_err("neither the registry nor its mirror answers");
        assert_eq!(reason(&status), "RegistryUnavailable", "{}", status.message());
        assert!(status.message().contains("did not answer within 4s"), "{}", status.message());
        assert!(took < Duration::from_secs(10), "answered after {took:?}");
    }
    // One probe at a time for the four pods (an attempt each 2 s, half the resolve timeout), and
    // each pull's size read (pulls side by side are sized): probes per pod would be twelve more.
    let asked = mirror.connections();
    assert!((1..=4 + 3).contains(&asked), "the mirror was asked, one probe at a time: {asked} connections");
}
