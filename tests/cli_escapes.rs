//! Text from the daemon that a terminal would act on (a pod's name, a registry's error, an
//! image's name), holding every control character, the bidirectional ones and the private-use
//! marks the command line once took for its own styles: the real binary against the real daemon
//! (on the scripted runtime) shows it and never sends it, through a pipe, with `NO_COLOR` and on
//! a terminal, and its JSON lines parse and give it back exactly.

mod support;

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use cri_imaged::api::{PodRef, image_manager_client::ImageManagerClient};
use serde_json::Value;
use support::{
    fake_runtime::{FakeImageService, FakeRuntime},
    process::DaemonProcess,
    tmux::Terminal,
    unix_channel,
};

const BIN: &str = env!("CARGO_BIN_EXE_cri-imaged");
const MISSING: &str = "missing:1";
/// How [`hostile`]'s forged styles look once shown: the old marks as they are, CSI and ESC as
/// Rust writes them.
const SHOWN: &str = "\u{E000}X\u{E002}\\u{9b}31m\\u{1b}[1;31mY";

/// `name`, styles forged with the old marks and with CSI and ESC, then every C0 control, DEL,
/// every C1 control, the bidirectional formatting characters and private-use ones.
fn hostile(name: &str) -> String {
    let mut text = format!("{name}\u{E000}X\u{E002}\u{9B}31m\x1b[1;31mY");
    text.extend(('\0'..='\u{1F}').chain(['\u{7F}']).chain('\u{80}'..='\u{9F}'));
    text.extend(['\u{061C}', '\u{200E}', '\u{200F}']);
    text.extend(('\u{202A}'..='\u{202E}').chain('\u{2066}'..='\u{2069}'));
    text.extend(['\u{E001}', '\u{F8FF}', '\u{F0000}', '\u{10FFFD}']);
    text
}

fn acted_on(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// `cri-imaged ARGS` through a pipe, with `env`: its exit status, stdout and stderr, each checked
/// to hold nothing a terminal would act on but line ends (no escape at all: nothing is coloured
/// through a pipe).
fn piped(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let output = Command::new(BIN)
        .args(args)
        .env_remove("NO_COLOR")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("cri-imaged runs");
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).expect("UTF-8 output");
    let (stdout, stderr) = (text(output.stdout), text(output.stderr));
    for (name, stream) in [("stdout", &stdout), ("stderr", &stderr)] {
        let acted: Vec<char> = stream.chars().filter(|&c| c != '\n' && acted_on(c)).collect();
        assert!(acted.is_empty(), "{args:?} {env:?}: {acted:?} on its {name}:\n{stream:?}");
    }
    (output.status.code().unwrap_or(-1), stdout, stderr)
}

