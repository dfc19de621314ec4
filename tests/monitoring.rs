//! What operators watch (deploy/prometheus, deploy/grafana, the PodMonitor), checked by
//! Prometheus itself: `promtool` checks the rules and runs their unit tests; a real Prometheus
//! scrapes a real daemon (real containerd and registry) through a pull, failed pulls, a breaker
//! opening and a GC pass, and then knows every metric a rule or a dashboard panel names, loads
//! every rule without an error, and records what the test caused: the failure ratios, per node
//! and by registry, a registry's pull duration, the events by reason; every dashboard query
//! parses on it.

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use cri_imaged::api::{GarbageCollectRequest, PullPolicy, image_manager_client::ImageManagerClient};
use serde_json::Value as Json;
use serde_yaml_ng::Value as Yaml;
use support::{
    call, ensure, eventually,
    process::{DaemonProcess, free_port, http_get, metrics_listen, require_tool},
    stack::LocalStack,
    unix_channel,
};

const RULES: &str = "deploy/prometheus/cri-imaged.rules.yml";
const RULE_TESTS: &str = "deploy/prometheus/tests";
const SCRAPE_CONFIG: &str = "deploy/prometheus/scrape-config.yml";
const SCRAPE_CONFIG_KUBERNETES: &str = "deploy/prometheus/scrape-config-kubernetes.yml";
const PODMONITOR: &str = "deploy/kubernetes/podmonitor.yaml";
const DAEMONSET: &str = "deploy/kubernetes/daemonset.yaml";
const DASHBOARD: &str = "deploy/grafana/cri-imaged.json";

/// Metrics a rule or panel names that only exist once something the test does not cause
/// happened (the daemon serves a family only once it has a series): each with the source file
/// that registers it, which the test reads for the name instead.
const NOT_CAUSED: [(&str, &str, &str); 2] = [
    ("cri_imaged_registry_pull_rate_qps", "src/pull/metrics.rs", "a registry answering 429"),
    ("cri_imaged_cri_relayed_calls_total", "src/server/metrics.rs", "a CRI call cri-imaged does not know"),
];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn yaml(path: &str) -> Yaml {
    let text = std::fs::read_to_string(repo().join(path)).unwrap_or_else(|error| panic!("{path}: {error}"));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|error| panic!("{path} is not YAML: {error}"))
}

fn said(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

fn run(program: &Path, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|error| panic!("{} does not run: {error}", program.display()))
}

/// Every rule of the rules file: its group's name and the rule.
fn rules() -> Vec<(String, Yaml)> {
    let file = yaml(RULES);
    let groups = file["groups"].as_sequence().expect("groups");
    groups
        .iter()
        .flat_map(|group| {
            let name = group["name"].as_str().expect("a group's name").to_owned();
            group["rules"].as_sequence().expect("rules").iter().map(move |rule| (name.clone(), rule.clone()))
        })
        .collect()
}

fn alerts() -> Vec<(String, Yaml)> {
    rules().into_iter().filter(|(_, rule)| rule["alert"].is_string()).collect()
}

fn recorded_names() -> BTreeSet<String> {
    rules().iter().filter_map(|(_, rule)| rule["record"].as_str().map(str::to_owned)).collect()
}

/// The unit test files beside the rules.
fn rule_test_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join(RULE_TESTS))
        .expect("the rules' unit tests")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.to_string_lossy().ends_with(".test.yml"))
        .collect();
    files.sort();
    files
}

#[test]
fn promtool_accepts_the_shipped_rules() {
    let Some(promtool) = require_tool("promtool") else { return };
    let output = run(&promtool, &["check", "rules", RULES]);
    assert!(output.status.success(), "promtool check rules {RULES}:\n{}", said(&output));
    let found = format!("SUCCESS: {} rules found", rules().len());
    assert!(said(&output).contains(&found), "{}", said(&output));
}

#[test]
fn the_rules_unit_tests_pass_in_promtool() {
    let Some(promtool) = require_tool("promtool") else { return };
    let files = rule_test_files();
    assert!(files.len() >= 4, "{files:?}");
    for file in files {
        let output = run(&promtool, &["test", "rules", file.to_str().expect("utf-8")]);
        assert!(output.status.success(), "promtool test rules {}:\n{}", file.display(), said(&output));
        assert!(said(&output).contains("SUCCESS"), "{}", said(&output));
    }
}

