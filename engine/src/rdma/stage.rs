//! [`RdmaNode`]s on a worker: mbufs in, mbufs out.
//!
//! On RX every frame goes to the node, which places payload straight into the application's
//! registered memory; the mbuf is freed right after. ARP replies are built into fresh mbufs.
//! On every poll the stage, per engine:
//! - serves the control path (registration, deregistration);
//! - lets the node take the doorbells the host rang, fire its timers and finish
//!   deregistrations;
//! - emits what the ready queue pairs want to send, straight from the application's memory
//!   into fresh mbufs, until the TX burst is full;
//! - hands the iteration's completions to the host's completion rings;
//! - once a millisecond of its clock, publishes its queue pairs' live state ([`super::live`]).
//!
//! The nodes are told the time by a [`WorkerClock`]: the TSC, except that time the worker did
//! not run (descheduled by the kernel, or stuck in a long iteration) counts for little, so that
//! the transport's retransmission timers measure the peer's silence, not the worker's own.

use std::sync::Arc;

use super::ControlPort;
use super::live::LIVE_EVERY_NS;
use super::rings;
use super::{RdmaNode, RxOutcome};
use crate::dataplane::wake::Wake;
use crate::dataplane::{Burst, Mempool, rdtsc, tsc_hz};
use crate::runtime::{Counters, Outlook, Outputs, Polling, Stage, polling};
use node::cm::Qp1Counters;
use node::{CcCounters, NodeCounters, TagCounters};
use portico_counters::NameMap;
use proto::cm::CmCounters;

