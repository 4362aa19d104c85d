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
//! Defined RC opcodes this responder does not execute (the atomics) NAK
//! "invalid request" and end the connection, as an unsupported opcode must. A SEND (or WRITE with immediate) that finds no posted receive
//! gets an RNR NAK and is not consumed.

use std::collections::VecDeque;

use crate::wire::aeth::{AethRepr, NakCode, Syndrome};
use crate::wire::{ImmDtRepr, Opcode, RoceRepr};

use super::cq::{CompletionQueue, WcOpcode, WcStatus, WorkCompletion};
use super::mr::{Access, Location, MemoryTable};
use super::psn;
use super::qp::QpStats;
use super::sge::Gather;
use super::{OutPacket, PayloadRef, QpConfig, RecvRequest, Refusal};

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

/// A READ being answered: the responses still to send.
#[derive(Debug, Clone, Copy)]
struct ReadJob {
    first_psn: u32,
    at: Location,
    len: u32,
    npkts: u32,
    sent: u32,
    msn: u32,
}

/// A multi-packet message between its FIRST and LAST packet. (The SEND variant carries its
/// resolved receive buffer inline; boxing it would allocate per message.)
#[derive(Debug, Clone, Copy)]
#[allow(clippy::large_enum_variant)]
enum InMsg {
    Send { recv: RecvWqe, done: u32 },
    Write { at: Location, len: u32, done: u32 },
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
    cur: Option<InMsg>,
    reads: VecDeque<ReadJob>,
    ack_due: bool,
    unacked: u32,
    nak: Option<(Syndrome, u32)>,
    /// Set when a sequence-error or RNR NAK went out for `epsn`; cleared when
    /// `epsn` arrives. Enforces one NAK per gap.
    nak_latched: bool,
    /// Responder counters (the requester fields stay zero).
    pub(crate) stats: QpStats,
}

impl Responder {
    pub(crate) fn new(cfg: &QpConfig) -> Responder {
        Responder {
            epsn: cfg.recv_psn,
            msn: 0,
            rq: VecDeque::with_capacity(cfg.max_recv_wr),
            cur: None,
            reads: VecDeque::with_capacity(cfg.max_rd_atomic as usize),
            ack_due: false,
            unacked: 0,
            nak: None,
            nak_latched: false,
            stats: QpStats::default(),
        }
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
        self.rq.iter().any(|r| r.local.uses_region(slot))
            || self.reads.iter().any(|j| j.at.region == slot)
            || match &self.cur {
                Some(InMsg::Send { recv, .. }) => recv.local.uses_region(slot),
                Some(InMsg::Write { at, .. }) => at.region == slot,
                None => false,
            }
    }

    pub(crate) fn post_recv(
        &mut self,
        cfg: &QpConfig,
        wr: &RecvRequest,
        mem: &MemoryTable,
    ) -> Result<(), Refusal> {
        if !self.has_room(cfg) {
            return Err(Refusal::Full);
        }
        let local = Gather::resolve(mem, &wr.sgl, Access::LOCAL_WRITE).map_err(Refusal::Local)?;
        self.rq.push_back(RecvWqe {
            wr_id: wr.wr_id,
            local,
        });
        Ok(())
    }

