//! The responder's checks, one small step each, in the order IBTA's responder (and rxe's
//! `rxe_resp.c`) runs them: PSN, opcode sequence, opcode validity, resources, length, remote
//! key; then the seed extensions (durable WRITE, tagged SEND) as steps of their own; then
//! execution (`super::execute`). A step that passes hands on what it found (the request's
//! class, its headers, the memory it names); one that fails says why the request stops
//! ([`Stop`]), and `Responder::on_request` turns that into a NAK, an RNR NAK or nothing.
//!
//! No check touches memory or consumes a receive request: a request that stops anywhere
//! before execution leaves the queue pair as it found it (an RNR retry finds everything as
//! it was). The one step with an effect, tag matching, claims the tagged buffer and so runs
//! last, when nothing after it can fail but execution itself.
//!
//! Two resource checks sit later than IBTA places them, because that is where the responder
//! has always made them and the difference is visible to a peer whose request has two faults
//! at once (see [`Responder::check_resource_after_rkey`]).

use wire::aeth::{NakCode, Syndrome};
use wire::feth::{FethRepr, Selectivity};
use wire::{Opcode, RethRepr, RoceRepr, TagHeader, TagKind};

use crate::transport::QpConfig;
use crate::transport::mr::{Access, Location, MemoryTable};
use crate::transport::psn;
use crate::transport::tagged::{Delivery, Landing, Next, TagTarget};

use super::{InMsg, Responder};

/// Why a request goes no further: what it gets instead of execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// Already answered (out of sequence, duplicate): nothing more to do.
    Answered,
    /// NAK with this code; the connection ends.
    Nak(NakCode),
    /// Receiver not ready: RNR NAK; the request is not consumed and comes again.
    Rnr,
    /// More READ-like requests than negotiated: dropped unanswered (and counted); the
    /// requester's timer sends it again.
    Drop,
}

/// The NAK most checks answer with.
pub(super) const INVALID: Stop = Stop::Nak(NakCode::InvalidRequest);

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pos {
    First,
    Middle,
    Last,
    Only,
}

impl Pos {
    /// A FIRST or ONLY: the packet opens a message.
    pub(super) fn opens(self) -> bool {
        matches!(self, Pos::First | Pos::Only)
    }

    /// A LAST or ONLY: the packet ends its message.
    pub(super) fn ends(self) -> bool {
        matches!(self, Pos::Last | Pos::Only)
    }
}

/// The class of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A SEND, which consumes a posted receive.
    Send,
    /// A SEND on a tagged queue pair (seed extension): a tag header, then data that lands
    /// where the tag matches.
    Tagged,
    /// An RDMA WRITE; `durable` when the message is a durable WRITE (0xE0/0xE1), for its
    /// continuation packets too.
    Write {
        durable: bool,
    },
    Read,
    Flush,
    AtomicWrite,
}

/// What a request is: its class and where it sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Op {
    pub(super) kind: Kind,
    pub(super) pos: Pos,
}

impl Op {
    /// The class of `opcode`, or `None` for an opcode this responder does not execute
    /// (responses, CmpSwap, FetchAdd, ...). SENDs are tagged on a tagged queue pair.
    /// Always inline, as `QueuePair::read_response_marks`.
    #[inline(always)]
    fn of(opcode: Opcode, tagged: bool) -> Option<Op> {
        let send = if tagged { Kind::Tagged } else { Kind::Send };
        let write = Kind::Write { durable: false };
        let durable = Kind::Write { durable: true };
        let (kind, pos) = match opcode {
            Opcode::SendFirst => (send, Pos::First),
            Opcode::SendMiddle => (send, Pos::Middle),
            Opcode::SendLast | Opcode::SendLastWithImmediate => (send, Pos::Last),
            Opcode::SendOnly | Opcode::SendOnlyWithImmediate => (send, Pos::Only),
            Opcode::RdmaWriteFirst => (write, Pos::First),
            Opcode::RdmaWriteMiddle => (write, Pos::Middle),
            Opcode::RdmaWriteLast | Opcode::RdmaWriteLastWithImmediate => (write, Pos::Last),
            Opcode::RdmaWriteOnly | Opcode::RdmaWriteOnlyWithImmediate => (write, Pos::Only),
            Opcode::DurableWriteFirst => (durable, Pos::First),
            Opcode::DurableWriteOnly => (durable, Pos::Only),
            Opcode::RdmaReadRequest => (Kind::Read, Pos::Only),
            Opcode::Flush => (Kind::Flush, Pos::Only),
            Opcode::AtomicWrite => (Kind::AtomicWrite, Pos::Only),
            _ => return None,
        };
        Some(Op { kind, pos })
    }
}

