//! The kubelet's credential-provider plugins: executables that answer "which credentials for
//! this image?", each run for the images its `matchImages` cover, its answers cached by the key
//! type it asks for and concurrent asks for one image sharing one run. At most
//! [`MAX_RUNS_PER_PLUGIN`] runs of one plugin and [`MAX_RUNS`] in all are under way; a run waits
//! for its turn only while someone still asks (each asker's own deadline bounds its wait).
//!
//! A plugin with `tokenAttributes` (KEP-4412) is given the pod's service-account token, and its
//! answers are cached per service account (and per token, for the `Token` cache type).
//!
//! - [`config`]: the config file.
//! - [`exec`]: one run of a plugin.
//! - [`account`]: what a plugin with `tokenAttributes` is asked with, and its keys.

pub mod account;
pub mod config;
pub mod exec;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use futures_util::future::{BoxFuture, FutureExt, Shared};
use tokio::{sync::Semaphore, time::Instant};

use self::{
    account::{AccountKey, Presented},
    config::ProviderConfig,
    exec::{CacheKeyType, PluginResponse},
};
use super::{AccountCoordinates, Credential, CredentialSource, RegistryAuth, account::ServiceAccount, keyring};

/// The most runs of one plugin under way at once.
pub const MAX_RUNS_PER_PLUGIN: usize = 4;
/// The most plugin runs under way at once, all plugins together.
pub const MAX_RUNS: usize = 8;

/// The cache key shared by every image when a plugin answers with `Global`: the kubelet's since
/// 1.34, which no registry host can be (with 1.33's `global`, an answer cached for a registry
/// host named `global` served every image).
const GLOBAL_CACHE_KEY: &str = "<global>";

/// Far enough ahead to stand for "never expires".
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A plugin's answer as keyring entries.
type Answer = Arc<Vec<(String, Arc<Credential>)>>;

/// One run's answer and how long it may be cached, under which key.
#[derive(Clone)]
struct Ran {
    answer: Answer,
    cache_for: Option<(String, Duration)>,
}

impl Ran {
    /// No answer, cached nowhere: a run that failed or never ran.
    fn nothing() -> Self {
        Self { answer: Answer::default(), cache_for: None }
    }
}

/// Every configured plugin, in config order.
pub struct Plugins {
    providers: Vec<Provider>,
}

impl Plugins {
    pub fn new(configs: Vec<ProviderConfig>) -> Self {
        let all = Arc::new(Semaphore::new(MAX_RUNS));
        Self { providers: configs.into_iter().map(|config| Provider::new(config, all.clone())).collect() }
    }

    pub fn none() -> Self {
        Self::new(Vec::new())
    }

    /// The entries every plugin whose `matchImages` cover `image` gives for it, those with
    /// `tokenAttributes` asked with the pod's service `account`. A plugin that fails, or is not
    /// run for want of an account, annotation or token, logs why and gives nothing.
    pub async fn provide(&self, image: &str, account: Option<&ServiceAccount>) -> Vec<(String, Arc<Credential>)> {
        let mut entries = Vec::new();
        for provider in &self.providers {
            entries.extend(provider.provide(image, account).await.iter().cloned());
        }
        entries
    }
}

/// A cache key: the image, its registry or the global key, and the service account asked for.
type CacheKey = (String, Option<AccountKey>);

/// Answers by cache key, each until it expires.
#[derive(Default)]
struct AnswerCache {
    entries: HashMap<CacheKey, CacheEntry>,
}

struct CacheEntry {
    answer: Answer,
    expires_at: Instant,
}

impl AnswerCache {
    /// The answer for `image` and `account`: cached by image, else by its registry, else the
    /// global one, each for that account only. Expired answers are dropped on the way (an answer
    /// is good until its expiry, inclusive).
    fn get(&mut self, image: &str, account: Option<&AccountKey>, now: Instant) -> Option<Answer> {
        self.entries.retain(|_, entry| entry.expires_at >= now);
        [image, registry_of(image), GLOBAL_CACHE_KEY]
            .into_iter()
            .find_map(|key| self.entries.get(&(key.to_owned(), account.cloned())).map(|entry| entry.answer.clone()))
    }

    /// Keeps `answer` under `key` for `duration` from `now`.
    fn insert(&mut self, key: CacheKey, answer: Answer, now: Instant, duration: Duration) {
        // A duration too far out to add is as good as forever.
        let expires_at = now.checked_add(duration).unwrap_or_else(|| now + FOREVER);
        self.entries.insert(key, CacheEntry { answer, expires_at });
    }
}

/// One plugin, its cache and its runs under way.
struct Provider {
    config: Arc<ProviderConfig>,
    cache: Mutex<AnswerCache>,
    /// By image and, with a token, the token's account key.
    in_flight: Mutex<HashMap<CacheKey, Shared<BoxFuture<'static, Ran>>>>,
    /// Turns to run: this plugin's, and every plugin's.
    turns: (Arc<Semaphore>, Arc<Semaphore>),
}

