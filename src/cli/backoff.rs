//! `cri-imaged backoff [clear POD_UID IMAGE | clear --all]`: the pods whose pulls back off, and
//! forgetting them.

use serde_json::{Value, json};

use super::{
    CliError,
    client::Daemon,
    output::{Style, print_json, print_lines},
    render::{
        human::{duration, wire_duration},
        line::Line,
        table::Table,
    },
};
use crate::{
    api,
    config::client::{BackoffAction, BackoffArgs, BackoffClearArgs, Output},
};

pub async fn run(args: BackoffArgs) -> Result<(), CliError> {
    if let Some(BackoffAction::Clear(clear)) = args.action {
        return self::clear(clear).await;
    }
    let style = Style::of(args.format.output);
    let mut daemon = Daemon::connect(&args.connection).await?;
    let answer = daemon.client.list_backoffs(daemon.timed(api::ListBackoffsRequest {})).await;
    let listed = daemon.answer(answer, "ListBackoffs").await?;
    if style.json() {
        return listed.entries.iter().try_for_each(|entry| print_json(&json_of(entry)));
    }
    print_lines(lines(&listed, &style), &style)
}

/// The pairs backing off as a table, and how many more are held.
fn lines(listed: &api::ListBackoffsResponse, style: &Style) -> Vec<Line> {
    let mut table = Table::new(&["POD", "POD UID", "IMAGE", "RETRY IN", "DELAY", "LAST ERROR"]);
    for entry in &listed.entries {
        let pod = entry.pod.clone().unwrap_or_default();
        let image = if entry.runtime_handler.is_empty() {
            entry.image.clone()
        } else {
            format!("{} ({})", entry.image, entry.runtime_handler)
        };
        table.row(vec![
            format!("{}/{}", pod.namespace, pod.name),
            pod.uid,
            image,
            duration(wire_duration(entry.retry_after.as_ref())),
            duration(wire_duration(entry.delay.as_ref())),
            entry.last_error.clone(),
        ]);
    }
    let mut lines = if table.is_empty() {
        vec![Line::plain("no pod's pulls are backing off")]
    } else {
        table.lines(style.table_width(), 5)
    };
    let unnamed = listed.total.saturating_sub(listed.entries.len() as u64);
    if unnamed > 0 {
        lines.push(Line::plain(format!(
            "(and {unnamed} more pairs held that are not backing off now, or too old to name)"
        )));
    }
    lines
}

fn json_of(entry: &api::BackoffEntry) -> Value {
    json!({
        "pod": entry.pod.as_ref().map(|pod| json!({"namespace": pod.namespace, "name": pod.name, "uid": pod.uid})),
        "image": entry.image,
        "runtimeHandler": entry.runtime_handler,
        "retryAfterSeconds": wire_duration(entry.retry_after.as_ref()).as_secs_f64(),
        "delaySeconds": wire_duration(entry.delay.as_ref()).as_secs_f64(),
        "lastError": entry.last_error,
    })
}

async fn clear(args: BackoffClearArgs) -> Result<(), CliError> {
    let mut daemon = Daemon::connect(&args.connection).await?;
    let request = api::ClearBackoffRequest {
        pod_uid: args.pod_uid.clone().unwrap_or_default(),
        image: args.image.clone().unwrap_or_default(),
        runtime_handler: args.runtime_handler.clone(),
        all: args.all,
    };
    let answer = daemon.client.clear_backoff(daemon.timed(request)).await;
    let cleared = daemon.answer(answer, "ClearBackoff").await?.cleared;
    let what = match (&args.pod_uid, &args.image) {
        (Some(uid), Some(image)) if !args.all => format!("pod {uid}'s pulls of {image}"),
        _ => "every backoff".to_owned(),
    };
    let said = match cleared {
        0 if args.all => "no backoff to clear".to_owned(),
        0 => format!("nothing to clear: {what} did not back off"),
        1 if !args.all => format!("cleared: {what} will be tried at once"),
        n => format!("cleared {n} backoffs"),
    };
    print_lines([Line::plain(said)], &Style::of(Output::Text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::render::hostile::{assert_json_line, every_style, hostile, rendered, shown};

    fn hostile_entry() -> api::BackoffEntry {
        api::BackoffEntry {
            pod: Some(api::PodRef {
                namespace: hostile("ns"),
                name: hostile("name"),
                uid: hostile("uid"),
                ..Default::default()
            }),
            image: hostile("image"),
            runtime_handler: hostile("handler"),
            retry_after: Some(prost_types::Duration { seconds: 9, nanos: 0 }),
            delay: Some(prost_types::Duration { seconds: 10, nanos: 0 }),
            last_error: hostile("error"),
        }
    }

    #[test]
    fn the_daemons_text_in_every_field_is_shown_never_acted_on_in_every_mode() {
        let listed = api::ListBackoffsResponse { entries: vec![hostile_entry()], total: 3 };
        for style in every_style() {
            if style.json() {
                let value =
                    assert_json_line(&crate::cli::render::json::line(&json_of(&listed.entries[0])).expect("JSON"));
                assert_eq!(value["pod"]["namespace"], hostile("ns"));
                assert_eq!(value["pod"]["name"], hostile("name"));
                assert_eq!(value["pod"]["uid"], hostile("uid"));
                assert_eq!(value["image"], hostile("image"));
                assert_eq!(value["runtimeHandler"], hostile("handler"));
                assert_eq!(value["lastError"], hostile("error"));
                continue;
            }
            let text = rendered(&lines(&listed, &style), &style);
            if style.table_width().is_none() {
                for field in ["ns", "name", "uid", "image", "handler", "error"] {
                    assert!(text.contains(&shown(field)), "{field} shown whole in {style:?}:\n{text}");
                }
            }
            assert_eq!(text.lines().count(), 3, "a header, the pair, the count: {text}");
        }
    }
}
