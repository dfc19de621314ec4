//! For the tests: text as hostile as the daemon could hand the command line (every character a
//! terminal acts on, our old in-band style marks and other private-use characters), and what the
//! output must then be.

use super::line::{ALERT, Line, RESET, STRONG, acted_on, printable};
use crate::{cli::output::Style, config::client::Output};

/// Every character a terminal acts on: C0, DEL, C1, and the bidirectional formatting ones.
pub fn every_acted_on() -> Vec<char> {
    let controls = ('\0'..='\u{1F}').chain(['\u{7F}']).chain('\u{80}'..='\u{9F}');
    let bidi =
        ['\u{061C}', '\u{200E}', '\u{200F}'].into_iter().chain('\u{202A}'..='\u{202E}').chain('\u{2066}'..='\u{2069}');
    controls.chain(bidi).collect()
}

/// The marks the command line once took for its styles (U+E000–U+E002), and private-use
/// characters of each plane that has them.
pub fn private_use() -> Vec<char> {
    vec!['\u{E000}', '\u{E001}', '\u{E002}', '\u{E003}', '\u{F8FF}', '\u{F0000}', '\u{10FFFD}']
}

/// `name` (to tell fields apart), a style forged with the old marks and with CSI, then every
/// character of [`every_acted_on`] and [`private_use`].
pub fn hostile(name: &str) -> String {
    let mut text = format!("{name}\u{E000}X\u{E002}\u{9B}31m\x1b[1;31mY");
    text.extend(every_acted_on());
    text.extend(private_use());
    text
}

/// [`hostile`]`(name)` as the output shows it.
pub fn shown(name: &str) -> String {
    printable(&hostile(name))
}

/// Asserts that `output` holds nothing a terminal would act on but line ends and, when `color`,
/// our own tones' escapes; without `color`, no escape at all.
#[track_caller]
pub fn assert_harmless(output: &str, color: bool) {
    let ours = if color { output.replace(ALERT, "").replace(STRONG, "").replace(RESET, "") } else { output.to_owned() };
    let acted: Vec<char> = ours.chars().filter(|&c| c != '\n' && acted_on(c)).collect();
    assert!(acted.is_empty(), "{acted:?} reach the output (colour {color}):\n{output:?}");
}

/// Asserts that `line` is one JSON value holding no character a terminal would act on (JSON's
/// escapes stand for them), and returns it.
#[track_caller]
pub fn assert_json_line(line: &str) -> serde_json::Value {
    assert!(!line.chars().any(acted_on), "a raw character a terminal acts on in JSON: {line:?}");
    serde_json::from_str(line).unwrap_or_else(|error| panic!("not JSON ({error}): {line:?}"))
}

/// Every way a command prints: text and wide on a terminal with colour, with `NO_COLOR` and
/// through a pipe, and JSON.
pub fn every_style() -> Vec<Style> {
    let style = |output, terminal, color| Style { output, terminal, color, size: (80, 24) };
    vec![
        style(Output::Text, true, true),
        style(Output::Text, true, false),
        style(Output::Text, false, false),
        style(Output::Wide, true, true),
        style(Output::Wide, true, false),
        style(Output::Wide, false, false),
        style(Output::Json, false, false),
    ]
}

/// `lines` as [`print_lines`](crate::cli::output::print_lines) writes them in `style`, each
/// checked with [`assert_harmless`].
#[track_caller]
pub fn rendered(lines: &[Line], style: &Style) -> String {
    let text: String = lines.iter().map(|line| line.render(style.color) + "\n").collect();
    assert_harmless(&text, style.color);
    text
}
