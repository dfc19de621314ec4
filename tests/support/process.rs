//! The real `cri-imaged` binary as a child process, and external tools the tests need.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::Duration,
};

use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use super::unix_channel;

/// Whether this run is CI, where nothing may be skipped.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false")
}

/// The path of `tool` on PATH. Outside CI a missing tool skips the test (returns `None`, saying
/// so); in CI it fails the test.
pub fn require_tool(tool: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(tool))
        .find(|candidate| candidate.is_file());
    if found.is_none() {
        assert!(!in_ci(), "{tool} is not installed; CI must install it (see .ci/run)");
        eprintln!("SKIPPED: {tool} is not installed (outside CI; `make deps` installs it)");
    }
    found
}

/// Whether python3 can import every one of `modules`. Outside CI a missing one skips the test
/// (returns false, saying so); in CI it fails the test.
pub fn require_python_modules(modules: &[&str]) -> bool {
    let Some(python) = require_tool("python3") else { return false };
    let imports = format!("import {}", modules.join(", "));
    let found = Command::new(python).args(["-c", &imports]).output().is_ok_and(|out| out.status.success());
    if !found {
        assert!(!in_ci(), "python3 cannot `{imports}`; CI must install them (scripts/install-deps.sh)");
        eprintln!("SKIPPED: python3 cannot `{imports}` (outside CI; `make deps` installs them)");
    }
    found
}

/// A running `cri-imaged serve`, its stderr kept in a file.
pub struct DaemonProcess {
    pub socket: PathBuf,
    pub log: PathBuf,
    child: Child,
}

impl DaemonProcess {
    /// Starts `cri-imaged serve --listen SOCKET --runtime-endpoint RUNTIME` plus `extra` flags and
    /// waits until it answers health checks.
    pub async fn start(socket: &Path, runtime_socket: &Path, extra: &[&str]) -> Self {
        let daemon = Self::spawn(socket, runtime_socket, extra);
        daemon.wait_until_serving().await;
        daemon
    }

    /// Starts the daemon without waiting for it, logging our own events at every level.
    pub fn spawn(socket: &Path, runtime_socket: &Path, extra: &[&str]) -> Self {
        // Our own events at every level, so tests see all we would ever log.
        Self::spawn_logging(socket, runtime_socket, extra, "info,cri_imaged=trace")
    }

    /// Starts the daemon without waiting for it, with `RUST_LOG=rust_log`.
    pub fn spawn_logging(socket: &Path, runtime_socket: &Path, extra: &[&str], rust_log: &str) -> Self {
        Self::spawn_with(Path::new(env!("CARGO_BIN_EXE_cri-imaged")), socket, runtime_socket, extra, rust_log, None)
    }

    /// As [`DaemonProcess::spawn_logging`], running `program` (another build of cri-imaged, for
    /// a comparison) instead of this build's.
    pub fn spawn_program(program: &Path, socket: &Path, runtime_socket: &Path, extra: &[&str], rust_log: &str) -> Self {
        Self::spawn_with(program, socket, runtime_socket, extra, rust_log, None)
    }

    /// As [`DaemonProcess::spawn_logging`], with `HOME` and the working directory set to `home`:
    /// the kubelet's search for the node's docker config (`--root-dir`, the working directory,
    /// `$HOME/.docker`, `/.docker`, then `.dockercfg` in the same places with `$HOME` and `/`) then
    /// sees only what the test put there, and `/` (root's own, not the user's, on this machine).
    pub fn spawn_at_home(socket: &Path, runtime_socket: &Path, extra: &[&str], rust_log: &str, home: &Path) -> Self {
        Self::spawn_with(
            Path::new(env!("CARGO_BIN_EXE_cri-imaged")),
            socket,
            runtime_socket,
            extra,
            rust_log,
            Some(home),
        )
    }

