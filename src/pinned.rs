//! The images cri-imaged pins: the sandbox image (`--pod-infra-container-image`, else the one the
//! runtime's CRI config names), every `--pinned-image`, and pre-pulls pinned for a while. Image GC never collects them, and
//! ImageStatus and ListImages through us report them `pinned: true`, because kubelets from 1.28
//! keep only what the runtime reports pinned and containerd before 2.0 pins nothing (2.x pins
//! its sandbox image itself: then nothing changes).
//!
//! An answer is marked without being decoded and encoded again: `pinned = true` is appended to
//! the image's message (a later value of a field wins, in every protobuf reader), so every other
//! byte the runtime sent, fields we do not know included, reaches the caller as it was.

use std::sync::{Arc, PoisonError, RwLock};

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{WireType, decode_key, decode_varint, encode_key, encode_varint};

use crate::reference;

/// Field 1 of ImageStatusResponse (`image`) and of ListImagesResponse (`images`).
const IMAGE_FIELD: u32 = 1;
/// `Image.pinned = true`: field 8, varint, 1.
const PINNED_TRUE: [u8; 2] = [8 << 3, 1];

/// Why an image is pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// The sandbox image, configured or as the runtime names it.
    SandboxImage,
    /// A `--pinned-image`.
    Configured,
    /// A pre-pull's, for a while after it is done.
    PrePull,
}

/// The pinned images: configured, and the sandbox image the runtime names.
#[derive(Debug, Default)]
pub struct PinnedImages {
    state: RwLock<Pins>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Pins {
    /// `--pod-infra-container-image` and `--pinned-image`, as configured.
    configured: Vec<String>,
    /// Whether the sandbox image is configured (else the runtime's is learned).
    sandbox_configured: bool,
    /// The sandbox image the runtime's CRI config names.
    learned: Option<String>,
    /// Images of pre-pulls pinned now.
    pre_pulled: Vec<String>,
    /// Every name an image carrying one of the above has in CRI answers: `name:tag`,
    /// `name@digest` (normalised, as the runtime reports them) and image ids.
    matched: Arc<[String]>,
}

impl Pins {
    fn with_matched(mut self) -> Self {
        let all = self.configured.iter().chain(&self.learned).chain(&self.pre_pulled);
        self.matched = all.flat_map(|image| reported_names(image)).collect();
        self
    }
}

/// The names under which the runtime reports `image`: an id as it is; a reference normalised,
/// as `name:tag` and `name@digest`. Nothing for what does not parse.
fn reported_names(image: &str) -> Vec<String> {
    if image.starts_with("sha256:") {
        return vec![image.to_owned()];
    }
    let Ok((reference, _)) = reference::parse_with_default_tag(image) else {
        return Vec::new();
    };
    let name = reference.name();
    let tagged = reference.tag().map(|tag| format!("{name}:{tag}"));
    let digested = reference.digest().map(|digest| format!("{name}@{digest}"));
    tagged.into_iter().chain(digested).collect()
}

impl PinnedImages {
    /// Pins `sandbox_image` (none: the runtime's, once learned) and `pinned`.
    pub fn new(sandbox_image: Option<&str>, pinned: &[String]) -> Self {
        let images = Self::default();
        images.configure(sandbox_image, pinned);
        images
    }

    /// Sets the configured images (at start and on reload); true when the pinned set changed.
    pub fn configure(&self, sandbox_image: Option<&str>, pinned: &[String]) -> bool {
        self.update(|pins| {
            pins.configured = sandbox_image.into_iter().map(str::to_owned).chain(pinned.iter().cloned()).collect();
            pins.sandbox_configured = sandbox_image.is_some();
        })
    }

    /// Whether the sandbox image is to be learned from the runtime (none is configured).
    pub fn learns_sandbox_image(&self) -> bool {
        !self.read().sandbox_configured
    }

    /// Takes the sandbox image the runtime names; true when the pinned set changed.
    pub fn learned_sandbox_image(&self, image: Option<String>) -> bool {
        self.update(|pins| pins.learned = image.filter(|_| !pins.sandbox_configured))
    }

