//! A policy's signature requirement where images enter: the signatures verified (from memory
//! when this digest met this requirement before), the verdict settled (audit mode lets a failure
//! in), and after the pull, the pulled image bound to the digest verified: a tag that moved
//! between the two leaves no unverified image behind.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::{PullError, Pulled};
use crate::{
    credentials::Credential,
    cri::ImageSpec,
    events::{EventType, Events, Subject, reason as event_reason},
    policy::{Pending, PolicyGate, SigstoreSigned, canonical},
    reference::ImageReference,
    runtime::{ImageRuntime, PresentImage, RuntimeError},
    signatures::{SignatureError, Signatures, Under, Verified, unreachable},
};

type Status = dyn Fn(ImageSpec) -> BoxFuture<'static, Result<Option<PresentImage>, RuntimeError>> + Send + Sync;
type Remove = dyn Fn(String, String) -> BoxFuture<'static, Result<(), RuntimeError>> + Send + Sync;

/// Verifies and binds; shared by EnsureImageExists and CRI PullImage.
pub struct SignedPulls {
    signatures: Arc<Signatures>,
    policy: Arc<PolicyGate>,
    events: Arc<Events>,
    status: Box<Status>,
    remove: Box<Remove>,
}

impl SignedPulls {
    /// Over `runtime`, whose answers say which digest a pulled image is.
    pub fn new<R: ImageRuntime>(
        runtime: Arc<R>,
        signatures: Arc<Signatures>,
        policy: Arc<PolicyGate>,
        events: Arc<Events>,
    ) -> Self {
        let asked = runtime.clone();
        let status = Box::new(move |spec: ImageSpec| {
            let runtime = asked.clone();
            Box::pin(async move { runtime.image_status(spec).await }) as BoxFuture<'static, _>
        });
        let remove = Box::new(move |id: String, handler: String| {
            let runtime = runtime.clone();
            Box::pin(async move { runtime.remove_image(&id, &handler).await }) as BoxFuture<'static, _>
        });
        Self { signatures, policy, events, status, remove }
    }

    /// The policy's verdict on `reference` once its signatures are checked, at `digest` when the
    /// digest that will run is known: `Ok` with what was verified (`None`: audit mode let a
    /// failure in), `Err` with the refusal, as a pull's error.
    pub async fn verify(
        &self,
        reference: &ImageReference,
        pending: Pending,
        digest: Option<&str>,
        credentials: &[Arc<Credential>],
        about: &Subject,
    ) -> Result<Option<Verified>, PullError> {
        let under = Under::of(pending.verdict());
        let checked = self.signatures.verify(reference, digest, (&pending.requirements, &under), credentials).await;
        let why = checked.as_ref().err().map(|error| error.to_string());
        let settled = self.policy.settle(reference, pending, why.as_ref().map_or(Ok(()), |why| Err(why)));
        match (settled, checked) {
            (Ok(None), Ok(verified)) => Ok(Some(verified)),
            (Ok(audited), _) => {
                if let Some(audited) = audited {
                    self.events.publish(about.event(EventType::Warning, event_reason::POLICY_AUDIT, audited.message));
                }
                Ok(None)
            }
            // The registry could not be reached: the image was not judged, and the pod is told
            // what a pull would tell it (the breaker counted it).
            (Err(_), Err(error)) if let Some(words) = unreachable(&error) => Err(PullError::RegistryUnavailable(words)),
            (Err(refusal), _) => Err(PullError::PolicyRejected(refusal.message)),
        }
    }

    /// The signatures checked as an entry would check them, but nothing settled, evented or
    /// let in: for a policy check, which explains a decision without making one.
    pub async fn check(
        &self,
        reference: &ImageReference,
        (requirements, under): (&[Arc<SigstoreSigned>], &Under),
        digest: Option<&str>,
        credentials: &[Arc<Credential>],
    ) -> Result<Verified, Arc<SignatureError>> {
        self.signatures.verify(reference, digest, (requirements, under), credentials).await
    }

    /// The node's signature checks: what they verified, their counters.
    pub fn signatures(&self) -> &Arc<Signatures> {
        &self.signatures
    }

    /// Whether `digest` met these requirements before (a verification would be answered from
    /// memory, needing no credentials).
    pub fn is_verified(&self, digest: &str, requirements: &[Arc<SigstoreSigned>]) -> bool {
        self.signatures.cached(digest, requirements).is_some()
    }

    /// The verdict on an image whose signatures cannot be checked at all, and why.
    pub fn settle_unverifiable(
        &self,
        reference: &ImageReference,
        pending: Pending,
        why: &str,
        about: &Subject,
    ) -> Result<(), PullError> {
        match self.policy.settle(reference, pending, Err(&why)) {
            Ok(audited) => {
                if let Some(audited) = audited {
                    self.events.publish(about.event(EventType::Warning, event_reason::POLICY_AUDIT, audited.message));
                }
                Ok(())
            }
            Err(refusal) => Err(PullError::PolicyRejected(refusal.message)),
        }
    }

    /// The event of an image pulled after its signatures were verified.
    pub fn announce(&self, reference: &ImageReference, verified: &Verified, about: &Subject) {
        let keys: Vec<&str> = verified.by.iter().map(|(key, _)| key.as_str()).collect();
        let message = format!(
            "Verified the signature of image docker://{} at {} (key {})",
            canonical(reference),
            verified.digest,
            keys.join(", ")
        );
        self.events.publish(about.event(EventType::Normal, event_reason::SIGNATURE_VERIFIED, message));
    }

