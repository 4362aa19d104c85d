//! A queue pair: one requester and one responder behind one configuration,
//! one state (Ready or Error) and one set of counters.
//!
//! The QP routes received packets by opcode (requests to the responder,
//! ACKs/NAKs/READ responses to the requester), interleaves the two halves'
//! output (responder first, so ACKs are never starved by bulk sends), and
//! owns the move to the error state: the failing WQE completes with its
//! status, everything else still posted completes with a flush error, and
//! later posts complete with a flush error at once.

use crate::cc::{CcMode, Notifier};
use wire::bth::Opcode;
use wire::ceth::Level;
use wire::template::HeaderTemplate;
use wire::{Ecn, PacketFields, RoceRepr};

use super::cq::{StagedCompletions, WcOpcode, WcStatus, WorkCompletion};
use super::mr::MemoryTable;
use super::requester::{Outcome, Requester};
use super::responder::{Responder, Verdict};
use super::sge::{LocalError, Sge};
use super::tagged::{Next, NoTags, TagTarget};
use super::{
    Budget, ConfigError, Inadmissible, OutPacket, PayloadRef, PostError, QpConfig, RecvRequest,
    Refusal, WorkRequest, WrKind, pkey_matches,
};

/// The QP states this transport distinguishes. (Reset/Init/RTR are the
/// connection manager's business; a QP is created ready to send.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Ready to send and receive.
    Ready,
    /// A fatal error happened; every work request completes with a flush error.
    Error,
}

/// Counters of one QP; plain integers, summed by whoever reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QpStats {
    // Requester.
    /// Request packets sent, retransmissions included.
    pub tx_requests: u64,
    /// Request packets sent again (go-back-N, timeout, RNR retry).
    pub retransmissions: u64,
    /// Retransmitted packets the responder already had: acknowledged sooner after they were
    /// sent again than half the shortest round trip measured (see `transport::rto`).
    pub spurious_retransmissions: u64,
    pub acks_received: u64,
    pub seq_naks_received: u64,
    pub rnr_naks_received: u64,
    pub fatal_naks_received: u64,
    pub timeouts: u64,
    /// Times the transmit cursor went back because of a NAK or a response gap.
    pub go_back_n: u64,
    /// READ responses for PSNs already received (or otherwise stale).
    pub duplicate_responses: u64,
    /// Responses that matched nothing outstanding or had a wrong length.
    pub ignored_responses: u64,
    /// MSN of the latest AETH seen.
    pub last_msn: u32,
    /// Durable ACKs received (repeats included).
    pub durable_acks_received: u64,
    /// Receipt ACKs (0xE3) received: the WRITEs they covered wait for the durable ACK.
    pub receipt_acks_received: u64,
    /// Durable-ACK timer expiries, and the probes they sent.
    pub durable_timeouts: u64,
    pub durable_probes: u64,
    // Responder.
    pub acks_sent: u64,
    pub seq_naks_sent: u64,
    pub rnr_naks_sent: u64,
    pub fatal_naks_sent: u64,
    pub read_responses_sent: u64,
    /// Requests behind the expected PSN.
    pub duplicate_requests: u64,
    /// Duplicate READs answered again from memory.
    pub reexecuted_reads: u64,
    /// Requests ahead of the expected PSN (dropped; the first one NAKed).
    pub out_of_sequence: u64,
    /// Requests dropped for lack of READ queue space.
    pub dropped_requests: u64,
    /// Durable ACKs (Portico's extension) sent.
    pub durable_acks_sent: u64,
    /// Receipt ACKs not sent because the durable ACK that went instead named the same last
    /// PSN (one frame instead of two).
    pub receipt_acks_folded: u64,
    /// Receipt ACKs (0xE3) sent: ACKs that covered a plain WRITE into a durable region not
    /// durable yet, from a requester that speaks the durable-write extension.
    pub receipt_acks_sent: u64,
    /// Tagged messages (eager or rendezvous) whose envelope was matched.
    pub tagged_received: u64,
    /// Tagged SENDs whose tag header did not parse (answered "invalid request").
    pub bad_tag_headers: u64,
    // Congestion control.
    /// Requests that arrived marked CE.
    pub ce_received: u64,
    /// ACKs sent with BECN (and a CETH): `cc = ack`.
    pub becn_acks_sent: u64,
    /// ACKs received with BECN.
    pub becn_acks_received: u64,
    /// CNPs sent (`cc = dcqcn`).
    pub cnps_sent: u64,
    /// CNPs received (acted on with `cc = dcqcn`, ignored otherwise).
    pub cnps_received: u64,
    /// Enhanced CNPs sent (`cc = ack`): the congestion of the READ responses received, in a
    /// CETH (service READ responses).
    pub read_cnps_sent: u64,
    /// Enhanced CNPs received: this queue pair's READ responses were paced by them.
    pub read_cnps_received: u64,
    // Both.
    pub rx_packets: u64,
    /// Packets for another QP number, or received in the error state.
    pub rx_dropped: u64,
}

