use super::*;

fn spec(image: &str) -> ImageSpec {
    ImageSpec { image: image.into(), ..Default::default() }
}

fn present(id: &str) -> PresentImage {
    PresentImage { id: id.into(), size: 1, repo_digests: Vec::new() }
}

pub(super) const STALENESS: Duration = Duration::from_millis(100);

/// Watching, proven current now.
pub(super) fn proven_cache(max_staleness: Duration) -> PresenceCache {
    let cache = PresenceCache::new(Arc::default(), max_staleness);
    cache.set_watching(true);
    cache.proven_current_as_of(Instant::now());
    cache
}

fn remember(cache: &PresenceCache, image: &str) {
    cache.remember(cache.ticket().expect("watching"), &spec(image), present(image));
}

#[tokio::test(start_paused = true)]
async fn nothing_is_remembered_until_events_are_watched() {
    let cache = PresenceCache::new(Arc::default(), STALENESS);
    assert_eq!(cache.ticket(), None, "no ticket, so callers ask the runtime every time");
    cache.set_watching(true);
    cache.proven_current_as_of(Instant::now());
    remember(&cache, "busybox:1");
    assert_eq!(cache.lookup(&spec("busybox:1"), Instant::now()), Lookup::Fresh(present("busybox:1")));
}

#[tokio::test(start_paused = true)]
async fn any_image_event_forgets_every_image() {
    let cache = proven_cache(STALENESS);
    for image in ["busybox:1", "nginx:1"] {
        remember(&cache, image);
    }
    cache.image_changed();
    assert!(cache.is_empty());
    assert_eq!(cache.lookup(&spec("nginx:1"), Instant::now()), Lookup::Miss);
}

#[tokio::test(start_paused = true)]
async fn an_answer_asked_before_an_event_is_not_remembered_after_it() {
    let cache = proven_cache(STALENESS);
    let ticket = cache.ticket().expect("watching");
    // The image is deleted while the runtime's (now stale) answer is on its way.
    cache.image_changed();
    cache.remember(ticket, &spec("busybox:1"), present("sha256:a"));
    assert_eq!(cache.lookup(&spec("busybox:1"), Instant::now()), Lookup::Miss);
}

#[tokio::test(start_paused = true)]
async fn losing_the_event_stream_forgets_everything_and_stops_remembering() {
    let cache = proven_cache(STALENESS);
    let ticket = cache.ticket().expect("watching");
    cache.remember(ticket, &spec("busybox:1"), present("sha256:a"));
    cache.set_watching(false);
    assert!(cache.is_empty());
    assert_eq!(cache.ticket(), None);
    cache.remember(ticket, &spec("busybox:1"), present("sha256:a"));
    assert!(cache.is_empty(), "a ticket from before the loss is void");
}

#[tokio::test(start_paused = true)]
async fn runtime_handlers_are_told_apart() {
    let cache = proven_cache(STALENESS);
    let gvisor = ImageSpec { runtime_handler: "runsc".into(), ..spec("busybox:1") };
    cache.remember(cache.ticket().expect("watching"), &gvisor, present("sha256:a"));
    assert_eq!(cache.lookup(&spec("busybox:1"), Instant::now()), Lookup::Miss);
    assert_eq!(cache.lookup(&gvisor, Instant::now()), Lookup::Fresh(present("sha256:a")));
}

#[tokio::test(start_paused = true)]
async fn a_full_cache_starts_over_instead_of_growing() {
    let cache = proven_cache(STALENESS);
    for index in 0..=CAPACITY {
        remember(&cache, &format!("image-{index}:1"));
    }
    assert_eq!(cache.len(), 1, "the image after the full cache is the only one kept");
}

#[tokio::test(start_paused = true)]
async fn a_hit_is_trusted_only_while_the_last_proof_is_recent_enough() {
    let cache = proven_cache(STALENESS);
    remember(&cache, "busybox:1");
    let proven = Instant::now();
    assert_eq!(cache.lookup(&spec("busybox:1"), proven + STALENESS), Lookup::Fresh(present("busybox:1")));
    let later = proven + STALENESS + Duration::from_millis(1);
    assert_eq!(cache.lookup(&spec("busybox:1"), later), Lookup::Unproven, "too old a proof");
    cache.proven_current_as_of(later);
    assert_eq!(cache.lookup(&spec("busybox:1"), later), Lookup::Fresh(present("busybox:1")));
}

#[tokio::test(start_paused = true)]
async fn watched_but_never_proven_is_unproven() {
    let cache = PresenceCache::new(Arc::default(), STALENESS);
    cache.set_watching(true);
    remember(&cache, "busybox:1");
    assert_eq!(cache.lookup(&spec("busybox:1"), Instant::now()), Lookup::Unproven);
}

#[tokio::test(start_paused = true)]
async fn half_way_to_stale_a_hit_asks_for_a_new_proof_without_waiting_for_it() {
    let cache = proven_cache(STALENESS);
    remember(&cache, "busybox:1");
    let asked = async { cache.barrier_wanted().await };
    tokio::pin!(asked);
    assert!(futures_poll(&mut asked).is_pending(), "a fresh proof asks for nothing");
    let now = Instant::now() + STALENESS * 3 / 4;
    assert_eq!(cache.lookup(&spec("busybox:1"), now), Lookup::Fresh(present("busybox:1")));
    assert!(futures_poll(&mut asked).is_ready(), "a barrier was asked for");
}

#[tokio::test(start_paused = true)]
async fn strict_mode_proves_every_hit_with_a_barrier_started_after_it() {
    let cache = Arc::new(proven_cache(Duration::ZERO));
    remember(&cache, "busybox:1");
    tokio::time::advance(Duration::from_millis(1)).await;
    let asked_at = Instant::now();
    assert_eq!(cache.lookup(&spec("busybox:1"), asked_at), Lookup::Unproven);

    let waiting = tokio::spawn({
        let cache = cache.clone();
        async move { cache.prove_current_since(asked_at).await }
    });
    cache.barrier_wanted().await;
    // A barrier that started before the question does not prove it.
    cache.proven_current_as_of(asked_at - Duration::from_micros(1));
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    cache.proven_current_as_of(asked_at);
    assert!(waiting.await.expect("task"), "proven by the barrier that started after the question");
    assert_eq!(cache.lookup(&spec("busybox:1"), asked_at), Lookup::Fresh(present("busybox:1")));
}

#[tokio::test(start_paused = true)]
async fn without_a_proof_in_time_or_with_the_stream_lost_the_runtime_is_asked() {
    let cache = Arc::new(proven_cache(Duration::ZERO));
    let since = Instant::now() + Duration::from_millis(1);
    assert!(!cache.prove_current_since(since).await, "no watcher answers: gives up after PROOF_WAIT");

    let waiting = tokio::spawn({
        let cache = cache.clone();
        async move { cache.prove_current_since(since).await }
    });
    tokio::task::yield_now().await;
    cache.set_watching(false);
    assert!(!waiting.await.expect("task"), "the stream was lost");
}

/// Polls a future once.
fn futures_poll<F: std::future::Future>(future: &mut std::pin::Pin<&mut F>) -> std::task::Poll<F::Output> {
    let waker = std::task::Waker::noop();
    future.as_mut().poll(&mut std::task::Context::from_waker(waker))
}
