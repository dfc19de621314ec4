use std::time::UNIX_EPOCH;

use super::*;

fn at(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_000_000 + seconds)
}

fn spec(image: &str, priority: i32) -> Spec {
    Spec {
        image: with_default_tag(image).expect("an image"),
        runtime_handler: String::new(),
        namespace: String::new(),
        priority,
        deadline: None,
        pin_for: None,
        declared: false,
        owner: None,
    }
}

fn states(book: &Book) -> Vec<(&str, &'static str)> {
    book.list().into_iter().map(|entry| (entry.spec.image.as_str(), entry.state.as_str())).collect()
}

#[test]
fn the_same_image_asked_again_is_the_same_pre_pull_under_an_id_of_the_image_and_handler() {
    let mut book = Book::default();
    let id = book.submit(spec("busybox", 0), None, at(0)).expect("queued").id.clone();
    assert_eq!(id, id_of("busybox:latest", "", ""), "the default tag is part of the image");
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
    let declared = id_of("base:1", "", "");
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
    let base = id_of("base:1", "", "");
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
    let restored = Book::restored(kept, at(1));
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
    let restored = Book::restored(book.entries().cloned().collect(), at(1));
    assert_eq!(restored.get(&id).expect("kept").state, State::Queued);
    assert!(book.release_held());
    assert_eq!(book.next(1), [id]);
}

fn failed(message: &str) -> State {
    State::Failed { reason: "RegistryUnavailable".into(), message: message.into() }
}

#[test]
fn a_flood_that_failed_leaves_room_ended_pre_pulls_stay_listed_and_do_not_count() {
    // Issue 47: 1024 pre-pulls of images on an unreachable host all fail in seconds.
    let mut book = Book::default();
    for index in 0..MAX_PRE_PULLS {
        let id =
            book.submit(spec(&format!("unreachable.example/app-{index}:1"), 0), None, at(0)).expect("room").id.clone();
        book.started(&id);
        book.ended(&id, failed("dial tcp: connection refused"), at(20));
    }
    let next = book.submit(spec("app:2", 0), None, at(21)).expect("ended pre-pulls do not count");
    assert_eq!(next.state, State::Queued);
    assert_eq!(book.list().len(), MAX_PRE_PULLS + 1, "the failed ones are still shown");
    let mut restored = Book::restored(book.entries().cloned().collect(), at(22));
    assert!(restored.submit(spec("app:3", 0), None, at(22)).is_ok(), "nor after a restart");
}

#[test]
fn a_full_book_says_to_cancel_and_a_cancel_makes_room_also_of_a_done_pinned_pre_pull_which_it_unpins() {
    let mut book = Book::default();
    let pinned = Spec { pin_for: Some(Duration::from_secs(86_400)), ..spec("pinned:1", 0) };
    let pinned = book.submit(pinned, None, at(0)).expect("queued").id.clone();
    book.started(&pinned);
    book.ended(&pinned, State::Done { image_ref: "sha256:p".into() }, at(1));
    let mut queued = Vec::new();
    for index in 1..MAX_PRE_PULLS {
        queued.push(book.submit(spec(&format!("image-{index}:1"), 0), None, at(2)).expect("room").id.clone());
    }
    let full = book.submit(spec("one-more:1", 0), None, at(3)).expect_err("full: the pinned one counts");
    assert_eq!(full, BookError::Full);
    assert!(full.to_string().contains("cancel some"), "{full}");

    assert_eq!(book.cancel(&queued[0], at(4)).expect("cancelled").state, State::Cancelled);
    book.submit(spec("one-more:1", 0), None, at(5)).expect("the cancel made room");
    assert_eq!(book.submit(spec("two-more:1", 0), None, at(5)).expect_err("full again"), BookError::Full);
    // A failed or cancelled pre-pull asked again counts again: refused while full.
    assert_eq!(book.submit(spec("image-1:1", 0), None, at(5)).expect_err("queued again"), BookError::Full);

    assert_eq!(book.pinned(at(6)), ["pinned:1", "sha256:p"]);
    let unpinned = book.cancel(&pinned, at(6)).expect("answered");
    assert_eq!((unpinned.state.as_str(), unpinned.pinned_until()), ("done", None), "done still, no longer pinned");
    assert!(book.pinned(at(6)).is_empty(), "image GC no longer keeps its image for it");
    book.submit(spec("two-more:1", 0), None, at(7)).expect("the unpin made room");
}

