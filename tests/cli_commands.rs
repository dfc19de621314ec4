//! The commands for people, as a person meets them: the real binary against a real daemon on
//! real containerd, in a tmux terminal of 80×24 where a person would look (the pull's progress
//! mid-pull), and through a pipe where a script would read.

mod support;

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use support::{throttled_node::ThrottledNode, tmux::Terminal};

const MIB: u64 = 1 << 20;
const BIN: &str = env!("CARGO_BIN_EXE_cri-imaged");

/// `cri-imaged ARGS` with stdout and stderr piped (no terminal): its exit status, stdout, stderr.
fn cli(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(BIN).args(args).stdin(Stdio::null()).output().expect("cri-imaged runs");
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).expect("UTF-8 output");
    (output.status.code().unwrap_or(-1), text(output.stdout), text(output.stderr))
}

fn socket_flag(socket: &Path) -> String {
    format!("--socket={}", socket.display())
}

#[test]
fn backoff_clear_with_nothing_to_clear_shows_both_ways_to_name_it() {
    let (status, _, stderr) = cli(&["backoff", "clear"]);
    assert_eq!(status, 2, "{stderr}");
    assert!(stderr.contains("cri-imaged backoff clear [OPTIONS] <POD_UID> <IMAGE>"), "{stderr}");
    assert!(stderr.contains("cri-imaged backoff clear [OPTIONS] --all"), "{stderr}");
}

