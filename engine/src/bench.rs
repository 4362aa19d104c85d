//! `portico bench`: RDMA operations between two engines on a `net_ring` link in one process,
//! with throughput and HdrHistogram latency per operation type.
//!
//! The host thread keeps `qd` operations outstanding on engine A's queue pair. With `--rate`,
//! operation *k* is due at `start + k / rate`. Its latency is measured from that intended time,
//! not from when it was actually posted, so a stall of the engine shows up in the percentiles
//! instead of quietly delaying the operations behind it (no coordinated omission). Without a
//! rate the loop is closed, and latency runs from posting to completion.
//!
//! A run lasts `--duration` seconds, or until Ctrl-C or SIGTERM when it is 0; either way it
//! then waits for what is outstanding and prints its summary, with the two `net_ring` ports'
//! own counters (misses, errors, mbuf allocation failures, drop xstats) beside the engines'.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pmem::Mapping;
use serde::Serialize;

use crate::app::{
    AppError, MemoryChoice, PortSummary, available_cores, check_pool_fits, plan_eal_args,
    port_summary,
};
use crate::config::{HugepageMode, MemoryLimit, limits};
use crate::dataplane::{self, Eal, PortInfo};
use crate::hugepages::HugepageStatus;
use crate::latency::{Latency, LatencySummary};
use crate::rdma::MemoryRegion;
use crate::rdma::loopback::{self, LoopbackOpts};
use crate::report;
use crate::runtime::{CaptureSink, Runtime};
use crate::transport::{
    Access, Mtu, QpConfig, RecvRequest, WcOpcode, WcStatus, WorkCompletion, WorkRequest,
};

pub mod congestion;
pub mod latency_plot;
pub mod persist;
pub mod placement;
mod plot;
pub mod shaper;
pub mod tagged;

/// Which operations to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
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
    /// `tagged` only: the parts to run (empty: all).
    pub part: Vec<tagged::TaggedPart>,
    /// Workers the two engines run on (`--cores`): 1 puts both engines on one worker; N > 1
    /// runs N workers, worker *i* holding shard *i* of both engines (`rdma::loopback`).
    pub cores: usize,
    /// Queue pairs between the engines (`--connections`; at least `cores`; default `cores`).
    pub connections: Option<usize>,
}

/// One operation type's results.
#[derive(Debug, Clone, Serialize)]
pub struct OpResult {
    pub op: &'static str,
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
    pub workers: Vec<crate::runtime::WorkerReport>,
    /// Where the host thread, each worker and EAL's own threads ran, read while the workers
    /// ran.
    pub cores: crate::app::CoresReport,
    /// The two `net_ring` ports' own counters, `a` (engine A's) then `b`.
    pub ports: Vec<PortSummary>,
    pub capture: Option<crate::app::CaptureSummary>,
    /// `persist` only: the mode, what the target's region is, and the queue pair's tuning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persist: Option<persist::PersistSummary>,
    /// With `--plot DIR`: the SVGs written (latency by percentile, the run over time).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plots: Vec<String>,
}

/// Bytes of each of the four application buffers at most.
const BUF_CAP: usize = 64 << 20;

/// Mbufs in the engines' pool, as `rdma::loopback` creates it (checked against EAL's memory
/// before EAL starts).
const LOOPBACK_MBUFS: u32 = 16383;

const OP_NAMES: [&str; 3] = ["read", "send", "write"];

fn op_index(op: WcOpcode) -> usize {
    match op {
        WcOpcode::RdmaRead => 0,
        WcOpcode::Send => 1,
        _ => 2,
    }
}

/// The pattern operation `id` carries: 8-byte little-endian words that differ per operation
/// and per word; a short tail takes the first bytes of one more word.
fn pattern_word(seed: u64, i: usize) -> u64 {
    seed ^ (i as u64).wrapping_mul(0xff51_afd7_ed55_8ccd)
}

