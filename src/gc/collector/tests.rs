//! A pass against a scripted runtime whose disk fills and empties with its images.

use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::time::Instant;

use super::*;
use crate::gc::GcPolicy;
use crate::{
    presence::metrics::PresenceMetrics,
    records::{format::PullCredentials, metrics::RecordsMetrics},
    runtime::{
        UsedImage,
        fake::{FakeRuntime, Hold, State as Disk},
    },
};

const MIB: u64 = 1 << 20;

fn image(id: &str, name: &str, size: u64) -> StoredImage {
    StoredImage { id: id.into(), size, names: vec![name.into()], ..StoredImage::default() }
}

struct Harness {
    runtime: Arc<FakeRuntime>,
    events: Arc<Events>,
    guard: Arc<ImageGuard>,
    records: Arc<PullRecords>,
    gc: ImageGc<FakeRuntime>,
    root: tempfile::TempDir,
}

/// No minimum age, so that images just detected are eligible.
const EAGER: GcPolicy = GcPolicy { min_age: Duration::ZERO, ..GcPolicy::KUBELET };

fn harness(disk: Disk, policy: GcPolicy) -> Harness {
    let root = tempfile::tempdir().expect("tempdir");
    let runtime = Arc::new(FakeRuntime::from(disk));
    collector_over(runtime, root, policy)
}

fn collector_over(runtime: Arc<FakeRuntime>, root: tempfile::TempDir, policy: GcPolicy) -> Harness {
    let guard = Arc::new(ImageGuard::default());
    let events = Arc::new(Events::default());
    let records = Arc::new(
        PullRecords::open(root.path(), Arc::new(RecordsMetrics::register(&mut Registry::default()))).expect("records"),
    );
    let parts = GcParts {
        runtime: runtime.clone(),
        config: GcConfig { policy, ..GcConfig::default() },
        guard: guard.clone(),
        presence: Arc::new(PresenceCache::new(Arc::new(PresenceMetrics::default()), Duration::ZERO)),
        pinned: Arc::default(),
        records: records.clone(),
        ages: AgesFile::open(root.path()).expect("ages"),
        events: events.clone(),
        metrics: Arc::new(GcMetrics::register(&mut Registry::default())),
    };
    Harness { runtime, guard, records, events, gc: ImageGc::new(parts, Instant::now()), root }
}

/// A pull record of `image_ref` written an hour ago, as a pull before the pass would leave it.
fn write_record_pulled_long_ago(h: &Harness, image_ref: &str) {
    let pulled = h.root.path().join("image_manager").join("pulled");
    let (dir, _) = crate::files::StateDir::open(pulled).expect("records dir");
    let record = crate::records::format::PulledRecord::new(image_ref, SystemTime::now() - Duration::from_secs(3600));
    dir.write(image_ref, &record.encode()).expect("written");
}

fn ids(report: &PassReport) -> Vec<(&str, Reason, &Outcome)> {
    report.images.iter().map(|image| (image.id.as_str(), image.reason, &image.outcome)).collect()
}

/// Three unused 10 MiB images on a 100 MiB disk with 60 MiB used otherwise: 90 % used; down to
/// 80 % takes 10 MiB.
fn crowded() -> Disk {
    Disk {
        images: vec![
            image("sha256:a", "a:1", 10 * MIB),
            image("sha256:b", "b:1", 10 * MIB),
            image("sha256:c", "c:1", 10 * MIB),
        ],
        capacity: 100 * MIB,
        other_usage: 60 * MIB,
        ..Disk::default()
    }
}

