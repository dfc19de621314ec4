use std::{ffi::OsString, path::Path};

use clap::CommandFactory;

use super::*;
use crate::config::Cli;

fn serve() -> Command {
    Cli::command().find_subcommand("serve").expect("the serve command").clone()
}

/// The arguments `text` adds when the command line gave none of its flags.
fn args(text: &str) -> Result<Vec<String>, FileError> {
    let (args, _) = parse(Path::new("cri-imaged.yaml"), text, &serve(), |_| false)?;
    Ok(args.into_iter().map(|arg| arg.into_string().expect("utf-8")).collect())
}

fn refused(text: &str) -> String {
    args(text).expect_err("refused").to_string()
}

#[test]
fn each_field_becomes_its_flag_with_the_value_as_the_flag_takes_it() {
    let text = "registry-qps: 0.5\nregistry-burst: 4\npresence-cache: false\nimage-pull-backoff-max: 5m\n\
                registry-qps-per-host:\n  - docker.io=2:5\n  - quay.io=1:1\n";
    assert_eq!(
        args(text).expect("valid"),
        [
            "--registry-qps=0.5",
            "--registry-burst=4",
            "--presence-cache=false",
            "--image-pull-backoff-max=5m",
            "--registry-qps-per-host=docker.io=2:5",
            "--registry-qps-per-host=quay.io=1:1",
        ]
    );
}

#[test]
fn an_empty_file_or_an_empty_field_sets_nothing() {
    assert_eq!(args("").expect("empty"), Vec::<String>::new());
    assert_eq!(args("# only comments\n").expect("comments"), Vec::<String>::new());
    assert_eq!(args("metrics-listen:\nregistry-qps-per-host: []\n").expect("empty fields"), Vec::<String>::new());
}

#[test]
fn a_flag_given_on_the_command_line_is_left_to_it() {
    let given = |arg: &Arg| arg.get_long() == Some("registry-qps");
    let (args, _) = parse(Path::new("f.yaml"), "registry-qps: 1\nregistry-burst: 2\n", &serve(), given).expect("valid");
    assert_eq!(args, [OsString::from("--registry-burst=2")]);
}

#[test]
fn an_unknown_field_is_named_with_its_line_and_the_flag_it_resembles() {
    assert_eq!(
        refused("registry-qps: 1\n\nregistryBurst: 4\n"),
        "cri-imaged.yaml:3: unknown field `registryBurst`: the fields are the serve flags without their dashes, e.g. `registry-burst`"
    );
    assert!(refused("image_gc_period: 1m\n").ends_with("e.g. `image-gc-period`"));
    assert_eq!(
        refused("colour: blue\n"),
        "cri-imaged.yaml:1: unknown field `colour`: the fields are the serve flags without their dashes"
    );
    assert!(refused("\"quoted-field\": 1\n").starts_with("cri-imaged.yaml:1: unknown field `quoted-field`"));
    assert!(refused("{colour: blue}").starts_with("cri-imaged.yaml: unknown field `colour`"), "flow style: no line");
}

#[test]
fn a_value_its_flag_refuses_is_named_with_its_line_field_and_reason() {
    assert_eq!(
        refused("listen: /run/x.sock\nworker-threads: 0\n"),
        "cri-imaged.yaml:2: worker-threads: invalid value \"0\": expected a whole number, 1 or more"
    );
    assert_eq!(
        refused("presence-cache: yes\n"),
        "cri-imaged.yaml:1: presence-cache: invalid value 'yes' [possible values: true, false]"
    );
    assert_eq!(
        refused("registry-rate-limit-mode: sometimes\n"),
        "cri-imaged.yaml:1: registry-rate-limit-mode: invalid value 'sometimes' [possible values: fail, wait]"
    );
    assert!(
        refused("shutdown-timeout: 0s\n").contains("shutdown-timeout: invalid value \"0s\": \"0s\" must be greater")
    );
    assert!(refused("registry-qps-per-host:\n  - docker.io=0:5\n").contains("QPS \"0\" is not accepted for a host"));
}

