//! Pure formatting, tested without a terminal.

#[cfg(test)]
pub mod hostile;
pub mod human;
pub mod json;
pub mod line;
pub mod progress;
pub mod table;
