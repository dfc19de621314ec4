//! `cri-imaged images`: the node's images as image GC sees them.

use std::time::SystemTime;

use serde_json::json;

use super::{
    CliError,
    client::Daemon,
    output::{Style, print_json, print_lines},
    render::{
        human::{age, bytes, moment, rfc3339, short_id},
        table::Table,
    },
};
use crate::{api, config::client::ImagesArgs};

pub async fn run(args: ImagesArgs) -> Result<(), CliError> {
    let style = Style::of(args.format.output);
    let mut daemon = Daemon::connect(&args.connection).await?;
    let answer = daemon.client.list_images(daemon.timed(api::ListImagesRequest {})).await;
    let mut images = daemon.answer(answer, "ListImages").await?.images;
    if let Some(filter) = &args.filter {
        images.retain(|image| names(image).iter().any(|name| name.contains(filter.as_str())));
    }
    images.sort_by_key(|image| names(image).first().cloned().unwrap_or_default());
    if style.json() {
        for image in &images {
            print_json(&json!({
                "id": image.image_id,
                "repoTags": image.repo_tags,
                "repoDigests": image.repo_digests,
                "sizeBytes": image.size_bytes,
                "runtimeHandler": image.runtime_handler,
                "pinned": image.pinned,
                "inUse": image.in_use,
                "firstDetected": rfc3339(image.first_detected.as_ref()),
                "lastUsed": rfc3339(image.last_used.as_ref()),
            }))?;
        }
        return Ok(());
    }
    print_lines(table(&images, SystemTime::now()).lines(style.table_width(), 0))
}

/// Its tags, else its digests, else its id: what a person calls it.
fn names(image: &api::NodeImage) -> Vec<String> {
    if !image.repo_tags.is_empty() {
        image.repo_tags.clone()
    } else if !image.repo_digests.is_empty() {
        image.repo_digests.clone()
    } else {
        vec!["<none>".to_owned()]
    }
}

/// One row per name, as crictl lists them.
fn table(images: &[api::NodeImage], now: SystemTime) -> Table {
    let mut table = Table::new(&["IMAGE", "IMAGE ID", "SIZE", "AGE", "LAST USED", "PINNED", "IN USE"]);
    let yes = |flag: bool| if flag { "yes" } else { "no" }.to_owned();
    for image in images {
        for name in names(image) {
            let name =
                if image.runtime_handler.is_empty() { name } else { format!("{name} ({})", image.runtime_handler) };
            let last_used = match moment(image.last_used.as_ref()) {
                _ if image.in_use => "now".to_owned(),
                Some(when) => format!("{} ago", age(Some(when), now)),
                None => "never".to_owned(),
            };
            table.row(vec![
                name,
                short_id(&image.image_id).to_owned(),
                bytes(image.size_bytes),
                age(moment(image.first_detected.as_ref()), now),
                last_used,
                yes(image.pinned),
                yes(image.in_use),
            ]);
        }
    }
    table
}
