//! The server's metrics: connections the accept path closed to keep its bounds, by why; calls
//! by method, the caller's role and whether it was allowed.

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

/// Calls by method, the caller's role and whether it was allowed (`cri_imaged_calls_total`).
#[derive(Debug, Clone, Default)]
pub struct CallMetrics {
    calls: Family<Labels, Counter>,
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
        metrics
    }

    /// One call of `method` (the table's label) by a caller holding `role`.
    pub fn count(&self, method: &'static str, role: &'static str, allowed: bool) {
        let result = if allowed { "allowed" } else { "denied" };
        self.calls.get_or_create(&vec![("method", method), ("role", role), ("result", result)]).inc();
    }
}
