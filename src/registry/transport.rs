//! One GET on a connection of its own, over plain HTTP or TLS as the endpoint says.

use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
};

use super::{client::RegistryError, endpoint::Endpoint};
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

/// GETs `path` (absolute, with its query) from `endpoint`.
pub async fn send(endpoint: &Endpoint, path: &str, ask: &Ask<'_>) -> Result<Response<Incoming>, RegistryError> {
    let registry = messages::echo(&endpoint.authority()).into_owned();
    let failed =
        |reason: String| RegistryError::Connection { registry: registry.clone(), what: ask.what.to_owned(), reason };
    let connect = TcpStream::connect((endpoint.connect_host(), endpoint.port));
    let stream = match endpoint.dial_timeout {
        Some(limit) => tokio::time::timeout(limit, connect)
            .await
            .unwrap_or_else(|_| Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "dial_timeout passed")))
            .map_err(|error| failed(error.to_string()))?,
        None => connect.await.map_err(|error| failed(error.to_string()))?,
    };
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
    let request = request.body(Empty::<Bytes>::new()).map_err(|_| failed("a path that is not a URI".to_owned()))?;
    if endpoint.plain_http {
        return exchange(stream, request).await.map_err(failed);
    }
    let stream = endpoint
        .tls
        .connect(stream, endpoint.connect_host())
        .await
        .map_err(|error| RegistryError::Tls { registry: registry.clone(), reason: error.to_string() })?;
    exchange(stream, request).await.map_err(failed)
}

async fn exchange<S>(stream: S, request: Request<Empty<Bytes>>) -> Result<Response<Incoming>, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|error| error.to_string())?;
    // Ends with the answer read or dropped (the caller's deadline drops it).
    tokio::spawn(connection);
    sender.send_request(request).await.map_err(|error| error.to_string())
}
