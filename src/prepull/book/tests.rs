use std::time::UNIX_EPOCH;

use super::*;

fn at(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_000_000 + seconds)
}

fn spec(image: &str, priority: i32) -> Spec {
    Spec {
        image: with_default_tag(image).expect("an image"),
        runtime_handler: String::new(),
        priority,
        deadline: None,
        pin_for: None,
        declared: false,
    }
}

fn states(book: &Book) -> Vec<(&str, &'static str)> {
    book.list().into_iter().map(|entry| (entry.spec.image.as_str(), entry.state.as_str())).collect()
}

#[test]
fn the_same_image_asked_again_is_the_same_pre_pull_under_an_id_of_the_image_and_handler() {
    let mut book = Book::default();
    let id = book.submit(spec("busybox", 0), None, at(0)).expect("queued").id.clone();
    assert_eq!(id, id_of("busybox:latest", ""), "the default tag is part of the image");
    assert_eq!(id.len(), 16);
    assert_eq!(book.submit(spec("busybox:latest", 5), None, at(1)).expect("the same").id, id);
    assert_eq!(book.get(&id).expect("listed").spec.priority, 5, "the higher priority wins");
    let kata = Spec { runtime_handler: "kata".into(), ..spec("busybox", 0) };
    assert_ne!(book.submit(kata, None, at(2)).expect("another").id, id, "another handler, another pre-pull");
    assert_eq!(book.list().len(), 2);
}

#[test]
fn a_pre_pull_running_with_credentials_is_not_taken_over_by_others() {
    let mut book = Book::default();
    let id = book.submit(spec("private.example/app:1", 0), Some(7), at(0)).expect("queued").id.clone();
    let refused = book.submit(spec("private.example/app:1", 0), Some(8), at(1)).expect_err("other credentials");
    assert_eq!(refused, BookError::OtherCredentials { image: "private.example/app:1".into(), id: id.clone() });
    assert!(book.submit(spec("private.example/app:1", 0), Some(7), at(1)).is_ok(), "the same credentials");
    book.started(&id);
    book.ended(&id, State::Failed { reason: "ErrImagePull".into(), message: "401".into() }, at(2));
    let again = book.submit(spec("private.example/app:1", 0), Some(8), at(3)).expect("a failed one is asked again");
    assert_eq!((again.state.as_str(), again.credentials), ("queued", Some(8)));
}

#[test]
fn the_highest_priority_goes_first_then_the_oldest_within_the_running_cap() {
    let mut book = Book::default();
    for (image, priority, second) in [("low:1", 0, 0), ("high:1", 10, 1), ("old-mid:1", 5, 2), ("new-mid:1", 5, 3)] {
        book.submit(spec(image, priority), None, at(second)).expect("queued");
    }
    let order = |book: &Book, cap| -> Vec<String> {
        book.next(cap).iter().map(|id| book.get(id).expect("listed").spec.image.clone()).collect()
    };
    assert_eq!(order(&book, 2), ["high:1", "old-mid:1"]);
    let first = book.next(1).remove(0);
    book.started(&first);
    assert_eq!(order(&book, 1), Vec::<String>::new(), "the cap is taken");
    assert_eq!(order(&book, 2), ["old-mid:1"]);
}

#[test]
fn cancelled_pre_pulls_end_and_declared_ones_cannot_be_cancelled() {
    let mut book = Book::default();
    let id = book.submit(spec("app:1", 0), None, at(0)).expect("queued").id.clone();
    assert_eq!(book.cancel(&id, at(1)).expect("cancelled").state, State::Cancelled);
    book.ended(&id, State::Done { image_ref: "sha256:a".into() }, at(2));
    assert_eq!(book.get(&id).expect("listed").state, State::Cancelled, "a pull ending after a cancel changes nothing");
    assert_eq!(
        book.cancel("0123456789abcdef", at(2)).expect_err("unknown"),
        BookError::NotFound("0123456789abcdef".into())
    );
    assert!(book.declare(&["base:1".into()], at(3)));
    let declared = id_of("base:1", "");
    assert_eq!(book.cancel(&declared, at(3)).expect_err("declared"), BookError::Declared(declared));
}

