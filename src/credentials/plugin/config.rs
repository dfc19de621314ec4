//! The kubelet's credential-provider config file (`--image-credential-provider-config`, kind
//! `CredentialProviderConfig`), read strictly and checked as the kubelet checks it.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

pub use self::token::{CacheType, TokenAttributes};
use crate::duration::{self, DurationError};

mod token;

/// The config file's API versions the kubelet reads.
const CONFIG_API_VERSIONS: [&str; 3] =
    ["kubelet.config.k8s.io/v1", "kubelet.config.k8s.io/v1beta1", "kubelet.config.k8s.io/v1alpha1"];
/// The plugin protocol's API versions.
pub const PLUGIN_API_VERSIONS: [&str; 3] = [
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
];

/// One validated provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    pub name: String,
    /// The plugin's executable: the bin dir joined with the name.
    pub executable: PathBuf,
    pub match_images: Vec<String>,
    pub default_cache_duration: Duration,
    /// The protocol version of requests and expected responses.
    pub api_version: String,
    pub args: Vec<String>,
    /// Added to the daemon's own environment, overriding it.
    pub env: Vec<(String, String)>,
    /// Set when the plugin is given the pod's service-account token (KEP-4412).
    pub token_attributes: Option<TokenAttributes>,
}

/// Why the config cannot be used; each message names the file and, where it can, the provider.
#[derive(Debug, thiserror::Error)]
pub enum PluginConfigError {
    #[error("cannot read the credential provider config {path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("the credential provider config {path} does not decode: {error}")]
    Decode { path: PathBuf, error: String },
    #[error("the credential provider config {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    api_version: String,
    kind: String,
    #[serde(default)]
    providers: Vec<Provider>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Provider {
    #[serde(default)]
    name: String,
    #[serde(default)]
    match_images: Vec<String>,
    default_cache_duration: Option<String>,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    /// Read only in `kubelet.config.k8s.io/v1` files (checked in [`token::validate`]).
    token_attributes: Option<token::RawTokenAttributes>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvVar {
    name: String,
    value: String,
}

/// Reads and validates the config at `path`, with plugins in `bin_dir`.
pub fn load(path: &Path, bin_dir: &Path) -> Result<Vec<ProviderConfig>, PluginConfigError> {
    let read_error = |error| PluginConfigError::Read { path: path.to_owned(), error };
    let bytes = crate::files::read_named(path, 1 << 20).map_err(read_error)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| read_error(std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text")))?;
    let invalid = |message: String| PluginConfigError::Invalid { path: path.to_owned(), message };
    let file: File = serde_yaml_ng::from_str(&text)
        .map_err(|error| PluginConfigError::Decode { path: path.to_owned(), error: error.to_string() })?;
    if file.kind != "CredentialProviderConfig" {
        return Err(invalid(format!("kind is {:?}, not \"CredentialProviderConfig\"", file.kind)));
    }
    if !CONFIG_API_VERSIONS.contains(&file.api_version.as_str()) {
        return Err(invalid(format!(
            "apiVersion {:?} is not one of {}",
            file.api_version,
            CONFIG_API_VERSIONS.join(", ")
        )));
    }
    validate(file.providers, &file.api_version, bin_dir).map_err(invalid)
}

/// The kubelet's checks, in its words where it has them.
fn validate(providers: Vec<Provider>, config_api_version: &str, bin_dir: &Path) -> Result<Vec<ProviderConfig>, String> {
    if providers.is_empty() {
        return Err("providers: at least 1 item in plugins is required".to_owned());
    }
    if !bin_dir.is_absolute() {
        return Err(format!("the plugin bin dir {} must be an absolute path", bin_dir.display()));
    }
    let mut names = HashSet::new();
    providers
        .into_iter()
        .enumerate()
        .map(|(index, provider)| {
            let at = |field: &str| format!("providers[{index}].{field}");
            if provider.name.is_empty() {
                return Err(format!("{}: name is required", at("name")));
            }
            if provider.name.contains(['/', '\\']) || provider.name == "." || provider.name == ".." {
                return Err(format!("{}: provider name cannot contain path separators, '.' or '..'", at("name")));
            }
            if !names.insert(provider.name.clone()) {
                return Err(format!("{}: duplicate names are not allowed", at("name")));
            }
            if provider.match_images.is_empty() {
                return Err(format!("{}: at least 1 item in matchImages is required", at("matchImages")));
            }
            for image in &provider.match_images {
                if crate::credentials::keyring::normalise_key(image).is_none() {
                    return Err(format!("{}: match image {image:?} is invalid", at("matchImages")));
                }
            }
            let default_cache_duration = match provider.default_cache_duration.as_deref() {
                None => return Err(format!("{}: defaultCacheDuration is required", at("defaultCacheDuration"))),
                Some(text) => duration::parse_go(text).map_err(|error| match error {
                    DurationError::Negative(_) => {
                        format!(
                            "{}: defaultCacheDuration must be greater than or equal to 0",
                            at("defaultCacheDuration")
                        )
                    }
                    _ => format!("{}: {error}", at("defaultCacheDuration")),
                })?,
            };
            if provider.api_version.is_empty() {
                return Err(format!("{}: apiVersion is required", at("apiVersion")));
            }
            if !PLUGIN_API_VERSIONS.contains(&provider.api_version.as_str()) {
                return Err(format!(
                    "{}: apiVersion must be one of {}",
                    at("apiVersion"),
                    PLUGIN_API_VERSIONS.join(", ")
                ));
            }
            let token_attributes = provider
                .token_attributes
                .map(|raw| token::validate(raw, config_api_version, &provider.api_version, &at("tokenAttributes")))
                .transpose()?;
            let executable = bin_dir.join(&provider.name);
            if let Err(error) = std::fs::metadata(&executable) {
                return Err(format!(
                    "{}: error inspecting binary executable {}: {error}",
                    at("name"),
                    executable.display()
                ));
            }
            Ok(ProviderConfig {
                name: provider.name,
                executable,
                match_images: provider.match_images,
                default_cache_duration,
                api_version: provider.api_version,
                args: provider.args,
                env: provider.env.into_iter().map(|var| (var.name, var.value)).collect(),
                token_attributes,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
