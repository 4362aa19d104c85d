//! Congestion control (seed 002, "congestion carried in ACKs"), its DCQCN baseline, and the
//! bottleneck emulator both are measured through.
//!
//! - [`bottleneck`]: a byte-counted FIFO served at a set rate, marking ECN CE on the
//!   instantaneous queue between Kmin and Kmax, dropping at the tail when full, and adding a
//!   one-way delay; what a congested switch port does to the packets through it.

pub mod bottleneck;
