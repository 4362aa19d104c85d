//! Shared set-up for the RDMA tests on real EAL, started without hugepages:
//!
//! - [`start`]: `portico::rdma::loopback`, two engines on a `net_ring` link in one process,
//!   one queue pair and one completion queue per end (what `portico bench` runs);
//! - [`start_connections`]: a second, independent pair of engines (its own link, pool and
//!   worker) joined by several queue pairs, each end of each with its own completion queue.
//!   Errors that end a connection (a NAK for a bad rkey ends both of its queue pairs, a bad
//!   local buffer ends one) each get a connection of their own there.
//!
//! One EAL per process: a test binary that uses [`start`] or [`start_connections`] holds a
//! single test function; one with several test functions uses [`shared_eal`] and [`serial`].
#![allow(dead_code, unused_imports)] // Each test binary uses part of this module.

use std::sync::OnceLock;

use portico::dataplane::Eal;
use portico::rdma::loopback::{self, LoopbackOpts};
use portico::rdma::{Cq, RdmaHandle};
use portico::runtime::{FaultConfig, Runtime};
use portico::transport::{QpConfig, WcStatus, WorkCompletion};

pub use portico::rdma::loopback::{Connection, End, LoopbackPair as Pair, QPN_A, QPN_B};

static CORES: OnceLock<Vec<usize>> = OnceLock::new();

/// The cores this process may use, as they were before EAL pinned the calling thread to its
/// main lcore (after that the thread sees only that one).
pub fn cores() -> &'static [usize] {
    CORES.get_or_init(portico::app::available_cores)
}

/// Starts EAL without hugepages on core 0; returns the cores the process may use.
pub fn start_eal() -> &'static [usize] {
    let args: Vec<String> = [
        "--no-huge",
        "-m",
        "512",
        "--no-shconf",
        "--no-pci",
        "-l",
        "0",
        "--log-level=lib.eal:error",
    ]
    .map(String::from)
    .to_vec();
    // Before EAL starts: EAL pins the calling thread to its main lcore.
    let cores = cores();
    Eal::init(&args).expect("EAL starts");
    cores
}

/// Starts EAL and the two engines of `portico::rdma::loopback`, A on the first core and B on
/// the last; `faults` applies to both receive paths.
pub fn start(qp: QpConfig, faults: Option<FaultConfig>) -> Pair {
    let cores = start_eal();
    let mut opts = LoopbackOpts::new(qp, [cores[0], *cores.last().unwrap()]);
    opts.faults = faults;
    loopback::start(&opts).expect("two engines start")
}

/// Two engines on one worker, joined by several connections.
pub struct Engines {
    pub runtime: Runtime,
    pub a: RdmaHandle,
    pub b: RdmaHandle,
    pub conns: Vec<Connection>,
}

/// Starts two more engines (EAL must be running) with `portico::rdma::loopback` under `name`
/// (their own link, pool and worker), both on `core`, joined by `connections` queue pairs set
/// up from `qp`, each end of each with its own completion queue.
pub fn start_connections(name: &str, qp: QpConfig, connections: usize, core: usize) -> Engines {
    let mut opts = LoopbackOpts::new(qp, [core, core]);
    opts.name = name.into();
    opts.connections = connections;
    let pair = loopback::start(&opts).expect("the second pair starts");
    let first = Connection {
        a: End {
            qp: pair.a.qp,
            cq: pair.a.cq,
        },
        b: End {
            qp: pair.b.qp,
            cq: pair.b.cq,
        },
    };
    Engines {
        runtime: pair.runtime,
        a: pair.a.engine,
        b: pair.b.engine,
        conns: std::iter::once(first).chain(pair.more).collect(),
    }
}

/// Waits for exactly `n` completions on `cq` (each within `wait`), then checks that no
/// further completion arrives for a short while.
pub fn completions(cq: &mut Cq, n: usize, wait: std::time::Duration) -> Vec<WorkCompletion> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        match cq.wait_one(wait) {
            Some(wc) => got.push(wc),
            None => panic!("{} of {n} completions within {wait:?}: {got:?}", got.len()),
        }
    }
    let extra = cq.wait_one(std::time::Duration::from_millis(50));
    assert_eq!(extra, None, "no completion beyond the {n} expected");
    got
}

/// (wr_id, status) of each completion, in order.
pub fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|wc| (wc.wr_id, wc.status)).collect()
}

/// Deterministic test data.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut data = vec![0u8; len];
    portico::rng::SplitMix64::new(seed).fill(&mut data);
    data
}

/// EAL for a test binary that holds several test functions (the tagged-messaging tests): the
/// first call starts it, with room for a pair of engines per test (`-m 2048`, no hugepages),
/// and every call returns the cores the process may use. Each test then starts its own pair
/// under a name of its own; [`serial`] keeps the tests from running at once.
pub fn shared_eal() -> &'static [usize] {
    static STARTED: OnceLock<()> = OnceLock::new();
    // Before EAL starts: EAL pins the calling thread to its main lcore.
    let cores = cores();
    STARTED.get_or_init(|| {
        let args: Vec<String> = [
            "--no-huge",
            "-m",
            "2048",
            "--no-shconf",
            "--no-pci",
            "-l",
            "0",
            "--log-level=lib.eal:error",
        ]
        .map(String::from)
        .to_vec();
        Eal::init(&args).expect("EAL starts");
    });
    cores
}

/// One test at a time in a binary whose tests each start engines (on 2 cores, two pairs of
/// busy-polling workers would share a core). A test that failed does not stop the next.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Pins the calling thread (the application) to the first core the process may use, away from
/// workers started on the last one, when there are two or more: a test thread that checks
/// megabytes then never takes a worker's core (which would stall that engine for a scheduler
/// slice, long enough for its retransmission timers to fire).
pub fn host_on_first_core() {
    let cores = cores();
    if cores.len() > 1 {
        core_affinity::set_for_current(core_affinity::CoreId { id: cores[0] });
    }
}

/// A fault run's totals over its workers' reports: what the injector corrupted, dropped and
/// duplicated, and the ICRC errors and retransmissions the engines counted. Prints each
/// report, and checks that no engine counted a malformed frame.
pub struct FaultTotals {
    pub corrupted: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub icrc: u64,
    pub retx: u64,
}

pub fn fault_totals(reports: &[portico::runtime::WorkerReport]) -> FaultTotals {
    let mut t = FaultTotals {
        corrupted: 0,
        dropped: 0,
        duplicated: 0,
        icrc: 0,
        retx: 0,
    };
    for r in reports {
        eprintln!(
            "{}: faults {:?}, counters {:?}",
            r.worker, r.faults, r.counters
        );
        t.corrupted += r.faults.corrupted;
        t.dropped += r.faults.dropped;
        t.duplicated += r.faults.duplicated;
        t.icrc += r.counter("icrc_errors").unwrap();
        t.retx += r.counter("retransmissions").unwrap();
        assert_eq!(r.counter("malformed"), Some(0), "{}", r.worker);
    }
    t
}

impl FaultTotals {
    /// Faults were injected, every corrupted frame was exactly one ICRC error, and losses
    /// were repaired by retransmission.
    pub fn check(&self) {
        assert!(
            self.corrupted > 0 && self.dropped > 0,
            "faults were injected"
        );
        assert_eq!(
            self.icrc, self.corrupted,
            "every corrupted frame is exactly one ICRC error"
        );
        assert!(self.retx > 0, "losses were repaired by retransmission");
    }
}
