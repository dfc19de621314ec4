//! cri-imaged: the kubelet's image manager as a node daemon in front of the CRI runtime.
//!
//! # Layout
//! - [`api`]: the generated `imagemanager.v1` gRPC API and its descriptors.
//! - [`config`]: the command line, with every default.
//! - [`daemon`]: the `serve` command, wiring everything together; signals and shutdown.
//! - [`listener`]: the unix socket, created safely, never stolen from a live daemon.
//! - [`server`]: gRPC handlers that only translate (our API and `runtime.v1.ImageService`),
//!   health, reflection, caller deadlines;
//!   `server::status` is the one place errors become gRPC statuses.
//! - [`manager`]: EnsureImageExists step by step, over the runtime trait: decide, back off, pull.
//! - [`backoff`]: the per-(pod, image) backoff store (pure).
//! - [`scheduler`]: the fair parallel-pull cap and single-flight.
//! - [`pull`]: one upstream pull as a tower service, and the single-flight key.
//! - [`ratelimit`]: registry rate limits as a governor-backed tower layer.
//! - [`metrics`]: Prometheus metrics and the `/metrics` endpoint.
//! - [`presence`]: the presence cache, remembering present images while their events are watched.
//! - [`runtime_events`]: containerd's image events, which keep the presence cache honest.
//! - [`policy`]: pull-policy defaulting and the pull decision (pure).
//! - [`reference`]: the image reference grammar and the default tag (pure).
//! - [`messages`]: the kubelet's human messages and reason strings, word for word.
//! - [`cri`]: the runtime trait and the CRI `runtime.v1.ImageService` client.
//! - [`passthrough`]: a gRPC codec that forwards message bytes untouched.
//! - [`telemetry`]: logging set-up.

pub mod api;
pub mod backoff;
pub mod config;
pub mod cri;
pub mod daemon;
pub mod listener;
pub mod manager;
pub mod messages;
pub mod metrics;
pub mod passthrough;
pub mod policy;
pub mod presence;
pub mod pull;
pub mod ratelimit;
pub mod reference;
pub mod runtime_events;
pub mod scheduler;
pub mod server;
pub mod telemetry;
