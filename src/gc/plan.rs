//! The kubelet's image GC, as pure functions of the records, the disk's usage, the policy and
//! `now`: which images to remove and why, and why each other one stays ([`kept`]). Removing
//! them, and reading the disk, is the caller's.

pub mod kept;

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, SystemTime},
};

use self::kept::why_kept;
pub use self::kept::{Holds, InUse, Kept, in_use};
use crate::{messages::go_duration_millis, runtime::StoredImage};

/// The kubelet's `ImageGCPolicy`, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcPolicy {
    /// At or above this disk usage (percent), images are removed...
    pub high_threshold_percent: u8,
    /// ...until usage is down to this.
    pub low_threshold_percent: u8,
    /// An image detected less than this long ago is never removed for space.
    pub min_age: Duration,
    /// An unused image not used for longer than this is removed, once the collector has run this
    /// long; zero turns it off.
    pub max_age: Duration,
}

/// A policy the kubelet would refuse, in its words (durations as Go prints them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GcPolicyError {
    #[error("imageGCHighThresholdPercent (--image-gc-high-threshold) {0} must be between 0 and 100, inclusive")]
    HighOutOfRange(i64),
    #[error("imageGCLowThresholdPercent (--image-gc-low-threshold) {0} must be between 0 and 100, inclusive")]
    LowOutOfRange(i64),
    #[error(
        "imageGCLowThresholdPercent (--image-gc-low-threshold) {low} must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) {high}"
    )]
    LowNotBelowHigh { low: i64, high: i64 },
    #[error("imageMaximumGCAge {} must be greater than imageMinimumGCAge {}", go_duration_millis(*.max_age), go_duration_millis(*.min_age))]
    MaxAgeNotAboveMinAge { max_age: Duration, min_age: Duration },
}

impl GcPolicy {
    /// The kubelet's defaults: 85 % high, 80 % low, 2 minutes minimum age, no maximum age.
    pub const KUBELET: Self = Self {
        high_threshold_percent: 85,
        low_threshold_percent: 80,
        min_age: Duration::from_secs(120),
        max_age: Duration::ZERO,
    };

    pub fn try_new(high: i64, low: i64, min_age: Duration, max_age: Duration) -> Result<Self, GcPolicyError> {
        let percent = |value: i64| u8::try_from(value).ok().filter(|value| *value <= 100);
        let high_threshold_percent = percent(high).ok_or(GcPolicyError::HighOutOfRange(high))?;
        let low_threshold_percent = percent(low).ok_or(GcPolicyError::LowOutOfRange(low))?;
        if low >= high {
            return Err(GcPolicyError::LowNotBelowHigh { low, high });
        }
        if !max_age.is_zero() && max_age <= min_age {
            return Err(GcPolicyError::MaxAgeNotAboveMinAge { max_age, min_age });
        }
        Ok(Self { high_threshold_percent, low_threshold_percent, min_age, max_age })
    }

    /// High 100 with no maximum age: nothing is ever collected.
    pub fn disabled(&self) -> bool {
        self.high_threshold_percent == 100 && self.max_age.is_zero()
    }
}

/// What is known of one image, kept for one runtime handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRecord {
    pub first_detected: SystemTime,
    /// `None`: never seen in use.
    pub last_used: Option<SystemTime>,
    pub size: u64,
    pub pinned: bool,
    /// The runtime handler the runtime lists the image for; empty for the default one.
    pub runtime_handler: String,
}

/// The key of an image's record, the kubelet's with `RuntimeClassInImageCriAPI`: its id, and
/// `id,handler` for an image the runtime keeps for a runtime handler (KEP-4216), so the same
/// image kept for two handlers is two images.
pub fn record_key(id: &str, runtime_handler: &str) -> String {
    match runtime_handler {
        "" => id.to_owned(),
        handler => format!("{id},{handler}"),
    }
}

/// The image id of the record kept under `key`.
pub fn record_id<'a>(key: &'a str, record: &ImageRecord) -> &'a str {
    match record.runtime_handler.as_str() {
        "" => key,
        handler => key.strip_suffix(handler).and_then(|key| key.strip_suffix(',')).unwrap_or(key),
    }
}

/// The kubelet's `detectImages`: new images are detected `now`, images in use (by any container,
/// exited ones included, or just handed out or pulled by cri-imaged) are used `now`, sizes and
/// pins are refreshed, and images no longer listed are forgotten.
pub fn detect(records: &mut HashMap<String, ImageRecord>, listed: &[StoredImage], in_use: &InUse, now: SystemTime) {
    let mut current = HashSet::with_capacity(listed.len());
    for image in listed {
        let key = record_key(&image.id, &image.runtime_handler);
        let used = in_use.contains_key(&key);
        let record = records.entry(key.clone()).or_insert(ImageRecord {
            first_detected: now,
            last_used: None,
            size: image.size,
            pinned: image.pinned,
            runtime_handler: image.runtime_handler.clone(),
        });
        if used {
            record.last_used = Some(now);
        }
        record.size = image.size;
        record.pinned = image.pinned;
        if record.runtime_handler != image.runtime_handler {
            // A record read from a file that named another handler under this key.
            record.runtime_handler.clone_from(&image.runtime_handler);
        }
        current.insert(key);
    }
    records.retain(|key, _| current.contains(key));
}

