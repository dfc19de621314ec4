//! The Debian package of scripts/build-deb.sh: it holds the binary, the units, the docs, the shell
//! completions and the man pages; the pages render without a warning and the bash, zsh and fish
//! completions complete in their shells (bash and zsh in a real terminal); on this machine (root,
//! no systemd running) `dpkg -i` installs it, the installed binary answers `--version` and serves
//! a call socket-activated as its installed units say, and `dpkg -r` removes every file it
//! installed.

mod support;

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use cri_imaged::api::{GetStatusRequest, image_manager_client::ImageManagerClient};
use support::{
    fake_runtime::{FakeImageService, FakeRuntime},
    process::{in_ci, require_tool},
    tmux::Terminal,
    unix_channel,
};

const PACKAGE: &str = "cri-imaged";
const BINARY: &str = "/usr/bin/cri-imaged";
const SERVICE: &str = "/lib/systemd/system/cri-imaged.service";
const SOCKET: &str = "/lib/systemd/system/cri-imaged.socket";
/// The default config, a conffile: kept on removal, gone on purge.
const CONFIG: &str = "/etc/cri-imaged/config.yaml";
const BASH_COMPLETION: &str = "/usr/share/bash-completion/completions/cri-imaged";
const ZSH_COMPLETION: &str = "/usr/share/zsh/vendor-completions/_cri-imaged";
const FISH_COMPLETION: &str = "/usr/share/fish/vendor_completions.d/cri-imaged.fish";
/// The Prometheus rules (the book's Monitoring), with their unit tests in `tests/` beside them.
const PROMETHEUS_RULES: &str = "/usr/share/doc/cri-imaged/prometheus/cri-imaged.rules.yml";
/// Every file the package installs but its conffile: the man pages are the command's, then one
/// per command a person runs (the hidden generate-man has none).
const FILES: [&str; 36] = [
    BINARY,
    SERVICE,
    SOCKET,
    "/usr/share/doc/cri-imaged/README.md.gz",
    "/usr/share/doc/cri-imaged/copyright",
    "/usr/share/doc/cri-imaged/examples/policy/README.md",
    "/usr/share/doc/cri-imaged/examples/policy/allow-my-registries.json",
    "/usr/share/doc/cri-imaged/examples/policy/signed-from-my-registry.json",
    "/usr/share/doc/cri-imaged/examples/policy/namespaces/ci.json",
    PROMETHEUS_RULES,
    "/usr/share/doc/cri-imaged/prometheus/scrape-config.yml",
    "/usr/share/doc/cri-imaged/prometheus/scrape-config-kubernetes.yml",
    "/usr/share/doc/cri-imaged/prometheus/podmonitor.yaml",
    "/usr/share/doc/cri-imaged/prometheus/tests/availability.test.yml",
    "/usr/share/doc/cri-imaged/prometheus/tests/image-gc.test.yml",
    "/usr/share/doc/cri-imaged/prometheus/tests/policy.test.yml",
    "/usr/share/doc/cri-imaged/prometheus/tests/pulls.test.yml",
    "/usr/share/doc/cri-imaged/prometheus/tests/registries.test.yml",
    "/usr/share/doc/cri-imaged/grafana/cri-imaged.json",
    BASH_COMPLETION,
    ZSH_COMPLETION,
    FISH_COMPLETION,
    "/usr/share/man/man1/cri-imaged.1.gz",
    "/usr/share/man/man1/cri-imaged-serve.1.gz",
    "/usr/share/man/man1/cri-imaged-pull.1.gz",
    "/usr/share/man/man1/cri-imaged-images.1.gz",
    "/usr/share/man/man1/cri-imaged-status.1.gz",
    "/usr/share/man/man1/cri-imaged-events.1.gz",
    "/usr/share/man/man1/cri-imaged-gc.1.gz",
    "/usr/share/man/man1/cri-imaged-backoff.1.gz",
    "/usr/share/man/man1/cri-imaged-backoff-clear.1.gz",
    "/usr/share/man/man1/cri-imaged-policy.1.gz",
    "/usr/share/man/man1/cri-imaged-policy-check.1.gz",
    "/usr/share/man/man1/cri-imaged-prepull.1.gz",
    "/usr/share/man/man1/cri-imaged-top.1.gz",
    "/usr/share/man/man1/cri-imaged-completion.1.gz",
];
/// The docs book as HTML (mdBook's pages, styles, scripts and fonts, whose names carry hashes), so
/// checked apart from `FILES`: these pages at least, every file of it 0644 root/root.
const BOOK: &str = "/usr/share/doc/cri-imaged/html/";
const BOOK_PAGES: [&str; 6] = [
    "index.html",
    "tasks/kubelet.html",
    "tasks/imagepullbackoff.html",
    "upgrade.html",
    "monitoring.html",
    "reference/flags.html",
];
/// A file of the package as `dpkg-deb --contents` lists it: path, mode, owner.
type Entry<'a> = (&'a str, &'a str, &'a str);
/// What its postinst makes besides: the socket enabled (deb-systemd-helper's symlink and record).
const ENABLEMENT: [&str; 2] = [
    "/etc/systemd/system/sockets.target.wants/cri-imaged.socket",
    "/var/lib/systemd/deb-systemd-helper-enabled/cri-imaged.socket.dsh-also",
];

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program).args(args).output().unwrap_or_else(|error| panic!("{program} does not run: {error}"))
}

