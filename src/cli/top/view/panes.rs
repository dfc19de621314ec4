//! Each pane's lines: the disk against the GC thresholds, the pulls with their bars, the
//! backoffs counting down, the registries in trouble, the events. The daemon's text is measured
//! and cut as it will be shown ([`printable`]), so that columns and cuts hold whatever it holds.

use std::time::{Duration, SystemTime};

use ratatui::{
    style::{Color, Modifier, Style},
    text::{Line, Span},
};

use super::time_of_day;
use crate::{
    api,
    cli::{
        render::{
            human::{age, bytes, cut_end, cut_middle, duration, moment},
            line::printable,
            progress::{amounts, bar},
        },
        status::pull_state,
        top::model::{Model, Reply},
    },
};

/// A heading and its items (a pull takes two lines), cut to the rows it is given.
pub struct Pane {
    heading: Line<'static>,
    items: Vec<Vec<Line<'static>>>,
    /// A log: when cut, its newest (last) items stay.
    newest_last: bool,
}

impl Pane {
    fn new(title: &str, detail: String, stale_at: Option<SystemTime>) -> Self {
        let mut spans = vec![Span::styled(title.to_owned(), Style::new().fg(Color::Cyan).add_modifier(Modifier::BOLD))];
        if !detail.is_empty() {
            spans.push(Span::raw(format!("  {detail}")));
        }
        if let Some(at) = stale_at {
            spans.push(Span::styled(format!("  (stale: as of {})", time_of_day(at)), Style::new().fg(Color::Red)));
        }
        Self { heading: Line::from(spans), items: Vec::new(), newest_last: false }
    }

    fn item(&mut self, lines: Vec<Line<'static>>) {
        self.items.push(lines);
    }

    fn note(&mut self, text: &str) {
        self.item(vec![Line::styled(format!("  {text}"), Style::new().add_modifier(Modifier::DIM))]);
    }

    /// The rows it would take whole.
    pub fn rows(&self) -> usize {
        1 + self.items.iter().map(Vec::len).sum::<usize>()
    }

    /// Its lines within `height` rows: the heading, then the items that fit, and what was left
    /// out counted (a log keeps its newest instead, and says nothing: older is less).
    pub fn fit(self, height: u16) -> Vec<Line<'static>> {
        if height == 0 {
            return Vec::new();
        }
        let room = usize::from(height) - 1;
        let mut lines = vec![self.heading];
        let total: usize = self.items.iter().map(Vec::len).sum();
        if total <= room {
            lines.extend(self.items.into_iter().flatten());
            return lines;
        }
        if self.newest_last {
            let mut kept = Vec::new();
            for item in self.items.into_iter().rev() {
                if kept.len() + item.len() > room {
                    break;
                }
                kept.splice(0..0, item);
            }
            lines.extend(kept);
            return lines;
        }
        let count = self.items.len();
        let mut shown = 0;
        for item in self.items {
            if lines.len() - 1 + item.len() > room.saturating_sub(1) {
                break;
            }
            lines.extend(item);
            shown += 1;
        }
        if room > 0 {
            lines.push(Line::styled(
                format!("  … and {} more", count - shown),
                Style::new().add_modifier(Modifier::DIM),
            ));
        }
        lines
    }
}

fn stale_at(model: &Model) -> Option<SystemTime> {
    model.status.as_ref().filter(|_| model.stale()).map(|(_, at)| *at)
}

/// `disk [=========     :  |   ]  62%  62.0 GB of 100 GB  GC 85%→80%`: the image filesystem's
/// usage, with the low (`:`) and high (`|`) thresholds marked where they fall.
pub fn disk(model: &Model, width: u16) -> Line<'static> {
    let Some((status, _)) = &model.status else { return Line::raw("disk  ?") };
    let Some(fs) = status.image_fs.as_ref().filter(|fs| fs.capacity_bytes > 0) else {
        let why =
            if status.runtime_reachable { "not reported by this daemon" } else { "unknown (runtime unreachable)" };
        return Line::raw(format!("disk  {why}"));
    };
    let (high, low, used) = (status.gc_high_threshold_percent, status.gc_low_threshold_percent, fs.usage_percent);
    let gc = match high {
        0 => String::new(),
        100.. => "  GC off".to_owned(),
        _ => format!("  GC {high}%→{low}%"),
    };
    let tail = format!(
        " {used:>3}%  {} of {}{gc}",
        bytes(fs.capacity_bytes.saturating_sub(fs.available_bytes)),
        bytes(fs.capacity_bytes)
    );
    let inner = usize::from(width).saturating_sub("disk []".len() + tail.chars().count()).clamp(10, 60);
    let at = |percent: u32| (percent.min(100) as usize * inner / 100).min(inner - 1);
    let marks = (0 < high && high < 100).then(|| (at(low), at(high)));
    let fill = match used {
        u if high > 0 && u >= high => Color::Red,
        u if low > 0 && u >= low => Color::Yellow,
        _ => Color::Green,
    };
    let filled = (used.min(100) as usize * inner).div_ceil(100);
    let mut spans = vec![Span::raw("disk [")];
    for cell in 0..inner {
        spans.push(match marks {
            Some((_, high)) if cell == high => {
                Span::styled("|", Style::new().fg(Color::Red).add_modifier(Modifier::BOLD))
            }
            Some((low, _)) if cell == low => {
                Span::styled(":", Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD))
            }
            _ if cell < filled => Span::styled("=", Style::new().fg(fill)),
            _ => Span::raw(" "),
        });
    }
    spans.push(Span::raw("]"));
    spans.push(Span::raw(tail));
    Line::from(spans)
}

