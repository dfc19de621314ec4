//! Go's duration syntax (`time.ParseDuration`), as Kubernetes writes durations in its config and
//! plugin responses: `12h`, `1m0s`, `1.5h`, `300ms`, `0`.

use std::time::Duration;

/// A duration that does not parse, or is negative where it may not be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GoDurationError {
    #[error("invalid duration {0:?}")]
    Invalid(String),
    #[error("duration {0:?} is negative")]
    Negative(String),
}

/// Parses a non-negative Go duration.
pub fn parse(text: &str) -> Result<Duration, GoDurationError> {
    let invalid = || GoDurationError::Invalid(text.to_owned());
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let whole_end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (whole, after) = rest.split_at(whole_end);
        let (fraction, after) = match after.strip_prefix('.') {
            Some(after) => after.split_at(after.find(|c: char| !c.is_ascii_digit()).unwrap_or(after.len())),
            None => ("", after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(invalid());
        }
        let unit_end = after.find(|c: char| c == '.' || c.is_ascii_digit()).unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(invalid()),
        };
        let whole: u128 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| invalid())? };
        let mut part = whole.checked_mul(unit_nanos).ok_or_else(invalid)?;
        // Go keeps as many fraction digits as fit; nanosecond precision is plenty here.
        let mut scale = unit_nanos;
        for digit in fraction.bytes().take(30) {
            scale /= 10;
            part = part.checked_add(u128::from(digit - b'0') * scale).ok_or_else(invalid)?;
        }
        nanos = nanos.checked_add(part).ok_or_else(invalid)?;
        rest = after;
    }
    // Go's durations are i64 nanoseconds.
    if nanos > i64::MAX as u128 {
        return Err(invalid());
    }
    if negative && nanos > 0 {
        return Err(GoDurationError::Negative(text.to_owned()));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_go_writes_them() {
        let cases = [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("12h", Duration::from_secs(12 * 3600)),
            ("1m0s", Duration::from_secs(60)),
            ("1h30m", Duration::from_secs(5400)),
            ("1.5h", Duration::from_secs(5400)),
            (".5s", Duration::from_millis(500)),
            ("300ms", Duration::from_millis(300)),
            ("2us", Duration::from_micros(2)),
            ("2µs", Duration::from_micros(2)),
            ("7ns", Duration::from_nanos(7)),
            ("+5s", Duration::from_secs(5)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(text), Ok(expected), "{text:?}");
        }
    }

    #[test]
    fn malformed_and_negative_durations_are_refused() {
        let huge = format!("{}h.999999", "9".repeat(38));
        for bad in ["", "5", "s", "1d", "1.s.", "1h 2m", "-", ".", "9999999999h", huge.as_str()] {
            assert_eq!(parse(bad), Err(GoDurationError::Invalid(bad.to_owned())), "{bad:?}");
        }
        assert_eq!(parse("-1m"), Err(GoDurationError::Negative("-1m".to_owned())));
    }
}