/// The headers [`Responder::check_op_valid`] found that a request's class needs.
#[derive(Debug, Clone, Copy)]
pub(super) enum Named {
    /// Nothing beyond the BTH: a SEND, or a WRITE packet after the first.
    Nothing,
    /// A RETH: the first packet of a WRITE, a READ, an ATOMIC WRITE.
    Range(RethRepr),
    /// A RETH and a FETH: a FLUSH.
    Flush(RethRepr, FethRepr),
}

impl Named {
    fn reth(self) -> Option<RethRepr> {
        match self {
            Named::Nothing => None,
            Named::Range(reth) | Named::Flush(reth, _) => Some(reth),
        }
    }
}

/// The remote memory [`Responder::check_rkey`] let a request touch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Target {
    pub(super) at: Location,
    pub(super) len: u64,
}

impl Target {
    const NONE: Target = Target {
        at: Location::NOWHERE,
        len: 0,
    };
}

/// What tag matching ([`Responder::check_tagged`]) decided for the first packet of a tagged
/// message.
#[derive(Debug, Clone, Copy)]
pub(super) enum TagStep {
    /// A done message for one of our rendezvous sends, with its cookie.
    Done(u32),
    /// A message of one packet, placed and reported already; then this.
    Whole(Next),
    /// Data that lands at `at`, at most `room` bytes of it; it starts `skip` bytes into the
    /// payload, after the tag header.
    Land {
        at: Location,
        room: u32,
        token: u64,
        skip: usize,
    },
}

/// The packet's payload fits where it sits in its message: FIRST and MIDDLE carry exactly
/// one path MTU, LAST between one byte and one MTU, ONLY at most one MTU. The one shape rule
/// of SENDs, tagged SENDs and WRITEs alike.
#[inline(always)]
fn packet_fits(pos: Pos, len: usize, mtu: usize) -> bool {
    match pos {
        Pos::First | Pos::Middle => len == mtu,
        Pos::Last => len != 0 && len <= mtu,
        Pos::Only => len <= mtu,
    }
}

impl Responder {
    /// The expected PSN, or not: a packet ahead of `epsn` is a sequence error (one NAK per
    /// gap), one behind it a duplicate (answered by `duplicate`). Either way the chain
    /// stops. Checked before anything else, even whether the opcode is one we execute.
    #[inline(always)]
    pub(super) fn check_psn(
        &mut self,
        cfg: &QpConfig,
        repr: &RoceRepr,
        mem: &MemoryTable,
    ) -> Result<(), Stop> {
        let d = psn::diff(repr.bth.psn, self.epsn);
        if d > 0 {
            self.stats.out_of_sequence += 1;
            if !self.nak_latched {
                self.nak_latched = true;
                self.nak = Some((Syndrome::Nak(NakCode::PsnSequenceError), self.epsn));
            }
            return Err(Stop::Answered);
        }
        if d < 0 {
            self.duplicate(cfg, repr, mem);
            return Err(Stop::Answered);
        }
        // The expected PSN arrived: any sequence/RNR NAK still queued is stale.
        self.nak_latched = false;
        self.nak = None;
        Ok(())
    }

    /// The opcode against the message in progress: a FIRST or ONLY may not cut into a
    /// message, a MIDDLE or LAST must continue one of its own class. A WRITE continuing a
    /// durable WRITE is durable. An opcode outside every class has no sequence to check and
    /// gets here the NAK [`Responder::check_op_valid`] would give it.
    #[inline(always)]
    pub(super) fn check_op_seq(&self, cfg: &QpConfig, opcode: Opcode) -> Result<Op, Stop> {
        let Some(mut op) = Op::of(opcode, cfg.tagged) else {
            return Err(INVALID);
        };
        let in_order = match (op.pos.opens(), op.kind, &self.cur) {
            (true, _, cur) => cur.is_none(),
            (false, Kind::Send, Some(InMsg::Send { .. })) => true,
            (false, Kind::Tagged, Some(InMsg::Tagged { .. })) => true,
            (false, Kind::Write { .. }, Some(InMsg::Write { durable, .. })) => {
                op.kind = Kind::Write { durable: *durable };
                true
            }
            (false, ..) => false,
        };
        if in_order { Ok(op) } else { Err(INVALID) }
    }

    /// The opcode is one this queue pair executes, with the headers it needs: durable
    /// WRITEs only where negotiated, no immediate on a tagged SEND, a RETH on what names
    /// remote memory, a FETH asking for something on a FLUSH.
    #[inline(always)]
    pub(super) fn check_op_valid(
        &self,
        cfg: &QpConfig,
        repr: &RoceRepr,
        op: Op,
    ) -> Result<Named, Stop> {
        match op.kind {
            Kind::Send => Ok(Named::Nothing),
            Kind::Tagged if repr.immdt.is_some() => Err(INVALID),
            Kind::Tagged => Ok(Named::Nothing),
            Kind::Write { .. } if !op.pos.opens() => Ok(Named::Nothing),
            Kind::Write { durable } => match repr.reth {
                Some(_) if durable && !cfg.durable_writes => Err(INVALID),
                Some(reth) => Ok(Named::Range(reth)),
                None => Err(INVALID),
            },
            Kind::Read | Kind::AtomicWrite => repr.reth.map(Named::Range).ok_or(INVALID),
            Kind::Flush => match (repr.reth, repr.feth) {
                (Some(reth), Some(feth))
                    if feth.placement.global_visibility || feth.placement.persistence =>
                {
                    Ok(Named::Flush(reth, feth))
                }
                _ => Err(INVALID),
            },
        }
    }