#[test]
fn every_command_with_a_table_explains_each_column_in_its_help() {
    let tables: [(&str, &[&str]); 5] = [
        ("images", &["IMAGE", "IMAGE ID", "SIZE", "AGE", "LAST USED", "PINNED", "IN USE", "VERIFIED"]),
        ("backoff", &["POD", "POD UID", "IMAGE", "RETRY IN", "DELAY", "LAST ERROR"]),
        ("gc", &["IMAGE", "IMAGE ID", "SIZE", "WHY", "LAST USED", "RESULT"]),
        ("prepull", &["ID", "IMAGE", "NAMESPACE", "STATE", "PRIORITY", "AGE", "DETAIL"]),
        ("status", &["IMAGE", "STATE", "CALLERS", "ASKED", "PROGRESS"]),
    ];
    for (command, columns) in tables {
        let (status, help, stderr) = cli(&[command, "--help"]);
        assert_eq!(status, 0, "{stderr}");
        for column in columns {
            let explained = help.lines().any(|line| {
                line.strip_prefix("  ").and_then(|rest| rest.strip_prefix(column)).is_some_and(|rest| {
                    rest.starts_with("  ") && rest.trim_start().chars().next().is_some_and(char::is_lowercase)
                })
            });
            assert!(explained, "{command} --help explains {column}:\n{help}");
        }
        assert!(help.contains("Exit status:"), "{help}");
    }
    let (_, help, _) = cli(&["images", "--help"]);
    assert!(help.contains("`-` until then, as for an image just pulled"), "{help}");
    assert!(help.contains("`never` if none"), "{help}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_on_a_terminal_shows_its_layer_and_total_bars_then_what_it_pulled() {
    let images = [("first:v1", 8 * MIB), ("big:v1", 24 * MIB)];
    // One pull at a time (the kubelet's default): big waits for first's slot.
    let Some(node) = ThrottledNode::start(&images, 2 * MIB, &["--serialize-image-pulls"]).await else { return };
    let socket = socket_flag(&node.daemon.socket);
    let mut first = Command::new(BIN)
        .args(["pull", &socket, &node.proxy.image("first:v1")])
        .stdout(Stdio::null())
        .spawn()
        .expect("cri-imaged runs");
    // big is asked for only once first holds the slot.
    let first_pulling = || {
        let (_, stdout, _) = cli(&["status", &socket, "-o", "json"]);
        stdout.contains("first:v1") && stdout.contains(r#""state":"pulling""#)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !tokio::task::block_in_place(first_pulling) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let image = node.proxy.image("big:v1");
    let Some(terminal) = Terminal::start(&format!("{BIN} pull {socket} {image}"), 80, 24, &[]) else {
        let _ = first.kill();
        let _ = first.wait();
        return;
    };
    let waiting = terminal.wait_for("the wait for a slot", Duration::from_secs(10), |screen| {
        screen.contains("waiting for a pull slot (1 queued)")
    });
    assert!(waiting.starts_with(&format!("Pulling {image} (")), "{waiting}");
    // Mid-pull: some of the layer's megabytes in, not all.
    let mid_pull = terminal.wait_for("the layer's bar and the total mid-pull", Duration::from_secs(30), |screen| {
        screen.lines().any(|line| line.contains("  [=") && line.contains(" MB / 25.2 MB"))
    });
    eprintln!("mid-pull at 80x24:\n{mid_pull}");
    let lines: Vec<&str> = mid_pull.lines().collect();
    assert!(lines.iter().any(|line| line.starts_with(&format!("Pulling {image} ("))), "{mid_pull}");
    let layer = lines.iter().find(|line| line.starts_with("  ") && line.contains("  [")).expect("a layer's bar");
    assert!(layer.ends_with(" MB / 25.2 MB"), "the layer's bytes of its size: {layer}\n{mid_pull}");
    let total = lines.iter().find(|line| line.starts_with("  total [")).expect("the total");
    assert!(total.contains("MB/s") && total.contains("left") && total.ends_with("0/1 layers"), "{total}");
    assert!(lines.iter().all(|line| line.chars().count() <= 80), "a line wider than the terminal:\n{mid_pull}");

    assert_eq!(terminal.exit_status(Duration::from_secs(60)), 0, "{}", terminal.screen());
    assert!(tokio::task::block_in_place(|| first.wait_with_output()).expect("the first pull ends").status.success());
    let after = terminal.screen();
    assert!(after.contains(&format!("Pulled {image} in ")) && after.contains("25.2 MB"), "{after}");
    // The frame was drawn in place and taken away: one header at most in the history, no bar left.
    assert!(!after.lines().any(|line| line.starts_with("  total [")), "the frame stays:\n{after}");
    assert!(terminal.screen_with_escapes().contains("\x1b[1mPulled"), "the outcome is in bold on a terminal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_through_a_pipe_prints_plain_lines_and_json_for_scripts() {
    let images = [("plain:v1", 24 * MIB), ("json:v1", 0), ("no-color:v1", 6 * MIB)];
    let Some(node) = ThrottledNode::start(&images, 2 * MIB, &[]).await else { return };
    let socket = socket_flag(&node.daemon.socket);
    let image = node.proxy.image("plain:v1");
    let (status, stdout, stderr) = tokio::task::block_in_place(|| cli(&["pull", &socket, &image]));
    assert_eq!(status, 0, "{stderr}");
    assert!(!stdout.contains('\x1b'), "escapes in piped output: {stdout:?}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() >= 2, "progress lines, then the outcome: {stdout}");
    let progress = &lines[..lines.len() - 1];
    assert!(progress.iter().all(|line| line.starts_with(&format!("pulling {image}"))), "{stdout}");
    // A line every 5 s of a 12 s pull: at least one with bytes moved.
    assert!(progress.iter().any(|line| line.contains(" MB / 25.2 MB")), "bytes of the total: {stdout}");
    assert!(lines[lines.len() - 1].starts_with(&format!("Pulled {image} in ")), "{stdout}");

    // NO_COLOR on a terminal: the same plain lines, no escape at all.
    let image = node.proxy.image("no-color:v1");
    let command = format!("{BIN} pull {socket} {image}");
    let Some(terminal) = Terminal::start(&command, 80, 24, &[("NO_COLOR", "1")]) else { return };
    assert_eq!(terminal.exit_status(Duration::from_secs(30)), 0, "{}", terminal.screen());
    let screen = terminal.screen_with_escapes();
    assert!(!screen.contains('\x1b'), "escapes under NO_COLOR: {screen:?}");
    assert!(
        screen.contains(&format!("pulling {image}: ")) && screen.contains(&format!("Pulled {image} in ")),
        "{screen}"
    );

    let image = node.proxy.image("json:v1");
    let (status, stdout, stderr) = tokio::task::block_in_place(|| cli(&["pull", &socket, "-o", "json", &image]));
    assert_eq!(status, 0, "{stderr}");
    let objects: Vec<serde_json::Value> =
        stdout.lines().map(|line| serde_json::from_str(line).expect("each line is JSON")).collect();
    let reasons: Vec<&str> = objects.iter().filter_map(|object| object["reason"].as_str()).collect();
    assert!(reasons.contains(&"Pulling"), "the pull's events: {stdout}");
    let outcome = objects.last().expect("an outcome");
    assert_eq!((outcome["image"].as_str(), outcome["pulled"].as_bool()), (Some(image.as_str()), Some(true)));
    assert!(outcome["imageRef"].as_str().is_some_and(|id| id.starts_with("sha256:")), "{outcome}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pull_backs_off_is_listed_and_cleared_and_the_node_can_be_looked_at() {
    let Some(node) = ThrottledNode::start(&[("small:v1", MIB)], 64 * MIB, &[]).await else { return };
    let socket = socket_flag(&node.daemon.socket);
    let cli = |args: &[&str]| tokio::task::block_in_place(|| cli(args));
    let missing = node.proxy.image("missing:v1");
    let pull_for_pod = ["pull", &socket, &missing, "--pod", "team/web-1", "--pod-uid", "uid-1"];

    let (status, _, stderr) = cli(&pull_for_pod);
    assert_eq!(status, 1, "the daemon's verdict: {stderr}");
    assert!(stderr.starts_with("cri-imaged: ErrImagePull: ") && stderr.contains("not found"), "{stderr}");
    let (status, _, stderr) = cli(&pull_for_pod);
    assert_eq!(status, 6, "backing off is for later: {stderr}");
    assert!(stderr.contains("ImagePullBackOff") && stderr.contains("try again in "), "{stderr}");
    assert!(stderr.contains(&format!("to try at once: cri-imaged backoff clear uid-1 {missing}")), "{stderr}");

    let (status, stdout, stderr) = cli(&["backoff", &socket]);
    assert_eq!(status, 0, "{stderr}");
    let row = stdout.lines().find(|line| line.contains("uid-1")).unwrap_or_else(|| panic!("the pair: {stdout}"));
    assert!(row.starts_with("team/web-1") && row.contains(&missing), "{row}");
    let (status, stdout, stderr) = cli(&["backoff", "clear", &socket, "uid-1", &missing]);
    assert_eq!(
        (status, stdout.trim()),
        (0, format!("cleared: pod uid-1's pulls of {missing} will be tried at once").as_str()),
        "{stderr}"
    );
    let (status, _, stderr) = cli(&pull_for_pod);
    assert_eq!(status, 1, "tried at once after the clear: {stderr}");

    let small = node.proxy.image("small:v1");
    assert_eq!(cli(&["pull", &socket, &small]).0, 0);
    let (status, stdout, stderr) = cli(&["images", &socket, "small"]);
    assert_eq!(status, 0, "{stderr}");
    let header = stdout.lines().next().expect("a header");
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["IMAGE", "IMAGE", "ID", "SIZE", "AGE", "LAST", "USED", "PINNED", "IN", "USE", "VERIFIED"]
    );
    let row: Vec<&str> = stdout.lines().nth(1).expect("the image's row").split_whitespace().collect();
    assert_eq!((row[0], row[2], row[3]), (small.as_str(), "1.05", "MB"), "{stdout}");
    assert_eq!(&row[row.len() - 3..], ["no", "no", "-"], "neither pinned nor in use, nor verified: {stdout}");

    // Following: the recent events, then one as it happens, until Ctrl-C (wide enough that no
    // line wraps).
    let Some(follow) = Terminal::start(&format!("{BIN} events -f {socket} --image {small}"), 250, 24, &[]) else {
        return;
    };
    follow.wait_for("the recent events", Duration::from_secs(10), |screen| screen.contains(" Pulled "));
    assert_eq!(cli(&["pull", &socket, &small]).0, 0);
    let screen = follow
        .wait_for("the new pull's event", Duration::from_secs(10), |screen| screen.matches(" Pulled ").count() == 2);
    let reasons: Vec<&str> = screen.lines().filter_map(|line| line.split_whitespace().nth(2)).collect();
    assert_eq!(reasons, ["Pulling", "Pulled", "Pulled"], "the first pull's events, then the second's: {screen}");
    follow.send_keys(&["C-c"]);
    assert_eq!(follow.exit_status(Duration::from_secs(5)), 130, "{}", follow.screen());

    let (status, stdout, stderr) = cli(&["events", &socket, "--image", &missing]);
    assert_eq!(status, 0, "{stderr}");
    let reasons: Vec<&str> = stdout.lines().filter_map(|line| line.split_whitespace().nth(2)).collect();
    assert_eq!(reasons, ["Pulling", "Failed", "BackOff", "BackoffCleared", "Pulling", "Failed"], "{stdout}");

    // The socket from the environment, as a node's profile would set it.
    let output = Command::new(BIN)
        .arg("status")
        .env("CRI_IMAGED_SOCKET", &node.daemon.socket)
        .output()
        .expect("cri-imaged runs");
    let (status, stdout, stderr) =
        (output.status.code(), String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(status, Some(0), "{stderr}");
    assert!(
        stdout.starts_with(&format!("cri-imaged {} at {}", env!("CARGO_PKG_VERSION"), node.daemon.socket.display())),
        "{stdout}"
    );
    assert!(stdout.lines().any(|line| line == "runtime        reachable"), "{stdout}");
    assert!(stdout.lines().any(|line| line.starts_with("backoffs       1 ")), "{stdout}");

    let (status, stdout, stderr) = cli(&["gc", "--dry-run", &socket]);
    assert_eq!(status, 0, "{stderr}");
    assert!(stdout.contains("would remove 0 images, 0 B"), "{stdout}");
    let kept = stdout.lines().find(|line| line.starts_with(&small)).unwrap_or_else(|| panic!("kept: {stdout}"));
    // Answered present or pulled within the hand-out window: its container is on the way.
    assert!(kept.ends_with("held"), "why it stays: {kept}");

    // NO_COLOR: the same outcome with no escape at all.
    for (env, bold) in [(vec![], true), (vec![("NO_COLOR", "1")], false)] {
        let command = format!("{BIN} pull {socket} {small}");
        let Some(terminal) = Terminal::start(&command, 80, 24, &env) else { return };
        assert_eq!(terminal.exit_status(Duration::from_secs(20)), 0, "{}", terminal.screen());
        let screen = terminal.screen_with_escapes();
        assert!(screen.contains(&format!("{small} is already present")), "{screen}");
        assert_eq!(screen.contains("\x1b["), bold, "{env:?}: {screen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_top_agree_that_gc_is_off_and_status_says_what_the_presence_cache_holds() {
    let flags = ["--image-gc-high-threshold", "100"];
    let Some(node) = ThrottledNode::start(&[("small:v1", MIB)], 64 * MIB, &flags).await else { return };
    let socket = socket_flag(&node.daemon.socket);
    let cli = |args: &[&str]| tokio::task::block_in_place(|| cli(args));
    let small = node.proxy.image("small:v1");
    assert_eq!(cli(&["pull", &socket, &small]).0, 0);
    assert_eq!(cli(&["pull", &socket, &small]).0, 0, "answered present");

    let (status, stdout, stderr) = cli(&["status", &socket]);
    assert_eq!(status, 0, "{stderr}");
    let line = |what: &str| {
        let found = stdout.lines().find(|line| line.starts_with(what));
        found.unwrap_or_else(|| panic!("{what}: {stdout}")).to_owned()
    };
    assert!(line("image fs ").ends_with("%); GC off"), "as top says it: {stdout}");
    let presence = line("presence cache ");
    let remembered = presence.strip_prefix("presence cache from memory, ").and_then(|rest| rest.split_once(' '));
    assert!(
        remembered.is_some_and(|(count, rest)| count.parse::<u64>().is_ok() && rest.starts_with("answer")),
        "answers, not images: {presence}"
    );

    let command = format!("{BIN} top {socket} --interval 250ms");
    let Some(top) = Terminal::start(&command, 100, 24, &[]) else { return };
    top.wait_for("the disk line with GC off", Duration::from_secs(10), |screen| screen.contains("  GC off"));
    top.send_keys(&["q"]);
}
