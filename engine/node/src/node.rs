//! One RDMA engine's state, driven with frames: pure, so it runs the same on mbufs and on
//! plain buffers.
//!
//! What a worker does with it, each loop iteration:
//! 1. [`RdmaNode::receive`] every frame: ARP for our address, or a RoCEv2 packet handed to the
//!    queue pair its BTH names (one index into a QPN table, no search), which then becomes
//!    *ready* (it may owe an ACK, or its window opened).
//! 2. [`RdmaNode::service`]: take the doorbells the host rang (work requests move from the
//!    host rings into the queue pairs, each with a completion slot reserved for it), retry
//!    queue pairs whose rings were left non-empty, fire due timers (a heap of deadlines, at
//!    most a few entries per queue pair), finish deregistrations nothing uses any more.
//! 3. [`RdmaNode::poll_transmit`] / [`RdmaNode::emit`] until the TX burst is full: only the
//!    ready list is visited, round robin, each queue pair's responses first and then its
//!    requests within a per-turn [`Budget`].
//! 4. [`RdmaNode::flush_completions`]: completions go into the host's completion rings, which
//!    never overflow because every one of them had its slot reserved.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::host::{Control, ControlReply};
use super::parts::{Ctx, Parts};
use super::rings::{
    self, Cq, CqWriter, Doorbells, Entry, HostSpin, MAX_QPS, Qp, QpRings, WorkerRing,
};
use super::tagged::{TagConfig, TagPort, TagShard};
use crate::Outlook;
use crate::wake::Wake;
use proto::shaper::{Shaper, ShaperConfig, ShaperError};
use proto::transport::{
    Budget, ConfigError, Inadmissible, MemoryTable, MrKeys, OutPacket, QpConfig, QueuePair,
    RegisterError, Sge, StagedCompletions, WcOpcode, WorkCompletion,
};
use wire::{self, EthernetAddress};

/// Request packets one queue pair may send per turn before the next ready one is served.
const TURN_PACKETS: u32 = 16;

/// What one received frame did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxOutcome {
    /// A RoCEv2 packet for one of our QPs, handed to it.
    Delivered,
    /// An ARP request for our address; the reply is `len` bytes of `arp_reply()`.
    ArpReply(usize),
    /// Taken by the connection manager: a QP1 frame (whatever the CM then made of it), or an
    /// ARP packet it learned from.
    Cm,
    /// Dropped (and counted).
    Dropped,
}

portico_counters::counter_set! {
    /// What a node counts, besides its QPs' own statistics, declared once: the names
    /// (`NodeCounters::NAMES`, the JSON keys) and how they combine follow this list. The RDMA
    /// stage reports every one that its own set names too (all but `rx_frames` and
    /// `tx_packets`).
    pub struct NodeCounters, slots NodeSlot {
        /// Frames received (every frame [`RdmaNode::receive`] was given).
        rx_frames: Sum,
        /// RoCEv2 packets handed to a queue pair.
        delivered: Sum,
        /// Frames whose ICRC did not match.
        icrc_errors: Sum,
        /// RoCEv2 frames that failed another check (length, checksum, opcode, ...).
        malformed: Sum,
        /// Frames that are not RoCEv2 or ARP for us (other protocols, other IP addresses,
        /// multicast and broadcast other than ARP and PFC).
        not_for_us: Sum,
        /// Unicast frames to another host's MAC address (seen only when the port floods or is
        /// promiscuous), whatever they carry.
        wrong_mac: Sum,
        /// Frames with an 802.1Q/802.1ad VLAN tag.
        vlan_tagged: Sum,
        /// IPv4 packets with options (a header longer than 20 bytes).
        ip_options: Sum,
        /// IPv4 fragments.
        ip_fragments: Sum,
        /// Packets of another transport service (UC, RD, UD, XRC): never taken by an RC QP.
        wrong_transport: Sum,
        /// RoCEv2 packets to a QPN no queue pair of this engine has.
        unknown_qp: Sum,
        /// Packets whose P_Key does not match their queue pair's (or is the invalid key).
        bad_pkey: Sum,
        /// Packets to a connected queue pair from an address that is not its peer's.
        wrong_source: Sum,
        /// RoCEv2 packets to a queue pair of this engine that is homed on another of its
        /// workers: the NIC's RSS (or a flow rule) delivered them to the wrong queue. Dropped;
        /// the sender's timer resends them, to the same wrong queue (see `docs/rdma.md`, "N
        /// cores").
        wrong_core: Sum,
        /// ARP replies built (to requests for our address).
        arp_replies: Sum,
        /// Frames the connection manager took: QP1's, and ARP packets it learned from.
        cm_frames: Sum,
        /// Packets the queue pairs sent (requests and responses, first sends and resends).
        tx_packets: Sum,
        /// Work requests posted by the host and taken by the worker.
        posted: Sum,
        /// Completions handed to the host.
        completions: Sum,
        /// Times work was left in a host ring because its completion queue had no free slot.
        cq_full: Sum,
        /// Completions that found their ring full (0 unless the reservation rule is broken).
        cq_overruns: Sum,
        /// Ranges handed to the flusher to persist (`msync`, or the power-loss simulator).
        persist_jobs: Sum,
        /// Persists that failed; the queue pairs waiting for them went to the error state.
        persist_failures: Sum,
        /// Requests the traffic shaper picked (one per request packet sent under a shaper;
        /// READ responses are `shaper_read_responses`).
        shaper_picks: Sum,
        /// Picks whose queue pair then had nothing to send after all (0 unless a peek and the
        /// send disagree; the pick's tokens are spent).
        shaper_misses: Sum,
        /// 802.1Qbb PFC frames from the link partner, taken by the shaper (its classes count
        /// their pauses); with no shaper, counted and otherwise ignored.
        pfc_frames: Sum,
        /// MAC control frames (0x8808) that are not a well-formed PFC frame (802.3x PAUSE
        /// included: Portico does not honour link-level pause).
        mac_control_ignored: Sum,
        /// READ response packets the traffic shaper picked (charged to their queue pair's
        /// class with its requests; without a shaper they go in turn, uncounted here).
        shaper_read_responses: Sum,
    }
}

/// How often the shapers of a port's workers rebalance the port's rates among themselves.
pub const PORT_REBALANCE_NS: u64 = 50_000;

/// A queue pair with the worker's end of its rings and its scheduling state.
pub(crate) struct QpEntry {
    pub(crate) qp: QueuePair,
    rings: QpRings,
    send_cq: u32,
    recv_cq: u32,
    /// On the ready list.
    ready: bool,
    /// On the backlog: its rings held requests it could not take yet.
    backlog: bool,
    /// The earliest deadline with an entry in the timer heap.
    armed: Option<u64>,
    /// On the list of queue pairs whose deadline is looked at before the heap is next read.
    arm_due: bool,
    /// False once destroyed ([`RdmaNode::destroy_qp`]): the slot waits for a new queue pair.
    pub(crate) live: bool,
}

impl QpEntry {
    /// Puts this queue pair, in `slot`, on the ready list, unless it is on it.
    #[inline(always)]
    fn wake_up(&mut self, ready: &mut ReadyList, slot: u32) {
        if !self.ready {
            self.ready = true;
            ready.push_back(slot);
        }
    }

    /// Notes that this queue pair, in `slot`, may have a new deadline, unless it is noted.
    #[inline(always)]
    fn arm(&mut self, touched: &mut Vec<u32>, slot: u32) {
        if !self.arm_due {
            self.arm_due = true;
            touched.push(slot);
        }
    }
}

/// Queue pairs indexed by QPN: a direct-mapped table over the QPN's low bits, grown when two
/// QPNs would share a slot, so a lookup is one index and one compare.
pub(crate) struct QpTable {
    pub(crate) entries: Vec<QpEntry>,
    index: Vec<u32>,
}

const NO_QP: u32 = u32::MAX;

impl QpTable {
    fn new() -> QpTable {
        QpTable {
            entries: Vec::new(),
            index: vec![NO_QP; 64],
        }
    }

    #[inline]
    pub(crate) fn lookup(&self, qpn: u32) -> Option<usize> {
        let i = self.index[qpn as usize & (self.index.len() - 1)];
        match self.entries.get(i as usize) {
            Some(e) if e.qp.config().local_qpn == qpn => Some(i as usize),
            _ => None,
        }
    }

    /// Indexes the entry `at` (already in `entries`), growing the index until no two QPNs
    /// share a slot. QPNs are 24-bit, so this ends by 2^24 slots.
    fn insert(&mut self, qpn: u32, at: usize) {
        let slot = qpn as usize & (self.index.len() - 1);
        if self.index[slot] == NO_QP {
            self.index[slot] = at as u32;
            return;
        }
        let mut size = self.index.len() * 2;
        while !self.rebuild(size) {
            size *= 2;
        }
    }

    /// Takes `qpn` (at entry `at`) out of the index.
    fn remove(&mut self, qpn: u32, at: usize) {
        let slot = qpn as usize & (self.index.len() - 1);
        if self.index[slot] == at as u32 {
            self.index[slot] = NO_QP;
        }
    }

    /// Indexes every live entry in a table of `size` slots; false if two collide.
    fn rebuild(&mut self, size: usize) -> bool {
        let mut index = vec![NO_QP; size];
        for (i, e) in self.entries.iter().enumerate().filter(|(_, e)| e.live) {
            let s = e.qp.config().local_qpn as usize & (size - 1);
            if index[s] != NO_QP {
                return false;
            }
            index[s] = i as u32;
        }
        self.index = index;
        true
    }
}

/// Offers the requests waiting in `ring` to `take` with their pieces (which posts one and
/// says whether it did), each with as many slots reserved in `cq` as it will complete
/// (`completions`: two for a durable WRITE that reports placement, otherwise one); a request
/// taken takes its list out of the list ring with it. Returns how many were taken, and
/// whether some were left behind (the queue pair's queue or the completion queue was full).
fn take_from<K>(
    ring: &mut WorkerRing<K>,
    cq: &mut CqWriter,
    counters: &mut NodeCounters,
    completions: impl Fn(&Entry<K>) -> usize,
    mut take: impl FnMut(&Entry<K>, &[Sge]) -> bool,
) -> (usize, bool) {
    let WorkerRing { entries, lists } = ring;
    let waiting = entries.slots();
    if waiting == 0 {
        return (0, false);
    }
    // One request (a lone operation's): peeked, then popped if taken, without the chunk's
    // two slices and their iterator. The loop's steps below, written out again: shared with
    // the loop as one function, they cost the loop 5 instructions a request. Callgrind: a lone
    // 64 B WRITE 3 666 -> 3 630, a batched one 1 717.3 -> 1 720.6 (the loop's registers).
    if waiting == 1 {
        let Ok(item) = entries.peek() else {
            return (0, false);
        };
        let need = completions(item);
        if !cq.has_room(need) {
            cq.note_full();
            counters.cq_full += 1;
            return (0, true);
        }
        if !item.pieces(lists).is_some_and(|sges| take(item, sges)) {
            return (0, true);
        }
        item.taken(lists);
        for _ in 0..need {
            cq.reserve();
        }
        let _ = entries.pop();
        return (1, false);
    }
    let Ok(chunk) = entries.read_chunk(waiting) else {
        return (0, false);
    };
    let (a, b) = chunk.as_slices();
    let mut used = 0;
    let mut short = false;
    // The completion ring's free slots, read once and counted down: the host only frees
    // more meanwhile (reading them is a load of the host's index, a line the other core
    // writes), so they are read again only before a request would be refused for want of
    // them.
    let mut free = cq.unreserved();
    for item in a.iter().chain(b) {
        let need = completions(item);
        if free < need {
            free = cq.unreserved();
            if free < need {
                cq.note_full();
                counters.cq_full += 1;
                short = true;
                break;
            }
        }
        // Its list was pushed before it; were it not visible yet, the request waits.
        let taken = item.pieces(lists).is_some_and(|sges| take(item, sges));
        if !taken {
            short = true;
            break;
        }
        item.taken(lists);
        for _ in 0..need {
            cq.reserve();
        }
        free -= need;
        used += 1;
    }
    chunk.commit(used);
    (used, short)
}

/// Why a queue pair could not be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddQpError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("queue pair number {0:#x} is already in use")]
    DuplicateQpn(u32),
    #[error("completion queue {0} does not belong to this engine")]
    UnknownCq(u32),
    #[error("an engine has at most {MAX_QPS} queue pairs")]
    TooMany,
    #[error("traffic_class {0}: the engine's shaper has {1} classes")]
    NoSuchClass(u8, usize),
}

/// A deregistration waiting for the region's last user, and the number of its request.
struct PendingDereg {
    slot: u32,
    id: u64,
}

/// A packet handed out by [`RdmaNode::poll_transmit`], to write with [`RdmaNode::emit`] before
/// the next call that changes the node. The packet itself stays in the node, where the queue
/// pair wrote it ([`RdmaNode::packet`]): a handle of 8 bytes is returned, not the packet's
/// 136 (callgrind: moving it out of the `Option` was 18 instructions a packet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tx {
    qp: u32,
    /// Which packet of the node's: a handle kept past the next `poll_transmit` is refused by
    /// `emit`.
    seq: u32,
}

