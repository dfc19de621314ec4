//! `signedIdentity`: whether the name a signature claims (`docker-reference`) is one the policy
//! accepts for the image, with containers/image's semantics (`policy_reference_match.go`). Names
//! are normalised as Docker does (`busybox` is `docker.io/library/busybox`) and compared as Go's
//! `reference.String()` prints them: `name[:tag][@digest]`.
//!
//! cosign writes the repository alone, without a tag: only `matchRepository`, `exactRepository`
//! and a `remapIdentity` to them accept its signatures, as containers-policy.json(5) says. The
//! default, `matchRepoDigestOrExact`, refuses them, and the reason says so.

use crate::{
    policy::{SignedIdentity, scope::shown},
    reference::ImageReference,
};

/// Why a signature's identity is not accepted: a sentence for a person.
pub type Mismatch = String;

/// Whether `signed` (a payload's `docker-reference`) is accepted for `image` under `rule`.
pub fn check(rule: &SignedIdentity, image: &ImageReference, signed: &str) -> Result<(), Mismatch> {
    let signature = ImageReference::parse_normalized(signed)
        .map_err(|error| format!("signed for {}, which is no image reference ({error})", shown(signed)))?;
    match rule {
        SignedIdentity::MatchExact {} => exact(image, &signature, "the image"),
        SignedIdentity::MatchRepoDigestOrExact {} => repo_digest_or_exact(image, &signature),
        SignedIdentity::MatchRepository {} => same_repository(&image.name(), &signature),
        SignedIdentity::ExactReference { docker_reference } => {
            let intended = policy_reference(docker_reference, "dockerReference")?;
            exact(&intended, &signature, "the policy's dockerReference")
        }
        SignedIdentity::ExactRepository { docker_repository } => {
            let intended = policy_reference(docker_repository, "dockerRepository")?;
            same_repository(&intended.name(), &signature)
        }
        SignedIdentity::RemapIdentity { prefix, signed_prefix } => {
            let remapped = remap(image, prefix, signed_prefix)?;
            repo_digest_or_exact(&remapped, &signature)
        }
    }
}

fn is_name_only(reference: &ImageReference) -> bool {
    reference.tag().is_none() && reference.digest().is_none()
}

fn policy_reference(value: &str, field: &str) -> Result<ImageReference, Mismatch> {
    ImageReference::parse_normalized(value)
        .map_err(|error| format!("the policy's {field} {} is no image reference ({error})", shown(value)))
}

/// The same name, tag and digest; neither may be a bare repository.
fn exact(intended: &ImageReference, signature: &ImageReference, what: &str) -> Result<(), Mismatch> {
    if is_name_only(signature) {
        return Err(repository_only(signature));
    }
    if is_name_only(intended) {
        return Err(format!("{what} {} names no tag or digest to match exactly", shown(&intended.to_string())));
    }
    if signature.to_string() == intended.to_string() {
        Ok(())
    } else {
        Err(format!("signed for {}, not {}", shown(&signature.to_string()), shown(&intended.to_string())))
    }
}

/// An image by tag: exactly its reference; by digest: its repository (the digest itself is the
/// payload's, checked apart).
fn repo_digest_or_exact(intended: &ImageReference, signature: &ImageReference) -> Result<(), Mismatch> {
    if is_name_only(signature) {
        return Err(repository_only(signature));
    }
    match (intended.tag(), intended.digest()) {
        (Some(_), _) => exact(intended, signature, "the image"),
        (None, Some(_)) => same_repository(&intended.name(), signature),
        (None, None) => Err(format!("the image {} names no tag or digest", shown(&intended.to_string()))),
    }
}

fn same_repository(intended: &str, signature: &ImageReference) -> Result<(), Mismatch> {
    if signature.name() == intended {
        Ok(())
    } else {
        Err(format!("signed for repository {}, not {}", shown(&signature.name()), shown(intended)))
    }
}

fn repository_only(signature: &ImageReference) -> Mismatch {
    format!(
        "signed for the repository {} without a tag, as cosign signs: only a signedIdentity of matchRepository or exactRepository accepts that",
        shown(&signature.name())
    )
}

/// The image's reference with `prefix` replaced by `signed_prefix`, when its name is `prefix`
/// or under it (`prefix/…`); unchanged otherwise. The result must be a full reference as written
/// (Go's `reference.ParseNamed`).
fn remap(image: &ImageReference, prefix: &str, signed_prefix: &str) -> Result<ImageReference, Mismatch> {
    let name = image.name();
    let matches = name == prefix || name.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/'));
    if !matches {
        return Ok(image.clone());
    }
    let written = image.to_string().replacen(prefix, signed_prefix, 1);
    match ImageReference::parse_normalized(&written) {
        Ok(remapped) if remapped.to_string() == written => Ok(remapped),
        _ => Err(format!("the image remapped to {} is no full image reference", shown(&written))),
    }
}