    fn spawn_with(
        program: &Path,
        socket: &Path,
        runtime_socket: &Path,
        extra: &[&str],
        rust_log: &str,
        home: Option<&Path>,
    ) -> Self {
        // Beside the socket's nearest existing ancestor: the daemon creates the socket's directory.
        let log_dir = socket.ancestors().skip(1).find(|dir| dir.is_dir()).expect("an existing ancestor");
        // A file of its own: a daemon taking a socket over from another must not overwrite its log.
        let name = socket.file_name().expect("socket name").to_string_lossy().into_owned();
        let log = (1..)
            .map(|n| log_dir.join(if n == 1 { format!("{name}.log") } else { format!("{name}.{n}.log") }))
            .find(|log| !log.exists())
            .expect("a free log name");
        let stderr = std::fs::File::create(&log).expect("daemon log file");
        // Quick probes and a short drain, pull records beside the socket (never in the machine's
        // /var/lib/cri-imaged), and no periodic image GC (the test's disk is the machine's),
        // unless the test sets its own.
        let root_dir = socket.parent().expect("the socket is in a directory").join("root");
        let root_dir = root_dir.to_str().expect("utf-8 path");
        let defaults = [
            ("--health-probe-interval", "100ms"),
            ("--health-probe-timeout", "200ms"),
            ("--shutdown-timeout", "2s"),
            ("--root-dir", root_dir),
            ("--image-gc-high-threshold", "100"),
        ];
        let mut command = Command::new(program);
        command
            .arg("serve")
            .arg("--listen")
            .arg(socket)
            .arg("--runtime-endpoint")
            .arg(runtime_socket)
            .args(defaults.iter().filter(|(flag, _)| !extra.contains(flag)).flat_map(|(flag, value)| [flag, value]))
            .args(extra)
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        if let Some(home) = home {
            command.env("HOME", home).current_dir(home);
        }
        let child = command.spawn().expect("cri-imaged starts");
        Self { socket: socket.to_owned(), log, child }
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits, at most 5 s, until the daemon answers health checks.
    pub async fn wait_until_serving(&self) {
        for _ in 0..200 {
            let mut client = HealthClient::new(unix_channel(&self.socket));
            if client.check(HealthCheckRequest { service: String::new() }).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("cri-imaged did not answer on {} within 5s; log:\n{}", self.socket.display(), self.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM without waiting.
    pub fn send_sigterm(&self) {
        self.signal("-TERM");
    }

    /// Sends `signal` (`-HUP`, `-TERM`, …) without waiting.
    pub fn signal(&self, signal: &str) {
        signal_process(signal, self.child.id());
    }

    /// Waits, at most 10 s, until the daemon's log satisfies `condition`; returns the log.
    pub async fn wait_for_log(&self, what: &str, mut condition: impl FnMut(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log_text();
            if condition(&log) {
                return log;
            }
            assert!(tokio::time::Instant::now() < deadline, "{what}: not within 10 s; log:\n{log}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends SIGTERM and waits (at most 10 s) for the exit status.
    pub async fn terminate(mut self) -> (ExitStatus, String) {
        self.send_sigterm();
        let status = self.wait_for_exit(Duration::from_secs(10)).await;
        (status, self.log_text())
    }

    /// Waits for the process to exit by itself, at most `limit`.
    pub async fn wait_for_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(tokio::time::Instant::now() < deadline, "cri-imaged did not exit within {limit:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl DaemonProcess {
    /// Ends the daemon with SIGKILL, as a crash would (no drain, no clean-up of any kind), and
    /// reaps it; returns its exit status.
    pub fn kill_hard(&mut self) -> ExitStatus {
        self.child.kill().expect("SIGKILL is sent");
        self.child.wait().expect("the killed daemon is reaped")
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `grpcurl -plaintext -unix FLAGS SOCKET VERB` against a daemon socket, with grpcurl's
/// default `:authority` (the socket path); returns (success, stdout, stderr).
pub fn grpcurl(grpcurl: &Path, socket: &Path, flags: &[&str], verb: &[&str]) -> (bool, String, String) {
    let output = Command::new(grpcurl)
        .args(["-plaintext", "-unix"])
        .args(flags)
        .arg(socket)
        .args(verb)
        .output()
        .expect("grpcurl runs");
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    (output.status.success(), text(output.stdout), text(output.stderr))
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// A free loopback port and the `--metrics-listen` value for it.
pub fn metrics_listen() -> (u16, String) {
    let port = free_port();
    (port, format!("127.0.0.1:{port}"))
}

/// The sum of every series of the metric `name` served on `http://127.0.0.1:port/metrics`
/// (0 when absent). Blocking.
pub fn metric(port: u16, name: &str) -> f64 {
    let text = http_get(port, "/metrics");
    text.lines()
        .filter(|line| line.strip_prefix(name).is_some_and(|rest| rest.starts_with([' ', '{'])))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `GET path` over HTTP/1.1 on loopback; returns the whole response, headers included.
pub fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics port");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("read timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").expect("send request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read response");
    response
}

/// The sum of the series of the metric `name` served on `http://127.0.0.1:port/metrics` whose
/// labels include `label` (written as `key="value"`); 0 when there is none. Blocking.
pub fn metric_with_label(port: u16, name: &str, label: &str) -> f64 {
    let text = http_get(port, "/metrics");
    text.lines()
        .filter_map(|line| line.strip_prefix(name))
        .filter_map(|rest| rest.strip_prefix('{'))
        .filter_map(|rest| rest.split_once('}'))
        .filter(|(labels, _)| labels.split(',').any(|pair| pair == label))
        .filter_map(|(_, value)| value.trim().split(' ').next()?.parse::<f64>().ok())
        // Not `sum()`: an empty sum of floats is -0, printed "-0".
        .fold(0.0, |sum, value| sum + value)
}

/// The resident memory of process `pid` now, in MiB (`VmRSS`).
pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the process's status");
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .expect("a VmRSS line");
    kib / 1024.0
}

/// The open file descriptors of process `pid` now.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).expect("the process's fds").count()
}

/// Sends `signal` (`-STOP`, `-KILL`, …) to process `pid`.
pub fn signal_process(signal: &str, pid: u32) {
    let sent = Command::new("kill").args([signal, &pid.to_string()]).status().expect("kill runs");
    assert!(sent.success(), "kill {signal} {pid} failed");
}
