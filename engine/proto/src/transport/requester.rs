//! The requester half of an RC queue pair.
//!
//! PSNs are assigned when a work request is posted, so every work queue
//! element (WQE) knows its PSN range for life: SEND and WRITE use one PSN per
//! MTU-sized packet, a READ request uses as many PSNs as its response will
//! have packets. The transmit cursor (`tx_psn`) walks forward over that space
//! and jumps back for go-back-N; `snd_una` is the oldest PSN not yet
//! acknowledged, and the distance between the two is what the in-flight cap
//! limits. ACKs are cumulative by PSN; READ response packets acknowledge
//! everything before them implicitly. A NAK "PSN sequence error" acknowledges
//! everything before its PSN and rewinds the cursor there; an RNR NAK does the
//! same after the RNR timer; other NAKs fail the WQE and the QP. The
//! retransmission timer rewinds to `snd_una` with exponential backoff and
//! gives up after `retry_limit` expiries without progress; its timeout follows
//! the measured round trip time ([`super::rto`]).
//!
//! A durable WRITE (Portico's extension) is acknowledged twice: the receipt ACK moves the
//! window like any ACK, and the WQE stays at the front of the queue, *held*, until the durable
//! ACK (opcode 0xE2, the same PSN, cumulative) completes it. Anything finished behind a held
//! WQE is held too, so completions keep their order. A lost durable ACK is recovered by its
//! own timer: the requester re-sends the last packet of the oldest held write (a duplicate,
//! which the responder answers with the durable ACK again once the data is durable).

use std::collections::VecDeque;

use wire::aeth::{self, AethRepr, NakCode, Syndrome};
use wire::feth::FethRepr;
use wire::{ImmDtRepr, Opcode, PacketFields, RethRepr, RoceRepr, TagHeader, TagKind, tag};

use super::cq::{StagedCompletions, WcOpcode, WcStatus, WorkCompletion};
use super::mr::{Access, Location, MemoryTable};
use super::psn;
use super::qp::QpStats;
use super::rto::{Resent, RttEstimator};
use super::sge::{Gather, LocalError, Sge, Spill};
use super::{Budget, OutPacket, PayloadRef, QpConfig, Refusal, WrKind};
use crate::cc::RateControl;

/// A posted send work request with its PSN range.
#[derive(Debug, Clone, Copy)]
struct SendWqe {
    wr_id: u64,
    kind: WrKind,
    /// The local buffer, resolved once when the request was taken.
    local: Gather,
    len: u32,
    first_psn: u32,
    /// PSNs the WQE occupies (request packets, or READ response packets).
    npsn: u32,
    /// READ only: response packets received and placed so far.
    read_done: u32,
    /// A tagged send by rendezvous (its tag header says where the target may READ it).
    /// The tag header itself is not kept: [`SendWqe::tag_header`] writes it from the kind,
    /// the buffer and the queue pair's rank (136 bytes a request kept, 88 without).
    rendezvous: bool,
    /// A held WQE's reason to wait is over: its durable ACK came (durable WRITE), or the
    /// target's done message (rendezvous send).
    done: bool,
    /// A plain WRITE a receipt ACK (0xE3) covered: held like a durable WRITE until the
    /// durable ACK through its PSN.
    owed_durable: bool,
}

// What the comment on `rendezvous` says; a field added to the request shows here.
const _: () = assert!(size_of::<SendWqe>() == 88);

impl SendWqe {
    /// Its completion: `opcode`, `status` and `byte_len` as the caller found them.
    #[inline(always)]
    fn completion(
        &self,
        qpn: u32,
        opcode: WcOpcode,
        status: WcStatus,
        byte_len: u32,
    ) -> WorkCompletion {
        WorkCompletion {
            wr_id: self.wr_id,
            qpn,
            opcode,
            status,
            byte_len,
            imm_data: None,
        }
    }

    fn last_psn(&self) -> u32 {
        psn::add(self.first_psn, self.npsn - 1)
    }

    fn is_read(&self) -> bool {
        matches!(self.kind, WrKind::Read { .. } | WrKind::TagPull { .. })
    }

    /// READ, FLUSH and ATOMIC WRITE: completed by a response packet, not by an ACK.
    fn expects_response(&self) -> bool {
        matches!(
            self.kind,
            WrKind::Read { .. }
                | WrKind::TagPull { .. }
                | WrKind::Flush { .. }
                | WrKind::AtomicWrite { .. }
        )
    }

    /// Completed by a durable ACK: a durable WRITE, or a WRITE a receipt ACK covered.
    fn is_durable(&self) -> bool {
        matches!(self.kind, WrKind::DurableWrite { .. }) || self.owed_durable
    }

    /// A rendezvous send: done on the wire when acknowledged, complete when the target says so.
    fn is_rendezvous(&self) -> bool {
        self.rendezvous
    }

    /// Tagged sends and done messages: whether the message starts with a tag header (`len`
    /// counts it; the local buffer follows it).
    fn is_tagged(&self) -> bool {
        matches!(
            self.kind,
            WrKind::TaggedSend { .. } | WrKind::TagDone { .. }
        )
    }

    /// The tag header a tagged send or done message starts with, as it was when posted: the
    /// envelope from the kind, the sender's rank from `cfg`, a rendezvous's address and rkey
    /// from its one local piece (its region stays registered while the request is queued,
    /// `uses_region`), and its cookie, the request's first PSN.
    fn tag_header(&self, cfg: &QpConfig, mem: &MemoryTable) -> Option<TagHeader> {
        let (kind, endpoint, match_bits, hdr_data, length, cookie) = match self.kind {
            WrKind::TaggedSend {
                endpoint,
                match_bits,
                hdr_data,
            } if self.rendezvous => {
                let (addr, rkey) = self
                    .local
                    .single()
                    .and_then(|(at, _)| mem.name_of(at))
                    .unwrap_or((0, 0));
                let kind = TagKind::Rendezvous { addr, rkey };
                (
                    kind,
                    endpoint,
                    match_bits,
                    hdr_data,
                    self.local.len(),
                    self.first_psn,
                )
            }
            WrKind::TaggedSend {
                endpoint,
                match_bits,
                hdr_data,
            } => (
                TagKind::Eager,
                endpoint,
                match_bits,
                hdr_data,
                self.local.len(),
                0,
            ),
            WrKind::TagDone { cookie, length } => (TagKind::Done, 0, 0, 0, length, cookie),
            _ => return None,
        };
        Some(TagHeader {
            kind,
            endpoint,
            initiator: cfg.tag_rank,
            match_bits,
            hdr_data,
            length,
            cookie,
        })
    }

    /// Posted by the engine itself: completes with no completion for the host.
    fn is_internal(&self) -> bool {
        matches!(self.kind, WrKind::TagPull { .. } | WrKind::TagDone { .. })
    }

    /// Held at the front of the queue and still waiting for its second event.
    fn waits(&self) -> bool {
        (self.is_durable() || self.is_rendezvous()) && !self.done
    }
}

/// The frame bytes of the READ responses that bring back `len` bytes: every packet has the
/// Ethernet, IPv4, UDP and BTH headers and the ICRC; the first and last (or only) carry an
/// AETH. What a READ request pulls in on the wire, for the traffic shaper's absorb bucket.
pub fn read_response_frames(cfg: &QpConfig, len: u32) -> u32 {
    let n = cfg.pmtu.packets(len);
    let aeths = if n == 1 { 1 } else { 2 };
    len + n * RESPONSE_HEADERS + aeths * wire::aeth::HEADER_LEN as u32
}

/// Ethernet, IPv4, UDP and BTH headers and the ICRC: what every READ response frame carries
/// besides its payload (and the AETH of the first and last).
const RESPONSE_HEADERS: u32 = (wire::roce::BASE_HEADER_LEN + wire::icrc::ICRC_LEN) as u32;

/// The frame bytes of one READ response of `payload` bytes, with an AETH or not (the
/// responder's, for a traffic shaper's peek).
pub(crate) fn read_response_frame(payload: u32, aeth: bool) -> u32 {
    let aeth = if aeth {
        wire::aeth::HEADER_LEN as u32
    } else {
        0
    };
    RESPONSE_HEADERS + aeth + payload.next_multiple_of(4)
}

