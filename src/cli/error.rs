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
    /// The caller's role does not allow the call: the daemon's message names the role it needs.
    #[error("{message}")]
    RoleRequired { message: String },
    /// The daemon's verdict: the kubelet's reason and message.
    #[error("{reason}: {message}")]
    Refused { reason: String, message: String },
    /// `then`: what a person may do instead of waiting, or empty.
    #[error("{reason}: {message}{}{then}", retry_after.map(retry_when).unwrap_or_default())]
    RetryLater { reason: String, message: String, retry_after: Option<Duration>, then: String },
    #[error("{0}")]
    Usage(String),
    #[error("interrupted")]
    Interrupted,
    #[error("cannot write the output: {0}")]
    Output(io::Error),
}

impl CliError {
    pub fn exit(&self) -> Exit {
        match self {
            Self::NoSocket { .. } | Self::NotListening { .. } | Self::Connect { .. } => Exit::Unreachable,
            Self::NoAnswer { .. } | Self::Lost { .. } => Exit::Unreachable,
            Self::Permission { .. } | Self::RoleRequired { .. } => Exit::Permission,
            Self::TooOld { .. } => Exit::TooOld,
            Self::Refused { .. } | Self::Output(_) => Exit::Failed,
            Self::RetryLater { .. } => Exit::RetryLater,
            Self::Usage(_) => Exit::Usage,
            Self::Interrupted => Exit::Interrupted,
        }
    }

    /// The daemon's answer to `method` as an error. A status the generated server gives a method
    /// it does not know (UNIMPLEMENTED, no message, no details) means an older daemon; the caller
    /// fills in its version.
    pub fn from_status(status: &Status, socket: &std::path::Path, method: &'static str) -> Self {
        let reason = status.get_details_error_info().map(|info| info.reason);
        let retry = status.get_details_retry_info();
        let message = status.message().to_owned();
        let lost = |error: String| Self::Lost { socket: socket.to_owned(), error };
        if status.code() == Code::Unimplemented && reason.is_none() && message.is_empty() {
            return Self::TooOld { socket: socket.to_owned(), method, version: "unknown".to_owned() };
        }
        if status.code() == Code::ResourceExhausted || retry.is_some() {
            let reason = reason.unwrap_or_else(|| "ResourceExhausted".to_owned());
            let retry_after = retry.and_then(|retry| retry.retry_delay);
            return Self::RetryLater { reason, message, retry_after, then: String::new() };
        }
        // Past --timeout: tonic's own CANCELLED, or the daemon's answer that the caller's deadline
        // passed (reason DeadlineExceeded).
        let timed_out = (status.code() == Code::Cancelled && message == "Timeout expired")
            || reason.as_deref() == Some("DeadlineExceeded")
            || (status.code() == Code::DeadlineExceeded && reason.is_none());
        if timed_out {
            return lost("no answer within --timeout".to_owned());
        }
        if status.code() == Code::PermissionDenied && reason.as_deref() == Some("RoleRequired") {
            return Self::RoleRequired { message };
        }
        match (reason, status.code()) {
            // The daemon stopping mid-call is the daemon going away, not its verdict.
            (Some(reason), _) if reason != "ShuttingDown" => Self::Refused { reason, message },
            (Some(_), _) | (None, Code::Unavailable | Code::Unknown | Code::Cancelled) => lost(message),
            (None, code) => Self::Refused { reason: format!("{code:?}"), message },
        }
    }

    /// A pod's backoff (ImagePullBackOff) says how to end it at once: the command that clears
    /// this pod's backoff for `image`.
    pub fn with_backoff_clear(self, pod_uid: &str, image: &str, runtime_handler: &str) -> Self {
        match self {
            Self::RetryLater { reason, message, retry_after, .. } if reason == "ImagePullBackOff" => {
                // A pull backs off only for a pod's uid; the placeholder is for a daemon that
                // would say otherwise.
                let uid = if pod_uid.is_empty() { "POD_UID" } else { pod_uid };
                let handler = if runtime_handler.is_empty() {
                    String::new()
                } else {
                    format!(" --runtime-handler {runtime_handler}")
                };
                let then = format!("; to try at once: cri-imaged backoff clear {uid} {image}{handler}");
                Self::RetryLater { reason, message, retry_after, then }
            }
            other => other,
        }
    }
}

/// ` (try again in 9s, at 13:07:31 UTC)`: how long, and until when, a backoff lasts.
fn retry_when(after: Duration) -> String {
    let until = crate::duration::rfc3339(std::time::SystemTime::now() + after);
    let clock = until.get(11..19).unwrap_or_default();
    format!(" (try again in {}, at {clock} UTC)", super::render::human::duration(after))
}

impl From<io::Error> for CliError {
    fn from(error: io::Error) -> Self {
        Self::Output(error)
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, path::Path};

    use tonic_types::ErrorDetails;

    use super::*;

