//! The presence cache and its watcher against a scripted runtime whose image events the test
//! holds back, so that an event slower than the next question is played every time, not once in a
//! thousand: the real binary, containerd's event protocol faked (see `tests/presence_races.rs` for
//! the same against real containerd).

mod support;

use std::time::Duration;

use cri_imaged::api::{PullPolicy, image_manager_client::ImageManagerClient};
use cri_imaged::cri::{ImageSpec, RemoveImageRequest, image_service_client::ImageServiceClient};
use support::{
    call, ensure,
    fake_runtime::{FakeImageService, FakeRuntime},
    process::{DaemonProcess, metric, metrics_listen},
    reason, unix_channel,
};
use tonic::{Code, transport::Channel};

const IF_NOT_PRESENT: i32 = PullPolicy::IfNotPresent as i32;
const NEVER: i32 = PullPolicy::Never as i32;
const IMAGE: &str = "busybox:1.36";

struct Cached {
    runtime: FakeRuntime,
    daemon: DaemonProcess,
    client: ImageManagerClient<Channel>,
    metrics_port: u16,
    _dir: tempfile::TempDir,
}

/// A daemon watching the fake's events, with `IMAGE` present and answered from memory.
async fn cached(flags: &[&str]) -> Cached {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start_with_events(&dir.path().join("runtime.sock"), FakeImageService::default());
    runtime.service.add_image(IMAGE, "sha256:busybox", 4096);
    let (metrics_port, listen) = metrics_listen();
    let mut all = vec!["--metrics-listen", listen.as_str()];
    all.extend_from_slice(flags);
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &all).await;
    let client = ImageManagerClient::new(unix_channel(&daemon.socket));
    let mut cached = Cached { runtime, daemon, client, metrics_port, _dir: dir };
    for _ in 0..250 {
        if cached.metric("cri_imaged_presence_cache_watching").await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(cached.metric("cri_imaged_presence_cache_watching").await, 1, "{}", cached.daemon.log_text());
    for _ in 0..2 {
        call(&mut cached.client, ensure(IMAGE, IF_NOT_PRESENT)).await.expect("present");
    }
    let asked = cached.runtime.service.script.lock().unwrap().status_calls;
    call(&mut cached.client, ensure(IMAGE, IF_NOT_PRESENT)).await.expect("present");
    assert_eq!(cached.runtime.service.script.lock().unwrap().status_calls, asked, "answered from memory");
    cached
}

impl Cached {
    async fn metric(&self, name: &'static str) -> u64 {
        let port = self.metrics_port;
        tokio::task::spawn_blocking(move || metric(port, name)).await.expect("metrics") as u64
    }

    async fn assert_absent(&mut self) {
        let status = call(&mut self.client, ensure(IMAGE, NEVER)).await.expect_err("the image was removed");
        assert_eq!((status.code(), reason(&status).as_str()), (Code::FailedPrecondition, "ErrImageNeverPull"));
    }
}

#[tokio::test]
async fn a_removal_through_the_cri_pass_through_is_forgotten_before_it_is_answered() {
    let mut cached = cached(&[]).await;
    cached.runtime.service.events.hold();
    let mut cri = ImageServiceClient::new(unix_channel(&cached.daemon.socket));
    let spec = Some(ImageSpec { image: IMAGE.into(), ..Default::default() });
    cri.remove_image(RemoveImageRequest { image: spec }).await.expect("removed");
    // The runtime's delete event has not arrived, and need not have.
    cached.assert_absent().await;
    cached.runtime.service.events.release();
}

#[tokio::test]
async fn in_strict_mode_a_removal_behind_its_back_is_seen_however_late_its_event_arrives() {
    let mut cached = cached(&["--presence-cache-max-staleness", "0s"]).await;
    let events = cached.runtime.service.events.clone();
    events.hold();
    cached.runtime.service.remove(IMAGE);
    // The question waits for a marker sent after it was asked; the marker comes back behind the
    // delete event, whenever the runtime delivers them.
    let asked = tokio::spawn(async move {
        cached.assert_absent().await;
        cached
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!asked.is_finished(), "the answer waited for the runtime's events");
    events.release();
    let cached = asked.await.expect("answered");
    assert!(cached.metric("cri_imaged_presence_cache_barriers_total").await >= 1);
}

#[tokio::test]
async fn with_the_default_staleness_a_steady_stream_of_hits_renews_its_own_proof() {
    let mut cached = cached(&[]).await;
    let barriers = cached.metric("cri_imaged_presence_cache_barriers_total").await;
    let asked = cached.runtime.service.script.lock().unwrap().status_calls;
    let started = tokio::time::Instant::now();
    while started.elapsed() < Duration::from_millis(500) {
        call(&mut cached.client, ensure(IMAGE, IF_NOT_PRESENT)).await.expect("present");
    }
    assert_eq!(cached.runtime.service.script.lock().unwrap().status_calls, asked, "every answer from memory");
    let renewed = cached.metric("cri_imaged_presence_cache_barriers_total").await - barriers;
    assert!(renewed >= 4, "proofs renewed ahead of their 100ms staleness over 500ms: {renewed}");
}

#[tokio::test]
async fn a_lost_event_stream_forgets_and_asks_the_runtime_until_it_is_back() {
    let mut cached = cached(&[]).await;
    cached.runtime.service.events.disconnect_all();
    for _ in 0..250 {
        if cached.metric("cri_imaged_presence_cache_watching").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(cached.metric("cri_imaged_presence_cache_watching").await, 0);
    cached.runtime.service.script.lock().unwrap().images.clear();
    cached.assert_absent().await;
}

#[tokio::test]
async fn an_answer_given_before_the_cri_layer_caught_up_with_an_event_is_forgotten_soon_after() {
    let mut cached = cached(&[]).await;
    // containerd's metadata has lost the image, but its CRI layer has not applied the event yet.
    let invalidations = cached.metric("cri_imaged_presence_cache_invalidations_total").await;
    cached.runtime.service.events.publish("/images/delete", None);
    for _ in 0..250 {
        if cached.metric("cri_imaged_presence_cache_invalidations_total").await > invalidations {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..2 {
        call(&mut cached.client, ensure(IMAGE, IF_NOT_PRESENT)).await.expect("the CRI layer still says present");
    }
    // The CRI layer catches up; containerd publishes nothing more.
    cached.runtime.service.script.lock().unwrap().images.remove(IMAGE);
    for _ in 0..250 {
        if call(&mut cached.client, ensure(IMAGE, NEVER)).await.is_err() {
            return cached.assert_absent().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the stale answer was kept for 5s:\n{}", cached.daemon.log_text());
}

#[tokio::test]
async fn a_stalled_event_stream_is_given_up_rather_than_waited_on() {
    let mut cached = cached(&["--presence-cache-max-staleness", "0s"]).await;
    cached.runtime.service.events.hold();
    let asked = cached.runtime.service.script.lock().unwrap().status_calls;
    // No proof comes back: after waiting a while for one, the runtime answers.
    call(&mut cached.client, ensure(IMAGE, IF_NOT_PRESENT)).await.expect("present");
    assert_eq!(cached.runtime.service.script.lock().unwrap().status_calls, asked + 1, "the runtime was asked");
    // A marker unanswered for long ends the subscription; hits stop waiting for proofs.
    for _ in 0..250 {
        if cached.metric("cri_imaged_presence_cache_watching").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(cached.metric("cri_imaged_presence_cache_watching").await, 0, "{}", cached.daemon.log_text());
    assert!(cached.daemon.log_text().contains("our marker event did not come back"), "{}", cached.daemon.log_text());
    cached.runtime.service.events.release();
}