crate::counter_set! {
    /// The stage's counters, declared once: the slots (`Counters::stage`, [`RdmaSlot`]), the
    /// names the reports, the JSON and telemetry carry, and how they combine all follow this
    /// list. First the nodes' (combined over the engines, see [`RdmaStage::publish`]), then
    /// the stage's own.
    pub struct RdmaCounters, slots RdmaSlot {
        /// RoCEv2 packets handed to a queue pair.
        delivered: Sum,
        /// Frames whose ICRC did not match.
        icrc_errors: Sum,
        /// RoCEv2 frames that failed another check (length, checksum, opcode, ...).
        malformed: Sum,
        /// Frames that are not RoCEv2 or ARP for us.
        not_for_us: Sum,
        /// RoCEv2 packets to a QPN no queue pair of the engine has.
        unknown_qp: Sum,
        /// Unicast frames to another host's MAC address.
        wrong_mac: Sum,
        /// Frames with an 802.1Q/802.1ad VLAN tag.
        vlan_tagged: Sum,
        /// IPv4 packets with options.
        ip_options: Sum,
        /// IPv4 fragments.
        ip_fragments: Sum,
        /// Packets of another transport service (UC, RD, UD, XRC).
        wrong_transport: Sum,
        /// Packets whose P_Key does not match their queue pair's.
        bad_pkey: Sum,
        /// Packets to a connected queue pair from an address that is not its peer's.
        wrong_source: Sum,
        /// Packets to a queue pair homed on another worker of the engine.
        wrong_core: Sum,
        /// ARP replies sent.
        arp_replies: Sum,
        /// Frames the connection manager took: QP1's, and ARP packets it learned from.
        cm_frames: Sum,
        /// Completions handed to the host.
        completions: Sum,
        /// Packets the queue pairs' requesters sent again.
        retransmissions: Sum,
        /// Times work waited in a host ring for a free completion queue slot.
        cq_full: Sum,
        /// Work requests posted by the host and taken by the worker.
        posted: Sum,
        /// Completions that found their ring full (0 unless the reservation rule is broken).
        cq_overruns: Sum,
        /// Ranges handed to the flusher to persist.
        persist_jobs: Sum,
        /// Persists that failed.
        persist_failures: Sum,
        /// Tagged messages matched on the priority list (0 without tagged messaging).
        tag_matched_priority: Sum,
        /// Tagged messages matched on the overflow list (unexpected messages).
        tag_matched_overflow: Sum,
        /// Tagged messages that matched nothing: consumed, data discarded.
        tag_dropped: Sum,
        /// Tagged messages longer than the buffer they matched.
        tag_truncated: Sum,
        /// Rendezvous pulls of a message's data.
        tag_rendezvous_pulls: Sum,
        /// Tagged messages refused with RNR: no event room or no free record.
        tag_not_ready: Sum,
        /// Tagged messages for an endpoint homed on another engine (refused).
        tag_wrong_engine: Sum,
        /// Tag events the application's ring had no room for.
        tag_events_lost: Sum,
        /// Retransmitted packets the responder already had.
        spurious_retransmissions: Sum,
        /// Packets received marked CE (congestion control, over the queue pairs).
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
        /// Requests the traffic shaper picked (0 on engines without one).
        shaper_picks: Sum,
        /// Picks whose queue pair then had nothing to send.
        shaper_misses: Sum,
        /// 802.1Qbb PFC frames from the link partner (the shaper's classes paused by them).
        pfc_frames: Sum,
        /// MAC control frames other than PFC (802.3x PAUSE included), ignored.
        mac_control_ignored: Sum,
        /// READ response packets the traffic shaper picked (0 on engines without one).
        shaper_read_responses: Sum,
        /// Arbitration steps MCUs waited for inbound (absorb) tokens, over the classes.
        shaper_waited_in: Sum,
        /// Arbitration steps MCUs waited for their outstanding cap, over the classes.
        shaper_waited_cap: Sum,
        /// Steps of the worker's clock longer than 50 µs: times the worker did not run.
        stalls: Sum,
        /// Times no mbuf could be had for a frame to send.
        alloc_failures: Sum,
        /// MADs QP1 handed to the CM.
        mads_received: Sum,
        /// MADs the CM sent (first sends, resends and answers).
        mads_sent: Sum,
        /// MADs refused: not 256 bytes.
        mad_bad_length: Sum,
        /// MADs refused: base version other than 1.
        mad_bad_base_version: Sum,
        /// MADs refused: a management class other than the CM's.
        mad_bad_class: Sum,
        /// MADs refused: a CM class version other than 2.
        mad_bad_class_version: Sum,
        /// MADs refused: a method other than Send.
        mad_bad_method: Sum,
        /// MADs refused: an attribute this CM does not take (LAP, APR, SIDR, ClassPortInfo,
        /// unknown ones).
        mad_unsupported_attribute: Sum,
        /// CM messages naming a communication ID this CM does not have.
        cm_unknown_comm_id: Sum,
        /// Repeated CM messages (answered again or ignored).
        cm_duplicates: Sum,
        /// REQs rejected: nobody listens on their port.
        cm_rej_no_listener: Sum,
        /// REQs rejected: the half-open or the connection bound was reached.
        cm_rej_no_resources: Sum,
        /// REQs rejected for their content (transport, MTU, addresses, a stale connection).
        cm_rej_invalid: Sum,
        /// MADs resent by a CM timer.
        cm_resends: Sum,
        /// Connections that timed out (no answer after every retry, or a request the
        /// application never answered).
        cm_timeouts: Sum,
        /// Connections established.
        cm_established: Sum,
        /// Connections ended.
        cm_disconnected: Sum,
        /// Connections the peer rejected.
        cm_rejected: Sum,
        /// QP1 frames received (UD SEND ONLY to QP 1 that parsed).
        qp1_frames: Sum,
        /// UD frames refused: not to QP 1 (Portico has no other UD queue pair).
        qp1_wrong_qp: Sum,
        /// QP1 frames refused: a Q_Key other than 0x80010000 or a source QP other than 1.
        qp1_bad_deth: Sum,
        /// QP1 frames refused: a bad checksum or ICRC, or a malformed frame.
        qp1_malformed: Sum,
        /// QP1 frames sent.
        qp1_sent: Sum,
        /// MADs dropped because the frame queue was full.
        qp1_tx_dropped: Sum,
        /// ARP requests sent.
        arp_requests: Sum,
        /// ARP answers learned.
        arp_learned: Sum,
        /// Resolutions given up.
        arp_failures: Sum,
        /// Events dropped because the application's event ring was full (the request they
        /// carried was rejected).
        cm_events_dropped: Sum,
        /// Queue pairs the CM created.
        cm_qps_created: Sum,
        /// Queue pairs the CM destroyed.
        cm_qps_destroyed: Sum,
        /// Queue pairs whose congestion control the Portico extension block settled with
        /// the peer (`docs/wire.md` §20).
        cm_cc_negotiated: Sum,
        /// Queue pairs configured `ack` whose peer offered or answered nothing (a standard
        /// peer, or private data that left no room): they run `dcqcn`.
        cm_cc_fallbacks: Sum,
    }
}

