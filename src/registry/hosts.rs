//! containerd's registry host settings (its CRI `config_path`, `--registry-config-path`), so that a
//! registry containerd pulls from is one cri-imaged reads signatures from: read at start and on
//! reload, never per request; looked up per registry as containerd looks them up.
//!
//! For a registry `H` (`docker.io`, `host:port`), each directory of the path (`:`-separated) in
//! turn: `H_port_` (containerd's spelling without a colon), then `H`, then `_default`; the first
//! that exists is the registry's. In it, `hosts.toml` (see `file`); without one (or one that does
//! not parse, as containerd falls back) Docker's layout: each `*.crt` is a CA of the default host.
//! Files are read as hostile input: regular files (links followed, as a ConfigMap mounts them),
//! each bounded, a bounded number of directories.

mod file;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use http::{HeaderName, HeaderValue};

use self::file::{HostEntry, HostUrl, HostsFileError, parse};
use super::{
    endpoint::{Capabilities, Endpoint, split_port},
    tls::{CA_FILE_LIMIT, Tls, pem_certificates},
};
use crate::files::read_named;

/// containerd's default `config_path` directory for hosts.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/containerd/certs.d";
/// A hosts.toml is a few hundred bytes.
const HOSTS_FILE_LIMIT: u64 = 256 * 1024;
/// Host directories read from one directory of the path; CA files from one host directory.
const HOST_DIRS: usize = 4096;
const CERT_FILES: usize = 64;

/// The settings in force, replaced whole on reload; read once per verification.
#[derive(Debug, Default)]
pub struct RegistryHosts(RwLock<Arc<HostsConfig>>);

impl RegistryHosts {
    pub fn current(&self) -> Arc<HostsConfig> {
        self.0.read().map_or_else(|poisoned| poisoned.into_inner().clone(), |hosts| hosts.clone())
    }

    pub fn replace(&self, hosts: HostsConfig) {
        match self.0.write() {
            Ok(mut current) => *current = Arc::new(hosts),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(hosts),
        }
    }
}

/// Every host directory read, by directory of the path and by name.
#[derive(Debug, Default)]
pub struct HostsConfig {
    roots: Vec<BTreeMap<String, Vec<Host>>>,
}

/// A host of a host directory, its files read.
#[derive(Debug, Clone)]
struct Host {
    url: Option<HostUrl>,
    capabilities: Capabilities,
    headers: Arc<[(HeaderName, HeaderValue)]>,
    /// Shared by every verification until the next reload, so its client config is built once.
    tls: Arc<Tls>,
    dial_timeout: Option<std::time::Duration>,
}

impl HostsConfig {
    /// Reads the directories of `config_path` (`:`-separated; empty: none, containerd's defaults
    /// everywhere). Nothing here stops the daemon, as nothing stops containerd: what cannot be read
    /// is logged, and a host whose `ca` does not read fails each connection saying so.
    pub fn load(config_path: &Path) -> Self {
        let text = config_path.to_string_lossy();
        let roots = text.split(':').filter(|dir| !dir.is_empty()).map(|dir| read_root(Path::new(dir))).collect();
        Self { roots }
    }

    /// The hosts to ask for `domain`'s repositories, in order.
    pub fn endpoints(&self, domain: &str) -> Vec<Endpoint> {
        let Some(hosts) = self.roots.iter().find_map(|root| directory_names(domain).find_map(|name| root.get(&name)))
        else {
            return vec![Endpoint::of(domain)];
        };
        hosts.iter().map(|host| host.endpoint(domain)).collect()
    }
}

impl Host {
    fn endpoint(&self, domain: &str) -> Endpoint {
        let mut endpoint = match &self.url {
            Some(url) => {
                let (host, port) = split_port(&url.authority);
                let port = port.unwrap_or(if url.plain_http { 80 } else { 443 });
                let mut endpoint = Endpoint::at(url.plain_http, host, port, &url.root);
                endpoint.capabilities = self.capabilities;
                endpoint
            }
            // containerd's default host, every capability whatever the top level says.
            None => Endpoint::of(domain),
        };
        endpoint.headers = self.headers.clone();
        endpoint.tls = self.tls.clone();
        endpoint.dial_timeout = self.dial_timeout;
        endpoint
    }
}

