//! A line of output with its styles beside its text, never inside it: text from the daemon (a
//! pod's name, a registry's error) is only ever text, and every character a terminal would act on
//! is shown, not sent, by the one function that makes text [`printable`].

/// How a span looks on a terminal that takes colour; every tone is plain anywhere else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Plain,
    /// Bold red: a failure, a warning.
    Alert,
    /// Bold: an outcome.
    Strong,
}

impl Tone {
    /// The escape that begins the tone; none for plain text.
    fn escape(self) -> Option<&'static str> {
        match self {
            Tone::Plain => None,
            Tone::Alert => Some(ALERT),
            Tone::Strong => Some(STRONG),
        }
    }
}

/// The escapes of our own tones, the only ones [`Line::render`] ever writes.
pub const ALERT: &str = "\x1b[1;31m";
pub const STRONG: &str = "\x1b[1m";
pub const RESET: &str = "\x1b[0m";

/// One line: spans of text, each with its tone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Line {
    spans: Vec<(Tone, String)>,
}

impl Line {
    pub fn plain(text: impl Into<String>) -> Self {
        Self::default().then(Tone::Plain, text)
    }

    pub fn alert(text: impl Into<String>) -> Self {
        Self::default().then(Tone::Alert, text)
    }

    pub fn strong(text: impl Into<String>) -> Self {
        Self::default().then(Tone::Strong, text)
    }

    /// This line with `text` in `tone` after it.
    pub fn then(mut self, tone: Tone, text: impl Into<String>) -> Self {
        self.spans.push((tone, text.into()));
        self
    }

    /// This line with `other`'s spans after it.
    pub fn append(mut self, other: Line) -> Self {
        self.spans.extend(other.spans);
        self
    }

    /// The text as given, without tones: what a test compares.
    #[cfg(test)]
    pub fn text(&self) -> String {
        self.spans.iter().map(|(_, text)| text.as_str()).collect()
    }

    /// At most `width` characters as they will be shown.
    pub fn cut_end(self, width: usize) -> Self {
        let mut left = width;
        let mut spans = Vec::new();
        for (tone, text) in self.spans {
            let shown: String = printable(&text).chars().take(left).collect();
            left -= shown.chars().count();
            spans.push((tone, shown));
        }
        Self { spans }
    }

    /// The line for the output: each span [`printable`], and in its tone's escapes when `color`
    /// (a terminal without `NO_COLOR`); no escape at all otherwise.
    pub fn render(&self, color: bool) -> String {
        let mut out = String::new();
        for (tone, text) in &self.spans {
            match tone.escape().filter(|_| color) {
                Some(escape) => {
                    out.push_str(escape);
                    out.push_str(&printable(text));
                    out.push_str(RESET);
                }
                None => out.push_str(&printable(text)),
            }
        }
        out
    }
}

/// Whether a terminal would act on `c` rather than show it: the control characters (C0, DEL and
/// C1: ESC and CSI begin escapes; a newline or a carriage return would forge a row or overwrite
/// one; a tab breaks columns) and the bidirectional formatting characters, which reorder what is
/// shown around them. Private-use characters are shown as any other character: no tone travels
/// in the text.
pub fn acted_on(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every character a terminal would act on ([`acted_on`]) shown as Rust writes it
/// (`\u{1b}`, `\n`, `\u{202e}`): the one place text is made safe to print.
pub fn printable(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if acted_on(c) {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::render::hostile::{assert_harmless, every_acted_on, hostile};

    #[test]
    fn every_character_a_terminal_acts_on_is_shown_not_sent() {
        for c in every_acted_on() {
            let shown = printable(&format!("a{c}b"));
            assert_eq!(shown, format!("a{}b", c.escape_default()), "{:?}", c);
        }
        assert_eq!(printable("pod\x1b]0;owned\x07 a\tb\nc"), "pod\\u{1b}]0;owned\\u{7} a\\tb\\nc");
        assert_eq!(printable("registry.local/app:v1 — ok \u{E000}"), "registry.local/app:v1 — ok \u{E000}");
        let once = printable(&hostile("x"));
        assert_eq!(printable(&once), once, "showing twice shows the same");
    }

    #[test]
    fn tones_are_escapes_only_where_colour_is_wanted_and_text_never_becomes_one() {
        let line = Line::plain("pod \u{E000}X\u{E002} ").then(Tone::Alert, "Warning").then(Tone::Strong, "\x1b[31m");
        assert_eq!(line.render(false), "pod \u{E000}X\u{E002} Warning\\u{1b}[31m");
        assert_eq!(line.render(true), "pod \u{E000}X\u{E002} \x1b[1;31mWarning\x1b[0m\x1b[1m\\u{1b}[31m\x1b[0m");
        assert_harmless(&line.render(true), true);
        assert_harmless(&line.render(false), false);
    }

    #[test]
    fn a_line_is_cut_by_the_characters_it_shows() {
        let line = Line::plain("ab\x1b").then(Tone::Alert, "cd").cut_end(9);
        assert_eq!(line.text(), "ab\\u{1b}c");
        assert_eq!(Line::plain("abc").cut_end(2).text(), "ab");
    }
}