#[test]
fn a_value_of_the_wrong_shape_is_refused() {
    assert_eq!(refused("registry-qps: [1, 2]\n"), "cri-imaged.yaml:1: registry-qps: takes one value, not a list");
    assert_eq!(
        refused("registry-qps: {a: 1}\n"),
        "cri-imaged.yaml:1: registry-qps: expected a plain value, not a mapping"
    );
    assert_eq!(
        refused("registry-qps-per-host: [[docker.io=1:1]]\n"),
        "cri-imaged.yaml:1: registry-qps-per-host: expected a list of plain values"
    );
}

#[test]
fn a_file_that_is_not_a_mapping_of_fields_or_names_another_file_is_refused() {
    assert!(refused("- registry-qps\n").contains("expected a mapping of flag names to values"));
    assert!(refused("registry-qps: [\n").starts_with("cri-imaged.yaml: not valid YAML:"));
    assert!(refused("registry-qps: 1\nregistry-qps: 2\n").contains("duplicate entry"));
    assert_eq!(
        refused("config: other.yaml\n"),
        "cri-imaged.yaml:1: `config` is a command-line flag only: a config file cannot name another"
    );
}

#[test]
fn the_line_of_a_field_is_its_top_level_key() {
    let text = "# registry-qps: 9\nregistry-qps-per-host:\n  - registry-qps: x\nregistry-qps : 1\n";
    assert_eq!(line_of(text, "registry-qps"), Some(4));
    assert_eq!(line_of(text, "registry-qps-per-host"), Some(2));
    assert_eq!(line_of("'listen': x\n", "listen"), Some(1));
    assert_eq!(line_of("{listen: x}", "listen"), None);
}

#[test]
fn a_file_nested_deeper_than_any_value_needs_is_refused_before_it_is_parsed() {
    let deep = format!("registry-qps-per-host: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    let started = tokio::time::Instant::now();
    let refusal = refused(&deep);
    assert_eq!(
        refusal,
        "cri-imaged.yaml: nested deeper than 16 levels of `[` and `{`; the fields take plain values or lists"
    );
    // Parsing first took about 40 s here; refusing is a scan.
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    let commented = "# [[[[[[[[[[[[[[[[[[[[\nregistry-qps-per-host: [docker.io=2:5] # ]]]]\n";
    assert_eq!(args(commented).expect("a comment's brackets do not count"), ["--registry-qps-per-host=docker.io=2:5"]);
}

#[test]
fn a_config_path_that_is_no_regular_file_or_too_large_is_refused_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("fifo.yaml");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success());
    let huge = dir.path().join("huge.yaml");
    std::fs::write(&huge, vec![b'#'; (CONFIG_LIMIT + 1) as usize]).expect("written");
    let linked = dir.path().join("linked.yaml");
    std::fs::write(dir.path().join("real.yaml"), "registry-qps: 3\n").expect("written");
    std::os::unix::fs::symlink(dir.path().join("real.yaml"), &linked).expect("link");
    let zero = dir.path().join("zero.yaml");
    std::os::unix::fs::symlink("/dev/zero", &zero).expect("link");
    let read =
        |path: &Path| super::read(path, &serve(), |_| false).map(|(args, _)| args).map_err(|error| error.to_string());
    assert!(read(&fifo).expect_err("a FIFO").ends_with("fifo.yaml: it is a FIFO, not a regular file"));
    assert!(read(&huge).expect_err("too large").ends_with("huge.yaml: it is larger than 1048576 bytes"));
    assert!(read(&zero).expect_err("a device").ends_with("zero.yaml: it is a character device, not a regular file"));
    assert_eq!(
        read(&linked).expect("a link to a file is followed (a ConfigMap's)"),
        [OsString::from("--registry-qps=3")]
    );
}
