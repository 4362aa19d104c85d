//! The responder half of an RC queue pair.
//!
//! The responder accepts requests strictly in PSN order from its expected PSN
//! (`epsn`). A packet ahead of `epsn` is a sequence error: the first one gets a
//! NAK "PSN sequence error" naming `epsn`, later ones are dropped silently
//! until `epsn` arrives (one NAK per gap). A packet behind `epsn` is a
//! duplicate: SEND and WRITE data is never applied twice, only re-ACKed with
//! the current MSN when it asks for an ACK; a duplicate READ is executed again
//! from memory. Each completed message (a READ as soon as it is accepted)
//! increments the MSN. ACKs are coalesced: one is owed when a packet carries
//! AckReq or `ack_coalesce` packets went unacknowledged, and however many are
//! owed, one cumulative ACK (PSN `epsn - 1`, current MSN) goes out per
//! transmit opportunity. READ responses are cut into path-MTU packets and
//! acknowledge implicitly, so they go out before any ACK. rkey, bounds and
//! permission are checked before the first byte is written; a failure NAKs
//! "remote access error" and moves the QP to the error state with memory
//! untouched. A READ or WRITE of DMA length 0 is not checked at all (C9-88)
//! and is answered as any other: an ACK, an empty READ RESPONSE ONLY.
//! Defined RC opcodes this responder does not execute (CmpSwap, FetchAdd) NAK
//! "invalid request" and end the connection, as an unsupported opcode must. A SEND (or WRITE
//! with immediate) that finds no posted receive gets an RNR NAK and is not consumed.
//!
//! Remote persistence (seed 004, `super::persist`): WRITEs into regions that persist are
//! persisted as they land; a durable WRITE (0xE0/0xE1, on queue pairs that negotiated it) is
//! acknowledged on receipt and again, with a DURABLE ACKNOWLEDGE of the same PSN, once
//! durable; IBTA FLUSH and ATOMIC WRITE are answered by an empty READ RESPONSE ONLY; responses
//! that acknowledge implicitly wait for the persists asked for before them, and no ACK names
//! a WRITE into a `DURABLE` region before it is durable.
//!
//! A request at the expected PSN goes through a chain of checks in IBTA's order (`checks`:
//! PSN, opcode sequence, opcode validity, resources, length, remote key, then the durable and
//! tagged extensions), the first failure deciding its answer, and only then is executed
//! (`execute`).

mod checks;
mod execute;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;

use wire::aeth::{AethRepr, NakCode, Syndrome};
use wire::{ImmDtRepr, Opcode, PacketFields, RoceRepr};

use super::cq::{StagedCompletions, WcOpcode, WcStatus, WorkCompletion};
use super::mr::{Access, Location, MemoryTable};
use super::persist::Durability;
use super::psn;
use super::qp::QpStats;
use super::sge::{Gather, Sge, Spill};
use super::tagged::{Next, TagTarget};
use super::{OutPacket, PayloadRef, QpConfig, Refusal};
use crate::cc::Notifier;

use checks::{Kind, Op, Pos, Stop};
use execute::Checked;

#[derive(Debug, Clone, Copy)]
struct RecvWqe {
    wr_id: u64,
    /// The receive buffer, resolved once when the request was taken.
    local: Gather,
}

impl RecvWqe {
    fn len(&self) -> u32 {
        self.local.len()
    }
}

/// A READ being answered: the responses still to send. FLUSH and ATOMIC WRITE are answered
/// the same way, by one empty READ RESPONSE ONLY.
#[derive(Debug, Clone, Copy)]
struct ReadJob {
    first_psn: u32,
    at: Location,
    len: u32,
    npkts: u32,
    sent: u32,
    msn: u32,
    /// The persist ticket the responses wait for (0: none): a response acknowledges every
    /// earlier request, so it may not overtake their persistence.
    gate: u64,
}

impl ReadJob {
    /// The one empty response to a FLUSH or an ATOMIC WRITE at `psn`.
    fn empty(psn: u32, msn: u32, gate: u64) -> ReadJob {
        ReadJob {
            first_psn: psn,
            at: Location::NOWHERE,
            len: 0,
            npkts: 1,
            sent: 0,
            msn,
            gate,
        }
    }
}