    fn with_reason(code: Code, reason: &str, message: &str) -> Status {
        let details = ErrorDetails::with_error_info(reason, "cri-imaged", HashMap::new());
        Status::with_error_details(code, message, details)
    }

    fn exit_of(status: &Status) -> Exit {
        CliError::from_status(status, Path::new("/run/s.sock"), "ListImages").exit()
    }

    #[test]
    fn a_pods_backoff_says_the_command_that_ends_it_and_other_waits_do_not() {
        let mut details = ErrorDetails::with_error_info("ImagePullBackOff", "cri-imaged", HashMap::new());
        details.set_retry_info(Some(Duration::from_secs(9)));
        let status = Status::with_error_details(Code::ResourceExhausted, "Back-off pulling image", details);
        let error = CliError::from_status(&status, Path::new("/run/s.sock"), "EnsureImageExists");
        let said = error.with_backoff_clear("uid-1", "busybox:1.36", "").to_string();
        assert!(said.ends_with(" UTC); to try at once: cri-imaged backoff clear uid-1 busybox:1.36"), "{said}");
        let qps = with_reason(Code::ResourceExhausted, "ErrImagePull", "pull QPS exceeded");
        let error = CliError::from_status(&qps, Path::new("/run/s.sock"), "EnsureImageExists");
        assert!(!error.with_backoff_clear("uid-1", "busybox", "").to_string().contains("backoff clear"));
    }

    #[test]
    fn the_daemons_verdicts_keep_the_kubelets_reason_and_exit_1() {
        let status = with_reason(Code::NotFound, "ErrImagePull", "not found");
        let error = CliError::from_status(&status, Path::new("/run/s.sock"), "EnsureImageExists");
        assert_eq!(error.to_string(), "ErrImagePull: not found");
        assert_eq!(error.exit(), Exit::Failed);
    }

    #[test]
    fn backing_off_and_the_rate_limit_are_for_later_with_the_time_left() {
        let mut details = ErrorDetails::with_error_info("ImagePullBackOff", "cri-imaged", HashMap::new());
        details.set_retry_info(Some(Duration::from_secs(40)));
        let status = Status::with_error_details(Code::Unavailable, "Back-off pulling image", details);
        let error = CliError::from_status(&status, Path::new("/s"), "EnsureImageExists");
        assert_eq!(error.exit(), Exit::RetryLater);
        assert!(
            error.to_string().starts_with("ImagePullBackOff: Back-off pulling image (try again in 40s, at "),
            "{error}"
        );
        assert_eq!(
            exit_of(&with_reason(Code::ResourceExhausted, "ErrImagePull", "pull QPS exceeded")),
            Exit::RetryLater
        );
    }

    #[test]
    fn a_method_the_daemon_does_not_know_means_it_is_older() {
        let error = CliError::from_status(&Status::unimplemented(""), Path::new("/run/s.sock"), "ListImages");
        assert_eq!(error.exit(), Exit::TooOld);
        assert!(error.to_string().contains("does not serve ListImages"), "{error}");
        // Our own UNIMPLEMENTED says why: the runtime lacks something, the daemon is not too old.
        assert_eq!(exit_of(&Status::unimplemented("cri-imaged does not serve /runtime.v1.X")), Exit::Failed);
    }

    #[test]
    fn a_call_the_callers_role_does_not_allow_exits_4_with_the_daemons_message() {
        let message = "GarbageCollect needs the admin role; uid 1000 (gid 1000, groups 997) has pull (--role and --default-role say who has which)";
        let error = CliError::from_status(
            &with_reason(Code::PermissionDenied, "RoleRequired", message),
            Path::new("/s"),
            "GarbageCollect",
        );
        assert_eq!((error.exit(), error.to_string()), (Exit::Permission, message.to_owned()));
        // A pull the registry refused is the daemon's verdict, not the socket's door.
        assert_eq!(exit_of(&with_reason(Code::PermissionDenied, "ErrImagePull", "denied")), Exit::Failed);
    }

    #[test]
    fn a_daemon_going_away_is_unreachable() {
        assert_eq!(exit_of(&Status::unavailable("transport error")), Exit::Unreachable);
        assert_eq!(
            exit_of(&with_reason(Code::Unavailable, "ShuttingDown", "cri-imaged is shutting down")),
            Exit::Unreachable
        );
        assert_eq!(exit_of(&Status::deadline_exceeded("")), Exit::Unreachable);
        assert_eq!(exit_of(&Status::cancelled("Timeout expired")), Exit::Unreachable);
        assert_eq!(
            exit_of(&with_reason(Code::DeadlineExceeded, "DeadlineExceeded", "caller's deadline")),
            Exit::Unreachable
        );
        // A pull that ran past --image-pull-timeout is the daemon's verdict.
        assert_eq!(exit_of(&with_reason(Code::DeadlineExceeded, "ErrImagePull", "--image-pull-timeout")), Exit::Failed);
    }
}
