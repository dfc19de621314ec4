//! Request translation of CRI `runtime.v1.ImageService/PullImage` on our socket: any protobuf
//! bytes decoded as tonic decodes them, then translated as `server::cri_image_service` does (the
//! credential taken into a `RegistryAuth`, the image parsed once into a `Pull`), and the
//! single-flight key the scheduler merges identical pulls by.
#![no_main]

use std::sync::Arc;

use cri_imaged::{
    credentials::RegistryAuth,
    messages,
    pull::{Pull, PullKey},
    reference,
    runtime::PullSpec,
};
use cri_imaged::cri::PullImageRequest;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = PullImageRequest::decode(data) else { return };
    let PullImageRequest { image, auth, sandbox_config } = request;

    let sent_auth = auth.clone();
    let auth = auth.map(|auth| Arc::new(RegistryAuth::from_cri(auth)));
    // The credential reaches the runtime as the caller sent it.
    assert_eq!(auth.as_ref().map(|auth| auth.to_cri()), sent_auth);

    let image = image.unwrap_or_default();
    let pull = Pull::of(PullSpec { image: image.clone(), auth, sandbox_config });
    assert_eq!(pull.spec.image, image, "the image spec reaches the runtime untouched");
    let parsed = reference::parse_with_default_tag(&image.image).ok();
    assert_eq!(pull.reference.as_deref(), parsed.as_ref().map(|(reference, _)| reference));
    let _ = messages::echo(&image.image);

    let key = PullKey::of(&pull);
    assert_eq!(key, PullKey::of(&pull.clone()), "the same pull, the same key");
    assert_eq!(key.runtime_handler, image.runtime_handler);
    let expected_image = pull.reference.as_ref().map_or_else(|| image.image.clone(), ToString::to_string);
    assert_eq!(key.image, expected_image);
    if pull.spec.auth.is_some() {
        let anonymous = Pull { spec: PullSpec { auth: None, ..pull.spec.clone() }, ..pull.clone() };
        assert_ne!(key, PullKey::of(&anonymous), "a pull with credentials never merges with one without");
    }
});