    /// A SEND opening a message needs a posted receive, or it is not ready for it (RNR).
    /// Only looked at here: execution takes it. (The other resources are checked after the
    /// remote key: [`Responder::check_resource_after_rkey`].)
    #[inline(always)]
    pub(super) fn check_resource(&self, op: Op) -> Result<(), Stop> {
        if op.kind == Kind::Send && op.pos.opens() && self.rq.is_empty() {
            return Err(Stop::Rnr);
        }
        Ok(())
    }

    /// The payload's length, written once: the packet fits its place in the message
    /// ([`packet_fits`]); a WRITE's packets add up to no more, and its LAST (or ONLY) to
    /// exactly, the RETH's DMA length; an ATOMIC WRITE carries 8 bytes for 8 aligned bytes.
    /// A READ or FLUSH has no payload length to check. (Whether a SEND fits its receive
    /// buffer is found when it is copied in, and completes that receive in error.)
    #[inline(always)]
    pub(super) fn check_length(
        &self,
        cfg: &QpConfig,
        op: Op,
        named: Named,
        payload: &[u8],
    ) -> Result<(), Stop> {
        let mtu = cfg.pmtu.bytes() as usize;
        let ok = match op.kind {
            Kind::Send | Kind::Tagged => packet_fits(op.pos, payload.len(), mtu),
            Kind::Write { .. } => {
                let (done, len) = match (named.reth(), &self.cur) {
                    (Some(reth), _) => (0, reth.dma_len),
                    (None, Some(InMsg::Write { done, len, .. })) => (*done, *len),
                    (None, _) => return Err(INVALID),
                };
                let total = done as usize + payload.len();
                packet_fits(op.pos, payload.len(), mtu)
                    && if op.pos.ends() {
                        total == len as usize
                    } else {
                        total < len as usize
                    }
            }
            Kind::AtomicWrite => named.reth().is_some_and(|reth| {
                payload.len() == 8 && reth.dma_len == 8 && reth.virtual_addr.is_multiple_of(8)
            }),
            Kind::Read | Kind::Flush => true,
        };
        if ok { Ok(()) } else { Err(INVALID) }
    }

    /// The remote key: the range (or, for a FLUSH of a whole region, the region) a request
    /// names is registered, in bounds and allows the access, or "remote access error". The
    /// check resolves the target; it touches no memory. A READ or WRITE of DMA length 0 is
    /// not checked at all (C9-88); a FLUSH is, whatever its length (docs/security.md,
    /// "Length 0"). A WRITE after its first packet was checked with its first.
    #[inline(always)]
    pub(super) fn check_rkey(
        &self,
        op: Op,
        named: Named,
        mem: &MemoryTable,
    ) -> Result<Target, Stop> {
        let target = match (op.kind, named) {
            (Kind::Write { .. }, Named::Range(reth)) => mem
                .check_remote_dma(
                    reth.rkey,
                    reth.virtual_addr,
                    u64::from(reth.dma_len),
                    Access::REMOTE_WRITE,
                )
                .map(|at| Target {
                    at,
                    len: u64::from(reth.dma_len),
                }),
            (Kind::Read, Named::Range(reth)) => mem
                .check_remote_dma(
                    reth.rkey,
                    reth.virtual_addr,
                    u64::from(reth.dma_len),
                    Access::REMOTE_READ,
                )
                .map(|at| Target {
                    at,
                    len: u64::from(reth.dma_len),
                }),
            (Kind::AtomicWrite, Named::Range(reth)) => mem
                .check_remote(reth.rkey, reth.virtual_addr, 8, Access::REMOTE_WRITE)
                .map(|at| Target { at, len: 8 }),
            (Kind::Flush, Named::Flush(reth, feth)) => {
                let pl = feth.placement;
                let mut need = Access::NONE;
                if pl.global_visibility {
                    need = need | Access::FLUSH_GLOBAL;
                }
                if pl.persistence {
                    need = need | Access::FLUSH_PERSISTENT;
                }
                match feth.selectivity {
                    Selectivity::MemoryRange => mem
                        .check_remote(reth.rkey, reth.virtual_addr, u64::from(reth.dma_len), need)
                        .map(|at| Target {
                            at,
                            len: u64::from(reth.dma_len),
                        }),
                    Selectivity::MemoryRegion => {
                        mem.check_remote_region(reth.rkey, need)
                            .map(|(slot, len)| Target {
                                at: Location {
                                    region: slot,
                                    offset: 0,
                                },
                                len,
                            })
                    }
                }
            }
            _ => Ok(Target::NONE),
        };
        target.map_err(|_| Stop::Nak(NakCode::RemoteAccessError))
    }

