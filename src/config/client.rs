//! The commands for people at a terminal (`pull`, `images`, `status`, `events`, `gc`, `backoff`,
//! `policy`, `prepull`, `top`, `completion`): their flags only; the `cli` module runs them.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Subcommand, ValueEnum};

use super::{DEFAULT_LISTEN, parse_duration};

/// Which daemon to ask, and how long to wait for it.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// The daemon's socket: the path `serve --listen` took, or unix:///path. Node agents may be
    /// given a socket of their own (e.g. /run/cri-imaged/agents.sock).
    #[arg(long, value_name = "PATH", env = "CRI_IMAGED_SOCKET", default_value = DEFAULT_LISTEN, value_parser = parse_socket)]
    pub socket: PathBuf,

    /// How long to wait for the daemon to accept the connection and for each answer other than a
    /// pull's (a pull waits as long as it takes; Ctrl-C leaves it).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// How a command prints what it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// For people: bars and tables on a terminal, plain lines otherwise.
    Text,
    /// Tables without any column cut to the terminal's width.
    Wide,
    /// One JSON object per line, for scripts.
    Json,
}

/// The output flag every listing command takes.
#[derive(Debug, Clone, Args)]
pub struct Format {
    /// text, wide (no column cut to fit the terminal) or json (one object per line).
    #[arg(long, short = 'o', value_name = "FORMAT", value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// The commands that talk to a running daemon.
#[derive(Debug, Clone, Subcommand)]
pub enum ClientCommand {
    /// Make sure an image is on the node as a pod's container would (EnsureImageExists), with
    /// progress: each layer's bytes, rate and time left, and what the pull waits for.
    Pull(PullArgs),
    /// The node's images as image GC sees them: size, age, last use, pinned, in use, and the
    /// image policy each was verified under.
    Images(ImagesArgs),
    /// What the daemon is doing: pulls under way and queued, backoffs, registries and their rate
    /// limits, image GC, the runtime's health.
    Status(StatusArgs),
    /// The node's image events, in the kubelet's reasons: the recent ones, or as they happen.
    Events(EventsArgs),
    /// Run image GC now, or see with --dry-run what it would remove and why each image stays.
    Gc(GcArgs),
    /// The pods whose pulls of an image are backing off, or clear one (or all) of them.
    Backoff(BackoffArgs),
    /// The node's image policy: what it decides for an image, and why.
    Policy(PolicyArgs),
    /// Pre-pull images: fetched ahead of need, behind pods' pulls, kept across restarts
    /// (SubmitPrePull); without IMAGE, the pre-pulls and how far each got.
    Prepull(PrePullArgs),
    /// A live full-screen view: pulls with progress, the queue, backoffs, disk against the GC
    /// thresholds, recent events. Keys: q quits, / filters by image, p pauses.
    Top(TopArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion(CompletionArgs),
    /// Write the man pages into DIR (used to build the package).
    #[command(hide = true)]
    GenerateMan(ManArgs),
}

pub use super::help::EXIT_STATUS_HELP;
use super::help::{BACKOFF_HELP, GC_HELP, IMAGES_HELP, PREPULL_HELP, STATUS_HELP};

#[derive(Debug, Clone, Args)]
#[command(after_help = EXIT_STATUS_HELP)]
pub struct PullArgs {
    /// The image, as a pod would name it (the default tag is applied).
    #[arg(value_name = "IMAGE")]
    pub image: String,

    /// The pod the pull is for, NAMESPACE/NAME: its events and backoff are the pod's.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub pod: Option<String>,

    /// The pod's uid; with it, a failed pull backs off for this pod as the kubelet's would.
    #[arg(long, value_name = "UID")]
    pub pod_uid: Option<String>,

    /// The container's imagePullPolicy; unset, defaulted as Kubernetes defaults it (Always for
    /// :latest or no tag, else IfNotPresent).
    #[arg(long, value_name = "POLICY", value_enum)]
    pub policy: Option<PolicyArg>,

