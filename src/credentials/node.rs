//! The node's docker config: the credentials every pod on the node may use, read from a
//! `config.json` (or the older `.dockercfg`) the kubelet's way and re-read when the file changes.
//!
//! Without `--node-docker-config`, the first file found wins, in the kubelet's order: `config.json`
//! in the root dir, the working directory, `$HOME/.docker` and `/.docker`; then `.dockercfg` in
//! the root dir, the working directory, `$HOME` and `/`.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::SystemTime,
};

use super::{
    Credential, CredentialSource,
    dockercfg::{self, DockerConfigError, Shape},
};

/// The node's entries: each registry key with its credential.
pub type Entries = Arc<Vec<(String, Arc<Credential>)>>;

/// Why the node's docker config cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NodeConfigError {
    #[error("cannot read the node docker config {path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("the node docker config {path} {error}")]
    Parse { path: PathBuf, error: DockerConfigError },
}

/// One place a config may be, and how it is written.
#[derive(Debug, Clone)]
struct Candidate {
    path: PathBuf,
    shape: Shape,
}

/// What identifies one version of a file, so that a change is noticed without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileVersion {
    path: PathBuf,
    inode: u64,
    len: u64,
    modified: Option<SystemTime>,
}

struct Loaded {
    version: Option<FileVersion>,
    entries: Entries,
    /// A version that failed to read, so that it is reported once rather than on every pull.
    failed: Option<FileVersion>,
}

/// The node's docker config, kept current.
pub struct NodeDockerConfig {
    candidates: Vec<Candidate>,
    loaded: Mutex<Loaded>,
}

impl NodeDockerConfig {
    /// No node credentials.
    pub fn none() -> Self {
        Self::from_candidates(Vec::new())
    }

    /// Exactly `path`; a file named `.dockercfg` is read in that format, anything else as a
    /// `config.json`. The file must exist and parse now.
    pub fn explicit(path: PathBuf) -> Result<Self, NodeConfigError> {
        let shape = if path.file_name().is_some_and(|name| name == ".dockercfg") {
            Shape::Dockercfg
        } else {
            Shape::ConfigJson
        };
        let config = Self::from_candidates(vec![Candidate { path: path.clone(), shape }]);
        if config.load()?.is_none() {
            let error = crate::files::read::missing();
            return Err(NodeConfigError::Read { path, error });
        }
        Ok(config)
    }

    /// The kubelet's search, from `root_dir`, `working_dir` and `home`. A file that is found
    /// but does not read or parse is an error now, not silently passed over.
    pub fn search(root_dir: &Path, working_dir: &Path, home: Option<&Path>) -> Result<Self, NodeConfigError> {
        let mut json_dirs = vec![root_dir.to_owned(), working_dir.to_owned()];
        let mut cfg_dirs = json_dirs.clone();
        if let Some(home) = home {
            json_dirs.push(home.join(".docker"));
            cfg_dirs.push(home.to_owned());
        }
        json_dirs.push(PathBuf::from("/.docker"));
        cfg_dirs.push(PathBuf::from("/"));
        let json =
            json_dirs.into_iter().map(|dir| Candidate { path: dir.join("config.json"), shape: Shape::ConfigJson });
        let cfg = cfg_dirs.into_iter().map(|dir| Candidate { path: dir.join(".dockercfg"), shape: Shape::Dockercfg });
        let config = Self::from_candidates(json.chain(cfg).collect());
        config.load()?;
        Ok(config)
    }

    fn from_candidates(candidates: Vec<Candidate>) -> Self {
        Self { candidates, loaded: Mutex::new(Loaded { version: None, entries: Entries::default(), failed: None }) }
    }

    /// Where the credentials now in use were read from, if anywhere.
    pub fn path(&self) -> Option<PathBuf> {
        self.loaded.lock().unwrap_or_else(PoisonError::into_inner).version.as_ref().map(|version| version.path.clone())
    }

    /// The current entries: re-read when the file found first is another file, or the same file
    /// changed. A file that no longer parses keeps the entries read before, with a warning.
    pub fn current(&self) -> Entries {
        if let Err(error) = self.load() {
            tracing::warn!(%error, "keeping the node credentials read before");
        }
        self.loaded.lock().unwrap_or_else(PoisonError::into_inner).entries.clone()
    }

    /// Reloads when the first file found is not the one loaded; returns where it read from.
    fn load(&self) -> Result<Option<PathBuf>, NodeConfigError> {
        let found = self.candidates.iter().find_map(|candidate| Some((candidate, version_of(&candidate.path)?)));
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        let version = found.as_ref().map(|(_, version)| version.clone());
        if loaded.version == version || (version.is_some() && loaded.failed == version) {
            return Ok(loaded.version.as_ref().map(|version| version.path.clone()));
        }
        let Some((candidate, version)) = found else {
            tracing::info!("no node docker config found; node credentials cleared");
            *loaded = Loaded { version: None, entries: Entries::default(), failed: None };
            return Ok(None);
        };
        // Credentials for a whole node fit in far less; a FIFO or a device is refused at once.
        let read = crate::files::read_named(&candidate.path, 1 << 20)
            .map_err(|error| NodeConfigError::Read { path: candidate.path.clone(), error })
            .and_then(|mut document| {
                let parsed = dockercfg::parse(&document, candidate.shape)
                    .map_err(|error| NodeConfigError::Parse { path: candidate.path.clone(), error });
                zeroize::Zeroize::zeroize(&mut document);
                parsed
            });
        let entries = match read {
            Ok(entries) => entries,
            Err(error) => {
                loaded.failed = Some(version);
                return Err(error);
            }
        };
        tracing::info!(path = %candidate.path.display(), registries = entries.len(), "node docker config read");
        let entries = entries
            .into_iter()
            .map(|entry| {
                (entry.key, Arc::new(Credential { auth: Arc::new(entry.auth), source: CredentialSource::NodeConfig }))
            })
            .collect();
        *loaded = Loaded { version: Some(version.clone()), entries: Arc::new(entries), failed: None };
        Ok(Some(version.path))
    }
}

