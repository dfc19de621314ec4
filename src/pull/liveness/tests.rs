use std::{net::SocketAddr, sync::Mutex as StdMutex, time::SystemTime};

use futures_util::future::join_all;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
    time::Instant,
};

use super::*;
use crate::{events::Events, pull::poller::ProgressConfig, reference::ImageReference, runtime::fake::FakeRuntime};

/// A registry that accepts connections and never answers; it keeps every one.
async fn hung_registry() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            kept.push(stream);
        }
    });
    addr
}

/// A registry that answers every request 401, as one asking for credentials does at `/v2/`.
async fn answering_registry() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0; 4096];
                let _ = stream.read(&mut buffer).await;
                let answer =
                    "HTTP/1.1 401 Unauthorized\r\nWww-Authenticate: Basic realm=\"x\"\r\nContent-Length: 0\r\n\r\n";
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

fn pull(image: &str) -> TrackedPull {
    let reference = ImageReference::parse_normalized(image).expect("a valid image");
    TrackedPull {
        image: image.into(),
        reference: Arc::new(reference),
        started_at: SystemTime::now(),
        waiting: Arc::new(StdMutex::new(Vec::new())),
        keep_in: None,
        lease_above: None,
    }
}

fn probes(attempt: Duration) -> Arc<RegistryProbes> {
    RegistryProbes::new(Arc::new(RegistryHosts::default()), attempt)
}

#[tokio::test(start_paused = true)]
async fn a_hung_registrys_pulls_share_one_probe_and_each_is_found_unanswered() {
    let hung = hung_registry().await;
    let probes = probes(Duration::from_secs(5));
    let liveness = Liveness { poller: None, probes: probes.clone() };
    let trackers: Vec<Tracker> = (0..10).map(|i| liveness.track(pull(&format!("{hung}/hung-{}:1", i % 5)))).collect();
    assert!(trackers.iter().all(|tracker| !tracker.watched()), "a probe watches no download");

    let began = Instant::now();
    join_all(trackers.iter().map(|tracker| tracker.unanswered_for(Duration::from_secs(1), began))).await;
    assert_eq!(began.elapsed(), Duration::from_secs(1), "each is unanswered at the grace");
    tokio::time::sleep(Duration::from_secs(29)).await;
    let attempts = probes.attempts();
    assert!((6..=7).contains(&attempts), "one attempt each 5 s for ten pulls over 30 s, not {attempts}");

    drop(trackers);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(probes.attempts(), attempts, "no pull waits: the probe ends");
}

#[tokio::test]
async fn a_registry_that_answers_answers_every_pull_waiting_with_one_request() {
    let registry = answering_registry().await;
    let probes = probes(Duration::from_secs(5));
    let liveness = Liveness { poller: None, probes: probes.clone() };
    let trackers: Vec<Tracker> = (0..3).map(|i| liveness.track(pull(&format!("{registry}/app-{i}:1")))).collect();
    let answered = join_all(trackers.iter().map(Tracker::answered));
    tokio::time::timeout(Duration::from_secs(10), answered).await.expect("a 401 at /v2/ is an answer");
    assert_eq!(probes.attempts(), 1);
    // Answered, a pull is never found unanswered.
    let quiet = trackers[0].unanswered_for(Duration::from_millis(1), Instant::now());
    assert!(tokio::time::timeout(Duration::from_millis(50), quiet).await.is_err());
}

/// Refused (or no such host) is no silence: the runtime's own pull fails as fast, and says why.
#[tokio::test]
async fn a_registry_that_refuses_leaves_its_pulls_to_the_runtime_after_one_attempt() {
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind").local_addr().expect("addr");
    let probes = probes(Duration::from_secs(5));
    let liveness = Liveness { poller: None, probes: probes.clone() };
    let trackers: Vec<Tracker> = (0..3).map(|i| liveness.track(pull(&format!("{closed}/app-{i}:1")))).collect();
    let answered = join_all(trackers.iter().map(Tracker::answered));
    tokio::time::timeout(Duration::from_secs(5), answered).await.expect("settled at the refusal");
    assert_eq!(probes.attempts(), 1);
}

#[tokio::test]
async fn a_runtime_without_the_content_service_has_its_pulls_probed_from_the_first() {
    let runtime = Arc::new(FakeRuntime::default().without_content_service());
    let poller = ProgressPoller::start(runtime, ProgressConfig::default(), Arc::new(Events::default()));
    let liveness = Liveness { poller: Some(poller.clone()), probes: probes(Duration::from_secs(5)) };
    let registry = answering_registry().await;

    // Tracked before the poller learnt the runtime has nothing to read: the probe tells.
    let first = liveness.track(pull(&format!("{registry}/first:1")));
    tokio::select! {
        () = first.answered() => {}
        () = first.unanswered_for(Duration::from_secs(2), Instant::now()) => panic!("the registry answered"),
    }
    while poller.supported().is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(poller.supported(), Some(false));
    let hung = hung_registry().await;
    let later = liveness.track(pull(&format!("{hung}/later:1")));
    later.unanswered_for(Duration::from_millis(300), Instant::now()).await;
}

#[test]
fn an_attempt_waits_half_the_resolve_timeout_within_bounds() {
    assert_eq!(attempt_bound(Some(Duration::from_secs(20))), Duration::from_secs(10));
    assert_eq!(attempt_bound(Some(Duration::from_secs(6))), Duration::from_secs(3));
    assert_eq!(attempt_bound(Some(Duration::from_millis(500))), Duration::from_secs(1));
    assert_eq!(attempt_bound(None), Duration::from_secs(10));
}
