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
        if self.color { format!("{ALERT}{text}{PLAIN}") } else { text.to_owned() }
    }

    /// `text` in bold, when colour is allowed.
    pub fn strong(&self, text: &str) -> String {
        if self.color { format!("{STRONG}{text}{PLAIN}") } else { text.to_owned() }
    }
}

/// Where [`Style::alert`] and [`Style::strong`] begin and end, until [`print_lines`] makes them
/// escapes: marks of our own (private-use characters), so that every control character in a line,
/// any of them from the daemon's text (a pod's name, a registry's error), can be made harmless.
const ALERT: char = '\u{E000}';
const STRONG: char = '\u{E001}';
const PLAIN: char = '\u{E002}';

/// `text` with every control character (an escape a terminal would act on) shown as Rust writes it
/// (`\u{1b}`), tabs aside.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() && c != '\t' { c.escape_default().to_string() } else { c.to_string() })
        .collect()
}

/// Prints `lines` to stdout, made [`printable`] (then coloured where asked); a closed pipe
/// (`| head`) is not an error.
pub fn print_lines<I: IntoIterator<Item = String>>(lines: I) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    for line in lines {
        let line = printable(&line).replace(ALERT, "\x1b[1;31m").replace(STRONG, "\x1b[1m").replace(PLAIN, "\x1b[0m");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_is_never_handed_an_escape_from_the_daemons_text() {
        assert_eq!(printable("pod\x1b]0;owned\x07 a\tb"), "pod\\u{1b}]0;owned\\u{7} a\tb");
        assert_eq!(printable("registry.local/app:v1 — ok"), "registry.local/app:v1 — ok");
    }
}
