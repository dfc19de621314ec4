//! The CRI validation suite's "Image Manager" behaviours, run against real containerd twice in
//! each test — straight to containerd, then through cri-imaged's `runtime.v1.ImageService` — and
//! the two transcripts compared: through cri-imaged the answers must be the same.

mod support;

use std::future::Future;

use k8s_cri::v1::{
    Image, ImageSpec, ImageStatusRequest, ListImagesRequest, PullImageRequest, RemoveImageRequest,
    image_service_client::ImageServiceClient,
};
use support::{process::DaemonProcess, stack::LocalStack, unix_channel};
use tonic::transport::Channel;

type Client = ImageServiceClient<Channel>;

fn spec(image: &str) -> Option<ImageSpec> {
    Some(ImageSpec { image: image.into(), ..Default::default() })
}

async fn pull(client: &mut Client, image: &str) -> String {
    let request = PullImageRequest { image: spec(image), ..Default::default() };
    client.pull_image(request).await.unwrap_or_else(|e| panic!("pull {image}: {e}")).into_inner().image_ref
}

async fn status(client: &mut Client, image: &str) -> Option<Image> {
    let request = ImageStatusRequest { image: spec(image), verbose: false };
    client.image_status(request).await.unwrap_or_else(|e| panic!("status {image}: {e}")).into_inner().image
}

async fn remove(client: &mut Client, image: &str) {
    let request = RemoveImageRequest { image: spec(image) };
    client.remove_image(request).await.unwrap_or_else(|e| panic!("remove {image}: {e}"));
}

async fn list(client: &mut Client) -> Vec<Image> {
    let mut images = client.list_images(ListImagesRequest::default()).await.expect("list").into_inner().images;
    for image in &mut images {
        image.repo_tags.sort();
    }
    images.sort_by(|a, b| a.id.cmp(&b.id));
    images
}

/// Runs `scenario` straight against containerd, then through cri-imaged, on one stack seeded
/// with `seeds` (name:tag, content); the scenario asserts the behaviour and returns a transcript,
/// and the two transcripts must be equal.
async fn conformance<F, Fut>(seeds: &[(&str, &str)], scenario: F)
where
    F: Fn(Client, String) -> Fut,
    Fut: Future<Output = Vec<String>>,
{
    let Some(stack) = LocalStack::start() else { return };
    for (name, content) in seeds {
        stack.seed(name, content);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &[]).await;
    let direct =
        scenario(ImageServiceClient::new(unix_channel(&stack.containerd_socket)), stack.registry.clone()).await;
    let through = scenario(ImageServiceClient::new(unix_channel(&daemon.socket)), stack.registry.clone()).await;
    assert!(!direct.is_empty(), "the scenario recorded nothing");
    assert_eq!(direct, through, "cri-imaged answered differently from containerd");
}

#[tokio::test]
async fn pull_and_remove_by_tag() {
    conformance(&[("cri/busy:v1", "busy v1")], |mut client, registry| async move {
        let image = format!("{registry}/cri/busy:v1");
        let image_ref = pull(&mut client, &image).await;
        let found = status(&mut client, &image).await.expect("present after pull");
        assert_eq!(found.id, image_ref);
        assert!(list(&mut client).await.iter().any(|i| i.id == image_ref), "listed right after its pull");
        remove(&mut client, &image).await;
        assert_eq!(status(&mut client, &image).await, None, "gone right after its removal");
        assert!(!list(&mut client).await.iter().any(|i| i.id == image_ref), "not listed after removal");
        vec![format!("pulled {image_ref}"), format!("tags {:?}", found.repo_tags)]
    })
    .await;
}

#[tokio::test]
async fn pull_without_a_tag_lists_the_latest_tag() {
    conformance(&[("cri/plain:latest", "plain latest")], |mut client, registry| async move {
        let image = format!("{registry}/cri/plain");
        let image_ref = pull(&mut client, &image).await;
        let found = status(&mut client, &image).await.expect("present");
        assert!(found.repo_tags.contains(&format!("{image}:latest")), "{:?}", found.repo_tags);
        remove(&mut client, &image).await;
        assert_eq!(status(&mut client, &image).await, None);
        vec![format!("pulled {image_ref}"), format!("tags {:?}", found.repo_tags)]
    })
    .await;
}

