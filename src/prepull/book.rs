//! The book of pre-pulls (pure, given `now`): what was asked for and how far each got. One entry
//! per image, runtime handler and namespace, under an id derived from them, so the same image asked
//! again is the same pre-pull, on every node and after every restart. Which queued pre-pulls go next:
//! highest priority first, then the oldest.

use std::{
    cmp::Reverse,
    collections::BTreeMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use sha2::{Digest, Sha256};

use crate::reference;

mod cursor;
mod state;

pub use self::{
    cursor::Cursor,
    state::{State, clip},
};

/// The most pre-pulls that may be live at once (queued, pulling, held, or done and pinned); a
/// submission past it is refused. Ended pre-pulls no longer pinned do not count, nor declared ones.
pub const MAX_PRE_PULLS: usize = 1024;

/// The most ended pre-pulls, no longer pinned, kept for display; past it, those that ended first
/// are forgotten first.
pub const MAX_ENDED_KEPT: usize = 1024;

/// The longest runtime handler: a DNS label, as a RuntimeClass's handler.
pub const MAX_RUNTIME_HANDLER: usize = 63;

/// The longest namespace: a Kubernetes namespace's name is a DNS label.
pub const MAX_NAMESPACE: usize = 63;

/// The longest image ref kept (the runtime's answer; containerd's is 71 bytes).
pub const MAX_IMAGE_REF: usize = 512;

/// The longest reason kept (the kubelet's reasons are a few words).
pub const MAX_REASON: usize = 128;

/// The longest message kept: the start of a longer one, marked as cut.
pub const MAX_MESSAGE: usize = 1024;

/// How long a finished pre-pull stays listed, unless still pinned.
pub const KEPT_AFTER_END: Duration = Duration::from_secs(3600);

/// The longest pin a pre-pull may ask for.
pub const MAX_PIN: Duration = Duration::from_secs(30 * 24 * 3600);

/// What a pre-pull is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The image with its default tag, as the runtime is asked for it.
    pub image: String,
    pub runtime_handler: String,
    /// The namespace whose image policy admits it (its pods' file, its audit mode); empty: the
    /// node's default policy.
    pub namespace: String,
    /// Higher goes first.
    pub priority: i32,
    /// Failed with `DeadlineExceeded` if not done by then.
    pub deadline: Option<SystemTime>,
    /// Kept from image GC for this long once done.
    pub pin_for: Option<Duration>,
    /// Listed by `--pre-pull`: kept present while listed, pulled again if removed.
    pub declared: bool,
    /// The uid that asked for it over the API (as the kernel named the caller), who may cancel
    /// it with the pull role; `None` for one declared, or kept before owners were.
    pub owner: Option<u32>,
}

/// One pre-pull.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrePull {
    pub id: String,
    pub spec: Spec,
    pub state: State,
    pub submitted: SystemTime,
    pub finished: Option<SystemTime>,
    /// Which credentials it pulls with (a fingerprint kept in memory only); `None` for the
    /// node's own. After a restart it is `None`: the credentials were never written down.
    pub credentials: Option<u64>,
    /// Times it was queued again after a restart interrupted it.
    pub resumed: u32,
}

impl PrePull {
    /// Until when image GC keeps its image: while declared and done, or for its pin once done.
    pub fn pinned_until(&self) -> Option<SystemTime> {
        match (&self.state, self.finished, self.spec.pin_for) {
            (State::Done { .. }, Some(finished), Some(pin_for)) => finished.checked_add(pin_for),
            _ => None,
        }
    }

    /// Whether it counts against [`MAX_PRE_PULLS`]: not declared, and not ended or still pinned.
    pub fn counts(&self, now: SystemTime) -> bool {
        !self.spec.declared && (!self.state.ended() || self.pinned_now(now))
    }

    /// Whether it is kept only to be shown: ended, no longer pinned, not declared.
    fn shown_only(&self, now: SystemTime) -> bool {
        !self.spec.declared && self.state.ended() && !self.pinned_now(now)
    }

    fn pinned_now(&self, now: SystemTime) -> bool {
        self.pinned_until().is_some_and(|until| until > now)
    }

    /// Its place in the list: highest priority first, then oldest, then by id.
    fn order(&self) -> (Reverse<i32>, SystemTime, &str) {
        (Reverse(self.spec.priority), self.submitted, self.id.as_str())
    }
}

