//! The kubelet's human messages, word for word, so users see what they already know; and ours,
//! in the same manner, for what the kubelet does not say (pull progress).

use std::{borrow::Cow, time::Duration};

/// The most of a caller's value that an answer, a log line or an event repeats, in bytes.
pub const ECHO_LIMIT: usize = 256;

/// `value` as we repeat it back: whole up to [`ECHO_LIMIT`] bytes; beyond, its start and its
/// length, so that a huge value costs neither memory nor a client's trailer limit (C-core
/// clients refuse more than 16 KiB of them).
pub fn echo(value: &str) -> Cow<'_, str> {
    if value.len() <= ECHO_LIMIT {
        return Cow::Borrowed(value);
    }
    let mut end = ECHO_LIMIT;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}… ({} bytes)", &value[..end], value.len()))
}

/// The reasons the kubelet gives a container waiting for a failed image (its `ErrImagePull`
/// family); the events' reasons are [`crate::events::reason`].
pub mod waiting_reason {
    pub const INVALID_IMAGE_NAME: &str = "InvalidImageName";
    pub const IMAGE_INSPECT_ERROR: &str = "ImageInspectError";
    pub const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
    pub const IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";
    pub const ERR_IMAGE_PULL: &str = "ErrImagePull";
    pub const REGISTRY_UNAVAILABLE: &str = "RegistryUnavailable";
    pub const SIGNATURE_VALIDATION_FAILED: &str = "SignatureValidationFailed";
}

pub fn invalid_image_name(image: &str, error: &impl std::fmt::Display) -> String {
    let image = echo(image);
    // The grammar's error may quote the image's name whole (one that is not lowercase).
    let error = error.to_string();
    let error = echo(&error);
    format!("Failed to apply default image tag {image:?}: couldn't parse image name {image:?}: {error}")
}

pub fn inspect_failed(image: &str, error: &impl std::fmt::Display) -> String {
    let image = echo(image);
    format!("Failed to inspect image {image:?}: {error}")
}

/// The kubelet's answer for a present image a pod may use (KEP-2535 on, as by default).
pub fn already_present(image: &str) -> String {
    format!("Container image {image:?} already present on machine and can be accessed by the pod")
}

pub fn never_pull(image: &str) -> String {
    format!("Container image {image:?} is not present with pull policy of Never")
}

/// The kubelet's `Back-off pulling image "X"`, with the failure that caused it (`reason: message`).
pub fn back_off(image: &str, last_error: impl std::fmt::Display) -> String {
    format!("Back-off pulling image {image:?}: {last_error}")
}

/// The kubelet's BackOff event: the image only (the answer adds the last error).
pub fn back_off_event(image: &str) -> String {
    format!("Back-off pulling image {image:?}")
}

pub fn pulling(image: &str) -> String {
    format!("Pulling image {image:?}")
}

pub fn pulled(image: &str, pull: Duration, total: Duration, size: u64) -> String {
    format!(
        "Successfully pulled image {image:?} in {} ({} including waiting). Image size: {size} bytes.",
        go_duration_millis(pull),
        go_duration_millis(total)
    )
}

pub fn pull_failed(image: &str, error: &impl std::fmt::Display) -> String {
    format!("Failed to pull image {image:?}: {error}")
}

/// Not the kubelet's: `Pulling image "X": 3.0 MiB of 8.0 MiB, 1 of 2 layers, 2.0 MiB/s`.
pub fn pull_progress(image: &str, progress: &crate::events::ProgressFacts) -> String {
    format!(
        "Pulling image {image:?}: {} of {}, {} of {} layers, {}/s",
        binary_size(progress.bytes_done),
        binary_size(progress.bytes_total),
        progress.layers_done,
        progress.layers_total,
        binary_size(progress.bytes_per_second)
    )
}

/// Bytes in the largest binary unit under which they are at least 1, to one decimal.
pub fn binary_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `detail` is what follows the runtime's `RegistryUnavailable` prefix, e.g. `: connection refused`.
pub fn registry_unavailable(image: &str, detail: &str) -> String {
    format!("image pull failed for {image} because the registry is unavailable{detail}")
}

