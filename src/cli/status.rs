//! `cri-imaged status`: GetStatus for a person (or as JSON).

use std::time::SystemTime;

use serde_json::{Value, json};

use super::{
    CliError,
    client::Daemon,
    output::{Style, print_json, print_lines},
    render::{
        human::{age, bytes, cut_end, duration, moment, rate, rfc3339, wire_duration},
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
    print_lines(lines(&status, &daemon.socket.display().to_string(), &style, SystemTime::now()))
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

fn lines(status: &api::GetStatusResponse, socket: &str, style: &Style, now: SystemTime) -> Vec<String> {
    let mut lines = vec![format!("cri-imaged {} at {socket}", status.version)];
    let mut say = |what: &str, text: String| lines.push(format!("{:<15}{text}", what));
    say(
        "runtime",
        if status.runtime_reachable {
            "reachable".to_owned()
        } else {
            style.alert(&format!("unreachable: {}", status.runtime_error))
        },
    );
    if let Some(fs) = &status.image_fs {
        say(
            "image fs",
            format!(
                "{} of {} used ({}%); GC from {}% down to {}%",
                bytes(fs.capacity_bytes.saturating_sub(fs.available_bytes)),
                bytes(fs.capacity_bytes),
                fs.usage_percent,
                status.gc_high_threshold_percent,
                status.gc_low_threshold_percent
            ),
        );
    }
    say(
        "presence cache",
        if status.presence_cache_watching {
            format!("from memory, {} images", status.presence_cache_entries)
        } else {
            "asks the runtime every time".to_owned()
        },
    );
    let running = status.pulls.iter().filter(|pull| pull.started.is_some()).count();
    say(
        "pulls",
        format!("{running} under way, {} queued, {} pre-pulls queued", status.pulls_queued, status.pre_pulls_queued),
    );
    say("backoffs", format!("{} (pod, image) pairs held", status.backoff_entries));
    if let Some(backoff) = &status.backoff {
        say(
            "this pod",
            if backoff.backing_off {
                format!(
                    "backing off: next try in {}; last error: {}",
                    duration(wire_duration(backoff.retry_after.as_ref())),
                    backoff.last_error
                )
            } else {
                "not backing off".to_owned()
            },
        );
    }
    for bucket in &status.rate_limits {
        let host = if bucket.host.is_empty() { "every registry" } else { bucket.host.as_str() };
        let lowered = if bucket.lowered_from_qps > 0.0 {
            format!(", lowered from {} after 429s", bucket.lowered_from_qps)
        } else {
            String::new()
        };
        say(
            "rate limit",
            format!(
                "{host}: {} pulls/s, burst {}, {:.1} tokens ({}){lowered}",
                bucket.qps, bucket.burst, bucket.tokens, status.rate_limit_mode
            ),
        );
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
        say("registry", if registry.breaker == "closed" { text } else { style.alert(&text) });
    }
    say(
        "image GC",
        match &status.last_gc_pass {
            Some(pass) => format!(
                "last pass {} ago{}: {} images removed, {} freed{}",
                age(moment(pass.finished.as_ref()), now),
                if pass.dry_run { " (dry run)" } else { "" },
                pass.images_removed,
                bytes(pass.bytes_freed),
                if pass.failure.is_empty() { String::new() } else { format!("; {}", pass.failure) }
            ),
            None => "no pass yet".to_owned(),
        },
    );
    if !status.pre_pulls.is_empty() {
        let count = |state: &str| status.pre_pulls.iter().filter(|pre_pull| pre_pull.state == state).count();
        say(
            "pre-pulls",
            format!(
                "{} queued, {} pulling, {} done, {} failed",
                count("queued"),
                count("pulling"),
                count("done"),
                count("failed")
            ),
        );
    }
    if !status.kubelet_image_service_warning.is_empty() {
        say("warning", style.alert(&status.kubelet_image_service_warning));
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
        lines.push(String::new());
        lines.extend(table.lines(style.table_width(), 0));
    }
    lines.iter().map(|line| style.table_width().map_or(line.clone(), |width| cut_end(line, width))).collect()
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
        "prePulls": status.pre_pulls.len(),
        "kubeletImageServiceWarning": status.kubelet_image_service_warning,
    })
}
