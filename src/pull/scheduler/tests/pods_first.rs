//! Pods first: pre-pulls never hold a slot a pod's pull waits for.

use super::*;

fn pre_pull(image: &str) -> Pull {
    Pull { class: PullClass::PrePull, ..spec(image, "") }
}

fn start(scheduler: &PullScheduler, pull: Pull) -> tokio::task::JoinHandle<Scheduled> {
    let scheduler = scheduler.clone();
    tokio::spawn(async move { scheduler.pull(pull).await })
}

fn started(upstream: &Upstream) -> Vec<String> {
    upstream.order.lock().unwrap().clone()
}

#[tokio::test(start_paused = true)]
async fn a_pods_pull_takes_the_slot_of_a_running_pre_pull_which_is_queued_again_and_finishes_after() {
    let upstream = Upstream::gated();
    let scheduler = scheduler(&upstream, Some(1));
    let prefetch = start(&scheduler, pre_pull("big:v1"));
    settle().await;
    assert_eq!(started(&upstream), ["big:v1"]);

    let pod = start(&scheduler, spec("app:v1", ""));
    settle().await;
    assert_eq!(started(&upstream), ["big:v1", "app:v1"], "the pod's pull started at once");
    assert_eq!(upstream.cancelled.load(SeqCst), 1, "the pre-pull's upstream call was cancelled");
    assert_eq!(scheduler.queued(), (0, 1), "the pre-pull waits again");
    assert_eq!(scheduler.shared.metrics.pulls_total(PullResult::Preempted), 1);

    upstream.gate.as_ref().expect("gated").notify_waiters();
    assert!(pod.await.expect("pod").result.is_ok());
    settle().await;
    assert_eq!(started(&upstream), ["big:v1", "app:v1", "big:v1"], "then the pre-pull again");
    upstream.gate.as_ref().expect("gated").notify_waiters();
    let prefetched = prefetch.await.expect("pre-pull");
    assert_eq!(prefetched.result.expect("pulled").image_ref, "ref-of-big:v1-");
}

#[tokio::test(start_paused = true)]
async fn a_queued_pre_pull_waits_while_any_pods_pull_waits_whatever_came_first() {
    let upstream = Upstream::slow(Duration::from_secs(10));
    let scheduler = scheduler(&upstream, Some(1));
    let first = start(&scheduler, spec("first:v1", ""));
    settle().await;
    let prefetch = start(&scheduler, pre_pull("big:v1"));
    settle().await;
    let second = start(&scheduler, spec("second:v1", ""));
    settle().await;
    assert_eq!(scheduler.queued(), (1, 1));
    for pull in [first, second, prefetch] {
        assert!(pull.await.expect("task").result.is_ok());
    }
    assert_eq!(started(&upstream), ["first:v1", "second:v1", "big:v1"]);
    assert_eq!(upstream.cancelled.load(SeqCst), 0, "nothing was taken from a pod's pull");
}

#[tokio::test(start_paused = true)]
async fn each_pods_pull_takes_one_slot_back_and_no_more() {
    let upstream = Upstream::gated();
    let scheduler = scheduler(&upstream, Some(3));
    let prefetches: Vec<_> = ["a:1", "b:1", "c:1"].map(|image| start(&scheduler, pre_pull(image))).into();
    settle().await;
    assert_eq!(upstream.running.load(SeqCst), 3);
    let pod = start(&scheduler, spec("app:v1", ""));
    settle().await;
    assert_eq!(upstream.cancelled.load(SeqCst), 1, "one pre-pull gave way");
    let running: Vec<String> =
        scheduler.in_flight().into_iter().filter(|pull| pull.started_at.is_some()).map(|pull| pull.image).collect();
    assert!(running.contains(&"app:v1".to_owned()), "{running:?}");
    assert!(!running.contains(&"c:1".to_owned()), "the most recently started gave way: {running:?}");
    upstream.gate.as_ref().expect("gated").notify_waiters();
    assert!(pod.await.expect("pod").result.is_ok());
    settle().await;
    upstream.gate.as_ref().expect("gated").notify_waiters();
    for prefetch in prefetches {
        assert!(prefetch.await.expect("pre-pull").result.is_ok());
    }
}

#[tokio::test(start_paused = true)]
async fn a_pods_pull_that_joins_a_pre_pull_makes_it_a_pods_pull_that_no_pod_takes_from() {
    let upstream = Upstream::gated();
    let scheduler = scheduler(&upstream, Some(1));
    let prefetch = start(&scheduler, pre_pull("app:v1"));
    settle().await;
    let pod = start(&scheduler, spec("app:v1", ""));
    settle().await;
    assert_eq!(scheduler.in_flight()[0].class, PullClass::Pod);
    let other = start(&scheduler, spec("other:v1", ""));
    settle().await;
    assert_eq!(upstream.cancelled.load(SeqCst), 0, "a pod's pull is not taken from");
    assert_eq!(scheduler.queued(), (1, 0));
    upstream.gate.as_ref().expect("gated").notify_waiters();
    let (pod, prefetch) = (pod.await.expect("pod"), prefetch.await.expect("pre-pull"));
    assert!(pod.joined && pod.result.is_ok() && prefetch.result.is_ok());
    settle().await;
    upstream.gate.as_ref().expect("gated").notify_waiters();
    assert!(other.await.expect("other").result.is_ok());
    assert_eq!(upstream.calls.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_queued_pre_pull_a_pod_joins_queues_as_a_pods_pull() {
    let upstream = Upstream::slow(Duration::from_secs(10));
    let scheduler = scheduler(&upstream, Some(1));
    let first = start(&scheduler, spec("first:v1", ""));
    settle().await;
    let waiting = start(&scheduler, pre_pull("big:v1"));
    let joined = start(&scheduler, pre_pull("joined:v1"));
    settle().await;
    assert_eq!(scheduler.queued(), (0, 2));
    let pod = start(&scheduler, spec("joined:v1", ""));
    settle().await;
    assert_eq!(scheduler.queued(), (1, 1), "the joined pre-pull waits as a pod's pull");
    for pull in [first, pod, joined, waiting] {
        assert!(pull.await.expect("task").result.is_ok());
    }
    assert_eq!(started(&upstream), ["first:v1", "joined:v1", "big:v1"]);
}

#[tokio::test(start_paused = true)]
async fn without_a_cap_pre_pulls_run_beside_pods_pulls() {
    let upstream = Upstream::gated();
    let scheduler = scheduler(&upstream, None);
    let prefetch = start(&scheduler, pre_pull("big:v1"));
    let pod = start(&scheduler, spec("app:v1", ""));
    settle().await;
    assert_eq!((upstream.running.load(SeqCst), upstream.cancelled.load(SeqCst)), (2, 0));
    upstream.gate.as_ref().expect("gated").notify_waiters();
    assert!(pod.await.expect("pod").result.is_ok() && prefetch.await.expect("pre-pull").result.is_ok());
}
