//! A pod's pull secrets as a keyring, read as the kubelet reads them.

use std::{fmt, sync::Arc};

use secrecy::{ExposeSecret, SecretString};

use super::{
    Credential, CredentialSource, Keyring, SecretCoordinates,
    dockercfg::{self, DockerConfigError, Shape},
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
/// the whole keyring, whether or not its entries apply.
pub fn keyring_for(image: &str, secrets: &[PullSecret]) -> Result<Keyring, SecretError> {
    let mut keyring = Keyring::for_image(image);
    for secret in secrets {
        let (shape, data_key) = match secret.kind.as_str() {
            "" | DOCKER_CONFIG_JSON => (Shape::ConfigJson, ".dockerconfigjson"),
            DOCKERCFG => (Shape::Dockercfg, ".dockercfg"),
            other => {
                let coordinates = &secret.coordinates;
                let secret = format_args!("{}/{}", coordinates.namespace, coordinates.name);
                tracing::debug!(%secret, kind = other, "not a docker config secret; skipped");
                continue;
            }
        };
        let content = secret.content.expose_secret();
        if content.is_empty() {
            continue;
        }
        let entries = dockercfg::parse(content.as_bytes(), shape).map_err(|error| SecretError {
            namespace: secret.coordinates.namespace.clone(),
            name: secret.coordinates.name.clone(),
            data_key,
            error,
        })?;
        let coordinates = Arc::new(secret.coordinates.clone());
        for entry in entries {
            let source = CredentialSource::Secret(coordinates.clone());
            keyring.add(&entry.key, Arc::new(Credential { auth: Arc::new(entry.auth), source }));
        }
    }
    Ok(keyring)
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;

    use super::*;

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
}
