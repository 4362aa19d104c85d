//! An [`RdmaNode`] on a worker: mbufs in, mbufs out.
//!
//! On RX every frame goes to the node. The mbuf is freed right after, because the transport
//! copies payload into registered memory. ARP replies are built into fresh mbufs. On every
//! poll the stage does four things:
//! - takes up to 64 host commands;
//! - runs the QPs' timers (time is the TSC in nanoseconds);
//! - emits what the QPs want to send, straight into fresh mbufs, until the TX buffer is full;
//! - hands completions to the host.

use std::sync::Arc;

use crossbeam::channel::{Receiver, Sender};

use super::{Command, Event, RdmaNode, RxOutcome};
use crate::dataplane::{Burst, Mempool, rdtsc, tsc_hz};
use crate::runtime::{Counters, Outputs, Stage};

/// Stage counter slots.
const DELIVERED: usize = 0;
const ICRC_ERRORS: usize = 1;
const MALFORMED: usize = 2;
const NOT_FOR_US: usize = 3;
const ARP_REPLIES: usize = 4;
const COMPLETIONS: usize = 5;
const RETRANSMISSIONS: usize = 6;
const ALLOC_FAILURES: usize = 7;

/// Host commands taken per poll: bounds the time one poll spends away from the wire.
const COMMANDS_PER_POLL: usize = 64;

pub struct RdmaStage {
    node: RdmaNode,
    pool: Arc<Mempool>,
    commands: Receiver<Command>,
    events: Sender<Event>,
    tsc0: u64,
    hz: u64,
    output: usize,
}

impl RdmaStage {
    /// Runs `node`, transmitting on output `output`, with frames from `pool`.
    pub fn new(
        node: RdmaNode,
        pool: Arc<Mempool>,
        commands: Receiver<Command>,
        events: Sender<Event>,
        output: usize,
    ) -> Self {
        RdmaStage {
            node,
            pool,
            commands,
            events,
            tsc0: rdtsc(),
            hz: tsc_hz().max(1),
            output,
        }
    }

    fn now_ns(&self) -> u64 {
        (rdtsc().saturating_sub(self.tsc0) as u128 * 1_000_000_000 / self.hz as u128) as u64
    }

    fn publish(&self, c: &mut Counters) {
        let n = &self.node.counters;
        c.stage[DELIVERED] = n.delivered;
        c.stage[ICRC_ERRORS] = n.icrc_errors;
        c.stage[MALFORMED] = n.malformed;
        c.stage[NOT_FOR_US] = n.not_for_us + n.unknown_qp;
        c.stage[ARP_REPLIES] = n.arp_replies;
        c.stage[RETRANSMISSIONS] = self
            .node
            .qps()
            .iter()
            .map(|q| q.stats().retransmissions)
            .sum();
    }
}

impl Stage for RdmaStage {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn counter_names(&self) -> &'static [&'static str] {
        &[
            "delivered",
            "icrc_errors",
            "malformed",
            "not_for_us",
            "arp_replies",
            "completions",
            "retransmissions",
            "alloc_failures",
        ]
    }

    fn on_rx(&mut self, _input: usize, burst: &mut Burst, out: &mut Outputs, c: &mut Counters) {
        let now = self.now_ns();
        for m in burst.as_slice() {
            if let RxOutcome::ArpReply(len) = self.node.receive(now, m.data()) {
                let reply = self.node.arp_reply(len);
                match self.pool.alloc() {
                    Some(mut r) => {
                        if let Some(d) = r.append(len as u16) {
                            d.copy_from_slice(reply);
                            let _ = out.buffer(self.output).push(r);
                        }
                    }
                    None => c.stage[ALLOC_FAILURES] += 1,
                }
            }
        }
        // Consumed: the transport copied what it needed into registered memory.
        burst.clear();
        self.publish(c);
    }

    fn on_poll(&mut self, out: &mut Outputs, c: &mut Counters) {
        for cmd in self.commands.try_iter().take(COMMANDS_PER_POLL) {
            let events = &self.events;
            self.node.apply(cmd, &mut |e| {
                let _ = events.send(e);
            });
        }
        let now = self.now_ns();
        self.node.run_timers(now);
        let buf = out.buffer(self.output);
        while buf.spare() > 0 {
            let Some(pkt) = self.node.poll_transmit(now) else {
                break;
            };
            let Some(mut m) = self.pool.alloc() else {
                // The packet is lost to the wire; the transport's timer resends it.
                c.stage[ALLOC_FAILURES] += 1;
                break;
            };
            let len = pkt.frame_len();
            let Some(data) = u16::try_from(len).ok().and_then(|l| m.append(l)) else {
                c.stage[ALLOC_FAILURES] += 1;
                break;
            };
            if pkt.emit(&self.node.mem, data).is_ok() {
                let _ = buf.push(m);
            }
        }
        while let Some(wc) = self.node.cq.poll() {
            c.stage[COMPLETIONS] += 1;
            let _ = self.events.send(Event::Completion(wc));
        }
        self.publish(c);
    }
}
