//! The CRI's own tools through cri-imaged's `runtime.v1.ImageService`, on a real containerd and a
//! loopback registry: critest's "Image Manager" specs (cri-tools v1.26.1, grpc-go 1.51, the
//! client code of that era's kubelet) straight against containerd and through cri-imaged in the
//! same run, and crictl's image commands through cri-imaged.

mod support;

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use support::{
    process::{DaemonProcess, metric, metrics_listen, require_shared_tool, require_tool},
    stack::LocalStack,
};

/// Specs that pass against containerd here: all of "Image Manager" but the one that pulls an
/// upstream image by a digest that cannot be rebuilt offline.
const SPECS_PASSING_OFFLINE: usize = 6;

/// One critest run's outcome: its summary lines and the names of the specs that passed.
struct CritestRun {
    summary: String,
    passed: BTreeSet<String>,
    ran: usize,
}

/// Runs critest's "Image Manager" specs with `image_endpoint` as the image service.
async fn critest(critest: PathBuf, containerd: &Path, image_endpoint: &Path, report: PathBuf) -> CritestRun {
    let args = [
        format!("--runtime-endpoint=unix://{}", containerd.display()),
        format!("--image-endpoint=unix://{}", image_endpoint.display()),
        "--ginkgo.focus=Image Manager".to_owned(),
        "--ginkgo.no-color".to_owned(),
        format!("--ginkgo.json-report={}", report.display()),
    ];
    let output = blocking(Command::new(critest).args(args)).await;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let summary: Vec<&str> =
        stdout.lines().filter(|line| line.starts_with("Ran ") || line.contains("Passed |")).collect();
    assert_eq!(summary.len(), 2, "critest printed no summary:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));

    // Ginkgo's JSON report, read with the python3 the stack already needs.
    let Some(python) = require_tool("python3") else { panic!("python3 is needed to read the report") };
    let read_report = r#"import json, sys
for suite in json.load(open(sys.argv[1])):
    for spec in suite.get("SpecReports") or []:
        if spec.get("LeafNodeType") == "It":
            print(spec["State"] + "\t" + " ".join((spec.get("ContainerHierarchyTexts") or []) + [spec["LeafNodeText"]]))"#;
    let states = blocking(Command::new(python).args(["-c", read_report]).arg(&report)).await;
    let states = String::from_utf8_lossy(&states.stdout).into_owned();
    let specs: Vec<(&str, &str)> = states.lines().filter_map(|line| line.split_once('\t')).collect();
    CritestRun {
        summary: summary.join("\n"),
        passed: specs.iter().filter(|(state, _)| *state == "passed").map(|(_, name)| name.to_string()).collect(),
        ran: specs.iter().filter(|(state, _)| *state != "skipped").count(),
    }
}

async fn blocking(command: &mut Command) -> Output {
    let mut command = std::mem::replace(command, Command::new("true"));
    tokio::task::spawn_blocking(move || command.output()).await.expect("task").expect("the command runs")
}

#[tokio::test]
async fn critest_image_manager_passes_through_cri_imaged_wherever_it_passes_against_containerd() {
    let Some(critest_bin) = require_shared_tool("critest") else { return };
    let Some(stack) = LocalStack::start() else { return };
    stack.seed_critest();
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &[]).await;

    let containerd = &stack.containerd_socket;
    let direct = critest(critest_bin.clone(), containerd, containerd, dir.path().join("direct.json")).await;
    let through = critest(critest_bin, containerd, &daemon.socket, dir.path().join("through.json")).await;
    println!("critest against containerd directly:\n{}", direct.summary);
    println!("critest through cri-imaged:\n{}", through.summary);

    assert_eq!(direct.ran, SPECS_PASSING_OFFLINE + 1, "every Image Manager spec ran: {:?}", direct.passed);
    assert_eq!(direct.passed.len(), SPECS_PASSING_OFFLINE, "{}", direct.summary);
    let missing: Vec<_> = direct.passed.difference(&through.passed).collect();
    assert!(
        missing.is_empty(),
        "passed against containerd, not through cri-imaged: {missing:?}\n{}",
        daemon.log_text()
    );
    assert_eq!(through.passed, direct.passed, "the same specs pass both ways");
}

/// `crictl ARGS` with a config file naming containerd as the runtime and cri-imaged as the image
/// service, as an operator would write it; returns (success, stdout + stderr).
async fn crictl(crictl: &Path, daemon: &DaemonProcess, containerd: &Path, args: Vec<String>) -> (bool, String) {
    let config = daemon.socket.with_file_name("crictl.yaml");
    let endpoints = format!(
        "runtime-endpoint: unix://{}\nimage-endpoint: unix://{}\ntimeout: 30\n",
        containerd.display(),
        daemon.socket.display()
    );
    std::fs::write(&config, endpoints).expect("crictl.yaml");
    let output = blocking(Command::new(crictl).arg("--config").arg(&config).args(args)).await;
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

#[tokio::test]
async fn crictl_pulls_lists_inspects_and_removes_an_image_through_cri_imaged() {
    let Some(crictl_bin) = require_shared_tool("crictl") else { return };
    let Some(stack) = LocalStack::start() else { return };
    let digest = stack.seed("demo/crictl:v1", "pulled by crictl");
    let image = format!("{}:v1", stack.image("demo/crictl"));
    let dir = tempfile::tempdir().expect("tempdir");
    let (port, listen) = metrics_listen();
    let daemon = DaemonProcess::start(
        &dir.path().join("cri-imaged.sock"),
        &stack.containerd_socket,
        &["--metrics-listen", &listen],
    )
    .await;
    let run = |args: &[&str]| {
        let args = args.iter().map(ToString::to_string).collect();
        crictl(&crictl_bin, &daemon, &stack.containerd_socket, args)
    };

    let (ok, pulled) = run(&["pull", &image]).await;
    assert!(ok && pulled.contains("Image is up to date for sha256:"), "{pulled}");
    let pulls = tokio::task::spawn_blocking(move || metric(port, "cri_imaged_pulls_total")).await.expect("metrics");
    assert_eq!(pulls, 1.0, "the pull went through cri-imaged's scheduler");

    let (ok, listed) = run(&["images", "--digests"]).await;
    let row = listed.lines().find(|line| line.starts_with(&stack.image("demo/crictl")));
    let row = row.unwrap_or_else(|| panic!("{image} is not listed (ok: {ok}):\n{listed}"));
    assert!(row.contains(" v1 ") && row.contains(&digest["sha256:".len()..][..13]), "{row}");

    let (ok, inspected) = run(&["inspecti", &image]).await;
    assert!(ok && inspected.contains(&format!(r#""{image}""#)), "{inspected}");
    assert!(inspected.contains(r#""repoDigests""#), "{inspected}");

    let (ok, removed) = run(&["rmi", &image]).await;
    assert!(ok && removed.contains(&format!("Deleted: {image}")), "{removed}");
    let (_, listed) = run(&["images"]).await;
    assert!(!listed.contains(&stack.image("demo/crictl")), "still listed after rmi:\n{listed}");
    let (ok, inspected) = run(&["inspecti", &image]).await;
    assert!(!ok && inspected.contains("no such image"), "{inspected}");
}
