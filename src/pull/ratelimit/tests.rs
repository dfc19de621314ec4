use std::sync::atomic::{AtomicUsize, Ordering};

use crate::cri::ImageSpec;

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

fn limits(config: &RateLimitConfig) -> Arc<RegistryLimits> {
    Arc::new(RegistryLimits::new(config, Default::default(), Arc::default()))
}

async fn pull<S>(service: &S, image: &str) -> Result<Pulled, PullError>
where
    S: Service<Pull, Response = Pulled, Error = PullError> + Clone,
{
    service.clone().oneshot(spec(image)).await
}

#[tokio::test(start_paused = true)]
async fn the_burst_passes_and_the_next_pull_fails_with_the_kubelets_words() {
    let config = RateLimitConfig { each_host: Some(limit(5.0, 10)), ..Default::default() };
    let limits = limits(&config);
    let calls = Arc::new(AtomicUsize::new(0));
    let service = RateLimitLayer::new(limits.clone()).layer(upstream(calls.clone()));

    for i in 0..10 {
        pull(&service, &format!("app:{i}")).await.expect("within the burst");
    }
    let refused = pull(&service, "app:11").await.expect_err("over the burst");
    assert_eq!(refused.to_string(), "pull QPS exceeded");
    assert_eq!(calls.load(Ordering::SeqCst), 10, "the refused pull never reached upstream");
    assert_eq!(limits.metrics.throttled_total(), 1);

    tokio::time::advance(Duration::from_millis(200)).await; // one token at 5 QPS
    pull(&service, "app:12").await.expect("a token freed up");
    assert!(pull(&service, "app:13").await.is_err(), "and only one");
}

#[tokio::test(start_paused = true)]
async fn each_registry_spends_a_bucket_of_its_own_so_a_busy_one_refuses_none_of_the_others_pulls() {
    let config = RateLimitConfig { each_host: Some(limit(5.0, 10)), ..Default::default() };
    let limits = limits(&config);
    let calls = Arc::new(AtomicUsize::new(0));
    let service = RateLimitLayer::new(limits.clone()).layer(upstream(calls.clone()));

    // Ten pulls to a registry that hangs take its whole burst...
    for i in 0..10 {
        pull(&service, &format!("hung.test/app-{i}:1")).await.expect("within the burst");
    }
    assert!(pull(&service, "hung.test/app-10:1").await.is_err(), "its eleventh is over the limit");
    // ...and another registry's ten pods are each pulled.
    for i in 0..10 {
        pull(&service, &format!("healthy.test/app-{i}:1")).await.expect("a bucket of its own");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 20);
}

#[tokio::test(start_paused = true)]
async fn hosts_past_the_bound_share_one_bucket_instead_of_growing_the_map() {
    let config = RateLimitConfig { each_host: Some(limit(1.0, 1)), ..Default::default() };
    let limits = limits(&config);
    let service = RateLimitLayer::new(limits.clone()).layer(upstream(Arc::default()));
    for i in 0..MAX_HOSTS {
        pull(&service, &format!("host-{i}.test/app:1")).await.expect("a bucket of its own");
    }
    pull(&service, "one-more.test/app:1").await.expect("the shared bucket's token");
    assert!(pull(&service, "and-another.test/app:1").await.is_err(), "the shared bucket is spent");
    assert_eq!(limits.buckets().len(), MAX_HOSTS + 1, "each host bucket, and the shared one");
}

#[tokio::test(start_paused = true)]
async fn a_host_with_its_own_bucket_is_independent_of_the_others() {
    let config = RateLimitConfig {
        each_host: Some(limit(1.0, 1)),
        per_host: vec![("registry.local:5000".into(), limit(1.0, 2))],
        mode: RateLimitMode::Fail,
        ..Default::default()
    };
    let limits = limits(&config);
    let service = RateLimitLayer::new(limits).layer(upstream(Arc::new(AtomicUsize::new(0))));

    pull(&service, "busybox:1").await.expect("docker.io's bucket of the default limit");
    assert!(pull(&service, "busybox:2").await.is_err(), "docker.io's bucket is empty");
    pull(&service, "quay.io/app:1").await.expect("quay.io's bucket of the default limit");
    pull(&service, "registry.local:5000/app:1").await.expect("its own bucket");
    pull(&service, "registry.local:5000/app:2").await.expect("burst of two");
    assert!(pull(&service, "registry.local:5000/app:3").await.is_err(), "its own bucket is empty too");
}

