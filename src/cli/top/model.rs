//! What `top` knows: the daemon's last answers, the events seen, the link's state and what the
//! person typed. Pure: every change is a method given `now`, so that tests need no clock.

use std::{
    collections::VecDeque,
    time::{Duration, SystemTime},
};

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::{
    api,
    cli::render::human::{moment, wire_duration},
};

/// How long "reconnected" stays on screen.
pub const RECONNECTED_FOR: Duration = Duration::from_secs(3);
/// The events kept for the events pane; more than any terminal shows.
const EVENTS_KEPT: usize = 200;
/// Updates held while paused; past this the oldest go (a long pause must not grow without end).
const HELD_MOST: usize = 1000;
/// The first and the longest wait between reconnect attempts.
const FIRST_WAIT: Duration = Duration::from_millis(250);
const LONGEST_WAIT: Duration = Duration::from_secs(5);

/// The wait before reconnect attempt `attempt` (1 for the first): 250 ms doubling to 5 s.
pub fn reconnect_wait(attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(1).min(16);
    FIRST_WAIT.saturating_mul(1 << doublings).min(LONGEST_WAIT)
}

/// The answer to a call an older daemon may not serve.
#[derive(Debug, Clone, Default)]
pub enum Reply<T> {
    /// Not answered yet.
    #[default]
    Waiting,
    /// The daemon does not serve the call (UNIMPLEMENTED): it is older than this command.
    Unimplemented,
    Got(T),
}

/// What the link to the daemon tells the screen.
#[derive(Debug, Clone)]
pub enum Update {
    /// Connected, and WatchEvents subscribed (when served).
    Connected,
    /// The daemon cannot be reached; reconnect attempt `attempt` comes in `retry_in`.
    Lost {
        attempt: u32,
        error: String,
        retry_in: Duration,
    },
    Status(Box<api::GetStatusResponse>),
    Backoffs(Reply<api::ListBackoffsResponse>),
    /// ListEvents' answer; the live events follow.
    History(Reply<Vec<api::Event>>),
    Event(Box<api::Event>),
}

/// The link to the daemon as the banner tells it.
#[derive(Debug, Clone, PartialEq)]
pub enum Link {
    /// The first connect is under way.
    Connecting,
    /// Answering; `reconnected` is when it came back after being lost.
    Up { reconnected: Option<SystemTime> },
    /// Unreachable: reconnect attempt `attempt` comes at `retry_at`.
    Down { attempt: u32, error: String, retry_at: SystemTime },
}

/// What a key asks of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Go,
    Quit,
}

#[derive(Debug, Clone)]
pub struct Model {
    pub socket: String,
    pub link: Link,
    /// The last GetStatus answer and when it came.
    pub status: Option<(api::GetStatusResponse, SystemTime)>,
    /// The last ListBackoffs answer and when it came: countdowns run from then.
    pub backoffs: Reply<(api::ListBackoffsResponse, SystemTime)>,
    /// Whether the daemon keeps a history (ListEvents).
    pub history: Reply<()>,
    /// Oldest first; PullProgress events are not kept (the pulls pane shows them).
    pub events: VecDeque<api::Event>,
    /// Only pulls, backoffs and events whose image contains this (any case); empty: all.
    pub filter: String,
    /// The filter being typed after `/`, until Enter or Esc.
    pub typing: Option<String>,
    /// Since when the screen is frozen (`p`): countdowns stop there too.
    pub paused: Option<SystemTime>,
    held: VecDeque<Update>,
}

impl Model {
    pub fn new(socket: String, filter: String) -> Self {
        Self {
            socket,
            link: Link::Connecting,
            status: None,
            backoffs: Reply::Waiting,
            history: Reply::Waiting,
            events: VecDeque::new(),
            filter,
            typing: None,
            paused: None,
            held: VecDeque::new(),
        }
    }

    /// Takes in what the link says. While paused, the daemon's data waits (the link's own state
    /// does not: the banner is always now).
    pub fn update(&mut self, update: Update, now: SystemTime) {
        match update {
            Update::Connected => {
                let lost = matches!(self.link, Link::Down { .. });
                self.link = Link::Up { reconnected: lost.then_some(now) };
            }
            Update::Lost { attempt, error, retry_in } => {
                self.link = Link::Down { attempt, error, retry_at: now + retry_in };
            }
            data if self.paused.is_some() => {
                if self.held.len() == HELD_MOST {
                    self.held.pop_front();
                }
                self.held.push_back(data);
            }
            Update::Status(status) => self.status = Some((*status, now)),
            Update::Backoffs(answer) => self.backoffs = served(answer, |list| (list, now)),
            Update::History(answer) => {
                if let Reply::Got(events) = &answer {
                    for event in events {
                        self.add_event(event.clone());
                    }
                    self.events.make_contiguous().sort_by_key(|event| moment(event.time.as_ref()));
                }
                self.history = served(answer, |_| ());
            }
            Update::Event(event) if event.reason == "PullProgress" => self.progress(&event),
            Update::Event(event) => self.add_event(*event),
        }
    }

