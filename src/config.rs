//! Command line and config file: every flag with its meaning, unit and default; the file
//! ([`file`](mod@file)) has a field for each, and a flag given on the command line wins over it.

pub mod file;
mod load;

pub use self::load::{Change, LoadError, Loaded, Values, load};

use std::{
    net::{SocketAddr, ToSocketAddrs},
    num::NonZeroUsize,
    path::{Path, PathBuf},
    time::Duration,
};

use clap::{ArgAction, Args, Parser, Subcommand};

use crate::{
    backoff::{BackoffConfig, BackoffConfigError},
    ensure::{ManagerConfig, VerificationConfig},
    gc::{GcConfig, plan::GcPolicy, plan::GcPolicyError},
    pull::poller::ProgressConfig,
    pull::ratelimit::{RateLimit, RateLimitConfig, RateLimitError, RateLimitMode},
    pull::scheduler::SchedulerConfig,
    records::policy::{Allowlist, PolicyError, VerificationPolicy},
    runtime::{EndpointError, RuntimeEndpoint},
    server::{ConnectionLimits, ServeLimits},
};

/// Where the daemon listens unless told otherwise.
pub const DEFAULT_LISTEN: &str = "/run/cri-imaged/cri-imaged.sock";
/// cri-imaged's own state.
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/cri-imaged";
/// containerd's usual CRI socket.
pub const DEFAULT_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// cri-imaged: the kubelet's image manager as a node daemon in front of the CRI runtime.
#[derive(Debug, Parser)]
#[command(name = "cri-imaged", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve EnsureImageExists on a unix socket, pulling through the CRI runtime.
    Serve(ServeArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
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

    /// Answer presence checks from memory while containerd's image events are watched (any image
    /// event forgets everything). false asks the runtime every time, as the kubelet does; so does
    /// a runtime without containerd's event service.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set)]
    pub presence_cache: bool,

    /// A remembered answer is trusted while the cache was proven current (a marker event sent
    /// through containerd's event stream came back) at most this long ago; 0s proves every hit,
    /// so that no removal that has returned is ever missed. Under traffic the proof is renewed
    /// ahead of time, so hits rarely wait.
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = parse_duration_or_zero, allow_hyphen_values = true)]
    pub presence_cache_max_staleness: Duration,

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

    /// Pull one image at a time, as the kubelet's --serialize-image-pulls. Defaults to true,
    /// unless --max-parallel-image-pulls is 2 or more.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set)]
    pub serialize_image_pulls: Option<bool>,

    /// The most upstream pulls at once when pulls are not serialized; unset means no cap.
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

    /// Average upstream pulls a second (presence checks are never limited); 0 turns the limit off.
    #[arg(long, value_name = "QPS", default_value = "5", value_parser = parse_qps, allow_hyphen_values = true)]
    pub registry_qps: f64,

    /// Pulls allowed at once before the QPS limit applies; at least 1 unless --registry-qps is 0.
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

    /// cri-imaged's state directory, as the kubelet's --root-dir: the first place the node's
    /// docker config (config.json, then .dockercfg) is looked for.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_ROOT_DIR)]
    pub root_dir: PathBuf,

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

    /// Which present images a pod must hold the credentials for (KEP-2535, the kubelet's
    /// imagePullCredentialsVerificationPolicy): NeverVerify; NeverVerifyPreloadedImages (only
    /// images cri-imaged pulled); NeverVerifyAllowlistedImages (all but the allowlist's);
    /// AlwaysVerify.
    #[arg(long, value_name = "POLICY", value_enum, default_value_t = VerificationPolicy::NeverVerifyPreloadedImages)]
    pub image_pull_credentials_verification_policy: VerificationPolicy,

    /// An image exempt from verification under NeverVerifyAllowlistedImages (repeatable): a full
    /// name without tag or digest (docker.io/library/nginx), or a prefix ending in /*
    /// (registry.local/base/*).
    #[arg(long, value_name = "IMAGE")]
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
    /// its image service is this socket served without systemd socket activation.
    #[arg(long, value_name = "PATH", default_value = "/var/lib/kubelet/config.yaml")]
    pub kubelet_config: PathBuf,

    /// Between image GC passes (the kubelet's fixed 5 minutes).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration, allow_hyphen_values = true)]
    pub image_gc_period: Duration,

    /// The image pod sandboxes run from, never collected. Unset: what the runtime reports
    /// (containerd's CRI config), and anything the runtime pins.
    #[arg(long, value_name = "IMAGE")]
    pub pod_infra_container_image: Option<String>,
}

/// `--registry-rate-limit-mode` as typed; the rate limiter has its own [`RateLimitMode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RateLimitModeArg {
    /// Fail at once with `pull QPS exceeded`, as the kubelet does.
    Fail,
    /// Wait until a token frees up, bounded by the caller's deadline.
    Wait,
}

