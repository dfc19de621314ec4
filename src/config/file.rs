//! The config file (`--config FILE`): YAML, one field per `serve` flag, named as the flag without
//! its dashes and holding what the flag takes (`registry-qps: 5`, `image-pull-backoff-max: 5m`;
//! a repeatable flag takes a list). Each value is checked by its flag's own parser, so the file
//! and the command line accept and refuse the same things; an error names the file, the line and
//! the field.

use std::{
    collections::BTreeMap,
    ffi::OsString,
    fmt,
    path::{Path, PathBuf},
};

use clap::{Arg, ArgAction, Command};
use serde_yaml_ng::Value;

use crate::files::{self, Links, ReadError};

/// The field that names the file itself; a file cannot name another.
pub const CONFIG_FIELD: &str = "config";

/// The largest config file read: one field per flag fits in a few KiB.
pub const CONFIG_LIMIT: u64 = 1 << 20;

/// The deepest nesting of `[` and `{` parsed: a field's value is a plain value or a list of
/// them. YAML's parser takes time and memory for each level before any field is checked.
pub const MAX_NESTING: usize = 16;

/// Where in the file something is: `path:line` when the line is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub path: PathBuf,
    pub line: Option<usize>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}", self.path.display()),
            None => write!(f, "{}", self.path.display()),
        }
    }
}

/// Where the file set each flag it set; a flag the command line gave is the command line's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origins(BTreeMap<String, Location>);

impl Origins {
    /// `flag` as an error names the setting: `--signature-policy` when the command line (or the
    /// default) set it, `config.yaml:3: signature-policy` when the file did.
    pub fn setting(&self, flag: &str) -> String {
        match self.0.get(flag) {
            Some(at) => format!("{at}: {flag}"),
            None => format!("--{flag}"),
        }
    }
}

/// A config file that cannot be used, saying where and why.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read the config file {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot read the config file {}: it is {refused}", path.display())]
    Refused { path: PathBuf, refused: files::Refused },
    #[error("{}: nested deeper than {MAX_NESTING} levels of `[` and `{{`; the fields take plain values or lists", path.display())]
    TooDeep { path: PathBuf },
    #[error("{}: not valid YAML: {reason}", path.display())]
    Syntax { path: PathBuf, reason: String },
    #[error("{}: expected a mapping of flag names to values, e.g. `registry-qps: 5`", path.display())]
    NotAMapping { path: PathBuf },
    #[error(
        "{at}: unknown field `{field}`: the fields are the serve flags without their dashes{hint}",
        hint = suggestion.as_ref().map(|flag| format!(", e.g. `{flag}`")).unwrap_or_default()
    )]
    UnknownField { at: Location, field: String, suggestion: Option<String> },
    #[error("{at}: `{CONFIG_FIELD}` is a command-line flag only: a config file cannot name another")]
    NestedConfig { at: Location },
    #[error("{at}: {field}: {reason}")]
    Value { at: Location, field: String, reason: String },
}