#[test]
fn every_alert_is_tested_both_firing_and_not_firing_in_the_test_file_of_its_group() {
    let mut cases: BTreeMap<(String, String), (bool, bool)> = BTreeMap::new();
    for file in rule_test_files() {
        let group = file.file_name().and_then(|name| name.to_str()).expect("name").trim_end_matches(".test.yml");
        let tests = yaml(file.strip_prefix(repo()).expect("in the repo").to_str().expect("utf-8"));
        for test in tests["tests"].as_sequence().expect("tests") {
            for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
                let alert = case["alertname"].as_str().expect("alertname").to_owned();
                let fired = case["exp_alerts"].as_sequence().is_some_and(|alerts| !alerts.is_empty());
                let seen = cases.entry((group.to_owned(), alert)).or_default();
                *seen = (seen.0 || fired, seen.1 || !fired);
            }
        }
    }
    for (group, rule) in alerts() {
        let alert = rule["alert"].as_str().expect("name");
        let group = group.strip_prefix("cri-imaged.").expect("groups are named cri-imaged.*");
        let seen = cases.get(&(group.to_owned(), alert.to_owned()));
        assert_eq!(
            seen,
            Some(&(true, true)),
            "{alert}: {RULE_TESTS}/{group}.test.yml must fire it and show it not firing"
        );
    }
}

#[test]
fn every_alert_says_what_where_and_links_a_runbook_in_the_book_that_exists() {
    // The runbooks' page of the book (docs/monitoring.md), which mdBook builds as monitoring.html.
    let runbooks = std::fs::read_to_string(repo().join("docs/monitoring.md")).expect("docs/monitoring.md");
    let anchors: BTreeSet<String> = runbooks.lines().filter(|line| line.starts_with('#')).map(github_anchor).collect();
    let alerts = alerts();
    assert!(alerts.len() >= 10, "{} alerts", alerts.len());
    for (_, rule) in alerts {
        let alert = rule["alert"].as_str().expect("name");
        let annotations = &rule["annotations"];
        for field in ["summary", "description", "runbook_url"] {
            assert!(annotations[field].as_str().is_some_and(|text| !text.is_empty()), "{alert} has no {field}");
        }
        let description = annotations["description"].as_str().expect("description");
        if alert != "CriImagedNotScraped" {
            assert!(
                description.contains("$labels.instance") && description.contains("$labels.node"),
                "{alert}: {description}"
            );
        }
        if rule["expr"].as_str().expect("expr").contains("registry") {
            assert!(description.contains("$labels.registry"), "{alert} names no registry: {description}");
        }
        let link = annotations["runbook_url"].as_str().expect("runbook_url");
        let anchor =
            link.strip_prefix("monitoring.html#").unwrap_or_else(|| panic!("{alert}: {link} is not monitoring.html#…"));
        assert!(anchors.contains(anchor), "{alert}: docs/monitoring.md has no heading #{anchor}");
        assert!(
            ["critical", "warning", "info"].contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
            "{alert}"
        );
    }
}

