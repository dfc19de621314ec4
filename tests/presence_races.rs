//! The presence cache against real containerd, in loops that race a removal against the next
//! question: once a removal has returned, no answer may call the image present.

mod support;

use cri_imaged::api::{PullPolicy, image_manager_client::ImageManagerClient};
use k8s_cri::v1::{ImageSpec, PullImageRequest, RemoveImageRequest, image_service_client::ImageServiceClient};
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
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
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
