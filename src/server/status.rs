//! The one place where errors become gRPC statuses.
//!
//! Every status for a request's error carries a `google.rpc.ErrorInfo` whose `reason` is the
//! kubelet's reason string, so callers can branch on it exactly as they would on the kubelet's.
//! The answers for a call the daemon does not serve, or for a pass that stopped, carry none.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::{
    body_timeout::BodyTimedOut,
    deadline::{CallerDeadline, DrainDeadline},
    request::RequestError,
    streams::StreamShutDown,
    watch::NoRequestMessage,
};
use std::sync::Arc;

use crate::{
    access::Denied,
    ensure::EnsureError,
    gc::{GcError, plan::PlanError},
    prepull::{PrePullError, book::BookError},
    pull::PullError,
    runtime::RuntimeError,
};

/// The `domain` of our `ErrorInfo` details.
pub const ERROR_DOMAIN: &str = "cri-imaged";

/// Reason for a request that could not be translated at all.
const INVALID_REQUEST: &str = "InvalidRequest";
/// Reason for a request whose caller's deadline passed.
const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
/// Reason for a request the daemon gave up on as it exited.
const SHUTTING_DOWN: &str = "ShuttingDown";

impl From<EnsureError> for Status {
    fn from(error: EnsureError) -> Self {
        let code = ensure_error_code(&error);
        let mut details = ErrorDetails::with_error_info(error.reason(), ERROR_DOMAIN, HashMap::new());
        if let EnsureError::BackOff { retry_after, .. } = &error {
            details.set_retry_info(Some(*retry_after));
        }
        Status::with_error_details(code, error.to_string(), details)
    }
}

/// Reason for a garbage collection pass that could not be made.
const IMAGE_GC_FAILED: &str = "ImageGCFailed";
/// Reason for a pass refused because the image filesystem reported no capacity.
const INVALID_DISK_CAPACITY: &str = "InvalidDiskCapacity";

impl From<GcError> for Status {
    fn from(error: GcError) -> Self {
        let (code, reason) = match &error {
            GcError::Plan(PlanError::InvalidDiskCapacity) => (Code::FailedPrecondition, INVALID_DISK_CAPACITY),
            // The runtime's own code: UNAVAILABLE when it cannot be reached, DEADLINE_EXCEEDED
            // past the request timeout, UNIMPLEMENTED from a runtime without the call.
            GcError::Runtime { source, .. } => (source.code(), IMAGE_GC_FAILED),
        };
        let details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, HashMap::new());
        Status::with_error_details(code, error.to_string(), details)
    }
}

impl From<BookError> for Status {
    fn from(error: BookError) -> Self {
        let (code, reason) = match &error {
            BookError::InvalidImage { .. } => (Code::InvalidArgument, "InvalidImageName"),
            BookError::PinTooLong(_) | BookError::DeadlinePassed | BookError::OtherCredentials { .. } => {
                (Code::InvalidArgument, INVALID_REQUEST)
            }
            BookError::Full => (Code::ResourceExhausted, "TooManyPrePulls"),
            BookError::NotFound(_) => (Code::NotFound, "PrePullNotFound"),
            BookError::Declared(_) => (Code::FailedPrecondition, "PrePullDeclared"),
        };
        let details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, HashMap::new());
        Status::with_error_details(code, error.to_string(), details)
    }
}

impl From<PrePullError> for Status {
    fn from(error: PrePullError) -> Self {
        match error {
            PrePullError::Refused(refused) => refused.into(),
            // Done, but a restart would undo it: asking again (the same pre-pull) writes it again.
            PrePullError::NotKept(_) => {
                let details = ErrorDetails::with_error_info("PrePullsNotKept", ERROR_DOMAIN, HashMap::new());
                Status::with_error_details(Code::Unavailable, error.to_string(), details)
            }
        }
    }
}

impl From<RequestError> for Status {
    fn from(error: RequestError) -> Self {
        let metadata = HashMap::from([("field".to_owned(), error.field().to_owned())]);
        let details = ErrorDetails::with_error_info(INVALID_REQUEST, ERROR_DOMAIN, metadata);
        Status::with_error_details(Code::InvalidArgument, error.to_string(), details)
    }
}

/// A CRI PullImage failure, answered as the runtime would answer it.
#[derive(Debug)]
pub struct CriPullError(pub Arc<PullError>);

