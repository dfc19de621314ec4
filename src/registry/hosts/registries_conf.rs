//! containers-registries.conf(5), version 2, as CRI-O reads it: `/etc/containers/registries.conf`
//! then each `registries.conf.d/*.conf` beside it in lexical order, a later `[[registry]]` with
//! the same `prefix` replacing an earlier one. A registry's hosts are its mirrors in order, then
//! its `location` (the prefix itself when none); `insecure` lets a host be reached over plain
//! HTTP or TLS unverified; `blocked` means no host of it is asked at all.
//!
//! Only what names a whole registry is honoured: a prefix or location with a repository path or a
//! wildcard (`*.example.com`) is passed over, listed for a warning, as are keys this reader does
//! not use (search registries, aliases, short names: the runtime's business). A value of the wrong
//! type, or a version 1 file, makes the file unreadable, saying which field or line.

use toml::{Table, Value};

/// Why a registries.conf was not read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistriesConfError {
    #[error("line {line}: not TOML: {reason}")]
    Toml { line: usize, reason: String },
    #[error("{key}: expected {expected}")]
    Type { key: String, expected: &'static str },
    #[error("{key}: a registry needs a prefix or a location")]
    Unnamed { key: String },
    #[error("[registries.*] is version 1 of the format, which is not read: write [[registry]] tables")]
    Version1,
}

/// A host of a registry: `host[:port]`, and whether it may be reached insecurely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfHost {
    pub location: String,
    pub insecure: bool,
}

/// One `[[registry]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfRegistry {
    /// The registry's name in references: `host[:port]`.
    pub prefix: String,
    pub location: ConfHost,
    pub mirrors: Vec<ConfHost>,
    pub blocked: bool,
}

/// A file's registries and what in it is passed over.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ConfParsed {
    pub registries: Vec<ConfRegistry>,
    pub ignored: Vec<String>,
}

const TOP_KEYS: [&str; 6] = [
    "registry",
    "unqualified-search-registries",
    "short-name-mode",
    "aliases",
    "credential-helpers",
    "additional-layer-store-auth-helper",
];
const REGISTRY_KEYS: [&str; 7] =
    ["prefix", "location", "insecure", "blocked", "mirror", "mirror-by-digest-only", "pull-from-mirror"];
const MIRROR_KEYS: [&str; 3] = ["location", "insecure", "pull-from-mirror"];

/// Reads `text`, one registries.conf or drop-in.
pub fn parse(text: &str) -> Result<ConfParsed, RegistriesConfError> {
    let table: Table = toml::from_str(text).map_err(|error| {
        let line = error.span().map_or(1, |span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        RegistriesConfError::Toml { line, reason: error.message().to_owned() }
    })?;
    if table.contains_key("registries") {
        return Err(RegistriesConfError::Version1);
    }
    let mut parsed = ConfParsed::default();
    for key in table.keys().filter(|key| !TOP_KEYS.contains(&key.as_str())) {
        parsed.ignored.push(key.clone());
    }
    let Some(registries) = table.get("registry") else { return Ok(parsed) };
    let registries = registries
        .as_array()
        .ok_or(RegistriesConfError::Type { key: "registry".into(), expected: "[[registry]] tables" })?;
    for (index, registry) in registries.iter().enumerate() {
        let key = format!("registry[{index}]");
        let registry =
            registry.as_table().ok_or(RegistriesConfError::Type { key: key.clone(), expected: "a table" })?;
        if let Some(read) = read_registry(registry, &key, &mut parsed.ignored)? {
            parsed.registries.push(read);
        }
    }
    Ok(parsed)
}

/// One `[[registry]]`; `None` when it names no whole registry (passed over, listed).
fn read_registry(
    table: &Table,
    key: &str,
    ignored: &mut Vec<String>,
) -> Result<Option<ConfRegistry>, RegistriesConfError> {
    for name in table.keys().filter(|name| !REGISTRY_KEYS.contains(&name.as_str())) {
        ignored.push(format!("{key}.{name}"));
    }
    let location = string(table, key, "location")?.unwrap_or_default();
    let prefix = string(table, key, "prefix")?.filter(|prefix| !prefix.is_empty()).unwrap_or_else(|| location.clone());
    if prefix.is_empty() {
        return Err(RegistriesConfError::Unnamed { key: key.to_owned() });
    }
    let insecure = boolean(table, key, "insecure")?;
    let blocked = boolean(table, key, "blocked")?;
    let mut mirrors = Vec::new();
    if let Some(value) = table.get("mirror") {
        let wrong =
            || RegistriesConfError::Type { key: format!("{key}.mirror"), expected: "[[registry.mirror]] tables" };
        for (index, mirror) in value.as_array().ok_or_else(wrong)?.iter().enumerate() {
            let key = format!("{key}.mirror[{index}]");
            let mirror =
                mirror.as_table().ok_or(RegistriesConfError::Type { key: key.clone(), expected: "a table" })?;
            for name in mirror.keys().filter(|name| !MIRROR_KEYS.contains(&name.as_str())) {
                ignored.push(format!("{key}.{name}"));
            }
            let location = string(mirror, &key, "location")?.unwrap_or_default();
            let insecure = boolean(mirror, &key, "insecure")?;
            if whole_registry(&location) {
                mirrors.push(ConfHost { location, insecure });
            } else {
                ignored.push(format!("{key}.location"));
            }
        }
    }
    if !whole_registry(&prefix) || !(location.is_empty() || whole_registry(&location)) {
        ignored.push(format!("{key} ({prefix})"));
        return Ok(None);
    }
    let location = if location.is_empty() { prefix.clone() } else { location };
    Ok(Some(ConfRegistry { prefix, location: ConfHost { location, insecure }, mirrors, blocked }))
}

/// `host[:port]` alone: no repository path, no wildcard, no scheme.
fn whole_registry(name: &str) -> bool {
    !name.is_empty() && !name.contains(['/', '*', '@', ' ']) && !name.contains("://")
}

fn string(table: &Table, key: &str, name: &str) -> Result<Option<String>, RegistriesConfError> {
    match table.get(name) {
        None => Ok(None),
        Some(Value::String(value)) => Ok(Some(value.trim().to_owned())),
        Some(_) => Err(RegistriesConfError::Type { key: format!("{key}.{name}"), expected: "a string" }),
    }
}

fn boolean(table: &Table, key: &str, name: &str) -> Result<bool, RegistriesConfError> {
    match table.get(name) {
        None => Ok(false),
        Some(Value::Boolean(value)) => Ok(*value),
        Some(_) => Err(RegistriesConfError::Type { key: format!("{key}.{name}"), expected: "true or false" }),
    }
}

/// Where the drop-ins of the registries.conf at `path` are: `registries.conf.d` beside it.
pub fn drop_in_dir(path: &std::path::Path) -> std::path::PathBuf {
    let mut dir = path.as_os_str().to_owned();
    dir.push(".d");
    dir.into()
}

/// The files read together, a later registry replacing an earlier one of the same prefix.
pub fn merge(files: impl IntoIterator<Item = ConfParsed>) -> Vec<ConfRegistry> {
    let mut merged: Vec<ConfRegistry> = Vec::new();
    for file in files {
        for registry in file.registries {
            match merged.iter_mut().find(|earlier| earlier.prefix == registry.prefix) {
                Some(earlier) => *earlier = registry,
                None => merged.push(registry),
            }
        }
    }
    merged
}

#[cfg(test)]
#[path = "registries_conf_tests.rs"]
mod tests;