impl QpStats {
    /// Add `other`'s counters to these; `last_msn` takes the larger value
    /// (only the requester sets it).
    fn merge(&mut self, o: &QpStats) {
        self.tx_requests += o.tx_requests;
        self.retransmissions += o.retransmissions;
        self.spurious_retransmissions += o.spurious_retransmissions;
        self.acks_received += o.acks_received;
        self.seq_naks_received += o.seq_naks_received;
        self.rnr_naks_received += o.rnr_naks_received;
        self.fatal_naks_received += o.fatal_naks_received;
        self.timeouts += o.timeouts;
        self.go_back_n += o.go_back_n;
        self.duplicate_responses += o.duplicate_responses;
        self.ignored_responses += o.ignored_responses;
        self.last_msn = self.last_msn.max(o.last_msn);
        self.durable_acks_received += o.durable_acks_received;
        self.durable_timeouts += o.durable_timeouts;
        self.durable_probes += o.durable_probes;
        self.durable_acks_sent += o.durable_acks_sent;
        self.receipt_acks_folded += o.receipt_acks_folded;
        self.receipt_acks_sent += o.receipt_acks_sent;
        self.receipt_acks_received += o.receipt_acks_received;
        self.tagged_received += o.tagged_received;
        self.bad_tag_headers += o.bad_tag_headers;
        self.acks_sent += o.acks_sent;
        self.seq_naks_sent += o.seq_naks_sent;
        self.rnr_naks_sent += o.rnr_naks_sent;
        self.fatal_naks_sent += o.fatal_naks_sent;
        self.read_responses_sent += o.read_responses_sent;
        self.duplicate_requests += o.duplicate_requests;
        self.reexecuted_reads += o.reexecuted_reads;
        self.out_of_sequence += o.out_of_sequence;
        self.dropped_requests += o.dropped_requests;
        self.ce_received += o.ce_received;
        self.becn_acks_sent += o.becn_acks_sent;
        self.becn_acks_received += o.becn_acks_received;
        self.cnps_sent += o.cnps_sent;
        self.cnps_received += o.cnps_received;
        self.read_cnps_sent += o.read_cnps_sent;
        self.read_cnps_received += o.read_cnps_received;
        self.rx_packets += o.rx_packets;
        self.rx_dropped += o.rx_dropped;
    }
}

/// An RC queue pair. See the module documentation of [`crate::transport`].
#[derive(Debug)]
pub struct QueuePair {
    cfg: QpConfig,
    state: QpState,
    req: Requester,
    resp: Responder,
    stats: QpStats,
    /// The headers every packet of this queue pair shares, prepared once: packets are
    /// emitted by patching it ([`HeaderTemplate`]).
    template: HeaderTemplate,
    /// The receiver's side of congestion control: CE marks of arriving requests turned into
    /// ACK state or CNPs.
    notifier: Notifier,
    /// A CNP to send (`cc = dcqcn`), and the template of its headers (the CNP's DSCP and ECN
    /// are the ConnectX capture's, not the queue pair's).
    cnp_due: bool,
    cnp_template: Option<HeaderTemplate>,
    /// `cc = ack`: an enhanced CNP to send (the congestion state of the READ responses this
    /// queue pair receives, for its peer's READ-response pacer), and the level the last one
    /// said, when, and how often the same level has been said since it changed.
    ecnp_due: bool,
    ecnp_said: Option<(Level, u64, u32)>,
}

/// Payloads up to this long are copied into the frame first and folded into the ICRC with
/// the extension headers in one call ([`QueuePair::emit`]); longer ones are folded as they
/// are copied (one pass).
const COPY_THEN_FOLD: usize = 256;

/// The DSCP of CNPs, as ConnectX NICs send them (and NVIDIA's firmware default).
pub const CNP_DSCP: u8 = 48;

impl QueuePair {
    /// Create a QP in the Ready state. All queues are allocated here, at
    /// their configured depth.
    pub fn new(cfg: QpConfig) -> Result<QueuePair, ConfigError> {
        cfg.validate()?;
        let template = HeaderTemplate::new(&cfg.header(Opcode::SendOnly, 0, false))
            .map_err(|_| ConfigError { field: "addresses" })?;
        let cnp_template = match cfg.cc.mode {
            CcMode::Dcqcn | CcMode::Ack => Some(
                HeaderTemplate::new(&cnp_header(&cfg))
                    .map_err(|_| ConfigError { field: "addresses" })?,
            ),
            _ => None,
        };
        Ok(QueuePair {
            req: Requester::new(&cfg),
            resp: Responder::new(&cfg),
            notifier: Notifier::new(&cfg.cc),
            cnp_due: false,
            cnp_template,
            ecnp_due: false,
            ecnp_said: None,
            cfg,
            state: QpState::Ready,
            stats: QpStats::default(),
            template,
        })
    }

    pub fn config(&self) -> &QpConfig {
        &self.cfg
    }

    pub fn state(&self) -> QpState {
        self.state
    }

    /// The QP's counters: the requester's, the responder's and its own,
    /// merged (each half only counts its own fields).
    pub fn stats(&self) -> QpStats {
        let mut s = self.stats.clone();
        s.merge(&self.req.stats);
        s.merge(&self.resp.stats);
        s
    }

