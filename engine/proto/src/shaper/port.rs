//! Rates configured per port and held per port across workers (issue 32). The seed's shaper
//! is one per port; Portico runs one per worker, so without this a port of N workers sends N
//! times the configured rates. With a [`PortShares`] shared by the workers' shapers, each one
//! rebalances on its own clock every `interval_ns` ([`super::Shaper::rebalance`]), never per
//! packet: it publishes which classes had work on it in the interval (one word per 64 classes)
//! and sets its class buckets to the class's configured rates divided among the workers with
//! work in that class, its own included (its link bucket likewise among the workers with any
//! work). A class busy on one worker gets the whole port's rate there; busy on two, half on
//! each. A worker that starts sending in a class waits at most one interval for its share to
//! grow; the burst of each bucket stays per worker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the workers of one port tell each other about their classes.
#[derive(Debug)]
pub struct PortShares {
    workers: usize,
    /// Words per worker: one bit per class.
    words: usize,
    /// Per worker, the classes that had work in its last interval.
    active: Vec<AtomicU64>,
}

impl PortShares {
    /// Shares for `workers` workers of `classes` classes, none active yet.
    pub fn new(workers: usize, classes: usize) -> Arc<PortShares> {
        let words = classes.div_ceil(64).max(1);
        Arc::new(PortShares {
            workers: workers.max(1),
            words,
            active: (0..workers.max(1) * words)
                .map(|_| AtomicU64::new(0))
                .collect(),
        })
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Worker `me`'s classes with work, as its bitset.
    pub(crate) fn publish(&self, me: usize, bits: &[u64]) {
        for (w, &b) in bits.iter().enumerate().take(self.words) {
            // Relaxed: a share read one interval late is as good as one read now.
            self.active[me * self.words + w].store(b, Ordering::Relaxed);
        }
    }

    /// Workers other than `me` with work in class `c`.
    pub(crate) fn others_in(&self, me: usize, c: usize) -> usize {
        let (w, bit) = (c / 64, 1u64 << (c % 64));
        (0..self.workers)
            .filter(|&k| {
                k != me && self.active[k * self.words + w].load(Ordering::Relaxed) & bit != 0
            })
            .count()
    }

    /// Workers other than `me` with work in any class.
    pub(crate) fn others_busy(&self, me: usize) -> usize {
        (0..self.workers)
            .filter(|&k| {
                k != me
                    && (0..self.words)
                        .any(|w| self.active[k * self.words + w].load(Ordering::Relaxed) != 0)
            })
            .count()
    }
}

/// A shaper's link to its port's shares: who it is, when it rebalances next, and the port's
/// configured rates it divides.
#[derive(Debug)]
pub(crate) struct PortLink {
    pub shares: Arc<PortShares>,
    pub me: usize,
    pub interval_ns: u64,
    pub next_at: u64,
    /// The port's link rate as configured (the class rates are in the classes'
    /// configurations; the buckets hold this worker's shares).
    pub link_bps: Option<u64>,
    /// Per class, the packets counted at the last rebalance (sent since: active).
    pub packets_then: Vec<u64>,
    /// This worker's active classes (scratch, one bit per class).
    pub bits: Vec<u64>,
}
