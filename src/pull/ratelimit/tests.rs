use std::sync::atomic::{AtomicUsize, Ordering};

use governor::clock::FakeRelativeClock;
use k8s_cri::v1::ImageSpec;

use super::*;
use crate::runtime::PullSpec;

fn limit(qps: f64, burst: u32) -> RateLimit {
    RateLimit::try_new(qps, burst).expect("valid").expect("limited")
}

/// An upstream that counts its calls and succeeds at once.
fn upstream(calls: Arc<AtomicUsize>) -> impl Service<Pull, Response = Pulled, Error = PullError, Future: Send> + Clone {
    tower::service_fn(move |spec: Pull| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move { Ok(Pulled { image_ref: spec.spec.image.image, image_size: 1, pull_duration: Duration::ZERO }) }
    })
}

fn spec(image: &str) -> Pull {
    Pull::of(PullSpec { image: ImageSpec { image: image.into(), ..Default::default() }, ..Default::default() })
}

async fn pull<S>(service: &S, image: &str) -> Result<Pulled, PullError>
where
    S: Service<Pull, Response = Pulled, Error = PullError> + Clone,
{
    service.clone().oneshot(spec(image)).await
}

#[tokio::test]
async fn the_burst_passes_and_the_next_pull_fails_with_the_kubelets_words() {
    let clock = FakeRelativeClock::default();
    let config = RateLimitConfig { global: Some(limit(5.0, 10)), ..Default::default() };
    let limits = Arc::new(RegistryLimits::new(&config, clock.clone(), Default::default()));
    let calls = Arc::new(AtomicUsize::new(0));
    let service = RateLimitLayer::new(limits.clone()).layer(upstream(calls.clone()));

    for i in 0..10 {
        pull(&service, &format!("app:{i}")).await.expect("within the burst");
    }
    let refused = pull(&service, "app:11").await.expect_err("over the burst");
    assert_eq!(refused.to_string(), "pull QPS exceeded");
    assert_eq!(calls.load(Ordering::SeqCst), 10, "the refused pull never reached upstream");
    assert_eq!(limits.metrics.throttled_total(), 1);

    clock.advance(Duration::from_millis(200)); // one token at 5 QPS
    pull(&service, "app:12").await.expect("a token freed up");
    assert!(pull(&service, "app:13").await.is_err(), "and only one");
}

#[tokio::test]
async fn a_host_with_its_own_bucket_is_independent_of_the_others() {
    let clock = FakeRelativeClock::default();
    let config = RateLimitConfig {
        global: Some(limit(1.0, 1)),
        per_host: vec![("registry.local:5000".into(), limit(1.0, 2))],
        mode: RateLimitMode::Fail,
    };
    let limits = Arc::new(RegistryLimits::new(&config, clock, Default::default()));
    let service = RateLimitLayer::new(limits).layer(upstream(Arc::new(AtomicUsize::new(0))));

    pull(&service, "busybox:1").await.expect("docker.io uses the global bucket");
    assert!(pull(&service, "quay.io/app:1").await.is_err(), "the global bucket is empty");
    pull(&service, "registry.local:5000/app:1").await.expect("its own bucket");
    pull(&service, "registry.local:5000/app:2").await.expect("burst of two");
    assert!(pull(&service, "registry.local:5000/app:3").await.is_err(), "its own bucket is empty too");
}

#[tokio::test(start_paused = true)]
async fn wait_mode_admits_pulls_at_the_configured_rate() {
    let config = RateLimitConfig { global: Some(limit(5.0, 1)), mode: RateLimitMode::Wait, ..Default::default() };
    let limits = Arc::new(RegistryLimits::new(&config, TokioClock::default(), Default::default()));
    let service = RateLimitLayer::new(limits.clone()).layer(upstream(Arc::new(AtomicUsize::new(0))));

    let started = tokio::time::Instant::now();
    let mut admitted_at = Vec::new();
    for i in 0..4 {
        pull(&service, &format!("app:{i}")).await.expect("wait mode never fails");
        admitted_at.push(started.elapsed().as_millis());
    }
    assert_eq!(admitted_at, [0, 200, 400, 600], "one pull every 200ms at 5 QPS");
    assert_eq!(limits.metrics.throttled_total(), 3);
}

#[test]
fn zero_qps_means_no_limit_and_bad_values_are_refused() {
    assert_eq!(RateLimit::try_new(0.0, 10), Ok(None));
    assert_eq!(RateLimit::try_new(5.0, 0), Err(RateLimitError::ZeroBurst));
    assert!(matches!(RateLimit::try_new(-1.0, 10), Err(RateLimitError::BadQps(_))));
    assert!(matches!(RateLimit::try_new(f64::NAN, 10), Err(RateLimitError::BadQps(_))));
}