fn pattern_seed(id: u64) -> u64 {
    (id + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn fill_pattern(id: u64, buf: &mut [u8]) {
    let seed = pattern_seed(id);
    let mut words = buf.chunks_exact_mut(8);
    let mut n = 0;
    for (i, w) in (&mut words).enumerate() {
        w.copy_from_slice(&pattern_word(seed, i).to_le_bytes());
        n = i + 1;
    }
    let rest = words.into_remainder();
    let tail = pattern_word(seed, n).to_le_bytes();
    let k = rest.len();
    rest.copy_from_slice(&tail[..k]);
}

/// Whether `buf` holds operation `id`'s pattern: one pass, comparing word by word as the
/// pattern is computed.
fn has_pattern(id: u64, buf: &[u8]) -> bool {
    let seed = pattern_seed(id);
    let mut words = buf.chunks_exact(8);
    let mut n = 0;
    let mut diff = 0u64;
    for (i, w) in (&mut words).enumerate() {
        diff |= u64::from_le_bytes(w.try_into().expect("8 bytes")) ^ pattern_word(seed, i);
        n = i + 1;
    }
    let rest = words.remainder();
    diff == 0 && rest == &pattern_word(seed, n).to_le_bytes()[..rest.len()]
}

/// The host's view of `--verify`: scratch space, no allocation per operation.
struct Verifier {
    buf: Vec<u8>,
    summary: VerifySummary,
}

impl Verifier {
    fn new(size: usize) -> Verifier {
        Verifier {
            buf: vec![0; size],
            summary: VerifySummary::default(),
        }
    }

    /// Writes operation `id`'s pattern into `mr` at `offset`.
    fn fill(&mut self, id: u64, mr: &MemoryRegion, offset: usize) {
        fill_pattern(id, &mut self.buf);
        mr.write(offset, &self.buf).expect("slot inside the buffer");
    }

    /// Compares what landed in `mr` at `offset` with operation `id`'s pattern.
    fn check(&mut self, id: u64, mr: &MemoryRegion, offset: usize) {
        mr.read(offset, &mut self.buf)
            .expect("slot inside the buffer");
        self.summary.checked_ops += 1;
        self.summary.checked_bytes += self.buf.len() as u64;
        if !has_pattern(id, &self.buf) {
            self.summary.mismatches += 1;
        }
    }
}

/// Where an operation's bytes landed, for `--verify`.
#[derive(Debug, Clone, Copy)]
enum Landed {
    /// B's buffer (a WRITE's target).
    Remote,
    /// A's READ destination.
    Back,
    /// B's receive buffer (a SEND).
    Received,
}

impl Landed {
    fn region<'a>(
        self,
        remote: &'a MemoryRegion,
        back: &'a MemoryRegion,
        received: &'a MemoryRegion,
    ) -> &'a MemoryRegion {
        match self {
            Landed::Remote => remote,
            Landed::Back => back,
            Landed::Received => received,
        }
    }
}

/// Completions taken per poll.
const WCS_LEN: usize = 64;

/// Under `--verify`, buffer slots needed per operation outstanding.
const VERIFY_SLOTS_PER_QD: usize = 4;

/// Under `--verify`, a doorbell for every this many filled requests.
const VERIFY_RING_EVERY: usize = 8;

/// A bench's two engines, running: EAL started, the loopback pair up.
pub(crate) struct Engines {
    pub(crate) memory: MemoryChoice,
    /// The host's core (EAL's main lcore) and the (first) engines' core.
    pub(crate) cores: (usize, usize),
    /// The workers' cores, in worker order.
    pub(crate) workers: Vec<usize>,
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
}

