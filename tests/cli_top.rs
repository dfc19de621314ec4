//! `cri-imaged top` as a person meets it: the real binary in a tmux terminal of 80×24, against a
//! real daemon on real containerd (a pull seen mid-way, a backoff counting down), through the
//! daemon being killed and started again, and against no daemon at all at first.

mod support;

use std::{path::Path, time::Duration};

use cri_imaged::api::{PodRef, PullPolicy};
use support::{call, ensure, process::DaemonProcess, throttled_node::ThrottledNode, tmux::Terminal};

const MIB: u64 = 1 << 20;
const BIN: &str = env!("CARGO_BIN_EXE_cri-imaged");

/// `top` on `socket`, asking every 250 ms (a test need not wait seconds for each answer), in a
/// shell that stays once it ends (so that the cursor it left can be seen) and says its status.
fn top(socket: &Path) -> Option<Terminal> {
    let top = format!("{BIN} top --socket {} --interval 250ms", socket.display());
    Terminal::start(&format!("sh -c '{top}; echo \"top exited $?\"; sleep 60'"), 80, 24, &[])
}

/// Top's exit status, once it ended; and whether it gave the terminal back: the alternate screen
/// left, the cursor shown.
fn ended(terminal: &Terminal) -> (u32, bool) {
    let screen = terminal.wait_for("top to end", Duration::from_secs(5), |screen| screen.contains("top exited "));
    let status = screen.split("top exited ").nth(1).and_then(|rest| rest.split_whitespace().next()?.parse().ok());
    (status.expect("a status"), !terminal.alternate_screen() && terminal.cursor_visible())
}

fn banner(socket: &Path) -> String {
    format!("daemon unreachable at {}: reconnecting (attempt ", socket.display())
}