/// Where the READ request that starts at response packet `k` of a READ of `npsn` packets
/// ends (exclusive): at the next multiple of `cfg.read_split_packets` (sub-requests keep their
/// boundaries when a retry asks for the rest of one), or at `npsn`.
fn read_request_end(cfg: &QpConfig, npsn: u32, k: u32) -> u32 {
    match cfg.read_split_packets {
        0 => npsn,
        split => (k / split + 1).saturating_mul(split).min(npsn),
    }
}

/// The frame bytes of the ACK a request asks for: headers, AETH and ICRC, and with `cc = ack`
/// room for a CETH (present only while congested; counted always, the larger case).
pub(crate) fn ack_frame(cfg: &QpConfig) -> u32 {
    let ceth = match cfg.cc.mode {
        crate::cc::CcMode::Ack => wire::ceth::MAX_LEN as u32,
        _ => 0,
    };
    14 + 20 + 8 + 12 + 4 + 4 + ceth
}

/// Internal work requests (rendezvous pulls and done messages) the send queue has room for
/// beyond the host's `max_send_wr` before it grows.
const INTERNAL_RESERVE: usize = 64;

/// What a received response did to the requester, for the QP to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    /// The WQE holding this PSN failed with this status; the QP must enter
    /// the error state.
    Fatal(WcStatus, u32),
}

#[derive(Debug)]
pub struct Requester {
    sq: VecDeque<SendWqe>,
    /// The pieces of the local buffers of more than one piece: a list for each host request
    /// `sq` can hold (internal ones have one piece or none).
    spill: Spill,
    /// PSN the next posted WQE gets.
    next_psn: u32,
    /// Next PSN to transmit, and the index in `sq` of the WQE that holds it.
    tx_psn: u32,
    tx_idx: usize,
    /// Oldest PSN not acknowledged.
    snd_una: u32,
    /// One past the highest PSN ever transmitted: below it, a send is a
    /// retransmission.
    high_psn: u32,
    /// Consecutive timer expiries / RNR NAKs without progress.
    retries: u32,
    /// The round trip estimate behind the retransmission timeout.
    rtt: RttEstimator,
    /// The packet being timed for a round trip sample: its PSN and when it left.
    timed: Option<(u32, u64)>,
    /// Retransmitted packets whose acknowledgement has not been judged yet.
    resent: Resent,
    rnr_retries: u32,
    deadline: Option<u64>,
    rnr_until: Option<u64>,
    /// The PSN of the last go-back-N, so that one gap rewinds the cursor once.
    rewound_to: Option<u32>,
    since_ack_req: u32,
    /// When the oldest packet sent since the last AckReq left: a packet that goes a quarter
    /// of the retransmission timeout after it asks for the ACK, whatever spaced the packets
    /// (a traffic shaper or a pacer), so that slow sending never looks like loss.
    unrequested_since: Option<u64>,
    /// WQEs at the front of `sq` that are done on the wire but not completed: durable WRITEs
    /// waiting for their durable ACK, and what finished behind them.
    head: usize,
    /// The durable-ACK timer, its consecutive expiries, and a probe to send.
    dur_deadline: Option<u64>,
    dur_retries: u32,
    probe: bool,
    /// Internal work requests in `sq` (not counted against the host's depth).
    internal: usize,
    /// Rendezvous pulls that completed (token, whether successfully), for the engine.
    pulled: VecDeque<(u64, bool)>,
    /// Congestion control: the controller the queue pair negotiated and the pacer that holds
    /// its requests to the controller's rate.
    pub(crate) cc: RateControl,
    /// Requester counters (the responder fields stay zero).
    pub(crate) stats: QpStats,
}

impl Requester {
    pub(crate) fn new(cfg: &QpConfig) -> Requester {
        Requester {
            // Only tagged queue pairs post internal work requests.
            sq: VecDeque::with_capacity(
                cfg.max_send_wr + if cfg.tagged { INTERNAL_RESERVE } else { 0 },
            ),
            spill: Spill::new(cfg.max_send_wr),
            next_psn: cfg.send_psn,
            tx_psn: cfg.send_psn,
            tx_idx: 0,
            snd_una: cfg.send_psn,
            high_psn: cfg.send_psn,
            retries: 0,
            rtt: RttEstimator::default(),
            timed: None,
            resent: Resent::default(),
            rnr_retries: 0,
            deadline: None,
            rnr_until: None,
            rewound_to: None,
            since_ack_req: 0,
            unrequested_since: None,
            head: 0,
            dur_deadline: None,
            dur_retries: 0,
            probe: false,
            internal: 0,
            pulled: VecDeque::with_capacity(if cfg.tagged { INTERNAL_RESERVE } else { 0 }),
            // The window's unit: a full packet's frame (headers, RETH, ICRC and all).
            cc: RateControl::new(&cfg.cc, cfg.pmtu.bytes() + 78),
            stats: QpStats::default(),
        }
    }

    /// PSNs sent and not yet acknowledged.
    pub fn in_flight(&self) -> u32 {
        psn::diff(self.high_psn, self.snd_una).max(0) as u32
    }

    /// PSNs from the oldest unacknowledged one up to the transmit cursor: what is in flight
    /// as far as sending goes (after a go-back-N rewind, what is to be sent again is not).
    pub fn outstanding(&self) -> u32 {
        psn::diff(self.tx_psn, self.snd_una).max(0) as u32
    }

    /// The PSN the transmit cursor sends next.
    pub fn tx_psn(&self) -> u32 {
        self.tx_psn
    }

    /// Oldest unacknowledged PSN.
    pub fn snd_una(&self) -> u32 {
        self.snd_una
    }

    /// Request packets sent again so far.
    pub fn retransmissions(&self) -> u64 {
        self.stats.retransmissions
    }

    /// Retransmitted packets found not to have been needed.
    pub fn spurious_retransmissions(&self) -> u64 {
        self.stats.spurious_retransmissions
    }

    /// The round trip estimate.
    pub fn rtt(&self) -> &RttEstimator {
        &self.rtt
    }

    /// The retransmission timeout the next armed timer gets.
    pub fn rto(&self, cfg: &QpConfig) -> u64 {
        self.rtt.rto(cfg)
    }

    /// Work requests posted and not completed.
    pub fn pending(&self) -> usize {
        self.sq.len()
    }

    /// Whether a packet is still to be sent: an unsent (or rewound) work request, or a
    /// durable probe.
    pub(crate) fn has_unsent(&self) -> bool {
        self.probe || self.tx_idx < self.sq.len()
    }

    /// READ requests out and not fully answered, as the responder counts them against
    /// `max_rd_atomic`: one per work request that expects a response, or with READs split
    /// into sub-requests, one per sub-request sent whose responses have not all come; the
    /// work request at the transmit cursor has sent its responses up to packet `k`.
    fn reads_outstanding(&self, cfg: &QpConfig, k: u32) -> u32 {
        let split = cfg.read_split_packets;
        let mut n = 0;
        for (i, w) in self.sq.range(self.head..=self.tx_idx).enumerate() {
            if !w.expects_response() {
                continue;
            }
            let sent = if self.head + i == self.tx_idx {
                k
            } else {
                w.npsn
            };
            if sent <= w.read_done {
                continue;
            }
            n += match split {
                0 => 1,
                _ => sent.div_ceil(split) - w.read_done / split,
            };
        }
        n
    }

    /// Whether another work request fits.
    pub fn has_room(&self, cfg: &QpConfig) -> bool {
        self.sq.len() - self.internal < cfg.max_send_wr
    }

    /// Whether any queued work request has a local buffer in region `slot`.
    pub(crate) fn uses_region(&self, slot: u32) -> bool {
        self.sq
            .iter()
            .any(|w| w.local.uses_region(&self.spill, slot))
    }

