//! Pull progress, stall detection and GetStatus on the real stack: the cri-imaged binary over a
//! real containerd that pulls through a throttling proxy in front of the loopback registry, so
//! that a pull of a few MiB takes seconds.

mod support;

use std::{path::PathBuf, sync::Arc, time::Duration};

use cri_imaged::{
    api::{Event, GetStatusRequest, PodRef, PullPolicy, WatchEventsRequest},
    runtime::{ContentStore, CriClient, RuntimeEndpoint},
};
use support::{
    call, ensure,
    process::{grpcurl, require_tool},
    reason,
    throttled_node::ThrottledNode,
};
use tokio::{task::JoinHandle, time::timeout};
use tonic::Code;

const MIB: u64 = 1 << 20;
/// The proxy's rate, shared by every connection through it.
const RATE: u64 = 2 * MIB;
/// What the seeded layer adds to its random bytes (the sleeper binary, tar headers).
const LAYER_OVERHEAD: u64 = 256 * 1024;

/// What these tests ask of the node (`support` is a module of this crate, so the impl may be here).
impl ThrottledNode {
    /// EnsureImageExists of `image` for the pod `uid`, in a task.
    fn ensure(
        &self,
        image: &str,
        uid: &str,
    ) -> JoinHandle<Result<cri_imaged::api::EnsureImageExistsResponse, tonic::Status>> {
        let mut client = self.client();
        let mut request = ensure(image, PullPolicy::IfNotPresent as i32);
        request.pod = Some(PodRef {
            namespace: "default".into(),
            name: format!("pod-{uid}"),
            uid: uid.into(),
            ..Default::default()
        });
        tokio::spawn(async move { call(&mut client, request).await })
    }

    /// Every event about `image` until its pull's outcome (Pulled or Failed), in a task; the
    /// subscription is open when this returns.
    async fn watch(&self, image: &str) -> JoinHandle<Vec<Event>> {
        let request = WatchEventsRequest { image: image.to_owned(), ..Default::default() };
        let mut stream = self.client().watch_events(request).await.expect("WatchEvents answers").into_inner();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Ok(Some(event)) =
                timeout(Duration::from_secs(30), stream.message()).await.expect("an event within 30 s")
            {
                let outcome = event.reason == "Pulled" || event.reason == "Failed";
                seen.push(event);
                if outcome {
                    break;
                }
            }
            seen
        })
    }

    fn runtime(&self) -> CriClient {
        let endpoint = RuntimeEndpoint::parse(&format!("unix://{}", self.stack.containerd_socket.display()))
            .expect("containerd's endpoint");
        CriClient::new(&endpoint, Duration::from_secs(5))
    }
}

/// The bytes each PullProgress event says were done, in order.
/// Bytes rise at each event until all are in. A poll may see them all before containerd counts
/// the last layer done; the pull's end then says so once more, layers complete.
fn assert_rising(progress: &[(u64, u64)], total: u64, who: &str) {
    let rising = progress.windows(2).all(|pair| pair[0].0 < pair[1].0 || pair == [(total, total); 2]);
    let at_total = progress.iter().filter(|(done, _)| *done == total).count();
    assert!(rising && at_total <= 2, "{who}: bytes rise at each event: {progress:?}");
}

fn progress_of(events: &[Event]) -> Vec<(u64, u64)> {
    events
        .iter()
        .filter(|event| event.reason == "PullProgress")
        .map(|event| {
            let progress = event.progress.as_ref().expect("a PullProgress event carries its progress");
            (progress.bytes_done, progress.bytes_total)
        })
        .collect()
}

