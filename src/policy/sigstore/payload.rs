//! The signed payload, cosign's "simple signing" JSON, read as strictly as containers/image reads
//! it (`UntrustedSigstorePayload`): `critical` and `optional` and nothing else; `critical` with
//! exactly `type` (cosign's), `image.docker-manifest-digest` and `identity.docker-reference`;
//! `optional` null or an object, whose `creator` is a string and `timestamp` an integer when
//! present, anything else in it left alone. Read only after the signature over it verified.

use serde::Deserialize;
use serde_json::Value;

/// The type every cosign signature's payload names.
pub const COSIGN_SIGNATURE_TYPE: &str = "cosign container image signature";

/// Why a payload is not a cosign signature's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// serde's words, escaped and bounded.
    #[error("not a cosign payload: {0}")]
    Json(String),
    #[error("not a cosign payload: {0} is not a JSON object")]
    NotAnObject(&'static str),
    #[error("its type is {0}, not \"cosign container image signature\"")]
    Type(String),
    #[error("optional.{0} is not {1}")]
    Optional(&'static str, &'static str),
}

/// What a payload claims: which manifest, under which name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    /// `critical.image.docker-manifest-digest`.
    pub manifest_digest: String,
    /// `critical.identity.docker-reference`: cosign writes the repository, without a tag.
    pub docker_reference: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    critical: Critical,
    // Present, even if null (as containers/image requires): `Value` is never missing-as-None.
    #[allow(dead_code)]
    optional: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Critical {
    #[serde(rename = "type")]
    kind: String,
    image: Image,
    identity: Identity,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    manifest_digest: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Identity {
    #[serde(rename = "docker-reference")]
    docker_reference: String,
}

/// Reads a payload (at most [`super::PAYLOAD_LIMIT`] bytes, which the caller has checked).
pub fn parse_payload(payload: &[u8]) -> Result<Payload, PayloadError> {
    let json = |error: serde_json::Error| {
        PayloadError::Json(crate::messages::echo(&error.to_string().escape_debug().to_string()).into_owned())
    };
    // Read twice: as values, to see objects where objects must be (serde's derived structs would
    // take arrays too); typed, for each field once and no other (values keep a repeated key's last).
    let value: Value = serde_json::from_slice(payload).map_err(json)?;
    shape(Some(&value), "the payload")?;
    let critical = value.get("critical");
    shape(critical, "critical")?;
    shape(critical.and_then(|critical| critical.get("image")), "critical.image")?;
    shape(critical.and_then(|critical| critical.get("identity")), "critical.identity")?;
    let raw: Raw = serde_json::from_slice(payload).map_err(json)?;
    if raw.critical.kind != COSIGN_SIGNATURE_TYPE {
        return Err(PayloadError::Type(crate::policy::scope::shown(&raw.critical.kind)));
    }
    match &raw.optional {
        Value::Null => {}
        Value::Object(optional) => {
            if optional.get("creator").is_some_and(|creator| !creator.is_string()) {
                return Err(PayloadError::Optional("creator", "a string"));
            }
            // An integer, as containers/image insists (a JSON number it reads as a float).
            let integral = |timestamp: &Value| {
                timestamp.is_i64() || timestamp.is_u64() || timestamp.as_f64().is_some_and(|f| f.fract() == 0.0)
            };
            if optional.get("timestamp").is_some_and(|timestamp| !integral(timestamp)) {
                return Err(PayloadError::Optional("timestamp", "an integer"));
            }
        }
        _ => return Err(PayloadError::NotAnObject("optional")),
    }
    Ok(Payload {
        manifest_digest: raw.critical.image.manifest_digest,
        docker_reference: raw.critical.identity.docker_reference,
    })
}

/// `value` must be an object, if it is there (a missing one is the typed read's to name).
fn shape(value: Option<&Value>, what: &'static str) -> Result<(), PayloadError> {
    match value {
        None | Some(Value::Object(_)) => Ok(()),
        Some(_) => Err(PayloadError::NotAnObject(what)),
    }
}
