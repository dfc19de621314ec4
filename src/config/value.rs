//! Parsers for flag values (the config file's go through them too): each says, when it refuses a
//! value, what its flag accepts.

use std::{
    net::{SocketAddr, ToSocketAddrs},
    num::NonZeroUsize,
    time::Duration,
};

use super::DEFAULT_RUNTIME_ENDPOINT;
use crate::{
    duration::{self, DurationError},
    pull::ratelimit::{RateLimit, RateLimitError},
    records::verification::{AllowlistEntry, PatternError},
    runtime::{EndpointError, RuntimeEndpoint},
};

/// A value its flag does not take. clap's message around it names the flag and the value,
/// `invalid value '0' for '--worker-threads <N>': `, and this says what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("expected a whole number, 1 or more")]
    NotAtLeastOne,
    #[error("expected a whole number, 0 or more")]
    NotACount,
    #[error("expected a whole number from 1 to {MOST_CONNECTIONS}")]
    NotAConnectionCount,
    #[error("expected a whole number of percent, from 0 to 100")]
    NotAPercent,
    #[error("expected a number of pulls a second, 0 or more (0 turns the limit off), e.g. 5 or 0.5")]
    NotAQps,
    #[error("expected a number of pulls a second above 0, e.g. 0.1")]
    NotAPositiveQps,
    #[error("expected HOST=QPS:BURST, e.g. docker.io=2:5 or registry.local:5000=20:40")]
    NotAHostLimit,
    #[error(
        "expected ROLE=SUBJECT: ROLE read, pull or admin; SUBJECT uid:N, user:NAME, gid:N or group:NAME, e.g. admin=group:cri-imaged"
    )]
    NotARole,
    #[error("the HOST before '=' is empty; expected HOST=QPS:BURST, e.g. docker.io=2:5")]
    EmptyHost,
    #[error(
        "QPS {0:?} is not accepted for a host: expected a number of pulls a second above 0, e.g. 2 or 0.5 (only --registry-qps takes 0, for no limit)"
    )]
    HostQps(String),
    #[error("BURST {0:?} is not accepted: expected a whole number of pulls, 1 or more")]
    HostBurst(String),
    #[error("{0}")]
    Duration(#[from] DurationError),
    #[error("{0:?} is not a duration: expected 0 or more as Go writes it, e.g. 0s, 90s, 2m, 1m30s or 168h")]
    GoDuration(String),
    /// The kubelet refuses a negative image GC age too (1.36: `must not be negative`).
    #[error("{0:?} must not be negative: expected 0 or more as Go writes it, e.g. 0s, 90s, 2m, 1m30s or 168h")]
    NegativeGoDuration(String),
    #[error(
        "{0}; expected a name without tag or digest, e.g. alpine or docker.io/library/nginx, or a prefix ending in /*, e.g. registry.local/base/*"
    )]
    AllowlistEntry(#[from] PatternError),
    #[error("{0}")]
    Endpoint(EndpointError),
    #[error("expected unix:///path/to.sock or an absolute socket path, e.g. {DEFAULT_RUNTIME_ENDPOINT}")]
    EmptyEndpoint,
    #[error("expected IP:PORT or HOST:PORT, e.g. 127.0.0.1:9757, [::1]:9757 or localhost:9757")]
    NotAnAddress,
    #[error("port {0:?} is not accepted: expected a number from 0 to 65535")]
    Port(String),
    #[error(
        "cannot resolve {host:?} ({reason}); expected an IP address or a host name this machine resolves, e.g. 127.0.0.1:9757 or localhost:9757"
    )]
    Unresolved { host: String, reason: String },
}

/// A count of at least one: threads, parallel pulls, backoff entries.
pub fn parse_at_least_one(text: &str) -> Result<NonZeroUsize, ValueError> {
    text.parse().map_err(|_| ValueError::NotAtLeastOne)
}

/// The most connections `--max-connections` takes: each holds a file descriptor, and the unit's
/// `LimitNOFILE` is 65,536.
pub const MOST_CONNECTIONS: usize = 1_000_000;

/// `--max-connections`: from 1 to [`MOST_CONNECTIONS`].
pub fn parse_connection_count(text: &str) -> Result<NonZeroUsize, ValueError> {
    let count: NonZeroUsize = text.parse().map_err(|_| ValueError::NotAConnectionCount)?;
    if count.get() > MOST_CONNECTIONS {
        return Err(ValueError::NotAConnectionCount);
    }
    Ok(count)
}

/// `--max-concurrent-streams`: 1 or more, as HTTP/2's setting takes it.
pub fn parse_stream_count(text: &str) -> Result<u32, ValueError> {
    text.parse().ok().filter(|count| *count > 0).ok_or(ValueError::NotAtLeastOne)
}

/// `--registry-burst`: any count; whether 0 goes with the QPS is checked with it.
pub fn parse_burst(text: &str) -> Result<u32, ValueError> {
    text.parse().map_err(|_| ValueError::NotACount)
}

