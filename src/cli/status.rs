//! `cri-imaged status`: GetStatus for a person (or as JSON).

use std::time::SystemTime;

use serde_json::{Value, json};

use super::{
    CliError,
    client::Daemon,
    output::{Style, print_json, print_lines},
    render::{
        human::{age, bytes, duration, moment, rate, rfc3339, wire_duration},
        line::Line,
        table::Table,
    },
};
use crate::{api, config::client::StatusArgs};

pub async fn run(args: StatusArgs) -> Result<(), CliError> {
    let style = Style::of(args.format.output);
    let mut daemon = Daemon::connect(&args.connection).await?;
    let request = api::GetStatusRequest {
        pod_uid: args.pod_uid.unwrap_or_default(),
        image: args.image.unwrap_or_default(),
        runtime_handler: String::new(),
    };
    let status = daemon.status(request).await?;
    if style.json() {
        return print_json(&json_of(&status));
    }
    print_lines(lines(&status, &daemon.socket.display().to_string(), &style, SystemTime::now()), &style)
}

/// What a pull waits for, in words.
pub fn pull_state(pull: &api::PullInFlight) -> &str {
    match pull.state.as_str() {
        "slot" => "waiting for a slot",
        "rate-limit" => "rate limited",
        "registry" => "registry silent",
        "pulling" => "pulling",
        "" if pull.started.is_none() => "waiting for a slot",
        "" => "pulling",
        other => other,
    }
}

/// A pull's progress in a cell: `12.3 MB / 33.6 MB, 2.10 MB/s`.
pub fn progress_cell(progress: Option<&api::PullProgress>) -> String {
    match progress {
        Some(progress) if progress.bytes_total > 0 => format!(
            "{} / {} ({}%), {}",
            bytes(progress.bytes_done),
            bytes(progress.bytes_total),
            progress.bytes_done * 100 / progress.bytes_total,
            rate(progress.bytes_per_second)
        ),
        _ => "-".to_owned(),
    }
}