#[tokio::test]
async fn over_the_high_threshold_images_are_removed_until_the_low_one_and_their_records_go() {
    let h = harness(crowded(), EAGER);
    write_record_pulled_long_ago(&h, "sha256:a");
    // Detected in one pass, then used in order: c, then a, then b (b the most recent).
    h.gc.pass(PassRequest { dry_run: true, ..PassRequest::default() }).await.expect("detects");
    for id in ["sha256:c", "sha256:a", "sha256:b"] {
        h.runtime.state().containers = vec![id.into()];
        h.gc.pass(PassRequest { dry_run: true, ..PassRequest::default() }).await.expect("uses");
    }
    h.runtime.state().containers.clear();
    let report = h.gc.pass(PassRequest::default()).await.expect("passes");
    assert_eq!(ids(&report), [("sha256:c", Reason::Space, &Outcome::Removed)]);
    assert_eq!((report.to_free, report.freed, report.shortfall.as_deref()), (10 * MIB, 10 * MIB, None));
    let (before, after) = (report.usage_before.expect("measured"), report.usage_after.expect("measured"));
    assert_eq!((before.available, after.available), (10 * MIB, 20 * MIB));
    assert_eq!(h.runtime.state().removed, ["sha256:c"]);
    assert!(h.records.record("sha256:a").await.expect("reads").is_some(), "a stays, and its record");

    h.runtime.state().other_usage = 80 * MIB; // 100 %: 20 MiB to free
    let report = h.gc.pass(PassRequest::default()).await.expect("passes");
    assert_eq!(
        ids(&report),
        [("sha256:a", Reason::Space, &Outcome::Removed), ("sha256:b", Reason::Space, &Outcome::Removed)]
    );
    assert!(h.records.record("sha256:a").await.expect("reads").is_none(), "the removed image's pull record goes");
}

#[tokio::test]
async fn each_removal_and_a_shortfall_are_events() {
    let disk = Disk {
        images: vec![image("sha256:a", "a:1", MIB)],
        capacity: 100 * MIB,
        other_usage: 99 * MIB,
        ..Disk::default()
    };
    let h = harness(disk, EAGER);
    let mut watching = h.events.subscribe(crate::events::Filter::default());
    h.gc.pass(PassRequest::default()).await.expect("passes");
    let Some(crate::events::Next::Event(removed)) = watching.next().await else { panic!("an event") };
    assert_eq!(
        (removed.kind, removed.reason, removed.image_ref.as_str(), removed.image.as_str()),
        (EventType::Normal, "ImageGarbageCollected", "sha256:a", "a:1")
    );
    assert_eq!(removed.message, format!("Removed image sha256:a ({MIB} bytes) for space"));
    let Some(crate::events::Next::Event(short)) = watching.next().await else { panic!("an event") };
    assert_eq!((short.kind, short.reason), (EventType::Warning, "FreeDiskSpaceFailed"));
    assert!(short.message.starts_with("Failed to garbage collect required amount of images."), "{short:?}");
}

#[tokio::test]
async fn a_removal_the_runtime_refuses_is_reported_and_the_next_image_goes_instead() {
    let mut disk = crowded();
    disk.refuse_removal.insert("sha256:a".into());
    let h = harness(disk, EAGER);
    let report = h.gc.pass(PassRequest::default()).await.expect("passes");
    assert_eq!(
        ids(&report),
        [
            (
                "sha256:a",
                Reason::Space,
                &Outcome::Failed("rpc error: code = FailedPrecondition desc = image sha256:a is busy".into())
            ),
            ("sha256:b", Reason::Space, &Outcome::Removed),
        ]
    );
    assert_eq!(report.shortfall, None);
    assert_eq!(
        pass_failure(&report).as_deref(),
        Some("image removals failed: [rpc error: code = FailedPrecondition desc = image sha256:a is busy]")
    );
}

#[tokio::test]
async fn too_little_to_free_is_the_kubelets_free_disk_space_failure() {
    let disk = Disk {
        images: vec![image("sha256:a", "a:1", MIB)],
        capacity: 100 * MIB,
        other_usage: 99 * MIB,
        ..Disk::default()
    };
    let h = harness(disk, EAGER);
    let report = h.gc.pass(PassRequest::default()).await.expect("passes");
    assert_eq!(ids(&report), [("sha256:a", Reason::Space, &Outcome::Removed)]);
    let expected = format!(
        "Failed to garbage collect required amount of images. Attempted to free {} bytes, but only found {} bytes eligible to free.",
        20 * MIB,
        MIB
    );
    assert_eq!(report.shortfall.as_deref(), Some(expected.as_str()));
    assert_eq!(pass_failure(&report), Some(expected));
}

#[tokio::test]
async fn a_dry_run_removes_nothing_and_lists_what_a_real_run_then_removes() {
    let h = harness(crowded(), EAGER);
    let dry = h.gc.pass(PassRequest { dry_run: true, ..PassRequest::default() }).await.expect("passes");
    assert_eq!(dry.images.len(), 1);
    assert_eq!(dry.images[0].outcome, Outcome::WouldRemove);
    assert!(h.runtime.state().removed.is_empty());
    assert_eq!(dry.usage_after, None);
    let real = h.gc.pass(PassRequest::default()).await.expect("passes");
    assert_eq!(real.images[0].id, dry.images[0].id);
    assert_eq!(h.runtime.state().removed, [dry.images[0].id.clone()]);
}

