use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::prepull::book::{MAX_ENDED_KEPT, MAX_PRE_PULLS};

fn at(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(1_700_000_000_123) + Duration::from_secs(seconds)
}

fn spec(image: &str) -> Spec {
    Spec {
        image: image.into(),
        runtime_handler: String::new(),
        namespace: String::new(),
        priority: 3,
        deadline: Some(at(600)),
        pin_for: Some(Duration::from_secs(60)),
        declared: false,
        owner: None,
    }
}

/// Writes every pre-pull of `book` as the daemon does, starting from `written`.
fn keep(store: &PrePullStore, book: &Book, written: &mut Written) {
    let wanted = book.entries().map(|entry| (entry.id.clone(), encode(entry))).collect();
    store.write_changes(&wanted, written).expect("written");
}

fn files(store: &PrePullStore) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(store.path())
        .expect("listed")
        .map(|entry| entry.expect("an entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn pre_pulls_survive_a_restart_one_file_each_without_their_credentials_and_what_was_pulling_resumes() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = PrePullStore::open(root.path()).expect("opens");
    let mut book = Book::default();
    let pulling = book.submit(spec("big:1"), Some(7), at(0)).expect("queued").id.clone();
    book.started(&pulling);
    let done = book.submit(spec("small:1"), None, at(0)).expect("queued").id.clone();
    book.started(&done);
    book.ended(&done, State::Done { image_ref: "sha256:s".into() }, at(0));
    let mut written = Written::new();
    keep(&store, &book, &mut written);
    let mut expected = vec![StateDir::file_name(&done), StateDir::file_name(&pulling)];
    expected.sort();
    assert_eq!(files(&store), expected, "one file each, named by id");
    let text = std::fs::read_to_string(store.path_of(&pulling)).expect("readable");
    assert!(!text.contains("credentials"), "{text}");

    let (restored, found) = store.load(at(1)).expect("loads");
    assert_eq!(found, written, "what is on disk is known, so an unchanged pre-pull is not written again");
    let resumed = restored.get(&pulling).expect("kept");
    assert_eq!((resumed.state.as_str(), resumed.resumed, resumed.credentials), ("queued", 1, None));
    assert_eq!(resumed.spec, book.get(&pulling).expect("listed").spec);
    assert_eq!(restored.get(&done).expect("kept").state, State::Done { image_ref: "sha256:s".into() });
}

#[test]
fn a_pre_pull_forgotten_by_the_book_loses_its_file_and_an_unchanged_one_is_not_written_again() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = PrePullStore::open(root.path()).expect("opens");
    let mut book = Book::default();
    let id = book.submit(spec("app:1"), None, at(0)).expect("queued").id.clone();
    book.started(&id);
    book.ended(&id, State::Failed { reason: "ErrImagePull".into(), message: "no".into() }, at(1));
    let mut written = Written::new();
    keep(&store, &book, &mut written);
    let path = store.path_of(&id);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).expect("marked");
    keep(&store, &book, &mut written);
    let mode = std::fs::metadata(&path).expect("kept").permissions().mode() & 0o777;
    assert_eq!(mode, 0o400, "not written again: the same file");
    assert!(book.expire(at(1 + 3600)), "forgotten an hour after it ended");
    keep(&store, &book, &mut written);
    assert!(files(&store).is_empty(), "{:?}", files(&store));
    assert!(written.is_empty());
}

#[test]
fn a_file_that_cannot_be_read_whole_is_set_aside_and_costs_only_its_own_pre_pull() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = PrePullStore::open(root.path()).expect("opens");
    let mut book = Book::default();
    let mut ids = Vec::new();
    for image in ["one:1", "two:1", "three:1", "four:1", "five:1"] {
        ids.push(book.submit(spec(image), None, at(0)).expect("queued").id.clone());
    }
    keep(&store, &book, &mut Written::new());
    // Torn, too large, not a pre-pull's fields, and another pre-pull's content under this name.
    std::fs::write(store.path_of(&ids[0]), b"{\"image\":\"one:1\",\"sta").expect("torn");
    std::fs::write(store.path_of(&ids[1]), vec![b' '; ENTRY_LIMIT as usize + 1]).expect("too large");
    std::fs::write(store.path_of(&ids[2]), br#"{"image":"three:1","state":"sleeping","submittedMs":1}"#).expect("odd");
    let five = std::fs::read(store.path_of(&ids[4])).expect("readable");
    std::fs::write(store.path_of(&ids[3]), five).expect("mis-named");

    let (restored, written) = store.load(at(1)).expect("loads");
    let images: Vec<&str> = restored.entries().map(|entry| entry.spec.image.as_str()).collect();
    assert_eq!(images, ["five:1"]);
    assert_eq!(written.keys().collect::<Vec<_>>(), [&ids[4]]);
    let aside = files(&store).iter().filter(|name| name.ends_with(crate::files::QUARANTINE_SUFFIX)).count();
    assert_eq!(aside, 4, "each bad file set aside: {:?}", files(&store));
    let (again, _) = store.load(at(2)).expect("loads again");
    assert_eq!(again.entries().count(), 1, "nothing set aside is read again");
}

