//! Sizes, durations and moments as people read them.

use std::time::{Duration, SystemTime};

/// Decimal units as crictl and the registries print them: `0 B`, `512 B`, `12.3 MB`, `1.20 GB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["kB", "MB", "GB", "TB", "PB"];
    if n < 1000 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1000.0;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    let digits = if value >= 100.0 {
        0
    } else if value >= 10.0 {
        1
    } else {
        2
    };
    format!("{value:.digits$} {}", UNITS[unit])
}

/// A rate: `bytes(n)` per second.
pub fn rate(bytes_per_second: u64) -> String {
    format!("{}/s", bytes(bytes_per_second))
}

/// The two largest units that are not zero: `45s`, `3m10s`, `2h5m`, `3d4h`; `0s` for none.
pub fn duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    let (days, hours, minutes, secs) = (seconds / 86_400, seconds / 3600 % 24, seconds / 60 % 60, seconds % 60);
    let parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")];
    let Some(first) = parts.iter().position(|(value, _)| *value > 0) else {
        return if duration.is_zero() { "0s".to_owned() } else { format!("{}ms", duration.as_millis()) };
    };
    parts[first..]
        .iter()
        .take(2)
        .filter(|(value, _)| *value > 0)
        .map(|(value, unit)| format!("{value}{unit}"))
        .collect()
}

/// How long ago `then` was, from `now`: `3m10s`; `-` when unknown.
pub fn age(then: Option<SystemTime>, now: SystemTime) -> String {
    match then {
        Some(then) => duration(now.duration_since(then).unwrap_or_default()),
        None => "-".to_owned(),
    }
}

/// A wire timestamp as a moment; `None` when unset or out of range.
pub fn moment(timestamp: Option<&prost_types::Timestamp>) -> Option<SystemTime> {
    SystemTime::try_from(*timestamp?).ok()
}

/// A wire timestamp as RFC 3339 in UTC (`2026-11-26T13:07:21Z`); `None` when unset.
pub fn rfc3339(timestamp: Option<&prost_types::Timestamp>) -> Option<String> {
    moment(timestamp).map(crate::duration::rfc3339)
}

/// A wire duration; zero when unset or negative.
pub fn wire_duration(duration: Option<&prost_types::Duration>) -> Duration {
    duration.and_then(|duration| Duration::try_from(*duration).ok()).unwrap_or_default()
}

/// `text` cut to `width` characters, its middle replaced with `…`, so that both a registry's name
/// and a tag stay readable.
pub fn cut_middle(text: &str, width: usize) -> String {
    let count = text.chars().count();
    if count <= width {
        return text.to_owned();
    }
    if width <= 1 {
        return "…".chars().take(width).collect();
    }
    let keep = width - 1;
    let (head, tail) = (keep.div_ceil(2), keep / 2);
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(count - tail).collect();
    format!("{start}…{end}")
}

/// `text` cut to `width` characters at its end.
pub fn cut_end(text: &str, width: usize) -> String {
    if text.chars().count() <= width { text.to_owned() } else { text.chars().take(width).collect() }
}

/// The first 12 hex digits of an image id, as crictl shows it.
pub fn short_id(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    hex.get(..12).unwrap_or(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_the_registries_print_them() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(999), "999 B");
        assert_eq!(bytes(1_500), "1.50 kB");
        assert_eq!(bytes(33_554_432), "33.6 MB");
        assert_eq!(bytes(1_073_741_824), "1.07 GB");
        assert_eq!(rate(2_097_152), "2.10 MB/s");
    }

    #[test]
    fn durations_show_their_two_largest_units() {
        assert_eq!(duration(Duration::from_secs(45)), "45s");
        assert_eq!(duration(Duration::from_secs(190)), "3m10s");
        assert_eq!(duration(Duration::from_secs(7_500)), "2h5m");
        assert_eq!(duration(Duration::from_secs(3 * 86_400 + 4 * 3600 + 59)), "3d4h");
        assert_eq!(duration(Duration::from_secs(3600)), "1h");
        assert_eq!(duration(Duration::from_millis(250)), "250ms");
        assert_eq!(duration(Duration::ZERO), "0s");
    }

    #[test]
    fn long_names_keep_their_registry_and_tag() {
        let name = "registry.example.com/team/very-long-image-name:v1.2.3";
        let cut = cut_middle(name, 30);
        assert_eq!(cut.chars().count(), 30);
        assert!(cut.starts_with("registry.exampl") && cut.ends_with("name:v1.2.3"), "{cut}");
        assert_eq!(cut_middle("short", 30), "short");
        assert_eq!(short_id("sha256:0123456789abcdef"), "0123456789ab");
    }
}