/// An RDMA engine: address, memory, queue pairs, completion queues.
pub struct RdmaNode {
    pub mac: EthernetAddress,
    pub ip: Ipv4Addr,
    pub mem: MemoryTable,
    pub(crate) qps: QpTable,
    cqs: Vec<CqWriter>,
    /// Completions the queue pairs produced since the last flush.
    staged: StagedCompletions,
    doorbells: Arc<Doorbells>,
    ready: ReadyList,
    backlog: Vec<u32>,
    timers: BinaryHeap<Reverse<(u64, u32)>>,
    /// Queue pairs a packet or a timer touched since the heap was last read: their deadlines
    /// enter the heap once per iteration ([`RdmaNode::arm_touched`]), not once per packet.
    touched: Vec<u32>,
    /// What the queue pair at the head of the ready list may still send in its turn.
    turn: Budget,
    /// The packet the last [`RdmaNode::poll_transmit`] handed out, and its number.
    pending: OutPacket,
    pending_seq: u32,
    deregs: Vec<PendingDereg>,
    finished: Vec<(u64, ControlReply)>,
    /// QPNs of the engine's queue pairs homed on its other workers, sorted: looked at only
    /// for a packet no queue pair here takes, to count it as `wrong_core`.
    homed_elsewhere: Vec<u32>,
    /// The headers of the frame [`RdmaNode::receive`] has in hand, decoded in place.
    rx_headers: wire::TransportHeaders,
    /// The offloads (`parts.rs`): ingress queue, tags, persistence, port ECN, shaper.
    parts: Parts,
    /// [`Parts::act_on_packets`], as of the last change of a part.
    packet_parts: bool,
    /// Queue pairs a part's hook called into, for the parts' `settle` hooks ([`Ctx::settle`]).
    unsettled: Vec<u32>,
    pub counters: NodeCounters,
    arp: [u8; 64],
    /// Slots of destroyed queue pairs, for the next ones.
    free_slots: Vec<u32>,
    /// What destroyed queue pairs had counted, so that the engine's sums never go back when
    /// their slots are reused.
    retired: Retired,
    /// A queue pair's timer fired since the CM last looked (a retry limit may have put it in
    /// the error state: its peer may be gone).
    pub(crate) timer_fired: bool,
    /// The connection manager on QP1, when enabled ([`RdmaNode::enable_cm`]).
    pub(crate) cm: Option<Box<crate::cm::NodeCm>>,
    /// How long the host's waits spin before they park ([`RdmaNode::set_host_spin`]), shared
    /// with the completion queues and the tag port.
    host_spin: HostSpin,
}

portico_counters::counter_set! {
    /// Congestion-control counters summed over an engine's queue pairs
    /// ([`RdmaNode::cc_counters`]), declared once; the RDMA stage reports them under the same
    /// names.
    pub struct CcCounters, slots CcSlot {
        /// Packets received marked CE.
        ce_received: Sum,
        /// ACKs sent with the BECN bit.
        becn_acks_sent: Sum,
        /// Congestion notification packets sent.
        cnps_sent: Sum,
        /// Congestion notification packets received.
        cnps_received: Sum,
        /// Enhanced CNPs sent (`cc = ack`): the congestion of the READ responses received.
        read_cnps_sent: Sum,
        /// Enhanced CNPs received: they pace the READ responses sent.
        read_cnps_received: Sum,
    }
}

impl RdmaNode {
    pub fn new(mac: EthernetAddress, ip: Ipv4Addr) -> Self {
        RdmaNode {
            mac,
            ip,
            mem: MemoryTable::new(),
            qps: QpTable::new(),
            cqs: Vec::new(),
            staged: StagedCompletions::new(0),
            doorbells: Doorbells::new(),
            ready: ReadyList::new(),
            backlog: Vec::new(),
            timers: BinaryHeap::new(),
            touched: Vec::new(),
            turn: Budget::packets(TURN_PACKETS),
            pending: OutPacket::UNSET,
            pending_seq: 0,
            deregs: Vec::new(),
            finished: Vec::new(),
            homed_elsewhere: Vec::new(),
            rx_headers: wire::TransportHeaders::default(),
            parts: Parts::default(),
            packet_parts: false,
            unsettled: Vec::new(),
            counters: NodeCounters::default(),
            arp: [0; 64],
            free_slots: Vec::new(),
            retired: Retired::default(),
            timer_fired: false,
            cm: None,
            host_spin: Arc::new(AtomicU64::new(rings::SPIN_NS)),
        }
    }

    /// Puts the engine's requests under a traffic shaper (`docs/shaper.md`); before any queue
    /// pair is added. Its flow queues are the queue pairs' send queues and READ responses, two
    /// per slot, so `flow_queues` and `flow_queue_depth` are set here.
    pub fn set_shaper(&mut self, mut cfg: ShaperConfig) -> Result<(), ShaperError> {
        assert!(self.qps.entries.is_empty(), "set_shaper before add_qp");
        // Two streams per queue pair: its requests and its READ responses.
        cfg.flow_queues = 2 * MAX_QPS;
        cfg.flow_queue_depth = 1;
        self.parts.shaper.shaper = Some(Box::new(Shaper::new(cfg)?));
        Ok(())
    }

    /// Makes this engine's shaper worker `me` of a port whose configured rates are held across
    /// its workers (`proto::shaper::PortShares`: each worker's rates are the port's divided
    /// among the workers with work, rebalanced every `PORT_REBALANCE_NS`). False without a
    /// shaper.
    pub fn share_shaper_port(&mut self, shares: Arc<proto::shaper::PortShares>, me: usize) -> bool {
        match self.parts.shaper.shaper.as_mut() {
            Some(sh) => {
                sh.share_port(shares, me, PORT_REBALANCE_NS);
                true
            }
            None => false,
        }
    }

    /// The traffic shaper, if the engine has one (its counters per class and per MCU).
    pub fn shaper(&self) -> Option<&Shaper> {
        self.parts.shaper.shaper.as_deref()
    }

    /// Persist on the calling thread instead of a flusher thread: deterministic, for tests
    /// and fuzzing. A worker must not (an `msync` would stall every queue pair it serves).
    pub fn set_persist_inline(&mut self, inline: bool) {
        self.parts.persistence.inline = inline;
    }

    /// Gives this engine a list-processing shard with the endpoints `cfg` homes here: tagged
    /// queue pairs ([`QpConfig::tagged`]) then match their messages against it. Returns the
    /// application's end (commands and events).
    pub fn enable_tags(&mut self, cfg: &TagConfig) -> Result<TagPort, proto::lpe::LpeError> {
        let (shard, port) = TagShard::new(cfg, self.host_spin.clone())?;
        self.parts.tags.shard = Some(shard);
        self.parts_changed();
        Ok(port)
    }

    /// The list-processing shard, when tagged messaging is on.
    pub fn tags(&self) -> Option<&TagShard> {
        self.parts.tags.shard.as_ref()
    }

    /// Adaptive polling: the host → worker paths whose posts wake this engine's worker (its
    /// doorbells, and its tag commands).
    pub fn wakes(&self) -> Vec<Arc<Wake>> {
        let mut w = vec![self.doorbells.wake().clone()];
        self.parts.wakes(&mut w);
        w
    }

    /// Adaptive polling: the host posted work the worker has not taken yet.
    pub fn host_work_pending(&self) -> bool {
        self.doorbells.pending() || self.parts.host_work_pending()
    }

    /// Adaptive polling: how long (worker time from `now`) until this engine needs a poll if
    /// nothing arrives, `Some(0)` while it holds work it could not finish (queue pairs ready
    /// to send, a backlog, persistence or deregistration under way, completions or tag
    /// actions not handed over), else its next timer or shaper pick; and whether it awaits
    /// packets (a timer is armed: a request in flight, its retransmission timer running).
    pub fn outlook(&mut self, now: u64) -> Outlook {
        let busy = !self.ready.is_empty()
            || !self.backlog.is_empty()
            || !self.deregs.is_empty()
            || self.parts.busy(&self.mem)
            || !self.staged.is_empty();
        if busy {
            return Outlook::BUSY;
        }
        self.prune_timers();
        let parts = [self.parts.due_at(now), self.cm_deadline()]
            .into_iter()
            .flatten()
            .min()
            .map(|t| t.saturating_sub(now));
        let timer = self
            .timers
            .peek()
            .map(|&Reverse((due, _))| due.saturating_sub(now));
        Outlook::due_in(parts).and(Outlook {
            due_in_ns: timer,
            awaits_packets: timer.is_some(),
        })
    }

    /// Drops the timers at the top of the heap that no longer stand (the queue pair's deadline
    /// moved or went away: its requests were all acknowledged), re-arming the real ones, so
    /// that the top is a deadline that will fire.
    fn prune_timers(&mut self) {
        self.arm_touched();
        while let Some(&Reverse((due, slot))) = self.timers.peek() {
            let e = &mut self.qps.entries[slot as usize];
            if e.qp.next_deadline() == Some(due) {
                break;
            }
            self.timers.pop();
            if e.armed == Some(due) {
                e.armed = None;
            }
            self.arm_now(slot);
        }
    }

    /// How long the host's waits (completion queues, tag events) spin before they park: the
    /// worker's policy says (`Cq::wait`).
    pub fn set_host_spin(&self, ns: u64) {
        self.host_spin.store(ns, Ordering::Relaxed);
    }

    /// The frames passed to [`RdmaNode::receive`] from now until
    /// [`RdmaNode::end_rx_burst`] were taken off the wire together (one PMD burst): host
    /// commands for the tag shard are looked for once for all of them, at the first tagged
    /// message, instead of at each ([`TagShard::begin_burst`]), and the event slots `frames`
    /// messages fill are asked for ahead. Without it every frame is a burst of its own.
    pub fn begin_rx_burst(&mut self, frames: usize) {
        if let Some(t) = &mut self.parts.tags.shard {
            t.begin_burst(frames);
        }
    }

    /// The burst [`RdmaNode::begin_rx_burst`] began is received: the host sees the tag events
    /// its messages made.
    pub fn end_rx_burst(&mut self) {
        if let Some(t) = &mut self.parts.tags.shard {
            t.end_burst();
        }
    }

    /// After an iteration: the host sees the tag events made since the last burst or
    /// iteration, and is woken if it waits for them. A driver calls it once an iteration (as
    /// it calls [`RdmaNode::flush_completions`]): events made outside a receive burst (by
    /// host commands, timers, frames received one at a time) are not seen before.
    pub fn publish_tag_events(&mut self) {
        self.parts.publish();
    }

    /// Creates a completion queue of `depth` entries; the application polls the returned end.
    pub fn create_cq(&mut self, depth: usize) -> Cq {
        let id = self.cqs.len() as u32;
        let (host, worker) = rings::cq_ring(id, depth.max(1), self.host_spin.clone());
        self.cqs.push(worker);
        // Every completion had a reserved slot in its ring, so this many can be staged at most.
        let capacity: usize = self.cqs.iter().map(|c| c.unreserved()).sum();
        self.staged = StagedCompletions::new(capacity);
        host
    }

    /// Adds a queue pair; its local MAC and IP are this node's. Completions of its send work
    /// go to `send_cq`, of its receives to `recv_cq`. Returns the application's end.
    pub fn add_qp(&mut self, cfg: QpConfig, send_cq: &Cq, recv_cq: &Cq) -> Result<Qp, AddQpError> {
        for cq in [send_cq, recv_cq] {
            if !self
                .cqs
                .get(cq.id() as usize)
                .is_some_and(|w| cq.feeds_from(w))
            {
                return Err(AddQpError::UnknownCq(cq.id()));
            }
        }
        self.add_qp_by_id(cfg, send_cq.id(), recv_cq.id())
    }

    /// [`RdmaNode::add_qp`] with the completion queues named by their ids (the CM's queue
    /// pairs, created on the worker).
    pub(crate) fn add_qp_by_id(
        &mut self,
        mut cfg: QpConfig,
        send_cq: u32,
        recv_cq: u32,
    ) -> Result<Qp, AddQpError> {
        cfg.local_mac = self.mac;
        cfg.local_ip = self.ip;
        let qpn = cfg.local_qpn;
        for cq in [send_cq, recv_cq] {
            if cq as usize >= self.cqs.len() {
                return Err(AddQpError::UnknownCq(cq));
            }
        }
        if self.qps.lookup(qpn).is_some() {
            return Err(AddQpError::DuplicateQpn(qpn));
        }
        if self.qps.entries.len() - self.free_slots.len() >= MAX_QPS {
            return Err(AddQpError::TooMany);
        }
        self.parts.admit_qp(&mut cfg)?;
        let qp = QueuePair::new(cfg.clone())?;
        let slot = self
            .free_slots
            .pop()
            .map_or(self.qps.entries.len(), |s| s as usize);
        self.parts.qp_added(slot as u32, &qp);
        self.parts_changed();
        let (host, rings) = rings::qp_rings(
            qpn,
            slot as u32,
            cfg.max_send_wr,
            cfg.max_recv_wr,
            self.doorbells.clone(),
        );
        let mut entry = QpEntry {
            qp,
            rings,
            send_cq,
            recv_cq,
            ready: false,
            backlog: false,
            armed: None,
            arm_due: false,
            live: true,
        };
        if let Some(old) = self.qps.entries.get(slot) {
            // A destroyed queue pair's slot: its places on the lists and in the timer heap
            // are the new one's (each is checked against the queue pair when it comes up).
            entry.ready = old.ready;
            entry.backlog = old.backlog;
            entry.armed = old.armed;
            entry.arm_due = old.arm_due;
            self.qps.entries[slot] = entry;
        } else {
            self.qps.entries.push(entry);
        }
        self.qps.insert(qpn, slot);
        let n = self.qps.entries.len();
        self.backlog.reserve(n);
        self.timers.reserve(2 * n + 16);
        self.touched.reserve(n);
        self.unsettled.reserve(n);
        Ok(host)
    }

    /// Destroys queue pair `qpn`: its work requests complete with a flush error (delivered
    /// to the host before this returns), packets for it are dropped as `unknown_qp` from now
    /// on, and its slot is free for a later queue pair. False if no queue pair has `qpn`.
    pub fn destroy_qp(&mut self, qpn: u32) -> bool {
        let Some(i) = self.qps.lookup(qpn) else {
            return false;
        };
        self.qps.entries[i].qp.shut_down(&mut self.staged);
        self.settle(i as u32);
        self.flush_completions();
        let qp = &self.qps.entries[i].qp;
        self.retired.retransmissions += qp.requester().retransmissions();
        self.retired.spurious_retransmissions += qp.requester().spurious_retransmissions();
        self.retired.cc.combine(&cc_of(qp));
        self.qps.remove(qpn, i);
        self.qps.entries[i].live = false;
        self.parts.qp_removed(i as u32);
        self.parts_changed();
        self.free_slots.push(i as u32);
        if !self.deregs.is_empty() {
            self.finish_deregistrations();
        }
        true
    }

    /// Queue pairs the node holds (destroyed ones not counted).
    pub fn qp_count(&self) -> usize {
        self.qps.entries.len() - self.free_slots.len()
    }

    /// Notes that queue pair `qpn` of the same engine is homed on another worker (this node
    /// is one shard of an engine that runs on several): a packet for it that arrives here is
    /// dropped and counted as `wrong_core` rather than `unknown_qp`.
    pub fn add_qp_homed_elsewhere(&mut self, qpn: u32) {
        if let Err(at) = self.homed_elsewhere.binary_search(&qpn) {
            self.homed_elsewhere.insert(at, qpn);
        }
    }

