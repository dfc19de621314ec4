//! The kubelet's image GC cases (`image_gc_manager_test.go`), in our words.

use std::time::UNIX_EPOCH;

use super::*;
use crate::runtime::UsedImage;

fn at(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_000_000 + seconds)
}

fn listed(id: &str, size: u64) -> StoredImage {
    StoredImage { id: id.into(), size, ..StoredImage::default() }
}

/// Records used by a container.
fn in_use(ids: &[&str]) -> InUse {
    ids.iter().map(|id| ((*id).to_owned(), Holds::of(Kept::InUse))).collect()
}

fn record(first_detected: u64, last_used: Option<u64>, size: u64) -> ImageRecord {
    let last_used = last_used.map(at);
    ImageRecord { first_detected: at(first_detected), last_used, size, pinned: false, runtime_handler: String::new() }
}

fn records(entries: &[(&str, ImageRecord)]) -> HashMap<String, ImageRecord> {
    entries.iter().map(|(id, record)| ((*id).to_owned(), record.clone())).collect()
}

fn ids(plan: &Plan) -> Vec<(&str, Reason)> {
    plan.remove.iter().map(|(id, reason)| (id.as_str(), *reason)).collect()
}

/// No min age, so that only the thresholds decide.
const NO_MIN_AGE: GcPolicy = GcPolicy { min_age: Duration::ZERO, ..GcPolicy::KUBELET };

#[test]
fn images_are_detected_once_used_when_in_use_and_forgotten_when_gone() {
    let mut known = HashMap::new();
    detect(&mut known, &[listed("a", 1024), listed("b", 2048)], &in_use(&["b"]), at(0));
    assert_eq!(known["a"], record(0, None, 1024));
    assert_eq!(known["b"], record(0, Some(0), 2048));
    let pinned = StoredImage { pinned: true, ..listed("a", 4096) };
    detect(&mut known, &[pinned], &in_use(&[]), at(10));
    assert_eq!(known["a"], ImageRecord { size: 4096, pinned: true, ..record(0, None, 4096) }, "first detection kept");
    assert!(!known.contains_key("b"), "no longer listed");
}

#[test]
fn images_in_use_are_found_by_id_by_name_and_by_normalised_name() {
    let images = [
        StoredImage { names: vec!["docker.io/library/busybox:latest".into()], ..listed("sha256:b", 1) },
        StoredImage {
            names: vec!["registry.k8s.io/pause:3.6".into(), "registry.k8s.io/pause@sha256:d".into()],
            ..listed("sha256:p", 1)
        },
        listed("sha256:unused", 1),
    ];
    let used = ["busybox", "registry.k8s.io/pause@sha256:d", "sha256:b", "gone:1", "not a reference"];
    let used: Vec<UsedImage> = used.into_iter().map(UsedImage::from).collect();
    assert_eq!(super::in_use(&images, &used, []), in_use(&["sha256:b", "sha256:p"]));
    let pinned = super::in_use(&images, &used, [("registry.k8s.io/pause:3.6", Kept::SandboxImage)]);
    assert_eq!(pinned["sha256:p"], Holds::of(Kept::InUse).with(Kept::SandboxImage), "every reason is kept");
    assert_eq!(pinned["sha256:p"].first(), Some(Kept::InUse), "a container's use first");
}