/// Pulls under way and queued: each its image, what it waits for, its callers, and once bytes
/// move, a bar with bytes, rate and time left.
pub fn pulls(model: &Model, now: SystemTime, width: u16) -> Pane {
    let Some((status, _)) = &model.status else {
        let mut pane = Pane::new("Pulls", String::new(), None);
        pane.note("no answer yet");
        return pane;
    };
    let running = status.pulls.iter().filter(|pull| pull.started.is_some()).count();
    let mut detail = format!("{running} under way, {} queued", status.pulls_queued);
    if status.pre_pulls_queued > 0 {
        detail.push_str(&format!(", {} pre-pulls queued", status.pre_pulls_queued));
    }
    let shown: Vec<&api::PullInFlight> = status.pulls.iter().filter(|pull| model.shows(&pull.image)).collect();
    if shown.len() < status.pulls.len() {
        detail.push_str(&format!("; {} hidden by the filter", status.pulls.len() - shown.len()));
    }
    let mut pane = Pane::new("Pulls", detail, stale_at(model));
    if shown.is_empty() {
        pane.note("no pulls");
    }
    let clock = model.clock(now);
    let width = usize::from(width);
    for pull in shown {
        let callers = if pull.callers == 1 { "1 caller".to_owned() } else { format!("{} callers", pull.callers) };
        let right =
            printable(&format!("  {}  {callers}  {}", pull_state(pull), age(moment(pull.asked.as_ref()), clock)));
        let name = if pull.pre_pull { format!("{} (pre-pull)", pull.image) } else { pull.image.clone() };
        let name = cut_middle(&printable(&name), width.saturating_sub(right.chars().count() + 2).max(10));
        let gap = width.saturating_sub(2 + name.chars().count() + right.chars().count());
        let mut lines = vec![Line::from(vec![
            Span::styled(format!("  {name}"), Style::new().add_modifier(Modifier::BOLD)),
            Span::raw(" ".repeat(gap)),
            Span::styled(right, Style::new().fg(state_colour(pull))),
        ])];
        if let Some(progress) = pull.progress.as_ref().filter(|progress| progress.bytes_total > 0) {
            lines.push(progress_line(progress, width));
        }
        pane.item(lines);
    }
    pane
}

fn state_colour(pull: &api::PullInFlight) -> Color {
    match pull.state.as_str() {
        "rate-limit" | "registry" => Color::Yellow,
        "slot" => Color::Gray,
        _ => Color::Green,
    }
}

/// `    [=======>        ]  45%  12.3 MB / 33.6 MB  2.10 MB/s  8s left`, as the pull command's.
fn progress_line(progress: &api::PullProgress, width: usize) -> Line<'static> {
    let tail = amounts(progress);
    let bar_width = width.saturating_sub(4 + tail.chars().count()).clamp(10, 50);
    Line::from(vec![
        Span::raw("    "),
        Span::styled(bar(progress.bytes_done, progress.bytes_total, bar_width), Style::new().fg(Color::Green)),
        Span::raw(tail),
    ])
}

/// The pods whose pulls back off, soonest retry first, counting down between answers.
pub fn backoffs(model: &Model, now: SystemTime, width: u16) -> Pane {
    let list = match &model.backoffs {
        Reply::Got((list, _)) => list,
        Reply::Unimplemented => {
            let mut pane = Pane::new("Backoffs", String::new(), None);
            pane.note("not served by this daemon (ListBackoffs)");
            return pane;
        }
        Reply::Waiting => {
            let mut pane = Pane::new("Backoffs", String::new(), None);
            pane.note("no answer yet");
            return pane;
        }
    };
    let shown: Vec<&api::BackoffEntry> = list.entries.iter().filter(|entry| model.shows(&entry.image)).collect();
    let mut pane = Pane::new("Backoffs", format!("{} backing off", list.entries.len()), stale_at(model));
    if shown.is_empty() {
        pane.note("no pod's pulls are backing off");
    }
    // Columns as wide as their widest, within reason: the error takes what is left.
    let pods: Vec<String> = shown
        .iter()
        .map(|entry| entry.pod.as_ref().map(|pod| format!("{}/{}", pod.namespace, pod.name)).unwrap_or_default())
        .map(|pod| cut_middle(&printable(&pod), 24))
        .collect();
    let pod_width = pods.iter().map(|pod| pod.chars().count()).max().unwrap_or(0);
    let images: Vec<String> = shown.iter().map(|entry| printable(&entry.image)).collect();
    let image_width = images.iter().map(|image| image.chars().count()).max().unwrap_or(0).min(36);
    for ((entry, pod), image) in shown.into_iter().zip(pods).zip(images) {
        let left = model.retry_in(entry, now);
        let retry = if left.is_zero() { "retry due".to_owned() } else { format!("retry in {}", duration(whole(left))) };
        let text = format!(
            "  {pod:<pod_width$}  {:<image_width$}  {retry:<14}  {}",
            cut_middle(&image, image_width),
            entry.last_error
        );
        pane.item(vec![Line::styled(cut_end(&printable(&text), usize::from(width)), Style::new().fg(Color::Yellow))]);
    }
    pane
}

