//! Which present images need their credentials verified before a pod may use them (the kubelet's
//! `imagePullCredentialsVerificationPolicy` and `preloadedImagesVerificationAllowlist`).

use std::collections::BTreeSet;

use crate::reference::ImageReference;

/// The kubelet's verification policies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum VerificationPolicy {
    /// Never verify: any pod may use any present image, as before KEP-2535.
    #[value(name = "NeverVerify")]
    NeverVerify,
    /// Verify only images cri-imaged pulled (a pulled record or a pull intent exists); images
    /// that were on the node before (pulled some other way) are not verified.
    #[default]
    #[value(name = "NeverVerifyPreloadedImages")]
    NeverVerifyPreloadedImages,
    /// Verify every image not on `--preloaded-images-verification-allowlist`.
    #[value(name = "NeverVerifyAllowlistedImages")]
    NeverVerifyAllowlistedImages,
    /// Verify every image.
    #[value(name = "AlwaysVerify")]
    AlwaysVerify,
}

impl VerificationPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NeverVerify => "NeverVerify",
            Self::NeverVerifyPreloadedImages => "NeverVerifyPreloadedImages",
            Self::NeverVerifyAllowlistedImages => "NeverVerifyAllowlistedImages",
            Self::AlwaysVerify => "AlwaysVerify",
        }
    }
}

/// Images exempt from verification under `NeverVerifyAllowlistedImages`: exact names
/// (`registry.io/team/app`) and prefixes (`registry.io/team/*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    names: BTreeSet<String>,
    prefixes: Vec<String>,
}

/// A policy and its allowlist that do not go together, or an allowlist entry that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(
        "invalid configuration: can't set `preloadedImagesVerificationAllowlist` if `imagePullCredentialsVerificationPolicy` is not \"NeverVerifyAllowlistedImages\""
    )]
    AllowlistWithoutItsPolicy,
    #[error("invalid configuration: invalid image pattern in `preloadedImagesVerificationAllowlist`: {0}")]
    Pattern(String),
}

impl Allowlist {
    /// Checks `patterns` as the kubelet does, with its messages, and keeps them.
    pub fn new(policy: VerificationPolicy, patterns: &[String]) -> Result<Self, PolicyError> {
        if patterns.is_empty() {
            return Ok(Self::default());
        }
        if policy != VerificationPolicy::NeverVerifyAllowlistedImages {
            return Err(PolicyError::AllowlistWithoutItsPolicy);
        }
        let mut allowlist = Self::default();
        for pattern in patterns {
            match pattern_kind(pattern).map_err(PolicyError::Pattern)? {
                Pattern::Prefix(prefix) => allowlist.prefixes.push(prefix.to_owned()),
                Pattern::Name(name) => {
                    allowlist.names.insert(name.to_owned());
                }
            }
        }
        Ok(allowlist)
    }

    /// Whether `name` (an image name without tag or digest, normalised) is exempt.
    pub fn allows(&self, name: &str) -> bool {
        self.names.contains(name) || self.prefixes.iter().any(|prefix| name.starts_with(prefix.as_str()))
    }
}

enum Pattern<'a> {
    Name(&'a str),
    Prefix(&'a str),
}

/// One allowlist entry: a full image name without tag or digest, or a prefix ending in `/*`.
fn pattern_kind(pattern: &str) -> Result<Pattern<'_>, String> {
    if pattern != pattern.trim() {
        return Err(format!("leading/trailing spaces are not allowed: {pattern}"));
    }
    let wildcard = pattern.ends_with("/*");
    let trimmed = if wildcard { &pattern[..pattern.len() - 1] } else { pattern };
    if trimmed.is_empty() {
        return Err(format!("the supplied pattern is too short: {pattern}"));
    }
    if trimmed.contains('*') {
        return Err(format!("not a valid wildcard pattern, only patterns ending with '/*' are allowed: {pattern}"));
    }
    if wildcard {
        if trimmed.len() == 1 {
            return Err("at least registry hostname is required".to_owned());
        }
        return Ok(Pattern::Prefix(trimmed));
    }
    let parsed = ImageReference::parse_normalized(trimmed)
        .map_err(|error| format!("failed to parse as an image name: {error}"))?;
    if parsed.name() != trimmed {
        return Err(format!("neither tag nor digest is accepted in an image reference: {pattern}"));
    }
    Ok(Pattern::Name(trimmed))
}