/// A multi-packet message between its FIRST and LAST packet. (The SEND variant carries its
/// resolved receive buffer inline; boxing it would allocate per message.)
#[derive(Debug, Clone, Copy)]
#[allow(clippy::large_enum_variant)]
enum InMsg {
    Send {
        recv: RecvWqe,
        done: u32,
    },
    Write {
        at: Location,
        len: u32,
        done: u32,
        /// Opened by a durable WRITE FIRST.
        durable: bool,
    },
    /// A tagged message: its data lands at `at`, at most `room` bytes of it.
    Tagged {
        at: Location,
        room: u32,
        /// Data bytes received so far (the tag header not counted).
        done: u32,
        token: u64,
    },
}

/// Whether a request left the QP usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Ok,
    /// A NAK for a class of error that ends the connection has been queued.
    Fatal,
}

#[derive(Debug)]
pub struct Responder {
    epsn: u32,
    msn: u32,
    rq: VecDeque<RecvWqe>,
    /// The pieces of receive buffers of more than one piece.
    spill: Spill,
    cur: Option<InMsg>,
    reads: VecDeque<ReadJob>,
    ack_due: bool,
    unacked: u32,
    nak: Option<(Syndrome, u32)>,
    /// Set when a sequence-error or RNR NAK went out for `epsn`; cleared when
    /// `epsn` arrives. Enforces one NAK per gap.
    nak_latched: bool,
    /// The PSN the last ACK named, so that an ACK held below a write that is not yet durable
    /// is not sent twice.
    last_ack: Option<u32>,
    /// The PSN the last receipt ACK (0xE3) named, so that one owed before a NAK goes once.
    receipt_sent: Option<u32>,
    /// What waits for persistence: durable ACKs owed, ACKs held, responses gated.
    dur: Durability,
    /// What the queue pair's requester must do for the last tagged message: a pull, or a
    /// done message (taken by the queue pair after each packet).
    pub(crate) tag_next: Next,
    /// The cookie of a done message that arrived for one of our rendezvous sends.
    pub(crate) tag_done: Option<u32>,
    /// The token of a tagged message cut off by the error state while it was arriving.
    pub(crate) tag_orphan: Option<u64>,
    /// Responder counters (the requester fields stay zero).
    pub(crate) stats: QpStats,
}

impl Responder {
    pub(crate) fn new(cfg: &QpConfig) -> Responder {
        Responder {
            epsn: cfg.recv_psn,
            msn: 0,
            rq: VecDeque::with_capacity(cfg.max_recv_wr),
            // The queued receives and the one a message in progress holds.
            spill: Spill::new(cfg.max_recv_wr + 1),
            cur: None,
            reads: VecDeque::with_capacity(cfg.max_rd_atomic as usize),
            ack_due: false,
            unacked: 0,
            nak: None,
            nak_latched: false,
            // As if the ACK of nothing (the PSN before the first) had been sent: a capped ACK
            // that would name it says nothing and is not sent.
            last_ack: Some(psn::sub(cfg.recv_psn, 1)),
            receipt_sent: None,
            tag_next: Next::Nothing,
            tag_done: None,
            tag_orphan: None,
            dur: Durability::new(cfg.max_send_wr + cfg.max_in_flight as usize),
            stats: QpStats::default(),
        }
    }

    /// Owe an ACK for what arrived so far now, whatever the coalescing says (congestion
    /// control: a change of level goes out at once).
    pub(crate) fn request_ack(&mut self) {
        if self.unacked > 0 {
            self.ack_due = true;
        }
    }

    /// Owe an ACK now even if nothing arrived since the last one (it repeats the last PSN):
    /// congestion control has something new to say. False before anything was received.
    pub(crate) fn repeat_ack(&mut self) -> bool {
        if self.msn == 0 && self.unacked == 0 && !self.ack_due {
            return false;
        }
        self.ack_due = true;
        true
    }

    /// The next PSN the responder accepts.
    pub fn expected_psn(&self) -> u32 {
        self.epsn
    }

    /// Messages completed so far (24-bit, wraps).
    pub fn msn(&self) -> u32 {
        self.msn
    }

    /// Receive work requests posted and not consumed.
    pub fn posted_receives(&self) -> usize {
        self.rq.len()
    }