/// The anchor GitHub and mdBook give a Markdown heading: lower case, punctuation but `-` and `_`
/// dropped, spaces as `-`.
fn github_anchor(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn promtool_accepts_the_static_scrape_config_and_the_kubernetes_ones_set_the_job_and_node() {
    if let Some(promtool) = require_tool("promtool") {
        let output = run(&promtool, &["check", "config", SCRAPE_CONFIG]);
        assert!(output.status.success(), "promtool check config {SCRAPE_CONFIG}:\n{}", said(&output));
    }
    let jobs = yaml(SCRAPE_CONFIG_KUBERNETES);
    let jobs = jobs["scrape_configs"].as_sequence().expect("scrape_configs");
    assert_eq!(jobs.len(), 2);
    for job in jobs {
        let relabel = job["relabel_configs"].as_sequence().expect("relabel_configs");
        let sets = |target: &str| relabel.iter().find(|rule| rule["target_label"].as_str() == Some(target)).cloned();
        let job_rule = sets("job").expect("the job is set");
        assert_eq!(job_rule["replacement"].as_str(), Some("cri-imaged"), "{job:?}");
        let node = sets("node").expect("the node is set");
        let from = node["source_labels"][0].as_str().expect("a source");
        assert!(["__meta_kubernetes_pod_node_name", "__meta_kubernetes_node_name"].contains(&from), "{from}");
    }
}

#[test]
fn the_podmonitor_selects_the_daemonsets_pods_on_their_metrics_port_as_job_cri_imaged() {
    let monitor = yaml(PODMONITOR);
    let daemonset = yaml(DAEMONSET);
    assert_eq!(monitor["kind"].as_str(), Some("PodMonitor"));
    assert_eq!(monitor["metadata"]["namespace"], daemonset["metadata"]["namespace"]);
    let namespaces = monitor["spec"]["namespaceSelector"]["matchNames"].as_sequence().expect("matchNames");
    assert!(namespaces.contains(&daemonset["metadata"]["namespace"]));
    let pod_labels = daemonset["spec"]["template"]["metadata"]["labels"].as_mapping().expect("pod labels");
    let wanted = monitor["spec"]["selector"]["matchLabels"].as_mapping().expect("matchLabels");
    for (key, value) in wanted {
        assert_eq!(pod_labels.get(key), Some(value), "the pods lack {key:?}");
    }
    let job_label = monitor["spec"]["jobLabel"].as_str().expect("jobLabel");
    assert_eq!(pod_labels.get(job_label).and_then(Yaml::as_str), Some("cri-imaged"), "job is {job_label}'s value");
    let container = &daemonset["spec"]["template"]["spec"]["containers"][0];
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    let port_name = endpoint["port"].as_str().expect("port");
    let port = container["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .find(|port| port["name"].as_str() == Some(port_name))
        .unwrap_or_else(|| panic!("the DaemonSet has no port {port_name}"));
    let number = port["containerPort"].as_u64().expect("containerPort");
    let args: Vec<&str> = container["args"].as_sequence().expect("args").iter().filter_map(Yaml::as_str).collect();
    assert!(args.contains(&format!("--metrics-listen=0.0.0.0:{number}").as_str()), "{args:?}");
    let relabel = &endpoint["relabelings"][0];
    assert_eq!(
        (relabel["sourceLabels"][0].as_str(), relabel["targetLabel"].as_str()),
        (Some("__meta_kubernetes_pod_node_name"), Some("node"))
    );
}

/// Every query of the dashboard: the panel's title and its expression.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join(DASHBOARD)).expect("the dashboard");
    let dashboard: Json = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|version| version >= 39), "schemaVersion");
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(variables, ["datasource", "instance"]);
    let panels = dashboard["panels"].as_array().expect("panels");
    let queries: Vec<(String, String)> = panels
        .iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().expect("a title").to_owned();
            panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |target| (title.clone(), target["expr"].as_str().expect("expr").to_owned()))
        })
        .collect();
    assert!(queries.len() >= 20, "{} queries", queries.len());
    for panel in panels.iter().filter(|panel| panel["type"] != "row") {
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{}", panel["title"]);
    }
    queries
}

/// The metric names a PromQL expression reads: identifiers that are not functions (followed by
/// `(`), keywords or aggregation modifiers, once strings, label matchers, ranges and the label
/// lists of `by`/`without`/`on`/`ignoring`/`group_*` are dropped.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const MODIFIERS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
    // Aggregations too: `sum by (x) (…)` puts a modifier between one and its parenthesis.
    const KEYWORDS: [&str; 17] = [
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
    ];
    // Strings, label matchers and ranges out.
    let mut text = String::new();
    let mut chars = expr.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => drop(chars.next()),
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '{' => chars.by_ref().take_while(|c| *c != '}').for_each(drop),
            '[' => chars.by_ref().take_while(|c| *c != ']').for_each(drop),
            _ => {
                text.push(c);
                continue;
            }
        }
        text.push(' ');
    }
    // Words, each with what follows it.
    let chars: Vec<char> = text.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_digit() || c == '.' {
            // A number (1e3, 0.9) is no name.
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            continue;
        }
        if !(c.is_ascii_alphabetic() || c == '_' || c == ':') {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let mut next = i;
        while next < chars.len() && chars[next].is_whitespace() {
            next += 1;
        }
        let opens = chars.get(next) == Some(&'(');
        if MODIFIERS.contains(&word.as_str()) {
            if opens {
                // Its label list: skip to the closing parenthesis.
                i = next + chars[next..].iter().position(|c| *c == ')').expect("a closed label list") + 1;
            }
        } else if !opens && !KEYWORDS.contains(&word.as_str()) {
            names.insert(word);
        }
    }
    names
}