#[tokio::test]
async fn containers_the_sandbox_image_and_images_just_handed_out_are_in_use() {
    let mut disk = crowded();
    disk.images.push(image("sha256:pause", "registry.k8s.io/pause:3.6", MIB));
    disk.images.push(image("sha256:d", "docker.io/library/d:1", MIB));
    disk.containers = vec!["sha256:a".into(), "d:1".into()]; // by id, and by the name as asked
    disk.sandbox_image = Some("registry.k8s.io/pause:3.6".into());
    disk.other_usage = 100 * MIB; // full: everything eligible goes
    let h = harness(disk, EAGER);
    assert!(h.guard.handing_out().complete("sha256:b", Instant::now()));
    let report = h.gc.pass(PassRequest::default()).await.expect("passes");
    assert_eq!(ids(&report), [("sha256:c", Reason::Space, &Outcome::Removed)]);
    let kept: Vec<(&str, &str, &str)> =
        report.kept.iter().map(|image| (image.id.as_str(), image.names[0].as_str(), image.reason.as_str())).collect();
    assert_eq!(
        kept,
        [
            ("sha256:a", "a:1", "in use"),
            ("sha256:b", "b:1", "held"),
            ("sha256:d", "docker.io/library/d:1", "in use"),
            ("sha256:pause", "registry.k8s.io/pause:3.6", "sandbox image"),
        ],
        "every image the pass left, with why"
    );
}

#[tokio::test]
async fn a_pass_says_why_it_left_each_image_whether_it_removes_or_not() {
    let mut disk = crowded();
    disk.images.push(StoredImage { pinned: true, ..image("sha256:p", "p:1", MIB) });
    disk.images.push(image("sha256:f", "f:1", MIB));
    disk.other_usage = 58 * MIB;
    let h = harness(disk, EAGER);
    h.gc.set_config(GcConfig { pinned_images: vec!["f:1".into()], ..h.gc.config() });
    let why = |report: &PassReport| -> Vec<(String, &'static str)> {
        report.kept.iter().map(|image| (image.id.clone(), image.reason.as_str())).collect()
    };
    // 90 % used: a goes (detected with the others, first by id); b and c are not needed.
    let dry = h.gc.pass(PassRequest { dry_run: true, ..PassRequest::default() }).await.expect("passes");
    assert_eq!(ids(&dry), [("sha256:a", Reason::Space, &Outcome::WouldRemove)]);
    let expected =
        [("sha256:b", "not needed"), ("sha256:c", "not needed"), ("sha256:f", "pinned"), ("sha256:p", "pinned")];
    assert_eq!(why(&dry), expected.map(|(id, reason)| (id.to_owned(), reason)), "a dry run says the same");
    let real = h.gc.pass(PassRequest::default()).await.expect("passes");
    assert_eq!(ids(&real), [("sha256:a", Reason::Space, &Outcome::Removed)]);
    assert_eq!(why(&real), expected.map(|(id, reason)| (id.to_owned(), reason)));
    let record = &real.kept[0];
    assert_eq!((record.size, record.names.as_slice(), record.last_used), (10 * MIB, &["b:1".to_owned()][..], None));

    // Too young for a minimum age of an hour: kept whatever the disk.
    h.gc.set_config(GcConfig { policy: GcPolicy { min_age: Duration::from_secs(3600), ..EAGER }, ..h.gc.config() });
    let unused = h.gc.pass(PassRequest { dry_run: true, delete_unused: true }).await.expect("passes");
    assert!(unused.images.is_empty());
    let expected = [("sha256:b", "young"), ("sha256:c", "young"), ("sha256:f", "pinned"), ("sha256:p", "pinned")];
    assert_eq!(why(&unused), expected.map(|(id, reason)| (id.to_owned(), reason)));
}