/// `detail` is what follows the runtime's `SignatureValidationFailed` prefix.
pub fn signature_validation_failed(image: &str, detail: &str) -> String {
    format!("image pull failed for {image} because the signature validation failed{detail}")
}

/// Go's `time.Duration.String()` of a duration truncated to milliseconds, as the kubelet logs it:
/// `0s`, `523ms`, `1.2s`, `2m3.04s`, `1h0m0s`.
pub fn go_duration_millis(duration: Duration) -> String {
    let millis = duration.as_millis();
    if millis == 0 {
        return "0s".to_owned();
    }
    if millis < 1000 {
        return format!("{millis}ms");
    }
    let (hours, minutes) = (millis / 3_600_000, millis / 60_000 % 60);
    let (seconds, fraction) = (millis / 1000 % 60, millis % 1000);
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&seconds.to_string());
    if fraction > 0 {
        let digits = format!("{fraction:03}");
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
    out.push('s');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_go_prints_them() {
        let cases = [
            (0, "0s"),
            (7, "7ms"),
            (523, "523ms"),
            (1_000, "1s"),
            (1_200, "1.2s"),
            (1_234, "1.234s"),
            (60_000, "1m0s"),
            (123_040, "2m3.04s"),
            (3_600_000, "1h0m0s"),
            (3_723_500, "1h2m3.5s"),
        ];
        for (millis, expected) in cases {
            assert_eq!(go_duration_millis(Duration::from_millis(millis)), expected, "{millis}ms");
        }
    }

    #[test]
    fn sub_millisecond_remainders_are_truncated() {
        assert_eq!(go_duration_millis(Duration::from_micros(1_999_999)), "1.999s");
        assert_eq!(go_duration_millis(Duration::from_micros(999)), "0s");
    }

    #[test]
    fn a_long_value_is_echoed_as_its_start_and_its_length() {
        assert_eq!(echo("busybox:1.36"), "busybox:1.36");
        let long = "a".repeat(1 << 20);
        let echoed = echo(&long);
        assert_eq!(echoed, format!("{}… (1048576 bytes)", "a".repeat(ECHO_LIMIT)));
        let message = invalid_image_name(&long, &"repository name must not be more than 255 characters");
        assert!(message.len() < 2 * ECHO_LIMIT + 200, "{} bytes", message.len());
        // Found by the ensure_request fuzz target: the error itself quoted a name not lowercase.
        let upper = format!("x/{long}A");
        let error = crate::reference::ImageReference::parse_normalized(&upper).expect_err("not lowercase");
        let message = invalid_image_name(&upper, &error);
        assert!(message.len() < 3 * ECHO_LIMIT + 200, "{} bytes", message.len());
        // Never cut inside a character.
        let wide = "é".repeat(200);
        assert!(echo(&wide).starts_with(&"é".repeat(ECHO_LIMIT / 2)));
    }

    #[test]
    fn progress_reads_in_binary_units() {
        let progress = crate::events::ProgressFacts {
            bytes_done: 3 << 20,
            bytes_total: (8 << 20) + 600 * 1024,
            layers_done: 1,
            layers_total: 2,
            bytes_per_second: 2 << 20,
            ..Default::default()
        };
        assert_eq!(
            pull_progress("app:v1", &progress),
            r#"Pulling image "app:v1": 3.0 MiB of 8.6 MiB, 1 of 2 layers, 2.0 MiB/s"#
        );
        let sizes =
            [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (5 << 30, "5.0 GiB"), (u64::MAX, "16777216.0 TiB")];
        for (bytes, expected) in sizes {
            assert_eq!(binary_size(bytes), expected);
        }
    }

    #[test]
    fn pulled_message_matches_the_kubelet_event() {
        let message = pulled("busybox", Duration::from_millis(1_200), Duration::from_millis(1_300), 4_242);
        assert_eq!(
            message,
            r#"Successfully pulled image "busybox" in 1.2s (1.3s including waiting). Image size: 4242 bytes."#
        );
    }
}