const _: () = assert!(RdmaCounters::LEN <= crate::runtime::STAGE_COUNTERS);

/// Where a node's counters go: to the stage's counter of the same name (all but `rx_frames`
/// and `tx_packets`, which the runtime's own counters cover).
const FROM_NODE: NameMap<{ NodeCounters::LEN }> =
    NameMap::new(&NodeCounters::NAMES, "", &RdmaCounters::NAMES);
/// Where a tag shard's counters go: to the stage's counter of the same name after `tag_`.
const FROM_TAGS: NameMap<{ TagCounters::LEN }> =
    NameMap::new(&TagCounters::NAMES, "tag_", &RdmaCounters::NAMES);
/// Where the queue pairs' congestion counters go: to the stage's of the same name.
const FROM_CC: NameMap<{ CcCounters::LEN }> =
    NameMap::new(&CcCounters::NAMES, "", &RdmaCounters::NAMES);
const FROM_CM: NameMap<{ CmCounters::LEN }> =
    NameMap::new(&CmCounters::NAMES, "", &RdmaCounters::NAMES);
const FROM_QP1: NameMap<{ Qp1Counters::LEN }> =
    NameMap::new(&Qp1Counters::NAMES, "", &RdmaCounters::NAMES);

/// The names of [`RdmaCounters`], in slot order.
#[cfg(test)]
pub(crate) const COUNTER_NAMES: [&str; RdmaCounters::LEN] = RdmaCounters::NAMES;

/// The most one step of the [`WorkerClock`] counts: longer than a busy loop iteration takes
/// (up to about 50 µs with bursts of 4 KiB frames on this machine), far shorter than a worker
/// descheduled by the kernel is away (0.5 to 15 ms on a shared 2-vCPU machine).
pub const MAX_STEP_NS: u64 = 50_000;

/// The time the transport is told: nanoseconds of a real clock, except that a gap of more
/// than [`MAX_STEP_NS`] between two readings counts as `MAX_STEP_NS`.
///
/// A worker that does not run neither receives nor answers. Had its timers counted the time
/// it was away, every queue pair whose ACKs were waiting in an RX ring (or whose peer, on the
/// same worker, had not read its requests yet) would time out the moment the worker ran again,
/// and resend a whole window the peer already had. With this clock a timer fires only after
/// the worker has spent its timeout serving its queues without hearing from the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerClock {
    real: u64,
    now: u64,
    /// Gaps longer than `MAX_STEP_NS`.
    pub stalls: u64,
    /// Time the worker slept on purpose since the last reading (adaptive polling): it
    /// passed for the transport too, and the next step may be that much longer.
    slept: u64,
}

impl WorkerClock {
    /// A clock reading 0 at the real time `real`.
    pub fn new(real: u64) -> WorkerClock {
        WorkerClock {
            real,
            now: 0,
            stalls: 0,
            slept: 0,
        }
    }

    /// The worker slept `ns` on purpose: the next reading counts that time (a timer armed
    /// before the sleep fires on time), and only a gap beyond it is a stall.
    pub fn slept(&mut self, ns: u64) {
        self.slept = self.slept.saturating_add(ns);
    }

