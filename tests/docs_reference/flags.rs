//! `docs/reference/flags.md`: every command's flags and arguments, walked from the clap command
//! the binary parses its command line with.

use clap::{Arg, ArgAction, Command, CommandFactory};
use cri_imaged::config::{Cli, client::EXIT_STATUS_HELP};

use super::markdown::{cell, code, opening, row, table_head};

pub fn page() -> String {
    let mut root = Cli::command();
    root.build();
    let mut page = opening("Command-line flags", "the clap definitions in `src/config/`");
    page.push_str(
        "Every command of `cri-imaged` and its flags, as `cri-imaged COMMAND --help` shows them. Each \
         command also takes `-h` (a summary) and `--help` (all of it); `cri-imaged --version` prints \
         the version. `serve`'s flags can be set in its config file too (see [Config keys](config.md)); \
         a flag given on the command line wins over the file.\n",
    );
    page.push_str(&format!(
        "\nThe commands other than `serve` talk to a running daemon over its socket; their exit \
         statuses are:\n\n```text\n{}\n```\n",
        EXIT_STATUS_HELP.trim_start_matches("Exit status:\n")
    ));
    for command in shown(&root) {
        section(&mut page, command, &[root.get_name()]);
    }
    // Each part ends with a blank line and each heading starts with one: keep one.
    while page.contains("\n\n\n") {
        page = page.replace("\n\n\n", "\n\n");
    }
    page
}

/// The subcommands a person sees (not `generate-man`, nor `help`).
fn shown(command: &Command) -> impl Iterator<Item = &Command> {
    command.get_subcommands().filter(|sub| !sub.is_hide_set() && sub.get_name() != "help")
}

/// `command`'s section, then its subcommands' (`backoff clear` after `backoff`).
fn section(page: &mut String, command: &Command, parents: &[&str]) {
    let mut path = parents.to_vec();
    path.push(command.get_name());
    let title = path.join(" ");
    page.push_str(&format!("\n## `{title}`\n\n"));
    if let Some(about) = command.get_long_about().or(command.get_about()) {
        page.push_str(&format!("{}\n\n", cell(&sentence(&about.to_string())).replace("<br>", "\n\n")));
    }
    let positionals: Vec<&Arg> = command.get_positionals().filter(|arg| !arg.is_hide_set()).collect();
    if !positionals.is_empty() {
        page.push_str(&table_head(&["argument", "required", "default", "description"]));
        for arg in positionals {
            page.push_str(&row(&[
                match arg.get_action() {
                    ArgAction::Append => format!("{}, repeatable", code(&value_names(arg))),
                    _ => code(&value_names(arg)),
                },
                if arg.is_required_set() { "yes" } else { "no" }.to_owned(),
                defaults(arg),
                description(arg),
            ]));
        }
        page.push('\n');
    }
    let flags: Vec<&Arg> =
        command.get_arguments().filter(|arg| !arg.is_positional() && !arg.is_hide_set() && !built_in(arg)).collect();
    if !flags.is_empty() {
        page.push_str(&table_head(&["flag", "value", "default", "environment", "description"]));
        for arg in flags {
            page.push_str(&row(&[
                code(&flag_names(arg)),
                value(arg),
                defaults(arg),
                arg.get_env().map(|env| code(&env.to_string_lossy())).unwrap_or_default(),
                description(arg),
            ]));
        }
        page.push('\n');
    }
    // The columns of a listing, when its long help explains them; the exit statuses are said once.
    if let Some(after) = command.get_after_long_help() {
        let after = after.to_string();
        let after = after.trim_end_matches(EXIT_STATUS_HELP).trim_end();
        if !after.is_empty() {
            page.push_str(&format!("```text\n{after}\n```\n\n"));
        }
    }
    let subcommands: Vec<&Command> = shown(command).collect();
    if !subcommands.is_empty() {
        let names: Vec<String> = subcommands.iter().map(|sub| code(&format!("{title} {}", sub.get_name()))).collect();
        page.push_str(&format!("Commands: {}.\n", names.join(", ")));
    }
    for sub in subcommands {
        section(page, sub, &path);
    }
}

/// `--help` and `--version`, which every command has and the opening says once.
fn built_in(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version)
}

/// `-o, --output`.
fn flag_names(arg: &Arg) -> String {
    let long = arg.get_long().map(|long| format!("--{long}"));
    let short = arg.get_short().map(|short| format!("-{short}"));
    short.into_iter().chain(long).collect::<Vec<_>>().join(", ")
}

fn value_names(arg: &Arg) -> String {
    let names = arg.get_value_names().unwrap_or_default();
    let names: Vec<String> = names.iter().map(ToString::to_string).collect();
    if names.is_empty() { arg.get_id().to_string().to_uppercase() } else { names.join(" ") }
}

/// What a flag takes: its value's name, the values it accepts when it names them, and whether it
/// may be given more than once. Nothing for a switch.
fn value(arg: &Arg) -> String {
    if !arg.get_action().takes_values() {
        return "(switch)".to_owned();
    }
    let mut text = code(&value_names(arg));
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|value| !value.is_hide_set())
        .map(|value| code(value.get_name()))
        .collect();
    if !possible.is_empty() && value_names(arg) != "BOOL" {
        text.push_str(&format!(": {}", possible.join(", ")));
    }
    if matches!(arg.get_action(), ArgAction::Append) {
        text.push_str(", repeatable");
    }
    text
}

fn defaults(arg: &Arg) -> String {
    if !arg.get_action().takes_values() {
        return String::new();
    }
    let values: Vec<String> =
        arg.get_default_values().iter().map(|value| value.to_string_lossy().into_owned()).collect();
    match values.as_slice() {
        [] => String::new(),
        [one] if one.is_empty() => "(empty)".to_owned(),
        values => values.iter().map(|value| code(value)).collect::<Vec<_>>().join(", "),
    }
}

/// The whole help of an argument, each paragraph kept.
fn description(arg: &Arg) -> String {
    let help = arg.get_long_help().or(arg.get_help()).map(ToString::to_string).unwrap_or_default();
    cell(&sentence(&help))
}

/// `text` ending as a sentence does: clap takes the last full stop off a one-paragraph help.
fn sentence(text: &str) -> String {
    let text = text.trim_end();
    match text.chars().last() {
        Some(last) if last.is_alphanumeric() || matches!(last, ')' | '`' | '\'' | '"') => format!("{text}."),
        _ => text.to_owned(),
    }
}
