//! Registry credentials as a pull carries them: `Debug` redacted, memory wiped on drop.

use std::fmt;

use crate::cri::AuthConfig;
use secrecy::{ExposeSecret, SecretString};
use zeroize::Zeroize;

/// The fields of the CRI's `AuthConfig`, each secret one held as a [`SecretString`].
#[derive(Clone, Default)]
pub struct RegistryAuth {
    pub username: SecretString,
    pub password: SecretString,
    /// base64 of `username:password`, as a CRI caller may send it; docker configs decode it
    /// into username and password instead.
    pub auth: SecretString,
    /// Not a secret: the registry the credential is for, when the caller names one.
    pub server_address: String,
    /// Not a secret, never sent to the runtime (the CRI has no such field): read from docker
    /// configs and part of the kubelet's credential hash.
    pub email: String,
    pub identity_token: SecretString,
    pub registry_token: SecretString,
}

impl RegistryAuth {
    /// A username and password, as docker configs and credential plugins give them.
    pub fn login(username: SecretString, password: SecretString) -> Self {
        Self { username, password, ..Default::default() }
    }

    /// Takes a CRI caller's `AuthConfig`, wiping the strings it arrived in.
    pub fn from_cri(mut config: AuthConfig) -> Self {
        let take = |field: &mut String| {
            let secret = SecretString::from(field.as_str());
            field.zeroize();
            secret
        };
        Self {
            username: take(&mut config.username),
            password: take(&mut config.password),
            auth: take(&mut config.auth),
            server_address: std::mem::take(&mut config.server_address),
            email: String::new(),
            identity_token: take(&mut config.identity_token),
            registry_token: take(&mut config.registry_token),
        }
    }

    /// The runtime's `AuthConfig`. Its plain strings live only as long as the PullImage request
    /// that carries them: the gRPC client encodes and drops it.
    pub fn to_cri(&self) -> AuthConfig {
        AuthConfig {
            username: self.username.expose_secret().to_owned(),
            password: self.password.expose_secret().to_owned(),
            auth: self.auth.expose_secret().to_owned(),
            server_address: self.server_address.clone(),
            identity_token: self.identity_token.expose_secret().to_owned(),
            registry_token: self.registry_token.expose_secret().to_owned(),
        }
    }

    /// Every field in a fixed order, for hashing into an identity that holds no secret.
    pub fn fields(&self) -> [&str; 6] {
        [
            self.server_address.as_str(),
            self.username.expose_secret(),
            self.password.expose_secret(),
            self.auth.expose_secret(),
            self.identity_token.expose_secret(),
            self.registry_token.expose_secret(),
        ]
    }
}

impl PartialEq for RegistryAuth {
    fn eq(&self, other: &Self) -> bool {
        self.fields() == other.fields()
    }
}

impl Eq for RegistryAuth {}

impl fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryAuth").field("server_address", &self.server_address).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_field() -> AuthConfig {
        AuthConfig {
            username: "alice".into(),
            password: "a-secret".into(),
            auth: "YWxpY2U6YS1zZWNyZXQ=".into(),
            server_address: "registry.local".into(),
            identity_token: "id-token".into(),
            registry_token: "reg-token".into(),
        }
    }

    #[test]
    fn debug_shows_no_secret_field() {
        let printed = format!("{:?}", RegistryAuth::from_cri(every_field()));
        for secret in ["alice", "a-secret", "YWxpY2U6YS1zZWNyZXQ=", "id-token", "reg-token"] {
            assert!(!printed.contains(secret), "{printed}");
        }
        assert!(printed.contains("registry.local"), "{printed}");
    }

    #[test]
    fn the_cri_fields_go_back_to_the_runtime_unchanged() {
        assert_eq!(RegistryAuth::from_cri(every_field()).to_cri(), every_field());
    }
}
