//! The files cri-imaged keeps or is given (pull records, intents, image ages, the config file).
//!
//! - [`read`]: every read takes a file as hostile input: a regular file only, to a cap; one that
//!   is not can be set aside.
//! - [`private`]: state is the daemon's user's alone: a directory others can write is tightened,
//!   one another user owns refused, a file either way set aside.
//! - [`state_dir`]: the directories of state files cri-imaged keeps, written crash-safely.

pub mod private;
pub mod read;
pub mod state_dir;

pub use self::{
    private::{PrivateError, secure_dir},
    read::{Links, QUARANTINE_SUFFIX, ReadError, Refused, quarantine, read_bounded, read_named, read_private},
    state_dir::{STATE_FILE_LIMIT, StateDir},
};
