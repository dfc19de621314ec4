//! The scheduler with registries that hang, refuse and come back, on the paused clock: what a
//! pull from another registry waits, when each caller is answered, what reaches the runtime.

use std::{collections::HashMap, num::NonZeroUsize, sync::Mutex as StdMutex};

use crate::cri::ImageSpec;
use tokio::time::{Instant, sleep};
use tower::{Layer, util::BoxCloneSyncService};

use super::*;
use crate::{
    pull::{
        Pull, PullService, Pulled,
        poller::{Report, TrackPulls, TrackedPull, Tracker},
        progress::Progress,
        ratelimit::{RateLimit, RateLimitConfig, RateLimitLayer, RateLimitMode, RegistryLimits},
        scheduler::{PullScheduler, SchedulerConfig},
    },
    runtime::{PullSpec, RuntimeError},
};

/// How each registry host behaves upstream.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Accepts and never answers.
    Hangs,
    /// Answers and the pull takes this long.
    Takes(Duration),
    /// Refuses the connection at once.
    Refuses,
}

#[derive(Default)]
struct Registries {
    behaviour: StdMutex<HashMap<&'static str, Behaviour>>,
    calls: StdMutex<HashMap<String, usize>>,
}

impl Registries {
    fn set(&self, host: &'static str, behaviour: Behaviour) {
        self.behaviour.lock().unwrap().insert(host, behaviour);
    }

    fn calls(&self, host: &str) -> usize {
        self.calls.lock().unwrap().get(host).copied().unwrap_or(0)
    }

    fn service(self: &Arc<Self>) -> PullService {
        let registries = self.clone();
        BoxCloneSyncService::new(tower::service_fn(move |pull: Pull| {
            let registries = registries.clone();
            async move {
                let host = pull.reference.as_ref().expect("parsed").domain().to_owned();
                *registries.calls.lock().unwrap().entry(host.clone()).or_default() += 1;
                let behaviour = registries.behaviour.lock().unwrap().get(host.as_str()).copied();
                match behaviour.unwrap_or(Behaviour::Takes(Duration::from_millis(100))) {
                    Behaviour::Hangs => std::future::pending().await,
                    Behaviour::Takes(duration) => sleep(duration).await,
                    Behaviour::Refuses => {
                        let message =
                            format!("failed to resolve reference: dial tcp {host}: connect: connection refused");
                        return Err(PullError::Runtime(RuntimeError::Status(tonic::Status::unknown(message))));
                    }
                }
                Ok(Pulled { image_ref: pull.spec.image.image, image_size: 1, pull_duration: Duration::ZERO })
            }
        }))
    }
}

/// Watches every pull; a pull of a host in `answering` is answered at once, as the poller
/// would find its manifest.
#[derive(Default)]
struct Watching {
    answering: StdMutex<Vec<&'static str>>,
    reports: StdMutex<Vec<watch::Sender<Option<Report>>>>,
    activity: StdMutex<Vec<(String, watch::Sender<Option<Instant>>)>>,
}

impl TrackPulls for Watching {
    fn track(&self, pull: TrackedPull) -> Tracker {
        let (reports, activity, tracker) = Tracker::scripted();
        if self.answering.lock().unwrap().contains(&pull.reference.domain()) {
            let progress = Progress { bytes_done: 0, bytes_total: 1, layers_done: 0, layers_total: 1 };
            reports.send_replace(Some(Report {
                progress,
                bytes_per_second: 0,
                stalled: None,
                kept: 0,
                held_in: None,
                layers: Arc::default(),
            }));
        }
        self.reports.lock().unwrap().push(reports);
        self.activity.lock().unwrap().push((pull.image, activity));
        tracker
    }
}

impl Watching {
    /// Says that a download nobody accounts for moved, to every pull of `image` watched.
    fn moved(&self, image: &str) {
        for (watched, activity) in self.activity.lock().unwrap().iter() {
            if watched == image {
                activity.send_replace(Some(Instant::now()));
            }
        }
    }
}

struct Node {
    scheduler: PullScheduler,
    registries: Arc<Registries>,
    watching: Arc<Watching>,
}

impl Node {
    /// Serial pulls, the default answer grace (1 s) and resolve timeout (20 s), and a breaker
    /// that opens after `failures`.
    fn new(failures: u32) -> Self {
        Self::behind(failures, None)
    }

