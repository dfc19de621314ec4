use super::*;
use crate::{
    events::{Filter, Next},
    runtime::{Held, fake::FakeRuntime},
};

const MIB: u64 = 1 << 20;

fn digest(n: u8) -> String {
    format!("sha256:{}", format!("{n:02x}").repeat(32))
}

/// The downloads these tests move on the fake's content store, by layer and manifest number.
trait Downloads {
    /// Stores an image manifest of `layers` (number, size) for `host`/`path`.
    fn manifest(&self, host: &str, path: &str, manifest: u8, layers: &[(u8, u64)]);
    fn downloading(&self, layer: u8, offset: u64, total: u64);
    fn commit(&self, layer: u8);
    /// How many times the ingests were listed.
    fn lists(&self) -> usize;
    /// How many times a manifest was looked for.
    fn searches(&self) -> usize;
}

impl Downloads for FakeRuntime {
    fn manifest(&self, host: &str, path: &str, manifest: u8, layers: &[(u8, u64)]) {
        let layers: Vec<String> =
            layers.iter().map(|(n, size)| format!(r#"{{"digest":"{}","size":{size}}}"#, digest(*n))).collect();
        let json = format!(r#"{{"schemaVersion":2,"layers":[{}]}}"#, layers.join(","));
        let mut state = self.state();
        state.blobs.insert(digest(manifest), json.into_bytes());
        state.manifests.insert((host.into(), path.into()), digest(manifest));
    }

    fn downloading(&self, layer: u8, offset: u64, total: u64) {
        self.state().ingests.insert(format!("layer-{}", digest(layer)), (offset, total));
    }

    fn commit(&self, layer: u8) {
        let mut state = self.state();
        state.ingests.remove(&format!("layer-{}", digest(layer)));
        state.blobs.insert(digest(layer), Vec::new());
    }

    fn lists(&self) -> usize {
        self.state().ingest_listings
    }

    fn searches(&self) -> usize {
        self.state().manifest_searches
    }
}

fn pod(uid: &str) -> Pod {
    Pod { namespace: "default".into(), name: format!("pod-{uid}"), uid: uid.into() }
}

fn pull(image: &str, waiting: &[&str]) -> TrackedPull {
    let reference = crate::reference::ImageReference::parse_normalized(image).expect("a valid image");
    TrackedPull {
        image: image.into(),
        reference: Arc::new(reference),
        started_at: SystemTime::now(),
        waiting: Arc::new(Mutex::new(waiting.iter().map(|uid| pod(uid)).collect())),
        keep_in: None,
        lease_above: None,
    }
}

fn config(stall: u64) -> ProgressConfig {
    ProgressConfig { stall_timeout: Some(Duration::from_secs(stall)), ..ProgressConfig::default() }
}

/// Lets the polling task run a tick's worth (paused clock).
async fn tick() {
    tokio::time::sleep(ProgressConfig::default().interval).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

fn latest(tracker: &Tracker) -> Option<Report> {
    tracker.reports().borrow().clone()
}

#[tokio::test(start_paused = true)]
async fn a_pull_reports_its_bytes_and_layers_as_they_arrive() {
    let content = Arc::new(FakeRuntime::default());
    let events = Arc::new(Events::default());
    let poller = ProgressPoller::start(content.clone(), config(300), events.clone());
    // Layer 3 was on the node already.
    content.commit(3);
    let tracker = poller.track(pull("registry.local:5000/team/app:v1", &["u1"]));
    tick().await;
    assert_eq!(latest(&tracker), None, "no manifest yet: nothing to report");

    content.manifest("registry.local", "team/app", 9, &[(1, 4 * MIB), (2, 2 * MIB), (3, 8 * MIB)]);
    content.downloading(1, MIB, 4 * MIB);
    tick().await;
    let first = latest(&tracker).expect("a report");
    assert_eq!(first.progress, Progress { bytes_done: MIB, bytes_total: 6 * MIB, layers_done: 0, layers_total: 2 });

    content.downloading(1, 3 * MIB, 4 * MIB);
    content.downloading(2, MIB, 2 * MIB);
    tick().await;
    assert_eq!(latest(&tracker).expect("a report").progress.bytes_done, 4 * MIB);
    content.commit(1);
    content.commit(2);
    tick().await;
    let done = latest(&tracker).expect("a report");
    assert_eq!(done.progress, Progress { bytes_done: 6 * MIB, bytes_total: 6 * MIB, layers_done: 2, layers_total: 2 });
    assert!(done.bytes_per_second > 0, "{done:?}");
    assert_eq!(done.stalled, None);
}

#[tokio::test(start_paused = true)]
async fn progress_events_name_the_pods_waiting_and_come_at_most_twice_a_second() {
    let content = Arc::new(FakeRuntime::default());
    let events = Arc::new(Events::default());
    let mut joined_pod = events.subscribe(Filter { pod_uid: "u2".into(), ..Filter::default() });
    let poller = ProgressPoller::start(content.clone(), config(300), events.clone());
    content.manifest("docker.io", "library/busybox", 9, &[(1, 8 * MIB)]);
    let pulling = pull("docker.io/library/busybox:1.36", &["u1", "u2"]);
    let _tracker = poller.track(pulling);
    // Four seconds of 1 MiB steps every quarter second: 16 polls, each one moved.
    for step in 1..=8 {
        content.downloading(1, step * MIB, 8 * MIB);
        tick().await;
        tick().await;
    }
    drop(poller);
    let mut seen = Vec::new();
    while let Ok(Some(Next::Event(event))) = tokio::time::timeout(Duration::from_millis(1), joined_pod.next()).await {
        seen.push(event);
    }
    assert!((7..=9).contains(&seen.len()), "one event per half second of movement, got {}", seen.len());
    let last = seen.last().expect("events");
    assert_eq!(last.reason, reason::PULL_PROGRESS);
    assert_eq!(last.pod.as_ref().map(|pod| pod.uid.as_str()), Some("u1"));
    assert_eq!(last.waiting.iter().map(|pod| pod.uid.as_str()).collect::<Vec<_>>(), ["u1", "u2"]);
    assert_eq!(last.image, "docker.io/library/busybox:1.36");
    let facts = last.progress.as_ref().expect("progress");
    assert_eq!((facts.bytes_total, facts.layers_total), (8 * MIB, 1));
    assert!(facts.bytes_done >= 7 * MIB, "{facts:?}");
    let done: Vec<u64> = seen.iter().map(|event| event.progress.as_ref().expect("progress").bytes_done).collect();
    assert!(done.windows(2).all(|pair| pair[0] < pair[1]), "rising: {done:?}");
    assert!(last.message.starts_with(r#"Pulling image "docker.io/library/busybox:1.36": "#), "{}", last.message);
}

#[tokio::test(start_paused = true)]
async fn a_completed_pull_says_all_of_it_is_done_and_an_unseen_one_says_nothing() {
    let content = Arc::new(FakeRuntime::default());
    let events = Arc::new(Events::default());
    let mut watcher = events.subscribe(Filter::default());
    let poller = ProgressPoller::start(content.clone(), config(300), events.clone());
    content.manifest("registry.local", "app", 9, &[(1, 4 * MIB), (2, 2 * MIB)]);
    let seen = poller.track(pull("registry.local/app:v1", &["u1"]));
    let unseen = poller.track(pull("registry.local/other:v1", &["u1"]));
    content.downloading(1, 3 * MIB, 4 * MIB);
    tick().await;
    let Some(Next::Event(first)) = watcher.next().await else { panic!("a progress event") };
    let facts = first.progress.as_ref().expect("progress");
    assert_eq!(facts.bytes_done, 3 * MIB);
    let layers = |facts: &ProgressFacts| -> Vec<(String, u64, u64, bool)> {
        facts.layers.iter().map(|layer| (layer.digest.to_string(), layer.size, layer.bytes_done, layer.done)).collect()
    };
    let each = [(digest(1), 4 * MIB, 3 * MIB, false), (digest(2), 2 * MIB, 0, false)];
    assert_eq!(layers(facts), each, "each layer, in the manifest's order");
    assert_eq!(latest(&seen).map(|report| report.layers.len()), Some(2), "as GetStatus reads them");
    // The pull ends between two polls.
    seen.completed();
    unseen.completed();
    let Some(Next::Event(last)) = watcher.next().await else { panic!("the last progress event") };
    let facts = last.progress.as_ref().expect("progress");
    assert_eq!((facts.bytes_done, facts.layers_done), (6 * MIB, 2), "all of it");
    let done = [(digest(1), 4 * MIB, 4 * MIB, true), (digest(2), 2 * MIB, 2 * MIB, true)];
    assert_eq!(layers(facts), done, "every layer done");
    assert_eq!(last.image, "registry.local/app:v1");
    drop(poller);
    let more = tokio::time::timeout(Duration::from_secs(1), watcher.next()).await;
    assert!(!matches!(more, Ok(Some(Next::Event(_)))), "nothing about the pull never seen: {more:?}");
}

#[tokio::test(start_paused = true)]
async fn a_pull_whose_last_poll_told_all_of_it_ends_without_repeating_it() {
    let content = Arc::new(FakeRuntime::default());
    let events = Arc::new(Events::default());
    let mut watcher = events.subscribe(Filter::default());
    let poller = ProgressPoller::start(content.clone(), config(300), events.clone());
    content.manifest("registry.local", "app", 9, &[(1, 4 * MIB)]);
    // The manifest is found while layer 1 is being written; it is committed before the end.
    content.downloading(1, MIB, 4 * MIB);
    let tracker = poller.track(pull("registry.local/app:v1", &[]));
    tick().await;
    content.commit(1);
    tick().await;
    tick().await;
    tick().await;
    tracker.completed();
    drop(poller);
    let mut told = Vec::new();
    while let Ok(Some(Next::Event(event))) = tokio::time::timeout(Duration::from_millis(1), watcher.next()).await {
        told.push(event.progress.as_ref().expect("progress").bytes_done);
    }
    assert_eq!(told, [MIB, 4 * MIB], "the total once");
}

#[tokio::test(start_paused = true)]
async fn pulls_under_way_share_one_listing_and_each_counts_its_own_layers() {
    let content = Arc::new(FakeRuntime::default());
    let poller = ProgressPoller::start(content.clone(), config(300), Arc::new(Events::default()));
    content.manifest("registry.local", "a", 8, &[(1, 4 * MIB), (5, MIB)]);
    content.manifest("registry.local", "b", 9, &[(2, 2 * MIB), (5, MIB)]);
    let a = poller.track(pull("registry.local/a:v1", &[]));
    let b = poller.track(pull("registry.local/b:v1", &[]));
    content.downloading(1, 3 * MIB, 4 * MIB);
    content.downloading(2, MIB, 2 * MIB);
    // Layer 5 is shared: one download, which both wait for.
    content.downloading(5, MIB, MIB);
    tick().await;
    let lists_before = content.lists();
    tick().await;
    assert_eq!(content.lists() - lists_before, 1, "one listing a tick, whatever the number of pulls");
    assert_eq!(latest(&a).expect("a").progress.bytes_done, 4 * MIB);
    assert_eq!(latest(&b).expect("b").progress.bytes_done, 2 * MIB);
}

#[tokio::test(start_paused = true)]
async fn a_download_that_stops_moving_is_stalled_after_the_timeout() {
    let content = Arc::new(FakeRuntime::default());
    let poller = ProgressPoller::start(content.clone(), config(5), Arc::new(Events::default()));
    content.manifest("registry.local", "big", 9, &[(1, 8 * MIB)]);
    let tracker = poller.track(pull("registry.local/big:v1", &[]));
    content.downloading(1, 3 * MIB, 8 * MIB);
    let started = tokio::time::Instant::now();
    let report = tokio::time::timeout(Duration::from_secs(60), tracker.stalled()).await.expect("stalled");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(5) && waited <= Duration::from_secs(6), "stalled after {waited:?}");
    assert_eq!(report.stalled, Some(Duration::from_secs(5)));
    assert_eq!(report.progress.bytes_done, 3 * MIB);
}

#[tokio::test(start_paused = true)]
async fn a_pull_with_nothing_downloading_never_stalls() {
    let content = Arc::new(FakeRuntime::default());
    let poller = ProgressPoller::start(content.clone(), config(5), Arc::new(Events::default()));
    content.manifest("registry.local", "slow", 9, &[(1, 8 * MIB)]);
    // Resolving, or waiting on another pull: no ingest of its layers.
    let tracker = poller.track(pull("registry.local/slow:v1", &[]));
    let stalled = tokio::time::timeout(Duration::from_secs(60), tracker.stalled()).await;
    assert!(stalled.is_err(), "stalled with nothing downloading");
}

#[tokio::test(start_paused = true)]
async fn the_poller_rests_while_nothing_is_tracked() {
    let content = Arc::new(FakeRuntime::default());
    let poller = ProgressPoller::start(content.clone(), config(300), Arc::new(Events::default()));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(content.lists(), 0, "no pull, no listing");
    let tracker = poller.track(pull("registry.local/app:v1", &[]));
    tick().await;
    assert!(content.lists() >= 1);
    drop(tracker);
    tick().await;
    let after = content.lists();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(content.lists(), after, "the last pull went: listing stops");
}

#[tokio::test(start_paused = true)]
async fn a_runtime_without_the_content_service_turns_progress_off() {
    let content = Arc::new(FakeRuntime::default().without_content_service());
    let poller = ProgressPoller::start(content.clone(), config(1), Arc::new(Events::default()));
    let mut first = poller.track(pull("registry.local/app:v1", &[]));
    tick().await;
    tick().await;
    assert_eq!(content.lists(), 1, "asked once");
    let mut second = poller.track(pull("registry.local/other:v1", &[]));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(content.lists(), 1, "never asked again");
    for tracker in [&mut first, &mut second] {
        assert_eq!(latest(tracker), None);
        let stalled = tokio::time::timeout(Duration::from_secs(5), tracker.stalled()).await;
        assert!(stalled.is_err(), "an untracked pull never stalls");
    }
}

#[tokio::test(start_paused = true)]
async fn a_manifest_is_looked_for_only_while_an_unaccounted_download_runs_and_at_most_twice_a_second() {
    let content = Arc::new(FakeRuntime::default());
    let poller = ProgressPoller::start(content.clone(), config(300), Arc::new(Events::default()));
    // An image the node had: nothing is downloaded, its manifest is never looked for.
    let stored = poller.track(pull("registry.local/stored:v1", &[]));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(content.searches(), 0);
    // Someone else's download (say, the kubelet pulling straight from containerd): looked for,
    // but not at every poll.
    content.downloading(7, MIB, 4 * MIB);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let searches = content.searches();
    assert!((9..=11).contains(&searches), "{searches} looks in 5 s");
    drop(stored);
    // Found once, a pull's own layers no longer count as unaccounted.
    content.manifest("registry.local", "app", 9, &[(7, 4 * MIB)]);
    let _app = poller.track(pull("registry.local/app:v1", &[]));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after_found = content.searches();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(content.searches(), after_found, "nothing left to account for");
}

#[test]
fn a_registry_host_loses_its_port_as_in_containerds_labels() {
    assert_eq!(host_without_port("registry.local:5000"), "registry.local");
    assert_eq!(host_without_port("127.0.0.1:41234"), "127.0.0.1");
    assert_eq!(host_without_port("docker.io"), "docker.io");
    assert_eq!(host_without_port("[::1]:5000"), "::1");
}

#[tokio::test(start_paused = true)]
async fn a_pull_waiting_for_its_manifest_is_not_unanswered_while_its_registry_sends_another_pull_bytes() {
    let content = Arc::new(FakeRuntime::default());
    let poller = ProgressPoller::start(content.clone(), config(300), Arc::new(Events::default()));
    content.manifest("registry.local", "big", 8, &[(1, 100 * MIB)]);
    let _big = poller.track(pull("registry.local/big:v1", &[]));
    // Over a link the big download fills, the next manifest of the same registry is slow.
    let quiet_after = |tracker: Tracker| {
        let since = Instant::now();
        tokio::spawn(async move { tracker.unanswered_for(Duration::from_secs(1), since).await })
    };
    let next = quiet_after(poller.track(pull("registry.local/next:v1", &[])));
    let elsewhere = quiet_after(poller.track(pull("other.test/app:v1", &[])));
    for mib in 1..=12 {
        content.downloading(1, mib * MIB, 100 * MIB);
        tick().await;
    }
    assert!(elsewhere.is_finished(), "another registry's bytes say nothing of this one");
    assert!(!next.is_finished(), "its registry is answering: bytes of its other pull keep coming");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(next.is_finished(), "once they stop, the quiet counts");
}

#[tokio::test(start_paused = true)]
async fn a_pull_kept_in_a_lease_has_its_manifest_layers_and_their_downloads_held_once_its_manifest_is_found() {
    let content = Arc::new(FakeRuntime::default());
    let poller = ProgressPoller::start(content.clone(), config(300), Arc::new(Events::default()));
    content.create_lease("cri-imaged.pre-pull.test", SystemTime::now()).await.expect("created");
    let kept = TrackedPull { keep_in: Some("cri-imaged.pre-pull.test".into()), ..pull("registry.local/app:v1", &[]) };
    let _tracker = poller.track(kept);
    content.manifest("registry.local", "app", 9, &[(1, 4 * MIB), (2, MIB)]);
    content.downloading(1, MIB, 4 * MIB);
    tick().await;
    let held = content.state().leases["cri-imaged.pre-pull.test"].clone();
    let expected = [
        Held::Blob(digest(9)),
        Held::Download(format!("manifest-{}", digest(9))),
        Held::Blob(digest(1)),
        Held::Download(format!("layer-{}", digest(1))),
        Held::Blob(digest(2)),
        Held::Download(format!("layer-{}", digest(2))),
    ];
    assert_eq!(held, expected, "the manifest (this one names no config) and its name, each layer and its download");
    tick().await;
    assert_eq!(content.state().leases["cri-imaged.pre-pull.test"].len(), expected.len(), "held once");
}

#[tokio::test(start_paused = true)]
async fn a_pull_resumed_from_its_lease_finds_its_manifest_there_and_says_what_was_fetched_before() {
    let content = Arc::new(FakeRuntime::default());
    let poller = ProgressPoller::start(content.clone(), config(300), Arc::new(Events::default()));
    // An earlier pull, cut short, stored the manifest and layer 2 and half of layer 1, all held
    // by the lease; its manifest predates this pull, so only the lease names it.
    content.manifest("registry.local", "app", 9, &[(1, 4 * MIB), (2, MIB)]);
    content.state().manifests.clear();
    content.commit(2);
    content.create_lease("cri-imaged.pre-pull.test", SystemTime::now()).await.expect("created");
    let held = [Held::Download(format!("manifest-{}", digest(9))), Held::Blob(digest(9))];
    content.hold("cri-imaged.pre-pull.test", &held).await.expect("held");
    content.downloading(1, 2 * MIB, 4 * MIB);
    let resumed =
        TrackedPull { keep_in: Some("cri-imaged.pre-pull.test".into()), ..pull("registry.local/app:v1", &[]) };
    let tracker = poller.track(resumed);
    tick().await;
    let report = latest(&tracker).expect("a report");
    assert_eq!(report.kept, 3 * MIB, "layer 2 whole and 2 MiB of layer 1");
    assert_eq!((report.progress.bytes_done, report.progress.bytes_total), (2 * MIB, 4 * MIB));

    // Without a lease, a manifest found nowhere reports nothing.
    let plain = poller.track(pull("registry.local/app:v1", &[]));
    content.downloading(1, 3 * MIB, 4 * MIB);
    tick().await;
    assert_eq!(latest(&plain), None);
}

#[tokio::test(start_paused = true)]
async fn a_big_pull_has_a_lease_made_for_it_holding_its_downloads_and_a_small_one_none() {
    let content = Arc::new(FakeRuntime::default());
    let poller = ProgressPoller::start(content.clone(), config(300), Arc::new(Events::default()));
    let above = |lease: &str| Some((Arc::from(lease), 4 * MIB));
    let big =
        poller.track(TrackedPull { lease_above: above("cri-imaged.resume.big"), ..pull("registry.local/big:v1", &[]) });
    let small = poller
        .track(TrackedPull { lease_above: above("cri-imaged.resume.small"), ..pull("registry.local/small:v1", &[]) });
    content.manifest("registry.local", "big", 9, &[(1, 4 * MIB), (2, MIB)]);
    content.manifest("registry.local", "small", 19, &[(11, MIB)]);
    content.downloading(1, MIB, 4 * MIB);
    content.downloading(11, MIB / 2, MIB);
    tick().await;

    let report = latest(&big).expect("a report");
    assert_eq!(report.held_in.as_deref(), Some("cri-imaged.resume.big"), "5 MiB to fetch, 4 MiB or more: held");
    let held = content.state().leases["cri-imaged.resume.big"].clone();
    assert!(held.contains(&Held::Download(format!("layer-{}", digest(1)))), "its download is held: {held:?}");
    assert_eq!(latest(&small).expect("a report").held_in, None, "1 MiB to fetch: no lease");
    assert!(!content.state().leases.contains_key("cri-imaged.resume.small"), "none made");
}
