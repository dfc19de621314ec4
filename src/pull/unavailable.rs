//! Which failed pulls the CRI names `RegistryUnavailable`: those that never reached a registry
//! able to answer, read from the runtime's message (containerd passes Go's errors on as text),
//! pure.
//!
//! Every network-level failure is one: the connection refused (`ECONNREFUSED`, to the registry or
//! a proxy before it), reset (`ECONNRESET`), no route to the host or network (`EHOSTUNREACH`,
//! `ENETUNREACH`), timed out (`ETIMEDOUT`, Go's `i/o timeout`, net/http's client timeout, a TLS
//! handshake that timed out), the name not resolved (DNS), and a 5xx answer. What the registry
//! answered (401, 403, 404, 429) and what no retry mends by itself (TLS and x509 verification, a
//! full disk) stay the runtime's error, `ErrImagePull`. CRI-O's PullImage (`server/image_pull.go`)
//! names only the first of these so (`errors.Is(err, syscall.ECONNREFUSED)`); the rest are named
//! here too, so that a pod whose registry cannot be reached says so whatever the way it failed.
//! The breaker reads failures more broadly still ([`super::breaker::failure`]): all of these are
//! among what it counts as unreachable.

use std::sync::Arc;

use super::{
    PullError,
    breaker::failure::{from_runtime_itself, server_error},
};
use crate::runtime::RuntimeError;

/// Go's words for the network-level failures above, lowercased, as a dial, read or lookup error
/// ends: `dial tcp 10.0.0.2:5000: connect: connection refused`, `lookup r.example on
/// 127.0.0.53:53: no such host`.
const NETWORK: [&str; 11] = [
    "connection refused",
    "connection reset by peer",
    "no route to host",
    "network is unreachable",
    "connection timed out",
    "i/o timeout",
    "tls handshake timeout",
    "client.timeout exceeded",
    "no such host",
    "server misbehaving",
    "dial tcp: lookup ",
];

/// How a runtime that names it already (CRI-O) starts its message: kept as it is, not prefixed
/// again.
const NAMED: &str = "RegistryUnavailable: ";

/// A runtime's failed pull as the pull's error: `RegistryUnavailable` with the runtime's own
/// message when it failed at the network level, else the runtime's error as it is.
pub fn pull_error(error: RuntimeError) -> PullError {
    match unavailable(&error) {
        Some(detail) => PullError::RegistryUnavailable(detail),
        None => PullError::Runtime(error),
    }
}

/// What follows `RegistryUnavailable: ` for a runtime's failure at the network level: the
/// runtime's whole message, or what follows the name when the runtime gave it; `None` for any
/// other failure, and for one of the runtime itself whatever its message.
pub fn unavailable(error: &RuntimeError) -> Option<String> {
    let RuntimeError::Status(status) = error else { return None };
    if from_runtime_itself(status.code()) {
        return None;
    }
    let message = status.message();
    if let Some(detail) = message.strip_prefix(NAMED) {
        return Some(detail.to_owned());
    }
    let lower = message.to_ascii_lowercase();
    let network = NETWORK.iter().any(|words| lower.contains(words)) || server_error(&lower);
    network.then(|| message.to_owned())
}