#[test]
fn an_image_kept_for_two_runtime_handlers_is_two_records_used_apart() {
    let kata = |image: StoredImage| StoredImage { runtime_handler: "kata".into(), ..image };
    let busybox = StoredImage { names: vec!["docker.io/library/busybox:latest".into()], ..listed("sha256:b", 1) };
    let pause = listed("sha256:p", 1);
    let images = [busybox.clone(), kata(busybox), pause.clone(), kata(pause), kata(listed("sha256:k", 1))];
    let mut known = HashMap::new();
    detect(&mut known, &images, &in_use(&[]), at(0));
    let mut keys: Vec<&str> = known.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["sha256:b", "sha256:b,kata", "sha256:k,kata", "sha256:p", "sha256:p,kata"]);
    assert_eq!(record_id("sha256:b,kata", &known["sha256:b,kata"]), "sha256:b");
    assert_eq!(record_id("sha256:b", &known["sha256:b"]), "sha256:b");

    // A container under kata uses kata's copy only; one under a handler the image is not
    // listed for keeps every copy (unsure: keep); an image we pin is kept for every handler.
    let used = [UsedImage::new("busybox", "kata"), UsedImage::new("sha256:k", "gvisor")];
    let used = super::in_use(&images, &used, [("sha256:p", Kept::Pinned)]);
    let pinned = Holds::of(Kept::Pinned);
    let mut expected = in_use(&["sha256:b,kata", "sha256:k,kata"]);
    expected.extend([("sha256:p".to_owned(), pinned), ("sha256:p,kata".to_owned(), pinned)]);
    assert_eq!(used, expected);
    let plan = plan_unused(&known, &used, &NO_MIN_AGE, at(10), Duration::from_secs(10));
    assert_eq!(ids(&plan), [("sha256:b", Reason::Unused)], "the default handler's copy goes");
}

#[test]
fn below_the_high_threshold_nothing_is_removed() {
    let known = records(&[("a", record(0, None, 1024))]);
    let disk = DiskUsage { capacity: 1000, available: 200 }; // 80 %
    let plan =
        plan(&known, &in_use(&[]), disk, &GcPolicy::KUBELET, at(1000), Duration::from_secs(1000)).expect("plans");
    assert_eq!(plan, Plan { kept: vec![("a".into(), Kept::NotNeeded)], ..Plan::default() });
}

#[test]
fn over_the_high_threshold_the_oldest_unused_images_go_until_the_low_one_is_reached() {
    let known = records(&[
        ("used-recently", record(0, Some(500), 300)),
        ("never-used-old", record(0, None, 100)),
        ("never-used-new", record(100, None, 100)),
        ("in-use", record(0, Some(999), 1000)),
        ("pinned", ImageRecord { pinned: true, ..record(0, None, 1000) }),
    ]);
    // 90 % used; the low threshold (80 %) needs 200 - 100 = 100 bytes.
    let disk = DiskUsage { capacity: 1000, available: 100 };
    let some =
        plan(&known, &in_use(&["in-use"]), disk, &NO_MIN_AGE, at(1000), Duration::from_secs(1000)).expect("plans");
    assert_eq!(ids(&some), [("never-used-old", Reason::Space)]);
    assert_eq!(some.spare, ["never-used-new", "used-recently"], "the rest, in order, should a removal fail");
    assert_eq!(some.space, Some(SpaceTarget { usage_percent: 90, to_free: 100, found: 100 }));
    assert_eq!(some.space.and_then(|space| space.shortfall()), None);
    // Needing more, the next oldest follow, never the one in use or the pinned one.
    let full = DiskUsage { capacity: 1000, available: 0 };
    let more =
        plan(&known, &in_use(&["in-use"]), full, &NO_MIN_AGE, at(1000), Duration::from_secs(1000)).expect("plans");
    assert_eq!(ids(&more), [("never-used-old", Reason::Space), ("never-used-new", Reason::Space)]);
    let space = more.space.expect("a space pass");
    assert_eq!((space.usage_percent, space.to_free, space.found), (100, 200, 200));
}

#[test]
fn too_few_eligible_bytes_is_the_kubelets_free_disk_space_failure() {
    let known = records(&[("a", record(0, None, 50))]);
    let disk = DiskUsage { capacity: 1000, available: 0 };
    let plan = plan(&known, &in_use(&[]), disk, &NO_MIN_AGE, at(1000), Duration::from_secs(1000)).expect("plans");
    assert_eq!(
        plan.space.and_then(|space| space.shortfall()).as_deref(),
        Some(
            "Failed to garbage collect required amount of images. Attempted to free 200 bytes, but only found 50 bytes eligible to free."
        )
    );
}

