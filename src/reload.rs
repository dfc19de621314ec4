//! SIGHUP: the command line and its config file read again, and applied while serving where that
//! is safe: the registry rate limits, the pull backoff, image GC's policy, pre-pulls, the credential
//! files (the node's docker config and the credential-provider plugins), the image policy's
//! files and containerd's registry host settings (read afresh even when no flag changed). Any other flag that changed is logged as waiting for a restart. A file that does not
//! load, or a configuration that does not validate, changes nothing: the running one is kept.

use std::{ffi::OsString, sync::Arc, time::SystemTime};

use tokio::sync::{mpsc, oneshot};

use crate::{
    config::{self, Change, ConfigError, LoadError, NodeCredentialsError, PolicyLoadError, RELOADABLE, Values},
    credentials::NodeCredentials,
    ensure,
    gc::ImageGc,
    notify,
    policy::PolicyGate,
    prepull::PrePulls,
    pull::ratelimit::RegistryLimits,
    registry::RegistryHosts,
    reload::metrics::{ReloadMetrics, ReloadResult},
    runtime::ImageRuntime,
    server::LastReload,
    shutdown::Shutdown,
};

/// What a reload reads again and how the daemon runs now.
#[derive(Debug, Clone)]
pub struct Source {
    /// The command line as given; its `--config` file is read anew each time.
    pub argv: Vec<OsString>,
    /// Every flag's value in effect.
    pub running: Values,
}

/// A reload that changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{0}")]
    Load(#[from] LoadError),
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Credentials(#[from] NodeCredentialsError),
    #[error("{0}")]
    Policy(#[from] PolicyLoadError),
    /// The daemon's command line names another command than `serve` (it cannot: it was read so).
    #[error("the command line no longer names `serve`")]
    NotServe,
}

/// The parts a reload reconfigures.
pub struct Reloadable<R> {
    pub limits: Arc<RegistryLimits>,
    pub manager: Arc<ensure::Manager<R>>,
    pub gc: Arc<ImageGc<R>>,
    pub pre_pulls: Arc<PrePulls<R>>,
    pub policy: Arc<PolicyGate>,
    pub credentials: Arc<NodeCredentials>,
    pub registry_hosts: Arc<RegistryHosts>,
    pub metrics: Arc<ReloadMetrics>,
    /// The last reload's refusal, for GetStatus.
    pub last: Arc<LastReload>,
}

/// What one reload did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Flags now in effect with their new values.
    pub applied: Vec<Change>,
    /// Flags that changed but wait for a restart.
    pub need_restart: Vec<Change>,
}

impl<R: ImageRuntime> Reloadable<R> {
    /// Reads `source` again and applies what can change; on any error nothing changes.
    pub fn reload(&self, source: &mut Source) -> Result<Reloaded, ReloadError> {
        let loaded = config::load(&source.argv)?;
        let config::Command::Serve(args) = loaded.cli.command else { return Err(ReloadError::NotServe) };
        // Everything is read and checked before anything is applied.
        let manager = args.manager_config()?;
        let gc = args.gc_config()?;
        let pre_pulls = args.pre_pull_config()?;
        let credentials = args.node_credentials()?;
        let policy = args.image_policy()?;
        let registry_hosts = args.registry_hosts();
        self.limits.reconfigure(&manager.rate_limits);
        self.manager.set_backoff(manager.backoff);
        self.gc.set_config(gc);
        self.pre_pulls.set_config(pre_pulls);
        self.credentials.replace(credentials);
        self.policy.replace(policy);
        self.registry_hosts.replace(registry_hosts);
        let (applied, need_restart) = source
            .running
            .changes(&loaded.values)
            .into_iter()
            .partition::<Vec<_>, _>(|change| RELOADABLE.contains(&change.flag.as_str()));
        for change in &applied {
            source.running.take(&change.flag, &loaded.values);
        }
        Ok(Reloaded { applied, need_restart })
    }

    /// Reloads on each request until `shutdown`, logging what changed, and telling systemd. A
    /// request before `ready_announced` (the daemon's first READY=1) waits for it.
    pub async fn serve(
        self,
        mut source: Source,
        mut requests: mpsc::UnboundedReceiver<()>,
        ready_announced: oneshot::Receiver<()>,
        shutdown: Shutdown,
    ) where
        R: 'static,
    {
        let reloadable = Arc::new(self);
        let stopping = shutdown.requested();
        tokio::pin!(stopping);
        tokio::select! {
            // Sent, or its sender gone: either way there is no first READY=1 left to overtake.
            _ = ready_announced => {}
            () = &mut stopping => return,
        }
        loop {
            tokio::select! {
                request = requests.recv() => if request.is_none() { return },
                () = &mut stopping => return,
            }
            notify::reloading("reloading the configuration");
            // Reading the files blocks: off the thread that serves requests.
            let (this, mut read) = (reloadable.clone(), source.clone());
            let reloading =
                tokio::task::spawn_blocking(move || this.reload(&mut read).map(|reloaded| (reloaded, read)));
            let status = match reloading.await {
                Ok(Ok((reloaded, read))) => {
                    source = read;
                    reloadable.metrics.reloaded(ReloadResult::Applied);
                    reloadable.last.applied();
                    log(&reloaded)
                }
                Ok(Err(error)) => {
                    reloadable.metrics.reloaded(ReloadResult::Refused);
                    reloadable.last.refused(SystemTime::now(), error.to_string());
                    tracing::error!(%error, "configuration reload refused; the running configuration is kept");
                    "configuration reload refused; the running configuration is kept".to_owned()
                }
                Err(error) => {
                    reloadable.metrics.reloaded(ReloadResult::Refused);
                    reloadable.last.refused(SystemTime::now(), format!("the reload failed: {error}"));
                    tracing::error!(%error, "configuration reload failed; the running configuration is kept");
                    "configuration reload failed; the running configuration is kept".to_owned()
                }
            };
            notify::ready(&status);
        }
    }
}

/// Logs what a reload changed; the status line for systemd.
fn log(reloaded: &Reloaded) -> String {
    for Change { flag, from, to } in &reloaded.applied {
        tracing::info!(flag = %flag, %from, %to, "configuration reloaded: applied");
    }
    for Change { flag, from, to } in &reloaded.need_restart {
        tracing::warn!(flag = %flag, %from, %to, "configuration reloaded: this flag changes at the next start");
    }
    let (applied, waiting) = (reloaded.applied.len(), reloaded.need_restart.len());
    tracing::info!(applied, waiting, "configuration reloaded; credential files read again");
    format!("configuration reloaded: {applied} changed, {waiting} waiting for a restart")
}

pub mod metrics;

#[cfg(test)]
mod tests;
