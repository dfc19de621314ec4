//! Where a registry's API is: the host a reference names, as containerd reaches it without a
//! `hosts.toml` of its own for it.

use std::net::IpAddr;

/// How a registry is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Plain HTTP: a loopback registry, as containerd's default hosts treat `localhost`,
    /// 127.0.0.0/8 and `::1`.
    pub plain_http: bool,
    /// The host (a bracketed IPv6 literal kept bracketed) and port to connect to.
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    /// The endpoint of the registry named `domain` (host, with a port or not) in a reference.
    pub fn of(domain: &str) -> Self {
        // Docker Hub's references name docker.io; its API answers at registry-1.docker.io.
        let domain = if domain == "docker.io" || domain == "index.docker.io" { "registry-1.docker.io" } else { domain };
        let (host, port) = split_port(domain);
        let plain_http = is_loopback(host);
        let port = port.unwrap_or(if plain_http { 80 } else { 443 });
        Self { plain_http, host: host.to_owned(), port }
    }

    /// `host:port`, for the `Host` header and messages.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The host without IPv6 brackets, to connect to.
    pub fn connect_host(&self) -> &str {
        self.host.trim_start_matches('[').trim_end_matches(']')
    }
}

/// `host` and its port, if one is written (`[::1]:5000`, `localhost:5000`, `example.com`).
fn split_port(domain: &str) -> (&str, Option<u16>) {
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

fn is_loopback(host: &str) -> bool {
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
        assert_eq!((remote.plain_http, remote.port), (false, 443));
        assert_eq!(Endpoint::of("docker.io").host, "registry-1.docker.io");
    }
}