    /// Packets the queue pair took from its peer (what [`QueuePair::stats`] reports as
    /// `rx_packets`, without merging the rest).
    pub fn rx_packets(&self) -> u64 {
        self.stats.rx_packets
    }

    pub fn requester(&self) -> &Requester {
        &self.req
    }

    pub fn responder(&self) -> &Responder {
        &self.resp
    }

    /// Whether the send queue takes another work request (in the error state it always does:
    /// the request completes at once with a flush error).
    pub fn send_queue_has_room(&self) -> bool {
        self.state == QpState::Error || self.req.has_room(&self.cfg)
    }

    /// Queue a SEND, RDMA WRITE or RDMA READ. The local buffer is checked
    /// now (every scatter/gather entry: key, bounds, LOCAL_WRITE for a READ);
    /// a bad one completes the request with a local protection (or length)
    /// error and moves the QP to the error state, as in verbs. In the error
    /// state the request is accepted and completes at once with a flush error.
    /// Refused only when the send queue is full.
    pub fn post_send(
        &mut self,
        wr: &WorkRequest,
        mem: &MemoryTable,
        cq: &mut StagedCompletions,
    ) -> Result<(), PostError> {
        self.post_send_pieces(wr.wr_id, &wr.kind, wr.sgl.as_slice(), mem, cq)
    }

    /// [`QueuePair::post_send`] of a request given by its parts, its list borrowed: an
    /// engine's host ring carries a request's one piece inline and a longer list apart, and
    /// hands them over without building a [`WorkRequest`] (its list is a fixed array of
    /// [`MAX_SGE`](super::MAX_SGE) pieces, 264 bytes). Its kind by reference: where it lies
    /// in the ring, not copied to the caller's stack for the call (callgrind: a batched 64 B
    /// WRITE 1 621.5 -> 1 617.4, a lone one 3 502 -> 3 498).
    pub fn post_send_pieces(
        &mut self,
        wr_id: u64,
        kind: &WrKind,
        sges: &[Sge],
        mem: &MemoryTable,
        cq: &mut StagedCompletions,
    ) -> Result<(), PostError> {
        let kind = *kind;
        let opcode = kind.wc_opcode();
        if self.state == QpState::Error {
            self.complete(cq, wr_id, opcode, WcStatus::WrFlushError);
            return Ok(());
        }
        match self.req.post(&self.cfg, wr_id, kind, sges, mem) {
            Ok(()) => Ok(()),
            Err(Refusal::Full) => Err(PostError::SendQueueFull),
            Err(Refusal::Local(e)) => {
                self.complete(cq, wr_id, opcode, local_status(e));
                self.enter_error(None, cq);
                Ok(())
            }
        }
    }

    /// Queue a receive buffer for an incoming SEND or WRITE with immediate;
    /// a bad buffer completes as in [`QueuePair::post_send`].
    pub fn post_recv(
        &mut self,
        wr: &RecvRequest,
        mem: &MemoryTable,
        cq: &mut StagedCompletions,
    ) -> Result<(), PostError> {
        self.post_recv_pieces(wr.wr_id, wr.sgl.as_slice(), mem, cq)
    }

    /// [`QueuePair::post_recv`] of a request given by its parts, as
    /// [`QueuePair::post_send_pieces`].
    pub fn post_recv_pieces(
        &mut self,
        wr_id: u64,
        sges: &[Sge],
        mem: &MemoryTable,
        cq: &mut StagedCompletions,
    ) -> Result<(), PostError> {
        if self.state == QpState::Error {
            self.complete(cq, wr_id, WcOpcode::Recv, WcStatus::WrFlushError);
            return Ok(());
        }
        match self.resp.post_recv(&self.cfg, wr_id, sges, mem) {
            Ok(()) => Ok(()),
            Err(Refusal::Full) => Err(PostError::RecvQueueFull),
            Err(Refusal::Local(e)) => {
                self.complete(cq, wr_id, WcOpcode::Recv, local_status(e));
                self.enter_error(None, cq);
                Ok(())
            }
        }
    }

    fn complete(&self, cq: &mut StagedCompletions, wr_id: u64, opcode: WcOpcode, status: WcStatus) {
        cq.push(WorkCompletion {
            wr_id,
            qpn: self.cfg.local_qpn,
            opcode,
            status,
            byte_len: 0,
            imm_data: None,
        });
    }

    /// The receiver's side of congestion control.
    pub fn notifier(&self) -> &Notifier {
        &self.notifier
    }

    /// Whether this queue pair's ACKs follow the engine's port-wide ECN window.
    pub fn port_scoped_ecn(&self) -> bool {
        self.notifier.port_scoped()
    }

    /// The port-wide ECN window's verdict on the packet about to be handed to
    /// [`QueuePair::on_packet`].
    pub fn set_shared_level(&mut self, shared: crate::cc::SharedLevel) {
        self.notifier.set_shared(shared);
    }

    /// The port's level changed through another queue pair's packet: owe an ACK that says it
    /// (a repeat of the last one when nothing new arrived). False when this queue pair has
    /// received nothing yet or is in the error state (nothing to acknowledge).
    pub fn announce_level(&mut self, shared: crate::cc::SharedLevel) -> bool {
        if self.state != QpState::Ready {
            return false;
        }
        self.notifier.set_shared(shared);
        self.resp.repeat_ack()
    }