    /// The worker time at the real time `real` (a monotonic reading).
    pub fn advance(&mut self, real: u64) -> u64 {
        let step = real.saturating_sub(self.real);
        self.real = self.real.max(real);
        let most = MAX_STEP_NS + std::mem::take(&mut self.slept);
        if step > most {
            self.stalls += 1;
        }
        self.now += step.min(most);
        self.now
    }
}

/// Mbufs allocated at once for transmission.
const TX_ALLOC: usize = 32;

/// Control requests taken per poll: bounds the time one poll spends away from the wire.
const CONTROL_PER_POLL: usize = 8;

/// Counters are gathered from the nodes every this many polls (and at the end).
const PUBLISH_EVERY: u64 = 64;

/// One engine served by the stage: its node, its control path and the output it sends on.
struct Engine {
    node: RdmaNode,
    control: ControlPort,
    output: usize,
}

/// One or more RDMA engines on one worker. Engine *i* receives what input *i* receives.
pub struct RdmaStage {
    engines: Vec<Engine>,
    /// Fresh mbufs for transmission, allocated in bulk (one mempool call per 32 frames).
    /// Declared before `pool` so that it is freed first.
    fresh: Burst,
    pool: Arc<Mempool>,
    polls: u64,
    alloc_failures: u64,
    /// The worker time the queue pairs' live state was last published.
    live_at: u64,
    clock: WorkerClock,
    tsc0: u64,
    /// Nanoseconds per TSC tick, 32.32 fixed point.
    ns_per_tick: u64,
}

impl RdmaStage {
    /// Runs `node`, transmitting on output `output`, with frames from `pool`.
    pub fn new(node: RdmaNode, pool: Arc<Mempool>, control: ControlPort, output: usize) -> Self {
        RdmaStage {
            engines: vec![Engine {
                node,
                control,
                output,
            }],
            fresh: Burst::new(),
            pool,
            polls: 0,
            alloc_failures: 0,
            live_at: 0,
            clock: WorkerClock::new(0),
            tsc0: rdtsc(),
            ns_per_tick: ((1_000_000_000u128 << 32) / u128::from(tsc_hz().max(1))) as u64,
        }
    }

    /// Adds another engine, fed by the next input and sending on `output` (several engines
    /// on one core: on a 2-core machine this leaves the other core to the application).
    pub fn with_engine(mut self, node: RdmaNode, control: ControlPort, output: usize) -> Self {
        self.engines.push(Engine {
            node,
            control,
            output,
        });
        self
    }

    /// Engine `engine`'s node (in the order the engines were added), to read its state
    /// between polls: its queue pairs, its shaper, its counters.
    pub fn node(&self, engine: usize) -> Option<&RdmaNode> {
        self.engines.get(engine).map(|e| &e.node)
    }

    /// Engine `engine`'s node, to tell it what the stage cannot see (an ingress queue's
    /// depth in front of it, see [`RdmaNode::set_ingress_queue`]) or to hand it frames
    /// between polls.
    pub fn node_mut(&mut self, engine: usize) -> Option<&mut RdmaNode> {
        self.engines.get_mut(engine).map(|e| &mut e.node)
    }

    /// The worker time: nanoseconds since the stage started (TSC ticks times a 32.32
    /// fixed-point factor, so no division per call), stalls not counted. The time the nodes
    /// are told; reading it advances the stage's clock.
    pub fn now_ns(&mut self) -> u64 {
        let real =
            ((rdtsc().saturating_sub(self.tsc0) as u128 * self.ns_per_tick as u128) >> 32) as u64;
        self.clock.advance(real)
    }