impl From<RateLimitModeArg> for RateLimitMode {
    fn from(mode: RateLimitModeArg) -> Self {
        match mode {
            RateLimitModeArg::Fail => Self::Fail,
            RateLimitModeArg::Wait => Self::Wait,
        }
    }
}

/// Flags that parse one by one but do not work together (the kubelet's `invalid configuration`).
/// Each message names the flags, their values and what is accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "invalid configuration: --max-parallel-image-pulls {0} needs --serialize-image-pulls=false (or unset); with --serialize-image-pulls=true only 1 is accepted, as in the kubelet"
    )]
    ParallelWhileSerialized(usize),
    #[error(
        "invalid configuration: --image-pull-backoff-initial {} must not exceed --image-pull-backoff-max {}",
        flag_duration(*.initial),
        flag_duration(*.max)
    )]
    BackoffInitialAboveMax { initial: Duration, max: Duration },
    #[error(
        "invalid configuration: --registry-burst 0 needs --registry-qps 0 (no limit); with --registry-qps {qps} the burst must be 1 or more"
    )]
    ZeroBurst { qps: f64 },
    /// Refused by a check the flags' own parsers already make; kept for callers other than clap.
    #[error("invalid configuration: {0}")]
    Backoff(BackoffConfigError),
    /// As [`ConfigError::Backoff`].
    #[error("invalid configuration: {0}")]
    RateLimit(RateLimitError),
    #[error("{0} ({hint})", hint = verification_hint(.0))]
    Verification(#[from] PolicyError),
    #[error("invalid configuration: {0}{hint}", hint = gc_hint(.0))]
    ImageGc(#[from] GcPolicyError),
    #[error(
        "invalid configuration: --{given} needs --{missing}: the plugins' config and the directory they are in go together"
    )]
    CredentialProviderHalf { given: &'static str, missing: &'static str },
}

/// The flags behind the kubelet's words for the verification policy.
fn verification_hint(error: &PolicyError) -> &'static str {
    match error {
        PolicyError::AllowlistWithoutItsPolicy => {
            "--preloaded-images-verification-allowlist needs --image-pull-credentials-verification-policy NeverVerifyAllowlistedImages"
        }
        PolicyError::Pattern(_) => {
            "--preloaded-images-verification-allowlist takes a full name without tag or digest, e.g. docker.io/library/nginx, or a prefix ending in /*, e.g. registry.local/base/*"
        }
    }
}

/// The flags behind the kubelet's words, where its message names only its config fields.
fn gc_hint(error: &GcPolicyError) -> &'static str {
    match error {
        GcPolicyError::MaxAgeNotAboveMinAge { .. } => {
            " (--image-maximum-gc-age must exceed --minimum-image-ttl-duration, or be 0s to turn it off)"
        }
        _ => "",
    }
}

/// A duration as a flag takes it: `90s`, `10m`, `1h`, `500ms`.
fn flag_duration(duration: Duration) -> String {
    let millis = duration.as_millis();
    match millis {
        0 => "0s".to_owned(),
        _ if millis.is_multiple_of(3_600_000) => format!("{}h", millis / 3_600_000),
        _ if millis.is_multiple_of(60_000) => format!("{}m", millis / 60_000),
        _ if millis.is_multiple_of(1_000) => format!("{}s", millis / 1_000),
        _ => format!("{millis}ms"),
    }
}

impl ServeArgs {
    /// The manager's configuration, validated as the kubelet validates its flags.
    pub fn manager_config(&self) -> Result<ManagerConfig, ConfigError> {
        let max_parallel = match (self.serialize_image_pulls, self.max_parallel_image_pulls) {
            (Some(true), Some(n)) if n.get() > 1 => return Err(ConfigError::ParallelWhileSerialized(n.get())),
            (Some(false), None) => None,
            (_, Some(n)) => Some(n),
            (Some(true) | None, None) => Some(NonZeroUsize::MIN),
        };
        let backoff = BackoffConfig::try_new(
            self.image_pull_backoff_initial,
            self.image_pull_backoff_max,
            self.image_pull_backoff_max_entries.get(),
        )
        .map_err(|error| match error {
            BackoffConfigError::InitialAboveMax { initial, max } => {
                ConfigError::BackoffInitialAboveMax { initial, max }
            }
            other => ConfigError::Backoff(other),
        })?;
        let global = RateLimit::try_new(self.registry_qps, self.registry_burst).map_err(|error| match error {
            RateLimitError::ZeroBurst => ConfigError::ZeroBurst { qps: self.registry_qps },
            other => ConfigError::RateLimit(other),
        })?;
        let rate_limits = RateLimitConfig {
            global,
            per_host: self.registry_qps_per_host.clone(),
            mode: self.registry_rate_limit_mode.into(),
        };
        let scheduler = SchedulerConfig { max_parallel, pull_timeout: self.image_pull_timeout };
        let policy = self.image_pull_credentials_verification_policy;
        let allowlist = Allowlist::new(policy, &self.preloaded_images_verification_allowlist)?;
        Ok(ManagerConfig {
            scheduler,
            backoff,
            rate_limits,
            presence_max_staleness: self.presence_cache_max_staleness,
            verification: VerificationConfig { policy, allowlist },
            progress: self.pull_progress.then(|| ProgressConfig {
                stall_timeout: Some(self.image_pull_progress_timeout).filter(|timeout| !timeout.is_zero()),
                ..ProgressConfig::default()
            }),
        })
    }
}

