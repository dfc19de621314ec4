//! A provider's `tokenAttributes` (KEP-4412): the plugin is given the pod's service-account token
//! for an audience, checked as the kubelet checks it and refused in its words.

use std::collections::BTreeSet;

use serde::Deserialize;

/// The only config version whose providers may carry `tokenAttributes`.
pub const TOKEN_CONFIG_API_VERSION: &str = "kubelet.config.k8s.io/v1";
/// The only plugin protocol that carries a token.
pub const TOKEN_PLUGIN_API_VERSION: &str = "credentialprovider.kubelet.k8s.io/v1";

/// How a plugin's answers given with a token are cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheType {
    /// Per token: a new token runs the plugin again.
    Token,
    /// Per service account (namespace, name, uid and the annotations sent): any of its tokens.
    ServiceAccount,
}

/// A provider's validated `tokenAttributes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenAttributes {
    /// The audience the token is minted for; the caller passes one token per audience.
    pub audience: String,
    pub cache_type: CacheType,
    /// Without a service account the plugin is not run when true, run without a token when false.
    pub require_service_account: bool,
    /// Annotations the service account must have, else the plugin is not run; sent to it.
    pub required_annotation_keys: Vec<String>,
    /// Annotations sent to the plugin when the service account has them.
    pub optional_annotation_keys: Vec<String>,
}

/// `tokenAttributes` as written; fields are optional here so that a missing one is refused in
/// the kubelet's words rather than serde's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawTokenAttributes {
    #[serde(default)]
    service_account_token_audience: String,
    #[serde(default)]
    cache_type: String,
    require_service_account: Option<bool>,
    #[serde(default)]
    required_service_account_annotation_keys: Vec<String>,
    #[serde(default)]
    optional_service_account_annotation_keys: Vec<String>,
}

/// The kubelet's checks of `tokenAttributes`, the first failure in its words, each field named
/// under `at` (`providers[i].tokenAttributes`).
pub(super) fn validate(
    raw: RawTokenAttributes,
    config_api_version: &str,
    plugin_api_version: &str,
    at: &str,
) -> Result<TokenAttributes, String> {
    if config_api_version != TOKEN_CONFIG_API_VERSION {
        // The kubelet's older config types have no such field: its strict decoder refuses it.
        return Err(format!(
            "{at}: unknown field \"tokenAttributes\" in {config_api_version} (only {TOKEN_CONFIG_API_VERSION} has it)"
        ));
    }
    if plugin_api_version != TOKEN_PLUGIN_API_VERSION {
        return Err(format!(
            "{at}: Forbidden: tokenAttributes is only supported for {TOKEN_PLUGIN_API_VERSION} API version"
        ));
    }
    if raw.service_account_token_audience.is_empty() {
        return Err(format!("{at}.serviceAccountTokenAudience: Required value"));
    }
    let Some(require_service_account) = raw.require_service_account else {
        return Err(format!("{at}.requireServiceAccount: Required value"));
    };
    let (required, optional) =
        (&raw.required_service_account_annotation_keys, &raw.optional_service_account_annotation_keys);
    if !require_service_account && !required.is_empty() {
        return Err(format!(
            "{at}.requiredServiceAccountAnnotationKeys: Forbidden: requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set"
        ));
    }
    check_keys(&format!("{at}.requiredServiceAccountAnnotationKeys"), required)?;
    check_keys(&format!("{at}.optionalServiceAccountAnnotationKeys"), optional)?;
    let both: BTreeSet<&String> = required.iter().filter(|key| optional.contains(key)).collect();
    if !both.is_empty() {
        let listed = both.iter().map(|key| format!("{key:?}")).collect::<Vec<_>>().join(",");
        return Err(format!("{at}: Invalid value: [{listed}]: annotation keys cannot be both required and optional"));
    }
    let cache_type = match raw.cache_type.as_str() {
        "" => {
            return Err(format!(
                "{at}.cacheType: Required value: cacheType is required to be set when tokenAttributes is specified. Supported values are: ServiceAccount, Token"
            ));
        }
        "ServiceAccount" => CacheType::ServiceAccount,
        "Token" => CacheType::Token,
        other => {
            return Err(format!(
                "{at}.cacheType: Unsupported value: {other:?}: supported values: \"ServiceAccount\", \"Token\""
            ));
        }
    };
    Ok(TokenAttributes {
        audience: raw.service_account_token_audience,
        cache_type,
        require_service_account,
        required_annotation_keys: raw.required_service_account_annotation_keys,
        optional_annotation_keys: raw.optional_service_account_annotation_keys,
    })
}

/// Each key an annotation key (a qualified name, case aside), none twice.
fn check_keys(at: &str, keys: &[String]) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    for key in keys {
        if let Some(problem) = qualified_name_problem(&key.to_lowercase()) {
            return Err(format!("{at}: Invalid value: {key:?}: {problem}"));
        }
        if !seen.insert(key) {
            return Err(format!("{at}: Duplicate value: {key:?}"));
        }
    }
    Ok(())
}

const NAME_FORMAT: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const SUBDOMAIN_FORMAT: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// Why `key` is not a Kubernetes qualified name (`[prefix/]name`), in apimachinery's words.
fn qualified_name_problem(key: &str) -> Option<String> {
    let name = match key.split('/').collect::<Vec<_>>()[..] {
        [name] => name,
        [prefix, name] => {
            if prefix.is_empty() {
                return Some("prefix part must be non-empty".to_owned());
            }
            if prefix.len() > 253 {
                return Some("prefix part must be no more than 253 characters".to_owned());
            }
            if !is_subdomain(prefix) {
                return Some(format!("prefix part {SUBDOMAIN_FORMAT}"));
            }
            name
        }
        _ => {
            return Some(format!(
                "a qualified name {NAME_FORMAT} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            ));
        }
    };
    if name.is_empty() {
        return Some("name part must be non-empty".to_owned());
    }
    if name.len() > 63 {
        return Some("name part must be no more than 63 characters".to_owned());
    }
    let inner = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let ends =
        name.starts_with(|c: char| c.is_ascii_alphanumeric()) && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    (!(ends && name.chars().all(inner))).then(|| format!("name part {NAME_FORMAT}"))
}

/// Dot-separated labels of lower-case alphanumerics and inner dashes.
fn is_subdomain(text: &str) -> bool {
    text.split('.').all(|label| {
        let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        label.starts_with(alnum) && label.ends_with(alnum) && label.chars().all(|c| alnum(c) || c == '-')
    })
}
