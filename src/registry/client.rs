//! One registry request at a time over HTTP/1.1 (plain or TLS): the hosts tried in order, each
//! host's challenge answered once per session, each answer read to a bound and checked against
//! the digest it was asked by.

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};

use super::{
    auth::{self, Challenge},
    endpoint::Endpoint,
    hosts::HostsConfig,
    transport::{self, Ask, TransportError},
};
use crate::{credentials::RegistryAuth, messages};

/// The manifest types asked for: an image's (or index's) digest is that of the manifest the
/// registry has, whichever it is.
const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";
/// A token answer is a small JSON document.
const TOKEN_LIMIT: usize = 64 * 1024;
/// Redirects followed for one blob (registries send blobs from a storage host).
const REDIRECTS: usize = 3;

/// Why a registry could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("registry {registry}: no host in its hosts.toml may {capability} (capabilities)")]
    NoHost { registry: String, capability: &'static str },
    #[error("registry {registry}: {what}: {reason}")]
    Connection { registry: String, what: String, reason: String },
    #[error("registry {registry}: TLS: {reason}")]
    Tls { registry: String, reason: String },
    #[error("registry {registry} answered {status} for {what}")]
    Status { registry: String, what: String, status: StatusCode },
    #[error("registry {registry} asks for credentials for {what}, and {reason}")]
    Unauthorized { registry: String, what: String, reason: &'static str },
    #[error("registry {registry}: {what} is larger than {limit} bytes")]
    TooLarge { registry: String, what: String, limit: usize },
    #[error("registry {registry}: {what} is not the content of {digest} (it hashes to {found})")]
    DigestMismatch { registry: String, what: String, digest: String, found: String },
    #[error("registry {registry}: the token answer is not a token document")]
    Token { registry: String },
}

impl From<TransportError> for RegistryError {
    fn from(error: TransportError) -> Self {
        match error {
            TransportError::Connection { registry, what, reason } => Self::Connection { registry, what, reason },
            TransportError::Tls { registry, reason } => Self::Tls { registry, reason },
        }
    }
}

/// What was fetched: the body, its digest and the type the registry gave it.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub body: Bytes,
    /// `sha256:<hex>` of the body.
    pub digest: String,
    pub media_type: Option<String>,
}

/// A repository in a registry, as a reference names it (`domain`, `path`).
#[derive(Debug, Clone)]
pub struct Repository {
    pub domain: String,
    pub path: String,
}

/// Reads a repository's manifests and blobs; one per verification, so a token is asked once per
/// host. The hosts are tried in order, as containerd tries them: the next after a failure or an
/// answer other than success, the first failure said if none has it.
pub struct RegistryClient<'a> {
    repository: &'a Repository,
    endpoints: Vec<Endpoint>,
    credentials: Option<&'a RegistryAuth>,
    /// Per host, the `Authorization` value its challenge led to.
    authorizations: Vec<Option<String>>,
    /// Per host, the connection kept for the next request.
    kept: Vec<transport::Kept>,
}

impl<'a> RegistryClient<'a> {
    /// A session on `repository` at the hosts `hosts` names for it, with the credentials the pull
    /// would use.
    pub fn new(repository: &'a Repository, credentials: Option<&'a RegistryAuth>, hosts: &HostsConfig) -> Self {
        let endpoints = hosts.endpoints(&repository.domain);
        // A registry token is a bearer token already.
        let authorization = credentials
            .map(|auth| auth.registry_token.expose_secret())
            .filter(|token| !token.is_empty())
            .map(|token| format!("Bearer {token}"));
        let authorizations = vec![authorization; endpoints.len()];
        let kept = endpoints.iter().map(|_| transport::Kept::default()).collect();
        Self { repository, endpoints, credentials, authorizations, kept }
    }

    /// The manifest `reference` (a tag or a digest) names, or `None` when there is none (404).
    pub async fn manifest(&mut self, reference: &str, limit: usize) -> Result<Option<Fetched>, RegistryError> {
        let what = format!("manifest {}", messages::echo(reference));
        let by_digest = reference.starts_with("sha256:");
        let path = format!("/{}/manifests/{reference}", self.repository.path);
        let Some((_, answer)) = self.first_answer(by_digest, &path, MANIFEST_TYPES, &what).await? else {
            return Ok(None);
        };
        let fetched = self.read(answer, &what, limit).await?;
        if by_digest && fetched.digest != reference {
            return Err(self.mismatch(what, reference, fetched.digest));
        }
        Ok(Some(fetched))
    }

