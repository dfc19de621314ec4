//! A registry's health as the pulls' circuit breaker keeps it, asked and told by a verification
//! that must read the registry (the pull path gives the breaker; this module only names what it
//! needs): an open breaker refuses the verification at once, as it refuses a pull, and how the
//! registry answered counts as one pull's outcome. A herd's merged verification counts once.

use super::SignatureError;
use crate::registry::RegistryError;

/// The breakers, as a verification sees them.
pub trait RegistryHealth: Send + Sync {
    /// Whether `host` may be read now: a visit to report on, or the refusal's words.
    fn visit(&self, host: &str) -> Result<Box<dyn RegistryVisit>, String>;
}

/// One verification's reading of a registry, told once it ended.
pub trait RegistryVisit: Send {
    fn ended(self: Box<Self>, reached: Reached);
}

/// What a verification learnt of its registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reached {
    /// It answered, whatever it said (a signature, none, a refusal of the credentials).
    Answered,
    /// It could not be reached or failed to serve (the words a pull's failure would carry).
    Unreachable(String),
    /// Nothing was learnt (no host may be asked, the verification never went out).
    Nothing,
}

impl Reached {
    /// What `result`'s failure, if any, says of the registry.
    pub fn of<T>(result: &Result<T, SignatureError>) -> Self {
        match result {
            Ok(_) => Self::Answered,
            Err(error) => match unreachable(error) {
                Some(words) => Self::Unreachable(words),
                None if matches!(error, SignatureError::Registry(RegistryError::NoHost { .. })) => Self::Nothing,
                None => Self::Answered,
            },
        }
    }
}

/// The words of a failure that says the registry could not be reached (a connection or TLS
/// failure, a 5xx, the verification's deadline, an open breaker), as a pull's `RegistryUnavailable`
/// carries them; `None` when the registry answered.
pub fn unreachable(error: &SignatureError) -> Option<String> {
    match error {
        SignatureError::RegistryUnavailable(words) => Some(words.clone()),
        SignatureError::TimedOut(_)
        | SignatureError::Registry(RegistryError::Connection { .. } | RegistryError::Tls { .. }) => {
            Some(error.to_string())
        }
        SignatureError::Registry(RegistryError::Status { status, .. }) if status.is_server_error() => {
            Some(error.to_string())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;

    fn registry(error: RegistryError) -> Result<(), SignatureError> {
        Err(SignatureError::Registry(error))
    }

    /// Only a failure that never got an answer is the registry's: refusals, missing signatures
    /// and 4xx are answers; a configuration that allows no host learnt nothing.
    #[test]
    fn what_a_verification_learnt_of_its_registry() {
        let connection = registry(RegistryError::Connection {
            registry: "r.test".into(),
            what: "x".into(),
            reason: "connection refused".into(),
        });
        assert!(
            matches!(Reached::of(&connection), Reached::Unreachable(words) if words.contains("connection refused"))
        );
        let tls = registry(RegistryError::Tls { registry: "r.test".into(), reason: "UnknownIssuer".into() });
        assert!(matches!(Reached::of(&tls), Reached::Unreachable(_)));
        let status = |status| registry(RegistryError::Status { registry: "r.test".into(), what: "x".into(), status });
        assert!(matches!(Reached::of(&status(StatusCode::BAD_GATEWAY)), Reached::Unreachable(_)));
        assert_eq!(Reached::of(&status(StatusCode::NOT_FOUND)), Reached::Answered);
        let timed_out: Result<(), _> = Err(SignatureError::TimedOut(std::time::Duration::from_secs(60)));
        assert!(matches!(Reached::of(&timed_out), Reached::Unreachable(words) if words.contains("longer than 60s")));
        let rejected: Result<(), _> = Err(SignatureError::Rejected { digest: "sha256:a".into(), reason: "no".into() });
        assert_eq!(Reached::of(&rejected), Reached::Answered);
        assert_eq!(Reached::of(&Ok::<(), SignatureError>(())), Reached::Answered);
        let no_host = registry(RegistryError::NoHost { registry: "r.test".into(), capability: "resolve" });
        assert_eq!(Reached::of(&no_host), Reached::Nothing);
    }
}