impl From<CriPullError> for Status {
    fn from(CriPullError(error): CriPullError) -> Self {
        match &*error {
            // The runtime's own status, unchanged: code, message, details and metadata.
            PullError::Runtime(RuntimeError::Status(status)) => Status::with_details_and_metadata(
                status.code(),
                status.message(),
                status.details().to_vec().into(),
                status.metadata().clone(),
            ),
            PullError::Runtime(RuntimeError::Timeout(_)) | PullError::TimedOut(_) | PullError::Stalled { .. } => {
                Status::deadline_exceeded(error.to_string())
            }
            PullError::Runtime(
                RuntimeError::EmptyImageRef(_) | RuntimeError::ImageFs(_) | RuntimeError::NotRemoved(_),
            ) => Status::unknown(error.to_string()),
            PullError::Runtime(RuntimeError::Unsupported(_)) => Status::unimplemented(error.to_string()),
            PullError::RateLimited => Status::resource_exhausted(error.to_string()),
            // UNKNOWN, as a runtime's plain error: the kubelet's CRI client hands only such a
            // status's message to its prefix test, which then gives the pod `RegistryUnavailable`.
            PullError::RegistryUnavailable(_) => Status::unknown(error.to_string()),
            PullError::Abandoned => Status::internal(error.to_string()),
            PullError::Cancelled => Status::cancelled(error.to_string()),
            // UNKNOWN, as CRI-O answers it: the kubelet reads the prefix only of such a status.
            PullError::PolicyRejected(_) => Status::unknown(error.to_string()),
            PullError::EveryCredentialFailed(_) => Status::new(pull_error_code(&error), error.to_string()),
        }
    }
}

impl From<CallerDeadline> for Status {
    fn from(error: CallerDeadline) -> Self {
        let details = ErrorDetails::with_error_info(DEADLINE_EXCEEDED, ERROR_DOMAIN, HashMap::new());
        Status::with_error_details(Code::DeadlineExceeded, error.to_string(), details)
    }
}

impl From<BodyTimedOut> for Status {
    fn from(error: BodyTimedOut) -> Self {
        let details = ErrorDetails::with_error_info(DEADLINE_EXCEEDED, ERROR_DOMAIN, HashMap::new());
        Status::with_error_details(Code::DeadlineExceeded, error.to_string(), details)
    }
}

impl From<DrainDeadline> for Status {
    fn from(error: DrainDeadline) -> Self {
        let details = ErrorDetails::with_error_info(SHUTTING_DOWN, ERROR_DOMAIN, HashMap::new());
        Status::with_error_details(Code::Unavailable, error.to_string(), details)
    }
}

impl From<NoRequestMessage> for Status {
    fn from(error: NoRequestMessage) -> Self {
        let details = ErrorDetails::with_error_info(INVALID_REQUEST, ERROR_DOMAIN, HashMap::new());
        Status::with_error_details(Code::InvalidArgument, error.to_string(), details)
    }
}

impl From<StreamShutDown> for Status {
    fn from(error: StreamShutDown) -> Self {
        let details = ErrorDetails::with_error_info(SHUTTING_DOWN, ERROR_DOMAIN, HashMap::new());
        Status::with_error_details(Code::Unavailable, error.to_string(), details)
    }
}

/// Reason for a call the caller's role does not allow.
const ROLE_REQUIRED: &str = "RoleRequired";

impl From<Denied> for Status {
    /// PERMISSION_DENIED naming the role needed, in the message and as the `role` metadata.
    fn from(denied: Denied) -> Self {
        let metadata = HashMap::from([("role".to_owned(), denied.needed.as_str().to_owned())]);
        let details = ErrorDetails::with_error_info(ROLE_REQUIRED, ERROR_DOMAIN, metadata);
        Status::with_error_details(Code::PermissionDenied, denied.to_string(), details)
    }
}

/// One of each refusal the server makes itself (its types are its own), with when it is made
/// and its status, for the generated reference of reasons (`tests/docs_reference.rs`).
#[doc(hidden)]
pub fn server_refusals() -> Vec<(&'static str, Status)> {
    let time = std::time::Duration::from_secs(10);
    vec![
        ("a request field cannot be understood (named in the `field` metadata)", RequestError::NoImages.into()),
        ("WatchEvents was called without its request message", NoRequestMessage.into()),
        ("the caller's own deadline passed", CallerDeadline(time).into()),
        ("a request's body did not arrive within `--request-body-timeout`", BodyTimedOut(time).into()),
        ("the daemon's drain deadline passed while the request ran", DrainDeadline(time).into()),
        ("the daemon stopped while a stream (WatchEvents) was open", StreamShutDown.into()),
    ]
}

/// `WatchEvents` reaching the generated service, which never serves it ([`super::watch`] does).
pub fn watch_served_elsewhere() -> Status {
    Status::internal("WatchEvents is served by the watch route")
}