    /// A pull's progress from its PullProgress event, fresher than the last GetStatus.
    fn progress(&mut self, event: &api::Event) {
        let Some((status, _)) = self.status.as_mut() else { return };
        if let Some(pull) = status.pulls.iter_mut().find(|pull| pull.image == event.image) {
            pull.progress.clone_from(&event.progress);
        }
    }

    /// Keeps `event` unless it is already there (a history overlapping live events, or the same
    /// daemon's history again after a short loss).
    fn add_event(&mut self, event: api::Event) {
        if self.events.iter().any(|kept| same_event(kept, &event)) {
            return;
        }
        if self.events.len() == EVENTS_KEPT {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }

    /// What a key does: q, Esc and Ctrl-C quit, `/` types a filter (Enter applies, Esc cancels),
    /// `p` pauses and resumes.
    pub fn key(&mut self, key: KeyEvent, now: SystemTime) -> Flow {
        if key.kind == KeyEventKind::Release {
            return Flow::Go;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Flow::Quit;
        }
        if let Some(typed) = self.typing.as_mut() {
            match key.code {
                KeyCode::Enter => self.filter = self.typing.take().unwrap_or_default().trim().to_owned(),
                KeyCode::Esc => self.typing = None,
                KeyCode::Backspace => {
                    typed.pop();
                }
                KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::CONTROL) => typed.push(c),
                _ => {}
            }
            return Flow::Go;
        }
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => return Flow::Quit,
            KeyCode::Char('/') => self.typing = Some(self.filter.clone()),
            KeyCode::Char('p') => self.pause(now),
            _ => {}
        }
        Flow::Go
    }

    /// Pauses, or resumes with every update held meanwhile.
    fn pause(&mut self, now: SystemTime) {
        if self.paused.take().is_none() {
            self.paused = Some(now);
            return;
        }
        for update in std::mem::take(&mut self.held) {
            self.update(update, now);
        }
    }

    /// The moment the daemon's data is shown at: now, or when paused.
    pub fn clock(&self, now: SystemTime) -> SystemTime {
        self.paused.unwrap_or(now)
    }

    /// Whether `image` passes the filter.
    pub fn shows(&self, image: &str) -> bool {
        self.filter.is_empty() || image.to_lowercase().contains(&self.filter.to_lowercase())
    }

    /// Whether the data on screen may no longer be true: the daemon is not answering.
    pub fn stale(&self) -> bool {
        !matches!(self.link, Link::Up { .. })
    }

    /// How long until a backoff's next try, counted down from its answer.
    pub fn retry_in(&self, entry: &api::BackoffEntry, now: SystemTime) -> Duration {
        let Reply::Got((_, answered)) = &self.backoffs else { return Duration::ZERO };
        let elapsed = self.clock(now).duration_since(*answered).unwrap_or_default();
        wire_duration(entry.retry_after.as_ref()).saturating_sub(elapsed)
    }

    /// The line across the top when the link has something to say.
    pub fn banner(&self, now: SystemTime) -> Option<Banner> {
        match &self.link {
            Link::Connecting => Some(Banner::Note(format!("connecting to {}…", self.socket))),
            Link::Down { attempt, error, retry_at } => {
                let next = retry_at.duration_since(now).unwrap_or_default();
                Some(Banner::Alert {
                    text: format!("daemon unreachable at {}: reconnecting (attempt {attempt})…", self.socket),
                    detail: format!("next try in {:.1}s; {error}", next.as_secs_f64()),
                })
            }
            Link::Up { reconnected: Some(at) } if now.duration_since(*at).unwrap_or_default() < RECONNECTED_FOR => {
                Some(Banner::Good(format!("reconnected to the daemon at {}", self.socket)))
            }
            Link::Up { .. } => match &self.status {
                Some((status, _)) if !status.runtime_reachable => {
                    Some(Banner::Warn(format!("the runtime does not answer: {}", status.runtime_error)))
                }
                _ => None,
            },
        }
    }
}

/// What the banner says, by how much it matters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Banner {
    Note(String),
    Good(String),
    /// The daemon answers, but its runtime does not.
    Warn(String),
    /// The daemon is unreachable: what is tried, and why it failed last.
    Alert {
        text: String,
        detail: String,
    },
}

fn served<T, U>(answer: Reply<T>, keep: impl FnOnce(T) -> U) -> Reply<U> {
    match answer {
        Reply::Waiting => Reply::Waiting,
        Reply::Unimplemented => Reply::Unimplemented,
        Reply::Got(answer) => Reply::Got(keep(answer)),
    }
}

/// Two copies of one event, rather than two events.
fn same_event(a: &api::Event, b: &api::Event) -> bool {
    a.time == b.time && a.reason == b.reason && a.image == b.image && a.message == b.message && a.pod == b.pod
}

#[cfg(test)]
mod tests;