    /// One engine's counters (the stage's own, which no engine has, 0): the node's, its tag
    /// shard's and its queue pairs' congestion counters go to the counters of the same name
    /// ([`FROM_NODE`], [`FROM_TAGS`], [`FROM_CC`]); what the node does not count as a counter
    /// is asked of it here.
    fn engine_counters(e: &Engine) -> RdmaCounters {
        let mut v = [0; RdmaCounters::LEN];
        FROM_NODE.copy(&e.node.counters.values(), &mut v);
        if let Some(t) = e.node.tags() {
            FROM_TAGS.copy(&t.counters.values(), &mut v);
        }
        FROM_CC.copy(&e.node.cc_counters().values(), &mut v);
        if let Some((cm, qp1)) = e.node.cm_counters() {
            FROM_CM.copy(&cm.values(), &mut v);
            FROM_QP1.copy(&qp1.values(), &mut v);
        }
        let mut c = RdmaCounters::load(&v);
        c.retransmissions = e.node.retransmissions();
        c.spurious_retransmissions = e.node.spurious_retransmissions();
        match e.node.shaper() {
            Some(sh) => {
                for class in 0..sh.classes() {
                    let k = sh.class_counters(class as u8);
                    c.shaper_waited_in += k.waited_in;
                    c.shaper_waited_cap += k.waited_cap;
                }
            }
            // Over the engines that have a shaper.
            None => {
                (c.shaper_picks, c.shaper_misses, c.shaper_read_responses) = (0, 0, 0);
            }
        }
        c
    }

    fn publish(&self, c: &mut Counters) {
        let mut all = RdmaCounters::default();
        for e in &self.engines {
            all.combine(&Self::engine_counters(e));
        }
        all.stalls = self.clock.stalls;
        all.alloc_failures = self.alloc_failures;
        all.store(&mut c.stage);
    }
}

impl Stage for RdmaStage {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn start(&mut self, polling: Polling) {
        // Beside an adaptive worker the host spins only briefly before it parks: on a shared
        // core its spinning is time the worker (or the peer's) does not get.
        let spin = match polling {
            Polling::Busy => rings::SPIN_NS,
            Polling::Adaptive { .. } => polling::SPIN_NS,
        };
        for e in &self.engines {
            e.node.set_host_spin(spin);
        }
    }

    fn outlook(&mut self) -> Outlook {
        let now = self.now_ns();
        self.engines
            .iter_mut()
            .fold(Outlook::due_in(None), |o, e| o.and(e.node.outlook(now)))
    }

    fn wakes(&self) -> Vec<Arc<Wake>> {
        self.engines
            .iter()
            .flat_map(|e| {
                let mut w = e.node.wakes();
                w.push(e.control.wake.clone());
                w
            })
            .collect()
    }

    fn host_work_pending(&self) -> bool {
        self.engines
            .iter()
            .any(|e| e.node.host_work_pending() || !e.control.requests.is_empty())
    }

    fn slept(&mut self, ns: u64) {
        self.clock.slept(ns);
    }