/// A garbage collection pass whose task ended without a report (it panicked or was cancelled).
pub fn gc_pass_stopped(error: &tokio::task::JoinError) -> Status {
    Status::internal(format!("the garbage collection pass stopped: {error}"))
}

fn ensure_error_code(error: &EnsureError) -> Code {
    match error {
        EnsureError::InvalidImageName { .. } | EnsureError::InvalidPullSecret { .. } => Code::InvalidArgument,
        EnsureError::NeverPull { .. } => Code::FailedPrecondition,
        EnsureError::ImageInspect { source: RuntimeError::Timeout(_), .. } => Code::DeadlineExceeded,
        EnsureError::ImageInspect { .. } | EnsureError::RegistryUnavailable { .. } | EnsureError::BackOff { .. } => {
            Code::Unavailable
        }
        EnsureError::SignatureValidationFailed { .. } => Code::PermissionDenied,
        EnsureError::RecordIntent { .. } => Code::Internal,
        EnsureError::Pull { source, .. } => pull_error_code(source),
    }
}

/// A failed pull's code for an EnsureImageExists caller.
fn pull_error_code(error: &PullError) -> Code {
    match error {
        // The runtime's code, where it tells the caller something it can act on.
        PullError::Runtime(runtime) => match runtime.code() {
            code @ (Code::NotFound | Code::Unauthenticated | Code::PermissionDenied) => code,
            _ => Code::Unknown,
        },
        PullError::RateLimited => Code::ResourceExhausted,
        PullError::RegistryUnavailable(_) => Code::Unavailable,
        PullError::TimedOut(_) | PullError::Stalled { .. } => Code::DeadlineExceeded,
        PullError::Abandoned => Code::Internal,
        PullError::Cancelled => Code::Cancelled,
        PullError::PolicyRejected(_) => Code::PermissionDenied,
        // One code when every attempt agrees on it.
        PullError::EveryCredentialFailed(failures) => {
            let mut codes = failures.iter().map(|failure| pull_error_code(failure));
            let first = codes.next().unwrap_or(Code::Unknown);
            if codes.all(|code| code == first) { first } else { Code::Unknown }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason_of(status: &Status) -> String {
        let details = status.get_error_details();
        details.error_info().expect("every status has an ErrorInfo").reason.clone()
    }

    #[test]
    fn a_pass_that_cannot_be_made_keeps_the_runtimes_code_and_names_why() {
        let unreachable = Status::from(GcError::Runtime {
            what: "list images",
            source: RuntimeError::from(Status::unavailable("connection refused")),
        });
        assert_eq!((unreachable.code(), reason_of(&unreachable).as_str()), (Code::Unavailable, "ImageGCFailed"));
        assert_eq!(
            unreachable.message(),
            "failed to list images: rpc error: code = Unavailable desc = connection refused"
        );
        let slow = Status::from(GcError::Runtime {
            what: "list containers",
            source: RuntimeError::Timeout(std::time::Duration::from_secs(120)),
        });
        assert_eq!(slow.code(), Code::DeadlineExceeded);
        let no_capacity = Status::from(GcError::Plan(PlanError::InvalidDiskCapacity));
        assert_eq!(
            (no_capacity.code(), reason_of(&no_capacity).as_str(), no_capacity.message()),
            (Code::FailedPrecondition, "InvalidDiskCapacity", "invalid capacity 0 on image filesystem")
        );
    }

    fn pull_error(code: Code) -> EnsureError {
        let source = std::sync::Arc::new(PullError::Runtime(RuntimeError::from(Status::new(code, "upstream"))));
        EnsureError::Pull { message: source.to_string(), source }
    }

    #[test]
    fn pull_errors_keep_only_the_runtime_codes_a_caller_can_act_on() {
        let cases = [
            (Code::NotFound, Code::NotFound),
            (Code::Unauthenticated, Code::Unauthenticated),
            (Code::PermissionDenied, Code::PermissionDenied),
            (Code::Internal, Code::Unknown),
            (Code::Unavailable, Code::Unknown),
            (Code::Unknown, Code::Unknown),
        ];
        for (runtime, expected) in cases {
            let status = Status::from(pull_error(runtime));
            assert_eq!(status.code(), expected, "runtime code {runtime:?}");
            assert_eq!(reason_of(&status), "ErrImagePull");
        }
    }

    #[test]
    fn rate_limited_timed_out_and_stalled_pulls_have_their_own_codes() {
        let stalled = PullError::Stalled {
            timeout: std::time::Duration::from_secs(30),
            bytes_done: 3 << 20,
            bytes_total: 8 << 20,
        };
        assert_eq!(
            stalled.to_string(),
            "image pull made no progress for 30s (--image-pull-progress-timeout) at 3.0 MiB of 8.0 MiB; the pull was cancelled"
        );
        let cases = [
            (PullError::RateLimited, Code::ResourceExhausted),
            (PullError::TimedOut(std::time::Duration::from_secs(1)), Code::DeadlineExceeded),
            (stalled, Code::DeadlineExceeded),
        ];
        for (error, code) in cases {
            let source = std::sync::Arc::new(error);
            let status = Status::from(EnsureError::Pull { message: source.to_string(), source });
            assert_eq!(status.code(), code);
            assert_eq!(reason_of(&status), "ErrImagePull");
        }
    }

    #[test]
    fn failed_credentials_keep_a_code_all_their_attempts_agree_on() {
        let failed = |codes: &[Code]| {
            let failures = codes.iter().map(|&code| {
                let status = Status::new(code, format!("{code:?} upstream"));
                std::sync::Arc::new(PullError::Runtime(RuntimeError::from(status)))
            });
            let source = PullError::every_credential_failed(failures.collect());
            Status::from(EnsureError::Pull { message: source.to_string(), source })
        };
        assert_eq!(failed(&[Code::Unauthenticated, Code::Unauthenticated]).code(), Code::Unauthenticated);
        assert_eq!(failed(&[Code::Unauthenticated, Code::NotFound]).code(), Code::Unknown);
        let status = failed(&[Code::NotFound, Code::PermissionDenied]);
        assert_eq!(reason_of(&status), "ErrImagePull");
        assert_eq!(
            status.message(),
            "[rpc error: code = NotFound desc = NotFound upstream, rpc error: code = PermissionDenied desc = PermissionDenied upstream]"
        );
    }

    #[test]
    fn an_unreadable_pull_secret_is_an_invalid_argument_with_the_pull_reason() {
        let source = crate::credentials::secrets::SecretError {
            namespace: "default".into(),
            name: "regcred".into(),
            data_key: ".dockerconfigjson",
            error: crate::credentials::dockercfg::DockerConfigError::NotAnObject,
        };
        let status = Status::from(EnsureError::InvalidPullSecret { source });
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(reason_of(&status), "ErrImagePull");
        assert_eq!(status.message(), "pull secret default/regcred: its .dockerconfigjson is not a JSON object");
    }

    #[test]
    fn back_off_is_unavailable_with_retry_info() {
        let retry_after = std::time::Duration::from_secs(17);
        let status = Status::from(EnsureError::BackOff { message: "Back-off pulling image".into(), retry_after });
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(reason_of(&status), "ImagePullBackOff");
        let details = status.get_error_details();
        assert_eq!(details.retry_info().and_then(|info| info.retry_delay), Some(retry_after));
    }

    #[test]
    fn calls_the_daemon_does_not_serve_and_a_stopped_pass_are_answered_plainly() {
        let watch = watch_served_elsewhere();
        assert_eq!((watch.code(), watch.message()), (Code::Internal, "WatchEvents is served by the watch route"));
        assert!(watch.get_error_details().error_info().is_none());
    }

    #[test]
    fn a_refused_call_is_permission_denied_naming_the_role_it_needs() {
        let denied = Denied {
            method: "ClearBackoff",
            needed: crate::access::Role::Admin,
            caller: Some(crate::access::Caller { uid: 1000, gid: 1000, pid: Some(7), groups: vec![997] }),
            held: Some(crate::access::Role::Pull),
        };
        let status = Status::from(denied);
        assert_eq!(status.code(), Code::PermissionDenied);
        assert_eq!(
            status.message(),
            "ClearBackoff needs the admin role; uid 1000 (gid 1000, groups 997) has pull (--role and --default-role say who has which)"
        );
        let info = status.get_error_details().error_info().cloned().expect("an ErrorInfo");
        assert_eq!(
            (info.reason.as_str(), info.metadata.get("role").map(String::as_str)),
            ("RoleRequired", Some("admin"))
        );
    }

    #[test]
    fn never_pull_is_a_failed_precondition_with_the_kubelet_reason_and_message() {
        let message = crate::messages::never_pull("busybox");
        let status = Status::from(EnsureError::NeverPull { message: message.clone() });
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(status.message(), message);
        assert_eq!(reason_of(&status), "ErrImageNeverPull");
        let details = status.get_error_details();
        assert_eq!(details.error_info().map(|info| info.domain.as_str()), Some(ERROR_DOMAIN));
    }
}
