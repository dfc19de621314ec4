//! Writing records: a pull's credentials merged in, a removed image's record forgotten.

use std::{sync::Arc, time::SystemTime};

use super::{
    PullRecords, RecordsError, blocking, check,
    format::{PullCredentials, PulledRecord, SecretRecord},
};

impl PullRecords {
    /// Adds `secret` to what may use `name` in the record of `image_ref` (a check found it holds
    /// a recorded credential, or a rotated one).
    pub async fn remember(
        self: &Arc<Self>,
        image_ref: &str,
        name: &str,
        secret: SecretRecord,
    ) -> Result<(), RecordsError> {
        let pulled_with = PullCredentials { kubernetes_secrets: vec![secret], ..Default::default() };
        self.merge(image_ref, name, pulled_with).await
    }

    /// Merges `pulled_with` into what may use `name` in the record of `image_ref`, writing it
    /// when it changed.
    pub async fn merge(
        self: &Arc<Self>,
        image_ref: &str,
        name: &str,
        pulled_with: PullCredentials,
    ) -> Result<(), RecordsError> {
        let _writing = self.writes.lock().await;
        let now = SystemTime::now();
        // A record that does not decode is replaced, which heals it.
        let current = self.record(image_ref).await.unwrap_or_else(|error| {
            tracing::info!(%error, "replacing a pull record that could not be read");
            None
        });
        let existed = current.is_some();
        let mut record = current.map_or_else(|| PulledRecord::new(image_ref, now), |record| (*record).clone());
        if !check::merge(&mut record, name, &pulled_with, now) && existed {
            return Ok(());
        }
        let (dir, key, contents) = (self.pulled.clone(), image_ref.to_owned(), record.encode());
        let replaced =
            blocking(move || dir.write(&key, &contents)).await.map_err(|error| self.io_error(&self.pulled, error))?;
        let mut state = self.state();
        if state.records.insert(image_ref, Arc::new(record)) {
            state.records_authoritative = false;
        }
        if !replaced {
            state.records_on_disk += 1;
        }
        drop(state);
        self.report();
        Ok(())
    }

    /// The image `image_ref` was removed at `removed_at`: its record goes, on disk and in
    /// memory, unless a pull wrote it since (in the same second too: keeping a record too long
    /// only verifies pods that need not be).
    pub async fn forget(self: &Arc<Self>, image_ref: &str, removed_at: SystemTime) -> Result<(), RecordsError> {
        let _writing = self.writes.lock().await;
        // Only a file that is this image's record: another ref's may share its name.
        let since = crate::duration::rfc3339(removed_at);
        match self.record(image_ref).await {
            Ok(Some(record)) if record.last_updated_time < since => {}
            _ => return Ok(()),
        }
        let (dir, key) = (self.pulled.clone(), image_ref.to_owned());
        blocking(move || dir.remove(&key)).await.map_err(|error| self.io_error(&self.pulled, error))?;
        let mut state = self.state();
        state.records.remove(image_ref);
        state.records_on_disk = state.records_on_disk.saturating_sub(1);
        drop(state);
        self.report();
        Ok(())
    }
}

/// Who a pull is for, to be recorded as soon as it succeeds, before its result is shared: a
/// caller with the same credential arriving the moment after then finds the record, rather than
/// pulling once more.
pub struct RecordTo {
    pub records: Arc<PullRecords>,
    /// The image's name, without tag or digest.
    pub name: String,
    pub pulled_with: PullCredentials,
}
