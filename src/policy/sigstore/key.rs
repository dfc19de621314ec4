//! Public keys a `sigstoreSigned` requirement names, read when the policy is: a PEM `PUBLIC KEY`
//! (SubjectPublicKeyInfo), as `cosign generate-key-pair` and `cosign import-key-pair` write them:
//! ECDSA P-256 or P-384, Ed25519, or RSA of 2048 to 8192 bits. Anything else refuses the policy,
//! so that a key that would never verify is found when the file is loaded, not at a pod's pull.
//! Errors never quote a key's bytes.

use std::fmt;

use base64::Engine as _;
use ring::signature::{self, UnparsedPublicKey, VerificationAlgorithm};

use super::der::{self, BIT_STRING, Der, DerError, INTEGER, NULL, OID, SEQUENCE};

/// The largest key file read, and the largest `keyData` decoded: a PEM RSA-8192 key is 1.5 KiB.
pub const KEY_FILE_LIMIT: u64 = 64 * 1024;

/// Why a key was not loaded; never with the key's bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("cannot be read: {0}")]
    Read(String),
    #[error("larger than {KEY_FILE_LIMIT} bytes: not a public key")]
    TooLarge,
    #[error("not base64 (keyData is the key file's bytes, base64-encoded)")]
    DataNotBase64,
    #[error("no PEM block (-----BEGIN PUBLIC KEY-----)")]
    NoPem,
    #[error("a PEM {0} block first, not a PUBLIC KEY")]
    PemType(String),
    #[error("a PEM block without its END line, or not base64")]
    PemBody,
    #[error("not a SubjectPublicKeyInfo: {0}")]
    Der(#[from] DerError),
    #[error("{0} keys are not verified by cri-imaged: use ECDSA P-256 or P-384, Ed25519 or RSA (2048 to 8192 bits)")]
    Unsupported(String),
    #[error("a Rekor key must be ECDSA, not {0}")]
    RekorNotEcdsa(Algorithm),
    #[error("an EC key whose point is not uncompressed, of its curve's size")]
    EcPoint,
    #[error("an Ed25519 key that is not 32 bytes")]
    Ed25519,
    #[error("an RSA key of {0} bits: cri-imaged verifies 2048 to 8192")]
    RsaSize(usize),
    #[error("an RSA key whose public exponent is not an odd number from 3 to 2^33-1")]
    RsaExponent,
    #[error("an RSA key that is not two positive DER integers")]
    RsaMalformed,
    #[error("a key that is not a whole number of bytes")]
    BitString,
}

/// A key's algorithm, and so how its signatures are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    EcdsaP256,
    EcdsaP384,
    Ed25519,
    Rsa { bits: usize },
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EcdsaP256 => f.write_str("ECDSA P-256"),
            Self::EcdsaP384 => f.write_str("ECDSA P-384"),
            Self::Ed25519 => f.write_str("Ed25519"),
            Self::Rsa { bits } => write!(f, "RSA-{bits}"),
        }
    }
}

/// A public key, loaded: equal keys are equal DER, so a reload sees a changed key file.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    algorithm: Algorithm,
    /// The SubjectPublicKeyInfo, whole.
    spki: Vec<u8>,
    /// What ring verifies with: the point, the Ed25519 key, or the PKCS#1 RSAPublicKey.
    raw: Vec<u8>,
    fingerprint: String,
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({} {})", self.algorithm, self.fingerprint)
    }
}

const EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];
const P521: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x23];
const RSA_ENCRYPTION: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const RSA_PSS: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a];
const ED25519: &[u8] = &[0x2b, 0x65, 0x70];
const ED448: &[u8] = &[0x2b, 0x65, 0x71];
const DSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x01];

