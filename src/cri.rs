//! The generated CRI `runtime.v1` API (`proto/runtime/v1/api.proto`): the messages cri-imaged
//! reads and writes, the client it asks the runtime with, and the servers its tests fake.

// The proto's comments become the types' docs as the Kubernetes authors wrote them: their
// `<placeholders>` and bare URLs are not rustdoc's HTML or links.
#![allow(
    clippy::doc_lazy_continuation,
    clippy::doc_overindented_list_items,
    rustdoc::invalid_html_tags,
    rustdoc::bare_urls,
    rustdoc::broken_intra_doc_links
)]

tonic::include_proto!("runtime.v1");

/// Registry credentials are never printed: only where they are for.
impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig").field("server_address", &self.server_address).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_not_printed() {
        let auth = AuthConfig {
            username: "robot".into(),
            password: "hunter2".into(),
            auth: "cm9ib3Q6aHVudGVyMg==".into(),
            server_address: "registry.example".into(),
            identity_token: "id-token".into(),
            registry_token: "reg-token".into(),
        };
        let printed = format!("{auth:?}");
        assert_eq!(printed, r#"AuthConfig { server_address: "registry.example", .. }"#);
    }
}