    fn counter_names(&self) -> &'static [&'static str] {
        &RdmaCounters::NAMES
    }

    fn on_rx(&mut self, input: usize, burst: &mut Burst, out: &mut Outputs, c: &mut Counters) {
        let now = self.now_ns();
        let Some(e) = self.engines.get_mut(input) else {
            return;
        };
        // Taken off the wire together: the tag shard looks for older host commands once.
        e.node.begin_rx_burst(burst.len());
        for m in burst.as_slice() {
            if let RxOutcome::ArpReply(len) = e.node.receive(now, m.data()) {
                let reply = e.node.arp_reply(len);
                match self.pool.alloc() {
                    Some(mut r) => {
                        if let Some(d) = r.append(len as u16) {
                            d.copy_from_slice(reply);
                            let _ = out.buffer(e.output).push(r);
                        }
                    }
                    None => c.io.drops += 1,
                }
            }
        }
        e.node.end_rx_burst();
        // Consumed: the transport placed what it needed into registered memory.
        burst.clear();
    }

    fn on_poll(&mut self, out: &mut Outputs, c: &mut Counters) {
        let now = self.now_ns();
        for e in &mut self.engines {
            // Looked at first: `try_recv` on an empty channel runs a sequentially consistent
            // fence (crossbeam's), which drained the store buffer at every iteration.
            if !e.control.requests.is_empty() {
                for (id, request) in e.control.requests.try_iter().take(CONTROL_PER_POLL) {
                    if let Some(reply) = e.node.control(id, request) {
                        let _ = e.control.replies.send(reply);
                    }
                }
            }
            e.node.service(now);
            let replies = &e.control.replies;
            e.node.take_replies(|r| {
                let _ = replies.send(r);
            });
            let buf = out.buffer(e.output);
            // The CM's frames first (QP1 MADs, ARP requests): few, and each one a connection
            // waiting.
            while buf.spare() > 0 && e.node.has_cm_frame() {
                let Some(mut m) = self.pool.alloc() else {
                    self.alloc_failures += 1;
                    break;
                };
                let Some(data) = m.append(crate::wire::gsi::FRAME_LEN as u16) else {
                    break;
                };
                let Some(len) = e.node.poll_cm_frame(data) else {
                    break;
                };
                m.trim((crate::wire::gsi::FRAME_LEN - len) as u16);
                let _ = buf.push(m);
            }
            while buf.spare() > 0 {
                if self.fresh.is_empty() && !self.fresh.alloc(&self.pool, TX_ALLOC) {
                    // Nothing is taken from the queue pairs; they send it next time.
                    self.alloc_failures += 1;
                    break;
                }
                // The packet stays in the node; `tx` is its 8-byte handle.
                let Some(tx) = e.node.poll_transmit(now) else {
                    break;
                };
                let mut m = self.fresh.pop().expect("refilled above");
                let len = e.node.frame_len(&tx);
                let Some(data) = u16::try_from(len).ok().and_then(|l| m.append(l)) else {
                    // Larger than an mbuf (a bug): the transport's timer resends it.
                    self.alloc_failures += 1;
                    continue;
                };
                if e.node.emit(&tx, data).is_ok() {
                    let _ = buf.push(m);
                }
            }
            e.node.flush_completions();
            e.node.publish_tag_events();
        }
        if now.saturating_sub(self.live_at) >= LIVE_EVERY_NS {
            self.live_at = now;
            for e in &self.engines {
                e.control.live.publish(e.node.qps(), now);
            }
        }
        self.polls += 1;
        if self.polls.is_multiple_of(PUBLISH_EVERY) {
            self.publish(c);
        }
    }

    fn on_stop(&mut self, c: &mut Counters) {
        self.publish(c);
        let now = self.now_ns();
        for e in &self.engines {
            e.control.live.publish(e.node.qps(), now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{Access, SgList, WorkRequest};
    use node::testing::pair_with;
    use pmem::Mapping;

    /// Both engines on one worker, in the loop's order: each receives what the other sent in
    /// the previous iteration, then each runs its timers and transmits. Returns A's
    /// retransmissions and spurious retransmissions after 32 WRITEs of which the worker was
    /// descheduled for 3 ms right after sending them; `clock` turns real time into the
    /// nodes' time.
    fn stalled_window(mut clock: impl FnMut(u64) -> u64) -> (u64, u64) {
        let (mut a, mut b) = pair_with(256, |_| {});
        let map = Arc::new(Mapping::anonymous(1 << 16).unwrap());
        let src = a
            .node
            .register(map.clone(), 0, 1 << 15, Access::ALL)
            .unwrap();
        let dst = b.node.register(map, 1 << 15, 1 << 15, Access::ALL).unwrap();
        let wrs: Vec<_> = (0..32u64)
            .map(|i| {
                let sgl = SgList::one(src.lkey, src.addr, 64);
                WorkRequest::write(i, sgl, dst.addr + 64 * i, dst.rkey, None)
            })
            .collect();
        a.qp.post_send(&wrs).unwrap();
        let (mut to_a, mut to_b): (Vec<Vec<u8>>, Vec<Vec<u8>>) = (Vec::new(), Vec::new());
        // Real times of the iterations: 1 µs apart, with a 3 ms gap after the first.
        let times = (0..20u64).map(|k| if k == 0 { 0 } else { 3_000_000 + k * 1_000 });
        for real in times {
            let now = clock(real);
            for f in to_a.drain(..) {
                a.node.receive(now, &f);
            }
            for f in to_b.drain(..) {
                b.node.receive(now, &f);
            }
            for (node, out) in [(&mut a.node, &mut to_b), (&mut b.node, &mut to_a)] {
                node.service(now);
                while let Some(tx) = node.poll_transmit(now) {
                    let mut frame = vec![0u8; node.frame_len(&tx)];
                    node.emit(&tx, &mut frame).unwrap();
                    out.push(frame);
                }
                node.flush_completions();
            }
        }
        let done = std::iter::from_fn(|| a.cq.poll_one()).count();
        assert_eq!(done, 32, "every WRITE completed");
        (a.node.retransmissions(), a.node.spurious_retransmissions())
    }

    #[test]
    fn a_descheduled_worker_does_not_time_out_its_own_peer() {
        let mut c = WorkerClock::new(0);
        assert_eq!(stalled_window(|real| c.advance(real)), (0, 0));
        // Counted in real time, the 3 ms the worker was away expire A's 250 µs timer before B,
        // on the same worker, has read the window: all of it is resent, for nothing.
        assert_eq!(stalled_window(|real| real), (32, 32));
    }

    #[test]
    fn the_counter_slots_follow_the_names() {
        assert_eq!(COUNTER_NAMES[RdmaSlot::ce_received as usize], "ce_received");
        assert_eq!(
            COUNTER_NAMES[RdmaSlot::shaper_picks.index()],
            "shaper_picks"
        );
        assert_eq!(COUNTER_NAMES[RdmaSlot::stalls.index()], "stalls");
        assert!(COUNTER_NAMES.len() <= crate::runtime::STAGE_COUNTERS);
    }

    /// Whatever is added to or removed from the declaration, names, slots, docs and JSON stay
    /// in step.
    #[test]
    fn names_slots_and_json_follow_the_declaration() {
        let names = RdmaCounters::NAMES;
        let mut unique = names.to_vec();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "names are unique");
        // At most STAGE_COUNTERS: checked when compiling (the `const _` after the list).
        // Dense, in declaration order, and named as declared.
        for (i, s) in RdmaSlot::ALL.into_iter().enumerate() {
            assert_eq!(s.index(), i);
            assert_eq!(format!("{s:?}"), names[i]);
            assert_eq!(RdmaCounters::DECLS[i].name, names[i]);
            assert!(!RdmaCounters::DECLS[i].doc().is_empty(), "{}", names[i]);
        }
        for name in names {
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{name}: a telemetry key"
            );
        }
        // Each slot holds its own counter: value i + 1 in slot i round-trips by name.
        let mut slots = [0u64; crate::runtime::STAGE_COUNTERS];
        for (i, v) in slots.iter_mut().take(RdmaCounters::LEN).enumerate() {
            *v = i as u64 + 1;
        }
        let c = RdmaCounters::load(&slots);
        assert_eq!(
            c.values().to_vec(),
            (1..=RdmaCounters::LEN as u64).collect::<Vec<_>>()
        );
        let mut back = [0u64; crate::runtime::STAGE_COUNTERS];
        c.store(&mut back);
        assert_eq!(back, slots);
        // The JSON: one key per declared counter, in slot order, with its slot's value.
        let fields: Vec<String> = (names.iter().enumerate())
            .map(|(i, name)| format!("\"{name}\":{}", i + 1))
            .collect();
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(json, format!("{{{}}}", fields.join(",")));
        // A worker's report names the same counters with the same values, and reads back.
        let w = crate::runtime::Counters {
            stage: slots,
            ..Default::default()
        };
        let r = crate::runtime::WorkerReport::new("rdma0", None, "rdma", &names, &w);
        assert_eq!(r.counters.len(), names.len());
        for (i, name) in names.iter().enumerate() {
            assert_eq!(r.counter(name), Some(i as u64 + 1), "{name}");
        }
        assert_eq!(RdmaCounters::from_pairs(r.counter_pairs()), c);
    }

    /// Every counter the stage publishes has exactly one source: a node counter, a tag
    /// counter or a congestion counter of the same name (taken by name, [`FROM_NODE`], ...),
    /// or one [`RdmaStage::engine_counters`] or [`RdmaStage::publish`] fills itself. A counter
    /// added to a node's set without one here, or renamed on one side only, fails this.
    #[test]
    fn every_counter_has_one_source() {
        let mut sources = vec![Vec::<String>::new(); RdmaCounters::LEN];
        let mut unmapped = Vec::new();
        let mut record = |set: &str, names: &[&str], targets: &[Option<usize>]| {
            for (name, t) in names.iter().zip(targets) {
                match t {
                    Some(t) => sources[*t].push(format!("{set}.{name}")),
                    None => unmapped.push(format!("{set}.{name}")),
                }
            }
        };
        record("node", &NodeCounters::NAMES, FROM_NODE.targets());
        record("tags", &TagCounters::NAMES, FROM_TAGS.targets());
        record("cc", &CcCounters::NAMES, FROM_CC.targets());
        record("cm", &CmCounters::NAMES, FROM_CM.targets());
        record("qp1", &Qp1Counters::NAMES, FROM_QP1.targets());
        for own in [
            RdmaSlot::retransmissions,
            RdmaSlot::spurious_retransmissions,
            RdmaSlot::shaper_waited_in,
            RdmaSlot::shaper_waited_cap,
            RdmaSlot::stalls,
            RdmaSlot::alloc_failures,
        ] {
            sources[own.index()].push("stage".into());
        }
        for (name, s) in RdmaCounters::NAMES.iter().zip(&sources) {
            assert_eq!(s.len(), 1, "{name}: {s:?}");
        }
        assert_eq!(
            unmapped,
            [
                "node.rx_frames",
                "node.tx_packets",
                "tags.unexpected_claimed",
                "tags.commands",
                "tags.commands_failed",
                "tags.undeliverable"
            ],
            "the counters the stage does not report"
        );
    }

    #[test]
    fn counters_combine_over_engines_as_declared() {
        let one = RdmaCounters::load(&[1; crate::runtime::STAGE_COUNTERS]);
        let mut all = RdmaCounters::default();
        for _ in 0..3 {
            all.combine(&one);
        }
        for (d, v) in RdmaCounters::DECLS.iter().zip(all.values()) {
            let want = match d.combine {
                crate::runtime::Combine::Sum => 3,
                crate::runtime::Combine::Max | crate::runtime::Combine::Last => 1,
            };
            assert_eq!(v, want, "{}", d.name);
        }
    }

    /// Every counter the stage publishes is named in the docs.
    #[test]
    fn every_counter_is_documented() {
        let docs = ["rdma.md", "congestion.md", "shaper.md", "lpe.md", "cm.md"]
            .iter()
            .filter_map(|f| {
                std::fs::read_to_string(
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("../docs")
                        .join(f),
                )
                .ok()
            })
            .collect::<String>();
        for name in RdmaCounters::NAMES {
            assert!(
                docs.contains(&format!("`{name}`")),
                "`{name}` is not in docs/"
            );
        }
    }

    #[test]
    fn the_worker_clock_counts_a_stall_as_one_step() {
        let mut c = WorkerClock::new(1_000);
        assert_eq!(c.advance(1_000), 0);
        assert_eq!(c.advance(21_000), 20_000);
        assert_eq!(
            c.advance(71_000),
            70_000,
            "a step of exactly the limit counts whole"
        );
        // Descheduled for 3 ms: the gap counts as one step.
        assert_eq!(c.advance(3_071_000), 70_000 + MAX_STEP_NS);
        assert_eq!(c.stalls, 1);
        assert_eq!(c.advance(3_081_000), 80_000 + MAX_STEP_NS);
        // A reading from before the last one (another core's TSC) moves nothing.
        assert_eq!(c.advance(3_000_000), 80_000 + MAX_STEP_NS);
        assert_eq!(c.advance(3_091_000), 90_000 + MAX_STEP_NS);
        assert_eq!(c.stalls, 1);
    }
}
