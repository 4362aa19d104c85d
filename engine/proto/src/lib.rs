//! Portico's protocol cores: everything an RDMA NIC decides, with none of how it moves bytes.
//!
//! - [`transport`]: reliable-connected queue pairs (requester, responder, retransmission,
//!   memory regions and their checks, the persistence rules of seed 004);
//! - [`cc`]: congestion control, DCQCN and the congestion state carried in ACKs (seed 002);
//! - [`shaper`]: the traffic shaper with GET pacing by response size (seed 000);
//! - [`lpe`]: the sharded list-processing (Portals/MPI matching) engine (seed 001);
//! - [`placement`]: header/data placement (seed 003);
//! - [`rng`]: the one seeded generator (SplitMix64) every crate draws from.
//!
//! Pure by construction: this crate depends on [`wire`] and on `pmem` (the mapped memory that
//! registered regions are), never on DPDK, and reads no clock: every time is an argument in
//! nanoseconds. It builds and tests on a machine without DPDK.

#![forbid(unsafe_code)]

pub mod cc;
pub mod cm;
pub mod lpe;
pub mod placement;
pub mod rng;
pub mod shaper;
pub mod transport;