    /// Next ACK, NAK or READ response. READ responses first: they carry
    /// lower PSNs than anything an ACK could name.
    pub(crate) fn poll_transmit(&mut self, cfg: &QpConfig) -> Option<OutPacket> {
        if let Some(job) = self.reads.front_mut() {
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
            let mut repr = cfg.header(opcode, psn::add(job.first_psn, k), false);
            if opcode != Opcode::RdmaReadResponseMiddle {
                repr.aeth = Some(AethRepr {
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
            return Some(OutPacket { repr, payload });
        }
        let (syndrome, psn) = if let Some(nak) = self.nak.take() {
            match nak.0 {
                Syndrome::Nak(NakCode::PsnSequenceError) => self.stats.seq_naks_sent += 1,
                Syndrome::RnrNak { .. } => self.stats.rnr_naks_sent += 1,
                _ => self.stats.fatal_naks_sent += 1,
            }
            nak
        } else if self.ack_due {
            self.stats.acks_sent += 1;
            (Syndrome::ACK_UNLIMITED, psn::sub(self.epsn, 1))
        } else {
            return None;
        };
        // Any NAK also acknowledges everything before its PSN.
        self.ack_due = false;
        self.unacked = 0;
        let mut repr = cfg.header(Opcode::Acknowledge, psn, false);
        repr.aeth = Some(AethRepr {
            syndrome,
            msn: self.msn,
        });
        Some(OutPacket {
            repr,
            payload: None,
        })
    }

    /// Handle one request packet addressed to this QP.
    pub(crate) fn on_request(
        &mut self,
        cfg: &QpConfig,
        repr: &RoceRepr,
        payload: &[u8],
        mem: &mut MemoryTable,
        cq: &mut CompletionQueue,
    ) -> Verdict {
        let psn = repr.bth.psn;
        let d = psn::diff(psn, self.epsn);
        if d > 0 {
            self.stats.out_of_sequence += 1;
            if !self.nak_latched {
                self.nak_latched = true;
                self.nak = Some((Syndrome::Nak(NakCode::PsnSequenceError), self.epsn));
            }
            return Verdict::Ok;
        }
        if d < 0 {
            self.duplicate(cfg, repr, mem);
            return Verdict::Ok;
        }
        // The expected PSN arrived: any sequence/RNR NAK still queued is stale.
        self.nak_latched = false;
        self.nak = None;

        let mtu = cfg.pmtu.bytes() as usize;
        let imm = repr
            .immdt
            .map(|ImmDtRepr { data }| u32::from_be_bytes(data));
        let opcode = repr.bth.opcode;
        let mut message_done = false;
        match opcode {
            Opcode::SendFirst | Opcode::SendOnly | Opcode::SendOnlyWithImmediate => {
                if self.cur.is_some() {
                    return self.fatal(NakCode::InvalidRequest, psn);
                }
                let Some(&recv) = self.rq.front() else {
                    return self.rnr(cfg, psn);
                };
                let first = opcode == Opcode::SendFirst;
                if (first && payload.len() != mtu) || payload.len() > mtu {
                    return self.fatal(NakCode::InvalidRequest, psn);
                }
                self.rq.pop_front();
                if payload.len() > recv.len() as usize {
                    complete_recv(cfg, cq, &recv, WcStatus::LocalLengthError, 0, None);
                    return self.fatal(NakCode::InvalidRequest, psn);
                }
                recv.local.copy_in(mem, 0, payload);
                let done = payload.len() as u32;
                if first {
                    self.cur = Some(InMsg::Send { recv, done });
                } else {
                    complete_recv(cfg, cq, &recv, WcStatus::Success, done, imm);
                    message_done = true;
                }
            }
            Opcode::SendMiddle | Opcode::SendLast | Opcode::SendLastWithImmediate => {
                // By reference: the receive request (with its resolved buffer) stays where it
                // is, and only the count moves on, packet by packet.
                let Some(InMsg::Send { recv, done }) = &mut self.cur else {
                    return self.fatal(NakCode::InvalidRequest, psn);
                };
                let last = opcode != Opcode::SendMiddle;
                if (!last && payload.len() != mtu) || payload.is_empty() || payload.len() > mtu {
                    return self.fatal(NakCode::InvalidRequest, psn);
                }
                let total = *done as usize + payload.len();
                if total > recv.len() as usize {
                    complete_recv(cfg, cq, recv, WcStatus::LocalLengthError, 0, None);
                    self.cur = None;
                    return self.fatal(NakCode::InvalidRequest, psn);
                }
                recv.local.copy_in(mem, *done, payload);
                if last {
                    complete_recv(cfg, cq, recv, WcStatus::Success, total as u32, imm);
                    self.cur = None;
                    message_done = true;
                } else {
                    *done = total as u32;
                }
            }
            Opcode::RdmaWriteFirst | Opcode::RdmaWriteOnly | Opcode::RdmaWriteOnlyWithImmediate => {
                let Some(reth) = repr.reth else {
                    return self.fatal(NakCode::InvalidRequest, psn);
                };
                if self.cur.is_some() {
                    return self.fatal(NakCode::InvalidRequest, psn);
                }
                let len = reth.dma_len as usize;
                let first = opcode == Opcode::RdmaWriteFirst;
                let shape_ok = if first {
                    payload.len() == mtu && len > mtu
                } else {
                    payload.len() == len && len <= mtu
                };
                if !shape_ok {
                    return self.fatal(NakCode::InvalidRequest, psn);
                }
                let at = match mem.check_remote_dma(
                    reth.rkey,
                    reth.virtual_addr,
                    u64::from(reth.dma_len),
                    Access::REMOTE_WRITE,
                ) {
                    Ok(at) => at,
                    Err(_) => return self.fatal(NakCode::RemoteAccessError, psn),
                };
                // An immediate needs a receive: check before touching memory
                // so that the RNR retry finds everything as it was.
                let recv = if imm.is_some() {
                    match self.rq.pop_front() {
                        Some(r) => Some(r),
                        None => return self.rnr(cfg, psn),
                    }
                } else {
                    None
                };
                mem.place(at, payload);
                if first {
                    self.cur = Some(InMsg::Write {
                        at,
                        len: reth.dma_len,
                        done: payload.len() as u32,
                    });
                } else {
                    if let Some(recv) = recv {
                        complete_write_imm(cfg, cq, &recv, reth.dma_len, imm);
                    }
                    message_done = true;
                }
            }
            Opcode::RdmaWriteMiddle
            | Opcode::RdmaWriteLast
            | Opcode::RdmaWriteLastWithImmediate => {
                let Some(InMsg::Write { at, len, done }) = self.cur else {
                    return self.fatal(NakCode::InvalidRequest, psn);
                };
                let last = opcode != Opcode::RdmaWriteMiddle;
                let total = done as usize + payload.len();
                let shape_ok = if last {
                    total == len as usize && !payload.is_empty() && payload.len() <= mtu
                } else {
                    payload.len() == mtu && total < len as usize
                };
                if !shape_ok {
                    return self.fatal(NakCode::InvalidRequest, psn);
                }
                let recv = if imm.is_some() {
                    match self.rq.pop_front() {
                        Some(r) => Some(r),
                        None => return self.rnr(cfg, psn),
                    }
                } else {
                    None
                };
                mem.place(at.advance(u64::from(done)), payload);
                if last {
                    self.cur = None;
                    if let Some(recv) = recv {
                        complete_write_imm(cfg, cq, &recv, len, imm);
                    }
                    message_done = true;
                } else {
                    self.cur = Some(InMsg::Write {
                        at,
                        len,
                        done: total as u32,
                    });
                }
            }
            Opcode::RdmaReadRequest => {
                let Some(reth) = repr.reth else {
                    return self.fatal(NakCode::InvalidRequest, psn);
                };
                if self.cur.is_some() {
                    return self.fatal(NakCode::InvalidRequest, psn);
                }
                let at = match mem.check_remote_dma(
                    reth.rkey,
                    reth.virtual_addr,
                    u64::from(reth.dma_len),
                    Access::REMOTE_READ,
                ) {
                    Ok(at) => at,
                    Err(_) => return self.fatal(NakCode::RemoteAccessError, psn),
                };
                if self.reads.len() >= cfg.max_rd_atomic as usize {
                    // More READs than negotiated: drop it unacknowledged; the
                    // requester's timer sends it again.
                    self.stats.dropped_requests += 1;
                    return Verdict::Ok;
                }
                let npkts = cfg.pmtu.packets(reth.dma_len);
                // A READ counts as a completed message when accepted (C9-148).
                self.msn = psn::add(self.msn, 1);
                self.reads.push_back(ReadJob {
                    first_psn: psn,
                    at,
                    len: reth.dma_len,
                    npkts,
                    sent: 0,
                    msn: self.msn,
                });
                self.epsn = psn::add(self.epsn, npkts);
                // The responses acknowledge everything before them.
                self.ack_due = false;
                self.unacked = 0;
                return Verdict::Ok;
            }
            _ => return self.fatal(NakCode::InvalidRequest, psn),
        }
        if message_done {
            self.msn = psn::add(self.msn, 1);
        }
        self.epsn = psn::add(self.epsn, 1);
        self.unacked += 1;
        if repr.bth.ack_req || self.unacked >= cfg.ack_coalesce {
            self.ack_due = true;
        }
        Verdict::Ok
    }

    /// A request behind `epsn`: re-ACK SEND/WRITE, re-execute READ.
    fn duplicate(&mut self, cfg: &QpConfig, repr: &RoceRepr, mem: &MemoryTable) {
        self.stats.duplicate_requests += 1;
        if repr.bth.opcode != Opcode::RdmaReadRequest {
            if repr.bth.ack_req {
                self.ack_due = true;
            }
            return;
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
        let psn = repr.bth.psn;
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
    pub(crate) fn fail(&mut self, cfg: &QpConfig, cq: &mut CompletionQueue) {
        if let Some(InMsg::Send { recv, .. }) = self.cur.take() {
            complete_recv(cfg, cq, &recv, WcStatus::WrFlushError, 0, None);
        }
        while let Some(recv) = self.rq.pop_front() {
            complete_recv(cfg, cq, &recv, WcStatus::WrFlushError, 0, None);
        }
        self.reads.clear();
        self.ack_due = false;
    }
}

fn complete_recv(
    cfg: &QpConfig,
    cq: &mut CompletionQueue,
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
    cq: &mut CompletionQueue,
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