/// Whether a present image must have its credentials verified: `name` is the image's normalised
/// name without tag or digest, `pulled_by_cri_imaged` whether a pulled record or a pull intent
/// exists for it. (The allowlist is matched against the normalised name, as the kubelet does from
/// 1.36 on, so `nginx:1.25` is covered by `docker.io/library/nginx`.)
pub fn requires_verification(
    policy: VerificationPolicy,
    allowlist: &Allowlist,
    name: &str,
    pulled_by_cri_imaged: bool,
) -> bool {
    match policy {
        VerificationPolicy::NeverVerify => false,
        VerificationPolicy::NeverVerifyPreloadedImages => pulled_by_cri_imaged,
        VerificationPolicy::NeverVerifyAllowlistedImages => !allowlist.allows(name),
        VerificationPolicy::AlwaysVerify => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowlist(patterns: &[&str]) -> Result<Allowlist, PolicyError> {
        let patterns: Vec<String> = patterns.iter().map(|pattern| (*pattern).to_owned()).collect();
        Allowlist::new(VerificationPolicy::NeverVerifyAllowlistedImages, &patterns)
    }

    #[test]
    fn invalid_allowlist_entries_are_refused_with_the_kubelets_messages() {
        let cases = [
            (
                "image.repo/pokus*/imagename",
                "not a valid wildcard pattern, only patterns ending with '/*' are allowed: image.repo/pokus*/imagename",
            ),
            (
                "image.repo/pokus*",
                "not a valid wildcard pattern, only patterns ending with '/*' are allowed: image.repo/pokus*",
            ),
            (
                "image.repo/*/imagename",
                "not a valid wildcard pattern, only patterns ending with '/*' are allowed: image.repo/*/imagename",
            ),
            ("/*", "at least registry hostname is required"),
            ("image.repo/", "failed to parse as an image name: invalid reference format"),
            ("", "the supplied pattern is too short: "),
            ("*", "not a valid wildcard pattern, only patterns ending with '/*' are allowed: *"),
            (
                "test.io/test/image1:tagged",
                "neither tag nor digest is accepted in an image reference: test.io/test/image1:tagged",
            ),
            (
                "test.io/test/image1@sha256:38a8906435c4dd5f4258899d46621bfd8eea3ad6ff494ee3c2f17ef0321625bd",
                "neither tag nor digest is accepted in an image reference: test.io/test/image1@sha256:38a8906435c4dd5f4258899d46621bfd8eea3ad6ff494ee3c2f17ef0321625bd",
            ),
            ("test.io/test/image1 ", "leading/trailing spaces are not allowed: test.io/test/image1 "),
            ("nginx", "neither tag nor digest is accepted in an image reference: nginx"),
        ];
        for (pattern, message) in cases {
            let error = allowlist(&[pattern]).expect_err(pattern);
            let expected = format!(
                "invalid configuration: invalid image pattern in `preloadedImagesVerificationAllowlist`: {message}"
            );
            assert_eq!(error.to_string(), expected, "{pattern:?}");
        }
    }

    #[test]
    fn an_allowlist_needs_its_policy() {
        let patterns = vec!["test.io/test/image1".to_owned()];
        let error = Allowlist::new(VerificationPolicy::AlwaysVerify, &patterns).expect_err("wrong policy");
        assert_eq!(error, PolicyError::AllowlistWithoutItsPolicy);
        assert!(Allowlist::new(VerificationPolicy::AlwaysVerify, &[]).is_ok());
    }

    #[test]
    fn allowlisted_names_and_prefixes_are_exempt() {
        let list =
            allowlist(&["test.io/test/image1", "test.io/test/image1", "docker.io/library/nginx", "test.io/other/*"])
                .expect("valid");
        for name in ["test.io/test/image1", "docker.io/library/nginx", "test.io/other/app", "test.io/other/deep/app"] {
            assert!(list.allows(name), "{name}");
        }
        for name in
            ["test.io/test/image2", "test.io/test/image1x", "test.io/otherwise/app", "docker.io/library/busybox"]
        {
            assert!(!list.allows(name), "{name}");
        }
        assert!(!allowlist(&["different.repo/test/*"]).expect("valid").allows("test.io/test/test-image"));
        assert!(allowlist(&["test.io/*"]).expect("valid").allows("test.io/test/test-image"));
    }

    #[test]
    fn each_policy_says_which_present_images_are_verified() {
        use VerificationPolicy::*;
        let list = allowlist(&["test.io/allowed"]).expect("valid");
        let cases = [
            (NeverVerify, "test.io/other", true, false),
            (NeverVerifyPreloadedImages, "test.io/other", false, false),
            (NeverVerifyPreloadedImages, "test.io/other", true, true),
            (NeverVerifyAllowlistedImages, "test.io/allowed", true, false),
            (NeverVerifyAllowlistedImages, "test.io/other", false, true),
            (AlwaysVerify, "test.io/allowed", false, true),
        ];
        for (policy, name, pulled, expected) in cases {
            assert_eq!(
                requires_verification(policy, &list, name, pulled),
                expected,
                "{policy:?} {name} pulled={pulled}"
            );
        }
    }
}