#[test]
fn images_detected_less_than_the_minimum_age_ago_or_used_now_stay() {
    let known = records(&[("young", record(950, None, 500)), ("used-now", record(0, Some(1000), 500))]);
    let disk = DiskUsage { capacity: 1000, available: 0 };
    let kept =
        plan(&known, &in_use(&[]), disk, &GcPolicy::KUBELET, at(1000), Duration::from_secs(1000)).expect("plans");
    assert!(kept.remove.is_empty(), "{kept:?}");
    let older = plan_at(&known, at(950 + 120));
    assert_eq!(ids(&older), [("young", Reason::Space)], "two minutes after its detection");
}

fn plan_at(known: &HashMap<String, ImageRecord>, now: SystemTime) -> Plan {
    let disk = DiskUsage { capacity: 1000, available: 0 };
    plan(known, &in_use(&[]), disk, &GcPolicy::KUBELET, now, now.duration_since(at(0)).expect("after")).expect("plans")
}

#[test]
fn with_a_maximum_age_idle_images_go_once_the_collector_has_run_that_long() {
    let policy = GcPolicy { max_age: Duration::from_secs(3600), ..GcPolicy::KUBELET };
    let known = records(&[("idle", record(0, Some(100), 10)), ("busy", record(0, Some(3700), 10))]);
    let plenty = DiskUsage { capacity: 1000, available: 900 };
    let early = plan(&known, &in_use(&[]), plenty, &policy, at(3800), Duration::from_secs(800)).expect("plans");
    assert!(early.remove.is_empty(), "the collector has not run an hour yet");
    let later = plan(&known, &in_use(&[]), plenty, &policy, at(3800), Duration::from_secs(3800)).expect("plans");
    assert_eq!(ids(&later), [("idle", Reason::Age)]);
    let in_use_now =
        plan(&known, &in_use(&["idle"]), plenty, &policy, at(3800), Duration::from_secs(3800)).expect("plans");
    assert!(in_use_now.remove.is_empty(), "an image in use is never too old");
}

#[test]
fn deleting_unused_images_takes_every_eligible_one_whatever_the_disk() {
    let known = records(&[
        ("idle", record(0, Some(100), 10)),
        ("never-used", record(0, None, 10)),
        ("young", record(950, None, 10)),
        ("used-now", record(0, Some(1000), 10)),
        ("in-use", record(0, Some(900), 10)),
        ("pinned", ImageRecord { pinned: true, ..record(0, None, 10) }),
    ]);
    let plan = plan_unused(&known, &in_use(&["in-use"]), &GcPolicy::KUBELET, at(1000), Duration::from_secs(1000));
    assert_eq!(ids(&plan), [("never-used", Reason::Unused), ("idle", Reason::Unused)]);
    assert_eq!((plan.space, plan.spare.len()), (None, 0));
}

#[test]
fn a_disk_of_no_capacity_is_an_error_and_more_available_than_capacity_is_capped() {
    let known = records(&[("a", record(0, None, 10))]);
    let none = DiskUsage { capacity: 0, available: 0 };
    let error = plan(&known, &in_use(&[]), none, &GcPolicy::KUBELET, at(1000), Duration::from_secs(1000))
        .expect_err("capacity 0");
    assert_eq!(error.to_string(), "invalid capacity 0 on image filesystem");
    let odd = DiskUsage { capacity: 1000, available: 5000 };
    assert_eq!(
        plan(&known, &in_use(&[]), odd, &GcPolicy::KUBELET, at(1000), Duration::from_secs(1000)).expect("plans").space,
        None
    );
}

#[test]
fn policies_are_validated_with_the_kubelets_messages() {
    let minute = Duration::from_secs(60);
    let cases = [
        (
            (101, 80, minute, Duration::ZERO),
            "imageGCHighThresholdPercent (--image-gc-high-threshold) 101 must be between 0 and 100, inclusive",
        ),
        (
            (85, -1, minute, Duration::ZERO),
            "imageGCLowThresholdPercent (--image-gc-low-threshold) -1 must be between 0 and 100, inclusive",
        ),
        (
            (80, 85, minute, Duration::ZERO),
            "imageGCLowThresholdPercent (--image-gc-low-threshold) 85 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 80",
        ),
        ((85, 80, minute, minute), "imageMaximumGCAge 1m0s must be greater than imageMinimumGCAge 1m0s"),
        (
            (100, 100, minute, Duration::ZERO),
            "imageGCLowThresholdPercent (--image-gc-low-threshold) 100 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 100",
        ),
    ];
    for ((high, low, min_age, max_age), message) in cases {
        let error = GcPolicy::try_new(high, low, min_age, max_age).expect_err(message);
        assert_eq!(error.to_string(), message);
    }
    assert_eq!(GcPolicy::try_new(85, 80, Duration::from_secs(120), Duration::ZERO), Ok(GcPolicy::KUBELET));
    let off = GcPolicy::try_new(100, 80, minute, Duration::ZERO).expect("high 100 turns collection off");
    assert!(off.disabled());
    assert!(!GcPolicy::KUBELET.disabled());
}

