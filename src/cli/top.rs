//! `cri-imaged top`: what the daemon is doing, live, on the whole terminal; through a restart of
//! the daemon too (the last answers stay on screen, marked stale, while it reconnects).
//!
//! - `model`: what is known and typed, changed only by its methods (pure).
//! - `view`: the screen drawn from the model (pure).
//! - `link`: the daemon's answers and events as updates, reconnecting when it goes.
//! - here: the terminal, and the loop that feeds keys and updates to the model and draws.

mod link;
mod model;
mod view;

use std::{io::IsTerminal, time::SystemTime};

use crossterm::event::{Event, EventStream};
use futures_util::StreamExt;
use ratatui::DefaultTerminal;
use tokio::sync::{mpsc, watch};

use self::model::{Flow, Model, Update};
use super::{CliError, client::Daemon};
use crate::config::client::TopArgs;

/// How often the screen is drawn with nothing new: clock, countdowns, the banner's next try.
const REDRAW: std::time::Duration = std::time::Duration::from_millis(250);

pub async fn run(args: TopArgs) -> Result<(), CliError> {
    if !std::io::stdout().is_terminal() {
        return Err(CliError::Usage(
            "top draws on a terminal; for scripts, `cri-imaged status -o json` or `cri-imaged events --follow -o json`"
                .to_owned(),
        ));
    }
    // A first connect before the screen: permission denied is told on the plain terminal. Any
    // other failure is the banner's (a person may start top before the daemon).
    let first = Daemon::connect(&args.connection).await;
    if let Err(error @ CliError::Permission { .. }) = first {
        return Err(error);
    }
    let mut model = Model::new(args.connection.socket.display().to_string(), args.filter.clone().unwrap_or_default());
    let (sender, updates) = mpsc::channel(256);
    let (pause, paused) = watch::channel(false);
    let mut screen = Screen::enter()?;
    tokio::select! {
        shown = show(&mut screen.0, &mut model, updates, pause) => shown,
        error = link::run(&args.connection, args.interval, first, &sender, &paused) => Err(error),
    }
}

/// The loop: draw, then wait for a key, an update or the next redraw.
async fn show(
    terminal: &mut DefaultTerminal,
    model: &mut Model,
    mut updates: mpsc::Receiver<Update>,
    pause: watch::Sender<bool>,
) -> Result<(), CliError> {
    let mut keys = EventStream::new();
    let mut redraw = tokio::time::interval(REDRAW);
    loop {
        terminal.draw(|frame| view::draw(frame, model, SystemTime::now()))?;
        tokio::select! {
            _ = redraw.tick() => {}
            update = updates.recv() => {
                let Some(update) = update else { return Ok(()) };
                model.update(update, SystemTime::now());
                // A burst (a history, events at once) drawn once.
                while let Ok(update) = updates.try_recv() {
                    model.update(update, SystemTime::now());
                }
            }
            key = keys.next() => match key {
                Some(Ok(Event::Key(key))) => {
                    if model.key(key, SystemTime::now()) == Flow::Quit {
                        return Ok(());
                    }
                    let now_paused = model.paused.is_some();
                    pause.send_if_modified(|paused| {
                        let changed = *paused != now_paused;
                        *paused = now_paused;
                        changed
                    });
                }
                // A resize is drawn at once; other input is not ours.
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(CliError::Output(error)),
                None => return Ok(()),
            },
        }
    }
}

/// The terminal in raw mode on the alternate screen, given back as it was when dropped: on
/// quit, on error, and when Ctrl-C's signal drops the command (a panic is ratatui's hook's).
struct Screen(DefaultTerminal);

impl Screen {
    fn enter() -> Result<Self, CliError> {
        match ratatui::try_init() {
            Ok(terminal) => Ok(Self(terminal)),
            Err(error) => {
                ratatui::restore();
                Err(CliError::Output(error))
            }
        }
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = self.0.show_cursor();
        ratatui::restore();
    }
}