#[tokio::test]
async fn progress_events_rise_to_the_total_of_a_throttled_pull() {
    let Some(node) = ThrottledNode::start(&[("big:v1", 8 * MIB)], RATE, &[]).await else { return };
    let image = node.proxy.image("big:v1");
    let watching = node.watch(&image).await;
    let answer = timeout(Duration::from_secs(20), node.ensure(&image, "u1")).await.expect("answered").expect("task");
    assert!(answer.expect("pulled").pulled);
    let events = watching.await.expect("watcher");
    let reasons: Vec<&str> = events.iter().map(|event| event.reason.as_str()).collect();
    let progress = progress_of(&events);
    eprintln!("{} events; progress {progress:?}", events.len());
    assert_eq!(reasons.first(), Some(&"Pulling"), "{reasons:?}");
    assert_eq!(reasons.last(), Some(&"Pulled"), "{reasons:?}");
    // About four seconds at two events a second, and the last one when the pull ends.
    assert!(progress.len() >= 4, "too few progress events: {progress:?}");
    let total = progress[0].1;
    assert!((8 * MIB..8 * MIB + LAYER_OVERHEAD).contains(&total), "total {total} is not the layer's size");
    assert!(progress.iter().all(|(_, each)| *each == total), "the total never changes: {progress:?}");
    assert_rising(&progress, total, "u1");
    assert_eq!(progress.last().map(|(done, _)| *done), Some(total), "the last event is the total");
    let last = events.iter().rfind(|event| event.reason == "PullProgress").expect("progress");
    let facts = last.progress.as_ref().expect("progress");
    assert_eq!((facts.layers_done, facts.layers_total), (1, 1));
    let rates: Vec<u64> =
        events.iter().filter_map(|event| event.progress.as_ref()).map(|p| p.bytes_per_second).collect();
    assert!(rates.iter().any(|rate| (MIB..=4 * MIB).contains(rate)), "no rate near the proxy's 2 MiB/s: {rates:?}");
    assert_eq!(last.pod.as_ref().map(|pod| pod.uid.as_str()), Some("u1"));
    assert!(last.message.starts_with(&format!("Pulling image {image:?}: 8.0 MiB of 8.0 MiB")), "{}", last.message);
    // Each event names the layer, its size and how far it is.
    let layers: Vec<(u64, bool)> = events
        .iter()
        .filter_map(|event| event.progress.as_ref())
        .map(|progress| match progress.layers.as_slice() {
            [layer] => {
                assert!(layer.digest.starts_with("sha256:") && layer.size_bytes == total, "{layer:?}");
                (layer.bytes_done, layer.done)
            }
            layers => panic!("one layer, not {layers:?}"),
        })
        .collect();
    assert_eq!(
        layers.iter().map(|(done, _)| *done).collect::<Vec<_>>(),
        progress.iter().map(|(done, _)| *done).collect::<Vec<_>>()
    );
    assert_eq!(layers.last(), Some(&(total, true)), "done at the end");
    assert!(!layers[0].1, "not done at the start");
}

#[tokio::test]
async fn two_images_pulling_at_once_each_report_their_own_bytes() {
    let images = [("large:v1", 6 * MIB), ("small:v1", 3 * MIB)];
    let Some(node) = ThrottledNode::start(&images, RATE, &["--max-parallel-image-pulls", "2"]).await else { return };
    let (large, small) = (node.proxy.image("large:v1"), node.proxy.image("small:v1"));
    let (watch_large, watch_small) = (node.watch(&large).await, node.watch(&small).await);
    let pulls = [node.ensure(&large, "u-large"), node.ensure(&small, "u-small")];
    for pull in pulls {
        let answer = timeout(Duration::from_secs(20), pull).await.expect("answered").expect("task");
        assert!(answer.expect("pulled").pulled);
    }
    let (large_events, small_events) = (watch_large.await.expect("watcher"), watch_small.await.expect("watcher"));
    for (events, size, uid) in [(large_events, 6 * MIB, "u-large"), (small_events, 3 * MIB, "u-small")] {
        let progress = progress_of(&events);
        eprintln!("{uid}: progress {progress:?}");
        assert!(progress.len() >= 2, "{uid}: too few progress events: {progress:?}");
        let total = progress[0].1;
        assert!((size..size + LAYER_OVERHEAD).contains(&total), "{uid}: total {total} is not its own layer's");
        assert_eq!(progress.last().map(|(done, _)| *done), Some(total), "{uid}: {progress:?}");
        assert_rising(&progress, total, uid);
        for event in events.iter().filter(|event| event.reason == "PullProgress") {
            let waiting: Vec<&str> = event.waiting_pods.iter().map(|pod| pod.uid.as_str()).collect();
            assert_eq!(waiting, [uid], "only the pod that asked for it waits");
        }
    }
}