    /// The depth of the receiving engine's own ingress queue (a bottleneck in front of it),
    /// which the CETH reports.
    pub fn note_ingress_queue(&mut self, bytes: Option<u32>) {
        self.notifier.set_ingress_queue(bytes);
    }

    /// The queuing delay of that ingress queue (ns), which the CETH reports where both ends
    /// use the delay field (`AckParams::delay`).
    pub fn note_ingress_delay(&mut self, ns: Option<u32>) {
        self.notifier.set_ingress_delay(ns);
    }

    /// The next response to transmit: a CNP, an ACK, a NAK or a READ response. Responses
    /// never wait behind requests, whatever paces the requests. With `cc = ack` every ACK
    /// carries the congestion state: BECN and a CETH while congested, neither once clear.
    pub fn poll_response(&mut self, now: u64) -> Option<OutPacket> {
        self.poll_responses(now, false)
    }

    /// [`QueuePair::poll_response`] without READ responses, which a traffic shaper paces
    /// ([`QueuePair::poll_read_response`]): CNPs, ACKs, NAKs and durable ACKs, which never
    /// wait for it. A NAK or durable ACK that would acknowledge a READ still being answered
    /// waits for its last response.
    pub fn poll_response_but_reads(&mut self, now: u64) -> Option<OutPacket> {
        self.poll_responses(now, true)
    }

    /// Whether a READ response is ready to go but for the pacer (its persists done).
    pub fn has_read_response(&self) -> bool {
        self.state != QpState::Error && self.resp.peek_read_response(&self.cfg).is_some()
    }

    /// The frame bytes of the READ response [`QueuePair::poll_read_response`] would hand out,
    /// if one may go now: its persists done, and the queue pair's congestion-control pacer
    /// (READ responses travel the same path as its requests, and are paced with them) lets it
    /// (a shaper's peek; sends nothing).
    pub fn peek_read_response(&mut self, now: u64) -> Option<u32> {
        if self.state == QpState::Error {
            return None;
        }
        let frame = self.resp.peek_read_response(&self.cfg)?;
        self.req.cc.may_send(now).then_some(frame)
    }

    /// The next READ response packet, if one may go (after [`QueuePair::peek_read_response`]).
    pub fn poll_read_response(&mut self, now: u64) -> Option<OutPacket> {
        self.peek_read_response(now)?;
        let p = self.resp.poll_read_response(&self.cfg)?;
        self.req.cc.on_sent(now, p.frame_len());
        Some(p)
    }

    /// [`QueuePair::poll_response`] (`reads_held` false) or
    /// [`QueuePair::poll_response_but_reads`] (true), for a caller that decides at run time.
    #[inline]
    pub fn poll_responses(&mut self, now: u64, reads_held: bool) -> Option<OutPacket> {
        let mut slot = OutPacket::UNSET;
        self.poll_responses_into(now, reads_held, &mut slot)
            .then_some(slot)
    }

    /// [`QueuePair::poll_responses`] writing the packet into `slot` (true when there is one),
    /// as [`QueuePair::poll_request_into`].
    ///
    /// Most calls find nothing to send (a requester's queue pair, or a responder's after its
    /// ACK went): that is looked at inline first, from five flags, before the call.
    #[inline]
    pub fn poll_responses_into(
        &mut self,
        now: u64,
        reads_held: bool,
        slot: &mut OutPacket,
    ) -> bool {
        if !self.cnp_due && !self.ecnp_due && self.resp.quiet() {
            return false;
        }
        self.poll_responses_due(now, reads_held, slot)
    }

    #[inline(never)]
    fn poll_responses_due(&mut self, now: u64, reads_held: bool, slot: &mut OutPacket) -> bool {
        if self.cnp_due || self.ecnp_due {
            let mut fields = CNP;
            if self.cnp_due {
                self.cnp_due = false;
                self.stats.cnps_sent += 1;
            } else {
                // An enhanced CNP: the congestion of the READ responses, in a CETH.
                self.ecnp_due = false;
                self.stats.read_cnps_sent += 1;
                fields.ceth = self.notifier.read_response_ceth();
                if let Some(c) = &fields.ceth {
                    let n = match self.ecnp_said {
                        Some((level, _, n)) if level == c.level => n + 1,
                        _ => 1,
                    };
                    self.ecnp_said = Some((c.level, now, n));
                }
            }
            *slot = OutPacket {
                fields,
                payload: None,
            };
            return true;
        }
        // With no READ being answered (the common case: SEND and WRITE traffic) there is
        // nothing to send or hold back here.
        let answering = self.resp.answering_reads();
        if answering
            && !reads_held
            && let Some(p) = self.poll_read_response(now)
        {
            *slot = p;
            return true;
        }
        // A READ response the pacer holds: nothing that would acknowledge it may pass it.
        let held = answering && (reads_held || self.resp.peek_read_response(&self.cfg).is_some());
        self.resp.poll_control(held, &mut self.notifier, slot)
    }