    /// As [`Node::new`], its pulls behind a registry rate limit of `limits`.
    fn behind(failures: u32, limits: Option<Arc<RegistryLimits>>) -> Self {
        let registries = Arc::new(Registries::default());
        let watching = Arc::new(Watching::default());
        let breaker = BreakerConfig { failures: std::num::NonZeroU32::new(failures), ..BreakerConfig::default() };
        let config = SchedulerConfig { max_parallel: NonZeroUsize::new(1), breaker, ..SchedulerConfig::default() };
        let progress = Some(watching.clone() as Arc<dyn TrackPulls>);
        let service = match limits {
            Some(limits) => BoxCloneSyncService::new(RateLimitLayer::new(limits).layer(registries.service())),
            None => registries.service(),
        };
        let scheduler = PullScheduler::tracked(service, config, Default::default(), progress, Arc::default());
        Self { scheduler, registries, watching }
    }

    /// Asks for `image` now; the handle answers with the result and when it came.
    fn pull(&self, image: &str) -> tokio::task::JoinHandle<(Result<Pulled, Arc<PullError>>, Duration)> {
        let scheduler = self.scheduler.clone();
        let spec = PullSpec { image: ImageSpec { image: image.into(), ..Default::default() }, ..Default::default() };
        let asked = Instant::now();
        tokio::spawn(async move { (scheduler.pull(Pull::of(spec)).await.result, asked.elapsed()) })
    }
}

#[tokio::test(start_paused = true)]
async fn a_hung_registry_gives_the_serial_slot_back_after_the_grace_and_its_pulls_fail_together() {
    let node = Node::new(0);
    node.registries.set("hung.test", Behaviour::Hangs);
    let first = node.pull("hung.test/a:1");
    sleep(Duration::from_millis(10)).await;
    // Queued for the slot before the registry went quiet.
    let queued = node.pull("hung.test/e:1");
    let healthy_early = node.pull("good.test/b:1");
    sleep(Duration::from_secs(2)).await;
    // The registry has gone quiet: its next pulls wait for the first, holding no slot.
    let second = node.pull("hung.test/c:1");
    sleep(Duration::from_millis(10)).await;
    let healthy_late = node.pull("good.test/d:1");

    let (early, waited_early) = healthy_early.await.expect("joined");
    early.expect("pulled");
    assert_eq!(waited_early, Duration::from_millis(1090), "behind the hung pull for the grace only");
    let (late, waited_late) = healthy_late.await.expect("joined");
    late.expect("pulled");
    assert_eq!(waited_late, Duration::from_millis(100), "no slot is held for the quiet registry");

    let (first, waited_first) = first.await.expect("joined");
    let (second, waited_second) = second.await.expect("joined");
    let first = first.expect_err("never answered");
    assert_eq!(waited_first, Duration::from_secs(20), "the resolve timeout");
    assert_eq!(
        first.to_string(),
        r#"RegistryUnavailable: registry "hung.test" did not answer within 20s (--registry-resolve-timeout); the pull was cancelled"#
    );
    let second = second.expect_err("failed with the first");
    assert_eq!(second.to_string(), first.to_string(), "told the same");
    assert_eq!(waited_second, Duration::from_millis(17_990), "answered the moment the first failed");
    let (queued, waited_queued) = queued.await.expect("joined");
    assert_eq!(queued.expect_err("failed with the first").to_string(), first.to_string());
    assert_eq!(waited_queued, Duration::from_millis(19_990), "it gave its slot back as it got it");
    assert_eq!(node.registries.calls("hung.test"), 1, "the waiting pull never reached the registry");
}

#[tokio::test(start_paused = true)]
async fn an_answered_pull_keeps_its_slot_and_is_never_timed_out() {
    let node = Node::new(0);
    node.watching.answering.lock().unwrap().push("big.test");
    node.registries.set("big.test", Behaviour::Takes(Duration::from_secs(90)));
    let big = node.pull("big.test/a:1");
    sleep(Duration::from_millis(10)).await;
    let small = node.pull("small.test/b:1");
    let (big, took) = big.await.expect("joined");
    big.expect("a long download of an answered pull is not a silent registry");
    assert_eq!(took, Duration::from_secs(90));
    let (small, waited) = small.await.expect("joined");
    small.expect("pulled");
    assert!(waited >= Duration::from_secs(90), "serial: one download at a time ({waited:?})");
}

