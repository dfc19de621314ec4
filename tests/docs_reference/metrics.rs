//! `docs/reference/metrics.md`: every metric the daemon registers. The registries name each
//! metric with its help (read from their `Debug`: prometheus-client lists them nowhere else); the
//! text exposition gives each one's type and labels once it has a series, so the metrics with no
//! series at start are given one here, and a metric registered without one fails the test.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use cri_imaged::{
    events::{Event, EventType, Events, reason},
    metrics::Metrics,
    pull::metrics::PullResult,
    pull_policy::PullPolicy,
    reload::metrics::ReloadResult,
    server::metrics::Closed,
};

use super::markdown::{cell, code, opening, row, table_head};

/// A registered metric: its name as served (prefix included, `_total` not) and its help.
struct Registered {
    name: String,
    help: String,
}

/// A metric as the exposition shows it.
#[derive(Default)]
struct Exposed {
    kind: String,
    /// Each label (but a histogram's `le`) and the values its series have.
    labels: BTreeMap<String, Vec<String>>,
}

pub fn page() -> String {
    let metrics = Metrics::default();
    let at_start = exposed(&metrics.render());
    give_each_a_series(&metrics);
    let exposed = exposed(&metrics.render());
    let mut page = opening("Metrics", "the metrics registry in `src/metrics.rs` and each concern's `metrics` module");
    page.push_str(
        "With `--metrics-listen ADDR`, `GET http://ADDR/metrics` serves these in the OpenMetrics text \
         format. A counter's series are named with `_total`; a histogram's with `_bucket`, `_sum` and \
         `_count`. No label carries an image name or a pod. A label's values are listed when each of \
         them is a series from the start (at 0), so that a rate sees the first event.\n",
    );
    let registries = metrics.registries();
    let sections = [
        ("`cri_imaged_*`", "The daemon's own metrics."),
        (
            "Under the kubelet's names (`kubelet_*`)",
            "Those that mean what one of the kubelet's image metrics means, served under its name too, \
             so that a dashboard made for the kubelet's image manager shows ours.",
        ),
    ];
    for (registry, (title, about)) in registries.iter().zip(sections) {
        page.push_str(&format!("\n## {title}\n\n{about}\n\n"));
        page.push_str(&table_head(&["metric", "type", "labels", "help"]));
        let metrics = registered(&format!("{registry:?}"));
        assert!(!metrics.is_empty(), "no metric read from the registry's Debug: has prometheus-client changed it?");
        for metric in metrics {
            let Some(shown) = exposed.get(&metric.name) else {
                panic!(
                    "{} is registered but has no series in the exposition: give it one in \
                     tests/docs_reference/metrics.rs (give_each_a_series) so that its type and labels are read",
                    metric.name
                );
            };
            let served = if shown.kind == "counter" { format!("{}_total", metric.name) } else { metric.name.clone() };
            let labels: Vec<String> = shown
                .labels
                .keys()
                .map(|label| match at_start.get(&metric.name).and_then(|start| start.labels.get(label)) {
                    Some(values) => {
                        // A family's series come in no fixed order.
                        let mut values: Vec<String> = values.iter().map(|value| code(value)).collect();
                        values.sort();
                        format!("{}: {}", code(label), values.join(", "))
                    }
                    None => code(label),
                })
                .collect();
            page.push_str(&row(&[code(&served), shown.kind.clone(), labels.join("<br>"), cell(&metric.help)]));
        }
    }
    page
}

