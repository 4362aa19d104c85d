//! Congestion control: the pure algorithms are `proto::cc`, re-exported here. (The emulated
//! switch the congestion benchmarks put between two engines is `portico_bench::bottleneck`.)

pub use proto::cc::*;