#[tokio::test(start_paused = true)]
async fn downloads_nobody_accounts_for_keep_an_unanswered_pull_alive() {
    let node = Node::new(0);
    node.registries.set("stale.test", Behaviour::Takes(Duration::from_secs(40)));
    let pull = node.pull("stale.test/a:1");
    for _ in 0..7 {
        sleep(Duration::from_secs(5)).await;
        node.watching.moved("stale.test/a:1");
    }
    let (result, took) = pull.await.expect("joined");
    result.expect("bytes moved all along: maybe its own, under a manifest the poller could not place");
    assert_eq!(took, Duration::from_secs(40));
}

#[tokio::test(start_paused = true)]
async fn the_breaker_opens_after_failures_in_a_row_refuses_at_once_then_lets_one_probe_through() {
    let node = Node::new(2);
    node.registries.set("down.test", Behaviour::Refuses);
    for i in 0..2 {
        let (result, _) = node.pull(&format!("down.test/a:{i}")).await.expect("joined");
        assert!(result.expect_err("refused").to_string().contains("connection refused"));
    }
    let (refused, waited) = node.pull("down.test/a:3").await.expect("joined");
    let refused = refused.expect_err("the breaker is open");
    assert_eq!(waited, Duration::ZERO, "at once");
    assert!(
        refused.to_string().starts_with(
            r#"RegistryUnavailable: registry "down.test" is unavailable after 2 failed pulls in a row (the last: "#
        ),
        "{refused}"
    );
    assert!(refused.to_string().ends_with("its pulls fail at once for 30s more, then one pull tests it"), "{refused}");
    assert_eq!(node.registries.calls("down.test"), 2);
    let status = node.scheduler.breakers().status();
    assert_eq!((status[0].host.as_str(), status[0].breaker, status[0].failures), ("down.test", "open", 2));
    node.pull("up.test/b:1").await.expect("joined").0.expect("other registries are not held up");

    // Cooled down, the registry is back: one pull tests it while the next is refused.
    sleep(Duration::from_secs(30)).await;
    node.registries.set("down.test", Behaviour::Takes(Duration::from_secs(1)));
    let probe = node.pull("down.test/a:4");
    sleep(Duration::from_millis(10)).await;
    let (second, _) = node.pull("down.test/a:5").await.expect("joined");
    assert!(second.expect_err("one probe at a time").to_string().ends_with("one pull is testing it now"));
    probe.await.expect("joined").0.expect("the probe pulls");
    assert_eq!(node.scheduler.breakers().status(), [], "closed, nothing to report");
    node.pull("down.test/a:6").await.expect("joined").0.expect("pulls go on as usual");
    assert_eq!(node.registries.calls("down.test"), 4);
}

