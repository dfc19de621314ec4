//! Durations, in one grammar: Go's (`time.ParseDuration`), in which Kubernetes writes them
//! (`12h`, `1m30s`, `1.5h`, `300ms`, `0`), and within it the daemon's own form for its waits and
//! periods, one whole number and a unit (`500ms`, `30s`, `2m`, `1h`). Every duration in the
//! daemon's form reads the same in Go's. And the one way times are written: [`rfc3339`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A duration refused, with the text as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not one whole number and a unit ([`parse`]).
    #[error("{0:?} is not a duration: write a whole number and a unit, e.g. 500ms, 30s, 2m or 1h")]
    Malformed(String),
    /// Zero, where the duration bounds a wait ([`parse_nonzero`]).
    #[error("{0:?} must be greater than zero: write a whole number and a unit, e.g. 500ms, 30s, 2m or 1h")]
    Zero(String),
    /// Longer than [`parse`] takes.
    #[error("{0:?} is too long: at most 8760h (a year)")]
    TooLong(String),
    /// Not in Go's syntax ([`parse_go`]); the words are Go's.
    #[error("invalid duration {0:?}")]
    Invalid(String),
    /// A Go duration below zero.
    #[error("duration {0:?} is negative")]
    Negative(String),
}

/// The longest duration [`parse`] takes: each bounds a wait or a period, and far-future instants
/// overflow.
const LONGEST: Duration = Duration::from_secs(365 * 24 * 3600);

/// The units of the daemon's own form; Go's also has `ns` and `us`.
const DAEMON_UNITS: [&str; 4] = ["ms", "s", "m", "h"];

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// The daemon's own form: one whole number and a unit (`ms`, `s`, `m` or `h`), from zero to a
/// year, as its flags and its config file take a wait or a period.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let malformed = || DurationError::Malformed(text.to_owned());
    let (term, rest) = Term::split(text).ok_or_else(malformed)?;
    if !rest.is_empty() || term.fraction.is_some() || !DAEMON_UNITS.contains(&term.unit) {
        return Err(malformed());
    }
    let nanos = term.nanos().ok_or_else(malformed)?;
    let duration = u64::try_from(nanos / NANOS_PER_SEC)
        .map(|secs| Duration::new(secs, (nanos % NANOS_PER_SEC) as u32))
        .map_err(|_| malformed())?;
    if duration > LONGEST {
        return Err(DurationError::TooLong(text.to_owned()));
    }
    Ok(duration)
}

/// As [`parse`], refusing zero: for a bound, which zero would make fail at once.
pub fn parse_nonzero(text: &str) -> Result<Duration, DurationError> {
    match parse(text)? {
        Duration::ZERO => Err(DurationError::Zero(text.to_owned())),
        duration => Ok(duration),
    }
}

/// Go's syntax, 0 or more: a sign, then terms of a number (fraction allowed) and a unit (`ns`,
/// `us`, `µs`, `ms`, `s`, `m`, `h`), or `0` alone.
pub fn parse_go(text: &str) -> Result<Duration, DurationError> {
    let invalid = || DurationError::Invalid(text.to_owned());
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
        let (term, after) = Term::split(rest).ok_or_else(invalid)?;
        nanos = nanos.checked_add(term.nanos().ok_or_else(invalid)?).ok_or_else(invalid)?;
        rest = after;
    }
    // Go's durations are i64 nanoseconds.
    if nanos > i64::MAX as u128 {
        return Err(invalid());
    }
    if negative && nanos > 0 {
        return Err(DurationError::Negative(text.to_owned()));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

/// One term of a duration, a number and its unit: `1.5h` of `1.5h30m`.
struct Term<'a> {
    whole: &'a str,
    /// The digits after a `.`, when there is one.
    fraction: Option<&'a str>,
    unit: &'a str,
}

impl<'a> Term<'a> {
    /// The term `text` begins with and what follows it; `None` when the number has no digits.
    fn split(text: &'a str) -> Option<(Self, &'a str)> {
        let digits = |text: &str| text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
        let (whole, after) = text.split_at(digits(text));
        let (fraction, after) = match after.strip_prefix('.') {
            Some(after) => {
                let (fraction, after) = after.split_at(digits(after));
                (Some(fraction), after)
            }
            None => (None, after),
        };
        if whole.is_empty() && fraction.is_none_or(str::is_empty) {
            return None;
        }
        let unit_end = after.find(|c: char| c == '.' || c.is_ascii_digit()).unwrap_or(after.len());
        let (unit, rest) = after.split_at(unit_end);
        Some((Self { whole, fraction, unit }, rest))
    }