/// What a bench reports about its engines once they have stopped.
pub(crate) struct Stopped {
    pub(crate) workers: Vec<crate::runtime::WorkerReport>,
    /// Where the threads ran, sampled just before the workers stopped.
    pub(crate) cores: crate::app::CoresReport,
    pub(crate) ports: Vec<PortSummary>,
    pub(crate) capture: Option<crate::app::CaptureSummary>,
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
    let max = crate::dataplane::RING_MAX_QUEUES as usize;
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
        crate::rdma::FRAME_DATA_ROOM,
        ("--memory-mb", "--hugepages"),
        "",
    )?;
    let info = Eal::init(&args)?;
    report::banner(info, &memory, opts.json);
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
        workers,
        a: ea,
        b: eb,
        more,
        homes,
        running: Running {
            runtime,
            capture,
            port_ids,
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
    ) -> Result<(Vec<PortSummary>, Vec<crate::runtime::WorkerReport>), AppError> {
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
        let cores = crate::app::CoresReport::sample();
        let workers = self.runtime.join()?;
        let capture = match (self.capture, pcap) {
            (Some(sink), Some(path)) => Some(crate::app::CaptureSummary {
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

fn post_batch(qp: &mut crate::rdma::Qp, batch: &[WorkRequest]) -> Result<(), AppError> {
    qp.post_send(batch)
        .map_err(|e| AppError::Failed(format!("posting {} work requests: {e}", batch.len())))
}

fn usage(msg: String) -> AppError {
    AppError::Usage(msg)
}

/// Runs the benchmark until its duration is over or `stop` is set, and returns its summary
/// (printed by the caller).
pub fn run(opts: &BenchOpts, stop: Arc<AtomicBool>) -> Result<BenchSummary, AppError> {
    if matches!(
        opts.op,
        BenchOp::Tagged | BenchOp::Placement | BenchOp::Congestion
    ) {
        return Err(usage(
            "bench tagged, placement and congestion have their own summaries: run them with bench::tagged::run, bench::placement::run and bench::congestion::run".into(),
        ));
    }
    if !opts.part.is_empty() {
        return Err(usage("--part: only `bench tagged` takes it".into()));
    }
    if opts.op == BenchOp::Persist {
        return persist::run(opts, stop);
    }
    if opts.mode.is_some() {
        return Err(usage("--mode: only `bench persist` takes it".into()));
    }
    if opts.file.is_some() {
        return Err(usage("--file: only `bench persist` takes it".into()));
    }
    if opts.size == 0 || opts.size as usize > BUF_CAP / 4 {
        return Err(usage(format!("--size: must be 1..={} bytes", BUF_CAP / 4)));
    }
    if opts.qd == 0 || opts.qd > 120 {
        return Err(usage(
            "--qd: must be 1..=120 (the send queue holds 128)".into(),
        ));
    }
    if opts.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        return Err(usage(
            "--rate: must be a positive number of operations per second".into(),
        ));
    }
    let size = opts.size as usize;
    let (_, connections) = layout(opts)?;
    if opts.qd < connections {
        return Err(usage(format!(
            "--qd: {} is fewer than the {connections} queue pairs (--qd is the total outstanding, spread over them)",
            opts.qd
        )));
    }
    // Buffer slots: each queue pair has its own share of every buffer, and its operation k
    // uses slot k mod its share. With --verify a slot must not be reused while an operation on
    // it may still be outstanding or unchecked. At most a window's worth are outstanding per
    // queue pair, a completion is checked one loop round after it is polled, and a receive
    // completion may be polled a round after its SEND's; four times the window leaves a
    // margin over all of that.
    let slots = (BUF_CAP / size).clamp(1, 1024);
    let share = slots / connections;
    let widest = opts.qd.div_ceil(connections);
    if share == 0 || (opts.verify && share < VERIFY_SLOTS_PER_QD * widest) {
        return Err(usage(format!(
            "--verify: {} slots of {size} B fit the {} MiB buffers, fewer than four times --qd {} (over {connections} queue pairs); lower --qd or --size",
            slots,
            BUF_CAP >> 20,
            opts.qd
        )));
    }
    let buf_len = slots * size;
    limits::check_memory(
        "--size",
        &format!("four buffers of {slots} slots of {size} bytes"),
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
        workers: worker_cores,
        a: ea,
        b: eb,
        more,
        homes,
        running,
    } = start_engines(opts, qp)?;
    let host = |e: crate::rdma::HostError| AppError::Failed(format!("host call: {e}"));
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
    let src = ea.engine.register_all(&a_src, Access::ALL).map_err(host)?;
    let dst = ea.engine.register_all(&a_dst, Access::ALL).map_err(host)?;
    let remote = eb.engine.register_all(&b_buf, Access::ALL).map_err(host)?;
    let recv = eb
        .engine
        .register_all(&b_recv, Access::LOCAL_WRITE)
        .map_err(host)?;
    let lanes_n = connections;
    let mut lanes: Vec<Lane> = std::iter::once((ea.qp, ea.cq, eb.qp, eb.cq))
        .chain(more.into_iter().map(|c| (c.a.qp, c.a.cq, c.b.qp, c.b.cq)))
        .enumerate()
        .map(|(i, (qp, cq, rqp, rcq))| {
            // The total window, dealt out: the first `qd % n` queue pairs take one more.
            let window = opts.qd / lanes_n + usize::from(i < opts.qd % lanes_n);
            Lane::new(i, window, qp, cq, rqp, rcq)
        })
        .collect();
    let slot_of = |lane: usize, k: u64| (lane * share + k as usize % share) * size;

    let placing = if worker_cores.len() == 1 {
        format!("both engines on core {}, host on core {a}", worker_cores[0])
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
            "{}; host on core {a}{}",
            per_worker.join(", "),
            if worker_cores.contains(&a) {
                " (shared with a worker: this machine has fewer cores than workers + host)"
            } else {
                ""
            }
        )
    };
    human(
        opts.json,
        &format!(
            "bench {:?}: {} B messages, queue depth {} over {} queue pair{}, {}, MTU {}, {}{}; {placing}; buffers: {buffers}",
            opts.op,
            size,
            opts.qd,
            lanes_n,
            if lanes_n == 1 { "" } else { "s" },
            opts.rate
                .map(|r| format!("{} ops/s intended", report::rate(r, "")))
                .unwrap_or_else(|| "closed loop".into()),
            opts.mtu.bytes(),
            opts.duration
                .map(|d| format!("{} s", d.as_secs_f64()))
                .unwrap_or_else(|| "until Ctrl-C".into()),
            if opts.verify {
                ", every byte verified"
            } else {
                ""
            },
        ),
    );

    let mut verifier = opts.verify.then(|| Verifier::new(size));
    let mut hist: [Latency; 3] = Default::default();
    let mut counts = [0u64; 3];
    let mut hlog = opts
        .hlog
        .as_ref()
        .map(|_| crate::latency::IntervalLog::new(&OP_NAMES, opts.hlog_interval));
    // The timeline's intervals: finer than a log's, so that a run of seconds is a line.
    let mut plot_log = opts
        .plot
        .as_ref()
        .map(|_| crate::latency::IntervalLog::new(&OP_NAMES, Duration::from_millis(100)));
    // With --verify: landed bytes to check, as (operation id, which buffer, offset). They are
    // checked after the next batch is posted, so the engine has work while the host compares.
    let mut to_check: Vec<(u64, Landed, usize)> = Vec::with_capacity(2 * WCS_LEN * lanes_n);
    // 0 WRITE, 1 READ, 2 SEND (by the operation's number over all queue pairs); and the
    // buffer an operation's data comes from.
    let kind_of = |k: u64| match opts.op {
        BenchOp::Write => 0,
        BenchOp::Read => 1,
        BenchOp::Send => 2,
        BenchOp::Mixed => k % 3,
        BenchOp::Persist
        | BenchOp::Tagged
        | BenchOp::Placement
        | BenchOp::Congestion
        | BenchOp::Shaper => {
            unreachable!(
                "`bench persist`, `tagged`, `placement`, `congestion` and `shaper` run in their own modules"
            )
        }
    };
    let mut wcs = [WorkCompletion::EMPTY; WCS_LEN];
    let mut errors = 0u64;
    let t0 = Instant::now();
    // When posting ends: the duration's end, or the moment `stop` is seen.
    let mut end = opts.duration.and_then(|d| t0.checked_add(d));
    // Operations posted over all queue pairs: operation k is due at t0 + k / rate.
    let mut next_k = 0u64;
    // The queue pair that takes the next operation of a closed loop.
    let mut cursor = 0usize;
    let mut last_print = t0;
    let mut last_done = 0u64;
    let mut done = 0u64;
    let uses_send = matches!(opts.op, BenchOp::Send | BenchOp::Mixed);
    loop {
        let now = Instant::now();
        if stop.load(Ordering::Relaxed) && end.is_none_or(|e| e > now) {
            end = Some(now);
        }
        let ended = end.is_some_and(|e| now >= e);
        if uses_send {
            // Keep B's receive queues a window ahead of the SENDs, before any of this round's
            // SENDs is posted (filling sources can take longer than the RNR retries last).
            for l in &mut lanes {
                let lane = l.index;
                l.recv_batch.clear();
                while l.recv_posted < l.sends_posted + l.window as u64
                    && l.recv_batch.len() < l.recv_batch.capacity()
                {
                    let slot = slot_of(lane, l.recv_posted);
                    l.recv_batch
                        .push(RecvRequest::new(l.recv_posted, recv.sgl(slot, opts.size)));
                    l.recv_posted += 1;
                }
                if let Err(full) = l.rqp.post_recv(&l.recv_batch) {
                    l.recv_posted -= (l.recv_batch.len() - full.posted) as u64;
                }
            }
        }
        // Post while there is room in a window and (with a rate) the next operation is due:
        // each queue pair's batch with one doorbell. Operations go to the queue pairs in turn.
        for l in &mut lanes {
            l.batch.clear();
        }
        let mut blocked = 0;
        while !ended && blocked < lanes_n {
            // With a rate, operation k belongs to queue pair k mod n and waits for it; closed,
            // the next queue pair in turn that has room takes it.
            let lane = match opts.rate {
                Some(_) => (next_k % lanes_n as u64) as usize,
                None => cursor,
            };
            let l = &mut lanes[lane];
            if l.outstanding + l.batch.len() >= l.window {
                if opts.rate.is_some() {
                    break;
                }
                blocked += 1;
                cursor = next_lane(cursor, lanes_n);
                continue;
            }
            blocked = 0;
            let intended = match opts.rate {
                // An operation due beyond any clock reading (a tiny rate) is never due.
                Some(r) => match Duration::try_from_secs_f64(next_k as f64 / r)
                    .ok()
                    .and_then(|d| t0.checked_add(d))
                {
                    Some(t) => t,
                    None => break,
                },
                None => now,
            };
            if intended > now {
                break;
            }
            let seq = l.next_seq;
            let id = (seq << LANE_BITS) | lane as u64;
            let slot = slot_of(lane, seq);
            let kind = kind_of(next_k);
            if let Some(v) = verifier.as_mut() {
                v.fill(id, if kind == 1 { &remote } else { &src }, slot);
            }
            let wr = match kind {
                0 => WorkRequest::write(
                    id,
                    src.sgl(slot, opts.size),
                    remote.addr() + slot as u64,
                    remote.rkey(),
                    None,
                ),
                1 => WorkRequest::read(
                    id,
                    dst.sgl(slot, opts.size),
                    remote.addr() + slot as u64,
                    remote.rkey(),
                ),
                _ => {
                    let mask = l.mask();
                    l.send_ids[l.sends_posted as usize & mask] = id;
                    l.sends_posted += 1;
                    WorkRequest::send(id, src.sgl(slot, opts.size), None)
                }
            };
            l.batch.push(wr);
            let mask = l.mask();
            l.started[seq as usize & mask] = Some(intended);
            l.next_seq += 1;
            next_k += 1;
            cursor = next_lane(cursor, lanes_n);
            if verifier.is_some() && l.batch.len() == VERIFY_RING_EVERY {
                // Filling takes time: ring for what is ready rather than for the whole batch.
                l.flush()?;
            }
        }
        for l in &mut lanes {
            l.flush()?;
        }
        if let Some(v) = verifier.as_mut() {
            for &(id, landed, slot) in &to_check {
                v.check(id, landed.region(&remote, &dst, &recv), slot);
            }
            to_check.clear();
        }
        for l in &mut lanes {
            let lane = l.index;
            let n = l.cq.poll(&mut wcs);
            if n > 0 {
                // One clock read per batch of completions: the work they did ended by now.
                let polled_at = Instant::now();
                for log in [&mut hlog, &mut plot_log].into_iter().flatten() {
                    log.tick(polled_at);
                }
                let mask = l.mask();
                for wc in &wcs[..n] {
                    let seq = wc.wr_id >> LANE_BITS;
                    let Some(t) = l.started[seq as usize & mask].take() else {
                        continue;
                    };
                    l.outstanding -= 1;
                    if wc.status != WcStatus::Success {
                        errors += 1;
                        continue;
                    }
                    let k = op_index(wc.opcode);
                    let ns = polled_at.saturating_duration_since(t).as_nanos() as u64;
                    hist[k].record(ns);
                    for log in [&mut hlog, &mut plot_log].into_iter().flatten() {
                        log.record(k, ns);
                    }
                    counts[k] += 1;
                    done += 1;
                    if verifier.is_some() {
                        let slot = slot_of(lane, seq);
                        match wc.opcode {
                            WcOpcode::RdmaWrite => to_check.push((wc.wr_id, Landed::Remote, slot)),
                            WcOpcode::RdmaRead => to_check.push((wc.wr_id, Landed::Back, slot)),
                            _ => {}
                        }
                    }
                }
            }
            if uses_send {
                let n = l.rcq.poll(&mut wcs);
                let mask = l.mask();
                for wc in &wcs[..n] {
                    let id = l.send_ids[l.sends_received as usize & mask];
                    l.sends_received += 1;
                    if wc.status != WcStatus::Success {
                        errors += 1;
                    } else if verifier.is_some() {
                        to_check.push((id, Landed::Received, slot_of(lane, wc.wr_id)));
                    }
                }
            }
        }
        let outstanding: usize = lanes.iter().map(|l| l.outstanding).sum();
        if now.duration_since(last_print) >= Duration::from_secs(1) {
            let dt = now.duration_since(last_print).as_secs_f64();
            human(
                opts.json,
                &format!(
                    "[{:6.1}s] {:>12} ops/s  {:>14}  outstanding {}",
                    now.duration_since(t0).as_secs_f64(),
                    report::rate((done - last_done) as f64 / dt, ""),
                    report::rate((done - last_done) as f64 * size as f64 * 8.0 / dt, "bit/s"),
                    outstanding
                ),
            );
            last_print = now;
            last_done = done;
        }
        let receives_done = !uses_send || lanes.iter().all(|l| l.sends_received == l.sends_posted);
        if ended && outstanding == 0 && receives_done {
            break;
        }
        if end.is_some_and(|e| now.saturating_duration_since(e) >= Duration::from_secs(5)) {
            errors += outstanding as u64;
            break;
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    if let Some(v) = verifier.as_mut() {
        for &(id, landed, slot) in &to_check {
            v.check(id, landed.region(&remote, &dst, &recv), slot);
        }
    }
    // Every operation has completed, so nothing more is on the way.
    let Stopped {
        workers,
        cores,
        ports,
        capture,
    } = running.finish(opts.pcap.as_ref())?;

    let results: Vec<OpResult> = (0..3)
        .filter(|&k| counts[k] > 0)
        .map(|k| OpResult {
            op: OP_NAMES[k],
            ops: counts[k],
            ops_per_sec: counts[k] as f64 / seconds,
            gbit_per_sec: counts[k] as f64 * size as f64 * 8.0 / seconds / 1e9,
            latency_ns: hist[k].summary(),
        })
        .collect();
    if let Some(path) = &opts.hgrm {
        let mut all = Latency::new();
        for h in &hist {
            all.merge(h);
        }
        write_hgrm(path, &all)?;
    }
    if let (Some(path), Some(log)) = (&opts.hlog, &mut hlog) {
        log.finish(Instant::now());
        let comment = format!(
            "portico bench {}: {} B, queue depth {}, latency in ns per operation type",
            format!("{:?}", opts.op).to_lowercase(),
            opts.size,
            opts.qd
        );
        let written = std::fs::File::create(path).and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            log.write(&mut w, &comment)?;
            std::io::Write::flush(&mut w)
        });
        written.map_err(|e| AppError::Failed(format!("writing {}: {e}", path.display())))?;
    }
    let mut plots = Vec::new();
    if let (Some(dir), Some(log)) = (&opts.plot, &mut plot_log) {
        log.finish(Instant::now());
        let named: latency_plot::Named<'_> = (0..3)
            .filter(|&k| counts[k] > 0)
            .map(|k| (OP_NAMES[k], &hist[k]))
            .collect();
        let title = format!(
            "{} B {}, queue depth {}",
            opts.size,
            format!("{:?}", opts.op).to_lowercase(),
            opts.qd
        );
        let (a, b) = latency_plot::write(dir, &title, &named, log)
            .map_err(|e| AppError::Failed(format!("writing plots into {}: {e}", dir.display())))?;
        plots = vec![a.display().to_string(), b.display().to_string()];
    }
    Ok(BenchSummary {
        plots,
        op: opts.op,
        size: opts.size,
        qd: opts.qd,
        rate: opts.rate,
        seconds,
        memory,
        buffers,
        results,
        errors,
        verify: verifier.map(|v| v.summary),
        connections: lanes_n,
        workers,
        cores,
        ports,
        capture,
        persist: None,
    })
}

/// The queue pair after `lane` of `n`, round robin (no division per operation).
fn next_lane(lane: usize, n: usize) -> usize {
    if lane + 1 >= n { 0 } else { lane + 1 }
}

/// Bits of an operation's id that name its queue pair (`--connections` is at most 256): the
/// id of queue pair `index`'s operation `seq` is `seq << LANE_BITS | index`, taken apart with a
/// shift rather than a division per completion.
const LANE_BITS: u32 = 8;

/// One queue pair of the bench: A's end (posts and completions) and B's (receives), with the
/// share of the window, the buffers and the bookkeeping that belong to it.
struct Lane {
    index: usize,
    /// Operations this queue pair keeps outstanding at most.
    window: usize,
    qp: crate::rdma::Qp,
    cq: crate::rdma::Cq,
    rqp: crate::rdma::Qp,
    rcq: crate::rdma::Cq,
    outstanding: usize,
    next_seq: u64,
    /// Start times of outstanding operations, by sequence number modulo a power of two above
    /// the window: at most `window` are outstanding, so entries never collide (and no hashing
    /// per operation).
    started: Vec<Option<Instant>>,
    /// Ids of SENDs in flight, oldest first: receive k gets the k-th SEND.
    send_ids: Vec<u64>,
    sends_posted: u64,
    sends_received: u64,
    recv_posted: u64,
    batch: Vec<WorkRequest>,
    recv_batch: Vec<RecvRequest>,
}

impl Lane {
    fn new(
        index: usize,
        window: usize,
        qp: crate::rdma::Qp,
        cq: crate::rdma::Cq,
        rqp: crate::rdma::Qp,
        rcq: crate::rdma::Cq,
    ) -> Lane {
        let ring = (window * 2).next_power_of_two();
        Lane {
            index,
            window,
            qp,
            cq,
            rqp,
            rcq,
            outstanding: 0,
            next_seq: 0,
            started: vec![None; ring],
            send_ids: vec![0; ring],
            sends_posted: 0,
            sends_received: 0,
            recv_posted: 0,
            batch: Vec::with_capacity(window),
            recv_batch: Vec::with_capacity(window * 2),
        }
    }

    fn mask(&self) -> usize {
        self.started.len() - 1
    }

    /// Posts the batch with one doorbell.
    fn flush(&mut self) -> Result<(), AppError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        post_batch(&mut self.qp, &self.batch)?;
        self.outstanding += self.batch.len();
        self.batch.clear();
        Ok(())
    }
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
    println!("bench summary: {:.2} s, {} errors", s.seconds, s.errors);
    println!(
        "  {:<6} {:>10} {:>12} {:>10}   latency µs: {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "op", "ops", "ops/s", "Gbit/s", "p50", "p90", "p99", "p99.9", "p99.99", "max"
    );
    for r in &s.results {
        let l = &r.latency_ns;
        let us = |ns: u64| ns as f64 / 1000.0;
        println!(
            "  {:<6} {:>10} {:>12.0} {:>10.3}               {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            r.op,
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
    print_workers(&s.workers);
    println!("  cores: {}", s.cores.line());
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
    if let Some(p) = hgrm {
        println!("  latency distribution (µs) written to {}", p.display());
    }
    if let Some(c) = &s.capture {
        println!("  capture: {} packets written to {}", c.packets, c.path);
    }
}

/// One line per worker with its nonzero counters.
pub(crate) fn print_workers(workers: &[crate::runtime::WorkerReport]) {
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
    fn the_check_finds_any_byte_that_differs_from_the_pattern() {
        for len in [1usize, 7, 8, 9, 64, 4096, 4099] {
            let mut buf = vec![0u8; len];
            fill_pattern(42, &mut buf);
            assert!(has_pattern(42, &buf), "len {len}");
            assert!(
                !has_pattern(43, &buf),
                "another operation's pattern, len {len}"
            );
            for at in [0, len / 2, len - 1] {
                buf[at] ^= 0x10;
                assert!(!has_pattern(42, &buf), "len {len}, byte {at} changed");
                buf[at] ^= 0x10;
            }
        }
    }
}