    /// Whether another receive request fits.
    pub fn has_room(&self, cfg: &QpConfig) -> bool {
        self.rq.len() < cfg.max_recv_wr
    }

    /// Whether a receive buffer, a message in progress or a READ being answered lies in
    /// region `slot`.
    pub(crate) fn uses_region(&self, slot: u32) -> bool {
        self.rq
            .iter()
            .any(|r| r.local.uses_region(&self.spill, slot))
            || self.reads.iter().any(|j| j.at.region == slot)
            || match &self.cur {
                Some(InMsg::Send { recv, .. }) => recv.local.uses_region(&self.spill, slot),
                Some(InMsg::Write { at, .. }) | Some(InMsg::Tagged { at, .. }) => at.region == slot,
                None => false,
            }
    }

    pub(crate) fn post_recv(
        &mut self,
        cfg: &QpConfig,
        wr_id: u64,
        sges: &[Sge],
        mem: &MemoryTable,
    ) -> Result<(), Refusal> {
        if !self.has_room(cfg) {
            return Err(Refusal::Full);
        }
        let local = Gather::resolve(mem, sges, Access::LOCAL_WRITE, &mut self.spill)
            .map_err(Refusal::Local)?;
        self.rq.push_back(RecvWqe { wr_id, local });
        Ok(())
    }

    /// Whether this responder waits for a persist ticket.
    pub(crate) fn awaits_persistence(&self) -> bool {
        self.dur.waiting()
    }

    /// The engine's persisted watermark moved: keep what it covers. True when something may
    /// now be sent.
    pub(crate) fn on_persisted(&mut self, persisted: u64) -> bool {
        self.dur.on_persisted(persisted)
    }

    /// A persist this responder waited for failed: NAK the oldest request still waiting.
    pub(crate) fn persist_failed(&mut self) {
        let psn = self.dur.oldest().unwrap_or(self.epsn);
        self.fatal(NakCode::RemoteOperationalError, psn);
    }

    /// Whether [`Responder::poll_control`] and the READ responses have nothing to send: no
    /// READ being answered, no NAK, no ACK and no durable ACK due. Then they would return
    /// `None` and change nothing, whatever their arguments. (A new reason for them to send
    /// must clear this too: `QueuePair::poll_responses` skips them when it holds.)
    #[inline(always)]
    pub(crate) fn quiet(&self) -> bool {
        !self.ack_due && self.nak.is_none() && self.reads.is_empty() && !self.dur.ack_due()
    }

    /// Whether a READ (or FLUSH, ATOMIC WRITE) is still being answered.
    #[inline]
    pub(crate) fn answering_reads(&self) -> bool {
        !self.reads.is_empty()
    }

    /// The frame bytes of the READ response [`Responder::poll_read_response`] would hand out
    /// now, if one may go.
    pub(crate) fn peek_read_response(&self, cfg: &QpConfig) -> Option<u32> {
        let job = self.reads.front()?;
        if !self.dur.passed(job.gate) {
            return None;
        }
        let mtu = cfg.pmtu.bytes();
        let len = (job.len - job.sent * mtu).min(mtu);
        let aeth = job.npkts == 1 || job.sent == 0 || job.sent + 1 == job.npkts;
        Some(super::requester::read_response_frame(len, aeth))
    }

    /// The next READ response packet, if one may go (its persists done).
    pub(crate) fn poll_read_response(&mut self, cfg: &QpConfig) -> Option<OutPacket> {
        if let Some(job) = self.reads.front_mut()
            && self.dur.passed(job.gate)
        {
            let mtu = cfg.pmtu.bytes();
            let k = job.sent;
            let offset = k * mtu;
            let len = (job.len - offset).min(mtu);
            let opcode = match (job.npkts, k) {
                (1, _) => Opcode::RdmaReadResponseOnly,
                (_, 0) => Opcode::RdmaReadResponseFirst,
                (n, k) if k + 1 == n => Opcode::RdmaReadResponseLast,
                _ => Opcode::RdmaReadResponseMiddle,
            };
            let mut fields = PacketFields::new(opcode, psn::add(job.first_psn, k), false);
            if opcode != Opcode::RdmaReadResponseMiddle {
                fields.aeth = Some(AethRepr {
                    syndrome: Syndrome::ACK_UNLIMITED,
                    msn: job.msn,
                });
            }
            let payload = (len > 0).then_some(PayloadRef::Region {
                at: job.at.advance(u64::from(offset)),
                len,
            });
            job.sent += 1;
            if job.sent == job.npkts {
                self.reads.pop_front();
            }
            self.stats.read_responses_sent += 1;
            return Some(OutPacket { fields, payload });
        }
        None
    }

