//! Image garbage collection, the kubelet's `ImageGCManager` (work in progress: the plan and the
//! ages' file; the loop and its runtime calls come next).
//!
//! - [`plan`]: the pure core: image records brought up to date from what the runtime lists and
//!   what containers use, and which images to remove, by age and by disk space, and why.
//! - [`ages`]: the records kept on disk, so that ages survive a restart.

pub mod ages;
pub mod plan;
