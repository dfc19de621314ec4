//! `cri-imaged prepull [IMAGE]... [--namespace NS]`: pre-pulls asked for (SubmitPrePull), or,
//! without IMAGE, every pre-pull and how far it got (ListPrePulls, page by page).

use std::time::SystemTime;

use serde_json::{Value, json};

use super::{
    CliError,
    client::Daemon,
    output::{Style, print_json, print_lines},
    render::{
        human::{age, bytes, moment, rfc3339},
        line::Line,
        table::Table,
    },
    secret,
};
use crate::{api, config::client::PrePullArgs};

pub async fn run(args: PrePullArgs) -> Result<(), CliError> {
    let style = Style::of(args.format.output);
    let pull_secrets = args.secret.iter().map(|path| secret::read(path)).collect::<Result<_, _>>()?;
    let mut daemon = Daemon::connect(&args.connection).await?;
    let pre_pulls = if args.images.is_empty() {
        let mut listed = list(&mut daemon).await?;
        if let Some(namespace) = &args.namespace {
            listed.retain(|pre_pull| &pre_pull.namespace == namespace);
        }
        listed
    } else {
        let request = api::SubmitPrePullRequest {
            images: args.images.clone(),
            priority: args.priority,
            pull_secrets,
            timeout: args.pull_timeout.and_then(|timeout| prost_types::Duration::try_from(timeout).ok()),
            pin_for: args.pin_for.and_then(|pin| prost_types::Duration::try_from(pin).ok()),
            runtime_handler: args.runtime_handler.clone(),
            namespace: args.namespace.clone().unwrap_or_default(),
        };
        let answer = daemon.client.submit_pre_pull(daemon.timed(request)).await;
        daemon.answer(answer, "SubmitPrePull").await?.pre_pulls
    };
    if style.json() {
        return pre_pulls.iter().try_for_each(|pre_pull| print_json(&json_of(pre_pull)));
    }
    print_lines(lines(&pre_pulls, SystemTime::now(), &style), &style)
}

/// Every pre-pull, a page at a time.
async fn list(daemon: &mut Daemon) -> Result<Vec<api::PrePull>, CliError> {
    let mut all = Vec::new();
    let mut page_token = String::new();
    loop {
        let request = api::ListPrePullsRequest { page_size: 0, page_token };
        let answer = daemon.client.list_pre_pulls(daemon.timed(request)).await;
        let page = daemon.answer(answer, "ListPrePulls").await?;
        all.extend(page.pre_pulls);
        if page.next_page_token.is_empty() {
            return Ok(all);
        }
        page_token = page.next_page_token;
    }
}

/// The pre-pulls as a table, in the daemon's order (highest priority first, then oldest).
fn lines(pre_pulls: &[api::PrePull], now: SystemTime, style: &Style) -> Vec<Line> {
    if pre_pulls.is_empty() {
        return vec![Line::plain("no pre-pulls")];
    }
    let mut table = Table::new(&["ID", "IMAGE", "NAMESPACE", "STATE", "PRIORITY", "AGE", "DETAIL"]);
    for pre_pull in pre_pulls {
        let image = if pre_pull.runtime_handler.is_empty() {
            pre_pull.image.clone()
        } else {
            format!("{} ({})", pre_pull.image, pre_pull.runtime_handler)
        };
        let namespace = if pre_pull.namespace.is_empty() { "-".to_owned() } else { pre_pull.namespace.clone() };
        let state = if pre_pull.declared { format!("{} (declared)", pre_pull.state) } else { pre_pull.state.clone() };
        table.row(vec![
            pre_pull.id.clone(),
            image,
            namespace,
            state,
            pre_pull.priority.to_string(),
            age(moment(pre_pull.submitted.as_ref()), now),
            detail(pre_pull),
        ]);
    }
    table.lines(style.table_width(), 1)
}

