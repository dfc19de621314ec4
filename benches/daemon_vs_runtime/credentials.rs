//! Pull credentials at scale: a pod with 100 pull secrets of 50 registries each. On the presence
//! path they are carried but never read; on the pull path they are read and matched, once per
//! pull. Both are compared with the same calls without secrets.

use std::time::{Duration, Instant};

use cri_imaged::{
    api,
    credentials::{self, NodeCredentials, SecretCoordinates, secrets},
};

use crate::memory::CountingAllocator;

/// Secrets per pod.
pub const SECRETS: usize = 100;
/// Registries per secret.
pub const ENTRIES: usize = 50;

/// The pod's secrets on the wire: every entry for a registry of its own, except the last one of
/// the last secret, which is for `registry` (so that a lookup walks them all and finds one).
pub fn pull_secrets(registry: &str) -> Vec<api::PullSecret> {
    (0..SECRETS)
        .map(|secret| {
            let auths: serde_json::Map<String, serde_json::Value> = (0..ENTRIES)
                .map(|entry| {
                    let key = if secret == SECRETS - 1 && entry == ENTRIES - 1 {
                        registry.to_owned()
                    } else {
                        format!("registry-{secret}-{entry}.example.com/team-{entry}")
                    };
                    let login =
                        serde_json::json!({"username": format!("user-{secret}-{entry}"), "password": "s3cret-pw"});
                    (key, login)
                })
                .collect();
            api::PullSecret {
                name: format!("regcred-{secret}"),
                namespace: "bench".into(),
                docker_config_json: serde_json::json!({ "auths": auths }).to_string(),
                uid: format!("uid-{secret}"),
                r#type: secrets::DOCKER_CONFIG_JSON.into(),
            }
        })
        .collect()
}

/// What reading the secrets and finding the credentials for one image costs, per pull.
pub struct LookupCost {
    pub per_lookup: Duration,
    pub allocations_per_lookup: f64,
    /// Credentials found for the image: must be 1.
    pub found: usize,
}

/// Builds the pod's keyring and looks `image_name` up in it and in the node's (empty) keyring,
/// `rounds` times, as a pull does.
pub async fn lookup_cost(
    allocator: &CountingAllocator,
    wire: &[api::PullSecret],
    image_name: &str,
    rounds: usize,
) -> LookupCost {
    let pull_secrets: Vec<secrets::PullSecret> = wire
        .iter()
        .map(|secret| secrets::PullSecret {
            coordinates: SecretCoordinates {
                uid: secret.uid.clone(),
                namespace: secret.namespace.clone(),
                name: secret.name.clone(),
            },
            kind: secret.r#type.clone(),
            content: secret.docker_config_json.as_str().into(),
        })
        .collect();
    let node = NodeCredentials::none();
    let allocations_before = allocator.allocations_made();
    let started = Instant::now();
    let mut found = 0;
    for _ in 0..rounds {
        let keyring = secrets::keyring_for(image_name, &pull_secrets).expect("the bench's secrets parse");
        found = credentials::for_pull(image_name, &keyring, &node).await.len();
    }
    let elapsed = started.elapsed();
    let allocations = allocator.allocations_made() - allocations_before;
    LookupCost {
        per_lookup: elapsed / rounds as u32,
        allocations_per_lookup: allocations as f64 / rounds as f64,
        found,
    }
}
