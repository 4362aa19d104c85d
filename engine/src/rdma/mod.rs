//! RDMA on the dataplane: a worker that speaks RoCEv2, and the application's side of it.
//!
//! - [`RdmaNode`] is one engine's state: its MAC and IPv4 address, its memory regions (the
//!   application's own mapped memory), its RC queue pairs in a QPN-indexed table, a ready
//!   list, a timer heap and its completion queues. It is pure (frames in, frames out), so it
//!   is tested without EAL. It answers ARP for its address, checks every frame (ICRC
//!   included), and counts what it drops.
//! - [`RdmaStage`] runs nodes on a worker: received mbufs go to the node, which places data
//!   straight into registered memory, and the node's packets are emitted straight from
//!   registered memory into fresh mbufs.
//! - The application holds, per engine, an [`RdmaHandle`] (the control path: register and
//!   deregister memory, [`MemoryRegion`]), and per queue pair a [`Qp`] (post work requests:
//!   one ring commit and one doorbell per list) and per completion queue a [`Cq`] (poll into a
//!   slice, or wait: spin, then park). See [`rings`] for the lock-free rings between the two
//!   and the memory-ordering contract.
//! - [`live`]: each worker's queue pairs' transport state (PSNs, queue depths, RTT), copied
//!   into relaxed atomics once a millisecond for readers such as telemetry.

#[cfg(test)]
mod acceptance_tests;
pub mod flusher;
mod host;
pub mod live;
pub mod loopback;
mod node;
mod placed;
pub mod rings;
mod stage;
pub mod tagged;
#[cfg(test)]
mod tagged_tests;

pub use host::{Control, ControlPort, ControlReply, HostError, MemoryRegion, RdmaHandle};
pub use live::{LiveQps, LiveReader, QpLive};
pub use node::{AddQpError, CcCounters, NodeCounters, RdmaNode, RxOutcome, Tx};
pub use placed::{PlaceError, Placed};
pub use rings::{Cq, Qp, QueueFull};
#[cfg(test)]
pub(crate) use stage::COUNTER_NAMES;
pub use stage::{Ingress, IngressReport, RdmaStage, ShaperProbe, ShaperReport};
pub use tagged::{
    TagCommand, TagCommandError, TagConfig, TagCounters, TagEntry, TagEvent, TagEventKind, TagPort,
    TagShard,
};

/// Data room of the mbufs an RDMA engine uses: headroom plus a 4096-byte MTU payload plus
/// every RoCEv2 header, pad and ICRC, so any frame fits one segment.
pub const FRAME_DATA_ROOM: u16 =
    (dpdk_sys::RTE_PKTMBUF_HEADROOM as usize + 4096 + crate::wire::roce::MAX_FRAME_OVERHEAD) as u16;
