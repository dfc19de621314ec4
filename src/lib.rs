//! cri-imaged: the kubelet's image manager as a node daemon in front of the CRI runtime.
//!
//! # Layout
//! From the composition root down; nothing imports a module above it (`tests/layering.rs`).
//! - [`daemon`]: the `serve` command, the composition root that builds every part; signals and
//!   shutdown.
//! - [`config`]: the command line and the config file (a field per flag), with every default, the
//!   reloadable flags, and each part's config built from them.
//! - [`reload`]: SIGHUP: the configuration read again and applied where it can change while
//!   serving (rate limits, backoff, image GC, credential files); a refusal kept for GetStatus.
//! - [`metrics`]: the Prometheus registry every concern's metrics are in, and the HTTP endpoint:
//!   `/metrics`, and `/readyz`, `/livez` for the kubelet's probes.
//! - [`readiness`]: the image service's health as the runtime probes found it, for `/readyz`.
//! - [`listener`]: the unix socket, created safely, never stolen from a live daemon.
//! - [`kubelet_guard`]: the warnings when the kubelet's image service is this socket, served
//!   without systemd socket activation, or the kubelet pulls through it serially.
//! - [`access`]: who may do what on the socket: the roles (read < pull < admin), the one table
//!   of what each method needs, and which role a caller's credentials hold (pure).
//! - [`server`]: gRPC handlers that only translate (our API and `runtime.v1.ImageService`) over
//!   the [`server::Services`] the root builds; WatchEvents (events encoded once into batches every
//!   watcher shares), health, reflection, caller and drain deadlines, the accept path that serves
//!   any `:authority`, roles at the door with its audit log (a caller's refusals after its first
//!   summarised per interval); `server::status` is the one place errors become gRPC statuses.
//! - [`ensure`]: EnsureImageExists as the kubelet's steps: default tag, presence, decide (and
//!   verify a present image), back off, find credentials, pull through the pull path.
//! - [`gc`]: image garbage collection, the kubelet's way: the pure plan (and why it keeps each
//!   image it leaves), the collector and its loop, the node's images as it sees them, the
//!   guard against removing an image being handed out, ages kept across restarts.
//! - [`pull`]: the pull path ([`pull::path::PullPath`]: records, GC guard, scheduler and events
//!   for every pull), one upstream pull as a tower service, its key, the registry rate limits,
//!   the scheduler (fair parallel cap, single-flight, stall cancel, big pulls yielding to small
//!   ones, per-registry breakers), and pull progress read from containerd's content service.
//! - [`prepull`]: pre-pulls asked for over the API or declared with `--pre-pull`: behind pods'
//!   pulls in the scheduler, admitted under their namespace's image policy, kept across restarts,
//!   pinned for a while once done.
//! - [`presence`]: the presence cache, trusted only while proven current, and the watcher of
//!   containerd's image events that keeps it so.
//! - [`records`]: pull records (KEP-2535): which credentials pulled each image, kept crash-safely
//!   in the kubelet's files, so that a present private image goes only to pods that could pull it.
//! - [`credentials`]: pull credentials the kubelet's way: pod secrets, the node's docker config
//!   and credential-provider plugins, matched to images by the keyring.
//! - [`runtime`]: the image service and content store traits, the CRI client (with containerd's
//!   content and event services), its endpoint, the pass-through codec; a shared fake for tests.
//! - [`pinned`]: the images we pin (the sandbox image, `--pinned-image`): never collected, and
//!   reported `pinned` in CRI answers, marked without re-encoding them.
//! - [`events`]: the node's image events in the kubelet's reasons, for WatchEvents subscribers,
//!   the newest kept for ListEvents.
//! - [`policy`]: image policy at the node: containers-policy.json(5), a file per namespace, the
//!   decision on an image, cosign signatures verified by public key (`policy::sigstore`) (pure).
//! - [`registry`]: a registry's manifests and blobs over the distribution API, bounded and
//!   checked, with the pull's credentials, over HTTP or TLS from the hosts containerd's hosts.toml
//!   names: what the runtime does not fetch (signatures).
//! - [`signatures`]: an image's signatures for a policy that requires them: the digest that
//!   will run, cosign's signatures for it read from its repository, verified, kept by digest
//!   and requirement (on disk too, across restarts).
//! - [`backoff`]: the per-(pod, image) backoff store, naming the newest pairs to fail (pure).
//! - [`pull_policy`]: pull-policy defaulting and the pull decision (pure).
//! - [`reference`](mod@reference): the image reference grammar and the default tag (pure).
//! - [`messages`]: the kubelet's human messages and a failed image's waiting reasons, word for
//!   word.
//! - [`files`]: state and config files read as hostile input (regular files only, no links,
//!   never blocking on open, bounded; a bad one set aside), and state directories written
//!   crash-safely.
//! - [`duration`]: the one duration grammar (Go's, and the flags' whole-unit subset).
//! - [`metric_labels`]: a series' labels (static strings only), for each concern's metrics.
//! - [`retry`]: the doubling waits of the daemon's retry loops.
//! - [`root_lock`]: one daemon per `--root-dir` (a lock file); one taking the socket over waits
//!   for it.
//! - [`shutdown`]: the one stop signal every loop and server observes.
//! - `memory`: gives memory freed after a burst back to the system (glibc's `malloc_trim`).
//! - `notify`: readiness and stopping notices to systemd (`Type=notify`).
//! - [`telemetry`]: logging set-up.
//! - [`api`]: the generated `imagemanager.v1` gRPC API and its descriptors.
//! - [`cri`]: the generated CRI `runtime.v1` API, client and servers.

pub mod access;
pub mod api;
pub mod backoff;
pub mod cli;
pub mod config;
pub mod credentials;
pub mod cri;
pub mod daemon;
pub mod duration;
pub mod ensure;
pub mod events;
pub mod files;
pub mod gc;
pub mod kubelet_guard;
pub mod listener;
mod memory;
pub mod messages;
pub mod metric_labels;
pub mod metrics;
mod notify;
pub mod pinned;
pub mod policy;
pub mod prepull;
pub mod presence;
pub mod pull;
pub mod pull_policy;
pub mod readiness;
pub mod records;
pub mod reference;
pub mod registry;
pub mod reload;
pub mod retry;
pub mod root_lock;
pub mod runtime;
pub mod server;
pub mod shutdown;
pub mod signatures;
pub mod telemetry;
