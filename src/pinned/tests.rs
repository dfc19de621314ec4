use std::collections::HashMap;

use crate::cri::{Image, ImageStatusResponse, ListImagesResponse};
use prost::Message;

use super::*;

const PAUSE_ID: &str = "sha256:7031c1b283388d2c2e09b57badb803c05ebed362dc88d84b480cc47f72a21097";
const PAUSE_DIGEST: &str = "sha256:fc70d1e8b7569bf0b7e8b9fd68830faec06b13bc179b1a4bf2d678e5897672eb";

fn image(id: &str, tag: &str) -> Image {
    let name = tag.rsplit_once(':').map_or(tag, |(name, _)| name);
    Image {
        id: id.into(),
        repo_tags: vec![tag.into()],
        repo_digests: vec![format!("{name}@{PAUSE_DIGEST}")],
        size: 311_000,
        username: "65535".into(),
        ..Default::default()
    }
}

fn pause() -> Image {
    image(PAUSE_ID, "registry.k8s.io/pause:3.9")
}

fn nginx() -> Image {
    image("sha256:1111111111111111111111111111111111111111111111111111111111111111", "docker.io/library/nginx:1.27")
}

fn list(images: Vec<Image>) -> Bytes {
    ListImagesResponse { images }.encode_to_vec().into()
}

fn listed(answer: &Bytes) -> Vec<Image> {
    ListImagesResponse::decode(answer.clone()).expect("a ListImagesResponse").images
}

#[test]
fn the_sandbox_image_is_reported_pinned_and_nothing_else_changes() {
    let pins = PinnedImages::new(Some("registry.k8s.io/pause:3.9"), &[]);
    let answer = pins.mark(list(vec![nginx(), pause()]));
    let mut pinned = pause();
    pinned.pinned = true;
    assert_eq!(listed(&answer), vec![nginx(), pinned]);
}

#[test]
fn an_image_status_keeps_its_info_and_is_marked() {
    let pins = PinnedImages::new(None, &["registry.k8s.io/pause:3.9".into()]);
    let info = HashMap::from([("info".to_owned(), r#"{"chainID":"sha256:d1"}"#.to_owned())]);
    let answer = ImageStatusResponse { image: Some(pause()), info: info.clone() };
    let marked = ImageStatusResponse::decode(pins.mark(answer.encode_to_vec().into())).expect("decodes");
    assert!(marked.image.as_ref().is_some_and(|image| image.pinned));
    assert_eq!(marked.info, info);
}

#[test]
fn short_names_digests_and_ids_pin_what_the_runtime_reports_in_full() {
    let docker_pause = image(PAUSE_ID, "docker.io/library/pause:latest");
    let by_digest = format!("registry.k8s.io/pause@{PAUSE_DIGEST}");
    for (configured, subject) in [("pause", docker_pause), (&by_digest, pause()), (PAUSE_ID, pause())] {
        let pins = PinnedImages::new(None, &[configured.to_owned()]);
        assert!(listed(&pins.mark(list(vec![subject, nginx()])))[0].pinned, "{configured}");
    }
}

#[test]
fn answers_without_a_pinned_image_are_the_same_bytes() {
    let pins = PinnedImages::new(Some("registry.k8s.io/pause:3.9"), &[]);
    let answer = list(vec![nginx()]);
    assert_eq!(pins.mark(answer.clone()).as_ptr(), answer.as_ptr(), "not copied");
    // Named, but not as an image's name: a tag that only begins with it.
    let other = list(vec![image(PAUSE_ID, "registry.k8s.io/pause:3.99")]);
    assert_eq!(pins.mark(other.clone()), other);
    let mut already = pause();
    already.pinned = true;
    let already = list(vec![already]);
    assert_eq!(pins.mark(already.clone()), already, "the runtime pinned it: as it said");
}

#[test]
fn fields_we_do_not_know_reach_the_caller() {
    let pins = PinnedImages::new(Some("registry.k8s.io/pause:3.9"), &[]);
    let mut image = pause().encode_to_vec();
    // Field 99, length-delimited: a field of a newer CRI.
    image.extend_from_slice(&[0x9a, 0x06, 3, b'n', b'e', b'w']);
    let mut answer = Vec::new();
    encode_key(1, WireType::LengthDelimited, &mut answer);
    encode_varint(image.len() as u64, &mut answer);
    answer.extend_from_slice(&image);
    let marked = pins.mark(answer.into());
    let expected = [&image[..], &PINNED_TRUE].concat();
    assert!(marked.ends_with(&expected), "the image's bytes, then pinned = true");
    assert!(listed(&marked)[0].pinned);
}

#[test]
fn an_answer_that_does_not_read_is_passed_on() {
    let pins = PinnedImages::new(Some("registry.k8s.io/pause:3.9"), &[]);
    let whole = list(vec![pause()]);
    let cut = whole.slice(..whole.len() - 3);
    assert_eq!(pins.mark(cut.clone()), cut);
}

#[test]
fn the_runtimes_sandbox_image_is_learned_only_when_none_is_configured() {
    let learning = PinnedImages::new(None, &[]);
    assert!(learning.learns_sandbox_image());
    assert!(learning.learned_sandbox_image(Some("registry.k8s.io/pause:3.9".into())), "changed");
    assert!(!learning.learned_sandbox_image(Some("registry.k8s.io/pause:3.9".into())), "the same");
    assert_eq!(learning.images(), ["registry.k8s.io/pause:3.9"]);
    assert!(listed(&learning.mark(list(vec![pause()])))[0].pinned);

    let configured = PinnedImages::new(Some("registry.k8s.io/pause:3.10"), &[]);
    assert!(!configured.learns_sandbox_image());
    assert!(!configured.learned_sandbox_image(Some("registry.k8s.io/pause:3.9".into())));
    assert_eq!(configured.images(), ["registry.k8s.io/pause:3.10"]);
    assert!(!listed(&configured.mark(list(vec![pause()])))[0].pinned);
    assert!(configured.configure(None, &[]), "a reload that unsets it");
    assert!(configured.learns_sandbox_image());
}

#[test]
fn each_pinned_image_says_why_it_is_pinned() {
    let pins = PinnedImages::new(Some("registry.k8s.io/pause:3.10"), &["app:1".to_owned()]);
    pins.pre_pulled(vec!["big:2".into()]);
    let expected = [
        ("registry.k8s.io/pause:3.10".to_owned(), Pin::SandboxImage),
        ("app:1".to_owned(), Pin::Configured),
        ("big:2".to_owned(), Pin::PrePull),
    ];
    assert_eq!(pins.images_and_why(), expected);
    let learning = PinnedImages::new(None, &["app:1".to_owned()]);
    learning.learned_sandbox_image(Some("registry.k8s.io/pause:3.9".into()));
    let expected = [("app:1".to_owned(), Pin::Configured), ("registry.k8s.io/pause:3.9".to_owned(), Pin::SandboxImage)];
    assert_eq!(learning.images_and_why(), expected, "a learned sandbox image too");
}
