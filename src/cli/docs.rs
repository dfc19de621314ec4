//! Shell completions and man pages, generated from the same clap definitions that parse the
//! command line (so they never drift from it); the package ships both.

use std::{io::Write, path::Path};

use clap::CommandFactory;
use clap_mangen::Man;

use super::CliError;
use crate::config::{Cli, client::EXIT_STATUS_HELP};

/// The completion script for `shell`, on stdout.
pub fn completion(shell: clap_complete::Shell) -> Result<(), CliError> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut without_hidden_commands(Cli::command()), "cri-imaged", &mut script);
    if shell == clap_complete::Shell::Bash {
        // clap_complete 4.6 names a hyphenated binary's branches `cri__subcmd__imaged__…` but
        // looks for `cri__imaged__…` (clap-rs/clap#6421): nothing past the first word would
        // complete.
        let text = String::from_utf8_lossy(&script).replace("cri__subcmd__imaged", "cri__imaged");
        script = text.into_bytes();
    }
    if shell == clap_complete::Shell::Fish {
        // clap_complete 4.6's fish script completes options and commands but no positional
        // argument (its docs say so): `cri-imaged completion fi` offered file names, not fish.
        script.extend_from_slice(fish_positional_values().as_bytes());
    }
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&script).and_then(|()| stdout.flush()).map_err(CliError::Output)
}

/// `root` without its hidden commands (`generate-man`, for the package's build): clap_complete
/// 4.6 offers hidden commands too, and clap cannot take a command out, so the shown ones are put
/// into a new command of the same name, version, description and arguments.
fn without_hidden_commands(root: clap::Command) -> clap::Command {
    let shown = root.get_subcommands().filter(|command| !command.is_hide_set()).cloned();
    let copy = clap::Command::new("cri-imaged").version(env!("CARGO_PKG_VERSION"));
    let copy = match root.get_about() {
        Some(about) => copy.about(about.clone()),
        None => copy,
    };
    copy.args(root.get_arguments().cloned()).subcommands(shown)
}

/// A fish `complete` line for each value of a command's positional argument that takes a fixed
/// set (`completion`'s SHELL), on the condition the generated script uses for that command. The
/// commands of cri-imaged only: none below them (`backoff clear`) has such an argument.
fn fish_positional_values() -> String {
    // In fish's single quotes only \ and ' are special.
    let quote = |text: &str| format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'").replace('\n', " "));
    let mut cli = Cli::command();
    cli.build();
    let mut lines = String::new();
    for command in cli.get_subcommands().filter(|command| !command.is_hide_set()) {
        for arg in command.get_positionals().filter(|arg| !arg.is_hide_set()) {
            for value in arg.get_possible_values().iter().filter(|value| !value.is_hide_set()) {
                let help = value.get_help().or(arg.get_help()).map(ToString::to_string).unwrap_or_default();
                lines.push_str(&format!(
                    "complete -c cri-imaged -n \"__fish_cri_imaged_using_subcommand {}\" -f -a {} -d {}\n",
                    command.get_name(),
                    quote(value.get_name()),
                    quote(&help),
                ));
            }
        }
    }
    lines
}

/// `cri-imaged.1` and a page per command (`cri-imaged-pull.1`, `cri-imaged-backoff-clear.1`, …)
/// into `dir`, dated `date` when given (a package's pages are then the same on every build).
pub fn man_pages(dir: &Path, date: Option<&str>) -> Result<(), CliError> {
    let mut command = Cli::command().disable_help_subcommand(true);
    command.build();
    write_pages(&command, dir, date)
        .map_err(|error| CliError::Usage(format!("cannot write the man pages into {}: {error}", dir.display())))
}

fn write_pages(command: &clap::Command, dir: &Path, date: Option<&str>) -> std::io::Result<()> {
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        write_pages(sub, dir, date)?;
    }
    // Every page says which release it documents; a command's own has no version to render.
    let version = env!("CARGO_PKG_VERSION");
    let mut man =
        Man::new(command.clone().version(version)).manual("cri-imaged").source(format!("cri-imaged {version}"));
    if let Some(date) = date {
        man = man.date(date);
    }
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    if command.get_arguments().any(|arg| !arg.is_hide_set()) {
        man.render_options_section(&mut page)?;
    }
    if command.get_subcommands().any(|sub| !sub.is_hide_set()) {
        man.render_subcommands_section(&mut page)?;
    }
    // Our exit statuses under their own heading (clap_mangen would title them EXTRA).
    if command.get_after_help().is_some() {
        page.extend_from_slice(b".SH \"EXIT STATUS\"\n.nf\n");
        for line in EXIT_STATUS_HELP.lines().skip(1) {
            page.extend_from_slice(line.trim_start().as_bytes());
            page.push(b'\n');
        }
        page.extend_from_slice(b".fi\n");
    }
    man.render_version_section(&mut page)?;
    std::fs::write(dir.join(man.get_filename()), page)
}
