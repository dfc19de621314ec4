//! What a pass is asked to do, and what it did.

use std::time::SystemTime;

use crate::{
    gc::plan::{Kept, Reason},
    runtime::ImageFsUsage,
};

/// What a pass is asked to do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassRequest {
    /// Plan and report, remove nothing.
    pub dry_run: bool,
    /// Every unused image old enough, whatever the disk's usage (the kubelet's
    /// `DeleteUnusedImages`), instead of the thresholds and the maximum age.
    pub delete_unused: bool,
}

/// One image a pass chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    pub id: String,
    /// The runtime handler the image was kept for; empty for the default one.
    pub runtime_handler: String,
    /// Its repo tags and digests.
    pub names: Vec<String>,
    pub reason: Reason,
    pub size: u64,
    pub first_detected: SystemTime,
    pub last_used: Option<SystemTime>,
    pub outcome: Outcome,
}

/// One image a pass left, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptImage {
    pub id: String,
    /// The runtime handler the image is kept for; empty for the default one.
    pub runtime_handler: String,
    /// Its repo tags and digests.
    pub names: Vec<String>,
    pub reason: Kept,
    pub size: u64,
    pub first_detected: SystemTime,
    pub last_used: Option<SystemTime>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Removed,
    /// A dry run.
    WouldRemove,
    /// Handed out or being pulled since the pass began.
    KeptInUse,
    /// The runtime refused, in its words.
    Failed(String),
}

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    pub images: Vec<Chosen>,
    pub usage_before: Option<ImageFsUsage>,
    pub usage_after: Option<ImageFsUsage>,
    /// What a space pass had to free; 0 when usage was below the high threshold.
    pub to_free: u64,
    /// Bytes of the images removed (or, in a dry run, that would be).
    pub freed: u64,
    /// The kubelet's `FreeDiskSpaceFailed` message, when the pass fell short.
    pub shortfall: Option<String>,
    /// Every image the pass neither chose nor tried, by id and runtime handler.
    pub kept: Vec<KeptImage>,
}

impl PassReport {
    fn failures(&self) -> Vec<&str> {
        self.images
            .iter()
            .filter_map(|image| match &image.outcome {
                Outcome::Failed(error) => Some(error.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// How the last pass went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastPass {
    pub finished: SystemTime,
    pub request: PassRequest,
    /// The images removed and the bytes they held; 0 in a dry run.
    pub removed: usize,
    pub freed: u64,
    /// Why the pass failed or fell short; `None` when it did not.
    pub failure: Option<String>,
}

/// Why a pass counts as failed for the periodic loop: it fell short, or removals failed.
pub(super) fn pass_failure(report: &PassReport) -> Option<String> {
    if let Some(shortfall) = &report.shortfall {
        return Some(shortfall.clone());
    }
    let failures = report.failures();
    (!failures.is_empty()).then(|| format!("image removals failed: [{}]", failures.join(", ")))
}