    /// The next ACK, NAK or durable ACK; the queue pair sends READ responses first
    /// ([`Responder::poll_read_response`]): they carry lower PSNs than anything an ACK could
    /// name. A response waits for the persists asked for before it, and an ACK never names a
    /// PSN whose response or durability it would vouch for early. With `reads_held` (READ
    /// responses wait for a traffic shaper or the pacer) a NAK or durable ACK waits while a
    /// READ is still being answered: either would acknowledge the READ's PSNs before its data
    /// went. A plain ACK is capped below the READ as always.
    ///
    /// `cc` gives an ACK or NAK its congestion state (BECN and a CETH) where the queue pair
    /// carries it in ACKs (`cc = ack`). The packet is written to `slot` (true when there is
    /// one; `slot` is left as it is otherwise).
    #[inline]
    pub(crate) fn poll_control(
        &mut self,
        reads_held: bool,
        cc: &mut Notifier,
        slot: &mut OutPacket,
    ) -> bool {
        // READ responses held back: only the ACK capped below them may go.
        let reads_block = reads_held && !self.reads.is_empty();
        if !reads_block && let Some((code, nak_psn)) = self.nak {
            // A NAK acknowledges everything before its PSN: a WRITE there that awaits its
            // durable ACK is first covered by a receipt ACK, so the requester holds it.
            let before = psn::sub(nak_psn, 1);
            if self.receipt_sent != Some(before) && self.dur.receipt_owed(before) {
                self.stats.acks_sent += 1;
                *slot = self.ack_packet(Syndrome::ACK_UNLIMITED, before, cc);
                return true;
            }
            // A standard requester's WRITE into a durable region there, not durable yet: the
            // NAK would vouch for it as an ACK would, so it waits for the hold to lift (the
            // persist's completion makes this queue pair ready again).
            if let Some(limit) = self.dur.ack_limit()
                && psn::before(limit, before)
            {
                return false;
            }
            self.nak = None;
            match code {
                Syndrome::Nak(NakCode::PsnSequenceError) => self.stats.seq_naks_sent += 1,
                Syndrome::RnrNak { .. } => self.stats.rnr_naks_sent += 1,
                _ => self.stats.fatal_naks_sent += 1,
            }
            // Any NAK also acknowledges everything before its PSN.
            self.ack_due = false;
            self.unacked = 0;
            *slot = self.ack_packet(code, nak_psn, cc);
            return true;
        }
        if let Some(psn) = self.ack_to_send() {
            self.stats.acks_sent += 1;
            *slot = self.ack_packet(Syndrome::ACK_UNLIMITED, psn, cc);
            return true;
        }
        if reads_block {
            return false;
        }
        let Some(psn) = self.dur.take_ack() else {
            return false;
        };
        self.stats.durable_acks_sent += 1;
        *slot = OutPacket {
            fields: PacketFields {
                aeth: Some(AethRepr {
                    syndrome: Syndrome::ACK_UNLIMITED,
                    msn: self.msn,
                }),
                ..PacketFields::new(Opcode::DurableAcknowledge, psn, false)
            },
            payload: None,
        };
        true
    }

    /// An ACK or NAK naming `psn`; an ACK that covers a WRITE still owed its durable ACK is a
    /// receipt ACK (0xE3), which promises that durable ACK through `psn`.
    #[inline(always)]
    fn ack_packet(&mut self, syndrome: Syndrome, psn: u32, cc: &mut Notifier) -> OutPacket {
        let mut opcode = Opcode::Acknowledge;
        if matches!(syndrome, Syndrome::Ack { .. }) && self.dur.receipt_owed(psn) {
            opcode = Opcode::ReceiptAcknowledge;
            self.receipt_sent = Some(psn);
            self.stats.receipt_acks_sent += 1;
        }
        // With `cc = ack` every ACK and NAK (not a receipt ACK) carries the congestion
        // state: BECN and a CETH while congested, neither once clear.
        let (becn, ceth) = if opcode == Opcode::Acknowledge && cc.carries_state() {
            cc.ack_state()
        } else {
            (false, None)
        };
        if becn {
            self.stats.becn_acks_sent += 1;
        }
        OutPacket {
            fields: PacketFields {
                becn,
                aeth: Some(AethRepr {
                    syndrome,
                    msn: self.msn,
                }),
                ceth,
                ..PacketFields::new(opcode, psn, false)
            },
            payload: None,
        }
    }