fn said(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// The tools building the package needs; outside CI a missing one skips the test.
fn build_tools_present() -> bool {
    ["dpkg-deb", "dpkg-shlibdeps", "strip"].iter().all(|tool| require_tool(tool).is_some())
}

/// Builds the package from the test build's binary into `out`; returns its path.
fn build_deb(out: &Path) -> PathBuf {
    build_deb_with(out, &[])
}

/// As [`build_deb`], with `env` set for the script.
fn build_deb_with(out: &Path, env: &[(&str, &str)]) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-deb.sh");
    let started = tokio::time::Instant::now();
    let output = Command::new(&script)
        .args(["--binary", env!("CARGO_BIN_EXE_cri-imaged"), "--out"])
        .arg(out)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("scripts/build-deb.sh runs");
    assert!(output.status.success(), "scripts/build-deb.sh failed:\n{}", said(&output));
    eprintln!("built the package in {:.1?}", started.elapsed());
    // "build-deb: /usr/bin/cri-imaged is 10089304 bytes stripped (10.1 MB)"
    let stderr = String::from_utf8_lossy(&output.stderr);
    let size = stderr.lines().find(|line| line.contains("bytes stripped")).expect("the stripped size is told");
    eprintln!("{size}");
    let deb = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let arch = run("dpkg", &["--print-architecture"]);
    let name = format!("{PACKAGE}_{}_{}.deb", env!("CARGO_PKG_VERSION"), String::from_utf8_lossy(&arch.stdout).trim());
    assert_eq!(deb, out.join(name), "the package's name");
    assert!(deb.is_file(), "{} was not written", deb.display());
    deb
}

/// The value of `field` in a control file or unit (`Field: value` or `Key=value` lines).
fn field<'a>(text: &'a str, field: &str, separator: &str) -> Option<&'a str> {
    text.lines().find_map(|line| line.trim().strip_prefix(field)?.strip_prefix(separator)).map(str::trim)
}

#[test]
fn the_package_holds_the_binary_the_units_and_the_docs() {
    if !build_tools_present() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let deb = build_deb(dir.path());
    let deb = deb.to_str().expect("utf-8 path");
    let tree = extract(Path::new(deb), &dir.path().join("tree"));

    let info = run("dpkg-deb", &["--info", deb]);
    assert!(info.status.success(), "{}", said(&info));
    let info = String::from_utf8_lossy(&info.stdout);
    eprintln!("{info}");
    assert_eq!(field(&info, "Package", ":"), Some(PACKAGE), "{info}");
    assert_eq!(field(&info, "Version", ":"), Some(env!("CARGO_PKG_VERSION")), "{info}");
    assert_eq!(field(&info, "Maintainer", ":"), Some("cri-imaged developers"), "{info}");
    let depends = field(&info, "Depends", ":").expect("a Depends field");
    assert!(depends.starts_with("libc6 (>= 2.") && depends.contains("passwd"), "Depends: {depends}");
    // "1478 bytes, 34 lines * postinst #!/bin/sh": the star marks an executable.
    for script in ["postinst", "prerm", "postrm"] {
        let executable = info.lines().any(|line| line.split_whitespace().skip(3).take(3).eq(["lines", "*", script]));
        assert!(executable, "no executable {script}: {info}");
    }

    let contents = run("dpkg-deb", &["--contents", deb]);
    assert!(contents.status.success(), "{}", said(&contents));
    let contents = String::from_utf8_lossy(&contents.stdout);
    // "-rwxr-xr-x root/root 18651776 2026-11-23 04:57 ./usr/bin/cri-imaged"
    let (book, mut files): (Vec<Entry>, Vec<Entry>) = contents
        .lines()
        .filter(|line| !line.starts_with('d'))
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            (words[5].trim_start_matches('.'), words[0], words[1])
        })
        .partition(|(path, _, _)| path.starts_with(BOOK));
    files.sort_unstable();
    for page in BOOK_PAGES {
        assert!(book.iter().any(|(path, _, _)| path.strip_prefix(BOOK) == Some(page)), "no {BOOK}{page}: {contents}");
    }
    for (path, mode, owner) in &book {
        assert_eq!((*mode, *owner), ("-rw-r--r--", "root/root"), "{path}");
    }
    let mut expected: Vec<(&str, &str, &str)> = FILES
        .iter()
        .chain([&CONFIG])
        .map(|file| (*file, if *file == BINARY { "-rwxr-xr-x" } else { "-rw-r--r--" }, "root/root"))
        .collect();
    expected.sort_unstable();
    assert_eq!(files, expected, "{contents}");

    let service = std::fs::read_to_string(tree.join(SERVICE.trim_start_matches('/'))).expect("the service");
    let exec_start = field(&service, "ExecStart", "=").expect("an ExecStart");
    assert_eq!(exec_start, format!("/usr/bin/cri-imaged serve --config {CONFIG}"), "every setting in the file");
    assert!(!service.contains("/usr/local/bin"), "{service}");
    let conffiles = dir.path().join("control");
    let control = Command::new("dpkg-deb").args(["--control", deb]).arg(&conffiles).output().expect("dpkg-deb runs");
    assert!(control.status.success(), "{}", said(&control));
    let conffiles = std::fs::read_to_string(conffiles.join("conffiles")).expect("a conffiles list");
    assert_eq!(conffiles, format!("{CONFIG}\n"), "the config is a conffile: an admin's edits survive upgrades");
}

