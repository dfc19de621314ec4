//! Events framed for gRPC once, by one task, and sealed into batches that every watcher shares.
//!
//! The batcher runs while anyone watches. It frames each event as it comes into the open batch,
//! and seals the batch [`EVENT_LINGER`] after its first event, or sooner once it holds
//! [`BATCH_BYTES`]. A watcher of every event sends each sealed batch as it is: one write and one
//! wake-up per batch, with no copy and no encoding of its own. A filtered watcher sends the
//! slices of a batch its filter matches.
//!
//! Sealed batches wait in one ring holding the newest [`SUBSCRIBER_BUFFER`] events or more (a
//! whole batch at least). A watcher that falls behind the ring loses the oldest batches and is
//! told how many events went by, once, then goes on.

use std::{
    collections::VecDeque,
    ops::Range,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use tokio::{sync::watch, time::Instant};

use crate::{
    api,
    events::{self, Event, Events, Filter, Matcher, Next, SUBSCRIBER_BUFFER, Subscription},
};

/// How long a batch stays open after its first event, for others to go with it.
pub const EVENT_LINGER: Duration = Duration::from_millis(20);

/// A batch is sealed once it holds this many bytes, so that a watcher far behind is sent no
/// more at once than its flow-control window lets through before it reads.
pub const BATCH_BYTES: usize = 64 * 1024;

/// Where watchers get their batches; one per daemon.
pub struct Batches {
    events: Arc<Events>,
    ring: watch::Sender<Ring>,
    /// Whether the batcher runs; held while starting or stopping it, and while a watcher joins.
    batching: Mutex<bool>,
}

/// The sealed batches watchers have yet to read, oldest first.
#[derive(Default)]
struct Ring {
    batches: VecDeque<Arc<Batch>>,
    /// Events in `batches`.
    events: usize,
    /// Publishing ended: nothing more will come.
    ended: bool,
}

/// Consecutive events, framed.
struct Batch {
    /// The number of the first event (events count from the daemon's start).
    first: u64,
    /// Each event with the range of `frames` its frame takes.
    events: Vec<(Arc<Event>, Range<usize>)>,
    frames: Bytes,
}

impl Batch {
    /// The number of the event after the last.
    fn end(&self) -> u64 {
        self.first + self.events.len() as u64
    }
}

impl Batches {
    pub fn new(events: Arc<Events>) -> Arc<Self> {
        Arc::new(Self { events, ring: watch::Sender::new(Ring::default()), batching: Mutex::new(false) })
    }

    /// A watcher of the events from now on that `filter` matches. Starts the batcher if it was not
    /// running.
    pub fn watch(self: &Arc<Self>, filter: Filter) -> Watcher {
        let filter = filter.prepare();
        let mut batching = self.batching.lock().unwrap_or_else(PoisonError::into_inner);
        let ring = self.ring.subscribe();
        if !*batching {
            *batching = true;
            let (subscription, sent) = self.events.subscribe_counted(Filter::default());
            tokio::spawn(self.clone().batch(subscription, sent));
        }
        Watcher { ring, next: self.events.sent(), filter, pending: VecDeque::new() }
    }

    /// Frames events into batches until no one watches.
    async fn batch(self: Arc<Self>, mut subscription: Subscription, mut next: u64) {
        loop {
            let first = tokio::select! {
                first = subscription.next() => first,
                () = self.ring.closed() => {
                    if self.stop_if_unwatched() {
                        return;
                    }
                    continue;
                }
            };
            let first = match first {
                Some(Next::Event(event)) => event,
                // Those numbers go by unseen: the watchers are told they lost them.
                Some(Next::Lagged(lost)) => {
                    next += lost;
                    continue;
                }
                None => {
                    self.ring.send_modify(|ring| ring.ended = true);
                    return;
                }
            };
            let mut open = OpenBatch::new(next, first);
            let sealing = Instant::now() + EVENT_LINGER;
            while open.frames.len() < BATCH_BYTES {
                let more = match subscription.try_next() {
                    Some(more) => Some(more),
                    None => tokio::select! {
                        more = subscription.next() => more,
                        () = tokio::time::sleep_until(sealing) => break,
                    },
                };
                match more {
                    Some(Next::Event(event)) => open.push(event),
                    // Sealed here, so that the batches' numbers show the gap.
                    Some(Next::Lagged(lost)) => {
                        next = open.end() + lost;
                        if !open.events.is_empty() {
                            self.seal(open.seal());
                        }
                        open = OpenBatch::empty(next);
                    }
                    None => break,
                }
            }
            next = open.end();
            if !open.events.is_empty() {
                self.seal(open.seal());
            }
        }
    }

    fn seal(&self, batch: Batch) {
        self.ring.send_modify(|ring| {
            ring.events += batch.events.len();
            ring.batches.push_back(Arc::new(batch));
            while ring.events > SUBSCRIBER_BUFFER && ring.batches.len() > 1 {
                if let Some(oldest) = ring.batches.pop_front() {
                    ring.events -= oldest.events.len();
                }
            }
        });
    }

    /// Stops the batcher, unless a watcher joined meanwhile.
    fn stop_if_unwatched(&self) -> bool {
        let mut batching = self.batching.lock().unwrap_or_else(PoisonError::into_inner);
        if self.ring.receiver_count() > 0 {
            return false;
        }
        *batching = false;
        self.ring.send_modify(|ring| *ring = Ring::default());
        true
    }
}

/// The batch the batcher is filling.
struct OpenBatch {
    first: u64,
    events: Vec<(Arc<Event>, Range<usize>)>,
    frames: BytesMut,
}

impl OpenBatch {
    fn empty(first: u64) -> Self {
        Self { first, events: Vec::new(), frames: BytesMut::new() }
    }

    fn new(first: u64, event: Arc<Event>) -> Self {
        let mut open = Self::empty(first);
        open.push(event);
        open
    }

    fn push(&mut self, event: Arc<Event>) {
        let start = self.frames.len();
        put_frame(&mut self.frames, &super::wire_event(&event, 0));
        self.events.push((event, start..self.frames.len()));
    }

    fn end(&self) -> u64 {
        self.first + self.events.len() as u64
    }

    fn seal(self) -> Batch {
        Batch { first: self.first, events: self.events, frames: self.frames.freeze() }
    }
}

/// Appends `message` framed as gRPC frames it: uncompressed, its length in four bytes, then
/// itself.
fn put_frame(frames: &mut BytesMut, message: &api::Event) {
    let length = message.encoded_len();
    frames.reserve(5 + length);
    frames.put_u8(0);
    // An event is made from a request of at most API_MAX_REQUEST_BYTES: far below 4 GiB.
    frames.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    message.encode_raw(frames);
}

/// One watcher's read of the batches.
pub struct Watcher {
    ring: watch::Receiver<Ring>,
    /// The number of the next event this watcher has not seen.
    next: u64,
    filter: Matcher,
    /// What is ready to send, in order.
    pending: VecDeque<Bytes>,
}

/// Publishing ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended;

impl Watcher {
    /// The next gRPC frames to send: a sealed batch, the slices of it the filter matches, or word
    /// of lost events.
    pub async fn next(&mut self) -> Result<Bytes, Ended> {
        loop {
            if let Some(frames) = self.pending.pop_front() {
                return Ok(frames);
            }
            let unread: Vec<Arc<Batch>> = {
                let ring = self.ring.borrow_and_update();
                if ring.ended {
                    return Err(Ended);
                }
                ring.batches.iter().filter(|batch| batch.end() > self.next).cloned().collect()
            };
            for batch in unread {
                self.read(&batch);
            }
            if self.pending.is_empty() && self.ring.changed().await.is_err() {
                return Err(Ended);
            }
        }
    }

    /// Queues what this watcher sends of `batch`.
    fn read(&mut self, batch: &Batch) {
        if batch.first > self.next {
            let lost = batch.first - self.next;
            let mut frames = BytesMut::new();
            put_frame(&mut frames, &super::wire_event(&events::lagged(lost), lost));
            self.pending.push_back(frames.freeze());
            self.next = batch.first;
        }
        // Events published before this watcher came are in the batch open at the time.
        let seen = usize::try_from(self.next - batch.first).unwrap_or(usize::MAX);
        self.next = batch.end();
        if seen == 0 && self.filter.matches_all() {
            self.pending.push_back(batch.frames.clone());
            return;
        }
        let mut runs: Vec<Range<usize>> = Vec::new();
        for (_, frame) in batch.events.iter().skip(seen).filter(|(event, _)| self.filter.matches(event)) {
            match runs.last_mut() {
                Some(run) if run.end == frame.start => run.end = frame.end,
                _ => runs.push(frame.clone()),
            }
        }
        match runs.as_slice() {
            [] => {}
            [run] => self.pending.push_back(batch.frames.slice(run.clone())),
            _ => {
                let mut frames = BytesMut::with_capacity(runs.iter().map(ExactSizeIterator::len).sum());
                for run in runs {
                    frames.extend_from_slice(&batch.frames[run]);
                }
                self.pending.push_back(frames.freeze());
            }
        }
    }
}

#[cfg(test)]
mod tests;
