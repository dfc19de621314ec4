//! Docker config documents, read as the kubelet reads them: `{"auths": {...}}` (a
//! `config.json` or a `kubernetes.io/dockerconfigjson` secret) or a bare map (a `.dockercfg` or a
//! `kubernetes.io/dockercfg` secret), each entry a registry key and a login.
//!
//! Field names match in any case, as Go's JSON decoding does; a non-empty `auth` (base64 of
//! `username:password`, padded or not) replaces `username` and `password`. Errors name where the
//! document is wrong and never quote what it holds.

use base64::{
    DecodeError, Engine,
    alphabet::STANDARD,
    engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig},
};
use serde_json::{Map, Value};
use zeroize::Zeroize;

use super::RegistryAuth;

/// The longest piece of a registry key quoted back in an error.
const MAX_QUOTED_KEY: usize = 100;

/// One entry: the registry key as written and its login.
pub struct Entry {
    pub key: String,
    pub auth: RegistryAuth,
}

/// Which of the two document shapes to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `{"auths": {"<registry>": {...}}}`: `config.json`, `kubernetes.io/dockerconfigjson`.
    ConfigJson,
    /// `{"<registry>": {...}}`: `.dockercfg`, `kubernetes.io/dockercfg`.
    Dockercfg,
}

/// Why a docker config document cannot be read. Never holds any of the document's values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DockerConfigError {
    #[error("is not valid JSON ({0})")]
    Syntax(String),
    #[error("is not a JSON object")]
    NotAnObject,
    #[error("has an \"auths\" that is not a JSON object")]
    AuthsNotAnObject,
    #[error("has an entry for {0:?} that is not a JSON object")]
    EntryNotAnObject(String),
    #[error("has an entry for {registry:?} whose {field:?} is not a string")]
    FieldNotAString { registry: String, field: &'static str },
    #[error("has an entry for {registry:?} that cannot be used: {error}")]
    Auth { registry: String, error: AuthError },
}

/// Why an entry's `auth` field cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("auth field is not base64 ({0})")]
    NotBase64(String),
    #[error("unable to parse auth field, must be formatted as base64(username:password)")]
    NoColon,
    #[error("auth field does not decode to UTF-8 text")]
    NotUtf8,
}

/// Reads a document of `shape`.
pub fn parse(document: &[u8], shape: Shape) -> Result<Vec<Entry>, DockerConfigError> {
    let mut value: Value = serde_json::from_slice(document).map_err(|error| {
        // serde_json's syntax errors name a position, never the text; data errors cannot occur
        // when reading into a `Value`.
        let kind = match error.classify() {
            serde_json::error::Category::Eof => "unexpected end of input",
            _ => "syntax error",
        };
        DockerConfigError::Syntax(format!("{kind} at line {} column {}", error.line(), error.column()))
    })?;
    let read = read_document(&mut value, shape);
    wipe(&mut value);
    read
}

fn read_document(value: &mut Value, shape: Shape) -> Result<Vec<Entry>, DockerConfigError> {
    let Value::Object(document) = value else { return Err(DockerConfigError::NotAnObject) };
    let registries = match shape {
        Shape::Dockercfg => document,
        Shape::ConfigJson => match field(document, "auths") {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Object(auths)) => auths,
            Some(_) => return Err(DockerConfigError::AuthsNotAnObject),
        },
    };
    let mut entries = Vec::with_capacity(registries.len());
    let mut failure = None;
    // Taken out one by one so that each key moves into its entry; each value is wiped once read,
    // the rest after a failure too.
    for (key, mut entry) in std::mem::take(registries) {
        if failure.is_none() {
            match read_entry(key, &mut entry) {
                Ok(read) => entries.push(read),
                Err(error) => failure = Some(error),
            }
        }
        wipe(&mut entry);
    }
    failure.map_or(Ok(entries), Err)
}

fn read_entry(key: String, entry: &mut Value) -> Result<Entry, DockerConfigError> {
    // A null entry reads as an empty login, as Go reads it.
    if entry.is_null() {
        return Ok(Entry { key, auth: RegistryAuth::default() });
    }
    let Value::Object(fields) = entry else { return Err(DockerConfigError::EntryNotAnObject(quoted(&key))) };
    let mut text = |name: &'static str| match field(fields, name) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(value)) => Ok(std::mem::take(value)),
        Some(_) => Err(DockerConfigError::FieldNotAString { registry: quoted(&key), field: name }),
    };
    let mut username = text("username")?;
    let mut password = text("password")?;
    let mut auth = text("auth")?;
    // Kept for the kubelet's credential hash; never sent to the runtime.
    let email = text("email")?;
    if !auth.is_empty() {
        username.zeroize();
        password.zeroize();
        let decoded = decode_auth(&auth);
        auth.zeroize();
        (username, password) = decoded.map_err(|error| DockerConfigError::Auth { registry: quoted(&key), error })?;
    }
    Ok(Entry { key, auth: RegistryAuth { email, ..RegistryAuth::login(username.into(), password.into()) } })
}

/// The field `name`, matched exactly when present, else in any case (Go's decoding).
fn field<'a>(object: &'a mut Map<String, Value>, name: &str) -> Option<&'a mut Value> {
    if object.contains_key(name) {
        return object.get_mut(name);
    }
    object.iter_mut().find_map(|(key, value)| key.eq_ignore_ascii_case(name).then_some(value))
}

/// Decodes `auth`: base64 of `username:password`, padded when it ends in `=` and unpadded
/// otherwise; split on the first `:`.
pub fn decode_auth(auth: &str) -> Result<(String, String), AuthError> {
    // Go's decoders skip line breaks and accept non-zero trailing bits.
    let config = GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true);
    let mut cleaned: String = auth.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
    let padding =
        if auth.trim().ends_with('=') { DecodePaddingMode::RequireCanonical } else { DecodePaddingMode::RequireNone };
    let decoded = GeneralPurpose::new(&STANDARD, config.with_decode_padding_mode(padding)).decode(&cleaned);
    cleaned.zeroize();
    // base64's own messages quote the offending byte, a byte of the secret: only where it is.
    let decoded = decoded.map_err(|error| {
        AuthError::NotBase64(match error {
            DecodeError::InvalidByte(offset, _) | DecodeError::InvalidLastSymbol(offset, _) => {
                format!("invalid symbol at offset {offset}")
            }
            DecodeError::InvalidLength(length) => format!("invalid length {length}"),
            DecodeError::InvalidPadding => "invalid padding".to_owned(),
        })
    })?;
    let mut text = String::from_utf8(decoded).map_err(|error| {
        error.into_bytes().zeroize();
        AuthError::NotUtf8
    })?;
    let split = text.split_once(':').map(|(username, password)| (username.to_owned(), password.to_owned()));
    text.zeroize();
    split.ok_or(AuthError::NoColon)
}

/// Overwrites every string left in `value`, so that what was not taken is not left in memory.
fn wipe(value: &mut Value) {
    match value {
        Value::String(text) => text.zeroize(),
        Value::Array(items) => items.iter_mut().for_each(wipe),
        Value::Object(fields) => fields.values_mut().for_each(wipe),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

fn quoted(key: &str) -> String {
    match key.char_indices().nth(MAX_QUOTED_KEY) {
        Some((cut, _)) => format!("{}…", &key[..cut]),
        None => key.to_owned(),
    }
}

#[cfg(test)]
mod tests;