#[test]
fn the_packaged_prometheus_rules_pass_their_unit_tests_where_they_are_installed() {
    if !build_tools_present() {
        return;
    }
    let Some(promtool) = require_tool("promtool") else { return };
    let (_dir, tree) = unpacked();
    let rules = tree.join(PROMETHEUS_RULES.trim_start_matches('/'));
    let directory = rules.parent().expect("a directory");
    let check = Command::new(&promtool).args(["check", "rules"]).arg(&rules).output().expect("promtool runs");
    assert!(check.status.success(), "{}", said(&check));
    let mut tests: Vec<PathBuf> = std::fs::read_dir(directory.join("tests"))
        .expect("the unit tests are packaged")
        .map(|entry| entry.expect("entry").path())
        .collect();
    tests.sort();
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/tests");
    let in_repo = std::fs::read_dir(shipped).expect("deploy/prometheus/tests").count();
    assert_eq!(tests.len(), in_repo, "every unit test of the rules is packaged: {tests:?}");
    let run = Command::new(&promtool)
        .args(["test", "rules"])
        .args(&tests)
        .current_dir(directory)
        .output()
        .expect("promtool runs");
    assert!(run.status.success(), "{}", said(&run));
    assert_eq!(said(&run).matches("SUCCESS").count(), in_repo, "{}", said(&run));
}

/// The package's files, extracted into `tree` (returned).
fn extract(deb: &Path, tree: &Path) -> PathBuf {
    let extract = Command::new("dpkg-deb").arg("--extract").args([deb, tree]).output().expect("dpkg-deb runs");
    assert!(extract.status.success(), "{}", said(&extract));
    tree.to_owned()
}

/// The package built and unpacked: the tree's root, in a directory that goes with the guard.
fn unpacked() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let deb = build_deb(dir.path());
    let tree = extract(&deb, &dir.path().join("tree"));
    (dir, tree)
}

/// A shell and the package's completion for it, unpacked with the package's tree (gone with
/// `_dir`).
struct Packaged {
    shell: PathBuf,
    completion: PathBuf,
    tree: PathBuf,
    _dir: tempfile::TempDir,
}

/// The package built and unpacked, with `shell` found and its completion (installed at
/// `installed_at`) read by it without an error (`check`: its flag to read and not run). `None`
/// where the package cannot be built here, or (outside CI) the shell is missing.
fn packaged_completion(shell: &str, check: &str, installed_at: &str) -> Option<Packaged> {
    if !build_tools_present() {
        return None;
    }
    let shell = require_tool(shell)?;
    let (dir, tree) = unpacked();
    let completion = tree.join(installed_at.trim_start_matches('/'));
    let syntax = Command::new(&shell).arg(check).arg(&completion).output().expect("the shell runs");
    assert!(syntax.status.success() && syntax.stderr.is_empty(), "{check}: {}", said(&syntax));
    Some(Packaged { shell, completion, tree, _dir: dir })
}

