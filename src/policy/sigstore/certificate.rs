//! A keyless signer's certificate (`fulcio`), read as hostile input: the chain to the policy's CA
//! is checked by rustls-webpki (at the time Rekor logged the signature, for code signing), the
//! OIDC issuer and e-mail Fulcio records are read from the leaf by our own DER reader, and the
//! leaf's key is what the payload's signature must verify under. containers/image's semantics:
//! the annotation's chain gives intermediates (its last certificate, a root, is never trusted:
//! only the policy's CA is), the issuer must equal `oidcIssuer`, and `subjectEmail` must be one of
//! the leaf's e-mail SANs.

use rustls::pki_types::{CertificateDer, UnixTime, pem::PemObject};
use webpki::{EndEntityCert, KeyUsage};

use super::{
    PublicKey,
    der::{self, BOOLEAN, Der, DerError, OCTET_STRING, OID, SEQUENCE, UTF8_STRING},
};
use crate::policy::scope::shown;

/// The most certificates a chain annotation may carry (Fulcio's is an intermediate and a root).
pub const CHAIN_LIMIT: usize = 8;

/// id-kp-codeSigning, 1.3.6.1.5.5.7.3.3: the only use a Fulcio certificate is good for.
const CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];
/// Fulcio's OIDC issuer, 1.3.6.1.4.1.57264.1.1: the issuer's bytes as they are (deprecated).
const ISSUER_V1: &[u8] = &[0x2b, 0x06, 0x01, 0x04, 0x01, 0x83, 0xbf, 0x30, 0x01, 0x01];
/// Fulcio's OIDC issuer, 1.3.6.1.4.1.57264.1.8: a DER UTF8String.
const ISSUER_V2: &[u8] = &[0x2b, 0x06, 0x01, 0x04, 0x01, 0x83, 0xbf, 0x30, 0x01, 0x08];
/// subjectAltName, 2.5.29.17.
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];
/// A GeneralName's rfc822Name: `[1] IMPLICIT IA5String`.
const RFC822_NAME: u8 = 0x81;
/// TBSCertificate's `[0] EXPLICIT Version` and `[3] EXPLICIT Extensions`.
const VERSION: u8 = 0xa0;
const EXTENSIONS: u8 = 0xa3;

/// Why a certificate does not vouch for a signature; in words for an event, quoting nothing
/// unbounded from the registry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertificateError {
    #[error("the certificate annotation holds {0} certificates, not one")]
    LeafCount(usize),
    #[error("the chain annotation holds more than {CHAIN_LIMIT} certificates")]
    ChainLength,
    #[error("the certificate is not X.509 DER: {0}")]
    Der(#[from] DerError),
    #[error("the certificate does not chain to the policy's fulcio CA for code signing at {time}: {error}")]
    Chain { time: u64, error: String },
    #[error("the certificate has no Fulcio OIDC issuer extension")]
    NoIssuer,
    #[error("the certificate names its OIDC issuer twice, differently")]
    IssuerTwice,
    #[error("the certificate's OIDC issuer is {0}, not the policy's")]
    OtherIssuer(String),
    #[error("the certificate's e-mail addresses ({0}) do not include the policy's subjectEmail")]
    OtherEmail(String),
    #[error("the certificate's key: {0}")]
    Key(#[from] super::KeyError),
}

/// What a leaf certificate says, read from its DER (after its chain was checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    pub key: PublicKey,
    pub issuer: Option<String>,
    pub emails: Vec<String>,
}

/// The certificates in PEM text, in order; blocks of other types are passed over.
pub fn pem_certificates(pem: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).filter_map(Result::ok).collect()
}

/// The policy's CA certificates, each usable as a trust anchor; why not otherwise.
pub fn trust_anchors(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let roots: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem).filter_map(Result::ok).collect();
    if roots.is_empty() {
        return Err("no PEM CERTIFICATE block".into());
    }
    for (at, root) in roots.iter().enumerate() {
        webpki::anchor_from_trusted_cert(root).map_err(|error| format!("certificate {at} is not a CA: {error:?}"))?;
    }
    Ok(roots)
}

