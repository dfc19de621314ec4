//! `cri-imaged gc [--dry-run]`: one image GC pass now, and what it removed (or would), and why
//! every other image stays.

use std::time::SystemTime;

use serde_json::json;

use super::{
    CliError,
    client::Daemon,
    output::{Style, print_json, print_lines},
    render::{
        human::{age, bytes, moment, short_id},
        line::Line,
        table::Table,
    },
};
use crate::{api, config::client::GcArgs};

pub async fn run(args: GcArgs) -> Result<(), CliError> {
    let style = Style::of(args.format.output);
    let mut daemon = Daemon::connect(&args.connection).await?;
    let request = api::GarbageCollectRequest { dry_run: args.dry_run, delete_unused: args.delete_unused };
    // A pass that removes may take longer than --timeout; Ctrl-C leaves it (it goes on).
    let request = if args.dry_run { daemon.timed(request) } else { tonic::Request::new(request) };
    let answer = daemon.client.garbage_collect(request).await;
    let pass = daemon.answer(answer, "GarbageCollect").await?;
    if style.json() {
        return print_json(&json_of(&pass));
    }
    print_lines(lines(&pass, args.dry_run, &style, SystemTime::now()), &style)
}

fn lines(pass: &api::GarbageCollectResponse, dry_run: bool, style: &Style, now: SystemTime) -> Vec<Line> {
    let mut lines = Vec::new();
    if let Some(usage) = &pass.usage_before {
        lines.push(Line::plain(format!(
            "image fs: {}% used ({} of {}); {} to free",
            usage.usage_percent,
            bytes(usage.capacity_bytes.saturating_sub(usage.available_bytes)),
            bytes(usage.capacity_bytes),
            bytes(pass.bytes_to_free)
        )));
    }
    let verb = if dry_run { "would remove" } else { "removed" };
    let count = if dry_run { pass.images.len() } else { pass.images.iter().filter(|image| image.removed).count() };
    lines.push(Line::plain(format!("{verb} {count} images, {}", bytes(pass.freed_bytes))));
    if !pass.shortfall.is_empty() {
        lines.push(Line::alert(pass.shortfall.clone()));
    }
    if !pass.images.is_empty() {
        let mut table = Table::new(&["IMAGE", "IMAGE ID", "SIZE", "WHY", "LAST USED", "RESULT"]);
        for image in &pass.images {
            let result = match (image.removed, dry_run) {
                (true, _) => "removed".to_owned(),
                (false, true) => "would be removed".to_owned(),
                (false, false) => format!("kept: {}", image.error),
            };
            let last_used = moment(image.last_used.as_ref())
                .map_or("never".to_owned(), |_| format!("{} ago", age(moment(image.last_used.as_ref()), now)));
            table.row(vec![
                first_name(&image.names),
                short_id(&image.image_id).to_owned(),
                bytes(image.size_bytes),
                image.reason.clone(),
                last_used,
                result,
            ]);
        }
        lines.push(Line::default());
        lines.extend(table.lines(style.table_width(), 0));
    }
    if !pass.kept.is_empty() {
        let mut table = Table::new(&["KEPT", "IMAGE ID", "SIZE", "WHY"]);
        for image in &pass.kept {
            table.row(vec![
                first_name(&image.names),
                short_id(&image.image_id).to_owned(),
                bytes(image.size_bytes),
                image.reason.clone(),
            ]);
        }
        lines.push(Line::default());
        lines.extend(table.lines(style.table_width(), 0));
    }
    lines
}

fn first_name(names: &[String]) -> String {
    names.first().cloned().unwrap_or_else(|| "<none>".to_owned())
}

fn json_of(pass: &api::GarbageCollectResponse) -> serde_json::Value {
    let usage = |usage: Option<&api::ImageFsUsage>| {
        usage.map(|usage| {
            json!({"capacityBytes": usage.capacity_bytes, "availableBytes": usage.available_bytes, "usagePercent": usage.usage_percent})
        })
    };
    json!({
        "usageBefore": usage(pass.usage_before.as_ref()),
        "usageAfter": usage(pass.usage_after.as_ref()),
        "bytesToFree": pass.bytes_to_free,
        "freedBytes": pass.freed_bytes,
        "shortfall": pass.shortfall,
        "images": pass.images.iter().map(|image| json!({
            "id": image.image_id, "names": image.names, "reason": image.reason, "sizeBytes": image.size_bytes,
            "removed": image.removed, "error": image.error, "runtimeHandler": image.runtime_handler,
        })).collect::<Vec<_>>(),
        "kept": pass.kept.iter().map(|image| json!({
            "id": image.image_id, "names": image.names, "reason": image.reason, "sizeBytes": image.size_bytes,
            "runtimeHandler": image.runtime_handler,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::render::hostile::{assert_json_line, every_style, hostile, rendered, shown};

    fn hostile_pass() -> api::GarbageCollectResponse {
        api::GarbageCollectResponse {
            images: vec![api::CollectedImage {
                image_id: hostile("id"),
                names: vec![hostile("removed")],
                reason: hostile("reason"),
                error: hostile("error"),
                runtime_handler: hostile("handler"),
                ..Default::default()
            }],
            kept: vec![api::KeptImage {
                image_id: hostile("kept-id"),
                names: vec![hostile("kept")],
                reason: hostile("why"),
                runtime_handler: hostile("kept-handler"),
                ..Default::default()
            }],
            shortfall: hostile("shortfall"),
            ..Default::default()
        }
    }

    #[test]
    fn the_daemons_text_in_every_field_is_shown_never_acted_on_in_every_mode() {
        let pass = hostile_pass();
        for style in every_style() {
            if style.json() {
                let value = assert_json_line(&crate::cli::render::json::line(&json_of(&pass)).expect("JSON"));
                assert_eq!(value["shortfall"], pass.shortfall);
                let (removed, kept) = (&value["images"][0], &value["kept"][0]);
                assert_eq!(
                    (&removed["id"], &removed["reason"], &removed["error"]),
                    (&json!(hostile("id")), &json!(hostile("reason")), &json!(hostile("error")))
                );
                assert_eq!(
                    (&removed["names"], &removed["runtimeHandler"]),
                    (&json!([hostile("removed")]), &json!(hostile("handler")))
                );
                assert_eq!(
                    (&kept["id"], &kept["names"], &kept["reason"]),
                    (&json!(hostile("kept-id")), &json!([hostile("kept")]), &json!(hostile("why")))
                );
                assert_eq!(kept["runtimeHandler"], hostile("kept-handler"));
                continue;
            }
            for dry_run in [true, false] {
                let text = rendered(&lines(&pass, dry_run, &style, SystemTime::now()), &style);
                if style.table_width().is_none() {
                    for field in ["shortfall", "removed", "reason", "error", "kept", "why"] {
                        assert!(
                            text.contains(&shown(field)) || (field == "error" && dry_run),
                            "{field} in {style:?}:\n{text}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_shortfall_is_in_alert_on_a_terminal_with_colour_only() {
        let pass = api::GarbageCollectResponse { shortfall: "could not free enough".to_owned(), ..Default::default() };
        let [coloured, no_color] =
            [0, 1].map(|at| rendered(&lines(&pass, true, &every_style()[at], SystemTime::now()), &every_style()[at]));
        assert!(coloured.contains("\x1b[1;31mcould not free enough\x1b[0m"), "{coloured:?}");
        assert!(!no_color.contains('\x1b'), "{no_color:?}");
    }
}