    /// In nanoseconds; `None` for a unit Go does not have or a whole number past `u64`.
    fn nanos(&self) -> Option<u128> {
        let unit: u128 = match self.unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => NANOS_PER_SEC,
            "m" => 60 * NANOS_PER_SEC,
            "h" => 3_600 * NANOS_PER_SEC,
            _ => return None,
        };
        let whole: u64 = if self.whole.is_empty() { 0 } else { self.whole.parse().ok()? };
        // No overflow: a u64 of hours in nanoseconds is below 2^107.
        let mut nanos = u128::from(whole) * unit;
        // Go keeps as many fraction digits as fit; nanosecond precision is plenty here.
        let mut scale = unit;
        for digit in self.fraction.unwrap_or_default().bytes().take(30) {
            scale /= 10;
            nanos += u128::from(digit - b'0') * scale;
        }
        Some(nanos)
    }
}

/// `now` as Kubernetes writes a `metav1.Time`: `2006-01-02T15:04:05Z`.
pub fn rfc3339(now: SystemTime) -> String {
    let seconds = now.duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs());
    let (days, second_of_day) = (seconds / 86_400, seconds % 86_400);
    // Howard Hinnant's days-to-civil, for the proleptic Gregorian calendar.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let (hour, minute, second) = (second_of_day / 3600, second_of_day / 60 % 60, second_of_day % 60);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_whole_number_and_a_unit() {
        assert_eq!(parse_nonzero("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_nonzero("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_nonzero("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_nonzero("1h"), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn malformed_and_zero_durations_are_refused_with_the_input() {
        for bad in ["", "30", "s", "1.5s", "-1s", "10 s", "3d", "99999999999999999999s"] {
            assert_eq!(parse_nonzero(bad), Err(DurationError::Malformed(bad.to_owned())), "{bad:?}");
        }
        assert_eq!(parse_nonzero("0s"), Err(DurationError::Zero("0s".to_owned())));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn the_daemons_form_is_one_whole_number_and_a_unit_up_to_a_year() {
        for bad in ["0", "1m30s", "1.s", ".5s", "+5s", "5us", "5ns", "5µs"] {
            assert!(parse_go(bad).is_ok(), "{bad:?} is a Go duration");
            assert_eq!(parse(bad), Err(DurationError::Malformed(bad.to_owned())), "{bad:?}");
        }
        assert_eq!(parse("8760h"), Ok(Duration::from_secs(365 * 24 * 3600)));
        for long in ["8761h", "18446744073709551615s"] {
            assert_eq!(parse(long), Err(DurationError::TooLong(long.to_owned())), "{long:?}");
        }
        // Past what a Duration holds: malformed, as a number past u64 is.
        assert_eq!(parse("18446744073709551615h"), Err(DurationError::Malformed("18446744073709551615h".to_owned())));
    }

    #[test]
    fn the_daemons_form_reads_the_same_in_gos() {
        for text in ["0s", "0ms", "7ms", "500ms", "30s", "2m", "90m", "1h", "168h", "8760h"] {
            assert_eq!(parse(text).ok(), parse_go(text).ok(), "{text:?}");
        }
    }

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
            assert_eq!(parse_go(text), Ok(expected), "{text:?}");
        }
    }

    #[test]
    fn malformed_and_negative_go_durations_are_refused() {
        let huge = format!("{}h.999999", "9".repeat(38));
        for bad in ["", "5", "s", "1d", "1.s.", "1h 2m", "-", ".", "9999999999h", huge.as_str()] {
            assert_eq!(parse_go(bad), Err(DurationError::Invalid(bad.to_owned())), "{bad:?}");
        }
        assert_eq!(parse_go("-1m"), Err(DurationError::Negative("-1m".to_owned())));
    }

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_729_468_800 + 12 * 3600 + 26 * 60 + 40)),
            "2024-10-21T12:26:40Z"
        );
    }
}
