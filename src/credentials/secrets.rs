//! A pod's pull secrets as a keyring, read as the kubelet reads them.

use std::fmt;

use secrecy::SecretString;

mod prepared;

pub use self::prepared::PreparedSecrets;
use super::{
    Keyring, SecretCoordinates,
    dockercfg::{DockerConfigError, Shape},
};

/// The secret type whose content is `{"auths": {...}}`.
pub const DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
/// The older secret type whose content is the bare registry map.
pub const DOCKERCFG: &str = "kubernetes.io/dockercfg";

/// One pull secret as the caller sent it.
#[derive(Clone, Default)]
pub struct PullSecret {
    pub coordinates: SecretCoordinates,
    /// The secret's `type`; empty means [`DOCKER_CONFIG_JSON`].
    pub kind: String,
    /// `.dockerconfigjson` or `.dockercfg`, by `kind`.
    pub content: SecretString,
}

impl fmt::Debug for PullSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PullSecret")
            .field("coordinates", &self.coordinates)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// A pull secret whose content cannot be read. Names the secret and what is wrong, never what
/// it holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pull secret {}/{}: its {data_key} {error}", crate::messages::echo(.namespace), crate::messages::echo(.name))]
pub struct SecretError {
    pub namespace: String,
    pub name: String,
    pub data_key: &'static str,
    pub error: DockerConfigError,
}

/// The pod's keyring for `image`: every entry of every secret of a docker config type that can
/// apply to it, each under its key, in secret order. Secrets of other types, and empty ones, are
/// skipped as the kubelet skips them (a pod may name any secret); one that does not parse fails
/// the whole keyring, whether or not its entries apply. Each secret is read afresh; the daemon
/// keeps what it read in [`PreparedSecrets`].
pub fn keyring_for(image: &str, secrets: &[PullSecret]) -> Result<Keyring, SecretError> {
    PreparedSecrets::default().keyring_for(image, secrets)
}

