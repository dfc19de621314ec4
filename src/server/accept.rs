//! The accept loop's side of the listener: tonic logs a failed accept at trace and tries again at
//! once, which at the file-descriptor limit (EMFILE) spins a core and says nothing. Here a
//! failure the next accept would repeat waits, doubling from 10 ms to 1 s, with a warning; one
//! that ends only the connection being accepted is tried again at once.

use std::{io, time::Duration};

use futures_util::Stream;
use tokio::net::{UnixListener, UnixStream};

/// The first wait after a failed accept, and the longest.
const FIRST_WAIT: Duration = Duration::from_millis(10);
const LONGEST_WAIT: Duration = Duration::from_secs(1);

/// Accepted connections; never an error, so tonic never spins on one.
pub fn connections(listener: UnixListener) -> impl Stream<Item = io::Result<UnixStream>> {
    futures_util::stream::unfold((listener, None::<Duration>), |(listener, mut waited)| async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    if waited.take().is_some() {
                        tracing::info!("accepting connections again");
                    }
                    return Some((Ok(stream), (listener, waited)));
                }
                Err(error) if only_this_connection(&error) => {
                    tracing::debug!(%error, "a connection ended while it was accepted");
                }
                Err(error) => {
                    let wait = next_wait(waited);
                    waited = Some(wait);
                    tracing::warn!(%error, retry_in = ?wait, "cannot accept connections (at the open-file limit? see LimitNOFILE)");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    })
}

/// Whether the failure ends only the connection being accepted (the next accept may succeed).
fn only_this_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionRefused
    )
}

/// The wait after `waited`: doubled, from [`FIRST_WAIT`] up to [`LONGEST_WAIT`].
fn next_wait(waited: Option<Duration>) -> Duration {
    waited.map_or(FIRST_WAIT, |waited| (waited * 2).min(LONGEST_WAIT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_a_second() {
        let mut waited = None;
        let waits: Vec<u128> = (0..10)
            .map(|_| {
                let wait = next_wait(waited);
                waited = Some(wait);
                wait.as_millis()
            })
            .collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
    }

    #[test]
    fn only_a_connection_level_failure_is_tried_again_at_once() {
        assert!(only_this_connection(&io::Error::from(io::ErrorKind::ConnectionAborted)));
        assert!(!only_this_connection(&io::Error::from_raw_os_error(24)), "EMFILE waits");
        assert!(!only_this_connection(&io::Error::from_raw_os_error(23)), "ENFILE waits");
    }
}
