//! `cri-imaged events [--follow]`: the recent events the daemon kept, then (with `--follow`) each
//! as it happens, in the kubelet's reasons.

use std::collections::HashSet;

use serde_json::{Value, json};

use super::{
    CliError,
    client::Daemon,
    output::{Style, print_json, print_lines},
    render::{
        human::{bytes, rate, rfc3339},
        line::{Line, Tone},
    },
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
    if style.json() { print_json(&json_of(event)) } else { print_lines([line(event)], style) }
}

/// One line: time, type (a warning in alert), reason, the pod, and the message.
pub fn line(event: &api::Event) -> Line {
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
    let tone = if event.r#type == "Warning" { Tone::Alert } else { Tone::Plain };
    Line::plain(format!("{time}  "))
        .then(tone, format!("{:<7}", event.r#type))
        .then(Tone::Plain, format!("  {:<21}  {object}  {message}", event.reason))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::render::hostile::{assert_json_line, every_style, hostile, rendered, shown};

    fn hostile_event(kind: &str, reason: &str) -> api::Event {
        api::Event {
            time: Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 0 }),
            r#type: kind.to_owned(),
            reason: reason.to_owned(),
            message: hostile("message"),
            pod: Some(api::PodRef {
                namespace: hostile("ns"),
                name: hostile("name"),
                uid: hostile("uid"),
                ..Default::default()
            }),
            container_name: hostile("container"),
            image: hostile("image"),
            image_ref: hostile("ref"),
            ..Default::default()
        }
    }

    #[test]
    fn the_daemons_text_in_every_field_is_shown_never_acted_on_in_every_mode() {
        // Type and reason too: the daemon names them, and an older or foreign one could say anything.
        let events = [
            hostile_event("Warning", "Failed"),
            hostile_event(&hostile("type"), &hostile("reason")),
            api::Event { progress: Some(api::PullProgress::default()), ..hostile_event("Normal", "PullProgress") },
            api::Event {
                pod: Some(api::PodRef { uid: hostile("uid"), ..Default::default() }),
                ..hostile_event("Normal", "Pulling")
            },
        ];
        for style in every_style() {
            for event in &events {
                if style.json() {
                    let value = assert_json_line(&crate::cli::render::json::line(&json_of(event)).expect("JSON"));
                    let pod = event.pod.clone().unwrap_or_default();
                    assert_eq!(value["type"], event.r#type);
                    assert_eq!(value["reason"], event.reason);
                    assert_eq!(value["message"], event.message);
                    assert_eq!(value["pod"]["namespace"], pod.namespace);
                    assert_eq!(value["pod"]["name"], pod.name);
                    assert_eq!(value["pod"]["uid"], pod.uid);
                    assert_eq!(value["container"], event.container_name);
                    assert_eq!(value["image"], event.image);
                    assert_eq!(value["imageRef"], event.image_ref);
                    continue;
                }
                let text = rendered(&[line(event)], &style);
                assert_eq!(text.lines().count(), 1, "one line: {text}");
            }
        }
        let text = rendered(&[line(&events[1])], &every_style()[2]);
        for field in ["type", "reason", "ns", "name", "message"] {
            assert!(text.contains(&shown(field)), "{field} shown whole: {text}");
        }
        assert!(rendered(&[line(&events[2])], &every_style()[2]).contains(&shown("image")));
        assert!(rendered(&[line(&events[3])], &every_style()[2]).contains(&format!("pod/{}", shown("uid"))));
    }

    #[test]
    fn a_warning_is_in_alert_on_a_terminal_with_colour_only() {
        let event = hostile_event("Warning", "Failed");
        let [coloured, no_color, piped] = [0, 1, 2].map(|at| rendered(&[line(&event)], &every_style()[at]));
        assert!(coloured.contains("\x1b[1;31mWarning\x1b[0m"), "{coloured:?}");
        assert_eq!(no_color, piped);
        assert!(!piped.contains('\x1b'), "{piped:?}");
    }
}
