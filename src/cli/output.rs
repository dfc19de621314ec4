//! Where a command's output goes and how: bars and colour only on a terminal that wants them,
//! plain lines when piped or with `NO_COLOR`, JSON lines with `-o json`.

use std::io::{IsTerminal, Write};

use crate::config::client::Output;

use super::CliError;

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

    /// `text` in bold red, when colour is allowed.
    pub fn alert(&self, text: &str) -> String {
        if self.color { format!("\x1b[1;31m{text}\x1b[0m") } else { text.to_owned() }
    }

    /// `text` in bold, when colour is allowed.
    pub fn strong(&self, text: &str) -> String {
        if self.color { format!("\x1b[1m{text}\x1b[0m") } else { text.to_owned() }
    }
}

/// Prints `lines` to stdout; a closed pipe (`| head`) is not an error.
pub fn print_lines<I: IntoIterator<Item = String>>(lines: I) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    for line in lines {
        if let Err(error) = writeln!(stdout, "{line}") {
            return quiet_pipe(error);
        }
    }
    stdout.flush().or_else(quiet_pipe)
}

/// Prints one JSON value as a line.
pub fn print_json(value: &serde_json::Value) -> Result<(), CliError> {
    print_lines([value.to_string()])
}

fn quiet_pipe(error: std::io::Error) -> Result<(), CliError> {
    if error.kind() == std::io::ErrorKind::BrokenPipe { Ok(()) } else { Err(CliError::Output(error)) }
}
