//! Verified digests, by the requirement they met, and the verifications under way, joined.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, PoisonError},
};

use futures_util::{
    FutureExt,
    future::{BoxFuture, Shared},
};

use super::{SignatureError, Verified};
use crate::policy::SigstoreSigned;

/// Digests kept: a node runs a few hundred images; each entry is a few hundred bytes.
const KEPT: usize = 4096;

/// What was verified, by digest and the requirements met. A reload that changes a requirement
/// leaves its entries unmatched; the oldest go first past [`KEPT`].
#[derive(Default)]
pub struct VerifiedCache {
    inner: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    by_digest: HashMap<String, Vec<(Vec<Arc<SigstoreSigned>>, Verified)>>,
    order: VecDeque<String>,
}

impl VerifiedCache {
    pub fn get(&self, digest: &str, requirements: &[Arc<SigstoreSigned>]) -> Option<Verified> {
        let kept = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let entries = kept.by_digest.get(digest)?;
        entries.iter().find(|(met, _)| met.as_slice() == requirements).map(|(_, verified)| verified.clone())
    }

    pub fn put(&self, digest: &str, requirements: &[Arc<SigstoreSigned>], verified: Verified) {
        let mut kept = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let Kept { by_digest, order } = &mut *kept;
        let entries = by_digest.entry(digest.to_owned()).or_default();
        if entries.iter().any(|(met, _)| met.as_slice() == requirements) {
            return;
        }
        entries.push((requirements.to_vec(), verified));
        order.push_back(digest.to_owned());
        while order.len() > KEPT {
            let Some(oldest) = order.pop_front() else { break };
            if let Some(entries) = by_digest.get_mut(&oldest) {
                entries.remove(0);
                if entries.is_empty() {
                    by_digest.remove(&oldest);
                }
            }
        }
    }
}

type Outcome = Result<Verified, Arc<SignatureError>>;

/// Verifications under way, by what they verify: a caller of one under way waits for its result.
#[derive(Default)]
pub struct Flights {
    under_way: Mutex<HashMap<String, Shared<BoxFuture<'static, Outcome>>>>,
}

impl Flights {
    /// The result of the verification `key` names: `work`'s, or that of the one under way.
    pub async fn join(&self, key: String, work: BoxFuture<'static, Outcome>) -> Outcome {
        let shared = {
            let mut under_way = self.under_way.lock().unwrap_or_else(PoisonError::into_inner);
            under_way.entry(key.clone()).or_insert_with(|| work.shared()).clone()
        };
        // Driven by every waiter; whichever sees it end first takes it off the list.
        let outcome = shared.clone().await;
        let mut under_way = self.under_way.lock().unwrap_or_else(PoisonError::into_inner);
        if under_way.get(&key).is_some_and(|current| current.ptr_eq(&shared)) {
            under_way.remove(&key);
        }
        outcome
    }
}