#[tokio::test]
async fn images_are_listed_as_a_pass_sees_them_with_the_ages_it_recorded() {
    let mut disk = crowded();
    disk.images.push(StoredImage { pinned: true, ..image("sha256:p", "registry.k8s.io/pause@sha256:d", MIB) });
    disk.containers = vec!["a:1".into()];
    disk.sandbox_image = Some("c:1".into());
    let h = harness(disk, EAGER);
    let before = h.gc.images().await.expect("lists");
    assert_eq!(before.len(), 4);
    assert!(before.iter().all(|image| image.first_detected.is_none()), "no pass has looked yet");
    h.gc.pass(PassRequest { dry_run: true, ..PassRequest::default() }).await.expect("passes");
    assert!(h.guard.handing_out().complete("sha256:b", Instant::now()));
    let images = h.gc.images().await.expect("lists");
    let listed: Vec<(&str, bool, bool, bool)> =
        images.iter().map(|image| (image.id.as_str(), image.pinned, image.in_use, image.last_used.is_some())).collect();
    assert_eq!(
        listed,
        [
            ("sha256:a", false, true, true),
            ("sha256:b", false, false, false),
            ("sha256:c", true, false, true),
            ("sha256:p", true, false, false),
        ],
        "by id: in use by a container; handed out (neither); the sandbox image; pinned by the runtime"
    );
    assert!(images.iter().all(|image| image.first_detected.is_some()), "the pass saw each");
    assert_eq!((images[0].size, images[0].names.as_slice()), (10 * MIB, &["a:1".to_owned()][..]));
}

#[tokio::test]
async fn pinned_images_are_kept_whatever_the_disk_and_a_reload_changes_them() {
    let mut disk = crowded();
    disk.other_usage = 100 * MIB; // full: everything eligible goes
    let h = harness(disk, EAGER);
    let everything = PassRequest { dry_run: true, delete_unused: true };
    h.gc.set_config(GcConfig { pinned_images: vec!["c:1".into(), "sha256:a".into()], ..h.gc.config() });
    let report = h.gc.pass(everything).await.expect("passes");
    assert_eq!(ids(&report), [("sha256:b", Reason::Unused, &Outcome::WouldRemove)], "by name and by id");

    h.gc.set_config(GcConfig { pinned_images: vec!["b:1".into()], ..h.gc.config() });
    assert_eq!(h.gc.parts.pinned.images(), ["b:1"], "what CRI answers mark pinned too");
    let report = h.gc.pass(everything).await.expect("passes");
    let collected: Vec<&str> = report.images.iter().map(|image| image.id.as_str()).collect();
    assert_eq!(collected, ["sha256:a", "sha256:c"]);
}

#[tokio::test(start_paused = true)]
async fn an_image_handed_out_stays_in_use_for_the_hand_out_window_only() {
    let mut disk = crowded();
    disk.other_usage = 100 * MIB; // full: everything eligible goes
    let h = harness(disk, EAGER);
    h.gc.set_config(GcConfig { hand_out_window: Duration::from_secs(30), ..h.gc.config() });
    assert!(h.guard.handing_out().complete("sha256:b", Instant::now()));
    tokio::time::advance(Duration::from_secs(29)).await;
    let report = h.gc.pass(PassRequest { dry_run: true, delete_unused: true }).await.expect("passes");
    assert!(!report.images.iter().any(|image| image.id == "sha256:b"), "within the window: {report:?}");
    tokio::time::advance(Duration::from_secs(2)).await;
    let report = h.gc.pass(PassRequest { dry_run: true, delete_unused: true }).await.expect("passes");
    assert!(report.images.iter().any(|image| image.id == "sha256:b"), "past the window: {report:?}");
}

#[tokio::test]
async fn an_image_being_pulled_when_its_turn_comes_is_kept() {
    let h = harness(crowded(), EAGER);
    let reference = crate::reference::ImageReference::parse_normalized("a:1").expect("parses");
    h.runtime.state().images[0].names = vec![reference.to_string()];
    let pulling = h.guard.pulling(&reference);
    h.runtime.state().other_usage = 75 * MIB; // 105 %: 25 MiB to free
    let report = h.gc.pass(PassRequest::default()).await.expect("passes");
    assert_eq!(
        ids(&report),
        [
            ("sha256:a", Reason::Space, &Outcome::KeptInUse),
            ("sha256:b", Reason::Space, &Outcome::Removed),
            ("sha256:c", Reason::Space, &Outcome::Removed),
        ]
    );
    drop(pulling);
}

