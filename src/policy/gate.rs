//! The policy in force, where images enter (EnsureImageExists and pre-pulls through it, CRI
//! PullImage): swapped whole on reload, each decision counted; in audit mode a refusal is logged
//! and counted but lets the image in, so that a policy can be rolled out without breaking pods.

use std::sync::{Arc, RwLock};

use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::{Decision, Policies, PolicySource, SigstoreSigned, Verdict};
use crate::{metric_labels::Labels, reference::ImageReference};

/// Whether a refusal refuses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// The policy's refusal fails the pull (the default).
    #[default]
    Enforce,
    /// A refusal is logged, evented and counted; the image goes in.
    Audit,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::Audit => "audit",
        }
    }
}

/// The policies and mode in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InForce {
    pub policies: Policies,
    /// The node's mode.
    pub mode: Mode,
    /// Namespaces audited whatever the node's mode.
    pub audit_namespaces: std::collections::BTreeSet<String>,
    /// Where they were read from and when; `None` for policies not read from files (tests).
    pub loaded: Option<super::Loaded>,
}

impl InForce {
    /// The mode for a pod of `namespace`: audit when the node or that namespace is audited.
    pub fn mode_for(&self, namespace: Option<&str>) -> Mode {
        match namespace {
            Some(namespace) if self.audit_namespaces.contains(namespace) => Mode::Audit,
            _ => self.mode,
        }
    }
}

/// An image the policy does not let in, and why, in containers/image's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub verdict: Verdict,
    /// `Running image docker://… is rejected by policy.` and where the requirement is.
    pub message: String,
    /// Audit mode: the image goes in anyway.
    pub audited: bool,
}

/// What the policy says where an image enters, short of a refusal.
#[derive(Debug)]
pub enum Admission {
    /// Accepted, or no policy.
    Admit,
    /// Refused, and let in by audit mode.
    Audited(Refusal),
    /// Accepted if its signatures meet these requirements: [`PolicyGate::settle`] says.
    Verify(Pending),
}

/// A decision waiting on the image's signatures.
#[derive(Debug, Clone)]
pub struct Pending {
    verdict: Verdict,
    /// Every one must be met.
    pub requirements: Vec<Arc<SigstoreSigned>>,
    mode: Mode,
    policy: &'static str,
}

impl Pending {
    /// Which policy and scope required the signatures, for events and messages.
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }
}

/// Images judged, by result and policy (`cri_imaged_policy_decisions_total`).
#[derive(Debug, Clone, Default)]
pub struct PolicyMetrics {
    decisions: Family<Labels, Counter>,
}

impl PolicyMetrics {
    /// The metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "policy_decisions",
            "Images judged by the node's image policy where they enter, by result (accepted; rejected; audited: rejected but let in by audit mode) and policy (default, or a namespace's own)",
            metrics.decisions.clone(),
        );
        // Every series from the start at 0: a rate sees a node's first refusal, and the family is
        // listed before any (the shipped alerts name it).
        for result in ["accepted", "rejected", "audited"] {
            for policy in ["default", "namespace"] {
                metrics.total(result, policy);
            }
        }
        metrics
    }

    /// How many were judged so.
    pub fn total(&self, result: &'static str, policy: &'static str) -> u64 {
        self.decisions.get_or_create(&vec![("result", result), ("policy", policy)]).get()
    }
}

/// The gate; shared by every entry point.
#[derive(Debug, Default)]
pub struct PolicyGate {
    in_force: RwLock<Arc<InForce>>,
    metrics: Arc<PolicyMetrics>,
}

impl PolicyGate {
    /// A gate with `in_force`, counting into `metrics`.
    pub fn new(in_force: InForce, metrics: Arc<PolicyMetrics>) -> Self {
        Self { in_force: RwLock::new(Arc::new(in_force)), metrics }
    }