#[tokio::test(start_paused = true)]
async fn a_cri_pull_waits_for_a_token_even_in_fail_mode() {
    let config = RateLimitConfig { global: Some(limit(5.0, 1)), mode: RateLimitMode::Fail, ..Default::default() };
    let limits = Arc::new(RegistryLimits::new(&config, TokioClock::default(), Default::default()));
    let service = RateLimitLayer::new(limits).layer(upstream(Arc::new(AtomicUsize::new(0))));
    let cri_spec = |image: &str| Pull { wait_for_rate_limit: true, ..spec(image) };

    let started = tokio::time::Instant::now();
    service.clone().oneshot(cri_spec("app:1")).await.expect("the burst");
    assert!(pull(&service, "app:2").await.is_err(), "an EnsureImageExists pull fails over the limit");
    service.clone().oneshot(cri_spec("app:3")).await.expect("a CRI pull waits instead");
    assert_eq!(started.elapsed(), Duration::from_millis(200));
}

#[tokio::test]
async fn each_bucket_tells_its_tokens_refilled_at_its_rate_up_to_its_burst() {
    let clock = FakeRelativeClock::default();
    let host = "registry.local:5000";
    let config = RateLimitConfig {
        global: Some(limit(5.0, 10)),
        per_host: vec![(host.into(), limit(1.0, 2))],
        mode: RateLimitMode::Fail,
    };
    let limits = Arc::new(RegistryLimits::new(&config, clock.clone(), Default::default()));
    let service = RateLimitLayer::new(limits.clone()).layer(upstream(Arc::default()));
    let tokens = |limits: &RegistryLimits<FakeRelativeClock>| -> Vec<(Option<String>, f64)> {
        limits.buckets().into_iter().map(|bucket| (bucket.host, bucket.tokens)).collect()
    };
    assert_eq!(tokens(&limits), [(None, 10.0), (Some(host.to_owned()), 2.0)], "full before any pull");
    for i in 0..3 {
        pull(&service, &format!("app:{i}")).await.expect("within the burst");
    }
    pull(&service, &format!("{host}/app:v1")).await.expect("within the burst");
    assert_eq!(tokens(&limits), [(None, 7.0), (Some(host.to_owned()), 1.0)]);
    clock.advance(Duration::from_millis(500));
    assert_eq!(tokens(&limits), [(None, 9.5), (Some(host.to_owned()), 1.5)], "refilled at 5 and 1 a second");
    clock.advance(Duration::from_secs(10));
    assert_eq!(tokens(&limits), [(None, 10.0), (Some(host.to_owned()), 2.0)], "never above the burst");
    assert_eq!(limits.mode(), RateLimitMode::Fail);
}

#[tokio::test]
async fn a_reload_keeps_the_tokens_of_an_unchanged_bucket_and_starts_a_changed_one_full() {
    let clock = FakeRelativeClock::default();
    let before = RateLimitConfig {
        global: Some(limit(1.0, 2)),
        per_host: vec![("registry.local:5000".into(), limit(1.0, 2))],
        mode: RateLimitMode::Fail,
    };
    let limits = Arc::new(RegistryLimits::new(&before, clock.clone(), Default::default()));
    let service = RateLimitLayer::new(limits.clone()).layer(upstream(Arc::new(AtomicUsize::new(0))));
    for image in ["app:1", "app:2", "registry.local:5000/app:1", "registry.local:5000/app:2"] {
        pull(&service, image).await.expect("within the bursts");
    }

    let after = RateLimitConfig {
        global: Some(limit(1.0, 2)),
        per_host: vec![("registry.local:5000".into(), limit(1.0, 3)), ("quay.io".into(), limit(1.0, 1))],
        mode: RateLimitMode::Fail,
    };
    limits.reconfigure(&after);
    assert!(pull(&service, "app:3").await.is_err(), "the unchanged bucket is still empty");
    for i in 3..6 {
        pull(&service, &format!("registry.local:5000/app:{i}")).await.expect("the changed bucket starts full");
    }
    pull(&service, "quay.io/app:1").await.expect("a new host's bucket");
    assert!(pull(&service, "quay.io/app:2").await.is_err(), "with its own burst");
    let hosts: Vec<Option<String>> = limits.buckets().into_iter().map(|bucket| bucket.host).collect();
    assert_eq!(hosts, [None, Some("quay.io".to_owned()), Some("registry.local:5000".to_owned())]);

    limits.reconfigure(&RateLimitConfig { mode: RateLimitMode::Wait, ..RateLimitConfig::default() });
    assert_eq!(limits.mode(), RateLimitMode::Wait);
    for i in 6..20 {
        pull(&service, &format!("app:{i}")).await.expect("no limit at all");
    }
}