impl ServeArgs {
    /// What one client may take of the daemon.
    pub fn serve_limits(&self) -> ServeLimits {
        ServeLimits {
            connections: ConnectionLimits {
                max_connections: self.max_connections.map_or(DEFAULT_MAX_CONNECTIONS, NonZeroUsize::get),
                handshake_timeout: self.connection_handshake_timeout,
                reserved: self.reserved_connections,
                reserved_uid: self.reserved_connection_uid,
                per_client: self.max_connections_per_client.get(),
            },
            max_concurrent_streams: self.max_concurrent_streams,
            request_body_timeout: self.request_body_timeout,
            keepalive_interval: self.http2_keepalive_interval,
            keepalive_timeout: self.http2_keepalive_timeout,
            idle_timeout: Some(self.connection_idle_timeout).filter(|timeout| !timeout.is_zero()),
        }
    }

    /// The credential-provider config and the plugins' directory, when both are given.
    pub fn credential_providers(&self) -> Result<Option<(&Path, &Path)>, ConfigError> {
        const CONFIG: &str = "image-credential-provider-config";
        const BIN_DIR: &str = "image-credential-provider-bin-dir";
        match (&self.image_credential_provider_config, &self.image_credential_provider_bin_dir) {
            (Some(config), Some(bin_dir)) => Ok(Some((config, bin_dir))),
            (Some(_), None) => Err(ConfigError::CredentialProviderHalf { given: CONFIG, missing: BIN_DIR }),
            (None, Some(_)) => Err(ConfigError::CredentialProviderHalf { given: BIN_DIR, missing: CONFIG }),
            (None, None) => Ok(None),
        }
    }

    /// Image GC's configuration, validated as the kubelet validates its flags.
    pub fn gc_config(&self) -> Result<GcConfig, ConfigError> {
        let policy = GcPolicy::try_new(
            self.image_gc_high_threshold,
            self.image_gc_low_threshold,
            self.minimum_image_ttl_duration,
            self.image_maximum_gc_age,
        )?;
        Ok(GcConfig {
            policy,
            period: self.image_gc_period,
            hand_out_window: self.image_gc_hand_out_window,
            sandbox_image: self.pod_infra_container_image.clone(),
        })
    }
}

/// A command line clap refused (an unknown flag, a value its flag does not take), in the daemon's
/// one error style: `cri-imaged: invalid value '0' for '--worker-threads <N>': expected …`, then
/// clap's usage hint. `None` for what is not an error: `--help` and `--version`.
pub fn usage_error(error: &clap::Error) -> Option<String> {
    if !error.use_stderr() {
        return None;
    }
    let text = error.render().to_string();
    Some(match text.strip_prefix("error: ") {
        Some(message) => format!("cri-imaged: {message}"),
        // `cri-imaged` with no command: clap's help, which names every command.
        None => text,
    })
}

/// A value its flag does not take. clap's message around it names the flag and the value,
/// `invalid value '0' for '--worker-threads <N>': `, and this says what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("expected a whole number, 1 or more")]
    NotAtLeastOne,
    #[error("expected a whole number, 0 or more")]
    NotACount,
    #[error("expected a whole number from 1 to {MOST_CONNECTIONS}")]
    NotAConnectionCount,
    #[error("expected a whole number of percent, from 0 to 100")]
    NotAPercent,
    #[error("expected a number of pulls a second, 0 or more (0 turns the limit off), e.g. 5 or 0.5")]
    NotAQps,
    #[error("expected HOST=QPS:BURST, e.g. docker.io=2:5 or registry.local:5000=20:40")]
    NotAHostLimit,
    #[error("the HOST before '=' is empty; expected HOST=QPS:BURST, e.g. docker.io=2:5")]
    EmptyHost,
    #[error(
        "QPS {0:?} is not accepted for a host: expected a number of pulls a second above 0, e.g. 2 or 0.5 (only --registry-qps takes 0, for no limit)"
    )]
    HostQps(String),
    #[error("BURST {0:?} is not accepted: expected a whole number of pulls, 1 or more")]
    HostBurst(String),
    #[error("{0}")]
    Duration(#[from] DurationError),
    #[error("{0:?} is not a duration: expected 0 or more as Go writes it, e.g. 0s, 90s, 2m, 1m30s or 168h")]
    GoDuration(String),
    #[error("{0}")]
    Endpoint(EndpointError),
    #[error("expected unix:///path/to.sock or an absolute socket path, e.g. {DEFAULT_RUNTIME_ENDPOINT}")]
    EmptyEndpoint,
    #[error("expected IP:PORT or HOST:PORT, e.g. 127.0.0.1:9757, [::1]:9757 or localhost:9757")]
    NotAnAddress,
    #[error("port {0:?} is not accepted: expected a number from 0 to 65535")]
    Port(String),
    #[error(
        "cannot resolve {host:?} ({reason}); expected an IP address or a host name this machine resolves, e.g. 127.0.0.1:9757 or localhost:9757"
    )]
    Unresolved { host: String, reason: String },
}