#[test]
fn the_space_pass_counts_what_the_age_pass_frees() {
    let policy = GcPolicy { max_age: Duration::from_secs(3600), ..NO_MIN_AGE };
    let known = records(&[("aged", record(0, Some(0), 150)), ("recent", record(0, Some(3700), 100))]);
    // 90 % used: down to 80 % takes 100 bytes, and removing the aged image frees 150.
    let disk = DiskUsage { capacity: 1000, available: 100 };
    let both = plan(&known, &in_use(&[]), disk, &policy, at(3800), Duration::from_secs(3800)).expect("plans");
    assert_eq!(ids(&both), [("aged", Reason::Age)], "below the high threshold once the aged image is gone");
    let space = plan_space(&known, &in_use(&[]), disk, &policy, (at(3800), Duration::from_secs(3800)), &HashSet::new())
        .expect("plans");
    assert_eq!(ids(&space), [("aged", Reason::Space)], "without the age pass, space takes the oldest");
}

#[test]
fn with_a_maximum_age_a_never_used_image_goes_that_long_after_its_detection() {
    let policy = GcPolicy { max_age: Duration::from_secs(3600), ..GcPolicy::KUBELET };
    let known = records(&[("old", record(0, None, 10)), ("new", record(3000, None, 10))]);
    let aged = plan_age(&known, &in_use(&[]), &policy, at(4000), Duration::from_secs(4000));
    assert_eq!(aged, ["old"]);
}

#[test]
fn after_a_restart_the_minimum_age_counts_from_the_start_again() {
    // Detected long ago, but the collector started 60 s ago: an image handed out just before
    // the restart is not taken while its container is being created.
    let known = records(&[("a", record(0, Some(500), 10))]);
    let full = DiskUsage { capacity: 1000, available: 0 };
    let just_started =
        plan(&known, &in_use(&[]), full, &GcPolicy::KUBELET, at(1000), Duration::from_secs(60)).expect("plans");
    assert!(just_started.remove.is_empty(), "{just_started:?}");
    let unused = plan_unused(&known, &in_use(&[]), &GcPolicy::KUBELET, at(1000), Duration::from_secs(60));
    assert!(unused.remove.is_empty());
    let later =
        plan(&known, &in_use(&[]), full, &GcPolicy::KUBELET, at(1000), Duration::from_secs(120)).expect("plans");
    assert_eq!(ids(&later), [("a", Reason::Space)]);
}

fn kept(plan: &Plan) -> Vec<(&str, &str)> {
    plan.kept.iter().map(|(key, why)| (key.as_str(), why.as_str())).collect()
}

/// One record of each kind: a container's, the sandbox image, pinned by the runtime and by
/// `--pinned-image`, handed out, young, and two old enough to go.
fn every_kind() -> (HashMap<String, ImageRecord>, InUse) {
    let known = records(&[
        ("container", record(0, Some(900), 10)),
        ("sandbox", record(0, Some(900), 10)),
        ("runtime-pinned", ImageRecord { pinned: true, ..record(0, None, 10) }),
        ("flag-pinned", record(0, None, 10)),
        ("handed-out", record(0, Some(900), 10)),
        ("young", record(950, None, 10)),
        ("old", record(0, None, 10)),
        ("older", record(0, Some(100), 10)),
    ]);
    let mut used = in_use(&["container"]);
    used.insert("sandbox".into(), Holds::of(Kept::SandboxImage));
    used.insert("flag-pinned".into(), Holds::of(Kept::Pinned));
    used.insert("handed-out".into(), Holds::of(Kept::Held));
    (known, used)
}