/// `--registry-qps`: a finite number, 0 or more.
pub fn parse_qps(text: &str) -> Result<f64, ValueError> {
    text.parse::<f64>().ok().filter(|qps| qps.is_finite() && *qps >= 0.0).ok_or(ValueError::NotAQps)
}

/// A pull rate that must be above 0 (`--registry-qps-floor`).
pub fn parse_positive_qps(text: &str) -> Result<f64, ValueError> {
    parse_qps(text).ok().filter(|qps| *qps > 0.0).ok_or(ValueError::NotAPositiveQps)
}

/// An image GC threshold: any whole number, so that the kubelet's own check (0 to 100, in its
/// words) judges the range.
pub fn parse_percent(text: &str) -> Result<i64, ValueError> {
    text.parse().map_err(|_| ValueError::NotAPercent)
}

/// `HOST=QPS:BURST` for `--registry-qps-per-host`, the host as in the image reference (port
/// included): `registry.local:5000=2.5:4`. A host's QPS must be above 0 and its burst at least 1.
pub fn parse_host_limit(text: &str) -> Result<(String, RateLimit), ValueError> {
    let (host, limit) = text.split_once('=').ok_or(ValueError::NotAHostLimit)?;
    let (qps, burst) = limit.split_once(':').ok_or(ValueError::NotAHostLimit)?;
    if host.is_empty() {
        return Err(ValueError::EmptyHost);
    }
    let bad_qps = || ValueError::HostQps(qps.to_owned());
    let bad_burst = || ValueError::HostBurst(burst.to_owned());
    let qps_value: f64 = qps.parse().map_err(|_| bad_qps())?;
    let burst_value: u32 = burst.parse().map_err(|_| bad_burst())?;
    // The limit's own checks; a host's 0 QPS (no limit) is refused: omit the host instead.
    match RateLimit::try_new(qps_value, burst_value) {
        Ok(Some(limit)) => Ok((host.to_owned(), limit)),
        Ok(None) | Err(RateLimitError::BadQps(_)) => Err(bad_qps()),
        Err(RateLimitError::ZeroBurst) => Err(bad_burst()),
    }
}

/// A path where empty means "none" (clap's own path parser refuses an empty one).
pub fn parse_path_or_empty(text: &str) -> Result<std::path::PathBuf, ValueError> {
    Ok(text.into())
}

/// `--runtime-endpoint`, saying what is accepted when it is refused.
pub fn parse_runtime_endpoint(text: &str) -> Result<RuntimeEndpoint, ValueError> {
    RuntimeEndpoint::parse(text).map_err(|error| match error {
        EndpointError::Empty => ValueError::EmptyEndpoint,
        other => ValueError::Endpoint(other),
    })
}

/// A wait or a period: `500ms`, `30s`, `2m`, `1h`; zero is refused because each bounds something
/// ([`duration::parse_nonzero`]).
pub fn parse_duration(text: &str) -> Result<Duration, ValueError> {
    Ok(duration::parse_nonzero(text)?)
}

/// As [`parse_duration`], where zero means "none at all" ([`duration::parse`]).
pub fn parse_duration_or_zero(text: &str) -> Result<Duration, ValueError> {
    Ok(duration::parse(text)?)
}

/// A Go duration, 0 or more (`2m`, `1m30s`), as the kubelet takes its image GC ages
/// ([`duration::parse_go`]).
pub fn parse_go_duration(text: &str) -> Result<Duration, ValueError> {
    duration::parse_go(text).map_err(|error| match error {
        DurationError::Negative(_) => ValueError::NegativeGoDuration(text.to_owned()),
        _ => ValueError::GoDuration(text.to_owned()),
    })
}

/// A `--preloaded-images-verification-allowlist` entry, as written: a name without tag or digest
/// (short ones as the kubelet normalises a pod's image) or a prefix ending in `/*`
/// ([`AllowlistEntry::parse`]).
pub fn parse_allowlist_entry(text: &str) -> Result<String, ValueError> {
    AllowlistEntry::parse(text)?;
    Ok(text.to_owned())
}

/// An address to listen on: `IP:PORT`, or `HOST:PORT` with the host resolved now, to its first
/// IPv4 address (loopback names resolve to `::1` first, which a host without IPv6 cannot bind),
/// else its first address.
pub fn parse_listen_address(text: &str) -> Result<SocketAddr, ValueError> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let (host, port) = text.rsplit_once(':').ok_or(ValueError::NotAnAddress)?;
    if host.is_empty() || host.contains([':', '[', ']', '/']) {
        return Err(ValueError::NotAnAddress);
    }
    let port: u16 = port.parse().map_err(|_| ValueError::Port(port.to_owned()))?;
    let unresolved = |reason: String| ValueError::Unresolved { host: host.to_owned(), reason };
    let addrs: Vec<SocketAddr> =
        (host, port).to_socket_addrs().map_err(|error| unresolved(error.to_string()))?.collect();
    addrs
        .iter()
        .find(|addr| addr.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| unresolved("no address".to_owned()))
}
