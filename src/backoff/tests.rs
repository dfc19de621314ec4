use std::sync::Arc;

use super::*;

const POD: &str = "0b7c6d5e-pod-uid";
const IMAGE: &str = "busybox:latest";

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn error(text: &str) -> Arc<str> {
    Arc::from(text)
}

fn store() -> BackoffStore<Arc<str>> {
    BackoffStore::new(BackoffConfig::KUBELET)
}

/// The key of `pod` and the test image.
fn pod(store: &BackoffStore<Arc<str>>, pod: &str) -> BackoffKey {
    store.key(pod, IMAGE, "")
}

#[tokio::test(start_paused = true)]
async fn backoff_doubles_from_ten_seconds_until_the_five_minute_cap() {
    let mut store = store();
    let delays: Vec<u64> =
        (0..8).map(|_| store.record_failure(pod(&store, POD), error("boom"), Instant::now()).as_secs()).collect();
    assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
}

#[tokio::test(start_paused = true)]
async fn a_key_is_refused_until_its_delay_runs_out_with_the_time_left() {
    let mut store = store();
    store.record_failure(pod(&store, POD), error("manifest unknown"), Instant::now());
    tokio::time::advance(secs(4)).await;
    let refusal = store.check(pod(&store, POD), Instant::now()).expect("inside the 10s window");
    assert_eq!(refusal.remaining, secs(6));
    assert_eq!(&*refusal.last_error, "manifest unknown");
    tokio::time::advance(secs(6)).await;
    assert_eq!(store.check(pod(&store, POD), Instant::now()), None, "the window is over");
}