#[test]
fn ended_pre_pulls_shown_are_bounded_those_that_ended_first_forgotten_first_pinned_ones_kept() {
    let mut book = Book::default();
    let pinned = Spec { pin_for: Some(Duration::from_secs(86_400)), ..spec("pinned:1", 0) };
    let pinned = book.submit(pinned, None, at(0)).expect("queued").id.clone();
    book.started(&pinned);
    book.ended(&pinned, State::Done { image_ref: "sha256:p".into() }, at(0));
    for index in 0..MAX_ENDED_KEPT + 10 {
        let id = book.submit(spec(&format!("image-{index}:1"), 0), None, at(1)).expect("room").id.clone();
        book.started(&id);
        book.ended(&id, failed("no"), at(2 + index as u64));
    }
    assert_eq!(book.entries().count(), MAX_ENDED_KEPT + 1);
    assert!(book.get(&pinned).is_some(), "a pinned one is not only shown");
    assert!(book.get(&id_of("image-9:1", "", "")).is_none(), "the first ten to end are forgotten");
    assert!(book.get(&id_of("image-10:1", "", "")).is_some());
}

#[test]
fn what_the_runtime_says_is_clipped_to_the_books_bounds_on_a_characters_boundary() {
    let mut book = Book::default();
    let id = book.submit(spec("app:1", 0), None, at(0)).expect("queued").id.clone();
    book.started(&id);
    book.ended(&id, State::Failed { reason: "R".repeat(4096), message: "é".repeat(1 << 20) }, at(1));
    let State::Failed { reason, message } = &book.get(&id).expect("listed").state else { panic!("failed") };
    assert!(reason.len() <= MAX_REASON && message.len() <= MAX_MESSAGE, "{} {}", reason.len(), message.len());
    assert!(message.ends_with('…') && message.starts_with("éé"), "marked as cut");
    assert_eq!(clip("short".into(), 8), "short");
}

#[test]
fn pages_go_on_after_the_last_pre_pull_shown_even_when_the_list_changes_between_them() {
    let mut book = Book::default();
    for index in 0..5 {
        book.submit(spec(&format!("image-{index}:1"), 0), None, at(index)).expect("queued");
    }
    let (first, next) = book.page(None, 2);
    let names = |page: &[&PrePull]| page.iter().map(|entry| entry.spec.image.clone()).collect::<Vec<_>>();
    assert_eq!(names(&first), ["image-0:1", "image-1:1"]);
    let token = next.expect("more follow").to_string();
    // Meanwhile one comes before the cursor and one after.
    book.submit(spec("first:1", 9), None, at(10)).expect("queued");
    book.submit(spec("last:1", 0), None, at(11)).expect("queued");
    let cursor = Cursor::parse(&token).expect("a token given parses");
    let (second, next) = book.page(Some(&cursor), 2);
    assert_eq!(names(&second), ["image-2:1", "image-3:1"]);
    let (third, next) = book.page(next.as_ref(), 2);
    assert_eq!((names(&third), next), (vec!["image-4:1".to_owned(), "last:1".to_owned()], None));
    assert_eq!(book.page(None, 500).0.len(), 7);
    for bad in ["", "x", "0.1.2", "0.1.2.XYZ", "0.1.2000000000.0123456789abcdef", &format!("0.1.2.{}", "a".repeat(17))]
    {
        assert_eq!(Cursor::parse(bad), None, "{bad:?}");
    }
}

#[test]
fn a_namespace_makes_another_pre_pull_and_none_keeps_the_id_of_before_namespaces() {
    let mut book = Book::default();
    let none = book.submit(spec("busybox", 0), None, at(0)).expect("queued").id.clone();
    // `printf 'busybox:latest\0' | sha256sum`: the id before pre-pulls had namespaces.
    assert_eq!(none, "1fdfbce274beb91d");
    let team = Spec { namespace: "team".into(), ..spec("busybox", 0) };
    let team = book.submit(team, None, at(1)).expect("another").id.clone();
    // `printf 'busybox:latest\0\0team' | sha256sum`
    assert_eq!(team, "868d2b1dc531b0d6");
    assert_eq!(team, id_of("busybox:latest", "", "team"));
    assert_eq!(book.get(&team).expect("listed").spec.namespace, "team");
    assert_eq!(book.get(&none).expect("listed").spec.namespace, "");
    let other = Spec { namespace: "other".into(), ..spec("busybox", 0) };
    assert_ne!(book.submit(other, None, at(2)).expect("a third").id, team);
    assert_eq!(book.list().len(), 3);
}
