//! An image's size read from its registry before any layer moves: the manifest at its tag or
//! digest (for an index, this node's platform's), its layers added up. It lets the scheduler put
//! the cheaper pulls first where the runtime says nothing of a pull while it runs (CRI-O, or
//! `--pull-progress=false`); where containerd's content service is watched, the poller tells the
//! same for free.
//!
//! It costs the registry one or two manifest GETs (Docker Hub counts those as a pull), so it is
//! read only for a pull that has others beside it to be ordered against. A read is not made
//! while the registry's breaker is open, and an answer tells the breaker the registry answers;
//! a failure never counts against it: the read is a hint, and the pull's own attempt judges.

use std::{sync::Arc, time::Duration};

use futures_util::future::BoxFuture;

use super::Pull;
use crate::{
    credentials::RegistryAuth,
    registry::{RegistryClient, RegistryError, RegistryHosts, Repository},
    signatures::{Reached, RegistryHealth},
};

/// The largest manifest or index read for a size.
const MANIFEST_LIMIT: usize = 4 << 20;

/// How long a size may take to read; past it the pull stays unsized (it shares the link).
const SIZE_DEADLINE: Duration = Duration::from_secs(5);

/// What the scheduler needs to size a pull it cannot watch.
pub trait SizePulls: Send + Sync {
    /// The bytes of `pull`'s layers, `None` where they cannot be read.
    fn size(&self, pull: &Pull) -> BoxFuture<'static, Option<u64>>;
}

/// Sizes read from the registry, with the pull's credentials, from the hosts containerd's
/// hosts.toml names.
pub struct RegistrySizes {
    hosts: Arc<RegistryHosts>,
    health: Option<Arc<dyn RegistryHealth>>,
}

impl RegistrySizes {
    pub fn new(hosts: Arc<RegistryHosts>) -> Self {
        Self { hosts, health: None }
    }

    /// Each read asked of, and told to, its registry's breaker.
    pub fn counted_by(self, health: Arc<dyn RegistryHealth>) -> Self {
        Self { health: Some(health), ..self }
    }
}

impl SizePulls for RegistrySizes {
    fn size(&self, pull: &Pull) -> BoxFuture<'static, Option<u64>> {
        let Some(reference) = pull.reference.clone() else { return Box::pin(async { None }) };
        let auth: Option<Arc<RegistryAuth>> = pull.spec.auth.clone();
        let hosts = self.hosts.current();
        let visit = match &self.health {
            Some(health) => match health.visit(reference.domain()) {
                Ok(visit) => Some(visit),
                // The breaker is open: the pull is refused or waits its turn; no read either.
                Err(_) => return Box::pin(async { None }),
            },
            None => None,
        };
        Box::pin(async move {
            let repository = Repository { domain: reference.domain().to_owned(), path: reference.path().to_owned() };
            let at = match reference.digest() {
                Some(digest) => digest.to_owned(),
                None => reference.tag().unwrap_or("latest").to_owned(),
            };
            let read = async {
                let mut client = RegistryClient::new(&repository, auth.as_deref(), &hosts);
                let Some(first) = client.manifest(&at, MANIFEST_LIMIT).await? else { return Ok(None) };
                let size = match read_manifest(&first.body, node_architecture()) {
                    Some(Manifest::Image(size)) => Some(size),
                    Some(Manifest::Index(digest)) => match client.manifest(&digest, MANIFEST_LIMIT).await? {
                        Some(manifest) => match read_manifest(&manifest.body, node_architecture()) {
                            Some(Manifest::Image(size)) => Some(size),
                            _ => None,
                        },
                        None => None,
                    },
                    None => None,
                };
                Ok::<_, RegistryError>(size)
            };
            let read = tokio::time::timeout(SIZE_DEADLINE, read).await;
            if let Some(visit) = visit {
                visit.ended(match &read {
                    Ok(read) => reached(read),
                    Err(_) => Reached::Nothing,
                });
            }
            read.ok()?.ok()?
        })
    }
}

/// What a size read tells its registry's breaker: an answer (a 404 or a 401 too) is one; a
/// failure is nothing. The read is a hint: where it cannot reach the registry, the pull's own
/// attempt judges (the runtime's view of the network, a proxy, may differ from ours).
fn reached(read: &Result<Option<u64>, RegistryError>) -> Reached {
    match read {
        Ok(_) => Reached::Answered,
        Err(RegistryError::Status { status, .. }) if !status.is_server_error() => Reached::Answered,
        Err(_) => Reached::Nothing,
    }
}

