use super::*;

fn for_pod(uid: &str, namespace: &str, image: &str) -> Event {
    let pod = Pod { namespace: namespace.into(), name: "web".into(), uid: uid.into() };
    Event {
        pod: Some(pod),
        image: image.into(),
        ..Event::new(EventType::Normal, reason::PULLING, format!("Pulling image {image:?}"))
    }
}

/// Every event until publishing ends.
async fn read(mut subscription: Subscription) -> Vec<Event> {
    let mut seen = Vec::new();
    while let Some(Next::Event(event)) = subscription.next().await {
        seen.push((*event).clone());
    }
    seen
}

#[tokio::test]
async fn a_subscriber_gets_the_events_its_filter_matches_in_order() {
    let events = Events::default();
    let all = events.subscribe(Filter::default());
    let pod = events.subscribe(Filter { pod_uid: "u1".into(), ..Filter::default() });
    let namespace = events.subscribe(Filter { namespace: "kube-system".into(), ..Filter::default() });
    let image = events.subscribe(Filter { image: "busybox:1.36".into(), ..Filter::default() });
    let published = [
        for_pod("u1", "default", "busybox:1.36"),
        for_pod("u2", "kube-system", "nginx:1.25"),
        Event {
            image_ref: "busybox:1.36".into(),
            ..Event::new(EventType::Normal, reason::IMAGE_GARBAGE_COLLECTED, "gone".into())
        },
    ];
    for event in &published {
        events.publish(event.clone());
    }
    drop(events);
    assert_eq!(read(all).await, published);
    assert_eq!(read(pod).await, [published[0].clone()]);
    assert_eq!(read(namespace).await, [published[1].clone()]);
    assert_eq!(read(image).await, [published[0].clone(), published[2].clone()], "as written or as a ref");
}

#[test]
fn a_progress_event_matches_every_pod_waiting_for_the_pull() {
    let first = Pod { namespace: "default".into(), name: "a".into(), uid: "u1".into() };
    let joined = Pod { namespace: "batch".into(), name: "b".into(), uid: "u2".into() };
    let progress = Event {
        pod: Some(first.clone()),
        waiting: vec![first, joined],
        ..Event::new(EventType::Normal, reason::PULL_PROGRESS, "half".into())
    };
    let filter = |uid: &str, namespace: &str| {
        Filter { pod_uid: uid.into(), namespace: namespace.into(), ..Filter::default() }.prepare()
    };
    assert!(filter("u2", "").matches(&progress), "a pod that joined the pull");
    assert!(filter("", "batch").matches(&progress));
    assert!(filter("u2", "batch").matches(&progress));
    assert!(!filter("u3", "").matches(&progress));
    assert!(!filter("u1", "batch").matches(&progress), "one pod must match both");
    assert!(!filter("", "kube-system").matches(&progress));
}

#[tokio::test]
async fn a_slow_subscriber_is_told_once_how_many_it_lost_and_goes_on() {
    let events = Events::with_buffer(4);
    let mut slow = events.subscribe(Filter::default());
    for n in 0..10 {
        events.publish(Event::new(EventType::Normal, reason::PULLING, format!("{n}")));
    }
    assert_eq!(slow.next().await, Some(Next::Lagged(6)));
    let mut rest = Vec::new();
    for _ in 0..4 {
        let Some(Next::Event(event)) = slow.next().await else { panic!("an event") };
        rest.push(event.message.clone());
    }
    assert_eq!(rest, ["6", "7", "8", "9"], "the newest, in order");
}

#[test]
fn a_counted_subscription_starts_after_every_event_sent_before_it() {
    let events = Events::with_buffer(8);
    events.publish(Event::new(EventType::Normal, reason::PULLING, "unwatched".into()));
    let (_first, sent) = events.subscribe_counted(Filter::default());
    assert_eq!(sent, 0, "an event no one watched is not counted");
    events.publish(Event::new(EventType::Normal, reason::PULLING, "a".into()));
    events.publish(Event::new(EventType::Normal, reason::PULLED, "b".into()));
    let (mut second, sent) = events.subscribe_counted(Filter::default());
    assert_eq!((sent, events.sent()), (2, 2));
    events.publish(Event::new(EventType::Normal, reason::PULLING, "c".into()));
    assert!(matches!(second.try_next(), Some(Next::Event(event)) if event.message == "c"));
    assert_eq!(events.sent(), 3);
}

#[test]
fn a_subscriber_gets_nothing_published_before_it() {
    let events = Events::with_buffer(4);
    events.publish(Event::new(EventType::Normal, reason::PULLING, "x".into()));
    let mut late = events.subscribe(Filter::default());
    events.publish(Event::new(EventType::Normal, reason::PULLED, "y".into()));
    assert!(matches!(late.receiver.try_recv(), Ok(event) if event.message == "y"));
}

