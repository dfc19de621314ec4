//! Whether the last configuration reload (SIGHUP) was refused, when and why: the reloader records
//! it, GetStatus shows it until a reload succeeds, so that a refusal is not in the log alone while
//! the status shows the old configuration as if all were well.

use std::{
    sync::{Mutex, PoisonError},
    time::SystemTime,
};

/// A refused reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub at: SystemTime,
    /// The reload's error, as logged: the file, the line, the flag and why.
    pub reason: String,
}

/// The last reload's refusal, shared by the reloader and GetStatus; `None` before any reload,
/// and after one that succeeded.
#[derive(Debug, Default)]
pub struct LastReload(Mutex<Option<Refusal>>);

impl LastReload {
    pub fn refused(&self, at: SystemTime, reason: String) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Refusal { at, reason });
    }

    pub fn applied(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    pub fn refusal(&self) -> Option<Refusal> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_refusal_is_kept_until_a_reload_succeeds_the_newest_one_said() {
        let last = LastReload::default();
        assert_eq!(last.refusal(), None, "no reload yet");
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(60);
        last.refused(at, "first".to_owned());
        last.refused(at + Duration::from_secs(1), "second".to_owned());
        let said = last.refusal().expect("kept");
        assert_eq!((said.at, said.reason.as_str()), (at + Duration::from_secs(1), "second"));
        last.applied();
        assert_eq!(last.refusal(), None, "a reload that succeeded ends it");
    }
}