#[tokio::test]
async fn deleting_unused_images_ignores_the_thresholds() {
    let mut disk = crowded();
    disk.other_usage = 0; // 30 % used
    disk.containers = vec!["sha256:b".into()];
    let h = harness(disk, EAGER);
    assert!(h.gc.pass(PassRequest::default()).await.expect("passes").images.is_empty());
    let report = h.gc.pass(PassRequest { delete_unused: true, ..PassRequest::default() }).await.expect("passes");
    let mut removed: Vec<&str> = ids(&report)
        .into_iter()
        .map(|(id, reason, _)| {
            assert_eq!(reason, Reason::Unused);
            id
        })
        .collect();
    removed.sort_unstable();
    assert_eq!(removed, ["sha256:a", "sha256:c"]);
}

#[tokio::test]
async fn ages_survive_a_restart_of_the_collector() {
    let h = harness(crowded(), GcPolicy { high_threshold_percent: 100, ..EAGER });
    h.runtime.state().containers = vec!["sha256:b".into()];
    h.gc.pass(PassRequest::default()).await.expect("passes");
    let (runtime, root) = (h.runtime.clone(), h.root);
    runtime.state().containers.clear();
    let restarted = collector_over(runtime, root, EAGER);
    let report = restarted.gc.pass(PassRequest { dry_run: true, delete_unused: true }).await.expect("passes");
    let b = report.images.iter().find(|image| image.id == "sha256:b").expect("b is unused now");
    assert!(b.last_used.is_some(), "used before the restart, and remembered");
    let a = report.images.iter().find(|image| image.id == "sha256:a").expect("a is unused");
    assert_eq!(a.last_used, None);
    assert!(a.first_detected < SystemTime::now());
    assert_eq!(report.images.last().map(|image| image.id.as_str()), Some("sha256:b"), "the used one goes last");
}

#[tokio::test]
async fn a_torn_ages_file_is_passed_over_and_the_pass_writes_a_whole_one() {
    let h = harness(crowded(), GcPolicy { high_threshold_percent: 100, ..EAGER });
    let ages = AgesFile::open(h.root.path()).expect("ages");
    std::fs::write(ages.path(), b"{\"images\":{\"sha256:a\":{\"firstDetectedMs\":17").expect("torn");
    let report = h.gc.pass(PassRequest { dry_run: true, delete_unused: true }).await.expect("the pass goes on");
    assert_eq!(report.images.len(), 3, "every image newly detected");
    let loaded = ages.load().expect("a whole file now");
    let mut ids: Vec<&str> = loaded.keys().map(String::as_str).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["sha256:a", "sha256:b", "sha256:c"]);
}

#[tokio::test]
async fn a_disk_reported_with_no_capacity_is_an_error() {
    let mut disk = crowded();
    disk.capacity = 0;
    let h = harness(disk, EAGER);
    let error = h.gc.pass(PassRequest::default()).await.expect_err("no capacity");
    assert_eq!(error.to_string(), "invalid capacity 0 on image filesystem");
    assert!(h.runtime.state().removed.is_empty());
}

#[tokio::test]
async fn a_hand_out_that_overlaps_the_removal_of_its_image_fails_and_one_during_the_pass_keeps_its_image() {
    let mut disk = crowded();
    disk.other_usage = 80 * MIB; // full: down to 70 % takes all three images
    let hold = Hold::default();
    disk.removal_hold = Some(hold.clone());
    let h = Arc::new(harness(disk, GcPolicy { low_threshold_percent: 70, ..EAGER }));
    let pass = tokio::spawn({
        let h = h.clone();
        async move { h.gc.pass(PassRequest::default()).await }
    });
    hold.entered.notified().await;
    // sha256:a is being removed: a presence check that saw it present must not hand it out.
    let hand_out = h.guard.handing_out();
    assert!(!hand_out.complete("sha256:a", Instant::now()));
    // sha256:c, due later in this pass, is handed out now: the pass keeps it.
    assert!(hand_out.complete("sha256:c", Instant::now()));
    hold.release.notify_one();
    hold.entered.notified().await; // sha256:b
    hold.release.notify_one();
    let report = pass.await.expect("joins").expect("passes");
    assert_eq!(
        ids(&report),
        [
            ("sha256:a", Reason::Space, &Outcome::Removed),
            ("sha256:b", Reason::Space, &Outcome::Removed),
            ("sha256:c", Reason::Space, &Outcome::KeptInUse),
        ]
    );
    assert!(!hand_out.complete("sha256:a", Instant::now()), "its ticket predates the removal's end");
    drop(hand_out);
    assert!(h.guard.handing_out().complete("sha256:a", Instant::now()), "a hand-out begun after it sees the truth");
}

