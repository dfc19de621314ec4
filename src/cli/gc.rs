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
    print_lines(lines(&pass, args.dry_run, &style, SystemTime::now()))
}

fn lines(pass: &api::GarbageCollectResponse, dry_run: bool, style: &Style, now: SystemTime) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(usage) = &pass.usage_before {
        lines.push(format!(
            "image fs: {}% used ({} of {}); {} to free",
            usage.usage_percent,
            bytes(usage.capacity_bytes.saturating_sub(usage.available_bytes)),
            bytes(usage.capacity_bytes),
            bytes(pass.bytes_to_free)
        ));
    }
    let verb = if dry_run { "would remove" } else { "removed" };
    let count = if dry_run { pass.images.len() } else { pass.images.iter().filter(|image| image.removed).count() };
    lines.push(format!("{verb} {count} images, {}", bytes(pass.freed_bytes)));
    if !pass.shortfall.is_empty() {
        lines.push(style.alert(&pass.shortfall));
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
        lines.push(String::new());
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
        lines.push(String::new());
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