/// How a secret's content is read, and the data key it is under; `None` for a type that holds
/// no docker config.
fn shape_of(secret: &PullSecret) -> Option<(Shape, &'static str)> {
    match secret.kind.as_str() {
        "" | DOCKER_CONFIG_JSON => Some((Shape::ConfigJson, ".dockerconfigjson")),
        DOCKERCFG => Some((Shape::Dockercfg, ".dockercfg")),
        other => {
            let coordinates = &secret.coordinates;
            let secret = format_args!("{}/{}", coordinates.namespace, coordinates.name);
            tracing::debug!(%secret, kind = other, "not a docker config secret; skipped");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use secrecy::ExposeSecret;

    use super::*;
    use crate::credentials::{CredentialSource, dockercfg};

    const AUTH: &str = "dXNlcjpwYXNzd29yZA=="; // user:password

    fn secret(name: &str, kind: &str, content: &str) -> PullSecret {
        let coordinates = SecretCoordinates { uid: format!("uid-{name}"), namespace: "ns1".into(), name: name.into() };
        PullSecret { coordinates, kind: kind.into(), content: content.into() }
    }

    fn found(secrets: &[PullSecret], image: &str) -> Vec<(String, String, CredentialSource)> {
        let keyring = keyring_for(image, secrets).expect("readable");
        let found = keyring.lookup(image);
        found
            .iter()
            .map(|credential| {
                let auth = &credential.auth;
                (
                    auth.username.expose_secret().to_owned(),
                    auth.password.expose_secret().to_owned(),
                    credential.source.clone(),
                )
            })
            .collect()
    }

    #[test]
    fn both_secret_types_give_their_logins_tagged_with_the_secret() {
        let json_auth = format!(r#"{{"auths": {{"test.registry.io": {{"auth": "{AUTH}"}}}}}}"#);
        let cfg_auth = format!(r#"{{"test.registry.io": {{"auth": "{AUTH}"}}}}"#);
        let json_login = r#"{"auths": {"test.registry.io": {"username": "user", "password": "password"}}}"#;
        let cfg_login = r#"{"test.registry.io": {"username": "user", "password": "password"}}"#;
        for (kind, content) in [
            (DOCKER_CONFIG_JSON, json_auth.as_str()),
            (DOCKERCFG, cfg_auth.as_str()),
            (DOCKER_CONFIG_JSON, json_login),
            (DOCKERCFG, cfg_login),
            ("", json_login),
        ] {
            let source = CredentialSource::Secret(Arc::new(SecretCoordinates {
                uid: "uid-s1".into(),
                namespace: "ns1".into(),
                name: "s1".into(),
            }));
            let expected = [("user".to_owned(), "password".to_owned(), source)];
            assert_eq!(found(&[secret("s1", kind, content)], "test.registry.io"), expected, "{kind} {content}");
        }
    }

    #[test]
    fn a_secret_read_as_the_other_type_or_of_another_type_or_empty_gives_nothing() {
        let cfg_login = r#"{"test.registry.io": {"username": "user", "password": "password"}}"#;
        let cases = [
            secret("json-as-cfg", DOCKERCFG, r#"{"auths": {"test.registry.io": {"username": "user"}}}"#),
            secret("cfg-as-json", DOCKER_CONFIG_JSON, cfg_login),
            secret("opaque", "Opaque", cfg_login),
            secret("empty", DOCKER_CONFIG_JSON, ""),
        ];
        for case in cases {
            let name = case.coordinates.name.clone();
            assert!(found(&[case], "test.registry.io").is_empty(), "{name}");
        }
    }

    #[test]
    fn logins_from_several_secrets_come_most_specific_key_first_then_in_secret_order() {
        let login = |registry: &str, user: &str| {
            format!(r#"{{"auths": {{"{registry}": {{"username": "{user}", "password": "p"}}}}}}"#)
        };
        let secrets = [
            secret("first", DOCKER_CONFIG_JSON, &login("registry.local", "first")),
            secret("second", DOCKER_CONFIG_JSON, &login("registry.local", "second")),
            secret("team", DOCKER_CONFIG_JSON, &login("registry.local/team", "team")),
        ];
        let users: Vec<String> =
            found(&secrets, "registry.local/team/app").into_iter().map(|(user, _, _)| user).collect();
        assert_eq!(users, ["team", "first", "second"]);
    }

    #[test]
    fn an_unreadable_secret_is_named_and_its_content_is_not_quoted() {
        let secrets =
            [secret("good", DOCKER_CONFIG_JSON, "{}"), secret("bad", DOCKERCFG, r#"{"r.io": {"auth": "hunter2!"}}"#)];
        let error = keyring_for("r.io/app", &secrets).err().expect("refused");
        assert_eq!(error.namespace, "ns1");
        assert_eq!(error.name, "bad");
        let message = error.to_string();
        assert!(message.starts_with("pull secret ns1/bad: its .dockercfg has an entry for \"r.io\" that cannot be used: auth field is not base64"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
    }

    /// Keys of every kind a lookup treats apart: hosts with and without ports and paths, globs,
    /// schemes, `/v1/` paths, Docker Hub's fallback and keys that are not URLs.
    const KEYS: [&str; 12] = [
        "registry.local",
        "registry.local:5000",
        "registry.local/team",
        "https://registry.local/v1/",
        "*.local",
        "registry.*",
        "[::1]:5000",
        "index.docker.io",
        "https://index.docker.io/v1/",
        "docker.io/library",
        "other.example.com",
        "bad key with spaces",
    ];
    const IMAGES: [&str; 8] = [
        "registry.local/team/app",
        "registry.local:5000/app",
        "registry.local/app",
        "mirror.local/app",
        "registry.example/app",
        "[::1]:5000/app",
        "busybox",
        "docker.io/library/nginx",
    ];

    fn secret_of(name: &str, keys: &[&str], password: &str) -> PullSecret {
        let auths: Vec<String> =
            keys.iter().map(|key| format!(r#""{key}": {{"username": "{name}", "password": "{password}"}}"#)).collect();
        secret(name, DOCKER_CONFIG_JSON, &format!(r#"{{"auths": {{{}}}}}"#, auths.join(", ")))
    }

    /// The keyring as read without the index: every entry of every secret added.
    fn every_entry_added(image: &str, secrets: &[PullSecret]) -> Keyring {
        let mut keyring = Keyring::for_image(image);
        for secret in secrets {
            let content = secret.content.expose_secret();
            let entries = dockercfg::parse(content.as_bytes(), dockercfg::Shape::ConfigJson).expect("parses");
            let source = CredentialSource::Secret(Arc::new(secret.coordinates.clone()));
            for entry in entries {
                keyring.add(
                    &entry.key,
                    Arc::new(crate::credentials::Credential { auth: Arc::new(entry.auth), source: source.clone() }),
                );
            }
        }
        keyring
    }

    fn users(keyring: &Keyring, image: &str) -> Vec<(String, String)> {
        let found = keyring.lookup(image);
        found
            .iter()
            .map(|credential| (credential.source.to_string(), credential.auth.username.expose_secret().to_owned()))
            .collect()
    }

    #[test]
    fn a_prepared_keyring_finds_what_every_entry_added_finds_for_any_image() {
        let secrets = [
            secret_of("first", &KEYS, "p1"),
            secret_of("second", &KEYS[3..], "p2"),
            secret_of("third", &KEYS[..2], "p3"),
        ];
        let prepared = PreparedSecrets::default();
        for _ in 0..2 {
            for image in IMAGES {
                let expected = users(&every_entry_added(image, &secrets), image);
                let found = users(&prepared.keyring_for(image, &secrets).expect("reads"), image);
                assert_eq!(found, expected, "{image}");
            }
        }
        let matched: usize = IMAGES.iter().map(|image| users(&every_entry_added(image, &secrets), image).len()).sum();
        assert!(matched >= 10, "the images match keys of several kinds: {matched}");
        assert_eq!(prepared.len(), 3, "each secret read once, whatever the images");
    }

    #[test]
    fn a_secret_whose_content_changed_is_read_again() {
        let prepared = PreparedSecrets::default();
        let password = |secrets: &[PullSecret]| {
            let keyring = prepared.keyring_for("registry.local/app", secrets).expect("reads");
            let found = keyring.lookup("registry.local/app");
            found.iter().map(|credential| credential.auth.password.expose_secret().to_owned()).collect::<Vec<_>>()
        };
        assert_eq!(password(&[secret_of("rotated", &["registry.local"], "old")]), ["old"]);
        assert_eq!(password(&[secret_of("rotated", &["registry.local"], "new")]), ["new"]);
        let broken = secret("rotated", DOCKER_CONFIG_JSON, "{");
        assert!(
            prepared.keyring_for("registry.local/app", &[broken]).is_err(),
            "a content that no longer parses fails"
        );
        assert_eq!(prepared.len(), 1, "kept by its coordinates: the new content replaced the old");
    }
}
