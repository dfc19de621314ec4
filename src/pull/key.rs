//! What makes two pulls the same pull, so that identical concurrent pulls can share one.

use std::{
    hash::{BuildHasher, RandomState},
    sync::LazyLock,
};

use super::Pull;

/// What identifies one pull, so that identical concurrent pulls can share it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PullKey {
    /// The image, normalised (`busybox` and `docker.io/library/busybox:latest` are one image).
    pub image: String,
    pub runtime_handler: String,
    /// Who the pull is for, as the registry sees it: callers whose credentials differ are never
    /// merged. A 128-bit hash keyed at random per process, so the key holds no secret and cannot
    /// be matched against a guess from outside; `None` without credentials.
    credential: Option<u128>,
}

/// The two independently keyed hashers whose outputs make a credential's 128-bit identity.
static CREDENTIAL_HASHERS: LazyLock<[RandomState; 2]> = LazyLock::new(|| [RandomState::new(), RandomState::new()]);

impl PullKey {
    pub fn of(pull: &Pull) -> Self {
        let image = pull.reference.as_ref().map_or_else(|| pull.image().image.clone(), ToString::to_string);
        let credential = pull.spec.auth.as_ref().map(|auth| {
            let fields = auth.fields();
            let [high, low] = CREDENTIAL_HASHERS.each_ref().map(|hasher| hasher.hash_one(fields));
            u128::from(high) << 64 | u128::from(low)
        });
        Self { image, runtime_handler: pull.image().runtime_handler.clone(), credential }
    }
}

impl std::fmt::Debug for PullKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullKey")
            .field("image", &self.image)
            .field("runtime_handler", &self.runtime_handler)
            .field("credential", &if self.credential.is_some() { "<hashed>" } else { "none" })
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::cri::ImageSpec;

    use super::*;
    use crate::{credentials::RegistryAuth, runtime::PullSpec};

    fn spec(image: &str, auth: Option<Arc<RegistryAuth>>) -> Pull {
        Pull::of(PullSpec {
            image: ImageSpec { image: image.into(), ..Default::default() },
            auth,
            ..Default::default()
        })
    }

    fn login(username: &str, password: &str) -> Option<Arc<RegistryAuth>> {
        Some(Arc::new(RegistryAuth::login(username.into(), password.into())))
    }

    #[test]
    fn spellings_of_one_image_share_a_key() {
        let short = PullKey::of(&spec("busybox:latest", None));
        assert_eq!(short, PullKey::of(&spec("docker.io/library/busybox:latest", None)));
        assert_eq!(short, PullKey::of(&spec("index.docker.io/library/busybox:latest", None)));
        assert_ne!(short, PullKey::of(&spec("busybox:1.36", None)));
        assert_eq!(short, PullKey::of(&spec("busybox", None)), "the default tag is part of the reference");
    }

    #[test]
    fn different_credentials_make_different_keys() {
        let alice = PullKey::of(&spec("registry.local/app:v1", login("alice", "a-secret")));
        assert_eq!(alice, PullKey::of(&spec("registry.local/app:v1", login("alice", "a-secret"))));
        assert_ne!(alice, PullKey::of(&spec("registry.local/app:v1", login("bob", "b-secret"))));
        assert_ne!(alice, PullKey::of(&spec("registry.local/app:v1", login("alice", "another"))));
        assert_ne!(alice, PullKey::of(&spec("registry.local/app:v1", None)));
        // Field boundaries count: moving a character from one field to the next is another login.
        assert_ne!(
            PullKey::of(&spec("registry.local/app:v1", login("al", "ice"))),
            PullKey::of(&spec("registry.local/app:v1", login("ali", "ce")))
        );
    }

    #[test]
    fn a_key_never_prints_its_credentials() {
        let key = PullKey::of(&spec("registry.local/app:v1", login("alice", "a-secret")));
        let printed = format!("{key:?}");
        assert!(!printed.contains("a-secret") && !printed.contains("alice"), "{printed}");
        assert!(printed.contains("<hashed>"), "{printed}");
    }
}