    /// Whether both [`QueuePair::poll_responses_into`] and [`QueuePair::poll_request_into`]
    /// would find nothing to send, at any time, until something else happens to the queue
    /// pair (a packet, a post, a timer): the two inline checks of those calls.
    ///
    /// The requests are looked at first, and the send queue's end before the rest: in a burst
    /// every packet but the last fails there.
    #[inline(always)]
    pub fn has_nothing_to_send(&self) -> bool {
        (self.req.nothing_to_send() || self.state == QpState::Error)
            && !self.cnp_due
            && !self.ecnp_due
            && self.resp.quiet()
    }

    /// The next request packet (SEND, WRITE, READ request), if the window, the READ limit,
    /// the RNR timer and `budget` allow one. Nothing is committed unless a packet is handed
    /// out; what is handed out is charged to `budget`.
    ///
    /// A queue pair whose requests have all gone (the call after its last packet, each turn)
    /// is told apart inline, before the call.
    #[inline]
    pub fn poll_request(&mut self, now: u64, budget: &mut Budget) -> Option<OutPacket> {
        let mut slot = OutPacket::UNSET;
        self.poll_request_into(now, budget, &mut slot)
            .then_some(slot)
    }

    /// [`QueuePair::poll_request`] writing the packet into `slot` (true when there is one):
    /// built where the caller keeps it, not moved out of an `Option` (an `OutPacket` is 136
    /// bytes; callgrind: 18 instructions a WRITE, 14 an ACK).
    #[inline]
    pub fn poll_request_into(
        &mut self,
        now: u64,
        budget: &mut Budget,
        slot: &mut OutPacket,
    ) -> bool {
        if self.state == QpState::Error || self.req.nothing_to_send() {
            return false;
        }
        self.poll_request_due(now, budget, slot)
    }

    #[inline(never)]
    fn poll_request_due(&mut self, now: u64, budget: &mut Budget, slot: &mut OutPacket) -> bool {
        self.req.poll_request(now, &self.cfg, budget, slot)
    }

    /// The request [`QueuePair::poll_request`] would hand out now given room: its frame bytes
    /// and the frame bytes of the responses it will pull in (a READ's); `None` if the window,
    /// the READ limit, the pacer or the RNR timer hold it (or there is none). Sends nothing.
    pub fn peek_request(&mut self, now: u64) -> Option<(u32, u32)> {
        let mut peek = Budget::peek();
        let sent = self.poll_request(now, &mut peek);
        debug_assert!(sent.is_none(), "nothing fits a peek");
        peek.offered
    }

    /// Whether the requester has a request it has not sent yet, or must send again (what a
    /// traffic shaper keeps the queue pair's stream active for).
    pub fn has_requests(&self) -> bool {
        self.state != QpState::Error && self.req.has_unsent()
    }

    /// The next packet of either kind, responses first, requests unbudgeted (tests and
    /// simple drivers).
    pub fn poll_transmit(&mut self, now: u64) -> Option<OutPacket> {
        self.poll_response(now)
            .or_else(|| self.poll_request(now, &mut Budget::packets(u32::MAX)))
    }

    /// Copy the payload of `p` (handed out by this QP since its last change) out of the
    /// application's memory into `dst` (`p.len()` bytes).
    pub fn copy_payload(&self, p: &PayloadRef, mem: &MemoryTable, dst: &mut [u8]) {
        match *p {
            PayloadRef::Region { at, .. } => mem.fetch(at, dst),
            PayloadRef::SendQueue { wqe, offset, .. } => {
                self.req.copy_payload(&self.cfg, mem, wqe, offset, dst)
            }
        }
    }

    /// [`QueuePair::copy_payload`] folding the bytes into the CRC register `reg` as they are
    /// copied; returns the register after them.
    fn copy_payload_crc(&self, p: &PayloadRef, mem: &MemoryTable, dst: &mut [u8], reg: u32) -> u32 {
        match *p {
            PayloadRef::Region { at, .. } => mem.fetch_crc(at, dst, reg),
            PayloadRef::SendQueue { wqe, offset, .. } => self
                .req
                .copy_payload_crc(&self.cfg, mem, wqe, offset, dst, reg),
        }
    }

    /// Write the whole frame of `pkt` (handed out by this QP since its last change) into
    /// `buf`: headers, the payload copied from the application's memory, pad and ICRC.
    /// Returns the frame length; `buf` must hold [`OutPacket::frame_len`] bytes (the
    /// template refuses a shorter one, `Truncated`, before it writes).
    pub fn emit(&self, pkt: &OutPacket, mem: &MemoryTable, buf: &mut [u8]) -> wire::Result<usize> {
        let plen = pkt.payload_len();
        let template = self.template_for(pkt.fields.opcode);
        // A payload longer than `COPY_THEN_FOLD` is folded into the ICRC as it is copied out
        // of the application's memory: one pass over its bytes (`pmem::crc`). A shorter one
        // is copied first, then folded with the extension headers in one call: a second read
        // of a few lines just written, for one kernel call fewer (32 instructions a 64 B
        // WRITE, callgrind). Inline in each of the template's opcode arms: out of line, it was
        // a call of 72 instructions a batched WRITE.
        template.emit_fields(
            &pkt.fields,
            plen,
            buf,
            #[inline(always)]
            |tail: &mut [u8], ext: usize, reg: u32| {
                let (headers, body) = tail.split_at_mut(ext);
                match &pkt.payload {
                    Some(p) if body.len() <= COPY_THEN_FOLD => {
                        self.copy_payload(p, mem, body);
                        pmem::crc::update(reg, tail)
                    }
                    Some(p) => {
                        let reg = pmem::crc::update(reg, headers);
                        self.copy_payload_crc(p, mem, body, reg)
                    }
                    None => pmem::crc::update(reg, headers),
                }
            },
        )
    }

