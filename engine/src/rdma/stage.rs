//! [`RdmaNode`]s on a worker: mbufs in, mbufs out.
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

/// One engine served by the stage: its node, its host queues and the output it sends on.
struct Engine {
    node: RdmaNode,
    commands: Receiver<Command>,
    events: Sender<Event>,
    output: usize,
}

/// One or more RDMA engines on one worker. Engine *i* receives what input *i* receives.
pub struct RdmaStage {
    engines: Vec<Engine>,
    pool: Arc<Mempool>,
    tsc0: u64,
    hz: u64,
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
            engines: vec![Engine {
                node,
                commands,
                events,
                output,
            }],
            pool,
            tsc0: rdtsc(),
            hz: tsc_hz().max(1),
        }
    }

    /// Adds another engine, fed by the next input and sending on `output` (several engines
    /// on one core: on a 2-core machine this leaves the other core to the application).
    pub fn with_engine(
        mut self,
        node: RdmaNode,
        commands: Receiver<Command>,
        events: Sender<Event>,
        output: usize,
    ) -> Self {
        self.engines.push(Engine {
            node,
            commands,
            events,
            output,
        });
        self
    }

    fn now_ns(&self) -> u64 {
        (rdtsc().saturating_sub(self.tsc0) as u128 * 1_000_000_000 / self.hz as u128) as u64
    }

    fn publish(&self, c: &mut Counters) {
        let mut sum = [0u64; 7];
        for e in &self.engines {
            let n = &e.node.counters;
            let retx: u64 = e.node.qps().iter().map(|q| q.stats().retransmissions).sum();
            for (s, v) in sum.iter_mut().zip([
                n.delivered,
                n.icrc_errors,
                n.malformed,
                n.not_for_us + n.unknown_qp,
                n.arp_replies,
                0,
                retx,
            ]) {
                *s += v;
            }
        }
        c.stage[DELIVERED] = sum[0];
        c.stage[ICRC_ERRORS] = sum[1];
        c.stage[MALFORMED] = sum[2];
        c.stage[NOT_FOR_US] = sum[3];
        c.stage[ARP_REPLIES] = sum[4];
        c.stage[RETRANSMISSIONS] = sum[6];
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
                    None => c.stage[ALLOC_FAILURES] += 1,
                }
            }
        }
        // Consumed: the transport copied what it needed into registered memory.
        burst.clear();
        self.publish(c);
    }

    fn on_poll(&mut self, out: &mut Outputs, c: &mut Counters) {
        let now = self.now_ns();
        for e in &mut self.engines {
            for cmd in e.commands.try_iter().take(COMMANDS_PER_POLL) {
                let events = &e.events;
                e.node.apply(cmd, &mut |ev| {
                    let _ = events.send(ev);
                });
            }
            e.node.run_timers(now);
            let buf = out.buffer(e.output);
            while buf.spare() > 0 {
                let Some(pkt) = e.node.poll_transmit(now) else {
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
                if pkt.emit(&e.node.mem, data).is_ok() {
                    let _ = buf.push(m);
                }
            }
            while let Some(wc) = e.node.cq.poll() {
                c.stage[COMPLETIONS] += 1;
                let _ = e.events.send(Event::Completion(wc));
            }
        }
        self.publish(c);
    }
}
