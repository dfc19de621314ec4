//! `docs/reference/reasons.md`: the error reasons and gRPC codes callers get. One error of each
//! kind (and each pull failure) is made and turned into its status by the daemon's own mapping
//! (`src/server/status.rs`), which gives the reason, the code and the message; the CLI's exit
//! status is its own mapping of that status. What each error means is said by an exhaustive
//! `match` below, so that a new kind of error does not compile until the page says when it happens.
//! The events' reasons are constants, read with their comments from `src/events.rs`.

use std::{path::Path, sync::Arc, time::Duration};

use cri_imaged::{
    access::{Caller, Denied, Role},
    cli::CliError,
    credentials::{dockercfg::DockerConfigError, secrets::SecretError},
    ensure::{EnsureError, classify_pull_error},
    gc::{GcError, plan::PlanError},
    messages,
    prepull::{PrePullError, book::BookError, store::StoreError},
    pull::PullError,
    records::RecordsError,
    reference::ImageReference,
    runtime::RuntimeError,
    server::{CriPullError, server_refusals},
};
use tonic::{Code, Status};
use tonic_types::StatusExt;

use super::markdown::{cell, code, opening, row, table_head};

const IMAGE: &str = "registry.example/app:1.0";

pub fn page() -> String {
    let mut page =
        opening("Error reasons", "the error-to-status mapping in `src/server/status.rs` and the errors it maps");
    let domain = Status::from(never_pull()).get_details_error_info().map(|info| info.domain).unwrap_or_default();
    page.push_str(&format!(
        "A call of cri-imaged's API (`imagemanager.v1`) that fails answers a gRPC status whose details \
         hold a `google.rpc.ErrorInfo` with domain {} and a `reason`: for EnsureImageExists, the reason \
         the kubelet gives a container waiting for its image, so a caller can branch on it as on the \
         kubelet's. The *CLI exit* column is the exit status of a `cri-imaged` command that gets the \
         status (see [Command-line flags](flags.md)). Messages are examples.\n",
        code(&domain)
    ));

    page.push_str("\n## EnsureImageExists\n\n");
    page.push_str(&table_head(&["reason", "code", "CLI exit", "when", "message"]));
    for error in ensure_errors() {
        let when = ensure_when(&error);
        page.push_str(&status_row(Status::from(error), &when));
    }

    page.push_str("\n## Pre-pulls, image GC and roles\n\n");
    page.push_str(&table_head(&["reason", "code", "CLI exit", "when", "message"]));
    for error in book_errors() {
        let when = book_when(&error);
        page.push_str(&status_row(Status::from(error), when));
    }
    let not_kept = PrePullError::NotKept(StoreError::Interrupted("the disk is full".to_owned()));
    page.push_str(&status_row(Status::from(not_kept), "a pre-pull was asked for or cancelled, but that could not be written down under `--root-dir` (a restart would undo it; asking again writes it again)"));
    for error in gc_errors() {
        let when = gc_when(&error);
        page.push_str(&status_row(Status::from(error), &when));
    }
    let denied = Denied {
        method: "ClearBackoff",
        needed: Role::Admin,
        caller: Some(Caller { uid: 1000, gid: 1000, pid: Some(7), groups: vec![] }),
        held: Some(Role::Pull),
    };
    page.push_str(&status_row(
        Status::from(denied),
        "the caller's role does not allow the call (`--role`, `--default-role`); the role needed is the `role` metadata",
    ));

    page.push_str("\n## Any call\n\n");
    page.push_str(&table_head(&["reason", "code", "CLI exit", "when", "message"]));
    for (when, status) in server_refusals() {
        page.push_str(&status_row(status, when));
    }

    page.push_str(
        "\n## CRI PullImage\n\n\
         The kubelet pulling through the CRI (`runtime.v1.ImageService`) gets a failed pull as the runtime \
         would answer it: no ErrorInfo, the runtime's own status passed on unchanged. The kubelet gives \
         the pod `RegistryUnavailable` or `SignatureValidationFailed` when the message of an UNKNOWN status \
         starts with that word, else `ErrImagePull`.\n\n",
    );
    page.push_str(&table_head(&["pull failure", "code", "message"]));
    for error in pull_errors() {
        let when = pull_when(&error);
        let status = Status::from(CriPullError(error));
        page.push_str(&row(&[cell(&when), code_name(status.code()), cell(status.message())]));
    }

    page.push_str(
        "\n## Event reasons\n\n\
         The node's image events (WatchEvents, ListEvents, `cri-imaged events`) carry a reason: the \
         kubelet's for what the kubelet reports, with its words; cri-imaged's own for the rest.\n\n",
    );
    page.push_str(&table_head(&["reason", "meaning"]));
    for (reason, doc) in event_reasons() {
        // The kubelet's own reasons carry no comment in the code: they mean what they mean there.
        let meaning = if doc.is_empty() { "The kubelet's.".to_owned() } else { doc };
        page.push_str(&row(&[code(&reason), cell(&meaning)]));
    }
    page
}