    /// Pins the images of the pre-pulls pinned now (and no others); true when the pinned set
    /// changed.
    pub fn pre_pulled(&self, images: Vec<String>) -> bool {
        self.update(|pins| pins.pre_pulled = images)
    }

    /// Every pinned image, as configured, learned or pre-pulled.
    pub fn images(&self) -> Vec<String> {
        let pins = self.read();
        pins.configured.iter().chain(&pins.learned).chain(&pins.pre_pulled).cloned().collect()
    }

    /// Every pinned image, as [`PinnedImages::images`], with why it is pinned.
    pub fn images_and_why(&self) -> Vec<(String, Pin)> {
        let pins = self.read();
        let configured = pins.configured.iter().enumerate().map(|(at, image)| match at {
            0 if pins.sandbox_configured => (image.clone(), Pin::SandboxImage),
            _ => (image.clone(), Pin::Configured),
        });
        let learned = pins.learned.iter().map(|image| (image.clone(), Pin::SandboxImage));
        let pre_pulled = pins.pre_pulled.iter().map(|image| (image.clone(), Pin::PrePull));
        configured.chain(learned).chain(pre_pulled).collect()
    }

    /// An ImageStatusResponse or ListImagesResponse `answer` with every pinned image that the
    /// runtime did not mark pinned marked so; `answer` itself when there is none (or it does not
    /// read as one).
    pub fn mark(&self, answer: Bytes) -> Bytes {
        let matched = self.read().matched.clone();
        if matched.iter().all(|name| memchr::memmem::find(&answer, name.as_bytes()).is_none()) {
            return answer;
        }
        mark_images(&answer, &matched).unwrap_or(answer)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Pins> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, change: impl FnOnce(&mut Pins)) -> bool {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        let mut next = state.clone();
        change(&mut next);
        let next = next.with_matched();
        let changed = next.matched != state.matched;
        *state = next;
        changed
    }
}

/// Just what decides whether an Image is to be marked; prost skips every other field.
#[derive(Clone, PartialEq, prost::Message)]
struct ImageNames {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(string, repeated, tag = "2")]
    repo_tags: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    repo_digests: Vec<String>,
    #[prost(bool, tag = "8")]
    pinned: bool,
}

/// `answer` with `pinned = true` appended to each image field whose image carries one of
/// `matched` and is not pinned; `None` when nothing changes or `answer` does not read.
fn mark_images(answer: &Bytes, matched: &[String]) -> Option<Bytes> {
    let mut marked: Option<BytesMut> = None;
    let (mut rest, mut copied) = (&answer[..], 0);
    while !rest.is_empty() {
        let field_start = answer.len() - rest.len();
        let (field, wire_type) = decode_key(&mut rest).ok()?;
        // Both answers hold only length-delimited fields (images, the info map).
        if wire_type != WireType::LengthDelimited {
            return None;
        }
        let length = usize::try_from(decode_varint(&mut rest).ok()?).ok()?;
        let value = rest.get(..length)?;
        rest = &rest[length..];
        if field != IMAGE_FIELD || !to_mark(value, matched) {
            continue;
        }
        let out = marked.get_or_insert_with(|| BytesMut::with_capacity(answer.len() + 16));
        out.put_slice(&answer[copied..field_start]);
        encode_key(IMAGE_FIELD, WireType::LengthDelimited, out);
        encode_varint((length + PINNED_TRUE.len()) as u64, out);
        out.put_slice(value);
        out.put_slice(&PINNED_TRUE);
        copied = answer.len() - rest.len();
    }
    let mut out = marked?;
    out.put_slice(&answer[copied..]);
    Some(out.freeze())
}

fn to_mark(image: &[u8], matched: &[String]) -> bool {
    let Ok(image) = <ImageNames as prost::Message>::decode(image) else {
        return false;
    };
    let names = || std::iter::once(&image.id).chain(&image.repo_tags).chain(&image.repo_digests);
    !image.pinned && names().any(|name| matched.contains(name))
}

#[cfg(test)]
mod tests;
