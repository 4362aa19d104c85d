//! Congestion control: the pure algorithms are `proto::cc`, re-exported here; [`bottleneck`]
//! is the emulated switch the congestion benchmarks put between two engines.

pub use proto::cc::*;

pub mod bottleneck;