    /// [`QueuePair::emit`] of an ACKNOWLEDGE (`pkt.fields.opcode`; anything else is written
    /// as `emit` writes it), from the template's prepared ACK ([`HeaderTemplate::emit_ack`]).
    /// The caller tells ACKs apart: a check in `emit` changed the registers of its other
    /// packets' paths (a batched 64 B WRITE +6.3 instructions, a READ +19, callgrind).
    #[inline(never)]
    pub fn emit_ack(
        &self,
        pkt: &OutPacket,
        mem: &MemoryTable,
        buf: &mut [u8],
    ) -> wire::Result<usize> {
        if pkt.payload.is_some() {
            return self.emit_cold(pkt, mem, buf);
        }
        self.template.emit_ack(&pkt.fields, buf, |tail, _ext, reg| {
            pmem::crc::update(reg, tail)
        })
    }

    /// [`QueuePair::emit`], out of line, for [`QueuePair::emit_ack`] given a packet with a
    /// payload (no ACK has one).
    #[cold]
    #[inline(never)]
    fn emit_cold(&self, pkt: &OutPacket, mem: &MemoryTable, buf: &mut [u8]) -> wire::Result<usize> {
        self.emit(pkt, mem, buf)
    }

    /// The template a packet of `opcode` is written from: a packet is its fields, its flow
    /// the template's (`QpConfig::header`), or the CNP template's (`cnp_header`) for a CNP.
    #[inline(always)]
    fn template_for(&self, opcode: Opcode) -> &HeaderTemplate {
        match (&self.cnp_template, opcode) {
            (Some(t), Opcode::Cnp) => t,
            _ => &self.template,
        }
    }

    /// The whole headers of `pkt` (handed out by this queue pair), as its frame carries them
    /// but for the pad count: its fields in the flow of the template that writes it.
    pub fn packet_repr(&self, pkt: &OutPacket) -> RoceRepr {
        pkt.fields
            .with_flow(self.template_for(pkt.fields.opcode).flow())
    }

    /// Whether any work request, message in progress or READ being answered uses region
    /// `slot` (deregistration waits until none does).
    pub fn uses_region(&self, slot: u32) -> bool {
        self.req.uses_region(slot) || self.resp.uses_region(slot)
    }

    /// Handle one received, already parsed and ICRC-checked packet.
    /// `payload` is the packet's payload without pad and ICRC.
    /// Whether a packet addressed to this queue pair may reach its state machines at all:
    /// its P_Key matches ([`pkey_matches`]), and it comes from the connected peer's address.
    /// A refused packet changes nothing (no NAK: the sender is not a party to this
    /// connection, or not in its partition).
    pub fn admit(&self, repr: &RoceRepr) -> Result<(), Inadmissible> {
        if !pkey_matches(repr.bth.pkey, self.cfg.pkey) {
            return Err(Inadmissible::PKey);
        }
        if repr.ip.src_addr != self.cfg.remote_ip {
            return Err(Inadmissible::Source);
        }
        Ok(())
    }

    pub fn on_packet(
        &mut self,
        now: u64,
        repr: &RoceRepr,
        payload: &[u8],
        mem: &mut MemoryTable,
        cq: &mut StagedCompletions,
    ) {
        self.on_packet_with(now, repr, payload, mem, cq, &mut NoTags)
    }

    /// [`QueuePair::on_packet`] on an engine with tagged messaging: `tags` matches the tagged
    /// messages that arrive and hears of the pulls this queue pair completes.
    pub fn on_packet_with(
        &mut self,
        now: u64,
        repr: &RoceRepr,
        payload: &[u8],
        mem: &mut MemoryTable,
        cq: &mut StagedCompletions,
        tags: &mut dyn TagTarget,
    ) {
        // A one-packet WRITE, the commonest request, and a longer WRITE's middle packets
        // handled with their opcode a constant, down to the responder's opcode sequence check.
        // (Callgrind: a batched 64 B WRITE 1 799.1 -> 1 760.1 instructions, a lone one 3 829
        // -> 3 793, a 64 KiB one 89 471 -> 88 422; a lone READ 4 277 -> 4 282. With the
        // one-packet arm alone: 1 757.1, 3 789, 89 263 and 4 268.)
        match repr.bth.opcode {
            Opcode::RdmaWriteOnly => {
                self.on_packet_as(now, repr, Opcode::RdmaWriteOnly, payload, mem, cq, tags)
            }
            Opcode::RdmaWriteMiddle => {
                self.on_packet_as(now, repr, Opcode::RdmaWriteMiddle, payload, mem, cq, tags)
            }
            opcode if opcode != Opcode::SendOnly => {
                self.on_packet_as(now, repr, opcode, payload, mem, cq, tags)
            }
            _ => self.on_send_only(now, repr, payload, mem, cq, tags),
        }
    }

