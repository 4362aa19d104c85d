//! What a run measured, as plain data: how EAL's memory was chosen, why the run stopped, the
//! workers' and ports' counters, the checkers' verdicts and the capture file.
//!
//! `app` fills these in and `report` prints them (as text or JSON). They live here, below
//! both, so that `report` does not depend on `app`: dependencies go `app` → `report` →
//! `summary`.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::dataplane::PortStats;
use crate::runtime::WorkerReport;

/// How the memory for EAL was chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum MemoryChoice {
    /// Hugepages (`free` pages of `page_kb` KiB were free at start).
    Hugepages { page_kb: u64, free: u64 },
    /// `--no-huge` with this many MiB (None: as the user passed it).
    NoHuge { mb: Option<u32> },
}

impl std::fmt::Display for MemoryChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemoryChoice::Hugepages { page_kb, free } => {
                write!(f, "hugepages ({free} free pages of {} MiB)", page_kb / 1024)
            }
            MemoryChoice::NoHuge { mb: Some(mb) } => {
                write!(f, "no hugepages (--no-huge, {mb} MiB)")
            }
            MemoryChoice::NoHuge { mb: None } => write!(f, "no hugepages (--no-huge, as given)"),
        }
    }
}

/// How a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Duration,
    Completed,
    Interrupted,
    WorkerFailed,
}

/// One port's line in the summary: what the PMD itself counted, including the frames it
/// dropped before any worker saw them.
#[derive(Debug, Clone, Serialize)]
pub struct PortSummary {
    pub name: String,
    pub id: u16,
    pub driver: String,
    pub link: String,
    /// `rx_missed` (imissed), `rx_errors` (ierrors), `tx_errors` and `rx_nombuf` among them.
    pub stats: PortStats,
    /// The port's extended statistics about drops, misses and errors, per queue where the
    /// PMD counts per queue (see [`is_drop_xstat`]), by name, zeros included.
    pub drop_xstats: BTreeMap<String, u64>,
}

impl PortSummary {
    /// The drop xstats that are not zero.
    pub fn nonzero_drop_xstats(&self) -> impl Iterator<Item = (&str, u64)> {
        self.drop_xstats
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| (k.as_str(), *v))
    }
}

/// Whether an extended statistic counts frames lost or refused: its name says drop, miss,
/// error, discard or nombuf (`rx_missed_errors`, `rx_q0_errors`, `rx_mbuf_allocation_errors`,
/// a NIC's `rx_discards_phy`, ...).
pub fn is_drop_xstat(name: &str) -> bool {
    const WORDS: [&str; 5] = ["drop", "miss", "error", "discard", "nombuf"];
    let name = name.to_ascii_lowercase();
    WORDS.iter().any(|w| name.contains(w))
}

/// The verdict of one checker.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CheckVerdict {
    pub worker: String,
    /// Frames the generators at the other end of the ring link sent, else the frames the
    /// config expects (None: neither is known; only integrity is checked).
    pub sent: Option<u64>,
    /// Valid frames that must arrive: `sent`, adjusted for injected faults.
    pub expected_valid: Option<u64>,
    pub valid: u64,
    pub invalid: u64,
    pub seq_gaps: u64,
    pub late: u64,
    pub passed: bool,
}

/// The pcapng file written with `--pcap`, and how many packets it holds.
#[derive(Debug, Clone, Serialize)]
pub struct CaptureSummary {
    pub path: String,
    pub packets: u64,
}

/// Everything a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub command: String,
    pub stop_reason: StopReason,
    pub seconds: f64,
    pub memory: MemoryChoice,
    pub eal_args: Vec<String>,
    pub workers: Vec<WorkerReport>,
    pub ports: Vec<PortSummary>,
    pub checks: Vec<CheckVerdict>,
    /// The pcapng file written with `--pcap`, and how many packets it holds.
    pub capture: Option<CaptureSummary>,
}

impl Summary {
    pub fn total_rx_packets(&self) -> u64 {
        self.workers.iter().map(|w| w.io.rx_packets).sum()
    }
    pub fn total_tx_packets(&self) -> u64 {
        self.workers.iter().map(|w| w.io.tx_packets).sum()
    }
    /// Forwarded (transmitted) packets per second over the run.
    pub fn tx_pps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.total_tx_packets() as f64 / self.seconds
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_xstats_are_told_by_name() {
        for name in [
            "rx_missed_errors",
            "rx_errors",
            "tx_errors",
            "rx_mbuf_allocation_errors",
            "rx_q0_errors",
            "rx_q3_drop_packets",
            "rx_discards_phy",
            "rx_nombuf",
            "RX_Q0_DROPS",
        ] {
            assert!(is_drop_xstat(name), "{name}");
        }
        for name in ["rx_good_packets", "rx_q0_bytes", "tx_q0_packets"] {
            assert!(!is_drop_xstat(name), "{name}");
        }
    }

    /// The summary's JSON carries an RDMA worker's counters as declared: every name, in slot
    /// order, with its slot's value.
    #[test]
    fn a_worker_summary_lists_the_declared_counters() {
        let names = crate::rdma::COUNTER_NAMES;
        let mut c = crate::runtime::Counters::default();
        for (i, v) in c.stage.iter_mut().enumerate() {
            *v = 100 + i as u64;
        }
        let w = WorkerReport::new("rdma0", Some(2), "rdma", &names, &c);
        let v = serde_json::to_value(&w).unwrap();
        let listed: Vec<(String, u64)> = serde_json::from_value(v["counters"].clone()).unwrap();
        let want: Vec<(String, u64)> = (names.iter().enumerate())
            .map(|(i, n)| (n.to_string(), 100 + i as u64))
            .collect();
        assert_eq!(listed, want);
    }
}