    /// The PSN of the ACK to send now, if one is owed and it says something new. It names
    /// `epsn - 1`, or less while a WRITE into a durable region is not yet durable or a
    /// response waits for persistence (the ACK would vouch for them); such a capped ACK stays
    /// owed until the cap lifts.
    ///
    /// None, too, when the durable ACK owed names `epsn - 1` itself (no READ response
    /// waiting): the requester takes a durable ACK as an ACK through its PSN, so the durable
    /// ACK, sent next, stands for this one: one frame instead of two where the persist was
    /// done on the spot (seed 004's lighter network load; `receipt_acks_folded`).
    #[inline]
    fn ack_to_send(&mut self) -> Option<u32> {
        if !self.ack_due {
            return None;
        }
        let mut psn = psn::sub(self.epsn, 1);
        if self.reads.is_empty() && self.dur.ack_owed() == Some(psn) {
            self.ack_due = false;
            self.unacked = 0;
            self.last_ack = Some(psn);
            self.stats.receipt_acks_folded += 1;
            return None;
        }
        let mut capped = false;
        let blocked = self.reads.front().map(|j| psn::sub(j.first_psn, 1));
        for limit in [self.dur.ack_limit(), blocked].into_iter().flatten() {
            if psn::before(limit, psn) {
                psn = limit;
                capped = true;
            }
        }
        if capped && self.last_ack == Some(psn) {
            return None;
        }
        self.ack_due = capped;
        self.unacked = 0;
        self.last_ack = Some(psn);
        Some(psn)
    }

    /// A WRITE message of `len` bytes at `at`, whose last packet is `psn`, has been placed:
    /// persist it if its region or its opcode asks, and note what is owed once it is durable.
    /// `pipelined`: the requester speaks the durable-write extension, so a plain WRITE into a
    /// durable region gets a receipt ACK at once and its durable ACK later; to any other
    /// requester no ACK names it before it is durable.
    ///
    /// A plain WRITE into a region that is neither persisted nor durable (the common one)
    /// is told apart inline; the rest is out of line, so that its call saves no registers.
    #[inline(always)]
    fn written(
        &mut self,
        mem: &mut MemoryTable,
        at: Location,
        len: u32,
        psn: u32,
        durable: bool,
        pipelined: bool,
    ) {
        // (A durable region is one that persists writes.)
        if durable || mem.persists_writes(at) {
            self.written_durably(mem, at, len, psn, durable, pipelined);
        }
    }

    /// [`Responder::written`] of a durable WRITE, or of one into a region that persists
    /// writes.
    #[inline(never)]
    fn written_durably(
        &mut self,
        mem: &mut MemoryTable,
        at: Location,
        len: u32,
        psn: u32,
        durable: bool,
        pipelined: bool,
    ) {
        let p = mem.persist(at, u64::from(len));
        self.dur.note(p);
        if durable {
            self.dur.durable_write(psn);
        } else if mem.access_at(at).contains(Access::DURABLE) {
            if pipelined {
                self.dur.region_write(psn);
            } else {
                self.dur.hold_ack(psn);
            }
        }
    }

