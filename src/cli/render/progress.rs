//! A pull's progress as a person sees it: a frame of lines (a header, a bar per layer, a total)
//! for a terminal, drawn again in place; a line now and then when the output is not a terminal.
//! Pure: the frame is a function of what is known, the elapsed time and the terminal's size.

use std::time::Duration;

use super::{
    human::{bytes, cut_end, duration, rate, short_id},
    line::printable,
};
use crate::api;

/// What is known of one pull.
#[derive(Debug, Clone, Default)]
pub struct View {
    pub image: String,
    /// What the pull waits for, in words, while it is not moving bytes; empty once it does.
    pub waiting: String,
    pub progress: Option<api::PullProgress>,
}

/// The lines to show, [`printable`], none wider than `columns` (so that the terminal never wraps
/// one, which would throw off the redraw), at most `rows - 1` of them (so that it never scrolls
/// the frame away).
pub fn frame(view: &View, elapsed: Duration, columns: u16, rows: u16) -> Vec<String> {
    let columns = usize::from(columns.max(20));
    let mut lines = vec![format!("Pulling {} ({})", view.image, duration_whole(elapsed))];
    let Some(progress) = view.progress.as_ref().filter(|progress| progress.bytes_total > 0) else {
        let waiting = if view.waiting.is_empty() { "asking the daemon" } else { view.waiting.as_str() };
        lines.push(format!("  {waiting}"));
        return lines.into_iter().map(|line| cut_end(&printable(&line), columns)).collect();
    };
    if !view.waiting.is_empty() {
        lines.push(format!("  {}", view.waiting));
    }
    // Room for the layers: the header and waiting lines, the "more" line, the total and the
    // last row (left free, so that the frame never scrolls) stay.
    let room = usize::from(rows).saturating_sub(lines.len() + 3).max(1);
    let layers = &progress.layers;
    let shown = layers.len().min(room);
    // Layers still moving first, then those done, each in the manifest's order.
    let mut order: Vec<&api::LayerProgress> = layers.iter().filter(|layer| !layer.done).collect();
    order.extend(layers.iter().filter(|layer| layer.done));
    for layer in order.iter().take(shown) {
        lines.push(layer_line(layer, columns));
    }
    let hidden = layers.len() - shown.min(layers.len());
    let unlisted = progress.layers_total as usize - layers.len().min(progress.layers_total as usize);
    if hidden + unlisted > 0 {
        let done_hidden = order.iter().skip(shown).filter(|layer| layer.done).count();
        lines.push(format!("  … and {} more layers ({done_hidden} of them done)", hidden + unlisted));
    }
    lines.push(total_line(progress, columns));
    lines.into_iter().map(|line| cut_end(&printable(&line), columns)).collect()
}

/// `  0a1b2c3d4e5f  [=====>      ]  12.3 MB / 33.6 MB`
fn layer_line(layer: &api::LayerProgress, columns: usize) -> String {
    let amounts = if layer.done {
        format!("done  {}", bytes(layer.size_bytes))
    } else {
        format!("{} / {}", bytes(layer.bytes_done), bytes(layer.size_bytes))
    };
    let head = format!("  {}  ", short_id(&layer.digest));
    let width = columns.saturating_sub(head.len() + amounts.len() + 4).clamp(5, 40);
    let done = if layer.done { layer.size_bytes } else { layer.bytes_done };
    format!("{head}{}  {amounts}", bar(done, layer.size_bytes, width))
}

/// `  total [=====>      ] 36%  12.3 MB / 33.6 MB  2.10 MB/s  12s left  1/3 layers`
fn total_line(progress: &api::PullProgress, columns: usize) -> String {
    let tail = format!("{}  {}/{} layers", amounts(progress), progress.layers_done, progress.layers_total);
    let width = columns.saturating_sub("  total ".len() + tail.len()).clamp(5, 30);
    format!("  total {}{tail}", bar(progress.bytes_done, progress.bytes_total, width))
}

/// ` 36%  12.3 MB / 33.6 MB  2.10 MB/s  12s left`: how far, how fast, and how long still (once
/// a rate is known).
pub fn amounts(progress: &api::PullProgress) -> String {
    let percent = progress.bytes_done.saturating_mul(100) / progress.bytes_total.max(1);
    let left = match progress.bytes_per_second {
        0 => "".to_owned(),
        rate => {
            let seconds = progress.bytes_total.saturating_sub(progress.bytes_done).div_ceil(rate);
            format!("  {} left", duration(Duration::from_secs(seconds)))
        }
    };
    format!(
        " {percent:>3}%  {} / {}  {}{left}",
        bytes(progress.bytes_done),
        bytes(progress.bytes_total),
        rate(progress.bytes_per_second)
    )
}

/// `[=====>    ]`, `width` characters in all; ASCII, so that a capture reads the same anywhere.
pub fn bar(done: u64, total: u64, width: usize) -> String {
    let inner = width.saturating_sub(2);
    let filled = if total == 0 { 0 } else { (done.min(total) as u128 * inner as u128 / total as u128) as usize };
    let head = if filled < inner && filled > 0 { ">" } else { "" };
    let body = if head.is_empty() { filled } else { filled - 1 };
    format!("[{}{head}{}]", "=".repeat(body), " ".repeat(inner - body - head.len()))
}

/// Whole seconds: the frame is drawn once a second, tenths would only flicker.
fn duration_whole(elapsed: Duration) -> String {
    duration(Duration::from_secs(elapsed.as_secs()))
}