impl PublicKey {
    /// The key in a key file's bytes: the file's first PEM block, which must be a `PUBLIC KEY`
    /// (as sigstore's `UnmarshalPEMToPublicKey` reads it).
    pub fn from_pem(file: &[u8]) -> Result<Self, KeyError> {
        if file.len() as u64 > KEY_FILE_LIMIT {
            return Err(KeyError::TooLarge);
        }
        let der = pem_public_key(file)?;
        Self::from_spki(&der)
    }

    /// The key in a base64 `keyData` (the key file's bytes, as containers-policy.json(5) has it).
    pub fn from_key_data(data: &str) -> Result<Self, KeyError> {
        Self::from_pem(&data_bytes(data)?)
    }

    /// A SubjectPublicKeyInfo's DER.
    pub fn from_spki(spki: &[u8]) -> Result<Self, KeyError> {
        let mut info = Der::new(der::only(spki, SEQUENCE)?);
        let mut identifier = Der::new(info.read(SEQUENCE)?);
        let bits = info.read(BIT_STRING)?;
        info.finish()?;
        let oid = identifier.read(OID)?;
        // The BIT STRING's first byte counts unused bits: a key is whole bytes.
        let Some((0, key)) = bits.split_first() else {
            return Err(KeyError::BitString);
        };
        // What follows the OID is the algorithm's parameters, read for the algorithms verified only.
        let mut parameters = identifier;
        let algorithm = match oid {
            EC_PUBLIC_KEY => {
                let curve = parameters.read(OID)?;
                parameters.finish()?;
                match curve {
                    P256 => ec_point(key, 65, Algorithm::EcdsaP256)?,
                    P384 => ec_point(key, 97, Algorithm::EcdsaP384)?,
                    P521 => return Err(KeyError::Unsupported("ECDSA P-521".into())),
                    other => return Err(KeyError::Unsupported(format!("ECDSA (curve {})", der::dotted(other)))),
                }
            }
            ED25519 => {
                parameters.finish()?;
                if key.len() != 32 {
                    return Err(KeyError::Ed25519);
                }
                Algorithm::Ed25519
            }
            RSA_ENCRYPTION => {
                // NULL parameters, as Go's x509 insists.
                if !parameters.read(NULL)?.is_empty() {
                    return Err(DerError::Length.into());
                }
                parameters.finish()?;
                rsa(key)?
            }
            RSA_PSS => return Err(KeyError::Unsupported("RSA-PSS".into())),
            ED448 => return Err(KeyError::Unsupported("Ed448".into())),
            DSA => return Err(KeyError::Unsupported("DSA".into())),
            other => return Err(KeyError::Unsupported(format!("OID {}", der::dotted(other)))),
        };
        let digest = ring::digest::digest(&ring::digest::SHA256, spki);
        let fingerprint = digest.as_ref()[..8].iter().map(|byte| format!("{byte:02x}")).collect();
        Ok(Self { algorithm, spki: spki.to_vec(), raw: key.to_vec(), fingerprint })
    }

    /// The SubjectPublicKeyInfo's DER, whole: what a Rekor entry names the signer by.
    pub fn spki(&self) -> &[u8] {
        &self.spki
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The first 16 hex digits of the SHA-256 of its SubjectPublicKeyInfo: names the key in
    /// messages.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Whether `signature` is this key's over `message`, as cosign signs: ECDSA (ASN.1 DER) and
    /// RSA (PKCS#1 v1.5) over SHA-256, Ed25519 over the message itself. A P-384 signature may be
    /// over SHA-256 (cosign's and containers/image's fixed hash) or SHA-384 (sigstore's algorithm
    /// registry, `cosign generate-key-pair --signing-algorithm ecdsa-sha2-384-nistp384`).
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        let with = |algorithm: &'static dyn VerificationAlgorithm| {
            UnparsedPublicKey::new(algorithm, &self.raw).verify(message, signature).is_ok()
        };
        match self.algorithm {
            Algorithm::EcdsaP256 => with(&signature::ECDSA_P256_SHA256_ASN1),
            Algorithm::EcdsaP384 => {
                with(&signature::ECDSA_P384_SHA256_ASN1) || with(&signature::ECDSA_P384_SHA384_ASN1)
            }
            Algorithm::Ed25519 => with(&signature::ED25519),
            Algorithm::Rsa { .. } => with(&signature::RSA_PKCS1_2048_8192_SHA256),
        }
    }
}

