//! Removing what a plan chose, image by image, unless it came into use since the pass began.

use std::{collections::HashMap, time::SystemTime};

use super::{Chosen, ImageGc, Outcome, Pass, PassReport};
use crate::{
    events::{Event, EventType, reason as event_reason},
    gc::plan::{ImageRecord, Plan, Reason, SpaceTarget, record_id},
    runtime::ImageRuntime,
};

impl<R: ImageRuntime> ImageGc<R> {
    /// Removes the plan's images in order; for space, goes on to the spares while what was freed
    /// falls short because a removal failed; then says whether the space pass fell short.
    pub(super) async fn execute(
        &self,
        plan: &Plan,
        pass: &Pass<'_>,
        images: &mut HashMap<String, ImageRecord>,
        report: &mut PassReport,
    ) {
        let policy = pass.policy;
        if let Some(space) = plan.space {
            tracing::info!(
                usage = space.usage_percent,
                high_threshold = policy.high_threshold_percent,
                amount_to_free = space.to_free,
                low_threshold = policy.low_threshold_percent,
                "Disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold"
            );
        }
        let to_free = plan.space.map_or(0, |space| space.to_free);
        let mut freed_for_space = 0;
        let spares = plan.spare.iter().map(|id| (id, Reason::Space));
        let chosen = plan.remove.iter().map(|(id, reason)| (id, *reason));
        for (key, reason) in chosen.chain(spares) {
            if reason == Reason::Space && freed_for_space >= to_free {
                continue;
            }
            let Some(record) = images.get(key).cloned() else { continue };
            let id = record_id(key, &record);
            let names = pass.names.get(id).copied().unwrap_or_default();
            // The pull records name the image, not a runtime handler's copy of it: they go with
            // its last copy.
            let last_copy = !images.iter().any(|(other, record)| other != key && record_id(other, record) == id);
            let outcome = match pass.dry_run {
                true => Outcome::WouldRemove,
                false => self.remove(id, names, &record, (reason, last_copy), pass).await,
            };
            if outcome == Outcome::Removed {
                images.remove(key);
            }
            if matches!(outcome, Outcome::Removed | Outcome::WouldRemove) {
                report.freed += record.size;
                if reason == Reason::Space {
                    freed_for_space += record.size;
                }
            }
            report.images.push(Chosen {
                id: id.to_owned(),
                runtime_handler: record.runtime_handler.clone(),
                names: names.to_vec(),
                reason,
                size: record.size,
                first_detected: record.first_detected,
                last_used: record.last_used,
                outcome,
            });
        }
        if let Some(space) = plan.space {
            report.to_free = space.to_free;
            if let Some(message) = (SpaceTarget { found: freed_for_space, ..space }).shortfall() {
                tracing::warn!(reason = "FreeDiskSpaceFailed", "{message}");
                if !pass.dry_run {
                    let event = Event::new(EventType::Warning, event_reason::FREE_DISK_SPACE_FAILED, message.clone());
                    self.parts.events.publish(event);
                }
                report.shortfall = Some(message);
            }
        }
    }

    /// Removes one image, unless it was handed out or pulled since the pass began, or is being
    /// pulled.
    async fn remove(
        &self,
        id: &str,
        names: &[String],
        record: &ImageRecord,
        (reason, last_copy): (Reason, bool),
        pass: &Pass<'_>,
    ) -> Outcome {
        let Some(claim) = self.parts.guard.claim(id, names, pass.began) else {
            tracing::info!(image_id = id, "image handed out or pulled during the pass; kept");
            return Outcome::KeptInUse;
        };
        match reason {
            Reason::Age => tracing::info!(
                image_id = id,
                runtime_handler = record.runtime_handler,
                size = record.size,
                max_age = ?pass.policy.max_age,
                "Removing image not used for longer than the maximum age"
            ),
            Reason::Space | Reason::Unused => {
                let handler = &record.runtime_handler;
                tracing::info!(
                    image_id = id,
                    runtime_handler = handler,
                    size = record.size,
                    "Removing image to free bytes"
                )
            }
        }
        let started = SystemTime::now();
        let removed = self.parts.runtime.remove_image(id, &record.runtime_handler).await;
        // Whatever the answer, the removal may have changed what is present: forgotten before
        // the claim ends, so no hand-out after it trusts a remembered answer.
        self.parts.presence.image_changed();
        drop(claim);
        match removed {
            Ok(()) => {
                self.parts.metrics.collected(reason, record.size);
                let message = format!("Removed image {id} ({} bytes) for {}", record.size, reason.as_str());
                let event = Event::new(EventType::Normal, event_reason::IMAGE_GARBAGE_COLLECTED, message);
                self.parts.events.publish(Event {
                    image_ref: id.to_owned(),
                    image: names.first().cloned().unwrap_or_default(),
                    ..event
                });
                if last_copy && let Err(error) = self.parts.records.forget(id, started).await {
                    tracing::warn!(%error, image_id = id, "cannot remove the pull record of a removed image");
                }
                Outcome::Removed
            }
            Err(error) => {
                tracing::warn!(%error, image_id = id, "failed to remove image");
                Outcome::Failed(error.to_string())
            }
        }
    }
}