    /// The image `pulled` is the digest verified in `repository`, or it is removed (unless a
    /// container uses it, which the runtime refuses) and the pull fails.
    pub async fn bind(
        &self,
        pulled: &Pulled,
        reference: &ImageReference,
        verified: &Verified,
        runtime_handler: &str,
    ) -> Result<(), PullError> {
        let wanted = format!("{}@{}", reference.name(), verified.digest);
        let spec = ImageSpec {
            image: pulled.image_ref.clone(),
            runtime_handler: runtime_handler.to_owned(),
            ..Default::default()
        };
        let found = (self.status)(spec).await.map_err(|error| {
            PullError::PolicyRejected(format!("the pulled image's digest could not be read: {error}"))
        })?;
        if found.as_ref().is_some_and(|image| image.repo_digests.contains(&wanted)) {
            return Ok(());
        }
        // By its id: CRI-O answers OK to a removal by `repo@digest` and removes nothing.
        let id = found.map_or_else(|| pulled.image_ref.clone(), |image| image.id);
        let removed = (self.remove)(id, runtime_handler.to_owned()).await;
        if let Err(error) = &removed {
            tracing::warn!(image_ref = %pulled.image_ref, %error, "the image pulled after its tag moved was not removed");
        }
        Err(PullError::PolicyRejected(format!(
            "Running image docker://{} is rejected by policy: the image pulled is not {} whose signature was verified (its tag moved during the pull){}",
            canonical(reference),
            verified.digest,
            if removed.is_ok() { "; it was removed" } else { "" }
        )))
    }
}

/// The digest of `present` in `reference`'s repository, as the runtime records it.
pub fn present_digest<'a>(present: &'a PresentImage, reference: &ImageReference) -> Option<&'a str> {
    let prefix = format!("{}@", reference.name());
    present.repo_digests.iter().find_map(|name| name.strip_prefix(&prefix))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::runtime::fake::FakeRuntime;

    const VERIFIED: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const MOVED: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn signed_pulls(runtime: Arc<FakeRuntime>) -> SignedPulls {
        let signatures = Arc::new(Signatures::new(Default::default(), Arc::default()));
        SignedPulls::new(runtime, signatures, Arc::default(), Arc::default())
    }

    fn bound_to(verified: &str) -> (ImageReference, Verified, Pulled) {
        let reference = ImageReference::parse_normalized("registry.example/app:v1").expect("a reference");
        let verified = Verified { digest: verified.into(), by: vec![("fingerprint".into(), "sha256:sig".into())] };
        let pulled = Pulled { image_ref: "sha256:image".into(), image_size: 1, pull_duration: Duration::ZERO };
        (reference, verified, pulled)
    }

    #[tokio::test]
    async fn an_image_pulled_as_the_digest_verified_stays() {
        let runtime =
            Arc::new(FakeRuntime::default().with_image(&format!("registry.example/app@{VERIFIED}"), "sha256:image", 1));
        let (reference, verified, pulled) = bound_to(VERIFIED);
        signed_pulls(runtime.clone()).bind(&pulled, &reference, &verified, "").await.expect("bound");
        assert!(runtime.state().removed.is_empty());
    }

    #[tokio::test]
    async fn an_image_whose_tag_moved_during_the_pull_is_removed_and_the_pull_fails() {
        let runtime =
            Arc::new(FakeRuntime::default().with_image(&format!("registry.example/app@{MOVED}"), "sha256:image", 1));
        let (reference, verified, pulled) = bound_to(VERIFIED);
        let refused = signed_pulls(runtime.clone()).bind(&pulled, &reference, &verified, "").await;
        let Err(PullError::PolicyRejected(message)) = refused else { panic!("bound: {refused:?}") };
        assert!(message.contains(&format!("the image pulled is not {VERIFIED}")), "{message}");
        assert!(message.ends_with("; it was removed"), "{message}");
        assert_eq!(runtime.state().removed, ["sha256:image"]);
    }

    #[tokio::test]
    async fn a_busy_image_is_not_removed_but_the_pull_still_fails() {
        let runtime =
            Arc::new(FakeRuntime::default().with_image(&format!("registry.example/app@{MOVED}"), "sha256:image", 1));
        runtime.state().refuse_removal.insert("sha256:image".into());
        let (reference, verified, pulled) = bound_to(VERIFIED);
        let refused = signed_pulls(runtime.clone()).bind(&pulled, &reference, &verified, "").await;
        let Err(PullError::PolicyRejected(message)) = refused else { panic!("bound: {refused:?}") };
        assert!(!message.contains("removed"), "{message}");
    }

    #[test]
    fn a_present_image_runs_as_its_digest_in_the_repository_asked_for() {
        let present = PresentImage {
            id: "sha256:image".into(),
            size: 1,
            repo_digests: vec![format!("other.example/app@{MOVED}"), format!("registry.example/app@{VERIFIED}")],
        };
        let (reference, _, _) = bound_to(VERIFIED);
        assert_eq!(present_digest(&present, &reference), Some(VERIFIED));
        let elsewhere = ImageReference::parse_normalized("third.example/app:v1").expect("a reference");
        assert_eq!(present_digest(&present, &elsewhere), None);
    }
}
