//! Per-worker counters. Each worker counts in plain integers on its own core and publishes
//! them with relaxed stores into a cache-line-aligned block that only it writes; readers (the
//! live stats line, the summary) load them whenever they like. Nothing is shared on the
//! fast path but that one line, which the reader touches once a second.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

use super::fault::FaultCounts;
use super::polling::IdleCounters;

/// How many stage-defined counters a worker has room for.
pub const STAGE_COUNTERS: usize = 80;

crate::counter_set! {
    /// The worker loop's own counters, whatever its stage runs: what it received, sent and
    /// freed, and how often it went round.
    pub struct LoopCounters, slots LoopSlot {
        /// Packets received from the worker's RX queues.
        rx_packets: Sum,
        /// Their bytes.
        rx_bytes: Sum,
        /// Packets the worker's TX queues took.
        tx_packets: Sum,
        /// Their bytes.
        tx_bytes: Sum,
        /// Packets freed because a TX queue did not take them or a stage discarded them.
        drops: Sum,
        /// Loop iterations in which nothing was received or sent.
        empty_polls: Sum,
        /// Loop iterations.
        loops: Sum,
    }
}

/// A worker's counters, as it keeps them while running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// The loop's own.
    pub io: LoopCounters,
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
            io: LoopCounters::default(),
            stage: [0; STAGE_COUNTERS],
            faults: FaultCounts::default(),
            idle: IdleCounters::default(),
            cpu_ns: 0,
            wall_ns: 0,
        }
    }
}

/// The published copy of a worker's [`Counters`]: each declared set in slots of its own.
#[repr(align(128))]
pub struct SharedCounters {
    io: [AtomicU64; LoopCounters::LEN],
    stage: [AtomicU64; STAGE_COUNTERS],
    faults: [AtomicU64; FaultCounts::LEN],
    idle: [AtomicU64; IdleCounters::LEN],
    cpu_ns: AtomicU64,
    wall_ns: AtomicU64,
}

impl Default for SharedCounters {
    fn default() -> Self {
        SharedCounters {
            io: Default::default(),
            stage: std::array::from_fn(|_| AtomicU64::new(0)),
            faults: Default::default(),
            idle: Default::default(),
            cpu_ns: AtomicU64::new(0),
            wall_ns: AtomicU64::new(0),
        }
    }
}

/// `values` into `slots`, one relaxed store each.
#[inline]
fn store_all<const N: usize>(slots: &[AtomicU64; N], values: [u64; N]) {
    for (s, v) in slots.iter().zip(values) {
        s.store(v, Relaxed);
    }
}

/// What `slots` hold, one relaxed load each.
fn load_all<const N: usize>(slots: &[AtomicU64; N]) -> [u64; N] {
    slots.each_ref().map(|s| s.load(Relaxed))
}

impl SharedCounters {
    /// Publishes `c`. Called only by the owning worker.
    #[inline]
    pub fn publish(&self, c: &Counters) {
        store_all(&self.io, c.io.values());
        store_all(&self.stage, c.stage);
        store_all(&self.faults, c.faults.values());
        store_all(&self.idle, c.idle.values());
        self.cpu_ns.store(c.cpu_ns, Relaxed);
        self.wall_ns.store(c.wall_ns, Relaxed);
    }

    /// The last published values.
    pub fn read(&self) -> Counters {
        Counters {
            io: LoopCounters::load(&load_all(&self.io)),
            stage: load_all(&self.stage),
            faults: FaultCounts::load(&load_all(&self.faults)),
            idle: IdleCounters::load(&load_all(&self.idle)),
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
    /// The loop's own counters, one key each in the JSON (as the other fields).
    #[serde(flatten)]
    pub io: LoopCounters,
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
            io: c.io,
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

    /// The stage counters as (name, value) pairs: what a declared set's `from_pairs` reads.
    pub fn counter_pairs(&self) -> impl Iterator<Item = (&str, u64)> {
        self.counters.iter().map(|(n, v)| (n.as_str(), *v))
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
            io: LoopCounters::load(&[1, 2, 3, 4, 5, 6, 7]),
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

    /// The loop's counters and the fault counts go through the shared block each from its own
    /// slot, and a report's JSON has one top-level key per loop counter and one `faults` key
    /// per fault counter, with the names users read.
    #[test]
    fn loop_and_fault_counters_follow_their_declaration() {
        assert_eq!(
            LoopCounters::NAMES,
            [
                "rx_packets",
                "rx_bytes",
                "tx_packets",
                "tx_bytes",
                "drops",
                "empty_polls",
                "loops"
            ]
        );
        assert_eq!(
            FaultCounts::NAMES,
            ["dropped", "duplicated", "reordered", "corrupted"]
        );
        let io: Vec<u64> = (1..=LoopCounters::LEN as u64).collect();
        let faults: Vec<u64> = (100..100 + FaultCounts::LEN as u64).collect();
        let c = Counters {
            io: LoopCounters::load(&io),
            faults: FaultCounts::load(&faults),
            ..Default::default()
        };
        let shared = SharedCounters::default();
        shared.publish(&c);
        let back = shared.read();
        assert_eq!(back.io.values().to_vec(), io);
        assert_eq!(back.faults.values().to_vec(), faults);
        let r = WorkerReport::new("w0", None, "fwd", &[], &back);
        let json = serde_json::to_value(&r).unwrap();
        for (i, name) in LoopCounters::NAMES.iter().enumerate() {
            assert_eq!(json[*name], io[i], "{name}");
        }
        for (i, name) in FaultCounts::NAMES.iter().enumerate() {
            assert_eq!(json["faults"][*name], faults[i], "{name}");
        }
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
