//! cri-imaged under systemd, as far as this machine has it (no systemd as PID 1): the shipped
//! units pass `systemd-analyze verify` and `security`, the socket's directory lets the members of
//! its group through (tests/cli_socket.rs calls through it as one), and the binary serves the
//! socket `systemd-socket-activate` passes it, telling a NOTIFY_SOCKET it is ready and, on
//! SIGTERM, that it is stopping.

mod support;

use std::{
    os::unix::net::UnixDatagram,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use cri_imaged::api::{GetStatusRequest, image_manager_client::ImageManagerClient};
use support::{
    fake_runtime::{FakeImageService, FakeRuntime},
    process::{free_port, require_tool},
    unix_channel,
};

const UNITS: [&str; 2] = ["cri-imaged.socket", "cri-imaged.service"];

/// The shipped unit `name`'s text.
fn shipped(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd").join(name))
        .expect("a shipped unit")
}

/// The shipped units, copied to `dir` with ExecStart naming the binary under test (verify checks
/// that it exists and is executable).
fn units_in(dir: &Path) -> Vec<PathBuf> {
    UNITS
        .iter()
        .map(|unit| {
            let text = shipped(unit).replace("/usr/local/bin/cri-imaged", env!("CARGO_BIN_EXE_cri-imaged"));
            let path = dir.join(unit);
            std::fs::write(&path, text).expect("write the unit");
            path
        })
        .collect()
}

#[test]
fn the_units_verify_clean() {
    let Some(analyze) = require_tool("systemd-analyze") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let units = units_in(dir.path());
    let output =
        Command::new(analyze).args(["verify", "--man=no"]).args(&units).output().expect("systemd-analyze runs");
    let said = String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "systemd-analyze verify failed: {said}");
    assert_eq!(said.trim(), "", "verify is not clean");
}

/// The value of `key` in a unit (its last `Key=value` line, as systemd reads a setting given twice).
fn setting<'a>(unit: &'a str, key: &str) -> Option<&'a str> {
    unit.lines().rev().find_map(|line| line.trim().strip_prefix(key)?.strip_prefix('=')).map(str::trim)
}

/// A mode setting of `unit`, or systemd's `default` for it.
fn mode(unit: &str, key: &str, default: u32) -> u32 {
    setting(unit, key).map_or(default, |mode| u32::from_str_radix(mode, 8).expect("an octal mode"))
}

#[test]
fn the_socket_is_its_groups_alone_and_its_directory_lets_the_members_through() {
    let socket = shipped("cri-imaged.socket");
    let service = shipped("cri-imaged.service");
    // systemd.socket(5): SocketMode= and DirectoryMode= default to 0666 and 0755;
    // systemd.exec(5): RuntimeDirectoryMode= to 0755.
    let socket_mode = mode(&socket, "SocketMode", 0o666);
    assert_eq!(socket_mode, 0o660, "root and the group read and write the socket; nobody else");
    assert_eq!(setting(&socket, "SocketUser"), Some("root"));
    assert_eq!(setting(&socket, "SocketGroup"), Some("cri-imaged"), "the group packaging/deb/postinst makes");
    // systemd makes the socket's directory root:root, so its members reach the socket only
    // through the bits for others: 0750 would shut every one of them out.
    let directory = mode(&socket, "DirectoryMode", 0o755);
    assert_eq!(directory & 0o001, 0o001, "DirectoryMode={directory:04o}: the group's members cannot reach the socket");
    assert_eq!(directory & 0o022, 0, "DirectoryMode={directory:04o}: only root may write there");
    // The same directory is the service's RuntimeDirectory, whose mode systemd sets at every start.
    let listen = setting(&socket, "ListenStream").expect("a ListenStream");
    let runtime_directory = setting(&service, "RuntimeDirectory").expect("a RuntimeDirectory");
    assert_eq!(Path::new(listen).parent(), Some(Path::new("/run").join(runtime_directory).as_path()));
    assert_eq!(
        mode(&service, "RuntimeDirectoryMode", 0o755),
        directory,
        "a start of the service would change the socket's directory to RuntimeDirectoryMode"
    );
}

#[test]
fn the_service_is_hardened_to_an_ok_exposure() {
    let Some(analyze) = require_tool("systemd-analyze") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let service = units_in(dir.path()).pop().expect("the service");
    let output =
        Command::new(analyze).args(["security", "--offline=yes"]).arg(&service).output().expect("systemd-analyze runs");
    let said = String::from_utf8_lossy(&output.stdout);
    let overall = said.lines().find(|line| line.contains("Overall exposure level")).expect("an overall line");
    eprintln!("{overall}");
    let (level, rating) = overall
        .rsplit_once(": ")
        .and_then(|(_, verdict)| {
            let mut words = verdict.split_whitespace();
            Some((words.next()?.parse::<f64>().ok()?, words.next()?.to_owned()))
        })
        .expect("a level and a rating");
    assert!(level <= 2.5 && ["OK", "SAFE"].contains(&rating.as_str()), "{overall}");
}

