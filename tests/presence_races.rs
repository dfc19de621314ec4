//! The presence cache against real containerd, in loops that race a removal against the next
//! question: once a removal has returned, no answer may call the image present. And the CRI
//! answers it remembers (ImageStatus, ListImages), hammered while the image is pulled and removed
//! behind cri-imaged's back: no answer asked longer than the documented window after a change
//! returned misses it.

mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use cri_imaged::cri::{
    ImageSpec, ImageStatusRequest, ListImagesRequest, PullImageRequest, RemoveImageRequest,
    image_service_client::ImageServiceClient,
};
use cri_imaged::{
    api::{PullPolicy, image_manager_client::ImageManagerClient},
    presence::DEFAULT_MAX_STALENESS,
};
use support::{
    call, ensure,
    process::{DaemonProcess, metric, metrics_listen},
    reason,
    stack::LocalStack,
    unix_channel,
};
use tonic::{Code, transport::Channel};

const IF_NOT_PRESENT: i32 = PullPolicy::IfNotPresent as i32;
const NEVER: i32 = PullPolicy::Never as i32;
const ITERATIONS: usize = 1000;
/// Pulls and removes behind cri-imaged's back, each, while its CRI answers are hammered.
const CHANGES: usize = 200;

/// Who removes the image in each iteration.
#[derive(Clone, Copy)]
enum Remover {
    /// The CRI pass-through on cri-imaged's socket (the kubelet's image GC, crictl rmi).
    CriImaged,
    /// containerd directly, behind cri-imaged's back (ctr, a client on containerd's socket).
    Containerd,
}

struct Race {
    stack: LocalStack,
    daemon: DaemonProcess,
    metrics_port: u16,
    _dir: tempfile::TempDir,
}

async fn race(flags: &[&str]) -> Option<Race> {
    let stack = LocalStack::start()?;
    stack.seed("race/app:v1", "raced");
    let dir = tempfile::tempdir().expect("tempdir");
    let (metrics_port, listen) = metrics_listen();
    // Two threads, as where the race was first seen; no registry limit on a thousand pulls.
    let mut all = vec!["--metrics-listen", &listen, "--worker-threads", "2", "--registry-qps", "0"];
    all.extend_from_slice(flags);
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &all).await;
    let race = Race { stack, daemon, metrics_port, _dir: dir };
    for _ in 0..250 {
        if race.metric("cri_imaged_presence_cache_watching").await == 1 {
            return Some(race);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the cache never started watching:\n{}", race.daemon.log_text());
}

impl Race {
    async fn metric(&self, name: &'static str) -> u64 {
        let port = self.metrics_port;
        tokio::task::spawn_blocking(move || metric(port, name)).await.expect("metrics") as u64
    }

    /// Pulls on containerd, has cri-imaged remember the image, removes it with `remover`, and asks
    /// at once with policy Never, `ITERATIONS` times; returns how many answers called it present.
    async fn run(&self, remover: Remover) -> usize {
        let image = self.stack.image("race/app:v1");
        let spec = || Some(ImageSpec { image: image.clone(), ..Default::default() });
        let mut manager = ImageManagerClient::new(unix_channel(&self.daemon.socket));
        let mut containerd = ImageServiceClient::new(unix_channel(&self.stack.containerd_socket));
        let mut through_us = ImageServiceClient::new(unix_channel(&self.daemon.socket));
        let mut stale = 0;
        for iteration in 0..ITERATIONS {
            containerd.pull_image(PullImageRequest { image: spec(), ..Default::default() }).await.expect("pull");
            for _ in 0..2 {
                call(&mut manager, ensure(&image, IF_NOT_PRESENT)).await.expect("present");
            }
            let removal = RemoveImageRequest { image: spec() };
            let removed = match remover {
                Remover::CriImaged => remove(&mut through_us, removal).await,
                Remover::Containerd => remove(&mut containerd, removal).await,
            };
            removed.unwrap_or_else(|status| panic!("iteration {iteration}: removal failed: {status:?}"));
            match call(&mut manager, ensure(&image, NEVER)).await {
                Ok(answer) => {
                    stale += 1;
                    eprintln!("iteration {iteration}: stale answer after the removal returned: {}", answer.message);
                }
                Err(status) => {
                    assert_eq!(
                        (status.code(), reason(&status).as_str()),
                        (Code::FailedPrecondition, "ErrImageNeverPull")
                    );
                }
            }
        }
        stale
    }
}

/// What the CRI answers through cri-imaged said after the changes behind its back.
#[derive(Debug)]
struct Seen {
    /// Answers (ImageStatus or ListImages) that missed a change that had returned.
    stale: usize,
    /// The longest time from a change's return to the asking of an answer that missed it.
    window: Duration,
}

impl Race {
    /// Pulls and removes the image on containerd directly, `CHANGES` times each, while two
    /// callers hammer ImageStatus and ListImages through cri-imaged; after each change returns,
    /// asks both until they show it.
    async fn cri_reads_behind_changes(&self) -> Seen {
        let image = self.stack.image("race/app:v1");
        let spec = || Some(ImageSpec { image: image.clone(), ..Default::default() });
        let mut containerd = ImageServiceClient::new(unix_channel(&self.stack.containerd_socket));
        let through_us = ImageServiceClient::new(unix_channel(&self.daemon.socket));
        let stop = Arc::new(AtomicBool::new(false));
        let hammers: Vec<_> = (0..2)
            .map(|_| {
                let (mut client, stop) = (through_us.clone(), stop.clone());
                let status = ImageStatusRequest { image: spec(), verbose: false };
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        client.image_status(status.clone()).await.expect("ImageStatus");
                        client.list_images(ListImagesRequest::default()).await.expect("ListImages");
                    }
                })
            })
            .collect();
        let mut client = through_us.clone();
        let mut seen = Seen { stale: 0, window: Duration::ZERO };
        for change in 0..CHANGES * 2 {
            let present = change % 2 == 0;
            if present {
                containerd.pull_image(PullImageRequest { image: spec(), ..Default::default() }).await.expect("pull");
            } else {
                containerd.remove_image(RemoveImageRequest { image: spec() }).await.expect("remove");
            }
            let returned = tokio::time::Instant::now();
            loop {
                let asked = returned.elapsed();
                let status = client.image_status(ImageStatusRequest { image: spec(), verbose: false }).await;
                let listed = client.list_images(ListImagesRequest::default()).await;
                let status_present = status.expect("ImageStatus").into_inner().image.is_some();
                let listed_present = listed
                    .expect("ListImages")
                    .into_inner()
                    .images
                    .iter()
                    .any(|listed| listed.repo_tags.contains(&image));
                if status_present == present && listed_present == present {
                    break;
                }
                seen.stale += 1;
                seen.window = seen.window.max(asked);
                assert!(asked < Duration::from_secs(5), "change {change}: still not seen after {asked:?}");
            }
        }
        stop.store(true, Ordering::Relaxed);
        for hammer in hammers {
            hammer.await.expect("hammer");
        }
        seen
    }
}

