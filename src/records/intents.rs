//! Pull intents: on disk before a pull starts, gone once its outcome is recorded; the guard a
//! pull holds meanwhile.

use std::sync::Arc;

use super::{
    PullRecords, RecordsError, blocking,
    format::{Intent, PullCredentials},
};

impl PullRecords {
    /// Before a pull of `image` (as the pod wrote it): its intent, on disk before the pull starts,
    /// whichever caller writes it. The guard ends it with the pull's outcome; dropped without one
    /// (the caller went away mid-pull, when the pull may still succeed for others), it leaves the
    /// intent on disk, so the image stays verified until a pull records who pulled it.
    pub async fn intend(self: &Arc<Self>, image: &str) -> Result<PullIntent, RecordsError> {
        self.record_intent(image).await?;
        Ok(PullIntent { records: self.clone(), image: image.to_owned(), ended: false })
    }

    pub(super) async fn record_intent(&self, image: &str) -> Result<(), RecordsError> {
        let _recording = self.intent_writes.lock().await;
        let first = {
            let mut state = self.state();
            let in_flight = state.intents_in_flight.entry(image.to_owned()).or_insert(0);
            *in_flight += 1;
            *in_flight == 1 && !state.intents.contains(image)
        };
        if first {
            let (dir, key) = (self.pulling.clone(), image.to_owned());
            let contents = Intent::new(image).encode();
            let written = blocking(move || dir.write(&key, &contents).map(|_| key)).await;
            match written {
                Ok(key) => {
                    self.state().intents.insert(key);
                }
                Err(error) => {
                    self.end_intent_in_memory(image);
                    return Err(self.io_error(&self.pulling, error));
                }
            }
            self.report();
        }
        Ok(())
    }

    /// After a successful pull: `name`'s credentials merged into the record of `image_ref`, then
    /// the intent ended. If the record cannot be written the intent stays, so that the next start
    /// turns it into a record that verifies every pod.
    pub async fn record_pulled(
        self: &Arc<Self>,
        image: &str,
        image_ref: &str,
        name: &str,
        pulled_with: PullCredentials,
    ) -> Result<(), RecordsError> {
        if let Err(error) = self.merge(image_ref, name, pulled_with).await {
            self.orphan(image);
            return Err(error);
        }
        self.end_intent(image, true).await
    }

    /// A pull of `image` ended without its record: its intent stays until a record replaces it.
    fn orphan(&self, image: &str) {
        self.end_intent_in_memory(image);
        self.state().orphaned.insert(image.to_owned());
    }

    /// After a failed pull: the intent ended (unless it is older than this start: see
    /// [`PullRecords::settle`]).
    pub async fn record_failed(&self, image: &str) -> Result<(), RecordsError> {
        self.end_intent(image, false).await
    }

    /// One pull ended, `recorded` when its record was written; the last one removes the intent,
    /// except an orphaned one that no record replaced.
    async fn end_intent(&self, image: &str, recorded: bool) -> Result<(), RecordsError> {
        if !self.end_intent_in_memory(image) {
            return Ok(());
        }
        {
            let mut state = self.state();
            if recorded {
                state.orphaned.remove(image);
            } else if state.orphaned.contains(image) {
                return Ok(());
            }
        }
        self.remove_intent(image).await
    }

    /// Removes the intent for `image` unless a pull of it started meanwhile: under the lock
    /// [`PullRecords::record_intent`] takes, so no pull starts trusting a file being removed.
    pub(super) async fn remove_intent(&self, image: &str) -> Result<(), RecordsError> {
        let _recording = self.intent_writes.lock().await;
        if self.state().intents_in_flight.contains_key(image) {
            return Ok(());
        }
        let (dir, key) = (self.pulling.clone(), image.to_owned());
        blocking(move || dir.remove(&key)).await.map_err(|error| self.io_error(&self.pulling, error))?;
        self.state().intents.remove(image);
        self.report();
        Ok(())
    }

    /// How many EnsureImageExists pulls of `image` (as the pod wrote it) are under way.
    pub fn pulls_in_flight(&self, image: &str) -> u32 {
        self.state().intents_in_flight.get(image).copied().unwrap_or(0)
    }

    /// One pull of `image` ended; whether it was the last.
    fn end_intent_in_memory(&self, image: &str) -> bool {
        let mut state = self.state();
        match state.intents_in_flight.get_mut(image) {
            Some(count) if *count > 1 => {
                *count -= 1;
                false
            }
            _ => {
                state.intents_in_flight.remove(image);
                true
            }
        }
    }
}

/// A pull's intent, ended by the pull's outcome (see [`PullRecords::intend`]).
pub struct PullIntent {
    records: Arc<PullRecords>,
    image: String,
    ended: bool,
}

impl PullIntent {
    /// The pull succeeded: see [`PullRecords::record_pulled`].
    pub async fn pulled(
        mut self,
        image_ref: &str,
        name: &str,
        pulled_with: PullCredentials,
    ) -> Result<(), RecordsError> {
        self.ended = true;
        self.records.record_pulled(&self.image, image_ref, name, pulled_with).await
    }

    /// The pull failed: the intent goes with the last pull of the image.
    pub async fn failed(mut self) -> Result<(), RecordsError> {
        self.ended = true;
        self.records.record_failed(&self.image).await
    }
}

impl Drop for PullIntent {
    fn drop(&mut self) {
        if !self.ended {
            // No outcome: the intent stays on disk until a record replaces it.
            self.records.orphan(&self.image);
        }
    }
}
