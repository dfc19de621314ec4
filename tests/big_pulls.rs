//! Small pulls do not wait behind big ones, nor share the link with them, at the daemon's defaults
//! (pulls in parallel): over the rig's shaped link, on the real stack, a big image's pull makes
//! way for a small one started beside it and goes on from what it had fetched (nothing crosses
//! the link twice); with containerd's content service unused (what CRI-O looks like to
//! cri-imaged), the big one, sized from its registry, makes way as early and starts over.

mod support;

use std::time::Duration;

use cri_imaged::api::{GetStatusRequest, PullPolicy, image_manager_client::ImageManagerClient};
use support::{
    call, ensure,
    netrig::{LinkShape, NetRig},
    process::DaemonProcess,
    stack::LocalStack,
    unix_channel,
};
use tokio::time::Instant;

/// 40 MB at 20 Mbit/s is 16 s of download; the size above which a pull makes way is set under it.
const BIG: u64 = 40_000_000;
const SMALL: u64 = 500_000;

/// The big image's pull, then (once a few MB of it are fetched and its size is known) the small
/// one's, through a daemon started with `flags`: (the small one's time, the big one's time, the
/// bytes that crossed the link, the daemon's log); `None` where the stack or rig cannot be had
/// outside CI (they say why).
async fn big_then_small(flags: &[&str]) -> Option<(Duration, Duration, u64, String)> {
    let stack = LocalStack::start()?;
    let rig = NetRig::start(LinkShape::new(20.0, 10, 0.0))?;
    rig.route(&stack);
    rig.push_image("big:1", BIG, 2);
    rig.push_image("small:1", SMALL, 1);
    let dir = tempfile::tempdir().expect("tempdir");
    // Registries are read where the stack's containerd reads its hosts, as on a node by default.
    let hosts = format!("--registry-config-path={}", stack.registry_config_path().display());
    let flags: Vec<&str> = flags.iter().copied().chain([hosts.as_str()]).collect();
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;
    let client = ImageManagerClient::new(unix_channel(&daemon.socket));
    let pull = |image: String| {
        let mut client = client.clone();
        tokio::spawn(async move {
            let asked = Instant::now();
            let answer = call(&mut client, ensure(&image, PullPolicy::IfNotPresent as i32)).await;
            (answer, asked.elapsed())
        })
    };
    let before = rig.bytes_to_node();
    let big = pull(rig.image("big:1"));
    // Once its manifest is seen (the poller looks every 250 ms), with a few MB fetched.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let small = pull(rig.image("small:1"));
    let (answer, small_took) = small.await.expect("joined");
    answer.expect("the small image is pulled");
    // The big one is under way again (once its task has run).
    let (mut status, asked) = (client.clone(), Instant::now());
    loop {
        let pulls = status.get_status(GetStatusRequest::default()).await.expect("GetStatus").into_inner().pulls;
        assert_eq!(pulls.len(), 1, "only the big pull is left: {pulls:?}");
        assert!(pulls[0].image.ends_with("big:1"), "{pulls:?}");
        if pulls[0].started.is_some() {
            break;
        }
        assert!(asked.elapsed() < Duration::from_secs(2), "the big pull did not go on: {pulls:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (answer, big_took) = big.await.expect("joined");
    answer.expect("the big image arrives after all");
    let crossed = rig.bytes_to_node() - before;
    let (_, log) = daemon.terminate().await;
    Some((small_took, big_took, crossed, log))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_pull_makes_way_for_a_small_one_and_goes_on_without_fetching_anything_twice() {
    let Some((small, big, crossed, log)) = big_then_small(&["--yield-pulls-above-mib", "30"]).await else { return };
    assert!(small < Duration::from_secs(3), "the small pull took {small:?} beside the big one");
    assert!(big > Duration::from_secs(14), "the big one downloaded over the shaped link: {big:?}");
    assert_eq!(log.matches("a big pull made way for cheaper pods' pulls").count(), 1, "{log}");
    assert!(log.contains("resumes=true"), "its downloads were kept in its lease: {log}");
    // Both images and their frames' headers (Ethernet, IP and TCP add about 4.6 %: 42.36 MB for
    // these 40.5 MB when nothing makes way); a big pull fetched again from its start would add the
    // megabytes it had when it made way (about 2.5 MB a second at 20 Mbit/s: 11 % in all).
    let images = BIG + SMALL;
    assert!(crossed < images * 107 / 100, "{crossed} bytes crossed the link for {images} bytes of images");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_containerds_content_service_a_big_pull_sized_by_its_registry_makes_way_early_and_starts_over() {
    let flags = ["--pull-progress=false", "--yield-pulls-above-mib", "30"];
    let Some((small, big, crossed, log)) = big_then_small(&flags).await else { return };
    assert!(small < Duration::from_secs(3), "the small pull took {small:?} beside the big one");
    assert!(big > Duration::from_secs(14), "the big one downloaded over the shaped link: {big:?}");
    assert_eq!(log.matches("a big pull made way for cheaper pods' pulls").count(), 1, "{log}");
    assert!(log.contains("resumes=false"), "nothing kept what it fetched: {log}");
    // What it had fetched in its first second or so crosses the link again, and no more: 2 s of
    // the link at most (5 MB, 12 %) besides the frames' 4.6 %.
    let images = BIG + SMALL;
    assert!(crossed < images * 118 / 100, "{crossed} bytes crossed the link for {images} bytes of images");
}