#[tokio::test(start_paused = true)]
async fn wait_mode_admits_pulls_at_the_configured_rate() {
    let config = RateLimitConfig { each_host: Some(limit(5.0, 1)), mode: RateLimitMode::Wait, ..Default::default() };
    let limits = limits(&config);
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
    let config = RateLimitConfig { each_host: Some(limit(5.0, 1)), mode: RateLimitMode::Fail, ..Default::default() };
    let limits = limits(&config);
    let service = RateLimitLayer::new(limits).layer(upstream(Arc::new(AtomicUsize::new(0))));
    let cri_spec = |image: &str| Pull { wait_for_rate_limit: true, ..spec(image) };

    let started = tokio::time::Instant::now();
    service.clone().oneshot(cri_spec("app:1")).await.expect("the burst");
    assert!(pull(&service, "app:2").await.is_err(), "an EnsureImageExists pull fails over the limit");
    service.clone().oneshot(cri_spec("app:3")).await.expect("a CRI pull waits instead");
    assert_eq!(started.elapsed(), Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn each_bucket_tells_its_tokens_refilled_at_its_rate_up_to_its_burst() {
    let host = "registry.local:5000";
    let config = RateLimitConfig {
        each_host: Some(limit(5.0, 10)),
        per_host: vec![(host.into(), limit(1.0, 2))],
        mode: RateLimitMode::Fail,
        ..Default::default()
    };
    let limits = limits(&config);
    let service = RateLimitLayer::new(limits.clone()).layer(upstream(Arc::default()));
    let tokens = |limits: &RegistryLimits| -> Vec<(Option<String>, f64)> {
        limits.buckets().into_iter().map(|bucket| (bucket.host, bucket.tokens)).collect()
    };
    assert_eq!(tokens(&limits), [(None, 10.0), (Some(host.to_owned()), 2.0)], "full before any pull");
    for i in 0..3 {
        pull(&service, &format!("app:{i}")).await.expect("within the burst");
    }
    pull(&service, &format!("{host}/app:v1")).await.expect("within the burst");
    let hub = Some("docker.io".to_owned());
    assert_eq!(
        tokens(&limits),
        [(None, 10.0), (hub.clone(), 7.0), (Some(host.to_owned()), 1.0)],
        "Docker Hub's pulls got a bucket of their own"
    );
    tokio::time::advance(Duration::from_millis(500)).await;
    assert_eq!(
        tokens(&limits),
        [(None, 10.0), (hub.clone(), 9.5), (Some(host.to_owned()), 1.5)],
        "refilled at 5 and 1 a second"
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(tokens(&limits), [(None, 10.0), (hub, 10.0), (Some(host.to_owned()), 2.0)], "never above the burst");
    assert_eq!(limits.mode(), RateLimitMode::Fail);
}

#[tokio::test(start_paused = true)]
async fn a_reload_keeps_the_tokens_of_an_unchanged_bucket_and_starts_a_changed_one_full() {
    let before = RateLimitConfig {
        each_host: Some(limit(1.0, 2)),
        per_host: vec![("registry.local:5000".into(), limit(1.0, 2))],
        mode: RateLimitMode::Fail,
        ..Default::default()
    };
    let limits = limits(&before);
    let service = RateLimitLayer::new(limits.clone()).layer(upstream(Arc::new(AtomicUsize::new(0))));
    for image in ["app:1", "app:2", "registry.local:5000/app:1", "registry.local:5000/app:2"] {
        pull(&service, image).await.expect("within the bursts");
    }

    let after = RateLimitConfig {
        each_host: Some(limit(1.0, 2)),
        per_host: vec![("registry.local:5000".into(), limit(1.0, 3)), ("quay.io".into(), limit(1.0, 1))],
        mode: RateLimitMode::Fail,
        ..Default::default()
    };
    limits.reconfigure(&after);
    assert!(pull(&service, "app:3").await.is_err(), "the unchanged bucket is still empty");
    for i in 3..6 {
        pull(&service, &format!("registry.local:5000/app:{i}")).await.expect("the changed bucket starts full");
    }
    pull(&service, "quay.io/app:1").await.expect("a new host's bucket");
    assert!(pull(&service, "quay.io/app:2").await.is_err(), "with its own burst");
    let hosts: Vec<Option<String>> = limits.buckets().into_iter().map(|bucket| bucket.host).collect();
    let hosts_now =
        [None, Some("docker.io".to_owned()), Some("quay.io".to_owned()), Some("registry.local:5000".to_owned())];
    assert_eq!(hosts, hosts_now);

    limits.reconfigure(&RateLimitConfig { mode: RateLimitMode::Wait, ..RateLimitConfig::default() });
    assert_eq!(limits.mode(), RateLimitMode::Wait);
    for i in 6..20 {
        pull(&service, &format!("app:{i}")).await.expect("no limit at all");
    }
}

/// An upstream where `hub.test` answers 429 while `limited` is set; counts what reached it.
fn answering_429(
    calls: Arc<AtomicUsize>,
    limited: Arc<std::sync::atomic::AtomicBool>,
) -> impl Service<Pull, Response = Pulled, Error = PullError, Future: Send> + Clone {
    tower::service_fn(move |spec: Pull| {
        calls.fetch_add(1, Ordering::SeqCst);
        let limited = limited.load(Ordering::SeqCst) && spec.spec.image.image.starts_with("hub.test/");
        async move {
            if limited {
                let message = "failed to copy: httpReadSeeker: failed open: unexpected status code https://hub.test/v2/a/manifests/1: 429 Too Many Requests - Server message: toomanyrequests: You have reached your pull rate limit";
                return Err(PullError::Runtime(crate::runtime::RuntimeError::Status(tonic::Status::unknown(message))));
            }
            Ok(Pulled { image_ref: spec.spec.image.image, image_size: 1, pull_duration: Duration::ZERO })
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_registry_answering_429_gets_half_the_rate_each_time_down_to_the_floor_and_the_others_keep_theirs() {
    let adaptive = AdaptiveConfig { floor: 0.5, recovery: Duration::from_secs(30) };
    let config = RateLimitConfig { each_host: Some(limit(4.0, 10)), adaptive, ..Default::default() };
    let limits = limits(&config);
    let (calls, limited) = (Arc::new(AtomicUsize::new(0)), Arc::new(std::sync::atomic::AtomicBool::new(true)));
    let service = RateLimitLayer::new(limits.clone()).layer(answering_429(calls.clone(), limited.clone()));

    let refused = pull(&service, "hub.test/a:1").await.expect_err("429");
    assert!(refused.to_string().contains("toomanyrequests"), "the registry's answer reaches the caller: {refused}");
    let hub = |limits: &RegistryLimits| {
        limits.buckets().into_iter().find(|bucket| bucket.host.as_deref() == Some("hub.test"))
    };
    let lowered = hub(&limits).expect("the registry has a bucket of its own now");
    assert_eq!((lowered.limit.qps, lowered.limit.burst.get()), (2.0, 1));
    assert_eq!(lowered.lowered_from, Some(limit(4.0, 10)));
    assert_eq!(limits.metrics.throttled_total(), 0);

    // Its next pull waits for the lowered rate's token; every other registry keeps the default bucket.
    assert_eq!(
        pull(&service, "hub.test/a:2").await.expect_err("over the lowered rate").to_string(),
        "pull QPS exceeded"
    );
    for i in 0..5 {
        pull(&service, &format!("quay.test/b:{i}")).await.expect("through the default bucket");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 6, "the lowered registry's second pull never reached it");
    let mut rates = Vec::new();
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(4)).await;
        pull(&service, "hub.test/a:3").await.expect_err("429 again");
        rates.push(hub(&limits).expect("lowered").limit.qps);
    }
    assert_eq!(rates, [1.0, 0.5, 0.5], "halved each time, never below the floor");
}

#[tokio::test(start_paused = true)]
async fn the_rate_recovers_a_tenth_a_quiet_period_and_the_registry_is_forgotten_once_back() {
    let adaptive = AdaptiveConfig { floor: 0.1, recovery: Duration::from_secs(30) };
    let config = RateLimitConfig { each_host: Some(limit(4.0, 10)), adaptive, ..Default::default() };
    let limits = limits(&config);
    let (calls, limited) = (Arc::new(AtomicUsize::new(0)), Arc::new(std::sync::atomic::AtomicBool::new(true)));
    let service = RateLimitLayer::new(limits.clone()).layer(answering_429(calls.clone(), limited.clone()));
    pull(&service, "hub.test/a:1").await.expect_err("429");
    limited.store(false, Ordering::SeqCst);
    let qps = |limits: &RegistryLimits| {
        limits
            .buckets()
            .into_iter()
            .find(|bucket| bucket.host.as_deref() == Some("hub.test") && bucket.lowered_from.is_some())
            .map(|bucket| bucket.limit.qps)
    };
    tokio::time::advance(Duration::from_secs(60)).await;
    let recovering = qps(&limits).expect("still lowered");
    assert!((recovering - 2.8).abs() < 1e-9, "two steps of 0.4 after 60 s: {recovering}");
    pull(&service, "hub.test/a:2").await.expect("the registry answers again");
    tokio::time::advance(Duration::from_secs(90)).await;
    assert_eq!(qps(&limits), None, "back to its bucket of the default limit");
    for i in 0..10 {
        pull(&service, &format!("hub.test/a:{i}")).await.expect("the whole burst again");
    }
}

#[tokio::test(start_paused = true)]
async fn a_registry_without_a_limit_that_answers_429_gets_one() {
    let config = RateLimitConfig { each_host: None, ..Default::default() };
    let limits = limits(&config);
    let limited = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let service = RateLimitLayer::new(limits.clone()).layer(answering_429(Arc::default(), limited));
    pull(&service, "hub.test/a:1").await.expect_err("429");
    let buckets = limits.buckets();
    assert_eq!(buckets.len(), 1, "no default bucket, one for the registry: {buckets:?}");
    assert_eq!(buckets[0].limit.qps, 2.5, "half the kubelet's 5 a second");
    for i in 0..20 {
        pull(&service, &format!("other.test/a:{i}")).await.expect("the others are still unlimited");
    }
}
