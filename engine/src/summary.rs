//! What a run measured, as plain data: how EAL's memory was chosen, why the run stopped, the
//! workers' and ports' counters, the checkers' verdicts and the capture file.
//!
//! `app` fills these in and `report` prints them (as text or JSON). They live here, below
//! both, so that `report` does not depend on `app`: dependencies go `app` → `report` →
//! `summary`.

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

/// One port's line in the summary.
#[derive(Debug, Clone, Serialize)]
pub struct PortSummary {
    pub name: String,
    pub id: u16,
    pub driver: String,
    pub link: String,
    pub stats: PortStats,
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
        self.workers.iter().map(|w| w.rx_packets).sum()
    }
    pub fn total_tx_packets(&self) -> u64 {
        self.workers.iter().map(|w| w.tx_packets).sum()
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