/// Why an image is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Not used for longer than the maximum age.
    Age,
    /// Disk usage was at or above the high threshold.
    Space,
    /// Asked to remove every unused image (the kubelet's `DeleteUnusedImages`).
    Unused,
}

impl Reason {
    /// The `reason` label and the RPC's word: the kubelet's `age` and `space`, and `unused`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Age => "age",
            Self::Space => "space",
            Self::Unused => "unused",
        }
    }
}

/// The disk holding the images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskUsage {
    pub capacity: u64,
    pub available: u64,
}

impl From<crate::runtime::ImageFsUsage> for DiskUsage {
    fn from(usage: crate::runtime::ImageFsUsage) -> Self {
        Self { capacity: usage.capacity, available: usage.available }
    }
}

impl DiskUsage {
    /// The kubelet's `100 - available*100/capacity`; 0 for no capacity.
    pub fn usage_percent(&self) -> u64 {
        match self.capacity {
            0 => 0,
            capacity => 100 - self.available.min(capacity).saturating_mul(100) / capacity,
        }
    }
}

/// What a pass should do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Records to remove (by key), in order, each with its reason.
    pub remove: Vec<(String, Reason)>,
    /// What a space pass had to free, and what the images it chose hold; `None` when usage was
    /// below the high threshold.
    pub space: Option<SpaceTarget>,
    /// Further images eligible for space, in order: tried, as the kubelet does, when removing a
    /// chosen one fails and the pass falls short.
    pub spare: Vec<String>,
    /// Every other record, by key, with why the plan leaves it.
    pub kept: Vec<(String, Kept)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceTarget {
    pub usage_percent: u64,
    pub to_free: u64,
    pub found: u64,
}

/// Why no plan can be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The kubelet's `InvalidDiskCapacity`.
    #[error("invalid capacity 0 on image filesystem")]
    InvalidDiskCapacity,
}

impl SpaceTarget {
    /// The kubelet's `FreeDiskSpaceFailed` message, when the images eligible fall short.
    pub fn shortfall(&self) -> Option<String> {
        (self.found < self.to_free).then(|| {
            format!(
                "Failed to garbage collect required amount of images. Attempted to free {} bytes, but only found {} bytes eligible to free.",
                self.to_free, self.found
            )
        })
    }
}

/// The kubelet's `freeOldImages`: with a maximum age, once the collector has run that long
/// (`collected_for`), every unused, unpinned image not used for longer (or, never used, detected
/// longer ago) goes, oldest first.
pub fn plan_age(
    records: &HashMap<String, ImageRecord>,
    in_use: &InUse,
    policy: &GcPolicy,
    now: SystemTime,
    collected_for: Duration,
) -> Vec<String> {
    if policy.max_age.is_zero() || collected_for <= policy.max_age {
        return Vec::new();
    }
    unused_oldest_first(records, in_use)
        .into_iter()
        .filter(|(_, record)| age(now, record.last_used.unwrap_or(record.first_detected)) > policy.max_age)
        .map(|(id, _)| id.clone())
        .collect()
}

/// The kubelet's space pass: at or above the high threshold, unused, unpinned images go, oldest
/// first (by last use, then first detection), until enough is freed to reach the low one,
/// skipping any used at `now` or detected less than the minimum age ago (counting from the
/// collector's start at the latest, as the kubelet's records do). `excluded` images are already
/// going. Call it with the disk as it is after the age pass.
pub fn plan_space(
    records: &HashMap<String, ImageRecord>,
    in_use: &InUse,
    disk: DiskUsage,
    policy: &GcPolicy,
    (now, collected_for): (SystemTime, Duration),
    excluded: &HashSet<String>,
) -> Result<Plan, PlanError> {
    let not_needed = |_: &ImageRecord| Kept::NotNeeded;
    // Collection turned off never needs the disk's capacity.
    if policy.disabled() {
        return Ok(Plan { kept: kept(records, in_use, &[], excluded, not_needed), ..Plan::default() });
    }
    if disk.capacity == 0 {
        return Err(PlanError::InvalidDiskCapacity);
    }
    let usage_percent = disk.usage_percent();
    if usage_percent < u64::from(policy.high_threshold_percent) {
        return Ok(Plan { kept: kept(records, in_use, &[], excluded, not_needed), ..Plan::default() });
    }
    let share = u64::from(100 - policy.low_threshold_percent);
    let target = disk.capacity / 100 * share + disk.capacity % 100 * share / 100;
    let to_free = target.saturating_sub(disk.available.min(disk.capacity));
    let (mut remove, mut spare, mut found) = (Vec::new(), Vec::new(), 0);
    let candidates = unused_oldest_first(records, in_use).into_iter().filter(|(id, _)| !excluded.contains(*id));
    for (id, record) in eligible(candidates, policy, now, collected_for) {
        if found >= to_free {
            spare.push(id.clone());
            continue;
        }
        remove.push((id.clone(), Reason::Space));
        found += record.size;
    }
    let young_or_not_needed = |record: &ImageRecord| match old_enough(record, policy, now, collected_for) {
        true => Kept::NotNeeded,
        false => Kept::Young,
    };
    let kept = kept(records, in_use, &remove, excluded, young_or_not_needed);
    Ok(Plan { remove, space: Some(SpaceTarget { usage_percent, to_free, found }), spare, kept })
}

