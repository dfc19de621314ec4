//! One registry request at a time over HTTP/1.1: the challenge answered once per session, each
//! answer read to a bound and checked against the digest it was asked by.

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;

use super::{
    auth::{self, Challenge},
    endpoint::Endpoint,
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
    #[error(
        "registry {registry} is reached over HTTPS, over which cri-imaged does not read signatures yet (a loopback registry is read over plain HTTP)"
    )]
    Https { registry: String },
    #[error("registry {registry}: {what}: {reason}")]
    Connection { registry: String, what: String, reason: String },
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

/// Reads a repository's manifests and blobs; one per verification, so a token is asked once.
pub struct RegistryClient<'a> {
    repository: &'a Repository,
    endpoint: Endpoint,
    credentials: Option<&'a RegistryAuth>,
    /// The `Authorization` value the registry's challenge led to.
    authorization: Option<String>,
}

impl<'a> RegistryClient<'a> {
    /// A session on `repository`, with the credentials the pull would use.
    pub fn new(repository: &'a Repository, credentials: Option<&'a RegistryAuth>) -> Self {
        let endpoint = Endpoint::of(&repository.domain);
        // A registry token is a bearer token already.
        let authorization = credentials
            .map(|auth| auth.registry_token.expose_secret())
            .filter(|token| !token.is_empty())
            .map(|token| format!("Bearer {token}"));
        Self { repository, endpoint, credentials, authorization }
    }

    /// The manifest `reference` (a tag or a digest) names, or `None` when there is none (404).
    pub async fn manifest(&mut self, reference: &str, limit: usize) -> Result<Option<Fetched>, RegistryError> {
        let what = format!("manifest {}", messages::echo(reference));
        let path = format!("/v2/{}/manifests/{reference}", self.repository.path);
        let answer = self.get(&path, MANIFEST_TYPES, &what).await?;
        if answer.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let fetched = self.read(answer, &what, limit).await?;
        if reference.starts_with("sha256:") && fetched.digest != reference {
            return Err(self.mismatch(what, reference, fetched.digest));
        }
        Ok(Some(fetched))
    }

    /// The blob `digest` names, checked against it.
    pub async fn blob(&mut self, digest: &str, limit: usize) -> Result<Fetched, RegistryError> {
        let what = format!("blob {}", messages::echo(digest));
        let mut answer = self.get(&format!("/v2/{}/blobs/{digest}", self.repository.path), "*/*", &what).await?;
        for _ in 0..REDIRECTS {
            if !answer.status().is_redirection() {
                break;
            }
            let location = answer.headers().get(header::LOCATION).and_then(|value| value.to_str().ok());
            let Some(target) = location.and_then(|location| self.redirect_target(location)) else { break };
            // The storage host is another party: no credentials follow the redirect.
            answer = send(&target.0, &target.1, "*/*", None, &what).await?;
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

    /// GET `path`, answering the registry's challenge once if it makes one.
    async fn get(&mut self, path: &str, accept: &str, what: &str) -> Result<Response<Incoming>, RegistryError> {
        let answer = send(&self.endpoint, path, accept, self.authorization.as_deref(), what).await?;
        // Answered once: a second 401 is the registry's refusal of what the pull has.
        if answer.status() != StatusCode::UNAUTHORIZED || self.authorization.is_some() {
            return Ok(answer);
        }
        let challenge =
            answer.headers().get(header::WWW_AUTHENTICATE).and_then(|value| value.to_str().ok()).and_then(auth::parse);
        self.authorization = Some(match challenge {
            Some(Challenge::Basic) => self.basic().ok_or_else(|| self.unauthorized(what, "the pull has none"))?,
            Some(Challenge::Bearer { realm, service, scope }) => self.token(&realm, service, scope, what).await?,
            None => return Err(self.unauthorized(what, "its challenge is not Basic or Bearer")),
        });
        send(&self.endpoint, path, accept, self.authorization.as_deref(), what).await
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
        let uri: Uri = realm.parse().map_err(|_| bad_realm())?;
        let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else { return Err(bad_realm()) };
        let port = authority.port_u16().unwrap_or(if scheme == "http" { 80 } else { 443 });
        let endpoint = Endpoint { plain_http: scheme == "http", host: authority.host().to_owned(), port };
        let scope = scope.unwrap_or_else(|| format!("repository:{}:pull", self.repository.path));
        let mut query = vec![format!("scope={}", encode(&scope))];
        if let Some(service) = service {
            query.push(format!("service={}", encode(&service)));
        }
        let base = uri.path_and_query().map_or("/", |path| path.as_str());
        let separator = if base.contains('?') { '&' } else { '?' };
        let path = format!("{base}{separator}{}", query.join("&"));
        let basic = zeroize::Zeroizing::new(self.basic());
        let answer = send(&endpoint, &path, "application/json", basic.as_deref(), "its token").await?;
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

    /// A redirect's target: an absolute URL, or a path on the same registry.
    fn redirect_target(&self, location: &str) -> Option<(Endpoint, String)> {
        if location.starts_with('/') {
            return Some((self.endpoint.clone(), location.to_owned()));
        }
        let uri: Uri = location.parse().ok()?;
        let authority = uri.authority()?;
        let plain_http = uri.scheme_str()? == "http";
        let port = authority.port_u16().unwrap_or(if plain_http { 80 } else { 443 });
        let path = uri.path_and_query().map_or("/", |path| path.as_str()).to_owned();
        Some((Endpoint { plain_http, host: authority.host().to_owned(), port }, path))
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

/// One GET on a connection of its own.
async fn send(
    endpoint: &Endpoint,
    path: &str,
    accept: &str,
    authorization: Option<&str>,
    what: &str,
) -> Result<Response<Incoming>, RegistryError> {
    let registry = messages::echo(&endpoint.authority()).into_owned();
    if !endpoint.plain_http {
        return Err(RegistryError::Https { registry });
    }
    let failed =
        |reason: String| RegistryError::Connection { registry: registry.clone(), what: what.to_owned(), reason };
    let stream = TcpStream::connect((endpoint.connect_host(), endpoint.port))
        .await
        .map_err(|error| failed(error.to_string()))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|error| failed(error.to_string()))?;
    // Ends with the answer read or dropped (the caller's deadline drops it).
    tokio::spawn(connection);
    let mut request = Request::get(path)
        .header(header::HOST, endpoint.authority())
        .header(header::ACCEPT, accept)
        .header(header::USER_AGENT, concat!("cri-imaged/", env!("CARGO_PKG_VERSION")));
    if let Some(value) = authorization {
        request = request.header(header::AUTHORIZATION, value);
    }
    let request = request.body(Empty::<Bytes>::new()).map_err(|_| failed("a path that is not a URI".to_owned()))?;
    sender.send_request(request).await.map_err(|error| failed(error.to_string()))
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
