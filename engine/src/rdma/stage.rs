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
//! - hands the iteration's completions to the host's completion rings.

use std::sync::Arc;

use super::host::ControlPort;
use super::{RdmaNode, RxOutcome};
use crate::dataplane::{Burst, Mempool, rdtsc, tsc_hz};
use crate::runtime::{Counters, Outputs, Stage};

/// The stage's counters, in slot order: the nodes' (summed over the engines, see
/// [`RdmaStage::publish`]), then the stage's own.
const COUNTER_NAMES: [&str; 30] = [
    "delivered",
    "icrc_errors",
    "malformed",
    "not_for_us",
    "unknown_qp",
    "wrong_mac",
    "vlan_tagged",
    "ip_options",
    "ip_fragments",
    "wrong_transport",
    "bad_pkey",
    "wrong_source",
    "wrong_core",
    "arp_replies",
    "completions",
    "retransmissions",
    "cq_full",
    "posted",
    "cq_overruns",
    "persist_jobs",
    "persist_failures",
    // Tagged messaging (the list-processing shard), 0 on engines without it.
    "tag_matched",
    "tag_unexpected",
    "tag_dropped",
    "tag_truncated",
    "tag_pulls",
    "tag_not_ready",
    "tag_wrong_engine",
    "tag_events_lost",
    "alloc_failures",
];

/// Slot of mbuf allocation failures: the last one.
const ALLOC_FAILURES: usize = COUNTER_NAMES.len() - 1;

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

    /// Nanoseconds since the stage started: TSC ticks times a 32.32 fixed-point factor, so
    /// no division per call.
    fn now_ns(&self) -> u64 {
        ((rdtsc().saturating_sub(self.tsc0) as u128 * self.ns_per_tick as u128) >> 32) as u64
    }

    fn publish(&self, c: &mut Counters) {
        let mut sum = [0u64; ALLOC_FAILURES];
        for e in &self.engines {
            let n = &e.node.counters;
            let t = e.node.tags().map(|t| t.counters).unwrap_or_default();
            for (s, v) in sum.iter_mut().zip([
                n.delivered,
                n.icrc_errors,
                n.malformed,
                n.not_for_us,
                n.unknown_qp,
                n.wrong_mac,
                n.vlan_tagged,
                n.ip_options,
                n.ip_fragments,
                n.wrong_transport,
                n.bad_pkey,
                n.wrong_source,
                n.wrong_core,
                n.arp_replies,
                n.completions,
                e.node.retransmissions(),
                n.cq_full,
                n.posted,
                n.cq_overruns,
                n.persist_jobs,
                n.persist_failures,
                t.matched_priority,
                t.matched_overflow,
                t.dropped,
                t.truncated,
                t.rendezvous_pulls,
                t.not_ready,
                t.wrong_engine,
                t.events_lost,
            ]) {
                *s += v;
            }
        }
        c.stage[..sum.len()].copy_from_slice(&sum);
        c.stage[ALLOC_FAILURES] = self.alloc_failures;
    }
}

impl Stage for RdmaStage {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn counter_names(&self) -> &'static [&'static str] {
        &COUNTER_NAMES
    }

    fn on_rx(&mut self, input: usize, burst: &mut Burst, out: &mut Outputs, c: &mut Counters) {
        let now = self.now_ns();
        let Some(e) = self.engines.get_mut(input) else {
            return;
        };
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
                    None => c.drops += 1,
                }
            }
        }
        // Consumed: the transport placed what it needed into registered memory.
        burst.clear();
    }

    fn on_poll(&mut self, out: &mut Outputs, c: &mut Counters) {
        let now = self.now_ns();
        for e in &mut self.engines {
            for (id, request) in e.control.requests.try_iter().take(CONTROL_PER_POLL) {
                if let Some(reply) = e.node.control(id, request) {
                    let _ = e.control.replies.send(reply);
                }
            }
            e.node.service(now);
            let replies = &e.control.replies;
            e.node.take_replies(|r| {
                let _ = replies.send(r);
            });
            let buf = out.buffer(e.output);
            while buf.spare() > 0 {
                if self.fresh.is_empty() && !self.fresh.alloc(&self.pool, TX_ALLOC) {
                    // Nothing is taken from the queue pairs; they send it next time.
                    self.alloc_failures += 1;
                    break;
                }
                let Some(tx) = e.node.poll_transmit(now) else {
                    break;
                };
                let mut m = self.fresh.pop().expect("refilled above");
                let len = tx.frame_len();
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
        }
        self.polls += 1;
        if self.polls.is_multiple_of(PUBLISH_EVERY) {
            self.publish(c);
        }
    }

    fn on_stop(&mut self, c: &mut Counters) {
        self.publish(c);
    }
}