/// Types `typed` at `prompt` in `terminal`'s shell, then Tab, then a mark: the line must become
/// `prompt`, `completed` and the mark (a completed word ends with a space, or an option with the
/// `=` its value follows, so the mark shows exactly what was added).
fn completes(terminal: &Terminal, prompt: &str, typed: &str, completed: &str) {
    terminal.send_keys(&["C-u", typed, "Tab"]);
    terminal.send_keys(&["#"]);
    let wanted = format!("{prompt}{completed}#");
    terminal.wait_for(&wanted, Duration::from_secs(10), |screen| screen.lines().any(|line| line == wanted));
}

/// 2023-11-14 22:13:20 UTC: the pages' date must come from it, not from the clock.
const SOURCE_DATE_EPOCH: &str = "1700000000";

#[test]
fn the_man_pages_render_without_a_warning_dated_from_source_date_epoch() {
    if !build_tools_present() {
        return;
    }
    let Some(man) = require_tool("man") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let deb = build_deb_with(dir.path(), &[("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH)]);
    let tree = extract(&deb, &dir.path().join("tree"));
    let pages: Vec<&str> = FILES.into_iter().filter(|file| file.starts_with("/usr/share/man/")).collect();
    assert_eq!(pages.len(), 14);
    for page in pages {
        let path = tree.join(page.trim_start_matches('/'));
        // gzip -n: no file name (FLG.FNAME, 0x08) and no time stamp (MTIME) in the header.
        let bytes = std::fs::read(&path).unwrap_or_else(|error| panic!("{page}: {error}"));
        assert_eq!(&bytes[..3], [0x1f, 0x8b, 8], "{page} is not gzipped");
        assert_eq!(
            (bytes[3] & 0x08, &bytes[4..8]),
            (0, &[0u8; 4][..]),
            "{page}: a name or time stamp in its gzip header"
        );
        // As a person reads it, every groff and man warning on (--warnings); no pager, no terminal.
        let output = Command::new(&man)
            .args(["--warnings", "--local-file"])
            .arg(&path)
            .env("MANWIDTH", "80")
            .env("MANPAGER", "cat")
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::null())
            .output()
            .expect("man runs");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "man {page}: {}", said(&output));
        assert_eq!(String::from_utf8_lossy(&output.stderr), "", "man --warnings {page}");
        assert!(text.contains("2023-11-14"), "{page} is not dated from SOURCE_DATE_EPOCH:\n{text}");
        assert!(text.contains("SYNOPSIS") && text.contains("cri-imaged"), "{page}:\n{text}");
    }
    // A command that talks to the daemon lists the exit statuses scripts tell apart.
    let pull = Command::new(&man)
        .arg("--local-file")
        .arg(tree.join("usr/share/man/man1/cri-imaged-pull.1.gz"))
        .env("MANPAGER", "cat")
        .output()
        .expect("man runs");
    let pull = String::from_utf8_lossy(&pull.stdout);
    assert!(pull.contains("EXIT STATUS") && pull.contains("130  interrupted"), "{pull}");
}

#[test]
fn the_packaged_bash_completion_completes_commands_in_a_terminal() {
    let Some(Packaged { shell: bash, completion, _dir, .. }) = packaged_completion("bash", "-n", BASH_COMPLETION)
    else {
        return;
    };
    let completion = completion.to_str().expect("utf-8 path");
    let script = format!("source {completion} && complete -p cri-imaged");
    let registered = run(bash.to_str().expect("utf-8 path"), &["--norc", "--noprofile", "-c", &script]);
    assert!(registered.status.success(), "{}", said(&registered));
    let registered = String::from_utf8_lossy(&registered.stdout);
    // "complete -o bashdefault -o default -o nosort -F _cri__imaged cri-imaged"
    assert!(
        registered.starts_with("complete ")
            && registered.contains(" -F ")
            && registered.trim_end().ends_with(" cri-imaged"),
        "{registered}"
    );

    // As a person meets it: an interactive bash with the file sourced, as bash-completion does, in
    // an empty directory (a word the script does not complete would complete as a file name).
    let empty = tempfile::tempdir().expect("tempdir");
    // PS1 set on the shell's own command line: a non-interactive bash between tmux and it drops one
    // from the environment.
    let shell = format!("env -C {} PS1='$ ' bash --norc --noprofile +o history", empty.path().display());
    let Some(terminal) = Terminal::start(&shell, 100, 12, &[]) else { return };
    terminal.send_keys(&[&format!("source {completion}"), "Enter"]);
    // Typed only at the prompt after it (the screen drops a prompt's trailing space).
    terminal
        .wait_for("the prompt after source", Duration::from_secs(10), |screen| screen.lines().any(|line| line == "$"));
    // A command, a command of a command, an option of a command, an option's value.
    completes(&terminal, "$ ", "cri-imaged pu", "cri-imaged pull ");
    completes(&terminal, "$ ", "cri-imaged backoff cl", "cri-imaged backoff clear ");
    completes(&terminal, "$ ", "cri-imaged status --soc", "cri-imaged status --socket ");
    completes(&terminal, "$ ", "cri-imaged pull -o wi", "cri-imaged pull -o wide ");
    completes(&terminal, "$ ", "cri-imaged completion fi", "cri-imaged completion fish ");
}

#[test]
fn the_packaged_zsh_completion_completes_commands_in_a_terminal() {
    // The tree stays while `_dir` lives; `zsh` is started by name in the terminal.
    let Some(Packaged { completion, _dir, .. }) = packaged_completion("zsh", "-n", ZSH_COMPLETION) else {
        return;
    };

    // As a person meets it: an interactive zsh whose only start-up file (-d: none of /etc/zsh) is
    // a .zshrc that puts the packaged directory on fpath, as Debian's zsh has it, and runs compinit,
    // which finds `_cri-imaged` there by its #compdef line. Emacs keys whatever $EDITOR says (C-u
    // clears the line). In an empty directory: a word the script does not complete would complete
    // as a file name.
    let zdotdir = tempfile::tempdir().expect("tempdir");
    let vendor_completions = completion.parent().expect("the completion's directory");
    let zshrc = format!(
        "fpath=({} $fpath)\nautoload -Uz compinit && compinit -u\nbindkey -e\nPS1='%% '\n",
        vendor_completions.display()
    );
    std::fs::write(zdotdir.path().join(".zshrc"), zshrc).expect("the .zshrc");
    let empty = tempfile::tempdir().expect("tempdir");
    let shell = format!("env -C {} ZDOTDIR={} zsh -d", empty.path().display(), zdotdir.path().display());
    let Some(terminal) = Terminal::start(&shell, 100, 12, &[]) else { return };
    // Typed only at the first prompt, after compinit (the screen drops a prompt's trailing space).
    terminal.wait_for("the first prompt", Duration::from_secs(10), |screen| screen.lines().any(|line| line == "%"));
    // A command, a command of a command, an option of a command (zsh adds the `=`), an option's
    // value, a positional argument's value.
    completes(&terminal, "% ", "cri-imaged pu", "cri-imaged pull ");
    completes(&terminal, "% ", "cri-imaged backoff cl", "cri-imaged backoff clear ");
    completes(&terminal, "% ", "cri-imaged status --soc", "cri-imaged status --socket=");
    completes(&terminal, "% ", "cri-imaged pull -o wi", "cri-imaged pull -o wide ");
    completes(&terminal, "% ", "cri-imaged completion fi", "cri-imaged completion fish ");
}

#[test]
fn the_packaged_fish_completion_completes_commands_where_fish_looks_for_it() {
    let Some(Packaged { shell: fish, completion, tree, _dir }) =
        packaged_completion("fish", "--no-execute", FISH_COMPLETION)
    else {
        return;
    };

    // A fish with nothing of this machine's user (an empty home, no XDG_CONFIG_HOME) and the
    // package's tree as its data directory: it looks in vendor_completions.d there, by the
    // command's name, as for the installed package. It loads completions only for a command it
    // can find, so the package's binary comes first on PATH. Not interactive: `complete -C` asks
    // fish what it would offer for a command line. In an empty directory: a word the script
    // does not complete would complete as a file name.
    let home = tempfile::tempdir().expect("tempdir");
    let empty = tempfile::tempdir().expect("tempdir");
    let path = std::env::join_paths(
        std::iter::once(tree.join("usr/bin"))
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .expect("a PATH");
    // What fish offers for `line`: the candidates, without their descriptions.
    let offers = |line: &str| -> Vec<String> {
        let output = Command::new(&fish)
            .args(["-c", "complete --do-complete $LINE; functions --details __fish_cri_imaged_needs_command"])
            .env_clear()
            .env("PATH", &path)
            .env("HOME", home.path())
            .env("XDG_DATA_DIRS", tree.join("usr/share"))
            .env("LANG", "C.UTF-8")
            .env("LINE", line)
            .current_dir(empty.path())
            .stdin(Stdio::null())
            .output()
            .expect("fish runs");
        assert!(output.status.success() && output.stderr.is_empty(), "complete -C '{line}': {}", said(&output));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let mut lines: Vec<&str> = stdout.lines().collect();
        // The file that defined the script's functions: the packaged one, not one installed here.
        assert_eq!(lines.pop().map(Path::new), Some(completion.as_path()), "complete -C '{line}':\n{stdout}");
        lines.iter().map(|offer| offer.split('\t').next().unwrap_or_default().to_owned()).collect()
    };
    // A command, a command of a command, an option of a command, an option's value (short and
    // long), a positional argument's value.
    assert_eq!(offers("cri-imaged pu"), ["pull"]);
    assert_eq!(offers("cri-imaged backoff cl"), ["clear"]);
    assert_eq!(offers("cri-imaged status --soc"), ["--socket"]);
    assert_eq!(offers("cri-imaged pull -o wi"), ["wide"]);
    assert_eq!(offers("cri-imaged pull --output wi"), ["wide"]);
    assert_eq!(offers("cri-imaged completion fi"), ["fish"]);
    // The package's own build step is hidden: offered neither as a command nor to help.
    assert_eq!(offers("cri-imaged gen"), Vec::<String>::new());
    assert!(!offers("cri-imaged help ").iter().any(|offer| offer == "generate-man"), "help offers no hidden command");
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// dpkg's word for the package's state: "installed", "config-files", …; None when it knows of
/// no such package.
fn package_status() -> Option<String> {
    let output = run("dpkg-query", &["--show", "--showformat=${db:Status-Status}", PACKAGE]);
    let status = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    (output.status.success() && !status.is_empty() && status != "not-installed").then_some(status)
}

/// Refuses to run over a cri-imaged this test did not install: it would replace and then remove it.
fn assert_nothing_installed() {
    if let Some(status) = package_status() {
        panic!(
            "the {PACKAGE} package is already on this machine (dpkg: {status}); this test installs and removes \
             its own build, so it will not touch it: remove it first (`dpkg --purge {PACKAGE}`)"
        );
    }
    for path in FILES.iter().chain(&ENABLEMENT).chain([&CONFIG]) {
        assert!(
            std::fs::symlink_metadata(path).is_err(),
            "{path} exists, though no {PACKAGE} package is installed; this test would overwrite it and then \
             remove it: move it away first"
        );
    }
}

/// The installed package, purged when dropped unless `dpkg -r` already removed it: a failed
/// assertion leaves the machine as it was (but for the cri-imaged group).
struct Installed;

impl Installed {
    fn install(deb: &Path) -> Self {
        let installed = Installed;
        let output = run("dpkg", &["--install", deb.to_str().expect("utf-8 path")]);
        assert!(output.status.success(), "dpkg --install failed:\n{}", said(&output));
        installed
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if package_status().is_some() {
            let output = run("dpkg", &["--purge", PACKAGE]);
            eprintln!("clean-up: dpkg --purge {PACKAGE}: {}", said(&output));
        }
    }
}

/// A child process, killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The installed units' command line, with the socket at `socket`, the runtime at `runtime` and
/// the state under `root_dir`: what systemd would run, in the test's own places. Returns the
/// `systemd-socket-activate` arguments: the socket, the environment, then the command.
fn activation_of_installed_units(socket: &Path, runtime: &Path, root_dir: &Path) -> Vec<String> {
    let service = std::fs::read_to_string(SERVICE).expect("the installed service");
    let socket_unit = std::fs::read_to_string(SOCKET).expect("the installed socket");
    let config = std::fs::read_to_string(CONFIG).expect("the installed config");
    let listen_stream = field(&socket_unit, "ListenStream", "=").expect("a ListenStream");
    assert_eq!(field(&config, "listen", ":"), Some(listen_stream), "the config listens where the socket unit does");
    let exec_start = field(&service, "ExecStart", "=").expect("an ExecStart");
    let mut words: Vec<String> = exec_start.split_whitespace().map(str::to_owned).collect();
    assert_eq!(words, [BINARY, "serve", "--config", CONFIG], "ExecStart={exec_start}");
    // Flags win over the installed config: the test's runtime and state dir, not the machine's
    // (the unit's StateDirectory); no periodic image GC of the machine's disk; a short drain.
    let [socket, runtime, root_dir] = [socket, runtime, root_dir].map(|path| path.to_str().expect("utf-8 path"));
    words.extend(
        [
            ["--listen", socket],
            ["--runtime-endpoint", runtime],
            ["--root-dir", root_dir],
            ["--image-gc-high-threshold", "100"],
            ["--shutdown-timeout", "2s"],
        ]
        .concat()
        .into_iter()
        .map(String::from),
    );
    let environment = service
        .lines()
        .filter_map(|line| line.strip_prefix("Environment="))
        .flat_map(str::split_whitespace)
        .map(|assignment| format!("--setenv={assignment}"));
    let mut arguments = vec!["--listen".to_owned(), socket.to_owned()];
    arguments.extend(environment);
    arguments.extend(words);
    arguments
}

#[tokio::test]
async fn dpkg_installs_the_package_which_serves_socket_activated_and_dpkg_removes_every_file() {
    if !is_root() {
        assert!(!in_ci(), "installing the package needs root in CI");
        eprintln!("SKIPPED: dpkg --install needs root (outside CI)");
        return;
    }
    if !build_tools_present() {
        return;
    }
    let Some(activate) = require_tool("systemd-socket-activate") else { return };
    assert_nothing_installed();
    let dir = tempfile::Builder::new().prefix("cri-deb").tempdir_in("/tmp").expect("tempdir");
    let deb = build_deb(dir.path());

    let installed = Installed::install(&deb);
    let listed = run("dpkg", &["--listfiles", PACKAGE]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    for file in FILES.iter().chain([&CONFIG]) {
        assert!(listed.lines().any(|line| line == *file), "dpkg does not list {file}:\n{listed}");
        assert!(Path::new(file).is_file(), "{file} is not installed");
    }
    for page in BOOK_PAGES {
        assert!(Path::new(&format!("{BOOK}{page}")).is_file(), "the book's {page} is not installed");
    }
    let group = run("getent", &["group", PACKAGE]);
    assert!(group.status.success(), "postinst made no {PACKAGE} group");
    // Enabled though systemd is not running here, as dh_installsystemd's scripts do; not started.
    let link = std::fs::read_link(ENABLEMENT[0]).expect("the socket is enabled");
    assert_eq!(link, Path::new(SOCKET));
    if let Some(analyze) = require_tool("systemd-analyze") {
        let verify = Command::new(analyze).args(["verify", "--man=no", SOCKET, SERVICE]).output().expect("runs");
        assert!(verify.status.success() && said(&verify).trim().is_empty(), "{}", said(&verify));
    }

    // man finds the installed pages by name, as `man cri-imaged-pull` would.
    if require_tool("man").is_some() {
        let found = run("man", &["--where", "cri-imaged-backoff-clear"]);
        assert_eq!(String::from_utf8_lossy(&found.stdout).trim(), "/usr/share/man/man1/cri-imaged-backoff-clear.1.gz");
    }

    let version = run(BINARY, &["--version"]);
    assert!(version.status.success(), "{}", said(&version));
    assert_eq!(String::from_utf8_lossy(&version.stdout).trim(), concat!("cri-imaged ", env!("CARGO_PKG_VERSION")));

    let runtime = FakeRuntime::start(&dir.path().join("runtime.sock"), FakeImageService::default());
    let socket = dir.path().join("cri-imaged.sock");
    let log_path = dir.path().join("daemon.log");
    let arguments = activation_of_installed_units(&socket, &runtime.socket, &dir.path().join("root"));
    let log = std::fs::File::create(&log_path).expect("the daemon's log");
    let daemon = Command::new(activate)
        .args(&arguments)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("systemd-socket-activate starts");
    let mut daemon = Killed(daemon);
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    for _ in 0..500 {
        if socket.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(socket.exists(), "systemd-socket-activate did not listen within 5 s:\n{}", log());
    // systemd-socket-activate starts the installed binary at this first connection.
    let mut client = ImageManagerClient::new(unix_channel(&socket));
    let call = tokio::time::timeout(Duration::from_secs(10), client.get_status(GetStatusRequest::default())).await;
    let answer = call.unwrap_or_else(|_| panic!("no answer within 10 s:\n{}", log()));
    let answer = answer.unwrap_or_else(|status| panic!("{status:?}\n{}", log()));
    assert!(answer.into_inner().runtime_reachable, "{}", log());
    let pid = daemon.0.id().to_string();
    assert!(run("kill", &["-TERM", &pid]).status.success());
    let mut exited = None;
    for _ in 0..1000 {
        exited = daemon.0.try_wait().expect("try_wait");
        if exited.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let exited = exited.unwrap_or_else(|| panic!("not exited within 10 s of SIGTERM:\n{}", log()));
    assert!(exited.success(), "{exited:?}:\n{}", log());

    // While a kubelet's image service is the socket, removal is refused; after the rollback the
    // book gives (the endpoint out of the kubelet's config, the kubelet restarted) it goes ahead.
    let kubelet_config = dir.path().join("kubelet-config.yaml");
    let naming = "kind: KubeletConfiguration\nimageServiceEndpoint: unix:///run/cri-imaged/cri-imaged.sock\n";
    std::fs::write(&kubelet_config, naming).expect("the kubelet's config");
    let kubelet = fake_kubelet(&["--config", kubelet_config.to_str().expect("utf-8 path")]);
    let refused = run("dpkg", &["--remove", PACKAGE]);
    assert!(!refused.status.success(), "dpkg --remove went ahead under a kubelet naming the socket");
    let words = said(&refused);
    for expected in [
        "refusing to remove cri-imaged",
        &format!("{}:imageServiceEndpoint: unix:///run/cri-imaged/cri-imaged.sock", kubelet_config.display()),
        "remove imageServiceEndpoint (or --image-service-endpoint)",
        "restart the kubelet",
        "CRI_IMAGED_FORCE_REMOVE=1 apt-get remove cri-imaged",
    ] {
        assert!(words.contains(expected), "the refusal does not say {expected:?}:\n{words}");
    }
    assert_eq!(package_status().as_deref(), Some("installed"), "after the refused removal");
    assert!(Path::new(SOCKET).is_file() && Path::new(BINARY).is_file(), "a refused removal removed files");
    // Stopping the socket under such a kubelet: its unit's ExecStopPre warns in the log.
    let unit = std::fs::read_to_string(SOCKET).expect("the socket unit");
    let stop_check = field(&unit, "ExecStopPre", "=").expect("the socket unit checks for a kubelet as it stops");
    let mut words = stop_check.trim_start_matches('-').split(' ');
    let stop = Command::new(words.next().expect("a program")).args(words).output().expect("the stop check runs");
    assert!(stop.status.success(), "a stop check must never hold the stop:\n{}", said(&stop));
    let warning = String::from_utf8_lossy(&stop.stderr);
    assert!(
        warning.contains("WARNING: cri-imaged.socket is stopping while the kubelet's image service is this socket")
            && warning.contains(&kubelet_config.display().to_string()),
        "no warning naming the kubelet's config:\n{warning}"
    );
    std::fs::write(&kubelet_config, "kind: KubeletConfiguration\n").expect("the kubelet's config, rolled back");
    drop(kubelet);
    let kubelet = fake_kubelet(&["--config", kubelet_config.to_str().expect("utf-8 path")]);

    let removal = run("dpkg", &["--remove", PACKAGE]);
    assert!(removal.status.success(), "dpkg --remove failed:\n{}", said(&removal));
    drop(kubelet);
    // dpkg keeps a removed package with a postrm as "config-files", until a purge runs it.
    assert_eq!(package_status().as_deref(), Some("config-files"), "after dpkg --remove");
    for path in FILES.iter().chain(&ENABLEMENT) {
        assert!(std::fs::symlink_metadata(path).is_err(), "{path} is left after dpkg --remove");
    }
    assert!(!Path::new("/usr/share/doc/cri-imaged").exists(), "the doc directory is left");
    assert!(Path::new(CONFIG).is_file(), "dpkg --remove keeps the conffile");
    let purge = run("dpkg", &["--purge", PACKAGE]);
    assert!(purge.status.success(), "dpkg --purge failed:\n{}", said(&purge));
    assert!(!Path::new("/etc/cri-imaged").exists(), "the purge takes the config and its directory");
    assert_eq!(package_status(), None, "dpkg still knows the package after purging it");
    // Kept, as Debian keeps system groups.
    assert!(run("getent", &["group", PACKAGE]).status.success());
    drop(installed);

    // The override: removed anyway, with a warning naming the kubelet's flag.
    let installed = Installed::install(&deb);
    let kubelet = fake_kubelet(&["--image-service-endpoint=unix:///run/cri-imaged/cri-imaged.sock"]);
    let forced = Command::new("dpkg")
        .args(["--purge", PACKAGE])
        .env("CRI_IMAGED_FORCE_REMOVE", "1")
        .output()
        .expect("dpkg runs");
    assert!(forced.status.success(), "CRI_IMAGED_FORCE_REMOVE=1 dpkg --purge failed:\n{}", said(&forced));
    let words = said(&forced);
    assert!(
        words.contains("WARNING") && words.contains("--image-service-endpoint=unix:///run/cri-imaged/cri-imaged.sock"),
        "no warning naming the kubelet's flag:\n{words}"
    );
    assert_eq!(package_status(), None, "after the forced purge");
    drop(kubelet);
    drop(installed);
}

/// A process that looks like a running kubelet to the package's scripts (its argv[0] is
/// /usr/bin/kubelet, then `args`), killed when dropped.
fn fake_kubelet(args: &[&str]) -> Killed {
    let mut command = Command::new("/usr/bin/python3");
    std::os::unix::process::CommandExt::arg0(&mut command, "/usr/bin/kubelet");
    let child = command
        .args(["-c", "import time; time.sleep(600)"])
        .args(args)
        .stdin(Stdio::null())
        .spawn()
        .expect("python3 starts as a kubelet");
    Killed(child)
}