/// The kubelet's `GarbageCollect` as one plan, for a dry run: the age pass, then the space pass
/// over the rest, with the disk credited the sizes the age pass would free.
pub fn plan(
    records: &HashMap<String, ImageRecord>,
    in_use: &InUse,
    disk: DiskUsage,
    policy: &GcPolicy,
    now: SystemTime,
    collected_for: Duration,
) -> Result<Plan, PlanError> {
    let aged = plan_age(records, in_use, policy, now, collected_for);
    let freed: u64 = aged.iter().filter_map(|id| records.get(id)).map(|record| record.size).sum();
    let after_age = DiskUsage { available: disk.available.saturating_add(freed), ..disk };
    let excluded: HashSet<String> = aged.iter().cloned().collect();
    let mut plan = plan_space(records, in_use, after_age, policy, (now, collected_for), &excluded)?;
    plan.remove.splice(0..0, aged.into_iter().map(|id| (id, Reason::Age)));
    Ok(plan)
}

/// The kubelet's `DeleteUnusedImages`: every unused, unpinned image, whatever the disk's usage,
/// except those detected less than the minimum age ago; oldest first.
pub fn plan_unused(
    records: &HashMap<String, ImageRecord>,
    in_use: &InUse,
    policy: &GcPolicy,
    now: SystemTime,
    collected_for: Duration,
) -> Plan {
    let remove: Vec<(String, Reason)> =
        eligible(unused_oldest_first(records, in_use).into_iter(), policy, now, collected_for)
            .map(|(id, _)| (id.clone(), Reason::Unused))
            .collect();
    let kept = kept(records, in_use, &remove, &HashSet::new(), |_| Kept::Young);
    Plan { remove, kept, ..Plan::default() }
}

/// Every record neither removed nor `excluded`, by key, with why it stays: what holds it, else
/// `otherwise` says.
fn kept(
    records: &HashMap<String, ImageRecord>,
    in_use: &InUse,
    remove: &[(String, Reason)],
    excluded: &HashSet<String>,
    otherwise: impl Fn(&ImageRecord) -> Kept,
) -> Vec<(String, Kept)> {
    let removed: HashSet<&str> = remove.iter().map(|(key, _)| key.as_str()).collect();
    let mut kept: Vec<(String, Kept)> = records
        .iter()
        .filter(|(key, _)| !removed.contains(key.as_str()) && !excluded.contains(*key))
        .map(|(key, record)| (key.clone(), why_kept(key, record, in_use, otherwise(record))))
        .collect();
    kept.sort_unstable();
    kept
}

fn age(now: SystemTime, since: SystemTime) -> Duration {
    now.duration_since(since).unwrap_or(Duration::ZERO)
}

/// Unused, unpinned images, never used first, then by last use, ties by first detection and id.
fn unused_oldest_first<'a>(
    records: &'a HashMap<String, ImageRecord>,
    in_use: &InUse,
) -> Vec<(&'a String, &'a ImageRecord)> {
    let mut candidates: Vec<(&String, &ImageRecord)> =
        records.iter().filter(|(id, record)| !in_use.contains_key(*id) && !record.pinned).collect();
    candidates.sort_by_key(|(id, record)| (record.last_used, record.first_detected, *id));
    candidates
}

/// Those of `candidates` that may go for space: not used at `now`, and detected at least the
/// minimum age ago (the image may have just been pulled for a container about to start). After
/// a restart the minimum age counts from the start again, as the kubelet's does: an image handed
/// out just before it is not taken while its container is being created.
fn eligible<'a>(
    candidates: impl Iterator<Item = (&'a String, &'a ImageRecord)>,
    policy: &GcPolicy,
    now: SystemTime,
    collected_for: Duration,
) -> impl Iterator<Item = (&'a String, &'a ImageRecord)> {
    candidates.filter(move |(_, record)| old_enough(record, policy, now, collected_for))
}

/// Whether `record` may go for space: see [`eligible`].
fn old_enough(record: &ImageRecord, policy: &GcPolicy, now: SystemTime, collected_for: Duration) -> bool {
    let detected_for = age(now, record.first_detected).min(collected_for);
    record.last_used.is_none_or(|used| used < now) && detected_for >= policy.min_age
}

#[cfg(test)]
mod tests;