fn lines(status: &api::GetStatusResponse, socket: &str, style: &Style, now: SystemTime) -> Vec<Line> {
    let mut lines = vec![Line::plain(format!("cri-imaged {} at {socket}", status.version))];
    let mut say = |what: &str, text: Line| lines.push(Line::plain(format!("{what:<15}")).append(text));
    say(
        "runtime",
        if status.runtime_reachable {
            Line::plain("reachable")
        } else {
            Line::alert(format!("unreachable: {}", status.runtime_error))
        },
    );
    if let Some(fs) = &status.image_fs {
        // As `top` says it: a high threshold of 100 is GC for space turned off; 0, a daemon that
        // does not say.
        let gc = match (status.gc_high_threshold_percent, status.gc_low_threshold_percent) {
            (0, _) => String::new(),
            (100.., _) => "; GC off".to_owned(),
            (high, low) => format!("; GC from {high}% down to {low}%"),
        };
        say(
            "image fs",
            Line::plain(format!(
                "{} of {} used ({}%){gc}",
                bytes(fs.capacity_bytes.saturating_sub(fs.available_bytes)),
                bytes(fs.capacity_bytes),
                fs.usage_percent,
            )),
        );
    }
    say(
        "presence cache",
        // Answers remembered (an image asked for, with its credentials), not the node's images.
        Line::plain(if status.presence_cache_watching {
            let count = status.presence_cache_entries;
            let answers = if count == 1 { "answer" } else { "answers" };
            format!("from memory, {count} {answers} remembered ({})", status.presence_cache_signal)
        } else {
            "asks the runtime every time".to_owned()
        }),
    );
    let running = status.pulls.iter().filter(|pull| pull.started.is_some()).count();
    say(
        "pulls",
        Line::plain(format!(
            "{running} under way, {} queued, {} pre-pulls queued",
            status.pulls_queued, status.pre_pulls_queued
        )),
    );
    say("backoffs", Line::plain(format!("{} (pod, image) pairs held", status.backoff_entries)));
    if let Some(backoff) = &status.backoff {
        say(
            "this pod",
            Line::plain(if backoff.backing_off {
                format!(
                    "backing off: next try in {}; last error: {}",
                    duration(wire_duration(backoff.retry_after.as_ref())),
                    backoff.last_error
                )
            } else {
                "not backing off".to_owned()
            }),
        );
    }
    for bucket in &status.rate_limits {
        let lowered = if bucket.lowered_from_qps > 0.0 {
            format!(", lowered from {} after 429s", bucket.lowered_from_qps)
        } else {
            String::new()
        };
        // The default's tokens are those of the bucket shared past the 256th host: rarely used.
        let line = if bucket.host.is_empty() {
            format!("each registry: {} pulls/s, burst {} ({})", bucket.qps, bucket.burst, status.rate_limit_mode)
        } else {
            format!(
                "{}: {} pulls/s, burst {}, {:.1} tokens ({}){lowered}",
                bucket.host, bucket.qps, bucket.burst, bucket.tokens, status.rate_limit_mode
            )
        };
        say("rate limit", Line::plain(line));
    }
    for registry in &status.registries {
        let until = moment(registry.open_until.as_ref())
            .and_then(|until| until.duration_since(now).ok())
            .map(|left| format!(" for {}", duration(left)))
            .unwrap_or_default();
        let silent = if registry.unanswered { "; a pull has no answer" } else { "" };
        let text = format!(
            "{}: breaker {}{until}, {} failures in a row{silent}; last: {}",
            registry.host, registry.breaker, registry.failures, registry.last_failure
        );
        say("registry", if registry.breaker == "closed" { Line::plain(text) } else { Line::alert(text) });
    }
    say(
        "image GC",
        Line::plain(match &status.last_gc_pass {
            Some(pass) => format!(
                "last pass {} ago{}: {} images removed, {} freed{}",
                age(moment(pass.finished.as_ref()), now),
                if pass.dry_run { " (dry run)" } else { "" },
                pass.images_removed,
                bytes(pass.bytes_freed),
                if pass.failure.is_empty() { String::new() } else { format!("; {}", pass.failure) }
            ),
            None => "no pass yet".to_owned(),
        }),
    );
    for (what, text) in super::policy::status_lines(status.image_policy.as_ref(), now) {
        say(what, Line::plain(text));
    }
    let counts = pre_pull_counts(status);
    if counts.iter().any(|(_, count)| *count > 0) {
        let shown = counts
            .iter()
            .filter(|(state, count)| *count > 0 || ["queued", "pulling", "done", "failed"].contains(state));
        let said = shown.map(|(state, count)| format!("{count} {state}")).collect::<Vec<_>>().join(", ");
        say("pre-pulls", Line::plain(said));
    }
    if let Some(refused) = &status.reload_refused {
        // Until a reload succeeds, the configuration in force is the one before it.
        let at = rfc3339(refused.at.as_ref()).map(|at| format!(" (at {at})")).unwrap_or_default();
        let text = format!(
            "last reload refused {} ago{at}, the configuration before it kept: {}",
            age(moment(refused.at.as_ref()), now),
            refused.reason
        );
        say("reload", Line::alert(text));
    }
    for warning in [&status.kubelet_image_service_warning, &status.kubelet_serial_image_pulls_warning] {
        if !warning.is_empty() {
            say("warning", Line::alert(warning.clone()));
        }
    }
    if !status.pulls.is_empty() {
        let mut table = Table::new(&["IMAGE", "STATE", "CALLERS", "ASKED", "PROGRESS"]);
        for pull in &status.pulls {
            let image = if pull.pre_pull { format!("{} (pre-pull)", pull.image) } else { pull.image.clone() };
            table.row(vec![
                image,
                pull_state(pull).to_owned(),
                pull.callers.to_string(),
                format!("{} ago", age(moment(pull.asked.as_ref()), now)),
                progress_cell(pull.progress.as_ref()),
            ]);
        }
        lines.push(Line::default());
        lines.extend(table.lines(style.table_width(), 0));
    }
    match style.table_width() {
        Some(width) => lines.into_iter().map(|line| line.cut_end(width)).collect(),
        None => lines,
    }
}

