//! The book of pre-pulls under abuse (issue 47), with the real binary against a fake runtime:
//! a flood of pre-pulls that all fail leaves room, and a cancel makes room as the refusal says;
//! fields past their bounds are refused naming the field and the bound, and answers stay under
//! gRPC's default whatever the book holds, also after a restart; a submission answered then
//! killed at once is there after the restart; a cancel of a done, pinned pre-pull unpins it.

mod support;

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use cri_imaged::api::{
    self, CancelPrePullRequest, GarbageCollectRequest, GetPrePullRequest, GetStatusRequest, ListPrePullsRequest,
    SubmitPrePullRequest, image_manager_client::ImageManagerClient,
};
use prost::Message;
use support::{
    fake_runtime::{FakeImageService, FakeRuntime},
    process::DaemonProcess,
    unix_channel,
};
use tonic::{Code, Status, transport::Channel};

/// gRPC's default for the largest message a client takes, and tonic's.
const GRPC_DEFAULT_MAX: usize = 4 << 20;

/// Pulls and pre-pulls 8 at a time: a thousand pre-pulls end sooner.
const PARALLEL: [&str; 4] = ["--max-parallel-image-pulls", "8", "--max-parallel-pre-pulls", "8"];

/// The most pre-pulls queued, pulling, held or pinned at once.
const MAX_PRE_PULLS: usize = 1024;

struct Node {
    dir: tempfile::TempDir,
    service: FakeImageService,
    _runtime: FakeRuntime,
}

impl Node {
    /// A fake runtime that GC can measure; pulls as `script` makes them.
    fn start(script: impl FnOnce(&FakeImageService)) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let service = FakeImageService::default();
        service.script.lock().unwrap().image_fs = Some(dir.path().to_owned());
        script(&service);
        let runtime = FakeRuntime::start_for_gc(&dir.path().join("runtime.sock"), service.clone());
        Self { dir, service, _runtime: runtime }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("cri-imaged.sock")
    }

    async fn daemon(&self, extra: &[&str]) -> DaemonProcess {
        DaemonProcess::start(&self.socket(), &self.dir.path().join("runtime.sock"), extra).await
    }

    /// The pre-pulls' files, as [`DaemonProcess`] sets `--root-dir`.
    fn book_dir(&self) -> PathBuf {
        self.dir.path().join("root/pre_pulls")
    }
}

fn client_of(daemon: &DaemonProcess) -> ImageManagerClient<Channel> {
    ImageManagerClient::new(unix_channel(&daemon.socket))
}

fn submission(images: Vec<String>) -> SubmitPrePullRequest {
    SubmitPrePullRequest { images, ..Default::default() }
}

async fn submit(
    client: &mut ImageManagerClient<Channel>,
    request: SubmitPrePullRequest,
) -> Result<Vec<api::PrePull>, Status> {
    client.submit_pre_pull(request).await.map(|answer| answer.into_inner().pre_pulls)
}

async fn counts(client: &mut ImageManagerClient<Channel>) -> api::PrePullCounts {
    let status = client.get_status(GetStatusRequest::default()).await.expect("status").into_inner();
    status.pre_pull_counts.expect("counted")
}

/// Every pre-pull listed, a page at a time; and the largest page's size on the wire.
async fn list_all(client: &mut ImageManagerClient<Channel>) -> (Vec<api::PrePull>, usize) {
    let (mut all, mut largest, mut page_token) = (Vec::new(), 0, String::new());
    loop {
        let request = ListPrePullsRequest { page_size: 0, page_token: page_token.clone() };
        let page = client.list_pre_pulls(request).await.expect("a page").into_inner();
        largest = largest.max(page.encoded_len());
        all.extend(page.pre_pulls);
        if page.next_page_token.is_empty() {
            return (all, largest);
        }
        page_token = page.next_page_token;
    }
}

