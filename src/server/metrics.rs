//! The server's metrics: connections the accept path closed to keep its bounds, by why; calls
//! by method, the caller's role and whether it was allowed; CRI calls relayed to the runtime
//! unread, by method.

use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use crate::metric_labels::Labels;

/// Why the accept path closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// At `--max-connections`, with no connection in its handshake to give its place.
    Refused,
    /// Its place was needed before it sent the HTTP/2 preface.
    Displaced,
    /// No HTTP/2 preface within `--connection-handshake-timeout`.
    HandshakeTimeout,
    /// Its process held its share (`--max-connections-per-client`) as it began HTTP/2.
    ClientShare,
}

impl Closed {
    fn label(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Displaced => "displaced",
            Self::HandshakeTimeout => "handshake_timeout",
            Self::ClientShare => "client_share",
        }
    }
}

/// Connections closed by the accept path, by why (`cri_imaged_connections_closed_total`).
#[derive(Debug, Clone, Default)]
pub struct ConnectionMetrics {
    closed: Family<Labels, Counter>,
}

impl ConnectionMetrics {
    /// The metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "connections_closed",
            "Connections the accept path closed to keep its bounds: refused at --max-connections, displaced before their HTTP/2 preface, or timed out waiting for it",
            metrics.closed.clone(),
        );
        metrics
    }

    pub fn closed(&self, why: Closed) {
        self.closed.get_or_create(&vec![("reason", why.label())]).inc();
    }

    /// How many were closed for `why` so far (its series exists from then on, at 0 if none).
    pub fn closed_total(&self, why: Closed) -> u64 {
        self.closed.get_or_create(&vec![("reason", why.label())]).get()
    }
}

/// The most methods the relayed calls' metric names; any other is counted as `other`, so that
/// callers naming methods at random cannot grow the series without bound.
const RELAYED_METHODS_NAMED: usize = 32;

/// The longest method name the relayed calls' metric names.
const RELAYED_METHOD_NAME_BYTES: usize = 64;

/// Calls by method, the caller's role and whether it was allowed (`cri_imaged_calls_total`), and
/// CRI calls cri-imaged does not know, relayed to the runtime (`cri_imaged_cri_relayed_calls_total`).
#[derive(Debug, Clone, Default)]
pub struct CallMetrics {
    calls: Family<Labels, Counter>,
    relayed: Family<Labels, Counter>,
    /// The method names the relayed calls' series have, each made `'static` once.
    relayed_names: std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>,
}

impl CallMetrics {
    /// The metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "calls",
            "Calls of our API and the CRI image service by method, the caller's role (--role, --default-role) and whether it was allowed or denied",
            metrics.calls.clone(),
        );
        registry.register(
            "cri_relayed_calls",
            "Calls of CRI image service methods cri-imaged does not know, relayed to the runtime unread, by method (the first 32 names; any other as other)",
            metrics.relayed.clone(),
        );
        metrics
    }

    /// One call of `method` (a name under `/runtime.v1.ImageService/`) relayed to the runtime.
    pub fn relayed(&self, method: &str) {
        let label = self.relayed_label(method);
        self.relayed.get_or_create(&vec![("method", label)]).inc();
    }

    /// How many calls of `method` were relayed so far.
    pub fn relayed_total(&self, method: &str) -> u64 {
        self.relayed.get_or_create(&vec![("method", self.relayed_label(method))]).get()
    }

    fn relayed_label(&self, method: &str) -> &'static str {
        let named = method.len() <= RELAYED_METHOD_NAME_BYTES
            && !method.is_empty()
            && method.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_');
        if !named || method == "other" {
            return "other";
        }
        let mut names = self.relayed_names.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(name) = names.iter().find(|name| **name == method) {
            return name;
        }
        if names.len() >= RELAYED_METHODS_NAMED {
            return "other";
        }
        // Bounded: at most 32 names of at most 64 bytes, for the life of the process.
        let name: &'static str = Box::leak(method.to_owned().into_boxed_str());
        names.push(name);
        name
    }

    /// One call of `method` (the table's label) by a caller holding `role`.
    pub fn count(&self, method: &'static str, role: &'static str, allowed: bool) {
        let result = if allowed { "allowed" } else { "denied" };
        self.calls.get_or_create(&vec![("method", method), ("role", role), ("result", result)]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relayed_calls_are_counted_by_method_and_the_names_are_bounded() {
        let metrics = CallMetrics::default();
        metrics.relayed("PullSecurityProfile");
        metrics.relayed("PullSecurityProfile");
        assert_eq!(metrics.relayed_total("PullSecurityProfile"), 2);
        for odd in ["", "Has/Slash", "Ünïcode", &"A".repeat(65)] {
            metrics.relayed(odd);
        }
        assert_eq!(metrics.relayed_total("other"), 4, "what is no method name is counted as other");
        for i in 0..40 {
            metrics.relayed(&format!("Method{i}"));
        }
        assert_eq!(metrics.relayed_total("Method30"), 1);
        assert_eq!(metrics.relayed_total("other"), 4 + 9, "past 32 names");
    }
}