/// The arguments the file at `path` adds to the `serve` command line, as `--field=value`, each
/// value checked by its flag's parser, and where each is written. A field whose flag
/// `given_on_command_line` is left out: the command line wins. An empty field (`field:` or
/// `field: null`) sets nothing.
pub fn read(
    path: &Path,
    serve: &Command,
    given_on_command_line: impl Fn(&Arg) -> bool,
) -> Result<(Vec<OsString>, Origins), FileError> {
    let read_error = |source| FileError::Read { path: path.to_owned(), source };
    let bytes = match files::read_bounded(path, CONFIG_LIMIT, Links::Follow) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Err(read_error(files::read::missing())),
        Err(ReadError::Io(source)) => return Err(read_error(source)),
        Err(ReadError::Refused(refused)) => return Err(FileError::Refused { path: path.to_owned(), refused }),
    };
    let text = String::from_utf8(bytes)
        .map_err(|_| read_error(std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text")))?;
    parse(path, &text, serve, given_on_command_line)
}

/// As [`read`], for the file's text.
pub fn parse(
    path: &Path,
    text: &str,
    serve: &Command,
    given_on_command_line: impl Fn(&Arg) -> bool,
) -> Result<(Vec<OsString>, Origins), FileError> {
    if flow_nesting(text) > MAX_NESTING {
        return Err(FileError::TooDeep { path: path.to_owned() });
    }
    let document: Value = serde_yaml_ng::from_str(text)
        .map_err(|error| FileError::Syntax { path: path.to_owned(), reason: error.to_string() })?;
    let fields = match document {
        Value::Null => return Ok((Vec::new(), Origins::default())),
        Value::Mapping(fields) => fields,
        _ => return Err(FileError::NotAMapping { path: path.to_owned() }),
    };
    let (mut args, mut origins) = (Vec::new(), Origins::default());
    for (key, value) in &fields {
        let field = match key {
            Value::String(field) => field.as_str(),
            other => &scalar_text(other).unwrap_or_else(|| "?".to_owned()),
        };
        let at = Location { path: path.to_owned(), line: line_of(text, field) };
        if field == CONFIG_FIELD {
            return Err(FileError::NestedConfig { at });
        }
        let Some(arg) = serve.get_arguments().find(|arg| arg.get_long() == Some(field)) else {
            let suggestion = suggest(serve, field);
            return Err(FileError::UnknownField { at, field: field.to_owned(), suggestion });
        };
        let bad_value = |reason: String| FileError::Value { at: at.clone(), field: field.to_owned(), reason };
        let values = values_of(arg, value).map_err(bad_value)?;
        for value in &values {
            check(arg, value).map_err(bad_value)?;
        }
        if !given_on_command_line(arg) && !values.is_empty() {
            args.extend(values.iter().map(|value| OsString::from(format!("--{field}={value}"))));
            origins.0.insert(field.to_owned(), at);
        }
    }
    Ok((args, origins))
}

/// The deepest nesting of flow collections (`[`, `{`) in `text`, comments left out. Brackets in
/// quoted values count too: an overcount only refuses a file no flag's values need. Block nesting
/// needs indentation, which the size cap bounds.
fn flow_nesting(text: &str) -> usize {
    let (mut depth, mut deepest, mut comment, mut previous) = (0usize, 0usize, false, '\n');
    for c in text.chars() {
        match c {
            '\n' => comment = false,
            _ if comment => {}
            '#' if previous.is_whitespace() => comment = true,
            '[' | '{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        previous = c;
    }
    deepest
}

/// A field's values as its flag would be given them: none for an empty field, one per item of a
/// list for a repeatable flag.
fn values_of(arg: &Arg, value: &Value) -> Result<Vec<String>, String> {
    let repeatable = matches!(arg.get_action(), ArgAction::Append);
    match value {
        Value::Null => Ok(Vec::new()),
        Value::Sequence(items) if repeatable => items
            .iter()
            .map(|item| scalar_text(item).ok_or_else(|| "expected a list of plain values".to_owned()))
            .collect(),
        Value::Sequence(_) => Err("takes one value, not a list".to_owned()),
        Value::Mapping(_) => Err("expected a plain value, not a mapping".to_owned()),
        scalar => scalar_text(scalar).map(|text| vec![text]).ok_or_else(|| "expected a plain value".to_owned()),
    }
}

/// A scalar as a flag's text: `true`, `5`, `0.5`, `30s`.
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::Bool(flag) => Some(flag.to_string()),
        Value::Number(number) => Some(number.to_string()),
        Value::String(text) => Some(text.clone()),
        _ => None,
    }
}

/// Runs the flag's own parser on `value`, with the reason it gives.
fn check(arg: &Arg, value: &str) -> Result<(), String> {
    let alone = Command::new("serve").no_binary_name(true).arg(arg.clone());
    let flag = OsString::from(format!("--{}={value}", arg.get_long().unwrap_or_default()));
    let error = match alone.try_get_matches_from([flag]) {
        Ok(_) => return Ok(()),
        Err(error) => error,
    };
    let reason = match std::error::Error::source(&error) {
        Some(reason) => format!("invalid value {value:?}: {reason}"),
        // clap's own parsers (a choice, a boolean) say what they accept in its message.
        None => {
            let rendered = error.render().to_string();
            let message = rendered.strip_prefix("error: ").unwrap_or(&rendered);
            let lines = message.lines().map(str::trim).filter(|line| !line.is_empty() && !line.starts_with("For more"));
            let message = lines.collect::<Vec<_>>().join(" ");
            // `invalid value 'x' for '--flag <BOOL>' [possible values: …]`: the field is named already.
            match (message.find(" for '--"), message.find("' [")) {
                (Some(start), Some(end)) if start < end => format!("{}{}", &message[..start], &message[end + 1..]),
                _ => message,
            }
        }
    };
    Err(reason)
}

/// The line of the top-level `field:` (quoted or not), when the file is written in block style.
fn line_of(text: &str, field: &str) -> Option<usize> {
    let keyed = |line: &str| {
        let rest = ["\"", "'", ""].iter().find_map(|quote| {
            line.strip_prefix(quote).and_then(|rest| rest.strip_prefix(field)).and_then(|rest| rest.strip_prefix(quote))
        });
        rest.is_some_and(|rest| rest.trim_start().starts_with(':'))
    };
    text.lines().position(keyed).map(|index| index + 1)
}

/// The flag an unknown field was probably meant to be, for `registryQps`, `registry_qps` or
/// `Registry-QPS`: the flags compared without case and separators.
fn suggest(serve: &Command, field: &str) -> Option<String> {
    let squash =
        |name: &str| -> String { name.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect() };
    let wanted = squash(field);
    serve
        .get_arguments()
        .filter_map(Arg::get_long)
        .find(|long| *long != CONFIG_FIELD && squash(long) == wanted)
        .map(str::to_owned)
}

#[cfg(test)]
mod tests;