#[test]
fn the_promql_tokenizer_finds_the_metrics_and_nothing_else() {
    let names = metric_names(
        r#"histogram_quantile(0.9, sum by (le, instance) (rate(a_bucket{job="x", le=~"1|2"}[5m]))) / on (job) group_left b > 1e3 and ignoring (x) c:rec:rate5m or vector(0)"#,
    );
    assert_eq!(names, BTreeSet::from(["a_bucket".to_owned(), "b".to_owned(), "c:rec:rate5m".to_owned()]));
}

/// A Prometheus of the machine's on loopback, killed when dropped.
struct Prometheus {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes `127.0.0.1:metrics_port` each second as job `cri-imaged`, node `test-node`, and
    /// evaluates the shipped rules each second.
    fn start(program: &Path, metrics_port: u16) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("prometheus.yml");
        let rules = repo().join(RULES);
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
                 rule_files: [{rules}]\n\
                 scrape_configs:\n  - job_name: cri-imaged\n    static_configs:\n      \
                 - targets: ['127.0.0.1:{metrics_port}']\n        labels: {{node: test-node}}\n",
                rules = rules.display()
            ),
        )
        .expect("write the config");
        let port = free_port();
        let log = dir.path().join("prometheus.log");
        let child = Command::new(program)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("prometheus starts");
        Self { child, port, log, _dir: dir }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET /api/v1/PATH?query` (its parameters percent-encoded here); the answer's `data`, or
    /// `Err` with the whole answer when its status is not `success`.
    fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<Json, String> {
        let query: Vec<String> = params.iter().map(|(key, value)| format!("{key}={}", percent_encode(value))).collect();
        let body = http_10_get(self.port, &format!("/api/v1/{path}?{}", query.join("&")))?;
        let answer: Json = serde_json::from_str(&body).map_err(|error| format!("{error}: {body}"))?;
        if answer["status"] == "success" { Ok(answer["data"].clone()) } else { Err(body) }
    }

    /// The value of the single-series answer to `expr` now; `None` while it has none.
    fn value(&self, expr: &str) -> Option<f64> {
        let data = self.api("query", &[("query", expr)]).unwrap_or_else(|answer| panic!("{expr}: {answer}"));
        let result = data["result"].as_array()?;
        assert!(result.len() <= 1, "{expr}: {result:?}");
        result.first()?["value"][1].as_str()?.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (byte as char).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// An HTTP/1.0 GET (so that the answer is never chunked): the body of a 200 or 4xx/5xx answer
/// (Prometheus's API answers errors as JSON); `Err` when nothing answers.
fn http_10_get(port: u16, path: &str) -> Result<String, String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|error| error.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").map_err(|error| error.to_string())?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(|error| error.to_string())?;
    let (_, body) = response.split_once("\r\n\r\n").ok_or_else(|| format!("no body: {response}"))?;
    Ok(body.to_owned())
}

/// The sample names of every metric family the daemon serves now (`# TYPE` lines: a counter's
/// `_total`, a histogram's `_bucket`, `_sum`, `_count`).
fn served_metric_names(metrics_port: u16) -> BTreeSet<String> {
    let text = http_get(metrics_port, "/metrics");
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .flat_map(|line| {
            let (family, kind) = line.split_once(' ').expect("# TYPE NAME KIND");
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            suffixes.iter().map(move |suffix| format!("{family}{suffix}")).collect::<Vec<_>>()
        })
        .collect()
}

