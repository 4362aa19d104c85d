//! portico bench shaper (in progress).
pub mod report;
