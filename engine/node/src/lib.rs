//! The worker-side RDMA engine, and the application's side of it. No DPDK: the runtime's
//! `RdmaStage` (in the `portico` crate) hands this crate frames and sends what it emits.
//!
//! - [`RdmaNode`] is one engine's state: its MAC and IPv4 address, its memory regions (the
//!   application's own mapped memory), its RC queue pairs in a QPN-indexed table, a ready
//!   list, a timer heap and its completion queues. It is pure (frames in, frames out), so it
//!   is tested without EAL. It answers ARP for its address, checks every frame (ICRC
//!   included), and counts what it drops.
//! - `portico::rdma::RdmaStage` runs nodes on a worker: received mbufs go to the node, which
//!   places data straight into registered memory, and the node's packets are emitted straight
//!   from registered memory into fresh mbufs.
//! - The application holds, per engine, an [`RdmaHandle`] (the control path: register and
//!   deregister memory, [`MemoryRegion`]), and per queue pair a [`Qp`] (post work requests:
//!   one ring commit and one doorbell per list) and per completion queue a [`Cq`] (poll into a
//!   slice, or wait: spin, then park). See [`rings`] for the lock-free rings between the two
//!   and the memory-ordering contract.
//! - [`live`]: each worker's queue pairs' transport state (PSNs, queue depths, RTT), copied
//!   into relaxed atomics once a millisecond for readers such as telemetry.
//! - [`wake`]: how a host wakes a sleeping worker; [`Outlook`]: what a worker's engine tells
//!   the polling policy about when it next needs a poll.

#![forbid(unsafe_code)]

pub mod arp;
pub mod cm;
pub mod flusher;
mod host;
pub mod live;
mod node;
mod outlook;
mod parts;
mod placed;
pub mod rings;
pub mod tagged;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;
pub mod wake;

pub use host::{Control, ControlPort, ControlReply, HostError, MemoryRegion, RdmaHandle};
pub use live::{LiveQps, LiveReader, QpLive};
pub use node::{AddQpError, CcCounters, NodeCounters, RdmaNode, RxOutcome, Tx};
pub use outlook::Outlook;
pub use placed::{PlaceError, Placed};
pub use rings::{Cq, Qp, QueueFull};
pub use tagged::{
    TagCommand, TagCommandError, TagConfig, TagCounters, TagEntry, TagEvent, TagEventKind, TagPort,
    TagShard,
};