/// Each line of `stdout` as JSON.
fn json_lines(stdout: &str) -> Vec<Value> {
    stdout.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|error| panic!("{error}: {line:?}"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemons_text_is_shown_never_acted_on_and_its_json_gives_it_back_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = FakeImageService::default();
    let (error, image) = (hostile("manifest unknown: "), hostile("registry.local/app"));
    service.fail_pull(MISSING, tonic::Status::not_found(error.clone()));
    service.add_image(&image, &format!("sha256:{:064x}", 7), 4096);
    service.script.lock().unwrap().image_fs = Some(dir.path().to_owned());
    let runtime = FakeRuntime::start_for_gc(&dir.path().join("runtime.sock"), service);
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &runtime.socket, &[]).await;
    let socket = format!("--socket={}", daemon.socket.display());

    // A pod named as the issue names it (and worse) fails to pull, then backs off.
    // The "w\u{E000}X\u{E002}\u{9B}" is where hostile("w") begins.
    let (namespace, name) = (hostile("ns"), hostile("w"));
    let pod =
        PodRef { namespace: namespace.clone(), name: name.clone(), uid: "uid-1".to_owned(), ..Default::default() };
    let mut client = ImageManagerClient::new(unix_channel(&daemon.socket));
    for _ in 0..2 {
        let request = cri_imaged::api::EnsureImageExistsRequest {
            pod: Some(pod.clone()),
            container_name: hostile("container"),
            ..support::ensure(MISSING, cri_imaged::api::PullPolicy::IfNotPresent as i32)
        };
        let refused = client.ensure_image_exists(request).await.expect_err("the pull fails");
        assert!(refused.message().contains(&error), "the runtime's words reach the daemon's: {refused:?}");
    }
    let cli = |args: &[&str], env: &[(&str, &str)]| tokio::task::block_in_place(|| piped(args, env));
    let no_color = [("NO_COLOR", "1")];

    for env in [&[][..], &no_color[..]] {
        for output in ["text", "wide"] {
            let (status, stdout, stderr) = cli(&["backoff", &socket, "-o", output], env);
            assert_eq!(status, 0, "{stderr}");
            let row = stdout.lines().find(|line| line.contains("uid-1")).unwrap_or_else(|| panic!("{stdout}"));
            assert!(row.starts_with(&format!("ns{SHOWN}")) && row.contains(&format!("/w{SHOWN}")), "{row}");
            assert!(row.contains(&format!("manifest unknown: {SHOWN}")), "the last error: {row}");

            let (status, stdout, stderr) = cli(&["events", &socket, "--image", MISSING, "-o", output], env);
            assert_eq!(status, 0, "{stderr}");
            let failed = stdout.lines().find(|line| line.contains(" Failed ")).unwrap_or_else(|| panic!("{stdout}"));
            assert!(
                failed.contains(&format!("pod/ns{SHOWN}")) && failed.contains(&format!("manifest unknown: {SHOWN}"))
            );

            let (status, stdout, stderr) = cli(&["status", &socket, "--pod-uid", "uid-1", "--image", MISSING], env);
            assert_eq!(status, 0, "{stderr}");
            assert!(
                stdout.contains(&format!("last error: rpc error: code = NotFound desc = manifest unknown: {SHOWN}"))
            );

            let (status, stdout, stderr) = cli(&["images", &socket, "-o", output], env);
            assert_eq!(status, 0, "{stderr}");
            assert!(stdout.lines().any(|line| line.starts_with(&format!("registry.local/app{SHOWN}"))), "{stdout}");

            let (status, stdout, stderr) = cli(&["gc", "--dry-run", &socket, "-o", output], env);
            assert_eq!(status, 0, "{stderr}");
            assert!(stdout.lines().any(|line| line.starts_with(&format!("registry.local/app{SHOWN}"))), "{stdout}");
        }
        // The daemon's verdict on stderr, shown too: the failure, then (the pod backing off) the
        // backoff that quotes it.
        let (status, _, stderr) = cli(&["pull", &socket, MISSING, "--pod-uid", "uid-2"], env);
        let reason = if env.is_empty() { (1, "ErrImagePull") } else { (6, "ImagePullBackOff") };
        assert_eq!(status, reason.0, "{stderr}");
        assert!(stderr.starts_with(&format!("cri-imaged: {}: ", reason.1)), "{stderr}");
        assert!(stderr.contains(&format!("manifest unknown: {SHOWN}")), "{stderr}");
    }

    // JSON: every string as the daemon gave it, whatever it holds.
    let (_, stdout, _) = cli(&["backoff", &socket, "-o", "json"], &[]);
    let entry = json_lines(&stdout).into_iter().find(|entry| entry["pod"]["uid"] == "uid-1").expect("the pair");
    assert_eq!(
        (&entry["pod"]["namespace"], &entry["pod"]["name"]),
        (&Value::from(namespace.clone()), &Value::from(name.clone()))
    );
    assert!(entry["lastError"].as_str().is_some_and(|last| last.ends_with(&error)), "{entry}");

    let (_, stdout, _) = cli(&["events", &socket, "--image", MISSING, "-o", "json"], &[]);
    let events = json_lines(&stdout);
    let failed = events.iter().find(|event| event["reason"] == "Failed").expect("the failure");
    assert_eq!((&failed["pod"]["namespace"], &failed["pod"]["name"]), (&Value::from(namespace), &Value::from(name)));
    assert_eq!(failed["container"], hostile("container"));
    assert!(failed["message"].as_str().is_some_and(|message| message.contains(&error)), "{failed}");

    let (_, stdout, _) = cli(&["status", &socket, "--pod-uid", "uid-1", "--image", MISSING, "-o", "json"], &[]);
    let status = json_lines(&stdout).remove(0);
    assert!(status["backoff"]["lastError"].as_str().is_some_and(|last| last.ends_with(&error)), "{status}");

    let (_, stdout, _) = cli(&["images", &socket, "-o", "json"], &[]);
    let tags: Vec<Value> = json_lines(&stdout).into_iter().map(|image| image["repoTags"][0].clone()).collect();
    assert!(tags.contains(&Value::from(image.clone())), "{tags:?}");

    let (_, stdout, _) = cli(&["gc", "--dry-run", &socket, "-o", "json"], &[]);
    let pass = json_lines(&stdout).remove(0);
    let kept: Vec<&Value> = pass["kept"].as_array().expect("kept").iter().map(|image| &image["names"][0]).collect();
    assert!(kept.contains(&&Value::from(image)), "{pass}");

    // The pull's events as they come (the failure's may come after the answer, and not be
    // printed): JSON, each message as the daemon wrote it.
    let (status, stdout, _) = cli(&["pull", &socket, MISSING, "--pod-uid", "uid-3", "-o", "json"], &[]);
    assert_eq!(status, 1);
    for event in json_lines(&stdout).iter().filter(|event| event["reason"] == "Failed") {
        assert!(event["message"].as_str().is_some_and(|message| message.contains(&error)), "{event}");
    }

    // On a terminal, with colour and with NO_COLOR: shown, and nothing but our own styles
    // (backoff has none, so no escape at all).
    for env in [&[][..], &no_color[..]] {
        let Some(terminal) = Terminal::start(&format!("{BIN} backoff {socket}"), 1200, 20, env) else { return };
        assert_eq!(terminal.exit_status(Duration::from_secs(10)), 0, "{}", terminal.screen());
        let screen = terminal.screen_with_escapes();
        assert!(screen.contains(&format!("ns{SHOWN}")), "{screen}");
        assert!(!screen.contains('\x1b'), "{env:?}: an escape on the screen: {screen:?}");
    }
    let Some(terminal) = Terminal::start(&format!("{BIN} events {socket} --image {MISSING}"), 1200, 20, &no_color)
    else {
        return;
    };
    assert_eq!(terminal.exit_status(Duration::from_secs(10)), 0, "{}", terminal.screen());
    let screen = terminal.screen_with_escapes();
    assert!(screen.contains(&format!("manifest unknown: {SHOWN}")) && !screen.contains('\x1b'), "{screen:?}");
}