#[tokio::test]
async fn pull_by_digest_lists_the_repo_digest() {
    conformance(&[("cri/pinned:v1", "pinned v1")], |mut client, registry| async move {
        let tagged = format!("{registry}/cri/pinned:v1");
        // The digest is the registry's; resolve it through a pull by tag, then start over.
        pull(&mut client, &tagged).await;
        let digest_ref = status(&mut client, &tagged).await.expect("present").repo_digests[0].clone();
        remove(&mut client, &tagged).await;

        let image_ref = pull(&mut client, &digest_ref).await;
        let found = status(&mut client, &digest_ref).await.expect("present by digest");
        assert!(found.repo_digests.contains(&digest_ref), "{:?}", found.repo_digests);
        remove(&mut client, &digest_ref).await;
        assert_eq!(status(&mut client, &digest_ref).await, None);
        vec![format!("pulled {image_ref}"), format!("digests {:?}", found.repo_digests)]
    })
    .await;
}

#[tokio::test]
async fn image_status_by_id_tag_and_digest_is_the_same_image() {
    conformance(&[("cri/same:v1", "same v1")], |mut client, registry| async move {
        let tagged = format!("{registry}/cri/same:v1");
        let image_ref = pull(&mut client, &tagged).await;
        let by_tag = status(&mut client, &tagged).await.expect("by tag");
        let by_id = status(&mut client, &image_ref).await.expect("by id");
        let by_digest = status(&mut client, &by_tag.repo_digests[0]).await.expect("by digest");
        assert_eq!(by_id, by_tag);
        assert_eq!(by_digest, by_tag);
        remove(&mut client, &image_ref).await;
        vec![format!("{by_tag:?}")]
    })
    .await;
}

#[tokio::test]
async fn three_tags_of_one_image_list_as_one_image_with_three_tags() {
    let seeds = [("cri/tri:a", "one image"), ("cri/tri:b", "one image"), ("cri/tri:c", "one image")];
    conformance(&seeds, |mut client, registry| async move {
        let tags: Vec<String> = ["a", "b", "c"].iter().map(|t| format!("{registry}/cri/tri:{t}")).collect();
        let mut ids = Vec::new();
        for tag in &tags {
            ids.push(pull(&mut client, tag).await);
        }
        assert!(ids.windows(2).all(|w| w[0] == w[1]), "one image: {ids:?}");
        let listed: Vec<Image> = list(&mut client).await.into_iter().filter(|i| i.id == ids[0]).collect();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].repo_tags, tags);
        remove(&mut client, &ids[0]).await;
        for tag in &tags {
            assert_eq!(status(&mut client, tag).await, None, "{tag} gone with the image");
        }
        vec![format!("{:?}", listed[0].repo_tags)]
    })
    .await;
}

#[tokio::test]
async fn three_different_images_list_as_three() {
    let seeds = [("cri/x:v1", "image x"), ("cri/y:v1", "image y"), ("cri/z:v1", "image z")];
    conformance(&seeds, |mut client, registry| async move {
        let mut ids = Vec::new();
        for name in ["x", "y", "z"] {
            ids.push(pull(&mut client, &format!("{registry}/cri/{name}:v1")).await);
        }
        let listed: Vec<String> =
            list(&mut client).await.into_iter().map(|i| i.id).filter(|id| ids.contains(id)).collect();
        assert_eq!(listed.len(), 3, "{listed:?}");
        for id in &ids {
            remove(&mut client, id).await;
        }
        ids.sort();
        ids
    })
    .await;
}

#[tokio::test]
async fn removing_a_missing_image_succeeds_and_five_concurrent_removals_all_succeed() {
    conformance(&[("cri/gone:v1", "gone v1")], |mut client, registry| async move {
        remove(&mut client, &format!("{registry}/cri/never-pulled:v1")).await;
        let image = format!("{registry}/cri/gone:v1");
        pull(&mut client, &image).await;
        let removals: Vec<_> = (0..5)
            .map(|_| {
                let (mut client, image) = (client.clone(), image.clone());
                tokio::spawn(async move { remove(&mut client, &image).await })
            })
            .collect();
        for removal in removals {
            removal.await.expect("every concurrent removal succeeds");
        }
        assert_eq!(status(&mut client, &image).await, None);
        vec!["removed missing: ok".into(), "five concurrent removals: ok".into()]
    })
    .await;
}