    /// Seed extension (durable WRITE, `transport::persist`), for the first packet of a
    /// WRITE: a durable WRITE of any length asks for persistence, which the region must
    /// allow ("remote access error" if not); and what will be owed once the WRITE is durable
    /// (a durable ACK, or an ACK held back) needs room, or the WRITE waits (RNR) before
    /// touching memory.
    #[inline(always)]
    pub(super) fn check_durable(
        &self,
        op: Op,
        target: Target,
        mem: &MemoryTable,
    ) -> Result<(), Stop> {
        let Kind::Write { durable } = op.kind else {
            return Ok(());
        };
        if !op.pos.opens() {
            return Ok(());
        }
        if durable && target.len > 0 && !mem.persists_writes(target.at) {
            return Err(Stop::Nak(NakCode::RemoteAccessError));
        }
        // The durable queue's room first: it is a field, where the region's flags are a
        // lookup in the memory table, which every WRITE made (callgrind: a batched 64 B WRITE
        // 1 735.3 -> 1 727.3, a lone one 3 684 -> 3 676).
        if self.dur.full() && (durable || mem.access_at(target.at).contains(Access::DURABLE)) {
            return Err(Stop::Rnr);
        }
        Ok(())
    }

    /// The resources IBTA checks with the receive of a SEND, checked here, after the remote
    /// key and the durable step, where the responder has always checked them: a WRITE with
    /// immediate needs a posted receive (RNR if none), and a READ, FLUSH or ATOMIC WRITE a
    /// free response slot of the `max_rd_atomic` negotiated (dropped if none). The order is
    /// visible to a request with two faults: a WRITE with immediate that has a bad length or
    /// remote key and finds no receive is NAKed fatally, not RNR-NAKed; a READ-like request
    /// with a bad remote key when every slot is taken is NAKed, not dropped.
    #[inline(always)]
    pub(super) fn check_resource_after_rkey(
        &self,
        cfg: &QpConfig,
        op: Op,
        repr: &RoceRepr,
    ) -> Result<(), Stop> {
        match op.kind {
            Kind::Write { .. } if repr.immdt.is_some() && self.rq.is_empty() => Err(Stop::Rnr),
            Kind::Read | Kind::Flush | Kind::AtomicWrite
                if self.reads.len() >= cfg.max_rd_atomic as usize =>
            {
                Err(Stop::Drop)
            }
            _ => Ok(()),
        }
    }

    /// Seed extension (tagged messages, `transport::tagged`), for the first packet of a
    /// tagged message: its tag header parses (counted if not); a done message is one empty
    /// ONLY; anything else is matched to where it lands, or waits (RNR), or is refused.
    /// Matching claims the tagged buffer, so this is the last step before execution.
    #[inline(always)]
    pub(super) fn check_tagged(
        &mut self,
        cfg: &QpConfig,
        op: Op,
        payload: &[u8],
        mem: &mut MemoryTable,
        tags: &mut dyn TagTarget,
    ) -> Result<Option<TagStep>, Stop> {
        if op.kind != Kind::Tagged || !op.pos.opens() {
            return Ok(None);
        }
        let Ok(hdr) = TagHeader::parse(payload) else {
            self.stats.bad_tag_headers += 1;
            return Err(INVALID);
        };
        let skip = hdr.buffer_len();
        if hdr.kind == TagKind::Done {
            if op.pos == Pos::First || payload.len() > skip {
                return Err(INVALID);
            }
            return Ok(Some(TagStep::Done(hdr.cookie)));
        }
        if op.pos == Pos::Only {
            // A message of one packet, matched, placed and reported in one call: the shard
            // need keep no record of it between an arrival and a landing
            // (`TagTarget::deliver`).
            return match tags.deliver(cfg.local_qpn, &hdr, &payload[skip..], mem) {
                Delivery::Placed(next) => Ok(Some(TagStep::Whole(next))),
                Delivery::NotReady => Err(Stop::Rnr),
                Delivery::Refuse => Err(INVALID),
            };
        }
        match tags.arrive(cfg.local_qpn, &hdr, mem) {
            Landing::Place { at, room, token } => Ok(Some(TagStep::Land {
                at,
                room,
                token,
                skip,
            })),
            Landing::NotReady => Err(Stop::Rnr),
            Landing::Refuse => Err(INVALID),
        }
    }
}