/// The sum of the daemon's `cri_imaged_pulls_total` series whose result is one of `results`.
fn pulls(metrics_port: u16, results: &[&str]) -> f64 {
    results
        .iter()
        .map(|result| {
            support::process::metric_with_label(
                metrics_port,
                "cri_imaged_pulls_total",
                &format!(r#"result="{result}""#),
            )
        })
        .sum()
}

/// The daemon's one series of `name` with exactly `labels` (in any order); 0 when none.
fn served_value(metrics_port: u16, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut wanted: Vec<String> = labels.iter().map(|(key, value)| format!(r#"{key}="{value}""#)).collect();
    wanted.sort();
    http_get(metrics_port, "/metrics")
        .lines()
        .filter_map(|line| line.strip_prefix(name)?.strip_prefix('{')?.split_once('}'))
        .find(|(found, _)| {
            let mut found: Vec<&str> = found.split(',').collect();
            found.sort_unstable();
            found == wanted
        })
        .and_then(|(_, value)| value.trim().split(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// The daemon's `cri_imaged_registry_pulls_total` of `registry` that ended with `result`.
fn registry_pulls(metrics_port: u16, registry: &str, result: &str) -> f64 {
    served_value(metrics_port, "cri_imaged_registry_pulls_total", &[("registry", registry), ("result", result)])
}

/// The daemon's `cri_imaged_events_total` of `reason` and `kind`.
fn events(metrics_port: u16, reason: &str, kind: &str) -> f64 {
    served_value(metrics_port, "cri_imaged_events_total", &[("reason", reason), ("type", kind)])
}

/// The finite buckets of `registry`'s pull duration histogram: each bound and its count, lowest first.
fn registry_duration_buckets(metrics_port: u16, registry: &str) -> Vec<(f64, f64)> {
    let text = http_get(metrics_port, "/metrics");
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|line| line.strip_prefix("cri_imaged_registry_pull_duration_seconds_bucket{"))
        .filter_map(|rest| rest.split_once('}'))
        .filter(|(labels, _)| labels.split(',').any(|pair| pair == format!(r#"registry="{registry}""#)))
        .filter_map(|(labels, count)| {
            let bound = labels.split(',').find_map(|pair| pair.strip_prefix("le=\""))?.trim_end_matches('"');
            Some((bound.parse::<f64>().ok().filter(|bound| bound.is_finite())?, count.trim().parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(!buckets.is_empty(), "no duration buckets of {registry}:\n{text}");
    buckets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scraping_the_daemon_knows_every_metric_the_rules_and_dashboard_name_and_records_its_failures()
 {
    let (Some(prometheus), Some(_)) = (require_tool("prometheus"), require_tool("promtool")) else { return };
    let Some(stack) = LocalStack::start() else { return };
    stack.seed("monitored:1", "watched");
    stack.seed("monitored:2", "watched again");
    let dir = tempfile::tempdir().expect("tempdir");
    let (metrics_port, listen) = metrics_listen();
    // GC for space on (the harness turns it off), at thresholds only a full disk reaches: the
    // stack's containerd holds only this test's images, and the rules see a threshold to compare.
    let flags = ["--metrics-listen", &listen, "--image-gc-high-threshold", "99", "--image-gc-low-threshold", "98"];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;
    let mut client = ImageManagerClient::new(unix_channel(&daemon.socket));
    let registry = stack.registry.clone();
    let nowhere = format!("127.0.0.1:{}", free_port());
    // A pull from `registry` (each its own image and pod, so that no backoff refuses one).
    let pull = |image: String, uid: &str| {
        let mut request = ensure(&image, PullPolicy::IfNotPresent as i32);
        request.pod.as_mut().expect("a pod").uid = uid.to_owned();
        request
    };

    // Before Prometheus looks: each registry's first pulls, one of each result the test causes.
    // A registry's series are made by its first pull, already counting it, and a rate sees no
    // rise from a series' first sample; a series first sampled at 0 and one first sampled at 1
    // are extrapolated differently. So every series the test raises is sampled above 0 first,
    // and the rates below are exact ratios of what the test did while watched.
    let monitored = |tag: u32| format!("{}:{tag}", stack.image("monitored"));
    let absent = |i: u32| format!("{}:1", stack.image(&format!("never-pushed-{i}")));
    call(&mut client, pull(monitored(1), "uid-warm")).await.expect("the image is pulled");
    call(&mut client, pull(absent(0), "uid-warm")).await.expect_err("the registry has no such image");
    call(&mut client, pull(format!("{nowhere}/gone-warm:1"), "uid-warm")).await.expect_err("nothing listens there");
    assert_eq!(registry_pulls(metrics_port, &registry, "success"), 1.0);
    assert_eq!(registry_pulls(metrics_port, &registry, "failure"), 1.0);
    assert_eq!(registry_pulls(metrics_port, &nowhere, "registry_unavailable"), 1.0);
    let durations_before = registry_duration_buckets(metrics_port, &registry);

    let server = Prometheus::start(&prometheus, metrics_port);
    eventually("Prometheus scrapes the daemon", Duration::from_secs(30), || {
        server.api("query", &[("query", "up")]).is_ok() && server.value(r#"up{job="cri-imaged"}"#) == Some(1.0)
    })
    .await;

    // A pull, a pull of an image the registry does not have, five pulls of a registry nothing
    // listens on (its breaker opens), and a GC pass.
    call(&mut client, pull(monitored(2), "uid-0")).await.expect("the image is pulled");
    call(&mut client, pull(absent(1), "uid-0")).await.expect_err("the registry has no such image");
    for i in 0..5 {
        call(&mut client, pull(format!("{nowhere}/gone-{i}:1"), &format!("uid-{i}")))
            .await
            .expect_err("nothing listens there");
    }
    client.garbage_collect(GarbageCollectRequest { dry_run: false, delete_unused: false }).await.expect("a GC pass");
    assert_eq!(pulls(metrics_port, &["success"]), 2.0);
    assert_eq!(pulls(metrics_port, &["failure"]), 2.0);
    assert_eq!(pulls(metrics_port, &["registry_unavailable"]), 6.0);
    // The same by registry, each labelled with its reference's host and port.
    assert_eq!(registry_pulls(metrics_port, &registry, "success"), 2.0);
    assert_eq!(registry_pulls(metrics_port, &registry, "failure"), 2.0);
    assert_eq!(registry_pulls(metrics_port, &registry, "registry_unavailable"), 0.0);
    assert_eq!(registry_pulls(metrics_port, &nowhere, "registry_unavailable"), 6.0);
    assert_eq!(registry_pulls(metrics_port, &nowhere, "success"), 0.0);
    // The bucket the watched pull's time fell in: the lowest whose count rose.
    let durations_after = registry_duration_buckets(metrics_port, &registry);
    let rose = durations_after.iter().zip(&durations_before).position(|((_, after), (_, before))| after > before);
    let rose = rose.expect("the watched pull was timed");
    let upper = durations_after[rose].0;
    let lower = rose.checked_sub(1).map_or(0.0, |below| durations_after[below].0);
    // Each event the pulls made, by reason: every request pulled, two pulled an image.
    assert_eq!(events(metrics_port, "Pulling", "Normal"), 10.0);
    assert_eq!(events(metrics_port, "Pulled", "Normal"), 2.0);

    // The recording rules show the failures: 6 of the 7 pulls that ended while watched failed,
    // and one was the registry's answer `failure`.
    let ratio = r#"instance:cri_imaged_pulls_failed:ratio_rate15m{job="cri-imaged",node="test-node"}"#;
    eventually("the failure ratio is recorded", Duration::from_secs(30), || {
        server.value(ratio).is_some_and(|value| (value - 6.0 / 7.0).abs() < 1e-9)
    })
    .await;
    let by_result = r#"instance_result:cri_imaged_pulls:ratio_rate15m{node="test-node",result="failure"}"#;
    let failure_share = server.value(by_result).expect("the failure's share is recorded");
    assert!((failure_share - 1.0 / 7.0).abs() < 1e-9, "{failure_share}");
    // By registry: half the test registry's pulls failed, all of the registry nowhere's, on the
    // node and over the job; the test registry's median pull time is in the bucket of the
    // watched pull's time (its middle, or near it where the buckets' first samples differ).
    for (rule, host, expected) in [
        ("instance_registry:cri_imaged_registry_pulls_failed:ratio_rate15m", &registry, 0.5),
        ("instance_registry:cri_imaged_registry_pulls_failed:ratio_rate15m", &nowhere, 1.0),
        ("job_registry:cri_imaged_registry_pulls_failed:ratio_rate15m", &registry, 0.5),
        ("job_registry:cri_imaged_registry_pulls_failed:ratio_rate15m", &nowhere, 1.0),
    ] {
        let query = format!(r#"{rule}{{job="cri-imaged",registry="{host}"}}"#);
        eventually(&format!("{query} is recorded as {expected}"), Duration::from_secs(30), || {
            server.value(&query).is_some_and(|value| (value - expected).abs() < 1e-9)
        })
        .await;
    }
    let ended = format!(r#"instance_registry:cri_imaged_registry_pulls_ended:increase15m{{registry="{nowhere}"}}"#);
    let ended = server.value(&ended).expect("the registry's ended pulls are recorded");
    assert!((5.0..=7.0).contains(&ended), "{ended}: 5 pulls ended while watched, extrapolated");
    let by_registry_result = format!(
        r#"instance_registry_result:cri_imaged_registry_pulls:ratio_rate15m{{registry="{registry}",result="success"}}"#
    );
    let success_share = server.value(&by_registry_result).expect("the registry's success share is recorded");
    assert!((success_share - 0.5).abs() < 1e-9, "{success_share}");
    let median = format!(
        r#"instance_registry:cri_imaged_registry_pull_duration_seconds:p50_rate15m{{node="test-node",registry="{registry}"}}"#
    );
    eventually(&format!("{median} is in ({lower}, {upper}]"), Duration::from_secs(30), || {
        server.value(&median).is_some_and(|value| value > lower && value <= upper)
    })
    .await;
    eventually("the events are scraped by reason", Duration::from_secs(10), || {
        server.value(r#"cri_imaged_events_total{reason="Pulled",type="Normal"}"#) == Some(2.0)
    })
    .await;
    eventually("the breaker's series is scraped", Duration::from_secs(10), || {
        server.value(&format!(r#"cri_imaged_registry_breaker_open{{registry="{nowhere}"}}"#)) == Some(1.0)
    })
    .await;
    eventually("the GC pass is scraped", Duration::from_secs(10), || {
        server.value(r#"cri_imaged_image_gc_passes_total{outcome="success"}"#).is_some_and(|passes| passes >= 1.0)
    })
    .await;
    let usage = server.value("instance:cri_imaged_image_filesystem_usage:percent").expect("the usage is recorded");
    assert!(usage > 0.0 && usage <= 100.0, "{usage}");
    let over = "instance:cri_imaged_image_filesystem_usage_over_high_threshold:percent";
    let over = server.value(over).expect("the use against the threshold is recorded");
    assert!((over - (usage - 99.0)).abs() < 1e-9, "{over} points over 99% at {usage}%");

    // Every rule loaded and evaluates without an error.
    eventually("every rule has been evaluated", Duration::from_secs(10), || {
        let groups = server.api("rules", &[]).expect("rules");
        let rules: Vec<&Json> = groups["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .flat_map(|g| g["rules"].as_array().expect("rules"))
            .collect();
        assert_eq!(rules.len(), self::rules().len(), "{}", server.log_text());
        rules.iter().all(|rule| {
            assert_ne!(rule["health"], "err", "{rule}");
            rule["health"] == "ok"
        })
    })
    .await;

    // Every metric a rule or a panel names is a family the daemon serves (or one it registers
    // for what the test did not cause), and Prometheus holds series of those it served.
    let served = served_metric_names(metrics_port);
    let stored: BTreeSet<String> = server
        .api("label/__name__/values", &[])
        .expect("names")
        .as_array()
        .expect("names")
        .iter()
        .filter_map(|name| name.as_str().map(str::to_owned))
        .collect();
    let recorded = recorded_names();
    let mut named = BTreeMap::new();
    for (group, rule) in rules() {
        for name in metric_names(rule["expr"].as_str().expect("expr")) {
            named.entry(name).or_insert_with(|| format!("rule group {group}"));
        }
    }
    let queries = dashboard_queries();
    for (title, expr) in &queries {
        for name in metric_names(expr) {
            named.entry(name).or_insert_with(|| format!("panel {title:?}"));
        }
    }
    assert!(named.len() >= 25, "{named:?}");
    for (name, user) in &named {
        if name == "up" || recorded.contains(name) {
            assert!(stored.contains(name), "{name} ({user}) has no series in Prometheus");
            continue;
        }
        if let Some((_, source, why)) = NOT_CAUSED.iter().find(|(known, ..)| known == name) {
            let text = std::fs::read_to_string(repo().join(source)).expect("source");
            let family = name.strip_prefix("cri_imaged_").expect("prefixed").trim_end_matches("_total");
            assert!(
                text.contains(&format!("\"{family}\"")),
                "{name} ({user}, needs {why}) is not registered in {source}"
            );
            continue;
        }
        assert!(served.contains(name), "{name} ({user}) is not a metric the daemon serves:\n{served:?}");
        assert!(stored.contains(name), "{name} ({user}) was served but Prometheus stored no series of it");
    }

    // Every dashboard query parses and runs, its variables filled in as Grafana would.
    for (title, expr) in &queries {
        let expr = expr.replace("$__rate_interval", "1m").replace("$instance", ".*");
        if let Err(answer) = server.api("query", &[("query", &expr)]) {
            panic!("panel {title:?}: {expr}: {answer}");
        }
    }
    drop(server);
    daemon.terminate().await;
}