/// The event reasons and their doc comments, read from `pub mod reason` in `src/events.rs`:
/// constants, which the compiled crate cannot list.
fn event_reasons() -> Vec<(String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/events.rs");
    let source = std::fs::read_to_string(path).expect("src/events.rs");
    let start = source.find("\npub mod reason {").expect("`pub mod reason` in src/events.rs");
    let block = &source[start..];
    let block = &block[..block.find("\n}").expect("the end of `pub mod reason`")];
    let (mut reasons, mut doc) = (Vec::new(), Vec::new());
    for line in block.lines().map(str::trim) {
        if let Some(text) = line.strip_prefix("///") {
            doc.push(text.trim().to_owned());
        } else if let Some(constant) = line.strip_prefix("pub const ") {
            let value = constant.split('"').nth(1).expect("pub const NAME: &str = \"Value\";");
            reasons.push((value.to_owned(), doc.join(" ")));
            doc.clear();
        }
    }
    assert!(!reasons.is_empty(), "no event reason read from {path}");
    reasons
}

/// A row of reason, code, the CLI's exit status, when, and the message.
fn status_row(status: Status, when: &str) -> String {
    let reason = status.get_details_error_info().map(|info| info.reason).unwrap_or_default();
    let exit = CliError::from_status(&status, Path::new("/run/cri-imaged/cri-imaged.sock"), "EnsureImageExists").exit();
    row(&[code(&reason), code_name(status.code()), (exit as u8).to_string(), cell(when), cell(status.message())])
}