async fn until(what: &str, limit: Duration, mut condition: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !condition().await {
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_failed_pre_pulls_leaves_room_across_a_restart_and_a_cancel_makes_room_as_the_refusal_says() {
    // Issue 47: 1,024 pre-pulls of images on an unreachable host all fail within seconds.
    let images: Vec<String> = (0..MAX_PRE_PULLS).map(|n| format!("unreachable.test/app-{n}:1")).collect();
    let node = Node::start(|service| {
        for image in &images {
            service.fail_pull(image, Status::unavailable("dial tcp 192.0.2.1:443: connect: connection refused"));
        }
    });
    let mut daemon = node.daemon(&PARALLEL).await;
    let mut client = client_of(&daemon);
    assert_eq!(submit(&mut client, submission(images.clone())).await.expect("room for all").len(), MAX_PRE_PULLS);
    until("every pre-pull failed", Duration::from_secs(300), async || counts(&mut client).await.failed == 1024).await;
    submit(&mut client, submission(vec!["after/flood:1".into()])).await.expect("ended pre-pulls do not count");

    daemon.kill_hard();
    let daemon = node.daemon(&PARALLEL).await;
    let mut client = client_of(&daemon);
    let after = counts(&mut client).await;
    assert_eq!(after.failed, 1024, "still shown after the restart: {after:?}");
    submit(&mut client, submission(vec!["after/restart:1".into()])).await.expect("nor after a restart");
    // Those two are pulled (and done, unpinned: they do not count either) before pulls hang.
    until("the two pulled", Duration::from_secs(30), async || counts(&mut client).await.done == 2).await;

    // Pulls that never end: every pre-pull stays queued or pulling, and counts.
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    node.service.script.lock().unwrap().pull_gate = Some(gate.clone());
    let fill: Vec<String> = (0..MAX_PRE_PULLS).map(|n| format!("waiting/app-{n}:1")).collect();
    submit(&mut client, submission(fill.clone())).await.expect("room up to the cap");
    let refused = submit(&mut client, submission(vec!["one/more:1".into()])).await.expect_err("full");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("cancel some"), "{}", refused.message());
    let again =
        submit(&mut client, submission(vec![images[0].clone()])).await.expect_err("a failed one asked again counts");
    assert_eq!(again.code(), Code::ResourceExhausted);

    let (waiting, _) = list_all(&mut client).await;
    let queued = waiting.iter().find(|pre_pull| pre_pull.state == "queued").expect("one queued");
    let cancelled = client.cancel_pre_pull(CancelPrePullRequest { id: queued.id.clone() }).await.expect("cancelled");
    assert_eq!(cancelled.into_inner().state, "cancelled");
    submit(&mut client, submission(vec!["one/more:1".into()])).await.expect("the cancel made room");
    gate.notify_waiters();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_past_their_bounds_are_refused_and_answers_stay_under_grpcs_default_also_after_a_restart() {
    // The largest image reference a registry can serve, and a runtime's error far past a message's bound.
    let host = ["a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61)].join(".");
    let images: Vec<String> = (0..MAX_PRE_PULLS)
        .map(|n| format!("{host}:5000/{}:{n:0>128}@sha512:{}", "p".repeat(255), "f".repeat(128)))
        .collect();
    let node = Node::start(|service| {
        for image in &images {
            service.fail_pull(image, Status::not_found(format!("{image} not found: {}", "é".repeat(2048))));
        }
    });
    let mut daemon = node.daemon(&PARALLEL).await;
    let mut client = client_of(&daemon);

    // Issue 47: twelve submissions with a 1.5 MiB runtime handler were accepted.
    for _ in 0..12 {
        let request = SubmitPrePullRequest { runtime_handler: "k".repeat(3 << 19), ..submission(vec!["app:1".into()]) };
        let refused = submit(&mut client, request).await.expect_err("refused");
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert_eq!(
            refused.message(),
            "runtime_handler: 1572864 bytes, more than 63 (a RuntimeClass's handler is a DNS label)"
        );
    }
    let long = format!("{}.example/app:1", "a".repeat(1 << 20));
    let refused = submit(&mut client, submission(vec![long.clone()])).await.expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(
        refused.message(),
        format!("images[0]: {} bytes, more than 1024 (the longest image reference)", long.len())
    );

    let request = SubmitPrePullRequest { runtime_handler: "h".repeat(63), ..submission(images.clone()) };
    let submitted = submit(&mut client, request).await.expect("every field at its bound");
    assert_eq!(submitted.len(), MAX_PRE_PULLS);
    until("every pre-pull failed", Duration::from_secs(300), async || counts(&mut client).await.failed == 1024).await;

    for round in ["before the restart", "after the restart"] {
        let (listed, largest_page) = list_all(&mut client).await;
        assert_eq!(listed.len(), MAX_PRE_PULLS, "{round}");
        assert!(listed.iter().all(|pre_pull| pre_pull.message.len() <= 1024), "{round}: messages clipped");
        let status = client.get_status(GetStatusRequest::default()).await.expect("status").into_inner();
        let status_size = status.encoded_len();
        assert!(
            largest_page < GRPC_DEFAULT_MAX / 2 && status_size < GRPC_DEFAULT_MAX / 8,
            "{round}: {largest_page} {status_size}"
        );
        eprintln!("{round}: the largest ListPrePulls page {largest_page} bytes, GetStatus {status_size} bytes");
        let output = Command::new(env!("CARGO_BIN_EXE_cri-imaged"))
            .args(["status", &format!("--socket={}", daemon.socket.display())])
            .stdin(Stdio::null())
            .output()
            .expect("cri-imaged status runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("1024 failed"),
            "{round}: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );

        let files: Vec<u64> = std::fs::read_dir(node.book_dir())
            .expect("the book's files")
            .map(|entry| entry.expect("an entry").metadata().expect("a file").len())
            .collect();
        let largest_file = files.iter().max().copied().unwrap_or_default();
        assert!(
            files.len() == MAX_PRE_PULLS && largest_file < (16 << 10) / 4,
            "{round}: {} files, the largest {largest_file}",
            files.len()
        );
        eprintln!(
            "{round}: {} files, the largest {largest_file} bytes, {} bytes in all",
            files.len(),
            files.iter().sum::<u64>()
        );
        if round == "before the restart" {
            daemon.kill_hard();
            daemon = node.daemon(&PARALLEL).await;
            client = client_of(&daemon);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_answered_then_killed_at_once_is_there_after_the_restart_and_a_bad_file_costs_only_itself() {
    let node = Node::start(|service| {
        // Pulls that never end: nothing but the submission writes the book.
        service.script.lock().unwrap().pull_gate = Some(std::sync::Arc::new(tokio::sync::Notify::new()));
    });
    let mut ids = Vec::new();
    for round in 0..8 {
        let mut daemon = node.daemon(&PARALLEL).await;
        let mut client = client_of(&daemon);
        for earlier in &ids {
            let found = client.get_pre_pull(GetPrePullRequest { id: String::clone(earlier) }).await;
            assert!(found.is_ok(), "round {round}: pre-pull {earlier} answered before a kill is gone: {found:?}");
        }
        let answered = submit(&mut client, submission(vec![format!("killed/app-{round}:1")])).await.expect("queued");
        // SIGKILL as soon as the answer is in.
        let exit = daemon.kill_hard();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&exit), Some(9));
        ids.push(answered[0].id.clone());
    }
    // One pre-pull's file spoilt (not a temporary file a kill mid-write left, which the next start
    // removes): the seven others stay.
    let spoilt = std::fs::read_dir(node.book_dir())
        .expect("listed")
        .map(|entry| entry.expect("an entry").path())
        .find(|path| path.extension().is_none())
        .expect("a pre-pull's file");
    std::fs::write(&spoilt, b"{\"image\":\"killed/app-").expect("torn");
    let daemon = node.daemon(&PARALLEL).await;
    let mut client = client_of(&daemon);
    let (listed, _) = list_all(&mut client).await;
    assert_eq!(listed.len(), 7, "{listed:?}");
    assert!(daemon.log_text().contains("quarantined"), "the bad file is reported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_a_done_pinned_pre_pull_unpins_it_and_image_gc_no_longer_holds_its_image() {
    let node = Node::start(|_| {});
    let flags = ["--minimum-image-ttl-duration", "0s", "--image-gc-hand-out-window", "0s"];
    let daemon = node.daemon(&flags).await;
    let mut client = client_of(&daemon);
    let request = SubmitPrePullRequest {
        pin_for: Some(prost_types::Duration { seconds: 86_400, nanos: 0 }),
        ..submission(vec!["pinned/app:1".into()])
    };
    let id = submit(&mut client, request).await.expect("queued")[0].id.clone();
    let mut done = api::PrePull::default();
    until("the pre-pull done", Duration::from_secs(30), async || {
        done = client.get_pre_pull(GetPrePullRequest { id: id.clone() }).await.expect("found").into_inner();
        done.state == "done"
    })
    .await;
    assert!(done.pinned_until.is_some(), "{done:?}");
    let why = async |client: &mut ImageManagerClient<Channel>| {
        let pass = GarbageCollectRequest { dry_run: true, delete_unused: true };
        let answer = client.garbage_collect(pass).await.expect("a dry run").into_inner();
        let kept = answer.kept.iter().find(|kept| kept.names.iter().any(|name| name == "pinned/app:1"));
        kept.map_or_else(|| "collected".to_owned(), |kept| kept.reason.clone())
    };
    assert_eq!(why(&mut client).await, "held");

    let cancelled =
        client.cancel_pre_pull(CancelPrePullRequest { id: id.clone() }).await.expect("answered").into_inner();
    assert_eq!((cancelled.state.as_str(), cancelled.pinned_until), ("done", None), "done, no longer pinned");
    assert_eq!(why(&mut client).await, "collected", "image GC no longer holds it, as soon as the cancel is answered");
    let after = client.get_pre_pull(GetPrePullRequest { id }).await.expect("found").into_inner();
    assert_eq!(after.pinned_until, None);
}