    pub(crate) fn post(
        &mut self,
        cfg: &QpConfig,
        wr_id: u64,
        kind: WrKind,
        sges: &[Sge],
        mem: &MemoryTable,
    ) -> Result<(), Refusal> {
        // A WRITE and a READ, the commonest requests, with their kind's checks folded into
        // the code (callgrind: a WRITE 20 instructions fewer, lone or batched; a READ 14).
        match kind {
            WrKind::Write { .. } => self.post_kind(cfg, wr_id, kind, sges, mem, Posted::Write),
            WrKind::Read { .. } => self.post_kind(cfg, wr_id, kind, sges, mem, Posted::Read),
            // And a tagged send, MPI's every message (callgrind, `tagged8x32`: 3 495.9 ->
            // 3 480.9).
            WrKind::TaggedSend { .. } => {
                self.post_kind(cfg, wr_id, kind, sges, mem, Posted::Tagged)
            }
            _ => self.post_kind(cfg, wr_id, kind, sges, mem, Posted::Any),
        }
    }

    /// [`Requester::post`] of a request of `kind`, which `posted` says is a WRITE or a READ
    /// where it knows (a constant).
    #[inline(always)]
    fn post_kind(
        &mut self,
        cfg: &QpConfig,
        wr_id: u64,
        kind: WrKind,
        sges: &[Sge],
        mem: &MemoryTable,
        posted: Posted,
    ) -> Result<(), Refusal> {
        if !self.has_room(cfg) {
            return Err(Refusal::Full);
        }
        let need = match kind {
            _ if posted == Posted::Write || posted == Posted::Tagged => Access::NONE,
            _ if posted == Posted::Read => Access::LOCAL_WRITE,
            WrKind::Read { .. } => Access::LOCAL_WRITE,
            _ => Access::NONE,
        };
        let allowed = match kind {
            _ if posted == Posted::Tagged => cfg.tagged,
            _ if posted != Posted::Any => true,
            WrKind::DurableWrite { .. } => cfg.durable_writes,
            // Only the engine posts these (`post_internal`).
            WrKind::TagPull { .. } | WrKind::TagDone { .. } => false,
            // A plain SEND would be taken for a tag header on a tagged queue pair.
            WrKind::Send { .. } => !cfg.tagged,
            _ => true,
        };
        if !allowed {
            return Err(Refusal::Local(LocalError::Operation));
        }
        // One piece, the common case, resolved here so that the list goes on in registers:
        // where the longer lists' call joined it, it met them in a stack slot and was copied
        // twice (callgrind: a batched 64 B WRITE 1 696.0 -> 1 673.0, a lone one 3 622 -> 3 599).
        let local = match sges {
            [s] => Gather::resolve_one(mem, s, need).map_err(Refusal::Local)?,
            _ => return self.post_list(cfg, wr_id, kind, sges, mem, need, posted),
        };
        self.post_resolved(cfg, wr_id, kind, local, mem, posted)
    }