#[test]
fn the_largest_pre_pull_the_book_holds_is_written_far_under_the_read_cap_and_a_full_book_reads_back_whole() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = PrePullStore::open(root.path()).expect("opens");
    // Every field at its bound: a 1024-byte image, a 63-byte handler and namespace, a reason and a message
    // from the runtime far past theirs (the book clips them).
    let host = ["a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61)].join(".");
    let image = |n: usize| {
        let tag = format!("{n:0>128}");
        format!("{host}:65535/{}:{tag}@sha512:{}", "p".repeat(255), "f".repeat(128))
    };
    let mut book = Book::default();
    let count = MAX_PRE_PULLS + MAX_ENDED_KEPT;
    for n in 0..count {
        let (runtime_handler, namespace) = ("h".repeat(book::MAX_RUNTIME_HANDLER), "n".repeat(book::MAX_NAMESPACE));
        let spec = Spec { image: image(n), runtime_handler, namespace, ..spec("x:1") };
        let id = book.submit(spec, None, at(0)).expect("room: the first half ends").id.clone();
        if n < MAX_ENDED_KEPT {
            book.started(&id);
            let failed = State::Failed { reason: "R".repeat(1 << 16), message: "é".repeat(1 << 16) };
            book.ended(&id, failed, at(1));
        }
    }
    assert_eq!(book.entries().count(), count);
    let largest = book.entries().map(|entry| encode(entry).len()).max().expect("entries");
    assert!(largest * 4 < ENTRY_LIMIT as usize, "{largest} bytes, cap {ENTRY_LIMIT}");
    eprintln!("largest pre-pull file: {largest} bytes; {count} of them: {} KiB", largest * count / 1024);
    keep(&store, &book, &mut Written::new());
    let (restored, _) = store.load(at(2)).expect("loads");
    assert_eq!(restored.entries().count(), count, "every pre-pull read back");
}

#[test]
fn text_of_control_characters_and_a_deadline_on_the_longest_image_still_read_back() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = PrePullStore::open(root.path()).expect("opens");
    // 986 bytes: its deadline's message, which names it, is past the 1 KiB a message may keep.
    let host = [&["h".repeat(63)][..]; 9].concat().join(".") + "." + &"e".repeat(20);
    let image = |path: &str| format!("{host}:5000/{}:{}", path.repeat(255), "t".repeat(128));
    assert_eq!(image("p").len(), 986);
    let mut book = Book::default();
    let spec = Spec { image: image("p"), deadline: Some(at(5)), ..spec("x:1") };
    let late = book.submit(spec, None, at(0)).expect("queued").id.clone();
    let failing = book.submit(spec_of(&image("q")), None, at(0)).expect("queued").id.clone();
    book.started(&failing);
    // Each control character is six bytes of JSON (`\u0001`).
    let failed = State::Failed { reason: "\u{1}".repeat(1 << 12), message: "\u{1}".repeat(1 << 12) };
    book.ended(&failing, failed, at(1));
    assert!(book.expire(at(6)), "the late one fails by its deadline");
    let largest = book.entries().map(|entry| encode(entry).len()).max().expect("entries");
    assert!(largest < ENTRY_LIMIT as usize, "{largest} bytes, cap {ENTRY_LIMIT}");
    keep(&store, &book, &mut Written::new());
    let (restored, _) = store.load(at(7)).expect("loads");
    let states: Vec<_> = [&late, &failing].map(|id| restored.get(id).map(|entry| entry.state.as_str())).to_vec();
    assert_eq!(states, [Some("failed"), Some("failed")], "both read back");
}

fn spec_of(image: &str) -> Spec {
    Spec { image: image.to_owned(), ..spec("x:1") }
}

