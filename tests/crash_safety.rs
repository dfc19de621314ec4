//! Crash safety of what cri-imaged keeps under `--root-dir` (issue 17): the real binary killed
//! with SIGKILL again and again while image GC passes rewrite the ages file and pulls write their
//! records, against the scripted runtime; and files torn by hand before a start. (The kills during
//! herds of private pulls on real containerd are in `tests/pull_records.rs`.)

mod support;

use std::{
    collections::HashMap,
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    time::Duration,
};

use cri_imaged::{
    api::{PullPolicy, image_manager_client::ImageManagerClient},
    files::StateDir,
    records::format::{Intent, PulledRecord},
};
use support::{
    call, ensure,
    fake_runtime::{FakeImageService, FakeRuntime},
    process::DaemonProcess,
    unix_channel,
};
use tokio::time::Instant;

const IF_NOT_PRESENT: i32 = PullPolicy::IfNotPresent as i32;
const KILLS: usize = 30;
/// Pulls started in each round, killed at any point of theirs.
const PULLS_A_ROUND: usize = 4;
/// What the daemon says of a file it found torn or unreadable.
const CORRUPTION_WARNINGS: [&str; 3] =
    ["image ages not read", "pull record unreadable or corrupt", "pull intent unreadable or corrupt"];

/// GC passes every 10 ms that write the ages and remove nothing: the maximum age (which makes
/// the passes run) is far off, and the disk is never 100 % used.
const GC_FLAGS: [&str; 6] =
    ["--image-gc-period", "10ms", "--image-gc-high-threshold", "100", "--image-maximum-gc-age", "1h"];

/// A daemon's `--root-dir` as [`DaemonProcess`] sets it, and the files under it.
struct Root {
    ages_dir: PathBuf,
    /// The ages file, named as the daemon names it.
    ages: PathBuf,
    pulled: PathBuf,
    pulling: PathBuf,
}

impl Root {
    fn beside(socket: &Path) -> Self {
        let root = socket.parent().expect("the socket is in a directory").join("root");
        let ages_dir = root.join("image_gc");
        Self {
            ages: ages_dir.join(StateDir::file_name("image-ages")),
            ages_dir,
            pulled: root.join("image_manager/pulled"),
            pulling: root.join("image_manager/pulling"),
        }
    }
}

/// What the directories held after a kill.
#[derive(Default)]
struct Left {
    /// First detection of each image in the ages file, in milliseconds.
    first_detected: HashMap<String, u64>,
    records: usize,
    /// The images of the intents: pulls a kill cut, of this round or an earlier one.
    intents: Vec<String>,
    /// Temporary files of writes the kill interrupted.
    temporary: Vec<PathBuf>,
}

/// The ages file decoded strictly (every image with exactly the fields the daemon writes);
/// panics naming the file when it does not decode.
fn decode_ages(path: &Path) -> HashMap<String, u64> {
    let bytes = std::fs::read(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let torn = |why: &str| -> ! { panic!("{} {why}: {:?}", path.display(), String::from_utf8_lossy(&bytes)) };
    let file: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_else(|error| torn(&error.to_string()));
    let Some(images) = file.as_object().filter(|file| file.len() == 1).and_then(|file| file["images"].as_object())
    else {
        torn("is not {\"images\": {...}}")
    };
    images
        .iter()
        .map(|(id, ages)| {
            let fields = ages.as_object().unwrap_or_else(|| torn("holds an image that is not an object"));
            let known = ["firstDetectedMs", "lastUsedMs", "size", "pinned"];
            if !fields.keys().all(|key| known.contains(&key.as_str())) || !fields["size"].is_u64() {
                torn("holds an image with other fields");
            }
            let first = fields["firstDetectedMs"].as_u64().unwrap_or_else(|| torn("lacks a first detection"));
            (id.clone(), first)
        })
        .collect()
}

/// Reads every file the daemon keeps: the ages file and each record and intent must decode
/// (panics naming the first that does not); temporary files are only listed.
fn read_left(root: &Root) -> Left {
    let mut left = Left { first_detected: decode_ages(&root.ages), ..Left::default() };
    for dir in [&root.ages_dir, &root.pulled, &root.pulling] {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().expect("a name").to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                left.temporary.push(path);
                continue;
            }
            let bytes = std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            let shown = || format!("{}: {:?}", path.display(), String::from_utf8_lossy(&bytes));
            if dir == &root.pulled {
                PulledRecord::decode(&bytes).unwrap_or_else(|error| panic!("{error}\n{}", shown()));
                left.records += 1;
            } else if dir == &root.pulling {
                let intent = Intent::decode(&bytes).unwrap_or_else(|error| panic!("{error}\n{}", shown()));
                left.intents.push(intent.image);
            }
        }
    }
    left
}

