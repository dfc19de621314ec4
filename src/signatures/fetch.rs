//! Reading an image's signatures from its repository: the tag resolved to the digest that will
//! run, cosign's signature manifest for it (`sha256-<hex>.sig`, else its referrers), and each
//! signature's payload (or Sigstore bundle), every read bounded.

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
    let bad = |error: sigstore::ArtifactError| SignatureError::BadArtifact {
        digest: digest.clone(),
        reason: error.to_string(),
    };
    let layers = match client.manifest(&tag, limits.signature_manifest).await? {
        Some(manifest) => sigstore::parse_artifact(&manifest.body).map_err(bad)?.layers,
        None => match referred(&mut client, &digest, hex, limits).await? {
            Some(referred) => referred.map_err(bad)?,
            None => return Err(SignatureError::NoSignatures { digest, repository: reference.name(), tag }),
        },
    };
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

/// The signatures pushed as OCI 1.1 referrers of `digest` (cosign's `--registry-referrers-mode=
/// oci-1-1`, and Sigstore bundles): listed by the registry's referrers API (unfiltered: both
/// artifact types are wanted), or by the index at the fallback tag `sha256-<hex>` where it serves
/// none; each listed signature manifest read, bounded, their layers joined (at most
/// [`sigstore::LAYER_LIMIT`]). `None`: the image has no such referrer.
async fn referred(
    client: &mut RegistryClient<'_>,
    digest: &str,
    hex: &str,
    limits: &FetchLimits,
) -> Result<Option<Result<Vec<sigstore::Layer>, sigstore::ArtifactError>>, SignatureError> {
    let index = match client.referrers(digest, None, limits.signature_manifest).await? {
        Some(index) => index,
        None => match client.manifest(&format!("sha256-{hex}"), limits.signature_manifest).await? {
            Some(index) => index,
            None => return Ok(None),
        },
    };
    let listed = match sigstore::parse_referrers(&index.body) {
        Ok(listed) if listed.is_empty() => return Ok(None),
        Ok(listed) => listed,
        Err(error) => return Ok(Some(Err(error))),
    };
    let mut layers = Vec::new();
    for manifest_digest in listed {
        let Some(manifest) = client.manifest(&manifest_digest, limits.signature_manifest).await? else { continue };
        match sigstore::parse_artifact(&manifest.body) {
            Ok(artifact) => layers.extend(artifact.layers),
            Err(error) => return Ok(Some(Err(error))),
        }
        if layers.len() >= sigstore::LAYER_LIMIT {
            layers.truncate(sigstore::LAYER_LIMIT);
            break;
        }
    }
    Ok(Some(Ok(layers)))
}
