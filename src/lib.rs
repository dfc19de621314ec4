//! cri-imaged: the kubelet's image manager as a node daemon in front of the CRI runtime.
//!
//! # Layout
//! - [`api`]: the generated `imagemanager.v1` gRPC API and its descriptors.
//! - [`config`]: the command line and the config file (a field per flag), with every default;
//!   each part validates its own config type.
//! - [`credentials`]: pull credentials the kubelet's way: pod secrets, the node's docker config
//!   and credential-provider plugins, matched to images by the keyring.
//! - [`daemon`]: the `serve` command, the composition root that builds every part; signals and
//!   shutdown.
//! - [`listener`]: the unix socket, created safely, never stolen from a live daemon.
//! - [`kubelet_guard`]: the warning when the kubelet's image service is this socket, served
//!   without systemd socket activation.
//! - [`server`]: gRPC handlers that only translate (our API and `runtime.v1.ImageService`),
//!   WatchEvents (events encoded once into batches every watcher shares), health, reflection,
//!   caller and drain deadlines, the accept path that serves any `:authority`; `server::status`
//!   is the one place errors become gRPC statuses.
//! - [`ensure`]: EnsureImageExists step by step: default tag, presence, decide (and verify a
//!   present image), back off, find credentials, pull, record.
//! - [`events`]: the node's image events in the kubelet's reasons, for WatchEvents subscribers.
//! - [`files`]: state and config files read as hostile input: regular files only, no links, never
//!   blocking on open, bounded; a bad one set aside.
//! - [`gc`]: image garbage collection, the kubelet's way: the pure plan, the collector and its
//!   loop, the guard against removing an image being handed out, ages kept across restarts.
//! - [`presence`]: the presence cache, trusted only while proven current.
//! - [`records`]: pull records (KEP-2535): which credentials pulled each image, kept crash-safely
//!   in the kubelet's files, so that a present private image goes only to pods that could pull it.
//! - [`backoff`]: the per-(pod, image) backoff store (pure).
//! - [`pull`]: one upstream pull as a tower service, its key, the registry rate limits, the
//!   scheduler (fair parallel cap, single-flight, stall cancel), and pull progress read from
//!   containerd's content service.
//! - [`runtime`]: the runtime trait, the CRI client (with containerd's content service), its
//!   endpoint, the pass-through codec and containerd's image events.
//! - `memory`: gives memory freed after a burst back to the system (glibc's `malloc_trim`).
//! - [`metrics`]: Prometheus metrics and the `/metrics` endpoint.
//! - `notify`: readiness and stopping notices to systemd (`Type=notify`).
//! - [`policy`]: pull-policy defaulting and the pull decision (pure).
//! - [`reference`](mod@reference): the image reference grammar and the default tag (pure).
//! - [`messages`]: the kubelet's human messages and reason strings, word for word.
//! - [`reload`]: SIGHUP: the configuration read again and applied where it can change while
//!   serving (rate limits, backoff, image GC, credential files).
//! - [`retry`]: the doubling waits of the daemon's retry loops.
//! - [`root_lock`]: one daemon per `--root-dir` (a lock file); one taking the socket over waits
//!   for it.
//! - [`shutdown`]: the one stop signal every loop and server observes.
//! - [`telemetry`]: logging set-up.

pub mod api;
pub mod backoff;
pub mod config;
pub mod credentials;
pub mod daemon;
pub mod ensure;
pub mod events;
pub mod files;
pub mod gc;
pub mod kubelet_guard;
pub mod listener;
mod memory;
pub mod messages;
pub mod metrics;
mod notify;
pub mod policy;
pub mod presence;
pub mod pull;
pub mod records;
pub mod reference;
pub mod reload;
pub mod retry;
pub mod root_lock;
pub mod runtime;
pub mod server;
pub mod shutdown;
pub mod telemetry;
