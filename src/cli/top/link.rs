//! The link to the daemon: subscribe to its events, read its history, ask its status every
//! interval; when it goes (stopped, restarting, not started yet), say so and connect again,
//! waiting longer each time. Only permission denied ends it: waiting would not help.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};
use tonic::{Code, Status, Streaming};

use super::model::{Reply, Update, reconnect_wait};
use crate::{
    api,
    cli::{CliError, client::Daemon},
    config::client::Connection,
};

/// The recent events asked for at each connect: more than a screen shows.
const HISTORY: u32 = 100;

/// Runs the link until permission is denied, sending what it learns to `updates`. `first` is the
/// connect made before the screen was drawn. While `paused`, the status is not asked for (each
/// GetStatus probes the runtime), and reconnects still go on.
pub async fn run(
    connection: &Connection,
    interval: Duration,
    first: Result<Daemon, CliError>,
    updates: &mpsc::Sender<Update>,
    paused: &watch::Receiver<bool>,
) -> CliError {
    let mut daemon = first;
    // Attempts since the daemon last answered a GetStatus.
    let mut attempt = 0;
    loop {
        match daemon {
            Ok(mut connected) => {
                let error = session(&mut connected, connection.timeout, interval, updates, paused, &mut attempt).await;
                daemon = Err(error);
            }
            Err(error @ CliError::Permission { .. }) => return error,
            Err(error) => {
                attempt += 1;
                let wait = reconnect_wait(attempt);
                let _ = updates.send(Update::Lost { attempt, error: error.to_string(), retry_in: wait }).await;
                tokio::time::sleep(wait).await;
                daemon = Daemon::connect(connection).await;
            }
        }
    }
}

/// One connection's life: subscribed, then polled every `interval` until a call fails; that
/// failure is returned.
async fn session(
    daemon: &mut Daemon,
    timeout: Duration,
    interval: Duration,
    updates: &mpsc::Sender<Update>,
    paused: &watch::Receiver<bool>,
    attempt: &mut u32,
) -> CliError {
    let socket = daemon.socket.clone();
    let lost = |status: Status, method| CliError::from_status(&status, &socket, method);
    // Watching before listing: an event between the two is in one or both, never neither. The
    // filter is ours, not the daemon's: it changes as the person types.
    let watching = daemon.client.watch_events(api::WatchEventsRequest::default());
    let mut stream = match tokio::time::timeout(timeout, watching).await {
        Err(_) => return CliError::NoAnswer { socket: socket.clone(), timeout },
        Ok(Ok(answer)) => Some(answer.into_inner()),
        Ok(Err(status)) if status.code() == Code::Unimplemented => None,
        Ok(Err(status)) => return lost(status, "WatchEvents"),
    };
    let request = api::ListEventsRequest { filter: None, limit: HISTORY };
    let history = match daemon.client.list_events(daemon.timed(request)).await {
        Ok(answer) => Reply::Got(answer.into_inner().events),
        Err(status) if status.code() == Code::Unimplemented => Reply::Unimplemented,
        Err(status) => return lost(status, "ListEvents"),
    };
    let _ = updates.send(Update::Connected).await;
    let _ = updates.send(Update::History(history)).await;
    // Never faster than the interval, however late a tick is taken.
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // An older daemon does not list backoffs; asked once a connection, in case it was upgraded.
    let mut lists_backoffs = true;
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                if *paused.borrow() {
                    continue;
                }
                let status = match daemon.client.get_status(daemon.timed(api::GetStatusRequest::default())).await {
                    Ok(answer) => answer.into_inner(),
                    Err(status) => return lost(status, "GetStatus"),
                };
                *attempt = 0;
                let _ = updates.send(Update::Status(Box::new(status))).await;
                if !lists_backoffs {
                    continue;
                }
                let backoffs = match daemon.client.list_backoffs(daemon.timed(api::ListBackoffsRequest {})).await {
                    Ok(answer) => Reply::Got(answer.into_inner()),
                    Err(status) if status.code() == Code::Unimplemented => Reply::Unimplemented,
                    Err(status) => return lost(status, "ListBackoffs"),
                };
                lists_backoffs = matches!(backoffs, Reply::Got(_));
                let _ = updates.send(Update::Backoffs(backoffs)).await;
            }
            event = next_event(&mut stream) => match event {
                Some(Ok(event)) => {
                    let _ = updates.send(Update::Event(Box::new(event))).await;
                }
                Some(Err(status)) => return lost(status, "WatchEvents"),
                None => return CliError::Lost { socket: socket.clone(), error: "the event stream ended".to_owned() },
            },
        }
    }
}

/// The next event, or never without a stream (a daemon that does not serve WatchEvents).
async fn next_event(stream: &mut Option<Streaming<api::Event>>) -> Option<Result<api::Event, Status>> {
    match stream {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}