    /// A pull secret: a Kubernetes Secret (YAML or JSON, as `kubectl get secret -o yaml` prints
    /// it), a docker config.json, or a .dockercfg. Repeatable.
    #[arg(long, value_name = "FILE")]
    pub secret: Vec<PathBuf>,

    /// The pod's runtime handler (its RuntimeClass's); empty for the default.
    #[arg(long, value_name = "HANDLER", default_value = "")]
    pub runtime_handler: String,

    #[command(flatten)]
    pub format: Format,

    #[command(flatten)]
    pub connection: Connection,
}

/// imagePullPolicy, as a pod spec writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    #[value(name = "Always", alias = "always")]
    Always,
    #[value(name = "IfNotPresent", alias = "if-not-present")]
    IfNotPresent,
    #[value(name = "Never", alias = "never")]
    Never,
}

#[derive(Debug, Clone, Args)]
#[command(after_help = EXIT_STATUS_HELP, after_long_help = IMAGES_HELP)]
pub struct ImagesArgs {
    /// Only images whose name contains this.
    #[arg(value_name = "FILTER")]
    pub filter: Option<String>,

    #[command(flatten)]
    pub format: Format,

    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, Args)]
#[command(after_help = EXIT_STATUS_HELP, after_long_help = STATUS_HELP)]
pub struct StatusArgs {
    /// With --image: whether this pod's pulls of the image are backing off.
    #[arg(long, value_name = "UID", requires = "image")]
    pub pod_uid: Option<String>,

    /// With --pod-uid: the image as the pod wrote it.
    #[arg(long, value_name = "IMAGE", requires = "pod_uid")]
    pub image: Option<String>,

    #[command(flatten)]
    pub format: Format,

    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, Args)]
#[command(after_help = EXIT_STATUS_HELP)]
pub struct EventsArgs {
    /// Keep printing events as they happen (after the recent ones).
    #[arg(long, short = 'f')]
    pub follow: bool,

    /// Only events about this image (as written, or its normalised name).
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,

    /// Only events about this pod.
    #[arg(long, value_name = "UID")]
    pub pod_uid: Option<String>,

    /// Only events about pods of this namespace.
    #[arg(long, short = 'n', value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// How many of the recent events to print first (0: every one kept).
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub limit: u32,

    /// With --follow, print each pull's progress events too.
    #[arg(long)]
    pub progress: bool,

    #[command(flatten)]
    pub format: Format,

    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, Args)]
#[command(after_help = EXIT_STATUS_HELP, after_long_help = GC_HELP)]
pub struct GcArgs {
    /// Say what a pass would remove, and why each other image stays; remove nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Remove every unused image old enough, whatever the disk's usage (the kubelet's
    /// DeleteUnusedImages).
    #[arg(long)]
    pub delete_unused: bool,

    #[command(flatten)]
    pub format: Format,

    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, Args)]
#[command(after_help = EXIT_STATUS_HELP, after_long_help = BACKOFF_HELP, args_conflicts_with_subcommands = true)]
pub struct BackoffArgs {
    #[command(subcommand)]
    pub action: Option<BackoffAction>,

    #[command(flatten)]
    pub format: Format,

    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, Subcommand)]
pub enum BackoffAction {
    /// Forget a pod's backoff for an image, or every backoff (--all): their pulls are tried at
    /// once.
    Clear(BackoffClearArgs),
}

#[derive(Debug, Clone, Args)]
#[command(
    after_help = EXIT_STATUS_HELP,
    // Both ways in the usage a refused command line prints, not only the pair's.
    override_usage = "cri-imaged backoff clear [OPTIONS] <POD_UID> <IMAGE>\n       cri-imaged backoff clear [OPTIONS] --all"
)]
pub struct BackoffClearArgs {
    /// The pod's uid, as `cri-imaged backoff` lists it.
    #[arg(value_name = "POD_UID", required_unless_present = "all", conflicts_with = "all")]
    pub pod_uid: Option<String>,