/// containerd's hostPaths: `host_port_` first for a host with a port, then as named, then
/// `_default`.
fn directory_names(domain: &str) -> impl Iterator<Item = String> {
    let spelled = domain
        .rfind(':')
        .filter(|&colon| colon > 0)
        .map(|colon| format!("{}_{}_", &domain[..colon], &domain[colon + 1..]));
    spelled.into_iter().chain([domain.to_owned(), "_default".to_owned()])
}

/// Each host directory of `dir`.
fn read_root(dir: &Path) -> BTreeMap<String, Vec<Host>> {
    let mut hosts = BTreeMap::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return hosts,
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "registry hosts: the directory cannot be read; containerd's defaults apply");
            return hosts;
        }
    };
    for entry in entries.flatten() {
        // Links followed: a ConfigMap's directories are links.
        if !entry.path().is_dir() {
            continue;
        }
        if hosts.len() == HOST_DIRS {
            tracing::warn!(dir = %dir.display(), "registry hosts: more than {HOST_DIRS} host directories; the rest are not read");
            break;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        hosts.insert(name, read_host_dir(&entry.path()));
    }
    hosts
}

/// One host directory: its hosts.toml, else Docker's `*.crt` files.
fn read_host_dir(dir: &Path) -> Vec<Host> {
    let file = dir.join("hosts.toml");
    let parsed = match read_named(&file, HOSTS_FILE_LIMIT) {
        Ok(bytes) => match std::str::from_utf8(&bytes)
            .map_err(|_| HostsFileError::Toml("not UTF-8".into()))
            .and_then(|text| parse(text, dir))
        {
            Ok(parsed) => Some(parsed),
            Err(error) => {
                tracing::warn!(file = %file.display(), %error, "registry hosts: not read, as containerd does not read it (its *.crt files are)");
                None
            }
        },
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => {
            tracing::warn!(file = %file.display(), %error, "registry hosts: not read");
            None
        }
    };
    let Some(parsed) = parsed else { return vec![cert_files(dir)] };
    if !parsed.ignored.is_empty() {
        tracing::warn!(file = %file.display(), ignored = ?parsed.ignored, "registry hosts: settings cri-imaged does not honour, passed over");
    }
    parsed.hosts.into_iter().map(|entry| host(entry, &file)).collect()
}

/// Docker's certs.d layout: every `*.crt` a CA of the default host (client `*.cert` not honoured).
fn cert_files(dir: &Path) -> Host {
    let mut ca: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "crt"))
        .take(CERT_FILES)
        .collect();
    ca.sort();
    host(
        HostEntry { url: None, capabilities: None, ca, skip_verify: None, headers: Vec::new(), dial_timeout: None },
        dir,
    )
}

/// A host's entry with its CA files read (`source` names where it was written, for messages).
fn host(entry: HostEntry, source: &Path) -> Host {
    let mut headers = Vec::new();
    for (name, value) in entry.headers {
        match (HeaderName::try_from(name.as_str()), HeaderValue::try_from(value)) {
            (Ok(name), Ok(value)) => headers.push((name, value)),
            // The value may be a secret: only the name is said.
            _ => {
                tracing::warn!(file = %source.display(), header = %crate::messages::echo(&name), "registry hosts: a header that is not HTTP's, passed over")
            }
        }
    }
    let tls = if entry.ca.is_empty() && entry.skip_verify.is_none() {
        Tls::system()
    } else {
        let (mut cas, mut broken) = (Vec::new(), None);
        for path in &entry.ca {
            match read_named(path, CA_FILE_LIMIT) {
                Ok(bytes) => match pem_certificates(&bytes) {
                    found if found.is_empty() => {
                        broken = Some(format!("{}: ca {}: no PEM certificate in it", source.display(), path.display()))
                    }
                    found => cas.extend(found),
                },
                Err(error) => {
                    let reason = match error.kind() {
                        std::io::ErrorKind::NotFound => "no such file".to_owned(),
                        _ => error.to_string(),
                    };
                    broken = Some(format!("{}: ca {}: {reason}", source.display(), path.display()));
                }
            }
        }
        if let Some(broken) = &broken {
            tracing::warn!(reason = %broken, "registry hosts: this host cannot be reached over TLS until fixed (as containerd cannot)");
        }
        Arc::new(Tls::new(cas, entry.skip_verify.unwrap_or(false), broken))
    };
    Host {
        url: entry.url,
        capabilities: entry.capabilities.unwrap_or(Capabilities::ALL),
        headers: Arc::from(headers),
        tls,
        dial_timeout: entry.dial_timeout,
    }
}

#[cfg(test)]
mod tests;
