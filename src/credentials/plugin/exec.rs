//! Running one credential-provider plugin: the request on stdin, the response on stdout.
//!
//! A plugin is hostile input too: it runs in a process group of its own, so that at its timeout,
//! or once it has exited, nothing it started lives on holding its pipes; its stdout is read to a
//! cap (the kubelet's response is a few KiB), its stderr to a smaller one.

use std::{process::Stdio, time::Duration};

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::{account::Presented, config::ProviderConfig};

/// The kubelet's catch-all bound on one plugin run.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest response read from a plugin's stdout.
pub const MAX_RESPONSE_BYTES: u64 = 1 << 20;
/// The most of a plugin's stderr read, and quoted in an error.
const MAX_STDERR_BYTES: u64 = 64 << 10;
const MAX_STDERR_QUOTED: usize = 1024;

/// What a plugin answered.
pub struct PluginResponse {
    pub cache_key_type: CacheKeyType,
    /// `None`: the provider's default applies.
    pub cache_duration: Option<Duration>,
    /// Registry key (may hold globs) → username and password.
    pub auth: Vec<(String, SecretString, SecretString)>,
}

/// What a response is cached under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheKeyType {
    Image,
    Registry,
    Global,
}

/// Why a plugin gave nothing.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("cannot start {0}")]
    Spawn(#[source] std::io::Error),
    #[error("did not finish within {0:?}; killed")]
    TimedOut(Duration),
    #[error("wrote more than {MAX_RESPONSE_BYTES} bytes to stdout; killed")]
    TooLarge,
    #[error("exited with {status}: {stderr}")]
    Failed { status: std::process::ExitStatus, stderr: String },
    #[error(
        "apiVersion from credential plugin response did not match expected apiVersion:{expected}, actual apiVersion:{actual}"
    )]
    ApiVersion { expected: String, actual: String },
    #[error("error decoding credential provider plugin response from stdout")]
    Decode,
    #[error("credential provider plugin did not return a valid cacheKeyType: {0:?}")]
    CacheKeyType(String),
    #[error("cannot encode the request")]
    Encode,
    #[error("I/O with the plugin failed: {0}")]
    Io(#[source] std::io::Error),
}

/// The kubelet's `CredentialProviderRequest`; the token fields only when a token is sent.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    kind: &'static str,
    api_version: &'a str,
    image: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_account_token: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_account_annotations: Option<&'a std::collections::BTreeMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    cache_key_type: String,
    cache_duration: Option<String>,
    #[serde(default)]
    auth: std::collections::BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    #[serde(default)]
    username: SecretString,
    #[serde(default)]
    password: SecretString,
}

/// Runs `provider` for `image`, with the service-account token and annotations when `presented`,
/// and reads its answer, within [`EXEC_TIMEOUT`].
pub async fn run(
    provider: &ProviderConfig,
    image: &str,
    presented: Option<&Presented>,
) -> Result<PluginResponse, ExecError> {
    run_within(provider, image, presented, EXEC_TIMEOUT).await
}