/// How many pre-pulls are in each state: the daemon's counts, or (from a daemon without them) the
/// pre-pulls it listed.
fn pre_pull_counts(status: &api::GetStatusResponse) -> [(&'static str, u32); 6] {
    match &status.pre_pull_counts {
        Some(counts) => [
            ("queued", counts.queued),
            ("pulling", counts.pulling),
            ("held", counts.held),
            ("done", counts.done),
            ("failed", counts.failed),
            ("cancelled", counts.cancelled),
        ],
        None => ["queued", "pulling", "held", "done", "failed", "cancelled"].map(|state| {
            let listed = status.pre_pulls.iter().filter(|pre_pull| pre_pull.state == state).count();
            (state, u32::try_from(listed).unwrap_or(u32::MAX))
        }),
    }
}

fn json_of(status: &api::GetStatusResponse) -> Value {
    let time = |timestamp: Option<&prost_types::Timestamp>| rfc3339(timestamp).map_or(Value::Null, Value::String);
    json!({
        "version": status.version,
        "runtimeReachable": status.runtime_reachable,
        "runtimeError": status.runtime_error,
        "imageFs": status.image_fs.as_ref().map(|fs| json!({
            "capacityBytes": fs.capacity_bytes, "availableBytes": fs.available_bytes, "usagePercent": fs.usage_percent,
        })),
        "gcHighThresholdPercent": status.gc_high_threshold_percent,
        "gcLowThresholdPercent": status.gc_low_threshold_percent,
        "pulls": status.pulls.iter().map(|pull| json!({
            "image": pull.image,
            "state": pull.state,
            "prePull": pull.pre_pull,
            "callers": pull.callers,
            "asked": time(pull.asked.as_ref()),
            "started": time(pull.started.as_ref()),
            "bytesDone": pull.progress.as_ref().map(|p| p.bytes_done),
            "bytesTotal": pull.progress.as_ref().map(|p| p.bytes_total),
        })).collect::<Vec<_>>(),
        "pullsQueued": status.pulls_queued,
        "prePullsQueued": status.pre_pulls_queued,
        "backoffEntries": status.backoff_entries,
        "backoff": status.backoff.as_ref().map(|backoff| json!({
            "backingOff": backoff.backing_off,
            "retryAfterSeconds": wire_duration(backoff.retry_after.as_ref()).as_secs_f64(),
            "lastError": backoff.last_error,
        })),
        "presenceCacheWatching": status.presence_cache_watching,
        "presenceCacheEntries": status.presence_cache_entries,
        "presenceCacheSignal": status.presence_cache_signal,
        "lastGcPass": status.last_gc_pass.as_ref().map(|pass| json!({
            "finished": time(pass.finished.as_ref()),
            "dryRun": pass.dry_run,
            "imagesRemoved": pass.images_removed,
            "bytesFreed": pass.bytes_freed,
            "failure": pass.failure,
        })),
        "rateLimitMode": status.rate_limit_mode,
        "rateLimits": status.rate_limits.iter().map(|bucket| json!({
            "host": bucket.host, "qps": bucket.qps, "burst": bucket.burst, "tokens": bucket.tokens,
            "loweredFromQps": bucket.lowered_from_qps,
        })).collect::<Vec<_>>(),
        "registries": status.registries.iter().map(|registry| json!({
            "host": registry.host, "breaker": registry.breaker, "failures": registry.failures,
            "lastFailure": registry.last_failure, "openUntil": time(registry.open_until.as_ref()),
            "unanswered": registry.unanswered,
        })).collect::<Vec<_>>(),
        "prePulls": pre_pull_counts(status).iter().map(|(_, count)| u64::from(*count)).sum::<u64>(),
        "prePullsByState": pre_pull_counts(status).iter().map(|(state, count)| ((*state).to_owned(), json!(count))).collect::<serde_json::Map<_, _>>(),
        "kubeletImageServiceWarning": status.kubelet_image_service_warning,
        "kubeletSerialImagePullsWarning": status.kubelet_serial_image_pulls_warning,
        "reloadRefused": status.reload_refused.as_ref().map(|refused| json!({
            "at": time(refused.at.as_ref()), "reason": refused.reason,
        })),
        "imagePolicy": super::policy::status_json(status.image_policy.as_ref()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::render::hostile::{assert_json_line, every_style, hostile, rendered, shown};

    fn hostile_status() -> api::GetStatusResponse {
        api::GetStatusResponse {
            version: hostile("version"),
            runtime_error: hostile("runtime"),
            pulls: vec![api::PullInFlight {
                image: hostile("pull"),
                state: hostile("state"),
                started: Some(prost_types::Timestamp::default()),
                ..Default::default()
            }],
            backoff: Some(api::BackoffStatus {
                backing_off: true,
                last_error: hostile("backoff"),
                ..Default::default()
            }),
            last_gc_pass: Some(api::GcPassStatus { failure: hostile("gc"), ..Default::default() }),
            rate_limit_mode: hostile("mode"),
            rate_limits: vec![api::RateLimitBucket { host: hostile("bucket"), ..Default::default() }],
            kubelet_image_service_warning: hostile("warning"),
            kubelet_serial_image_pulls_warning: hostile("serial"),
            reload_refused: Some(api::ReloadRefusal { at: None, reason: hostile("reload") }),
            registries: vec![
                api::RegistryHealth {
                    host: hostile("open"),
                    breaker: hostile("breaker"),
                    last_failure: hostile("failure"),
                    ..Default::default()
                },
                api::RegistryHealth {
                    host: hostile("closed"),
                    breaker: "closed".to_owned(),
                    last_failure: hostile("last"),
                    ..Default::default()
                },
            ],
            pre_pulls: vec![api::PrePull { state: hostile("pre-pull"), ..Default::default() }],
            image_fs: Some(api::ImageFsUsage::default()),
            ..Default::default()
        }
    }

    #[test]
    fn the_daemons_text_in_every_field_is_shown_never_acted_on_in_every_mode() {
        let status = hostile_status();
        let socket = hostile("socket");
        for style in every_style() {
            if style.json() {
                let value = assert_json_line(&crate::cli::render::json::line(&json_of(&status)).expect("JSON"));
                assert_eq!(
                    (&value["version"], &value["runtimeError"]),
                    (&json!(hostile("version")), &json!(hostile("runtime")))
                );
                assert_eq!(
                    (&value["pulls"][0]["image"], &value["pulls"][0]["state"]),
                    (&json!(hostile("pull")), &json!(hostile("state")))
                );
                assert_eq!(value["backoff"]["lastError"], hostile("backoff"));
                assert_eq!(value["lastGcPass"]["failure"], hostile("gc"));
                assert_eq!(
                    (&value["rateLimitMode"], &value["rateLimits"][0]["host"]),
                    (&json!(hostile("mode")), &json!(hostile("bucket")))
                );
                assert_eq!(
                    (&value["kubeletImageServiceWarning"], &value["kubeletSerialImagePullsWarning"]),
                    (&json!(hostile("warning")), &json!(hostile("serial")))
                );
                assert_eq!(value["reloadRefused"]["reason"], hostile("reload"));
                let open = &value["registries"][0];
                assert_eq!(
                    (&open["host"], &open["breaker"], &open["lastFailure"]),
                    (&json!(hostile("open")), &json!(hostile("breaker")), &json!(hostile("failure")))
                );
                continue;
            }
            let text = rendered(&lines(&status, &socket, &style, SystemTime::now()), &style);
            if style.table_width().is_none() {
                let fields = [
                    "socket", "version", "runtime", "backoff", "gc", "mode", "bucket", "warning", "serial", "open",
                    "breaker", "failure", "closed", "last", "pull", "state", "reload",
                ];
                for field in fields {
                    assert!(text.contains(&shown(field)), "{field} shown whole in {style:?}:\n{text}");
                }
            } else {
                assert!(
                    text.lines().all(|line| line.chars().count() <= 80 || style.color),
                    "cut to the terminal: {text}"
                );
            }
        }
    }

    #[test]
    fn what_is_wrong_is_in_alert_on_a_terminal_with_colour_only() {
        let status = api::GetStatusResponse { runtime_error: "connection refused".to_owned(), ..Default::default() };
        let [coloured, no_color] =
            [0, 1].map(|at| rendered(&lines(&status, "/s", &every_style()[at], SystemTime::now()), &every_style()[at]));
        assert!(coloured.contains("runtime        \x1b[1;31munreachable: connection refused\x1b[0m"), "{coloured:?}");
        assert!(
            no_color.contains("runtime        unreachable: connection refused") && !no_color.contains('\x1b'),
            "{no_color:?}"
        );
    }
}
