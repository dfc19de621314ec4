//! `-o json` lines, written by serde_json: the daemon's strings kept exactly, and every character a
//! terminal would act on in them as a JSON `\u` escape, so that a line is as harmless on a terminal
//! as the text output and the same value to any JSON reader.

use std::io::{self, Write};

use serde::Serialize;
use serde_json::ser::{CharEscape, CompactFormatter, Formatter, Serializer};

use super::line::acted_on;

/// `value` as one line of compact JSON.
pub fn line(value: &impl Serialize) -> Result<String, serde_json::Error> {
    let mut bytes = Vec::new();
    value.serialize(&mut Serializer::with_formatter(&mut bytes, TerminalSafe))?;
    // The serializer writes only UTF-8 (it is given `str`s and ASCII escapes).
    String::from_utf8(bytes).map_err(|error| serde::ser::Error::custom(error.utf8_error()))
}

/// serde_json's compact output, but for the string fragments it leaves as they are: JSON requires
/// escapes only below U+0020, so DEL, the C1 controls and the bidirectional formatting characters
/// would pass raw.
struct TerminalSafe;

impl Formatter for TerminalSafe {
    fn write_string_fragment<W: ?Sized + Write>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()> {
        let mut start = 0;
        for (at, c) in fragment.char_indices().filter(|&(_, c)| acted_on(c)) {
            CompactFormatter.write_string_fragment(writer, &fragment[start..at])?;
            match u8::try_from(c) {
                // DEL and C1: serde_json's own `\u00XX`.
                Ok(byte) => self.write_char_escape(writer, CharEscape::AsciiControl(byte))?,
                // Bidirectional formatting characters, all in the Basic Multilingual Plane: one
                // `\uXXXX` each.
                Err(_) => write!(writer, "\\u{:04x}", u32::from(c))?,
            }
            start = at + c.len_utf8();
        }
        CompactFormatter.write_string_fragment(writer, &fragment[start..])
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cli::render::hostile::{assert_json_line, every_acted_on, hostile};

    #[test]
    fn every_string_comes_back_exactly_and_nothing_a_terminal_acts_on_is_raw() {
        let value = json!({"pod": hostile("pod"), "names": [hostile("a"), "plain"], "n": 1});
        let line = line(&value).expect("serialised");
        assert!(!line.contains('\n'), "one line: {line:?}");
        assert_eq!(assert_json_line(&line), value);
        for c in every_acted_on() {
            let line = super::line(&json!(c.to_string())).expect("serialised");
            assert!(line.starts_with("\"\\") && line.is_ascii(), "{c:?} as {line}");
            assert_eq!(serde_json::from_str::<String>(&line).expect("JSON"), c.to_string());
        }
    }

    #[test]
    fn ordinary_text_is_written_as_serde_json_writes_it() {
        let value =
            json!({"image": "registry.local/app:v1", "message": "pulled \"x\" — ok \u{E000}\\", "n": [1.5, null]});
        assert_eq!(line(&value).expect("serialised"), value.to_string());
    }
}
