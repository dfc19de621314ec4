//! The screen, drawn from the model alone: a header, the banner when the link has something to
//! say, the disk, then the panes (pulls, backoffs, registries, events) and the keys. Pure: the
//! same model and `now` draw the same cells, so tests render into a `TestBackend`.

mod panes;

use std::time::SystemTime;

use ratatui::{
    Frame,
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::Paragraph,
};

use self::panes::Pane;
use super::model::{Banner, Model};
use crate::cli::render::{human::cut_middle, line::printable};

/// Draws the whole screen.
pub fn draw(frame: &mut Frame, model: &Model, now: SystemTime) {
    let area = frame.area();
    let banner = banner_lines(model, now);
    let [header, banner_area, disk, body, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(banner.len() as u16),
        Constraint::Length(1),
        Constraint::Fill(1),
        Constraint::Length(1),
    ])
    .areas(area);
    frame.render_widget(Paragraph::new(shown(header_line(model, now, area.width))), header);
    frame.render_widget(Paragraph::new(banner.into_iter().map(shown).collect::<Vec<_>>()), banner_area);
    let dim = if model.stale() { Style::new().add_modifier(Modifier::DIM) } else { Style::new() };
    frame.render_widget(Paragraph::new(shown(panes::disk(model, disk.width))).style(dim), disk);
    let panes = [
        panes::pulls(model, now, body.width),
        panes::backoffs(model, now, body.width),
        panes::registries(model, now, body.width),
        panes::events(model, body.width),
    ];
    let heights = split(body.height, panes.each_ref().map(Pane::rows));
    let mut top = body.y;
    for (pane, height) in panes.into_iter().zip(heights) {
        let area = Rect { y: top, height, ..body };
        let lines: Vec<Line> = pane.fit(height).into_iter().map(shown).collect();
        frame.render_widget(Paragraph::new(lines).style(dim), area);
        top += height;
    }
    frame.render_widget(Paragraph::new(shown(footer_line(model, area.width))), footer);
}

/// `line` with every span [`printable`]: text from the daemon (a pod's name, a registry's error)
/// or typed into the filter is shown, never acted on (ratatui would drop control characters
/// unseen, and pass bidirectional ones).
fn shown(mut line: Line<'static>) -> Line<'static> {
    for span in &mut line.spans {
        span.content = printable(&span.content).into();
    }
    line
}

/// The rows each pane gets of `rows`: first its heading and one row each, then pulls (at most
/// half the screen), backoffs and registries all they want in that order, and events the rest.
pub fn split(rows: u16, wants: [usize; 4]) -> [u16; 4] {
    let mut left = usize::from(rows);
    let mut got = [0usize; 4];
    for (got, want) in got.iter_mut().zip(wants) {
        *got = want.min(2).min(left);
        left -= *got;
    }
    let caps = [usize::from(rows / 2).max(2), usize::MAX, usize::MAX];
    for ((got, want), cap) in got.iter_mut().zip(wants).zip(caps) {
        let more = want.min(cap).saturating_sub(*got).min(left);
        *got += more;
        left -= more;
    }
    got[3] += left;
    got.map(|rows| rows as u16)
}

/// ` cri-imaged 1.4.0  /run/cri-imaged/cri-imaged.sock  runtime ok          14:03:22 UTC `; the
/// socket cut in its middle when the row is short.
fn header_line(model: &Model, now: SystemTime, width: u16) -> Line<'static> {
    let bar = Style::new().fg(Color::Black).bg(Color::Gray);
    let version = model.status.as_ref().map_or("?", |(status, _)| status.version.as_str());
    let runtime = match model.status.as_ref() {
        None => Span::styled("runtime ?", bar),
        Some((status, _)) if status.runtime_reachable => Span::styled("runtime ok", bar),
        Some(_) => Span::styled("runtime DOWN", bar.fg(Color::Red).add_modifier(Modifier::BOLD)),
    };
    let clock = format!("{} UTC ", time_of_day(now));
    let name = printable(&format!(" cri-imaged {version}  "));
    let rest = name.chars().count() + 2 + runtime.content.chars().count() + clock.len();
    let socket = cut_middle(&printable(&model.socket), usize::from(width).saturating_sub(rest + 1).max(10));
    let used = rest + socket.chars().count();
    let gap = usize::from(width).saturating_sub(used).max(1);
    Line::from(vec![
        Span::styled(format!("{name}{socket}  "), bar.add_modifier(Modifier::BOLD)),
        runtime,
        Span::styled(" ".repeat(gap), bar),
        Span::styled(clock, bar),
    ])
    .style(bar)
}

