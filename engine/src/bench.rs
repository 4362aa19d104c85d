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

pub mod persist;
pub mod placement;
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
    /// The engines' worker counters (retransmissions, ICRC errors, ...).
    pub workers: Vec<crate::runtime::WorkerReport>,
    /// The two `net_ring` ports' own counters, `a` (engine A's) then `b`.
    pub ports: Vec<PortSummary>,
    pub capture: Option<crate::app::CaptureSummary>,
    /// `persist` only: the mode, what the target's region is, and the queue pair's tuning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persist: Option<persist::PersistSummary>,
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
    /// The host's core (EAL's main lcore) and the engines' core.
    pub(crate) cores: (usize, usize),
    pub(crate) a: loopback::LoopbackEnd,
    pub(crate) b: loopback::LoopbackEnd,
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
    pub(crate) ports: Vec<PortSummary>,
    pub(crate) capture: Option<crate::app::CaptureSummary>,
}

/// Starts EAL (after the banner) and the two engines with queue pair settings `qp`: both
/// engines on the last core, the host loop on the first (EAL's main lcore). On a 2-core
/// machine a third busy thread would leave the host waiting for CPU time slices.
pub(crate) fn start_engines(opts: &BenchOpts, qp: QpConfig) -> Result<Engines, AppError> {
    let cores = available_cores();
    let (a, b) = (cores[0], *cores.last().unwrap_or(&cores[0]));
    let (args, memory) = plan_eal_args(
        &opts.eal,
        opts.hugepages,
        opts.memory_mb,
        a,
        &[],
        &HugepageStatus::read(),
    )?;
    check_pool_fits(
        &memory,
        LOOPBACK_MBUFS,
        crate::rdma::FRAME_DATA_ROOM,
        ("--memory-mb", "--hugepages"),
        "",
    )?;
    let info = Eal::init(&args)?;
    report::banner(info, &memory, opts.json);
    let mut lo = LoopbackOpts::new(qp, [b, b]);
    lo.pcap = opts.pcap.clone();
    let pair =
        loopback::start(&lo).map_err(|e| AppError::Failed(format!("starting the engines: {e}")))?;
    // DPDK names a ring port `net_ring_<name>`, `<name>` being what `loopback` asked for
    // (`rdma_a`, `rdma_b`).
    let port_ids = ["a", "b"].map(|end| {
        let suffix = format!("{}_{end}", lo.name);
        let id = dataplane::port_ids()
            .into_iter()
            .find(|&id| PortInfo::read(id).is_ok_and(|p| p.name.ends_with(&suffix)));
        (end, id)
    });
    let loopback::LoopbackPair {
        runtime,
        a: ea,
        b: eb,
        capture,
        ..
    } = pair;
    Ok(Engines {
        memory,
        cores: (a, b),
        a: ea,
        b: eb,
        running: Running {
            runtime,
            capture,
            port_ids,
        },
    })
}

