//! Where a command's output goes and how: bars and colour only on a terminal that wants them,
//! plain lines when piped or with `NO_COLOR`, JSON lines with `-o json`. Nothing reaches stdout
//! but through here (or the pull's frame): lines rendered by [`Line::render`], JSON by
//! [`json::line`].

use std::io::{IsTerminal, Write};

use crate::config::client::Output;

use super::{
    CliError,
    render::{json, line::Line},
};

#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub output: Output,
    /// Stdout is a terminal: redraw in place, cut tables to its width.
    pub terminal: bool,
    /// Escapes allowed, colours and a frame redrawn in place (a terminal, and no `NO_COLOR`):
    /// without, a terminal gets the plain lines a pipe gets.
    pub color: bool,
    /// The terminal's columns and rows (80×24 when unknown).
    pub size: (u16, u16),
}

impl Style {
    pub fn of(output: Output) -> Self {
        let terminal = std::io::stdout().is_terminal() && output != Output::Json;
        let color = terminal && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
        let size = crossterm::terminal::size().unwrap_or((80, 24));
        Self { output, terminal, color, size }
    }

    /// The width a table is cut to: a terminal's, unless `-o wide`.
    pub fn table_width(&self) -> Option<usize> {
        (self.terminal && self.output == Output::Text).then_some(usize::from(self.size.0))
    }

    pub fn json(&self) -> bool {
        self.output == Output::Json
    }
}

/// Prints `lines` to stdout, in their tones when `style` allows colour, each made
/// [`printable`](super::render::line::printable); a closed pipe (`| head`) is not an error.
pub fn print_lines<I: IntoIterator<Item = Line>>(lines: I, style: &Style) -> Result<(), CliError> {
    write_lines(lines.into_iter().map(|line| line.render(style.color)))
}

/// Prints `value` as one line of JSON (see [`json::line`]).
pub fn print_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    let line = json::line(value).map_err(|error| CliError::Output(error.into()))?;
    write_lines([line])
}

fn write_lines(lines: impl IntoIterator<Item = String>) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    for line in lines {
        if let Err(error) = writeln!(stdout, "{line}") {
            return quiet_pipe(error);
        }
    }
    stdout.flush().or_else(quiet_pipe)
}

fn quiet_pipe(error: std::io::Error) -> Result<(), CliError> {
    if error.kind() == std::io::ErrorKind::BrokenPipe { Ok(()) } else { Err(CliError::Output(error)) }
}