    /// Registers memory directly (before the worker runs, or in tests).
    pub fn register(
        &mut self,
        map: Arc<pmem::Mapping>,
        offset: usize,
        len: usize,
        access: proto::transport::Access,
    ) -> Result<MrKeys, RegisterError> {
        self.mem.register(map, offset, len, access)
    }

    pub fn qp(&self, qpn: u32) -> Option<&QueuePair> {
        self.qps.lookup(qpn).map(|i| &self.qps.entries[i].qp)
    }

    pub fn qps(&self) -> impl Iterator<Item = &QueuePair> {
        self.live_entries().map(|e| &e.qp)
    }

    /// The queue pairs that are not destroyed.
    fn live_entries(&self) -> impl Iterator<Item = &QpEntry> {
        self.qps.entries.iter().filter(|e| e.live)
    }

    /// Request packets sent again, over all queue pairs, destroyed ones included (read
    /// without copying their stats).
    pub fn retransmissions(&self) -> u64 {
        self.retired.retransmissions
            + self
                .live_entries()
                .map(|e| e.qp.requester().retransmissions())
                .sum::<u64>()
    }

    /// Congestion-control counters over all queue pairs, destroyed ones included (the ones
    /// the stage publishes).
    pub fn cc_counters(&self) -> CcCounters {
        let mut c = self.retired.cc;
        for e in self.live_entries() {
            c.combine(&cc_of(&e.qp));
        }
        c
    }

    /// The depth in bytes of the bottleneck in front of this engine's receive path, now.
    pub fn set_ingress_queue(&mut self, bytes: Option<u32>) {
        self.parts.ingress.bytes = bytes;
        self.parts_changed();
    }

    /// A part was enabled or reconfigured, or a queue pair added or removed.
    fn parts_changed(&mut self) {
        self.packet_parts = self.parts.act_on_packets();
    }

    /// The queuing delay in ns of that bottleneck, now, where it knows its rate (the CETH's
    /// delay word, `AckParams::delay`).
    pub fn set_ingress_delay(&mut self, ns: Option<u32>) {
        self.parts.ingress.delay_ns = ns;
    }

    /// Retransmitted packets found not to have been needed, over all queue pairs, destroyed
    /// ones included.
    pub fn spurious_retransmissions(&self) -> u64 {
        self.retired.spurious_retransmissions
            + self
                .live_entries()
                .map(|e| e.qp.requester().spurious_retransmissions())
                .sum::<u64>()
    }

    /// The ARP reply written by the last [`RxOutcome::ArpReply`].
    pub fn arp_reply(&self, len: usize) -> &[u8] {
        &self.arp[..len]
    }

    /// Puts the queue pair in `slot` on the ready list, unless it is there ([`wake_up`]).
    #[inline(always)]
    fn make_ready(&mut self, slot: u32) {
        wake_up(&mut self.qps, &mut self.ready, slot);
    }

    /// [`RdmaNode::make_ready`] and [`RdmaNode::arm`] with one look at the entry (the queue
    /// pair a packet came for), not one each (callgrind: a batched 64 B WRITE 1 603.4 ->
    /// 1 602.2, a lone one 3 483 -> 3 477).
    #[inline(always)]
    fn make_ready_and_arm(&mut self, slot: u32) {
        let e = &mut self.qps.entries[slot as usize];
        e.wake_up(&mut self.ready, slot);
        e.arm(&mut self.touched, slot);
    }

    /// The parts, and the rest of the node as they see it.
    #[inline(always)]
    fn split(&mut self) -> (&mut Parts, Ctx<'_>) {
        let RdmaNode {
            parts,
            qps,
            ready,
            mem,
            staged,
            counters,
            unsettled,
            ..
        } = self;
        let cx = Ctx {
            qps,
            ready,
            mem,
            staged,
            counters,
            unsettled,
        };
        (parts, cx)
    }

    /// Notes that the queue pair in `slot` may have a new deadline (a packet went or came): it
    /// is looked at when the heap is next read, once however many packets touched it in
    /// between. A burst of 32 WRITEs arms the sending queue pair once, not once a packet.
    #[inline(always)]
    fn arm(&mut self, slot: u32) {
        self.qps.entries[slot as usize].arm(&mut self.touched, slot);
    }

    /// Enters the deadlines of the queue pairs [`RdmaNode::arm`] noted: before the heap is read
    /// ([`RdmaNode::run_timers`], [`RdmaNode::outlook`]).
    ///
    /// Inline is only the look at the list, which most iterations of a node that answers
    /// find empty; the loop is out of line.
    #[inline(always)]
    fn arm_touched(&mut self) {
        if !self.touched.is_empty() {
            self.arm_touched_slow();
        }
    }

    #[inline(never)]
    fn arm_touched_slow(&mut self) {
        while let Some(slot) = self.touched.pop() {
            self.qps.entries[slot as usize].arm_due = false;
            self.arm_now(slot);
        }
    }

    /// Puts the deadline of the queue pair in `slot` in the heap, if it is earlier than the
    /// one it has there.
    ///
    /// Inline where the heap is read: most calls find the deadline in the heap already (or
    /// none), and the push is out of line, so that the check saves no registers.
    #[inline(always)]
    fn arm_now(&mut self, slot: u32) {
        let e = &mut self.qps.entries[slot as usize];
        if let Some(d) = e.qp.next_deadline()
            && e.armed.is_none_or(|a| d < a)
        {
            self.arm_at(slot, d);
        }
    }

    #[inline(never)]
    fn arm_at(&mut self, slot: u32, due: u64) {
        self.qps.entries[slot as usize].armed = Some(due);
        self.timers.push(Reverse((due, slot)));
    }

    /// A frame to the MAC control address: a PFC frame pauses (or resumes) the shaper's
    /// classes mapped to its priorities (seed 000: flow control from the link partner is an
    /// input to the arbitration); anything else is counted and dropped.
    fn mac_control(&mut self, now: u64, frame: &[u8]) -> RxOutcome {
        match wire::pfc::PfcRepr::parse(frame) {
            Ok(pfc) => {
                self.counters.pfc_frames += 1;
                if let Some(sh) = self.parts.shaper.shaper.as_mut() {
                    sh.pfc(now, &pfc);
                }
            }
            Err(_) => self.counters.mac_control_ignored += 1,
        }
        RxOutcome::Dropped
    }

    /// The answer to `frame` if it is an ARP request for our address (its sender learnt by
    /// the connection manager, when there is one).
    fn arp_request(&mut self, now: u64, frame: &[u8]) -> Option<RxOutcome> {
        let len = wire::arp::answer(frame, self.mac, self.ip, &mut self.arp)?;
        self.counters.arp_replies += 1;
        self.cm_learn(now, frame);
        Some(RxOutcome::ArpReply(len))
    }

    /// Handles one received frame.
    ///
    /// The checks come in the order a NIC makes them, each refusal counted under its own
    /// reason with no NAK and no state change: the destination MAC (ours; broadcast only for
    /// ARP), the frame's structure, checksums and ICRC ([`wire::parse_frame`]), the
    /// destination IP, the destination QP, then the queue pair's own acceptance (P_Key,
    /// source address). Only then does the transport see the packet.
    pub fn receive(&mut self, now: u64, frame: &[u8]) -> RxOutcome {
        self.counters.rx_frames += 1;
        let Some(dst) = frame.get(..6) else {
            self.counters.malformed += 1;
            return RxOutcome::Dropped;
        };
        if dst != self.mac.0 {
            if dst[0] & 1 == 0 {
                self.counters.wrong_mac += 1;
                return RxOutcome::Dropped;
            }
            // Broadcast or multicast: only an ARP request for our address is ours.
            if dst == [0xff; 6]
                && let Some(reply) = self.arp_request(now, frame)
            {
                return reply;
            }
            if dst == wire::pfc::MAC_CONTROL_ADDRESS.0 {
                return self.mac_control(now, frame);
            }
            self.counters.not_for_us += 1;
            return RxOutcome::Dropped;
        }
        let count_error = |c: &mut NodeCounters, e: wire::Error| {
            *match e {
                wire::Error::BadIcrc { .. } => &mut c.icrc_errors,
                wire::Error::NotRoce { .. } => &mut c.not_for_us,
                wire::Error::OtherTransport(_) => &mut c.wrong_transport,
                wire::Error::Unsupported(u) => match u {
                    wire::Unsupported::VlanTag(_) => &mut c.vlan_tagged,
                    wire::Unsupported::IpOptions(_) => &mut c.ip_options,
                    wire::Unsupported::IpFragment { .. } => &mut c.ip_fragments,
                },
                _ => &mut c.malformed,
            } += 1;
        };
        // The structure and the headers first, in one pass (`wire::rx`), then the cheap
        // filters (our address, a queue pair of ours) before the checksums and the ICRC: a
        // packet for someone else is dropped without reading it whole, which the IBTA allows
        // (nothing is answered to a packet that fails either check, whatever its ICRC).
        let rx = match wire::RxFrame::new(frame, &mut self.rx_headers) {
            Ok(rx) => rx,
            Err(e) => {
                // Not RoCEv2: an ARP request for our address is answered (looked for only
                // here, not before every RoCEv2 frame: about 20 instructions a frame, callgrind).
                if let Some(reply) = self.arp_request(now, frame) {
                    return reply;
                }
                // QP1's frames (another transport to the RC parser) and ARP replies go to
                // the connection manager, when there is one.
                if self.cm.is_some() && self.cm_take(now, frame, e) {
                    self.counters.cm_frames += 1;
                    return RxOutcome::Cm;
                }
                count_error(&mut self.counters, e);
                return RxOutcome::Dropped;
            }
        };
        let c = &mut self.counters;
        if rx.dst_addr() != self.ip {
            c.not_for_us += 1;
            return RxOutcome::Dropped;
        }
        let dest_qp = rx.dest_qp();
        let Some(i) = self.qps.lookup(dest_qp) else {
            // Multi-core: a queue pair of this engine that another worker holds.
            match self.homed_elsewhere.binary_search(&dest_qp) {
                Ok(_) => c.wrong_core += 1,
                Err(_) => c.unknown_qp += 1,
            }
            return RxOutcome::Dropped;
        };
        let e = &mut self.qps.entries[i];
        let (repr, payload) = match rx.verify_masked(pmem::crc::update_masked) {
            Ok(parsed) => parsed,
            Err(e) => {
                count_error(c, e);
                return RxOutcome::Dropped;
            }
        };
        if let Err(why) = e.qp.admit(repr) {
            *match why {
                Inadmissible::PKey => &mut c.bad_pkey,
                Inadmissible::Source => &mut c.wrong_source,
            } += 1;
            return RxOutcome::Dropped;
        }
        let (mem, staged) = (&mut self.mem, &mut self.staged);
        // The parts' hooks around the transport, where one may act (callgrind, a lone 64 B
        // WRITE 3 064.3 -> 3 040.3, a batched one 1 585.2 -> 1 572.8).
        let parts = self.packet_parts;
        // Debug builds check the cached flag at every packet (`debug_assert!` here, compiled
        // out as it is, moved the release build's code: +14 instructions a lone WRITE).
        #[cfg(debug_assertions)]
        assert_eq!(parts, self.parts.act_on_packets(), "packet_parts is stale");
        if parts {
            self.parts.before_packet(now, &mut e.qp, repr);
        }
        if !(parts
            && self
                .parts
                .deliver(now, &mut e.qp, (repr, payload), mem, staged))
        {
            e.qp.on_packet(now, repr, payload, mem, staged);
        }
        let request = repr.bth.opcode.is_send_write_or_read();
        c.delivered += 1;
        // A packet that moved the queue pair to the error state may have cut off a tagged
        // message or a pull.
        if parts {
            self.settle(i as u32);
        }
        // Only a response (an ACK, a NAK, a READ response, a CNP) moves the queue pair's
        // deadlines, which are its requester's: a request leaves them as they were, or none
        // when it moved the queue pair to the error state. So a request wakes the queue pair
        // (it may owe an ACK) and arms nothing; the rarer requests (atomics, FLUSH, durable
        // WRITEs) arm as before, since telling them apart costs more than their arming.
        //
        // A response that left the queue pair without a deadline (the ACK of a lone operation,
        // or of a window's last) has nothing to arm either; and the touch its request's send
        // left, still on top of the touched list, has nothing left to look at: it is taken
        // back (callgrind, a lone 64 B WRITE 3 040.3 -> 3 007.3, a lone READ 3 670.3 -> 3 637.3).
        let e = &mut self.qps.entries[i];
        if request {
            self.make_ready(i as u32);
        } else if !e.qp.has_deadline() {
            if e.arm_due && self.touched.last() == Some(&(i as u32)) {
                self.touched.pop();
                e.arm_due = false;
            }
            self.make_ready(i as u32);
        } else {
            self.make_ready_and_arm(i as u32);
        }
        let (parts, mut cx) = self.split();
        parts.after_packet(i as u32, &mut cx);
        RxOutcome::Delivered
    }

    /// Host-facing work of one iteration: doorbells, backlog, timers, deregistrations.
    ///
    /// An iteration with none of it (a busy worker's, mostly; the peer's, in a lone
    /// operation's exchange) asks each source once, inline, and goes no further: the call,
    /// its frame and the sources asked in turn by `serve` were about 70 instructions
    /// (callgrind, a lone 64 B WRITE 3 224.1 -> 3 180.1).
    #[inline]
    pub fn service(&mut self, now: u64) {
        if self.service_due(now) {
            self.serve(now);
        }
    }

    /// Whether [`RdmaNode::service`] has something to do: each of the sources [`RdmaNode::serve`]
    /// looks at, asked as it asks it.
    #[inline(always)]
    fn service_due(&self, now: u64) -> bool {
        self.doorbells.pending()
            || !self.backlog.is_empty()
            || !self.touched.is_empty()
            || self
                .timers
                .peek()
                .is_some_and(|Reverse((due, _))| *due <= now)
            || !self.deregs.is_empty()
            || !self.unsettled.is_empty()
            || self.cm.is_some()
            || self.parts.iteration_work(&self.mem)
    }

