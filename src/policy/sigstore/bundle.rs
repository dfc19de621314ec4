//! A Sigstore bundle attached to an image as an OCI 1.1 referrer, read as hostile input: cosign
//! 3's `sign` (and cosign 2.5's `attest --new-bundle-format --type https://sigstore.dev/cosign/
//! sign/v1`) writes a DSSE envelope whose payload is an in-toto statement of the image's digest.
//! The envelope's signature is over DSSE's pre-authentication encoding of that payload; its signer
//! is one of the policy's keys, or the bundle's certificate (`fulcio`), whose time Rekor's entry
//! in the bundle gives. Only then is the statement read: it must be a cosign signature (not some
//! other attestation), of the manifest verified.
//!
//! A statement's subject may name its repository; one that does not (cosign 3 names none) is
//! taken to claim the repository it is attached in, so `signedIdentity` judges it as it judges
//! cosign's legacy payload, which names the repository without a tag.

use rustls::pki_types::CertificateDer;

use super::{
    artifact::BUNDLE_MEDIA_TYPES,
    certificate,
    envelope::{
        BundleError, ENVELOPE_SIGNATURE_LIMIT, IN_TOTO_PAYLOAD_TYPE, Material, RawBundle, RawBytes,
        SIGN_PREDICATE_TYPE, SIGNATURE_BASE64_LIMIT, STATEMENT_TYPES, Statement, Subject, bounded, decode, pae,
    },
    identity, rekor,
    verdict::{Accepted, Why, certificate_name, named, short},
};
use crate::{
    policy::{SignedIdentity, SigstoreSigned, scope::shown},
    reference::ImageReference,
};

/// Judges one bundle (`blob`, already checked against its layer's digest and size) for `image`
/// at `manifest_digest`: see the module's words.
pub fn judge(
    requirement: &SigstoreSigned,
    rule: &SignedIdentity,
    image: &ImageReference,
    manifest_digest: &str,
    (layer, blob): (&str, &[u8]),
) -> Result<Accepted, Why> {
    let bundle: RawBundle = serde_json::from_slice(blob).map_err(|error| BundleError::Parse(bounded(&error)))?;
    if !BUNDLE_MEDIA_TYPES.contains(&bundle.media_type.as_str()) {
        return Err(BundleError::MediaType(shown(&bundle.media_type)).into());
    }
    if bundle.message_signature.is_some() {
        return Err(BundleError::MessageSignature.into());
    }
    let envelope = bundle.dsse_envelope.ok_or(BundleError::NoEnvelope)?;
    if envelope.payload_type != IN_TOTO_PAYLOAD_TYPE {
        return Err(BundleError::PayloadType(shown(&envelope.payload_type)).into());
    }
    let payload = decode(&envelope.payload).ok_or(BundleError::PayloadEncoding)?;
    let count = envelope.signatures.len();
    if !(1..=ENVELOPE_SIGNATURE_LIMIT).contains(&count) {
        return Err(BundleError::SignatureCount(count).into());
    }
    let material = &bundle.verification_material;
    let encoded = pae(&envelope.payload_type, &payload);
    let mut why = None;
    let mut signer = None;
    for signature in &envelope.signatures {
        if signature.sig.len() > SIGNATURE_BASE64_LIMIT {
            return Err(BundleError::SignatureEncoding.into());
        }
        let signature = decode(&signature.sig).ok_or(BundleError::SignatureEncoding)?;
        match trusted(requirement, material, &signature, &payload, &encoded) {
            Ok(name) => {
                signer = Some(name);
                break;
            }
            Err(error) => why = Some(error),
        }
    }
    // One signature at least was tried (count ≥ 1): `why` is its reason.
    let Some(key) = signer else { return Err(why.unwrap_or(Why::Bundle(BundleError::SignatureCount(0)))) };
    let statement: Statement =
        serde_json::from_slice(&payload).map_err(|error| BundleError::Statement(bounded(&error)))?;
    if !STATEMENT_TYPES.contains(&statement.statement_type.as_str()) {
        return Err(BundleError::StatementType(shown(&statement.statement_type)).into());
    }
    if statement.predicate_type != SIGN_PREDICATE_TYPE {
        return Err(BundleError::NotASignature(shown(&statement.predicate_type)).into());
    }
    let hex = manifest_digest.strip_prefix("sha256:").unwrap_or(manifest_digest);
    let of_image = |subject: &&Subject| subject.digest.get("sha256").is_some_and(|signed| signed == hex);
    let Some(subject) = statement.subject.iter().find(of_image) else {
        let first = statement.subject.first().and_then(|subject| subject.digest.get("sha256"));
        let other = first.map_or_else(|| "none".to_owned(), |hex| short(&format!("sha256:{hex}")));
        return Err(Why::OtherImage(other));
    };
    let claimed = subject.name.clone().unwrap_or_else(|| image.name());
    identity::check(rule, image, &claimed).map_err(Why::Identity)?;
    Ok(Accepted { key, layer: layer.to_owned(), identity: shown(&claimed) })
}

/// Whom the policy trusts for `signature` over `encoded` (the envelope's PAE), with Rekor's
/// entry for it where the policy names Rekor's key.
fn trusted(
    requirement: &SigstoreSigned,
    material: &Material,
    signature: &[u8],
    payload: &[u8],
    encoded: &[u8],
) -> Result<String, Why> {
    let entries = &material.tlog_entries;
    let Some(fulcio) = &requirement.fulcio else {
        let keys = &requirement.keys;
        let key = keys.iter().find(|key| key.verifies(encoded, signature)).ok_or_else(|| Why::NoKey(named(keys)))?;
        if !requirement.rekor_keys.is_empty() {
            rekor::dsse_logged_at(&requirement.rekor_keys, entries, key.spki(), signature, payload)?;
        }
        return Ok(key.fingerprint().to_owned());
    };
    let (leaf, intermediates) = certificates(material)?;
    let time = rekor::dsse_logged_at(&requirement.rekor_keys, entries, &leaf, signature, payload)?;
    let issuer = fulcio.oidc_issuer.as_deref().unwrap_or_default();
    let email = fulcio.subject_email.as_deref().unwrap_or_default();
    let key = certificate::chained_signer(&requirement.fulcio_roots, &leaf, &intermediates, time, (issuer, email))?;
    if !key.verifies(encoded, signature) {
        return Err(Why::NotByCertificate);
    }
    Ok(certificate_name(fulcio))
}

/// The bundle's leaf certificate and the intermediates after it: 0.3's `certificate`, or the
/// first of an older bundle's `x509CertificateChain`.
fn certificates(material: &Material) -> Result<(CertificateDer<'static>, Vec<CertificateDer<'static>>), Why> {
    let listed: Vec<&RawBytes> = match (&material.certificate, &material.x509_certificate_chain) {
        (Some(leaf), _) => vec![leaf],
        (None, Some(chain)) => chain.certificates.iter().collect(),
        (None, None) => return Err(Why::NoCertificate),
    };
    let mut read = listed.into_iter().map(|raw| decode(&raw.raw_bytes).map(CertificateDer::from));
    let leaf = read.next().flatten().ok_or(BundleError::CertificateEncoding)?;
    let intermediates = read.collect::<Option<Vec<_>>>().ok_or(BundleError::CertificateEncoding)?;
    Ok((leaf, intermediates))
}