#[tokio::test(start_paused = true)]
async fn a_hung_registry_opens_its_breaker_once_enough_of_its_pulls_failed_waiting() {
    let node = Node::new(3);
    node.registries.set("hung.test", Behaviour::Hangs);
    let first = node.pull("hung.test/a:1");
    sleep(Duration::from_secs(2)).await;
    let waiting: Vec<_> = (2..5).map(|i| node.pull(&format!("hung.test/a:{i}"))).collect();
    first.await.expect("joined").0.expect_err("timed out");
    for pull in waiting {
        pull.await.expect("joined").0.expect_err("failed with it");
    }
    let (retry, waited) = node.pull("hung.test/a:1").await.expect("joined");
    assert_eq!(waited, Duration::ZERO, "a retry fails at once while the breaker is open");
    assert!(retry.expect_err("open").to_string().contains("after 4 failed pulls in a row"));
    assert_eq!(node.registries.calls("hung.test"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_wait_for_a_rate_limit_token_is_not_the_registrys_silence() {
    let limit = RateLimit::try_new(0.02, 1).expect("valid").expect("limited");
    let config = RateLimitConfig { each_host: Some(limit), mode: RateLimitMode::Wait, ..Default::default() };
    let limits = Arc::new(RegistryLimits::new(&config, Default::default(), Arc::default()));
    let node = Node::behind(0, Some(limits));
    node.pull("slow.test/a:1").await.expect("joined").0.expect("the burst");
    // The next token is 50 s away, beyond the resolve timeout; then the pull takes 100 ms.
    let (second, waited) = node.pull("slow.test/b:1").await.expect("joined");
    second.expect("waited for its token, then pulled");
    assert!(waited >= Duration::from_secs(49), "{waited:?}");
    assert_eq!(node.scheduler.breakers().status(), [], "nothing was held against the registry");
}

/// What each pull in flight says it waits for, in the order they were asked.
fn states(scheduler: &PullScheduler) -> Vec<(String, &'static str)> {
    scheduler.in_flight().into_iter().map(|pull| (pull.image, pull.state.as_str())).collect()
}

#[tokio::test(start_paused = true)]
async fn each_pull_in_flight_says_what_it_waits_for() {
    let limit = RateLimit::try_new(0.02, 1).expect("valid").expect("limited");
    let config = RateLimitConfig { each_host: Some(limit), mode: RateLimitMode::Wait, ..Default::default() };
    let limits = Arc::new(RegistryLimits::new(&config, Default::default(), Arc::default()));
    let node = Node::behind(0, Some(limits));
    node.pull("slow.test/a:1").await.expect("joined").0.expect("the burst");
    // The next token is 50 s away: the serial slot's holder waits for it, the next for the slot.
    let _limited = node.pull("slow.test/b:1");
    sleep(Duration::from_millis(10)).await;
    let _queued = node.pull("slow.test/c:1");
    sleep(Duration::from_millis(10)).await;
    let expected = [("slow.test/b:1".to_owned(), "rate-limit"), ("slow.test/c:1".to_owned(), "slot")];
    assert_eq!(states(&node.scheduler), expected);
    sleep(Duration::from_secs(50)).await;
    let after = [("slow.test/c:1".to_owned(), "rate-limit")];
    assert_eq!(states(&node.scheduler), after, "b got its token and pulled; c holds the slot, waiting for the next");
    // Its token came at 100 s; its pull takes 100 ms.
    sleep(Duration::from_millis(49_900)).await;
    assert_eq!(states(&node.scheduler), [("slow.test/c:1".to_owned(), "pulling")]);

    let node = Node::new(0);
    node.registries.set("hung.test", Behaviour::Hangs);
    let _first = node.pull("hung.test/a:1");
    sleep(Duration::from_secs(2)).await;
    let _second = node.pull("hung.test/c:1");
    sleep(Duration::from_millis(10)).await;
    let expected = [("hung.test/a:1".to_owned(), "pulling"), ("hung.test/c:1".to_owned(), "registry")];
    assert_eq!(states(&node.scheduler), expected, "the second waits for the first, unanswered");
}

/// A signature read is one more visit to its registry: unreachable, it counts as a failed pull
/// does, and once the breaker is open, reads and pulls of that registry are refused at once, the
/// breaker's words said; an answer of any kind closes it again. Other registries are untouched.
#[tokio::test(start_paused = true)]
async fn signature_reads_count_toward_their_registrys_breaker_and_an_open_one_refuses_them() {
    use crate::signatures::{Reached, RegistryHealth};
    let node = Node::new(5);
    let reads = SignatureReads(node.scheduler.breakers().clone());
    for _ in 0..5 {
        let visit = reads.visit("down.test").expect("closed: admitted");
        visit.ended(Reached::Unreachable("registry down.test: connection refused".into()));
    }
    let refused = reads.visit("down.test").err().expect("open: refused");
    assert!(refused.starts_with("RegistryUnavailable:") && refused.contains("connection refused"), "{refused}");
    let pulled = node.pull("down.test/app:1").await.expect("joined").0;
    assert!(matches!(pulled.as_ref().map_err(|error| &**error), Err(PullError::RegistryUnavailable(_))), "{pulled:?}");
    assert_eq!(node.registries.calls("down.test"), 0, "the pull never reached the registry");
    reads.visit("up.test").expect("another registry is admitted").ended(Reached::Answered);

    // After the cooldown, a read is the probe: answered, the breaker closes for pulls too.
    sleep(Duration::from_secs(31)).await;
    reads.visit("down.test").expect("half-open: the probe").ended(Reached::Answered);
    node.pull("down.test/app:1").await.expect("joined").0.expect("closed again");
    // A read that learnt nothing (no host may be asked) neither opens nor closes anything.
    for _ in 0..5 {
        reads.visit("quiet.test").expect("admitted").ended(Reached::Nothing);
    }
    reads.visit("quiet.test").expect("still closed");
}
