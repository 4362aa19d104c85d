//! Per-worker counters. Each worker counts in plain integers on its own core and publishes
//! them with relaxed stores into a cache-line-aligned block that only it writes; readers (the
//! live stats line, the summary) load them whenever they like. Nothing is shared on the
//! fast path but that one line, which the reader touches once a second.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

use super::fault::FaultCounts;

/// How many stage-defined counters a worker has room for.
pub const STAGE_COUNTERS: usize = 48;

/// A worker's counters, as it keeps them while running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Packets freed because a TX queue did not take them or a stage discarded them.
    pub drops: u64,
    /// Loop iterations in which nothing was received or sent.
    pub empty_polls: u64,
    pub loops: u64,
    /// Meaning given by the stage's `counter_names`.
    pub stage: [u64; STAGE_COUNTERS],
    /// Faults injected on the receive path (all 0 without fault injection).
    pub faults: FaultCounts,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            rx_packets: 0,
            rx_bytes: 0,
            tx_packets: 0,
            tx_bytes: 0,
            drops: 0,
            empty_polls: 0,
            loops: 0,
            stage: [0; STAGE_COUNTERS],
            faults: FaultCounts::default(),
        }
    }
}

/// The published copy of a worker's [`Counters`].
#[repr(align(128))]
pub struct SharedCounters {
    rx_packets: AtomicU64,
    rx_bytes: AtomicU64,
    tx_packets: AtomicU64,
    tx_bytes: AtomicU64,
    drops: AtomicU64,
    empty_polls: AtomicU64,
    loops: AtomicU64,
    stage: [AtomicU64; STAGE_COUNTERS],
    faults: [AtomicU64; 4],
}

impl Default for SharedCounters {
    fn default() -> Self {
        SharedCounters {
            rx_packets: AtomicU64::new(0),
            rx_bytes: AtomicU64::new(0),
            tx_packets: AtomicU64::new(0),
            tx_bytes: AtomicU64::new(0),
            drops: AtomicU64::new(0),
            empty_polls: AtomicU64::new(0),
            loops: AtomicU64::new(0),
            stage: std::array::from_fn(|_| AtomicU64::new(0)),
            faults: Default::default(),
        }
    }
}

impl SharedCounters {
    /// Publishes `c`. Called only by the owning worker.
    #[inline]
    pub fn publish(&self, c: &Counters) {
        self.rx_packets.store(c.rx_packets, Relaxed);
        self.rx_bytes.store(c.rx_bytes, Relaxed);
        self.tx_packets.store(c.tx_packets, Relaxed);
        self.tx_bytes.store(c.tx_bytes, Relaxed);
        self.drops.store(c.drops, Relaxed);
        self.empty_polls.store(c.empty_polls, Relaxed);
        self.loops.store(c.loops, Relaxed);
        for (s, v) in self.stage.iter().zip(c.stage) {
            s.store(v, Relaxed);
        }
        let f = &c.faults;
        for (s, v) in self
            .faults
            .iter()
            .zip([f.dropped, f.duplicated, f.reordered, f.corrupted])
        {
            s.store(v, Relaxed);
        }
    }

    /// The last published values.
    pub fn read(&self) -> Counters {
        let mut stage = [0; STAGE_COUNTERS];
        for (v, s) in stage.iter_mut().zip(&self.stage) {
            *v = s.load(Relaxed);
        }
        Counters {
            rx_packets: self.rx_packets.load(Relaxed),
            rx_bytes: self.rx_bytes.load(Relaxed),
            tx_packets: self.tx_packets.load(Relaxed),
            tx_bytes: self.tx_bytes.load(Relaxed),
            drops: self.drops.load(Relaxed),
            empty_polls: self.empty_polls.load(Relaxed),
            loops: self.loops.load(Relaxed),
            stage,
            faults: FaultCounts {
                dropped: self.faults[0].load(Relaxed),
                duplicated: self.faults[1].load(Relaxed),
                reordered: self.faults[2].load(Relaxed),
                corrupted: self.faults[3].load(Relaxed),
            },
        }
    }
}

/// A named, serialisable view of one worker's counters.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct WorkerReport {
    pub worker: String,
    pub core: Option<usize>,
    pub stage: String,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub drops: u64,
    pub empty_polls: u64,
    pub loops: u64,
    /// Stage counters by name.
    pub counters: Vec<(String, u64)>,
    pub faults: FaultCounts,
}

impl WorkerReport {
    pub fn new(
        worker: &str,
        core: Option<usize>,
        stage: &str,
        names: &[&str],
        c: &Counters,
    ) -> Self {
        WorkerReport {
            worker: worker.to_string(),
            core,
            stage: stage.to_string(),
            rx_packets: c.rx_packets,
            rx_bytes: c.rx_bytes,
            tx_packets: c.tx_packets,
            tx_bytes: c.tx_bytes,
            drops: c.drops,
            empty_polls: c.empty_polls,
            loops: c.loops,
            counters: names
                .iter()
                .zip(c.stage)
                .map(|(n, v)| (n.to_string(), v))
                .collect(),
            faults: c.faults,
        }
    }

    /// A stage counter by name.
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.counters
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_then_read_round_trips() {
        let shared = SharedCounters::default();
        let mut c = Counters {
            rx_packets: 1,
            rx_bytes: 2,
            tx_packets: 3,
            tx_bytes: 4,
            drops: 5,
            empty_polls: 6,
            loops: 7,
            ..Default::default()
        };
        c.stage[7] = 99;
        c.faults.reordered = 3;
        shared.publish(&c);
        assert_eq!(shared.read(), c);
        assert_eq!(std::mem::align_of::<SharedCounters>(), 128);
    }

    #[test]
    fn report_names_stage_counters() {
        let mut c = Counters::default();
        c.stage[0] = 10;
        c.stage[1] = 20;
        let r = WorkerReport::new("w0", Some(1), "check", &["ok", "bad"], &c);
        assert_eq!(r.counter("ok"), Some(10));
        assert_eq!(r.counter("bad"), Some(20));
        assert_eq!(r.counter("missing"), None);
    }
}
