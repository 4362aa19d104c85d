//! `portico bench`: RDMA operations between two engines on a `net_ring` link in one process,
//! with throughput and HdrHistogram latency per operation type.
//!
//! The host thread keeps `qd` operations outstanding on engine A's queue pair. With `--rate`,
//! operation *k* is due at `start + k / rate`. Its latency is measured from that intended time,
//! not from when it was actually posted, so a stall of the engine shows up in the percentiles
//! instead of quietly delaying the operations behind it (no coordinated omission). Without a
//! rate the loop is closed, and latency runs from posting to completion.
//!
//! A run is one point (a message size and a queue depth) or a sweep of them (`--sizes`,
//! `--all-sizes`, a `--qd` list), run one after the other on the same engines by
//! `point::Runner`. Each point lasts `--duration` seconds, or until Ctrl-C or SIGTERM when it
//! is 0; a signal ends the current point (it waits for what is outstanding) and the run, and
//! everything measured until then is still printed and written (`--hlog`, `--plot`, `--csv`).
//! The summary has the two `net_ring` ports' own counters (misses, errors, mbuf allocation
//! failures, drop xstats) beside the engines'.
//!
//! This crate (`portico-bench`, in `bench/`) sits above the library: nothing in `portico`
//! depends on it, so an edit here rebuilds only this crate and the binary.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pmem::Mapping;
use serde::Serialize;

use portico::app::{
    AppError, MemoryChoice, PortSummary, available_cores, check_pool_fits, plan_eal_args,
    port_summary,
};
use portico::config::{HugepageMode, MemoryLimit, limits};
use portico::dataplane::{self, Eal, PortInfo};
use portico::hugepages::HugepageStatus;
use portico::latency::{Latency, LatencySummary};
use portico::rdma::loopback::{self, LoopbackOpts};
use portico::report;
use portico::runtime::{CaptureSink, Polling, Runtime, polling};
use portico::transport::{Access, Mtu, QpConfig, WcOpcode, WorkRequest};

pub use point::Point;
pub(crate) use point::WCS_LEN;

pub mod args;
pub mod bottleneck;
pub mod congestion;
pub mod connect;
mod inline;
pub mod instrument;
pub mod latency_plot;
pub mod persist;
pub mod placement;
mod plot;
pub mod point;
pub mod remote;
pub mod shaper;
pub mod tagged;

/// Which operations to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchOp {
    Write,
    Read,
    Send,
    /// SEND, WRITE and READ in turn.
    Mixed,
    /// One durable write per operation, into a file-backed region on the target, made durable
    /// the way `--mode` says ([`persist`]).
    Persist,
    /// Tagged messaging: eager, unexpected and rendezvous tagged sends against software
    /// matching and RDMA READ ([`tagged`], run by [`tagged::run`]).
    Tagged,
    /// Header + data to a target's buffer list: the placement planner's one coalesced WRITE
    /// against two WRITEs and naive coalescing ([`placement`], run by [`placement::run`]).
    Placement,
    /// N flows into one target through an ECN-marking bottleneck, under each congestion
    /// control scheme ([`congestion`], run by [`congestion::run`]).
    Congestion,
    /// READs paced by the size of their responses into a host with a limited absorb rate,
    /// beside WRITE classes, with pacing on and off ([`shaper`], run by [`shaper::run`]).
    Shaper,
    /// Connection set-up through the CM against the TCP exchange ([`connect`], run by
    /// [`connect::run`]).
    Connect,
}

#[derive(Debug, Clone)]
pub struct BenchOpts {
    pub op: BenchOp,
    /// Message size in bytes.
    pub size: u32,
    /// `--size` was given (`bench placement` then runs only that data size).
    pub size_given: bool,
    /// Operations outstanding at once.
    pub qd: usize,
    /// A size sweep (`--sizes`, `--all-sizes`): every size at every queue depth; empty: `size`.
    pub sizes: Vec<u32>,
    /// A queue-depth sweep (`--qd 1,8,64`); empty: `qd`.
    pub qds: Vec<usize>,
    /// Write every point's results as CSV here.
    pub csv: Option<PathBuf>,
    /// `--server` / `--client`: the queue pairs' congestion control (`--cc`), negotiated in
    /// the exchange.
    pub cc: Option<portico::cc::CcMode>,
    /// Operations per second (None: as fast as completions come back).
    pub rate: Option<f64>,
    /// None: until Ctrl-C or SIGTERM.
    pub duration: Option<Duration>,
    pub mtu: Mtu,
    /// Fill every source buffer with a per-operation pattern and check every byte that lands.
    pub verify: bool,
    pub hgrm: Option<PathBuf>,
    /// Write HdrHistogram interval logs (`.hlog`) here: one histogram per operation type per
    /// `hlog_interval` (`write`, `read`, `send`, `mixed` only).
    pub hlog: Option<PathBuf>,
    pub hlog_interval: Duration,
    /// Write `latency.svg` and `timeline.svg` into this directory (`write`, `read`, `send`,
    /// `mixed` only).
    pub plot: Option<PathBuf>,
    /// Capture both engines' ports into this pcapng file.
    pub pcap: Option<PathBuf>,
    pub json: bool,
    pub hugepages: HugepageMode,
    pub memory_mb: u32,
    pub eal: Vec<String>,
    /// `persist` only: how each write is made durable.
    pub mode: Option<persist::PersistMode>,
    /// `persist` only: the file to map as the target's region (default: one in a fresh
    /// directory under /var/tmp, removed afterwards).
    pub file: Option<PathBuf>,
    /// `persist` only: the target's region file treated as persistent memory
    /// (`pmem::MapOptions::emulate_pmem`: persist = cache-line write-back, not durable).
    pub emulate_pmem: bool,
    /// `tagged` only: the parts to run (empty: all).
    pub part: Vec<tagged::TaggedPart>,
    /// `tagged` in one process only: the points to run (`--sizes`, `--depths`, `--matching`).
    pub points: tagged::PointFilter,
    /// Workers the two engines run on (`--cores`): 1 puts both engines on one worker; N > 1
    /// runs N workers, worker *i* holding shard *i* of both engines (`rdma::loopback`).
    pub cores: usize,
    /// Queue pairs between the engines (`--connections`; at least `cores`; default `cores`).
    pub connections: Option<usize>,
    /// Host threads (`--host-threads`; default `cores`).
    pub host_threads: Option<usize>,
    /// `--inline`: the workers run the application's loop themselves.
    pub inline: bool,
}