    /// [`RdmaNode::service`]'s work, when there is some.
    #[inline(never)]
    fn serve(&mut self, now: u64) {
        while let Some(slot) = self.doorbells.pop() {
            let e = &mut self.qps.entries[slot as usize];
            e.rings.take_doorbell();
            if e.live {
                self.take_work(slot);
            }
        }
        if !self.backlog.is_empty() {
            let n = self.backlog.len();
            for k in 0..n {
                let slot = self.backlog[k];
                let e = &mut self.qps.entries[slot as usize];
                e.backlog = false;
                if e.live {
                    self.take_work(slot);
                }
            }
            // Queue pairs that are still short of room were pushed again behind the old list.
            self.backlog.drain(..n);
        }
        let parts_work = self.parts.iteration_work(&self.mem);
        if parts_work {
            let (parts, mut cx) = self.split();
            parts.poll_host(&mut cx);
        }
        self.run_timers(now);
        if !self.deregs.is_empty() {
            self.finish_deregistrations();
        }
        if parts_work || self.parts.iteration_work(&self.mem) {
            let (parts, mut cx) = self.split();
            parts.service(now, &mut cx);
        }
        self.settle_parts();
        if self.cm.is_some() {
            self.cm_service(now);
        }
    }

    /// The parts' `settle` hooks, for the queue pairs a part's hook called into.
    fn settle_parts(&mut self) {
        for k in 0..self.unsettled.len() {
            let slot = self.unsettled[k];
            self.parts.settle(slot, &mut self.qps, &self.mem);
        }
        self.unsettled.clear();
    }

    /// What a call into the queue pair in `slot` left for the parts (the tag shard: pulls
    /// that ended, messages cut off by the error state).
    #[inline(always)]
    fn settle(&mut self, slot: u32) {
        self.parts.settle(slot, &mut self.qps, &self.mem);
    }

    /// Moves work requests from a queue pair's host rings into it, as far as its queues and
    /// its completion queues have room.
    fn take_work(&mut self, slot: u32) {
        let e = &mut self.qps.entries[slot as usize];
        let (mem, staged) = (&self.mem, &mut self.staged);
        let qp = &mut e.qp;
        // A post is refused only when its queue is full (a request that fails its checks
        // completes in error, and in the error state every request completes at once): then
        // the request stays in the ring. (Asking the queue for room first asked twice:
        // callgrind, a batched 64 B WRITE 1 602.2 -> 1 595.0, a lone one 3 477 -> 3 463.)
        let (sends, short_s) = take_from(
            &mut e.rings.sq,
            &mut self.cqs[e.send_cq as usize],
            &mut self.counters,
            |wr| wr.kind.completions(),
            |wr, sges| {
                qp.post_send_pieces(wr.wr_id, &wr.kind, sges, mem, staged)
                    .is_ok()
            },
        );
        let (recvs, short_r) = take_from(
            &mut e.rings.rq,
            &mut self.cqs[e.recv_cq as usize],
            &mut self.counters,
            |_| 1,
            |wr, sges| qp.post_recv_pieces(wr.wr_id, sges, mem, staged).is_ok(),
        );
        let short = short_s || short_r;
        let took = (sends + recvs) as u64;
        if short && !e.backlog {
            e.backlog = true;
            self.backlog.push(slot);
        }
        self.counters.posted += took;
        // A post that failed its local checks moved the queue pair to the error state.
        self.settle(slot);
        if took > 0 {
            self.make_ready(slot);
        }
    }

    /// Runs expired timers of every queue pair.
    ///
    /// One pass looks at no more entries than the heap held when it started: a deadline that
    /// is still due after its queue pair was served (the end of an RNR wait stays due until
    /// the queue pair next transmits) is armed again and seen in the next pass, not in a
    /// loop inside this one.
    #[inline(always)]
    pub fn run_timers(&mut self, now: u64) {
        self.arm_touched();
        for _ in 0..self.timers.len() {
            let Some(&Reverse((due, slot))) = self.timers.peek() else {
                break;
            };
            if due > now {
                break;
            }
            self.timers.pop();
            let e = &mut self.qps.entries[slot as usize];
            if e.armed == Some(due) {
                e.armed = None;
            }
            // The entry may be stale (the deadline moved later): then only re-arm.
            if e.qp.next_deadline().is_some_and(|d| d <= now) {
                e.qp.on_timer(now, &mut self.staged);
                self.timer_fired = true;
                self.settle(slot);
                self.make_ready(slot);
            }
            self.arm_now(slot);
        }
    }

    /// The next packet to send: ready queue pairs in turn, each one's responses first, then
    /// its requests within its turn's budget.
    ///
    /// Inlined into the worker's loop: the call and its spills cost a batched WRITE 24
    /// instructions and a lone one 62 (callgrind, `roce_count`, whose loop mirrors the RDMA
    /// stage's). The queue pair writes the packet where the node keeps it.
    #[inline(always)]
    pub fn poll_transmit(&mut self, now: u64) -> Option<Tx> {
        let reads_held = self.parts.holds_read_responses();
        while let Some(slot) = self.ready.front() {
            let e = &mut self.qps.entries[slot as usize];
            // A response moves none of the queue pair's deadlines (its requester's): it is
            // handed out without arming.
            if e.qp.poll_responses_into(now, reads_held, &mut self.pending) {
                leave_if_done(&mut self.ready, &mut self.turn, e);
                return Some(self.handed_out_unarmed(slot));
            }
            // A part (the shaper) may send the queue pair's requests instead, later.
            let sent = !self.parts.holds_requests(slot, &e.qp)
                && e.qp
                    .poll_request_into(now, &mut self.turn, &mut self.pending);
            if sent {
                leave_if_done(&mut self.ready, &mut self.turn, e);
                return Some(self.handed_out(slot));
            }
            // The turn is over: either nothing more to send now, or its budget is spent.
            self.ready.pop_front();
            if self.turn.packets == 0 {
                self.ready.push_back(slot);
            } else {
                e.ready = false;
            }
            self.turn = Budget::packets(TURN_PACKETS);
            self.arm(slot);
        }
        // Requests the parts let go (the shaper's picks).
        if !self.parts.iteration_work(&self.mem) {
            return None;
        }
        let (parts, mut cx) = self.split();
        let (slot, packet) = parts.transmit(now, &mut cx)?;
        self.pending = packet;
        Some(self.handed_out(slot))
    }

    /// The handle of the packet of the queue pair in `slot` just written to `pending`.
    #[inline(always)]
    fn handed_out(&mut self, slot: u32) -> Tx {
        // A request just sent may have started the retransmission timer; the turn may end
        // with the TX burst, before the QP is visited again.
        self.arm(slot);
        self.handed_out_unarmed(slot)
    }

    /// [`RdmaNode::handed_out`] of a response, which starts no timer.
    #[inline(always)]
    fn handed_out_unarmed(&mut self, slot: u32) -> Tx {
        self.counters.tx_packets += 1;
        self.pending_seq = self.pending_seq.wrapping_add(1);
        Tx {
            qp: slot,
            seq: self.pending_seq,
        }
    }

    /// The packet `tx` stands for, while it is the last one handed out (`None` after).
    pub fn packet(&self, tx: &Tx) -> Option<&OutPacket> {
        (tx.seq == self.pending_seq).then_some(&self.pending)
    }

    /// Length of the frame of `tx`'s packet: what [`RdmaNode::emit`] needs of `buf` (0 for a
    /// stale handle, which `emit` refuses).
    pub fn frame_len(&self, tx: &Tx) -> usize {
        self.packet(tx).map_or(0, OutPacket::frame_len)
    }

    /// Writes the packet of `tx`, the last one [`RdmaNode::poll_transmit`] handed out, into
    /// `buf` (at least [`RdmaNode::frame_len`] bytes): headers, payload from the application's
    /// memory, ICRC. A handle kept past a later `poll_transmit` is refused
    /// (`Error::StaleHandle`), and nothing is written.
    pub fn emit(&self, tx: &Tx, buf: &mut [u8]) -> wire::Result<usize> {
        if tx.seq != self.pending_seq {
            return Err(wire::Error::StaleHandle);
        }
        let qp = &self.qps.entries[tx.qp as usize].qp;
        if self.pending.fields.opcode == wire::Opcode::Acknowledge {
            return qp.emit_ack(&self.pending, &self.mem, buf);
        }
        qp.emit(&self.pending, &self.mem, buf)
    }

    /// Hands the completions of this iteration to the host's completion rings: consecutive
    /// completions for the same ring go in with one ring commit.
    pub fn flush_completions(&mut self) {
        match self.staged.len() {
            0 => return,
            // A lone operation's: straight into its ring, without the runs' set-up (callgrind:
            // 221 instructions a lone WRITE through it).
            1 => return self.flush_one(),
            _ => {}
        }
        // Runs of completions for one ring enter it straight from the staging queue, with one
        // commit each; the queue pair of the last completion is remembered, since a burst's
        // completions mostly come from one. (The completions were copied into a run buffer
        // first, and each looked its queue pair up. Callgrind, per batched WRITE: 80
        // instructions here and 18.6 in `push_all` before, 33.6 and 19.1 after; a lone WRITE
        // pays 10 more, for the set-up.)
        let (cqs, counters) = (&mut self.cqs, &mut self.counters);
        let mut push = |cq: u32, wcs: &[WorkCompletion]| {
            if !wcs.is_empty() {
                counters.cq_overruns += cqs[cq as usize].push_all(wcs) as u64;
                counters.completions += wcs.len() as u64;
            }
        };
        // The queue pair of the last completion and its rings, in three plain variables: as
        // an `Option` (of a tuple, or of the number) they were spilled and reloaded at every
        // completion (callgrind: a batched 64 B WRITE 1 711.3 -> 1 701.4). `u32::MAX` is no
        // queue pair's number (`QpConfig::validate` keeps them to 24 bits), so it stands for
        // none yet.
        let (mut last_qpn, mut send_cq, mut recv_cq) = (u32::MAX, 0, 0);
        let staged = self.staged.as_slice();
        let mut lost = 0;
        let (mut start, mut run_cq) = (0, 0);
        for (k, wc) in staged.iter().enumerate() {
            debug_assert!(wc.qpn <= 0xff_ffff, "a queue pair number of 24 bits");
            if wc.qpn != last_qpn {
                let Some(i) = self.qps.lookup(wc.qpn) else {
                    // Completions come only from this node's queue pairs; were one lost, it
                    // counts.
                    push(run_cq, &staged[start..k]);
                    lost += 1;
                    start = k + 1;
                    continue;
                };
                let e = &self.qps.entries[i];
                (last_qpn, send_cq, recv_cq) = (wc.qpn, e.send_cq, e.recv_cq);
            }
            let cq = ring_of(wc, send_cq, recv_cq);
            if k > start && cq != run_cq {
                push(run_cq, &staged[start..k]);
                start = k;
            }
            run_cq = cq;
        }
        push(run_cq, &staged[start..]);
        self.counters.cq_overruns += lost;
        self.staged.clear();
        for cq in &mut self.cqs {
            cq.publish();
        }
    }

    /// [`RdmaNode::flush_completions`] of the one staged completion.
    fn flush_one(&mut self) {
        // Pushed from where it is staged, not copied out first (callgrind, a lone 64 B WRITE
        // 3 139.2 -> 3 116.2).
        let Some(wc) = self.staged.as_slice().first() else {
            return;
        };
        match self.qps.lookup(wc.qpn) {
            Some(i) => {
                let e = &self.qps.entries[i];
                let cq = &mut self.cqs[ring_of(wc, e.send_cq, e.recv_cq) as usize];
                self.counters.cq_overruns += cq.push_all(std::slice::from_ref(wc)) as u64;
                self.counters.completions += 1;
                cq.publish();
            }
            // As in the runs: a completion of no queue pair of this node counts, lost.
            None => self.counters.cq_overruns += 1,
        }
        // Empty again, and (cleared) from its front: the runs read it as one slice.
        self.staged.clear();
    }

    /// Carries out a control request. A deregistration whose region is still in use is
    /// answered later, through [`RdmaNode::take_replies`].
    pub fn control(&mut self, id: u64, request: Control) -> Option<(u64, ControlReply)> {
        let reply = match request {
            Control::Register {
                map,
                offset,
                len,
                access,
                iova,
            } => ControlReply::Registered(match iova {
                Some(iova) => self.mem.register_iova(map, offset, len, iova, access),
                None => self.mem.register(map, offset, len, access),
            }),
            Control::Install {
                map,
                offset,
                access,
                keys,
            } => ControlReply::Registered(self.mem.install(map, offset, keys, access)),
            Control::Cm(c) => ControlReply::Cm(self.cm_control(c)),
            Control::Deregister { lkey } => match self.mem.retire(lkey) {
                None => ControlReply::Deregistered(false),
                Some(slot) => {
                    self.parts.region_retired(slot);
                    self.deregs.push(PendingDereg { slot, id });
                    self.finish_deregistrations();
                    return None;
                }
            },
        };
        Some((id, reply))
    }

    fn finish_deregistrations(&mut self) {
        let mut k = 0;
        while k < self.deregs.len() {
            let slot = self.deregs[k].slot;
            if self.live_entries().any(|e| e.qp.uses_region(slot)) || self.parts.uses_region(slot) {
                k += 1;
                continue;
            }
            self.mem.remove(slot);
            let done = self.deregs.swap_remove(k);
            self.finished
                .push((done.id, ControlReply::Deregistered(true)));
        }
    }

    /// Answers that became ready since the last call (finished deregistrations).
    pub fn take_replies(&mut self, mut f: impl FnMut((u64, ControlReply))) {
        for r in self.finished.drain(..) {
            f(r);
        }
    }
}

/// What destroyed queue pairs had counted ([`RdmaNode::destroy_qp`]).
#[derive(Debug, Clone, Copy, Default)]
struct Retired {
    retransmissions: u64,
    spurious_retransmissions: u64,
    cc: CcCounters,
}

/// A queue pair's congestion-control counters.
fn cc_of(qp: &QueuePair) -> CcCounters {
    let s = qp.stats();
    CcCounters {
        ce_received: s.ce_received,
        becn_acks_sent: s.becn_acks_sent,
        cnps_sent: s.cnps_sent,
        cnps_received: s.cnps_received,
        read_cnps_sent: s.read_cnps_sent,
        read_cnps_received: s.read_cnps_received,
    }
}

