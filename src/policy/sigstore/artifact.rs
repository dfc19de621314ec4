//! cosign's signature artifact as a registry serves it, read as hostile input: the image manifest
//! at the tag `sha256-<hex>.sig` (or an OCI 1.1 referrer of the image, listed by an index), each
//! of whose layers of cosign's simple-signing type is one signature (the layer's blob is the
//! signed payload; its annotations carry the signature and, for keyless signing, the
//! certificate, its chain and Rekor's bundle). A Sigstore bundle attached as a referrer (cosign 3's
//! `sign`, `attest --new-bundle-format`) is a layer too: its blob holds the signature, its signer
//! and Rekor's entry (read by `bundle`). Every size is bounded.

use serde::{
    Deserialize,
    de::{SeqAccess, Visitor},
};

use crate::policy::scope::shown;

/// The largest signature manifest read: cosign's are a few KiB (a certificate and a chain per
/// layer at most).
pub const MANIFEST_LIMIT: usize = 4 * 1024 * 1024;

/// The most signature layers considered; those beyond are counted, not read.
pub const LAYER_LIMIT: usize = 32;

/// The largest payload (a layer's blob) read. cosign's are about 250 bytes plus the signer's
/// `-a key=value` annotations, which CI pipelines fill with repositories, commits and run URLs:
/// 64 KiB leaves them room, and bounds one image's signatures at 2 MiB ([`LAYER_LIMIT`] of them;
/// containers/image allows 4 MiB for each).
pub const PAYLOAD_LIMIT: u64 = 64 * 1024;

/// The artifact type of cosign's signature manifest pushed as an OCI 1.1 referrer
/// (`cosign sign --registry-referrers-mode=oci-1-1`): its config's media type.
pub const REFERRER_ARTIFACT_TYPE: &str = "application/vnd.dev.cosign.artifact.sig.v1+json";

/// The most signature manifests read from an image's referrers.
pub const REFERRER_LIMIT: usize = 8;

/// The media type of a Sigstore bundle 0.3, as a referrer's artifact type and as its layer's.
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";

/// The media types a Sigstore bundle is known by: 0.3's, and the older form of 0.1 to 0.3.
pub const BUNDLE_MEDIA_TYPES: [&str; 4] = [
    BUNDLE_MEDIA_TYPE,
    "application/vnd.dev.sigstore.bundle+json;version=0.1",
    "application/vnd.dev.sigstore.bundle+json;version=0.2",
    "application/vnd.dev.sigstore.bundle+json;version=0.3",
];

/// The artifact type an index gives a referrer with an empty config and no artifact type of its
/// own; cosign 2.5 lists its bundles so at the fallback tag. Such referrers are read after those
/// of a known type, within [`REFERRER_LIMIT`].
const EMPTY_ARTIFACT_TYPE: &str = "application/vnd.oci.empty.v1+json";

/// The media type of a layer that is a cosign signature.
pub const SIGNATURE_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";

/// Why a signature manifest was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArtifactError {
    #[error("the signature manifest is {0} bytes, more than {MANIFEST_LIMIT}")]
    TooLarge(usize),
    /// serde's words, escaped and bounded: they may quote what the registry sent.
    #[error("the signature manifest is not an image manifest: {0}")]
    Parse(String),
    #[error("the signature manifest's schemaVersion is {0}, not 2")]
    SchemaVersion(u64),
    #[error("the signature manifest is a {0}, not an image manifest")]
    MediaType(String),
    #[error("a signature layer's digest {0} is not sha256:<64 hex digits>")]
    Digest(String),
}

/// What a signature layer's blob is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// cosign's simple-signing payload; its signature is in the layer's annotations.
    Cosign,
    /// A Sigstore bundle: the signature, its signer and Rekor's entry are all in the blob.
    Bundle,
}

/// One signature layer: where its payload is, and the annotations verification reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub kind: LayerKind,
    /// `sha256:<64 lowercase hex digits>`, checked: the payload's digest, and safe in a blob URL.
    pub digest: String,
    /// The payload's size as the manifest states it; one over [`PAYLOAD_LIMIT`] need not be
    /// fetched (pass it with an empty payload: verification refuses it for its size).
    pub size: u64,
    /// `dev.cosignproject.cosign/signature`: the signature, base64.
    pub signature: Option<String>,
    /// `dev.sigstore.cosign/certificate`: the signer's certificate (keyless signing), PEM.
    pub certificate: Option<String>,
    /// `dev.sigstore.cosign/chain`: the certificate's chain, PEM.
    pub chain: Option<String>,
    /// `dev.sigstore.cosign/bundle`: Rekor's signed entry timestamp and entry, JSON.
    pub bundle: Option<String>,
}

