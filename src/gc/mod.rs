//! Image garbage collection, the kubelet's `ImageGCManager`, with ages that survive a restart.
//!
//! - [`plan`]: the pure core: image records brought up to date from what the runtime lists and
//!   what containers use, and which images to remove, by age and by disk space, and why; and why
//!   each other image stays.
//! - [`collector`]: a pass (list, detect, plan, remove), the periodic loop, and the images as a
//!   pass sees them.
//! - [`guard`]: keeps an image cri-imaged is handing out or pulling from being removed.
//! - [`ages`]: the records kept on disk, so that ages survive a restart.
//! - [`metrics`]: images removed, bytes freed, passes, the image filesystem.

pub mod ages;
pub mod collector;
pub mod guard;
pub mod metrics;
pub mod plan;

use std::time::Duration;

pub use self::{
    collector::{GcError, GcParts, ImageGc, KeptImage, NodeImage, Outcome, PassReport, PassRequest},
    guard::ImageGuard,
    plan::GcPolicy,
};

/// How and how often images are collected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcConfig {
    pub policy: GcPolicy,
    /// Between periodic passes (the kubelet's 5 minutes).
    pub period: Duration,
    /// An image handed out or pulled within this long is in use.
    pub hand_out_window: Duration,
    /// The sandbox image, when the runtime does not say (kept, as the kubelet's
    /// `--pod-infra-container-image` was).
    pub sandbox_image: Option<String>,
    /// Images kept whatever their age or the disk (`--pinned-image`).
    pub pinned_images: Vec<String>,
}

impl GcConfig {
    /// No periodic collection (the RPC still collects when asked).
    pub fn off() -> Self {
        Self { policy: GcPolicy { high_threshold_percent: 100, ..GcPolicy::KUBELET }, ..Self::default() }
    }
}

impl Default for GcConfig {
    fn default() -> Self {
        Self {
            policy: GcPolicy::KUBELET,
            period: Duration::from_secs(300),
            hand_out_window: GcPolicy::KUBELET.min_age,
            sandbox_image: None,
            pinned_images: Vec::new(),
        }
    }
}
