//! Reading from registries over the distribution API, for what the runtime does not fetch for us:
//! an image's signatures (issue 49). A manifest by tag or digest, a blob by digest, each bounded
//! and checked against its digest, with the credentials the pull would use (HTTP Basic, or the
//! Docker token flow with them; a registry token as is).
//!
//! - `endpoint`: where a registry is reached: `docker.io` at `registry-1.docker.io`; a loopback
//!   registry over plain HTTP, as containerd reaches one; any other over HTTPS.
//! - `auth`: the `WWW-Authenticate` challenge and the token it leads to.
//! - `client`: one request at a time over HTTP/1.1, the answer read to a bound.

mod auth;
mod client;
mod endpoint;

pub use self::{
    client::{Fetched, RegistryClient, RegistryError, Repository},
    endpoint::Endpoint,
};

#[cfg(test)]
mod tests;
