//! Request translation of `imagemanager.v1` `EnsureImageExists`: any protobuf bytes decoded as
//! tonic decodes them, translated into the manager's request (`TryFrom` in `server::request`),
//! then every step the manager takes with it before it asks the runtime: the default tag, the
//! default policy, the pod's keyring from its pull secrets and the records' credential hashes.
#![no_main]

use cri_imaged::{
    api,
    credentials::{CredentialSource, hash::kubelet_hash, secrets},
    ensure::EnsureRequest,
    messages::{self, ECHO_LIMIT},
    pull_policy::PullPolicy,
    reference,
};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use secrecy::ExposeSecret;

fuzz_target!(|data: &[u8]| {
    let Ok(wire) = api::EnsureImageExistsRequest::decode(data) else { return };
    let policy_known = api::PullPolicy::try_from(wire.pull_policy).is_ok();
    let (pull_policy, image) = (wire.pull_policy, wire.image.clone());
    let (pod, secrets_sent) = (wire.pod.clone().unwrap_or_default(), wire.pull_secrets.clone());
    let (container, handler, sandbox) =
        (wire.container_name.clone(), wire.runtime_handler.clone(), wire.pod_sandbox_config.clone());
    let tokens: Vec<String> =
        wire.service_account.iter().flat_map(|account| &account.tokens).map(|token| token.token.clone()).collect();

    let request = match EnsureRequest::try_from(wire) {
        Ok(request) => request,
        Err(error) if error.field() == "pull_policy" => {
            assert!(!policy_known, "a known policy {pull_policy} is refused: {error}");
            assert!(error.to_string().contains(&pull_policy.to_string()), "the error names the value");
            return;
        }
        Err(error) => {
            // The pod's service account out of bounds or not the pod's: never a token in the error.
            assert!(error.field().starts_with("service_account."), "{}: {error}", error.field());
            let message = error.to_string();
            assert!(tokens.iter().filter(|token| token.len() >= 8).all(|token| !message.contains(token.as_str())));
            return;
        }
    };
    assert!(policy_known, "an unknown policy {pull_policy} is accepted");
    assert_eq!(request.pull_policy.is_none(), pull_policy == api::PullPolicy::Unspecified as i32);
    // Translation keeps every field as sent.
    assert_eq!((&request.image, &request.container_name, &request.runtime_handler), (&image, &container, &handler));
    assert_eq!(request.sandbox_config, sandbox);
    let translated = &request.pod;
    assert_eq!(
        (&translated.namespace, &translated.name, &translated.uid, &translated.annotations),
        (&pod.namespace, &pod.name, &pod.uid, &pod.annotations)
    );
    assert_eq!(request.pull_secrets.len(), secrets_sent.len());
    for (secret, sent) in request.pull_secrets.iter().zip(&secrets_sent) {
        let coordinates = &secret.coordinates;
        assert_eq!(
            (&coordinates.uid, &coordinates.namespace, &coordinates.name),
            (&sent.uid, &sent.namespace, &sent.name)
        );
        assert_eq!(secret.kind, sent.r#type);
        assert_eq!(secret.content.expose_secret(), sent.docker_config_json);
    }

    // What the manager repeats back is bounded, however long the image.
    let echoed = messages::echo(&request.image);
    assert!(echoed.len() <= ECHO_LIMIT + 32 || request.image.len() <= ECHO_LIMIT);
    assert!(request.image.len() > ECHO_LIMIT || echoed == request.image);

    let (reference, _tagged) = match reference::parse_with_default_tag(&request.image) {
        Ok(parsed) => parsed,
        Err(error) => {
            // The answer repeats the image bounded (twice, quoted), and the error bounded too: it
            // may quote the image's name.
            let message = messages::invalid_image_name(&request.image, &error);
            let quoted = format!("{:?}", messages::echo(&request.image)).len();
            let bound = 2 * quoted + 64 + ECHO_LIMIT + 32;
            assert!(message.len() <= bound, "{} bytes for a {}-byte image", message.len(), request.image.len());
            return;
        }
    };
    let _policy = request.pull_policy.unwrap_or_else(|| PullPolicy::default_for(&reference));
    let repository = reference.name();
    match secrets::keyring_for(&repository, &request.pull_secrets) {
        Ok(keyring) => {
            for credential in keyring.lookup(&repository) {
                let CredentialSource::Secret(coordinates) = &credential.source else {
                    panic!("a pod keyring holds only its secrets' credentials")
                };
                assert!(request.pull_secrets.iter().any(|secret| secret.coordinates == **coordinates));
                let hash = kubelet_hash(&credential.auth);
                assert!(hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()));
            }
        }
        Err(error) => {
            let _ = error.to_string();
        }
    }
});