async fn remove(client: &mut ImageServiceClient<Channel>, request: RemoveImageRequest) -> Result<(), tonic::Status> {
    client.remove_image(request).await.map(drop)
}

#[tokio::test]
async fn after_a_removal_through_cri_imaged_returns_no_answer_calls_the_image_present() {
    let Some(race) = race(&[]).await else { return };
    let stale = race.run(Remover::CriImaged).await;
    let hits = race.metric("cri_imaged_presence_cache_hits_total").await;
    println!("{ITERATIONS} removals through cri-imaged: {stale} stale answers, {hits} cache hits");
    assert!(hits >= ITERATIONS as u64 / 2, "the cache answered in most iterations ({hits} hits), or nothing was raced");
    assert_eq!(stale, 0, "{}", race.daemon.log_text().lines().rev().take(20).collect::<Vec<_>>().join("\n"));
}

#[tokio::test]
async fn in_strict_mode_no_answer_after_a_removal_behind_its_back_calls_the_image_present() {
    let Some(race) = race(&["--presence-cache-max-staleness", "0s"]).await else { return };
    let stale = race.run(Remover::Containerd).await;
    let hits = race.metric("cri_imaged_presence_cache_hits_total").await;
    let barriers = race.metric("cri_imaged_presence_cache_barriers_total").await;
    println!("{ITERATIONS} removals on containerd: {stale} stale answers, {hits} cache hits, {barriers} barriers");
    assert!(hits >= ITERATIONS as u64 / 2, "the cache answered in most iterations ({hits} hits), or nothing was raced");
    assert_eq!(stale, 0);
}

#[tokio::test]
async fn cri_answers_from_memory_never_miss_a_change_behind_its_back_for_longer_than_the_staleness_bound() {
    let Some(race) = race(&[]).await else { return };
    let seen = race.cri_reads_behind_changes().await;
    let hits = race.metric("cri_imaged_presence_cache_hits_total").await;
    println!("{CHANGES} pulls and {CHANGES} removals on containerd: {seen:?}, {hits} answers from memory");
    assert!(
        hits >= CHANGES as u64 * 4,
        "most of the hammering was answered from memory ({hits}), or nothing was raced"
    );
    assert!(seen.window <= DEFAULT_MAX_STALENESS, "{seen:?}");
}

#[tokio::test]
async fn in_strict_mode_no_cri_answer_misses_a_change_behind_its_back() {
    let Some(race) = race(&["--presence-cache-max-staleness", "0s"]).await else { return };
    let seen = race.cri_reads_behind_changes().await;
    println!("{CHANGES} pulls and {CHANGES} removals on containerd, strict: {seen:?}");
    assert_eq!(seen.stale, 0, "{seen:?}");
}