/// A count of at least one: threads, parallel pulls, backoff entries.
pub fn parse_at_least_one(text: &str) -> Result<NonZeroUsize, ValueError> {
    text.parse().map_err(|_| ValueError::NotAtLeastOne)
}

/// The most connections `--max-connections` takes: each holds a file descriptor, and the unit's
/// `LimitNOFILE` is 65,536.
pub const MOST_CONNECTIONS: usize = 1_000_000;

/// `--max-connections` unset, before it is fitted to the open-file limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// `--max-connections`: from 1 to [`MOST_CONNECTIONS`].
pub fn parse_connection_count(text: &str) -> Result<NonZeroUsize, ValueError> {
    let count: NonZeroUsize = text.parse().map_err(|_| ValueError::NotAConnectionCount)?;
    if count.get() > MOST_CONNECTIONS {
        return Err(ValueError::NotAConnectionCount);
    }
    Ok(count)
}

/// `--max-concurrent-streams`: 1 or more, as HTTP/2's setting takes it.
pub fn parse_stream_count(text: &str) -> Result<u32, ValueError> {
    text.parse().ok().filter(|count| *count > 0).ok_or(ValueError::NotAtLeastOne)
}

/// `--registry-burst`: any count; whether 0 goes with the QPS is checked with it.
pub fn parse_burst(text: &str) -> Result<u32, ValueError> {
    text.parse().map_err(|_| ValueError::NotACount)
}

/// `--registry-qps`: a finite number, 0 or more.
pub fn parse_qps(text: &str) -> Result<f64, ValueError> {
    text.parse::<f64>().ok().filter(|qps| qps.is_finite() && *qps >= 0.0).ok_or(ValueError::NotAQps)
}

/// An image GC threshold: any whole number, so that the kubelet's own check (0 to 100, in its
/// words) judges the range.
pub fn parse_percent(text: &str) -> Result<i64, ValueError> {
    text.parse().map_err(|_| ValueError::NotAPercent)
}

/// `HOST=QPS:BURST` for `--registry-qps-per-host`, the host as in the image reference (port
/// included): `registry.local:5000=2.5:4`. A host's QPS must be above 0 and its burst at least 1.
pub fn parse_host_limit(text: &str) -> Result<(String, RateLimit), ValueError> {
    let (host, limit) = text.split_once('=').ok_or(ValueError::NotAHostLimit)?;
    let (qps, burst) = limit.split_once(':').ok_or(ValueError::NotAHostLimit)?;
    if host.is_empty() {
        return Err(ValueError::EmptyHost);
    }
    let bad_qps = || ValueError::HostQps(qps.to_owned());
    let bad_burst = || ValueError::HostBurst(burst.to_owned());
    let qps_value: f64 = qps.parse().map_err(|_| bad_qps())?;
    let burst_value: u32 = burst.parse().map_err(|_| bad_burst())?;
    // The limit's own checks; a host's 0 QPS (no limit) is refused: omit the host instead.
    match RateLimit::try_new(qps_value, burst_value) {
        Ok(Some(limit)) => Ok((host.to_owned(), limit)),
        Ok(None) | Err(RateLimitError::BadQps(_)) => Err(bad_qps()),
        Err(RateLimitError::ZeroBurst) => Err(bad_burst()),
    }
}

/// `--runtime-endpoint`, saying what is accepted when it is refused.
pub fn parse_runtime_endpoint(text: &str) -> Result<RuntimeEndpoint, ValueError> {
    RuntimeEndpoint::parse(text).map_err(|error| match error {
        EndpointError::Empty => ValueError::EmptyEndpoint,
        other => ValueError::Endpoint(other),
    })
}

/// A Go duration, 0 or more (`2m`, `1m30s`), as the kubelet takes its image GC ages.
pub fn parse_go_duration(text: &str) -> Result<Duration, ValueError> {
    crate::credentials::plugin::duration::parse(text).map_err(|_| ValueError::GoDuration(text.to_owned()))
}

