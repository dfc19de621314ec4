//! Reading the command line with the config file it names, and what changed between two reads
//! (for a reload).

use std::{collections::BTreeMap, ffi::OsString, path::PathBuf};

use clap::{ArgMatches, CommandFactory, FromArgMatches, parser::ValueSource};

use super::{Cli, file};
use crate::duration;

/// The command line as given and the config file it names, read together.
#[derive(Debug)]
pub struct Loaded {
    pub cli: Cli,
    /// Every `serve` flag's value as it took effect, for what a reload changes.
    pub values: Values,
}

/// Why the command line and its config file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A flag clap refused (or `--help`, `--version`: see [`super::usage_error`]).
    #[error("{}", .0.render().to_string().trim_start_matches("error: ").lines().next().unwrap_or_default())]
    Usage(clap::Error),
    #[error(transparent)]
    File(#[from] file::FileError),
}

/// Parses `argv` (the program's name first) with the config file its `--config` names: a flag on
/// the command line wins over the file, the file over the default. Read at start and again on
/// every reload.
pub fn load(argv: &[OsString]) -> Result<Loaded, LoadError> {
    let command = Cli::command();
    let given = command.clone().try_get_matches_from(argv).map_err(LoadError::Usage)?;
    let mut argv = argv.to_vec();
    let mut origins = file::Origins::default();
    if let Some((serve, given)) = serve_parts(&command, &given)
        && let Some(path) = given.get_one::<PathBuf>("config")
    {
        let on_command_line =
            |arg: &clap::Arg| given.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine);
        let (args, from_file) = file::read(path, serve, on_command_line)?;
        argv.extend(args);
        origins = from_file;
    }
    let matches = command.clone().try_get_matches_from(&argv).map_err(LoadError::Usage)?;
    let mut cli = Cli::from_arg_matches(&matches).map_err(LoadError::Usage)?;
    if let super::Command::Serve(serve) = &mut cli.command {
        serve.origins = origins;
    }
    let values = serve_parts(&command, &matches).map(|(serve, matches)| Values::of(serve, matches)).unwrap_or_default();
    Ok(Loaded { cli, values })
}

/// The `serve` subcommand and its matches; `None` for the other commands, which have no config
/// file.
fn serve_parts<'a>(command: &'a clap::Command, matches: &'a ArgMatches) -> Option<(&'a clap::Command, &'a ArgMatches)> {
    let matches = matches.subcommand_matches(SERVE)?;
    Some((command.find_subcommand(SERVE)?, matches))
}

const SERVE: &str = "serve";

/// Each `serve` flag (by its long name) and the values it took, defaults included.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Values(BTreeMap<String, Vec<String>>);

/// A value as it means, so that `5m` and `300s`, or `5` and `5.0`, are no change. Go's syntax
/// covers every duration a flag takes.
fn canonical(value: &str) -> String {
    match (duration::parse_go(value).ok(), value.parse::<f64>()) {
        (Some(duration), _) => format!("{}ns", duration.as_nanos()),
        (None, Ok(number)) => number.to_string(),
        (None, Err(_)) => value.to_owned(),
    }
}

/// A flag whose value differs between two loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub flag: String,
    pub from: String,
    pub to: String,
}

impl Values {
    fn of(serve: &clap::Command, matches: &ArgMatches) -> Self {
        let flags = serve.get_arguments().filter_map(|arg| {
            let long = arg.get_long().filter(|long| *long != file::CONFIG_FIELD)?;
            let raw = matches.get_raw(arg.get_id().as_str()).into_iter().flatten();
            Some((long.to_owned(), raw.map(|value| value.to_string_lossy().into_owned()).collect()))
        });
        Self(flags.collect())
    }

    /// The flags whose values differ in `other`, by name.
    pub fn changes(&self, other: &Self) -> Vec<Change> {
        let shown = |values: Option<&Vec<String>>| match values {
            Some(values) if !values.is_empty() => values.join(", "),
            _ => "unset".to_owned(),
        };
        let meaning = |values: Option<&Vec<String>>| {
            values.map(|values| values.iter().map(|value| canonical(value)).collect::<Vec<_>>())
        };
        let flags: std::collections::BTreeSet<&String> = self.0.keys().chain(other.0.keys()).collect();
        flags
            .into_iter()
            .filter(|flag| meaning(self.0.get(*flag)) != meaning(other.0.get(*flag)))
            .map(|flag| Change { flag: flag.clone(), from: shown(self.0.get(flag)), to: shown(other.0.get(flag)) })
            .collect()
    }

    /// These values with `flag` as it is in `other`.
    pub fn take(&mut self, flag: &str, other: &Self) {
        match other.0.get(flag) {
            Some(values) => self.0.insert(flag.to_owned(), values.clone()),
            None => self.0.remove(flag),
        };
    }

    /// Whether `flag` is a `serve` flag.
    pub fn knows(&self, flag: &str) -> bool {
        self.0.contains_key(flag)
    }
}