    /// [`Requester::post_kind`] of a list of other than one piece.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn post_list(
        &mut self,
        cfg: &QpConfig,
        wr_id: u64,
        kind: WrKind,
        sges: &[Sge],
        mem: &MemoryTable,
        need: Access,
        posted: Posted,
    ) -> Result<(), Refusal> {
        let local =
            Gather::resolve_list(mem, sges, need, &mut self.spill).map_err(Refusal::Local)?;
        self.post_resolved(cfg, wr_id, kind, local, mem, posted)
    }

    /// [`Requester::post_kind`] once the local list is resolved.
    #[inline(always)]
    fn post_resolved(
        &mut self,
        cfg: &QpConfig,
        wr_id: u64,
        kind: WrKind,
        local: Gather,
        mem: &MemoryTable,
        posted: Posted,
    ) -> Result<(), Refusal> {
        let mut len = local.len();
        let len_ok = match kind {
            _ if posted != Posted::Any => true,
            WrKind::AtomicWrite { .. } => len == 8,
            WrKind::Flush { .. } => len == 0,
            _ => true,
        };
        if !len_ok {
            return Err(Refusal::Local(LocalError::Length));
        }
        let mut rendezvous = false;
        if posted == Posted::Tagged {
            if len > cfg.rndv_threshold {
                // The target READs the message where it is: one piece, remotely readable.
                let (at, _) = local
                    .single()
                    .ok_or(Refusal::Local(LocalError::Operation))?;
                mem.remote_name(at, Access::REMOTE_READ)
                    .ok_or(Refusal::Local(LocalError::Operation))?;
                rendezvous = true;
                // The envelope and what fits with it in the first packet.
                let first = cfg.pmtu.bytes() - tag::RNDV_LEN as u32;
                len = tag::RNDV_LEN as u32 + len.min(first);
            } else {
                len += tag::SHORT_LEN as u32;
            }
        }
        self.push(cfg, wr_id, kind, local, len, rendezvous);
        Ok(())
    }

    /// Always inline: a call for the tagged sends' and the other kinds' posts (callgrind:
    /// `tagged8x32` 3 271.8 -> 3 252.8, `write64x32` 1 590.2 -> 1 588.2).
    #[inline(always)]
    fn push(
        &mut self,
        cfg: &QpConfig,
        wr_id: u64,
        kind: WrKind,
        local: Gather,
        len: u32,
        rendezvous: bool,
    ) {
        let npsn = cfg.pmtu.packets(len);
        self.sq.push_back(SendWqe {
            wr_id,
            kind,
            local,
            len,
            first_psn: self.next_psn,
            npsn,
            read_done: 0,
            rendezvous,
            done: false,
            owed_durable: false,
        });
        self.next_psn = psn::add(self.next_psn, npsn);
    }

    /// The READ of the rest of a rendezvous message into `local` (the engine's, not the host's).
    pub(crate) fn post_pull(
        &mut self,
        cfg: &QpConfig,
        local: Location,
        len: u32,
        remote_addr: u64,
        rkey: u32,
        token: u64,
    ) {
        let kind = WrKind::TagPull {
            remote_addr,
            rkey,
            token,
        };
        self.internal += 1;
        self.push(cfg, 0, kind, Gather::at(local, len), len, false);
    }

    /// The done message for the sender's rendezvous `cookie`.
    pub(crate) fn post_done(&mut self, cfg: &QpConfig, cookie: u32, length: u32) {
        self.internal += 1;
        let kind = WrKind::TagDone { cookie, length };
        self.push(cfg, 0, kind, Gather::EMPTY, tag::SHORT_LEN as u32, false);
    }

    /// The target took the rendezvous message `cookie` names: its send completes, with what
    /// was held behind it.
    pub(crate) fn rendezvous_done(
        &mut self,
        cfg: &QpConfig,
        cookie: u32,
        cq: &mut StagedCompletions,
    ) {
        let Some(w) = self
            .sq
            .iter_mut()
            .find(|w| w.is_rendezvous() && w.first_psn == cookie && !w.done)
        else {
            self.stats.ignored_responses += 1;
            return;
        };
        w.done = true;
        self.drain_held(cfg, cq);
        if self.waiting() == 0 {
            self.dur_deadline = None;
            self.dur_retries = 0;
            self.probe = false;
        }
    }

    /// Pulls that completed (or failed) since the last call.
    pub(crate) fn take_pulled(&mut self) -> Option<(u64, bool)> {
        self.pulled.pop_front()
    }

    /// Held WQEs still waiting for their second event (durable ACK, or done message).
    fn waiting(&self) -> usize {
        self.sq.iter().take(self.head).filter(|w| w.waits()).count()
    }

    /// Packets between two AckReqs: `ack_req_every`, or fewer while the pacer spaces packets
    /// so far apart that as many would span more than a quarter of the retransmission
    /// timeout (a flow cut to a low rate would otherwise time out waiting for its ACK).
    fn ack_req_every(&self, cfg: &QpConfig) -> u32 {
        if self.cc.rate_bps().is_none() {
            // No pacer: nothing spaces the packets out (and no timeout to work out).
            return cfg.ack_req_every;
        }
        match self.cc.packets_within(self.rtt.rto(cfg) / 4) {
            Some(n) => n.clamp(1, cfg.ack_req_every),
            None => cfg.ack_req_every,
        }
    }

    /// An enhanced CNP's CETH (`cc = ack`): the congestion of the READ responses this side
    /// sends, taken as the state an ACK would carry (the pacer paces requests and READ
    /// responses alike); level none restores the rate.
    pub(crate) fn on_read_congestion(&mut self, now: u64, ceth: &wire::ceth::CethRepr) {
        let congested = ceth.level != wire::ceth::Level::None;
        self.cc.on_ack(
            now,
            congested,
            congested.then_some(ceth),
            self.rtt.min_rtt(),
        );
    }

    /// The congestion controller and pacer.
    pub fn cc(&self) -> &RateControl {
        &self.cc
    }

    /// Whether [`Requester::next_deadline`] has one.
    #[inline(always)]
    pub(crate) fn has_deadline(&self) -> bool {
        self.deadline.is_some()
            || self.rnr_until.is_some()
            || self.dur_deadline.is_some()
            || self.cc.has_deadline()
    }

    pub(crate) fn next_deadline(&self) -> Option<u64> {
        // `None` as "never" (u64::MAX), then one minimum. The same result as
        // `[..].into_iter().flatten().min()`, which LLVM compiles (1.95, release) into
        // branches on the payload of a `None` that are taken and then discarded: harmless,
        // but memcheck reports each one as a jump on uninitialised data (issue 28), and the
        // engine's tests run under memcheck in `make test`. Here a `None` only selects.
        let at = |d: Option<u64>| d.unwrap_or(u64::MAX);
        let next = at(self.deadline)
            .min(at(self.rnr_until))
            .min(at(self.dur_deadline))
            .min(at(self.cc.next_deadline()));
        (next != u64::MAX).then_some(next)
    }

    fn durable_rto(&self, cfg: &QpConfig) -> u64 {
        cfg.durable_timeout_ns << self.dur_retries.min(cfg.max_backoff_shift)
    }

    /// Durable WRITEs waiting for their durable ACK.
    pub fn awaiting_durable(&self) -> usize {
        self.sq
            .iter()
            .take(self.head)
            .filter(|w| w.is_durable() && !w.done)
            .count()
    }

    /// The last packet of the oldest held durable WRITE again, with AckReq: the responder
    /// takes it as a duplicate and repeats its durable ACK once the data is durable.
    fn probe_packet(&self, cfg: &QpConfig) -> Option<OutPacket> {
        let i = self.sq.iter().take(self.head).position(|w| w.waits())?;
        let w = &self.sq[i];
        if w.is_rendezvous() {
            // The envelope again (one SEND ONLY): a duplicate the target only ACKs.
            let fields = PacketFields::new(Opcode::SendOnly, w.first_psn, true);
            let payload = Some(PayloadRef::SendQueue {
                wqe: i as u32,
                offset: 0,
                len: w.len,
            });
            return Some(OutPacket { fields, payload });
        }
        let (remote_addr, rkey, only, last) = match w.kind {
            WrKind::DurableWrite {
                remote_addr, rkey, ..
            } => (
                remote_addr,
                rkey,
                Opcode::DurableWriteOnly,
                Opcode::RdmaWriteLast,
            ),
            // A WRITE a receipt ACK covered: its last packet as it went.
            WrKind::Write {
                remote_addr,
                rkey,
                imm,
            } => (
                remote_addr,
                rkey,
                data_opcode(true, true, true, imm.is_some()),
                data_opcode(true, false, true, imm.is_some()),
            ),
            _ => return None,
        };
        let offset = (w.npsn - 1) * cfg.pmtu.bytes();
        let len = w.len - offset.min(w.len);
        let mut fields = if w.npsn == 1 {
            let mut r = PacketFields::new(only, w.last_psn(), true);
            r.reth = Some(RethRepr {
                virtual_addr: remote_addr,
                rkey,
                dma_len: w.len,
            });
            r
        } else {
            PacketFields::new(last, w.last_psn(), true)
        };
        if let WrKind::Write { imm: Some(imm), .. } = w.kind {
            fields.immdt = Some(ImmDtRepr {
                data: imm.to_be_bytes(),
            });
        }
        fields.ack_req = true;
        let payload = (len > 0).then_some(PayloadRef::SendQueue {
            wqe: i as u32,
            offset,
            len,
        });
        Some(OutPacket { fields, payload })
    }

    /// Whether [`Requester::poll_request`] would find no packet whatever the window and the
    /// budget: no RNR wait to end, no probe, every request's packets handed out. It would then
    /// return `None` and change nothing. (A new reason for it to send must clear this too:
    /// `QueuePair::poll_request` skips it when this holds.)
    #[inline(always)]
    pub(crate) fn nothing_to_send(&self) -> bool {
        self.tx_idx >= self.sq.len() && self.rnr_until.is_none() && !self.probe
    }

    /// The next packet to send, if the window, the READ limit, the RNR timer and `budget`
    /// allow one: written to `slot`, and true. Nothing changes unless a packet is handed out
    /// (`slot` neither), and what is handed out is charged to `budget`. A packet is its
    /// [`PacketFields`]: the flow is the queue pair's template's.
    pub(crate) fn poll_request(
        &mut self,
        now: u64,
        cfg: &QpConfig,
        budget: &mut Budget,
        slot: &mut OutPacket,
    ) -> bool {
        if let Some(until) = self.rnr_until {
            if now < until {
                return false;
            }
            self.rnr_until = None;
        }
        if self.probe {
            if let Some(out) = self.probe_packet(cfg) {
                let frame_len = out.frame_len();
                // A probe asks for its ACK (the durable one, once the data is durable).
                if !self.cc.may_send(now) || !budget.offer(frame_len, ack_frame(cfg)) {
                    return false;
                }
                budget.charge(frame_len);
                self.cc.on_sent(now, frame_len);
                self.probe = false;
                self.stats.tx_requests += 1;
                self.stats.retransmissions += 1;
                self.stats.durable_probes += 1;
                *slot = out;
                return true;
            }
            self.probe = false;
        }
        let Some(wqe) = self.sq.get(self.tx_idx) else {
            return false;
        };
        if !self.cc.may_send(now) {
            return false;
        }
        let psn = self.tx_psn;
        let outstanding = psn::diff(psn, self.snd_una).max(0) as u32;
        // The window: the configured cap, or less while congestion control has set one.
        let max_in_flight = match self.cc.window_packets() {
            Some(w) if w < cfg.max_in_flight => {
                if outstanding >= w {
                    self.cc.note_windowed();
                }
                w
            }
            _ => cfg.max_in_flight,
        };
        let k = psn::diff(psn, wqe.first_psn).max(0) as u32;
        let mtu = cfg.pmtu.bytes();
        // Each arm builds its packet in `slot`: an `OutPacket` is 136 bytes, and moving one
        // made in a local is a call to `memcpy`.
        match wqe.kind {
            WrKind::Read { .. }
            | WrKind::TagPull { .. }
            | WrKind::Flush { .. }
            | WrKind::AtomicWrite { .. } => {
                let k = k.max(wqe.read_done);
                let psn = psn::add(wqe.first_psn, k);
                // This request's responses end at the next sub-request boundary (seed 000's
                // GET split) or with the READ.
                let end = read_request_end(cfg, wqe.npsn, k);
                let psns = end - k;
                // A READ larger than the whole window may go alone.
                if outstanding > 0 && outstanding + psns > max_in_flight {
                    return false;
                }
                if self.reads_outstanding(cfg, k) >= cfg.max_rd_atomic {
                    return false;
                }
                let mut payload = None;
                let fields = match wqe.kind {
                    WrKind::Read { remote_addr, rkey }
                    | WrKind::TagPull {
                        remote_addr, rkey, ..
                    } => {
                        // A retry after partial responses asks only for the rest (of its
                        // sub-request).
                        let skip = k * mtu;
                        let mut fields = PacketFields::new(Opcode::RdmaReadRequest, psn, true);
                        fields.reth = Some(RethRepr {
                            virtual_addr: remote_addr.wrapping_add(u64::from(skip)),
                            rkey,
                            dma_len: wqe.len.min(end * mtu) - skip.min(wqe.len),
                        });
                        fields
                    }
                    WrKind::Flush {
                        remote_addr,
                        rkey,
                        len,
                        placement,
                        selectivity,
                    } => {
                        let mut fields = PacketFields::new(Opcode::Flush, psn, true);
                        fields.feth = Some(FethRepr {
                            selectivity,
                            placement,
                        });
                        fields.reth = Some(RethRepr {
                            virtual_addr: remote_addr,
                            rkey,
                            dma_len: len,
                        });
                        fields
                    }
                    WrKind::AtomicWrite { remote_addr, rkey } => {
                        let mut fields = PacketFields::new(Opcode::AtomicWrite, psn, true);
                        fields.reth = Some(RethRepr {
                            virtual_addr: remote_addr,
                            rkey,
                            dma_len: 8,
                        });
                        payload = Some(PayloadRef::SendQueue {
                            wqe: self.tx_idx as u32,
                            offset: 0,
                            len: 8,
                        });
                        fields
                    }
                    _ => unreachable!("matched above"),
                };
                let frame_len = fields.frame_len(payload.map_or(0, |p: PayloadRef| p.len()));
                let back = match wqe.kind {
                    WrKind::Read { .. } | WrKind::TagPull { .. } => {
                        read_response_frames(cfg, wqe.len.min(end * mtu) - (k * mtu).min(wqe.len))
                    }
                    // FLUSH and ATOMIC WRITE are answered with an acknowledgement.
                    _ => ack_frame(cfg),
                };
                if !budget.offer(frame_len, back) {
                    return false;
                }
                budget.charge(frame_len);
                self.since_ack_req = 0;
                self.unrequested_since = None;
                self.tx_psn = psn::add(wqe.first_psn, end);
                if end == wqe.npsn {
                    self.tx_idx += 1;
                }
                // Timed when its first response comes back.
                self.note_sent(now, cfg, psn, psns, true);
                self.cc.on_sent(now, frame_len);
                *slot = OutPacket { fields, payload };
                true
            }
            WrKind::Send { .. }
            | WrKind::Write { .. }
            | WrKind::DurableWrite { .. }
            | WrKind::TaggedSend { .. }
            | WrKind::TagDone { .. } => {
                // The commonest packets, a WRITE of one packet without immediate data and
                // the middle packets of a longer WRITE, with their opcode, headers and position
                // constants (as the responder checks them). Callgrind: a batched 64 B WRITE
                // 1 900.5 -> 1 828.1 instructions, a lone one 3 928 -> 3 858, a 64 KiB one
                // 89 905 -> 89 500; a lone READ 4 290 -> 4 293.
                let window = (outstanding, max_in_flight);
                match wqe.kind {
                    WrKind::Write { imm: None, .. } if wqe.npsn == 1 => {
                        self.data_request(now, cfg, budget, slot, psn, k, window, Shape::OneWrite)
                    }
                    WrKind::Write { .. } if k > 0 && k + 1 < wqe.npsn => self.data_request(
                        now,
                        cfg,
                        budget,
                        slot,
                        psn,
                        k,
                        window,
                        Shape::MiddleWrite,
                    ),
                    // A tagged send of one packet (an eager message, MPI's commonest; callgrind,
                    // `tagged8x32`: 3 458.8 -> 3 371.8; a batched 64 B WRITE 1 584.3 -> 1 586.1).
                    WrKind::TaggedSend { .. } if wqe.npsn == 1 => {
                        self.data_request(now, cfg, budget, slot, psn, k, window, Shape::OneTagged)
                    }
                    _ => self.data_request(now, cfg, budget, slot, psn, k, window, Shape::Any),
                }
            }
        }
    }

    /// [`Requester::poll_request`] of a SEND or WRITE packet (`k` packets into its request,
    /// with `window`: the packets outstanding and the most allowed) of `shape` (called with
    /// it a constant, so that the opcode and headers of a common shape fold into the code).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn data_request(
        &mut self,
        now: u64,
        cfg: &QpConfig,
        budget: &mut Budget,
        slot: &mut OutPacket,
        psn: u32,
        k: u32,
        window: (u32, u32),
        shape: Shape,
    ) -> bool {
        let one_write = shape == Shape::OneWrite;
        let middle_write = shape == Shape::MiddleWrite;
        let one_tagged = shape == Shape::OneTagged;
        let (outstanding, max_in_flight) = window;
        let mtu = cfg.pmtu.bytes();
        let wqe = &self.sq[self.tx_idx];
        let imm = match wqe.kind {
            _ if one_write || middle_write || one_tagged => None,
            WrKind::Send { imm } | WrKind::Write { imm, .. } => imm,
            _ => None,
        };
        if outstanding >= max_in_flight {
            return false;
        }
        let offset = if one_write || one_tagged { 0 } else { k * mtu };
        let len = (wqe.len - offset).min(mtu);
        let (first, last) = if one_write || one_tagged {
            (true, true)
        } else if middle_write {
            (false, false)
        } else {
            (k == 0, k + 1 == wqe.npsn)
        };
        let opcode = match wqe.kind {
            _ if one_write => Opcode::RdmaWriteOnly,
            _ if middle_write => Opcode::RdmaWriteMiddle,
            _ if one_tagged => Opcode::SendOnly,
            WrKind::DurableWrite { .. } => durable_opcode(first, last),
            WrKind::Write { .. } => data_opcode(true, first, last, imm.is_some()),
            _ => data_opcode(false, first, last, imm.is_some()),
        };
        let since_ack_req = self.since_ack_req + 1;
        // AckReq on a message's last packet, every `ack_req_every`
        // packets, and on the packet that fills the window, so that
        // the responder never sits on the ACK we are waiting for.
        let ack_req = last
            || since_ack_req >= self.ack_req_every(cfg)
            || self
                .unrequested_since
                .is_some_and(|t| now.saturating_sub(t) >= self.rtt.rto(cfg) / 4)
            || outstanding + 1 >= max_in_flight;
        let reth = match wqe.kind {
            _ if one_tagged => None,
            WrKind::Write {
                remote_addr, rkey, ..
            }
            | WrKind::DurableWrite {
                remote_addr, rkey, ..
            } if first => Some(RethRepr {
                virtual_addr: remote_addr,
                rkey,
                dma_len: wqe.len,
            }),
            _ => None,
        };
        let immdt = match imm {
            Some(imm) if last => Some(ImmDtRepr {
                data: imm.to_be_bytes(),
            }),
            _ => None,
        };
        // The packet is built where it is returned; its length is known from the
        // opcode before.
        let frame_len = wire::frame_len(opcode, len as usize);
        // A packet that asks for its ACK pulls that ACK in.
        let back = if ack_req { ack_frame(cfg) } else { 0 };
        if !budget.offer(frame_len, back) {
            return false;
        }
        budget.charge(frame_len);
        let payload = (len > 0).then_some(PayloadRef::SendQueue {
            wqe: self.tx_idx as u32,
            offset,
            len,
        });
        self.since_ack_req = if ack_req { 0 } else { since_ack_req };
        self.unrequested_since = if ack_req {
            None
        } else {
            self.unrequested_since.or(Some(now))
        };
        self.tx_psn = psn::add(psn, 1);
        if last {
            self.tx_idx += 1;
        }
        // Timed only with AckReq: an ACK for a packet without it may wait for a later
        // one, which would lengthen the sample.
        self.note_sent(now, cfg, psn, 1, ack_req);
        self.cc.on_sent(now, frame_len);
        *slot = OutPacket {
            fields: PacketFields {
                reth,
                immdt,
                ..PacketFields::new(opcode, psn, ack_req)
            },
            payload,
        };
        true
    }

    /// Copy message bytes of the send work request at position `wqe` (from a
    /// [`PayloadRef::SendQueue`]) out of the application's memory.
    pub(crate) fn copy_payload(
        &self,
        cfg: &QpConfig,
        mem: &MemoryTable,
        wqe: u32,
        offset: u32,
        dst: &mut [u8],
    ) {
        let w = &self.sq[wqe as usize];
        if !w.is_tagged() {
            return w.local.copy_out(mem, &self.spill, offset, dst);
        }
        self.copy_tagged(cfg, mem, w, offset, dst);
    }

    /// [`Requester::copy_payload`] folding the bytes into the CRC register `reg` (one pass over
    /// the application's bytes); returns the register after them.
    pub(crate) fn copy_payload_crc(
        &self,
        cfg: &QpConfig,
        mem: &MemoryTable,
        wqe: u32,
        offset: u32,
        dst: &mut [u8],
        reg: u32,
    ) -> u32 {
        let w = &self.sq[wqe as usize];
        if !w.is_tagged() {
            return w.local.copy_out_crc(mem, &self.spill, offset, dst, reg);
        }
        // A tagged message (the engine's tag header, then the application's bytes) is copied
        // and then folded: two passes (tagged sends are not the fused path yet).
        self.copy_tagged(cfg, mem, w, offset, dst);
        pmem::crc::update(reg, dst)
    }

    #[inline(never)]
    fn copy_tagged(
        &self,
        cfg: &QpConfig,
        mem: &MemoryTable,
        w: &SendWqe,
        offset: u32,
        dst: &mut [u8],
    ) {
        let Some(h) = w.tag_header(cfg, mem) else {
            return;
        };
        // The tag header, then the local buffer.
        let hlen = h.buffer_len() as u32;
        let mut start = 0;
        if offset == 0 && dst.len() >= hlen as usize {
            // The whole header at the packet's start (every eager message's first packet):
            // written in place, not into a scratch copy first (callgrind, `tagged8x32`: 3 480.9
            // -> 3 458.8).
            let _ = h.emit(dst);
            start = hlen as usize;
        } else if offset < hlen {
            let mut hb = [0u8; tag::RNDV_LEN];
            let _ = h.emit(&mut hb);
            let n = ((hlen - offset) as usize).min(dst.len());
            dst[..n].copy_from_slice(&hb[offset as usize..offset as usize + n]);
            start = n;
        }
        if start < dst.len() {
            let at = (offset + start as u32) - hlen;
            w.local.copy_out(mem, &self.spill, at, &mut dst[start..]);
        }
    }

    /// A request packet holding PSNs `[psn, psn + n)` left at `now`; `timed`: it may be the
    /// round trip sample (its acknowledgement comes without waiting for a later packet).
    ///
    /// Inline in `poll_request`: a first transmission is a few stores; a retransmission's
    /// bookkeeping is out of line.
    #[inline(always)]
    fn note_sent(&mut self, now: u64, cfg: &QpConfig, psn: u32, n: u32, timed: bool) {
        self.stats.tx_requests += 1;
        let end = psn::add(psn, n);
        if psn::before(psn, self.high_psn) {
            self.note_resent(now, psn, n, end);
        } else {
            self.high_psn = end;
            if timed && self.timed.is_none() {
                self.timed = Some((psn, now));
            }
        }
        if self.deadline.is_none() {
            self.deadline = Some(now + self.rtt.rto(cfg));
        }
    }

    #[inline(never)]
    fn note_resent(&mut self, now: u64, psn: u32, n: u32, end: u32) {
        self.stats.retransmissions += 1;
        self.resent.note(now, psn, n);
        if psn::before(self.high_psn, end) {
            self.high_psn = end;
        }
    }

    /// The cursor goes back to resend: no packet sent so far may be timed any more (Karn's
    /// rule), and the retransmissions to judge start afresh.
    fn abandon_sample(&mut self) {
        self.timed = None;
        self.resent.clear();
    }

    /// Handle an ACK, NAK or READ response addressed to this QP.
    pub(crate) fn on_response(
        &mut self,
        now: u64,
        cfg: &QpConfig,
        repr: &RoceRepr,
        payload: &[u8],
        mem: &mut MemoryTable,
        cq: &mut StagedCompletions,
    ) -> Outcome {
        let psn = repr.bth.psn;
        match repr.bth.opcode {
            Opcode::Acknowledge | Opcode::ReceiptAcknowledge => {
                let Some(AethRepr { syndrome, msn }) = repr.aeth else {
                    return Outcome::Ok;
                };
                if repr.bth.opcode == Opcode::ReceiptAcknowledge {
                    // Only a peer that negotiated the extension may promise a durable ACK,
                    // and only in an ACK.
                    if !cfg.durable_writes || !matches!(syndrome, Syndrome::Ack { .. }) {
                        self.stats.ignored_responses += 1;
                        return Outcome::Ok;
                    }
                    self.stats.receipt_acks_received += 1;
                    self.owe_durable(psn);
                }
                self.stats.last_msn = msn;
                if repr.bth.becn {
                    self.stats.becn_acks_received += 1;
                }
                self.cc
                    .on_ack(now, repr.bth.becn, repr.ceth.as_ref(), self.rtt.min_rtt());
                self.on_aeth(now, cfg, syndrome, psn, cq)
            }
            Opcode::RdmaReadResponseFirst
            | Opcode::RdmaReadResponseMiddle
            | Opcode::RdmaReadResponseLast
            | Opcode::RdmaReadResponseOnly => {
                if let Some(a) = repr.aeth {
                    self.stats.last_msn = a.msn;
                }
                self.on_read_response(now, cfg, psn, payload, mem, cq);
                Outcome::Ok
            }
            Opcode::DurableAcknowledge => {
                let Some(AethRepr {
                    syndrome: Syndrome::Ack { .. },
                    ..
                }) = repr.aeth
                else {
                    self.stats.ignored_responses += 1;
                    return Outcome::Ok;
                };
                self.stats.durable_acks_received += 1;
                if !psn::before(psn, self.high_psn) {
                    // Names a PSN never sent.
                    self.stats.ignored_responses += 1;
                    return Outcome::Ok;
                }
                // Durable implies received: it acknowledges through its PSN as an ACK does.
                self.ack_through(now, cfg, psn, cq);
                self.release_durable(now, cfg, psn, cq);
                Outcome::Ok
            }
            _ => Outcome::Ok,
        }
    }

    /// The WQE at `head` is done on the wire: complete it, or hold it (a durable WRITE until
    /// its durable ACK; anything behind a held WQE until that one completes, so completions
    /// stay in posting order). Returns whether it left the queue.
    #[inline(always)]
    fn finish(&mut self, now: u64, cfg: &QpConfig, cq: &mut StagedCompletions) -> bool {
        // By reference: a WQE is over a hundred bytes, and this runs once per request.
        let w = &self.sq[self.head];
        let waits = w.waits();
        if let WrKind::DurableWrite { placed, .. } = w.kind {
            if placed {
                cq.push(w.completion(
                    cfg.local_qpn,
                    WcOpcode::DurablePlaced,
                    WcStatus::Success,
                    w.len,
                ));
            }
            if self.dur_deadline.is_none() {
                self.dur_deadline = Some(now + self.durable_rto(cfg));
            }
            self.head += 1;
            return false;
        }
        if waits && self.dur_deadline.is_none() {
            // A held rendezvous send: the same timer probes a target that went silent.
            self.dur_deadline = Some(now + self.durable_rto(cfg));
        }
        if self.head > 0 || waits {
            self.head += 1;
            return false;
        }
        self.complete_front(cfg, WcStatus::Success, cq);
        true
    }

    /// A receipt ACK for `psn`: the WRITEs it acknowledges (not yet finished) complete on the
    /// durable ACK through it, which follows.
    fn owe_durable(&mut self, psn: u32) {
        if !(psn::diff(psn, self.snd_una) >= -1 && psn::before(psn, self.high_psn)) {
            return;
        }
        for w in self.sq.range_mut(self.head..) {
            if !psn::before_eq(w.last_psn(), psn) {
                break;
            }
            if matches!(w.kind, WrKind::Write { .. }) {
                w.owed_durable = true;
            }
        }
    }

    /// A durable ACK for `psn`: every held durable WRITE up to it is durable; complete them
    /// and what was held behind them, in order.
    fn release_durable(&mut self, now: u64, cfg: &QpConfig, psn: u32, cq: &mut StagedCompletions) {
        let mut progress = false;
        for w in self.sq.iter_mut().take(self.head) {
            if w.is_durable() && !w.done && psn::before_eq(w.last_psn(), psn) {
                w.done = true;
                progress = true;
            }
        }
        self.drain_held(cfg, cq);
        if progress {
            self.dur_retries = 0;
            self.probe = false;
        }
        if self.waiting() == 0 {
            self.dur_deadline = None;
        } else if progress {
            self.dur_deadline = Some(now + self.durable_rto(cfg));
        }
    }

    /// Completes held WQEs from the front while none of them still waits.
    fn drain_held(&mut self, cfg: &QpConfig, cq: &mut StagedCompletions) {
        let mut popped = 0;
        while self.head > 0 && !self.sq[0].waits() {
            self.complete_front(cfg, WcStatus::Success, cq);
            self.head -= 1;
            popped += 1;
        }
        self.tx_idx = self.tx_idx.saturating_sub(popped);
    }

    fn on_aeth(
        &mut self,
        now: u64,
        cfg: &QpConfig,
        syndrome: Syndrome,
        psn: u32,
        cq: &mut StagedCompletions,
    ) -> Outcome {
        match syndrome {
            Syndrome::Ack { .. } => {
                self.stats.acks_received += 1;
                // An ACK at or past a probed write says the responder is alive and holds the
                // data: its flush is only slow. Probing goes on, but the retry limit counts
                // unanswered probes only, so a slow disk does not fail the connection.
                if self.dur_retries > 0
                    && self
                        .sq
                        .iter()
                        .take(self.head)
                        .find(|w| w.waits())
                        .is_some_and(|w| psn::before_eq(w.last_psn(), psn))
                {
                    self.dur_retries = 0;
                }
                if psn::diff(psn, self.snd_una) == -1 {
                    // It acknowledges nothing new: the responder's answer to a request it
                    // already had.
                    self.stats.spurious_retransmissions += self.resent.repeated(psn);
                }
                self.ack_through(now, cfg, psn, cq);
            }
            Syndrome::Nak(NakCode::PsnSequenceError) => {
                self.stats.seq_naks_received += 1;
                if !self.nak_psn_valid(psn) {
                    return Outcome::Ok;
                }
                self.ack_through(now, cfg, psn::sub(psn, 1), cq);
                self.rewind(psn);
            }
            Syndrome::RnrNak { timer_code } => {
                self.stats.rnr_naks_received += 1;
                if !self.nak_psn_valid(psn) {
                    return Outcome::Ok;
                }
                self.ack_through(now, cfg, psn::sub(psn, 1), cq);
                self.rnr_retries += 1;
                if self.rnr_retries > cfg.rnr_retry_limit {
                    return Outcome::Fatal(WcStatus::RnrRetryExceeded, psn);
                }
                // Wait, then resend from the refused PSN; the retransmission
                // timer sleeps meanwhile (the peer is alive, only busy).
                self.rnr_until = Some(now + u64::from(aeth::rnr_timer_usec(timer_code)) * 1000);
                self.deadline = None;
                self.abandon_sample();
                self.seek(psn);
                self.rewound_to = Some(psn);
            }
            Syndrome::Nak(code) => {
                self.stats.fatal_naks_received += 1;
                if !self.nak_psn_valid(psn) {
                    return Outcome::Ok;
                }
                self.ack_through(now, cfg, psn::sub(psn, 1), cq);
                let status = match code {
                    NakCode::RemoteAccessError => WcStatus::RemoteAccessError,
                    NakCode::RemoteOperationalError => WcStatus::RemoteOperationalError,
                    _ => WcStatus::RemoteInvalidRequest,
                };
                return Outcome::Fatal(status, psn);
            }
        }
        Outcome::Ok
    }

    /// A NAK names the PSN the responder expects: it must lie between the
    /// oldest unacknowledged PSN and the highest one sent.
    fn nak_psn_valid(&self, psn: u32) -> bool {
        psn::before_eq(self.snd_una, psn) && psn::before(psn, self.high_psn)
    }

    /// Cumulative acknowledgement of every PSN up to and including `psn`.
    fn ack_through(&mut self, now: u64, cfg: &QpConfig, psn: u32, cq: &mut StagedCompletions) {
        // Valid ACK PSNs run from snd_una - 1 (a repeat) to high_psn - 1.
        if !(psn::diff(psn, self.snd_una) >= -1 && psn::before(psn, self.high_psn)) {
            return;
        }
        let mut popped = 0;
        let mut new_una = psn::add(psn, 1);
        while let Some(w) = self.sq.get(self.head) {
            // A plain WRITE (no response to wait for, no durable ACK owed) at the front, with
            // nothing held before it, the commonest case: completed from the reference in
            // hand (`finish` and `complete_front` looked it up twice more; callgrind, a
            // batched 64 B WRITE 1 629.5 -> 1 621.5, a lone one 3 510 -> 3 502).
            let plain = matches!(w.kind, WrKind::Write { .. }) && !w.owed_durable;
            if plain && self.head == 0 {
                if !psn::before_eq(w.last_psn(), psn) {
                    break;
                }
                cq.push(w.completion(cfg.local_qpn, WcOpcode::RdmaWrite, WcStatus::Success, w.len));
                self.sq.pop_front();
                popped += 1;
                continue;
            }
            // An eager tagged send, likewise: nothing waits for it but this ACK (`finish`
            // holds only rendezvous sends, `complete_front` takes engine-posted requests).
            if matches!(w.kind, WrKind::TaggedSend { .. }) && !w.rendezvous && self.head == 0 {
                if !psn::before_eq(w.last_psn(), psn) {
                    break;
                }
                let len = w.local.len();
                cq.push(w.completion(cfg.local_qpn, WcOpcode::TaggedSend, WcStatus::Success, len));
                self.sq.pop_front();
                popped += 1;
                continue;
            }
            if !plain && w.expects_response() && w.read_done < w.npsn {
                let expect = psn::add(w.first_psn, w.read_done);
                if psn::before_eq(expect, psn) {
                    // The ACK covers READ PSNs whose responses never came:
                    // they were lost (or are late); ask again for the rest.
                    new_una = expect;
                    self.rewind(expect);
                }
                break;
            }
            if !psn::before_eq(w.last_psn(), psn) {
                break;
            }
            if self.finish(now, cfg, cq) {
                popped += 1;
            }
        }
        self.tx_idx = self.tx_idx.saturating_sub(popped);
        self.advance_una(now, cfg, new_una);
    }

    fn on_read_response(
        &mut self,
        now: u64,
        cfg: &QpConfig,
        psn: u32,
        payload: &[u8],
        mem: &mut MemoryTable,
        cq: &mut StagedCompletions,
    ) {
        if !(psn::before_eq(self.snd_una, psn) && psn::before(psn, self.high_psn)) {
            self.stats.duplicate_responses += 1;
            return;
        }
        // A READ response acknowledges every earlier PSN.
        let mut popped = 0;
        while let Some(w) = self.sq.get(self.head) {
            if w.expects_response() || !psn::before(w.last_psn(), psn) {
                break;
            }
            if self.finish(now, cfg, cq) {
                popped += 1;
            }
        }
        self.tx_idx = self.tx_idx.saturating_sub(popped);
        let head = self.head;
        let Some(w) = self.sq.get_mut(head) else {
            return;
        };
        if !w.expects_response() {
            self.stats.ignored_responses += 1;
            return;
        }
        let expect = psn::add(w.first_psn, w.read_done);
        if psn != expect {
            if psn::before(psn, expect) {
                self.stats.duplicate_responses += 1;
            } else {
                // A gap in the response stream: go back to the first missing one.
                self.advance_una(now, cfg, expect);
                self.rewind(expect);
            }
            return;
        }
        let mtu = cfg.pmtu.bytes();
        let offset = w.read_done * mtu;
        // FLUSH and ATOMIC WRITE are answered by one empty response.
        let want = if w.is_read() {
            (w.len - offset.min(w.len)).min(mtu) as usize
        } else {
            0
        };
        if payload.len() != want {
            self.stats.ignored_responses += 1;
            return;
        }
        w.local.copy_in(mem, &self.spill, offset, payload);
        w.read_done += 1;
        if w.read_done == w.npsn && self.finish(now, cfg, cq) {
            self.tx_idx = self.tx_idx.saturating_sub(1);
        }
        self.advance_una(now, cfg, psn::add(psn, 1));
    }

    /// Move `snd_una` forward to `una`; progress resets retries and the timer, judges the
    /// retransmissions it acknowledges and ends the round trip sample it covers.
    fn advance_una(&mut self, now: u64, cfg: &QpConfig, una: u32) {
        if psn::before(self.snd_una, una) {
            self.stats.spurious_retransmissions += self.resent.acknowledged(now, una, &self.rtt);
            if let Some((p, sent)) = self.timed
                && psn::before(p, una)
            {
                self.rtt.sample(now.saturating_sub(sent));
                self.timed = None;
                // Sent after the last retransmission: the answers to those came before.
                self.resent.clear();
            }
            self.snd_una = una;
            self.retries = 0;
            self.rnr_retries = 0;
            self.rewound_to = None;
            self.deadline = if psn::before(self.snd_una, self.high_psn) {
                Some(now + self.rtt.rto(cfg))
            } else {
                None
            };
        }
        if psn::before(self.tx_psn, self.snd_una) {
            self.seek(self.snd_una);
        }
    }

    /// Go-back-N to `psn`, once per gap.
    fn rewind(&mut self, psn: u32) {
        if self.rewound_to == Some(psn) {
            return;
        }
        self.stats.go_back_n += 1;
        self.rewound_to = Some(psn);
        if psn::before(psn, self.tx_psn) {
            self.abandon_sample();
            self.seek(psn);
        }
    }

    /// Point the transmit cursor at `psn` and the WQE that holds it.
    fn seek(&mut self, psn: u32) {
        self.tx_psn = psn;
        self.tx_idx = self
            .sq
            .iter()
            .position(|w| psn::in_window(psn, w.first_psn, w.npsn))
            .unwrap_or(self.sq.len());
        if let Some(w) = self.sq.get(self.tx_idx)
            && w.expects_response()
        {
            // A READ is re-requested from its first missing response.
            self.tx_psn = psn::add(w.first_psn, w.read_done);
        }
    }

    /// Timer expiry: retransmit from `snd_una` with a doubled timeout, or
    /// give up after `retry_limit` expiries without progress.
    pub(crate) fn on_timer(&mut self, now: u64, cfg: &QpConfig) -> Outcome {
        self.cc.on_timer(now);
        if let Some(d) = self.dur_deadline
            && now >= d
        {
            self.dur_retries += 1;
            if self.dur_retries > cfg.retry_limit {
                self.dur_deadline = None;
                let oldest = self.sq.iter().take(self.head).find(|w| w.waits());
                if let Some(w) = oldest {
                    return Outcome::Fatal(WcStatus::RetryExceeded, w.last_psn());
                }
            } else {
                self.stats.durable_timeouts += 1;
                self.probe = true;
                self.dur_deadline = Some(now + self.durable_rto(cfg));
            }
        }
        match self.deadline {
            Some(d) if now >= d => {}
            _ => return Outcome::Ok,
        }
        self.stats.timeouts += 1;
        self.retries += 1;
        if self.retries > cfg.retry_limit {
            self.deadline = None;
            return Outcome::Fatal(WcStatus::RetryExceeded, self.snd_una);
        }
        self.rtt.back_off(cfg);
        self.abandon_sample();
        self.seek(self.snd_una);
        self.rewound_to = Some(self.snd_una);
        self.deadline = Some(now + self.rtt.rto(cfg));
        Outcome::Ok
    }

    /// Inline in its callers (`finish` runs it once a request): one set of saved registers,
    /// not two (callgrind: 22 instructions fewer a WRITE).
    #[inline(always)]
    fn complete_front(&mut self, cfg: &QpConfig, status: WcStatus, cq: &mut StagedCompletions) {
        // Read in place, then dropped: not moved out whole.
        let Some(w) = self.sq.front() else {
            return;
        };
        if w.is_internal() {
            return self.complete_internal(status);
        }
        let byte_len = if w.is_tagged() { w.local.len() } else { w.len };
        let opcode = w.kind.wc_opcode();
        cq.push(w.completion(cfg.local_qpn, opcode, status, byte_len));
        self.sq.pop_front();
    }

    /// [`Requester::complete_front`] of a request the engine posted (a rendezvous pull or
    /// done message): the host reserved no completion for it, the engine hears of a pull.
    #[inline(never)]
    fn complete_internal(&mut self, status: WcStatus) {
        self.internal -= 1;
        if let Some(WrKind::TagPull { token, .. }) = self.sq.front().map(|w| w.kind) {
            self.pulled.push_back((token, status == WcStatus::Success));
        }
        self.sq.pop_front();
    }

    /// Error state: the WQE holding PSN `blame.1` (if any) completes with
    /// status `blame.0`, every other one with a flush error. (Normally the
    /// blamed WQE is the oldest; it need not be if a NAK overtook the
    /// responses of an earlier READ.)
    pub(crate) fn fail(
        &mut self,
        cfg: &QpConfig,
        blame: Option<(WcStatus, u32)>,
        cq: &mut StagedCompletions,
    ) {
        while let Some(w) = self.sq.front() {
            let status = match blame {
                Some((status, psn)) if psn::in_window(psn, w.first_psn, w.npsn) => status,
                _ => WcStatus::WrFlushError,
            };
            self.complete_front(cfg, status, cq);
        }
        self.tx_idx = 0;
        self.head = 0;
        self.deadline = None;
        self.rnr_until = None;
        self.dur_deadline = None;
        self.probe = false;
    }
}

