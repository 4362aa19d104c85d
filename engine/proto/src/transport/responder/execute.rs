//! Execution: a request that passed every check (`super::checks`) is carried out. What can
//! still fail here is only what cannot be known before touching memory or a receive: a SEND
//! longer than its receive buffer (which completes that receive in error), an ATOMIC WRITE
//! whose real address is misaligned (refused before any byte changes).

use crate::transport::QpConfig;
use crate::transport::cq::{StagedCompletions, WcStatus};
use crate::transport::mr::MemoryTable;
use crate::transport::psn;
use crate::transport::tagged::{Next, TagTarget};

use super::checks::{INVALID, Kind, Named, Op, Pos, Stop, TagStep, Target};
use super::{InMsg, ReadJob, Responder, Verdict, complete_recv, complete_write_imm};

/// A request as the checks found it, handed to [`Responder::execute`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Checked {
    /// Its PSN, the expected one.
    pub(super) psn: u32,
    /// Whether it asks for an ACK.
    pub(super) ack_req: bool,
    /// Its immediate data, if it carries one.
    pub(super) imm: Option<u32>,
    pub(super) op: Op,
    pub(super) named: Named,
    pub(super) target: Target,
    pub(super) tag: Option<TagStep>,
}

impl Responder {
    /// Carry out a checked request at the expected PSN.
    #[inline(always)]
    pub(super) fn execute(
        &mut self,
        cfg: &QpConfig,
        req: Checked,
        payload: &[u8],
        mem: &mut MemoryTable,
        cq: &mut StagedCompletions,
        tags: &mut dyn TagTarget,
    ) -> Result<Verdict, Stop> {
        let message_done = match req.op.kind {
            Kind::Send => self.execute_send(cfg, req, payload, mem, cq)?,
            // A whole eager message was matched and placed by the checks (`TagStep::Whole`):
            // told apart inline, where the call had the checked request copied to the stack
            // for it (callgrind, `tagged8x32`: 2 843.4 -> 2 791.3).
            Kind::Tagged => match req.tag {
                Some(TagStep::Whole(next)) => {
                    self.whole_tagged(next);
                    true
                }
                _ => self.execute_tagged(cfg, req, payload, mem, tags)?,
            },
            Kind::Write { durable } => self.execute_write(cfg, req, durable, payload, mem, cq)?,
            Kind::Read => return Ok(self.execute_read(cfg, req)),
            Kind::Flush => return Ok(self.execute_flush(req, mem)),
            Kind::AtomicWrite => return self.execute_atomic_write(req, payload, mem),
        };
        if message_done {
            self.msn = psn::add(self.msn, 1);
        }
        self.epsn = psn::add(self.epsn, 1);
        self.unacked += 1;
        if req.ack_req || self.unacked >= cfg.ack_coalesce {
            self.ack_due = true;
        }
        Ok(Verdict::Ok)
    }

    /// A SEND packet lands in the receive buffer; true when it ended its message.
    fn execute_send(
        &mut self,
        cfg: &QpConfig,
        req: Checked,
        payload: &[u8],
        mem: &MemoryTable,
        cq: &mut StagedCompletions,
    ) -> Result<bool, Stop> {
        if req.op.pos.opens() {
            // The receive `check_resource` found.
            let Some(recv) = self.rq.pop_front() else {
                return Err(Stop::Rnr);
            };
            if payload.len() > recv.len() as usize {
                complete_recv(cfg, cq, &recv, WcStatus::LocalLengthError, 0, None);
                return Err(INVALID);
            }
            recv.local.copy_in(mem, &self.spill, 0, payload);
            let done = payload.len() as u32;
            if req.op.pos == Pos::First {
                self.cur = Some(InMsg::Send { recv, done });
                return Ok(false);
            }
            complete_recv(cfg, cq, &recv, WcStatus::Success, done, req.imm);
            return Ok(true);
        }
        // By reference: the receive request (with its resolved buffer) stays where it is, and
        // only the count moves on, packet by packet. (`check_op_seq` found it there.)
        let Some(InMsg::Send { recv, done }) = &mut self.cur else {
            return Err(INVALID);
        };
        let total = *done as usize + payload.len();
        if total > recv.len() as usize {
            complete_recv(cfg, cq, recv, WcStatus::LocalLengthError, 0, None);
            self.cur = None;
            return Err(INVALID);
        }
        recv.local.copy_in(mem, &self.spill, *done, payload);
        if req.op.pos == Pos::Last {
            complete_recv(cfg, cq, recv, WcStatus::Success, total as u32, req.imm);
            self.cur = None;
            return Ok(true);
        }
        *done = total as u32;
        Ok(false)
    }

    /// What a tagged message leaves to do, other than nothing (out of line, so that the
    /// common case's plain store is not merged back into a copy).
    #[inline(never)]
    fn set_tag_next(&mut self, next: Next) {
        self.tag_next = next;
    }

    /// A tagged message of one packet, matched and placed: `next` is what the queue pair
    /// does after it.
    #[inline(always)]
    fn whole_tagged(&mut self, next: Next) {
        self.stats.tagged_received += 1;
        // Nearly always nothing, and then written, not copied: a copy loads `next`'s 48 bytes
        // 16 at a time from the caller's stores of 4 and 8 bytes just made, which the core
        // cannot forward, so each load waited for those stores, and every store before them,
        // to reach the cache (see `docs/rdma.md`, "Stores the core cannot forward").
        if matches!(next, Next::Nothing) {
            self.tag_next = Next::Nothing;
        } else {
            self.set_tag_next(next);
        }
    }

