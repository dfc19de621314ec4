//! Reading an image's signatures from its repository: the tag resolved to the digest that will
//! run, cosign's signature manifest for it (`sha256-<hex>.sig`), its referrers where those are
//! absent or not enough, and each signature's payload (or Sigstore bundle), every read bounded.

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

/// Whether the signatures found for a digest are enough (they meet what the verification asks).
pub type Enough<'a> = dyn Fn(&str, &[(sigstore::Layer, Vec<u8>)]) -> bool + Send + Sync + 'a;

/// What a read of signatures goes by.
pub struct Reading<'a> {
    pub hosts: &'a HostsConfig,
    pub limits: &'a FetchLimits,
    pub metrics: &'a SignatureMetrics,
    /// The tag's signatures, when they are enough, are all that is read; otherwise the image's
    /// referrers are read too (an image signed both ways, by a cosign before 3 and by cosign 3,
    /// or by two signers).
    pub enough: &'a Enough<'a>,
}

/// Reads `reference`'s signatures (at `digest`, else at its tag's digest now), with each
/// credential in turn until one is not refused; none: anonymously.
pub async fn signatures(
    reference: &ImageReference,
    digest: Option<&str>,
    credentials: &[Arc<Credential>],
    reading: &Reading<'_>,
) -> Result<Found, SignatureError> {
    let repository = Repository { domain: reference.domain().to_owned(), path: reference.path().to_owned() };
    if credentials.is_empty() {
        return read(&repository, reference, digest, None, reading).await;
    }
    let mut last = None;
    for credential in credentials {
        match read(&repository, reference, digest, Some(&credential.auth), reading).await {
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
    reading: &Reading<'_>,
) -> Result<Found, SignatureError> {
    let limits = reading.limits;
    let mut client = RegistryClient::new(repository, auth, reading.hosts);
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
    reading.metrics.fetched();
    let bad = |error: sigstore::ArtifactError| SignatureError::BadArtifact {
        digest: digest.clone(),
        reason: error.to_string(),
    };
    let tagged = match client.manifest(&tag, limits.signature_manifest).await? {
        Some(manifest) => {
            let layers = sigstore::parse_artifact(&manifest.body).map_err(bad)?.layers;
            Some(payloads(&mut client, layers, limits).await?)
        }
        None => None,
    };
    let tagged = match tagged {
        Some(tagged) if (reading.enough)(&digest, &tagged) => return Ok(Found { digest, signatures: tagged }),
        tagged => tagged,
    };
    let referred = match referred(&mut client, &digest, hex, limits).await? {
        Some(referred) => Some(payloads(&mut client, referred.map_err(bad)?, limits).await?),
        None => None,
    };
    let signatures = match (tagged, referred) {
        (None, None) => return Err(SignatureError::NoSignatures { digest, repository: reference.name(), tag }),
        (Some(found), None) | (None, Some(found)) => found,
        (Some(_), Some(referred)) if (reading.enough)(&digest, &referred) => referred,
        // Neither is enough: both, for every signature's reason (the first of them are judged).
        (Some(mut tagged), Some(referred)) => {
            tagged.extend(referred);
            tagged
        }
    };
    Ok(Found { digest, signatures })
}

/// Each layer with its payload (its blob), read bounded; one stated too large is not read (the
/// verification says it was too large).
async fn payloads(
    client: &mut RegistryClient<'_>,
    layers: Vec<sigstore::Layer>,
    limits: &FetchLimits,
) -> Result<Vec<(sigstore::Layer, Vec<u8>)>, SignatureError> {
    let mut signatures = Vec::with_capacity(layers.len());
    for layer in layers {
        if layer.size > limits.payload as u64 {
            signatures.push((layer, Vec::new()));
            continue;
        }
        let payload = client.blob(&layer.digest, limits.payload).await?;
        signatures.push((layer, payload.body.to_vec()));
    }
    Ok(signatures)
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