    /// Handle one request packet addressed to this QP: the checks of `checks`, in IBTA's
    /// order, then execution; the first check that fails decides the answer.
    /// `opcode` is `repr`'s (a constant where the caller knows it).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_request(
        &mut self,
        cfg: &QpConfig,
        repr: &RoceRepr,
        opcode: Opcode,
        payload: &[u8],
        mem: &mut MemoryTable,
        cq: &mut StagedCompletions,
        tags: &mut dyn TagTarget,
    ) -> Verdict {
        match self.respond(cfg, repr, opcode, payload, mem, cq, tags) {
            Ok(verdict) => verdict,
            Err(stop) => self.stop(cfg, repr.bth.psn, stop),
        }
    }

    /// The chain. Each step passes on what it found or stops the request; no memory is
    /// written and no receive taken before `execute` (tag matching, which claims a tagged
    /// buffer, comes last for that reason).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn respond(
        &mut self,
        cfg: &QpConfig,
        repr: &RoceRepr,
        opcode: Opcode,
        payload: &[u8],
        mem: &mut MemoryTable,
        cq: &mut StagedCompletions,
        tags: &mut dyn TagTarget,
    ) -> Result<Verdict, Stop> {
        self.check_psn(cfg, repr, mem)?;
        let op = self.check_op_seq(cfg, opcode)?;
        // Dispatched on once, here: each arm runs the same chain with the class (and, for the
        // commonest request, a one-packet WRITE, the position) a constant, so the checks' own
        // `match`es on them fold away when the chain is inlined. Without it the chain matched
        // on the class again in every step: +135 instructions per WRITE, +2.0 % for a batched
        // 64 B WRITE over the hand-written responder; with it, -1.8 %
        // (`bench/roce_instructions.sh write64x32`; docs/architecture.md, "What the split cost").
        match op.kind {
            Kind::Write { durable: false } if op.pos == Pos::Only => {
                let op = Op {
                    kind: Kind::Write { durable: false },
                    pos: Pos::Only,
                };
                self.chain(cfg, repr, op, payload, mem, cq, tags)
            }
            Kind::Write { durable: false } => {
                let op = Op {
                    kind: Kind::Write { durable: false },
                    pos: op.pos,
                };
                self.chain(cfg, repr, op, payload, mem, cq, tags)
            }
            Kind::Send => {
                let op = Op {
                    kind: Kind::Send,
                    pos: op.pos,
                };
                self.chain(cfg, repr, op, payload, mem, cq, tags)
            }
            _ => self.chain(cfg, repr, op, payload, mem, cq, tags),
        }
    }

    /// The checks after the opcode's sequence, then execution, for a request of class `op`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn chain(
        &mut self,
        cfg: &QpConfig,
        repr: &RoceRepr,
        op: Op,
        payload: &[u8],
        mem: &mut MemoryTable,
        cq: &mut StagedCompletions,
        tags: &mut dyn TagTarget,
    ) -> Result<Verdict, Stop> {
        let named = self.check_op_valid(cfg, repr, op)?;
        self.check_resource(op)?;
        self.check_length(cfg, op, named, payload)?;
        let target = self.check_rkey(op, named, mem)?;
        self.check_durable(op, target, mem)?;
        self.check_resource_after_rkey(cfg, op, repr)?;
        let tag = self.check_tagged(cfg, op, payload, mem, tags)?;
        let req = Checked {
            psn: repr.bth.psn,
            ack_req: repr.bth.ack_req,
            imm: repr
                .immdt
                .map(|ImmDtRepr { data }| u32::from_be_bytes(data)),
            op,
            named,
            target,
            tag,
        };
        self.execute(cfg, req, payload, mem, cq, tags)
    }

    /// A request stopped by a check at `psn` (the expected PSN, unless it was answered as
    /// out of sequence or duplicate): queue its NAK, or drop it.
    fn stop(&mut self, cfg: &QpConfig, psn: u32, stop: Stop) -> Verdict {
        match stop {
            Stop::Answered => Verdict::Ok,
            Stop::Nak(code) => self.fatal(code, psn),
            Stop::Rnr => self.rnr(cfg, psn),
            Stop::Drop => {
                self.stats.dropped_requests += 1;
                Verdict::Ok
            }
        }
    }

    /// A FLUSH or ATOMIC WRITE at `psn` was executed: it completes a message, and its one empty
    /// response, which acknowledges everything before it, waits for the persists asked for
    /// so far.
    fn accept_empty_response(&mut self, psn: u32) -> Verdict {
        self.msn = psn::add(self.msn, 1);
        self.reads
            .push_back(ReadJob::empty(psn, self.msn, self.dur.gate()));
        self.epsn = psn::add(self.epsn, 1);
        self.ack_due = false;
        self.unacked = 0;
        Verdict::Ok
    }

    /// A request behind `epsn`: re-ACK SEND/WRITE (and say again what is durable),
    /// re-execute READ, answer FLUSH and ATOMIC WRITE again without executing them again.
    fn duplicate(&mut self, cfg: &QpConfig, repr: &RoceRepr, mem: &MemoryTable) {
        self.stats.duplicate_requests += 1;
        let psn = repr.bth.psn;
        self.dur.on_duplicate(psn);
        match repr.bth.opcode {
            Opcode::RdmaReadRequest => {}
            Opcode::Flush | Opcode::AtomicWrite => {
                if self.reads.iter().any(|j| j.first_psn == psn && j.sent == 0) {
                    return;
                }
                if self.reads.len() >= cfg.max_rd_atomic as usize {
                    self.stats.dropped_requests += 1;
                    return;
                }
                // The first execution's effects stand (an ATOMIC WRITE is not stored twice);
                // the answer waits for what this queue pair persists now.
                self.reads
                    .push_back(ReadJob::empty(psn, self.msn, self.dur.gate()));
                return;
            }
            _ => {
                if repr.bth.ack_req {
                    self.ack_due = true;
                }
                return;
            }
        }
        let Some(reth) = repr.reth else { return };
        // The first execution passed these checks; if the region changed
        // since, the retry is silently dropped.
        let Ok(at) = mem.check_remote_dma(
            reth.rkey,
            reth.virtual_addr,
            u64::from(reth.dma_len),
            Access::REMOTE_READ,
        ) else {
            return;
        };
        // One re-execution per PSN at a time is enough.
        if self.reads.iter().any(|j| j.first_psn == psn && j.sent == 0) {
            return;
        }
        if self.reads.len() >= cfg.max_rd_atomic as usize {
            self.stats.dropped_requests += 1;
            return;
        }
        self.stats.reexecuted_reads += 1;
        self.reads.push_back(ReadJob {
            first_psn: psn,
            at,
            len: reth.dma_len,
            npkts: cfg.pmtu.packets(reth.dma_len),
            sent: 0,
            msn: self.msn,
            gate: self.dur.gate(),
        });
    }

    fn rnr(&mut self, cfg: &QpConfig, psn: u32) -> Verdict {
        self.nak_latched = true;
        self.nak = Some((
            Syndrome::RnrNak {
                timer_code: cfg.rnr_timer_code,
            },
            psn,
        ));
        Verdict::Ok
    }

    fn fatal(&mut self, code: NakCode, psn: u32) -> Verdict {
        self.nak = Some((Syndrome::Nak(code), psn));
        Verdict::Fatal
    }

    /// Error state: flush posted receives, forget work in progress. A queued
    /// NAK survives so the peer learns why.
    pub(crate) fn fail(&mut self, cfg: &QpConfig, cq: &mut StagedCompletions) {
        match self.cur.take() {
            Some(InMsg::Send { recv, .. }) => {
                complete_recv(cfg, cq, &recv, WcStatus::WrFlushError, 0, None)
            }
            Some(InMsg::Tagged { token, .. }) => self.tag_orphan = Some(token),
            _ => {}
        }
        while let Some(recv) = self.rq.pop_front() {
            complete_recv(cfg, cq, &recv, WcStatus::WrFlushError, 0, None);
        }
        self.reads.clear();
        self.ack_due = false;
        self.dur.clear();
    }
}

fn complete_recv(
    cfg: &QpConfig,
    cq: &mut StagedCompletions,
    recv: &RecvWqe,
    status: WcStatus,
    byte_len: u32,
    imm_data: Option<u32>,
) {
    cq.push(WorkCompletion {
        wr_id: recv.wr_id,
        qpn: cfg.local_qpn,
        opcode: WcOpcode::Recv,
        status,
        byte_len,
        imm_data,
    });
}

fn complete_write_imm(
    cfg: &QpConfig,
    cq: &mut StagedCompletions,
    recv: &RecvWqe,
    byte_len: u32,
    imm_data: Option<u32>,
) {
    cq.push(WorkCompletion {
        wr_id: recv.wr_id,
        qpn: cfg.local_qpn,
        opcode: WcOpcode::RecvRdmaWithImm,
        status: WcStatus::Success,
        byte_len,
        imm_data,
    });
}
