//! Small pulls do not wait behind big ones: with the daemon's serial default, a big image's pull
//! that has barely begun gives its slot to a small one queued behind it, over the rig's shaped
//! link, on the real stack; the big pod still gets its image.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_image_queued_behind_a_big_one_is_pulled_first_and_the_big_one_still_arrives() {
    let Some(stack) = LocalStack::start() else { return };
    // 40 MB at 20 Mbit/s is 16 s of download; the yield threshold is set under it.
    let Some(rig) = NetRig::start(LinkShape::new(20.0, 10, 0.0)) else { return };
    rig.route(&stack);
    rig.push_image("big:1", 40_000_000, 2);
    rig.push_image("small:1", 500_000, 1);
    let dir = tempfile::tempdir().expect("tempdir");
    let flags = ["--yield-pulls-above-mib", "30"];
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

    let big = pull(rig.image("big:1"));
    // Once its manifest is seen (the poller looks every 250 ms), with a few MB fetched.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let small = pull(rig.image("small:1"));
    let (answer, took) = small.await.expect("joined");
    answer.expect("the small image is pulled");
    assert!(took < Duration::from_secs(5), "the small pull waited {took:?} behind the big one");
    // The big one has the slot again (once its task has run).
    let (mut status, asked) = (client.clone(), Instant::now());
    loop {
        let pulls = status.get_status(GetStatusRequest::default()).await.expect("GetStatus").into_inner().pulls;
        assert_eq!(pulls.len(), 1, "only the big pull is left: {pulls:?}");
        assert!(pulls[0].image.ends_with("big:1"), "{pulls:?}");
        if pulls[0].started.is_some() {
            break;
        }
        assert!(asked.elapsed() < Duration::from_secs(2), "the big pull did not start again: {pulls:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (answer, took) = big.await.expect("joined");
    answer.expect("the big image arrives after all");
    assert!(took > Duration::from_secs(14), "it downloaded over the shaped link: {took:?}");
    let (_, log) = daemon.terminate().await;
    assert_eq!(log.matches("a big pull gave its slot to the pulls queued behind it").count(), 1, "{log}");
}
