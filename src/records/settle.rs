//! After start: the intents a crash left turned into records, the records read into memory,
//! those of images gone since removed.

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, SystemTime},
};

use super::{
    PullRecords, RecordsError,
    adopt::Adopted,
    blocking,
    format::{PullCredentials, PulledRecord},
};
use crate::{retry::Doubling, runtime::ImageRuntime};

impl PullRecords {
    /// After start, while serving: each intent a crash (or a failed record write) left behind
    /// whose image is present becomes a record with no credentials (so every pod is verified),
    /// and goes; then every record is read into memory; then the records of images that are
    /// gone, last written before `started`, are removed.
    pub async fn settle<R: ImageRuntime>(self: Arc<Self>, runtime: &R, started: SystemTime) {
        // Until the runtime answers for every intent (it may still be starting at boot).
        let mut waits = Doubling::new(Duration::from_millis(100), Duration::from_secs(30));
        while !self.convert_orphaned_intents(runtime).await {
            tokio::time::sleep(waits.next_wait()).await;
        }
        waits.reset();
        loop {
            match self.adopt(runtime).await {
                Ok(adopted) => {
                    if adopted != Adopted::default() {
                        tracing::info!(
                            records = adopted.records,
                            intents = adopted.intents,
                            "adopted the kubelet's pull records of images present"
                        );
                    }
                    break;
                }
                Err(error) => tracing::warn!(%error, "cannot adopt the kubelet's pull records yet; trying again"),
            }
            tokio::time::sleep(waits.next_wait()).await;
        }
        self.state().unsettled = false;
        let records = self.clone();
        match tokio::task::spawn_blocking(move || records.warm()).await {
            Ok(Err(error)) => tracing::warn!(%error, "cannot read the pull records; each is read when asked for"),
            Err(error) => tracing::warn!(%error, "reading the pull records stopped"),
            Ok(Ok(())) => {}
        }
        if let Err(error) = self.prune(runtime, started).await {
            tracing::warn!(%error, "cannot prune the records of images that are gone");
        }
    }

    /// One pass over the orphaned intents; whether the runtime answered for each.
    async fn convert_orphaned_intents<R: ImageRuntime>(self: &Arc<Self>, runtime: &R) -> bool {
        let orphaned: Vec<String> = self.state().orphaned.iter().cloned().collect();
        let mut answered = true;
        for image in orphaned {
            let spec = crate::cri::ImageSpec { image: image.clone(), ..Default::default() };
            match runtime.image_status(spec).await {
                Ok(Some(found)) => {
                    let converted = self.merge_unknown(&found.id).await;
                    if let Err(error) = converted {
                        tracing::warn!(%error, image, "cannot turn a pull intent into a record; kept");
                        answered = false;
                        continue;
                    }
                    tracing::info!(image, image_ref = %found.id, "a pull intent left from before is now a record: every pod is verified for this image");
                    self.state().orphaned.remove(&image);
                    if let Err(error) = self.remove_intent(&image).await {
                        tracing::warn!(%error, image, "cannot remove a pull intent");
                    }
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(%error, image, "cannot tell whether a pull intent's image is present; asking again");
                    answered = false;
                }
            }
        }
        answered
    }

    /// A record of `image_ref` pulled under unknown circumstances: no credentials at all (an
    /// existing record is left as it is).
    pub(super) async fn merge_unknown(self: &Arc<Self>, image_ref: &str) -> Result<(), RecordsError> {
        self.merge(image_ref, "", PullCredentials::default()).await
    }

    async fn prune<R: ImageRuntime>(&self, runtime: &R, started: SystemTime) -> Result<(), RecordsError> {
        // Held from before the images are listed: a pull that lands meanwhile records after the
        // prune, never has its record removed as that of an absent image.
        let _writing = self.writes.lock().await;
        let ids = match runtime.list_image_ids().await {
            Ok(Some(ids)) => ids.into_iter().collect::<HashSet<_>>(),
            Ok(None) => return Ok(()),
            Err(error) => return Err(RecordsError::Writer(error.to_string())),
        };
        let dir = self.pulled.clone();
        let before = crate::duration::rfc3339(started);
        let removed = blocking(move || {
            let mut removed = Vec::new();
            for (path, contents) in dir.read_all()? {
                // One that cannot be read was reported when the records were read.
                let Some(record) = contents.ok().and_then(|contents| PulledRecord::decode(&contents).ok()) else {
                    continue;
                };
                if !ids.contains(&record.image_ref) && record.last_updated_time < before {
                    dir.remove_path(&path)?;
                    removed.push(record.image_ref);
                }
            }
            Ok(removed)
        })
        .await
        .map_err(|error| self.io_error(&self.pulled, error))?;
        let mut state = self.state();
        for image_ref in &removed {
            state.records.remove(image_ref);
        }
        state.records_on_disk = state.records_on_disk.saturating_sub(removed.len());
        drop(state);
        if !removed.is_empty() {
            tracing::info!(removed = removed.len(), "removed the pull records of images that are gone");
        }
        self.report();
        Ok(())
    }
}