/// One line for a log or a pipe: `pulling busybox: 12.3 MB / 33.6 MB (36%), 2.10 MB/s, 2/3 layers`.
pub fn plain_line(view: &View) -> String {
    match view.progress.as_ref().filter(|progress| progress.bytes_total > 0) {
        Some(progress) => format!(
            "pulling {}: {} / {} ({}%), {}, {}/{} layers",
            view.image,
            bytes(progress.bytes_done),
            bytes(progress.bytes_total),
            progress.bytes_done.saturating_mul(100) / progress.bytes_total,
            rate(progress.bytes_per_second),
            progress.layers_done,
            progress.layers_total
        ),
        None if !view.waiting.is_empty() => format!("pulling {}: {}", view.image, view.waiting),
        None => format!("pulling {}", view.image),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    fn layer(n: u8, size: u64, done_bytes: u64) -> api::LayerProgress {
        api::LayerProgress {
            digest: format!("sha256:{n:02x}{}", "ab".repeat(31)),
            size_bytes: size,
            bytes_done: done_bytes,
            done: done_bytes == size,
        }
    }

    fn pulling(layers: Vec<api::LayerProgress>) -> View {
        let bytes_total = layers.iter().map(|layer| layer.size_bytes).sum();
        let bytes_done = layers.iter().map(|layer| layer.bytes_done).sum();
        let layers_done = layers.iter().filter(|layer| layer.done).count() as u32;
        View {
            image: "registry.local:5000/big:v1".to_owned(),
            waiting: String::new(),
            progress: Some(api::PullProgress {
                bytes_done,
                bytes_total,
                layers_done,
                layers_total: layers.len() as u32,
                bytes_per_second: 2 * MB,
                layers,
            }),
        }
    }

    #[test]
    fn a_pull_shows_a_bar_per_layer_and_a_total_with_rate_and_time_left() {
        let view = pulling(vec![layer(1, 20 * MB, 5 * MB), layer(2, 10 * MB, 10 * MB)]);
        let lines = frame(&view, Duration::from_millis(12_400), 80, 24);
        assert_eq!(lines[0], "Pulling registry.local:5000/big:v1 (12s)");
        assert!(lines[1].starts_with("  01abababab") && lines[1].ends_with("5.00 MB / 20.0 MB"), "{lines:#?}");
        assert!(lines[2].starts_with("  02abababab") && lines[2].ends_with("done  10.0 MB"), "{lines:#?}");
        assert!(lines[3].contains(" 50%  15.0 MB / 30.0 MB  2.00 MB/s  8s left  1/2 layers"), "{lines:#?}");
        assert!(lines.iter().all(|line| line.chars().count() <= 80), "{lines:#?}");
    }

    #[test]
    fn more_layers_than_rows_are_summed_up_in_one_line() {
        let layers = (0..40).map(|n| layer(n, MB, if n < 30 { MB } else { 0 })).collect();
        let lines = frame(&pulling(layers), Duration::ZERO, 80, 24);
        assert!(lines.len() < 24, "{} lines", lines.len());
        // The ten still moving come first.
        assert!(lines[1..11].iter().all(|line| line.contains("0 B / 1.00 MB")), "{lines:#?}");
        let more = lines.iter().find(|line| line.contains("more layers")).expect("a summary line");
        assert!(more.contains("and 20 more layers (20 of them done)"), "{more}");
    }

    #[test]
    fn before_any_byte_moves_the_frame_says_what_the_pull_waits_for() {
        let view = View {
            image: "busybox".to_owned(),
            waiting: "waiting for a pull slot (3 queued)".to_owned(),
            progress: None,
        };
        assert_eq!(
            frame(&view, Duration::from_secs(3), 80, 24),
            ["Pulling busybox (3s)", "  waiting for a pull slot (3 queued)"]
        );
        assert_eq!(plain_line(&view), "pulling busybox: waiting for a pull slot (3 queued)");
    }

    #[test]
    fn a_narrow_terminal_cuts_lines_instead_of_wrapping_them() {
        let view = pulling(vec![layer(1, 200 * MB, 50 * MB)]);
        for columns in [20, 40, 60] {
            let lines = frame(&view, Duration::ZERO, columns, 10);
            assert!(lines.iter().all(|line| line.chars().count() <= usize::from(columns)), "{columns}: {lines:#?}");
        }
    }

    #[test]
    fn bars_fill_with_the_bytes_done() {
        assert_eq!(bar(0, 10, 12), "[          ]");
        assert_eq!(bar(5, 10, 12), "[====>     ]");
        assert_eq!(bar(10, 10, 12), "[==========]");
    }

    #[test]
    fn the_daemons_text_in_the_frame_is_shown_within_the_width_never_acted_on() {
        use crate::cli::render::hostile::{assert_harmless, hostile};
        let mut view = pulling(vec![layer(1, 20 * MB, 5 * MB)]);
        view.image = hostile("image");
        view.waiting = hostile("waiting");
        if let Some(progress) = view.progress.as_mut() {
            progress.layers[0].digest = hostile("digest");
        }
        for columns in [20, 80, 2000] {
            let lines = frame(&view, Duration::ZERO, columns, 24);
            assert!(lines.iter().all(|line| line.chars().count() <= usize::from(columns)), "{columns}: {lines:#?}");
            assert_harmless(&lines.join("\n"), false);
        }
        assert!(frame(&view, Duration::ZERO, 2000, 24)[0].contains(&printable(&hostile("image"))));
        assert_harmless(&super::super::line::Line::plain(plain_line(&view)).render(false), false);
    }
}
