//! Tagged messages (seed 001, list matching) as the transport sees them: the hooks between a
//! queue pair that negotiated tagged messaging ([`super::QpConfig::tagged`]) and the worker's
//! list-processing engine shard, which lives outside the transport (`node::tagged`).
//!
//! On such a queue pair every SEND starts with a tag header ([`wire::tag`]). The
//! responder hands the header of a message's first packet to [`TagTarget::arrive`], which
//! matches it and says where the data lands; every packet's data goes there (what does not fit
//! is discarded: MPI truncation). After the last packet, [`TagTarget::landed`] says what is
//! next: nothing, an RDMA READ of the rest of a rendezvous message ([`Pull`], issued by this
//! queue pair's requester, with no host involvement), or a *done* message to the sender. The
//! requester completes a rendezvous send only when the done message for it arrives. A message
//! of one packet goes to [`TagTarget::deliver`] instead, which does all three at once.

use wire::TagHeader;

use super::mr::{Location, MemoryTable};

/// Where the data of a tagged message lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Landing {
    /// At `at`, at most `room` bytes (the rest is discarded); `token` names the message in
    /// later calls.
    Place { at: Location, room: u32, token: u64 },
    /// Not now (no event room, no record free): the responder answers RNR, the sender retries.
    NotReady,
    /// Never (no such endpoint on this engine, or the message breaks the protocol): the
    /// responder answers "invalid request".
    Refuse,
}

/// A READ of the rest of a rendezvous message into the buffer it matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pull {
    pub local: Location,
    pub len: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub token: u64,
}

/// What the queue pair does after a tagged message landed, or after a pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Nothing,
    Pull(Pull),
    /// Tell the sender its rendezvous message `cookie` is done (`length` bytes taken).
    Done {
        cookie: u32,
        length: u32,
    },
}

/// What became of a tagged message that arrived whole ([`TagTarget::deliver`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Matched, its data placed (what fits) and its events written; then this.
    Placed(Next),
    /// As [`Landing::NotReady`].
    NotReady,
    /// As [`Landing::Refuse`].
    Refuse,
}

/// The worker's side of tagged messaging, called by a tagged queue pair.
pub trait TagTarget {
    /// The first packet of a tagged message (eager or rendezvous) arrived on queue pair `qpn`.
    fn arrive(&mut self, qpn: u32, hdr: &TagHeader, mem: &MemoryTable) -> Landing;
    /// Its last packet landed: `received` data bytes arrived in all (those past the room were
    /// discarded).
    fn landed(&mut self, qpn: u32, token: u64, received: u32, mem: &MemoryTable) -> Next;
    /// A message of one packet (a SEND ONLY) arrived whole with its data `data`: matched,
    /// placed and reported in one call. By default as a first packet and a last one:
    /// [`TagTarget::arrive`], the data stored, [`TagTarget::landed`].
    fn deliver(&mut self, qpn: u32, hdr: &TagHeader, data: &[u8], mem: &MemoryTable) -> Delivery {
        deliver_in_two(self, qpn, hdr, data, mem)
    }
}

/// [`TagTarget::deliver`] as [`TagTarget::arrive`], the data stored where it landed (what
/// fits), and [`TagTarget::landed`].
pub fn deliver_in_two<T: TagTarget + ?Sized>(
    target: &mut T,
    qpn: u32,
    hdr: &TagHeader,
    data: &[u8],
    mem: &MemoryTable,
) -> Delivery {
    match target.arrive(qpn, hdr, mem) {
        Landing::Place { at, room, token } => {
            mem.store(at, &data[..data.len().min(room as usize)]);
            Delivery::Placed(target.landed(qpn, token, data.len() as u32, mem))
        }
        Landing::NotReady => Delivery::NotReady,
        Landing::Refuse => Delivery::Refuse,
    }
}

/// No tagged messaging on this engine: every tagged message is refused.
pub struct NoTags;

impl TagTarget for NoTags {
    fn arrive(&mut self, _: u32, _: &TagHeader, _: &MemoryTable) -> Landing {
        Landing::Refuse
    }
    fn landed(&mut self, _: u32, _: u64, _: u32, _: &MemoryTable) -> Next {
        Next::Nothing
    }
}
