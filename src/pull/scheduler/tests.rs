use std::{
    collections::HashMap,
    num::NonZeroUsize,
    sync::atomic::{AtomicUsize, Ordering::SeqCst},
};

use crate::cri::ImageSpec;
use tokio::sync::Notify;
use tower::util::BoxCloneSyncService;

use super::*;
use crate::{
    pull::{
        metrics::PullResult,
        poller::{TrackedPull, Tracker},
    },
    runtime::PullSpec,
};

/// A pull service that takes `duration` (paused clock) or waits for `gate`, and counts calls.
#[derive(Default)]
struct Upstream {
    calls: AtomicUsize,
    running: AtomicUsize,
    most_at_once: AtomicUsize,
    cancelled: AtomicUsize,
    gate: Option<Notify>,
    duration: Duration,
    order: std::sync::Mutex<Vec<String>>,
    /// The lease each call named to go on from, in the same order.
    kept_in: std::sync::Mutex<Vec<Option<Arc<str>>>>,
    /// Behind an exhausted registry limit: a pull that will not wait for a token is refused.
    rate_limited: bool,
    refused: AtomicUsize,
}

impl Upstream {
    fn slow(duration: Duration) -> Arc<Self> {
        Arc::new(Self { duration, ..Default::default() })
    }

    fn gated() -> Arc<Self> {
        Arc::new(Self { gate: Some(Notify::new()), ..Default::default() })
    }

    fn service(self: &Arc<Self>) -> PullService {
        let upstream = self.clone();
        BoxCloneSyncService::new(tower::service_fn(move |spec: Pull| {
            let upstream = upstream.clone();
            async move { upstream.pull(spec).await }
        }))
    }

    async fn pull(&self, spec: Pull) -> Result<Pulled, PullError> {
        if self.rate_limited && !spec.wait_for_rate_limit {
            self.refused.fetch_add(1, SeqCst);
            return Err(PullError::RateLimited);
        }
        self.calls.fetch_add(1, SeqCst);
        self.order.lock().unwrap().push(spec.image().image.clone());
        self.kept_in.lock().unwrap().push(spec.keep_in.clone());
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.most_at_once.fetch_max(now, SeqCst);
        // Counts a cancellation when the future is dropped before it finishes.
        struct Guard<'a>(&'a Upstream, bool);
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                self.0.running.fetch_sub(1, SeqCst);
                if !self.1 {
                    self.0.cancelled.fetch_add(1, SeqCst);
                }
            }
        }
        let mut guard = Guard(self, false);
        match &self.gate {
            Some(gate) => gate.notified().await,
            None => tokio::time::sleep(self.duration).await,
        }
        guard.1 = true;
        let image_ref = format!("ref-of-{}-{}", spec.image().image, spec.image().runtime_handler);
        Ok(Pulled { image_ref, image_size: 42, pull_duration: self.duration })
    }
}

fn spec(image: &str, handler: &str) -> Pull {
    let image = ImageSpec { image: image.into(), runtime_handler: handler.into(), ..Default::default() };
    Pull::of(PullSpec { image, ..Default::default() })
}

fn scheduler(upstream: &Arc<Upstream>, max_parallel: Option<usize>) -> PullScheduler {
    let max_parallel = max_parallel.and_then(NonZeroUsize::new);
    PullScheduler::new(
        upstream.service(),
        SchedulerConfig { max_parallel, pull_timeout: None, ..Default::default() },
        Default::default(),
    )
}

/// Lets spawned tasks run until they all wait.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_thousand_identical_pulls_share_one_upstream_call() {
    let upstream = Upstream::slow(Duration::from_secs(3));
    let scheduler = scheduler(&upstream, None);
    let pulls: Vec<_> = (0..1000)
        .map(|_| {
            let scheduler = scheduler.clone();
            tokio::spawn(async move { scheduler.pull(spec("busybox:latest", "")).await })
        })
        .collect();
    let mut joined = 0;
    for pull in pulls {
        let scheduled = pull.await.expect("task");
        assert_eq!(scheduled.result.expect("pulled").image_ref, "ref-of-busybox:latest-");
        joined += usize::from(scheduled.joined);
    }
    assert_eq!(upstream.calls.load(SeqCst), 1);
    assert_eq!(joined, 999);
    let metrics = &scheduler.shared.metrics;
    assert_eq!((metrics.joins_total(), metrics.pulls_total(PullResult::Success)), (999, 1));
    assert_eq!(metrics.registry_pulls_total(Some("docker.io"), PullResult::Success), 1, "by its registry too");
}