#[tokio::test(start_paused = true)]
async fn other_pods_and_images_are_not_affected() {
    let mut store = store();
    store.record_failure(pod(&store, POD), error("boom"), Instant::now());
    assert!(store.check(pod(&store, "other-pod"), Instant::now()).is_none());
    assert!(store.check(store.key(POD, "nginx:latest", ""), Instant::now()).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_failure_after_twice_the_max_starts_over_at_the_initial_delay() {
    let mut store = store();
    for _ in 0..4 {
        store.record_failure(pod(&store, POD), error("boom"), Instant::now());
    }
    tokio::time::advance(secs(601)).await;
    assert_eq!(store.record_failure(pod(&store, POD), error("boom"), Instant::now()), secs(10));
}

#[tokio::test(start_paused = true)]
async fn a_failure_within_twice_the_max_keeps_doubling() {
    let mut store = store();
    store.record_failure(pod(&store, POD), error("boom"), Instant::now());
    tokio::time::advance(secs(600)).await;
    assert_eq!(store.record_failure(pod(&store, POD), error("boom"), Instant::now()), secs(20));
}

#[tokio::test(start_paused = true)]
async fn entries_not_updated_for_twice_the_max_are_collected() {
    let mut store = store();
    store.record_failure(pod(&store, "old_a:1"), error("boom"), Instant::now());
    tokio::time::advance(secs(300)).await;
    store.record_failure(pod(&store, "young_a:1"), error("boom"), Instant::now());
    tokio::time::advance(secs(301)).await;
    store.gc(Instant::now());
    assert_eq!(store.len(), 1, "only the entry updated 301s ago is kept");
    assert!(store.check(pod(&store, "old_a:1"), Instant::now()).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_full_store_evicts_the_stalest_entry_first() {
    let mut store: BackoffStore<Arc<str>> =
        BackoffStore::new(BackoffConfig::try_new(secs(10), secs(300), 3).expect("valid"));
    for key in ["a", "b", "c"] {
        store.record_failure(pod(&store, key), error("boom"), Instant::now());
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    // "a" is updated again, so "b" is now the stalest.
    store.record_failure(pod(&store, "a"), error("boom"), Instant::now());
    store.record_failure(pod(&store, "d"), error("boom"), Instant::now());
    assert_eq!(store.len(), 3);
    assert!(store.check(pod(&store, "b"), Instant::now()).is_none(), "b was evicted");
    for kept in ["a", "c", "d"] {
        assert!(store.check(pod(&store, kept), Instant::now()).is_some(), "{kept} is kept");
    }
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_distinct_pods_stays_within_the_capacity() {
    let mut store: BackoffStore<Arc<str>> =
        BackoffStore::new(BackoffConfig::try_new(secs(10), secs(300), 1_000).expect("valid"));
    let shared = error("pull QPS exceeded");
    for index in 0..10_000 {
        store.record_failure(pod(&store, &format!("pod-{index}")), shared.clone(), Instant::now());
    }
    assert_eq!(store.len(), 1_000);
    assert!(store.check(pod(&store, "pod-9999"), Instant::now()).is_some());
    assert!(store.check(pod(&store, "pod-0"), Instant::now()).is_none());
}

#[test]
fn keys_tell_pods_and_images_apart_even_where_the_kubelet_string_would_not() {
    let store = store();
    assert_eq!(store.key("pod-a", "busybox:1", ""), store.key("pod-a", "busybox:1", ""));
    assert_ne!(store.key("pod-a", "busybox:1", ""), store.key("pod-b", "busybox:1", ""));
    assert_ne!(store.key("pod-a", "busybox:1", ""), store.key("pod-a", "busybox:2", ""));
    // "{uid}_{image}" is the same string for both; the pairs are not the same.
    assert_ne!(store.key("a_b", "c", ""), store.key("a", "b_c", ""));
}

#[test]
fn keys_of_one_store_do_not_repeat_those_of_another() {
    // Each store keys its hash at random, so a caller cannot aim a collision at another pod.
    assert_ne!(store().key(POD, IMAGE, ""), store().key(POD, IMAGE, ""));
}

#[test]
fn configurations_that_cannot_work_are_refused() {
    assert_eq!(
        BackoffConfig::try_new(secs(301), secs(300), 10),
        Err(BackoffConfigError::InitialAboveMax { initial: secs(301), max: secs(300) })
    );
    assert_eq!(BackoffConfig::try_new(secs(1), secs(300), 0), Err(BackoffConfigError::ZeroCapacity));
}

#[test]
fn a_new_configuration_grows_the_next_delays_and_a_smaller_capacity_forgets_the_stalest() {
    let now = Instant::now();
    let mut store = BackoffStore::new(BackoffConfig::KUBELET);
    let keys: Vec<BackoffKey> = (0..3).map(|pod| store.key(&format!("pod-{pod}"), "app:1", "")).collect();
    for (i, key) in keys.iter().enumerate() {
        store.record_failure(*key, "failed", now + Duration::from_secs(i as u64));
    }
    let faster = BackoffConfig::try_new(Duration::from_secs(1), Duration::from_secs(4), 2).expect("valid");
    store.set_config(faster);
    assert_eq!(store.len(), 2, "down to the new capacity");
    assert!(store.check(keys[0], now + Duration::from_secs(3)).is_none(), "the stalest went");
    let later = now + Duration::from_secs(3);
    assert_eq!(
        store.record_failure(keys[2], "failed", later),
        Duration::from_secs(4),
        "doubling is capped by the new max"
    );
    let fresh = store.key("pod-new", "app:1", "");
    assert_eq!(
        store.record_failure(fresh, "failed", later),
        Duration::from_secs(1),
        "a new entry starts at the new initial"
    );
}

fn named(uid: &str, image: &str) -> BackoffName {
    BackoffName {
        namespace: "default".into(),
        name: format!("pod-{uid}"),
        uid: uid.into(),
        image: image.into(),
        runtime_handler: String::new(),
    }
}

/// Records a failure of `uid`'s pulls of `image`, named.
fn fail_named(store: &mut BackoffStore<Arc<str>>, uid: &str, image: &str, error_text: &str) -> BackoffKey {
    let key = store.key(uid, image, "");
    store.record_failure(key, error(error_text), Instant::now());
    store.name(key, named(uid, image));
    key
}

#[tokio::test(start_paused = true)]
async fn removing_a_pair_forgets_it_and_only_it() {
    let mut store = store();
    let gone = fail_named(&mut store, "u1", IMAGE, "boom");
    let kept = fail_named(&mut store, "u2", IMAGE, "boom");
    assert!(store.remove(gone), "it was held");
    assert_eq!(store.check(gone, Instant::now()), None, "its next pull is tried at once");
    assert!(store.check(kept, Instant::now()).is_some(), "another pod's pair still backs off");
    assert_eq!((store.len(), store.backing_off(Instant::now()).len()), (1, 1), "its name went with it");
    assert!(!store.remove(gone), "nothing left to forget");
    // Failing again starts over, at the initial delay.
    assert_eq!(store.record_failure(gone, error("boom"), Instant::now()), secs(10));
}

#[tokio::test(start_paused = true)]
async fn clearing_forgets_every_pair_named_or_not() {
    let mut store = store();
    fail_named(&mut store, "u1", IMAGE, "boom");
    store.record_failure(store.key("unnamed", IMAGE, ""), error("boom"), Instant::now());
    assert_eq!(store.clear(), 2);
    assert!(store.is_empty() && store.backing_off(Instant::now()).is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_named_pairs_backing_off_are_listed_soonest_retry_first() {
    let mut store = store();
    let twice = fail_named(&mut store, "u1", "app:1", "manifest unknown");
    store.record_failure(twice, error("manifest unknown"), Instant::now());
    tokio::time::advance(secs(5)).await;
    fail_named(&mut store, "u2", "app:2", "unauthorized");
    store.record_failure(store.key("unnamed", IMAGE, ""), error("boom"), Instant::now());
    let listed: Vec<(String, u64, u64, String)> = store
        .backing_off(Instant::now())
        .into_iter()
        .map(|entry| (entry.name.uid, entry.remaining.as_secs(), entry.delay.as_secs(), entry.last_error.to_string()))
        .collect();
    assert_eq!(
        listed,
        [("u2".into(), 10, 10, "unauthorized".into()), ("u1".into(), 15, 20, "manifest unknown".into())],
        "an unnamed pair is not listed"
    );
    tokio::time::advance(secs(11)).await;
    let left: Vec<String> = store.backing_off(Instant::now()).into_iter().map(|entry| entry.name.uid).collect();
    assert_eq!(left, ["u1"], "a pair whose delay ran out is not backing off");
    assert_eq!(store.len(), 3, "though the store still holds it");
}

#[tokio::test(start_paused = true)]
async fn only_the_newest_names_are_kept_and_a_name_too_long_is_not() {
    let mut store = store();
    for n in 0..NAMED_MOST + 10 {
        fail_named(&mut store, &format!("u{n}"), IMAGE, "boom");
    }
    assert_eq!(store.backing_off(Instant::now()).len(), NAMED_MOST);
    assert_eq!(store.name_of(store.key("u0", IMAGE, "")), None, "the oldest name went");
    assert!(store.name_of(store.key(&format!("u{}", NAMED_MOST + 9), IMAGE, "")).is_some());
    assert_eq!(store.len(), NAMED_MOST + 10, "every pair still backs off");
    let huge = "x".repeat(NAME_BYTES_MOST);
    let key = fail_named(&mut store, &huge, IMAGE, "boom");
    assert_eq!(store.name_of(key), None);
    assert!(store.check(key, Instant::now()).is_some(), "it backs off all the same");
}

#[tokio::test(start_paused = true)]
async fn an_evicted_pair_loses_its_name() {
    let mut store: BackoffStore<Arc<str>> =
        BackoffStore::new(BackoffConfig::try_new(secs(10), secs(300), 2).expect("valid"));
    let first = fail_named(&mut store, "u1", IMAGE, "boom");
    fail_named(&mut store, "u2", IMAGE, "boom");
    fail_named(&mut store, "u3", IMAGE, "boom");
    assert_eq!(store.name_of(first), None);
    let listed: Vec<String> = store.backing_off(Instant::now()).into_iter().map(|entry| entry.name.uid).collect();
    assert_eq!(listed, ["u2", "u3"]);
    let unknown = store.key("never-failed", IMAGE, "");
    store.name(unknown, named("never-failed", IMAGE));
    assert_eq!(store.name_of(unknown), None, "only a pair the store holds is named");
}
