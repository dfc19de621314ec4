//! Where the runtime listens.

use std::path::PathBuf;

/// Where the runtime listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeEndpoint(PathBuf);

/// A runtime endpoint that cri-imaged cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("runtime endpoint is empty")]
    Empty,
    #[error("runtime endpoint {0:?} is not supported: use unix:///path/to.sock or an absolute socket path")]
    Unsupported(String),
}

impl RuntimeEndpoint {
    /// Accepts `unix:///path` (as the kubelet's `--container-runtime-endpoint`) or a bare absolute path.
    pub fn parse(endpoint: &str) -> Result<Self, EndpointError> {
        if endpoint.is_empty() {
            return Err(EndpointError::Empty);
        }
        let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
        if !path.starts_with('/') {
            return Err(EndpointError::Unsupported(endpoint.to_owned()));
        }
        Ok(Self(PathBuf::from(path)))
    }

    /// The socket path.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl std::fmt::Display for RuntimeEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unix://{}", self.0.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_accepts_unix_urls_and_absolute_paths() {
        let url = RuntimeEndpoint::parse("unix:///run/containerd/containerd.sock").expect("unix url");
        let bare = RuntimeEndpoint::parse("/run/containerd/containerd.sock").expect("bare path");
        assert_eq!(url, bare);
        assert_eq!(url.to_string(), "unix:///run/containerd/containerd.sock");
    }

    #[test]
    fn endpoint_rejects_tcp_relative_and_empty() {
        assert_eq!(RuntimeEndpoint::parse(""), Err(EndpointError::Empty));
        for bad in ["tcp://127.0.0.1:1234", "run/containerd.sock", "unix://relative.sock"] {
            assert!(
                matches!(RuntimeEndpoint::parse(bad), Err(EndpointError::Unsupported(ref e)) if e == bad),
                "{bad} should be refused"
            );
        }
    }
}