/// What a manifest says of its image's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Manifest {
    /// An image manifest: its layers' bytes.
    Image(u64),
    /// An index: the digest of its manifest for linux on this architecture.
    Index(String),
}

/// Reads an image manifest or an index (OCI or Docker's); `None` for anything else, or an index
/// with no manifest for linux on `architecture`.
pub fn read_manifest(body: &[u8], architecture: &str) -> Option<Manifest> {
    #[derive(serde::Deserialize)]
    struct Either {
        #[serde(default)]
        layers: Option<Vec<Sized>>,
        #[serde(default)]
        manifests: Option<Vec<Entry>>,
    }
    #[derive(serde::Deserialize)]
    struct Sized {
        #[serde(default)]
        size: u64,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        digest: String,
        #[serde(default)]
        platform: Option<Platform>,
    }
    #[derive(serde::Deserialize)]
    struct Platform {
        #[serde(default)]
        architecture: String,
        #[serde(default)]
        os: String,
    }
    let either: Either = serde_json::from_slice(body).ok()?;
    match (either.layers, either.manifests) {
        (Some(layers), _) => Some(Manifest::Image(layers.iter().map(|layer| layer.size).sum())),
        (None, Some(manifests)) => manifests
            .into_iter()
            .find(|entry| {
                entry
                    .platform
                    .as_ref()
                    .is_some_and(|platform| platform.os == "linux" && platform.architecture == architecture)
            })
            .map(|entry| Manifest::Index(entry.digest)),
        (None, None) => None,
    }
}

/// This node's architecture as image platforms name it (Go's `GOARCH`).
pub fn node_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read's failure never counts against the registry's breaker; an answer counts as one.
    #[test]
    fn a_size_read_tells_the_breaker_of_answers_only() {
        let connection = || RegistryError::Connection {
            registry: "r.test".into(),
            what: "manifest".into(),
            reason: "connection refused".into(),
        };
        let status = |status| RegistryError::Status { registry: "r.test".into(), what: "manifest".into(), status };
        assert_eq!(reached(&Err(connection())), Reached::Nothing, "unreachable from here: the pull judges");
        assert_eq!(reached(&Err(status(http::StatusCode::BAD_GATEWAY))), Reached::Nothing);
        assert_eq!(reached(&Err(status(http::StatusCode::NOT_FOUND))), Reached::Answered);
        assert_eq!(reached(&Ok(Some(1234))), Reached::Answered);
        assert_eq!(reached(&Ok(None)), Reached::Answered, "no such manifest: an answer");
        let no_host = RegistryError::NoHost { registry: "r.test".into(), capability: "resolve" };
        assert_eq!(reached(&Err(no_host)), Reached::Nothing);
    }

    #[test]
    fn an_image_manifest_is_its_layers_bytes() {
        let manifest = br#"{"schemaVersion":2,"config":{"digest":"sha256:c","size":900},"layers":[{"digest":"sha256:a","size":1000},{"digest":"sha256:b","size":234}]}"#;
        assert_eq!(read_manifest(manifest, "amd64"), Some(Manifest::Image(1234)));
    }

    #[test]
    fn an_index_names_this_platforms_manifest_or_none() {
        let index = br#"{"schemaVersion":2,"manifests":[
            {"digest":"sha256:arm","platform":{"architecture":"arm64","os":"linux"}},
            {"digest":"sha256:win","platform":{"architecture":"amd64","os":"windows"}},
            {"digest":"sha256:amd","platform":{"architecture":"amd64","os":"linux"}}]}"#;
        assert_eq!(read_manifest(index, "amd64"), Some(Manifest::Index("sha256:amd".into())));
        assert_eq!(read_manifest(index, "arm64"), Some(Manifest::Index("sha256:arm".into())));
        assert_eq!(read_manifest(index, "s390x"), None);
        assert_eq!(read_manifest(b"not json", "amd64"), None);
        assert_eq!(read_manifest(br#"{"schemaVersion":2}"#, "amd64"), None);
    }
}
