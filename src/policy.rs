//! Image policy at the node (issue 49): which images may run, in containers-policy.json(5), the
//! format CRI-O, Podman and skopeo read, so that an operator brings the file they have; a file per
//! namespace (`<dir>/<namespace>.json`, as CRI-O's `signature_policy_dir`) replaces the default
//! policy for that namespace's pods. The decision is pure; the files are read by the config, as
//! hostile input.
//!
//! - `file`: the document, read strictly (an unknown field is an error), and what is refused
//!   because it would not be honoured;
//! - `scope`: the `docker` transport's scopes, and the keys an image is looked up under;
//! - `gate`: the policies in force where images enter, swapped whole on reload; audit mode;
//! - `explain`: what is shown of them: where they were read from, their digest, each requirement;
//! - [`sigstore`]: cosign signatures verified by public key (the keys loaded with the file; the
//!   signature artifact and payload read as hostile input; `signedIdentity`), pure.
//!
//! `insecureAcceptAnything` and `reject` are decided here; a `sigstoreSigned` requirement is
//! decided as needing a signature, which [`sigstore::verify`] judges once the caller has fetched
//! the image's signatures. Its `fulcio` certificates and Rekor's proofs are not verified yet, and
//! refuse.

mod explain;
mod file;
mod gate;
mod scope;
pub mod sigstore;

use std::{collections::BTreeMap, sync::Arc};

pub use self::{
    explain::Loaded,
    file::{Fulcio, PolicyFile, PolicyFileError, Requirement, SignedIdentity, SigstoreSigned, parse, parse_with_keys},
    gate::{Admission, InForce, Mode, Pending, PolicyGate, PolicyMetrics, Refusal, canonical, where_decided},
    scope::{ScopeError, lookups},
};
use crate::reference::ImageReference;

/// The node's policies: the default one and those of the namespaces that have their own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policies {
    pub default: Option<PolicyFile>,
    pub namespaces: BTreeMap<String, PolicyFile>,
}

/// What a policy says of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Which policy: `default`, or the namespace's file.
    pub policy: PolicySource,
    /// The scope the requirements are the image's under: a key of `transports.docker`, `""` (the
    /// transport's default), or `None` for the policy's `default`.
    pub scope: Option<String>,
    pub decision: Decision,
}

/// Which policy applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicySource {
    /// No policy is configured: every image is accepted.
    None,
    Default,
    Namespace(String),
}

/// What the requirements decide, every one of which must accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Accepted,
    /// A `reject` requirement applies.
    Rejected,
    /// Signatures are required: each of these requirements must accept one
    /// ([`sigstore::verify`]); they hold their keys, loaded with the file.
    NeedsSignature(Vec<Arc<SigstoreSigned>>),
}

impl Policies {
    /// The verdict on `reference` for a pod of `namespace` (none: a caller that names none, which
    /// the default policy covers).
    pub fn decide(&self, reference: &ImageReference, namespace: Option<&str>) -> Verdict {
        let own = namespace.and_then(|namespace| Some((namespace, self.namespaces.get(namespace)?)));
        let (policy, file) = match (own, &self.default) {
            (Some((namespace, file)), _) => (PolicySource::Namespace(namespace.to_owned()), file),
            (None, Some(file)) => (PolicySource::Default, file),
            (None, None) => return Verdict { policy: PolicySource::None, scope: None, decision: Decision::Accepted },
        };
        let scoped = lookups(reference)
            .into_iter()
            .chain([String::new()])
            .find_map(|key| file.docker.get(&key).map(|requirements| (Some(key), requirements)));
        let (scope, requirements) = scoped.unwrap_or((None, &file.default));
        Verdict { policy, scope, decision: decide(requirements) }
    }
}

/// Every requirement must accept: one `reject` rejects; signatures are needed when any
/// requirement asks for one.
fn decide(requirements: &[Requirement]) -> Decision {
    if requirements.contains(&Requirement::Reject) {
        return Decision::Rejected;
    }
    let signed: Vec<Arc<SigstoreSigned>> = requirements
        .iter()
        .filter_map(|requirement| match requirement {
            Requirement::SigstoreSigned(signed) => Some(Arc::clone(signed)),
            _ => None,
        })
        .collect();
    if signed.is_empty() { Decision::Accepted } else { Decision::NeedsSignature(signed) }
}

#[cfg(test)]
mod tests;
