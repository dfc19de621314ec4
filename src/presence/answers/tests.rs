use std::sync::Arc;

use super::*;
use crate::presence::tests::{STALENESS, proven_cache};

fn remember(cache: &PresenceCache, call: CriCall, request: &str, answer: &str) {
    let ticket = cache.answer_ticket().expect("watching, not strict");
    cache.remember_answer(ticket, call, request.as_bytes(), answer.as_bytes());
}

async fn recall(cache: &PresenceCache, call: CriCall, request: &str) -> Option<Bytes> {
    cache.recall_answer(call, &Bytes::copy_from_slice(request.as_bytes()), Instant::now()).await
}

#[tokio::test(start_paused = true)]
async fn an_answer_is_given_again_only_for_the_same_call_and_request_bytes() {
    let cache = proven_cache(STALENESS);
    remember(&cache, CriCall::ImageStatus, "app:v1", "present");
    remember(&cache, CriCall::ListImages, "", "two images");
    assert_eq!(recall(&cache, CriCall::ImageStatus, "app:v1").await.as_deref(), Some(&b"present"[..]));
    assert_eq!(recall(&cache, CriCall::ListImages, "").await.as_deref(), Some(&b"two images"[..]));
    assert_eq!(recall(&cache, CriCall::ImageStatus, "app:v2").await, None);
    assert_eq!(recall(&cache, CriCall::ListImages, "app:v1").await, None, "another call's question");
}

#[tokio::test(start_paused = true)]
async fn any_image_change_forgets_every_answer_and_voids_tickets_from_before_it() {
    let cache = proven_cache(STALENESS);
    remember(&cache, CriCall::ImageStatus, "app:v1", "absent");
    let asked_before = cache.answer_ticket().expect("ticket");
    let fs_ticket = cache.fs_info_ticket();
    cache.image_changed();
    assert_eq!(recall(&cache, CriCall::ImageStatus, "app:v1").await, None, "forgotten");
    cache.remember_answer(asked_before, CriCall::ImageStatus, b"app:v1", b"absent");
    cache.remember_fs_info(fs_ticket, b"full", Instant::now());
    assert_eq!(recall(&cache, CriCall::ImageStatus, "app:v1").await, None, "an answer from before is not kept");
    assert_eq!(cache.fs_info(Instant::now()), None);
    assert_eq!(cache.answers_len(), 0);
}

#[tokio::test(start_paused = true)]
async fn strict_mode_and_an_unwatched_runtime_remember_no_answer() {
    let strict = proven_cache(Duration::ZERO);
    assert_eq!(strict.answer_ticket(), None, "strict: every call asks the runtime");
    let unwatched = PresenceCache::new(Arc::default(), STALENESS);
    assert_eq!(unwatched.answer_ticket(), None);
}

#[tokio::test(start_paused = true)]
async fn an_answer_waits_for_a_proof_once_the_last_one_is_too_old_and_is_asked_again_without_one() {
    let cache = Arc::new(proven_cache(STALENESS));
    remember(&cache, CriCall::ListImages, "", "listed");
    tokio::time::advance(STALENESS * 2).await;
    let asked_at = Instant::now();
    let waiting = tokio::spawn({
        let cache = cache.clone();
        async move { cache.recall_answer(CriCall::ListImages, &Bytes::new(), asked_at).await }
    });
    cache.barrier_wanted().await;
    cache.proven_current_as_of(asked_at);
    assert_eq!(waiting.await.expect("task").as_deref(), Some(&b"listed"[..]), "proven, then answered");

    tokio::time::advance(STALENESS * 2).await;
    assert_eq!(recall(&cache, CriCall::ListImages, "").await, None, "no proof came: the runtime is asked");
}

#[tokio::test(start_paused = true)]
async fn answers_past_the_byte_bound_start_over_and_one_too_big_is_not_kept() {
    let cache = proven_cache(STALENESS);
    let half = "x".repeat(ANSWER_BYTES / 2);
    remember(&cache, CriCall::ListImages, "first", &half);
    remember(&cache, CriCall::ListImages, "second", &half);
    assert_eq!(recall(&cache, CriCall::ListImages, "first").await, None, "started over");
    assert!(recall(&cache, CriCall::ListImages, "second").await.is_some());
    remember(&cache, CriCall::ListImages, "huge", &"x".repeat(ANSWER_BYTES));
    assert_eq!(recall(&cache, CriCall::ListImages, "huge").await, None);
    assert_eq!(cache.answers_len(), 1, "the one kept before");
}

#[tokio::test(start_paused = true)]
async fn the_image_filesystem_snapshot_is_served_while_younger_than_its_age() {
    let cache = PresenceCache::new(Arc::default(), STALENESS).with_fs_info_max_age(Duration::from_secs(1));
    let asked_at = Instant::now();
    cache.remember_fs_info(cache.fs_info_ticket(), b"snapshot", asked_at);
    assert_eq!(cache.fs_info(asked_at + Duration::from_millis(999)).as_deref(), Some(&b"snapshot"[..]));
    assert_eq!(cache.fs_info(asked_at + Duration::from_secs(1)), None, "aged out");
    cache.image_changed();
    assert_eq!(cache.fs_info(asked_at), None, "a pull or removal since");

    let never = PresenceCache::new(Arc::default(), STALENESS).with_fs_info_max_age(Duration::ZERO);
    never.remember_fs_info(never.fs_info_ticket(), b"snapshot", asked_at);
    assert_eq!(never.fs_info(asked_at), None);
}
