//! Cheapest first: pulls waiting for a slot take one smallest first, sized by their registry.

use super::*;

/// One slot, pulls of `duration` each, sized by `sizes`; yielding as `yield_above` says.
fn one_slot(
    sizes: &[(&'static str, u64)],
    duration: Duration,
    yield_above: Option<u64>,
) -> (Arc<Upstream>, Arc<ScriptedSizes>, PullScheduler) {
    let upstream = Upstream::slow(duration);
    let sizes = Arc::new(ScriptedSizes { sizes: sizes.iter().copied().collect(), ..Default::default() });
    let config = SchedulerConfig { max_parallel: NonZeroUsize::new(1), yield_above, ..Default::default() };
    let scheduler = PullScheduler::new(upstream.service(), config, Default::default());
    scheduler.size_with(sizes.clone());
    (upstream, sizes, scheduler)
}

const MIB: u64 = 1 << 20;

#[tokio::test(start_paused = true)]
async fn queued_pulls_take_the_slot_smallest_first_and_an_unsized_one_between_small_and_big() {
    let sized = [("big:v1", 1024 * MIB), ("mid:v1", 100 * MIB), ("small:v1", 2 * MIB)];
    let (upstream, sizes, scheduler) = one_slot(&sized, Duration::from_secs(1), Some(64 * MIB));
    let mut pulls = vec![pull_in_task(&scheduler, for_pod("first:v1", "u0"))];
    settle().await;
    // They come biggest first; "unknown:v1" is not sized (its registry says nothing).
    for (index, image) in ["big:v1", "mid:v1", "unknown:v1", "small:v1"].into_iter().enumerate() {
        pulls.push(pull_in_task(&scheduler, for_pod(image, &format!("u{}", index + 1))));
        settle().await;
    }
    for pull in pulls {
        pull.await.expect("a pull").result.expect("pulled");
    }
    let order = upstream.order.lock().unwrap().clone();
    assert_eq!(order, ["first:v1", "small:v1", "unknown:v1", "mid:v1", "big:v1"]);
    assert_eq!(sizes.reads.load(SeqCst), 5, "each read once: the four queued, and the running one beside them");
}

#[tokio::test(start_paused = true)]
async fn a_big_pull_that_has_waited_a_minute_goes_before_cheaper_ones_that_came_after() {
    // mid is cheaper than big, but not so much cheaper that big, once running, makes way for it.
    let sized = [("big:v1", 1024 * MIB), ("small:v1", 2 * MIB), ("mid:v1", 300 * MIB)];
    let (upstream, _, scheduler) = one_slot(&sized, Duration::from_secs(40), Some(64 * MIB));
    let first = pull_in_task(&scheduler, for_pod("first:v1", "u0"));
    settle().await;
    let big = pull_in_task(&scheduler, for_pod("big:v1", "u1"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let small = pull_in_task(&scheduler, for_pod("small:v1", "u2"));
    // small has the slot from 40 s to 80 s; mid comes at 45 s; big has waited a minute at 60 s.
    tokio::time::sleep(Duration::from_secs(44)).await;
    let mid = pull_in_task(&scheduler, for_pod("mid:v1", "u3"));
    for pull in [first, big, small, mid] {
        pull.await.expect("a pull").result.expect("pulled");
    }
    let order = upstream.order.lock().unwrap().clone();
    assert_eq!(order, ["first:v1", "small:v1", "big:v1", "mid:v1"]);
}

#[tokio::test(start_paused = true)]
async fn without_yielding_the_line_is_first_come_first_served_and_nothing_is_sized() {
    let sized = [("big:v1", 1024 * MIB), ("small:v1", 2 * MIB)];
    let (upstream, sizes, scheduler) = one_slot(&sized, Duration::from_secs(1), None);
    let mut pulls = Vec::new();
    for (index, image) in ["first:v1", "big:v1", "small:v1"].into_iter().enumerate() {
        pulls.push(pull_in_task(&scheduler, for_pod(image, &format!("u{index}"))));
        settle().await;
    }
    for pull in pulls {
        pull.await.expect("a pull").result.expect("pulled");
    }
    assert_eq!(*upstream.order.lock().unwrap(), ["first:v1", "big:v1", "small:v1"]);
    assert_eq!(sizes.reads.load(SeqCst), 0);
}
