//! A `sigstoreSigned` requirement's keys, read when its policy file is: each `keyPath`,
//! `keyPaths`, `keyData` and `keyDatas`, Rekor's (which must be ECDSA, as containers/image
//! has it) and Fulcio's CA (`caPath` or `caData`, PEM certificates each usable as a trust anchor). The files are read through the reader the caller gives (the config reads regular
//! files only, bounded); nothing here touches the file system.

use std::path::Path;

use super::key::{Algorithm, KeyError, PublicKey, data_bytes};
use crate::policy::{SigstoreSigned, scope::shown};

/// Reads a key file the policy names: its bytes, or why not (never with the file's bytes).
pub type KeyReader<'a> = dyn Fn(&Path) -> Result<Vec<u8>, String> + 'a;

/// A key that did not load: which (`keyPath "/etc/pki/a.pub"`, `keyDatas[1]`…), and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {error}")]
pub struct KeyLoadError {
    pub key: String,
    pub error: KeyError,
}

/// Loads `signed`'s keys into it.
pub fn load_keys(signed: &mut SigstoreSigned, read: &KeyReader<'_>) -> Result<(), KeyLoadError> {
    signed.keys = keys(
        [("keyPath", &signed.key_path), ("keyData", &signed.key_data)],
        [("keyPaths", &signed.key_paths), ("keyDatas", &signed.key_datas)],
        read,
    )?;
    let rekor =
        [("rekorPublicKeyPath", &signed.rekor_public_key_path), ("rekorPublicKeyData", &signed.rekor_public_key_data)];
    let rekors = [
        ("rekorPublicKeyPaths", &signed.rekor_public_key_paths),
        ("rekorPublicKeyDatas", &signed.rekor_public_key_datas),
    ];
    let rekor_keys = keys(rekor, rekors, read)?;
    signed.rekor_keys = rekor_keys;
    if let Some(fulcio) = &signed.fulcio {
        let (name, pem) = match (&fulcio.ca_path, &fulcio.ca_data) {
            (Some(path), _) => (format!("fulcio.caPath {}", shown(path)), read(Path::new(path))),
            (None, Some(data)) => ("fulcio.caData".to_owned(), data_bytes(data).map_err(|error| error.to_string())),
            (None, None) => return Ok(()),
        };
        let roots = pem.and_then(|pem| super::trust_anchors(&pem));
        signed.fulcio_roots = roots.map_err(|error| KeyLoadError {
            key: name,
            error: KeyError::Read(crate::messages::echo(&error).into_owned()),
        })?;
    }
    Ok(())
}

/// The keys of the single fields and the lists, in that order; a field ending in `Path(s)` names
/// files, one in `Data(s)` holds base64.
fn keys(
    single: [(&'static str, &Option<String>); 2],
    lists: [(&'static str, &Option<Vec<String>>); 2],
    read: &KeyReader<'_>,
) -> Result<Vec<PublicKey>, KeyLoadError> {
    let rekor = single[0].0.starts_with("rekor");
    let mut named: Vec<(String, &'static str, &str)> = Vec::new();
    for (field, value) in single {
        if let Some(value) = value {
            named.push((field.to_owned(), field, value));
        }
    }
    for (field, values) in lists {
        for (at, value) in values.iter().flatten().enumerate() {
            named.push((format!("{field}[{at}]"), field, value));
        }
    }
    named
        .into_iter()
        .map(|(name, field, value)| {
            let is_path = field.contains("Path");
            let key = if is_path { format!("{name} {}", shown(value)) } else { name };
            let loaded = if is_path {
                read(Path::new(value))
                    .map_err(|error| KeyError::Read(crate::messages::echo(&error).into_owned()))
                    .and_then(|file| PublicKey::from_pem(&file))
            } else {
                PublicKey::from_key_data(value)
            };
            let loaded = loaded.and_then(|loaded| match loaded.algorithm() {
                Algorithm::EcdsaP256 | Algorithm::EcdsaP384 => Ok(loaded),
                other if rekor => Err(KeyError::RekorNotEcdsa(other)),
                _ => Ok(loaded),
            });
            loaded.map_err(|error| KeyLoadError { key, error })
        })
        .collect()
}
