//! `cri-imaged backoff [clear POD_UID IMAGE | clear --all]`: the pods whose pulls back off, and
//! forgetting them.

use serde_json::json;

use super::{
    CliError,
    client::Daemon,
    output::{Style, print_json, print_lines},
    render::{
        human::{duration, wire_duration},
        table::Table,
    },
};
use crate::{
    api,
    config::client::{BackoffAction, BackoffArgs, BackoffClearArgs},
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
        for entry in &listed.entries {
            print_json(&json!({
                "pod": entry.pod.as_ref().map(|pod| json!({"namespace": pod.namespace, "name": pod.name, "uid": pod.uid})),
                "image": entry.image,
                "runtimeHandler": entry.runtime_handler,
                "retryAfterSeconds": wire_duration(entry.retry_after.as_ref()).as_secs_f64(),
                "delaySeconds": wire_duration(entry.delay.as_ref()).as_secs_f64(),
                "lastError": entry.last_error,
            }))?;
        }
        return Ok(());
    }
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
        vec!["no pod's pulls are backing off".to_owned()]
    } else {
        table.lines(style.table_width(), 5)
    };
    let unnamed = listed.total.saturating_sub(listed.entries.len() as u64);
    if unnamed > 0 {
        lines.push(format!("(and {unnamed} more pairs held that are not backing off now, or too old to name)"));
    }
    print_lines(lines)
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
    print_lines([match cleared {
        0 if args.all => "no backoff to clear".to_owned(),
        0 => format!("nothing to clear: {what} did not back off"),
        1 if !args.all => format!("cleared: {what} will be tried at once"),
        n => format!("cleared {n} backoffs"),
    }])
}
