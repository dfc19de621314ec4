//! Soak (issue 17), run by `make soak` only (Cargo.toml keeps it out of `cargo test`, and so out
//! of CI): a release build of the daemon on a real containerd and registry under mixed load for
//! `SOAK_SECS` (default 1,800 s): presence checks of a present image, distinct pulls (20 images
//! pulled and removed in turn), failing pulls of missing images by ever new pods, and event
//! subscribers (one of them slow). RSS and open files are sampled every 10 s; after the warm-up
//! (the first fifth) both must stay flat.

mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use cri_imaged::api::{PullPolicy, WatchEventsRequest, image_manager_client::ImageManagerClient};
use cri_imaged::cri::{ImageSpec, RemoveImageRequest, image_service_client::ImageServiceClient};
use support::{
    ensure,
    process::{DaemonProcess, open_fds, rss_mib},
    stack::LocalStack,
    unix_channel,
};
use tokio::time::Instant;

const IF_NOT_PRESENT: i32 = PullPolicy::IfNotPresent as i32;
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// How much RSS (MiB) and how many open files may vary after the warm-up.
const RSS_DRIFT_MIB: f64 = 8.0;
const FD_DRIFT: usize = 16;

/// Counts of what the load did.
#[derive(Default)]
struct Counts {
    presence: AtomicU64,
    pulls: AtomicU64,
    failed_pulls: AtomicU64,
    events: AtomicU64,
}

/// Runs `step` until `stop`, counting into `count` each time it returns true.
fn spawn_loop<F, Fut>(stop: &Arc<AtomicBool>, mut step: F) -> tokio::task::JoinHandle<()>
where
    F: FnMut(u64) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let stop = stop.clone();
    tokio::spawn(async move {
        let mut round = 0;
        while !stop.load(Ordering::Relaxed) {
            step(round).await;
            round += 1;
        }
    })
}

