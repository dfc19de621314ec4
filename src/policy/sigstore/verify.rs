//! The decision on an image's signatures under one `sigstoreSigned` requirement, pure: one
//! signature is enough, if it verifies under one of the requirement's keys, is over the payload
//! the layer names, and that payload claims the manifest's digest and an identity the policy's
//! `signedIdentity` accepts. Otherwise every signature's reason, in words for an event.

use super::{
    artifact::{LAYER_LIMIT, Layer, LayerKind, PAYLOAD_LIMIT, is_sha256},
    bundle, certificate, identity, parse_payload, rekor,
    verdict::{Accepted, Refused, Rejected, SIGNATURE_BASE64_LIMIT, Why, certificate_name, named, short},
};
use crate::{
    policy::{Fulcio, SignedIdentity, SigstoreSigned, scope::shown},
    reference::ImageReference,
};

/// Judges `image` (as the pod names it, normalised, with the default tag applied: the identity
/// `signedIdentity` compares), whose manifest has `manifest_digest` (`sha256:…`, computed by the
/// caller over the bytes the pull will use), by its `signatures` (each layer of
/// [`super::parse_artifact`]'s with its payload, the layer's blob) under `requirement`. At most
/// [`LAYER_LIMIT`] are read.
pub fn verify(
    requirement: &SigstoreSigned,
    image: &ImageReference,
    manifest_digest: &str,
    signatures: &[(Layer, Vec<u8>)],
) -> Result<Accepted, Rejected> {
    // What the policy's load guarantees, checked again: a requirement whose keys or CA were never
    // loaded refuses everything rather than skip what it names.
    let names_rekor = [
        requirement.rekor_public_key_path.is_some(),
        requirement.rekor_public_key_paths.is_some(),
        requirement.rekor_public_key_data.is_some(),
        requirement.rekor_public_key_datas.is_some(),
    ]
    .contains(&true);
    if names_rekor && requirement.rekor_keys.is_empty() {
        return Err(Rejected::Unsupported("the requirement has no Rekor key loaded"));
    }
    if requirement.fulcio.is_some() {
        if requirement.fulcio_roots.is_empty() || requirement.rekor_keys.is_empty() {
            return Err(Rejected::Unsupported("the requirement has no fulcio CA or Rekor key loaded"));
        }
    } else if requirement.keys.is_empty() {
        return Err(Rejected::Unsupported("the requirement has no public key loaded"));
    }
    if let Some(named) = image.digest().filter(|named| *named != manifest_digest) {
        return Err(Rejected::ImageDigest { named: shown(named), manifest: shown(manifest_digest) });
    }
    if signatures.is_empty() {
        return Err(Rejected::NoSignature);
    }
    let rule = requirement.signed_identity.clone().unwrap_or(SignedIdentity::MatchRepoDigestOrExact {});
    let mut refused = Vec::new();
    for (layer, payload) in signatures.iter().take(LAYER_LIMIT) {
        match one(requirement, &rule, image, manifest_digest, layer, payload) {
            Ok(accepted) => return Ok(accepted),
            Err(why) => refused.push(Refused { layer: short(&layer.digest), why }),
        }
    }
    Err(Rejected::NoneVerified(refused))
}

/// One signature, in containers/image's order: the payload is the layer's, the signer is
/// trusted (a policy's key, or a certificate Rekor logged and the policy's CA issued to its
/// identity), the signature over the payload verifies, and only then is the payload read and
/// its claims checked.
fn one(
    requirement: &SigstoreSigned,
    rule: &SignedIdentity,
    image: &ImageReference,
    manifest_digest: &str,
    layer: &Layer,
    payload: &[u8],
) -> Result<Accepted, Why> {
    if layer.size > PAYLOAD_LIMIT || payload.len() as u64 > PAYLOAD_LIMIT {
        return Err(Why::PayloadTooLarge(layer.size.max(payload.len() as u64)));
    }
    if payload.len() as u64 != layer.size {
        return Err(Why::PayloadSize { stated: layer.size, read: payload.len() });
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, payload);
    if !is_sha256(&layer.digest) || layer.digest["sha256:".len()..] != hex(digest.as_ref()) {
        return Err(Why::PayloadDigest);
    }
    if layer.kind == LayerKind::Bundle {
        return bundle::judge(requirement, rule, image, manifest_digest, (&layer.digest, payload));
    }
    let encoded = layer.signature.as_deref().ok_or(Why::NoSignature)?;
    if encoded.len() > SIGNATURE_BASE64_LIMIT {
        return Err(Why::SignatureEncoding);
    }
    let signature = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, encoded)
        .map_err(|_| Why::SignatureEncoding)?;
    let key = match &requirement.fulcio {
        Some(fulcio) => by_certificate(requirement, fulcio, layer, &signature, payload)?,
        None => {
            let keys = &requirement.keys;
            let key =
                keys.iter().find(|key| key.verifies(payload, &signature)).ok_or_else(|| Why::NoKey(named(keys)))?;
            if !requirement.rekor_keys.is_empty() {
                rekor::logged_at(&requirement.rekor_keys, layer.bundle.as_deref(), key.spki(), &signature, payload)?;
            }
            key.fingerprint().to_owned()
        }
    };
    let claims = parse_payload(payload)?;
    if claims.manifest_digest != manifest_digest {
        return Err(Why::OtherImage(short(&claims.manifest_digest)));
    }
    identity::check(rule, image, &claims.docker_reference).map_err(Why::Identity)?;
    Ok(Accepted { key, layer: layer.digest.clone(), identity: shown(&claims.docker_reference) })
}

/// A keyless signature: Rekor logged it (its time), the certificate was the policy's CA's for the
/// policy's identity then, and its key made the signature. Whom the certificate names.
fn by_certificate(
    requirement: &SigstoreSigned,
    fulcio: &Fulcio,
    layer: &Layer,
    signature: &[u8],
    payload: &[u8],
) -> Result<String, Why> {
    let certificate = layer.certificate.as_deref().ok_or(Why::NoCertificate)?;
    let signer = rekor::first_pem_der(certificate.as_bytes()).ok_or(Why::NoCertificate)?;
    let time = rekor::logged_at(&requirement.rekor_keys, layer.bundle.as_deref(), &signer, signature, payload)?;
    let issuer = fulcio.oidc_issuer.as_deref().unwrap_or_default();
    let email = fulcio.subject_email.as_deref().unwrap_or_default();
    let chain = layer.chain.as_deref();
    let key = certificate::signer(&requirement.fulcio_roots, certificate, chain, time, (issuer, email))?;
    if !key.verifies(payload, signature) {
        return Err(Why::NotByCertificate);
    }
    Ok(certificate_name(fulcio))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
