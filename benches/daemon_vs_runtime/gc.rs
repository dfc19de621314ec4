//! Image garbage collection at scale: the pure planning for 10,000 images and 50,000 containers
//! in process (time, and heap counted by the allocator), and a real dry-run pass through
//! cri-imaged against the CRI calls a pass makes, straight to containerd.

use std::{
    collections::{HashMap, HashSet},
    hint::black_box,
    path::Path,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use cri_imaged::cri::{
    ImageFsInfoRequest, ImageSpec, ListContainersRequest, ListImagesRequest, StatusRequest,
    image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
};
use cri_imaged::{
    api::GarbageCollectRequest,
    gc::{
        ages::AgesFile,
        plan::{self, DiskUsage, GcPolicy, ImageRecord},
    },
    runtime::{ImageRuntime, PullSpec, StoredImage, UsedImage},
};

use crate::{
    ALLOCATOR, Bench, Daemon, Findings, PresenceCall,
    load::Run,
    memory::CountingAllocator,
    report::{self, Table, Verdict},
    support::unix_channel,
    take_turns,
};

/// Images the runtime lists, two names each (a tag and a digest).
pub const IMAGES: usize = 10_000;
/// Containers (all states); each names its image twice, by ref and as its spec asked.
pub const CONTAINERS: usize = 50_000;
/// Images the containers use; the rest are candidates.
/// How long the collector has run on the node planned for: a month, as its records are aged.
const COLLECTED_FOR: Duration = Duration::from_secs(30 * 24 * 3600);

const IMAGES_IN_USE: usize = 6_000;
/// Images no longer listed that some containers still name.
const RETIRED: usize = 500;
/// Disk usage for the space plan: above the kubelet's high threshold (85 %).
const USAGE_PERCENT: u64 = 95;

/// The whole planning (in_use + detect + plan), median over the runs. It runs once a period
/// (5 minutes), so 100 ms is 0.03 % of a core; it runs inline on one of the daemon's runtime
/// workers, which it holds that long while the others serve. Measured 52–62 ms on 2 cores (88 ms
/// while another test suite ran), two fifths of it parsing the 17,500 strings not found as
/// written.
const PLANNING_TARGET: Duration = Duration::from_millis(100);
/// Records' heap per image: a 71-byte id plus a 72-byte bucket at the table's load (191 B at
/// 10,000, whose table is 61 % full; 236 B just after the table doubles, at 44 %).
const RECORD_BYTES_TARGET: f64 = 256.0;
/// A pass's transient heap above the records at 10,000 images and 50,000 containers (measured
/// 2.7 MiB planning, 5.5 MiB keeping the ages: a clone of the records, the file's map and its
/// JSON): with the idle 20 MiB and the records, well inside the 64 MiB peak the herd allows.
const PASS_PEAK_TARGET: usize = 8 << 20;
/// A dry-run pass through cri-imaged against the CRI calls it makes, p50. The pass also writes
/// the ages file (fsynced: 0.57–0.65× the direct calls on its own), reads the image
/// filesystem's statvfs and crosses one more socket; measured 1.97–2.41 on a quiet machine.
const PASS_RATIO_TARGET: f64 = 3.0;

/// The kubelet's policy with no minimum age: every unused image is eligible, so the plan walks
/// (and sorts) them all.
const POLICY: GcPolicy = GcPolicy { min_age: Duration::ZERO, ..GcPolicy::KUBELET };

/// The section: planning in process, then a real pass on the stack.
pub async fn run(bench: &Bench, findings: &mut Findings) {
    let listed = listed_images(IMAGES);
    let used = container_images(&listed, CONTAINERS);
    let runs = if bench.sizes.pairs > 1 { 30 } else { 3 };
    planning(&listed, &used, runs, &bench.work.path().join("gc-ages"), findings);
    heap(&ALLOCATOR, &listed, &used, &bench.work.path().join("gc-heap-ages"), findings);
    let images = if bench.sizes.pairs > 1 { 20 } else { 3 };
    real_pass(bench, images, findings).await;
}

/// `count` images as a busy node lists them: ids and digests of 64 hex digits, names
/// `registry.example/team-N/app-M:tag` (every tenth on Docker Hub, `docker.io/library/app-M:vK`,
/// so that short names find it), sizes of 20 to 500 MB, one in a thousand pinned.
pub fn listed_images(count: usize) -> Vec<StoredImage> {
    (0..count)
        .map(|index| {
            let repository = repository(index);
            let tag = if index.is_multiple_of(10) {
                format!("v{}", index % 7)
            } else {
                format!("1.{}.{}", index % 30, index % 7)
            };
            StoredImage {
                id: format!("sha256:{}", hex64(2 * index as u64)),
                size: 20_000_000 + splitmix(&mut (index as u64 + 7)) % 480_000_000,
                pinned: index % 1000 == 999,
                names: vec![
                    format!("{repository}:{tag}"),
                    format!("{repository}@sha256:{}", hex64(2 * index as u64 + 1)),
                ],
                runtime_handler: String::new(),
            }
        })
        .collect()
}

fn repository(index: usize) -> String {
    if index.is_multiple_of(10) {
        format!("docker.io/library/app-{index}")
    } else {
        format!("registry.example/team-{}/app-{index}", index % 100)
    }
}

/// The image strings of `containers` containers, as CRI ListContainers gives them: each
/// container's image ref (the id), then its spec's image: half by tag, 15 % by digest, 10 % by
/// id, 15 % by a short name (`app-M:vK`, normalised to Docker Hub's), and 10 % one of
/// [`RETIRED`] images no longer listed (exited containers of removed images; their refs too).
/// Containers use the first [`IMAGES_IN_USE`] images, unevenly.
pub fn container_images(listed: &[StoredImage], containers: usize) -> Vec<UsedImage> {
    let in_use = IMAGES_IN_USE.min(listed.len());
    let mut strings = Vec::with_capacity(containers * 2);
    for container in 0..containers {
        let mut state = container as u64 ^ 0x5eed;
        let index = (splitmix(&mut state) % in_use as u64) as usize;
        let image = &listed[index];
        match container % 20 {
            0..=9 => strings.extend([image.id.clone(), image.names[0].clone()]),
            10..=12 => strings.extend([image.id.clone(), image.names[1].clone()]),
            13 | 14 => strings.extend([image.id.clone(), image.id.clone()]),
            15..=17 => {
                let hub = &listed[index - index % 10];
                let short = hub.names[0].trim_start_matches("docker.io/library/").to_owned();
                strings.extend([hub.id.clone(), short]);
            }
            _ => {
                let retired = container % RETIRED;
                strings.extend([
                    format!("sha256:{}", hex64(u64::MAX - retired as u64)),
                    format!("registry.example/team-{}/retired-{retired}:1.0", retired % 100),
                ]);
            }
        }
    }
    strings.into_iter().map(|image| UsedImage::new(image, "")).collect()
}

/// Records as a node that has run for a month keeps them: detected over 30 days, two in three
/// used since.
fn aged_records(listed: &[StoredImage], now: SystemTime) -> HashMap<String, ImageRecord> {
    let mut records = HashMap::new();
    plan::detect(&mut records, listed, &plan::InUse::new(), now);
    for (index, image) in listed.iter().enumerate() {
        let mut state = index as u64 ^ 0xa9e5;
        let record = records.get_mut(&image.id).expect("detected");
        record.first_detected = now - Duration::from_secs(splitmix(&mut state) % (30 * 86_400) + 3_600);
        if !index.is_multiple_of(3) {
            let since = now.duration_since(record.first_detected).expect("in the past").as_secs();
            record.last_used = Some(record.first_detected + Duration::from_secs(splitmix(&mut state) % since));
        }
    }
    records
}

/// A disk at [`USAGE_PERCENT`].
fn disk() -> DiskUsage {
    let capacity = 1 << 40;
    DiskUsage { capacity, available: capacity / 100 * (100 - USAGE_PERCENT) }
}

/// The median and the longest of `times`.
fn median_max(times: &mut [Duration]) -> (Duration, Duration) {
    times.sort_unstable();
    (times[times.len() / 2], times[times.len() - 1])
}

/// Times each step of a periodic pass's planning, `runs` times, on records kept from pass to
/// pass as the collector keeps them (each run a second later); then what else a pass does in
/// process: the same lookup without the strings that need parsing, and keeping the ages in
/// `ages_root`.
fn planning(listed: &[StoredImage], used: &[UsedImage], runs: usize, ages_root: &Path, findings: &mut Findings) {
    let start = SystemTime::now();
    let first = Instant::now();
    let mut fresh = HashMap::new();
    plan::detect(&mut fresh, listed, &plan::InUse::new(), start);
    let first_detect = first.elapsed();
    drop(fresh);

    let mut records = aged_records(listed, start);
    let (mut in_use_times, mut detect_times, mut plan_times, mut full_times, mut unused_times) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut in_use_count, mut chosen, mut spare) = (0, 0, 0);
    for run in 0..runs {
        let now = start + Duration::from_secs(run as u64 + 1);
        let began = Instant::now();
        let in_use = plan::in_use(listed, used, []);
        let used_at = Instant::now();
        plan::detect(&mut records, listed, &in_use, now);
        let detected_at = Instant::now();
        let planned =
            plan::plan(&records, &in_use, disk(), &POLICY, now, COLLECTED_FOR).expect("a disk of some capacity");
        let planned_at = Instant::now();
        let unused = plan::plan_unused(&records, &in_use, &POLICY, now, COLLECTED_FOR);
        let unused_at = Instant::now();
        in_use_times.push(used_at - began);
        detect_times.push(detected_at - used_at);
        plan_times.push(planned_at - detected_at);
        full_times.push(planned_at - began);
        unused_times.push(unused_at - planned_at);
        assert!(planned.space.and_then(|space| space.shortfall()).is_none(), "enough is eligible");
        (in_use_count, chosen, spare) = (in_use.len(), planned.remove.len(), planned.spare.len());
        assert_eq!(unused.remove.len(), chosen + spare, "plan_unused lists every candidate");
        black_box((planned, unused));
    }
    assert!(in_use_count > IMAGES_IN_USE / 2, "the containers' images are found: {in_use_count}");

    // Strings that name a listed image as written; the others are parsed as references.
    let written: HashSet<&str> =
        listed.iter().flat_map(|image| image.names.iter().chain([&image.id])).map(String::as_str).collect();
    let as_written: Vec<UsedImage> =
        used.iter().filter(|used| written.contains(used.image.as_str())).cloned().collect();
    let parsed = used.len() - as_written.len();
    let mut as_written_times = Vec::new();
    for _ in 0..runs {
        let began = Instant::now();
        black_box(plan::in_use(listed, &as_written, []));
        as_written_times.push(began.elapsed());
    }
    let ages = AgesFile::open(ages_root).expect("ages directory");
    let mut save_times = Vec::new();
    for _ in 0..runs {
        let began = Instant::now();
        ages.save(&records).expect("ages kept");
        save_times.push(began.elapsed());
    }
    let ages_bytes = std::fs::read_dir(ages_root.join("image_gc"))
        .expect("ages directory")
        .flatten()
        .filter_map(|entry| entry.metadata().ok())
        .map(|metadata| metadata.len())
        .sum::<u64>();

    let mut table = Table::new(
        format!(
            "Image GC planning in process: {IMAGES} images, {CONTAINERS} containers ({} image strings), disk at {USAGE_PERCENT} %, min age 0",
            used.len()
        ),
        &["step", "runs", "median", "max"],
    );
    let mut row = |step: String, times: &mut Vec<Duration>| {
        let (median, max) = median_max(times);
        table.row(vec![step, times.len().to_string(), report::duration(median), report::duration(max)]);
        (median, max)
    };
    row(
        format!("in_use: {} strings ({parsed} parsed as references) → {in_use_count} images in use", used.len()),
        &mut in_use_times,
    );
    row("detect: records brought up to date".into(), &mut detect_times);
    row(format!("plan: {chosen} chosen for space, {spare} spare"), &mut plan_times);
    let (median, max) = row("whole planning (in_use + detect + plan)".into(), &mut full_times);
    row(format!("plan_unused: {} unused, unpinned", chosen + spare), &mut unused_times);
    row(format!("first detect: {IMAGES} new records (once)"), &mut vec![first_detect]);
    row(
        format!("in_use over the {} strings found as written only (none parsed)", as_written.len()),
        &mut as_written_times,
    );
    row(
        format!("ages file: {IMAGES} records kept (JSON, {} KiB, fsynced), after every pass", ages_bytes / 1024),
        &mut save_times,
    );
    findings.tables.push(table);
    findings.verdicts.push(Verdict {
        what: format!("image GC planning, {IMAGES} images and {CONTAINERS} containers (median)"),
        target: format!("≤ {}", report::duration(PLANNING_TARGET)),
        measured: format!("{} (max {})", report::duration(median), report::duration(max)),
        met: median <= PLANNING_TARGET,
    });
}