/// The daemon's warnings about a torn or unreadable file.
fn corruption_warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| line.contains("WARN") && CORRUPTION_WARNINGS.iter().any(|warning| line.contains(warning)))
        .collect()
}

/// Waits until a GC pass of this daemon has loaded the ages, collected and written them.
async fn wait_for_a_pass(daemon: &DaemonProcess) {
    daemon.wait_for_log("a GC pass succeeded", |log| log.contains("Image garbage collection succeeded")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_while_gc_passes_and_pulls_write_the_daemon_leaves_every_file_whole_and_loads_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (socket, runtime_socket) = (dir.path().join("cri-imaged.sock"), dir.path().join("runtime.sock"));
    let service = FakeImageService::default();
    {
        let mut script = service.script.lock().unwrap();
        script.image_fs = Some(dir.path().to_owned());
        // Long enough for some kills to come mid-pull.
        script.pull_delay = Duration::from_millis(15);
    }
    let _runtime = FakeRuntime::start_for_gc(&runtime_socket, service.clone());
    let root = Root::beside(&socket);

    let mut first_seen: HashMap<String, u64> = HashMap::new();
    let mut left_before: Vec<PathBuf> = Vec::new();
    let (mut kills_mid_write, mut kills_mid_pull) = (0, 0);
    let started = Instant::now();
    for round in 1..=KILLS {
        // One more image each round, so that the ages file grows and changes.
        service.add_image(&format!("gc/round-{round}:v1"), &format!("sha256:{:064x}", 0x5eed_0000 + round), 1024);
        let mut daemon = DaemonProcess::start(&socket, &runtime_socket, &GC_FLAGS).await;
        let label = format!("round {round}");
        for path in &left_before {
            assert!(!path.exists(), "{label}: serving, yet the crash's {} remains", path.display());
        }
        let client = ImageManagerClient::new(unix_channel(&daemon.socket));
        let pulls: Vec<_> = (0..PULLS_A_ROUND)
            .map(|pull| {
                let (mut client, image) = (client.clone(), format!("crash/app-{round}-{pull}:v1"));
                tokio::spawn(async move { call(&mut client, ensure(&image, IF_NOT_PRESENT)).await })
            })
            .collect();
        wait_for_a_pass(&daemon).await;
        // The kill lands 0 to 39 ms later, a different moment of the passes (which rewrite the
        // ages every 10 ms) and of the pulls each round.
        tokio::time::sleep(Duration::from_millis(round as u64 * 7 % 40)).await;
        let exit = daemon.kill_hard();
        assert_eq!(exit.signal(), Some(9), "{label}: running until killed: {exit:?}\n{}", daemon.log_text());
        let log = daemon.log_text();
        assert_eq!(corruption_warnings(&log), Vec::<&str>::new(), "{label}: what the last kill left was whole");
        for pull in pulls {
            // Answered, or cut by the kill.
            let _ = pull.await.expect("the pull's task");
        }

        let left = read_left(&root);
        for (id, first) in &left.first_detected {
            let seen = *first_seen.entry(id.clone()).or_insert(*first);
            assert_eq!(seen, *first, "{label}: {id}'s first detection was lost: ages were not loaded");
        }
        assert!(left.first_detected.len() >= round, "{label}: every image listed so far has ages");
        kills_mid_write += usize::from(!left.temporary.is_empty());
        let this_round = format!("crash/app-{round}-");
        kills_mid_pull += usize::from(left.intents.iter().any(|image| image.starts_with(&this_round)));
        left_before = left.temporary;
    }
    let loop_time = started.elapsed();

    // Once more, left to run: what the last kill left is removed, the ages load, and the daemon
    // stops cleanly.
    let daemon = DaemonProcess::start(&socket, &runtime_socket, &GC_FLAGS).await;
    for path in &left_before {
        assert!(!path.exists(), "after the last restart, the crash's {} remains", path.display());
    }
    wait_for_a_pass(&daemon).await;
    let (exit, log) = daemon.terminate().await;
    assert!(exit.success(), "{log}");
    assert_eq!(corruption_warnings(&log), Vec::<&str>::new());
    let left = read_left(&root);
    assert_eq!(left.temporary, Vec::<PathBuf>::new(), "a clean stop leaves no temporary file");
    for (id, first) in &first_seen {
        assert_eq!(left.first_detected.get(id), Some(first), "{id} kept its first detection to the end");
    }
    // Where a kill lands is chance; mid-write is rare enough to be only reported, mid-pull is not.
    assert!(kills_mid_pull > 0, "no kill came while a pull was under way");
    eprintln!(
        "{KILLS} kills in {loop_time:.1?}: {kills_mid_write} left a temporary file, {kills_mid_pull} came mid-pull; \
         {} images aged, {} records at the end",
        left.first_detected.len(),
        left.records,
    );
}

#[tokio::test]
async fn torn_files_written_before_a_start_are_each_reported_once_and_the_daemon_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (socket, runtime_socket) = (dir.path().join("cri-imaged.sock"), dir.path().join("runtime.sock"));
    let service = FakeImageService::default();
    service.script.lock().unwrap().image_fs = Some(dir.path().to_owned());
    service.add_image("gc/kept:v1", "sha256:kept", 1024);
    let _runtime = FakeRuntime::start_for_gc(&runtime_socket, service.clone());
    let root = Root::beside(&socket);
    for created in [&root.ages_dir, &root.pulled, &root.pulling] {
        std::fs::create_dir_all(created).expect("created");
    }
    let record = root.pulled.join(StateDir::file_name("sha256:kept"));
    let intent = root.pulling.join(StateDir::file_name("gc/left:v1"));
    std::fs::write(&root.ages, br#"{"images":{"sha256:kept":{"firstDetectedMs":17"#).expect("a torn ages file");
    std::fs::write(&record, br#"{"kind":"ImagePulledRecord","apiVersion":"kubelet.con"#).expect("a torn record");
    std::fs::write(&intent, b"").expect("an empty intent");
    // Its writer (the pid in its name, above any pid Linux gives) is gone.
    let temporary = root.ages_dir.join(format!("{}.4194305.0.tmp", StateDir::file_name("image-ages")));
    std::fs::write(&temporary, br#"{"images":{"#).expect("a temporary file");

    let daemon = DaemonProcess::start(&socket, &runtime_socket, &GC_FLAGS).await;
    daemon.wait_for_log("every torn file was reported", |log| corruption_warnings(log).len() >= 3).await;
    let mut client = ImageManagerClient::new(unix_channel(&daemon.socket));
    let pulled = call(&mut client, ensure("gc/new:v1", IF_NOT_PRESENT)).await.expect("serves");
    assert!(pulled.pulled, "{pulled:?}");
    wait_for_a_pass(&daemon).await;
    let (exit, log) = daemon.terminate().await;
    assert!(exit.success(), "{log}");

    let warnings: Vec<&str> = log.lines().filter(|line| line.contains("WARN")).collect();
    for file in [&root.ages, &record, &intent] {
        let naming: Vec<&&str> = warnings.iter().filter(|line| line.contains(&file.display().to_string())).collect();
        assert_eq!(naming.len(), 1, "one warning names {}: {warnings:#?}", file.display());
    }
    assert_eq!(corruption_warnings(&log).len(), 3, "{warnings:#?}");
    assert!(!temporary.exists(), "a temporary file is removed at start, without a warning");
    // The pass wrote the ages whole again.
    assert!(decode_ages(&root.ages).contains_key("sha256:kept"));
}
