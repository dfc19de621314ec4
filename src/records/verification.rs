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
/// (`registry.io/team/app`) and prefixes (`registry.io/team/*`), normalised as pods' images are.
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
    Pattern(#[from] PatternError),
}

/// Why one allowlist entry is refused, in the kubelet's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PatternError(String);

/// One allowlist entry, normalised as the kubelet (1.36) normalises a pod's image before matching
/// it (`ParseNormalizedNamed`): `alpine` is `docker.io/library/alpine`, `myorg/*` is
/// `docker.io/myorg/*`. The kubelet's own config takes full names only; a short one is read here
/// as the pod images it is meant for are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowlistEntry {
    /// An image name without tag or digest: `docker.io/library/alpine`.
    Name(String),
    /// What a name starts with, ending in `/`: `registry.io/team/` (written `registry.io/team/*`).
    Prefix(String),
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
            match AllowlistEntry::parse(pattern)? {
                AllowlistEntry::Prefix(prefix) => allowlist.prefixes.push(prefix),
                AllowlistEntry::Name(name) => {
                    allowlist.names.insert(name);
                }
            }
        }
        Ok(allowlist)
    }

    /// Whether `name` (an image name without tag or digest, normalised: a pod's image as
    /// [`ImageReference::parse_normalized`] reads it) is exempt.
    pub fn allows(&self, name: &str) -> bool {
        self.names.contains(name) || self.prefixes.iter().any(|prefix| name.starts_with(prefix.as_str()))
    }
}

impl AllowlistEntry {
    /// Checks `pattern` as the kubelet does, with its messages (a short name aside), and
    /// normalises it.
    pub fn parse(pattern: &str) -> Result<Self, PatternError> {
        if pattern != pattern.trim() {
            return Err(PatternError(format!("leading/trailing spaces are not allowed: {pattern}")));
        }
        let wildcard = pattern.ends_with("/*");
        let trimmed = if wildcard { &pattern[..pattern.len() - 1] } else { pattern };
        if trimmed.is_empty() {
            return Err(PatternError(format!("the supplied pattern is too short: {pattern}")));
        }
        if trimmed.contains('*') {
            let reason = format!("not a valid wildcard pattern, only patterns ending with '/*' are allowed: {pattern}");
            return Err(PatternError(reason));
        }
        if wildcard {
            if trimmed.len() == 1 {
                return Err(PatternError("at least registry hostname is required".to_owned()));
            }
            // Two more components, so that normalising never adds `library/`: `docker.io/*` is
            // every image on Docker Hub, not only the official ones.
            let parsed = ImageReference::parse_normalized(&format!("{trimmed}x/y"))
                .map_err(|error| PatternError(format!("failed to parse as an image name prefix: {error}")))?;
            let name = parsed.name();
            return Ok(Self::Prefix(name.strip_suffix("x/y").unwrap_or(&name).to_owned()));
        }
        let parsed = ImageReference::parse_normalized(trimmed)
            .map_err(|error| PatternError(format!("failed to parse as an image name: {error}")))?;
        if parsed.tag().is_some() || parsed.digest().is_some() {
            return Err(PatternError(format!("neither tag nor digest is accepted in an image reference: {pattern}")));
        }
        Ok(Self::Name(parsed.name()))
    }
}

/// Whether a present image must have its credentials verified: `name` is the image's normalised
/// name without tag or digest, `pulled_by_cri_imaged` whether a pulled record or a pull intent
/// exists for it. (The allowlist is matched against the normalised name, as the kubelet does from
/// 1.36 on, so `nginx:1.25` is covered by `docker.io/library/nginx` and by `nginx`.)
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
            (" alpine", "leading/trailing spaces are not allowed:  alpine"),
            ("alpine:3", "neither tag nor digest is accepted in an image reference: alpine:3"),
            (
                "library/alpine@sha256:38a8906435c4dd5f4258899d46621bfd8eea3ad6ff494ee3c2f17ef0321625bd",
                "neither tag nor digest is accepted in an image reference: library/alpine@sha256:38a8906435c4dd5f4258899d46621bfd8eea3ad6ff494ee3c2f17ef0321625bd",
            ),
            (
                "Alpine",
                "failed to parse as an image name: invalid reference format: repository name (library/Alpine) must be lowercase",
            ),
            ("team//*", "failed to parse as an image name prefix: invalid reference format"),
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
    fn short_entries_are_taken_as_the_kubelet_normalises_a_pods_image() {
        let cases = [
            ("alpine", AllowlistEntry::Name("docker.io/library/alpine".into())),
            ("library/alpine", AllowlistEntry::Name("docker.io/library/alpine".into())),
            ("docker.io/alpine", AllowlistEntry::Name("docker.io/library/alpine".into())),
            ("index.docker.io/library/alpine", AllowlistEntry::Name("docker.io/library/alpine".into())),
            ("docker.io/library/alpine", AllowlistEntry::Name("docker.io/library/alpine".into())),
            ("myorg/app", AllowlistEntry::Name("docker.io/myorg/app".into())),
            ("registry.local:5000/app", AllowlistEntry::Name("registry.local:5000/app".into())),
            ("myorg/*", AllowlistEntry::Prefix("docker.io/myorg/".into())),
            ("docker.io/*", AllowlistEntry::Prefix("docker.io/".into())),
            ("index.docker.io/*", AllowlistEntry::Prefix("docker.io/".into())),
            ("registry.local:5000/team/*", AllowlistEntry::Prefix("registry.local:5000/team/".into())),
        ];
        for (pattern, entry) in cases {
            assert_eq!(AllowlistEntry::parse(pattern), Ok(entry), "{pattern:?}");
        }
    }

    /// A pod's image as the manager matches it: normalised, without tag or digest.
    fn pods(image: &str) -> String {
        ImageReference::parse_normalized(image).expect("a pod's image").name()
    }

    #[test]
    fn a_pods_short_image_matches_a_short_entry_and_its_full_name() {
        let digest = "sha256:38a8906435c4dd5f4258899d46621bfd8eea3ad6ff494ee3c2f17ef0321625bd";
        let images = ["alpine:3.19", &format!("library/alpine@{digest}"), "docker.io/alpine", "alpine"];
        for entry in ["alpine", "docker.io/library/alpine", "library/*", "docker.io/*"] {
            let list = allowlist(&[entry]).expect("valid");
            for image in images {
                assert!(list.allows(&pods(image)), "{entry:?} exempts {image:?}");
            }
            assert!(!list.allows(&pods("registry.local/alpine:3.19")), "{entry:?}: another registry's alpine");
        }
        let list = allowlist(&["alpine"]).expect("valid");
        for image in ["alpinex:1", "myorg/alpine:1", "docker.io/library/alpine-extra"] {
            assert!(!list.allows(&pods(image)), "{image:?}");
        }
        let team = allowlist(&["myorg/*"]).expect("valid");
        assert!(team.allows(&pods("myorg/app:1")) && team.allows(&pods("docker.io/myorg/tools/app")));
        assert!(!team.allows(&pods("alpine")) && !team.allows(&pods("registry.local/myorg/app")));
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
