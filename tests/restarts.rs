//! Never brick a node: the kubelet's image service is cri-imaged under systemd socket activation,
//! where systemd holds the socket from boot and hands it to each start of the daemon. Here
//! `systemd-socket-activate` binds the socket and, at the first connection, starts a small holder
//! with it as fd 3; the holder keeps it and starts each daemon with it (`LISTEN_FDS=1`), as systemd
//! does across restarts. The clients are ones we did not write: a restart while a grpcio client
//! calls ImageStatus and PullImage all along loses no call, and at boot a client that dials before
//! anything listens is answered once the daemon is up, every call made after the socket exists
//! succeeding.

mod support;

use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::Duration,
};

use serde_json::json;
use support::{
    clients::{Answer, Call, Client},
    fake_runtime::{FakeImageService, FakeRuntime},
    process::require_tool,
};
use tokio::time::Instant;

/// systemd's part once `systemd-socket-activate` has passed the socket as fd 3: starts the daemon
/// whose command line follows at once (says `started`), then on `restart` and `stop` lines
/// restarts or stops it, answering `COMMAND done` to each.
const HOLDER: &str = r#"import os, signal, subprocess, sys
daemon = sys.argv[1:]
os.set_inheritable(3, True)
launch = ["sh", "-c", 'export LISTEN_PID=$$ LISTEN_FDS=1; exec "$0" "$@"'] + daemon
child = subprocess.Popen(launch, pass_fds=[3])
print("started", flush=True)
for line in sys.stdin:
    command = line.strip()
    if command in ("restart", "stop") and child:
        child.send_signal(signal.SIGTERM)
        child.wait()
        child = None
    if command == "restart":
        child = subprocess.Popen(launch, pass_fds=[3])
    print(command + " done", flush=True)
if child:
    child.send_signal(signal.SIGTERM)
    child.wait()
"#;

/// The holder, and its line-by-line conversation.
struct Holder {
    child: Child,
    /// Closed on drop: the holder then stops its daemon (SIGTERM) and exits.
    commands: Option<ChildStdin>,
    answers: BufReader<ChildStdout>,
}

impl Holder {
    /// `systemd-socket-activate` listening on `socket`, for a daemon on `runtime` logging to
    /// `log`; returns once the socket exists (the daemon starts at the first connection).
    fn listen(socket: &Path, runtime: &Path, log: &Path) -> Self {
        let activate = require_tool("systemd-socket-activate").expect("systemd-socket-activate");
        let python = require_tool("python3").expect("python3");
        let root = socket.with_file_name("root");
        let mut child = Command::new(activate)
            .arg("-l")
            .arg(socket)
            .arg(python)
            .args(["-c", HOLDER])
            .arg(env!("CARGO_BIN_EXE_cri-imaged"))
            .args(["serve", "--listen"])
            .arg(socket)
            .arg("--runtime-endpoint")
            .arg(runtime)
            .arg("--root-dir")
            .arg(root)
            // No registry rate limit: the calls come as fast as the client makes them.
            .args(["--image-gc-high-threshold", "100", "--shutdown-timeout", "5s", "--registry-qps", "0"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).expect("log file"))
            .spawn()
            .expect("the holder starts");
        let (commands, answers) = (child.stdin.take().expect("stdin"), child.stdout.take().expect("stdout"));
        let started = Instant::now();
        while !socket.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "systemd-socket-activate never bound {}",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Self { child, commands: Some(commands), answers: BufReader::new(answers) }
    }

    /// Waits until the first connection has started the daemon.
    fn started(&mut self) {
        assert_eq!(self.answer(), "started");
    }

    fn answer(&mut self) -> String {
        let mut line = String::new();
        self.answers.read_line(&mut line).expect("the holder answers");
        line.trim().to_owned()
    }

