//! Pure formatting, tested without a terminal.

pub mod human;
pub mod progress;
pub mod table;
