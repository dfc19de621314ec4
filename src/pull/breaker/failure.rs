//! What a failed pull says about its registry, read from the runtime's message (containerd and
//! CRI-O pass on Go's `net/http` errors and the registry's status line as text).

use crate::{pull::PullError, runtime::RuntimeError};

/// What a pull's error says about the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The registry could not be reached or failed to serve: refused, DNS, TLS, a timeout, a 5xx.
    Unreachable,
    /// The registry answered 429 / `toomanyrequests`: the node pulls too often.
    TooManyRequests,
    /// The registry answered (not found, unauthorized, a bad manifest).
    Answered,
    /// Nothing about the registry: the runtime itself failed, or the pull never reached it.
    Unknown,
}

/// Words of Go's network errors that mean no answer came from the registry.
const UNREACHABLE: [&str; 14] = [
    "connection refused",
    "connection reset",
    "no such host",
    "server misbehaving",
    "i/o timeout",
    "network is unreachable",
    "no route to host",
    "tls handshake timeout",
    "tls:",
    "x509:",
    "client.timeout exceeded",
    "server gave http response to https client",
    "unexpected eof",
    "registryunavailable",
];

/// Reads a pull's failure.
pub fn classify(error: &PullError) -> Failure {
    match error {
        PullError::Runtime(RuntimeError::Status(status)) if from_runtime_itself(status.code()) => Failure::Unknown,
        PullError::Runtime(RuntimeError::Status(status)) => classify_message(status.message()),
        PullError::RegistryUnavailable(_) | PullError::Stalled { .. } => Failure::Unreachable,
        PullError::EveryCredentialFailed(failures) => {
            let mut seen = failures.iter().map(|failure| classify(failure));
            let first = seen.next().unwrap_or(Failure::Unknown);
            if seen.all(|failure| failure == first) { first } else { Failure::Answered }
        }
        PullError::Runtime(_)
        | PullError::RateLimited
        | PullError::TimedOut(_)
        | PullError::Abandoned
        | PullError::Cancelled
        | PullError::PolicyRejected(_) => Failure::Unknown,
    }
}

/// Whether a runtime's status with `code` is about the runtime itself (its channel failed, it
/// cancelled the call, it does not serve pulls), whatever its message says of a registry.
pub fn from_runtime_itself(code: tonic::Code) -> bool {
    matches!(code, tonic::Code::Unavailable | tonic::Code::Unimplemented | tonic::Code::Cancelled)
}

/// Reads a runtime's pull error message.
pub fn classify_message(message: &str) -> Failure {
    let lower = message.to_ascii_lowercase();
    if lower.contains("429 too many requests") || lower.contains("toomanyrequests") {
        return Failure::TooManyRequests;
    }
    if UNREACHABLE.iter().any(|words| lower.contains(words)) || server_error(&lower) {
        return Failure::Unreachable;
    }
    Failure::Answered
}

/// Whether the message quotes a 5xx status line (`...: 503 Service Unavailable`).
pub fn server_error(lower: &str) -> bool {
    lower.match_indices(": 5").any(|(at, _)| {
        let code = lower.as_bytes().get(at + 2..at + 5);
        let after = lower.as_bytes().get(at + 5);
        code.is_some_and(|code| code.iter().all(u8::is_ascii_digit)) && after.is_none_or(|byte| *byte == b' ')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(code: tonic::Code, message: &str) -> PullError {
        PullError::Runtime(RuntimeError::Status(tonic::Status::new(code, message)))
    }

    #[test]
    fn containerds_messages_for_a_registry_that_cannot_be_reached() {
        for message in [
            r#"failed to pull and unpack image "10.9.0.2:5000/a:1": failed to resolve reference "10.9.0.2:5000/a:1": failed to do request: Head "http://10.9.0.2:5000/v2/a/manifests/1": dial tcp 10.9.0.2:5000: connect: connection refused"#,
            r#"failed to resolve reference "r.example/a:1": failed to do request: Head "https://r.example/v2/a/manifests/1": dial tcp: lookup r.example on 127.0.0.53:53: no such host"#,
            r#"failed to resolve reference "r.example/a:1": failed to do request: Head "https://r.example/v2/a/manifests/1": tls: failed to verify certificate: x509: certificate signed by unknown authority"#,
            r#"failed to resolve reference "r.example/a:1": unexpected status from HEAD request to https://r.example/v2/a/manifests/1: 503 Service Unavailable"#,
            r#"failed to copy: httpReadSeeker: failed open: unexpected status code https://r.example/v2/a/blobs/sha256:ab: 502 Bad Gateway"#,
            "failed to copy: read tcp 10.0.0.1:3344->10.0.0.2:443: read: connection reset by peer",
            "RegistryUnavailable: the registry did not answer",
        ] {
            assert_eq!(classify(&runtime(tonic::Code::Unknown, message)), Failure::Unreachable, "{message}");
        }
    }

    #[test]
    fn answers_the_registry_gave_and_its_rate_limit() {
        let limited = r#"failed to copy: httpReadSeeker: failed open: unexpected status code https://registry-1.docker.io/v2/library/a/manifests/sha256:ab: 429 Too Many Requests - Server message: toomanyrequests: You have reached your pull rate limit."#;
        assert_eq!(classify_message(limited), Failure::TooManyRequests);
        for answered in [
            r#"failed to resolve reference "r.example/a:1": r.example/a:1: not found"#,
            r#"failed to resolve reference "r.example/a:1": pull access denied, repository does not exist or may require authorization: server message: insufficient_scope"#,
            r#"unexpected status from HEAD request to https://r.example/v2/a/manifests/1: 401 Unauthorized"#,
            // A 5 that is not a status code.
            "failed to extract layer sha256:5123: write /var/lib: no space left on device",
        ] {
            assert_eq!(classify_message(answered), Failure::Answered, "{answered}");
        }
    }

    #[test]
    fn the_runtimes_own_failures_say_nothing_about_the_registry() {
        let down = runtime(tonic::Code::Unavailable, "connection refused (containerd.sock)");
        assert_eq!(classify(&down), Failure::Unknown);
        assert_eq!(classify(&PullError::Cancelled), Failure::Unknown);
        assert_eq!(classify(&PullError::RateLimited), Failure::Unknown);
    }
}