#[tokio::test]
async fn a_removed_images_pull_record_goes_unless_a_pull_wrote_it_since() {
    let h = harness(crowded(), EAGER);
    let removed_at = SystemTime::now() - Duration::from_secs(5);
    h.records.merge("sha256:a", "docker.io/library/a", PullCredentials::default()).await.expect("recorded");
    h.records.forget("sha256:a", removed_at).await.expect("forgets");
    assert!(h.records.record("sha256:a").await.expect("reads").is_some(), "written after the removal began: kept");
    h.records.forget("sha256:a", SystemTime::now() + Duration::from_secs(5)).await.expect("forgets");
    assert!(h.records.record("sha256:a").await.expect("reads").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_new_configuration_applies_from_the_next_pass_one_new_period_after_it_came() {
    let h = harness(Disk { capacity: 100 * MIB, ..Disk::default() }, EAGER);
    let gc = Arc::new(h.gc);
    let (stop, shutdown) = crate::shutdown::channel();
    let running = tokio::spawn(gc.clone().run(shutdown));
    let passes = || h.runtime.state().image_listings;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(passes(), 1, "the first pass at once");
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert_eq!(passes(), 2, "then every 5 minutes");

    tokio::time::sleep(Duration::from_secs(100)).await;
    gc.set_config(gc.config());
    tokio::time::sleep(Duration::from_secs(201)).await;
    assert_eq!(passes(), 3, "the same configuration again puts no pass off");

    gc.set_config(GcConfig { period: Duration::from_secs(60), ..gc.config() });
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert_eq!(passes(), 3, "no pass before the new period is up");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(passes(), 4);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(passes(), 5, "every new period");

    let off = GcPolicy { high_threshold_percent: 100, ..EAGER };
    gc.set_config(GcConfig { policy: off, ..gc.config() });
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(passes(), 5, "collection turned off");
    gc.set_config(GcConfig { policy: EAGER, ..gc.config() });
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(passes(), 6, "and on again");

    stop.request();
    running.await.expect("the loop stops at shutdown");
}

#[tokio::test]
async fn an_image_kept_for_two_runtime_handlers_is_removed_only_for_the_one_unused_and_its_record_stays() {
    // KEP-4216: the runtime lists sha256:a for the default handler and for kata; a kata
    // container uses kata's copy.
    let kata = StoredImage { runtime_handler: "kata".into(), ..image("sha256:a", "a:1", 10 * MIB) };
    let disk = Disk {
        images: vec![image("sha256:a", "a:1", 10 * MIB), kata],
        containers: vec![UsedImage::new("a:1", "kata")],
        capacity: 100 * MIB,
        ..Disk::default()
    };
    let h = harness(disk, EAGER);
    write_record_pulled_long_ago(&h, "sha256:a");
    let report = h.gc.pass(PassRequest { delete_unused: true, ..PassRequest::default() }).await.expect("passes");
    assert_eq!(ids(&report), [("sha256:a", Reason::Unused, &Outcome::Removed)]);
    assert_eq!(report.images[0].runtime_handler, "", "the default handler's copy");
    let left: Vec<(String, String)> =
        h.runtime.state().images.iter().map(|image| (image.id.clone(), image.runtime_handler.clone())).collect();
    assert_eq!(left, [("sha256:a".to_owned(), "kata".to_owned())], "removed for the default handler only");
    assert!(h.records.record("sha256:a").await.expect("reads").is_some(), "kata's copy keeps the pull record");

    // Once no container uses it, kata's copy goes, asked for by its handler, and the record with it.
    h.runtime.state().containers.clear();
    let report = h.gc.pass(PassRequest { delete_unused: true, ..PassRequest::default() }).await.expect("passes");
    assert_eq!(ids(&report), [("sha256:a", Reason::Unused, &Outcome::Removed)]);
    assert_eq!(report.images[0].runtime_handler, "kata");
    assert!(h.runtime.state().images.is_empty());
    assert!(h.records.record("sha256:a").await.expect("reads").is_none(), "the last copy took the record");
}
