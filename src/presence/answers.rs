//! The CRI answers the pass-through remembers, under the presence cache's rules: ImageStatus
//! (not verbose) and ListImages, each by its request's bytes, answered with the runtime's bytes
//! as they came; and the image filesystem's snapshot (ImageFsInfo), served for a while.
//!
//! Keyed by the bytes asked, an answer needs no understanding of the runtime's names (a tag, a
//! digest, an id or a prefix of one, a filter): the same question gets the same answer until
//! anything changes. Absence is remembered too: a pull through cri-imaged forgets everything
//! before it is answered, and one behind its back comes as an image event. With zero staleness
//! (strict) nothing is remembered and every call asks the runtime.

use std::{collections::HashMap, time::Duration};

use bytes::Bytes;
use tokio::time::Instant;

use super::{PresenceCache, Ticket, metrics::Answered};

/// The default of `--image-fs-info-max-age`.
pub const DEFAULT_FS_INFO_MAX_AGE: Duration = Duration::from_secs(1);
/// The most bytes (questions and answers) remembered; past it, the answers start over. 1,000
/// images list in about 300 KiB.
pub const ANSWER_BYTES: usize = 32 << 20;
/// The most answers remembered; past it, they start over.
pub const ANSWERS: usize = 4096;

/// A CRI call whose answers are remembered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CriCall {
    ImageStatus,
    ListImages,
}

impl CriCall {
    fn answered(self) -> Answered {
        match self {
            Self::ImageStatus => Answered::ImageStatus,
            Self::ListImages => Answered::ListImages,
        }
    }
}

/// A question: the call and its request's bytes.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct Asked {
    call: CriCall,
    request: Bytes,
}

/// What is remembered; emptied with the rest of the cache.
#[derive(Debug, Default)]
pub(super) struct Remembered {
    by_question: HashMap<Asked, Bytes>,
    bytes: usize,
    /// The last ImageFsInfo answer and when it was asked.
    fs_info: Option<(Bytes, Instant)>,
}

impl Remembered {
    pub(super) fn clear(&mut self) {
        self.by_question.clear();
        self.bytes = 0;
        self.fs_info = None;
    }
}

impl PresenceCache {
    /// The runtime's answer to `call` with `request`, if remembered and the cache is proven
    /// current within the allowed staleness (waiting for a proof when it must); `None`: ask.
    pub async fn recall_answer(&self, call: CriCall, request: &Bytes, asked_at: Instant) -> Option<Bytes> {
        let asked = Asked { call, request: request.clone() };
        self.recall(asked_at, |cache| {
            let state = cache.state();
            cache.judge(&state, state.answers.by_question.get(&asked), asked_at, call.answered())
        })
        .await
    }

    /// A ticket to remember an answer about to be asked for; `None` while events are not
    /// watched, or in strict mode, where every call asks the runtime.
    pub fn answer_ticket(&self) -> Option<Ticket> {
        if self.max_staleness.is_zero() {
            return None;
        }
        self.ticket()
    }

    /// Remembers the runtime's `answer` to `call` with `request`, unless something changed since
    /// `ticket`. Both are copied: the buffers they came in may be far larger.
    pub fn remember_answer(&self, ticket: Ticket, call: CriCall, request: &[u8], answer: &[u8]) {
        let size = request.len() + answer.len();
        if size > ANSWER_BYTES {
            return;
        }
        let mut state = self.state();
        if !state.watching || state.generation != ticket.0 {
            return;
        }
        let answers = &mut state.answers;
        if answers.bytes + size > ANSWER_BYTES || answers.by_question.len() >= ANSWERS {
            answers.by_question.clear();
            answers.bytes = 0;
        }
        let asked = Asked { call, request: Bytes::copy_from_slice(request) };
        if let Some(replaced) = answers.by_question.insert(asked, Bytes::copy_from_slice(answer)) {
            answers.bytes -= request.len() + replaced.len();
        }
        answers.bytes += size;
    }

    /// The last image filesystem answer, while it is younger than the allowed age and no image
    /// has changed since it was asked.
    pub fn fs_info(&self, now: Instant) -> Option<Bytes> {
        let state = self.state();
        let (answer, asked_at) = state.answers.fs_info.as_ref()?;
        if now.saturating_duration_since(*asked_at) >= self.fs_info_max_age {
            return None;
        }
        self.metrics.hit(Answered::ImageFsInfo);
        Some(answer.clone())
    }

    /// A ticket to remember an image filesystem answer about to be asked for at `now`.
    pub fn fs_info_ticket(&self) -> Ticket {
        Ticket(self.state().generation)
    }

    /// Remembers the image filesystem `answer` asked for at `asked_at`, unless an image
    /// changed since `ticket`. Kept whether or not events are watched: its age bounds it.
    pub fn remember_fs_info(&self, ticket: Ticket, answer: &[u8], asked_at: Instant) {
        if self.fs_info_max_age.is_zero() {
            return;
        }
        let mut state = self.state();
        if state.generation == ticket.0 {
            state.answers.fs_info = Some((Bytes::copy_from_slice(answer), asked_at));
        }
    }

    /// How many CRI answers are remembered (the filesystem snapshot aside).
    pub fn answers_len(&self) -> usize {
        self.state().answers.by_question.len()
    }
}

#[cfg(test)]
mod tests;
