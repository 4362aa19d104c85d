//! RDMA on the dataplane. The engine and the application's API are the `node` crate,
//! re-exported here; this module adds what needs DPDK: [`RdmaStage`], which runs nodes on a
//! worker (received mbufs go to the node, which places data straight into registered
//! memory; the node's packets are emitted straight from registered memory into fresh
//! mbufs), and [`loopback`], two engines joined by rings on one EAL.

pub use node::*;

pub mod loopback;
mod stage;

#[cfg(test)]
pub(crate) use stage::COUNTER_NAMES;
pub use stage::{RdmaCounters, RdmaSlot, RdmaStage};

/// Data room of the mbufs an RDMA engine uses: headroom plus a 4096-byte MTU payload plus
/// every RoCEv2 header, pad and ICRC, so any frame fits one segment.
pub const FRAME_DATA_ROOM: u16 =
    (dpdk_sys::RTE_PKTMBUF_HEADROOM as usize + 4096 + crate::wire::roce::MAX_FRAME_OVERHEAD) as u16;