/// The completion ring a completion goes to: its queue pair's receive ring for a receive,
/// its send ring for anything else.
#[inline(always)]
fn ring_of(wc: &WorkCompletion, send_cq: u32, recv_cq: u32) -> u32 {
    match wc.opcode {
        WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => recv_cq,
        _ => send_cq,
    }
}

/// Puts the queue pair in `slot` on the ready list, unless it is on it.
///
/// Inline everywhere: most calls (every frame after the first of a burst) find it there, and
/// the ring's push is a few stores (callgrind: a lone WRITE 14 instructions fewer than with
/// the push out of line behind an inline check, a batched one level).
#[inline(always)]
pub(crate) fn wake_up(qps: &mut QpTable, ready: &mut ReadyList, slot: u32) {
    qps.entries[slot as usize].wake_up(ready, slot);
}

/// Ends the turn of the queue pair at the front of `ready` (`e`), which just handed out a
/// packet, if it has nothing more to send (a lone operation's, an ACK's sender): here, not in
/// a later `poll_transmit` that would find nothing. Anything new to send comes with a wake-up
/// (a packet, a post, a timer).
#[inline(always)]
fn leave_if_done(ready: &mut ReadyList, turn: &mut Budget, e: &mut QpEntry) {
    if e.qp.has_nothing_to_send() {
        ready.pop_front();
        e.ready = false;
        *turn = Budget::packets(TURN_PACKETS);
    }
}

/// The queue pairs with something to send, in turn: a ring of [`MAX_QPS`] slots. A queue pair
/// is on it at most once (`QpEntry::ready`), so it never overflows; a power-of-two ring
/// wraps with a mask, where a `VecDeque` compares with its capacity at every step (callgrind:
/// 46 instructions fewer a lone WRITE, 5 fewer a batched one).
pub(crate) struct ReadyList {
    slots: Box<[u32; MAX_QPS]>,
    /// Where the first queue pair is, below `MAX_QPS`.
    head: usize,
    len: usize,
}

const _: () = assert!(
    MAX_QPS.is_power_of_two(),
    "the ready list wraps with a mask"
);