/// `cri-imaged serve` under `systemd-socket-activate`, listening on `socket` and notifying
/// `notify`; `listen` is the `--listen` flag, which a passed socket overrides.
fn socket_activated(tool: &Path, socket: &str, notify: &Path, listen: &Path, runtime: &Path) -> Child {
    let root_dir = notify.with_file_name("root");
    Command::new(tool)
        .args(["--listen", socket])
        .arg(format!("--setenv=NOTIFY_SOCKET={}", notify.display()))
        .arg("--setenv=RUST_LOG=info")
        .arg(env!("CARGO_BIN_EXE_cri-imaged"))
        .arg("serve")
        .arg("--listen")
        .arg(listen)
        .arg("--runtime-endpoint")
        .arg(runtime)
        .arg("--root-dir")
        .arg(root_dir)
        .args(["--image-gc-high-threshold", "100", "--shutdown-timeout", "2s"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("systemd-socket-activate starts")
}

/// Waits, at most 5 s, until `done`.
async fn wait_for(done: impl Fn() -> bool, what: &str) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 5 s");
}

/// The next notice on `notify`, within 10 s.
fn notice(notify: &UnixDatagram) -> String {
    let mut buffer = [0u8; 4096];
    let read = notify.recv(&mut buffer).expect("a notice within 10 s");
    String::from_utf8_lossy(&buffer[..read]).into_owned()
}

#[tokio::test]
async fn a_socket_systemd_passes_is_served_and_readiness_and_stopping_are_told() {
    let Some(activate) = require_tool("systemd-socket-activate") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).expect("bind the notify socket");
    notify.set_read_timeout(Some(Duration::from_secs(10))).expect("a read timeout");
    let socket = dir.path().join("passed.sock");
    let unused = dir.path().join("unused/flag.sock");
    let mut daemon =
        socket_activated(&activate, socket.to_str().expect("utf-8"), &notify_path, &unused, &runtime.socket);
    wait_for(|| socket.exists(), "systemd-socket-activate listens").await;

    // As systemd does, it starts the daemon at the first connection, which waits meanwhile.
    let mut client = ImageManagerClient::new(unix_channel(&socket));
    let answer = client.get_status(GetStatusRequest::default()).await.expect("served on the passed socket");
    assert!(answer.into_inner().runtime_reachable);
    let ready = tokio::task::spawn_blocking({
        let notify = notify.try_clone().expect("clone");
        move || notice(&notify)
    })
    .await
    .expect("joins");
    assert!(ready.lines().any(|line| line == "READY=1"), "{ready}");
    let status = format!("STATUS=serving on {}; the runtime answers", socket.display());
    assert!(ready.lines().any(|line| line == status), "{ready}");
    assert!(!unused.exists() && !unused.parent().expect("a directory").exists(), "--listen was not bound");

    let pid = i32::try_from(daemon.id()).expect("a pid");
    let kill = Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill runs");
    assert!(kill.success());
    let stopping = tokio::task::spawn_blocking(move || notice(&notify)).await.expect("joins");
    assert!(stopping.lines().any(|line| line == "STOPPING=1"), "{stopping}");
    let exited = tokio::task::spawn_blocking(move || daemon.wait()).await.expect("joins").expect("exits");
    assert!(exited.success(), "{exited:?}");
    assert!(socket.exists(), "the passed socket is systemd's: left in place");
}

#[tokio::test]
async fn a_passed_socket_that_is_not_a_unix_stream_is_refused_with_the_reason() {
    let Some(activate) = require_tool("systemd-socket-activate") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let listen = dir.path().join("flag.sock");
    let address = format!("127.0.0.1:{}", free_port());
    let daemon =
        socket_activated(&activate, &address, &dir.path().join("no-notify"), &listen, Path::new("/nonexistent"));
    // The daemon starts at the first connection.
    let mut attempts = 0;
    let _connection = loop {
        match tokio::net::TcpStream::connect(&address).await {
            Ok(connection) => break connection,
            Err(error) => {
                attempts += 1;
                assert!(attempts < 500, "systemd-socket-activate never listened on {address}: {error}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let output = tokio::task::spawn_blocking(move || daemon.wait_with_output()).await.expect("joins").expect("exits");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("the socket systemd passed (LISTEN_FDS) cannot be served"), "{stderr}");
    assert!(stderr.contains("unix stream socket"), "{stderr}");
}