/// The records' heap, a planning pass's peak above them, and keeping them on disk (the pass
/// clones them and writes them as JSON), counted by the allocator; `ages_root` for the file.
fn heap(
    allocator: &CountingAllocator,
    listed: &[StoredImage],
    used: &[UsedImage],
    ages_root: &Path,
    findings: &mut Findings,
) {
    let now = SystemTime::now();
    let (bytes_before, allocations_before) = allocator.live();
    let mut records = HashMap::new();
    plan::detect(&mut records, listed, &plan::InUse::new(), now);
    let (bytes_after, allocations_after) = allocator.live();
    let records_bytes = bytes_after.saturating_sub(bytes_before);
    let records_allocations = allocations_after.saturating_sub(allocations_before);

    let base = allocator.reset_peak();
    let in_use = plan::in_use(listed, used, []);
    let in_use_bytes = allocator.live().0.saturating_sub(base);
    plan::detect(&mut records, listed, &in_use, now + Duration::from_secs(1));
    let planned =
        plan::plan(&records, &in_use, disk(), &POLICY, now + Duration::from_secs(2), COLLECTED_FOR).expect("planned");
    let pass_peak = allocator.peak_bytes().saturating_sub(base);
    let pass_kept = allocator.live().0.saturating_sub(base);
    black_box((&planned, &records));
    drop((planned, in_use));

    let ages = AgesFile::open(ages_root).expect("ages directory");
    let base = allocator.reset_peak();
    let copy = records.clone();
    ages.save(&copy).expect("ages kept");
    drop(copy);
    let save_peak = allocator.peak_bytes().saturating_sub(base);

    let mib = |bytes: usize| format!("{:.2} MiB", bytes as f64 / 1_048_576.0);
    let per_image = |bytes: usize| format!("{:.0}", bytes as f64 / IMAGES as f64);
    let mut table = Table::new(
        format!("Image GC heap, counted by the allocator: {IMAGES} images, {CONTAINERS} containers"),
        &["what", "bytes", "bytes per image", "allocations"],
    );
    table.row(vec![
        format!("records: HashMap<String, ImageRecord> of {IMAGES}, built by detect"),
        mib(records_bytes),
        per_image(records_bytes),
        records_allocations.to_string(),
    ]);
    table.row(vec![
        "one planning pass, peak above the records (in_use + detect + plan)".into(),
        mib(pass_peak),
        per_image(pass_peak),
        "-".into(),
    ]);
    table.row(vec![
        "  of which the in-use set and the plan, kept to the pass's end".into(),
        mib(pass_kept),
        per_image(pass_kept),
        "-".into(),
    ]);
    table.row(vec!["  of which the in-use set alone".into(), mib(in_use_bytes), per_image(in_use_bytes), "-".into()]);
    table.row(vec![
        "keeping the ages after the pass (records cloned, JSON written), peak above the records".into(),
        mib(save_peak),
        per_image(save_peak),
        "-".into(),
    ]);
    findings.tables.push(table);
    let per_record = records_bytes as f64 / IMAGES as f64;
    findings.verdicts.push(Verdict {
        what: format!("image GC records' heap per image ({IMAGES} images)"),
        target: format!("≤ {RECORD_BYTES_TARGET:.0} B"),
        measured: format!("{per_record:.0} B ({})", mib(records_bytes)),
        met: per_record <= RECORD_BYTES_TARGET,
    });
    let pass = pass_peak.max(save_peak);
    findings.verdicts.push(Verdict {
        what: format!("image GC pass peak above the records ({IMAGES} images, {CONTAINERS} containers)"),
        target: format!("≤ {}", mib(PASS_PEAK_TARGET)),
        measured: format!("{} (planning {}, keeping the ages {})", mib(pass), mib(pass_peak), mib(save_peak)),
        met: pass <= PASS_PEAK_TARGET,
    });
}

