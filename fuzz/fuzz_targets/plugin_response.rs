//! Credential-provider plugin responses: any bytes as a plugin's stdout, read by
//! `credentials::plugin::exec::decode` (Go durations included), then its registry keys, which may
//! hold globs, put in a keyring and an arbitrary image looked up, as the node's lookup does.
//!
//! Input: one byte choosing the expected apiVersion, the image up to the first newline, then
//! the plugin's stdout.
#![no_main]

use std::{sync::Arc, time::Duration};

use cri_imaged::{
    credentials::{Credential, CredentialSource, Keyring, RegistryAuth, plugin::exec},
    duration,
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const API_VERSIONS: [&str; 3] = [
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let api_version = API_VERSIONS[usize::from(selector) % API_VERSIONS.len()];
    let (image, stdout) = match rest.iter().position(|&b| b == b'\n') {
        Some(newline) => (&rest[..newline], &rest[newline + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(image) = std::str::from_utf8(image) else { return };

    let response = match exec::decode(stdout, api_version) {
        Ok(response) => response,
        Err(error) => {
            let _ = error.to_string();
            return;
        }
    };
    // Only a response of the expected kind and version is read.
    // serde_json skips an unknown field's string without checking its UTF-8 or the pairing of its
    // surrogate escapes (`\udbff` alone), as Go's decoder takes both; such a document is no
    // `Value`, and the fields the checks below read are checked in every other.
    let Ok(document) = serde_json::from_str::<Value>(&String::from_utf8_lossy(stdout)) else { return };
    assert_eq!(document["kind"], "CredentialProviderResponse");
    assert_eq!(document["apiVersion"], api_version);
    if let Some(cache_duration) = response.cache_duration {
        // Go's durations are i64 nanoseconds.
        assert!(cache_duration <= Duration::from_nanos(i64::MAX as u64));
        let written = document["cacheDuration"].as_str().expect("a duration read from a string");
        match duration::parse_go(written) {
            Ok(parsed) => assert_eq!(parsed, cache_duration),
            Err(duration::DurationError::Negative(_)) => assert_eq!(cache_duration, Duration::ZERO),
            Err(error) => panic!("decoded {written:?} that does not parse: {error}"),
        }
    }
    let keys = document.get("auth").and_then(Value::as_object).map_or(0, |auth| auth.len());
    assert_eq!(response.auth.len(), keys, "one entry a registry key");

    let mut keyring = Keyring::for_image(image);
    for (key, username, password) in response.auth {
        let auth = Arc::new(RegistryAuth::login(username, password));
        let source = CredentialSource::Plugin { name: "fuzz".into(), account: None };
        keyring.add(&key, Arc::new(Credential { auth, source }));
    }
    let _ = keyring.lookup(image);
});