/// As [`run`], within `timeout`.
pub async fn run_within(
    provider: &ProviderConfig,
    image: &str,
    presented: Option<&Presented>,
    timeout: Duration,
) -> Result<PluginResponse, ExecError> {
    let request = Request {
        kind: "CredentialProviderRequest",
        api_version: &provider.api_version,
        image,
        service_account_token: presented.map(|presented| presented.token.expose_secret()),
        service_account_annotations: presented
            .map(|presented| &presented.annotations)
            .filter(|annotations| !annotations.is_empty()),
    };
    // Holds the token: sized up front so that no grown-out copy is left behind, and wiped once
    // dropped.
    let size = 512 + image.len() + presented.map_or(0, encoded_size);
    let mut encoded = zeroize::Zeroizing::new(Vec::with_capacity(size));
    serde_json::to_writer(&mut *encoded, &request).map_err(|_| ExecError::Encode)?;
    let request = encoded;
    let mut child = tokio::process::Command::new(&provider.executable)
        .args(&provider.args)
        .envs(provider.env.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(ExecError::Spawn)?;
    let group = ProcessGroup(child.id());
    let pipe = || ExecError::Io(std::io::ErrorKind::BrokenPipe.into());
    let (mut stdin, stdout, stderr) = (
        child.stdin.take().ok_or_else(pipe)?,
        child.stdout.take().ok_or_else(pipe)?,
        child.stderr.take().ok_or_else(pipe)?,
    );
    let waiting = async {
        // A plugin that exits without reading its request is judged by its exit status.
        let _ = stdin.write_all(&request).await;
        drop(stdin);
        let status = child.wait().await;
        // What it left running would hold its pipes open until the timeout.
        group.kill();
        status.map_err(ExecError::Io)
    };
    let reading = async {
        let read = tokio::join!(read_capped(stdout, MAX_RESPONSE_BYTES), read_capped(stderr, MAX_STDERR_BYTES));
        if read.0.is_err() {
            group.kill();
        }
        read
    };
    let exchange = async {
        let (status, (stdout, stderr)) = tokio::join!(waiting, reading);
        Ok::<_, ExecError>((status?, stdout?, stderr.unwrap_or_default()))
    };
    let ran = tokio::time::timeout(timeout, exchange).await;
    // At the timeout, the plugin and everything it started; after it, whatever is left.
    group.kill();
    let (status, stdout, stderr) = ran.map_err(|_| ExecError::TimedOut(timeout))??;
    if !status.success() {
        let stderr = String::from_utf8_lossy(&stderr);
        let stderr = stderr.trim();
        let quoted = match stderr.char_indices().nth(MAX_STDERR_QUOTED) {
            Some((cut, _)) => format!("{}…", &stderr[..cut]),
            None => stderr.to_owned(),
        };
        return Err(ExecError::Failed { status, stderr: quoted });
    }
    let mut stdout = stdout;
    let decoded = decode(&stdout, &provider.api_version);
    zeroize::Zeroize::zeroize(&mut stdout);
    decoded
}

/// About the bytes the token and annotations take in the request, escapes aside.
fn encoded_size(presented: &Presented) -> usize {
    let annotations: usize = presented.annotations.iter().map(|(key, value)| key.len() + value.len() + 8).sum();
    presented.token.expose_secret().len() + annotations + 96
}

/// A plugin's process group (its pid: it leads it).
struct ProcessGroup(Option<u32>);

impl ProcessGroup {
    /// SIGKILL to every process left in the group; one already gone is no error.
    fn kill(&self) {
        let Some(pid) = self.0.and_then(|pid| rustix::process::Pid::from_raw(pid.try_into().ok()?)) else {
            return;
        };
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// All of `pipe` up to `limit` bytes; [`ExecError::TooLarge`] past it.
async fn read_capped(pipe: impl AsyncRead + Unpin, limit: u64) -> Result<Vec<u8>, ExecError> {
    let mut read = Vec::new();
    pipe.take(limit + 1).read_to_end(&mut read).await.map_err(ExecError::Io)?;
    if read.len() as u64 > limit {
        return Err(ExecError::TooLarge);
    }
    Ok(read)
}

/// Reads a plugin's stdout, which must answer in `api_version`. Public for the fuzz targets.
pub fn decode(stdout: &[u8], api_version: &str) -> Result<PluginResponse, ExecError> {
    let response: Response = serde_json::from_slice(stdout).map_err(|_| ExecError::Decode)?;
    if response.api_version != api_version {
        return Err(ExecError::ApiVersion { expected: api_version.to_owned(), actual: response.api_version });
    }
    if response.kind != "CredentialProviderResponse" {
        return Err(ExecError::Decode);
    }
    let cache_key_type = match response.cache_key_type.as_str() {
        "Image" => CacheKeyType::Image,
        "Registry" => CacheKeyType::Registry,
        "Global" => CacheKeyType::Global,
        other => return Err(ExecError::CacheKeyType(other.to_owned())),
    };
    let cache_duration = match response.cache_duration.as_deref() {
        None => None,
        // A negative duration caches nothing, as an answer already expired does in the kubelet.
        Some(text) => Some(match crate::duration::parse_go(text) {
            Ok(duration) => duration,
            Err(crate::duration::DurationError::Negative(_)) => std::time::Duration::ZERO,
            Err(_) => return Err(ExecError::Decode),
        }),
    };
    let auth = response.auth.into_iter().map(|(key, entry)| (key, entry.username, entry.password)).collect();
    Ok(PluginResponse { cache_key_type, cache_duration, auth })
}