#[tokio::test]
async fn mixed_load_for_half_an_hour_keeps_memory_and_open_files_flat() {
    let duration =
        Duration::from_secs(std::env::var("SOAK_SECS").ok().and_then(|secs| secs.parse().ok()).unwrap_or(1800));
    let Some(stack) = LocalStack::start() else { return };
    stack.seed("soak/present:v1", "present");
    let present = stack.image("soak/present:v1");
    let distinct: Vec<String> = (0..20)
        .map(|i| {
            stack.seed(&format!("soak/distinct-{i}:v1"), &format!("distinct {i}"));
            stack.image(&format!("soak/distinct-{i}:v1"))
        })
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let flags = ["--image-pull-backoff-max", "60s", "--registry-qps", "20", "--registry-burst", "20"];
    // Warnings only: half an hour of every pull at info would be most of what is measured.
    let daemon =
        DaemonProcess::spawn_logging(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags, "warn");
    daemon.wait_until_serving().await;
    let (socket, pid) = (daemon.socket.clone(), daemon.pid());
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();

    for caller in 0..2 {
        let (client, counts, present) =
            (ImageManagerClient::new(unix_channel(&socket)), counts.clone(), present.clone());
        tasks.push(spawn_loop(&stop, move |round| {
            let (mut client, counts, present) = (client.clone(), counts.clone(), present.clone());
            async move {
                let mut request = ensure(&present, IF_NOT_PRESENT);
                if let Some(pod) = request.pod.as_mut() {
                    pod.uid = format!("presence-{caller}-{}", round % 1000);
                }
                if client.ensure_image_exists(request).await.is_ok() {
                    counts.presence.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    let (client, cri) =
        (ImageManagerClient::new(unix_channel(&socket)), ImageServiceClient::new(unix_channel(&socket)));
    let counts_pulls = counts.clone();
    tasks.push(spawn_loop(&stop, move |round| {
        let (mut client, mut cri, counts) = (client.clone(), cri.clone(), counts_pulls.clone());
        let image = distinct[usize::try_from(round).unwrap_or_default() % distinct.len()].clone();
        async move {
            if client
                .ensure_image_exists(ensure(&image, IF_NOT_PRESENT))
                .await
                .is_ok_and(|answer| answer.get_ref().pulled)
            {
                counts.pulls.fetch_add(1, Ordering::Relaxed);
            }
            let remove = RemoveImageRequest { image: Some(ImageSpec { image, ..Default::default() }) };
            let _ = cri.remove_image(remove).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }));
    let (client, counts_failed, registry) =
        (ImageManagerClient::new(unix_channel(&socket)), counts.clone(), stack.registry.clone());
    tasks.push(spawn_loop(&stop, move |round| {
        let (mut client, counts) = (client.clone(), counts_failed.clone());
        let mut request = ensure(&format!("{registry}/soak/missing-{}:v1", round % 500), IF_NOT_PRESENT);
        if let Some(pod) = request.pod.as_mut() {
            pod.uid = format!("failing-{round}");
        }
        async move {
            if client.ensure_image_exists(request).await.is_err() {
                counts.failed_pulls.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }));
    for watcher in 0..5 {
        let (mut client, counts, stop) = (ImageManagerClient::new(unix_channel(&socket)), counts.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut events = client.watch_events(WatchEventsRequest::default()).await.expect("watching").into_inner();
            while !stop.load(Ordering::Relaxed) {
                // One slow reader, told what it lost.
                if watcher == 0 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                match tokio::time::timeout(Duration::from_secs(1), events.message()).await {
                    Ok(Ok(Some(_))) => {
                        counts.events.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => return,
                    Err(_) => {}
                }
            }
        }));
    }

    let started = Instant::now();
    let mut samples = Vec::new();
    println!("| t (s) | RSS (MiB) | open files | presence answers | pulls | failed pulls | events read |");
    println!("|---|---|---|---|---|---|---|");
    while started.elapsed() < duration {
        tokio::time::sleep(SAMPLE_EVERY).await;
        let (rss, fds) = (rss_mib(pid), open_fds(pid));
        let t = started.elapsed().as_secs();
        samples.push((t, rss, fds));
        if t % 60 < 10 {
            let load = |count: &AtomicU64| count.load(Ordering::Relaxed);
            println!(
                "| {t} | {rss:.1} | {fds} | {} | {} | {} | {} |",
                load(&counts.presence),
                load(&counts.pulls),
                load(&counts.failed_pulls),
                load(&counts.events)
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }

    let warm = samples.iter().filter(|(t, _, _)| *t >= duration.as_secs() / 5);
    let (rss_min, rss_max) =
        warm.clone().fold((f64::MAX, 0f64), |(low, high), (_, rss, _)| (low.min(*rss), high.max(*rss)));
    let (fd_min, fd_max) = warm.fold((usize::MAX, 0), |(low, high), (_, _, fds)| (low.min(*fds), high.max(*fds)));
    println!(
        "soak {}s: after the warm-up RSS {rss_min:.1}..{rss_max:.1} MiB, open files {fd_min}..{fd_max}; {} presence \
         answers, {} pulls, {} failed pulls, {} events read",
        duration.as_secs(),
        counts.presence.load(Ordering::Relaxed),
        counts.pulls.load(Ordering::Relaxed),
        counts.failed_pulls.load(Ordering::Relaxed),
        counts.events.load(Ordering::Relaxed)
    );
    assert!(rss_max - rss_min <= RSS_DRIFT_MIB, "RSS grew after the warm-up: {rss_min:.1} -> {rss_max:.1} MiB");
    assert!(fd_max - fd_min <= FD_DRIFT, "open files grew after the warm-up: {fd_min} -> {fd_max}");
    assert!(counts.pulls.load(Ordering::Relaxed) > 0 && counts.failed_pulls.load(Ordering::Relaxed) > 0);
    let log = daemon.log_text();
    assert!(!log.contains("panicked"), "the daemon panicked:\n{log}");
}