/// An address to listen on: `IP:PORT`, or `HOST:PORT` with the host resolved now, to its first
/// IPv4 address (loopback names resolve to `::1` first, which a host without IPv6 cannot bind),
/// else its first address.
pub fn parse_listen_address(text: &str) -> Result<SocketAddr, ValueError> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let (host, port) = text.rsplit_once(':').ok_or(ValueError::NotAnAddress)?;
    if host.is_empty() || host.contains([':', '[', ']', '/']) {
        return Err(ValueError::NotAnAddress);
    }
    let port: u16 = port.parse().map_err(|_| ValueError::Port(port.to_owned()))?;
    let unresolved = |reason: String| ValueError::Unresolved { host: host.to_owned(), reason };
    let addrs: Vec<SocketAddr> =
        (host, port).to_socket_addrs().map_err(|error| unresolved(error.to_string()))?.collect();
    addrs
        .iter()
        .find(|addr| addr.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| unresolved("no address".to_owned()))
}

/// A duration not written as a whole number and a unit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("{0:?} is not a duration: write a whole number and a unit, e.g. 500ms, 30s, 2m or 1h")]
    Malformed(String),
    #[error("{0:?} must be greater than zero: write a whole number and a unit, e.g. 500ms, 30s, 2m or 1h")]
    Zero(String),
    #[error("{0:?} is too long: at most 8760h (a year)")]
    TooLong(String),
}

/// The longest duration a flag takes: every duration here is a bound on a wait or a period, and
/// far-future instants overflow.
const LONGEST_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses `500ms`, `30s`, `2m`, `1h`; zero is refused because every duration here is a bound.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    match parse_duration_or_zero(text)? {
        Duration::ZERO => Err(DurationError::Zero(text.to_owned())),
        duration => Ok(duration),
    }
}

