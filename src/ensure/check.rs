//! A policy check (`cri-imaged policy check`): the node's decision on an image for a namespace's
//! pods, explained and made as an entry would make it (the policy in force, the present image's
//! digest or the tag resolved, the pod's secrets and the node's credentials), but nothing pulled,
//! counted as a decision, evented or backed off.

use std::sync::Arc;

use super::{EnsureError, EnsureRequest, Manager, PodRef, request::with_default_tag};
use crate::{
    credentials::secrets::PullSecret,
    cri::ImageSpec,
    policy::{Decision, Mode, SigstoreSigned, Verdict, canonical, where_decided},
    pull::signed,
    reference::ImageReference,
    runtime::ImageRuntime,
    signatures::{Under, Verified},
};

/// What to check: an image for a namespace's pods (none: the default policy), read with these
/// pull secrets as the pod's.
#[derive(Debug, Clone, Default)]
pub struct CheckRequest {
    pub image: String,
    pub namespace: String,
    pub pull_secrets: Vec<PullSecret>,
}

/// The decision, and why.
#[derive(Debug, Clone)]
pub struct PolicyCheck {
    /// The image as the policy saw it (containers/image's form: the default tag applied).
    pub image: String,
    pub verdict: Verdict,
    /// Each requirement of the scope that decided, in a line.
    pub requirements: Vec<String>,
    pub mode: Mode,
    /// For a signature requirement: the digest and what verified it, or why nothing did.
    pub signatures: Option<SignatureCheck>,
}

/// Where the digest checked came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestFrom {
    /// The image on the node, which is what would run.
    Present,
    /// The reference's own `@sha256:…`.
    Reference,
    /// Its tag, resolved at the registry now.
    Registry,
}

impl DigestFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Present => "present",
            Self::Reference => "reference",
            Self::Registry => "registry",
        }
    }
}

#[derive(Debug, Clone)]
pub struct SignatureCheck {
    /// Unknown when the tag could not be resolved.
    pub digest: Option<String>,
    pub from: DigestFrom,
    /// The key and signature that met each requirement, or why none did.
    pub outcome: Result<Verified, String>,
}

/// What the node does with the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckResult {
    Allowed,
    Refused,
    /// Refused by the policy, let in by audit mode.
    Audited,
}

impl CheckResult {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Refused => "refused",
            Self::Audited => "audited",
        }
    }
}

impl PolicyCheck {
    /// Why the policy refuses the image, in the words an entry would use; `None` when it accepts.
    pub fn refusal(&self) -> Option<String> {
        let why = match (&self.verdict.decision, &self.signatures) {
            (Decision::Accepted, _) => return None,
            (Decision::NeedsSignature(_), Some(SignatureCheck { outcome: Ok(_), .. })) => return None,
            (Decision::NeedsSignature(_), Some(SignatureCheck { outcome: Err(why), .. })) => format!(": {why}"),
            (Decision::Rejected | Decision::NeedsSignature(_), _) => String::new(),
        };
        let where_ = where_decided(&self.verdict);
        Some(format!("Running image docker://{} is rejected by policy ({where_}){why}", self.image))
    }

    pub fn result(&self) -> CheckResult {
        match (self.refusal(), self.mode) {
            (None, _) => CheckResult::Allowed,
            (Some(_), Mode::Audit) => CheckResult::Audited,
            (Some(_), Mode::Enforce) => CheckResult::Refused,
        }
    }
}

impl<R: ImageRuntime> Manager<R> {
    /// The policy in force's decision on `request.image` for `request.namespace`'s pods.
    pub async fn check_policy(&self, request: CheckRequest) -> Result<PolicyCheck, EnsureError> {
        let CheckRequest { image, namespace, pull_secrets } = request;
        let pod = PodRef { namespace, ..Default::default() };
        let ensure = EnsureRequest { image, pod, pull_secrets, ..Default::default() };
        let (reference, spec) = with_default_tag(&ensure)?;
        let in_force = self.policy.in_force();
        let namespace = Some(ensure.pod.namespace.as_str()).filter(|namespace| !namespace.is_empty());
        let verdict = in_force.policies.decide(&reference, namespace);
        let requirements = in_force.policies.requirements_of(&verdict).iter().map(|each| each.describe()).collect();
        let signatures = match &verdict.decision {
            Decision::NeedsSignature(required) => {
                let under = Under::of(&verdict);
                Some(self.check_signatures(&ensure, (&reference, spec), (required, &under)).await?)
            }
            Decision::Accepted | Decision::Rejected => None,
        };
        let mode = in_force.mode_for(namespace);
        Ok(PolicyCheck { image: canonical(&reference), verdict, requirements, mode, signatures })
    }

    /// The signatures at the digest that would run: the present image's, the reference's own, or
    /// the tag's now.
    async fn check_signatures(
        &self,
        request: &EnsureRequest,
        (reference, spec): (&ImageReference, ImageSpec),
        (required, under): (&[Arc<SigstoreSigned>], &Under),
    ) -> Result<SignatureCheck, EnsureError> {
        let present = self.image_status(&request.image, &spec).await?;
        let present_digest = present.as_ref().and_then(|found| signed::present_digest(found, reference));
        let (digest, from) = match (present_digest, &present, reference.digest()) {
            (Some(digest), ..) => (Some(digest.to_owned()), DigestFrom::Present),
            (None, Some(_), _) => {
                let outcome = Err(format!(
                    "the present image has no digest in {} (it was not pulled from there), so its signatures cannot be checked",
                    reference.name()
                ));
                return Ok(SignatureCheck { digest: None, from: DigestFrom::Present, outcome });
            }
            (None, None, Some(digest)) => (Some(digest.to_owned()), DigestFrom::Reference),
            (None, None, None) => (None, DigestFrom::Registry),
        };
        let signed = self.pulls.signed();
        let known = digest.as_deref().is_some_and(|digest| signed.is_verified(digest, required));
        let credentials = if known { Vec::new() } else { self.credentials(request, &reference.name()).await? };
        let checked = signed.check(reference, (required, under), digest.as_deref(), &credentials).await;
        Ok(match checked {
            Ok(verified) => SignatureCheck { digest: Some(verified.digest.clone()), from, outcome: Ok(verified) },
            Err(error) => SignatureCheck {
                digest: digest.or_else(|| error.digest().map(str::to_owned)),
                from,
                outcome: Err(error.to_string()),
            },
        })
    }
}
