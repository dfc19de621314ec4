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
mod registries_conf;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use http::{HeaderName, HeaderValue};

use self::{
    file::{HostEntry, HostUrl, HostsFileError, parse},
    registries_conf::{ConfHost, ConfRegistry, drop_in_dir, merge},
};
use super::{
    endpoint::{Capabilities, Endpoint, is_loopback, split_port},
    tls::{CA_FILE_LIMIT, Tls, pem_certificates},
};
use crate::files::read_named;

/// containerd's default `config_path` directory for hosts.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/containerd/certs.d";
/// CRI-O's registries configuration (containers-registries.conf(5)).
pub const DEFAULT_REGISTRIES_CONF: &str = "/etc/containers/registries.conf";
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

/// Every host directory read, by directory of the path and by name; or CRI-O's registries.conf.
#[derive(Debug, Default)]
pub struct HostsConfig {
    roots: Vec<BTreeMap<String, Vec<Host>>>,
    /// From a registries.conf: each registry's hosts, by its name in references.
    registries: BTreeMap<String, Vec<Host>>,
    /// From a registries.conf: registries no host of which may be asked.
    blocked: BTreeSet<String>,
}

/// A registries.conf or drop-in is a few KiB; drop-ins read at most.
const REGISTRIES_CONF_LIMIT: u64 = 256 * 1024;
const DROP_INS: usize = 256;

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
        Self { roots, ..Self::default() }
    }

    /// containerd's host directories where one of `config_path`'s exists; else, where the file
    /// `registries_conf` exists (CRI-O's node), its registries; else the defaults.
    pub fn load_either(config_path: &Path, registries_conf: &Path) -> Self {
        let text = config_path.to_string_lossy();
        let dirs = text.split(':').filter(|dir| !dir.is_empty()).any(|dir| Path::new(dir).is_dir());
        if dirs || registries_conf.as_os_str().is_empty() || !registries_conf.exists() {
            return Self::load(config_path);
        }
        Self::from_registries_conf(registries_conf)
    }

    /// The registries of `path` and its drop-ins; what does not read is logged and passed over
    /// (a drop-in), or leaves the defaults (the file itself).
    fn from_registries_conf(path: &Path) -> Self {
        let mut files = vec![path.to_owned()];
        let mut drop_ins: Vec<PathBuf> = std::fs::read_dir(drop_in_dir(path))
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .take(HOST_DIRS)
            .filter(|path| path.extension().is_some_and(|extension| extension == "conf"))
            .collect();
        // The first in lexical order, as CRI-O reads them.
        drop_ins.sort();
        drop_ins.truncate(DROP_INS);
        files.extend(drop_ins);
        let mut parsed = Vec::new();
        for file in &files {
            let read = read_named(file, REGISTRIES_CONF_LIMIT).map_err(|error| error.to_string()).and_then(|bytes| {
                let text = String::from_utf8(bytes).map_err(|_| "not UTF-8".to_owned())?;
                registries_conf::parse(&text).map_err(|error| error.to_string())
            });
            match read {
                Ok(read) => {
                    if !read.ignored.is_empty() {
                        tracing::info!(file = %file.display(), ignored = ?read.ignored, "registries.conf: settings cri-imaged does not use, passed over");
                    }
                    parsed.push(read);
                }
                Err(error) if file == path => {
                    tracing::warn!(file = %file.display(), %error, "registries.conf: not read; registries are reached as by default");
                    return Self::default();
                }
                Err(error) => {
                    tracing::warn!(file = %file.display(), %error, "registries.conf: this drop-in is not read")
                }
            }
        }
        let mut config = Self::default();
        for registry in merge(parsed) {
            if registry.blocked {
                config.blocked.insert(registry.prefix);
                continue;
            }
            let ConfRegistry { prefix, location, mirrors, .. } = registry;
            let hosts = mirrors.iter().chain([&location]).flat_map(conf_hosts).collect();
            config.registries.insert(prefix, hosts);
        }
        config
    }

    /// The hosts to ask for `domain`'s repositories, in order: none for a blocked registry.
    pub fn endpoints(&self, domain: &str) -> Vec<Endpoint> {
        if self.blocked.contains(domain) {
            return Vec::new();
        }
        if let Some(hosts) = self.registries.get(domain) {
            return hosts.iter().map(|host| host.endpoint(domain)).collect();
        }
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

/// A registries.conf host: over TLS (plain HTTP for a loopback one, as by default); an insecure
/// one over TLS unverified, then plain HTTP, as containers/image falls back.
fn conf_hosts(conf: &ConfHost) -> Vec<Host> {
    let authority = if conf.location == "docker.io" { "registry-1.docker.io" } else { conf.location.as_str() };
    let at = |plain_http: bool, skip_verify: Option<bool>| {
        let url = HostUrl { plain_http, authority: authority.to_owned(), root: "/v2".to_owned() };
        let entry = HostEntry {
            url: Some(url),
            capabilities: None,
            ca: Vec::new(),
            skip_verify,
            headers: Vec::new(),
            dial_timeout: None,
        };
        host(entry, Path::new("registries.conf"))
    };
    match (conf.insecure, is_loopback(split_port(authority).0)) {
        (_, true) => vec![at(true, None)],
        (true, false) => vec![at(false, Some(true)), at(true, None)],
        (false, false) => vec![at(false, None)],
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