    /// The policies and mode now.
    pub fn in_force(&self) -> Arc<InForce> {
        self.in_force.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Puts `in_force` in place of what was (a reload).
    pub fn replace(&self, in_force: InForce) {
        *self.in_force.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(in_force);
    }

    /// Judges `reference` for a pod of `namespace`: `Ok` to let it in (with the refusal audit
    /// mode let through) or to verify its signatures first; `Err` with the refusal in enforce
    /// mode.
    pub fn check(&self, reference: &ImageReference, namespace: Option<&str>) -> Result<Admission, Refusal> {
        let in_force = self.in_force();
        let verdict = in_force.policies.decide(reference, namespace.filter(|namespace| !namespace.is_empty()));
        let policy = match &verdict.policy {
            // No policy: nothing judged, nothing counted (every container start asks).
            PolicySource::None => return Ok(Admission::Admit),
            PolicySource::Default => "default",
            PolicySource::Namespace(_) => "namespace",
        };
        match &verdict.decision {
            Decision::Accepted => {
                self.count("accepted", policy);
                Ok(Admission::Admit)
            }
            Decision::Rejected => {
                let message = format!(
                    "Running image docker://{} is rejected by policy ({})",
                    canonical(reference),
                    where_decided(&verdict)
                );
                self.refuse(verdict, message, in_force.mode_for(namespace), policy).map(Admission::Audited)
            }
            Decision::NeedsSignature(requirements) => {
                let requirements = requirements.clone();
                let mode = in_force.mode_for(namespace);
                Ok(Admission::Verify(Pending { verdict, requirements, mode, policy }))
            }
        }
    }

    /// The verdict on an image whose signatures were checked: `verified`, or why not.
    pub fn settle(
        &self,
        reference: &ImageReference,
        pending: Pending,
        verified: Result<(), &dyn std::fmt::Display>,
    ) -> Result<Option<Refusal>, Refusal> {
        let Pending { verdict, mode, policy, .. } = pending;
        let why = match verified {
            Ok(()) => {
                self.count("accepted", policy);
                return Ok(None);
            }
            Err(why) => why,
        };
        let message = format!(
            "Running image docker://{} is rejected by policy ({}): {why}",
            canonical(reference),
            where_decided(&verdict)
        );
        self.refuse(verdict, message, mode, policy).map(Some)
    }

    /// A refusal: in audit mode logged and let through, else returned.
    fn refuse(&self, verdict: Verdict, message: String, mode: Mode, policy: &'static str) -> Result<Refusal, Refusal> {
        let audited = mode == Mode::Audit;
        self.count(if audited { "audited" } else { "rejected" }, policy);
        let refusal = Refusal { verdict, message, audited };
        if audited {
            tracing::warn!(mode = "audit", "{}; let in (audit mode)", refusal.message);
            return Ok(refusal);
        }
        tracing::info!("{}", refusal.message);
        Err(refusal)
    }

    fn count(&self, result: &'static str, policy: &'static str) {
        self.metrics.decisions.get_or_create(&vec![("result", result), ("policy", policy)]).inc();
    }
}

/// The reference as containers/image names it: in full, its digest rather than its tag when it
/// has both.
pub fn canonical(reference: &ImageReference) -> String {
    match (reference.digest(), reference.tag()) {
        (Some(digest), _) => format!("{}@{digest}", reference.name()),
        (None, Some(tag)) => format!("{}:{tag}", reference.name()),
        (None, None) => reference.name(),
    }
}

/// Which policy and scope the requirement comes from, for the message.
pub fn where_decided(verdict: &Verdict) -> String {
    let policy = match &verdict.policy {
        PolicySource::Namespace(namespace) => format!("the policy of namespace {namespace:?}"),
        PolicySource::Default | PolicySource::None => "the node's policy".to_owned(),
    };
    match &verdict.scope {
        Some(scope) if scope.is_empty() => format!("{policy}, the docker transport's default"),
        Some(scope) => format!("{policy}, scope {scope:?}"),
        None => format!("{policy}, its default"),
    }
}