    /// `restart` or `stop` the daemon; returns once done.
    fn tell(&mut self, command: &str) {
        let commands = self.commands.as_mut().expect("the holder's stdin is open");
        writeln!(commands, "{command}").expect("the holder listens");
        assert_eq!(self.answer(), format!("{command} done"));
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // The daemon is the holder's child's: a holder killed outright would leave it running.
        drop(self.commands.take());
        for _ in 0..100 {
            if self.child.try_wait().is_ok_and(|status| status.is_some()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fake runtime that has `registry.local/app:v1` and pulls it.
fn runtime(dir: &Path) -> FakeRuntime {
    let service = FakeImageService::default();
    service.add_image("registry.local/app:v1", "sha256:app", 1);
    FakeRuntime::start(&dir.join("runtime.sock"), service)
}

/// A temp dir, the fake runtime in it, and where the socket and the daemon's log go; `None`
/// without grpcio (outside CI).
fn set_up() -> Option<(tempfile::TempDir, FakeRuntime, std::path::PathBuf, std::path::PathBuf)> {
    if !Client::Grpcio.installed() {
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = runtime(dir.path());
    let (socket, log) = (dir.path().join("cri-imaged.sock"), dir.path().join("daemon.log"));
    Some((dir, runtime, socket, log))
}

/// The kubelet's image calls: ImageStatus, then PullImage, `pairs` times.
fn kubelet_calls(pairs: usize) -> Vec<Call> {
    let image = json!({ "image": { "image": "registry.local/app:v1" } });
    (0..pairs)
        .flat_map(|_| {
            [
                Call::new("runtime.v1.ImageService/ImageStatus", image.clone()),
                Call::new("runtime.v1.ImageService/PullImage", image.clone()),
            ]
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_loses_no_call_of_a_client_calling_all_along() {
    // The temp dir lives as long as the test.
    let Some((_dir, runtime, socket, log)) = set_up() else { return };
    let mut holder = Holder::listen(&socket, &runtime.socket, &log);
    let calls = kubelet_calls(1500);
    let calling = {
        let (socket, calls) = (socket.clone(), calls.clone());
        tokio::task::spawn_blocking(move || Client::Grpcio.run(&socket, &calls))
    };
    // Its first connection starts the daemon, as with systemd.
    tokio::task::block_in_place(|| holder.started());
    // Twice across the calls, as a package upgrade and a `systemctl restart` would.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        tokio::task::block_in_place(|| holder.tell("restart"));
    }
    let answers = calling.await.expect("the client ran");
    let failed: Vec<_> = answers.iter().filter(|answer| !matches!(answer, Answer::Ok(_))).collect();
    let daemon_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        failed.is_empty(),
        "{} of {} calls failed: {:?}\n{daemon_log}",
        failed.len(),
        answers.len(),
        &failed[..failed.len().min(3)]
    );
    assert_eq!(daemon_log.matches("cri-imaged serving").count(), 3, "three daemons served in turn:\n{daemon_log}");
    assert!(daemon_log.matches("cri-imaged stopped").count() >= 2, "{daemon_log}");
    println!("{} calls across two restarts, none failed", answers.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_boot_a_client_that_dials_first_is_answered_once_the_daemon_is_up_and_loses_no_call() {
    // The temp dir lives as long as the test.
    let Some((_dir, runtime, socket, log)) = set_up() else { return };
    // The kubelet at boot: dials at once, and again until the socket is there.
    let booted = Instant::now();
    let dialing = {
        let socket = socket.clone();
        tokio::task::spawn_blocking(move || {
            let mut refused = 0;
            while !socket.exists() {
                refused += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            // The socket exists: from now on no call may fail, the daemon up or not.
            (refused, Client::Grpcio.run(&socket, &kubelet_calls(50)))
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // systemd's order: the socket, then, at the first connection (the client's), the daemon.
    let mut holder = tokio::task::block_in_place(|| Holder::listen(&socket, &runtime.socket, &log));
    tokio::task::block_in_place(|| holder.started());
    let (refused, answers) = dialing.await.expect("the client ran");
    let failed: Vec<_> = answers.iter().filter(|answer| !matches!(answer, Answer::Ok(_))).collect();
    assert!(refused > 0, "the client dialled before the socket existed");
    assert!(
        failed.is_empty(),
        "{} calls failed: {:?}\n{}",
        failed.len(),
        failed,
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(answers.len(), 100);
    println!(
        "dialled {refused} times before the socket, then {} calls answered, {:?} after boot",
        answers.len(),
        booted.elapsed()
    );
}