/// Records something in each metric that has no series until the daemon does something, so that
/// the exposition shows its type and labels. The values are of no interest.
fn give_each_a_series(metrics: &Metrics) {
    let mut request = metrics.ensure.request();
    (request.policy, request.present, request.pull_required) =
        (Some(PullPolicy::IfNotPresent), Some(false), Some(true));
    drop(request);
    metrics.ensure.pulled_for_request(Duration::from_secs(1), 1);
    metrics.pulls.finished(Some("registry.example"), PullResult::Success);
    metrics.pulls.pulled(Some("registry.example"), Duration::from_secs(1));
    metrics.pulls.breaker_opened("registry.example");
    metrics.pulls.registry_rate("registry.example", Some(1.0));
    metrics.calls.count("ClearBackoff", "admin", true);
    metrics.calls.relayed("PullSecurityProfile");
    metrics.connections.closed(Closed::Refused);
    metrics.reloads.reloaded(ReloadResult::Applied);
    metrics.pre_pulls.states([
        ("queued", 0),
        ("pulling", 0),
        ("held", 0),
        ("done", 0),
        ("failed", 0),
        ("cancelled", 0),
    ]);
    metrics.records.quarantined("record");
    let events = Events::with_buffer(1).counted(Arc::clone(&metrics.events));
    events.publish(Event::new(EventType::Normal, reason::PULLED, String::new()));
}

/// The registered metrics, in the order registered, from a registry's `Debug`: a registry shows
/// its prefix, then its metrics' descriptors, then its sub-registries (each with its whole prefix).
fn registered(debug: &str) -> Vec<Registered> {
    const PREFIX: &str = "prefix: Some(Prefix(\"";
    const DESCRIPTOR: &str = "Descriptor { name: \"";
    const HELP: &str = "\", help: \"";
    let (mut prefix, mut metrics, mut rest) = (String::new(), Vec::new(), debug);
    loop {
        let next_prefix = rest.find(PREFIX);
        let next_descriptor = rest.find(DESCRIPTOR);
        match (next_prefix, next_descriptor) {
            (Some(at), descriptor) if descriptor.is_none_or(|descriptor| at < descriptor) => {
                rest = &rest[at + PREFIX.len()..];
                let end = rest.find('"').expect("a prefix's end");
                prefix = rest[..end].to_owned();
            }
            (_, Some(at)) => {
                rest = &rest[at + DESCRIPTOR.len()..];
                let end = rest.find(HELP).expect("a descriptor's help");
                let name = format!("{prefix}_{}", &rest[..end]);
                rest = &rest[end + HELP.len()..];
                let (help, after) = debug_string(rest);
                rest = after;
                metrics.push(Registered { name, help });
            }
            (_, None) => return metrics,
        }
    }
}

/// A Rust `Debug` string's text up to its closing quote, and what follows.
fn debug_string(text: &str) -> (String, &str) {
    let mut out = String::new();
    let mut chars = text.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return (out, &text[at + 1..]),
            '\\' => match chars.next() {
                Some((_, 'n')) => out.push('\n'),
                Some((_, escaped)) => out.push(escaped),
                None => break,
            },
            c => out.push(c),
        }
    }
    panic!("a Debug string without its closing quote: {text}");
}

/// Each metric family in an exposition, by name.
fn exposed(text: &str) -> BTreeMap<String, Exposed> {
    let mut families: BTreeMap<String, Exposed> = BTreeMap::new();
    let mut current = String::new();
    for line in text.lines() {
        if let Some(kind) = line.strip_prefix("# TYPE ") {
            let (name, kind) = kind.split_once(' ').expect("# TYPE name type");
            current = name.to_owned();
            families.entry(current.clone()).or_default().kind = kind.to_owned();
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let Some((_, labels)) = line.split_once('{') else { continue };
        let labels = labels.split_once('}').map(|(labels, _)| labels).unwrap_or_default();
        let family = families.entry(current.clone()).or_default();
        for pair in labels.split("\",").filter(|pair| !pair.is_empty()) {
            let (label, value) = pair.split_once("=\"").expect("label=\"value\"");
            if label == "le" {
                continue;
            }
            let values = family.labels.entry(label.to_owned()).or_default();
            let value = value.trim_end_matches('"').to_owned();
            if !values.contains(&value) {
                values.push(value);
            }
        }
    }
    families
}
