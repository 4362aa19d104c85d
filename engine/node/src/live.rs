//! Live transport state of one worker's queue pairs, for readers outside the worker
//! (telemetry): the worker copies each queue pair's PSNs, queue depths, RTT estimate and a few
//! counters into relaxed atomics at most once per [`LIVE_EVERY_NS`] of its clock, from its poll
//! (the RDMA stage's); nothing is written per packet, nothing allocates or locks.
//!
//! The slots are made with the control path ([`super::RdmaHandle::sharded`]), one block per
//! worker, [`LIVE_SLOTS`] queue pairs each; queue pairs past that are counted, not shown.
//! Each value is a relaxed load of what the worker last stored: the fields of one queue pair
//! may come from two neighbouring snapshots.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

use proto::transport::{QpState, QueuePair};

/// How often (worker time) a worker publishes its queue pairs: 1 ms.
pub const LIVE_EVERY_NS: u64 = 1_000_000;

/// Queue pairs one worker publishes.
pub const LIVE_SLOTS: usize = 64;

/// One queue pair's published state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QpLive {
    pub qpn: u32,
    /// 1 once the queue pair is in the error state.
    pub error_state: u64,
    /// Requester: the next PSN the transmit cursor sends, the oldest unacknowledged one, PSNs
    /// between them (what is in flight as far as sending goes) and work requests not completed.
    pub next_tx_psn: u32,
    pub oldest_unacked_psn: u32,
    pub outstanding_psns: u64,
    pub pending_wrs: u64,
    /// Responder: the next PSN it accepts and the receives posted and not consumed.
    pub expected_psn: u32,
    pub posted_receives: u64,
    /// The retransmission timeout the next timer gets, and the RTT estimate (0 before the
    /// first sample), in ns of the worker's clock.
    pub rto_ns: u64,
    pub srtt_ns: u64,
    pub min_rtt_ns: u64,
    pub tx_requests: u64,
    pub retransmissions: u64,
    pub timeouts: u64,
    pub acks_received: u64,
    pub acks_sent: u64,
    pub naks_sent: u64,
    pub naks_received: u64,
    pub rx_packets: u64,
    /// The worker's clock (ns since its stage started) when this was published.
    pub published_at_ns: u64,
}

const FIELDS: usize = 20;

/// One slot: [`QpLive`]'s fields in declaration order.
#[derive(Default)]
#[repr(align(64))]
struct Slot([AtomicU64; FIELDS]);

/// The published queue pairs of one worker.
pub struct LiveQps {
    slots: Box<[Slot]>,
    /// Queue pairs published in the last round, and those that found no slot.
    used: AtomicU64,
    unshown: AtomicU64,
}

impl Default for LiveQps {
    fn default() -> Self {
        LiveQps {
            slots: (0..LIVE_SLOTS).map(|_| Slot::default()).collect(),
            used: AtomicU64::new(0),
            unshown: AtomicU64::new(0),
        }
    }
}

impl QpLive {
    /// The state of `qp` now (`now`: the worker's clock).
    pub fn of(qp: &QueuePair, now: u64) -> QpLive {
        let cfg = qp.config();
        let req = qp.requester();
        let resp = qp.responder();
        let s = qp.stats();
        QpLive {
            qpn: cfg.local_qpn,
            error_state: u64::from(qp.state() == QpState::Error),
            next_tx_psn: req.tx_psn(),
            oldest_unacked_psn: req.snd_una(),
            outstanding_psns: u64::from(req.outstanding()),
            pending_wrs: req.pending() as u64,
            expected_psn: resp.expected_psn(),
            posted_receives: resp.posted_receives() as u64,
            rto_ns: req.rto(cfg),
            srtt_ns: req.rtt().srtt().unwrap_or(0),
            min_rtt_ns: req.rtt().min_rtt().unwrap_or(0),
            tx_requests: s.tx_requests,
            retransmissions: s.retransmissions,
            timeouts: s.timeouts,
            acks_received: s.acks_received,
            acks_sent: s.acks_sent,
            naks_sent: s.seq_naks_sent + s.rnr_naks_sent + s.fatal_naks_sent,
            naks_received: s.seq_naks_received + s.rnr_naks_received + s.fatal_naks_received,
            rx_packets: s.rx_packets,
            published_at_ns: now,
        }
    }