/// The signer's key, if `certificate` (the annotation's PEM, one certificate) chains through
/// `chain`'s intermediates to one of `roots` at `time` (seconds since the epoch), is for code
/// signing, and names `issuer` and `email` as Fulcio records them.
pub fn signer(
    roots: &[CertificateDer<'static>],
    certificate: &str,
    chain: Option<&str>,
    time: u64,
    (issuer, email): (&str, &str),
) -> Result<PublicKey, CertificateError> {
    let leaves = pem_certificates(certificate);
    let [leaf] = leaves.as_slice() else {
        return Err(CertificateError::LeafCount(leaves.len()));
    };
    let mut intermediates = chain.map(pem_certificates).unwrap_or_default();
    if intermediates.len() > CHAIN_LIMIT {
        return Err(CertificateError::ChainLength);
    }
    // The chain's last certificate is its root: only the policy's roots are trusted.
    intermediates.pop();
    chained_signer(roots, leaf, &intermediates, time, (issuer, email))
}

/// [`signer`], for a leaf and intermediates already read (a Sigstore bundle's DER).
pub fn chained_signer(
    roots: &[CertificateDer<'static>],
    leaf: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    time: u64,
    (issuer, email): (&str, &str),
) -> Result<PublicKey, CertificateError> {
    if intermediates.len() > CHAIN_LIMIT {
        return Err(CertificateError::ChainLength);
    }
    let anchors: Vec<_> = roots.iter().filter_map(|root| webpki::anchor_from_trusted_cert(root).ok()).collect();
    let chained = EndEntityCert::try_from(leaf).and_then(|end_entity| {
        end_entity
            .verify_for_usage(
                webpki::ALL_VERIFICATION_ALGS,
                &anchors,
                intermediates,
                UnixTime::since_unix_epoch(std::time::Duration::from_secs(time)),
                KeyUsage::required(CODE_SIGNING),
                None,
                None,
            )
            .map(|_| ())
    });
    chained.map_err(|error| CertificateError::Chain { time, error: format!("{error:?}") })?;
    let read = read_leaf(leaf)?;
    match read.issuer.as_deref() {
        None => return Err(CertificateError::NoIssuer),
        Some(found) if found != issuer => return Err(CertificateError::OtherIssuer(shown(found))),
        Some(_) => {}
    }
    if !read.emails.iter().any(|found| found == email) {
        let found: Vec<String> = read.emails.iter().take(4).map(|email| shown(email)).collect();
        return Err(CertificateError::OtherEmail(if found.is_empty() { "none".into() } else { found.join(", ") }));
    }
    Ok(read.key)
}

/// The leaf's key, Fulcio issuer and e-mail SANs, from its TBSCertificate.
pub fn read_leaf(certificate: &[u8]) -> Result<Leaf, CertificateError> {
    let mut outer = Der::new(der::only(certificate, SEQUENCE)?);
    let mut tbs = Der::new(outer.read(SEQUENCE)?);
    tbs.read_optional(VERSION)?;
    tbs.read(der::INTEGER)?; // serialNumber
    tbs.read(SEQUENCE)?; // signature
    tbs.read(SEQUENCE)?; // issuer
    tbs.read(SEQUENCE)?; // validity
    tbs.read(SEQUENCE)?; // subject
    let key = PublicKey::from_spki(tbs.read_encoded(SEQUENCE)?)?;
    tbs.read_optional(0x81)?; // issuerUniqueID
    tbs.read_optional(0x82)?; // subjectUniqueID
    let mut leaf = Leaf { key, issuer: None, emails: Vec::new() };
    let Some(extensions) = tbs.read_optional(EXTENSIONS)? else { return Ok(leaf) };
    let (mut v1, mut v2) = (None, None);
    let mut list = Der::new(der::only(extensions, SEQUENCE)?);
    while list.peek().is_some() {
        let mut extension = Der::new(list.read(SEQUENCE)?);
        let id = extension.read(OID)?;
        extension.read_optional(BOOLEAN)?;
        let value = extension.read(OCTET_STRING)?;
        extension.finish()?;
        match id {
            ISSUER_V1 => once(&mut v1, String::from_utf8_lossy(value).into_owned())?,
            ISSUER_V2 => once(&mut v2, String::from_utf8_lossy(der::only(value, UTF8_STRING)?).into_owned())?,
            SUBJECT_ALT_NAME => {
                let mut names = Der::new(der::only(value, SEQUENCE)?);
                while let Some(tag) = names.peek() {
                    let name = names.read(tag)?;
                    if tag == RFC822_NAME {
                        leaf.emails.push(String::from_utf8_lossy(name).into_owned());
                    }
                }
            }
            _ => {}
        }
    }
    leaf.issuer = match (v1, v2) {
        (Some(v1), Some(v2)) if v1 != v2 => return Err(CertificateError::IssuerTwice),
        (v1, v2) => v2.or(v1),
    };
    Ok(leaf)
}

/// An extension met twice is refused, as Go's x509 refuses any duplicate.
fn once(slot: &mut Option<String>, value: String) -> Result<(), CertificateError> {
    if slot.replace(value).is_some() { Err(CertificateError::IssuerTwice) } else { Ok(()) }
}
