//! The node's image policy: any bytes read as a containers-policy.json(5) file
//! (`policy::parse_with_keys`, every key file a P-256 test key, a `keyData` whatever it holds),
//! then an arbitrary image judged under it, for a namespace with that file and for one without
//! (`Policies::decide`).
//!
//! Input: the image up to the first newline, then the document.
#![no_main]

use std::collections::BTreeMap;

use cri_imaged::{
    policy::{Policies, PolicySource, lookups, parse_with_keys},
    reference::ImageReference,
};
use libfuzzer_sys::fuzz_target;

/// What every key file holds (src/policy/sigstore/testdata/p256.pub).
const KEY: &[u8] = include_bytes!("../../src/policy/sigstore/testdata/p256.pub");

/// The longest error a document may give: it quotes at most 100 characters of a scope.
const MAX_ERROR: usize = 1500;

fuzz_target!(|data: &[u8]| {
    let (image, document) = match data.iter().position(|&b| b == b'\n') {
        Some(newline) => (&data[..newline], &data[newline + 1..]),
        None => (data, &[][..]),
    };
    let file = match parse_with_keys(document, &|_| Ok(KEY.to_vec())) {
        Ok(file) => file,
        Err(error) => {
            assert!(error.to_string().len() <= MAX_ERROR, "an error quotes a bounded scope: {error}");
            return;
        }
    };
    let Ok(image) = std::str::from_utf8(image) else { return };
    let Ok(reference) = ImageReference::parse_normalized(image) else { return };
    let policies = Policies { default: None, namespaces: BTreeMap::from([("ns".to_owned(), file.clone())]) };
    let own = policies.decide(&reference, Some("ns"));
    assert_eq!(own.policy, PolicySource::Namespace("ns".into()));
    // The scope that decided is one the image is looked up under (or the transport's "").
    if let Some(scope) = &own.scope {
        assert!(scope.is_empty() || lookups(&reference).contains(scope), "{scope:?} for {image:?}");
        assert!(file.docker.contains_key(scope));
    }
    // The same file as the default decides alike; a namespace without a file of its own gets it.
    let default = Policies { default: Some(file), namespaces: BTreeMap::new() };
    let other = default.decide(&reference, Some("other"));
    assert_eq!((other.scope, other.decision), (own.scope, own.decision));
    assert_eq!(other.policy, PolicySource::Default);
});