/// The opcode of one packet of a durable WRITE: the mark is on the packet with the RETH,
/// the rest of the message is standard WRITE MIDDLE and LAST.
fn durable_opcode(first: bool, last: bool) -> Opcode {
    match (first, last) {
        (true, true) => Opcode::DurableWriteOnly,
        (true, false) => Opcode::DurableWriteFirst,
        (false, false) => Opcode::RdmaWriteMiddle,
        (false, true) => Opcode::RdmaWriteLast,
    }
}

/// What [`Requester::post`] knows of a request's kind before its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Posted {
    Write,
    Read,
    Tagged,
    Any,
}

/// Where a SEND or WRITE packet is in its request, where [`Requester::poll_request`] knows it
/// before building the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// The one packet of a WRITE without immediate data.
    OneWrite,
    /// A packet of a WRITE that is neither its first nor its last.
    MiddleWrite,
    /// The one packet of a tagged send.
    OneTagged,
    /// Any other.
    Any,
}

/// The opcode of one SEND or WRITE packet.
fn data_opcode(write: bool, first: bool, last: bool, imm: bool) -> Opcode {
    match (write, first, last, imm) {
        (false, true, true, false) => Opcode::SendOnly,
        (false, true, true, true) => Opcode::SendOnlyWithImmediate,
        (false, true, false, _) => Opcode::SendFirst,
        (false, false, false, _) => Opcode::SendMiddle,
        (false, false, true, false) => Opcode::SendLast,
        (false, false, true, true) => Opcode::SendLastWithImmediate,
        (true, true, true, false) => Opcode::RdmaWriteOnly,
        (true, true, true, true) => Opcode::RdmaWriteOnlyWithImmediate,
        (true, true, false, _) => Opcode::RdmaWriteFirst,
        (true, false, false, _) => Opcode::RdmaWriteMiddle,
        (true, false, true, false) => Opcode::RdmaWriteLast,
        (true, false, true, true) => Opcode::RdmaWriteLastWithImmediate,
    }
}