/// Each credential's attempt failed, each as `RegistryUnavailable`, with different messages
/// (one refused, the next refused by the breaker it opened): one `RegistryUnavailable` whose
/// detail is the kubelet's aggregate of theirs, `[a, b]`. A kubelet over CRI-O would show
/// `ErrImagePull` there, only because its prefix test reads the aggregate's `[` (the same
/// message twice it shows once, and as `RegistryUnavailable`); no credential reached the
/// registry, so the pod is told it could not be reached, as with one credential. `None` when
/// any attempt failed otherwise: the kubelet's `ErrImagePull` with every message.
pub fn every_attempt(failures: &[Arc<PullError>]) -> Option<PullError> {
    let details: Option<Vec<&str>> = failures
        .iter()
        .map(|failure| match &**failure {
            PullError::RegistryUnavailable(detail) => Some(detail.as_str()),
            _ => None,
        })
        .collect();
    Some(PullError::RegistryUnavailable(format!("[{}]", details?.join(", "))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pull::breaker::failure::{Failure, classify};

    fn unknown(message: &str) -> RuntimeError {
        RuntimeError::Status(tonic::Status::unknown(message))
    }

    /// containerd's words for a registry that refused the connection, at each step of a pull (the
    /// first three as tests/e2e_containerd.rs saw them).
    const REFUSED_BY_CONTAINERD: [&str; 5] = [
        // 1.6 resolving the tag (it tries a loopback registry over plain HTTP).
        r#"failed to pull and unpack image "127.0.0.1:1/e2e/app:v1": failed to resolve reference "127.0.0.1:1/e2e/app:v1": failed to do request: Head "http://127.0.0.1:1/v2/e2e/app/manifests/v1": dial tcp 127.0.0.1:1: connect: connection refused"#,
        // 1.7.
        r#"failed to pull and unpack image "127.0.0.1:1/e2e/app:v1": failed to resolve reference "127.0.0.1:1/e2e/app:v1": failed to do request: Head "https://127.0.0.1:1/v2/e2e/app/manifests/v1": dial tcp 127.0.0.1:1: connect: connection refused"#,
        // 2.1.
        r#"failed to pull and unpack image "127.0.0.1:1/e2e/app:v1": failed to resolve image: failed to do request: Head "https://127.0.0.1:1/v2/e2e/app/manifests/v1": dial tcp 127.0.0.1:1: connect: connection refused"#,
        // Gone mid-pull, fetching a layer.
        r#"failed to pull and unpack image "10.9.0.2:5000/a:1": failed to copy: httpReadSeeker: failed open: failed to do request: Get "http://10.9.0.2:5000/v2/a/blobs/sha256:ab": dial tcp 10.9.0.2:5000: connect: connection refused"#,
        // Through a proxy that is down.
        r#"failed to pull and unpack image "r.example/a:1": failed to resolve reference "r.example/a:1": failed to do request: Head "https://r.example/v2/a/manifests/1": proxyconnect tcp: dial tcp 10.0.0.9:3128: connect: connection refused"#,
    ];

    #[test]
    fn a_refused_connection_is_registry_unavailable_with_the_runtimes_own_message() {
        for message in REFUSED_BY_CONTAINERD {
            let error = pull_error(unknown(message));
            assert!(matches!(&error, PullError::RegistryUnavailable(detail) if detail == message), "{error:?}");
            assert_eq!(error.to_string(), format!("RegistryUnavailable: {message}"));
            assert_eq!(classify(&error), Failure::Unreachable, "the breaker counts it as before");
            assert_eq!(classify(&PullError::Runtime(unknown(message))), Failure::Unreachable);
        }
    }

    #[test]
    fn a_runtime_that_names_it_already_is_not_named_twice() {
        let crio = "RegistryUnavailable: initializing source docker://r.example/a:1: pinging container registry r.example: Get \"https://r.example/v2/\": dial tcp 10.0.0.2:443: connect: connection refused";
        let error = pull_error(unknown(crio));
        assert_eq!(error.to_string(), crio);
        assert!(matches!(error, PullError::RegistryUnavailable(_)));
    }

    #[test]
    fn every_network_level_failure_is_registry_unavailable() {
        for message in [
            "failed to copy: read tcp 10.0.0.1:3344->10.0.0.2:443: read: connection reset by peer",
            r#"failed to do request: Head "https://10.9.0.2/v2/a/manifests/1": dial tcp 10.9.0.2:443: connect: no route to host"#,
            r#"failed to do request: Head "https://10.9.0.2/v2/a/manifests/1": dial tcp 10.9.0.2:443: connect: network is unreachable"#,
            r#"failed to do request: Head "https://10.9.0.2/v2/a/manifests/1": dial tcp 10.9.0.2:443: connect: connection timed out"#,
            r#"failed to do request: Head "https://10.9.0.2/v2/a/manifests/1": dial tcp 10.9.0.2:443: i/o timeout"#,
            r#"failed to do request: Head "https://r.example/v2/a/manifests/1": dial tcp: lookup r.example on 127.0.0.53:53: no such host"#,
            r#"failed to do request: Head "https://r.example/v2/a/manifests/1": dial tcp: lookup r.example on 127.0.0.53:53: server misbehaving"#,
            r#"failed to do request: Head "https://r.example/v2/a/manifests/1": dial tcp: lookup r.example on 127.0.0.53:53: read udp 127.0.0.1:45530->127.0.0.53:53: read: connection refused"#,
            r#"failed to do request: Head "https://r.example/v2/a/manifests/1": net/http: request canceled (Client.Timeout exceeded while awaiting headers)"#,
            r#"failed to do request: Head "https://r.example/v2/a/manifests/1": net/http: TLS handshake timeout"#,
            r#"failed to resolve reference "r.example/a:1": unexpected status from HEAD request to https://r.example/v2/a/manifests/1: 503 Service Unavailable"#,
            r#"failed to copy: httpReadSeeker: failed open: unexpected status code https://r.example/v2/a/blobs/sha256:ab: 502 Bad Gateway"#,
        ] {
            assert_eq!(unavailable(&unknown(message)).as_deref(), Some(message), "{message}");
            assert_eq!(
                classify(&pull_error(unknown(message))),
                Failure::Unreachable,
                "the breaker counts it as before"
            );
        }
    }

    #[test]
    fn what_the_registry_answered_and_what_no_retry_mends_stay_the_runtimes_error() {
        for message in [
            r#"failed to do request: Head "https://r.example/v2/a/manifests/1": tls: failed to verify certificate: x509: certificate signed by unknown authority"#,
            r#"failed to do request: Head "https://r.example/v2/a/manifests/1": http: server gave HTTP response to HTTPS client"#,
            r#"unexpected status from HEAD request to https://r.example/v2/a/manifests/1: 401 Unauthorized"#,
            r#"unexpected status from HEAD request to https://r.example/v2/a/manifests/1: 403 Forbidden"#,
            r#"failed to resolve reference "r.example/a:1": r.example/a:1: not found"#,
            r#"unexpected status code https://r.example/v2/a/manifests/sha256:ab: 429 Too Many Requests - Server message: toomanyrequests: You have reached your pull rate limit."#,
            "failed to extract layer sha256:5123: write /var/lib: no space left on device",
        ] {
            assert_eq!(unavailable(&unknown(message)), None, "{message}");
            assert!(matches!(pull_error(unknown(message)), PullError::Runtime(_)), "{message}");
        }
    }

    #[test]
    fn the_runtimes_own_failures_are_not_the_registrys() {
        let own = [
            tonic::Status::unavailable(
                "connection error: dial unix /run/containerd/containerd.sock: connect: connection refused",
            ),
            tonic::Status::cancelled("RegistryUnavailable: dial tcp 10.0.0.2:443: connect: connection refused"),
        ];
        for status in own {
            assert_eq!(unavailable(&RuntimeError::Status(status)), None);
        }
        assert_eq!(unavailable(&RuntimeError::Timeout(std::time::Duration::from_secs(2))), None);
    }

    #[test]
    fn credentials_that_each_found_the_registry_unavailable_are_registry_unavailable() {
        let unavailable = |detail: &str| Arc::new(PullError::RegistryUnavailable(detail.to_owned()));
        let refused = "dial tcp 10.0.0.2:443: connect: connection refused";
        let open = r#"registry "r.example" is unavailable after 5 failed pulls in a row"#;
        let both = PullError::every_credential_failed(vec![unavailable(refused), unavailable(open)]);
        assert!(matches!(&*both, PullError::RegistryUnavailable(_)), "{both:?}");
        assert_eq!(both.to_string(), format!("RegistryUnavailable: [{refused}, {open}]"));
        // The same message twice is that message, as the kubelet's aggregate has it.
        let same = PullError::every_credential_failed(vec![unavailable(refused), unavailable(refused)]);
        assert_eq!(same.to_string(), format!("RegistryUnavailable: {refused}"));
    }

    #[test]
    fn credentials_one_of_which_reached_the_registry_keep_every_message() {
        let refused = Arc::new(PullError::RegistryUnavailable("connect: connection refused".to_owned()));
        let denied = Arc::new(PullError::Runtime(unknown("401 Unauthorized")));
        let mixed = PullError::every_credential_failed(vec![refused, denied]);
        assert!(matches!(&*mixed, PullError::EveryCredentialFailed(failures) if failures.len() == 2), "{mixed:?}");
        assert_eq!(mixed.kubelet_message(), "[RegistryUnavailable: connect: connection refused, 401 Unauthorized]");
    }
}