#[test]
fn a_plan_says_why_it_leaves_every_image_it_does_not_remove() {
    let (known, used) = every_kind();
    let (now, collected_for) = (at(1000), Duration::from_secs(1000));
    let holding = [
        ("container", "in use"),
        ("flag-pinned", "pinned"),
        ("handed-out", "held"),
        ("runtime-pinned", "pinned"),
        ("sandbox", "sandbox image"),
    ];
    // Every unused one old enough goes; the young one stays.
    let unused = plan_unused(&known, &used, &GcPolicy::KUBELET, now, collected_for);
    assert_eq!(ids(&unused), [("old", Reason::Unused), ("older", Reason::Unused)]);
    let mut expected = holding.to_vec();
    expected.insert(5, ("young", "young"));
    assert_eq!(kept(&unused), expected);

    // Below the high threshold nothing is needed, however old.
    let roomy = DiskUsage { capacity: 1000, available: 900 };
    let below = plan(&known, &used, roomy, &GcPolicy::KUBELET, now, collected_for).expect("plans");
    let mut expected = holding.to_vec();
    expected.extend([("old", "not needed"), ("older", "not needed"), ("young", "not needed")]);
    expected.sort_unstable();
    assert_eq!((below.remove.len(), kept(&below)), (0, expected));

    // Over it, the oldest goes; the next is not needed, the young one could not go.
    let tight = DiskUsage { capacity: 1000, available: 195 }; // 81 % over 80 %: 5 bytes to free
    let policy = GcPolicy { high_threshold_percent: 81, ..GcPolicy::KUBELET };
    let over = plan(&known, &used, tight, &policy, now, collected_for).expect("plans");
    assert_eq!(ids(&over), [("old", Reason::Space)]);
    let mut expected = holding.to_vec();
    expected.extend([("older", "not needed"), ("young", "young")]);
    expected.sort_unstable();
    assert_eq!(kept(&over), expected);
}

#[test]
fn images_the_age_pass_removes_are_not_among_those_kept() {
    let (known, used) = every_kind();
    let policy = GcPolicy { max_age: Duration::from_secs(600), ..GcPolicy::KUBELET };
    let roomy = DiskUsage { capacity: 1000, available: 900 };
    let aged = plan(&known, &used, roomy, &policy, at(1000), Duration::from_secs(1000)).expect("plans");
    assert_eq!(ids(&aged), [("old", Reason::Age), ("older", Reason::Age)]);
    assert_eq!(aged.kept.len(), known.len() - 2);
    assert!(aged.kept.iter().all(|(key, _)| key != "old" && key != "older"));
}

#[test]
fn with_collection_off_every_image_is_kept_and_the_disk_is_not_asked() {
    let (known, used) = every_kind();
    let off = GcPolicy { high_threshold_percent: 100, ..GcPolicy::KUBELET };
    let no_disk = DiskUsage { capacity: 0, available: 0 };
    let plan = plan(&known, &used, no_disk, &off, at(1000), Duration::from_secs(1000)).expect("off needs no disk");
    assert!(plan.remove.is_empty());
    assert_eq!(plan.kept.len(), known.len());
    assert!(kept(&plan).contains(&("old", "not needed")) && kept(&plan).contains(&("sandbox", "sandbox image")));
}

#[test]
fn of_two_reasons_to_keep_an_image_the_first_is_told() {
    let holds = Holds::of(Kept::Held).with(Kept::SandboxImage);
    assert_eq!(holds.first(), Some(Kept::SandboxImage));
    assert!(holds.has(Kept::Held) && !holds.has(Kept::InUse));
    assert_eq!(Holds::default().first(), None);
    let pinned_by_runtime = ImageRecord { pinned: true, ..record(0, None, 1) };
    let held = InUse::from([("a".to_owned(), Holds::of(Kept::Held))]);
    assert_eq!(why_kept("a", &pinned_by_runtime, &held, Kept::NotNeeded), Kept::Pinned, "a pin before a hand-out");
}