fn banner_lines(model: &Model, now: SystemTime) -> Vec<Line<'static>> {
    let Some(banner) = model.banner(now) else { return Vec::new() };
    // Shown before ratatui's Line takes it: it would split the text at a line end, unseen.
    let banner = match banner {
        Banner::Note(text) => Banner::Note(printable(&text)),
        Banner::Good(text) => Banner::Good(printable(&text)),
        Banner::Warn(text) => Banner::Warn(printable(&text)),
        Banner::Alert { text, detail } => Banner::Alert { text: printable(&text), detail: printable(&detail) },
    };
    match banner {
        Banner::Note(text) => vec![Line::styled(text, Style::new().fg(Color::Yellow))],
        Banner::Good(text) => vec![Line::styled(text, Style::new().fg(Color::Green).add_modifier(Modifier::BOLD))],
        Banner::Warn(text) => vec![Line::styled(text, Style::new().fg(Color::Red).add_modifier(Modifier::BOLD))],
        Banner::Alert { text, detail } => vec![
            Line::styled(text, Style::new().fg(Color::White).bg(Color::Red).add_modifier(Modifier::BOLD)),
            Line::styled(detail, Style::new().fg(Color::Red)),
        ],
    }
}

/// The keys, and what is set: the filter, being typed or applied, and the pause.
fn footer_line(model: &Model, width: u16) -> Line<'static> {
    let key = Style::new().add_modifier(Modifier::BOLD);
    if let Some(typed) = &model.typing {
        return Line::from(vec![
            Span::styled("filter: ", key),
            Span::raw(format!("{typed}_")),
            Span::styled("  Enter applies, Esc cancels", Style::new().add_modifier(Modifier::DIM)),
        ]);
    }
    let mut spans = vec![
        Span::styled("q", key),
        Span::raw(" quit  "),
        Span::styled("/", key),
        Span::raw(" filter  "),
        Span::styled("p", key),
        Span::raw(if model.paused.is_some() { " resume" } else { " pause" }),
    ];
    let mut right = Vec::new();
    if !model.filter.is_empty() {
        right.push(Span::styled(printable(&format!("filter: {}", model.filter)), Style::new().fg(Color::Cyan)));
    }
    if let Some(paused) = model.paused {
        right.push(Span::styled(
            format!("PAUSED at {}", time_of_day(paused)),
            Style::new().fg(Color::Black).bg(Color::Yellow),
        ));
    } else if let (true, Some((_, at))) = (model.stale(), &model.status) {
        right.push(Span::styled(format!("stale: as of {}", time_of_day(*at)), Style::new().fg(Color::Red)));
    }
    let used: usize = spans.iter().chain(&right).map(|span| span.content.chars().count() + 2).sum();
    spans.push(Span::raw(" ".repeat(usize::from(width).saturating_sub(used).max(2))));
    for span in right {
        spans.push(span);
        spans.push(Span::raw("  "));
    }
    Line::from(spans)
}

/// `14:03:22`, in UTC (the node's logs are).
pub fn time_of_day(at: SystemTime) -> String {
    let stamp = crate::duration::rfc3339(at);
    stamp.get(11..19).unwrap_or(&stamp).to_owned()
}

#[cfg(test)]
mod tests;