    /// The OCI 1.1 referrers of `digest` (an image index), of `artifact_type` only where given and
    /// the registry filters, or `None` when it serves no referrers API (404, as the distribution
    /// spec has it).
    pub async fn referrers(
        &mut self,
        digest: &str,
        artifact_type: Option<&str>,
        limit: usize,
    ) -> Result<Option<Fetched>, RegistryError> {
        let what = format!("the referrers of {}", messages::echo(digest));
        // A media type's `+` would be a space in a query: percent-encoded.
        let filter = artifact_type.map(|artifact_type| format!("?artifactType={}", artifact_type.replace('+', "%2B")));
        let path = format!("/{}/referrers/{digest}{}", self.repository.path, filter.unwrap_or_default());
        let accept = "application/vnd.oci.image.index.v1+json";
        let Some((_, answer)) = self.first_answer(true, &path, accept, &what).await? else {
            return Ok(None);
        };
        self.read(answer, &what, limit).await.map(Some)
    }

    /// The blob `digest` names, checked against it.
    pub async fn blob(&mut self, digest: &str, limit: usize) -> Result<Fetched, RegistryError> {
        let what = format!("blob {}", messages::echo(digest));
        let path = format!("/{}/blobs/{digest}", self.repository.path);
        let Some((index, mut answer)) = self.first_answer(true, &path, "*/*", &what).await? else {
            let registry = self.registry();
            return Err(RegistryError::Status { registry, what, status: StatusCode::NOT_FOUND });
        };
        for _ in 0..REDIRECTS {
            if !answer.status().is_redirection() {
                break;
            }
            let location = answer.headers().get(header::LOCATION).and_then(|value| value.to_str().ok());
            let Some((target, path)) = location.and_then(|location| self.redirect_target(index, location)) else {
                break;
            };
            // The storage host is another party: no credentials follow the redirect.
            let ask = Ask { accept: "*/*", authorization: None, host_headers: false, what: &what };
            answer = transport::send(&target, &path, &ask).await?;
        }
        let fetched = self.read(answer, &what, limit).await?;
        if fetched.digest != digest {
            return Err(self.mismatch(what, digest, fetched.digest));
        }
        Ok(fetched)
    }

    fn registry(&self) -> String {
        messages::echo(&self.repository.domain).into_owned()
    }

    fn mismatch(&self, what: String, digest: &str, found: String) -> RegistryError {
        RegistryError::DigestMismatch { registry: self.registry(), what, digest: digest.to_owned(), found }
    }

    /// The first host's answer that is not a failure (a redirect is an answer): content by
    /// digest from hosts that may `pull`, a tag from hosts that may `resolve`. `None`: every host
    /// answered 404.
    async fn first_answer(
        &mut self,
        by_digest: bool,
        path: &str,
        accept: &str,
        what: &str,
    ) -> Result<Option<(usize, Response<Incoming>)>, RegistryError> {
        let capability = if by_digest { "pull" } else { "resolve" };
        let able: Vec<usize> = (0..self.endpoints.len())
            .filter(|&index| {
                let capabilities = self.endpoints[index].capabilities;
                if by_digest { capabilities.pull } else { capabilities.resolve }
            })
            .collect();
        if able.is_empty() {
            return Err(RegistryError::NoHost { registry: self.registry(), capability });
        }
        let mut first_failure = None;
        for index in able {
            let full = format!("{}{path}", self.endpoints[index].root);
            match self.get(index, &full, accept, what).await {
                Ok(answer) if answer.status().is_success() || answer.status().is_redirection() => {
                    return Ok(Some((index, answer)));
                }
                Ok(answer) if answer.status() == StatusCode::NOT_FOUND => {}
                Ok(answer) => {
                    let registry = messages::echo(&self.endpoints[index].authority()).into_owned();
                    let status = RegistryError::Status { registry, what: what.to_owned(), status: answer.status() };
                    first_failure.get_or_insert(status);
                }
                Err(error) => {
                    first_failure.get_or_insert(error);
                }
            }
        }
        first_failure.map_or(Ok(None), Err)
    }

    /// GET `path` from host `index`, answering its challenge once if it makes one.
    async fn get(
        &mut self,
        index: usize,
        path: &str,
        accept: &str,
        what: &str,
    ) -> Result<Response<Incoming>, RegistryError> {
        let endpoint = &self.endpoints[index];
        let ask = |authorization| Ask { accept, authorization, host_headers: true, what };
        let kept = &mut self.kept[index];
        let answer = transport::send_kept(endpoint, path, &ask(self.authorizations[index].as_deref()), kept).await?;
        // Answered once: a second 401 is the registry's refusal of what the pull has.
        if answer.status() != StatusCode::UNAUTHORIZED || self.authorizations[index].is_some() {
            return Ok(answer);
        }
        let challenge =
            answer.headers().get(header::WWW_AUTHENTICATE).and_then(|value| value.to_str().ok()).and_then(auth::parse);
        let authorization = match challenge {
            Some(Challenge::Basic) => self.basic().ok_or_else(|| self.unauthorized(what, "the pull has none"))?,
            Some(Challenge::Bearer { realm, service, scope }) => {
                self.token(index, &realm, service, scope, what).await?
            }
            None => return Err(self.unauthorized(what, "its challenge is not Basic or Bearer")),
        };
        // The challenge's answer, unread, closes its connection: the next request opens another.
        drop(answer);
        let kept = &mut self.kept[index];
        let answer = transport::send_kept(&self.endpoints[index], path, &ask(Some(&authorization)), kept).await;
        self.authorizations[index] = Some(authorization);
        Ok(answer?)
    }