    /// The image as the pod wrote it.
    #[arg(value_name = "IMAGE", required_unless_present = "all")]
    pub image: Option<String>,

    /// The pod's runtime handler; empty for the default.
    #[arg(long, value_name = "HANDLER", default_value = "")]
    pub runtime_handler: String,

    /// Every backoff on the node.
    #[arg(long)]
    pub all: bool,

    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    #[command(subcommand)]
    pub action: PolicyAction,
}

#[derive(Debug, Clone, Subcommand)]
pub enum PolicyAction {
    /// What the policy in force decides for IMAGE and a namespace's pods, as a pull would, without
    /// pulling: the policy and scope, their requirements, and for a signature the digest and the
    /// key that verified it, or why none did. Exit status 0 when the image is let in (in audit
    /// mode, also when the policy refuses it), 1 when it is refused.
    Check(PolicyCheckArgs),
}

#[derive(Debug, Clone, Args)]
#[command(after_help = EXIT_STATUS_HELP)]
pub struct PolicyCheckArgs {
    /// The image, as a pod would name it (the default tag is applied).
    #[arg(value_name = "IMAGE")]
    pub image: String,

    /// The pod's namespace: its own policy file if it has one; unset, the node's policy.
    #[arg(long, short = 'n', value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// A pull secret to read the signatures with, as the pod's: a Kubernetes Secret (YAML or
    /// JSON), a docker config.json, or a .dockercfg. Repeatable.
    #[arg(long, value_name = "FILE")]
    pub secret: Vec<PathBuf>,

    #[command(flatten)]
    pub format: Format,

    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, Args)]
#[command(after_help = EXIT_STATUS_HELP, after_long_help = PREPULL_HELP)]
pub struct PrePullArgs {
    /// The images, as a pod would name them (the default tag is applied); none: list the
    /// pre-pulls.
    #[arg(value_name = "IMAGE")]
    pub images: Vec<String>,

    /// The namespace whose pods the images are for: its image policy admits them (its own
    /// policy file, its audit mode); unset, the node's policy. Listing: only its pre-pulls.
    #[arg(long, short = 'n', value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// Higher goes first among pre-pulls (never before a pod's pull).
    #[arg(long, value_name = "N", default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,

    /// Fail a pre-pull (DeadlineExceeded) not done within this; unset, no limit.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub pull_timeout: Option<Duration>,

    /// Once done, keep the image from image GC this long (30 days at most).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub pin_for: Option<Duration>,

    /// The runtime handler (a RuntimeClass's) to pull for; empty for the default.
    #[arg(long, value_name = "HANDLER", default_value = "")]
    pub runtime_handler: String,

    /// A pull secret: a Kubernetes Secret (YAML or JSON), a docker config.json, or a
    /// .dockercfg; kept by the daemon in memory only. Repeatable.
    #[arg(long, value_name = "FILE")]
    pub secret: Vec<PathBuf>,

    #[command(flatten)]
    pub format: Format,

    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, Args)]
#[command(after_help = EXIT_STATUS_HELP)]
pub struct TopArgs {
    /// How often to ask for the daemon's status.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,

    /// Only pulls, backoffs and events whose image contains this (/ changes it).
    #[arg(long, value_name = "TEXT")]
    pub filter: Option<String>,

    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, Args)]
pub struct CompletionArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_name = "SHELL", value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Clone, Args)]
pub struct ManArgs {
    /// Where to write cri-imaged.1 and a page per command.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,

    /// The pages' date, YYYY-MM-DD (for reproducible packages); unset, none.
    #[arg(long, value_name = "DATE")]
    pub date: Option<String>,
}

/// A socket as `--socket` takes it: a path, or unix:///path as the kubelet writes endpoints.
fn parse_socket(value: &str) -> Result<PathBuf, String> {
    let path = value.strip_prefix("unix://").unwrap_or(value);
    if path.is_empty() {
        return Err("expected a socket path or unix:///path".to_owned());
    }
    Ok(PathBuf::from(path))
}
