use super::*;
use crate::{cri::ImageSpec, runtime::PresentImage, shutdown};

/// A directory holding an (empty) image store.
fn store() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join(IMAGES_JSON), "[]").expect("images.json");
    dir
}

/// Rewrites `images.json` as containers/storage does: a new file renamed over the old one.
fn rewrite(dir: &Path) {
    let temporary = dir.join(".tmp-images.json1234");
    std::fs::write(&temporary, "[]").expect("temporary file");
    std::fs::rename(&temporary, dir.join(IMAGES_JSON)).expect("rename");
}

fn spec(image: &str) -> ImageSpec {
    ImageSpec { image: image.into(), ..Default::default() }
}

fn present(id: &str) -> PresentImage {
    PresentImage { id: id.into(), size: 1, repo_digests: Vec::new() }
}

#[test]
fn only_the_store_files_and_the_directory_itself_matter() {
    let name = |text: &'static [u8]| Some(CStr::from_bytes_with_nul(text).expect("a C string"));
    assert_eq!(classify(ReadFlags::MOVED_TO, name(b"images.json\0")), Seen::Changed);
    assert_eq!(classify(ReadFlags::MODIFY, name(b"images.lock\0")), Seen::Changed);
    assert_eq!(classify(ReadFlags::CLOSE_WRITE, name(b"images.lock\0")), Seen::Nothing, "a reader's unlock");
    assert_eq!(classify(ReadFlags::DELETE, name(b"images.json\0")), Seen::Changed);
    assert_eq!(classify(ReadFlags::CLOSE_WRITE, name(b".tmp-images.json42\0")), Seen::Nothing);
    assert_eq!(classify(ReadFlags::CREATE | ReadFlags::ISDIR, name(b"0123abcd\0")), Seen::Nothing);
    assert_eq!(classify(ReadFlags::OPEN, name(b"images.json\0")), Seen::Nothing);
    for gone in [ReadFlags::IGNORED, ReadFlags::UNMOUNT, ReadFlags::DELETE_SELF, ReadFlags::MOVE_SELF] {
        assert_eq!(classify(gone, None), Seen::Lost, "{gone:?}");
    }
    assert_eq!(classify(ReadFlags::QUEUE_OVERFLOW, None), Seen::Overflow);
}

#[tokio::test]
async fn a_rewrite_is_queued_by_the_time_the_rename_returns() {
    let dir = store();
    let watch = StoreWatch::open(dir.path()).expect("watched");
    assert!(!watch.drain().expect("drained"), "nothing changed yet");
    rewrite(dir.path());
    // No waiting for readiness: the rename queued its event before it returned.
    assert!(watch.drain().expect("drained"), "the rewrite is seen");
    assert!(!watch.drain().expect("drained"), "and read once");
    std::fs::create_dir(dir.path().join("0123abcd")).expect("an image's directory");
    std::fs::write(dir.path().join("0123abcd/manifest"), "{}").expect("a big data file");
    assert!(!watch.drain().expect("drained"), "other files change nothing");
}

#[tokio::test]
async fn a_directory_without_images_json_or_its_lock_is_no_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(matches!(StoreWatch::open(dir.path()), Err(StoreWatchError::NotAStore(_))));
    std::os::unix::fs::symlink("/etc/hostname", dir.path().join(IMAGES_JSON)).expect("a link");
    std::os::unix::fs::symlink("/etc/hostname", dir.path().join(IMAGES_LOCK)).expect("a link");
    assert!(!holds_store(dir.path()), "a link is not followed");
}

/// containers/storage's lock as CRI-O 1.34 uses it: every reader opens `images.lock` read-write
/// to lock it and closes it unwritten; a writer records its change with a `pwrite` into it.
#[tokio::test]
async fn a_reader_closing_the_lock_is_no_change_a_writer_recording_one_is() {
    use std::os::unix::fs::FileExt;
    let dir = store();
    std::fs::write(dir.path().join(IMAGES_LOCK), "").expect("images.lock");
    let watch = StoreWatch::open(dir.path()).expect("watched");
    let lock = || std::fs::OpenOptions::new().read(true).write(true).open(dir.path().join(IMAGES_LOCK));
    for _ in 0..3 {
        drop(lock().expect("the lock opened read-write"));
    }
    assert!(!watch.drain().expect("drained"), "readers changed nothing");
    lock().expect("the lock opened read-write").write_at(b"0123456789abcdef", 0).expect("the write recorded");
    assert!(watch.drain().expect("drained"), "the recorded write is a change");
}

