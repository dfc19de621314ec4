//! What a plugin configured with `tokenAttributes` (KEP-4412) is asked with: the pod's token for
//! its audience and the annotations it names, or no run at all, in the kubelet's order; and the
//! service-account part of its cache and single-flight keys.

use std::{collections::BTreeMap, sync::Arc};

use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

use super::config::{CacheType, TokenAttributes};
use crate::credentials::{AccountCoordinates, account::ServiceAccount};

/// The token and annotations sent to a plugin, and whose they are.
pub struct Presented {
    pub account: Arc<AccountCoordinates>,
    pub token: SecretString,
    /// Only the keys the provider names, and only those the account has.
    pub annotations: BTreeMap<String, String>,
}

/// The service-account part of a key: which account, as the plugin saw it. The token only ever
/// as its SHA-256, as the kubelet keys it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AccountKey {
    namespace: String,
    name: String,
    uid: String,
    annotations: BTreeMap<String, String>,
    token_sha256: Option<[u8; 32]>,
}

/// One ask of one provider.
pub struct Ask {
    /// `None`: the plain request, without a token.
    pub presented: Option<Presented>,
    /// What the answer is cached under, beside the image, registry or global key.
    pub cache_key: Option<AccountKey>,
    /// What concurrent asks share a run under: with a token, the token's own.
    pub flight_key: Option<AccountKey>,
}

impl Ask {
    fn plain() -> Self {
        Self { presented: None, cache_key: None, flight_key: None }
    }
}

/// How `provider` is asked given the request's `account`: `None` when it is not run at all (the
/// pull goes on without its credentials; the reason is logged, never the token).
pub fn ask(attributes: Option<&TokenAttributes>, account: Option<&ServiceAccount>, provider: &str) -> Option<Ask> {
    let Some(attributes) = attributes else {
        return Some(Ask::plain());
    };
    let Some(account) = account.filter(|account| !account.name.is_empty()) else {
        if attributes.require_service_account {
            tracing::debug!(provider, "Service account name is empty for the pod; the provider requires one");
            return None;
        }
        return Some(Ask::plain());
    };
    if let Some(missing) =
        attributes.required_annotation_keys.iter().find(|key| !account.annotations.contains_key(*key))
    {
        tracing::debug!(
            provider,
            "Failed to get service account data {}/{}: required annotation {missing} not found",
            account.namespace,
            account.name
        );
        return None;
    }
    let annotations: BTreeMap<String, String> = (attributes.required_annotation_keys.iter())
        .chain(&attributes.optional_annotation_keys)
        .filter_map(|key| Some((key.clone(), account.annotations.get(key)?.clone())))
        .collect();
    let Some(token) = account.token_for(&attributes.audience) else {
        tracing::warn!(
            provider,
            audience = %attributes.audience,
            "no service account token for audience {:?} (provider {provider:?}); the provider is not run",
            attributes.audience
        );
        return None;
    };
    let token_sha256: [u8; 32] = Sha256::digest(token.expose_secret().as_bytes()).into();
    let key = |token_sha256| AccountKey {
        namespace: account.namespace.clone(),
        name: account.name.clone(),
        uid: account.uid.clone(),
        annotations: annotations.clone(),
        token_sha256,
    };
    let cache_key = key((attributes.cache_type == CacheType::Token).then_some(token_sha256));
    let flight_key = key(Some(token_sha256));
    Some(Ask {
        presented: Some(Presented {
            account: Arc::new(AccountCoordinates {
                uid: account.uid.clone(),
                namespace: account.namespace.clone(),
                name: account.name.clone(),
            }),
            token: token.clone(),
            annotations,
        }),
        cache_key: Some(cache_key),
        flight_key: Some(flight_key),
    })
}

/// Whether an answer must be dropped: outside the `Token` cache type, a password that is the
/// token itself would be cached for the whole account, every token of it after this one.
pub fn echoes_token<'a>(
    attributes: Option<&TokenAttributes>,
    presented: Option<&Presented>,
    mut passwords: impl Iterator<Item = &'a SecretString>,
) -> bool {
    let (Some(attributes), Some(presented)) = (attributes, presented) else {
        return false;
    };
    attributes.cache_type != CacheType::Token
        && passwords.any(|password| password.expose_secret() == presented.token.expose_secret())
}