impl ReadyList {
    fn new() -> ReadyList {
        ReadyList {
            slots: Box::new([0; MAX_QPS]),
            head: 0,
            len: 0,
        }
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The queue pair whose turn it is.
    #[inline]
    fn front(&self) -> Option<u32> {
        (self.len != 0).then(|| self.slots[self.head])
    }

    #[inline]
    fn pop_front(&mut self) {
        if self.len != 0 {
            self.head = (self.head + 1) % MAX_QPS;
            self.len -= 1;
        }
    }

    /// Puts `slot` last; a queue pair that is on the list already must not be (each slot is
    /// on it once, so the ring has room).
    #[inline]
    fn push_back(&mut self, slot: u32) {
        debug_assert!(self.len < MAX_QPS, "a queue pair on the ready list twice");
        self.slots[(self.head + self.len) % MAX_QPS] = slot;
        self.len += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;
    use pmem::Mapping;
    use proto::transport::{Access, RecvRequest, SgList, WcStatus, WorkRequest};

    /// `len` bytes of fresh anonymous memory, registered on `node` with all access.
    fn register_anonymous(node: &mut RdmaNode, len: usize) -> MrKeys {
        let map = Arc::new(Mapping::anonymous(len).unwrap());
        node.register(map, 0, len, Access::ALL).unwrap()
    }

    /// Sixteen READs of `read` bytes each, side by side, from `src` into `dst`.
    fn sixteen_reads(read: u32, dst: &MrKeys, src: &MrKeys) -> Vec<WorkRequest> {
        (0..16u64)
            .map(|i| {
                let off = i * u64::from(read);
                WorkRequest::read(
                    i,
                    SgList::one(dst.lkey, dst.addr + off, read),
                    src.addr + off,
                    src.rkey,
                )
            })
            .collect()
    }

    fn drain(cq: &mut Cq) -> Vec<WorkCompletion> {
        std::iter::from_fn(|| cq.poll_one()).collect()
    }

    /// The id and status of each completion waiting in `cq`, in order.
    fn outcomes(cq: &mut Cq) -> Vec<(u64, WcStatus)> {
        drain(cq).iter().map(|w| (w.wr_id, w.status)).collect()
    }

    /// `ids`, each a success.
    fn succeeded(ids: impl IntoIterator<Item = u64>) -> Vec<(u64, WcStatus)> {
        ids.into_iter().map(|i| (i, WcStatus::Success)).collect()
    }

    #[test]
    fn staged_completions_reach_their_queue_pair_s_rings_in_order_and_a_stray_one_counts() {
        let mut node = RdmaNode::new(
            EthernetAddress([2, 0, 0, 0, 0, 1]),
            Ipv4Addr::new(10, 9, 0, 1),
        );
        let (mut send_a, mut recv_a, mut both_b) =
            (node.create_cq(16), node.create_cq(16), node.create_cq(16));
        let qp = |qpn| {
            let mut cfg = QpConfig::new(qpn, 0x99);
            cfg.remote_ip = Ipv4Addr::new(10, 9, 0, 2);
            cfg
        };
        let _a = node.add_qp(qp(0x11), &send_a, &recv_a).unwrap();
        let _b = node.add_qp(qp(0x12), &both_b, &both_b).unwrap();
        let wc = |wr_id, qpn, opcode| WorkCompletion {
            wr_id,
            qpn,
            opcode,
            ..WorkCompletion::EMPTY
        };
        // Runs of one ring, a switch of ring within a queue pair, another queue pair, and a
        // completion of no queue pair between two of one run.
        let staged = [
            wc(1, 0x11, WcOpcode::RdmaWrite),
            wc(2, 0x11, WcOpcode::Send),
            wc(3, 0x11, WcOpcode::Recv),
            wc(4, 0x12, WcOpcode::Recv),
            wc(5, 0x12, WcOpcode::Send),
            wc(6, 0x77, WcOpcode::Send),
            wc(7, 0x12, WcOpcode::RdmaRead),
            wc(8, 0x11, WcOpcode::RecvRdmaWithImm),
            wc(9, 0x11, WcOpcode::Send),
        ];
        for w in staged {
            node.staged.push(w);
        }
        node.flush_completions();
        let ids = |cq: &mut Cq| drain(cq).iter().map(|w| w.wr_id).collect::<Vec<_>>();
        assert_eq!(ids(&mut send_a), [1, 2, 9]);
        assert_eq!(ids(&mut recv_a), [3, 8]);
        assert_eq!(ids(&mut both_b), [4, 5, 7]);
        assert_eq!(node.counters.completions, 8);
        assert_eq!(
            node.counters.cq_overruns, 1,
            "the completion of no queue pair"
        );
        assert!(node.staged.is_empty());
        // One at a time (a lone operation's path): the same rings, the same counts.
        for w in staged {
            node.staged.push(w);
            node.flush_completions();
            assert!(node.staged.is_empty());
        }
        assert_eq!(ids(&mut send_a), [1, 2, 9]);
        assert_eq!(ids(&mut recv_a), [3, 8]);
        assert_eq!(ids(&mut both_b), [4, 5, 7]);
        assert_eq!(node.counters.completions, 16);
        assert_eq!(node.counters.cq_overruns, 2);
    }

    #[test]
    fn the_outlook_follows_a_request_in_flight_and_forgets_its_timer_once_acknowledged() {
        let (mut a, mut b) = pair();
        let src = register_anonymous(&mut a.node, 4096);
        let dst = register_anonymous(&mut b.node, 4096);
        assert_eq!(a.node.outlook(0), Outlook::due_in(None), "nothing to do");
        assert!(!a.node.host_work_pending());
        let sgl = proto::transport::SgList::one(src.lkey, src.addr, 64);
        a.qp.post_send(&[WorkRequest::write(1, sgl, dst.addr, dst.rkey, None)])
            .unwrap();
        // Posted, not taken: the worker must not sleep.
        assert!(a.node.host_work_pending());
        a.node.service(0);
        assert!(!a.node.host_work_pending());
        assert_eq!(a.node.outlook(0), Outlook::BUSY, "ready to send");
        let mut frame = vec![0u8; 9000];
        let tx = a.node.poll_transmit(0).expect("the WRITE");
        let len = a.node.emit(&tx, &mut frame).unwrap();
        assert!(
            a.node.poll_transmit(0).is_none(),
            "one packet, and its turn ends"
        );
        // In flight: its retransmission timer is what is due, and the reply is awaited.
        let o = a.node.outlook(1_000);
        let rto = a.node.qp(0x11).unwrap().next_deadline().unwrap();
        assert_eq!(
            o,
            Outlook {
                due_in_ns: Some(rto - 1_000),
                awaits_packets: true
            }
        );
        // Acknowledged: the heap still holds the timer, the outlook drops it.
        b.node.receive(2_000, &frame[..len]);
        b.node.service(2_000);
        let ack = b.node.poll_transmit(2_000).expect("the ACK");
        let len = b.node.emit(&ack, &mut frame).unwrap();
        assert!(b.node.poll_transmit(2_000).is_none());
        a.node.receive(3_000, &frame[..len]);
        // The rest of the worker's iteration: nothing more to send, the completion handed over.
        a.node.service(3_000);
        assert!(a.node.poll_transmit(3_000).is_none());
        a.node.flush_completions();
        assert_eq!(a.node.qp(0x11).unwrap().next_deadline(), None);
        assert_eq!(a.node.timers.len(), 1, "the stale timer is still queued");
        assert_eq!(a.node.outlook(4_000), Outlook::due_in(None));
        assert!(a.node.timers.is_empty(), "and is pruned");
        assert_eq!(a.cq.poll_one().map(|w| w.status), Some(WcStatus::Success));
    }

    /// The ready list is first in, first out across its wrap, holds as many queue pairs as an
    /// engine has, and a pop of an empty list changes nothing.
    #[test]
    fn the_ready_list_keeps_its_order_across_the_wrap() {
        let mut r = ReadyList::new();
        r.pop_front();
        assert!(r.is_empty() && r.front().is_none());
        // Walk the head round the ring once and a bit, three queue pairs taking turns.
        for s in 0..3 {
            r.push_back(s);
        }
        for turn in 0..MAX_QPS as u32 + 5 {
            assert_eq!(r.front(), Some(turn % 3));
            r.pop_front();
            r.push_back(turn % 3);
        }
        // Full: every slot once, in order from the wrapped head.
        while !r.is_empty() {
            r.pop_front();
        }
        for s in 0..MAX_QPS as u32 {
            r.push_back(s);
        }
        for s in 0..MAX_QPS as u32 {
            assert_eq!(r.front(), Some(s));
            r.pop_front();
        }
        assert!(r.is_empty());
    }

    /// A `Tx` stands for the last packet handed out only: an older one is refused by `emit`
    /// with nothing written, has no packet and no length, and the newer one emits its own
    /// frame (its PSN, not the older one's).
    #[test]
    fn a_transmit_handle_kept_past_the_next_poll_is_refused() {
        let (mut a, _b) = pair();
        let src = register_anonymous(&mut a.node, 4096);
        let wrs: Vec<WorkRequest> = (0..2)
            .map(|i| {
                let sgl = proto::transport::SgList::one(src.lkey, src.addr, 64);
                WorkRequest::write(i, sgl, 0x1000, 7, None)
            })
            .collect();
        a.qp.post_send(&wrs).unwrap();
        a.node.service(0);
        let first = a.node.poll_transmit(0).expect("the first WRITE");
        let psn = a.node.packet(&first).expect("the last").fields.psn;
        let second = a.node.poll_transmit(0).expect("the second WRITE");
        assert_ne!(first, second);
        let mut buf = [0xa5u8; 256];
        assert_eq!(a.node.emit(&first, &mut buf), Err(wire::Error::StaleHandle));
        assert!(buf.iter().all(|&b| b == 0xa5), "nothing written");
        assert_eq!(a.node.packet(&first), None);
        assert_eq!(a.node.frame_len(&first), 0);
        let len = a.node.emit(&second, &mut buf).unwrap();
        assert_eq!(len, a.node.frame_len(&second));
        let repr = wire::parse_frame(&buf[..len]).expect("a valid frame").0;
        assert_eq!(repr.bth.psn, (psn + 1) & 0xff_ffff);
    }

    #[test]
    fn write_and_send_between_two_nodes_land_in_the_applications_memory() {
        let (mut a, mut b) = pair();
        let src_map = Arc::new(Mapping::anonymous(10_000).unwrap());
        let dst_map = Arc::new(Mapping::anonymous(10_000).unwrap());
        let src = a
            .node
            .register(src_map.clone(), 0, 10_000, Access::ALL)
            .unwrap();
        let dst = b
            .node
            .register(dst_map.clone(), 0, 10_000, Access::ALL)
            .unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 256) as u8).collect();
        src_map.write(0, &data).unwrap();
        let sgl = proto::transport::SgList::one(src.lkey, src.addr, 10_000);
        a.qp.post_send(&[WorkRequest::write(1, sgl, dst.addr, dst.rkey, None)])
            .unwrap();
        b.qp.post_recv(&[RecvRequest::new(
            9,
            proto::transport::SgList::one(dst.lkey, dst.addr, 100),
        )])
        .unwrap();
        let first100 = proto::transport::SgList::one(src.lkey, src.addr, 100);
        a.qp.post_send(&[WorkRequest::send(2, first100, Some(5))])
            .unwrap();
        let moved = pump(&mut a.node, &mut b.node, 5);
        assert!(moved > 11, "{moved} frames");
        let mut got = vec![0u8; 10_000];
        dst_map.read(0, &mut got).unwrap();
        assert_eq!(
            got, data,
            "WRITE landed in B's mapping, then SEND overwrote the first 100 bytes with the same data"
        );
        let wcs = drain(&mut a.cq);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(1, WcStatus::Success), (2, WcStatus::Success)]
        );
        let recv = b.cq.poll_one().unwrap();
        assert_eq!(
            (recv.wr_id, recv.opcode, recv.byte_len, recv.imm_data),
            (9, WcOpcode::Recv, 100, Some(5))
        );
        assert!(
            a.node.counters.icrc_errors + b.node.counters.icrc_errors > 0,
            "every 5th frame was corrupted, and recovered from"
        );
        assert_eq!(a.node.counters.posted, 2);
        assert_eq!(b.node.counters.posted, 1);
    }

    #[test]
    fn a_pfc_frame_pauses_the_shaper_class_of_its_priority_and_other_mac_control_is_counted() {
        use proto::shaper::ClassConfig;
        let class = |p: Option<u8>| ClassConfig {
            assured_bps: 0,
            ceiling_bps: 100_000_000_000,
            burst_bytes: 65_536,
            strict: false,
            pfc_priority: p,
        };
        let cfg = ShaperConfig::new(vec![class(Some(3)), class(None)]);
        let (mut a, _b) = pair_shaped(256, Some(cfg), |_| {});
        let mut quanta = [0u16; 8];
        quanta[3] = 0xffff;
        let pfc = wire::pfc::PfcRepr {
            src_mac: wire::EthernetAddress([2, 0, 0, 0, 0, 10]),
            enabled: 1 << 3,
            quanta,
        };
        let mut frame = [0u8; wire::pfc::FRAME_LEN];
        pfc.emit(&mut frame).unwrap();
        assert_eq!(a.node.receive(0, &frame), RxOutcome::Dropped);
        assert_eq!(a.node.counters.pfc_frames, 1);
        let sh = a.node.shaper().unwrap();
        assert_eq!(
            (
                sh.class_counters(0).pfc_pauses,
                sh.class_counters(1).pfc_pauses
            ),
            (1, 0)
        );
        // 802.3x PAUSE (opcode 0x0001) to the same address: not honoured, counted.
        frame[14..16].copy_from_slice(&wire::pfc::OPCODE_PAUSE.to_be_bytes());
        a.node.receive(0, &frame);
        assert_eq!(
            (
                a.node.counters.pfc_frames,
                a.node.counters.mac_control_ignored
            ),
            (1, 1)
        );
        assert_eq!(a.node.counters.not_for_us, 0);
    }

    #[test]
    fn a_shaper_paces_reads_in_sub_requests_to_the_absorb_rate() {
        use proto::shaper::ClassConfig;
        // 1 Gbit/s of absorb (8 ns per byte) and a burst of one sub-request's responses (4
        // packets, 16 KiB): a 64 KiB READ asked for whole would be one charge of four times
        // the bucket.
        let absorb_bps = 1_000_000_000;
        let read = 64 * 1024u32;
        let sub = 16 * 1024u32;
        let mtu4k = QpConfig {
            pmtu: proto::transport::Mtu::M4096,
            ..QpConfig::new(1, 2)
        };
        let per_sub = proto::transport::requester::read_response_frames(&mtu4k, sub) as u64;
        let mut cfg = ShaperConfig::new(vec![ClassConfig {
            assured_bps: 0,
            ceiling_bps: 100_000_000_000,
            burst_bytes: 65_536,
            strict: false,
            pfc_priority: None,
        }]);
        cfg.absorb_bps = Some(absorb_bps);
        cfg.absorb_burst_bytes = per_sub;
        assert_eq!(cfg.read_split_packets, 4);
        let (mut a, mut b) = pair_shaped(256, Some(cfg), |c| {
            c.pmtu = proto::transport::Mtu::M4096;
            c.max_in_flight = 1024;
        });
        // A queue pair asking for a class the shaper does not have is refused.
        let cq = a.node.create_cq(4);
        let mut bad = QpConfig::new(0x33, 0x44);
        bad.traffic_class = 1;
        assert!(matches!(
            a.node.add_qp(bad, &cq, &cq),
            Err(AddQpError::NoSuchClass(1, 1))
        ));
        let dst = register_anonymous(&mut a.node, 1 << 20);
        let src_map = Arc::new(Mapping::anonymous(1 << 20).unwrap());
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 13 % 251) as u8).collect();
        src_map.write(0, &data).unwrap();
        let src = b.node.register(src_map, 0, 1 << 20, Access::ALL).unwrap();
        a.qp.post_send(&sixteen_reads(read, &dst, &src)).unwrap();
        // 1 µs per round; count the response bytes A receives per round.
        let mut frame = vec![0u8; 9000];
        let mut arrivals = Vec::new();
        for round in 0..20_000u64 {
            let now = round * 1000;
            let mut moved = 0;
            carry(&mut a.node, &mut b.node, now, 0, &mut moved);
            b.node.service(now);
            while let Some(tx) = b.node.poll_transmit(now) {
                let len = b.node.emit(&tx, &mut frame).unwrap();
                arrivals.push((now, len as u64));
                a.node.receive(now, &frame[..len]);
            }
            a.node.flush_completions();
            if drain(&mut a.cq).len() == 16 {
                break;
            }
        }
        let mut got = vec![0u8; 1 << 20];
        assert!(a.node.mem.read(dst.lkey, 0, &mut got));
        assert!(got == data, "every READ landed");
        // Inbound never ahead of the absorb rate plus the bucket: over every prefix of the run.
        let total: u64 = arrivals.iter().map(|&(_, l)| l).sum();
        assert_eq!(total, 64 * per_sub);
        let mut sum = 0;
        for &(t, l) in &arrivals {
            sum += l;
            assert!(sum <= per_sub + t / 8 + per_sub, "{sum} B by {t} ns");
        }
        // Sixteen READs at 1 Gbit/s take ~8.5 ms: the last arrives no sooner than the rate lets.
        let last = arrivals.last().unwrap().0;
        assert!(last >= 63 * per_sub * 8, "{last}");
        // Four sub-requests per READ, each its own request and its own charge.
        let sh = a.node.shaper().unwrap();
        assert_eq!(a.node.counters.shaper_picks, 64);
        assert_eq!(a.node.counters.shaper_misses, 0);
        assert_eq!(sh.class_counters(0).packets, 64);
        assert_eq!(sh.class_counters(0).response_bytes, 64 * per_sub);
        let ra = a.node.qp(0x11).unwrap().stats();
        assert_eq!(ra.tx_requests, 64, "four READ requests per READ");
        assert_eq!(b.node.qp(0x22).unwrap().stats().read_responses_sent, 256);
        assert!(sh.class_counters(0).waited_in > 0);
        assert_eq!(a.node.retransmissions(), 0);
    }

    #[test]
    fn a_responder_s_read_responses_wait_for_its_class_and_its_acks_never_do() {
        use proto::shaper::ClassConfig;
        // A serves READs under a shaper whose one class is capped at 1 Gbit/s (8 ns per
        // byte) with a 16 KiB burst; B reads 16 x 64 KiB from it and writes to it meanwhile.
        let mut cfg = ShaperConfig::new(vec![ClassConfig {
            assured_bps: 0,
            ceiling_bps: 1_000_000_000,
            burst_bytes: 16 * 1024,
            strict: false,
            pfc_priority: None,
        }]);
        cfg.quantum_bytes = 4096 + 128;
        let (mut a, mut b) = pair_shaped(256, Some(cfg), |c| {
            c.pmtu = proto::transport::Mtu::M4096;
            c.max_in_flight = 1024;
        });
        let read = 64 * 1024u32;
        let src_map = Arc::new(Mapping::anonymous(1 << 20).unwrap());
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 % 253) as u8).collect();
        src_map.write(0, &data).unwrap();
        let src = a.node.register(src_map, 0, 1 << 20, Access::ALL).unwrap();
        let dst = register_anonymous(&mut b.node, 1 << 20);
        let sink = register_anonymous(&mut a.node, 4096);
        let small = register_anonymous(&mut b.node, 4096);
        // A second connection, in the same class, for the WRITE (on the first its ACK would
        // follow the READs' responses by PSN order, as RC requires).
        let mut c2 = QpConfig::new(0x12, 0x23);
        (c2.remote_mac, c2.remote_ip) = (b.node.mac, b.node.ip);
        let mut p2 = c2.mirrored();
        (p2.remote_mac, p2.remote_ip) = (a.node.mac, a.node.ip);
        let cq_a2 = a.node.create_cq(16);
        let mut cq_b2 = b.node.create_cq(16);
        let _qp_a2 = a.node.add_qp(c2, &cq_a2, &cq_a2).unwrap();
        let mut qp_b2 = b.node.add_qp(p2, &cq_b2, &cq_b2).unwrap();
        b.qp.post_send(&sixteen_reads(read, &dst, &src)).unwrap();
        let mut frame = vec![0u8; 9000];
        let (mut response_bytes, mut arrivals) = (0u64, Vec::new());
        let mut write_posted_at = None;
        let mut write_acked_after = None;
        for round in 0..40_000u64 {
            let now = round * 1000;
            let mut moved = 0;
            carry(&mut b.node, &mut a.node, now, 0, &mut moved);
            a.node.service(now);
            while let Some(tx) = a.node.poll_transmit(now) {
                let len = a.node.emit(&tx, &mut frame).unwrap();
                use wire::Opcode::*;
                if matches!(
                    a.node.packet(&tx).expect("the last").fields.opcode,
                    RdmaReadResponseFirst
                        | RdmaReadResponseMiddle
                        | RdmaReadResponseLast
                        | RdmaReadResponseOnly
                ) {
                    response_bytes += len as u64;
                    arrivals.push((now, response_bytes));
                }
                b.node.receive(now, &frame[..len]);
            }
            b.node.flush_completions();
            // Halfway through the READs, one WRITE: its ACK must not queue behind them.
            if round == 2000 {
                let w = WorkRequest::write(
                    100,
                    proto::transport::SgList::one(small.lkey, small.addr, 64),
                    sink.addr,
                    sink.rkey,
                    None,
                );
                qp_b2.post_send(&[w]).unwrap();
                write_posted_at = Some(now);
            }
            for wc in drain(&mut b.cq) {
                assert_eq!(wc.status, WcStatus::Success);
            }
            for wc in drain(&mut cq_b2) {
                assert_eq!((wc.wr_id, wc.status), (100, WcStatus::Success));
                write_acked_after = Some(now - write_posted_at.unwrap());
            }
            if b.node.qp(0x22).unwrap().requester().outstanding() == 0
                && write_acked_after.is_some()
                && response_bytes > 0
                && !b.node.qp(0x22).unwrap().has_requests()
            {
                break;
            }
        }
        let mut got = vec![0u8; 1 << 20];
        assert!(b.node.mem.read(dst.lkey, 0, &mut got));
        assert!(got == data, "every READ landed");
        // The READ responses never went faster than the class's ceiling plus its burst.
        for &(t, sum) in &arrivals {
            assert!(
                sum <= 16 * 1024 + 4200 + t / 8,
                "{sum} B of responses by {t} ns"
            );
        }
        let (last, total) = *arrivals.last().unwrap();
        assert!(
            last >= (total - 16 * 1024 - 4200) * 8,
            "{total} B by {last} ns: too fast"
        );
        // The WRITE's ACK came back within a few rounds, the READs still being answered.
        let acked = write_acked_after.expect("the WRITE completed");
        assert!(acked <= 10_000, "the WRITE waited {acked} ns for its ACK");
        assert!(
            write_posted_at.unwrap() + acked < last,
            "it was acknowledged mid-READs"
        );
        assert_eq!(a.node.counters.shaper_read_responses, 256);
        assert_eq!(a.node.counters.shaper_picks, 0, "A sent no requests");
        assert_eq!(a.node.shaper().unwrap().class_counters(0).packets, 256);
        // Each response charged its frame bytes exactly (the peek is what goes out).
        assert_eq!(a.node.shaper().unwrap().class_counters(0).bytes, total);
        assert!(a.node.shaper().unwrap().class_counters(0).waited_out > 0);
        assert_eq!(b.node.retransmissions(), 0);
    }

    #[test]
    fn two_workers_of_a_port_hold_its_rate_between_them() {
        use proto::shaper::{ClassConfig, PortShares};
        // Two engines (a port's two workers), each with the port's shaper: one class capped
        // at 1 Gbit/s (8 ns per byte) for the port. Each WRITEs to its own peer for 4 ms.
        let shares = PortShares::new(2, 1);
        let mut ends: Vec<(End, End)> = (0..2)
            .map(|i| {
                let cfg = ShaperConfig::new(vec![ClassConfig {
                    assured_bps: 0,
                    ceiling_bps: 1_000_000_000,
                    burst_bytes: 16_384,
                    strict: false,
                    pfc_priority: None,
                }]);
                let (mut a, b) = pair_shaped(256, Some(cfg), |c| c.max_in_flight = 1024);
                assert!(a.node.share_shaper_port(shares.clone(), i));
                (a, b)
            })
            .collect();
        let mut regions = Vec::new();
        for (a, b) in &mut ends {
            let src = register_anonymous(&mut a.node, 1 << 20);
            let dst = register_anonymous(&mut b.node, 1 << 20);
            let wrs: Vec<WorkRequest> = (0..64u64)
                .map(|i| {
                    WorkRequest::write(
                        i,
                        SgList::one(src.lkey, src.addr + i * 16_384, 16_384),
                        dst.addr + i * 16_384,
                        dst.rkey,
                        None,
                    )
                })
                .collect();
            a.qp.post_send(&wrs).unwrap();
            regions.push((src, dst));
        }
        let mut frame = vec![0u8; 9000];
        let mut sent = [0u64; 2];
        for round in 0..4_000u64 {
            let now = round * 1000;
            for (k, (a, b)) in ends.iter_mut().enumerate() {
                a.node.service(now);
                while let Some(tx) = a.node.poll_transmit(now) {
                    let len = a.node.emit(&tx, &mut frame).unwrap();
                    sent[k] += len as u64;
                    b.node.receive(now, &frame[..len]);
                }
                let mut moved = 0;
                carry(&mut b.node, &mut a.node, now, 0, &mut moved);
                a.node.flush_completions();
                drain(&mut a.cq);
            }
        }
        // 1 Gbit/s for 4 ms is 500 000 bytes for the port (plus a burst each), not per worker.
        let port = 500_000f64;
        let total = (sent[0] + sent[1]) as f64;
        assert!((total - port).abs() <= port * 0.1, "{sent:?}");
        for s in sent {
            assert!((s as f64 - port / 2.0).abs() <= port * 0.1, "{sent:?}");
        }
    }

    #[test]
    fn multi_packet_reads_need_no_retransmission_on_a_clean_wire() {
        let (mut a, mut b) = pair();
        let dst = register_anonymous(&mut a.node, 1 << 20);
        let src = register_anonymous(&mut b.node, 1 << 20);
        let wrs: Vec<WorkRequest> = (0..16u64)
            .map(|i| {
                WorkRequest::read(
                    i,
                    proto::transport::SgList::one(dst.lkey, dst.addr + i * 16384, 16384),
                    src.addr + i * 16384,
                    src.rkey,
                )
            })
            .collect();
        a.qp.post_send(&wrs).unwrap();
        pump(&mut a.node, &mut b.node, 0);
        let wcs = drain(&mut a.cq);
        assert_eq!(wcs.len(), 16);
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
        assert_eq!(a.node.retransmissions(), 0);
    }

    #[test]
    fn a_completion_queue_the_host_does_not_poll_holds_work_back_and_loses_nothing() {
        let (mut a, mut b) = pair_with_cq(4);
        let map = Arc::new(Mapping::anonymous(4096).unwrap());
        let src = a.node.register(map.clone(), 0, 4096, Access::ALL).unwrap();
        let dst = b.node.register(map, 0, 4096, Access::ALL).unwrap();
        let wrs: Vec<WorkRequest> = (0..10u64)
            .map(|i| {
                WorkRequest::write(
                    i,
                    proto::transport::SgList::one(src.lkey, src.addr, 8),
                    dst.addr,
                    dst.rkey,
                    None,
                )
            })
            .collect();
        a.qp.post_send(&wrs).unwrap();
        pump(&mut a.node, &mut b.node, 0);
        assert_eq!(
            a.node.counters.posted, 4,
            "only as many as there are CQ slots"
        );
        assert!(a.node.counters.cq_full > 0 && a.cq.full_stalls() > 0);
        let mut got = Vec::new();
        for _ in 0..10 {
            got.extend(drain(&mut a.cq).iter().map(|w| w.wr_id));
            pump(&mut a.node, &mut b.node, 0);
        }
        assert_eq!(
            got,
            (0..10).collect::<Vec<_>>(),
            "every one completes, in order"
        );
        assert_eq!(a.node.counters.cq_overruns, 0);
    }

    /// A send queue full of requests in flight: what the host posts meanwhile waits in its
    /// ring (the post refused for want of room, the queue pair on the backlog), and every
    /// request completes, in order, once the ACKs come.
    #[test]
    fn requests_wait_in_the_ring_while_the_send_queue_is_full_and_all_complete() {
        let (mut a, mut b) = pair_with(256, |cfg| cfg.max_send_wr = 4);
        let map = Arc::new(Mapping::anonymous(4096).unwrap());
        map.write(0, &(0..64u8).collect::<Vec<_>>()).unwrap();
        let src = a.node.register(map.clone(), 0, 64, Access::ALL).unwrap();
        let dst = b.node.register(map.clone(), 2048, 64, Access::ALL).unwrap();
        let write = |i: u64| {
            WorkRequest::write(
                i,
                proto::transport::SgList::one(src.lkey, src.addr + 8 * i, 8),
                dst.addr + 8 * i,
                dst.rkey,
                None,
            )
        };
        let first: Vec<WorkRequest> = (0..4).map(write).collect();
        a.qp.post_send(&first).unwrap();
        // A sends, B hears nothing yet: four requests in flight fill the send queue.
        a.node.service(0);
        while let Some(tx) = a.node.poll_transmit(0) {
            let mut frame = vec![0u8; a.node.frame_len(&tx)];
            a.node.emit(&tx, &mut frame).unwrap();
        }
        assert_eq!(a.node.counters.posted, 4);
        let second: Vec<WorkRequest> = (4..8).map(write).collect();
        a.qp.post_send(&second).unwrap();
        a.node.service(1_000);
        assert_eq!(
            a.node.counters.posted, 4,
            "the queue is full: the rest wait"
        );
        assert_eq!(a.node.backlog, [0], "the queue pair waits on the backlog");
        // The copies in flight were lost; the timeout resends them, B answers, the rest go.
        let mut moved = 0;
        for round in 0..50u64 {
            let now = 1_000_000_000 + round * 1_000_000;
            carry(&mut a.node, &mut b.node, now, 0, &mut moved);
            carry(&mut b.node, &mut a.node, now, 0, &mut moved);
        }
        assert_eq!(a.node.counters.posted, 8);
        assert_eq!(outcomes(&mut a.cq), succeeded(0..8));
        let mut landed = [0u8; 64];
        map.read(2048, &mut landed).unwrap();
        assert_eq!(landed.to_vec(), (0..64u8).collect::<Vec<_>>());
    }

    /// A queue pair leaves the ready list with its last packet, not in a later call that
    /// finds nothing; one that still has something to send (a request behind its ACK, the
    /// rest of a burst) stays; new work brings it back.
    #[test]
    fn a_queue_pair_leaves_the_ready_list_with_its_last_packet_and_new_work_brings_it_back() {
        let (mut a, mut b) = pair();
        let map = Arc::new(Mapping::anonymous(4096).unwrap());
        map.write(0, &(0..64u8).collect::<Vec<_>>()).unwrap();
        let src_a = a.node.register(map.clone(), 0, 64, Access::ALL).unwrap();
        let dst_a = a.node.register(map.clone(), 1024, 64, Access::ALL).unwrap();
        let src_b = b.node.register(map.clone(), 0, 64, Access::ALL).unwrap();
        let dst_b = b.node.register(map.clone(), 2048, 64, Access::ALL).unwrap();
        let write = |i: u64, src: &MrKeys, dst: &MrKeys| {
            WorkRequest::write(
                i,
                proto::transport::SgList::one(src.lkey, src.addr + 8 * i, 8),
                dst.addr + 8 * i,
                dst.rkey,
                None,
            )
        };
        let mut frame = vec![0u8; 512];
        let mut send = |from: &mut RdmaNode, to: &mut RdmaNode, now: u64| {
            let tx = from.poll_transmit(now).expect("a packet");
            let len = from.emit(&tx, &mut frame).unwrap();
            assert_eq!(to.receive(now, &frame[..len]), RxOutcome::Delivered);
        };
        // A burst of two: the queue pair stays for the second, and leaves with it.
        a.qp.post_send(&[write(0, &src_a, &dst_b), write(1, &src_a, &dst_b)])
            .unwrap();
        a.node.service(1_000);
        send(&mut a.node, &mut b.node, 1_000);
        assert_eq!(a.node.ready.front(), Some(0), "one more request to send");
        send(&mut a.node, &mut b.node, 1_000);
        assert!(a.node.ready.is_empty(), "left with its last packet");
        assert!(!a.node.qps.entries[0].ready);
        assert!(a.node.poll_transmit(1_000).is_none());
        // B owes an ACK and has a request of its own: it stays after the ACK.
        b.qp.post_send(&[write(0, &src_b, &dst_a)]).unwrap();
        b.node.service(2_000);
        send(&mut b.node, &mut a.node, 2_000);
        assert_eq!(
            a.node.qp(0x11).unwrap().requester().in_flight(),
            0,
            "the ACK"
        );
        assert_eq!(b.node.ready.front(), Some(0), "its WRITE is still to go");
        send(&mut b.node, &mut a.node, 2_000);
        assert!(b.node.ready.is_empty(), "left with its WRITE");
        assert!(b.node.poll_transmit(2_000).is_none());
        // A owes B an ACK now: it is back on the list, sends it and leaves.
        a.node.service(3_000);
        assert_eq!(a.node.ready.front(), Some(0));
        send(&mut a.node, &mut b.node, 3_000);
        assert!(a.node.ready.is_empty(), "left with its ACK");
        // A new post brings A back.
        a.qp.post_send(&[write(2, &src_a, &dst_b)]).unwrap();
        a.node.service(4_000);
        send(&mut a.node, &mut b.node, 4_000);
        assert!(a.node.ready.is_empty());
        b.node.service(4_000);
        send(&mut b.node, &mut a.node, 4_000);
        a.node.flush_completions();
        b.node.flush_completions();
        assert_eq!(outcomes(&mut a.cq), succeeded([0, 1, 2]));
        assert_eq!(outcomes(&mut b.cq), succeeded([0]));
        let mut landed = [0u8; 24];
        map.read(2048, &mut landed).unwrap();
        assert_eq!(landed.to_vec(), (0..24u8).collect::<Vec<_>>());
        map.read(1024, &mut landed[..8]).unwrap();
        assert_eq!(landed[..8].to_vec(), (0..8u8).collect::<Vec<_>>());
    }

    /// The timer heap hears of a queue pair after a request goes out (the retransmission
    /// timer starts), not after a request comes in or a response goes out, which move no
    /// deadline of its requester; a request lost on the wire is still sent again when its
    /// timer expires, and completes once.
    #[test]
    fn requests_sent_arm_the_timer_and_requests_received_and_acks_sent_do_not() {
        let (mut a, mut b) = pair();
        let map = Arc::new(Mapping::anonymous(4096).unwrap());
        map.write(0, &[0x3c; 16]).unwrap();
        let src = a.node.register(map.clone(), 0, 16, Access::ALL).unwrap();
        let dst = b.node.register(map.clone(), 2048, 16, Access::ALL).unwrap();
        let write = WorkRequest::write(
            7,
            proto::transport::SgList::one(src.lkey, src.addr, 16),
            dst.addr,
            dst.rkey,
            None,
        );
        let mut frame = vec![0u8; 512];
        a.qp.post_send(&[write]).unwrap();
        a.node.service(1_000);
        let tx = a.node.poll_transmit(1_000).expect("the WRITE");
        let len = a.node.emit(&tx, &mut frame).unwrap();
        assert_eq!(
            a.node.touched,
            [0],
            "a request went: its timer is to be armed"
        );
        // The frame is lost. The next iteration puts the deadline in the heap.
        a.node.service(2_000);
        assert!(a.node.touched.is_empty());
        let (due, _) = a.node.timers.peek().expect("the retransmission timer").0;
        assert!(due > 2_000);
        // Past the deadline the WRITE goes again, and B hears it.
        a.node.service(due);
        let tx = a.node.poll_transmit(due).expect("the WRITE, again");
        let again = a.node.emit(&tx, &mut frame).unwrap();
        assert_eq!(again, len);
        assert_eq!(b.node.receive(due, &frame[..len]), RxOutcome::Delivered);
        assert!(b.node.touched.is_empty(), "a request received arms nothing");
        assert_eq!(b.node.ready.front(), Some(0), "B owes an ACK");
        b.node.service(due);
        let tx = b.node.poll_transmit(due).expect("the ACK");
        let len = b.node.emit(&tx, &mut frame).unwrap();
        assert!(b.node.touched.is_empty(), "an ACK sent arms nothing");
        assert_eq!(a.node.receive(due, &frame[..len]), RxOutcome::Delivered);
        a.node.flush_completions();
        assert_eq!(outcomes(&mut a.cq), succeeded([7]));
        let mut landed = [0u8; 16];
        map.read(2048, &mut landed).unwrap();
        assert_eq!(landed, [0x3c; 16]);
    }

    /// A response that leaves its queue pair without a deadline takes back the touch its
    /// request's send left; one that leaves a deadline keeps it, and the heap gets it.
    #[test]
    fn an_ack_that_leaves_no_deadline_takes_back_its_send_s_touch() {
        let (mut a, mut b) = pair();
        let map = Arc::new(Mapping::anonymous(4096).unwrap());
        let src = a.node.register(map.clone(), 0, 64, Access::ALL).unwrap();
        let dst = b.node.register(map.clone(), 2048, 64, Access::ALL).unwrap();
        let write = |id: u64| {
            let sgl = proto::transport::SgList::one(src.lkey, src.addr + 16 * (id - 1), 16);
            WorkRequest::write(id, sgl, dst.addr + 16 * (id - 1), dst.rkey, None)
        };
        let mut frame = vec![0u8; 512];
        let mut ack_for = |a: &mut End, b: &mut End, now: u64, sent: &[u8]| {
            assert_eq!(b.node.receive(now, sent), RxOutcome::Delivered);
            b.node.service(now);
            let tx = b.node.poll_transmit(now).expect("the ACK");
            let len = b.node.emit(&tx, &mut frame).unwrap();
            assert_eq!(a.node.receive(now, &frame[..len]), RxOutcome::Delivered);
        };
        // A lone WRITE, its ACK before A's next iteration: nothing left to arm.
        a.qp.post_send(&[write(1)]).unwrap();
        a.node.service(1_000);
        let tx = a.node.poll_transmit(1_000).expect("WRITE 1");
        let mut sent = vec![0u8; 512];
        let len = a.node.emit(&tx, &mut sent).unwrap();
        assert_eq!(a.node.touched, [0]);
        ack_for(&mut a, &mut b, 1_000, &sent[..len]);
        assert!(a.node.touched.is_empty(), "taken back");
        assert!(!a.node.qps.entries[0].arm_due);
        a.node.service(2_000);
        assert!(a.node.timers.is_empty(), "nothing armed");
        // Two WRITEs, the ACK of the first only: the second's deadline is armed.
        a.qp.post_send(&[write(2), write(3)]).unwrap();
        a.node.service(3_000);
        let tx = a.node.poll_transmit(3_000).expect("WRITE 2");
        let len = a.node.emit(&tx, &mut sent).unwrap();
        let first = sent[..len].to_vec();
        let tx = a.node.poll_transmit(3_000).expect("WRITE 3");
        a.node.emit(&tx, &mut sent).unwrap();
        ack_for(&mut a, &mut b, 3_000, &first);
        assert_eq!(a.node.touched, [0], "a deadline is left: kept");
        a.node.service(4_000);
        let (due, _) = a.node.timers.peek().expect("WRITE 3's timer").0;
        assert!(due > 4_000);
        a.node.flush_completions();
        assert_eq!(outcomes(&mut a.cq), succeeded([1, 2]));
    }

    /// One request at a time takes `take_from`'s path for a lone request: held while the
    /// completion queue has no slot (counted), taken once the host frees one, and its bytes
    /// land.
    #[test]
    fn a_lone_request_waits_for_a_completion_slot_and_goes_once_one_is_free() {
        let (mut a, mut b) = pair_with_cq(1);
        let map = Arc::new(Mapping::anonymous(4096).unwrap());
        map.write(0, &[0x5a; 16]).unwrap();
        let src = a.node.register(map.clone(), 0, 16, Access::ALL).unwrap();
        let dst = b.node.register(map.clone(), 2048, 16, Access::ALL).unwrap();
        let write = |i: u64| {
            WorkRequest::write(
                i,
                proto::transport::SgList::one(src.lkey, src.addr, 8),
                dst.addr + 8 * i,
                dst.rkey,
                None,
            )
        };
        a.qp.post_send(&[write(0)]).unwrap();
        pump(&mut a.node, &mut b.node, 0);
        assert_eq!(a.node.counters.posted, 1);
        // The first completion sits in the ring, unpolled: the second request waits.
        a.qp.post_send(&[write(1)]).unwrap();
        pump(&mut a.node, &mut b.node, 0);
        assert_eq!(a.node.counters.posted, 1, "held for want of a slot");
        assert!(a.node.counters.cq_full > 0);
        let first: Vec<u64> = drain(&mut a.cq).iter().map(|w| w.wr_id).collect();
        assert_eq!(first, [0]);
        pump(&mut a.node, &mut b.node, 0);
        assert_eq!(a.node.counters.posted, 2, "taken once the slot is free");
        assert_eq!(outcomes(&mut a.cq), succeeded([1]));
        let mut landed = [0u8; 16];
        map.read(2048, &mut landed).unwrap();
        assert_eq!(landed, [0x5a; 16]);
        assert_eq!(a.node.counters.cq_overruns, 0);
    }

    #[test]
    fn a_send_refused_for_want_of_a_receive_goes_through_once_one_is_posted() {
        let (mut a, mut b) = pair();
        let map = Arc::new(Mapping::anonymous(4096).unwrap());
        let src = a.node.register(map.clone(), 0, 64, Access::ALL).unwrap();
        let dst = b.node.register(map, 64, 64, Access::ALL).unwrap();
        let sgl = proto::transport::SgList::one(src.lkey, src.addr, 64);
        a.qp.post_send(&[WorkRequest::send(1, sgl, None)]).unwrap();
        // No receive on B: an RNR NAK, and A waits out the RNR timer (its deadline stays due
        // until A transmits again, which once made the timer pass spin forever).
        let mut moved = 0;
        for round in 0..3u64 {
            // 20 µs apart: past each RNR wait (timer code 1: 10 µs).
            let now = round * 20_000;
            carry(&mut a.node, &mut b.node, now, 0, &mut moved);
            carry(&mut b.node, &mut a.node, now, 0, &mut moved);
        }
        let rnr = a.node.qp(0x11).unwrap().stats().rnr_naks_received;
        assert!((2..=3).contains(&rnr), "{rnr} RNR NAKs");
        assert!(a.cq.poll_one().is_none(), "still waiting, not failed");
        b.qp.post_recv(&[RecvRequest::new(
            7,
            proto::transport::SgList::one(dst.lkey, dst.addr, 64),
        )])
        .unwrap();
        for _ in 0..20 {
            pump(&mut a.node, &mut b.node, 0);
        }
        let wc = a.cq.poll_one().expect("the SEND completes");
        assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
        let wc = b.cq.poll_one().expect("the receive completes");
        assert_eq!((wc.wr_id, wc.byte_len), (7, 64));
    }

    #[test]
    fn qpns_index_directly_even_when_low_bits_collide() {
        let mut n = RdmaNode::new(EthernetAddress([2, 0, 0, 0, 0, 1]), Ipv4Addr::LOCALHOST);
        let cq = n.create_cq(16);
        let qpns = [0x11, 0x51, 0x1011, 0x22, 0xff_ffff, 0x40];
        for &q in &qpns {
            n.add_qp(QpConfig::new(q, 1), &cq, &cq).unwrap();
        }
        for &q in &qpns {
            assert_eq!(n.qp(q).unwrap().config().local_qpn, q);
        }
        assert!(n.qp(0x12).is_none());
        assert!(matches!(
            n.add_qp(QpConfig::new(0x51, 1), &cq, &cq),
            Err(AddQpError::DuplicateQpn(0x51))
        ));
        // A completion queue of another engine, even one with a valid index here, is refused.
        let mut other = RdmaNode::new(EthernetAddress([2, 0, 0, 0, 0, 2]), Ipv4Addr::LOCALHOST);
        let foreign = other.create_cq(16);
        assert_eq!(foreign.id(), cq.id());
        assert!(matches!(
            n.add_qp(QpConfig::new(0x99, 1), &foreign, &cq),
            Err(AddQpError::UnknownCq(0))
        ));
    }

    #[test]
    fn a_packet_for_a_queue_pair_homed_on_another_shard_is_counted_as_wrong_core() {
        let (mut a, b) = pair();
        // Another shard of B's engine: same address, without B's queue pair but told of it.
        let mut other = RdmaNode::new(b.node.mac, b.node.ip);
        let map = Arc::new(Mapping::anonymous(64).unwrap());
        let src = a.node.register(map, 0, 64, Access::ALL).unwrap();
        let sgl = proto::transport::SgList::one(src.lkey, src.addr, 64);
        a.qp.post_send(&[WorkRequest::send(1, sgl, None)]).unwrap();
        a.node.service(0);
        let tx = a.node.poll_transmit(0).expect("the SEND");
        let mut frame = vec![0u8; 2048];
        let len = a.node.emit(&tx, &mut frame).unwrap();
        assert_eq!(other.receive(0, &frame[..len]), RxOutcome::Dropped);
        assert_eq!(
            (other.counters.unknown_qp, other.counters.wrong_core),
            (1, 0)
        );
        other.add_qp_homed_elsewhere(0x22);
        other.add_qp_homed_elsewhere(0x22);
        assert_eq!(other.receive(0, &frame[..len]), RxOutcome::Dropped);
        assert_eq!(
            (other.counters.unknown_qp, other.counters.wrong_core),
            (1, 1)
        );
        assert_eq!(other.counters.delivered, 0);
    }

    /// Nodes A (10.9.0.1) and B (10.9.0.2), with no queue pair yet.
    fn two_nodes() -> (RdmaNode, RdmaNode) {
        let a = RdmaNode::new(
            EthernetAddress([2, 0, 0, 0, 0, 1]),
            Ipv4Addr::new(10, 9, 0, 1),
        );
        let b = RdmaNode::new(
            EthernetAddress([2, 0, 0, 0, 0, 2]),
            Ipv4Addr::new(10, 9, 0, 2),
        );
        (a, b)
    }

    /// The ingress queue's depth the node is told reaches the queue pair at each packet, and
    /// so the CETH of its ACK; with no depth told, none is reported.
    #[test]
    fn the_ingress_queue_s_depth_reaches_the_ceth_of_the_ack() {
        use proto::cc::{CcMode, EcnScope};
        for told in [None, Some(30_000)] {
            let (mut a, mut b) = two_nodes();
            let (cq_a, cq_b) = (a.create_cq(16), b.create_cq(16));
            let mut cfg = QpConfig::new(0x11, 0x22);
            (cfg.remote_mac, cfg.remote_ip) = (b.mac, b.ip);
            cfg.cc.mode = CcMode::Ack;
            cfg.cc.ack.scope = EcnScope::QueuePair;
            let mut peer = cfg.mirrored();
            (peer.remote_mac, peer.remote_ip) = (a.mac, a.ip);
            let mut qa = a.add_qp(cfg, &cq_a, &cq_a).unwrap();
            b.add_qp(peer, &cq_b, &cq_b).unwrap();
            b.set_ingress_queue(told);
            let src = register_anonymous(&mut a, 4096);
            let dst = register_anonymous(&mut b, 4096);
            let sgl = proto::transport::SgList::one(src.lkey, src.addr, 64);
            qa.post_send(&[WorkRequest::write(1, sgl, dst.addr, dst.rkey, None)])
                .unwrap();
            let mut frame = vec![0u8; 9000];
            a.service(0);
            let tx = a.poll_transmit(0).expect("the WRITE");
            let len = a.emit(&tx, &mut frame).unwrap();
            // Marked: B's ACK says it is congested, with a CETH.
            let mut p = wire::RocePacket::new_checked(&mut frame[..len]).unwrap();
            p.ipv4_mut().set_ecn(wire::Ecn::Ce);
            p.ipv4_mut().fill_checksum();
            assert_eq!(b.receive(0, &frame[..len]), RxOutcome::Delivered);
            b.service(0);
            let tx = b.poll_transmit(0).expect("the ACK");
            let len = b.emit(&tx, &mut frame).unwrap();
            let (ack, _) = wire::parse_frame(&frame[..len]).unwrap();
            let ceth = ack.ceth.expect("a CETH while congested");
            assert_eq!(ceth.queue_bytes, told, "told {told:?}");
        }
    }

    #[test]
    fn a_change_of_the_ports_ecn_level_is_told_by_every_queue_pair_that_follows_the_port() {
        use proto::cc::CcMode;
        let (mut a, mut b) = two_nodes();
        let (cq_a, cq_b) = (a.create_cq(256), b.create_cq(256));
        let mut qps = Vec::new();
        for (local, remote) in [(0x11, 0x22), (0x13, 0x24)] {
            let mut cfg = QpConfig::new(local, remote);
            cfg.remote_mac = b.mac;
            cfg.remote_ip = b.ip;
            cfg.cc.mode = CcMode::Ack;
            let mut peer = cfg.mirrored();
            peer.remote_mac = a.mac;
            peer.remote_ip = a.ip;
            let qa = a.add_qp(cfg, &cq_a, &cq_a).unwrap();
            b.add_qp(peer, &cq_b, &cq_b).unwrap();
            qps.push(qa);
        }
        assert!(b.qp(0x22).unwrap().port_scoped_ecn() && b.qp(0x24).unwrap().port_scoped_ecn());
        let src = register_anonymous(&mut a, 4096);
        let dst = register_anonymous(&mut b, 4096);
        let write = |id| {
            let sgl = proto::transport::SgList::one(src.lkey, src.addr, 64);
            WorkRequest::write(id, sgl, dst.addr, dst.rkey, None)
        };
        // Frames from A to B, each marked CE when `mark`; what B sends back, by B's slot.
        let mut frame = vec![0u8; 9000];
        let mut exchange = |a: &mut RdmaNode, b: &mut RdmaNode, now: u64, mark: bool| {
            let mut from_b = [0usize; 2];
            a.service(now);
            while let Some(tx) = a.poll_transmit(now) {
                let len = a.emit(&tx, &mut frame).unwrap();
                if mark {
                    let mut p = wire::RocePacket::new_checked(&mut frame[..len]).unwrap();
                    p.ipv4_mut().set_ecn(wire::Ecn::Ce);
                    p.ipv4_mut().fill_checksum();
                }
                assert_eq!(b.receive(now, &frame[..len]), RxOutcome::Delivered);
            }
            b.service(now);
            while let Some(tx) = b.poll_transmit(now) {
                let len = b.emit(&tx, &mut frame).unwrap();
                from_b[tx.qp as usize] += 1;
                a.receive(now, &frame[..len]);
            }
            a.flush_completions();
            b.flush_completions();
            from_b
        };
        // Both of B's queue pairs receive something, unmarked.
        qps[0].post_send(&[write(1)]).unwrap();
        qps[1].post_send(&[write(2)]).unwrap();
        assert_eq!(exchange(&mut a, &mut b, 0, false), [1, 1]);
        // Then only the first one's packets arrive, all marked: the port's level rises, and
        // the second queue pair, which received nothing new, says so in an ACK of its own.
        let mut told = 0;
        for k in 0..8u64 {
            qps[0].post_send(&[write(10 + k)]).unwrap();
            let from_b = exchange(&mut a, &mut b, 1_000 * (k + 1), true);
            assert_eq!(from_b[0], 1, "each WRITE acknowledged");
            told += from_b[1];
        }
        assert!(told > 0, "the idle queue pair told the port's level");
        assert!(b.qp(0x22).unwrap().stats().ce_received > 0);
        assert_eq!(b.qp(0x24).unwrap().stats().ce_received, 0);
    }

    #[test]
    fn a_destroyed_queue_pair_s_counts_stay_in_the_engine_s_sums() {
        let (mut a, _b) = pair();
        let src = register_anonymous(&mut a.node, 4096);
        let wr = WorkRequest::write(1, SgList::one(src.lkey, src.addr, 64), 0x1000, 7, None);
        a.qp.post_send(&[wr]).unwrap();
        // The WRITE goes out and is lost; its timer sends it again.
        let mut buf = vec![0u8; 9000];
        let mut send_all = |node: &mut RdmaNode, now: u64| {
            node.service(now);
            while let Some(tx) = node.poll_transmit(now) {
                node.emit(&tx, &mut buf).unwrap();
            }
        };
        send_all(&mut a.node, 0);
        let due = a.node.qp(0x11).unwrap().next_deadline().unwrap();
        send_all(&mut a.node, due);
        assert_eq!(a.node.retransmissions(), 1);
        assert!(a.node.destroy_qp(0x11));
        assert_eq!(
            a.node.retransmissions(),
            1,
            "kept after the queue pair is gone"
        );
        // A new queue pair takes the slot; the sum still holds the destroyed one's.
        let cq = a.node.create_cq(16);
        a.node.add_qp(QpConfig::new(0x33, 0x44), &cq, &cq).unwrap();
        assert_eq!(a.node.qp_count(), 1);
        assert_eq!(a.node.retransmissions(), 1, "kept after its slot is reused");
    }

    #[test]
    fn arp_and_strangers_are_handled_and_counted() {
        let (mut a, _) = pair();
        #[rustfmt::skip]
        let request: [u8; 42] = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 9, 0x08, 0x06,
            0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 9, 10, 9, 0, 9,
            0, 0, 0, 0, 0, 0, 10, 9, 0, 1,
        ];
        let RxOutcome::ArpReply(n) = a.node.receive(0, &request) else {
            panic!("no ARP reply")
        };
        assert_eq!(&a.node.arp_reply(n)[..6], &[2, 0, 0, 0, 0, 9]);
        assert_eq!(a.node.receive(0, &[0u8; 3]), RxOutcome::Dropped);
        assert_eq!(a.node.receive(0, &request[..30]), RxOutcome::Dropped);
        assert_eq!(a.node.counters.arp_replies, 1);
        assert_eq!(a.node.counters.rx_frames, 3);
        assert_eq!(a.node.counters.malformed + a.node.counters.not_for_us, 2);
    }
}