/// Rounded up to the second: a countdown shows 1s until it is due, never 0s.
fn whole(left: Duration) -> Duration {
    Duration::from_secs(left.as_secs() + u64::from(left.subsec_nanos() > 0))
}

/// Registries with something to report, and the rate limits holding pulls back; one calm line
/// when there is nothing.
pub fn registries(model: &Model, now: SystemTime, width: u16) -> Pane {
    let mut pane = Pane::new("Registries", String::new(), stale_at(model));
    let Some((status, _)) = &model.status else {
        pane.note("no answer yet");
        return pane;
    };
    let width = usize::from(width);
    let clock = model.clock(now);
    for registry in &status.registries {
        let until = moment(registry.open_until.as_ref())
            .and_then(|until| until.duration_since(clock).ok())
            .map(|left| format!(" for {}", duration(whole(left))))
            .unwrap_or_default();
        let silent = if registry.unanswered { ", a pull unanswered" } else { "" };
        let text = format!(
            "  {}  breaker {}{until}, {} failures{silent}: {}",
            registry.host, registry.breaker, registry.failures, registry.last_failure
        );
        let colour = if registry.breaker == "closed" { Color::Yellow } else { Color::Red };
        pane.item(vec![Line::styled(cut_end(&printable(&text), width), Style::new().fg(colour))]);
    }
    for bucket in status.rate_limits.iter().filter(|bucket| bucket.lowered_from_qps > 0.0 || bucket.tokens < 1.0) {
        let lowered = if bucket.lowered_from_qps > 0.0 {
            format!(", lowered from {}/s after 429s", bucket.lowered_from_qps)
        } else {
            String::new()
        };
        let text = format!(
            "  rate limit {}: {}/s, burst {}, {:.1} tokens ({}){lowered}",
            host_or_default(&bucket.host),
            bucket.qps,
            bucket.burst,
            bucket.tokens,
            status.rate_limit_mode
        );
        pane.item(vec![Line::styled(cut_end(&printable(&text), width), Style::new().fg(Color::Yellow))]);
    }
    if pane.items.is_empty() {
        let limit = status
            .rate_limits
            .first()
            .map(|bucket| format!("; rate limit {}/s, burst {} ({})", bucket.qps, bucket.burst, status.rate_limit_mode))
            .unwrap_or_default();
        pane.note(&format!("all healthy{limit}"));
    }
    pane
}

fn host_or_default(host: &str) -> &str {
    if host.is_empty() { "each registry" } else { host }
}

/// The node's events, newest last: `14:03:22 Pulled       default/web  Successfully pulled …`.
pub fn events(model: &Model, width: u16) -> Pane {
    let detail = match model.history {
        Reply::Unimplemented => "(history not served by this daemon; live ones only)".to_owned(),
        _ => String::new(),
    };
    let mut pane = Pane::new("Events", detail, stale_at(model));
    pane.newest_last = true;
    let shown: Vec<&api::Event> = model.events.iter().filter(|event| model.shows(&event.image)).collect();
    if shown.is_empty() {
        pane.note(if model.events.is_empty() { "no events yet" } else { "none about an image the filter matches" });
    }
    for event in shown {
        let time = moment(event.time.as_ref()).map(time_of_day).unwrap_or_else(|| "--:--:--".to_owned());
        let object = match &event.pod {
            Some(pod) if !pod.name.is_empty() => format!("{}/{}", pod.namespace, pod.name),
            _ => "node".to_owned(),
        };
        let message = if event.reason == "Lagged" {
            format!("{} events went by unread", event.dropped)
        } else {
            event.message.clone()
        };
        let colour = if event.r#type == "Warning" { Color::Red } else { Color::Reset };
        let text = format!("  {time} {:<14} {object}  {message}", event.reason);
        pane.item(vec![Line::styled(cut_end(&printable(&text), usize::from(width)), Style::new().fg(colour))]);
    }
    pane
}