    /// [`QueuePair::on_packet_with`] of a SEND ONLY (a tagged eager message, MPI's commonest)
    /// with its opcode a constant. Out of line, and tested for after the WRITEs' arms: inline,
    /// it was 20 instructions fewer a tagged message and 3 to 5 more a WRITE (callgrind:
    /// `tagged8x32` 3 371.8 -> 3 271.8 as it is, `write64x32` 1 586.1 -> 1 590.2, `write64`
    /// 3 213 -> 3 221, `read64` 3 834 -> 3 850).
    #[inline(never)]
    fn on_send_only(
        &mut self,
        now: u64,
        repr: &RoceRepr,
        payload: &[u8],
        mem: &mut MemoryTable,
        cq: &mut StagedCompletions,
        tags: &mut dyn TagTarget,
    ) {
        self.on_packet_as(now, repr, Opcode::SendOnly, payload, mem, cq, tags)
    }

    /// [`QueuePair::on_packet_with`] of a packet whose opcode is `opcode`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn on_packet_as(
        &mut self,
        now: u64,
        repr: &RoceRepr,
        opcode: Opcode,
        payload: &[u8],
        mem: &mut MemoryTable,
        cq: &mut StagedCompletions,
        tags: &mut dyn TagTarget,
    ) {
        self.stats.rx_packets += 1;
        if repr.bth.dest_qp != self.cfg.local_qpn || self.state == QpState::Error {
            self.stats.rx_dropped += 1;
            return;
        }
        if opcode.is_request() {
            let ce = repr.ip.ecn == Ecn::Ce;
            if ce {
                self.stats.ce_received += 1;
            }
            let notice = self.notifier.on_packet(now, ce);
            self.cnp_due |= notice.cnp;
            let verdict = self
                .resp
                .on_request(&self.cfg, repr, opcode, payload, mem, cq, tags);
            if verdict == Verdict::Fatal {
                self.enter_error(None, cq);
                return;
            }
            if notice.ack_now {
                // The level changed: the sender hears it now, not at the next coalesced ACK.
                self.resp.request_ack();
            }
            if let Some(cookie) = self.resp.tag_done.take() {
                self.req.rendezvous_done(&self.cfg, cookie, cq);
            }
            // Looked at here first: the call, for the `Nothing` of every untagged request, was
            // 31 instructions a WRITE, lone or batched (callgrind).
            if self.resp.tag_next != Next::Nothing {
                let next = std::mem::replace(&mut self.resp.tag_next, Next::Nothing);
                self.tag_next(next);
            }
        } else if opcode.is_response() {
            if opcode.is_read_response() {
                self.read_response_marks(now, repr.ip.ecn == Ecn::Ce);
            }
            let outcome = self.req.on_response(now, &self.cfg, repr, payload, mem, cq);
            if let Outcome::Fatal(status, psn) = outcome {
                self.enter_error(Some((status, psn)), cq);
            }
        } else if opcode == Opcode::Cnp {
            match &repr.ceth {
                // An enhanced CNP (`cc = ack`): how congested the READ responses this queue
                // pair sends are, for its pacer, which paces requests and READ responses alike.
                Some(c) if self.cfg.cc.mode == CcMode::Ack => {
                    self.stats.read_cnps_received += 1;
                    self.req.on_read_congestion(now, c);
                }
                // Acted on by DCQCN; a queue pair without it counts it and goes on.
                _ => {
                    self.stats.cnps_received += 1;
                    self.req.cc.on_cnp(now);
                }
            }
        } else {
            self.stats.rx_dropped += 1;
        }
    }

    /// A READ response arrived, CE-marked or not (seed 002's service "RC READ response"): it
    /// goes into the same ECN window as arriving requests (they share this node's ingress).
    /// Under `dcqcn` a mark may owe a CNP, as for requests. Under `ack`, where no ACK goes back
    /// to the responder for READ responses, an enhanced CNP says the window's level: at once
    /// when it changed, again every `window_ns` while READ responses come and it is not none,
    /// and a change to none is said twice (its loss would leave the responder slow).
    ///
    /// Always inline: with `on_send_only` beside `on_packet_with`, LLVM left it and
    /// `Op::of` out of line (callgrind: a lone READ 41 instructions more).
    #[inline(always)]
    fn read_response_marks(&mut self, now: u64, ce: bool) {
        if ce {
            self.stats.ce_received += 1;
        }
        self.cnp_due |= self.notifier.on_read_response(now, ce);
        let Some(level) = self.notifier.level() else {
            return;
        };
        // What the last one sent said (recorded when it goes: several responses may arrive
        // before it does, and it says the level of its own time).
        let every = self.cfg.cc.ack.window_ns;
        self.ecnp_due |= match self.ecnp_said {
            None => level != Level::None,
            Some((said, _, _)) if said != level => true,
            Some((Level::None, at, n)) => n < 2 && now.saturating_sub(at) >= every,
            Some((_, at, _)) => now.saturating_sub(at) >= every,
        };
    }

    /// Carries out what the engine's tag matching asked of this queue pair: READ the rest of a
    /// rendezvous message, or tell its sender it is done. Nothing in the error state: then
    /// false, and a pull's message is one the engine must report undeliverable.
    pub fn tag_next(&mut self, next: Next) -> bool {
        if self.state == QpState::Error {
            return next == Next::Nothing;
        }
        match next {
            Next::Nothing => {}
            Next::Pull(p) => {
                self.req
                    .post_pull(&self.cfg, p.local, p.len, p.remote_addr, p.rkey, p.token)
            }
            Next::Done { cookie, length } => self.req.post_done(&self.cfg, cookie, length),
        }
        true
    }

    /// What the engine's tag matching has still to hear from this queue pair after a call
    /// that did not give it `tags` (or entered the error state): a rendezvous pull that ended
    /// (token, whether it succeeded), or a tagged message cut off by the error state while it
    /// was arriving (token, false). Each is taken once.
    pub fn take_tag_outcome(&mut self) -> Option<(u64, bool)> {
        if let Some(p) = self.req.take_pulled() {
            return Some(p);
        }
        self.resp.tag_orphan.take().map(|token| (token, false))
    }

    /// Whether the responder waits for the engine's persisted watermark to pass a ticket.
    pub fn awaits_persistence(&self) -> bool {
        self.state == QpState::Ready && self.resp.awaits_persistence()
    }

    /// The engine's persisted watermark (every persist ticket up to it is durable) moved:
    /// durable ACKs, held ACKs and gated responses it covers may go. True when the queue pair
    /// may now have something to send.
    pub fn on_persisted(&mut self, persisted: u64) -> bool {
        self.state == QpState::Ready && self.resp.on_persisted(persisted)
    }

    /// The engine could not make a range durable: nothing this queue pair waits for can be
    /// vouched for. NAK "remote operational error" and enter the error state.
    pub fn persist_failed(&mut self, cq: &mut StagedCompletions) {
        if self.state == QpState::Ready {
            self.resp.persist_failed();
            self.enter_error(None, cq);
        }
    }

    /// Whether [`QueuePair::next_deadline`] has one: a question cheaper than the answer.
    /// (Debug builds check it against the answer at every call, so every test of the
    /// transport and the node checks it.)
    #[inline(always)]
    pub fn has_deadline(&self) -> bool {
        let has = self.state != QpState::Error && self.req.has_deadline();
        debug_assert_eq!(has, self.next_deadline().is_some(), "has_deadline");
        has
    }

    /// The earliest `now` at which [`QueuePair::on_timer`] has work
    /// (retransmission timeout or end of an RNR wait).
    pub fn next_deadline(&self) -> Option<u64> {
        if self.state == QpState::Error {
            return None;
        }
        self.req.next_deadline()
    }

    /// Run expired timers. Retry exhaustion completes the oldest work request
    /// with RetryExceeded and moves the QP to the error state.
    pub fn on_timer(&mut self, now: u64, cq: &mut StagedCompletions) {
        if self.state == QpState::Error {
            return;
        }
        if let Outcome::Fatal(status, psn) = self.req.on_timer(now, &self.cfg) {
            self.enter_error(Some((status, psn)), cq);
        }
    }

    /// Moves to the error state, as `ibv_modify_qp(IBV_QPS_ERR)` does before a queue pair is
    /// destroyed: every work request still held completes with a flush error.
    pub fn shut_down(&mut self, cq: &mut StagedCompletions) {
        if self.state != QpState::Error {
            self.enter_error(None, cq);
        }
    }

    /// Move to the error state; `blame` names the failed request's status
    /// and a PSN it holds.
    fn enter_error(&mut self, blame: Option<(WcStatus, u32)>, cq: &mut StagedCompletions) {
        self.state = QpState::Error;
        self.req.fail(&self.cfg, blame, cq);
        self.resp.fail(&self.cfg, cq);
    }
}

