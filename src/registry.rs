//! Reading from registries over the distribution API, for what the runtime does not fetch for us:
//! an image's signatures (issue 49). A manifest by tag or digest, a blob by digest, each bounded
//! and checked against its digest, with the credentials the pull would use (HTTP Basic, or the
//! Docker token flow with them; a registry token as is), from the hosts containerd would pull from.
//!
//! - `endpoint`: where and how a host is reached; without a hosts.toml, containerd's default:
//!   `docker.io` at `registry-1.docker.io`, a loopback registry over plain HTTP, any other HTTPS.
//! - `hosts`: containerd's `config_path` (hosts.toml: server, mirrors, capabilities, CA, headers),
//!   read at start and on reload.
//! - `tls`: TLS with the system's roots and a host's CA, the bundle read once, lazily.
//! - `auth`: the `WWW-Authenticate` challenge and the token it leads to.
//! - `transport`: one GET on a connection of its own, plain or TLS.
//! - `client`: one request at a time, the hosts tried in order, the answer read to a bound.
//! - `ping`: whether a registry answers at all (`GET /v2/`), for pulls the runtime says nothing of.

mod auth;
mod client;
mod endpoint;
mod hosts;
mod ping;
mod tls;
mod transport;

pub use self::{
    client::{Fetched, RegistryClient, RegistryError, Repository},
    endpoint::{Capabilities, Endpoint},
    hosts::{DEFAULT_CONFIG_PATH, DEFAULT_REGISTRIES_CONF, HostsConfig, RegistryHosts},
    ping::ping,
};

#[cfg(test)]
mod tests;