#[test]
fn the_bloated_single_file_of_an_earlier_version_keeps_what_holds_together_one_file_each() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = PrePullStore::open(root.path()).expect("opens");
    // Issue 47: twelve pre-pulls with a 1.5 MiB runtime handler made the file larger than the
    // 4 MiB it was read with; a legitimate pre-pull, done and pinned, was lost with them.
    let handler = "k".repeat(3 << 19);
    let mut entries: Vec<String> = (0..12)
        .map(|n| format!(r#"{{"image":"bloat-{n}:1","runtimeHandler":"{handler}","state":"failed","reason":"ErrImagePull","submittedMs":1,"finishedMs":2}}"#))
        .collect();
    let now = millis(SystemTime::now());
    entries.push(format!(
        r#"{{"image":"app:1","state":"done","imageRef":"sha256:a","pinForMs":86400000,"submittedMs":{now},"finishedMs":{now}}}"#
    ));
    entries.push(r#"{"image":"app:1","state":"sleeping","submittedMs":1}"#.into());
    let legacy = format!(r#"{{"prePulls":[{}]}}"#, entries.join(","));
    assert!(legacy.len() > 4 << 20, "{} bytes", legacy.len());
    std::fs::write(store.path_of(LEGACY_KEY), legacy).expect("written");

    let (book, written) = store.load(SystemTime::now()).expect("loads");
    let kept: Vec<(&str, &str)> =
        book.entries().map(|entry| (entry.spec.image.as_str(), entry.state.as_str())).collect();
    assert_eq!(kept, [("app:1", "done")]);
    assert_eq!(book.pinned(SystemTime::now()), ["app:1", "sha256:a"], "still pinned");
    let id = book::id_of("app:1", "", "");
    assert_eq!(files(&store), [StateDir::file_name(&id)], "the single file is gone");
    assert_eq!(written.keys().collect::<Vec<_>>(), [&id]);
}

#[test]
fn a_pre_pull_keeps_who_asked_for_it_across_a_restart_and_one_kept_before_owners_has_none() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = PrePullStore::open(root.path()).expect("opens");
    let mut book = Book::default();
    let owned = book.submit(Spec { owner: Some(1000), ..spec("owned:1") }, None, at(0)).expect("queued").id.clone();
    let mut written = Written::new();
    keep(&store, &book, &mut written);
    let (restored, _) = store.load(at(1)).expect("loads");
    assert_eq!(restored.get(&owned).expect("kept").spec.owner, Some(1000));
    let text = std::fs::read_to_string(store.path_of(&owned)).expect("readable");
    assert!(text.contains(r#""owner":1000"#), "{text}");
    let earlier = text.replace(r#","owner":1000"#, "");
    std::fs::write(store.path_of(&owned), earlier).expect("as an earlier version wrote it");
    let (restored, _) = store.load(at(2)).expect("loads");
    assert_eq!(restored.get(&owned).expect("kept").spec.owner, None, "no owner: only admin may cancel it");
}

#[test]
fn a_pre_pull_keeps_its_namespace_across_a_restart_and_a_file_with_one_that_is_no_namespace_is_set_aside() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = PrePullStore::open(root.path()).expect("opens");
    let mut book = Book::default();
    let team = book.submit(Spec { namespace: "team".into(), ..spec("app:1") }, None, at(0)).expect("queued");
    let team = team.id.clone();
    let none = book.submit(spec("app:1"), None, at(0)).expect("queued").id.clone();
    keep(&store, &book, &mut Written::new());
    let text = std::fs::read_to_string(store.path_of(&team)).expect("readable");
    assert!(text.contains(r#""namespace":"team""#), "{text}");
    let untouched = std::fs::read_to_string(store.path_of(&none)).expect("readable");
    assert!(!untouched.contains("namespace"), "none written as before namespaces: {untouched}");
    let (restored, _) = store.load(at(1)).expect("loads");
    assert_eq!(restored.get(&team).expect("kept").spec.namespace, "team");
    assert_eq!(restored.get(&none).expect("kept").spec.namespace, "");
    // Under its own name, a namespace that is no DNS label: not a pre-pull we wrote.
    for bad in ["Team", "-team", "team-", "te/am", &"n".repeat(64)] {
        let id = book::id_of("app:1", "", bad);
        std::fs::write(store.path_of(&id), text.replace(r#""team""#, &format!("{bad:?}"))).expect("written");
    }
    let (restored, _) = store.load(at(2)).expect("loads");
    assert_eq!(restored.entries().count(), 2, "only the two written by the daemon");
    let aside = files(&store).iter().filter(|name| name.ends_with(crate::files::QUARANTINE_SUFFIX)).count();
    assert_eq!(aside, 5, "{:?}", files(&store));
}
