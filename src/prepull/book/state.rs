//! How far a pre-pull got, its text kept within the book's bounds.

use super::{MAX_IMAGE_REF, MAX_MESSAGE, MAX_REASON};

/// How far a pre-pull got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Queued,
    Pulling,
    /// Waits: pulled now, the image would take the image filesystem over image GC's high
    /// threshold (`DiskPressure`). Queued again when room is looked for next.
    Held {
        reason: String,
        message: String,
    },
    Done {
        image_ref: String,
    },
    Failed {
        reason: String,
        message: String,
    },
    Cancelled,
}

impl State {
    /// Every state's name, as [`State::as_str`] says it.
    pub const NAMES: [&'static str; 6] = ["queued", "pulling", "held", "done", "failed", "cancelled"];

    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Pulling => "pulling",
            Self::Held { .. } => "held",
            Self::Done { .. } => "done",
            Self::Failed { .. } => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn ended(&self) -> bool {
        matches!(self, Self::Done { .. } | Self::Failed { .. } | Self::Cancelled)
    }

    /// The state with its text within the book's bounds ([`MAX_IMAGE_REF`], [`MAX_REASON`],
    /// [`MAX_MESSAGE`]): what the runtime or a pull's error says is not ours to bound.
    pub fn clipped(self) -> Self {
        match self {
            Self::Done { image_ref } => Self::Done { image_ref: clip(image_ref, MAX_IMAGE_REF) },
            Self::Held { reason, message } => {
                Self::Held { reason: clip(reason, MAX_REASON), message: clip(message, MAX_MESSAGE) }
            }
            Self::Failed { reason, message } => {
                Self::Failed { reason: clip(reason, MAX_REASON), message: clip(message, MAX_MESSAGE) }
            }
            other => other,
        }
    }
}

/// `text` cut to at most `max` bytes, at a character's boundary, marked with `…` when cut.
pub fn clip(mut text: String, max: usize) -> String {
    const MARK: &str = "…";
    if text.len() <= max {
        return text;
    }
    let mut end = max.saturating_sub(MARK.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(MARK);
    text
}
