//! The command line at the daemon's socket, and each way it cannot get through, with the exit
//! status a script tells apart and the next step for a person: no socket, nothing listening, a
//! daemon too old for the command, and (as root, on a real daemon and containerd) the socket as
//! the shipped socket unit makes it: a member of its group gets through its directory, anyone
//! else is told which group to join and how.

mod support;

use std::{
    os::unix::fs::PermissionsExt,
    path::Path,
    process::{Command, Stdio},
};

use prost::Message;
use support::{
    accounts::ThrowawayGroup,
    process::{DaemonProcess, in_ci, require_tool},
    stack::LocalStack,
};

const BIN: &str = env!("CARGO_BIN_EXE_cri-imaged");

/// `cri-imaged ARGS` through pipes: its exit status, stdout, stderr.
fn cli(program: &Path, args: &[&str]) -> (i32, String, String) {
    cli_as(Command::new(program).args(args))
}

fn cli_as(command: &mut Command) -> (i32, String, String) {
    let output = command.env_remove("CRI_IMAGED_SOCKET").stdin(Stdio::null()).output().expect("cri-imaged runs");
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).expect("UTF-8 output");
    (output.status.code().unwrap_or(-1), text(output.stdout), text(output.stderr))
}

fn socket_flag(socket: &Path) -> String {
    format!("--socket={}", socket.display())
}

#[test]
fn no_socket_exits_3_naming_the_path_and_asking_whether_cri_imaged_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("cri-imaged.sock");
    let (status, stdout, stderr) = cli(Path::new(BIN), &["status", &socket_flag(&socket)]);
    assert_eq!(status, 3, "{stderr}");
    assert_eq!(stdout, "");
    let said = format!("cri-imaged: no socket at {}: is cri-imaged running?", socket.display());
    assert!(stderr.starts_with(&said), "{stderr}");
    assert!(stderr.contains("--socket or CRI_IMAGED_SOCKET"), "{stderr}");
}

#[test]
fn a_socket_nothing_listens_on_exits_3_saying_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("cri-imaged.sock");
    // A daemon that died: its socket file is left, and a connect to it is refused.
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("bind"));
    assert!(socket.exists());
    let (status, _, stderr) = cli(Path::new(BIN), &["images", &socket_flag(&socket)]);
    assert_eq!(status, 3, "{stderr}");
    let said = format!("cri-imaged: nothing is listening on {}: the daemon is not running", socket.display());
    assert!(stderr.starts_with(&said), "{stderr}");
}

const OLD_VERSION: &str = "0.0.9";

/// A daemon of an older build: its generated server answers GetStatus (version [`OLD_VERSION`]),
/// and a method it does not know as tonic's generated servers do (UNIMPLEMENTED, no message, no
/// body). Plain HTTP/2, one task per connection and per call.
async fn serve_as_an_old_daemon(listener: tokio::net::UnixListener) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(async move {
            let Ok(mut connection) = h2::server::handshake(stream).await else { return };
            while let Some(Ok((request, respond))) = connection.accept().await {
                tokio::spawn(answer_as_an_old_daemon(request, respond));
            }
        });
    }
}

