//! `cri-imaged events [--follow]`: the recent events the daemon kept, then (with `--follow`) each
//! as it happens, in the kubelet's reasons.

use std::collections::HashSet;

use serde_json::{Value, json};

use super::{
    CliError,
    client::Daemon,
    output::{Style, print_json, print_lines},
    render::human::{bytes, rate, rfc3339},
};
use crate::{api, config::client::EventsArgs};

pub async fn run(args: EventsArgs) -> Result<(), CliError> {
    let style = Style::of(args.format.output);
    let mut daemon = Daemon::connect(&args.connection).await?;
    let filter = api::WatchEventsRequest {
        pod_uid: args.pod_uid.clone().unwrap_or_default(),
        namespace: args.namespace.clone().unwrap_or_default(),
        image: args.image.clone().unwrap_or_default(),
    };
    // Watching before listing: an event between the two is in one or both, never neither.
    let mut stream = if args.follow {
        let answer = daemon.client.watch_events(filter.clone()).await;
        Some(daemon.answer(answer, "WatchEvents").await?)
    } else {
        None
    };
    let request = api::ListEventsRequest { filter: Some(filter), limit: args.limit };
    let answer = daemon.client.list_events(daemon.timed(request)).await;
    let recent = match daemon.answer(answer, "ListEvents").await {
        Ok(answer) => answer.events,
        // An older daemon keeps no history; following still works.
        Err(CliError::TooOld { .. }) if args.follow => Vec::new(),
        Err(error) => return Err(error),
    };
    let seen: HashSet<String> = recent.iter().map(identity).collect();
    for event in &recent {
        show(event, &style)?;
    }
    let Some(stream) = stream.as_mut() else { return Ok(()) };
    loop {
        match stream.message().await {
            Ok(Some(event)) if seen.contains(&identity(&event)) => {}
            Ok(Some(event)) if event.reason == "PullProgress" && !args.progress => {}
            Ok(Some(event)) => show(&event, &style)?,
            Ok(None) => return Ok(()),
            Err(status) => return Err(daemon.error(&status, "WatchEvents").await),
        }
    }
}

/// What tells two copies of one event apart from two events.
fn identity(event: &api::Event) -> String {
    let time = event.time.as_ref().map(|time| (time.seconds, time.nanos)).unwrap_or_default();
    format!("{time:?}\0{}\0{}\0{}", event.reason, event.image, event.message)
}

fn show(event: &api::Event, style: &Style) -> Result<(), CliError> {
    if style.json() { print_json(&json_of(event)) } else { print_lines([line(event, style)]) }
}

/// One line: time, type, reason, the pod, and the message.
pub fn line(event: &api::Event, style: &Style) -> String {
    let time = rfc3339(event.time.as_ref()).unwrap_or_default();
    let object = match &event.pod {
        Some(pod) if !pod.name.is_empty() => format!("pod/{}/{}", pod.namespace, pod.name),
        Some(pod) if !pod.uid.is_empty() => format!("pod/{}", pod.uid),
        _ => "node".to_owned(),
    };
    let message = match (&event.progress, event.reason.as_str()) {
        (Some(progress), _) => format!(
            "{}: {} / {}, {} of {} layers, {}",
            event.image,
            bytes(progress.bytes_done),
            bytes(progress.bytes_total),
            progress.layers_done,
            progress.layers_total,
            rate(progress.bytes_per_second)
        ),
        (None, "Lagged") => format!("{} events went by unread (this watcher fell behind)", event.dropped),
        (None, _) => event.message.clone(),
    };
    let kind = if event.r#type == "Warning" {
        style.alert(&format!("{:<7}", event.r#type))
    } else {
        format!("{:<7}", event.r#type)
    };
    format!("{time}  {kind}  {:<21}  {object}  {message}", event.reason)
}

pub fn json_of(event: &api::Event) -> Value {
    let seconds = |duration: Option<&prost_types::Duration>| {
        duration.and_then(|duration| std::time::Duration::try_from(*duration).ok()).map(|d| d.as_secs_f64())
    };
    json!({
        "time": rfc3339(event.time.as_ref()),
        "type": event.r#type,
        "reason": event.reason,
        "message": event.message,
        "pod": event.pod.as_ref().map(|pod| json!({"namespace": pod.namespace, "name": pod.name, "uid": pod.uid})),
        "container": event.container_name,
        "image": event.image,
        "imageRef": event.image_ref,
        "pullSeconds": seconds(event.pull_duration.as_ref()),
        "pullSecondsWithWaiting": seconds(event.pull_duration_with_waiting.as_ref()),
        "imageSizeBytes": event.image_size_bytes,
        "dropped": event.dropped,
        "progress": event.progress.as_ref().map(|p| json!({
            "bytesDone": p.bytes_done, "bytesTotal": p.bytes_total, "layersDone": p.layers_done,
            "layersTotal": p.layers_total, "bytesPerSecond": p.bytes_per_second,
        })),
    })
}