/// The file's version, or `None` when there is no regular file at `path`.
fn version_of(path: &Path) -> Option<FileVersion> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path).ok().filter(std::fs::Metadata::is_file)?;
    Some(FileVersion {
        path: path.to_owned(),
        inode: metadata.ino(),
        len: metadata.len(),
        modified: metadata.modified().ok(),
    })
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;

    use super::*;

    fn users(config: &NodeDockerConfig) -> Vec<String> {
        let entries = config.current();
        let mut users: Vec<String> = entries
            .iter()
            .map(|(key, credential)| format!("{key}={}", credential.auth.username.expose_secret()))
            .collect();
        users.sort();
        users
    }

    fn write_login(path: &Path, registry: &str, user: &str) {
        let document = serde_json::json!({"auths": {registry: {"username": user, "password": "pw"}}});
        std::fs::write(path, document.to_string()).expect("written");
    }

    #[test]
    fn a_given_file_must_exist_and_parse() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = NodeDockerConfig::explicit(dir.path().join("config.json")).err().expect("missing");
        assert!(missing.to_string().starts_with("cannot read the node docker config"), "{missing}");
        std::fs::write(dir.path().join("config.json"), "{").expect("written");
        let broken = NodeDockerConfig::explicit(dir.path().join("config.json")).err().expect("broken");
        assert!(
            broken.to_string().ends_with("is not valid JSON (unexpected end of input at line 1 column 1)"),
            "{broken}"
        );
    }

    #[test]
    fn a_given_file_that_is_a_fifo_is_refused_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("config.json");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success());
        let (done, refused) = std::sync::mpsc::channel();
        std::thread::spawn(move || done.send(NodeDockerConfig::explicit(fifo).err().map(|error| error.to_string())));
        let refused = refused.recv_timeout(std::time::Duration::from_secs(5)).expect("never blocked");
        let refused = refused.expect("refused");
        assert!(refused.starts_with("cannot read the node docker config"), "{refused}");
    }

    #[test]
    fn a_file_named_dockercfg_is_read_as_the_bare_map() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(".dockercfg");
        std::fs::write(&path, r#"{"registry.local": {"username": "old-style", "password": "pw"}}"#).expect("written");
        assert_eq!(users(&NodeDockerConfig::explicit(path).expect("readable")), ["registry.local=old-style"]);
    }

    #[test]
    fn the_search_takes_the_first_config_json_then_the_first_dockercfg() {
        let root = tempfile::tempdir().expect("tempdir");
        let (root_dir, working_dir, home) =
            (root.path().join("root"), root.path().join("cwd"), root.path().join("home"));
        for dir in [&root_dir, &working_dir, &home.join(".docker")] {
            std::fs::create_dir_all(dir).expect("dir");
        }
        let search = || NodeDockerConfig::search(&root_dir, &working_dir, Some(&home)).expect("readable");
        assert!(users(&search()).is_empty(), "nothing to find");
        std::fs::write(home.join(".dockercfg"), r#"{"r.local": {"username": "home-cfg"}}"#).expect("written");
        assert_eq!(users(&search()), ["r.local=home-cfg"]);
        write_login(&home.join(".docker/config.json"), "r.local", "home-json");
        assert_eq!(users(&search()), ["r.local=home-json"], "any config.json before any .dockercfg");
        write_login(&working_dir.join("config.json"), "r.local", "cwd");
        assert_eq!(users(&search()), ["r.local=cwd"]);
        write_login(&root_dir.join("config.json"), "r.local", "root-dir");
        let config = search();
        assert_eq!(users(&config), ["r.local=root-dir"]);
        assert_eq!(config.path(), Some(root_dir.join("config.json")));
    }

    #[test]
    fn a_changed_file_is_read_again_and_a_broken_one_keeps_what_was_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.json");
        write_login(&path, "registry.local", "before");
        let config = NodeDockerConfig::explicit(path.clone()).expect("readable");
        assert_eq!(users(&config), ["registry.local=before"]);
        write_login(&path, "registry.local", "after-the-change");
        assert_eq!(users(&config), ["registry.local=after-the-change"]);
        std::fs::write(&path, "{ not json").expect("written");
        assert_eq!(users(&config), ["registry.local=after-the-change"], "kept");
        write_login(&path, "registry.local", "fixed");
        assert_eq!(users(&config), ["registry.local=fixed"]);
        std::fs::remove_file(&path).expect("removed");
        assert!(users(&config).is_empty(), "a removed file takes its credentials with it");
    }
}
