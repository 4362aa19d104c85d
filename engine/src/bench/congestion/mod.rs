//! `portico bench congestion` (to be written).

pub mod report;
