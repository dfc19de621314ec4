//! `serve`'s flags, each with its meaning, unit and default, and which of them a reload applies.

use std::{net::SocketAddr, num::NonZeroUsize, path::PathBuf, time::Duration};

use clap::{ArgAction, Args};

use super::modes::{PolicyModeArg, RateLimitModeArg};
use super::{
    DEFAULT_LISTEN, DEFAULT_ROOT_DIR, DEFAULT_RUNTIME_ENDPOINT, DefaultRoleArg, RoleArg, parse_allowlist_entry,
    parse_at_least_one, parse_burst, parse_connection_count, parse_duration, parse_duration_or_zero, parse_go_duration,
    parse_host_limit, parse_listen_address, parse_path_or_empty, parse_percent, parse_positive_qps, parse_qps,
    parse_role, parse_runtime_endpoint, parse_stream_count,
};
use crate::{
    pull::ratelimit::RateLimit,
    records::verification::VerificationPolicy,
    registry::{DEFAULT_CONFIG_PATH, DEFAULT_REGISTRIES_CONF},
    runtime::RuntimeEndpoint,
};

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Where the config file set each flag it set, for errors that name a setting.
    #[arg(skip)]
    pub origins: super::file::Origins,

    /// A YAML file with a field for any of these flags, named as the flag without its dashes
    /// (`registry-qps: 5`; a repeatable flag takes a list). A flag given here wins over the file.
    /// SIGHUP reads it again and applies what can change while serving.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Unix socket to serve on; its directory is created if missing, the socket gets mode 0660.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_LISTEN)]
    pub listen: PathBuf,

    /// The runtime's CRI socket: unix:///path or an absolute path.
    #[arg(long, value_name = "ENDPOINT", default_value = DEFAULT_RUNTIME_ENDPOINT, value_parser = parse_runtime_endpoint)]
    pub runtime_endpoint: RuntimeEndpoint,

    /// Deadline for runtime calls other than pulls (e.g. 2m, 30s, 500ms), as the kubelet's
    /// --runtime-request-timeout.
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_duration, allow_hyphen_values = true)]
    pub runtime_request_timeout: Duration,

    /// After SIGTERM or SIGINT, how long in-flight requests may take before the daemon exits.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub shutdown_timeout: Duration,

    /// Serve Prometheus metrics on http://ADDR/metrics; off when unset. IP:PORT (`127.0.0.1:9757`,
    /// `[::1]:9757`) or HOST:PORT (localhost:9757): a host name is resolved once, at start, to its
    /// first IPv4 address (else its first IPv6 one).
    #[arg(long, value_name = "ADDR", value_parser = parse_listen_address)]
    pub metrics_listen: Option<SocketAddr>,

    /// Answer presence checks from memory while containerd's image events, or else CRI-O's image
    /// store, are watched (any change forgets everything). false asks the runtime every time, as
    /// the kubelet does; so does a runtime with neither.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set)]
    pub presence_cache: bool,

    /// The containers/storage image store to watch (the directory holding images.json) when the
    /// runtime has no image events and its ImageFsInfo names no such directory.
    #[arg(long, value_name = "DIR")]
    pub image_store_path: Option<PathBuf>,

    /// A remembered answer is trusted while the cache was proven current (a marker event came back
    /// through containerd's events, the image store's inotify queue read dry) at most this long
    /// ago; 0s proves every hit, so that no removal that has returned is ever missed. Under
    /// traffic the proof is renewed ahead of time, so hits rarely wait.
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = parse_duration_or_zero, allow_hyphen_values = true)]
    pub presence_cache_max_staleness: Duration,

    /// CRI ImageFsInfo is answered from the runtime's last answer while it is younger than this
    /// and no image was pulled or removed since (through cri-imaged, or as an image event says);
    /// 0s asks the runtime every time. containerd measures its own snapshot every 10 s.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration_or_zero, allow_hyphen_values = true)]
    pub image_fs_info_max_age: Duration,

    /// The most client connections served at once. At the cap a new connection takes the place of
    /// the oldest one that has not yet begun HTTP/2, else it is closed at once. Unset: 1024,
    /// lowered at start to fit the open-file limit (RLIMIT_NOFILE).
    #[arg(long, value_name = "N", value_parser = parse_connection_count, allow_hyphen_values = true)]
    pub max_connections: Option<NonZeroUsize>,

    /// Of --max-connections, the places only root (or --reserved-connection-uid) may take, so that
    /// other callers cannot lock the kubelet out; at most all but one.
    #[arg(long, value_name = "N", default_value = "32", allow_hyphen_values = true)]
    pub reserved_connections: usize,

    /// A caller besides root that may take a reserved place: the kubelet's uid, when not root.
    #[arg(long, value_name = "UID")]
    pub reserved_connection_uid: Option<u32>,

    /// A role for a uid, a user, a gid or a group (repeatable): ROLE=SUBJECT, ROLE read, pull or
    /// admin, SUBJECT uid:N, user:NAME, gid:N or group:NAME (names looked up at start). A caller
    /// holds the highest role its matches give; root and --reserved-connection-uid are admin.
    #[arg(long, value_name = "ROLE=SUBJECT", value_parser = parse_role)]
    pub role: Vec<RoleArg>,

    /// The role of a caller no --role names: read (status, lists, events), pull (and pulls, its
    /// own pre-pulls), admin (everything) or none (health and reflection only).
    #[arg(long, value_name = "ROLE", value_enum, default_value_t = DefaultRoleArg::Pull)]
    pub default_role: DefaultRoleArg,

    /// The most connections one process other than root's (and --reserved-connection-uid's)
    /// holds once they have begun HTTP/2; one more is closed as it begins.
    #[arg(long, value_name = "N", default_value = "64", value_parser = parse_connection_count, allow_hyphen_values = true)]
    pub max_connections_per_client: NonZeroUsize,

    /// A connection that has not sent the HTTP/2 preface this long after it was accepted is
    /// closed (gRPC clients send it at once).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub connection_handshake_timeout: Duration,

    /// The most requests (streams) open at once on one connection; a client past it waits.
    #[arg(long, value_name = "N", default_value = "1024", value_parser = parse_stream_count, allow_hyphen_values = true)]
    pub max_concurrent_streams: u32,

    /// A request whose body has not fully arrived this long after its headers fails with
    /// DEADLINE_EXCEEDED, and what came of it is freed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub request_body_timeout: Duration,

    /// A connection quiet this long is sent an HTTP/2 PING; one not answered within
    /// --http2-keepalive-timeout is closed.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub http2_keepalive_interval: Duration,

    /// How long a keep-alive PING may go unanswered.
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub http2_keepalive_timeout: Duration,

    /// A connection with no request under way this long is sent GOAWAY and closed (a gRPC client
    /// dials again when it next calls); 0s keeps quiet connections open.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration_or_zero, allow_hyphen_values = true)]
    pub connection_idle_timeout: Duration,

    /// Threads serving requests. One (the default) is fastest here: the daemon mostly waits on
    /// the runtime, and one thread never pays for waking another.
    #[arg(long, value_name = "N", default_value = "1", value_parser = parse_at_least_one, allow_hyphen_values = true)]
    pub worker_threads: NonZeroUsize,

    /// How often the runtime is probed for the health service.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub health_probe_interval: Duration,

    /// How long one health probe may take; a runtime that does not answer in time (frozen,
    /// overloaded) is reported NOT_SERVING.
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub health_probe_timeout: Duration,

    /// `/livez` on --metrics-listen answers 503 once the runtime has been unreachable this long;
    /// 0s (the default) keeps it 200 whatever the runtime does. For a runtime socket mounted as a
    /// file (the DaemonSet): a restarted runtime makes a new socket, which only a new container
    /// reaches, so the kubelet's liveness probe should restart this one.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_duration_or_zero, allow_hyphen_values = true)]
    pub liveness_runtime_timeout: Duration,

    /// Pull one image at a time, as the kubelet's --serialize-image-pulls (its default). Defaults
    /// to false here: pulls run in parallel up to --max-parallel-image-pulls, cheaper ones first.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set)]
    pub serialize_image_pulls: Option<bool>,

    /// The most upstream pulls at once when pulls are not serialized (default 5).
    #[arg(long, value_name = "N", value_parser = parse_at_least_one, allow_hyphen_values = true)]
    pub max_parallel_image_pulls: Option<NonZeroUsize>,

    /// Bounds one upstream pull; on expiry it is cancelled and its callers get DEADLINE_EXCEEDED.
    /// Unset (the default, as in the kubelet) waits as long as the pull takes.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub image_pull_timeout: Option<Duration>,

    /// Watch each pull's downloads on containerd's content service: progress in GetStatus and
    /// WatchEvents, and the stall timeout below. false (or a runtime without the service, such as
    /// CRI-O) reports a pull's start and end only.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set)]
    pub pull_progress: bool,

    /// A pull with this many MiB or more to fetch makes way, once, for pods' pulls queued for a
    /// slot or fetching a quarter of what it has left or less, and goes on where it was (its
    /// downloads kept in a lease) once they are done, within 60 s; without --pull-progress
    /// (CRI-O), only within its first 2 s, and starting over. Pods' pulls waiting for a slot
    /// take one smallest first, an unsized one ranking as one of this size. 0: never, and the
    /// queue is first come, first served.
    #[arg(long, value_name = "MIB", default_value = "64", allow_hyphen_values = true)]
    pub yield_pulls_above_mib: u64,

    /// Cancels a pull that downloaded nothing for this long (as containerd 1.7's
    /// image_pull_progress_timeout); its callers get DEADLINE_EXCEEDED. containerd reports a
    /// layer's progress in 1 MiB steps, so this must cover 1 MiB at the slowest rate to accept.
    /// 0s turns it off; needs --pull-progress.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration_or_zero, allow_hyphen_values = true)]
    pub image_pull_progress_timeout: Duration,

    /// First backoff delay after a failed pull, per pod and image.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub image_pull_backoff_initial: Duration,

    /// Longest backoff delay; entries not updated for twice this are forgotten.
    #[arg(long, value_name = "DURATION", default_value = "300s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub image_pull_backoff_max: Duration,

    /// The most (pod, image) backoff entries kept; past it the stalest is forgotten.
    #[arg(long, value_name = "N", default_value = "100000", value_parser = parse_at_least_one, allow_hyphen_values = true)]
    pub image_pull_backoff_max_entries: NonZeroUsize,

    /// Average upstream pulls a second to each registry host (presence checks are never limited);
    /// 0 turns the limit off.
    #[arg(long, value_name = "QPS", default_value = "5", value_parser = parse_qps, allow_hyphen_values = true)]
    pub registry_qps: f64,

    /// Pulls allowed at once to a registry host before the QPS limit applies; at least 1 unless
    /// --registry-qps is 0.
    #[arg(long, value_name = "N", default_value = "10", value_parser = parse_burst, allow_hyphen_values = true)]
    pub registry_burst: u32,

    /// A pull over the limit fails at once with `pull QPS exceeded` (fail, the kubelet's way) or
    /// waits for a token, bounded by the caller's deadline (wait).
    #[arg(long, value_name = "MODE", value_enum, default_value_t = RateLimitModeArg::Fail)]
    pub registry_rate_limit_mode: RateLimitModeArg,

    /// A bucket of its own for one registry host, as HOST=QPS:BURST (repeatable), e.g.
    /// docker.io=2:5 or registry.local:5000=20:40.
    #[arg(long, value_name = "HOST=QPS:BURST", value_parser = parse_host_limit, allow_hyphen_values = true)]
    pub registry_qps_per_host: Vec<(String, RateLimit)>,

    /// A pull whose registry has not answered this long (no manifest, no byte) gives its pull
    /// slot back to pulls that move bytes, and the registry's next pulls wait for it rather
    /// than take a slot. Needs --pull-progress (containerd).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub registry_answer_grace: Duration,

    /// A pull whose registry has not answered this long fails with `RegistryUnavailable:`, and
    /// the registry's pulls waiting for it with it. 0s waits as long as the pull takes (the
    /// kubelet's way). Needs --pull-progress (containerd).
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = parse_duration_or_zero, allow_hyphen_values = true)]
    pub registry_resolve_timeout: Duration,

    /// Pulls failing to reach a registry in a row (refused, DNS, TLS, timeouts, 5xx) that open
    /// its breaker: its pulls then fail at once with `RegistryUnavailable:` for the cool-down,
    /// then one pull tests it. 0 turns the breaker off.
    #[arg(long, value_name = "N", default_value = "5", allow_hyphen_values = true)]
    pub registry_breaker_failures: u32,

    /// A failure further than this from the one before starts the breaker's count again.
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_duration, allow_hyphen_values = true)]
    pub registry_breaker_window: Duration,

    /// How long an open breaker fails a registry's pulls at once before one pull tests it.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub registry_breaker_cooldown: Duration,

    /// The lowest pull rate (pulls a second) of a registry answering 429: each 429 halves its
    /// rate down to this.
    #[arg(long, value_name = "QPS", default_value = "0.1", value_parser = parse_positive_qps, allow_hyphen_values = true)]
    pub registry_qps_floor: f64,

    /// After this long without a 429, a lowered registry rate goes up by a tenth of its
    /// configured rate; as long again, another tenth, until it is back.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub registry_qps_recovery: Duration,

    /// cri-imaged's state directory, as the kubelet's --root-dir: the first place the node's
    /// docker config (config.json, then .dockercfg) is looked for.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_ROOT_DIR)]
    pub root_dir: PathBuf,

    /// The kubelet's --root-dir: the pull records (KEP-2535) its own image manager wrote there
    /// are merged into ours at every start (read only), so that images it pulled with a pod's
    /// secret stay verified. Empty: none are read. Never the same directory as --root-dir.
    #[arg(long, value_name = "PATH", default_value = "/var/lib/kubelet", value_parser = parse_path_or_empty)]
    pub kubelet_root_dir: PathBuf,

    /// The node's docker config (a config.json, or a file named .dockercfg), whose credentials
    /// every pod may use; re-read when it changes. Unset: the kubelet's search (the root dir, the
    /// working directory, $HOME/.docker and /.docker for config.json, then .dockercfg in the root
    /// dir, the working directory, $HOME and /).
    #[arg(long, value_name = "PATH")]
    pub node_docker_config: Option<PathBuf>,

    /// The kubelet's credential-provider config (kind CredentialProviderConfig, YAML or JSON);
    /// needs --image-credential-provider-bin-dir.
    #[arg(long, value_name = "PATH")]
    pub image_credential_provider_config: Option<PathBuf>,

    /// Where the credential-provider plugins named in the config are.
    #[arg(long, value_name = "DIR")]
    pub image_credential_provider_bin_dir: Option<PathBuf>,

    /// The node's image policy, a containers-policy.json(5) file: which images may enter, for pods
    /// of a namespace without a file of its own in --signature-policy-dir. Unset: every image.
    #[arg(long, value_name = "PATH")]
    pub signature_policy: Option<PathBuf>,

    /// A directory of per-namespace policies, as CRI-O's signature_policy_dir:
    /// `<namespace>.json` replaces --signature-policy for that namespace's pods.
    #[arg(long, value_name = "DIR")]
    pub signature_policy_dir: Option<PathBuf>,

    /// enforce: an image the policy does not let in fails with SignatureValidationFailed; audit:
    /// it is logged, evented (PolicyAudit) and counted, and let in.
    #[arg(long, value_name = "MODE", value_enum, default_value_t = PolicyModeArg::Enforce)]
    pub signature_policy_mode: PolicyModeArg,

    /// A namespace whose pods the policy audits rather than enforces (repeatable), so that a
    /// namespace's policy is rolled out while the rest of the node enforces.
    #[arg(long, value_name = "NAMESPACE")]
    pub signature_policy_audit_namespace: Vec<String>,

    /// containerd's registry host directories (its CRI registry config_path; `:` between several):
    /// signatures are read where their hosts.toml files send containerd's pulls (server, mirrors,
    /// capabilities, ca, skip_verify, header, override_path). Empty: containerd's defaults.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_CONFIG_PATH, value_parser = parse_path_or_empty)]
    pub registry_config_path: PathBuf,

    /// CRI-O's containers-registries.conf(5) (v2; its `.d` drop-ins beside it): read instead when
    /// no directory of --registry-config-path exists and this file does, so that registries are
    /// asked where CRI-O pulls from (mirrors, insecure, blocked). Empty: never read.
    #[arg(long, value_name = "FILE", default_value = DEFAULT_REGISTRIES_CONF, value_parser = parse_path_or_empty)]
    pub registries_conf: PathBuf,

    /// Which present images a pod must hold the credentials for (KEP-2535, the kubelet's
    /// imagePullCredentialsVerificationPolicy): NeverVerify; NeverVerifyPreloadedImages (only
    /// images cri-imaged pulled); NeverVerifyAllowlistedImages (all but the allowlist's);
    /// AlwaysVerify.
    #[arg(long, value_name = "POLICY", value_enum, default_value_t = VerificationPolicy::NeverVerifyPreloadedImages)]
    pub image_pull_credentials_verification_policy: VerificationPolicy,

    /// An image exempt from verification under NeverVerifyAllowlistedImages (repeatable): a name
    /// without tag or digest (docker.io/library/nginx; a short one, alpine, as the kubelet
    /// normalises a pod's image: docker.io/library/alpine), or a prefix ending in /*
    /// (registry.local/base/*).
    #[arg(long, value_name = "IMAGE", value_parser = parse_allowlist_entry)]
    pub preloaded_images_verification_allowlist: Vec<String>,

    /// Image GC: at or above this disk usage (percent) of the image filesystem, unused images
    /// are removed, least recently used first. 100 with --image-maximum-gc-age 0 turns image GC
    /// off. Turn the kubelet's own image GC off (imageGCHighThresholdPercent: 100) so that one
    /// collector runs.
    #[arg(long, value_name = "PERCENT", default_value = "85", value_parser = parse_percent, allow_hyphen_values = true)]
    pub image_gc_high_threshold: i64,

    /// Image GC removes images until usage is down to this percent.
    #[arg(long, value_name = "PERCENT", default_value = "80", value_parser = parse_percent, allow_hyphen_values = true)]
    pub image_gc_low_threshold: i64,

    /// An image detected less than this long ago is never removed for space (a Go duration, as
    /// the kubelet's: 2m, 1m30s).
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_go_duration, allow_hyphen_values = true)]
    pub minimum_image_ttl_duration: Duration,

    /// An unused image not used for longer than this is removed, whatever the disk's usage, once
    /// cri-imaged has collected that long; 0 turns it off.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_go_duration, allow_hyphen_values = true)]
    pub image_maximum_gc_age: Duration,

    /// An image handed out (answered present, by EnsureImageExists or CRI ImageStatus) or pulled
    /// within this long is in use for image GC: the kubelet creates its container right after,
    /// and from then on the container holds it. The kubelet's minimum image age by default.
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_go_duration, allow_hyphen_values = true)]
    pub image_gc_hand_out_window: Duration,

    /// Take the socket over from a daemon still serving it, instead of refusing to start: bind a
    /// new socket and rename it over the path, so that callers reach this daemon while the old one
    /// drains (a DaemonSet's rolling update with surge). Never for the kubelet's socket, which
    /// systemd holds.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = ArgAction::Set)]
    pub take_over_socket: bool,

    /// The kubelet's config file, read at start (after a running kubelet's own flags) to warn when
    /// its image service is this socket served without systemd socket activation, or when it pulls
    /// through this socket serially (serializeImagePulls not false).
    #[arg(long, value_name = "PATH", default_value = "/var/lib/kubelet/config.yaml")]
    pub kubelet_config: PathBuf,

    /// Between image GC passes (the kubelet's fixed 5 minutes).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration, allow_hyphen_values = true)]
    pub image_gc_period: Duration,

    /// The image pod sandboxes run from, never collected. Unset: what the runtime reports
    /// (containerd's CRI config), and anything the runtime pins.
    #[arg(long, value_name = "IMAGE")]
    pub pod_infra_container_image: Option<String>,

    /// An image never collected and reported pinned through us, as the sandbox image is
    /// (repeatable): a name as pods write it, or an image id.
    #[arg(long, value_name = "IMAGE")]
    pub pinned_image: Vec<String>,

    /// An image pulled at start and kept present (repeatable): pulled behind pods' pulls, and
    /// again when removed; give it --pinned-image too to keep it from image GC.
    #[arg(long, value_name = "IMAGE")]
    pub pre_pull: Vec<String>,

    /// How often a --pre-pull image is looked for, to pull it again when it was removed.
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = parse_duration, allow_hyphen_values = true)]
    pub pre_pull_recheck_period: Duration,

    /// The most pre-pulls under way at once; they never hold a slot a pod's pull waits for.
    #[arg(long, value_name = "N", default_value = "1", value_parser = parse_at_least_one, allow_hyphen_values = true)]
    pub max_parallel_pre_pulls: NonZeroUsize,
}

/// The flags a reload (SIGHUP) applies; the others take effect at the next start.
/// Beside the flags, so that whoever adds one decides whether a reload applies it.
pub const RELOADABLE: &[&str] = &[
    "signature-policy",
    "signature-policy-dir",
    "signature-policy-mode",
    "registry-config-path",
    "registries-conf",
    "registry-qps",
    "registry-burst",
    "registry-rate-limit-mode",
    "registry-qps-per-host",
    "registry-qps-floor",
    "registry-qps-recovery",
    "image-pull-backoff-initial",
    "image-pull-backoff-max",
    "image-pull-backoff-max-entries",
    "image-gc-high-threshold",
    "image-gc-low-threshold",
    "minimum-image-ttl-duration",
    "image-maximum-gc-age",
    "image-gc-period",
    "image-gc-hand-out-window",
    "pod-infra-container-image",
    "pinned-image",
    "pre-pull",
    "pre-pull-recheck-period",
    "max-parallel-pre-pulls",
    "node-docker-config",
    "image-credential-provider-config",
    "image-credential-provider-bin-dir",
];