async fn answer_as_an_old_daemon(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<bytes::Bytes>,
) {
    let known = request.uri().path() == "/imagemanager.v1.ImageManager/GetStatus";
    let mut body = request.into_body();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let response = |grpc_status: Option<&str>| {
        let mut response = http::Response::builder().status(200).header("content-type", "application/grpc");
        if let Some(code) = grpc_status {
            response = response.header("grpc-status", code);
        }
        response.body(()).expect("a response")
    };
    if !known {
        let _ = respond.send_response(response(Some("12")), true);
        return;
    }
    let message =
        cri_imaged::api::GetStatusResponse { version: OLD_VERSION.into(), ..Default::default() }.encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    frame.extend_from_slice(&message);
    let Ok(mut stream) = respond.send_response(response(None), false) else { return };
    let _ = stream.send_data(frame.into(), false);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let _ = stream.send_trailers(trailers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_too_old_for_the_command_exits_5_naming_its_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("old.sock");
    let server = tokio::spawn(serve_as_an_old_daemon(tokio::net::UnixListener::bind(&socket).expect("bind")));
    let (status, stdout, stderr) =
        tokio::task::block_in_place(|| cli(Path::new(BIN), &["images", &socket_flag(&socket)]));
    assert_eq!(status, 5, "{stderr}");
    assert_eq!(stdout, "");
    let said = format!(
        "cri-imaged: the daemon at {} (version {OLD_VERSION}) does not serve ListImages: it is older than this \
         cri-imaged ({}); upgrade it",
        socket.display(),
        env!("CARGO_PKG_VERSION")
    );
    assert!(stderr.starts_with(&said), "{stderr}");
    // What it does serve, it answers: the old daemon is reachable, only too old.
    let (status, stdout, stderr) =
        tokio::task::block_in_place(|| cli(Path::new(BIN), &["status", &socket_flag(&socket)]));
    assert_eq!(status, 0, "{stderr}");
    assert!(stdout.starts_with(&format!("cri-imaged {OLD_VERSION} at {}", socket.display())), "{stdout}");
    server.abort();
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A mode of the shipped socket unit's `[Socket]` (its last `KEY=`), or systemd's `default` for it.
fn shipped_socket_unit_mode(key: &str, default: u32) -> u32 {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd/cri-imaged.socket");
    let text = std::fs::read_to_string(unit).expect("the shipped socket unit");
    text.lines()
        .rev()
        .find_map(|line| line.trim().strip_prefix(key)?.strip_prefix('='))
        .map_or(default, |mode| u32::from_str_radix(mode.trim(), 8).expect("an octal mode"))
}

/// `program ARGS` as the user `nobody` (primary group theirs), with the supplementary groups
/// `groups`: `--init-groups` as a new login gets them from /etc/group, `--clear-groups` as a
/// session from before a `usermod -aG` has none.
fn as_nobody(program: &Path, groups: &str, args: &[&str]) -> (i32, String, String) {
    cli_as(Command::new("setpriv").args(["--reuid=nobody", "--regid=nogroup", groups]).arg(program).args(args))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_of_the_socket_group_get_through_the_units_directory_and_others_are_told_how_to_join() {
    if !is_root() {
        assert!(!in_ci(), "making a group and calling as another user needs root in CI");
        eprintln!("SKIPPED: making a group and calling as another user needs root (outside CI)");
        return;
    }
    if ["setpriv", "groupadd", "gpasswd", "groupdel"].iter().any(|tool| require_tool(tool).is_none()) {
        return;
    }
    let Some(stack) = LocalStack::start() else { return };
    let group = ThrowawayGroup::create();

    // Where nobody may look: a directory of its own for the binary (the build's may be under a
    // home nobody cannot enter) and, under it, the socket's directory as the socket unit makes it
    // (root's, DirectoryMode), with the socket as SocketGroup and SocketMode make it.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let program = dir.path().join("cri-imaged");
    std::fs::copy(BIN, &program).expect("copy the binary");
    let run = dir.path().join("run");
    let directory_mode = shipped_socket_unit_mode("DirectoryMode", 0o755);
    std::fs::create_dir(&run).expect("mkdir");
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(directory_mode)).expect("chmod");
    let socket = run.join("cri-imaged.sock");
    let daemon = DaemonProcess::start(&socket, &stack.containerd_socket, &[]).await;
    std::os::unix::fs::chown(&socket, Some(0), Some(group.gid)).expect("chown the socket");
    let socket_mode = shipped_socket_unit_mode("SocketMode", 0o666);
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(socket_mode)).expect("chmod");
    let status = ["status".to_owned(), socket_flag(&socket)];
    let status: Vec<&str> = status.iter().map(String::as_str).collect();
    let call = |groups: &str| tokio::task::block_in_place(|| as_nobody(&program, groups, &status));
    let name = &group.name;

    // Not a member: refused, told who may call and how to become one.
    let (code, stdout, stderr) = call("--clear-groups");
    assert_eq!((code, stdout.as_str()), (4, ""), "{stderr}");
    let said = format!(
        "cri-imaged: permission denied on {0}: the socket {0} is root:{name} {socket_mode:04o}; run as root or as a \
         member of group {name} (`sudo usermod -aG {name} $USER`, then log in again)",
        socket.display()
    );
    assert_eq!(stderr.trim_end(), said);

    // Added to the group, but still in a session from before: told to log in again.
    group.add("nobody");
    let (code, _, stderr) = call("--clear-groups");
    assert_eq!(code, 4, "{stderr}");
    let again = format!("(you were added to {name} since you logged in: log in again, or `newgrp {name}`)");
    assert!(stderr.trim_end().ends_with(&again), "{stderr}");

    // A new login, a member: through the directory to the daemon, which answers.
    let (code, stdout, stderr) = call("--init-groups");
    assert_eq!(code, 0, "a member of {name} is refused: {stderr}\n{}", daemon.log_text());
    assert!(
        stdout.starts_with(&format!("cri-imaged {} at {}", env!("CARGO_PKG_VERSION"), socket.display())),
        "{stdout}"
    );
    assert!(stdout.lines().any(|line| line.starts_with("runtime") && line.ends_with("reachable")), "{stdout}");

    // Why the unit's DirectoryMode matters: a root-owned 0750 directory keeps every member out,
    // whatever the socket's group, and the message names the directory.
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o750)).expect("chmod");
    let (code, _, stderr) = call("--init-groups");
    assert_eq!(code, 4, "{stderr}");
    let blocked = format!("its directory {} is root:root 0750", run.display());
    assert!(stderr.contains(&blocked), "{stderr}");
}