impl Provider {
    fn new(config: ProviderConfig, all: Arc<Semaphore>) -> Self {
        let turns = (Arc::new(Semaphore::new(MAX_RUNS_PER_PLUGIN)), all);
        Self { config: Arc::new(config), cache: Mutex::default(), in_flight: Mutex::default(), turns }
    }

    fn cache(&self) -> MutexGuard<'_, AnswerCache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What the plugin gives for `image`: nothing when its `matchImages` do not cover it or it
    /// is not to be run for `account`, the cached answer while there is one, else the answer of a
    /// run shared with concurrent asks.
    async fn provide(&self, image: &str, account: Option<&ServiceAccount>) -> Answer {
        if !self.config.match_images.iter().any(|glob| keyring::urls_match(glob, image)) {
            return Answer::default();
        }
        let Some(ask) = account::ask(self.config.token_attributes.as_ref(), account, &self.config.name) else {
            return Answer::default();
        };
        if let Some(cached) = self.cache().get(image, ask.cache_key.as_ref(), Instant::now()) {
            return cached;
        }
        let flight_key = (image.to_owned(), ask.flight_key);
        let presented = ask.presented;
        let run = {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(PoisonError::into_inner);
            let start = || {
                let (config, image, (mine, all)) = (self.config.clone(), image.to_owned(), self.turns.clone());
                async move {
                    // Waits for its turn only while polled: while someone asks.
                    let (Ok(mine), Ok(all)) = (mine.acquire_owned().await, all.acquire_owned().await) else {
                        return Ran::nothing();
                    };
                    // In a task of its own: a run every asker gave up on still ends (and its
                    // child process with it) instead of waiting, unpolled, for the next ask.
                    let task = tokio::spawn(async move {
                        let _turns = (mine, all);
                        run(config, image, presented).await
                    });
                    task.await.unwrap_or_else(|_| Ran::nothing())
                }
                .boxed()
                .shared()
            };
            in_flight.entry(flight_key.clone()).or_insert_with(start).clone()
        };
        let ran = run.clone().await;
        if let Some((key, duration)) = ran.cache_for.clone() {
            self.cache().insert((key, ask.cache_key), ran.answer.clone(), Instant::now(), duration);
        }
        let mut in_flight = self.in_flight.lock().unwrap_or_else(PoisonError::into_inner);
        // Only this run's entry: a newer run for the image may have taken its place.
        if in_flight.get(&flight_key).is_some_and(|current| current.ptr_eq(&run)) {
            in_flight.remove(&flight_key);
        }
        ran.answer
    }
}

/// Runs the plugin once for `image`, with the token and annotations when `presented`.
async fn run(config: Arc<ProviderConfig>, image: String, presented: Option<Presented>) -> Ran {
    match exec::run(&config, &image, presented.as_ref()).await {
        Ok(response) => {
            tracing::debug!(provider = %config.name, registries = response.auth.len(), "credential provider answered");
            let passwords = response.auth.iter().map(|(_, _, password)| password);
            if account::echoes_token(config.token_attributes.as_ref(), presented.as_ref(), passwords) {
                tracing::warn!(
                    provider = %config.name,
                    "Credential provider plugin returned the service account token as the password for image {image:?}, which is not allowed when service account cache type is not set to 'Token'"
                );
                return Ran::nothing();
            }
            ran(&config, &image, response, presented.map(|presented| presented.account))
        }
        Err(error) => {
            tracing::warn!(provider = %config.name, %error, "Failed getting credential from external registry credential provider");
            Ran::nothing()
        }
    }
}

/// The answer as entries (given for `account`, when asked with its token), and its cache key and
/// lifetime: the response's duration, else the provider's default; zero caches nothing.
fn ran(
    config: &ProviderConfig,
    image: &str,
    response: PluginResponse,
    account: Option<Arc<AccountCoordinates>>,
) -> Ran {
    let source = CredentialSource::Plugin { name: config.name.clone(), account };
    let answer = response
        .auth
        .into_iter()
        .map(|(key, username, password)| {
            let auth = Arc::new(RegistryAuth::login(username, password));
            (key, Arc::new(Credential { auth, source: source.clone() }))
        })
        .collect();
    let key = match response.cache_key_type {
        CacheKeyType::Image => image,
        CacheKeyType::Registry => registry_of(image),
        CacheKeyType::Global => GLOBAL_CACHE_KEY,
    };
    let duration = response.cache_duration.unwrap_or(config.default_cache_duration);
    let cache_for = (!duration.is_zero()).then(|| (key.to_owned(), duration));
    Ran { answer: Arc::new(answer), cache_for }
}

/// The registry part of an image name: everything before the first `/`.
fn registry_of(image: &str) -> &str {
    image.split_once('/').map_or(image, |(registry, _)| registry)
}

#[cfg(test)]
mod tests;
