use std::time::Duration;

use bytes::Buf;

use super::*;
use crate::events::{EventType, Pod, reason};

fn event(n: usize, pod_uid: &str) -> Event {
    let pod = Pod { namespace: "default".into(), name: format!("pod-{pod_uid}"), uid: pod_uid.into() };
    Event {
        pod: Some(pod),
        image: "busybox:1.36".into(),
        ..Event::new(EventType::Normal, reason::PULLING, format!("event {n}"))
    }
}

/// The events in `frames`, as a gRPC client reads them.
fn decode(mut frames: Bytes) -> Vec<api::Event> {
    let mut events = Vec::new();
    while frames.has_remaining() {
        assert_eq!(frames.get_u8(), 0, "uncompressed");
        let length = frames.get_u32() as usize;
        events.push(api::Event::decode(frames.split_to(length)).expect("an Event message"));
    }
    events
}

fn messages(events: &[api::Event]) -> Vec<&str> {
    events.iter().map(|event| event.message.as_str()).collect()
}

async fn next(watcher: &mut Watcher) -> Bytes {
    tokio::time::timeout(Duration::from_secs(1), watcher.next()).await.expect("a batch in time").expect("a batch")
}

fn setup() -> (Arc<Events>, Arc<Batches>) {
    setup_buffering(SUBSCRIBER_BUFFER)
}

/// Events whose subscribers (the batcher) fall behind after `buffer` unread events.
fn setup_buffering(buffer: usize) -> (Arc<Events>, Arc<Batches>) {
    let events = Arc::new(Events::with_buffer(buffer));
    let batches = Batches::new(events.clone());
    (events, batches)
}

/// Events numbered `numbers`, in order: even ones for pod u1, odd ones for u2.
fn publish_alternating(events: &Events, numbers: Range<usize>) {
    for n in numbers {
        events.publish(event(n, if n % 2 == 0 { "u1" } else { "u2" }));
    }
}