impl Running {
    /// Reads the ports' counters while the workers still hold them started, stops the
    /// workers, and finishes the capture (written to `pcap`).
    pub(crate) fn finish(self, pcap: Option<&PathBuf>) -> Result<Stopped, AppError> {
        let ports = self
            .port_ids
            .iter()
            .filter_map(|&(name, id)| Some(port_summary(id?, name)))
            .collect::<Result<Vec<_>, _>>()?;
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
    if matches!(opts.op, BenchOp::Tagged | BenchOp::Placement) {
        return Err(usage(
            "bench tagged and bench placement have their own summaries: run them with bench::tagged::run and bench::placement::run".into(),
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
    // Buffer slots: operation k uses slot k mod slots. With --verify a slot must not be
    // reused while an operation on it may still be outstanding or unchecked. At most `qd` are
    // outstanding, a completion is checked one loop round after it is polled, and a receive
    // completion may be polled a round after its SEND's; four times the queue depth leaves a
    // margin over all of that.
    let slots = (BUF_CAP / size).clamp(1, 1024);
    if opts.verify && slots < VERIFY_SLOTS_PER_QD * opts.qd {
        return Err(usage(format!(
            "--verify: {} slots of {size} B fit the {} MiB buffers, fewer than four times --qd {}; lower --qd or --size",
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
        cores: (a, b),
        a: mut ea,
        b: mut eb,
        running,
    } = start_engines(opts, qp)?;
    let host = |e: crate::rdma::HostError| AppError::Failed(format!("host call: {e}"));
    // The application's memory: four buffers it maps itself, then registers.
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
    let slot_of = |k: u64| (k as usize % slots) * size;

    human(
        opts.json,
        &format!(
            "bench {:?}: {} B messages, queue depth {}, {}, MTU {}, {}{}; both engines on core {b}, host on core {a}; buffers: {buffers}",
            opts.op,
            size,
            opts.qd,
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
    // Start times of outstanding operations, by wr_id modulo a power of two above the queue
    // depth: at most `qd` are outstanding, so slots never collide (and no hashing per op).
    let slots_len = (opts.qd * 2).next_power_of_two();
    let mut started: Vec<Option<Instant>> = vec![None; slots_len];
    // Operation ids of SENDs in flight, oldest first: receive k gets the k-th SEND.
    let mut send_ids: Vec<u64> = vec![0; slots_len];
    let (mut sends_posted, mut sends_received) = (0u64, 0u64);
    let mut batch: Vec<WorkRequest> = Vec::with_capacity(opts.qd);
    // With --verify: landed bytes to check, as (operation id, which buffer, offset). They are
    // checked after the next batch is posted, so the engine has work while the host compares.
    let mut to_check: Vec<(u64, Landed, usize)> = Vec::with_capacity(2 * WCS_LEN);
    // 0 WRITE, 1 READ, 2 SEND; and the buffer an operation's data comes from.
    let kind_of = |id: u64| match opts.op {
        BenchOp::Write => 0,
        BenchOp::Read => 1,
        BenchOp::Send => 2,
        BenchOp::Mixed => id % 3,
        BenchOp::Persist | BenchOp::Tagged | BenchOp::Placement => {
            unreachable!("`bench persist`, `tagged` and `placement` run in their own modules")
        }
    };
    let source = |id: u64| if kind_of(id) == 1 { &remote } else { &src };
    let mut recv_batch: Vec<RecvRequest> = Vec::with_capacity(opts.qd * 2);
    let mut wcs = [WorkCompletion::EMPTY; WCS_LEN];
    let mut outstanding = 0usize;
    let mut errors = 0u64;
    let t0 = Instant::now();
    // When posting ends: the duration's end, or the moment `stop` is seen.
    let mut end = opts.duration.and_then(|d| t0.checked_add(d));
    let mut next_id = 0u64;
    let mut last_print = t0;
    let mut last_done = 0u64;
    let mut done = 0u64;
    let mut recv_posted = 0u64;
    let uses_send = matches!(opts.op, BenchOp::Send | BenchOp::Mixed);
    loop {
        let now = Instant::now();
        if stop.load(Ordering::Relaxed) && end.is_none_or(|e| e > now) {
            end = Some(now);
        }
        let ended = end.is_some_and(|e| now >= e);
        if uses_send {
            // Keep B's receive queue a window ahead of the SENDs, before any of this round's
            // SENDs is posted (filling sources can take longer than the RNR retries last).
            recv_batch.clear();
            while recv_posted < sends_posted + opts.qd as u64
                && recv_batch.len() < recv_batch.capacity()
            {
                recv_batch.push(RecvRequest::new(
                    recv_posted,
                    recv.sgl(slot_of(recv_posted), opts.size),
                ));
                recv_posted += 1;
            }
            if let Err(full) = eb.qp.post_recv(&recv_batch) {
                recv_posted -= (recv_batch.len() - full.posted) as u64;
            }
        }
        // Post while there is room in the window and (with a rate) the next operation is due:
        // the whole batch with one doorbell.
        batch.clear();
        while outstanding + batch.len() < opts.qd && !ended {
            let intended = match opts.rate {
                // An operation due beyond any clock reading (a tiny rate) is never due.
                Some(r) => match Duration::try_from_secs_f64(next_id as f64 / r)
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
            let slot = slot_of(next_id);
            if let Some(v) = verifier.as_mut() {
                v.fill(next_id, source(next_id), slot);
            }
            let wr = match kind_of(next_id) {
                0 => WorkRequest::write(
                    next_id,
                    src.sgl(slot, opts.size),
                    remote.addr() + slot as u64,
                    remote.rkey(),
                    None,
                ),
                1 => WorkRequest::read(
                    next_id,
                    dst.sgl(slot, opts.size),
                    remote.addr() + slot as u64,
                    remote.rkey(),
                ),
                _ => {
                    send_ids[sends_posted as usize & (slots_len - 1)] = next_id;
                    sends_posted += 1;
                    WorkRequest::send(next_id, src.sgl(slot, opts.size), None)
                }
            };
            batch.push(wr);
            started[next_id as usize & (slots_len - 1)] = Some(intended);
            next_id += 1;
            if verifier.is_some() && batch.len() == VERIFY_RING_EVERY {
                // Filling takes time: ring for what is ready rather than for the whole batch.
                post_batch(&mut ea.qp, &batch)?;
                outstanding += batch.len();
                batch.clear();
            }
        }
        if !batch.is_empty() {
            post_batch(&mut ea.qp, &batch)?;
            outstanding += batch.len();
        }
        if let Some(v) = verifier.as_mut() {
            for &(id, landed, slot) in &to_check {
                v.check(id, landed.region(&remote, &dst, &recv), slot);
            }
            to_check.clear();
        }
        let n = ea.cq.poll(&mut wcs);
        if n > 0 {
            // One clock read per batch of completions: the work they did ended by now.
            let polled_at = Instant::now();
            for wc in &wcs[..n] {
                let Some(t) = started[wc.wr_id as usize & (slots_len - 1)].take() else {
                    continue;
                };
                outstanding -= 1;
                if wc.status != WcStatus::Success {
                    errors += 1;
                    continue;
                }
                let k = op_index(wc.opcode);
                hist[k].record(polled_at.saturating_duration_since(t).as_nanos() as u64);
                counts[k] += 1;
                done += 1;
                if verifier.is_some() {
                    let slot = slot_of(wc.wr_id);
                    match wc.opcode {
                        WcOpcode::RdmaWrite => to_check.push((wc.wr_id, Landed::Remote, slot)),
                        WcOpcode::RdmaRead => to_check.push((wc.wr_id, Landed::Back, slot)),
                        _ => {}
                    }
                }
            }
        }
        if uses_send {
            let n = eb.cq.poll(&mut wcs);
            for wc in &wcs[..n] {
                let id = send_ids[sends_received as usize & (slots_len - 1)];
                sends_received += 1;
                if wc.status != WcStatus::Success {
                    errors += 1;
                } else if verifier.is_some() {
                    to_check.push((id, Landed::Received, slot_of(wc.wr_id)));
                }
            }
        }
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
        if ended && outstanding == 0 && (!uses_send || sends_received == sends_posted) {
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
    Ok(BenchSummary {
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
        workers,
        ports,
        capture,
        persist: None,
    })
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
