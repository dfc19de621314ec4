//! A metric series' labels, shared by every concern's metrics (each registers its own in the
//! daemon's one registry). Static strings only: no series carries an image name or a pod,
//! so the series count stays small on any node.

/// A series' labels.
pub type Labels = Vec<(&'static str, &'static str)>;
