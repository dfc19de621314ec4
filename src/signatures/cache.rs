//! Verified digests, by the requirement they met (those read back from disk by its name), and the
//! verifications under way, joined.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures_util::{
    FutureExt,
    future::{BoxFuture, Shared},
};

use tokio::{sync::Notify, time::Instant};

use super::{SignatureError, Under, Verified, requirement::requirement_id};
use crate::policy::SigstoreSigned;

/// Digests kept: a node runs a few hundred images; each entry is a few hundred bytes.
pub const KEPT: usize = 4096;

/// What was verified, by digest and the requirements met. A reload that changes a requirement
/// leaves its entries unmatched; the oldest go first past [`KEPT`]. Entries read back from disk
/// know their requirements by name only ([`requirement_id`]).
#[derive(Default)]
pub struct VerifiedCache {
    inner: Mutex<Kept>,
    /// Told of each entry added, for the writer that keeps them on disk.
    changed: Notify,
}

/// A digest verified: the requirements it met (by name; and themselves, when verified since
/// start), under which policy (the first that asked), and how.
struct Met {
    requirement: String,
    requirements: Option<Vec<Arc<SigstoreSigned>>>,
    under: Under,
    verified: Verified,
}

/// A verification as kept on disk: the name of the requirements it met, the policy that asked,
/// and what verified it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub requirement: String,
    pub under: Under,
    pub verified: Verified,
}

#[derive(Default)]
struct Kept {
    by_digest: HashMap<String, Vec<Met>>,
    /// Oldest first; a digest once for each of its entries, in the order of its list.
    order: VecDeque<String>,
}

impl VerifiedCache {
    pub fn get(&self, digest: &str, requirements: &[Arc<SigstoreSigned>]) -> Option<Verified> {
        let kept = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let entries = kept.by_digest.get(digest)?;
        if let Some(met) = entries.iter().find(|met| met.requirements.as_deref() == Some(requirements)) {
            return Some(met.verified.clone());
        }
        // Read back from disk: matched by the requirements' name.
        let mut stored = entries.iter().filter(|met| met.requirements.is_none()).peekable();
        stored.peek()?;
        let name = requirement_id(requirements);
        stored.find(|met| met.requirement == name).map(|met| met.verified.clone())
    }

    /// Every policy `digest` was verified under.
    pub fn under(&self, digest: &str) -> Vec<(Under, Verified)> {
        let kept = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let entries = kept.by_digest.get(digest).map_or(&[][..], Vec::as_slice);
        entries.iter().map(|met| (met.under.clone(), met.verified.clone())).collect()
    }

    pub fn put(&self, digest: &str, requirements: &[Arc<SigstoreSigned>], (under, verified): (Under, Verified)) {
        let requirement = requirement_id(requirements);
        let mut kept = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let Kept { by_digest, order } = &mut *kept;
        let entries = by_digest.entry(digest.to_owned()).or_default();
        if entries.iter().any(|met| met.requirement == requirement) {
            return;
        }
        entries.push(Met { requirement, requirements: Some(requirements.to_vec()), under, verified });
        order.push_back(digest.to_owned());
        kept.trim();
        drop(kept);
        self.changed.notify_one();
    }

    /// Adds what was kept on disk (oldest first) as older than anything verified since start.
    pub fn restore(&self, stored: Vec<Stored>) {
        let mut kept = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let Kept { by_digest, order } = &mut *kept;
        for Stored { requirement, under, verified } in stored.into_iter().rev() {
            let entries = by_digest.entry(verified.digest.clone()).or_default();
            if entries.iter().any(|met| met.requirement == requirement) {
                continue;
            }
            order.push_front(verified.digest.clone());
            entries.insert(0, Met { requirement, requirements: None, under, verified });
        }
        kept.trim();
    }

    /// Every entry, oldest first, as kept on disk.
    pub fn stored(&self) -> Vec<Stored> {
        let kept = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next: HashMap<&str, usize> = HashMap::new();
        let mut stored = Vec::with_capacity(kept.order.len());
        for digest in &kept.order {
            let index = next.entry(digest).or_default();
            if let Some(met) = kept.by_digest.get(digest).and_then(|entries| entries.get(*index)) {
                let Met { requirement, under, verified, .. } = met;
                stored.push(Stored {
                    requirement: requirement.clone(),
                    under: under.clone(),
                    verified: verified.clone(),
                });
            }
            *index += 1;
        }
        stored
    }

