//! Where and how a registry host is reached: scheme, host and port, the API root, what it may be
//! asked (containerd's capabilities), the headers and TLS settings hosts.toml gives it. Without a
//! hosts.toml, a reference's registry is reached as containerd reaches it by default.

use std::{net::IpAddr, sync::Arc, time::Duration};

use http::{HeaderName, HeaderValue, Uri};

use super::tls::Tls;

/// What a host may be asked, as containerd's `capabilities` (`push` is never needed here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// A tag resolved to a digest (the image's tag, cosign's `.sig` tag).
    pub resolve: bool,
    /// Content by digest: manifests and blobs.
    pub pull: bool,
}

impl Capabilities {
    pub const ALL: Self = Self { resolve: true, pull: true };
}

/// How a registry host is reached.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Plain HTTP: an `http://` host, or a loopback registry without a hosts.toml, as containerd's
    /// default hosts treat `localhost`, 127.0.0.0/8 and `::1`.
    pub plain_http: bool,
    /// The host (a bracketed IPv6 literal kept bracketed) and port to connect to.
    pub host: String,
    pub port: u16,
    /// The path the API is under: `/v2`, or what hosts.toml names (`override_path`).
    pub root: String,
    pub capabilities: Capabilities,
    /// Sent with each request to this host (hosts.toml `header`).
    pub headers: Arc<[(HeaderName, HeaderValue)]>,
    pub tls: Arc<Tls>,
    /// How long a connection may take to open (hosts.toml `dial_timeout`); unset: the whole
    /// verification's deadline bounds it.
    pub dial_timeout: Option<Duration>,
}

impl Endpoint {
    /// The endpoint of the registry named `domain` (host, with a port or not) in a reference, as
    /// containerd reaches it without a hosts.toml.
    pub fn of(domain: &str) -> Self {
        // Docker Hub's references name docker.io; its API answers at registry-1.docker.io.
        let domain = if domain == "docker.io" || domain == "index.docker.io" { "registry-1.docker.io" } else { domain };
        let (host, port) = split_port(domain);
        let plain_http = is_loopback(host);
        let port = port.unwrap_or(if plain_http { 80 } else { 443 });
        Self::at(plain_http, host, port, "/v2")
    }

    /// An endpoint with no settings of its own: the system's roots, no headers, every capability.
    pub fn at(plain_http: bool, host: &str, port: u16, root: &str) -> Self {
        Self {
            plain_http,
            host: host.to_owned(),
            port,
            root: root.to_owned(),
            capabilities: Capabilities::ALL,
            headers: Arc::from([]),
            tls: Tls::system(),
            dial_timeout: None,
        }
    }

    /// The endpoint an absolute `http(s)` URL names, and its path and query (a redirect's target,
    /// a token realm); the TLS settings are `from`'s, as containerd's client follows them with the
    /// host's own transport.
    pub fn for_url(url: &str, from: &Endpoint) -> Option<(Self, String)> {
        let uri: Uri = url.parse().ok()?;
        let plain_http = match uri.scheme_str()? {
            "http" => true,
            "https" => false,
            _ => return None,
        };
        let authority = uri.authority()?;
        let port = authority.port_u16().unwrap_or(if plain_http { 80 } else { 443 });
        let path = uri.path_and_query().map_or("/", |path| path.as_str()).to_owned();
        let mut endpoint = Self::at(plain_http, authority.host(), port, "");
        endpoint.tls = from.tls.clone();
        endpoint.dial_timeout = from.dial_timeout;
        Some((endpoint, path))
    }

    /// `host:port`, for messages and to tell hosts apart.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The `Host` header: the port left out where it is the scheme's, as Go's client sends it
    /// (a registry behind a virtual host or a token service checks it).
    pub fn host_header(&self) -> String {
        match (self.plain_http, self.port) {
            (true, 80) | (false, 443) => self.host.clone(),
            _ => self.authority(),
        }
    }

    /// The host without IPv6 brackets, to connect to and to check a certificate against.
    pub fn connect_host(&self) -> &str {
        self.host.trim_start_matches('[').trim_end_matches(']')
    }
}

/// `host` and its port, if one is written (`[::1]:5000`, `localhost:5000`, `example.com`).
pub fn split_port(domain: &str) -> (&str, Option<u16>) {
    let (host, port) = match domain.rfind(':') {
        Some(colon) if !domain[colon..].contains(']') => (&domain[..colon], Some(&domain[colon + 1..])),
        _ => (domain, None),
    };
    match port.map(str::parse::<u16>) {
        Some(Ok(port)) => (host, Some(port)),
        // Not a port: leave the whole as the host (the connection will say what is wrong).
        Some(Err(_)) => (domain, None),
        None => (host, None),
    }
}

pub fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare == "localhost" || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_registries_are_plain_http_and_others_https() {
        let local = Endpoint::of("127.0.0.1:5000");
        assert_eq!((local.plain_http, local.host.as_str(), local.port), (true, "127.0.0.1", 5000));
        assert!(Endpoint::of("localhost:5000").plain_http);
        let six = Endpoint::of("[::1]:5000");
        assert_eq!((six.plain_http, six.connect_host(), six.port), (true, "::1", 5000));
        let remote = Endpoint::of("registry.example.com");
        assert_eq!((remote.plain_http, remote.port, remote.root.as_str()), (false, 443, "/v2"));
        assert_eq!(remote.host_header(), "registry.example.com");
        assert_eq!(Endpoint::of("docker.io").host, "registry-1.docker.io");
    }

    #[test]
    fn a_redirect_keeps_the_hosts_tls_and_names_its_own_place() {
        let from = Endpoint::of("registry.example.com");
        let (to, path) = Endpoint::for_url("https://storage.example.net/blobs/x?sig=1", &from).expect("a URL");
        assert_eq!(
            (to.plain_http, to.host.as_str(), to.port, path.as_str()),
            (false, "storage.example.net", 443, "/blobs/x?sig=1")
        );
        assert!(Arc::ptr_eq(&to.tls, &from.tls));
        let (plain, _) = Endpoint::for_url("http://127.0.0.1:9000/b", &from).expect("a URL");
        assert_eq!((plain.plain_http, plain.port, plain.host_header().as_str()), (true, 9000, "127.0.0.1:9000"));
        assert!(Endpoint::for_url("ftp://x/y", &from).is_none());
        assert!(Endpoint::for_url("/relative", &from).is_none());
    }
}