#[tokio::test]
async fn a_pull_that_stops_moving_is_cancelled_on_containerd() {
    let flags = ["--image-pull-progress-timeout", "2s"];
    let Some(node) = ThrottledNode::start(&[("stuck:v1", 8 * MIB)], RATE, &flags).await else { return };
    let image = node.proxy.image("stuck:v1");
    let watching = node.watch(&image).await;
    let pulling = node.ensure(&image, "u1");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while node.proxy.bytes_forwarded() < 3 * MIB {
        assert!(tokio::time::Instant::now() < deadline, "the pull never got 3 MiB through the proxy");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    node.proxy.stall();
    let stalled_at = tokio::time::Instant::now();
    let answer = timeout(Duration::from_secs(15), pulling).await.expect("answered").expect("task");
    let took = stalled_at.elapsed();
    let status = answer.expect_err("the stalled pull fails");
    eprintln!("answered {took:?} after the stall: {status:?}");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(reason(&status), "ErrImagePull");
    assert!(
        status.message().contains("made no progress for 2s (--image-pull-progress-timeout)"),
        "{}",
        status.message()
    );
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(6), "cancelled {took:?} after the stall");
    let events = watching.await.expect("watcher");
    let failed = events.last().expect("events");
    assert_eq!(failed.reason, "Failed");
    assert!(failed.message.contains("made no progress"), "{}", failed.message);

    // containerd aborted the download: no ingest is left.
    let runtime = node.runtime();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let ingests = runtime.list_ingests().await.expect("containerd lists its ingests");
        if ingests.is_empty() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "containerd still writes {ingests:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut client = node.client();
    let status = client.get_status(GetStatusRequest::default()).await.expect("GetStatus").into_inner();
    assert!(status.pulls.is_empty(), "{status:?}");
    node.proxy.resume();
}

#[tokio::test]
async fn grpcurl_reads_a_pulls_progress_from_get_status() {
    let Some(grpcurl_bin) = require_tool("grpcurl") else { return };
    let thresholds = ["--image-gc-high-threshold", "90", "--image-gc-low-threshold", "70"];
    let Some(node) = ThrottledNode::start(&[("watched:v1", 8 * MIB)], RATE, &thresholds).await else { return };
    let image = node.proxy.image("watched:v1");
    let pulling = node.ensure(&image, "u1");
    let socket: PathBuf = node.daemon.socket.clone();
    let grpcurl_bin = Arc::new(grpcurl_bin);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let pull = loop {
        let (bin, sock) = (grpcurl_bin.clone(), socket.clone());
        let (ok, stdout, stderr) =
            tokio::task::spawn_blocking(move || grpcurl(&bin, &sock, &[], &["imagemanager.v1.ImageManager/GetStatus"]))
                .await
                .expect("grpcurl ran");
        assert!(ok, "{stderr}");
        let status: serde_json::Value = serde_json::from_str(&stdout).expect("grpcurl prints JSON");
        // The image filesystem and image GC's thresholds, whatever is pulling.
        let capacity: u64 = status["imageFs"]["capacityBytes"].as_str().and_then(|n| n.parse().ok()).unwrap_or(0);
        // grpcurl leaves a 0 out.
        assert!(capacity > 0 && status["imageFs"]["usagePercent"].as_u64().unwrap_or(0) <= 100, "{stdout}");
        assert_eq!((&status["gcHighThresholdPercent"], &status["gcLowThresholdPercent"]), (&90.into(), &70.into()));
        let pull = status["pulls"][0].clone();
        // grpcurl prints 64-bit numbers as strings.
        let done: u64 = pull["progress"]["bytesDone"].as_str().and_then(|done| done.parse().ok()).unwrap_or(0);
        if done > 0 {
            break pull;
        }
        assert!(tokio::time::Instant::now() < deadline, "no progress in GetStatus: {stdout}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("GetStatus mid-pull: {pull}");
    assert_eq!(pull["image"], image.as_str());
    let total: u64 = pull["progress"]["bytesTotal"].as_str().and_then(|total| total.parse().ok()).expect("a total");
    assert!((8 * MIB..8 * MIB + LAYER_OVERHEAD).contains(&total), "{pull}");
    assert_eq!(pull["progress"]["layersTotal"], 1, "{pull}");
    assert_eq!(pull["state"], "pulling", "{pull}");
    assert_eq!(pull.get("prePull"), None, "a pod's pull (false is left out): {pull}");
    let layer = &pull["progress"]["layers"][0];
    assert!(layer["digest"].as_str().is_some_and(|digest| digest.starts_with("sha256:")), "{pull}");
    assert_eq!(layer["sizeBytes"], total.to_string(), "{pull}");
    assert!(layer["bytesDone"].as_str().is_some_and(|done| done != "0"), "{pull}");
    let answer = timeout(Duration::from_secs(20), pulling).await.expect("answered").expect("task");
    assert!(answer.expect("pulled").pulled);
}