    fn fields(&self) -> [u64; FIELDS] {
        [
            u64::from(self.qpn),
            self.error_state,
            u64::from(self.next_tx_psn),
            u64::from(self.oldest_unacked_psn),
            self.outstanding_psns,
            self.pending_wrs,
            u64::from(self.expected_psn),
            self.posted_receives,
            self.rto_ns,
            self.srtt_ns,
            self.min_rtt_ns,
            self.tx_requests,
            self.retransmissions,
            self.timeouts,
            self.acks_received,
            self.acks_sent,
            self.naks_sent,
            self.naks_received,
            self.rx_packets,
            self.published_at_ns,
        ]
    }

    fn from_fields(f: [u64; FIELDS]) -> QpLive {
        QpLive {
            qpn: f[0] as u32,
            error_state: f[1],
            next_tx_psn: f[2] as u32,
            oldest_unacked_psn: f[3] as u32,
            outstanding_psns: f[4],
            pending_wrs: f[5],
            expected_psn: f[6] as u32,
            posted_receives: f[7],
            rto_ns: f[8],
            srtt_ns: f[9],
            min_rtt_ns: f[10],
            tx_requests: f[11],
            retransmissions: f[12],
            timeouts: f[13],
            acks_received: f[14],
            acks_sent: f[15],
            naks_sent: f[16],
            naks_received: f[17],
            rx_packets: f[18],
            published_at_ns: f[19],
        }
    }
}

impl LiveQps {
    /// Publishes the worker's queue pairs, in order (called by the owning worker only).
    pub fn publish<'a>(&self, qps: impl Iterator<Item = &'a QueuePair>, now: u64) {
        let (mut used, mut unshown) = (0u64, 0u64);
        for qp in qps {
            match self.slots.get(used as usize) {
                Some(slot) => {
                    for (a, v) in slot.0.iter().zip(QpLive::of(qp, now).fields()) {
                        a.store(v, Relaxed);
                    }
                    used += 1;
                }
                None => unshown += 1,
            }
        }
        self.used.store(used, Relaxed);
        self.unshown.store(unshown, Relaxed);
    }

    /// What the worker last published (empty before its first publication), and how many
    /// queue pairs it has beyond [`LIVE_SLOTS`].
    pub fn read(&self) -> (Vec<QpLive>, u64) {
        let used = (self.used.load(Relaxed) as usize).min(self.slots.len());
        let qps = self.slots[..used]
            .iter()
            .map(|s| QpLive::from_fields(std::array::from_fn(|i| s.0[i].load(Relaxed))))
            .collect();
        (qps, self.unshown.load(Relaxed))
    }
}

/// Every worker's published queue pairs ([`super::RdmaHandle::live_qps`]), readable from any
/// thread while the engine runs and after.
#[derive(Clone)]
pub struct LiveReader {
    workers: Vec<Arc<LiveQps>>,
}

impl LiveReader {
    pub(crate) fn new(workers: Vec<Arc<LiveQps>>) -> LiveReader {
        LiveReader { workers }
    }

    /// Per worker: [`LiveQps::read`].
    pub fn read(&self) -> Vec<(Vec<QpLive>, u64)> {
        self.workers.iter().map(|w| w.read()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::transport::QpConfig;

    #[test]
    fn a_published_queue_pair_reads_back() {
        let mut cfg = QpConfig::new(0x22, 0x11);
        cfg.send_psn = 100;
        cfg.recv_psn = 7;
        let qp = QueuePair::new(cfg.clone()).unwrap();
        let live = LiveQps::default();
        assert_eq!(live.read(), (vec![], 0));
        live.publish([&qp].into_iter(), 5_000);
        let (qps, unshown) = live.read();
        assert_eq!(unshown, 0);
        assert_eq!(qps, vec![QpLive::of(&qp, 5_000)]);
        let q = qps[0];
        assert_eq!(
            (q.qpn, q.next_tx_psn, q.oldest_unacked_psn),
            (0x22, 100, 100)
        );
        assert_eq!(
            (q.expected_psn, q.outstanding_psns, q.pending_wrs),
            (7, 0, 0)
        );
        assert_eq!(q.rto_ns, cfg.timeout_ns);
        assert_eq!(q.published_at_ns, 5_000);
        let many: Vec<QueuePair> = (0..LIVE_SLOTS as u32 + 2)
            .map(|i| QueuePair::new(QpConfig::new(i + 1, 1)).unwrap())
            .collect();
        live.publish(many.iter(), 6_000);
        let (qps, unshown) = live.read();
        assert_eq!((qps.len(), unshown), (LIVE_SLOTS, 2));
        assert_eq!(qps[LIVE_SLOTS - 1].qpn, LIVE_SLOTS as u32);
    }
}
