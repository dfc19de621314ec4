//! Looking a record or an intent up: from memory when it knows, else from disk, off the async
//! runtime's threads.

use std::sync::Arc;

use super::{
    PullRecords, RecordsError, decode_listed,
    format::{Intent, PulledRecord},
    off_the_runtime,
};
use crate::files::StateDir;

impl PullRecords {
    /// Reads every record into memory; from then on, while they fit, a miss needs no disk read.
    /// A record that does not decode is reported once and left for a lookup to fail safe on.
    pub fn warm(&self) -> Result<(), RecordsError> {
        let files =
            self.pulled.read_all().map_err(|error| RecordsError::Io { path: self.pulled.path().into(), error })?;
        let files_read = files.len();
        let mut decoded = Vec::with_capacity(files.len());
        let mut complete = true;
        for (path, contents) in files {
            match decode_listed(contents, PulledRecord::decode) {
                // Named for another ref than it holds: its lookup by name fails safe.
                Ok(record) if path.file_name().is_some_and(|name| *name != *StateDir::file_name(&record.image_ref)) => {
                    tracing::warn!(path = %path.display(), holds = %record.image_ref, "pull record named for another image; its image will be verified");
                    complete = false;
                }
                Ok(record) => decoded.push(record),
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "pull record unreadable or corrupt; its image will be verified");
                    complete = false;
                }
            }
        }
        let mut state = self.state();
        state.records_on_disk = files_read;
        let mut evicted = false;
        for record in decoded {
            let image_ref = record.image_ref.clone();
            // A record written since the files were read is newer: kept.
            if state.records.get(&image_ref).is_none() {
                evicted |= state.records.insert(&image_ref, Arc::new(record));
            }
        }
        state.records_authoritative = complete && !evicted;
        drop(state);
        self.report();
        Ok(())
    }

    /// The record of `image_ref`, if any. A record that does not decode, or whose file was set
    /// aside as unreadable (now or before a restart), is an error, so that the caller verifies
    /// rather than trusts. Answered from memory when it can be; a file is read off the async
    /// runtime's threads.
    pub async fn record(self: &Arc<Self>, image_ref: &str) -> Result<Option<Arc<PulledRecord>>, RecordsError> {
        let found = match self.record_in_memory(image_ref) {
            Some(known) => known,
            None => {
                let (records, image_ref) = (self.clone(), image_ref.to_owned());
                off_the_runtime(move || records.record_on_disk(&image_ref)).await?
            }
        };
        match found {
            None if self.pulled.was_set_aside(image_ref) => {
                Err(RecordsError::SetAside { file: "pull record", key: image_ref.to_owned() })
            }
            found => Ok(found),
        }
    }

    /// The record of `image_ref` as memory knows it, when memory knows.
    fn record_in_memory(&self, image_ref: &str) -> Option<Option<Arc<PulledRecord>>> {
        let mut state = self.state();
        if let Some(record) = state.records.get(image_ref) {
            return Some(Some(record));
        }
        state.records_authoritative.then_some(None)
    }

    fn record_on_disk(&self, image_ref: &str) -> Result<Option<Arc<PulledRecord>>, RecordsError> {
        let path = || self.pulled.path().join(StateDir::file_name(image_ref));
        let Some(contents) = self.pulled.read(image_ref).map_err(|error| RecordsError::Io { path: path(), error })?
        else {
            return Ok(None);
        };
        let record = PulledRecord::decode(&contents).map_err(|error| RecordsError::Format { path: path(), error })?;
        // The file named for this ref holds another's: put there by hand or by a bug, never by a
        // write of ours. What it says of this image is unknown, so the image is verified.
        if record.image_ref != image_ref {
            return Err(RecordsError::Misplaced { path: path(), holds: record.image_ref });
        }
        let record = Arc::new(record);
        let mut state = self.state();
        if state.records.insert(image_ref, record.clone()) {
            state.records_authoritative = false;
        }
        Ok(Some(record))
    }

    /// Whether cri-imaged pulled the image: a record of `image_ref`, or an intent for `image` (as
    /// the pod wrote it). An intent set aside as unreadable is an error, as a record is. A file is
    /// read off the async runtime's threads.
    pub async fn pulled_by_cri_imaged(self: &Arc<Self>, image: &str, image_ref: &str) -> Result<bool, RecordsError> {
        if self.state().unsettled || self.record(image_ref).await?.is_some() {
            return Ok(true);
        }
        if self.pulling.was_set_aside(image) {
            return Err(RecordsError::SetAside { file: "pull intent", key: image.to_owned() });
        }
        {
            let state = self.state();
            if state.intents_in_flight.contains_key(image) || state.intents.contains(image) {
                return Ok(true);
            }
            if state.intents_authoritative {
                return Ok(false);
            }
        }
        let (records, image) = (self.clone(), image.to_owned());
        off_the_runtime(move || records.intent_on_disk(&image)).await
    }

    /// Whether an intent for `image` is on disk.
    fn intent_on_disk(&self, image: &str) -> Result<bool, RecordsError> {
        let path = || self.pulling.path().join(StateDir::file_name(image));
        match self.pulling.read(image).map_err(|error| RecordsError::Io { path: path(), error })? {
            None => Ok(false),
            Some(contents) => {
                let intent = Intent::decode(&contents).map_err(|error| RecordsError::Format { path: path(), error })?;
                Ok(intent.image == image)
            }
        }
    }
}