/// `images` small images pulled on the stack, then GarbageCollect dry runs through cri-imaged
/// (thresholds: nothing chosen below 100 %; and delete_unused: every image listed) against the
/// CRI calls a pass makes (ListImages, ListContainers, verbose Status, ImageFsInfo), in turns.
async fn real_pass(bench: &Bench, images: usize, findings: &mut Findings) {
    for index in 0..images {
        let name = format!("bench/gc-{index}:v1");
        bench.stack.seed(&name, &format!("gc bench image {index}"));
        let spec = ImageSpec { image: bench.stack.image(&name), ..Default::default() };
        ImageRuntime::pull_image(&*bench.direct, PullSpec { image: spec, ..Default::default() })
            .await
            .expect("containerd pulls");
    }
    let listed = ImageServiceClient::new(unix_channel(&bench.stack.containerd_socket))
        .list_images(ListImagesRequest { filter: None })
        .await
        .expect("containerd lists its images")
        .into_inner()
        .images
        .len();
    // No minimum age, so that delete_unused lists every image; high threshold 100 (the bench's
    // default): the daemon never collects on its own.
    let daemon = Daemon::start(bench, "gc", &["--minimum-image-ttl-duration", "0s"]).await;
    let sides: [(&str, PresenceCall); 3] = [
        ("containerd directly: the 4 CRI calls", direct_calls(&bench.stack.containerd_socket)),
        ("cri-imaged GarbageCollect{dry_run}", garbage_collect(&daemon, false, 0)),
        ("cri-imaged GarbageCollect{dry_run, delete_unused}", garbage_collect(&daemon, true, images)),
    ];
    let runs = take_turns(&sides, 1, bench.sizes).await;
    let direct = runs[0].quantile_us(0.5);
    let mut table = Table::new(
        format!(
            "Image GC pass on the stack ({listed} images, no containers): GarbageCollect dry run through cri-imaged vs ListImages + ListContainers + Status(verbose) + ImageFsInfo on containerd"
        ),
        &["path", "calls", "p50", "p99", "max", "p50 / direct"],
    );
    for ((path, _), run) in sides.iter().zip(&runs) {
        table.row(vec![
            (*path).to_owned(),
            run.latencies_us.len().to_string(),
            report::micros(run.quantile_us(0.5)),
            report::micros(run.quantile_us(0.99)),
            report::micros(run.quantile_us(1.0)),
            report::ratio(run.quantile_us(0.5).into(), direct.into()),
        ]);
    }
    let saves = ages_saves(bench, runs[1].latencies_us.len().min(1000)).await;
    table.row(vec![
        format!("of which, in process: keeping the ages of {listed} images (fsynced), as every pass does"),
        saves.latencies_us.len().to_string(),
        report::micros(saves.quantile_us(0.5)),
        report::micros(saves.quantile_us(0.99)),
        report::micros(saves.quantile_us(1.0)),
        report::ratio(saves.quantile_us(0.5).into(), direct.into()),
    ]);
    findings.tables.push(table);
    for (side, what) in [(1, "dry run"), (2, "dry run, delete_unused")] {
        let ratio = f64::from(runs[side].quantile_us(0.5)) / f64::from(direct);
        findings.verdicts.push(Verdict {
            what: format!("GarbageCollect {what} over {listed} images / its CRI calls on containerd (p50)"),
            target: format!("≤ {PASS_RATIO_TARGET:.2}"),
            measured: format!(
                "{ratio:.2} ({} vs {})",
                report::micros(runs[side].quantile_us(0.5)),
                report::micros(direct)
            ),
            met: ratio <= PASS_RATIO_TARGET,
        });
    }
}