/// One operation type's results.
#[derive(Debug, Clone, Serialize)]
pub struct OpResult {
    pub op: &'static str,
    /// The point's message size and queue depth (`bench write|read|send|mixed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qd: Option<usize>,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub gbit_per_sec: f64,
    pub latency_ns: LatencySummary,
}

/// What `--verify` checked.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct VerifySummary {
    /// Operations whose landed bytes were compared (WRITE targets, READ destinations, SEND
    /// receive buffers).
    pub checked_ops: u64,
    pub checked_bytes: u64,
    /// Operations with at least one byte different from the pattern sent.
    pub mismatches: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchSummary {
    pub op: BenchOp,
    pub size: u32,
    pub qd: usize,
    pub rate: Option<f64>,
    pub seconds: f64,
    pub memory: MemoryChoice,
    /// What the application's buffers are (anonymous memory or hugetlb pages).
    pub buffers: String,
    pub results: Vec<OpResult>,
    pub errors: u64,
    /// Present with `--verify`.
    pub verify: Option<VerifySummary>,
    /// Queue pairs the operations were spread over.
    pub connections: usize,
    /// The engines' worker counters (retransmissions, ICRC errors, ...), one entry per worker.
    pub workers: Vec<portico::runtime::WorkerReport>,
    /// Where the host thread, each worker and EAL's own threads ran, read while the workers
    /// ran.
    pub cores: portico::app::CoresReport,
    /// The two `net_ring` ports' own counters, `a` (engine A's) then `b`.
    pub ports: Vec<PortSummary>,
    pub capture: Option<portico::app::CaptureSummary>,
    /// `persist` only: the mode, what the target's region is, and the queue pair's tuning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persist: Option<persist::PersistSummary>,
    /// With `--plot DIR`: the SVGs written (latency by percentile, the run over time).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plots: Vec<String>,
    /// A sweep's points, each with its own results (all of them are in `results` too, with
    /// their size and queue depth).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<PointSummary>,
    /// The run ended early (Ctrl-C or SIGTERM, or a point that could not drain): `points` and
    /// `results` hold what was measured until then.
    pub interrupted: bool,
    /// With `--csv FILE`: the file written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub csv: Option<String>,
    /// `--client`: what the server reported of its side.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<serde_json::Value>,
    /// The host threads that posted and polled, each with its core and the queue pairs
    /// (engine A's QPNs) it drove (one process: write, read, send, mixed). With `--inline`, the
    /// workers that ran the application's loop, on their own cores.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub host_threads: Vec<HostThread>,
    /// `--inline`: the application ran inside the workers' loops.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub inline: bool,
}

/// One host thread of a run and what it drove.
#[derive(Debug, Clone, Serialize)]
pub struct HostThread {
    pub thread: usize,
    pub core: usize,
    pub qpns: Vec<u32>,
}

/// One point of a sweep.
#[derive(Debug, Clone, Serialize)]
pub struct PointSummary {
    pub size: u32,
    pub qd: usize,
    pub seconds: f64,
    pub results: Vec<OpResult>,
    pub errors: u64,
    /// Ctrl-C or SIGTERM ended this point before its duration.
    pub interrupted: bool,
}

/// Mbufs in the engines' pool, as `rdma::loopback` creates it (checked against EAL's memory
/// before EAL starts).
const LOOPBACK_MBUFS: u32 = 16383;

/// The operation types, in the order of [`op_index`] (latency histograms, `.hlog` tags).
pub(crate) const OP_NAMES: [&str; 3] = ["read", "send", "write"];

pub(crate) fn op_index(op: WcOpcode) -> usize {
    match op {
        WcOpcode::RdmaRead => 0,
        WcOpcode::Send => 1,
        _ => 2,
    }
}

/// A bench's two engines, running: EAL started, the loopback pair up.
pub(crate) struct Engines {
    pub(crate) memory: MemoryChoice,
    /// The host's core (EAL's main lcore) and the (first) engines' core.
    pub(crate) cores: (usize, usize),
    /// The cores the process could run on before EAL pinned its main thread.
    pub(crate) all_cores: Vec<usize>,
    /// The workers' cores, in worker order.
    pub(crate) workers: Vec<usize>,
    /// `--inline`: where each worker takes the application's loop.
    pub(crate) inline: Option<Vec<std::sync::mpsc::Sender<point::InlineApp>>>,
    pub(crate) a: loopback::LoopbackEnd,
    pub(crate) b: loopback::LoopbackEnd,
    /// Connections 1.. when `--connections` asked for more than one.
    pub(crate) more: Vec<loopback::Connection>,
    /// Per connection: the home workers of its two ends.
    pub(crate) homes: Vec<[usize; 2]>,
    pub(crate) running: Running,
}