/// A fresh CRI-O (1.34) has opened its store, which creates `images.lock`, but has pulled
/// nothing, so there is no `images.json` yet: the store is watched all the same, and the first
/// pull's `images.json` is a change.
#[tokio::test]
async fn a_fresh_store_holding_only_its_lock_is_watched_and_its_first_pull_seen() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join(IMAGES_LOCK), "").expect("images.lock");
    assert!(holds_store(dir.path()));
    let watch = StoreWatch::open(dir.path()).expect("watched");
    assert!(!watch.drain().expect("drained"), "nothing changed yet");
    rewrite(dir.path());
    assert!(watch.drain().expect("drained"), "the first images.json is seen");
}

/// Queues more events than the kernel keeps, without reading any.
fn overflow(dir: &Path) {
    let limit: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(16384);
    // Alternating, so that the kernel cannot merge one event into the one before it.
    for _ in 0..=limit / 2 {
        std::fs::write(dir.join(IMAGES_LOCK), "").expect("lock written");
        std::fs::remove_file(dir.join(IMAGES_LOCK)).expect("lock deleted");
    }
}

#[tokio::test]
async fn an_overflowing_queue_is_an_error_not_a_quiet_store() {
    let dir = store();
    let watch = StoreWatch::open(dir.path()).expect("watched");
    overflow(dir.path());
    assert!(matches!(watch.drain(), Err(StoreWatchError::Overflow)));
}

/// A cache fed by a watcher of `dir`, once the watch is live.
async fn watched(dir: &Path, max_staleness: Duration) -> (Arc<PresenceCache>, shutdown::ShutdownTrigger) {
    let cache = Arc::new(PresenceCache::new(Arc::default(), max_staleness));
    let (trigger, shutdown) = shutdown::channel();
    tokio::spawn(watch(dir.to_owned(), cache.clone(), shutdown));
    until(|| cache.is_watching()).await;
    assert_eq!(cache.signal(), Signal::ImageStore(dir.to_owned()));
    (cache, trigger)
}

/// Waits (in real time, at most 10 s) until `condition` holds.
async fn until(condition: impl Fn() -> bool) {
    for _ in 0..1000 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not met within 10 s");
}

#[tokio::test]
async fn a_strict_check_never_misses_a_change_that_has_returned() {
    let dir = store();
    let (cache, _trigger) = watched(dir.path(), Duration::ZERO).await;
    cache.remember(cache.ticket().expect("watching"), &spec("busybox:1"), present("sha256:a"));
    assert_eq!(cache.recall_image(&spec("busybox:1"), Instant::now()).await, Some(present("sha256:a")));
    // Removed behind our back; the watcher has not been woken yet (this task has not yielded).
    rewrite(dir.path());
    assert_eq!(cache.recall_image(&spec("busybox:1"), Instant::now()).await, None);
    assert!(cache.is_empty());
}

#[tokio::test]
async fn an_overflow_forgets_everything_and_voids_older_tickets_until_watched_again() {
    let dir = store();
    let (cache, _trigger) = watched(dir.path(), DEFAULT_STALENESS).await;
    let ticket = cache.ticket().expect("watching");
    cache.remember(ticket, &spec("busybox:1"), present("sha256:a"));
    overflow(dir.path());
    until(|| cache.ticket().is_some_and(|now| now != ticket)).await;
    assert!(cache.is_empty());
    cache.remember(ticket, &spec("busybox:1"), present("sha256:a"));
    assert!(cache.is_empty(), "a ticket from before the overflow is void");
}

const DEFAULT_STALENESS: Duration = super::super::DEFAULT_MAX_STALENESS;

#[tokio::test]
async fn a_lost_watch_stops_remembering_until_the_store_is_back() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("overlay-images");
    std::fs::create_dir(&dir).expect("store dir");
    std::fs::write(dir.join(IMAGES_JSON), "[]").expect("images.json");
    let (cache, _trigger) = watched(&dir, DEFAULT_STALENESS).await;
    cache.remember(cache.ticket().expect("watching"), &spec("busybox:1"), present("sha256:a"));
    let aside = parent.path().join("moved");
    std::fs::rename(&dir, &aside).expect("store moved away");
    until(|| !cache.is_watching()).await;
    assert!(cache.is_empty());
    assert_eq!(cache.ticket(), None, "nothing is remembered meanwhile");
    assert_eq!(cache.signal(), Signal::None);
    std::fs::rename(&aside, &dir).expect("store back");
    until(|| cache.is_watching()).await;
}
