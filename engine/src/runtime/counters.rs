//! Per-worker counters. Each worker counts in plain integers on its own core and publishes
//! them with relaxed stores into a cache-line-aligned block that only it writes; readers (the
//! live stats line, the summary) load them whenever they like. Nothing is shared on the
//! fast path but that one line, which the reader touches once a second.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

use super::fault::FaultCounts;
use super::polling::IdleCounters;

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
    /// What adaptive polling did (all 0 when busy polling).
    pub idle: IdleCounters,
    /// The worker thread's CPU time, and the time since its loop started (read now and then,
    /// and when it stops): their ratio is the share of a core it used.
    pub cpu_ns: u64,
    pub wall_ns: u64,
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
            idle: IdleCounters::default(),
            cpu_ns: 0,
            wall_ns: 0,
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
    idle: [AtomicU64; IdleCounters::LEN],
    cpu_ns: AtomicU64,
    wall_ns: AtomicU64,
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
            idle: Default::default(),
            cpu_ns: AtomicU64::new(0),
            wall_ns: AtomicU64::new(0),
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
        for (s, v) in self.idle.iter().zip(c.idle.values()) {
            s.store(v, Relaxed);
        }
        self.cpu_ns.store(c.cpu_ns, Relaxed);
        self.wall_ns.store(c.wall_ns, Relaxed);
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
            idle: IdleCounters::load(&self.idle.each_ref().map(|a| a.load(Relaxed))),
            cpu_ns: self.cpu_ns.load(Relaxed),
            wall_ns: self.wall_ns.load(Relaxed),
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
    /// What adaptive polling did (all 0 when busy polling).
    pub idle: IdleCounters,
    /// CPU time the worker thread used, and the time its loop ran.
    pub cpu_ns: u64,
    pub wall_ns: u64,
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
            idle: c.idle,
            cpu_ns: c.cpu_ns,
            wall_ns: c.wall_ns,
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
        c.idle.max_oversleep_ns = 11;
        c.idle.wakeups = 12;
        c.cpu_ns = 13;
        c.wall_ns = 14;
        shared.publish(&c);
        assert_eq!(shared.read(), c);
        assert_eq!(std::mem::align_of::<SharedCounters>(), 128);
    }

    /// Every declared idle counter is published and read back from its own slot, and a
    /// report's JSON carries them as the `idle` object: one key per declared counter, in
    /// order, with the names users read.
    #[test]
    fn idle_counters_follow_their_declaration() {
        use crate::runtime::{Combine, IdleSlot};
        assert_eq!(
            IdleCounters::NAMES,
            [
                "busy",
                "backed_off",
                "slept",
                "sleep_asked_ns",
                "sleep_taken_ns",
                "timeouts",
                "oversleep_ns",
                "max_oversleep_ns",
                "host_wakes",
                "skipped",
                "wakeups"
            ]
        );
        let values: Vec<u64> = (1..=IdleCounters::LEN as u64).collect();
        let c = Counters {
            idle: IdleCounters::load(&values),
            ..Default::default()
        };
        let shared = SharedCounters::default();
        shared.publish(&c);
        assert_eq!(shared.read().idle.values().to_vec(), values);
        let r = WorkerReport::new("w0", None, "rdma", &[], &shared.read());
        let json = serde_json::to_value(&r).unwrap();
        let idle = json["idle"].as_object().unwrap();
        let keys: Vec<&str> = idle.keys().map(String::as_str).collect();
        let mut want = IdleCounters::NAMES.to_vec();
        want.sort_unstable(); // serde_json's map is sorted
        assert_eq!(keys, want);
        for (i, name) in IdleCounters::NAMES.iter().enumerate() {
            assert_eq!(idle[*name], i as u64 + 1, "{name}");
        }
        assert_eq!(
            serde_json::to_string(&r.idle).unwrap(),
            format!(
                "{{{}}}",
                (IdleCounters::NAMES.iter().zip(&values))
                    .map(|(n, v)| format!("\"{n}\":{v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            "in declaration order"
        );
        let d = IdleCounters::DECLS[IdleSlot::max_oversleep_ns.index()];
        assert_eq!(d.combine, Combine::Max, "a high-water mark");
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
