//! Pull policy: Kubernetes' defaulting and the kubelet's pull decision, both pure.

use crate::reference::{DEFAULT_TAG, ImageReference};

/// A container's `imagePullPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PullPolicy {
    /// Pull on every request.
    Always,
    /// Pull only when the image is absent.
    IfNotPresent,
    /// Never pull.
    Never,
}

impl PullPolicy {
    /// The policy Kubernetes gives a container that names none: `Always` when the effective tag is
    /// `latest` (written, or implied by neither tag nor digest), else `IfNotPresent`.
    ///
    /// As in Kubernetes, `image:latest@sha256:…` is `Always`: the written tag decides.
    pub fn default_for(reference: &ImageReference) -> Self {
        let implied_latest = reference.tag().is_none() && reference.digest().is_none();
        if implied_latest || reference.tag() == Some(DEFAULT_TAG) { Self::Always } else { Self::IfNotPresent }
    }

    /// The policy as Kubernetes spells it, for logs and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// What to do about an image, given its policy and whether the runtime has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The image is present and the policy does not ask for a fresh pull.
    UsePresent,
    /// Pull the image.
    Pull,
    /// The image is absent and the policy forbids pulling it.
    RefuseNeverPull,
}

/// The kubelet's `shouldPullImage`, with its two "no pull" outcomes told apart.
pub fn decide(policy: PullPolicy, present: bool) -> Decision {
    match (policy, present) {
        (PullPolicy::Never, true) | (PullPolicy::IfNotPresent, true) => Decision::UsePresent,
        (PullPolicy::Never, false) => Decision::RefuseNeverPull,
        (PullPolicy::Always, _) | (PullPolicy::IfNotPresent, false) => Decision::Pull,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_for(image: &str) -> PullPolicy {
        let reference = ImageReference::parse_normalized(image).expect("test image parses");
        PullPolicy::default_for(&reference)
    }

    #[test]
    fn unspecified_policy_is_always_without_tag_or_digest() {
        assert_eq!(default_for("busybox"), PullPolicy::Always);
        assert_eq!(default_for("registry.local:5000/team/app"), PullPolicy::Always);
    }

    #[test]
    fn unspecified_policy_is_always_for_the_latest_tag() {
        assert_eq!(default_for("busybox:latest"), PullPolicy::Always);
    }

    #[test]
    fn unspecified_policy_is_if_not_present_for_any_other_tag() {
        assert_eq!(default_for("busybox:1.36"), PullPolicy::IfNotPresent);
        assert_eq!(default_for("localhost:5000/app:latest-rc"), PullPolicy::IfNotPresent);
    }

    #[test]
    fn unspecified_policy_is_if_not_present_for_a_digest() {
        let digest = format!("sha256:{}", "a".repeat(64));
        assert_eq!(default_for(&format!("busybox@{digest}")), PullPolicy::IfNotPresent);
        assert_eq!(default_for(&format!("busybox:1.36@{digest}")), PullPolicy::IfNotPresent);
    }

    #[test]
    fn written_latest_tag_beside_a_digest_is_always_as_in_kubernetes() {
        let digest = format!("sha256:{}", "a".repeat(64));
        assert_eq!(default_for(&format!("busybox:latest@{digest}")), PullPolicy::Always);
    }

    #[test]
    fn decision_table_matches_the_kubelet() {
        use Decision::*;
        use PullPolicy::*;
        let table = [
            (Always, true, Pull),
            (Always, false, Pull),
            (IfNotPresent, true, UsePresent),
            (IfNotPresent, false, Pull),
            (Never, true, UsePresent),
            (Never, false, RefuseNeverPull),
        ];
        for (policy, present, expected) in table {
            assert_eq!(decide(policy, present), expected, "{policy:?} with present={present}");
        }
    }
}