fn messages(events: &[Arc<Event>]) -> Vec<&str> {
    events.iter().map(|event| event.message.as_str()).collect()
}

#[test]
fn the_newest_events_are_kept_unwatched_progress_and_lag_aside() {
    let events = Events::default();
    events.publish(Event::new(EventType::Normal, reason::PULLING, "first".into()));
    for noise in [reason::PULL_PROGRESS, reason::LAGGED] {
        events.publish(Event::new(EventType::Normal, noise, "noise".into()));
    }
    events.publish(for_pod("u1", "default", "busybox"));
    let everything = Filter::default().prepare();
    assert_eq!(messages(&events.recent(&everything, 0)), ["first", "Pulling image \"busybox\""], "oldest first");
    for n in 0..KEPT_EVENTS {
        events.publish(Event::new(EventType::Normal, reason::PULLED, format!("{n}")));
    }
    let kept = events.recent(&everything, 0);
    assert_eq!(kept.len(), KEPT_EVENTS, "bounded");
    assert_eq!((kept[0].message.as_str(), kept[KEPT_EVENTS - 1].message.as_str()), ("0", "1023"));
    assert_eq!(messages(&events.recent(&everything, 2)), ["1022", "1023"], "a limit takes the newest");
    assert_eq!(events.sent(), 0, "nothing was sent: no one watched");
}

#[test]
fn the_kept_events_are_filtered_before_the_limit() {
    let events = Events::default();
    for (n, uid) in ["u1", "u2", "u1", "u2", "u1"].into_iter().enumerate() {
        events.publish(Event { message: format!("{n}"), ..for_pod(uid, "default", "busybox:1.36") });
    }
    let u1 = Filter { pod_uid: "u1".into(), ..Filter::default() }.prepare();
    assert_eq!(messages(&events.recent(&u1, 0)), ["0", "2", "4"]);
    assert_eq!(messages(&events.recent(&u1, 2)), ["2", "4"]);
    let other = Filter { image: "nginx".into(), ..Filter::default() }.prepare();
    assert!(events.recent(&other, 0).is_empty());
}

#[test]
fn an_image_filter_matches_every_spelling_of_the_same_reference() {
    let about =
        |image: &str| Event { image: image.into(), ..Event::new(EventType::Normal, reason::PULLING, "x".into()) };
    let busybox = Filter { image: "busybox".into(), ..Filter::default() }.prepare();
    for same in ["busybox", "busybox:latest", "docker.io/library/busybox", "index.docker.io/library/busybox:latest"] {
        assert!(busybox.matches(&about(same)), "{same}");
    }
    for other in ["busybox:1.36", "quay.io/busybox", "example.test/library/busybox", "", "Not A Name"] {
        assert!(!busybox.matches(&about(other)), "{other}");
    }
    let full = Filter { image: "docker.io/library/busybox:1.36".into(), ..Filter::default() }.prepare();
    assert!(full.matches(&about("busybox:1.36")), "the other way round");
    let id = "sha256:".to_owned() + &"ab".repeat(32);
    let by_id = Filter { image: id.clone(), ..Filter::default() }.prepare();
    let removed = Event { image_ref: id.clone(), ..about("docker.io/library/busybox:latest") };
    assert!(by_id.matches(&removed), "an image ref, exactly");
    assert!(!by_id.matches(&about("busybox")));
}

#[test]
fn published_events_are_counted_by_reason_and_type_but_progress_and_unkept_ones_are_not() {
    let metrics = Arc::new(EventMetrics::default());
    let events = Events::default().counted(metrics.clone());
    let _watcher = events.subscribe(Filter::default());
    events.publish(for_pod("u1", "default", "busybox:1.36"));
    events.publish(for_pod("u2", "default", "busybox:1.36"));
    events.publish(Event::new(EventType::Warning, reason::FAILED, "no such image".into()));
    events.publish(Event::new(EventType::Normal, reason::PULL_PROGRESS, "half way".into()));
    events.publish_unkept(Event::new(EventType::Normal, reason::PULLED, "already present".into()));
    assert_eq!(metrics.total(EventType::Normal, reason::PULLING), 2);
    assert_eq!(metrics.total(EventType::Warning, reason::FAILED), 1);
    assert_eq!(metrics.total(EventType::Normal, reason::PULL_PROGRESS), 0, "made only for watchers");
    assert_eq!(metrics.total(EventType::Normal, reason::PULLED), 0, "made only for watchers");
}