/// As [`parse_duration`], where zero means "none at all".
pub fn parse_duration_or_zero(text: &str) -> Result<Duration, DurationError> {
    let malformed = || DurationError::Malformed(text.to_owned());
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(malformed)?;
    let (number, unit) = text.split_at(split);
    let value: u64 = number.parse().map_err(|_| malformed())?;
    let duration = match unit {
        "ms" => Duration::from_millis(value),
        "s" => Duration::from_secs(value),
        "m" => Duration::from_secs(value.checked_mul(60).ok_or_else(malformed)?),
        "h" => Duration::from_secs(value.checked_mul(3600).ok_or_else(malformed)?),
        _ => return Err(malformed()),
    };
    if duration > LONGEST_DURATION {
        return Err(DurationError::TooLong(text.to_owned()));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use clap::CommandFactory;

    use super::*;

    #[test]
    fn durations_take_a_whole_number_and_a_unit() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn malformed_and_zero_durations_are_refused_with_the_input() {
        for bad in ["", "30", "s", "1.5s", "-1s", "10 s", "3d", "99999999999999999999s"] {
            assert_eq!(parse_duration(bad), Err(DurationError::Malformed(bad.to_owned())), "{bad:?}");
        }
        assert_eq!(parse_duration("0s"), Err(DurationError::Zero("0s".to_owned())));
        assert_eq!(parse_duration_or_zero("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn serve_defaults_match_the_documented_ones() {
        let cli = Cli::try_parse_from(["cri-imaged", "serve"]).expect("defaults parse");
        let Command::Serve(args) = cli.command;
        assert_eq!(args.listen, PathBuf::from(DEFAULT_LISTEN));
        assert_eq!(args.runtime_endpoint.to_string(), DEFAULT_RUNTIME_ENDPOINT);
        assert_eq!(args.runtime_request_timeout, Duration::from_secs(120));
        assert_eq!(args.shutdown_timeout, Duration::from_secs(30));
        assert_eq!(args.health_probe_interval, Duration::from_secs(5));
        assert_eq!(args.health_probe_timeout, Duration::from_secs(3));
        assert!(args.presence_cache);
        assert_eq!(args.presence_cache_max_staleness, crate::presence::DEFAULT_MAX_STALENESS);
        assert_eq!(args.worker_threads.get(), 1);
        assert_eq!(args.gc_config(), Ok(GcConfig::default()));
        assert_eq!(args.serve_limits(), ServeLimits::default());
    }

    #[test]
    fn image_gc_flags_take_the_kubelets_values_and_messages() {
        let parse = |flags: &[&str]| {
            let cli = Cli::try_parse_from([&["cri-imaged", "serve"], flags].concat()).expect("parses");
            let Command::Serve(args) = cli.command;
            args.gc_config()
        };
        let config =
            parse(&["--minimum-image-ttl-duration", "1m30s", "--image-maximum-gc-age", "168h"]).expect("valid");
        assert_eq!(config.policy.min_age, Duration::from_secs(90));
        assert_eq!(config.policy.max_age, Duration::from_secs(168 * 3600));
        let error =
            parse(&["--image-gc-high-threshold", "70", "--image-gc-low-threshold", "75"]).expect_err("low over high");
        assert_eq!(
            error.to_string(),
            "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) 75 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 70"
        );
        let negative = parse(&["--image-gc-low-threshold", "-1"]).expect_err("negative");
        assert!(negative.to_string().ends_with("-1 must be between 0 and 100, inclusive"), "{negative}");
        assert!(parse(&["--image-gc-high-threshold", "100"]).expect("valid").policy.disabled());
    }

    #[test]
    fn the_presence_cache_can_be_turned_off_and_zero_threads_is_refused() {
        let cli = Cli::try_parse_from(["cri-imaged", "serve", "--presence-cache=false"]).expect("flag parses");
        let Command::Serve(args) = cli.command;
        assert!(!args.presence_cache);
        let error = Cli::try_parse_from(["cri-imaged", "serve", "--worker-threads", "0"]).expect_err("zero threads");
        assert!(error.to_string().contains("--worker-threads"), "{error}");
    }

    fn manager_config(flags: &[&str]) -> Result<ManagerConfig, ConfigError> {
        let cli = Cli::try_parse_from(["cri-imaged", "serve"].iter().chain(flags)).expect("flags parse");
        let Command::Serve(args) = cli.command;
        args.manager_config()
    }

    fn max_parallel(flags: &[&str]) -> Option<usize> {
        manager_config(flags).expect("valid").scheduler.max_parallel.map(NonZeroUsize::get)
    }

    #[test]
    fn pulls_are_serial_by_default_as_in_the_kubelet() {
        assert_eq!(max_parallel(&[]), Some(1));
        assert_eq!(max_parallel(&["--serialize-image-pulls"]), Some(1));
        assert_eq!(manager_config(&[]).expect("valid"), ManagerConfig::default());
    }

    #[test]
    fn parallel_pulls_are_capped_or_unlimited() {
        assert_eq!(max_parallel(&["--max-parallel-image-pulls", "3"]), Some(3));
        assert_eq!(max_parallel(&["--serialize-image-pulls=false", "--max-parallel-image-pulls", "3"]), Some(3));
        assert_eq!(max_parallel(&["--serialize-image-pulls=false"]), None);
    }

    #[test]
    fn registry_limits_come_from_their_flags() {
        let config = manager_config(&[
            "--registry-qps=0",
            "--registry-rate-limit-mode=wait",
            "--registry-qps-per-host=docker.io=1:2",
            "--registry-qps-per-host=quay.io=3:4",
        ])
        .expect("valid");
        assert_eq!(config.rate_limits.global, None, "0 QPS is no limit");
        assert_eq!(config.rate_limits.mode, RateLimitMode::Wait);
        let hosts: Vec<&str> = config.rate_limits.per_host.iter().map(|(host, _)| host.as_str()).collect();
        assert_eq!(hosts, ["docker.io", "quay.io"]);
        let zero_burst = manager_config(&["--registry-burst=0"]).expect_err("a burst of 0 under a limit");
        assert_eq!(zero_burst, ConfigError::ZeroBurst { qps: 5.0 });
        assert_eq!(
            zero_burst.to_string(),
            "invalid configuration: --registry-burst 0 needs --registry-qps 0 (no limit); with --registry-qps 5 the burst must be 1 or more"
        );
        assert!(manager_config(&["--registry-qps=0", "--registry-burst=0"]).is_ok(), "no limit, no burst");
    }

    #[test]
    fn contradictory_pull_flags_are_refused() {
        let both = manager_config(&["--serialize-image-pulls=true", "--max-parallel-image-pulls", "4"]);
        assert_eq!(both, Err(ConfigError::ParallelWhileSerialized(4)));
        let backwards = manager_config(&["--image-pull-backoff-initial", "10m", "--image-pull-backoff-max", "90s"]);
        assert_eq!(
            backwards.expect_err("initial over max").to_string(),
            "invalid configuration: --image-pull-backoff-initial 10m must not exceed --image-pull-backoff-max 90s"
        );
    }

    /// clap's message for `flags`, as the daemon prints it.
    fn usage_message(flags: &[&str]) -> String {
        let error = Cli::try_parse_from(["cri-imaged", "serve"].iter().chain(flags)).expect_err("refused");
        usage_error(&error).expect("an error, not help")
    }

    #[test]
    fn a_refused_value_names_its_flag_the_value_and_what_is_accepted() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--worker-threads", "0"],
                "invalid value '0' for '--worker-threads <N>': expected a whole number, 1 or more",
            ),
            (
                &["--max-parallel-image-pulls", "0"],
                "'--max-parallel-image-pulls <N>': expected a whole number, 1 or more",
            ),
            (&["--image-pull-backoff-max-entries", "0"], "expected a whole number, 1 or more"),
            (
                &["--registry-qps", "-1"],
                "invalid value '-1' for '--registry-qps <QPS>': expected a number of pulls a second, 0 or more",
            ),
            (&["--registry-qps", "inf"], "invalid value 'inf' for '--registry-qps <QPS>'"),
            (
                &["--registry-burst", "-1"],
                "invalid value '-1' for '--registry-burst <N>': expected a whole number, 0 or more",
            ),
            (
                &["--registry-qps-per-host", "docker.io=0:5"],
                "QPS \"0\" is not accepted for a host: expected a number of pulls a second above 0",
            ),
            (
                &["--registry-qps-per-host", "docker.io=2:0"],
                "BURST \"0\" is not accepted: expected a whole number of pulls, 1 or more",
            ),
            (&["--registry-qps-per-host", "docker.io"], "expected HOST=QPS:BURST, e.g. docker.io=2:5"),
            (&["--registry-qps-per-host", "=2:5"], "the HOST before '=' is empty"),
            (
                &["--image-gc-high-threshold", "lots"],
                "'--image-gc-high-threshold <PERCENT>': expected a whole number of percent, from 0 to 100",
            ),
            (
                &["--presence-cache-max-staleness", "-1s"],
                "invalid value '-1s' for '--presence-cache-max-staleness <DURATION>': \"-1s\" is not a duration",
            ),
            (&["--shutdown-timeout", "0s"], "\"0s\" must be greater than zero: write a whole number and a unit"),
            (&["--request-body-timeout", "18446744073709551615s"], "is too long: at most 8760h (a year)"),
            (&["--max-connections", "99999999999"], "expected a whole number from 1 to 1000000"),
            (
                &["--minimum-image-ttl-duration", "5"],
                "\"5\" is not a duration: expected 0 or more as Go writes it, e.g. 0s, 90s, 2m, 1m30s or 168h",
            ),
            (&["--image-maximum-gc-age", "-1h"], "invalid value '-1h' for '--image-maximum-gc-age <DURATION>'"),
            (&["--runtime-endpoint", ""], "expected unix:///path/to.sock or an absolute socket path"),
            (
                &["--metrics-listen", "localhost"],
                "expected IP:PORT or HOST:PORT, e.g. 127.0.0.1:9757, [::1]:9757 or localhost:9757",
            ),
            (
                &["--metrics-listen", "localhost:http"],
                "port \"http\" is not accepted: expected a number from 0 to 65535",
            ),
        ];
        for (flags, expected) in cases {
            let message = usage_message(flags);
            assert!(message.starts_with("cri-imaged: "), "{flags:?}: {message}");
            assert!(message.contains(expected), "{flags:?}: {message}");
        }
    }

    #[test]
    fn help_and_version_are_not_errors() {
        for flag in ["--help", "--version"] {
            let error = Cli::try_parse_from(["cri-imaged", flag]).expect_err("clap stops there");
            assert_eq!(usage_error(&error), None, "{flag}");
        }
    }

    #[test]
    fn metrics_listen_takes_an_address_or_a_host_name() {
        assert_eq!(parse_listen_address("127.0.0.1:9757"), Ok(SocketAddr::from(([127, 0, 0, 1], 9757))));
        assert_eq!(parse_listen_address("[::1]:9757"), "[::1]:9757".parse().map_err(|_| ValueError::NotAnAddress));
        assert_eq!(parse_listen_address("localhost:9757"), Ok(SocketAddr::from(([127, 0, 0, 1], 9757))));
        assert!(matches!(parse_listen_address("no-such-host.invalid:1"), Err(ValueError::Unresolved { .. })));
    }

    #[test]
    fn a_host_limit_takes_a_host_with_its_port_a_rate_and_a_burst() {
        let (host, limit) = parse_host_limit("registry.local:5000=2.5:4").expect("valid");
        assert_eq!(host, "registry.local:5000");
        assert_eq!(limit, RateLimit { qps: 2.5, burst: std::num::NonZeroU32::new(4).expect("non-zero") });
        assert_eq!(parse_host_limit("docker.io=x:10"), Err(ValueError::HostQps("x".to_owned())));
        assert_eq!(parse_host_limit("docker.io=5"), Err(ValueError::NotAHostLimit));
    }

    fn load_with_file(text: &str, flags: &[&str]) -> Result<Loaded, LoadError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, text).expect("config written");
        let config = path.to_str().expect("utf-8").to_owned();
        let argv = ["cri-imaged", "serve", "--config", &config].into_iter().chain(flags.iter().copied());
        let argv = argv.map(OsString::from);
        load(&argv.collect::<Vec<_>>())
    }

    fn serve_args(loaded: Loaded) -> ServeArgs {
        let Command::Serve(args) = loaded.cli.command;
        args
    }

    fn no_file() -> Loaded {
        load(&["cri-imaged", "serve"].map(OsString::from)).expect("defaults load")
    }

    #[test]
    fn the_file_sets_what_the_command_line_leaves_and_a_flag_wins_over_it() {
        let text = "registry-qps: 2\nregistry-burst: 3\nregistry-qps-per-host: [docker.io=1:1]\n";
        let args = serve_args(load_with_file(text, &["--registry-burst", "7"]).expect("valid"));
        assert_eq!(args.registry_qps, 2.0, "from the file");
        assert_eq!(args.registry_burst, 7, "the flag wins");
        assert_eq!(args.registry_qps_per_host.len(), 1);
        assert_eq!(args.shutdown_timeout, Duration::from_secs(30), "the default where neither says");
        let flag_list = ["--registry-qps-per-host", "quay.io=2:2"];
        let args = serve_args(load_with_file(text, &flag_list).expect("valid"));
        let hosts: Vec<&str> = args.registry_qps_per_host.iter().map(|(host, _)| host.as_str()).collect();
        assert_eq!(hosts, ["quay.io"], "a repeatable flag replaces the file's list, not adds to it");
    }

    #[test]
    fn values_from_the_file_are_checked_together_as_flags_are() {
        let halves = load_with_file("image-credential-provider-config: /etc/p.yaml\n", &[]).expect("loads");
        assert_eq!(
            serve_args(halves).credential_providers().expect_err("half").to_string(),
            "invalid configuration: --image-credential-provider-config needs --image-credential-provider-bin-dir: the plugins' config and the directory they are in go together"
        );
        let backwards = load_with_file("image-pull-backoff-initial: 10m\nimage-pull-backoff-max: 90s\n", &[]);
        assert!(matches!(
            serve_args(backwards.expect("loads")).manager_config(),
            Err(ConfigError::BackoffInitialAboveMax { .. })
        ));
        let missing = load(&["cri-imaged", "serve", "--config", "/nonexistent/cri-imaged.yaml"].map(OsString::from));
        assert!(
            matches!(&missing, Err(LoadError::File(file::FileError::Read { .. }))),
            "{:?}",
            missing.map(|loaded| loaded.values)
        );
    }

    #[test]
    fn the_shipped_config_file_has_every_flag_and_sets_only_the_defaults() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/cri-imaged.yaml");
        let text = std::fs::read_to_string(path).expect("the shipped config");
        let loaded =
            load(&["cri-imaged", "serve", "--config", path].map(OsString::from)).expect("the shipped file loads");
        assert_eq!(no_file().values.changes(&loaded.values), [], "every value is the default");
        let serve = Cli::command().find_subcommand("serve").expect("serve").clone();
        for long in serve.get_arguments().filter_map(clap::Arg::get_long).filter(|long| *long != file::CONFIG_FIELD) {
            let written = text.lines().any(|line| {
                let line = line.trim_start_matches(['#', ' ']);
                line.strip_prefix(long).is_some_and(|rest| rest.starts_with(':'))
            });
            assert!(written, "{long} is missing from {path}");
        }
    }

    #[test]
    fn changes_name_each_flag_whose_value_differs() {
        let before = no_file().values;
        let same = load_with_file("registry-qps: 5.0\nimage-pull-backoff-max: 5m\nimage-gc-period: 300s\n", &[]);
        assert_eq!(before.changes(&same.expect("valid").values), [], "another spelling of the same value");
        let after =
            load_with_file("registry-qps: 2\nregistry-qps-per-host: [a.io=1:1, b.io=2:2]\n", &[]).expect("valid");
        let changes = before.changes(&after.values);
        let change = |flag: &str, from: &str, to: &str| Change { flag: flag.into(), from: from.into(), to: to.into() };
        assert_eq!(
            changes,
            [change("registry-qps", "5", "2"), change("registry-qps-per-host", "unset", "a.io=1:1, b.io=2:2")]
        );
        let mut running = before.clone();
        running.take("registry-qps", &after.values);
        assert_eq!(running.changes(&after.values).len(), 1, "only the per-host limits still differ");
        assert!(running.knows("registry-qps") && !running.knows("config") && !running.knows("no-such-flag"));
    }

    #[test]
    fn a_bad_runtime_endpoint_is_a_usage_error_that_names_it() {
        let error = Cli::try_parse_from(["cri-imaged", "serve", "--runtime-endpoint", "tcp://10.0.0.1:1"])
            .expect_err("tcp is not supported");
        assert!(error.to_string().contains("tcp://10.0.0.1:1"), "{error}");
    }
}
