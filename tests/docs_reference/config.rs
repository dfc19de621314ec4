//! `docs/reference/config.md`: every key of `serve`'s config file. The file's keys are `serve`'s
//! flags without their dashes (`src/config/file.rs` looks each field up among them), so the page
//! walks the same clap command, and marks the keys a reload applies from `RELOADABLE`.

use clap::{Arg, ArgAction, CommandFactory};
use cri_imaged::config::{
    Cli, RELOADABLE,
    file::{CONFIG_FIELD, CONFIG_LIMIT, MAX_NESTING},
};

use super::markdown::{code, opening, row, table_head};

pub fn page() -> String {
    let root = Cli::command();
    let serve = root.find_subcommand("serve").expect("a serve command");
    let keys: Vec<&Arg> = serve
        .get_arguments()
        .filter(|arg| !arg.is_hide_set() && arg.get_long().is_some_and(|long| long != CONFIG_FIELD))
        .filter(|arg| arg.get_action().takes_values())
        .collect();
    let mut page = opening("Config keys", "the `serve` flags in `src/config/serve.rs` and `src/config/file.rs`");
    page.push_str(&format!(
        "`cri-imaged serve --config FILE` reads a YAML mapping with a key for any of `serve`'s flags, \
         named as the flag without its dashes (`registry-qps: 5`). A flag that may be given more than \
         once takes a list. Each value is checked by its flag's own parser, so the file and the command \
         line accept and refuse the same things; an error names the file, the line and the key. A flag \
         given on the command line wins over the file; an empty key (`key:` or `key: null`) sets \
         nothing. `{CONFIG_FIELD}` is a command-line flag only. The file may be at most {} MiB, nested \
         at most {MAX_NESTING} levels of `[` and `{{`.\n\n\
         SIGHUP reads the file (and the command line) again; the keys marked *reload* take effect \
         while serving; a change to any other takes effect at the next start (the reload logs it as \
         waiting for a restart). Each key's meaning is its \
         flag's: see [Command-line flags](flags.md#cri-imaged-serve).\n\n",
        CONFIG_LIMIT >> 20,
    ));
    page.push_str(&table_head(&["key", "value", "default", "reload", "flag"]));
    for arg in &keys {
        let long = arg.get_long().unwrap_or_default();
        page.push_str(&row(&[
            code(long),
            value(arg),
            default_cell(arg),
            if RELOADABLE.contains(&long) { "reload".to_owned() } else { String::new() },
            code(&format!("--{long}")),
        ]));
    }
    page.push_str("\n## Every key at its default\n\n```yaml\n");
    for arg in &keys {
        let long = arg.get_long().unwrap_or_default();
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        let summary = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for line in wrap(&first_sentence(&summary), 98) {
            page.push_str(&format!("# {line}\n"));
        }
        let defaults: Vec<String> =
            arg.get_default_values().iter().map(|value| yaml_scalar(&value.to_string_lossy())).collect();
        match (repeatable(arg), defaults.as_slice()) {
            (true, values) => page.push_str(&format!("# {long}: [{}]\n", values.join(", "))),
            (false, []) => page.push_str(&format!("# {long}:\n")),
            (false, values) => page.push_str(&format!("# {long}: {}\n", values.join(", "))),
        }
    }
    page.push_str("```\n");
    page
}

fn repeatable(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Append)
}

/// What the key holds: its flag's value, or a list of them.
fn value(arg: &Arg) -> String {
    let name = arg.get_value_names().and_then(|names| names.first()).map(ToString::to_string).unwrap_or_default();
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|value| !value.is_hide_set())
        .map(|value| code(value.get_name()))
        .collect();
    let mut text = if repeatable(arg) { format!("a list of {}", code(&name)) } else { code(&name) };
    if !possible.is_empty() {
        text.push_str(&format!(": {}", possible.join(", ")));
    }
    text
}

fn default_cell(arg: &Arg) -> String {
    let values: Vec<String> =
        arg.get_default_values().iter().map(|value| value.to_string_lossy().into_owned()).collect();
    match values.as_slice() {
        [] => String::new(),
        [one] if one.is_empty() => "(empty)".to_owned(),
        values => values.iter().map(|value| code(value)).collect::<Vec<_>>().join(", "),
    }
}

/// The help's first sentence, for a comment above the key (the flags page has the whole help).
fn first_sentence(help: &str) -> String {
    let ends = help.match_indices(". ").map(|(end, _)| end).filter(|&end| {
        let next = help[end + 2..].chars().next();
        !help[..end].ends_with("e.g") && !help[..end].ends_with("i.e") && next.is_some_and(char::is_uppercase)
    });
    let end = ends.into_iter().next().map(|end| end + 1).unwrap_or(help.len());
    help[..end].to_owned()
}

/// `text` in lines of at most `width` characters, broken between words.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.len() + 1 + word.len() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_owned()),
        }
    }
    lines
}

/// A value as YAML writes it: quoted when plain text would read as something else.
fn yaml_scalar(value: &str) -> String {
    let plain = !value.is_empty()
        && !value.contains(": ")
        && !value.contains(" #")
        && !value.ends_with(':')
        && value.chars().next().is_some_and(|c| c.is_alphanumeric() || c == '/' || c == '.');
    if plain { value.to_owned() } else { format!("'{}'", value.replace('\'', "''")) }
}