/// A signature manifest, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// The first [`LAYER_LIMIT`] signature layers, in the manifest's order.
    pub layers: Vec<Layer>,
    /// Signature layers beyond those, not considered.
    pub not_considered: usize,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawManifest {
    schema_version: u64,
    media_type: Option<String>,
    layers: Layers,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawLayer {
    media_type: String,
    digest: String,
    size: u64,
    annotations: Option<RawAnnotations>,
}

/// The annotations read; others are passed over unread.
#[derive(Deserialize)]
struct RawAnnotations {
    #[serde(rename = "dev.cosignproject.cosign/signature")]
    signature: Option<String>,
    #[serde(rename = "dev.sigstore.cosign/certificate")]
    certificate: Option<String>,
    #[serde(rename = "dev.sigstore.cosign/chain")]
    chain: Option<String>,
    #[serde(rename = "dev.sigstore.cosign/bundle")]
    bundle: Option<String>,
}

/// The signature layers, at most [`LAYER_LIMIT`] kept however many the list has: one layer is
/// held at a time, so a manifest of a million small layers costs no more than one of 32.
struct Layers {
    kept: Vec<RawLayer>,
    beyond: usize,
}

impl<'de> Deserialize<'de> for Layers {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bounded;
        impl<'de> Visitor<'de> for Bounded {
            type Value = Layers;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a list of layers")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Layers, A::Error> {
                let mut layers = Layers { kept: Vec::new(), beyond: 0 };
                while let Some(layer) = seq.next_element::<RawLayer>()? {
                    if kind(&layer.media_type).is_none() {
                        continue;
                    }
                    if layers.kept.len() < LAYER_LIMIT {
                        layers.kept.push(layer);
                    } else {
                        layers.beyond += 1;
                    }
                }
                Ok(layers)
            }
        }
        deserializer.deserialize_seq(Bounded)
    }
}

/// The media types a signature manifest may have: OCI's, or Docker's schema 2 (a registry may
/// convert).
const MANIFEST_TYPES: [&str; 2] =
    ["application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"];

/// Reads a signature manifest's bytes. Layers of other media types are passed over (cosign puts
/// only signatures there; other attachments are not signatures).
pub fn parse_artifact(manifest: &[u8]) -> Result<Artifact, ArtifactError> {
    if manifest.len() > MANIFEST_LIMIT {
        return Err(ArtifactError::TooLarge(manifest.len()));
    }
    let raw: RawManifest = serde_json::from_slice(manifest).map_err(|error| {
        ArtifactError::Parse(crate::messages::echo(&error.to_string().escape_debug().to_string()).into_owned())
    })?;
    if raw.schema_version != 2 {
        return Err(ArtifactError::SchemaVersion(raw.schema_version));
    }
    if let Some(media_type) = raw.media_type.filter(|media_type| !MANIFEST_TYPES.contains(&media_type.as_str())) {
        return Err(ArtifactError::MediaType(shown(&media_type)));
    }
    let layers = raw.layers.kept.into_iter().map(layer).collect::<Result<_, _>>()?;
    Ok(Artifact { layers, not_considered: raw.layers.beyond })
}

/// A signature layer's kind by its media type; `None`: not a signature.
fn kind(media_type: &str) -> Option<LayerKind> {
    if media_type == SIGNATURE_MEDIA_TYPE {
        Some(LayerKind::Cosign)
    } else {
        BUNDLE_MEDIA_TYPES.contains(&media_type).then_some(LayerKind::Bundle)
    }
}

fn layer(raw: RawLayer) -> Result<Layer, ArtifactError> {
    if !is_sha256(&raw.digest) {
        return Err(ArtifactError::Digest(shown(&raw.digest)));
    }
    let kind = kind(&raw.media_type).unwrap_or(LayerKind::Cosign);
    let annotations =
        raw.annotations.unwrap_or(RawAnnotations { signature: None, certificate: None, chain: None, bundle: None });
    Ok(Layer {
        kind,
        digest: raw.digest,
        size: raw.size,
        signature: annotations.signature,
        certificate: annotations.certificate,
        chain: annotations.chain,
        bundle: annotations.bundle,
    })
}

#[derive(Deserialize)]
struct RawIndex {
    #[serde(rename = "schemaVersion")]
    schema_version: u64,
    manifests: Vec<RawDescriptor>,
}

#[derive(Deserialize)]
struct RawDescriptor {
    digest: String,
    #[serde(rename = "artifactType")]
    artifact_type: Option<String>,
}

/// The digests of the signature manifests among an image's referrers (the referrers API's
/// answer, or the index at its fallback tag `sha256-<hex>`): cosign's ([`REFERRER_ARTIFACT_TYPE`])
/// and Sigstore bundles ([`BUNDLE_MEDIA_TYPES`]), then those of an empty artifact type, the first
/// [`REFERRER_LIMIT`], each a checked SHA-256 (safe in a manifest URL).
pub fn parse_referrers(index: &[u8]) -> Result<Vec<String>, ArtifactError> {
    if index.len() > MANIFEST_LIMIT {
        return Err(ArtifactError::TooLarge(index.len()));
    }
    let raw: RawIndex = serde_json::from_slice(index).map_err(|error| {
        ArtifactError::Parse(crate::messages::echo(&error.to_string().escape_debug().to_string()).into_owned())
    })?;
    if raw.schema_version != 2 {
        return Err(ArtifactError::SchemaVersion(raw.schema_version));
    }
    let listed = raw.manifests.iter().filter(|referrer| is_sha256(&referrer.digest));
    let of = |wanted: fn(&str) -> bool| {
        listed.clone().filter(move |referrer| referrer.artifact_type.as_deref().is_some_and(wanted))
    };
    let known =
        of(|artifact_type| artifact_type == REFERRER_ARTIFACT_TYPE || BUNDLE_MEDIA_TYPES.contains(&artifact_type));
    let empty = of(|artifact_type| artifact_type == EMPTY_ARTIFACT_TYPE);
    Ok(known.chain(empty).take(REFERRER_LIMIT).map(|referrer| referrer.digest.clone()).collect())
}

/// `sha256:` and 64 lowercase hex digits, as go-digest validates a SHA-256 digest.
pub fn is_sha256(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
    })
}
