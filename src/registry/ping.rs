//! Whether a registry answers at all: `GET /v2/` at the hosts a pull's tag is resolved from, in
//! order, as the runtime tries them. Any HTTP answer counts (a 401 asks for credentials, a 404
//! is a registry's own word): it says the registry is there, not what it holds.

use http::StatusCode;

use super::{
    client::RegistryError,
    hosts::HostsConfig,
    transport::{self, Ask},
};
use crate::messages;

/// The first answer of `domain`'s hosts that may resolve a tag; a host that cannot be reached
/// (refused, TLS) is passed for the next, as the runtime passes it; the first failure if none
/// answers. Unbounded: the caller bounds it (a host that accepts and never answers holds it).
pub async fn ping(hosts: &HostsConfig, domain: &str) -> Result<StatusCode, RegistryError> {
    let endpoints = hosts.endpoints(domain);
    let mut first_failure = None;
    for endpoint in endpoints.iter().filter(|endpoint| endpoint.capabilities.resolve) {
        let ask = Ask { accept: "application/json", authorization: None, host_headers: true, what: "its API root" };
        match transport::send(endpoint, &format!("{}/", endpoint.root), &ask).await {
            Ok(answer) => return Ok(answer.status()),
            Err(error) => {
                first_failure.get_or_insert(RegistryError::from(error));
            }
        }
    }
    Err(first_failure.unwrap_or_else(|| RegistryError::NoHost {
        registry: messages::echo(domain).into_owned(),
        capability: "resolve",
    }))
}