/// The flow of CNPs to the peer (the CNP template's), in the format of the ConnectX-4 Lx
/// capture (`docs/wire.md` §10): DSCP 48 with ECT(0), TTL 64, DF, UDP checksum 0. The UDP
/// source port is the queue pair's own (ConnectX writes 0), so that a multi-queue peer's RSS
/// brings the CNP to the queue pair's home core. A CNP's own fields are [`CNP`].
fn cnp_header(cfg: &QpConfig) -> RoceRepr {
    let mut repr = cfg.header(Opcode::Cnp, 0, false);
    repr.ip.dscp = CNP_DSCP;
    repr.ip.ecn = Ecn::Ect0;
    repr
}

/// A CNP's fields: BECN set, PSN 0 (its 16 reserved bytes are zero, or an enhanced CNP's
/// CETH).
const CNP: PacketFields = PacketFields {
    becn: true,
    ..PacketFields::new(Opcode::Cnp, 0, false)
};

/// The completion status of a local buffer that failed its checks.
fn local_status(e: LocalError) -> WcStatus {
    match e {
        LocalError::Protection { .. } => WcStatus::LocalProtectionError,
        LocalError::Length | LocalError::TooMany(_) => WcStatus::LocalLengthError,
        LocalError::Operation => WcStatus::LocalQpOperationError,
    }
}