    fn unauthorized(&self, what: &str, reason: &'static str) -> RegistryError {
        RegistryError::Unauthorized { registry: self.registry(), what: what.to_owned(), reason }
    }

    /// `Basic` with the pull's username and password (or its `auth`, which is them encoded).
    fn basic(&self) -> Option<String> {
        use base64::Engine as _;
        let credentials = self.credentials?;
        let encoded = credentials.auth.expose_secret();
        if !encoded.is_empty() {
            return Some(format!("Basic {encoded}"));
        }
        let (username, password) = (credentials.username.expose_secret(), credentials.password.expose_secret());
        if username.is_empty() && password.is_empty() {
            return None;
        }
        let joined = zeroize::Zeroizing::new(format!("{username}:{password}"));
        Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(joined.as_bytes())))
    }

    /// The distribution token flow: the realm asked, with Basic credentials when the pull has
    /// some, for a pull token on this repository.
    async fn token(
        &self,
        index: usize,
        realm: &str,
        service: Option<String>,
        scope: Option<String>,
        what: &str,
    ) -> Result<String, RegistryError> {
        let registry = self.registry();
        let bad_realm = || RegistryError::Connection {
            registry: registry.clone(),
            what: what.to_owned(),
            reason: "its token realm is not an http(s) URL".to_owned(),
        };
        // The realm is reached with the host's TLS settings, as containerd's client reaches it.
        let (endpoint, base) = Endpoint::for_url(realm, &self.endpoints[index]).ok_or_else(bad_realm)?;
        let scope = scope.unwrap_or_else(|| format!("repository:{}:pull", self.repository.path));
        let mut query = vec![format!("scope={}", encode(&scope))];
        if let Some(service) = service {
            query.push(format!("service={}", encode(&service)));
        }
        let separator = if base.contains('?') { '&' } else { '?' };
        let path = format!("{base}{separator}{}", query.join("&"));
        let basic = zeroize::Zeroizing::new(self.basic());
        let ask =
            Ask { accept: "application/json", authorization: basic.as_deref(), host_headers: false, what: "its token" };
        let answer = transport::send(&endpoint, &path, &ask).await?;
        if answer.status() == StatusCode::UNAUTHORIZED {
            return Err(self.unauthorized(what, "its token service refused the pull's"));
        }
        let fetched = self.read(answer, "its token", TOKEN_LIMIT).await?;
        #[derive(serde::Deserialize)]
        struct TokenAnswer {
            token: Option<secrecy::SecretString>,
            access_token: Option<secrecy::SecretString>,
        }
        let answer: TokenAnswer =
            serde_json::from_slice(&fetched.body).map_err(|_| RegistryError::Token { registry: registry.clone() })?;
        let token = answer.token.or(answer.access_token).ok_or(RegistryError::Token { registry })?;
        Ok(format!("Bearer {}", token.expose_secret()))
    }

    /// A redirect's target: an absolute URL, or a path on the same host.
    fn redirect_target(&self, index: usize, location: &str) -> Option<(Endpoint, String)> {
        let from = &self.endpoints[index];
        if location.starts_with('/') {
            return Some((from.clone(), location.to_owned()));
        }
        Endpoint::for_url(location, from)
    }

    /// The answer's body, if it is a success, read to `limit` bytes.
    async fn read(&self, answer: Response<Incoming>, what: &str, limit: usize) -> Result<Fetched, RegistryError> {
        let registry = self.registry();
        if !answer.status().is_success() {
            return Err(RegistryError::Status { registry, what: what.to_owned(), status: answer.status() });
        }
        let too_large = || RegistryError::TooLarge { registry: registry.clone(), what: what.to_owned(), limit };
        let length = answer.headers().get(header::CONTENT_LENGTH).and_then(|value| value.to_str().ok()?.parse().ok());
        if length.is_some_and(|length: u64| length > limit as u64) {
            return Err(too_large());
        }
        let media_type = answer
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(|value| messages::echo(value).into_owned());
        let body = Limited::new(answer.into_body(), limit).collect().await.map_err(|error| {
            if error.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                too_large()
            } else {
                RegistryError::Connection {
                    registry: registry.clone(),
                    what: what.to_owned(),
                    reason: error.to_string(),
                }
            }
        })?;
        let body = body.to_bytes();
        let digest = format!("sha256:{}", hex(&Sha256::digest(&body)));
        Ok(Fetched { body, digest, media_type })
    }
}

/// Percent-encodes a query value.
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~:/".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Lower-case hex, as digests are written.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}