/// What a person wants to know of its state: why it failed or is held, what it pulled, how far.
fn detail(pre_pull: &api::PrePull) -> String {
    match pre_pull.state.as_str() {
        "failed" | "held" => format!("{}: {}", pre_pull.reason, pre_pull.message),
        "done" => pre_pull.image_ref.clone(),
        "pulling" => match &pre_pull.progress {
            Some(progress) => format!("{} of {}", bytes(progress.bytes_done), bytes(progress.bytes_total)),
            None => String::new(),
        },
        _ => String::new(),
    }
}

fn json_of(pre_pull: &api::PrePull) -> Value {
    json!({
        "id": pre_pull.id,
        "image": pre_pull.image,
        "namespace": pre_pull.namespace,
        "runtimeHandler": pre_pull.runtime_handler,
        "priority": pre_pull.priority,
        "state": pre_pull.state,
        "imageRef": pre_pull.image_ref,
        "reason": pre_pull.reason,
        "message": pre_pull.message,
        "submitted": rfc3339(pre_pull.submitted.as_ref()),
        "finished": rfc3339(pre_pull.finished.as_ref()),
        "deadline": rfc3339(pre_pull.deadline.as_ref()),
        "pinnedUntil": rfc3339(pre_pull.pinned_until.as_ref()),
        "declared": pre_pull.declared,
        "resumed": pre_pull.resumed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::render::hostile::{assert_json_line, every_style, hostile, rendered, shown};

    fn hostile_pre_pull(state: &str) -> api::PrePull {
        api::PrePull {
            id: hostile("id"),
            image: hostile("image"),
            runtime_handler: hostile("handler"),
            namespace: hostile("namespace"),
            state: state.into(),
            reason: hostile("reason"),
            message: hostile("message"),
            image_ref: hostile("ref"),
            ..Default::default()
        }
    }

    #[test]
    fn the_daemons_text_in_every_field_is_shown_never_acted_on_in_every_mode() {
        let pre_pulls = [hostile_pre_pull("failed"), hostile_pre_pull("done")];
        for style in every_style() {
            if style.json() {
                let value = assert_json_line(&crate::cli::render::json::line(&json_of(&pre_pulls[0])).expect("JSON"));
                for field in ["id", "image", "namespace", "reason", "message"] {
                    assert_eq!(value[field], hostile(field), "{field}");
                }
                assert_eq!(value["runtimeHandler"], hostile("handler"));
                continue;
            }
            let text = rendered(&lines(&pre_pulls, SystemTime::now(), &style), &style);
            if style.table_width().is_none() {
                for field in ["id", "image", "handler", "namespace", "reason", "message", "ref"] {
                    assert!(text.contains(&shown(field)), "{field} shown whole in {style:?}:\n{text}");
                }
            }
            assert_eq!(text.lines().count(), 3, "a header and the two pre-pulls: {text}");
        }
    }

    #[test]
    fn a_pre_pull_without_namespace_shows_a_dash_and_each_state_its_detail() {
        let style =
            Style { output: crate::config::client::Output::Wide, terminal: false, color: false, size: (80, 24) };
        let mut done =
            api::PrePull { id: "0123".into(), image: "app:1".into(), state: "done".into(), ..Default::default() };
        done.image_ref = "sha256:ab".into();
        let failed = api::PrePull {
            id: "4567".into(),
            image: "app:1".into(),
            namespace: "team".into(),
            state: "failed".into(),
            reason: "SignatureValidationFailed".into(),
            message: "rejected by policy".into(),
            ..Default::default()
        };
        let text = rendered(&lines(&[done, failed], SystemTime::now(), &style), &style);
        let rows: Vec<Vec<&str>> = text.lines().skip(1).map(|line| line.split_whitespace().collect()).collect();
        assert_eq!(rows[0][..4], ["0123", "app:1", "-", "done"], "{text}");
        assert!(text.contains("sha256:ab"), "{text}");
        assert_eq!(rows[1][..4], ["4567", "app:1", "team", "failed"], "{text}");
        assert!(text.contains("SignatureValidationFailed: rejected by policy"), "{text}");
        assert_eq!(rendered(&lines(&[], SystemTime::now(), &style), &style).trim(), "no pre-pulls");
    }
}