#[tokio::test(start_paused = true)]
async fn the_first_caller_going_away_does_not_fail_the_others() {
    let upstream = Upstream::gated();
    let scheduler = scheduler(&upstream, None);
    let first = tokio::spawn({
        let scheduler = scheduler.clone();
        async move { scheduler.pull(spec("busybox:latest", "")).await }
    });
    settle().await;
    let second = tokio::spawn({
        let scheduler = scheduler.clone();
        async move { scheduler.pull(spec("busybox:latest", "")).await }
    });
    settle().await;
    first.abort();
    settle().await;
    upstream.gate.as_ref().expect("gated").notify_waiters();
    let scheduled = second.await.expect("second caller");
    assert!(scheduled.joined);
    assert!(scheduled.result.is_ok(), "the pull finished for the remaining caller");
    assert_eq!((upstream.calls.load(SeqCst), upstream.cancelled.load(SeqCst)), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_running_pull_every_caller_left_is_cancelled_upstream_and_frees_its_slot() {
    let upstream = Upstream::gated();
    let scheduler = scheduler(&upstream, Some(1));
    let callers: Vec<_> = (0..2)
        .map(|_| {
            let scheduler = scheduler.clone();
            tokio::spawn(async move { scheduler.pull(spec("big:v1", "")).await })
        })
        .collect();
    settle().await;
    assert_eq!(upstream.calls.load(SeqCst), 1, "one shared upstream pull");
    callers[0].abort();
    settle().await;
    assert_eq!(upstream.cancelled.load(SeqCst), 0, "one caller still waits");
    callers[1].abort();
    settle().await;
    assert_eq!(upstream.cancelled.load(SeqCst), 1, "the upstream call was dropped");
    assert_eq!(scheduler.shared.metrics.pulls_total(PullResult::Cancelled), 1);

    // Its slot is free at once, and a new request for the same image pulls afresh.
    let next = tokio::spawn({
        let scheduler = scheduler.clone();
        async move { scheduler.pull(spec("big:v1", "")).await }
    });
    settle().await;
    assert_eq!(upstream.calls.load(SeqCst), 2, "the next pull started in the freed slot");
    upstream.gate.as_ref().expect("gated").notify_waiters();
    assert!(!next.await.expect("next").joined, "a fresh pull, not the cancelled one");
}

#[tokio::test(start_paused = true)]
async fn different_runtime_handlers_are_not_merged() {
    let upstream = Upstream::slow(Duration::from_secs(1));
    let scheduler = scheduler(&upstream, None);
    let (a, b) =
        tokio::join!(scheduler.pull(spec("busybox:latest", "runc")), scheduler.pull(spec("busybox:latest", "kata")));
    assert_eq!(a.result.expect("runc").image_ref, "ref-of-busybox:latest-runc");
    assert_eq!(b.result.expect("kata").image_ref, "ref-of-busybox:latest-kata");
    assert_eq!(upstream.calls.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn callers_with_different_credentials_are_not_merged() {
    let upstream = Upstream::slow(Duration::from_secs(1));
    let scheduler = scheduler(&upstream, None);
    let with_login = |user: &str| {
        let auth = crate::credentials::RegistryAuth::login(user.into(), "pw".into());
        {
            let pull = spec("registry.local/app:v1", "");
            Pull { spec: PullSpec { auth: Some(Arc::new(auth)), ..pull.spec }, ..pull }
        }
    };
    let (a, b, c) = tokio::join!(
        scheduler.pull(with_login("alice")),
        scheduler.pull(with_login("bob")),
        scheduler.pull(with_login("alice"))
    );
    assert!(a.result.is_ok() && b.result.is_ok() && c.result.is_ok());
    assert_eq!(upstream.calls.load(SeqCst), 2, "alice's two requests merged; bob's did not");
    assert!(c.joined && !b.joined);
}

async fn most_at_once(max_parallel: Option<usize>, images: usize) -> usize {
    let upstream = Upstream::slow(Duration::from_secs(5));
    let scheduler = scheduler(&upstream, max_parallel);
    let pulls = (0..images).map(|i| {
        let scheduler = scheduler.clone();
        async move { scheduler.pull(spec(&format!("image-{i}:v1"), "")).await }
    });
    for scheduled in join_all_spawned(pulls).await {
        assert!(scheduled.result.is_ok());
    }
    assert_eq!(upstream.calls.load(SeqCst), images);
    upstream.most_at_once.load(SeqCst)
}

async fn join_all_spawned<F: std::future::Future + Send + 'static>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F::Output: Send,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut outputs = Vec::with_capacity(handles.len());
    for handle in handles {
        outputs.push(handle.await.expect("task"));
    }
    outputs
}

#[tokio::test(start_paused = true)]
async fn a_cap_of_two_never_runs_more_than_two_pulls_at_once() {
    assert_eq!(most_at_once(Some(2), 7).await, 2);
}

#[tokio::test(start_paused = true)]
async fn serial_pulls_run_one_at_a_time() {
    assert_eq!(most_at_once(Some(1), 5).await, 1);
}

#[tokio::test(start_paused = true)]
async fn without_a_cap_every_distinct_pull_runs_at_once() {
    assert_eq!(most_at_once(None, 6).await, 6);
}

#[tokio::test(start_paused = true)]
async fn queued_pulls_start_first_come_first_served() {
    let upstream = Upstream::slow(Duration::from_secs(1));
    let scheduler = scheduler(&upstream, Some(1));
    let mut pulls = Vec::new();
    for image in ["first:v1", "second:v1", "third:v1", "fourth:v1"] {
        let scheduler = scheduler.clone();
        pulls.push(tokio::spawn(async move { scheduler.pull(spec(image, "")).await }));
        settle().await; // each request arrives before the next
    }
    for pull in pulls {
        assert!(pull.await.expect("task").result.is_ok());
    }
    assert_eq!(*upstream.order.lock().unwrap(), ["first:v1", "second:v1", "third:v1", "fourth:v1"]);
}

#[tokio::test(start_paused = true)]
async fn a_queued_pull_whose_callers_gave_up_is_dropped_and_the_queue_moves_on() {
    let upstream = Upstream::slow(Duration::from_secs(10));
    let scheduler = scheduler(&upstream, Some(1));
    let busy = tokio::spawn({
        let scheduler = scheduler.clone();
        async move { scheduler.pull(spec("busy:v1", "")).await }
    });
    settle().await;
    // This caller's deadline passes while its pull is still queued.
    let impatient = tokio::time::timeout(Duration::from_secs(2), scheduler.pull(spec("abandoned:v1", ""))).await;
    assert!(impatient.is_err(), "the caller gave up while queued");
    let patient = scheduler.pull(spec("patient:v1", ""));
    assert!(busy.await.expect("busy").result.is_ok());
    assert_eq!(patient.await.result.expect("patient").image_ref, "ref-of-patient:v1-");
    assert_eq!(upstream.calls.load(SeqCst), 2, "the abandoned pull never reached the runtime");
}

#[tokio::test(start_paused = true)]
async fn an_expired_pull_timeout_cancels_the_upstream_call() {
    let upstream = Upstream::slow(Duration::from_secs(60));
    let config =
        SchedulerConfig { max_parallel: None, pull_timeout: Some(Duration::from_secs(5)), ..Default::default() };
    let scheduler = PullScheduler::new(upstream.service(), config, Default::default());
    let (a, b) = tokio::join!(scheduler.pull(spec("slow:v1", "")), scheduler.pull(spec("slow:v1", "")));
    for scheduled in [a, b] {
        let error = scheduled.result.expect_err("timed out");
        assert!(matches!(*error, PullError::TimedOut(limit) if limit == Duration::from_secs(5)), "{error}");
    }
    assert_eq!(upstream.cancelled.load(SeqCst), 1, "the upstream future was dropped");
    assert_eq!(scheduler.shared.metrics.pulls_total(PullResult::TimedOut), 1);
    assert_eq!(scheduler.shared.metrics.registry_pulls_total(Some("docker.io"), PullResult::TimedOut), 1);
}

#[tokio::test(start_paused = true)]
async fn a_pull_after_the_last_one_finished_goes_upstream_again() {
    let upstream = Upstream::slow(Duration::from_secs(1));
    let scheduler = scheduler(&upstream, None);
    scheduler.pull(spec("busybox:latest", "")).await.result.expect("first");
    scheduler.pull(spec("busybox:latest", "")).await.result.expect("second");
    assert_eq!(upstream.calls.load(SeqCst), 2);
}

/// A CRI PullImage (waits for a token) joining an EnsureImageExists pull (fails at once) that is
/// queued behind another: the shared pull waits, and both callers get the image.
#[tokio::test(start_paused = true)]
async fn a_caller_that_would_wait_for_the_rate_limit_makes_the_pull_it_joins_wait_for_everyone() {
    let upstream = Arc::new(Upstream { gate: Some(Notify::new()), rate_limited: true, ..Default::default() });
    let scheduler = scheduler(&upstream, Some(1));
    let waiting = |image: &str| Pull { wait_for_rate_limit: true, ..spec(image, "") };
    let pull = |spec: Pull| {
        let scheduler = scheduler.clone();
        tokio::spawn(async move { scheduler.pull(spec).await })
    };
    let holder = pull(waiting("first:1"));
    settle().await;
    let ensure = pull(spec("herd:1", ""));
    settle().await;
    let cri = pull(waiting("herd:1"));
    settle().await;
    let gate = upstream.gate.as_ref().expect("gated");
    gate.notify_one();
    settle().await;
    gate.notify_one();
    assert!(holder.await.expect("task").result.is_ok());
    let (ensure, cri) = (ensure.await.expect("task"), cri.await.expect("task"));
    assert!(ensure.result.is_ok(), "the EnsureImageExists caller shares the waiting pull: {:?}", ensure.result);
    assert!(cri.result.is_ok() && cri.joined, "the CRI caller joined and got the image: {:?}", cri.result);
    assert_eq!(upstream.refused.load(SeqCst), 0, "nobody was refused");
    assert_eq!(upstream.calls.load(SeqCst), 2, "one upstream pull per image");
}

#[tokio::test(start_paused = true)]
async fn a_pull_no_caller_would_wait_for_is_refused_at_the_rate_limit() {
    let upstream = Arc::new(Upstream { rate_limited: true, ..Default::default() });
    let scheduler = scheduler(&upstream, Some(1));
    let (first, second) = tokio::join!(scheduler.pull(spec("herd:1", "")), scheduler.pull(spec("herd:1", "")));
    for scheduled in [first, second] {
        let refused = scheduled.result.as_ref().err().is_some_and(|error| matches!(**error, PullError::RateLimited));
        assert!(refused, "{:?}", scheduled.result);
    }
    assert_eq!(upstream.refused.load(SeqCst), 1, "one shared refusal");
}

#[tokio::test(start_paused = true)]
async fn the_pulls_under_way_and_queued_are_listed_with_their_callers() {
    let upstream = Upstream::slow(Duration::from_secs(10));
    let scheduler = scheduler(&upstream, Some(1));
    let pulls: Vec<_> = [("a:1", 2), ("b:1", 1)]
        .into_iter()
        .flat_map(|(image, callers)| std::iter::repeat_n(image, callers))
        .map(|image| {
            let scheduler = scheduler.clone();
            tokio::spawn(async move { scheduler.pull(spec(image, "")).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let listed: Vec<(String, usize, bool)> =
        scheduler.in_flight().into_iter().map(|pull| (pull.image, pull.callers, pull.started_at.is_some())).collect();
    assert_eq!(listed, [("a:1".to_owned(), 2, true), ("b:1".to_owned(), 1, false)], "b waits for a's slot");
    for pull in pulls {
        pull.await.expect("joins").result.expect("pulled");
    }
    assert!(scheduler.in_flight().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_saw_the_image_absent_before_the_same_pull_ended_gets_its_result() {
    let upstream = Upstream::slow(Duration::from_secs(1));
    let scheduler = scheduler(&upstream, None);
    let checked_before = Instant::now();
    scheduler.pull(spec("busybox:latest", "")).await.result.expect("first");
    let late = Pull { absent_since: Some(checked_before), ..spec("busybox:latest", "") };
    let served = scheduler.pull(late).await;
    assert!(served.joined && served.result.is_ok(), "{served:?}");
    assert_eq!(upstream.calls.load(SeqCst), 1, "no second upstream pull");
    // Saw it absent after the pull ended (it was removed since), or asked to pull always: a new pull.
    tokio::time::advance(Duration::from_millis(1)).await;
    let fresh = Pull { absent_since: Some(Instant::now()), ..spec("busybox:latest", "") };
    scheduler.pull(fresh).await.result.expect("pulled again");
    scheduler.pull(spec("busybox:latest", "")).await.result.expect("always");
    assert_eq!(upstream.calls.load(SeqCst), 3);
    // Another credential or handler is another pull.
    let other = Pull { absent_since: Some(checked_before), ..spec("busybox:latest", "runc-2") };
    scheduler.pull(other).await.result.expect("its own pull");
    assert_eq!(upstream.calls.load(SeqCst), 4);
}

/// Hands out trackers whose reports the test sends, and keeps what each pull told it.
#[derive(Default)]
struct ScriptedTracking {
    reports: std::sync::Mutex<Vec<watch::Sender<Option<Report>>>>,
    /// Each tracked pull's unaccounted downloads, as the poller would see them move.
    activity: std::sync::Mutex<Vec<watch::Sender<Option<Instant>>>>,
    pulls: std::sync::Mutex<Vec<(String, WaitingPods)>>,
}

impl TrackPulls for ScriptedTracking {
    fn track(&self, pull: TrackedPull) -> Tracker {
        let (reports, activity, tracker) = Tracker::scripted();
        self.reports.lock().unwrap().push(reports);
        self.activity.lock().unwrap().push(activity);
        self.pulls.lock().unwrap().push((pull.image, pull.waiting));
        tracker
    }
}

fn tracked_scheduler(upstream: &Arc<Upstream>, tracking: &Arc<ScriptedTracking>) -> PullScheduler {
    let config = SchedulerConfig { max_parallel: None, resolve_timeout: None, ..Default::default() };
    PullScheduler::tracked(upstream.service(), config, Default::default(), Some(tracking.clone()), Arc::default())
}

fn for_pod(image: &str, uid: &str) -> Pull {
    let pod = Pod { namespace: "default".into(), name: format!("pod-{uid}"), uid: uid.into() };
    Pull { caller: Some(pod), ..spec(image, "") }
}

fn report(bytes_done: u64, stalled: Option<Duration>) -> Report {
    let progress =
        crate::pull::progress::Progress { bytes_done, bytes_total: 8 << 20, layers_done: 0, layers_total: 2 };
    Report { progress, bytes_per_second: 0, stalled, kept: 0, held_in: None, layers: Arc::default() }
}

#[tokio::test(start_paused = true)]
async fn a_stalled_pull_is_cancelled_and_every_caller_told_why() {
    let upstream = Upstream::slow(Duration::from_secs(600));
    let tracking = Arc::new(ScriptedTracking::default());
    let scheduler = tracked_scheduler(&upstream, &tracking);
    let callers: Vec<_> = ["u1", "u2"]
        .into_iter()
        .map(|uid| {
            let scheduler = scheduler.clone();
            tokio::spawn(async move { scheduler.pull(for_pod("big:v1", uid)).await })
        })
        .collect();
    settle().await;
    let reports = tracking.reports.lock().unwrap()[0].clone();
    reports.send_replace(Some(report(3 << 20, None)));
    settle().await;
    assert!(callers.iter().all(|caller| !caller.is_finished()), "progress alone does not end a pull");
    reports.send_replace(Some(report(3 << 20, Some(Duration::from_secs(30)))));
    for caller in callers {
        let error = caller.await.expect("caller").result.expect_err("stalled");
        assert!(
            matches!(*error, PullError::Stalled { timeout, bytes_done, .. } if timeout == Duration::from_secs(30) && bytes_done == 3 << 20),
            "{error}"
        );
    }
    assert_eq!(upstream.cancelled.load(SeqCst), 1, "the runtime's pull was dropped");
    assert_eq!(scheduler.shared.metrics.pulls_total(PullResult::Stalled), 1);
    assert!(reports.is_closed(), "the tracker went with the pull");
}

#[tokio::test(start_paused = true)]
async fn a_pull_in_flight_shows_its_progress_and_the_pods_waiting_for_it() {
    let upstream = Upstream::gated();
    let tracking = Arc::new(ScriptedTracking::default());
    let scheduler = tracked_scheduler(&upstream, &tracking);
    let callers: Vec<_> = ["u1", "u2", "u1"]
        .into_iter()
        .map(|uid| {
            let scheduler = scheduler.clone();
            tokio::spawn(async move { scheduler.pull(for_pod("app:v1", uid)).await })
        })
        .collect();
    settle().await;
    assert_eq!(scheduler.in_flight()[0].progress, None, "nothing seen yet");
    tracking.reports.lock().unwrap()[0].send_replace(Some(report(1 << 20, None)));
    assert_eq!(scheduler.in_flight()[0].progress, Some(report(1 << 20, None)));
    let (image, waiting) = tracking.pulls.lock().unwrap()[0].clone();
    assert_eq!(image, "app:v1");
    let uids: Vec<String> = waiting.lock().unwrap().iter().map(|pod| pod.uid.clone()).collect();
    assert_eq!(uids, ["u1", "u2"], "each pod once, in the order it came");
    upstream.gate.as_ref().expect("gated").notify_one();
    for caller in callers {
        caller.await.expect("caller").result.expect("pulled");
    }
    assert_eq!(upstream.calls.load(SeqCst), 1);
}

/// Serial pulls, each taking the same time, watched by scripted trackers; the registry is never
/// taken for a silent one (most pulls get no report). Each pull runs in a task that says when it
/// ended.
struct Serial {
    upstream: Arc<Upstream>,
    tracking: Arc<ScriptedTracking>,
    scheduler: PullScheduler,
    ended: Arc<std::sync::Mutex<Vec<&'static str>>>,
}

impl Serial {
    fn new(each_takes: Duration) -> Self {
        let (upstream, tracking) = (Upstream::slow(each_takes), Arc::new(ScriptedTracking::default()));
        let config = SchedulerConfig {
            max_parallel: NonZeroUsize::new(1),
            answer_grace: Duration::from_secs(3600),
            resolve_timeout: None,
            ..Default::default()
        };
        let progress: Option<Arc<dyn TrackPulls>> = Some(tracking.clone());
        let scheduler =
            PullScheduler::tracked(upstream.service(), config, Default::default(), progress, Arc::default());
        Self { upstream, tracking, scheduler, ended: Arc::default() }
    }

    /// Pulls `image` in a task, and lets it reach the scheduler.
    async fn pull(&self, image: &'static str) -> tokio::task::JoinHandle<Scheduled> {
        let (scheduler, ended) = (self.scheduler.clone(), self.ended.clone());
        let task = tokio::spawn(async move {
            let scheduled = scheduler.pull(spec(image, "")).await;
            ended.lock().unwrap().push(image);
            scheduled
        });
        settle().await;
        task
    }

    /// The `nth` tracker handed out reports `bytes_done` of `bytes_total`.
    async fn report(&self, nth: usize, bytes_done: u64, bytes_total: u64) {
        let progress = crate::pull::progress::Progress { bytes_done, bytes_total, layers_done: 0, layers_total: 4 };
        let report =
            Report { progress, bytes_per_second: 0, stalled: None, kept: 0, held_in: None, layers: Arc::default() };
        self.tracking.reports.lock().unwrap()[nth].send_replace(Some(report));
        settle().await;
    }

    fn cancelled(&self) -> usize {
        self.upstream.cancelled.load(SeqCst)
    }

    fn ended(&self) -> Vec<&'static str> {
        self.ended.lock().unwrap().clone()
    }
}

#[tokio::test(start_paused = true)]
async fn a_big_pull_that_has_barely_begun_lets_the_pulls_queued_behind_it_go_first_once() {
    let serial = Serial::new(Duration::from_secs(60));
    let big = serial.pull("big:v1").await;
    // Its manifest says 1 GiB to fetch, 1 MiB has come; nothing waits: it goes on.
    serial.report(0, 1 << 20, 1 << 30).await;
    assert_eq!(serial.cancelled(), 0);

    // A pull queues behind it: the big one gives it the slot and queues again.
    let small = serial.pull("small:v1").await;
    assert_eq!(serial.cancelled(), 1, "the big pull's runtime call was dropped");
    assert_eq!(serial.scheduler.shared.metrics.pulls_total(PullResult::Yielded), 1);
    let queued: Vec<_> = serial
        .scheduler
        .in_flight()
        .into_iter()
        .map(|pull| (pull.image, pull.started_at.is_some(), pull.progress.is_some()))
        .collect();
    // Queued again with its progress gone (it starts over), the small one running.
    assert_eq!(queued, [("big:v1".to_owned(), false, false), ("small:v1".to_owned(), true, false)]);
    // One that comes while it waits goes first too.
    let meanwhile = serial.pull("meanwhile:v1").await;
    small.await.expect("small").result.expect("pulled");
    meanwhile.await.expect("meanwhile").result.expect("pulled");

    // Running again, it never yields a second time: a later pull waits for it.
    settle().await;
    serial.report(3, 0, 1 << 30).await;
    let later = serial.pull("later:v1").await;
    assert_eq!(serial.cancelled(), 1);
    big.await.expect("big").result.expect("pulled once the small ones were");
    later.await.expect("later").result.expect("pulled");
    assert_eq!(serial.ended(), ["small:v1", "meanwhile:v1", "big:v1", "later:v1"]);
    assert_eq!(*serial.upstream.order.lock().unwrap(), ["big:v1", "small:v1", "meanwhile:v1", "big:v1", "later:v1"]);
}

#[tokio::test(start_paused = true)]
async fn a_pull_that_yielded_lets_later_ones_go_first_for_a_minute_at_most() {
    let serial = Serial::new(Duration::from_secs(50));
    let big = serial.pull("big:v1").await;
    serial.report(0, 0, 1 << 30).await;
    // A stream of pulls each taking 50 s: at 0 s, then at 5 s and every 10 s after.
    let names = ["s0:v1", "s1:v1", "s2:v1", "s3:v1", "s4:v1", "s5:v1", "s6:v1", "s7:v1", "s8:v1"];
    let mut stream = Vec::new();
    for (index, name) in names.into_iter().enumerate() {
        stream.push(serial.pull(name).await);
        tokio::time::sleep(Duration::from_secs(if index == 0 { 5 } else { 10 })).await;
    }
    big.await.expect("big").result.expect("pulled");
    let order = serial.upstream.order.lock().unwrap().clone();
    let again = order.iter().rposition(|image| image == "big:v1").expect("the big pull ran again");
    // It yielded at 0 s and queued again at 60 s: after the pulls queued by then (s0 … s6), before
    // those that came after.
    assert_eq!(order[..again], ["big:v1", "s0:v1", "s1:v1", "s2:v1", "s3:v1", "s4:v1", "s5:v1", "s6:v1"]);
    for pull in stream {
        pull.await.expect("a pull of the stream").result.expect("pulled");
    }
}

#[tokio::test(start_paused = true)]
async fn a_pull_under_the_size_or_past_its_first_32_mib_keeps_its_slot() {
    for (done, total) in [(0, super::DEFAULT_YIELD_ABOVE - 1), (yielding::YIELD_WITHIN, 1 << 30)] {
        let serial = Serial::new(Duration::from_secs(60));
        let first = serial.pull("first:v1").await;
        serial.report(0, done, total).await;
        let second = serial.pull("second:v1").await;
        assert_eq!(serial.cancelled(), 0, "{done} of {total}");
        first.await.expect("first").result.expect("pulled");
        second.await.expect("second").result.expect("pulled");
        assert_eq!(serial.ended(), ["first:v1", "second:v1"]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_big_pull_yields_when_its_size_is_known_after_the_others_queued() {
    let serial = Serial::new(Duration::from_secs(60));
    let big = serial.pull("big:v1").await;
    let small = serial.pull("small:v1").await;
    assert_eq!(serial.cancelled(), 0, "its size is not known yet");
    serial.report(0, 0, 1 << 30).await;
    assert_eq!(serial.cancelled(), 1);
    small.await.expect("small").result.expect("pulled");
    big.await.expect("big").result.expect("pulled");
    assert_eq!(serial.ended(), ["small:v1", "big:v1"]);
}

/// A scheduler of up to ten pulls at once (the default), each taking a minute, watched by
/// scripted trackers.
fn parallel_tracked() -> (Arc<Upstream>, Arc<ScriptedTracking>, PullScheduler) {
    let (upstream, tracking) = (Upstream::slow(Duration::from_secs(60)), Arc::new(ScriptedTracking::default()));
    let config =
        SchedulerConfig { answer_grace: Duration::from_secs(3600), resolve_timeout: None, ..Default::default() };
    let progress: Option<Arc<dyn TrackPulls>> = Some(tracking.clone());
    let scheduler = PullScheduler::tracked(upstream.service(), config, Default::default(), progress, Arc::default());
    (upstream, tracking, scheduler)
}

/// The `nth` tracker handed out reports `bytes_done` of `bytes_total`, its downloads in `held_in`.
async fn downloading(
    tracking: &ScriptedTracking,
    nth: usize,
    (bytes_done, bytes_total): (u64, u64),
    held_in: Option<&str>,
) {
    let progress = crate::pull::progress::Progress { bytes_done, bytes_total, layers_done: 0, layers_total: 2 };
    let held_in = held_in.map(Arc::from);
    let report = Report { progress, bytes_per_second: 0, stalled: None, kept: 0, held_in, layers: Arc::default() };
    tracking.reports.lock().unwrap()[nth].send_replace(Some(report));
    // The big pull looks at the pulls beside it every 100 ms.
    tokio::time::sleep(Duration::from_millis(150)).await;
    settle().await;
}

fn pull_in_task(scheduler: &PullScheduler, pull: Pull) -> tokio::task::JoinHandle<Scheduled> {
    let scheduler = scheduler.clone();
    tokio::spawn(async move { scheduler.pull(pull).await })
}

#[tokio::test(start_paused = true)]
async fn a_big_pull_makes_way_for_a_much_cheaper_pods_pull_beside_it_and_goes_on_from_its_lease() {
    let (upstream, tracking, scheduler) = parallel_tracked();
    let big = pull_in_task(&scheduler, for_pod("big:v1", "u1"));
    settle().await;
    downloading(&tracking, 0, (10 << 20, 1 << 30), Some("cri-imaged.resume.test")).await;
    let small = pull_in_task(&scheduler, for_pod("small:v1", "u2"));
    settle().await;
    assert_eq!(upstream.cancelled.load(SeqCst), 0, "the small pull's size is not known yet");
    downloading(&tracking, 1, (0, 2 << 20), None).await;
    assert_eq!(upstream.cancelled.load(SeqCst), 1, "2 MiB beside 1014 MiB left: the big pull made way");
    assert_eq!(scheduler.shared.metrics.pulls_total(PullResult::Yielded), 1);
    assert_eq!(upstream.running.load(SeqCst), 1, "the small pull has the link to itself");

    small.await.expect("small").result.expect("pulled");
    big.await.expect("big").result.expect("pulled once the small one was");
    assert_eq!(*upstream.order.lock().unwrap(), ["big:v1", "small:v1", "big:v1"]);
    let kept_in = upstream.kept_in.lock().unwrap().clone();
    let kept_in: Vec<Option<&str>> = kept_in.iter().map(Option::as_deref).collect();
    assert_eq!(kept_in, [None, None, Some("cri-imaged.resume.test")], "it went on from what its lease held");
}

#[tokio::test(start_paused = true)]
async fn big_pulls_share_the_link_with_comparable_pulls_and_pre_pulls_and_make_way_once() {
    let (upstream, tracking, scheduler) = parallel_tracked();
    let big = pull_in_task(&scheduler, for_pod("big:v1", "u1"));
    settle().await;
    downloading(&tracking, 0, (0, 1 << 30), Some("cri-imaged.resume.test")).await;
    // A third of what it has left is not much cheaper; a pre-pull is no pod's.
    let comparable = pull_in_task(&scheduler, for_pod("comparable:v1", "u2"));
    settle().await;
    downloading(&tracking, 1, (0, 350 << 20), None).await;
    let pre_pull = pull_in_task(&scheduler, Pull { class: PullClass::PrePull, ..spec("ahead:v1", "") });
    settle().await;
    downloading(&tracking, 2, (0, 2 << 20), None).await;
    assert_eq!(upstream.cancelled.load(SeqCst), 0, "all three share the link");

    // A small pod's pull: both big ones make way, once.
    let small = pull_in_task(&scheduler, for_pod("small:v1", "u3"));
    settle().await;
    downloading(&tracking, 3, (0, 2 << 20), None).await;
    assert_eq!(upstream.cancelled.load(SeqCst), 2, "2 MiB is much cheaper than 350 MiB too");
    tokio::time::sleep(Duration::from_secs(61)).await;
    settle().await;
    // Going on, they are watched by new trackers; another small pod's pull does not stop them again.
    downloading(&tracking, 4, (0, 1 << 30), Some("cri-imaged.resume.test")).await;
    downloading(&tracking, 5, (0, 350 << 20), Some("cri-imaged.resume.other")).await;
    let again = pull_in_task(&scheduler, for_pod("again:v1", "u4"));
    settle().await;
    downloading(&tracking, 6, (0, 2 << 20), None).await;
    assert_eq!(upstream.cancelled.load(SeqCst), 2, "each makes way once");
    for pull in [big, comparable, pre_pull, small, again] {
        pull.await.expect("a pull").result.expect("pulled");
    }
}

/// Sizes each image as the test says, a registry's round trips later, and counts the reads.
#[derive(Default)]
struct ScriptedSizes {
    sizes: HashMap<&'static str, u64>,
    reads: AtomicUsize,
}

impl crate::pull::size::SizePulls for ScriptedSizes {
    fn size(&self, pull: &Pull) -> futures_util::future::BoxFuture<'static, Option<u64>> {
        self.reads.fetch_add(1, SeqCst);
        let size = self.sizes.get(pull.image().image.as_str()).copied();
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            size
        })
    }
}

/// Ten pulls at once, none of them watched (the runtime has no content service), sized by
/// `sizes`.
fn parallel_unwatched(sizes: &[(&'static str, u64)]) -> (Arc<Upstream>, Arc<ScriptedSizes>, PullScheduler) {
    let upstream = Upstream::slow(Duration::from_secs(60));
    let sizes = Arc::new(ScriptedSizes { sizes: sizes.iter().copied().collect(), ..Default::default() });
    let scheduler = PullScheduler::new(upstream.service(), SchedulerConfig::default(), Default::default());
    scheduler.size_with(sizes.clone());
    (upstream, sizes, scheduler)
}

#[tokio::test(start_paused = true)]
async fn an_unwatched_big_pull_sized_by_its_registry_makes_way_for_a_small_one_early_on() {
    let (upstream, sizes, scheduler) = parallel_unwatched(&[("big:v1", 1 << 30), ("small:v1", 2 << 20)]);
    let big = pull_in_task(&scheduler, for_pod("big:v1", "u1"));
    settle().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sizes.reads.load(SeqCst), 0, "alone, nothing needs its size");
    let small = pull_in_task(&scheduler, for_pod("small:v1", "u2"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    settle().await;
    assert_eq!(sizes.reads.load(SeqCst), 2, "both sized once the two run side by side");
    assert_eq!(upstream.cancelled.load(SeqCst), 1, "the big pull made way, 0.8 s into it");
    small.await.expect("small").result.expect("pulled");
    big.await.expect("big").result.expect("pulled once the small one was");
    assert_eq!(*upstream.order.lock().unwrap(), ["big:v1", "small:v1", "big:v1"]);
}

#[tokio::test(start_paused = true)]
async fn an_unwatched_pull_past_its_first_two_seconds_does_not_make_way() {
    let (upstream, _, scheduler) = parallel_unwatched(&[("big:v1", 1 << 30), ("small:v1", 2 << 20)]);
    let big = pull_in_task(&scheduler, for_pod("big:v1", "u1"));
    settle().await;
    tokio::time::sleep(yielding::UNWATCHED_WITHIN).await;
    let small = pull_in_task(&scheduler, for_pod("small:v1", "u2"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    settle().await;
    assert_eq!(upstream.cancelled.load(SeqCst), 0, "what it fetched would be fetched again: they share the link");
    small.await.expect("small").result.expect("pulled");
    big.await.expect("big").result.expect("pulled");
}

mod cheapest_first;
mod pods_first;