/// What stops the engines and gathers their counters at the end of a bench.
pub(crate) struct Running {
    runtime: Runtime,
    capture: Option<Arc<CaptureSink>>,
    /// The ports `loopback` created, `a` then `b`, for their counters at the end.
    port_ids: [(&'static str, Option<u16>); 2],
    /// A cache line's round trip from the host's core to the workers', before they started.
    trips_before: Vec<portico::app::LineTrip>,
}

/// A cache line's round trip from the calling (host) thread's core to each core `lo` puts a
/// worker on, measured before the workers start (`CoresReport::line_trips_before`).
fn trips_before(lo: &LoopbackOpts) -> Vec<portico::app::LineTrip> {
    let Some(host) = portico::app::current_cpu() else {
        return Vec::new();
    };
    let cores = if lo.workers.is_empty() {
        &lo.cores[..]
    } else {
        &lo.workers[..]
    };
    let planned: Vec<u32> = cores.iter().map(|&c| c as u32).collect();
    portico::app::line_trips(host, &planned)
}

/// What a bench reports about its engines once they have stopped.
pub(crate) struct Stopped {
    pub(crate) workers: Vec<portico::runtime::WorkerReport>,
    /// Where the threads ran, sampled just before the workers stopped.
    pub(crate) cores: portico::app::CoresReport,
    pub(crate) ports: Vec<PortSummary>,
    pub(crate) capture: Option<portico::app::CaptureSummary>,
}

/// The cores of `n` workers: the last `n` of `cores`, counted from the end and wrapping round
/// when there are fewer cores than workers (the host loop takes the first core).
pub(crate) fn worker_cores(cores: &[usize], n: usize) -> Vec<usize> {
    let len = cores.len().max(1);
    let mut w: Vec<usize> = (0..n)
        .map(|i| cores.get(len - 1 - i % len).copied().unwrap_or(0))
        .collect();
    w.reverse();
    w
}

/// `--cores` and `--connections`: the workers and the queue pairs, checked.
fn layout(opts: &BenchOpts) -> Result<(usize, usize), AppError> {
    let max = portico::dataplane::RING_MAX_QUEUES as usize;
    if opts.cores == 0 || opts.cores > max {
        return Err(usage(format!(
            "--cores: must be 1..={max} (a net_ring port has at most {max} queues)"
        )));
    }
    let connections = opts.connections.unwrap_or(opts.cores);
    if connections < opts.cores || connections > 256 {
        return Err(usage(format!(
            "--connections: must be {}..=256 (at least one queue pair per worker)",
            opts.cores
        )));
    }
    Ok((opts.cores, connections))
}

/// `--host-threads`, checked against the queue pairs and the logs. The default is one per
/// worker as far as the cores the workers leave go (at least one): host threads that share
/// cores with busy-polling workers only take turns with them (on this 2-core VM, `--cores 2`
/// with two host threads ran 8 k ops/s against 0.8 M with one).
fn host_threads(opts: &BenchOpts, connections: usize) -> Result<usize, AppError> {
    if opts.inline {
        if opts.host_threads.is_some() {
            return Err(usage(
                "--host-threads: not with --inline (the workers run the application)".into(),
            ));
        }
        for (flag, given) in [
            ("--hlog", opts.hlog.is_some()),
            ("--plot", opts.plot.is_some()),
        ] {
            if given {
                return Err(usage(format!(
                    "{flag}: not with --inline (each worker keeps its own histograms)"
                )));
            }
        }
        return Ok(opts.cores);
    }
    let free = available_cores().len().saturating_sub(opts.cores);
    let t = opts.host_threads.unwrap_or(opts.cores.min(free).max(1));
    if t == 0 || t > connections {
        return Err(usage(format!(
            "--host-threads: must be 1..={connections} (each thread drives at least one of the \
             {connections} queue pairs)"
        )));
    }
    for (flag, given) in [
        ("--hlog", opts.hlog.is_some()),
        ("--plot", opts.plot.is_some()),
    ] {
        if t > 1 && given {
            return Err(usage(format!(
                "{flag}: takes --host-threads 1 (its log has one writer)"
            )));
        }
    }
    Ok(t)
}

/// Starts EAL for a bench that runs `pairs` loopback pairs of engines one after the other on
/// one worker (a pair's pool may not be gone when the next is made, so the memory must hold
/// them all), and prints the banner. Returns the host's core, the engines' core and the
/// memory EAL got.
pub(crate) fn start_eal_for_pairs(
    opts: &BenchOpts,
    pairs: u32,
) -> Result<(usize, usize, MemoryChoice), AppError> {
    let cores = available_cores();
    let (host_core, engine_core) = (cores[0], *cores.last().unwrap_or(&cores[0]));
    let memory = start_eal(opts, host_core, pairs)?;
    Ok((host_core, engine_core, memory))
}

/// Starts EAL with its main lcore on `host_core` and memory for `pairs` loopback pools, and
/// prints the banner.
fn start_eal(opts: &BenchOpts, host_core: usize, pairs: u32) -> Result<MemoryChoice, AppError> {
    let (args, memory) = plan_eal_args(
        &opts.eal,
        opts.hugepages,
        opts.memory_mb,
        host_core,
        &[],
        &HugepageStatus::read(),
    )?;
    check_pool_fits(
        &memory,
        LOOPBACK_MBUFS * pairs.max(1),
        portico::rdma::FRAME_DATA_ROOM,
        ("--memory-mb", "--hugepages"),
        "",
    )?;
    let info = Eal::init(&args)?;
    report::banner(
        info,
        &memory,
        Some(polling::effective(Polling::Busy)),
        opts.json,
    );
    Ok(memory)
}

/// Starts EAL (after the banner) and the two engines with queue pair settings `qp`. One
/// worker (`--cores 1`): both engines on the last core, the host loop on the first (EAL's
/// main lcore); on a 2-core machine a third busy thread would leave the host waiting for CPU
/// time slices. N workers: on the last N cores (wrapping round on a small machine), each with
/// shard *i* of both engines.
pub(crate) fn start_engines(opts: &BenchOpts, qp: QpConfig) -> Result<Engines, AppError> {
    let (n, connections) = layout(opts)?;
    let cores = available_cores();
    let workers = worker_cores(&cores, n);
    let (a, b) = (cores[0], workers[0]);
    let memory = start_eal(opts, a, 1)?;
    let mut lo = if n == 1 {
        let mut lo = LoopbackOpts::new(qp, [b, b]);
        lo.connections = connections;
        lo
    } else {
        LoopbackOpts::multicore(qp, &workers, connections)
    };
    lo.pcap = opts.pcap.clone();
    let inline = opts.inline.then(|| {
        let (wrap, senders) = inline::wrap(workers.len());
        lo.wrap = Some(wrap);
        senders
    });
    let trips_before = trips_before(&lo);
    let pair =
        loopback::start(&lo).map_err(|e| AppError::Failed(format!("starting the engines: {e}")))?;
    let port_ids = ring_port_ids(&lo.name);
    let loopback::LoopbackPair {
        runtime,
        a: ea,
        b: eb,
        more,
        homes,
        capture,
        ..
    } = pair;
    Ok(Engines {
        memory,
        cores: (a, b),
        all_cores: cores,
        workers,
        inline,
        a: ea,
        b: eb,
        more,
        homes,
        running: Running {
            runtime,
            capture,
            port_ids,
            trips_before,
        },
    })
}

/// The two ring ports `loopback` made for the pair named `name`, labelled `a` and `b`: DPDK
/// names a ring port `net_ring_<name>_a` (`_b`).
pub(crate) fn ring_port_ids(name: &str) -> [(&'static str, Option<u16>); 2] {
    ["a", "b"].map(|end| {
        let suffix = format!("{name}_{end}");
        let id = dataplane::port_ids()
            .into_iter()
            .find(|&id| PortInfo::read(id).is_ok_and(|p| p.name.ends_with(&suffix)));
        (end, id)
    })
}

/// A pair of engines that one run of a multi-run bench started (`bench congestion`'s
/// schemes, `bench shaper`'s phases): both ends, the further connections, the workers.
pub(crate) struct StartedPair {
    pub(crate) a: loopback::LoopbackEnd,
    pub(crate) b: loopback::LoopbackEnd,
    pub(crate) more: Vec<loopback::Connection>,
    pub(crate) running: Running,
}

/// Starts the pair `lo` asks for (its name names the engines in errors and the ports).
pub(crate) fn start_pair(lo: &LoopbackOpts) -> Result<StartedPair, AppError> {
    let name = &lo.name;
    let trips_before = trips_before(lo);
    let pair = loopback::start(lo)
        .map_err(|e| AppError::Failed(format!("starting the {name} engines: {e}")))?;
    let port_ids = ring_port_ids(name);
    let loopback::LoopbackPair {
        runtime,
        a,
        b,
        more,
        capture,
        ..
    } = pair;
    Ok(StartedPair {
        a,
        b,
        more,
        running: Running {
            runtime,
            capture,
            port_ids,
            trips_before,
        },
    })
}

/// What a stage left in `slot` when it stopped; `what` names it in the error.
pub(crate) fn take_report<T>(
    slot: &std::sync::Mutex<Option<T>>,
    what: &str,
) -> Result<T, AppError> {
    slot.lock()
        .ok()
        .and_then(|mut s| s.take())
        .ok_or_else(|| AppError::Failed(format!("{what} left no report")))
}

impl Running {
    /// Reads the ports' counters (labelled `<label>_a`, `<label>_b`) while the workers still
    /// hold them started, then stops the workers (`name` names them in an error).
    pub(crate) fn stop_labelled(
        self,
        label: &str,
        name: &str,
    ) -> Result<(Vec<PortSummary>, Vec<portico::runtime::WorkerReport>), AppError> {
        let ports = self
            .port_ids
            .iter()
            .filter_map(|&(end, id)| Some(port_summary(id?, &format!("{label}_{end}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let workers = self
            .runtime
            .join()
            .map_err(|e| AppError::Failed(format!("{name} workers: {e}")))?;
        Ok((ports, workers))
    }

    /// Reads the ports' counters while the workers still hold them started, stops the
    /// workers, and finishes the capture (written to `pcap`).
    pub(crate) fn finish(self, pcap: Option<&PathBuf>) -> Result<Stopped, AppError> {
        let ports = self
            .port_ids
            .iter()
            .filter_map(|&(name, id)| Some(port_summary(id?, name)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut cores = portico::app::CoresReport::sample();
        let workers = self.runtime.join()?;
        cores.measure_line_trips();
        cores.line_trips_before = self.trips_before;
        let capture = match (self.capture, pcap) {
            (Some(sink), Some(path)) => Some(portico::app::CaptureSummary {
                path: path.display().to_string(),
                packets: sink.finish().map_err(|source| AppError::Capture {
                    path: path.display().to_string(),
                    source,
                })?,
            }),
            _ => None,
        };
        Ok(Stopped {
            workers,
            cores,
            ports,
            capture,
        })
    }
}

fn post_batch(qp: &mut portico::rdma::Qp, batch: &[WorkRequest]) -> Result<(), AppError> {
    qp.post_send(batch)
        .map_err(|e| AppError::Failed(format!("posting {} work requests: {e}", batch.len())))
}

fn usage(msg: String) -> AppError {
    AppError::Usage(msg)
}

/// The points `opts` asks for: each size at each queue depth (queue depth outer, so that a
/// queue depth's sizes are one line of a sweep's plot).
pub fn points(opts: &BenchOpts) -> Vec<Point> {
    let sizes = if opts.sizes.is_empty() {
        vec![opts.size]
    } else {
        opts.sizes.clone()
    };
    let qds = if opts.qds.is_empty() {
        vec![opts.qd]
    } else {
        opts.qds.clone()
    };
    qds.iter()
        .flat_map(|&qd| sizes.iter().map(move |&size| Point { size, qd }))
        .collect()
}

/// The sizes of `--all-sizes`: 2 B to 8 MiB by powers of two, as perftest's `-a`.
pub fn all_sizes() -> Vec<u32> {
    (1..=23).map(|k| 1u32 << k).collect()
}

/// `--rate`, when given, is a positive, finite number of operations per second.
pub(crate) fn check_rate(opts: &BenchOpts) -> Result<(), AppError> {
    if opts.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        return Err(usage(
            "--rate: must be a positive number of operations per second".into(),
        ));
    }
    Ok(())
}

/// Checks what every run of the main loop needs of its options: the operation and the rate
/// (which flags a bench takes is clap's: `bench::args`).
pub(crate) fn check_main_loop(opts: &BenchOpts) -> Result<point::Ops, AppError> {
    check_rate(opts)?;
    match opts.op {
        BenchOp::Write => Ok(point::Ops::Write),
        BenchOp::Read => Ok(point::Ops::Read),
        BenchOp::Send => Ok(point::Ops::Send),
        BenchOp::Mixed => Ok(point::Ops::Mixed),
        other => Err(usage(format!(
            "bench {}: has its own run (bench::tagged::run, placement::run, congestion::run, shaper::run, persist via bench::run)",
            format!("{other:?}").to_lowercase()
        ))),
    }
}

/// Runs the benchmark, every point of it, until each point's duration is over or `stop` is
/// set (which ends the current point and the run), and returns its summary (printed by the
/// caller). `--hlog`, `--plot` and `--csv` are written here, with whatever was measured.
pub fn run(opts: &BenchOpts, stop: Arc<AtomicBool>) -> Result<BenchSummary, AppError> {
    if opts.op == BenchOp::Persist {
        // In one process bench persist runs one point: clap takes --sizes, --all-sizes
        // and --csv with --server or --client only, and one --qd (`bench::args`).
        return persist::run(opts, stop);
    }
    let ops = check_main_loop(opts)?;
    let points = points(opts);
    let (_, connections) = layout(opts)?;
    let threads = host_threads(opts, connections)?;
    let buf_len = point::buffer_len(&points);
    for p in &points {
        point::check_point(*p, connections, opts.verify, buf_len)?;
    }
    let recv_len = points.iter().map(|p| p.size).max().unwrap_or(1);
    limits::check_memory(
        "--size",
        &format!("four buffers of {buf_len} bytes"),
        4 * buf_len as u64,
        MemoryLimit::read().as_ref(),
    )
    .map_err(|e| usage(e.to_string()))?;
    let mut qp = QpConfig::new(0, 0);
    qp.pmtu = opts.mtu;
    qp.max_send_wr = 128;
    qp.max_recv_wr = 128;
    // The retransmission timeout is QpConfig's: adaptive, 250 µs to 100 ms (docs/transport.md).
    let Engines {
        memory,
        cores: (a, _),
        all_cores: cores,
        workers: worker_cores,
        inline,
        a: ea,
        b: eb,
        more,
        homes,
        running,
    } = start_engines(opts, qp)?;
    let host = |e: portico::rdma::HostError| AppError::Failed(format!("host call: {e}"));
    // The application's memory: four buffers it maps itself, then registers (on every worker
    // of an engine: the handle broadcasts).
    let map = |len: usize| {
        Mapping::anonymous_prefer_huge(len)
            .map(Arc::new)
            .map_err(|e| AppError::Failed(format!("mapping {len} bytes of buffer memory: {e}")))
    };
    let (a_src, a_dst, b_buf, b_recv) =
        (map(buf_len)?, map(buf_len)?, map(buf_len)?, map(buf_len)?);
    let buffers = a_src.kind().to_string();
    let ea_live = ea.engine.live_qps();
    let remote = eb.engine.register_all(&b_buf, Access::ALL).map_err(host)?;
    let regions = point::Buffers {
        src: ea.engine.register_all(&a_src, Access::ALL).map_err(host)?,
        dst: ea.engine.register_all(&a_dst, Access::ALL).map_err(host)?,
        remote: point::RemoteBuf {
            addr: remote.addr(),
            rkey: remote.rkey(),
        },
        peer: Some(point::LocalPeer {
            buf: remote,
            recv: eb
                .engine
                .register_all(&b_recv, Access::LOCAL_WRITE)
                .map_err(host)?,
        }),
        len: buf_len,
        recv_len,
    };
    let conns: Vec<point::Conn> = std::iter::once((ea.qp, ea.cq, eb.qp, eb.cq))
        .chain(more.into_iter().map(|c| (c.a.qp, c.a.cq, c.b.qp, c.b.cq)))
        .map(|(qp, cq, rqp, rcq)| point::Conn {
            qp,
            cq,
            peer: Some((rqp, rcq)),
        })
        .collect();
    // Engine A's queue pairs, as telemetry shows them (the live state is A's).
    let placements: Vec<portico::telemetry::QpHome> = conns
        .iter()
        .zip(&homes)
        .map(|(c, h)| portico::telemetry::QpHome {
            qpn: c.qp.qpn(),
            peer_qpn: c.peer.as_ref().map_or(0, |(q, _)| q.qpn()),
            worker: h[0],
            core: worker_cores.get(h[0]).copied().unwrap_or(0),
            peer_queue: h[1] as u16,
            udp_src_port: 0,
        })
        .collect();
    // Host thread t on the process's core t (the workers took the last ones): where the
    // machine has the cores, each thread has one of its own. Inline, loop t runs on worker t.
    let host_cores: Vec<usize> = if opts.inline {
        worker_cores.clone()
    } else {
        (0..threads).map(|t| cores[t % cores.len()]).collect()
    };
    debug_assert!(opts.inline || host_cores[0] == a);
    let hosts = if opts.inline {
        "the application inline on the workers".to_string()
    } else if threads == 1 {
        format!("host on core {a}")
    } else {
        format!(
            "{threads} host threads on cores {}",
            host_cores
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    let shared_core = !opts.inline
        && (host_cores.iter().any(|c| worker_cores.contains(c))
            || (1..threads).any(|t| host_cores[..t].contains(&host_cores[t])));
    let placing = if worker_cores.len() == 1 {
        format!(
            "both engines on core {}, {hosts}{}",
            worker_cores[0],
            if shared_core {
                " (sharing cores: this machine has fewer cores than workers + host threads)"
            } else {
                ""
            }
        )
    } else {
        let per_worker: Vec<String> = worker_cores
            .iter()
            .enumerate()
            .map(|(w, c)| {
                let qps = homes.iter().filter(|h| h[0] == w).count();
                format!("worker {w} on core {c} ({qps} QPs)")
            })
            .collect();
        format!(
            "{}; {hosts}{}",
            per_worker.join(", "),
            if shared_core {
                " (sharing cores: this machine has fewer cores than workers + host threads)"
            } else {
                ""
            }
        )
    };
    // /portico/... on EAL's telemetry socket: the workers' counters, engine A's queue pairs,
    // the current point's latency.
    let slot = portico::telemetry::LatencySlot::new();
    let telemetry = portico::telemetry::register(portico::telemetry::Instance {
        role: "bench",
        ports: running
            .port_ids
            .iter()
            .filter_map(|&(end, id)| Some((end.to_string(), id?)))
            .collect(),
        counters: running.runtime.counter_reader(),
        qps: placements,
        live: Some(ea_live),
        latency: portico::telemetry::LatencySource::Slot(slot.clone()),
    })
    .map_err(|e| eprintln!("warning: no telemetry commands: {e}"))
    .ok();
    let runner =
        point::Runner::new(conns, regions, ops, opts.rate, opts.verify).with_latency_slot(slot);
    let runner = match inline {
        Some(senders) => runner.inline(senders),
        None => runner.with_host_threads(host_cores[1..].to_vec()),
    };
    let host_layout: Vec<HostThread> = runner
        .host_layout()
        .into_iter()
        .enumerate()
        .map(|(t, qpns)| HostThread {
            thread: t,
            core: host_cores[t],
            qpns,
        })
        .collect();
    human(
        opts.json,
        &format!(
            "{}; {placing}; buffers: {buffers}",
            run_line(opts, &points, connections)
        ),
    );
    let measured = run_points(opts, runner, &points, &stop)?;
    // Every operation has completed, so nothing more is on the way.
    let stopped = running.finish(opts.pcap.as_ref())?;
    drop(telemetry);
    let mut summary = summarise(opts, &measured, memory, buffers, connections, stopped)?;
    summary.host_threads = host_layout;
    summary.inline = opts.inline;
    Ok(summary)
}

/// The line that says what a run does: operation, sizes, queue depths, queue pairs, loop,
/// MTU, duration.
pub(crate) fn run_line(opts: &BenchOpts, points: &[Point], connections: usize) -> String {
    let sizes: Vec<u32> = dedup(points.iter().map(|p| p.size));
    let qds: Vec<usize> = dedup(points.iter().map(|p| p.qd));
    let list = |v: Vec<String>| v.join(",");
    format!(
        "bench {}: {} B messages, queue depth {} over {} queue pair{}, {}, MTU {}, {}{}{}",
        format!("{:?}", opts.op).to_lowercase(),
        list(sizes.iter().map(|s| s.to_string()).collect()),
        list(qds.iter().map(|s| s.to_string()).collect()),
        connections,
        if connections == 1 { "" } else { "s" },
        opts.rate
            .map(|r| format!("{} ops/s intended", report::rate(r, "")))
            .unwrap_or_else(|| "closed loop".into()),
        opts.mtu.bytes(),
        opts.duration
            .map(|d| format!("{} s", d.as_secs_f64()))
            .unwrap_or_else(|| "until Ctrl-C".into()),
        if points.len() > 1 {
            format!(" per point, {} points", points.len())
        } else {
            String::new()
        },
        if opts.verify {
            ", every byte verified"
        } else {
            ""
        },
    )
}

fn dedup<T: PartialEq + Copy>(it: impl Iterator<Item = T>) -> Vec<T> {
    let mut v = Vec::new();
    for x in it {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}

/// What the points of a run measured, with the logs they filled.
pub(crate) struct RunMeasured {
    pub(crate) points: Vec<point::Measured>,
    pub(crate) hlog: Option<portico::latency::IntervalLog>,
    pub(crate) timeline: Option<portico::latency::IntervalLog>,
    /// The run ended before its last point (Ctrl-C, SIGTERM, or a point that could not drain).
    pub(crate) cut_short: bool,
}

/// The `.hlog` tag of operation type `k` at `p`: the type alone for a single point,
/// `write-4096B-qd32` in a sweep (tags may hold no spaces or commas).
fn hlog_tag(k: usize, p: Point, sweep: bool) -> String {
    if sweep {
        format!("{}-{}B-qd{}", OP_NAMES[k], p.size, p.qd)
    } else {
        OP_NAMES[k].to_string()
    }
}

/// Runs `points` one after the other on `runner`, with progress (point n of m, time left)
/// in a sweep; `stop` ends the current point cleanly and the run after it.
pub(crate) fn run_points(
    opts: &BenchOpts,
    mut runner: point::Runner,
    points: &[Point],
    stop: &AtomicBool,
) -> Result<RunMeasured, AppError> {
    let sweep = points.len() > 1;
    let tags: Vec<String> = points
        .iter()
        .flat_map(|&p| (0..3).map(move |k| hlog_tag(k, p, sweep)))
        .collect();
    let mut hlog = opts
        .hlog
        .as_ref()
        .map(|_| portico::latency::IntervalLog::new(&tags, opts.hlog_interval));
    // The timeline's intervals: finer than a log's, so that a run of seconds is a line.
    let mut timeline = opts.plot.as_ref().map(|_| {
        portico::latency::IntervalLog::new(&OP_NAMES.map(String::from), Duration::from_millis(100))
    });
    let mut measured = Vec::with_capacity(points.len());
    let t0 = Instant::now();
    let mut cut_short = false;
    for (i, &p) in points.iter().enumerate() {
        if stop.load(Ordering::Relaxed) && !measured.is_empty() {
            cut_short = true;
            break;
        }
        let prefix = if sweep {
            let left = opts
                .duration
                .map(|d| {
                    format!(
                        ", about {:.0} s left",
                        (d.as_secs_f64() + 0.05) * (points.len() - i) as f64
                    )
                })
                .unwrap_or_default();
            human(
                opts.json,
                &format!(
                    "point {}/{}: {} B, queue depth {} ({:.0} s so far{left})",
                    i + 1,
                    points.len(),
                    p.size,
                    p.qd,
                    t0.elapsed().as_secs_f64()
                ),
            );
            format!("[{}/{}] ", i + 1, points.len())
        } else {
            String::new()
        };
        let mut logs = point::Logs {
            hlog: hlog.as_mut().map(|l| (l, 3 * i)),
            timeline: timeline.as_mut(),
        };
        let m = runner.run(
            p,
            opts.duration,
            stop,
            &mut logs,
            &point::Progress {
                prefix,
                json: opts.json,
            },
        )?;
        let (stuck, interrupted) = (m.stuck, m.interrupted);
        measured.push(m);
        if stuck {
            human(
                opts.json,
                &format!(
                    "point {}: operations still outstanding {} s after it ended; the run stops here",
                    i + 1,
                    5
                ),
            );
        }
        if stuck || (interrupted && i + 1 < points.len()) {
            cut_short = true;
            break;
        }
    }
    let now = Instant::now();
    for log in [&mut hlog, &mut timeline].into_iter().flatten() {
        log.finish(now);
    }
    Ok(RunMeasured {
        points: measured,
        hlog,
        timeline,
        cut_short,
    })
}

/// The summary of what a run measured, beside what its engines reported when they stopped.
/// Writes `--hgrm`, `--hlog`, `--plot` and `--csv` from it.
pub(crate) fn summarise(
    opts: &BenchOpts,
    m: &RunMeasured,
    memory: MemoryChoice,
    buffers: String,
    connections: usize,
    stopped: Stopped,
) -> Result<BenchSummary, AppError> {
    let Stopped {
        workers,
        cores,
        ports,
        capture,
    } = stopped;
    let sweep = m.points.len() > 1 || !opts.sizes.is_empty() || !opts.qds.is_empty();
    // Operation type k's name: across two processes `bench persist` runs durable WRITEs and
    // `bench tagged` tagged sends, both counted where WRITEs are.
    let name = |k: usize| match (opts.op, k) {
        (BenchOp::Persist, 2) => "durable",
        (BenchOp::Tagged, 2) => "tagged",
        _ => OP_NAMES[k],
    };
    let mut points = Vec::with_capacity(m.points.len());
    let mut results = Vec::new();
    let mut verify: Option<VerifySummary> = None;
    let mut all = Latency::new();
    for p in &m.points {
        let size = p.point.size as f64;
        let rs: Vec<OpResult> = (0..3)
            .filter(|&k| p.counts[k] > 0)
            .map(|k| OpResult {
                op: name(k),
                size: Some(p.point.size),
                qd: Some(p.point.qd),
                ops: p.counts[k],
                ops_per_sec: p.counts[k] as f64 / p.seconds,
                gbit_per_sec: p.counts[k] as f64 * size * 8.0 / p.seconds / 1e9,
                latency_ns: p.hist[k].summary(),
            })
            .collect();
        for h in &p.hist {
            all.merge(h);
        }
        if let Some(v) = p.verify {
            let t = verify.get_or_insert_with(VerifySummary::default);
            t.checked_ops += v.checked_ops;
            t.checked_bytes += v.checked_bytes;
            t.mismatches += v.mismatches;
        }
        results.extend(rs.iter().cloned());
        points.push(PointSummary {
            size: p.point.size,
            qd: p.point.qd,
            seconds: p.seconds,
            results: rs,
            errors: p.errors,
            interrupted: p.interrupted,
        });
    }
    if let Some(path) = &opts.hgrm {
        write_hgrm(path, &all)?;
    }
    if let (Some(path), Some(log)) = (&opts.hlog, &m.hlog) {
        let comment = format!(
            "portico bench {}: {}, latency in ns per operation type{}",
            format!("{:?}", opts.op).to_lowercase(),
            m.points
                .iter()
                .map(|p| format!("{} B qd {}", p.point.size, p.point.qd))
                .collect::<Vec<_>>()
                .join("; "),
            if sweep { " and point" } else { "" }
        );
        let written = std::fs::File::create(path).and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            log.write(&mut w, &comment)?;
            std::io::Write::flush(&mut w)
        });
        written.map_err(|e| AppError::Failed(format!("writing {}: {e}", path.display())))?;
    }
    let mut plots = Vec::new();
    if let (Some(dir), Some(log)) = (&opts.plot, &m.timeline) {
        let op = format!("{:?}", opts.op).to_lowercase();
        let named: latency_plot::Named<'_> = m
            .points
            .iter()
            .flat_map(|p| {
                (0..3).filter(|&k| p.counts[k] > 0).map(move |k| {
                    let name = if sweep {
                        format!("{} {} B qd {}", name(k), p.point.size, p.point.qd)
                    } else {
                        name(k).to_string()
                    };
                    (name, &p.hist[k])
                })
            })
            .collect();
        let title = match m.points.as_slice() {
            [p] => format!("{} B {op}, queue depth {}", p.point.size, p.point.qd),
            _ => format!("{op}, {} points", m.points.len()),
        };
        let failed = |e: std::io::Error| {
            AppError::Failed(format!("writing plots into {}: {e}", dir.display()))
        };
        let (a, b) = latency_plot::write(dir, &title, &named, log).map_err(failed)?;
        plots = vec![a.display().to_string(), b.display().to_string()];
        if sweep {
            let s = latency_plot::write_sweep(dir, &op, &results).map_err(failed)?;
            plots.push(s.display().to_string());
        }
    }
    if let Some(path) = &opts.csv {
        std::fs::write(path, csv(&points, &format!("{:?}", opts.op).to_lowercase()))
            .map_err(|e| AppError::Failed(format!("writing {}: {e}", path.display())))?;
    }
    let last = m.points.last().map(|p| p.point);
    Ok(BenchSummary {
        plots,
        op: opts.op,
        size: last.map_or(opts.size, |p| p.size),
        qd: last.map_or(opts.qd, |p| p.qd),
        rate: opts.rate,
        seconds: m.points.iter().map(|p| p.seconds).sum(),
        memory,
        buffers,
        results,
        errors: m.points.iter().map(|p| p.errors).sum(),
        verify,
        connections,
        workers,
        cores,
        ports,
        capture,
        persist: None,
        points: if sweep { points } else { Vec::new() },
        interrupted: m.cut_short || m.points.iter().any(|p| p.interrupted),
        csv: opts.csv.as_ref().map(|p| p.display().to_string()),
        server: None,
        host_threads: Vec::new(),
        inline: false,
    })
}

/// The CSV of a run: one row per point and operation type.
///
/// A point that completed no operation (cut by Ctrl-C before its first completion) still has
/// its row, as it has its entry in the JSON: op `bench_op`, 0 operations, no latencies.
pub(crate) fn csv(points: &[PointSummary], bench_op: &str) -> String {
    let mut out = String::from(
        "op,size,qd,ops,seconds,ops_per_sec,gbit_per_sec,p50_ns,p90_ns,p99_ns,p99_9_ns,p99_99_ns,max_ns,mean_ns,errors,interrupted\n",
    );
    for p in points {
        if p.results.is_empty() {
            out.push_str(&format!(
                "{bench_op},{},{},0,{:.6},0.0,0.000000,,,,,,,,{},{}\n",
                p.size, p.qd, p.seconds, p.errors, p.interrupted
            ));
        }
        for r in &p.results {
            let l = &r.latency_ns;
            out.push_str(&format!(
                "{},{},{},{},{:.6},{:.1},{:.6},{},{},{},{},{},{},{:.1},{},{}\n",
                r.op,
                p.size,
                p.qd,
                r.ops,
                p.seconds,
                r.ops_per_sec,
                r.gbit_per_sec,
                l.p50,
                l.p90,
                l.p99,
                l.p99_9,
                l.p99_99,
                l.max,
                l.mean,
                p.errors,
                p.interrupted
            ));
        }
    }
    out
}

/// Writes `h` to `path` in HdrHistogram's .hgrm format, in microseconds.
fn write_hgrm(path: &Path, h: &Latency) -> Result<(), AppError> {
    let failed = |source| AppError::Capture {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::create(path).map_err(failed)?;
    h.write_hgrm(std::io::BufWriter::new(file), 1000.0)
        .map_err(failed)
}

fn human(json: bool, line: &str) {
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// Prints the summary: a table per operation type, or one JSON object.
/// A bench summary as one JSON object on stdout, `"type": "bench"` added.
pub(crate) fn print_json<T: Serialize>(s: &T) {
    let mut v = serde_json::to_value(s).expect("summary serialises");
    v["type"] = serde_json::json!("bench");
    println!("{v}");
}

pub fn print(s: &BenchSummary, json: bool, hgrm: Option<&PathBuf>) {
    if json {
        return print_json(s);
    }
    println!();
    println!(
        "bench summary: {:.2} s, {} errors{}",
        s.seconds,
        s.errors,
        if s.interrupted {
            " (interrupted: what was measured until then)"
        } else {
            ""
        }
    );
    if s.points.is_empty() {
        op_table(&s.results, false);
    } else {
        // A sweep: one table per operation type, a row per point.
        for op in OP_NAMES.iter().chain(&["durable", "tagged"]) {
            let rows: Vec<OpResult> = s.results.iter().filter(|r| r.op == *op).cloned().collect();
            if !rows.is_empty() {
                println!("  {op}:");
                op_table(&rows, true);
            }
        }
    }
    print_workers(&s.workers);
    println!("  cores: {}", s.cores.line());
    if let Some(line) = s.cores.trips_line() {
        println!("  {line}");
    }
    report::port_table(&s.ports);
    if let Some(v) = &s.verify {
        println!(
            "  verify: {} operations, {} bytes compared, {} mismatched",
            v.checked_ops, v.checked_bytes, v.mismatches
        );
    }
    if let Some(p) = &s.persist {
        persist::print(p);
    }
    for p in &s.plots {
        println!("  plot: {p}");
    }
    if let Some(c) = &s.csv {
        println!("  csv: {c}");
    }
    if let Some(v) = &s.server {
        println!(
            "  server side: {} messages received (SENDs, tagged sends), {} receive errors, its port rx {} tx {} packets",
            v["receives"],
            v["receive_errors"],
            v["ports"][0]["stats"]["rx_packets"],
            v["ports"][0]["stats"]["tx_packets"]
        );
    }
    if let Some(p) = hgrm {
        println!("  latency distribution (µs) written to {}", p.display());
    }
    if let Some(c) = &s.capture {
        println!("  capture: {} packets written to {}", c.packets, c.path);
    }
}

/// The results table: a row per operation type, or (`by_point`) per point of one type.
fn op_table(rows: &[OpResult], by_point: bool) {
    let us = |ns: u64| ns as f64 / 1000.0;
    let head = if by_point {
        format!("  {:>8} {:>4}", "bytes", "qd")
    } else {
        format!("  {:<6}", "op")
    };
    println!(
        "{head} {:>10} {:>12} {:>10}   latency µs: {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "ops", "ops/s", "Gbit/s", "p50", "p90", "p99", "p99.9", "p99.99", "max"
    );
    for r in rows {
        let l = &r.latency_ns;
        let key = if by_point {
            format!("  {:>8} {:>4}", r.size.unwrap_or(0), r.qd.unwrap_or(0))
        } else {
            format!("  {:<6}", r.op)
        };
        println!(
            "{key} {:>10} {:>12.0} {:>10.3}               {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            r.ops,
            r.ops_per_sec,
            r.gbit_per_sec,
            us(l.p50),
            us(l.p90),
            us(l.p99),
            us(l.p99_9),
            us(l.p99_99),
            us(l.max)
        );
    }
}

/// One line per worker with its nonzero counters.
pub(crate) fn print_workers(workers: &[portico::runtime::WorkerReport]) {
    for w in workers {
        let c: Vec<String> = w
            .counters
            .iter()
            .filter(|(_, v)| *v > 0)
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        println!(
            "  worker {} (core {}): {}",
            w.worker,
            w.core.unwrap_or(0),
            c.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_has_a_csv_row_even_one_cut_before_its_first_completion() {
        let mut h = Latency::new();
        h.record(2_000);
        let measured = PointSummary {
            size: 2,
            qd: 64,
            seconds: 1.0,
            results: vec![OpResult {
                op: "write",
                size: Some(2),
                qd: Some(64),
                ops: 1,
                ops_per_sec: 1.0,
                gbit_per_sec: 0.000000016,
                latency_ns: h.summary(),
            }],
            errors: 0,
            interrupted: false,
        };
        let cut = PointSummary {
            size: 4,
            qd: 64,
            seconds: 0.002,
            results: Vec::new(),
            errors: 0,
            interrupted: true,
        };
        let text = csv(&[measured, cut], "write");
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(rows.len(), 3, "{text}");
        assert!(rows[1].starts_with("write,2,64,1,1.000000,"), "{text}");
        assert_eq!(rows[2], "write,4,64,0,0.002000,0.0,0.000000,,,,,,,,0,true");
        // As many fields as the header.
        let fields = rows[0].split(',').count();
        assert!(
            rows.iter().all(|r| r.split(',').count() == fields),
            "{text}"
        );
    }
}
