use std::time::{Duration, UNIX_EPOCH};

use prost::Message;

use super::*;
use crate::prepull::{
    Page,
    book::{Book, MAX_ENDED_KEPT, MAX_PRE_PULLS, MAX_RUNTIME_HANDLER, Spec},
};

/// gRPC's default for the largest message a client takes.
const GRPC_DEFAULT_MAX: usize = 4 << 20;

/// A book full of the largest pre-pulls it holds: every field at its bound, half of them failed
/// with a runtime's message far past its own.
fn full_book_of_the_largest() -> Book {
    let host = ["a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61)].join(".");
    let mut book = Book::default();
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    for n in 0..MAX_PRE_PULLS + MAX_ENDED_KEPT {
        let image = format!("{host}:65535/{}:{n:0>128}@sha512:{}", "p".repeat(255), "f".repeat(128));
        let spec = Spec {
            image,
            runtime_handler: "h".repeat(MAX_RUNTIME_HANDLER),
            namespace: "n".repeat(63),
            priority: i32::MIN,
            deadline: Some(now + Duration::from_secs(3600)),
            pin_for: Some(Duration::from_secs(3600)),
            declared: false,
            owner: None,
        };
        let id = book.submit(spec, None, now).expect("room").id.clone();
        if n < MAX_ENDED_KEPT {
            book.started(&id);
            let failed = State::Failed { reason: "R".repeat(1 << 12), message: "é".repeat(1 << 16) };
            book.ended(&id, failed, now + Duration::from_secs(1));
        }
    }
    book
}

#[test]
fn a_page_of_the_largest_pre_pulls_and_get_statuss_share_stay_far_under_grpcs_default_answer() {
    let book = full_book_of_the_largest();
    let (page, next) = book.page(None, Page::MAX_SIZE);
    assert!(next.is_some(), "more than a page");
    let largest = book.entries().map(|entry| wire(entry.clone(), &[]).encoded_len()).max().expect("entries");
    let answer = api::ListPrePullsResponse {
        pre_pulls: wire_all(page.into_iter().cloned().collect(), &[]),
        next_page_token: next.map(|cursor| cursor.to_string()).unwrap_or_default(),
    };
    let size = answer.encoded_len();
    // The pulling ones (at most --max-parallel-pre-pulls) add their progress: 64 layers of about
    // 100 bytes each.
    assert!(size + 64 * 7000 < GRPC_DEFAULT_MAX / 2, "a page is {size} bytes");
    let (first, _) = book.page(None, IN_STATUS);
    let in_status = wire_all(first.into_iter().cloned().collect(), &[]).iter().map(Message::encoded_len).sum::<usize>();
    assert!(in_status < GRPC_DEFAULT_MAX / 8, "GetStatus's pre-pulls are {in_status} bytes");
    eprintln!(
        "largest pre-pull on the wire: {largest} bytes; a page of {}: {size} bytes; GetStatus's {IN_STATUS}: {in_status} bytes",
        Page::MAX_SIZE
    );
}

#[test]
fn counts_on_the_wire_name_every_state() {
    let counts = [("queued", 1), ("pulling", 2), ("held", 3), ("done", 4), ("failed", 5), ("cancelled", 6)];
    let wired = wire_counts(counts);
    let api::PrePullCounts { queued, pulling, held, done, failed, cancelled } = wired;
    assert_eq!([queued, pulling, held, done, failed, cancelled], [1, 2, 3, 4, 5, 6]);
}
