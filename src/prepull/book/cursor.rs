//! Where a page of the pre-pulls' list ended, as a page token.

use std::{
    cmp::Reverse,
    fmt,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use super::PrePull;

/// Where a page of the list ended: the last pre-pull's place in the list's order, so that the
/// next page goes on after it even if pre-pulls came or went meanwhile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    priority: i32,
    submitted: SystemTime,
    id: String,
}

impl Cursor {
    pub(super) fn after(entry: &PrePull) -> Self {
        Self { priority: entry.spec.priority, submitted: entry.submitted, id: entry.id.clone() }
    }

    pub(super) fn order(&self) -> (Reverse<i32>, SystemTime, &str) {
        (Reverse(self.priority), self.submitted, self.id.as_str())
    }

    /// A cursor as [`Cursor`]'s `Display` wrote it; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.splitn(4, '.');
        let priority = parts.next()?.parse().ok()?;
        let seconds: u64 = parts.next()?.parse().ok()?;
        let nanos: u32 = parts.next()?.parse().ok().filter(|nanos| *nanos < 1_000_000_000)?;
        let id =
            parts.next().filter(|id| id.len() == 16 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))?;
        let submitted = UNIX_EPOCH.checked_add(Duration::new(seconds, nanos))?;
        Some(Self { priority, submitted, id: id.to_owned() })
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let since = self.submitted.duration_since(UNIX_EPOCH).unwrap_or_default();
        write!(f, "{}.{}.{}.{}", self.priority, since.as_secs(), since.subsec_nanos(), self.id)
    }
}
