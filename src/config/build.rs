//! Each part's config built from the `serve` flags, and why flags that parse one by one do not
//! go together ([`ConfigError`]).

use std::{
    num::{NonZeroU32, NonZeroUsize},
    path::Path,
    time::Duration,
};

use super::{DEFAULT_MAX_CONNECTIONS, ServeArgs};
use crate::{
    backoff::{BackoffConfig, BackoffConfigError},
    credentials::{
        NodeCredentials,
        node::{NodeConfigError, NodeDockerConfig},
        plugin::{self, Plugins, config::PluginConfigError},
    },
    ensure::{ManagerConfig, VerificationConfig},
    gc::{GcConfig, plan::GcPolicy, plan::GcPolicyError},
    prepull::{
        PrePullConfig,
        book::{self, BookError},
    },
    pull::poller::ProgressConfig,
    pull::ratelimit::{RateLimit, RateLimitConfig, RateLimitError},
    pull::{
        breaker::state::BreakerConfig,
        ratelimit::AdaptiveConfig,
        scheduler::{DEFAULT_MAX_PARALLEL, SchedulerConfig},
    },
    records::verification::{Allowlist, PolicyError},
    server::{ConnectionLimits, ServeLimits},
};

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
    #[error(
        "invalid configuration: --root-dir {0:?} is the kubelet's --root-dir (--kubelet-root-dir): the kubelet and cri-imaged would both write its pull records; give cri-imaged a directory of its own"
    )]
    SharedRootDir(std::path::PathBuf),
    #[error("invalid configuration: --pre-pull {0}")]
    PrePull(BookError),
    #[error("invalid configuration: --role {role}={subject}: no such name in {}", file.display())]
    UnknownName { role: crate::access::Role, subject: String, file: std::path::PathBuf },
    #[error("invalid configuration: --role names a user or group, and {} cannot be read: {reason}", file.display())]
    Names { file: std::path::PathBuf, reason: String },
}

/// Why the node's credentials could not be read.
#[derive(Debug, thiserror::Error)]
pub enum NodeCredentialsError {
    #[error(transparent)]
    Flags(#[from] ConfigError),
    #[error(transparent)]
    NodeDockerConfig(#[from] NodeConfigError),
    #[error(transparent)]
    CredentialProviders(#[from] PluginConfigError),
}

/// The flags behind the kubelet's words for the verification policy.
fn verification_hint(error: &PolicyError) -> &'static str {
    match error {
        PolicyError::AllowlistWithoutItsPolicy => {
            "--preloaded-images-verification-allowlist needs --image-pull-credentials-verification-policy NeverVerifyAllowlistedImages"
        }
        PolicyError::Pattern(_) => {
            "--preloaded-images-verification-allowlist takes a name without tag or digest, e.g. alpine or docker.io/library/nginx, or a prefix ending in /*, e.g. registry.local/base/*"
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
            (_, Some(n)) => Some(n),
            (Some(true), None) => Some(NonZeroUsize::MIN),
            (Some(false) | None, None) => Some(DEFAULT_MAX_PARALLEL),
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
        let each_host = RateLimit::try_new(self.registry_qps, self.registry_burst).map_err(|error| match error {
            RateLimitError::ZeroBurst => ConfigError::ZeroBurst { qps: self.registry_qps },
            other => ConfigError::RateLimit(other),
        })?;
        let rate_limits = RateLimitConfig {
            each_host,
            per_host: self.registry_qps_per_host.clone(),
            mode: self.registry_rate_limit_mode.into(),
            adaptive: AdaptiveConfig { floor: self.registry_qps_floor, recovery: self.registry_qps_recovery },
        };
        let scheduler = SchedulerConfig {
            max_parallel,
            pull_timeout: self.image_pull_timeout,
            answer_grace: self.registry_answer_grace,
            resolve_timeout: Some(self.registry_resolve_timeout).filter(|timeout| !timeout.is_zero()),
            yield_above: Some(self.yield_pulls_above_mib.saturating_mul(1 << 20)).filter(|&bytes| bytes > 0),
            breaker: BreakerConfig {
                failures: NonZeroU32::new(self.registry_breaker_failures),
                window: self.registry_breaker_window,
                cooldown: self.registry_breaker_cooldown,
            },
        };
        let policy = self.image_pull_credentials_verification_policy;
        let allowlist = Allowlist::new(policy, &self.preloaded_images_verification_allowlist)?;
        Ok(ManagerConfig {
            scheduler,
            backoff,
            rate_limits,
            presence_max_staleness: self.presence_cache_max_staleness,
            image_fs_info_max_age: self.image_fs_info_max_age,
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

    /// The node's credentials as the flags ask: its docker config (a given file or the kubelet's
    /// search) and its credential-provider plugins, read now so that a bad file stops the start
    /// (or the reload).
    pub fn node_credentials(&self) -> Result<NodeCredentials, NodeCredentialsError> {
        let docker_config = match &self.node_docker_config {
            Some(path) => NodeDockerConfig::explicit(path.clone())?,
            None => {
                let working_dir = std::env::current_dir().unwrap_or_else(|_| "/".into());
                let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
                NodeDockerConfig::search(&self.root_dir, &working_dir, home.as_deref())?
            }
        };
        let providers = match self.credential_providers()? {
            Some((config, bin_dir)) => plugin::config::load(config, bin_dir)?,
            None => Vec::new(),
        };
        if let Some(path) = docker_config.path() {
            tracing::info!(path = %path.display(), "node credentials from this docker config");
        }
        for provider in &providers {
            tracing::info!(name = %provider.name, match_images = ?provider.match_images, "credential provider plugin");
        }
        Ok(NodeCredentials::new(docker_config, Plugins::new(providers)))
    }

    /// The kubelet's root dir whose pull records are adopted; `None` when empty. Refused when it
    /// is our own root dir, whichever way either is written.
    pub fn kubelet_root_dir(&self) -> Result<Option<std::path::PathBuf>, ConfigError> {
        if self.kubelet_root_dir.as_os_str().is_empty() {
            return Ok(None);
        }
        let resolved = |path: &std::path::Path| std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        if resolved(&self.kubelet_root_dir) == resolved(&self.root_dir) {
            return Err(ConfigError::SharedRootDir(self.root_dir.clone()));
        }
        Ok(Some(self.kubelet_root_dir.clone()))
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
            pinned_images: self.pinned_image.clone(),
        })
    }

    /// How pre-pulls run: the declared images with their default tags.
    pub fn pre_pull_config(&self) -> Result<PrePullConfig, ConfigError> {
        let declared = self.pre_pull.iter().map(|image| book::with_default_tag(image)).collect::<Result<_, _>>();
        Ok(PrePullConfig {
            declared: declared.map_err(ConfigError::PrePull)?,
            max_parallel: self.max_parallel_pre_pulls.get(),
            recheck: self.pre_pull_recheck_period.max(Duration::from_secs(1)),
        })
    }
}
