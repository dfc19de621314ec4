//! Image garbage collection, the kubelet's `ImageGCManager` (work in progress: the plan; the
//! loop, persisted ages and the runtime calls come next).
//!
//! - [`plan`]: the pure core: image records brought up to date from what the runtime lists and
//!   what containers use, and which images to remove, by age and by disk space, and why.

pub mod plan;
