//! One hosts.toml, read as containerd reads it (core/remotes/docker/config/hosts.go): the
//! `[host."URL"]` tables in the file's order, then the top level (`server`, or containerd's
//! default host when there is none) last. Each takes `capabilities`, `ca` (a path or a list,
//! relative to the file's directory), `skip_verify`, `header`, `override_path` and
//! `dial_timeout`. A key containerd does not know is passed over, as it does; `client` (TLS client
//! certificates) is known but not honoured: both are listed for a warning. A value of the wrong
//! type, or an unknown capability, makes the file unreadable, as it does for containerd.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use toml::{Table, Value};

use crate::registry::endpoint::Capabilities;

/// Why a hosts.toml was not read.
#[derive(Debug, thiserror::Error)]
pub enum HostsFileError {
    #[error("not TOML: {0}")]
    Toml(String),
    #[error("{key}: expected {expected}")]
    Type { key: String, expected: &'static str },
    #[error("{key}: unknown capability {value:?} (pull, resolve, push)")]
    Capability { key: String, value: String },
    #[error("{key}: {value:?} is not an http or https URL")]
    Url { key: String, value: String },
    #[error("{key}: {value:?} is not a Go duration")]
    Duration { key: String, value: String },
}

/// A URL as hosts.toml names a host, made absolute as containerd makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostUrl {
    pub plain_http: bool,
    /// `host[:port]`.
    pub authority: String,
    /// The API root: the URL's path with `/v2` added, unless `override_path`.
    pub root: String,
}

/// One host of a hosts.toml, in the order tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    /// `None`: the top level without `server`, which is the registry's default host.
    pub url: Option<HostUrl>,
    /// `None`: every capability (none written).
    pub capabilities: Option<Capabilities>,
    /// CA files, absolute.
    pub ca: Vec<PathBuf>,
    pub skip_verify: Option<bool>,
    pub headers: Vec<(String, String)>,
    pub dial_timeout: Option<Duration>,
}

/// A hosts.toml's hosts and the keys in it that are not honoured.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub hosts: Vec<HostEntry>,
    pub ignored: Vec<String>,
}

/// The keys of a host's table (the top level has `server` and `host` besides).
const HOST_KEYS: [&str; 7] = ["capabilities", "ca", "client", "skip_verify", "header", "override_path", "dial_timeout"];

/// Reads `text`, a hosts.toml in `dir`.
pub fn parse(text: &str, dir: &Path) -> Result<Parsed, HostsFileError> {
    let table: Table = toml::from_str(text).map_err(|error| HostsFileError::Toml(error.message().to_owned()))?;
    let mut parsed = Parsed::default();
    if let Some(hosts) = table.get("host") {
        let hosts = hosts.as_table().ok_or(HostsFileError::Type { key: "host".into(), expected: "a table" })?;
        for (url, host) in hosts {
            let key = format!("host.{url:?}");
            let host = host.as_table().ok_or(HostsFileError::Type { key: key.clone(), expected: "a table" })?;
            parsed.hosts.push(entry(Some(url), host, &key, dir, &mut parsed.ignored)?);
        }
    }
    let server = match table.get("server") {
        Some(Value::String(server)) if !server.is_empty() => Some(server.clone()),
        Some(Value::String(_)) | None => None,
        Some(_) => return Err(HostsFileError::Type { key: "server".into(), expected: "a string" }),
    };
    let top: Table = table.into_iter().filter(|(key, _)| key != "host" && key != "server").collect();
    parsed.hosts.push(entry(server.as_deref(), &top, "", dir, &mut parsed.ignored)?);
    Ok(parsed)
}