/// A row of a pull's bar: `    [=====>     ]  36%  12.3 MB / 33.6 MB  2.00 MB/s  11s left`.
fn bar_row(screen: &str) -> Option<&str> {
    screen.lines().find(|line| line.trim_start().starts_with("[=") && line.contains(" MB / ") && line.contains("MB/s"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_shows_a_pull_mid_way_keeps_it_through_a_daemon_restart_and_quits_cleanly() {
    // 24 s for the pull: still under way, with room to spare, when the daemon is killed below.
    let Some(mut node) = ThrottledNode::start(&[("big:v1", 24 * MIB)], MIB, &[]).await else { return };
    let socket = node.daemon.socket.clone();
    let Some(terminal) = top(&socket) else { return };
    terminal.wait_for("the daemon's answers", Duration::from_secs(10), |screen| screen.contains("runtime ok"));
    assert!(terminal.alternate_screen(), "a full-screen view");

    let mut client = node.client();
    let mut failing = ensure(&node.proxy.image("missing:v1"), PullPolicy::IfNotPresent as i32);
    failing.pod =
        Some(PodRef { namespace: "team".into(), name: "web-1".into(), uid: "uid-1".into(), ..Default::default() });
    assert!(call(&mut client, failing).await.is_err(), "a missing image fails, and backs off");
    let image = node.proxy.image("big:v1");
    let pulling = tokio::spawn(async move { call(&mut client, ensure(&image, PullPolicy::IfNotPresent as i32)).await });

    let mid_pull = terminal.wait_for("the pull with its bar and bytes", Duration::from_secs(20), |screen| {
        bar_row(screen).is_some() && screen.contains("1 backing off")
    });
    eprintln!("mid-pull:\n{mid_pull}");
    let lines: Vec<&str> = mid_pull.lines().collect();
    assert_eq!(lines.len(), 24, "{mid_pull}");
    assert!(lines.iter().all(|line| line.chars().count() <= 80), "{mid_pull}");
    let name = lines.iter().find(|line| line.contains("/big:v1")).expect("the pull's image");
    assert!(name.contains("pulling  1 caller"), "{name}");
    let bar = bar_row(&mid_pull).expect("a bar");
    assert!(bar.contains(" / 25.2 MB") && bar.ends_with(" left"), "bytes of the image's size, and time left: {bar}");
    let backoff = lines.iter().find(|line| line.contains("team/web-1")).expect("the pod backing off");
    assert!(backoff.contains("/missing:v1") && backoff.contains("retry in "), "{backoff}");
    assert!(mid_pull.contains("Failed") || mid_pull.contains("BackOff"), "the failure's events: {mid_pull}");

    // Typed: a filter no image matches hides the pull; cleared, it is back.
    terminal.send_keys(&["/", "zzz", "Enter"]);
    terminal.wait_for("the pull filtered out", Duration::from_secs(5), |screen| {
        screen.contains("1 hidden by the filter") && screen.contains("filter: zzz")
    });
    terminal.send_keys(&["/", "BSpace", "BSpace", "BSpace", "Enter"]);
    terminal.wait_for("the pull back", Duration::from_secs(5), |screen| bar_row(screen).is_some());

    node.daemon.kill_hard();
    let down = terminal
        .wait_for("the reconnecting banner", Duration::from_secs(5), |screen| screen.contains(&banner(&socket)));
    eprintln!("daemon killed:\n{down}");
    assert!(down.contains("/big:v1") && down.contains("stale: as of"), "the last answers stay, marked: {down}");
    assert!(pulling.await.expect("the pull's task").is_err(), "the killed daemon's caller was cut off");

    node.daemon = DaemonProcess::start(&socket, &node.stack.containerd_socket, &[]).await;
    terminal.wait_for("reconnected", Duration::from_secs(10), |screen| screen.contains("reconnected to the daemon"));
    let back = terminal.wait_for("fresh answers, the banner gone", Duration::from_secs(10), |screen| {
        !screen.contains("reconnect") && !screen.contains("stale") && screen.contains("runtime ok")
    });
    eprintln!("daemon back:\n{back}");
    let pull_rows = back.lines().filter(|line| line.contains("/big:v1") && line.contains("caller")).count();
    assert!(back.contains("Pulls  0 under way") && pull_rows == 0, "the new daemon's pulls: {back}");

    terminal.send_keys(&["q"]);
    assert_eq!(ended(&terminal), (0, true), "q quits and gives the terminal back:\n{}", terminal.screen());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_started_before_the_daemon_waits_for_it_and_ctrl_c_quits() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Not even its directory yet: a person may start top before the service.
    let socket = dir.path().join("run").join("d.sock");
    let Some(terminal) = top(&socket) else { return };
    let waiting = terminal.wait_for("the banner", Duration::from_secs(5), |screen| screen.contains(&banner(&socket)));
    assert!(waiting.contains("no socket at"), "why: {waiting}");
    let attempt = |screen: &str| {
        let at = screen.find("(attempt ")? + "(attempt ".len();
        screen[at..].split(')').next()?.parse::<u32>().ok()
    };
    let first = attempt(&waiting).expect("an attempt number");
    terminal.wait_for("attempts counted", Duration::from_secs(5), |screen| attempt(screen) > Some(first));

    // No runtime behind it: the daemon serves anyway, and says so.
    let daemon = DaemonProcess::start(&socket, &dir.path().join("no-runtime.sock"), &[]).await;
    let up = terminal.wait_for("the daemon's answers", Duration::from_secs(10), |screen| {
        screen.contains(&format!("cri-imaged {}", env!("CARGO_PKG_VERSION"))) && screen.contains("runtime DOWN")
    });
    eprintln!("daemon up, no runtime:\n{up}");
    terminal.wait_for("the banner gone", Duration::from_secs(10), |screen| {
        !screen.contains("unreachable at") && screen.contains("the runtime does not answer")
    });

    terminal.resize(100, 30);
    terminal.wait_for("the screen drawn to the new size", Duration::from_secs(5), |screen| {
        let header = screen.lines().find(|line| line.contains(" UTC")).unwrap_or_default();
        header.find(" UTC").is_some_and(|at| at > 85)
            && screen.lines().nth(29).is_some_and(|keys| keys.starts_with("q quit"))
    });

    terminal.send_keys(&["C-c"]);
    assert_eq!(ended(&terminal), (0, true), "Ctrl-C quits and gives the terminal back:\n{}", terminal.screen());
    drop(daemon);
}
