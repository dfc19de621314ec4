//! Docker config documents and the keyring: any bytes read as a `config.json` or a `.dockercfg`
//! (`credentials::dockercfg::parse`) and as a pod's pull secret (`credentials::secrets`), every
//! entry added to a keyring (`credentials::keyring`), then an arbitrary image looked up in it.
//!
//! Input: one byte choosing the shape, the image up to the first newline, then the document.
#![no_main]

use std::sync::Arc;

use cri_imaged::credentials::{
    Credential, CredentialSource, Keyring, SecretCoordinates,
    dockercfg::{self, Shape},
    keyring,
    secrets::{self, PullSecret},
};
use libfuzzer_sys::fuzz_target;

/// The longest error a document may give: each names at most 100 characters of a key, escaped.
const MAX_ERROR: usize = 1500;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let shape = if selector & 1 == 0 { Shape::ConfigJson } else { Shape::Dockercfg };
    let (image, document) = match rest.iter().position(|&b| b == b'\n') {
        Some(newline) => (&rest[..newline], &rest[newline + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(image) = std::str::from_utf8(image) else { return };

    let parsed = dockercfg::parse(document, shape);
    let entries = match &parsed {
        Ok(entries) => entries,
        Err(error) => {
            assert!(error.to_string().len() <= MAX_ERROR, "an error quotes a bounded key: {error}");
            &Vec::new()
        }
    };

    // A keyring that keeps everything, and one kept for this image alone, answer alike.
    let mut full = Keyring::default();
    let mut scoped = Keyring::for_image(image);
    for entry in entries {
        let credential =
            Arc::new(Credential { auth: Arc::new(entry.auth.clone()), source: CredentialSource::NodeConfig });
        let added = full.add(&entry.key, credential.clone());
        assert_eq!(added, keyring::normalise_key(&entry.key).is_some());
        assert_eq!(scoped.add(&entry.key, credential), added);
        let _ = keyring::urls_match(&entry.key, image);
    }
    let found = full.lookup(image);
    let found_scoped = scoped.lookup(image);
    assert_eq!(found.len(), found_scoped.len(), "a scoped keyring finds what a full one does");
    assert!(found.iter().zip(&found_scoped).all(|(a, b)| Arc::ptr_eq(a, b)), "in the same order");
    assert!(scoped.len() <= full.len());
    let _ = keyring::is_default_registry(image);

    // The same document as a pod's pull secret, of the matching type.
    let Ok(content) = std::str::from_utf8(document) else { return };
    if content.is_empty() {
        return;
    }
    let kind = match shape {
        Shape::ConfigJson => secrets::DOCKER_CONFIG_JSON,
        Shape::Dockercfg => secrets::DOCKERCFG,
    };
    let coordinates = SecretCoordinates { uid: "u".into(), namespace: "ns".into(), name: "s".into() };
    let secret = PullSecret { coordinates, kind: kind.into(), content: content.into() };
    match secrets::keyring_for(image, std::slice::from_ref(&secret)) {
        Ok(pod) => {
            assert!(parsed.is_ok(), "a secret reads only when its document does");
            let fields: Vec<_> =
                pod.lookup(image).iter().map(|credential| credential.auth.fields().map(str::to_owned)).collect();
            let expected: Vec<_> = found.iter().map(|credential| credential.auth.fields().map(str::to_owned)).collect();
            assert_eq!(fields, expected, "a pull secret gives what its document does");
        }
        Err(error) => {
            assert_eq!(Some(&error.error), parsed.as_ref().err());
            assert!(error.to_string().len() <= MAX_ERROR + 100);
        }
    }
});