/// `count` saves of the stack's images' ages, as a pass keeps them, in a directory beside the
/// daemons' (the same filesystem).
async fn ages_saves(bench: &Bench, count: usize) -> Run {
    let listed = ImageRuntime::list_images(&*bench.direct).await.expect("containerd lists its images");
    let mut records = HashMap::new();
    plan::detect(&mut records, &listed, &plan::InUse::new(), SystemTime::now());
    let ages = AgesFile::open(&bench.work.path().join("gc-pass-ages")).expect("ages directory");
    let mut run = Run::default();
    for _ in 0..count.max(1) {
        let began = Instant::now();
        ages.save(&records).expect("ages kept");
        run.latencies_us.push(u32::try_from(began.elapsed().as_micros()).unwrap_or(u32::MAX));
    }
    run.sort();
    run
}

/// What a pass asks containerd, in the collector's order, on raw CRI clients.
fn direct_calls(socket: &Path) -> PresenceCall {
    let channel = unix_channel(socket);
    let (images, runtime) = (ImageServiceClient::new(channel.clone()), RuntimeServiceClient::new(channel));
    Arc::new(move |_| {
        let (mut images, mut runtime) = (images.clone(), runtime.clone());
        Box::pin(async move {
            let failed = |status: tonic::Status| status.to_string();
            let listed = images.list_images(ListImagesRequest { filter: None }).await.map_err(failed)?;
            runtime.list_containers(ListContainersRequest { filter: None }).await.map_err(failed)?;
            runtime.status(StatusRequest { verbose: true }).await.map_err(failed)?;
            let fs = images.image_fs_info(ImageFsInfoRequest {}).await.map_err(failed)?;
            if listed.into_inner().images.is_empty() || fs.into_inner().image_filesystems.is_empty() {
                return Err("containerd listed no images or no image filesystem".to_owned());
            }
            Ok(())
        })
    })
}

/// A GarbageCollect dry run through `daemon`, which must remove nothing and list at least
/// `at_least` images.
fn garbage_collect(daemon: &Daemon, delete_unused: bool, at_least: usize) -> PresenceCall {
    let client = daemon.client.clone();
    Arc::new(move |_| {
        let mut client = client.clone();
        Box::pin(async move {
            let request = GarbageCollectRequest { dry_run: true, delete_unused };
            let response = client.garbage_collect(request).await.map_err(|status| status.to_string())?.into_inner();
            if response.images.iter().any(|image| image.removed) {
                return Err("a dry run removed an image".to_owned());
            }
            if response.images.len() < at_least {
                return Err(format!("listed {} images, expected at least {at_least}", response.images.len()));
            }
            if response.usage_before.is_none() && !delete_unused {
                return Err("no image filesystem usage".to_owned());
            }
            Ok(())
        })
    })
}

/// 64 hex digits, distinct for every `seed`.
fn hex64(seed: u64) -> String {
    let mut state = seed;
    (0..4).map(|_| format!("{:016x}", splitmix(&mut state))).collect()
}

/// SplitMix64: a fixed, well-spread sequence from `state`.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