/// Why a submission or a cancellation is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BookError {
    #[error("image {image:?} is not a valid image reference: {reason}")]
    InvalidImage { image: String, reason: String },
    #[error("pin_for {0:?} is longer than the longest pin, 30 days")]
    PinTooLong(Duration),
    #[error("the deadline has passed")]
    DeadlinePassed,
    #[error("{image:?} is being pre-pulled with other credentials (pre-pull {id}); cancel it first")]
    OtherCredentials { image: String, id: String },
    #[error(
        "{MAX_PRE_PULLS} pre-pulls are queued, pulling, held or pinned already; cancel some or wait for them to end (ended and cancelled ones do not count)"
    )]
    Full,
    #[error("no pre-pull {0:?}")]
    NotFound(String),
    #[error("pre-pull {0} is declared by --pre-pull; remove it there")]
    Declared(String),
}

/// The stable id of a pre-pull of `image` (with its default tag) for `runtime_handler` and
/// `namespace` (one without a namespace has the id it had before pre-pulls had namespaces).
pub fn id_of(image: &str, runtime_handler: &str, namespace: &str) -> String {
    let mut digest = Sha256::new().chain_update(image).chain_update([0]).chain_update(runtime_handler);
    if !namespace.is_empty() {
        digest = digest.chain_update([0]).chain_update(namespace);
    }
    digest.finalize()[..8].iter().map(|byte| format!("{byte:02x}")).collect()
}

/// `image` with its default tag, or why it is no image.
pub fn with_default_tag(image: &str) -> Result<String, BookError> {
    reference::parse_with_default_tag(image).map(|(_, tagged)| tagged).map_err(|error| BookError::InvalidImage {
        image: crate::messages::echo(image).into_owned(),
        reason: error.to_string(),
    })
}

/// Every pre-pull, by id.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Book {
    entries: BTreeMap<String, PrePull>,
}

impl Book {
    pub fn get(&self, id: &str) -> Option<&PrePull> {
        self.entries.get(id)
    }

    /// Every pre-pull, highest priority first, then oldest.
    pub fn list(&self) -> Vec<&PrePull> {
        let mut all: Vec<&PrePull> = self.entries.values().collect();
        all.sort_by(|a, b| a.order().cmp(&b.order()));
        all
    }

    /// At most `size` pre-pulls of the list after `after` (from the start without), and where
    /// the next page starts when there are more.
    pub fn page(&self, after: Option<&Cursor>, size: usize) -> (Vec<&PrePull>, Option<Cursor>) {
        let mut rest: Vec<&PrePull> = self.list();
        if let Some(after) = after {
            rest.retain(|entry| entry.order() > after.order());
        }
        let more = rest.len() > size;
        rest.truncate(size);
        let next = more.then(|| rest.last().map(|last| Cursor::after(last))).flatten();
        (rest, next)
    }

