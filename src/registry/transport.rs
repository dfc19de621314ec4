//! One GET, over plain HTTP or TLS as the endpoint says: on a connection of its own, or on the
//! connection kept from the last request to that host (HTTP/1.1 keep-alive: a verification reads
//! a tag, a signature manifest and its payloads in turn, each a connection's round trips saved
//! over a long link).

use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::Empty;
use hyper::{body::Incoming, client::conn::http1::SendRequest};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
};

use super::endpoint::Endpoint;
use crate::messages;

/// What a request carries besides its path.
pub struct Ask<'a> {
    pub accept: &'a str,
    pub authorization: Option<&'a str>,
    /// The host's hosts.toml headers: for the registry's own API, not a redirect or a realm.
    pub host_headers: bool,
    /// What is asked, for messages.
    pub what: &'a str,
}

/// Why a GET got no answer; the client says it as its own `RegistryError` (`Connection`, `Tls`).
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("registry {registry}: {what}: {reason}")]
    Connection { registry: String, what: String, reason: String },
    #[error("registry {registry}: TLS: {reason}")]
    Tls { registry: String, reason: String },
}

/// How long a kept connection may take to be free again (its last answer's end is being read).
const KEPT_READY: std::time::Duration = std::time::Duration::from_millis(100);

/// A host's connection, kept for its next request; empty until the first.
#[derive(Default)]
pub struct Kept(Option<SendRequest<Empty<Bytes>>>);

/// GETs `path` (absolute, with its query) from `endpoint`, on `kept`'s connection when it is
/// still open and free (the last answer read to its end), else on a new one kept there.
pub async fn send_kept(
    endpoint: &Endpoint,
    path: &str,
    ask: &Ask<'_>,
    kept: &mut Kept,
) -> Result<Response<Incoming>, TransportError> {
    if let Some(mut sender) = kept.0.take() {
        // Free once the last answer was read to its end; closed if it was dropped before (or the
        // registry ended it). Never waited on long: an answer still held keeps it busy.
        let ready = tokio::time::timeout(KEPT_READY, sender.ready()).await;
        if matches!(ready, Ok(Ok(())))
            && let Ok(request) = request(endpoint, path, ask)
            && let Ok(answer) = sender.send_request(request).await
        {
            kept.0 = Some(sender);
            return Ok(answer);
        }
        // Closed meanwhile (the registry's keep-alive ended): a GET is asked again, anew.
    }
    let (answer, sender) = connect_and_send(endpoint, path, ask).await?;
    kept.0 = Some(sender);
    Ok(answer)
}

/// GETs `path` (absolute, with its query) from `endpoint` on a connection of its own.
pub async fn send(endpoint: &Endpoint, path: &str, ask: &Ask<'_>) -> Result<Response<Incoming>, TransportError> {
    connect_and_send(endpoint, path, ask).await.map(|(answer, _)| answer)
}

fn request(endpoint: &Endpoint, path: &str, ask: &Ask<'_>) -> Result<Request<Empty<Bytes>>, http::Error> {
    let mut request = Request::get(path)
        .header(header::HOST, endpoint.host_header())
        .header(header::ACCEPT, ask.accept)
        .header(header::USER_AGENT, concat!("cri-imaged/", env!("CARGO_PKG_VERSION")));
    if ask.host_headers {
        for (name, value) in endpoint.headers.iter() {
            request = request.header(name, value);
        }
    }
    if let Some(value) = ask.authorization {
        request = request.header(header::AUTHORIZATION, value);
    }
    request.body(Empty::<Bytes>::new())
}

async fn connect_and_send(
    endpoint: &Endpoint,
    path: &str,
    ask: &Ask<'_>,
) -> Result<(Response<Incoming>, SendRequest<Empty<Bytes>>), TransportError> {
    let registry = messages::echo(&endpoint.authority()).into_owned();
    let failed =
        |reason: String| TransportError::Connection { registry: registry.clone(), what: ask.what.to_owned(), reason };
    let connect = TcpStream::connect((endpoint.connect_host(), endpoint.port));
    let stream = match endpoint.dial_timeout {
        Some(limit) => tokio::time::timeout(limit, connect)
            .await
            .unwrap_or_else(|_| Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "dial_timeout passed")))
            .map_err(|error| failed(error.to_string()))?,
        None => connect.await.map_err(|error| failed(error.to_string()))?,
    };
    let request = request(endpoint, path, ask).map_err(|_| failed("a path that is not a URI".to_owned()))?;
    if endpoint.plain_http {
        return exchange(stream, request).await.map_err(failed);
    }
    let stream = endpoint
        .tls
        .connect(stream, endpoint.connect_host())
        .await
        .map_err(|error| TransportError::Tls { registry: registry.clone(), reason: error.to_string() })?;
    exchange(stream, request).await.map_err(failed)
}

async fn exchange<S>(
    stream: S,
    request: Request<Empty<Bytes>>,
) -> Result<(Response<Incoming>, SendRequest<Empty<Bytes>>), String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|error| error.to_string())?;
    // Ends when its sender is dropped (the client's session ended) or an answer is dropped
    // before its end (the caller's deadline drops it).
    tokio::spawn(connection);
    let answer = sender.send_request(request).await.map_err(|error| error.to_string())?;
    Ok((answer, sender))
}
