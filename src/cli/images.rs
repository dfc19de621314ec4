//! `cri-imaged images`: the node's images as image GC sees them.

use std::time::SystemTime;

use serde_json::{Value, json};

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
        return images.iter().try_for_each(|image| print_json(&json_of(image)));
    }
    print_lines(table(&images, SystemTime::now()).lines(style.table_width(), 0), &style)
}

fn json_of(image: &api::NodeImage) -> Value {
    json!({
        "id": image.image_id,
        "repoTags": image.repo_tags,
        "repoDigests": image.repo_digests,
        "sizeBytes": image.size_bytes,
        "runtimeHandler": image.runtime_handler,
        "pinned": image.pinned,
        "inUse": image.in_use,
        "firstDetected": rfc3339(image.first_detected.as_ref()),
        "lastUsed": rfc3339(image.last_used.as_ref()),
        "verifications": super::policy::verifications_json(image),
    })
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
    let mut table = Table::new(&["IMAGE", "IMAGE ID", "SIZE", "AGE", "LAST USED", "PINNED", "IN USE", "VERIFIED"]);
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
                super::policy::verified_cell(image),
            ]);
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::render::hostile::{assert_json_line, every_style, hostile, rendered, shown};

    fn hostile_image() -> api::NodeImage {
        api::NodeImage {
            image_id: hostile("id"),
            repo_tags: vec![hostile("tag")],
            repo_digests: vec![hostile("digest")],
            runtime_handler: hostile("handler"),
            ..Default::default()
        }
    }

    #[test]
    fn the_daemons_text_in_every_field_is_shown_never_acted_on_in_every_mode() {
        let untagged = api::NodeImage { repo_tags: Vec::new(), ..hostile_image() };
        let images = [hostile_image(), untagged];
        for style in every_style() {
            if style.json() {
                for image in &images {
                    let value = assert_json_line(&crate::cli::render::json::line(&json_of(image)).expect("JSON"));
                    assert_eq!(value["id"], image.image_id);
                    assert_eq!(value["repoTags"], json!(image.repo_tags));
                    assert_eq!(value["repoDigests"], json!(image.repo_digests));
                    assert_eq!(value["runtimeHandler"], image.runtime_handler);
                }
                continue;
            }
            let text = rendered(&table(&images, SystemTime::now()).lines(style.table_width(), 0), &style);
            assert_eq!(text.lines().count(), 3, "a header and a row each: {text}");
            if style.table_width().is_none() {
                for field in ["tag", "digest", "handler"] {
                    assert!(text.contains(&shown(field)), "{field} shown whole in {style:?}:\n{text}");
                }
            }
        }
    }
}