    /// A tagged SEND packet: a done message is noted for the queue pair, data lands where
    /// its tag matched, what does not fit the room is discarded (truncation); true when the
    /// packet ended its message.
    fn execute_tagged(
        &mut self,
        cfg: &QpConfig,
        req: Checked,
        payload: &[u8],
        mem: &mut MemoryTable,
        tags: &mut dyn TagTarget,
    ) -> Result<bool, Stop> {
        match req.tag {
            Some(TagStep::Done(cookie)) => {
                self.tag_done = Some(cookie);
                return Ok(true);
            }
            // `execute`, this function's one caller, takes this step inline and does not
            // come here with it; handled all the same, so that the function takes every step.
            Some(TagStep::Whole(next)) => {
                self.whole_tagged(next);
                return Ok(true);
            }
            Some(TagStep::Land {
                at,
                room,
                token,
                skip,
            }) => {
                self.stats.tagged_received += 1;
                let data = &payload[skip..];
                let n = data.len().min(room as usize);
                mem.store(at, &data[..n]);
                let done = data.len() as u32;
                if req.op.pos == Pos::First {
                    self.cur = Some(InMsg::Tagged {
                        at,
                        room,
                        done,
                        token,
                    });
                    return Ok(false);
                }
                self.tag_next = tags.landed(cfg.local_qpn, token, done, mem);
                return Ok(true);
            }
            None => {}
        }
        let Some(InMsg::Tagged {
            at,
            room,
            done,
            token,
        }) = &mut self.cur
        else {
            return Err(INVALID);
        };
        if *done < *room {
            let n = payload.len().min((*room - *done) as usize);
            mem.store(at.advance(u64::from(*done)), &payload[..n]);
        }
        *done = done.saturating_add(payload.len() as u32);
        if req.op.pos == Pos::Last {
            let (token, done) = (*token, *done);
            self.cur = None;
            self.tag_next = tags.landed(cfg.local_qpn, token, done, mem);
            return Ok(true);
        }
        Ok(false)
    }

    /// A WRITE packet is placed; its last packet persists it as asked and completes the
    /// receive of an immediate. True when it ended its message.
    #[inline(always)]
    fn execute_write(
        &mut self,
        cfg: &QpConfig,
        req: Checked,
        durable: bool,
        payload: &[u8],
        mem: &mut MemoryTable,
        cq: &mut StagedCompletions,
    ) -> Result<bool, Stop> {
        let (at, len, done) = match (req.named, self.cur) {
            (Named::Range(reth), _) => (req.target.at, reth.dma_len, 0),
            (_, Some(InMsg::Write { at, len, done, .. })) => (at, len, done),
            _ => return Err(INVALID),
        };
        // The receive `check_resource_after_rkey` found, taken before memory is touched.
        let recv = if req.imm.is_some() {
            match self.rq.pop_front() {
                Some(r) => Some(r),
                None => return Err(Stop::Rnr),
            }
        } else {
            None
        };
        mem.store(at.advance(u64::from(done)), payload);
        if !req.op.pos.ends() {
            self.cur = Some(InMsg::Write {
                at,
                len,
                done: done + payload.len() as u32,
                durable,
            });
            return Ok(false);
        }
        self.cur = None;
        self.written(mem, at, len, req.psn, durable, cfg.durable_writes);
        if let Some(recv) = recv {
            complete_write_imm(cfg, cq, &recv, len, req.imm);
        }
        Ok(true)
    }

    /// A READ is accepted: its responses are queued (cut into path-MTU packets when sent).
    fn execute_read(&mut self, cfg: &QpConfig, req: Checked) -> Verdict {
        let len = req.target.len as u32;
        let npkts = cfg.pmtu.packets(len);
        // A READ counts as a completed message when accepted (C9-148).
        self.msn = psn::add(self.msn, 1);
        self.reads.push_back(ReadJob {
            first_psn: req.psn,
            at: req.target.at,
            len,
            npkts,
            sent: 0,
            msn: self.msn,
            gate: self.dur.gate(),
        });
        self.epsn = psn::add(self.epsn, npkts);
        // The responses acknowledge everything before them.
        self.ack_due = false;
        self.unacked = 0;
        Verdict::Ok
    }

    /// A FLUSH: data placed by this engine is visible to the host's CPUs once placed (the
    /// copy is made by a CPU), so global visibility needs nothing more; persistence needs the
    /// range persisted, and the response waits for it and for every persist asked for before
    /// it.
    fn execute_flush(&mut self, req: Checked, mem: &mut MemoryTable) -> Verdict {
        if let Named::Flush(_, feth) = req.named
            && feth.placement.persistence
        {
            let p = mem.persist(req.target.at, req.target.len);
            self.dur.note(p);
        }
        self.accept_empty_response(req.psn)
    }

    /// An ATOMIC WRITE: the store is the only access; a region whose real address is
    /// misaligned (registered under another address) refuses it before any byte changes.
    fn execute_atomic_write(
        &mut self,
        req: Checked,
        payload: &[u8],
        mem: &mut MemoryTable,
    ) -> Result<Verdict, Stop> {
        // `check_length` saw 8 bytes.
        let Ok(value) = <[u8; 8]>::try_from(payload) else {
            return Err(INVALID);
        };
        let at = req.target.at;
        if !mem.store_u64(at, value) {
            return Err(INVALID);
        }
        if mem.persists_writes(at) {
            let p = mem.persist(at, 8);
            self.dur.note(p);
        }
        Ok(self.accept_empty_response(req.psn))
    }
}