/// One host's table (`prefix` names it in messages: `host."URL"`, or nothing at the top level).
fn entry(
    url: Option<&str>,
    table: &Table,
    prefix: &str,
    dir: &Path,
    ignored: &mut Vec<String>,
) -> Result<HostEntry, HostsFileError> {
    let name = |key: &str| if prefix.is_empty() { key.to_owned() } else { format!("{prefix}.{key}") };
    for key in table.keys() {
        if !HOST_KEYS.contains(&key.as_str()) || key == "client" {
            ignored.push(name(key));
        }
    }
    let override_path = match table.get("override_path") {
        Some(value) => {
            value.as_bool().ok_or(HostsFileError::Type { key: name("override_path"), expected: "true or false" })?
        }
        None => false,
    };
    let url = url
        .map(|url| host_url(url, override_path).ok_or(HostsFileError::Url { key: name("server"), value: url.into() }));
    let capabilities = match table.get("capabilities") {
        None => None,
        Some(value) => {
            let mut found = Capabilities { resolve: false, pull: false };
            for capability in strings(value, &name("capabilities"))? {
                match capability.to_ascii_lowercase().as_str() {
                    "pull" => found.pull = true,
                    "resolve" => found.resolve = true,
                    "push" => {}
                    _ => return Err(HostsFileError::Capability { key: name("capabilities"), value: capability }),
                }
            }
            // containerd takes an empty list as none written.
            if value.as_array().is_some_and(Vec::is_empty) { None } else { Some(found) }
        }
    };
    let ca = match table.get("ca") {
        None => Vec::new(),
        Some(value) => strings(value, &name("ca"))?.into_iter().map(|path| dir.join(path)).collect(),
    };
    let skip_verify = match table.get("skip_verify") {
        None => None,
        Some(value) => {
            Some(value.as_bool().ok_or(HostsFileError::Type { key: name("skip_verify"), expected: "true or false" })?)
        }
    };
    let mut headers = Vec::new();
    if let Some(value) = table.get("header") {
        let header = value.as_table().ok_or(HostsFileError::Type { key: name("header"), expected: "a table" })?;
        for (key, values) in header {
            for value in strings(values, &name(&format!("header.{key}")))? {
                headers.push((key.clone(), value));
            }
        }
    }
    let dial_timeout = match table.get("dial_timeout") {
        None => None,
        Some(Value::String(text)) => Some(
            crate::duration::parse_go(text)
                .map_err(|_| HostsFileError::Duration { key: name("dial_timeout"), value: text.clone() })?,
        ),
        Some(_) => return Err(HostsFileError::Type { key: name("dial_timeout"), expected: "a duration string" }),
    };
    Ok(HostEntry { url: url.transpose()?, capabilities, ca, skip_verify, headers, dial_timeout })
}

/// A string, or a list of strings (containerd takes either for `ca`, a header, `capabilities`).
fn strings(value: &Value, key: &str) -> Result<Vec<String>, HostsFileError> {
    let wrong = || HostsFileError::Type { key: key.to_owned(), expected: "a string or a list of strings" };
    match value {
        Value::String(one) => Ok(vec![one.clone()]),
        Value::Array(many) => many.iter().map(|item| item.as_str().map(str::to_owned).ok_or_else(wrong)).collect(),
        _ => Err(wrong()),
    }
}

/// containerd's parseHostConfig: no scheme is `https://`; the path cleaned, `/v2` added unless
/// `override_path`.
fn host_url(url: &str, override_path: bool) -> Option<HostUrl> {
    let absolute = match url {
        url if url.starts_with("http://") || url.starts_with("https://") => url.to_owned(),
        url if url.contains("://") => return None,
        url => format!("https://{url}"),
    };
    let uri: http::Uri = absolute.parse().ok()?;
    let plain_http = match uri.scheme_str()? {
        "http" => true,
        "https" => false,
        _ => return None,
    };
    let authority = uri.authority()?.as_str().to_owned();
    if authority.contains('@') {
        return None;
    }
    let mut root = clean(uri.path());
    if !override_path && !root.ends_with("/v2") {
        root.push_str("/v2");
    }
    Some(HostUrl { plain_http, authority, root })
}

/// A path without empty, `.` and `..` segments, nor a final `/`; `""` for the root.
fn clean(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            segment => segments.push(segment),
        }
    }
    segments.iter().map(|segment| format!("/{segment}")).collect()
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
