//! The files cri-imaged keeps or is given (pull records, intents, image ages, the config file).
//!
//! - [`read`]: every read takes a file as hostile input: a regular file only, to a cap; one that
//!   is not can be set aside.
//! - [`state_dir`]: the directories of state files cri-imaged keeps, written crash-safely.

pub mod read;
pub mod state_dir;

pub use self::{
    read::{Links, QUARANTINE_SUFFIX, ReadError, Refused, quarantine, read_bounded, read_named},
    state_dir::{STATE_FILE_LIMIT, StateDir},
};