#[test]
fn deadlines_fail_what_has_not_ended_and_ended_pre_pulls_are_forgotten_after_an_hour_unless_pinned() {
    let mut book = Book::default();
    let late = Spec { deadline: Some(at(60)), ..spec("late:1", 0) };
    let late = book.submit(late, None, at(0)).expect("queued").id.clone();
    let pinned = Spec { pin_for: Some(Duration::from_secs(7200)), ..spec("pinned:1", 0) };
    let pinned = book.submit(pinned, None, at(0)).expect("queued").id.clone();
    book.started(&pinned);
    book.ended(&pinned, State::Done { image_ref: "sha256:p".into() }, at(10));
    assert_eq!(book.next_change(), Some(at(60)), "the deadline first");
    assert!(book.expire(at(61)));
    assert!(
        matches!(&book.get(&late).expect("listed").state, State::Failed { reason, .. } if reason == "DeadlineExceeded")
    );
    assert_eq!(book.pinned(at(100)), ["pinned:1", "sha256:p"]);
    book.expire(at(61 + 3600));
    assert!(book.get(&late).is_none(), "forgotten an hour after it ended");
    assert!(book.get(&pinned).is_some(), "kept while pinned");
    book.expire(at(10 + 7200));
    assert!(book.pinned(at(10 + 7200)).is_empty());
    assert!(book.get(&pinned).is_none());
}

#[test]
fn bad_submissions_are_refused_with_their_reason() {
    let mut book = Book::default();
    assert!(matches!(with_default_tag("Not An Image"), Err(BookError::InvalidImage { .. })));
    let pin = Spec { pin_for: Some(MAX_PIN + Duration::from_secs(1)), ..spec("a:1", 0) };
    assert!(matches!(book.submit(pin, None, at(0)), Err(BookError::PinTooLong(_))));
    let past = Spec { deadline: Some(at(0)), ..spec("a:1", 0) };
    assert_eq!(book.submit(past, None, at(0)).expect_err("past"), BookError::DeadlinePassed);
    for index in 0..MAX_PRE_PULLS {
        book.submit(spec(&format!("image-{index}:1"), 0), None, at(0)).expect("room");
    }
    assert_eq!(book.submit(spec("one-more:1", 0), None, at(0)).expect_err("full"), BookError::Full);
}

#[test]
fn declared_pre_pulls_follow_the_list_and_are_queued_again_when_their_image_goes() {
    let mut book = Book::default();
    assert!(book.declare(&["base:1".into(), "tools:2".into()], at(0)));
    assert!(!book.declare(&["base:1".into(), "tools:2".into()], at(1)), "the same list changes nothing");
    let base = id_of("base:1", "");
    book.started(&base);
    book.ended(&base, State::Done { image_ref: "sha256:b".into() }, at(2));
    book.gone(&base, at(3));
    assert_eq!(book.get(&base).expect("listed").state, State::Queued);
    assert!(book.declare(&["tools:2".into()], at(4)));
    assert_eq!(states(&book), [("tools:2", "queued")]);
}

#[test]
fn a_restart_queues_what_was_pulling_again_and_keeps_no_credentials() {
    let mut book = Book::default();
    let id = book.submit(spec("big:1", 0), Some(9), at(0)).expect("queued").id.clone();
    book.started(&id);
    let mut kept: Vec<PrePull> = book.entries().cloned().collect();
    kept[0].id = "forged".into();
    let restored = Book::restored(kept);
    let entry = restored.get(&id).expect("under its image's id");
    assert_eq!((entry.state.as_str(), entry.resumed, entry.credentials), ("queued", 1, None));
}

#[test]
fn a_pre_pull_held_for_want_of_room_waits_until_released_and_a_restart_queues_it() {
    let mut book = Book::default();
    let id = book.submit(spec("big:1", 0), None, at(0)).expect("queued").id.clone();
    book.started(&id);
    book.held(&id, "DiskPressure", "DiskPressure: too big now".into());
    assert!(!book.get(&id).expect("listed").state.ended(), "held is not ended");
    assert!(book.next(1).is_empty(), "a held pre-pull does not start");
    let restored = Book::restored(book.entries().cloned().collect());
    assert_eq!(restored.get(&id).expect("kept").state, State::Queued);
    assert!(book.release_held());
    assert_eq!(book.next(1), [id]);
}