    /// How many pre-pulls are in each state, for every state in [`State::NAMES`]' order.
    pub fn count_by_state(&self) -> [(&'static str, usize); 6] {
        State::NAMES.map(|state| (state, self.entries.values().filter(|entry| entry.state.as_str() == state).count()))
    }

    /// How many pre-pulls count against [`MAX_PRE_PULLS`] now.
    fn counted(&self, now: SystemTime) -> usize {
        self.entries.values().filter(|entry| entry.counts(now)).count()
    }

    /// Asks for `spec` with `credentials`: a new pre-pull, or the one of the same image already
    /// listed (queued again if it failed or was cancelled).
    pub fn submit(&mut self, spec: Spec, credentials: Option<u64>, now: SystemTime) -> Result<&PrePull, BookError> {
        if spec.pin_for.is_some_and(|pin| pin > MAX_PIN) {
            return Err(BookError::PinTooLong(spec.pin_for.unwrap_or_default()));
        }
        if spec.deadline.is_some_and(|deadline| deadline <= now) {
            return Err(BookError::DeadlinePassed);
        }
        let id = id_of(&spec.image, &spec.runtime_handler, &spec.namespace);
        let full = self.counted(now) >= MAX_PRE_PULLS;
        if let Some(entry) = self.entries.get_mut(&id) {
            let running = !entry.state.ended();
            if running && entry.credentials.is_some() && entry.credentials != credentials {
                return Err(BookError::OtherCredentials { image: entry.spec.image.clone(), id });
            }
            if !running && !matches!(entry.state, State::Done { .. }) {
                // Queued again, it counts again.
                if full && !(entry.spec.declared || spec.declared) {
                    return Err(BookError::Full);
                }
                entry.state = State::Queued;
                entry.finished = None;
                entry.submitted = now;
                // Asked for afresh: it is the new asker's to cancel.
                entry.spec.owner = spec.owner.or(entry.spec.owner);
            }
            entry.credentials = credentials.or(entry.credentials);
            entry.spec.declared |= spec.declared;
            entry.spec.priority = entry.spec.priority.max(spec.priority);
            return Ok(&self.entries[&id]);
        }
        if full && !spec.declared {
            return Err(BookError::Full);
        }
        let entry = PrePull {
            id: id.clone(),
            spec,
            state: State::Queued,
            submitted: now,
            finished: None,
            credentials,
            resumed: 0,
        };
        Ok(self.entries.entry(id).or_insert(entry))
    }

    /// Cancels a pre-pull that has not ended, and ends the pin of one done and pinned (image GC
    /// no longer keeps its image for it); either no longer counts against [`MAX_PRE_PULLS`]. One
    /// declared by the configuration cannot be cancelled.
    pub fn cancel(&mut self, id: &str, now: SystemTime) -> Result<PrePull, BookError> {
        let entry =
            self.entries.get_mut(id).ok_or_else(|| BookError::NotFound(crate::messages::echo(id).into_owned()))?;
        if entry.spec.declared {
            return Err(BookError::Declared(entry.id.clone()));
        }
        if !entry.state.ended() {
            entry.state = State::Cancelled;
            entry.finished = Some(now);
        } else if entry.pinned_now(now) {
            entry.spec.pin_for = None;
        }
        let cancelled = entry.clone();
        self.forget_past_display_cap(now);
        Ok(cancelled)
    }

    /// The queued pre-pulls to start now so that `running_at_most` run, in order.
    pub fn next(&self, running_at_most: usize) -> Vec<String> {
        let running = self.entries.values().filter(|entry| entry.state == State::Pulling).count();
        let room = running_at_most.saturating_sub(running);
        let queued = self.list().into_iter().filter(|entry| entry.state == State::Queued);
        queued.take(room).map(|entry| entry.id.clone()).collect()
    }

    pub fn started(&mut self, id: &str) {
        if let Some(entry) = self.entries.get_mut(id).filter(|entry| entry.state == State::Queued) {
            entry.state = State::Pulling;
        }
    }

    /// A pre-pull's pull was stopped for want of room: it waits, held.
    pub fn held(&mut self, id: &str, reason: &str, message: String) {
        if let Some(entry) = self.entries.get_mut(id).filter(|entry| entry.state == State::Pulling) {
            entry.state = State::Held { reason: reason.to_owned(), message }.clipped();
        }
    }

    /// Pre-pulls held for want of room are queued again (room may have been made since).
    pub fn release_held(&mut self) -> bool {
        let mut released = false;
        for entry in self.entries.values_mut().filter(|entry| matches!(entry.state, State::Held { .. })) {
            entry.state = State::Queued;
            released = true;
        }
        released
    }

    /// A pre-pull's pull ended (unless it was cancelled meanwhile).
    pub fn ended(&mut self, id: &str, state: State, now: SystemTime) {
        if let Some(entry) = self.entries.get_mut(id).filter(|entry| entry.state == State::Pulling) {
            entry.state = state.clipped();
            entry.finished = Some(now);
            self.forget_past_display_cap(now);
        }
    }

    /// Forgets the ended pre-pulls kept only to be shown past [`MAX_ENDED_KEPT`], those that
    /// ended first first; true when it forgot any.
    fn forget_past_display_cap(&mut self, now: SystemTime) -> bool {
        let mut shown: Vec<(SystemTime, &str)> = self
            .entries
            .values()
            .filter(|entry| entry.shown_only(now))
            .map(|entry| (entry.finished.unwrap_or(UNIX_EPOCH), entry.id.as_str()))
            .collect();
        let Some(past) = shown.len().checked_sub(MAX_ENDED_KEPT).filter(|past| *past > 0) else { return false };
        shown.sort_unstable();
        let forgotten: Vec<String> = shown[..past].iter().map(|(_, id)| (*id).to_owned()).collect();
        for id in forgotten {
            self.entries.remove(&id);
        }
        true
    }

    /// Fails what is past its deadline, and forgets what ended long ago and is no longer
    /// pinned; true when anything changed.
    pub fn expire(&mut self, now: SystemTime) -> bool {
        let mut changed = false;
        for entry in self.entries.values_mut() {
            if !entry.state.ended() && entry.spec.deadline.is_some_and(|deadline| deadline <= now) {
                let message = format!("pre-pull of {:?} did not end by its deadline", entry.spec.image);
                entry.state = State::Failed { reason: "DeadlineExceeded".into(), message }.clipped();
                entry.finished = Some(now);
                changed = true;
            }
        }
        let before = self.entries.len();
        self.entries.retain(|_, entry| {
            let kept_until = entry.finished.and_then(|finished| finished.checked_add(KEPT_AFTER_END));
            let listed = entry.spec.declared || kept_until.is_none_or(|until| until > now);
            listed || entry.pinned_now(now)
        });
        self.forget_past_display_cap(now) || changed || self.entries.len() != before
    }

    /// Makes the declared pre-pulls `images` (with default tags): new ones are queued, and those
    /// no longer declared forgotten; true when anything changed.
    pub fn declare(&mut self, images: &[String], now: SystemTime) -> bool {
        let ids: Vec<String> = images.iter().map(|image| id_of(image, "", "")).collect();
        let before = self.clone();
        self.entries.retain(|id, entry| !entry.spec.declared || ids.contains(id));
        for image in images {
            let spec = Spec {
                image: image.clone(),
                runtime_handler: String::new(),
                namespace: String::new(),
                priority: 0,
                deadline: None,
                pin_for: None,
                declared: true,
                owner: None,
            };
            // Declared images are valid references (checked with the flags) and never over the cap.
            let _ = self.submit(spec, None, now);
        }
        *self != before
    }

    /// A declared pre-pull's image was found gone: it is queued again.
    pub fn gone(&mut self, id: &str, now: SystemTime) {
        if let Some(entry) = self.entries.get_mut(id).filter(|entry| matches!(entry.state, State::Done { .. })) {
            entry.state = State::Queued;
            entry.finished = None;
            entry.submitted = now;
        }
    }

    /// Images image GC must keep now: those of pinned pre-pulls.
    pub fn pinned(&self, now: SystemTime) -> Vec<String> {
        self.entries
            .values()
            .filter(|entry| entry.pinned_until().is_some_and(|until| until > now))
            .flat_map(|entry| match &entry.state {
                State::Done { image_ref } => vec![entry.spec.image.clone(), image_ref.clone()],
                _ => Vec::new(),
            })
            .collect()
    }

    /// The earliest moment something changes by itself (a deadline, a pin or a listing ends).
    pub fn next_change(&self) -> Option<SystemTime> {
        let times = self.entries.values().flat_map(|entry| {
            let deadline = entry.spec.deadline.filter(|_| !entry.state.ended());
            let forgotten = entry.finished.and_then(|finished| finished.checked_add(KEPT_AFTER_END));
            [deadline, entry.pinned_until(), forgotten]
        });
        times.flatten().min()
    }

    /// The book as a restart finds it at `now`: what was under way is queued again and counted
    /// resumed; no credentials survive; within the caps (what counts past [`MAX_PRE_PULLS`], last
    /// in the list's order, and what is only shown past [`MAX_ENDED_KEPT`] are forgotten).
    pub fn restored(entries: Vec<PrePull>, now: SystemTime) -> Self {
        let entries = entries
            .into_iter()
            .map(|mut entry| {
                // The id is the image's, whatever the file said.
                entry.id = id_of(&entry.spec.image, &entry.spec.runtime_handler, &entry.spec.namespace);
                match entry.state {
                    State::Pulling => {
                        entry.state = State::Queued;
                        entry.resumed += 1;
                    }
                    State::Held { .. } => entry.state = State::Queued,
                    _ => {}
                }
                entry.credentials = None;
                entry.state = entry.state.clipped();
                (entry.id.clone(), entry)
            })
            .collect();
        let mut book = Self { entries };
        let past_cap: Vec<String> = {
            let counted = book.list().into_iter().filter(|entry| entry.counts(now));
            counted.skip(MAX_PRE_PULLS).map(|entry| entry.id.clone()).collect()
        };
        for id in past_cap {
            book.entries.remove(&id);
        }
        book.forget_past_display_cap(now);
        book
    }

    /// Every entry, for keeping.
    pub fn entries(&self) -> impl Iterator<Item = &PrePull> {
        self.entries.values()
    }
}

#[cfg(test)]
mod tests;
