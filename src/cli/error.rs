//! What went wrong, for a person: each error says what to do next, and maps to one exit status
//! (the table in [`crate::config::client::EXIT_STATUS_HELP`]).

use std::{io, path::PathBuf, time::Duration};

use tonic::{Code, Status};
use tonic_types::StatusExt;

/// The exit statuses scripts can tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    Done = 0,
    Failed = 1,
    Usage = 2,
    Unreachable = 3,
    Permission = 4,
    TooOld = 5,
    RetryLater = 6,
    Interrupted = 130,
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(
        "no socket at {}: is cri-imaged running? (systemctl status cri-imaged.socket cri-imaged); give its path with --socket or CRI_IMAGED_SOCKET",
        socket.display()
    )]
    NoSocket { socket: PathBuf },
    #[error("nothing is listening on {}: the daemon is not running (systemctl start cri-imaged)", socket.display())]
    NotListening { socket: PathBuf },
    #[error("permission denied on {}{hint}", socket.display())]
    Permission { socket: PathBuf, hint: String },
    #[error("cannot connect to {}: {error}", socket.display())]
    Connect { socket: PathBuf, error: io::Error },
    #[error("the daemon at {} did not answer within {timeout:?} (--timeout)", socket.display())]
    NoAnswer { socket: PathBuf, timeout: Duration },
    #[error("lost the daemon at {}: {error}", socket.display())]
    Lost { socket: PathBuf, error: String },
    #[error(
        "the daemon at {} (version {version}) does not serve {method}: it is older than this cri-imaged ({}); upgrade it, or restart it if it was upgraded (systemctl restart cri-imaged)",
        socket.display(), env!("CARGO_PKG_VERSION")
    )]
    TooOld { socket: PathBuf, method: &'static str, version: String },
    /// The daemon's verdict: the kubelet's reason and message.
    #[error("{reason}: {message}")]
    Refused { reason: String, message: String },
    #[error("{reason}: {message}{}", retry_after.map(|after| format!(" (try again in {})", super::render::human::duration(after))).unwrap_or_default())]
    RetryLater { reason: String, message: String, retry_after: Option<Duration> },
    #[error("{0}")]
    Usage(String),
    #[error("interrupted{0}")]
    Interrupted(&'static str),
    #[error("cannot write the output: {0}")]
    Output(io::Error),
}

impl CliError {
    pub fn exit(&self) -> Exit {
        match self {
            Self::NoSocket { .. } | Self::NotListening { .. } | Self::Connect { .. } => Exit::Unreachable,
            Self::NoAnswer { .. } | Self::Lost { .. } => Exit::Unreachable,
            Self::Permission { .. } => Exit::Permission,
            Self::TooOld { .. } => Exit::TooOld,
            Self::Refused { .. } | Self::Output(_) => Exit::Failed,
            Self::RetryLater { .. } => Exit::RetryLater,
            Self::Usage(_) => Exit::Usage,
            Self::Interrupted(_) => Exit::Interrupted,
        }
    }

    /// The daemon's answer to `method` as an error. A status the generated server gives a method
    /// it does not know (UNIMPLEMENTED, no message, no details) means an older daemon; the caller
    /// fills in its version.
    pub fn from_status(status: &Status, socket: &std::path::Path, method: &'static str) -> Self {
        let info = status.get_details_error_info();
        let reason = info.as_ref().map(|info| info.reason.clone());
        match (status.code(), reason) {
            (Code::Unimplemented, None) if status.message().is_empty() => {
                Self::TooOld { socket: socket.to_owned(), method, version: "unknown".to_owned() }
            }
            (Code::ResourceExhausted, reason) | (Code::Unavailable, reason @ Some(_))
                if status.code() == Code::ResourceExhausted || status.get_details_retry_info().is_some() =>
            {
                Self::RetryLater {
                    reason: reason.unwrap_or_else(|| "ResourceExhausted".to_owned()),
                    message: status.message().to_owned(),
                    retry_after: status.get_details_retry_info().and_then(|retry| retry.retry_delay),
                }
            }
            (_, Some(reason)) if reason != "ShuttingDown" => {
                Self::Refused { reason, message: status.message().to_owned() }
            }
            // The daemon stopping, the connection lost, or no answer in time.
            (Code::Unavailable | Code::Unknown | Code::Cancelled, _) | (_, Some(_)) => {
                Self::Lost { socket: socket.to_owned(), error: status.message().to_owned() }
            }
            (Code::DeadlineExceeded, None) => {
                Self::Lost { socket: socket.to_owned(), error: "no answer in time (--timeout)".to_owned() }
            }
            (code, None) => Self::Refused { reason: format!("{code:?}"), message: status.message().to_owned() },
        }
    }
}

impl From<io::Error> for CliError {
    fn from(error: io::Error) -> Self {
        Self::Output(error)
    }
}