    /// Resolves once an entry was added since the last time it resolved.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

impl Kept {
    /// Drops the oldest entries past [`KEPT`].
    fn trim(&mut self) {
        while self.order.len() > KEPT {
            let Some(oldest) = self.order.pop_front() else { break };
            if let Some(entries) = self.by_digest.get_mut(&oldest) {
                entries.remove(0);
                if entries.is_empty() {
                    self.by_digest.remove(&oldest);
                }
            }
        }
    }
}

type Outcome = Result<Verified, Arc<SignatureError>>;

/// How long a verification that succeeded answers those who ask the same after it ended: a
/// herd's late callers by tag (no digest yet to look the cache up by) take its result rather than
/// read the signatures again, as the scheduler shares a pull's result for as long.
const RECENT: Duration = Duration::from_secs(10);

/// A verification under way, or ended well within [`RECENT`].
struct Flight {
    shared: Shared<BoxFuture<'static, Outcome>>,
    ended: Option<Instant>,
}

/// Verifications under way, by what they verify: a caller of one under way waits for its result.
#[derive(Default)]
pub struct Flights {
    under_way: Mutex<HashMap<String, Flight>>,
}

impl Flights {
    /// The result of the verification `key` names: `work`'s, or that of the one under way (or
    /// ended well within [`RECENT`]).
    pub async fn join(&self, key: String, work: BoxFuture<'static, Outcome>) -> Outcome {
        let shared = {
            let mut under_way = self.under_way.lock().unwrap_or_else(PoisonError::into_inner);
            under_way.retain(|_, flight| flight.ended.is_none_or(|ended| ended.elapsed() < RECENT));
            let flight = under_way.entry(key.clone()).or_insert_with(|| Flight { shared: work.shared(), ended: None });
            flight.shared.clone()
        };
        // Driven by every waiter; whichever sees it end first marks it ended, or takes a failure
        // off the list (the next caller tries again).
        let outcome = shared.clone().await;
        let mut under_way = self.under_way.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(flight) = under_way.get_mut(&key)
            && flight.shared.ptr_eq(&shared)
        {
            match outcome {
                Ok(_) => {
                    flight.ended.get_or_insert_with(Instant::now);
                }
                Err(_) => {
                    under_way.remove(&key);
                }
            }
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::policy::SigstoreSigned;

    fn requirement(key: &str) -> Vec<Arc<SigstoreSigned>> {
        let text = format!(r#"{{"keyData": "{key}"}}"#);
        vec![Arc::new(serde_json::from_str(&text).expect("a requirement"))]
    }

    fn verified(digest: &str) -> Verified {
        Verified { digest: digest.into(), by: vec![("0123".into(), "sha256:sig".into())] }
    }

    fn under(namespace: Option<&str>) -> Under {
        let policy = namespace.map_or(crate::policy::PolicySource::Default, |namespace| {
            crate::policy::PolicySource::Namespace(namespace.into())
        });
        Under { policy, scope: Some("r.example".into()) }
    }

    #[test]
    fn a_digest_is_verified_only_under_the_requirement_it_met() {
        let cache = VerifiedCache::default();
        cache.put("sha256:a", &requirement("one"), (under(None), verified("sha256:a")));
        assert_eq!(cache.get("sha256:a", &requirement("one")), Some(verified("sha256:a")));
        // A reload that changed the key: what the old one covered does not count.
        assert_eq!(cache.get("sha256:a", &requirement("two")), None);
        assert_eq!(cache.get("sha256:b", &requirement("one")), None);
    }

    #[test]
    fn a_digest_lists_each_policy_it_was_verified_under() {
        let cache = VerifiedCache::default();
        cache.put("sha256:a", &requirement("one"), (under(None), verified("sha256:a")));
        cache.put("sha256:a", &requirement("two"), (under(Some("team")), verified("sha256:a")));
        // The same requirement again (another pod, another policy with the same key): kept once.
        cache.put("sha256:a", &requirement("one"), (under(Some("other")), verified("sha256:a")));
        let listed: Vec<Under> = cache.under("sha256:a").into_iter().map(|(under, _)| under).collect();
        assert_eq!(listed, [under(None), under(Some("team"))]);
        assert!(cache.under("sha256:b").is_empty());
    }

    #[test]
    fn the_oldest_entries_go_past_the_bound() {
        let cache = VerifiedCache::default();
        for n in 0..=KEPT {
            let digest = format!("sha256:{n}");
            cache.put(&digest, &requirement("one"), (under(None), verified(&digest)));
        }
        assert_eq!(cache.get("sha256:0", &requirement("one")), None);
        assert!(cache.get(&format!("sha256:{KEPT}"), &requirement("one")).is_some());
        assert!(cache.get("sha256:1", &requirement("one")).is_some());
    }

    #[tokio::test]
    async fn verifications_of_one_image_under_way_at_once_are_one() {
        let flights = Arc::new(Flights::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let (release, held) = tokio::sync::watch::channel(false);
        let waiters: Vec<_> = (0..50)
            .map(|_| {
                let (flights, runs, mut held) = (flights.clone(), runs.clone(), held.clone());
                let work = async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let _ = held.wait_for(|released| *released).await;
                    Ok(verified("sha256:a"))
                };
                tokio::spawn(async move { flights.join("image".into(), Box::pin(work)).await })
            })
            .collect();
        tokio::task::yield_now().await;
        release.send(true).expect("waiters");
        for waiter in waiters {
            assert_eq!(waiter.await.expect("task").expect("verified"), verified("sha256:a"));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "one verification for fifty callers");
        // Just ended: a late caller of the herd takes its result.
        let late = flights.join("image".into(), Box::pin(async { Ok(verified("sha256:b")) })).await;
        assert_eq!(late.expect("verified"), verified("sha256:a"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_verification_answers_for_ten_seconds_after_it_ended_and_a_failure_not_at_all() {
        let flights = Flights::default();
        let ok = |digest: &'static str| Box::pin(async move { Ok(verified(digest)) }) as BoxFuture<'static, Outcome>;
        assert_eq!(flights.join("image".into(), ok("sha256:a")).await.expect("verified"), verified("sha256:a"));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(flights.join("image".into(), ok("sha256:b")).await.expect("kept"), verified("sha256:a"));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(flights.join("image".into(), ok("sha256:c")).await.expect("again"), verified("sha256:c"));

        let failed = Box::pin(async { Err(Arc::new(SignatureError::TimedOut(Duration::from_secs(1)))) });
        assert!(flights.join("other".into(), failed).await.is_err());
        assert_eq!(flights.join("other".into(), ok("sha256:d")).await.expect("tried again"), verified("sha256:d"));
    }
}
