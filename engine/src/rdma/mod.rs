//! RDMA on the dataplane: a worker that speaks RoCEv2.
//!
//! - [`RdmaNode`] is one engine's state: its MAC and IPv4 address, its memory regions, its RC
//!   queue pairs and its completion queue. It is pure (frames in, frames out), so it is tested
//!   without EAL. It answers ARP for its address, checks every frame (ICRC included), and
//!   counts what it drops.
//! - [`RdmaStage`] runs a node on a worker: received mbufs go to the node, and the node's
//!   packets are emitted straight into fresh mbufs. Host commands arrive over a crossbeam
//!   queue, and completions leave over another.
//! - [`RdmaHandle`] is what an application holds. It registers memory, reads and writes it,
//!   posts SEND/WRITE/READ and receives, and polls completions. Every call is a message to the
//!   worker, so the worker never shares memory with another thread.

mod handle;
pub mod loopback;
mod node;
mod stage;

pub use handle::{HostError, RdmaHandle};
pub use node::{NodeCounters, RdmaNode, RxOutcome};
pub use stage::RdmaStage;

use crate::transport::{Access, MrKeys, RecvRequest, WorkCompletion, WorkRequest};

/// Data room of the mbufs an RDMA engine uses: headroom plus a 4096-byte MTU payload plus
/// every RoCEv2 header, pad and ICRC, so any frame fits one segment.
pub const FRAME_DATA_ROOM: u16 = (dpdk_sys::RTE_PKTMBUF_HEADROOM + 4096 + 256) as u16;

/// A request from the host to the worker that owns an [`RdmaNode`].
pub enum Command {
    Register {
        addr: u64,
        len: usize,
        access: Access,
        reply: crossbeam::channel::Sender<MrKeys>,
    },
    Write {
        lkey: u32,
        offset: usize,
        data: Vec<u8>,
        reply: crossbeam::channel::Sender<bool>,
    },
    Read {
        lkey: u32,
        offset: usize,
        len: usize,
        reply: crossbeam::channel::Sender<Option<Vec<u8>>>,
    },
    PostSend {
        qpn: u32,
        wr: WorkRequest,
    },
    PostRecv {
        qpn: u32,
        wr: RecvRequest,
    },
}

/// What the worker sends back without being asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Completion(WorkCompletion),
    /// A post was refused (queue full, bad local key): no completion will come for it.
    PostRefused {
        qpn: u32,
        wr_id: u64,
    },
}
