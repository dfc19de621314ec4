//! Reading an image's signatures from its repository: the tag resolved to the digest that will
//! run, cosign's signature manifest for it (`sha256-<hex>.sig`), and each signature's payload,
//! every read bounded.

use std::{sync::Arc, time::Duration};

use super::{SignatureError, metrics::SignatureMetrics};
use crate::{
    credentials::Credential,
    policy::sigstore,
    reference::ImageReference,
    registry::{HostsConfig, RegistryClient, RegistryError, Repository},
};

/// What a verification may read.
#[derive(Debug, Clone)]
pub struct FetchLimits {
    /// The whole verification, connection to last byte.
    pub deadline: Duration,
    /// An image manifest (or index) read to resolve its tag.
    pub manifest: usize,
    /// The signature manifest.
    pub signature_manifest: usize,
    /// One signature's payload.
    pub payload: usize,
}

impl Default for FetchLimits {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(60),
            manifest: 4 << 20,
            signature_manifest: sigstore::MANIFEST_LIMIT,
            payload: sigstore::PAYLOAD_LIMIT as usize,
        }
    }
}

impl FetchLimits {
    /// The defaults, the whole verification within `pull_timeout` (`--image-pull-timeout`) too:
    /// reading signatures takes no longer than the pull it guards may.
    pub fn within(pull_timeout: Option<Duration>) -> Self {
        let limits = Self::default();
        Self { deadline: pull_timeout.map_or(limits.deadline, |timeout| timeout.min(limits.deadline)), ..limits }
    }
}

/// The digest that will run and the signatures found for it.
pub struct Found {
    pub digest: String,
    pub signatures: Vec<(sigstore::Layer, Vec<u8>)>,
}

/// Reads `reference`'s signatures (at `digest`, else at its tag's digest now), with each
/// credential in turn until one is not refused; none: anonymously.
pub async fn signatures(
    reference: &ImageReference,
    digest: Option<&str>,
    credentials: &[Arc<Credential>],
    hosts: &HostsConfig,
    limits: &FetchLimits,
    metrics: &SignatureMetrics,
) -> Result<Found, SignatureError> {
    let repository = Repository { domain: reference.domain().to_owned(), path: reference.path().to_owned() };
    if credentials.is_empty() {
        return read(&repository, reference, digest, None, hosts, limits, metrics).await;
    }
    let mut last = None;
    for credential in credentials {
        match read(&repository, reference, digest, Some(&credential.auth), hosts, limits, metrics).await {
            Err(SignatureError::Registry(refused @ RegistryError::Unauthorized { .. })) => last = Some(refused),
            Err(SignatureError::Registry(RegistryError::Status { status, .. }))
                if status == http::StatusCode::FORBIDDEN =>
            {
                last = Some(RegistryError::Unauthorized {
                    registry: repository.domain.clone(),
                    what: "the image".to_owned(),
                    reason: "it refused the pull's (403)",
                });
            }
            done => return done,
        }
    }
    Err(SignatureError::Registry(last.unwrap_or(RegistryError::Unauthorized {
        registry: repository.domain.clone(),
        what: "the image".to_owned(),
        reason: "the pull has none",
    })))
}

async fn read(
    repository: &Repository,
    reference: &ImageReference,
    digest: Option<&str>,
    auth: Option<&crate::credentials::RegistryAuth>,
    hosts: &HostsConfig,
    limits: &FetchLimits,
    metrics: &SignatureMetrics,
) -> Result<Found, SignatureError> {
    let mut client = RegistryClient::new(repository, auth, hosts);
    let digest = match digest {
        Some(digest) => digest.to_owned(),
        None => {
            let tag = reference.tag().unwrap_or("latest");
            let manifest = client.manifest(tag, limits.manifest).await?;
            manifest.ok_or_else(|| SignatureError::NoManifest(format!("{}:{tag}", reference.name())))?.digest
        }
    };
    let Some(hex) = digest.strip_prefix("sha256:") else {
        return Err(SignatureError::BadArtifact {
            digest,
            reason: "only sha256 digests are signed by cosign's tag scheme".into(),
        });
    };
    let tag = format!("sha256-{hex}.sig");
    metrics.fetched();
    let Some(manifest) = client.manifest(&tag, limits.signature_manifest).await? else {
        return Err(SignatureError::NoSignatures { digest, repository: reference.name(), tag });
    };
    let layers = sigstore::parse_artifact(&manifest.body)
        .map_err(|error| SignatureError::BadArtifact { digest: digest.clone(), reason: error.to_string() })?
        .layers;
    let mut signatures = Vec::with_capacity(layers.len());
    for layer in layers {
        if layer.size > limits.payload as u64 {
            // Not read: the verification says it was too large.
            signatures.push((layer, Vec::new()));
            continue;
        }
        let payload = client.blob(&layer.digest, limits.payload).await?;
        signatures.push((layer, payload.body.to_vec()));
    }
    Ok(Found { digest, signatures })
}
