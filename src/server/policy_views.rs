//! The image policy on the wire: the policy in force for GetStatus, a policy check's answer, and
//! what each listed image was verified under.

use std::path::Path;

use crate::{
    api,
    ensure::check::PolicyCheck,
    policy::{InForce, PolicySource},
    signatures::{Signatures, Under},
};

/// The policy in force and its signature counters; `None` when no policy is configured.
pub fn image_policy_status(in_force: &InForce, signatures: &Signatures) -> Option<api::ImagePolicyStatus> {
    let loaded = in_force.loaded.as_ref().filter(|loaded| loaded.file.is_some() || loaded.dir.is_some())?;
    let shown = |path: Option<&Path>| path.map(|path| path.display().to_string()).unwrap_or_default();
    let metrics = signatures.metrics();
    let [verified, rejected, error] = metrics.verifications_total();
    Some(api::ImagePolicyStatus {
        policy_file: shown(loaded.file.as_deref()),
        namespace_dir: shown(loaded.dir.as_deref()),
        namespace_files: u32::try_from(loaded.namespace_files).unwrap_or(u32::MAX),
        digest: loaded.digest.clone(),
        mode: in_force.mode.as_str().to_owned(),
        loaded: Some(prost_types::Timestamp::from(loaded.at)),
        verifications_verified: verified,
        verifications_rejected: rejected,
        verifications_error: error,
        signature_cache_hits: metrics.cache_hits_total(),
        audit_namespaces: in_force.audit_namespaces.iter().cloned().collect(),
    })
}

/// `policy` and `namespace` as the API writes them.
fn policy_fields(policy: &PolicySource) -> (String, String) {
    match policy {
        PolicySource::None => ("none".to_owned(), String::new()),
        PolicySource::Default => ("default".to_owned(), String::new()),
        PolicySource::Namespace(namespace) => ("namespace".to_owned(), namespace.clone()),
    }
}

pub fn check_response(check: PolicyCheck) -> api::CheckImagePolicyResponse {
    let result = check.result().as_str().to_owned();
    let refusal = check.refusal().unwrap_or_default();
    let (policy, namespace) = policy_fields(&check.verdict.policy);
    let (digest, digest_source, verified_by) = match check.signatures {
        Some(signatures) => {
            let verified_by = match signatures.outcome {
                Ok(verified) => {
                    verified.by.into_iter().map(|(key, signature)| api::SignatureMatch { key, signature }).collect()
                }
                Err(_) => Vec::new(),
            };
            (signatures.digest.unwrap_or_default(), signatures.from.as_str().to_owned(), verified_by)
        }
        None => Default::default(),
    };
    api::CheckImagePolicyResponse {
        result,
        image: check.image,
        policy,
        namespace,
        scope: check.verdict.scope,
        requirements: check.requirements,
        mode: check.mode.as_str().to_owned(),
        digest,
        digest_source,
        verified_by,
        refusal,
    }
}

/// What each of `repo_digests` (`name@sha256:…`) was verified under: from memory, no registry.
pub fn verifications(signatures: &Signatures, repo_digests: &[String]) -> Vec<api::ImageVerification> {
    let mut digests: Vec<&str> = repo_digests.iter().filter_map(|name| name.split_once('@')).map(|(_, d)| d).collect();
    digests.sort_unstable();
    digests.dedup();
    digests
        .into_iter()
        .flat_map(|digest| signatures.verified_under(digest))
        .map(|(Under { policy, scope }, verified)| {
            let (policy, namespace) = policy_fields(&policy);
            api::ImageVerification {
                digest: verified.digest,
                policy,
                namespace,
                scope,
                keys: verified.by.into_iter().map(|(key, _)| key).collect(),
            }
        })
        .collect()
}