/// The DER of the first PEM block of `file`, which must be a `PUBLIC KEY`: as Go's `pem.Decode`,
/// text before it is passed over, and after it ignored.
fn pem_public_key(file: &[u8]) -> Result<Vec<u8>, KeyError> {
    let text = String::from_utf8_lossy(file);
    let begin = text
        .match_indices("-----BEGIN ")
        .map(|(at, _)| at)
        .find(|at| *at == 0 || text[..*at].ends_with('\n'))
        .ok_or(KeyError::NoPem)?;
    let after = &text[begin + "-----BEGIN ".len()..];
    let (label_line, body) = after.split_once('\n').unwrap_or((after, ""));
    let label = label_line.trim_end().strip_suffix("-----").ok_or(KeyError::NoPem)?;
    if label != "PUBLIC KEY" {
        return Err(KeyError::PemType(crate::policy::scope::shown(label)));
    }
    let end = body.find("-----END PUBLIC KEY-----").ok_or(KeyError::PemBody)?;
    let base64: String = body[..end].chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD.decode(base64).map_err(|_| KeyError::PemBody)
}

/// A `…Data` field's bytes (a key's or a CA's file, base64), bounded as the file would be.
pub fn data_bytes(data: &str) -> Result<Vec<u8>, KeyError> {
    if data.len() as u64 > KEY_FILE_LIMIT * 2 {
        return Err(KeyError::TooLarge);
    }
    // Go's encoding/json reads []byte as standard base64, line breaks ignored.
    let joined: String = data.chars().filter(|c| *c != '\n' && *c != '\r').collect();
    base64::engine::general_purpose::STANDARD.decode(joined).map_err(|_| KeyError::DataNotBase64)
}

fn ec_point(point: &[u8], size: usize, algorithm: Algorithm) -> Result<Algorithm, KeyError> {
    // Uncompressed only, as Go's x509 reads EC keys; ring checks the point is on the curve.
    if point.len() == size && point[0] == 0x04 { Ok(algorithm) } else { Err(KeyError::EcPoint) }
}

/// A PKCS#1 RSAPublicKey within ring's bounds: 2048 to 8192 bits, an odd exponent of 3 to 2^33-1.
fn rsa(key: &[u8]) -> Result<Algorithm, KeyError> {
    let mut fields = Der::new(der::only(key, SEQUENCE)?);
    let modulus = unsigned(fields.read(INTEGER)?)?;
    let exponent = unsigned(fields.read(INTEGER)?)?;
    fields.finish()?;
    let bits = match modulus.first() {
        Some(first) => modulus.len() * 8 - first.leading_zeros() as usize,
        None => 0,
    };
    if !(2048..=8192).contains(&bits) {
        return Err(KeyError::RsaSize(bits));
    }
    let value = match exponent.len() {
        1..=5 => exponent.iter().fold(0u64, |value, byte| value << 8 | u64::from(*byte)),
        _ => return Err(KeyError::RsaExponent),
    };
    if value < 3 || value % 2 == 0 || value > (1 << 33) - 1 {
        return Err(KeyError::RsaExponent);
    }
    Ok(Algorithm::Rsa { bits })
}

/// A DER INTEGER's magnitude, which must be positive and minimal.
fn unsigned(integer: &[u8]) -> Result<&[u8], KeyError> {
    match integer {
        [] => Err(KeyError::RsaMalformed),
        [first, ..] if first & 0x80 != 0 => Err(KeyError::RsaMalformed),
        [0, next, ..] if next & 0x80 == 0 => Err(KeyError::RsaMalformed),
        [0, rest @ ..] => Ok(rest),
        whole => Ok(whole),
    }
}