/// How many events the one `Lagged` event in `frames` says were lost.
fn lagged_by(frames: Bytes) -> u64 {
    match decode(frames).as_slice() {
        [told] if told.reason == reason::LAGGED => told.dropped,
        other => panic!("one Lagged event, not {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn events_within_the_linger_go_to_every_watcher_of_everything_as_one_shared_batch() {
    let (events, batches) = setup();
    let (mut first, mut second) = (batches.watch(Filter::default()), batches.watch(Filter::default()));
    let started = Instant::now();
    for n in 0..3 {
        events.publish(event(n, "u1"));
    }
    let (one, other) = (next(&mut first).await, next(&mut second).await);
    assert_eq!(started.elapsed(), EVENT_LINGER, "sealed a linger after its first event");
    assert_eq!(messages(&decode(one.clone())), ["event 0", "event 1", "event 2"]);
    assert_eq!(one.as_ptr(), other.as_ptr(), "both watchers send the same bytes, not copies");
}

#[tokio::test(start_paused = true)]
async fn a_batch_closes_a_linger_after_its_first_event_and_the_next_event_opens_another() {
    let (events, batches) = setup();
    let mut watcher = batches.watch(Filter::default());
    events.publish(event(0, "u1"));
    tokio::time::sleep(EVENT_LINGER / 2).await;
    events.publish(event(1, "u1"));
    tokio::time::sleep(EVENT_LINGER).await;
    events.publish(event(2, "u1"));
    assert_eq!(messages(&decode(next(&mut watcher).await)), ["event 0", "event 1"]);
    assert_eq!(messages(&decode(next(&mut watcher).await)), ["event 2"]);
}

#[tokio::test(start_paused = true)]
async fn a_full_batch_is_sealed_at_once() {
    let (events, batches) = setup();
    let mut watcher = batches.watch(Filter::default());
    let started = Instant::now();
    let message = "x".repeat(1024);
    for n in 0..BATCH_BYTES / 1024 + 8 {
        events.publish(Event { message: format!("{n} {message}"), ..event(n, "u1") });
    }
    let full = next(&mut watcher).await;
    assert_eq!(started.elapsed(), Duration::ZERO, "no linger for a full batch");
    assert!(full.len() >= BATCH_BYTES && full.len() < BATCH_BYTES + 2048, "{} bytes", full.len());
    let rest = next(&mut watcher).await;
    assert_eq!(decode(full).len() + decode(rest).len(), BATCH_BYTES / 1024 + 8, "every event, once");
}

#[tokio::test(start_paused = true)]
async fn a_filtered_watcher_is_sent_only_what_it_matches() {
    let (events, batches) = setup();
    let mut u1 = batches.watch(Filter { pod_uid: "u1".into(), ..Filter::default() });
    let mut u2 = batches.watch(Filter { pod_uid: "u2".into(), ..Filter::default() });
    let mut nobody = batches.watch(Filter { namespace: "kube-system".into(), ..Filter::default() });
    for (n, pod) in ["u1", "u2", "u1", "u1"].into_iter().enumerate() {
        events.publish(event(n, pod));
    }
    assert_eq!(messages(&decode(next(&mut u1).await)), ["event 0", "event 2", "event 3"]);
    assert_eq!(messages(&decode(next(&mut u2).await)), ["event 1"]);
    let nothing = tokio::time::timeout(Duration::from_secs(1), nobody.next()).await;
    assert!(nothing.is_err(), "a watcher whose filter matches nothing is sent nothing");
}

#[tokio::test(start_paused = true)]
async fn a_watcher_is_not_sent_what_was_published_before_it_came() {
    let (events, batches) = setup();
    let mut early = batches.watch(Filter::default());
    events.publish(event(0, "u1"));
    // The batch holding event 0 is still open when the late watcher comes.
    let mut late = batches.watch(Filter::default());
    events.publish(event(1, "u1"));
    assert_eq!(messages(&decode(next(&mut early).await)), ["event 0", "event 1"]);
    assert_eq!(messages(&decode(next(&mut late).await)), ["event 1"]);
}

#[tokio::test(start_paused = true)]
async fn a_watcher_far_behind_is_told_once_how_many_it_lost_then_reads_the_newest() {
    let (events, batches) = setup();
    let mut slow = batches.watch(Filter::default());
    let published = SUBSCRIBER_BUFFER * 2;
    for burst in 0..published / 256 {
        for n in 0..256 {
            events.publish(event(burst * 256 + n, "u1"));
        }
        tokio::time::sleep(EVENT_LINGER * 2).await;
    }
    let mut read = Vec::new();
    while let Ok(frames) = tokio::time::timeout(Duration::from_secs(1), slow.next()).await {
        read.extend(decode(frames.expect("a batch")));
    }
    let lagged: Vec<&api::Event> = read.iter().filter(|event| event.reason == reason::LAGGED).collect();
    assert_eq!(lagged.len(), 1, "told once");
    assert_eq!(read[0].reason, reason::LAGGED, "before anything newer");
    let kept = &read[1..];
    assert!(kept.len() >= SUBSCRIBER_BUFFER, "the ring's worth is kept: {}", kept.len());
    assert_eq!(lagged[0].dropped as usize + kept.len(), published, "each event read or counted lost");
    assert_eq!(kept.last().map(|event| event.message.as_str()), Some(format!("event {}", published - 1).as_str()));
}

#[tokio::test(start_paused = true)]
async fn the_batcher_stops_with_the_last_watcher_and_starts_again_with_the_next() {
    let (events, batches) = setup();
    let watcher = batches.watch(Filter::default());
    assert!(events.watched());
    drop(watcher);
    for _ in 0..100 {
        if !events.watched() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(!events.watched(), "with no one watching, events are not even made");
    let mut again = batches.watch(Filter::default());
    events.publish(event(0, "u1"));
    assert_eq!(messages(&decode(next(&mut again).await)), ["event 0"]);
}

#[tokio::test(start_paused = true)]
async fn when_the_batcher_falls_behind_before_a_batch_every_watcher_is_told_how_many_went_by() {
    let (events, batches) = setup_buffering(4);
    let mut everything = batches.watch(Filter::default());
    let mut u2 = batches.watch(Filter { pod_uid: "u2".into(), ..Filter::default() });
    // The batcher has not run yet: it finds only the newest 4 of 10.
    publish_alternating(&events, 0..10);
    assert_eq!(lagged_by(next(&mut everything).await), 6);
    assert_eq!(messages(&decode(next(&mut everything).await)), ["event 6", "event 7", "event 8", "event 9"]);
    assert_eq!(lagged_by(next(&mut u2).await), 6, "every lost event counts, matching or not");
    assert_eq!(messages(&decode(next(&mut u2).await)), ["event 7", "event 9"]);
}

#[tokio::test(start_paused = true)]
async fn when_the_batcher_falls_behind_within_a_batch_the_batch_is_sealed_at_the_gap() {
    let (events, batches) = setup_buffering(4);
    let mut watcher = batches.watch(Filter::default());
    events.publish(event(0, "u1"));
    // The batcher takes event 0 and waits for more, its batch open.
    tokio::task::yield_now().await;
    publish_alternating(&events, 1..11);
    let before_the_gap = decode(next(&mut watcher).await);
    assert_eq!(messages(&before_the_gap), ["event 0"]);
    assert_eq!(lagged_by(next(&mut watcher).await), 6);
    let after = decode(next(&mut watcher).await);
    assert_eq!(messages(&after), ["event 7", "event 8", "event 9", "event 10"]);
}