/// A code as gRPC names it: `INVALID_ARGUMENT`.
fn code_name(code: Code) -> String {
    let mut name = String::new();
    for (index, c) in format!("{code:?}").chars().enumerate() {
        if c.is_uppercase() && index > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

fn runtime_status(code: Code, message: &str) -> PullError {
    PullError::Runtime(RuntimeError::Status(Status::new(code, message)))
}

/// Each way a pull fails, as the pull path reports it.
fn pull_errors() -> Vec<Arc<PullError>> {
    let errors = vec![
        runtime_status(Code::NotFound, "failed to resolve reference: registry.example/app:1.0: not found"),
        runtime_status(Code::Unauthenticated, "pull access denied"),
        runtime_status(Code::PermissionDenied, "pull access denied"),
        runtime_status(Code::Unknown, "failed to pull and unpack image: unexpected EOF"),
        runtime_status(Code::Unknown, "RegistryUnavailable: dial tcp 10.0.0.1:443: connect: connection refused"),
        runtime_status(Code::Unknown, "SignatureValidationFailed: no signature"),
        PullError::Runtime(RuntimeError::EmptyImageRef(IMAGE.to_owned())),
        PullError::RegistryUnavailable("no answer within 20s (--registry-resolve-timeout)".to_owned()),
        PullError::RateLimited,
        PullError::TimedOut(Duration::from_secs(600)),
        PullError::Stalled { timeout: Duration::from_secs(300), bytes_done: 3 << 20, bytes_total: 8 << 20 },
        PullError::Cancelled,
        PullError::Abandoned,
        PullError::EveryCredentialFailed(vec![
            Arc::new(runtime_status(Code::Unauthenticated, "pull access denied")),
            Arc::new(runtime_status(Code::NotFound, "not found")),
        ]),
        PullError::PolicyRejected("no signature of registry.example/app met the policy".to_owned()),
    ];
    errors.into_iter().map(Arc::new).collect()
}

fn pull_when(error: &PullError) -> String {
    match error {
        PullError::Runtime(runtime) => runtime_when(runtime),
        PullError::RateLimited => "the registry's rate limit (`--registry-qps`, `--registry-burst`) refused the pull".into(),
        PullError::TimedOut(_) => "`--image-pull-timeout` ran out; the pull was cancelled".into(),
        PullError::Stalled { .. } => "the pull downloaded nothing for `--image-pull-progress-timeout`; it was cancelled".into(),
        PullError::RegistryUnavailable(_) => {
            "the registry could not be reached, did not answer within `--registry-resolve-timeout`, or its breaker is open".into()
        }
        PullError::Abandoned => "the task running the pull ended without a result".into(),
        PullError::Cancelled => "every caller went away before the pull ended; it was cancelled".into(),
        PullError::EveryCredentialFailed(_) => {
            "each of the pod's credentials was tried and each pull failed: the code they all agree on, else UNKNOWN".into()
        }
        PullError::PolicyRejected(_) => "the node's image policy does not let the image in; nothing was pulled".into(),
    }
}

fn runtime_when(error: &RuntimeError) -> String {
    match error {
        RuntimeError::Status(status) => {
            let message = status.message();
            if let Some((prefix, _)) = message.split_once(':').filter(|(prefix, _)| {
                [messages::waiting_reason::REGISTRY_UNAVAILABLE, messages::waiting_reason::SIGNATURE_VALIDATION_FAILED]
                    .contains(prefix)
            }) {
                return format!("the runtime's message starts with `{prefix}`");
            }
            match status.code() {
                code @ (Code::NotFound | Code::Unauthenticated | Code::PermissionDenied) => {
                    format!("the runtime's pull failed with {}", code_name(code))
                }
                _ => "the runtime's pull failed with any other code (containerd's usual UNKNOWN)".into(),
            }
        }
        RuntimeError::Timeout(_) => "the runtime did not answer within `--runtime-request-timeout`".into(),
        RuntimeError::EmptyImageRef(_) => "the runtime reported success for the pull but named no image".into(),
        RuntimeError::ImageFs(_) => {
            "the runtime reported no image filesystem, or one whose usage cannot be read".into()
        }
        RuntimeError::Unsupported(_) => "the runtime does not have the call".into(),
        RuntimeError::NotRemoved(_) => "the runtime answered a removal but still has the image".into(),
    }
}

fn never_pull() -> EnsureError {
    EnsureError::NeverPull { message: messages::never_pull(IMAGE) }
}

/// Each kind of EnsureImageExists failure, a pull's as the pull path classifies it.
fn ensure_errors() -> Vec<EnsureError> {
    let bad_name = "registry.example/App";
    let parse_error = ImageReference::parse_normalized(bad_name).expect_err("an image name that is not lowercase");
    let inspect =
        |source: RuntimeError| EnsureError::ImageInspect { message: messages::inspect_failed(IMAGE, &source), source };
    let records = RecordsError::Writer("the disk is full".to_owned());
    let mut errors = vec![
        EnsureError::InvalidImageName {
            message: messages::invalid_image_name(bad_name, &parse_error),
            source: parse_error,
        },
        inspect(RuntimeError::Status(Status::unavailable("connection refused"))),
        inspect(RuntimeError::Timeout(Duration::from_secs(120))),
        never_pull(),
        EnsureError::InvalidPullSecret {
            source: SecretError {
                namespace: "default".to_owned(),
                name: "regcred".to_owned(),
                data_key: ".dockerconfigjson",
                error: DockerConfigError::NotAnObject,
            },
        },
        EnsureError::BackOff {
            message: messages::back_off(IMAGE, "ErrImagePull: pull access denied"),
            retry_after: Duration::from_secs(20),
        },
        EnsureError::RecordIntent {
            message: format!("Failed to record image pull intent for container image {IMAGE:?}: {records}"),
            source: records,
        },
    ];
    errors.extend(pull_errors().into_iter().map(|error| classify_pull_error(IMAGE, error)));
    errors
}

fn ensure_when(error: &EnsureError) -> String {
    match error {
        EnsureError::InvalidImageName { .. } => "the image is not a valid reference".into(),
        EnsureError::ImageInspect { source: RuntimeError::Timeout(_), .. } => {
            "the runtime's ImageStatus did not answer within `--runtime-request-timeout`".into()
        }
        EnsureError::ImageInspect { .. } => "the runtime's ImageStatus failed (the runtime is down, say)".into(),
        EnsureError::NeverPull { .. } => "the image is absent and the pull policy is Never".into(),
        EnsureError::InvalidPullSecret { .. } => {
            "a pull secret does not parse (read only when a pull is needed, or a pull record is checked against it); its content is never shown".into()
        }
        EnsureError::BackOff { .. } => {
            "the pod's last pull of the image failed and its backoff has not ended; the details hold a RetryInfo".into()
        }
        EnsureError::Pull { source, .. }
        | EnsureError::RegistryUnavailable { source, .. }
        | EnsureError::SignatureValidationFailed { source, .. } => pull_when(source),
        EnsureError::RecordIntent { .. } => {
            "the pull's intent could not be written under `--root-dir`; nothing was pulled".into()
        }
    }
}

fn book_errors() -> Vec<BookError> {
    vec![
        BookError::InvalidImage { image: "App".to_owned(), reason: "repository name must be lowercase".to_owned() },
        BookError::PinTooLong(Duration::from_secs(40 * 24 * 3600)),
        BookError::DeadlinePassed,
        BookError::OtherCredentials { image: IMAGE.to_owned(), id: "0123456789abcdef".to_owned() },
        BookError::Full,
        BookError::NotFound("0123456789abcdef".to_owned()),
        BookError::Declared("0123456789abcdef".to_owned()),
    ]
}

fn book_when(error: &BookError) -> &'static str {
    match error {
        BookError::InvalidImage { .. } => "a pre-pull's image is not a valid reference",
        BookError::PinTooLong(_) => "a pre-pull's `pin_for` is longer than the longest pin",
        BookError::DeadlinePassed => "a pre-pull's deadline has passed already",
        BookError::OtherCredentials { .. } => "the image is being pre-pulled with other credentials",
        BookError::Full => "as many pre-pulls as may be are queued, pulling, held or pinned",
        BookError::NotFound(_) => "CancelPrePull names no pre-pull",
        BookError::Declared(_) => "CancelPrePull names a pre-pull declared by `--pre-pull`",
    }
}

fn gc_errors() -> Vec<GcError> {
    vec![
        GcError::Runtime {
            what: "list images",
            source: RuntimeError::Status(Status::unavailable("connection refused")),
        },
        GcError::Runtime { what: "list containers", source: RuntimeError::Timeout(Duration::from_secs(120)) },
        GcError::Plan(PlanError::InvalidDiskCapacity),
    ]
}

fn gc_when(error: &GcError) -> String {
    match error {
        GcError::Runtime { source: RuntimeError::Timeout(_), .. } => {
            "GarbageCollect: the runtime did not answer within `--runtime-request-timeout` while listing images or \
             containers or reporting its image filesystem"
                .into()
        }
        GcError::Runtime { .. } => {
            "GarbageCollect: the runtime could not list images or containers or report its image \
                                    filesystem; the code is the runtime's (UNAVAILABLE when it cannot be reached)"
                .into()
        }
        GcError::Plan(PlanError::InvalidDiskCapacity) => {
            "GarbageCollect: the runtime reports an image filesystem of capacity 0".into()
        }
    }
}
