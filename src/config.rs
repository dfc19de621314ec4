//! Command line and config file: every flag with its meaning, unit and default; the file
//! ([`file`](mod@file)) has a field for each, and a flag given on the command line wins over it.
//!
//! - [`cli`]: the commands, the defaults, and clap's errors in the daemon's style.
//! - [`client`]: the flags of the commands for people (`pull`, `images`, `top`, …).
//! - [`serve`]: `serve`'s flags, and the ones a reload applies ([`RELOADABLE`]).
//! - [`value`]: the flags' value parsers, each saying what its flag accepts.
//! - [`access`](mod@access): `--role` and `--default-role`, names looked up at start.
//! - [`build`]: each part's config built from the flags, and [`ConfigError`] for flags that do
//!   not go together.
//! - [`file`](mod@file): the config file, a field per flag.
//! - `load`: the command line read with its file, and what changed between two reads.
//! - [`policy`](mod@policy): the image policy's files (`--signature-policy`, its per-namespace
//!   directory), read as hostile input.

pub mod access;
pub mod build;
pub mod cli;
pub mod client;
pub mod file;
mod help;
mod load;
mod modes;
pub mod policy;
pub mod serve;
pub mod value;

pub use self::{
    access::{DefaultRoleArg, RoleArg, parse_role},
    build::{ConfigError, NodeCredentialsError},
    cli::{
        Cli, Command, DEFAULT_LISTEN, DEFAULT_MAX_CONNECTIONS, DEFAULT_ROOT_DIR, DEFAULT_RUNTIME_ENDPOINT, usage_error,
    },
    load::{Change, LoadError, Loaded, Values, load},
    modes::{PolicyModeArg, RateLimitModeArg},
    policy::PolicyLoadError,
    serve::{RELOADABLE, ServeArgs},
    value::{
        MOST_CONNECTIONS, ValueError, parse_allowlist_entry, parse_at_least_one, parse_burst, parse_connection_count,
        parse_duration, parse_duration_or_zero, parse_go_duration, parse_host_limit, parse_listen_address,
        parse_path_or_empty, parse_percent, parse_positive_qps, parse_qps, parse_runtime_endpoint, parse_stream_count,
    },
};

#[cfg(test)]
mod tests;
