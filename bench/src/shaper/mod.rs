//! `portico bench shaper`: READs paced by the size of their responses (seed 000), beside WRITE
//! traffic on other traffic classes, through a host that absorbs inbound data at a set rate.
//!
//! One process, two engines on one worker joined by `net_ring` ports. Engine B is the
//! initiator, with the traffic shaper on its requests ([`portico::shaper`]); engine A answers.
//! In front of B's receive path sits the bottleneck emulator ([`crate::bottleneck`]) as
//! the host's absorb limit: a byte FIFO served at `--absorb-gbps`, with a finite buffer
//! (`--buffer-kb`, drop-tail, no ECN marking) and a delay (`--rtt-us`).
//!
//! Queue pairs: `--reads` of them in class 0 (`reads`) each keep `--qd` READs of `--read-size`
//! outstanding; for each share of `--write-shares` a WRITE class (`writes1`, `writes2`, ...) of
//! `--writes` queue pairs keeps `--qd` WRITEs of `--write-size` outstanding. The shaper's link
//! is `--link-gbps`; a WRITE class is assured its share of it (ceiling: the link); the READ
//! class has strict priority up to a twentieth of the link (its requests are small: they must
//! not wait behind WRITEs assured the whole link, and what they pull in is paced apart).
//!
//! Phases, each with fresh engines, one after the other (`--phases`): `alone` (the WRITEs
//! only: their baseline), `paced` (READs and WRITEs, the absorb bucket on) and `unpaced` (the
//! same, the absorb bucket off: READ requests go as fast as the windows let them). Two more
//! on request turn the READs around: `served` (engine A asks for the READs and B answers
//! them while it WRITEs; B's READ responses are charged to class `reads` with its WRITE
//! classes, every class assured its part of the link: `reads` [`SERVED_READ_SHARE`], each
//! WRITE class its share of the rest) and `served-free` (the same, B's READ responses sent
//! outside the shaper, as before issue 32). Each phase runs `--duration` seconds (default 1)
//! after which the outstanding operations finish.
//!
//! Figures per phase, over its steady part (from 10 % into the traffic to its end): inbound
//! rate ÷ absorb rate, drops at the absorb buffer, retransmissions, READ (and WRITE) latency
//! percentiles (post to completion), per-class throughput against its configured share, per
//! queue pair (each held by one MCU) against its equal part of its class, the shaper's
//! counters per class and per MCU, and WRITE throughput against the `alone` phase. Output: the
//! bench JSON schema (`results[]` per phase: READ latency, or WRITE latency in `alone`) with a
//! `shaper` object beside it, a CSV of the time series and an SVG plot (`--out DIR`).

pub mod report;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{BenchOpts, OpResult, WCS_LEN, human, print_json, print_workers, usage};
use crate::bottleneck::{BottleneckConfig, BottleneckCounters};
use crate::instrument::{BottleneckSpec, IngressReport, ShaperProbe, ShaperReport};
use portico::app::{AppError, MemoryChoice, PortSummary};
use portico::latency::{Latency, LatencySummary};
use portico::rdma::loopback::{LoopbackOpts, ShaperSpec};
use portico::rdma::{Cq, Qp};
use portico::runtime::WorkerReport;
use portico::shaper::{ClassConfig, Counters, ShaperConfig};
use portico::transport::{Access, QpConfig, SgList, WcStatus, WorkCompletion, WorkRequest};

/// Trace bins.
const BIN_NS: u64 = 20_000;
/// How long the outstanding operations may take after a phase's time is up.
const GRACE: Duration = Duration::from_secs(10);
/// Operations outstanding per queue pair, at most.
pub const MAX_QD: usize = 16;
/// The steady part of a phase starts this far into its traffic.
const WARMUP: f64 = 0.1;

/// A phase of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PhaseKind {
    /// The WRITE classes alone: their baseline.
    Alone,
    /// READs and WRITEs, READs paced by the absorb bucket.
    Paced,
    /// READs and WRITEs, the absorb bucket off.
    Unpaced,
    /// Engine B serves READs (engine A asks for them on the READ queue pairs) while it
    /// WRITEs: its READ responses are charged to class `reads` with its WRITE classes, one
    /// outbound policy (seed 000). Every class is assured its part of the link.
    Served,
    /// [`PhaseKind::Served`] with B's READ responses sent in turn, outside the shaper (how
    /// the engine served READs before issue 32): the comparison.
    ServedFree,
}

impl PhaseKind {
    pub fn name(self) -> &'static str {
        match self {
            PhaseKind::Alone => "alone",
            PhaseKind::Paced => "paced",
            PhaseKind::Unpaced => "unpaced",
            PhaseKind::Served => "served",
            PhaseKind::ServedFree => "served-free",
        }
    }

    fn op(self) -> &'static str {
        match self {
            PhaseKind::Alone => "shaper-alone",
            PhaseKind::Paced => "shaper-paced",
            PhaseKind::Unpaced => "shaper-unpaced",
            PhaseKind::Served => "shaper-served",
            PhaseKind::ServedFree => "shaper-served-free",
        }
    }

    fn reads(self) -> bool {
        self != PhaseKind::Alone
    }

    /// B answers the READs instead of asking for them.
    fn served(self) -> bool {
        matches!(self, PhaseKind::Served | PhaseKind::ServedFree)
    }
}

/// What `bench shaper` takes besides the common bench options (`--mtu`, `--qd`,
/// `--duration`, `--json`, the EAL's).
#[derive(Debug, Clone)]
pub struct ShaperArgs {
    pub phases: Vec<PhaseKind>,
    pub reads: usize,
    pub read_size: u32,
    /// WRITE queue pairs per WRITE class.
    pub writes: usize,
    pub write_size: u32,
    /// Per WRITE class: its assured share of the link.
    pub write_shares: Vec<f64>,
    pub absorb_gbps: f64,
    pub link_gbps: f64,
    pub buffer_kb: f64,
    pub rtt_us: f64,
    pub mcus: usize,
    pub outstanding_cap: u32,
    pub quantum_bytes: u32,
    /// The absorb bucket's depth (default: two READs' response frames).
    pub absorb_burst_kb: Option<f64>,
    pub out: Option<PathBuf>,
}

impl Default for ShaperArgs {
    fn default() -> Self {
        ShaperArgs {
            phases: vec![PhaseKind::Alone, PhaseKind::Paced, PhaseKind::Unpaced],
            reads: 8,
            read_size: 64 * 1024,
            writes: 1,
            write_size: 64 * 1024,
            write_shares: vec![0.75, 0.25],
            absorb_gbps: 2.0,
            link_gbps: 3.0,
            buffer_kb: 256.0,
            rtt_us: 10.0,
            mcus: 16,
            outstanding_cap: 64,
            quantum_bytes: 4096,
            absorb_burst_kb: None,
            out: None,
        }
    }
}

/// The parameters a run used, resolved.
#[derive(Debug, Clone, Serialize)]
pub struct ShaperParams {
    pub reads: usize,
    pub read_size: u32,
    pub writes_per_class: usize,
    pub write_size: u32,
    pub write_shares: Vec<f64>,
    pub qd_per_qp: usize,
    pub mtu: u32,
    pub absorb_gbps: f64,
    pub absorb_burst_bytes: u64,
    pub link_gbps: f64,
    pub buffer_bytes: u64,
    pub rtt_us: f64,
    pub seconds_per_phase: f64,
    pub bin_ns: u64,
    pub class_names: Vec<String>,
    /// The shaper as configured in the paced phase (the unpaced one has no absorb rate).
    pub classes: Vec<ClassParams>,
    pub mcus: usize,
    pub outstanding_cap: u32,
    pub quantum_bytes: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClassParams {
    pub name: String,
    pub assured_gbps: f64,
    pub ceiling_gbps: f64,
    /// Served before the others, up to its ceiling.
    pub strict: bool,
    pub queue_pairs: usize,
}

/// A class's throughput in a phase's steady part against what it is configured to get.
#[derive(Debug, Clone, Serialize)]
pub struct ClassFigures {
    pub class: String,
    /// WRITE classes: bytes sent; the READ class: response bytes pulled in (frames).
    pub gbps: Option<f64>,
    /// What it is configured to get: a WRITE class its assured share of the link, the READ
    /// class the absorb rate (paced); None where nothing sets it.
    pub target_gbps: Option<f64>,
    pub ratio: Option<f64>,
    /// The shaper's counters for the class over the whole phase.
    pub counters: Counters,
}

/// A queue pair's part of its class (payload completed in the steady part, host-measured):
/// the deficit round robin among a class's MCUs gives each queue pair (one MCU each) an
/// equal part.
#[derive(Debug, Clone, Serialize)]
pub struct QpFigures {
    pub qp: usize,
    pub class: String,
    /// Payload completed in the steady part over its wall-clock length.
    pub gbps: f64,
    /// Its bytes over its class's.
    pub share: Option<f64>,
    /// 1 / the queue pairs of its class.
    pub expected_share: f64,
    pub ratio: Option<f64>,
}

/// One phase's figures.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseSummary {
    pub phase: PhaseKind,
    pub seconds: f64,
    /// The steady part the rates are taken over, in worker time (µs).
    pub window_us: (f64, f64),
    pub inbound_gbps: Option<f64>,
    pub inbound_over_absorb: Option<f64>,
    /// Served phases: B's WRITE and READ response payload rate over the link rate its
    /// shaper models (at most 1 when READ responses are charged with the WRITEs).
    pub outbound_over_link: Option<f64>,
    pub drops: u64,
    pub retransmissions: u64,
    pub reads: u64,
    pub writes: u64,
    /// Operations that completed in error (a queue pair that gave up retrying).
    pub errors: u64,
    /// Queue pairs that went to the error state (their retries exhausted).
    pub failed_qps: usize,
    /// The first failed completion's status and operation, e.g. `RetryExceeded (READ)`.
    pub first_error: Option<String>,
    pub read_latency_ns: LatencySummary,
    pub write_latency_ns: LatencySummary,
    pub classes: Vec<ClassFigures>,
    /// Per WRITE class: its throughput here over the `alone` phase's.
    pub writes_over_alone: Vec<Option<f64>>,
    pub queue_pairs: Vec<QpFigures>,
    /// The shaper's counters per MCU over the whole phase.
    pub mcus: Vec<Counters>,
    pub bottleneck: BottleneckCounters,
    pub queue_p50_bytes: u64,
    pub queue_p99_bytes: u64,
    pub shaper_misses: u64,
    pub stalls: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ShaperSummary {
    pub params: ShaperParams,
    pub phases: Vec<PhaseSummary>,
    pub csv: Option<String>,
    pub svg: Option<String>,
}

impl ShaperSummary {
    /// Operations that failed in the phases where none should: `alone` and `paced`.
    pub fn failures_with_pacing(&self) -> u64 {
        self.phases
            .iter()
            .filter(|p| p.phase != PhaseKind::Unpaced)
            .map(|p| p.errors)
            .sum()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ShaperBenchSummary {
    pub op: &'static str,
    pub seconds: f64,
    pub memory: MemoryChoice,
    pub buffers: String,
    pub results: Vec<OpResult>,
    pub errors: u64,
    pub workers: Vec<WorkerReport>,
    pub ports: Vec<PortSummary>,
    pub shaper: ShaperSummary,
}

fn gbps_arg(field: &str, v: f64, max: f64) -> Result<f64, AppError> {
    if v.is_finite() && v > 0.0 && v <= max {
        Ok(v)
    } else {
        Err(usage(format!("{field}: must be in (0, {max}]")))
    }
}

fn resolve(opts: &BenchOpts, args: &ShaperArgs) -> Result<ShaperParams, AppError> {
    if args.phases.is_empty() {
        return Err(usage("--phases: at least one".into()));
    }
    if args.reads == 0 || args.reads > 16 {
        return Err(usage("--reads: must be 1..=16".into()));
    }
    if args.write_shares.is_empty() || args.write_shares.len() > 4 {
        return Err(usage("--write-shares: 1 to 4 shares".into()));
    }
    if args.write_shares.iter().any(|s| !(*s > 0.0 && *s <= 1.0))
        || args.write_shares.iter().sum::<f64>() > 1.0 + 1e-9
    {
        return Err(usage(
            "--write-shares: each in (0, 1], together at most 1".into(),
        ));
    }
    if args.writes == 0 || args.writes * args.write_shares.len() > 16 {
        return Err(usage(
            "--writes: 1 or more, at most 16 WRITE queue pairs in all".into(),
        ));
    }
    for (field, size) in [
        ("--read-size", args.read_size),
        ("--write-size", args.write_size),
    ] {
        if size == 0 || size > 1 << 20 {
            return Err(usage(format!("{field}: must be 1..=1048576 bytes")));
        }
    }
    let absorb = gbps_arg("--absorb-gbps", args.absorb_gbps, 400.0)?;
    let link = gbps_arg("--link-gbps", args.link_gbps, 400.0)?;
    if !(args.buffer_kb.is_finite() && args.buffer_kb > 0.0 && args.buffer_kb <= 1e6) {
        return Err(usage("--buffer-kb: must be in (0, 1000000]".into()));
    }
    if !(args.rtt_us.is_finite() && (0.0..=10_000.0).contains(&args.rtt_us)) {
        return Err(usage("--rtt-us: must be 0..=10000".into()));
    }
    if opts.qd == 0 {
        return Err(usage("--qd: at least 1".into()));
    }
    let mut qp = QpConfig::new(0, 0);
    qp.pmtu = opts.mtu;
    let one_read = u64::from(portico::transport::requester::read_response_frames(
        &qp,
        args.read_size,
    ));
    let absorb_burst_bytes = match args.absorb_burst_kb {
        Some(k) if k.is_finite() && k > 0.0 && k <= 1e6 => (k * 1000.0) as u64,
        Some(_) => return Err(usage("--absorb-burst-kb: must be in (0, 1000000]".into())),
        // Two READs' worth: a READ goes as soon as one fits, and the tokens that accrue while
        // the worker is busy elsewhere are not lost to a full bucket.
        None => 2 * one_read,
    };
    let seconds = opts.duration.map_or(1.0, |d| d.as_secs_f64());
    if seconds <= 0.0 || seconds > 60.0 {
        return Err(usage(
            "--duration: bench shaper runs each phase 0 < s <= 60 seconds".into(),
        ));
    }
    let mut class_names = vec!["reads".to_string()];
    // The READ class is the low-latency one: strict priority, held to a twentieth of the
    // link. Its requests are small (a 64 KiB READ asks with 74 bytes) and must not queue
    // behind bulk WRITEs that are assured the whole link between them; what they pull in is
    // the absorb bucket's business.
    let mut classes = vec![ClassParams {
        name: "reads".into(),
        assured_gbps: 0.0,
        ceiling_gbps: link / 20.0,
        strict: true,
        queue_pairs: args.reads,
    }];
    for (k, share) in args.write_shares.iter().enumerate() {
        let name = format!("writes{}", k + 1);
        class_names.push(name.clone());
        classes.push(ClassParams {
            name,
            assured_gbps: share * link,
            ceiling_gbps: link,
            strict: false,
            queue_pairs: args.writes,
        });
    }
    let params = ShaperParams {
        reads: args.reads,
        read_size: args.read_size,
        writes_per_class: args.writes,
        write_size: args.write_size,
        write_shares: args.write_shares.clone(),
        qd_per_qp: opts.qd.min(MAX_QD),
        mtu: opts.mtu.bytes(),
        absorb_gbps: absorb,
        absorb_burst_bytes,
        link_gbps: link,
        buffer_bytes: (args.buffer_kb * 1000.0) as u64,
        rtt_us: args.rtt_us,
        seconds_per_phase: seconds,
        bin_ns: BIN_NS,
        class_names,
        classes,
        mcus: args.mcus,
        outstanding_cap: args.outstanding_cap,
        quantum_bytes: args.quantum_bytes,
    };
    // The shaper names its own bad fields (MCUs, cap, quantum).
    shaper_config(&params, PhaseKind::Paced)
        .validate()
        .map_err(|e| usage(format!("--{}: {}", e.field.replace('_', "-"), e.reason)))?;
    Ok(params)
}

/// The share of the link class `reads` is assured in the served phases, where its READ
/// responses are bulk data: the WRITE classes are assured their shares of the rest.
pub const SERVED_READ_SHARE: f64 = 0.2;

/// Class `c`'s (assured, ceiling, strict) in a phase of `kind`: as configured, or in the
/// served phases every class assured its part of the link (the READ responses
/// [`SERVED_READ_SHARE`], each WRITE class its share of the rest), none strict.
fn class_in(p: &ShaperParams, kind: PhaseKind, c: usize) -> (f64, f64, bool) {
    let cp = &p.classes[c];
    if !kind.served() {
        return (cp.assured_gbps, cp.ceiling_gbps, cp.strict);
    }
    let assured = match c {
        0 => SERVED_READ_SHARE * p.link_gbps,
        _ => cp.assured_gbps * (1.0 - SERVED_READ_SHARE),
    };
    (assured, p.link_gbps, false)
}

/// The shaper of a phase: the classes, the link, the absorb bucket in the paced phase, and
/// whether READ responses pass it.
fn shaper_config(p: &ShaperParams, kind: PhaseKind) -> ShaperConfig {
    let bps = |g: f64| (g * 1e9).round() as u64;
    let classes = (0..p.classes.len())
        .map(|c| {
            let (assured, ceiling, strict) = class_in(p, kind, c);
            ClassConfig {
                assured_bps: bps(assured),
                ceiling_bps: bps(ceiling),
                burst_bytes: 64 * 1024,
                strict,
                pfc_priority: None,
            }
        })
        .collect();
    let mut cfg = ShaperConfig::new(classes);
    cfg.link_bps = Some(bps(p.link_gbps));
    cfg.shape_read_responses = kind != PhaseKind::ServedFree;
    cfg.absorb_bps = (kind == PhaseKind::Paced).then(|| bps(p.absorb_gbps));
    cfg.absorb_burst_bytes = p.absorb_burst_bytes;
    cfg.mcus = p.mcus;
    cfg.outstanding_cap = p.outstanding_cap;
    cfg.quantum_bytes = p.quantum_bytes;
    cfg
}

/// One queue pair on the host's side (engine B's end).
struct Lane {
    qp: Qp,
    cq: Cq,
    /// Its traffic class: 0 (`reads`) for the READ queue pairs.
    class: usize,
    /// Where its buffers start in both regions.
    base: u64,
    size: u32,
    slots: Vec<Option<Instant>>,
    ops: u64,
    /// Payload bytes completed in the steady part (host time).
    steady_bytes: u64,
    /// A completion failed: the queue pair is in the error state, and nothing more is posted.
    failed: bool,
}

impl Lane {
    /// A queue pair of the READ class.
    fn read(&self) -> bool {
        self.class == 0
    }
}

struct PhaseRun {
    phase: report::Phase,
    result: OpResult,
    summary: PhaseSummary,
    workers: Vec<WorkerReport>,
    ports: Vec<PortSummary>,
}

/// Runs every phase of `args` and returns the summary (printed by the caller); the CSV and
/// SVG are written on the way.
pub fn run(
    opts: &BenchOpts,
    args: &ShaperArgs,
    stop: Arc<AtomicBool>,
) -> Result<ShaperBenchSummary, AppError> {
    let params = resolve(opts, args)?;
    let (host_core, engine_core, memory) =
        super::start_eal_for_pairs(opts, args.phases.len() as u32)?;
    human(
        opts.json,
        &format!(
            "bench shaper: {} queue pairs of {} B READs and {} x {} of {} B WRITEs (shares {:?} of a {} Gbit/s link), {} outstanding each, MTU {}; absorb {} Gbit/s (bucket {} B), buffer {} KB, RTT {} µs; phases {}; both engines on core {engine_core}, host on core {host_core}",
            params.reads,
            params.read_size,
            params.write_shares.len(),
            params.writes_per_class,
            params.write_size,
            params.write_shares,
            params.link_gbps,
            params.qd_per_qp,
            params.mtu,
            params.absorb_gbps,
            params.absorb_burst_bytes,
            params.buffer_bytes / 1000,
            params.rtt_us,
            args.phases
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(", "),
        ),
    );
    let t0 = Instant::now();
    let mut phases = Vec::new();
    let mut results = Vec::new();
    let mut summaries: Vec<PhaseSummary> = Vec::new();
    let mut workers = Vec::new();
    let mut ports = Vec::new();
    let mut buffers = String::new();
    for &kind in &args.phases {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let r = run_phase(opts, &params, kind, engine_core, &stop, &mut buffers)?;
        let s = &r.summary;
        let o = |v: Option<f64>, prec: usize| {
            v.map(|v| format!("{v:.prec$}"))
                .unwrap_or_else(|| "-".into())
        };
        human(
            opts.json,
            &format!(
                "  {}: inbound {} Gbit/s ({}x absorb), drops {}, retransmissions {}, READ p50 {} µs, classes {}",
                kind.name(),
                o(s.inbound_gbps, 3),
                o(s.inbound_over_absorb, 3),
                s.drops,
                s.retransmissions,
                s.read_latency_ns.p50 / 1000,
                s.classes
                    .iter()
                    .map(|c| format!("{} {}", c.class, o(c.gbps, 3)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        phases.push(r.phase);
        results.push(r.result);
        summaries.push(r.summary);
        workers.extend(r.workers);
        ports.extend(r.ports);
    }
    // WRITE throughput against the phase without READs.
    let alone: Option<Vec<Option<f64>>> = summaries
        .iter()
        .find(|s| s.phase == PhaseKind::Alone)
        .map(|s| s.classes.iter().skip(1).map(|c| c.gbps).collect());
    for s in &mut summaries {
        s.writes_over_alone = match &alone {
            Some(base) => s
                .classes
                .iter()
                .skip(1)
                .zip(base)
                .map(|(c, b)| match (c.gbps, b) {
                    (Some(x), Some(y)) if *y > 0.0 => Some(x / y),
                    _ => None,
                })
                .collect(),
            None => Vec::new(),
        };
    }
    let dir = args.out.clone().unwrap_or_else(|| PathBuf::from("shaper"));
    let files = std::fs::create_dir_all(&dir).and_then(|_| {
        let csv = dir.join("shaper.csv");
        let svg = dir.join("shaper.svg");
        report::write_csv(&csv, &phases)?;
        let title = format!(
            "{} x {} KiB READs into {} Gbit/s of absorb, WRITE classes {:?} of {} Gbit/s",
            params.reads,
            params.read_size / 1024,
            params.absorb_gbps,
            params.write_shares,
            params.link_gbps
        );
        report::write_svg(&svg, &phases, &title)?;
        Ok((csv, svg))
    });
    let (csv, svg) = match files {
        Ok((c, s)) => (Some(c.display().to_string()), Some(s.display().to_string())),
        Err(e) => {
            return Err(AppError::Failed(format!(
                "writing the time series into {}: {e}",
                dir.display()
            )));
        }
    };
    let errors = summaries.iter().map(|s| s.errors).sum();
    Ok(ShaperBenchSummary {
        op: "shaper",
        seconds: t0.elapsed().as_secs_f64(),
        memory,
        buffers,
        results,
        errors,
        workers,
        ports,
        shaper: ShaperSummary {
            params,
            phases: summaries,
            csv,
            svg,
        },
    })
}

fn run_phase(
    opts: &BenchOpts,
    p: &ShaperParams,
    kind: PhaseKind,
    core: usize,
    stop: &AtomicBool,
    buffers: &mut String,
) -> Result<PhaseRun, AppError> {
    let depth = p.qd_per_qp;
    let writes = p.writes_per_class * p.write_shares.len();
    let lanes_n = p.reads + writes;
    // Per connection: class 0 for the READ queue pairs, then each WRITE class's.
    let classes: Vec<u8> = std::iter::repeat_n(0u8, p.reads)
        .chain(
            (0..p.write_shares.len())
                .flat_map(|k| std::iter::repeat_n(k as u8 + 1, p.writes_per_class)),
        )
        .collect();
    let mut qp = QpConfig::new(0, 0);
    qp.pmtu = opts.mtu;
    qp.max_send_wr = depth + 8;
    qp.max_recv_wr = 8;
    // Every READ outstanding at once, each as the sub-requests the shaper splits it into.
    let subs = opts
        .mtu
        .packets(p.read_size)
        .div_ceil(portico::shaper::DEFAULT_READ_SPLIT_PACKETS);
    qp.max_rd_atomic = depth as u32 * subs;
    // A READ's responses may wait behind the absorb bucket's worth of data at the absorb
    // rate (a few hundred µs at the defaults) before the first arrives: a timeout well above
    // that, as RoCE NICs' millisecond timeouts are, so that waiting is not taken for loss.
    qp.timeout_ns = 2_000_000;
    // Room for every outstanding operation's PSNs: the windows are not what limits here.
    qp.max_in_flight =
        ((depth as u32) * opts.mtu.packets(p.read_size.max(p.write_size))).clamp(64, 4096);
    let seconds = p.seconds_per_phase;
    let bins = ((seconds + GRACE.as_secs_f64() + 1.0) * 1e9 / BIN_NS as f64) as usize;
    let ingress_slot = Arc::new(Mutex::new(None));
    let shaper_slot = Arc::new(Mutex::new(None));
    let absorb_bps = (p.absorb_gbps * 1e9).round() as u64;
    let config = BottleneckConfig {
        rate_bps: absorb_bps,
        buffer_bytes: p.buffer_bytes,
        // No ECN marking: the absorb limit is the host's, not a switch's.
        kmin_bytes: p.buffer_bytes,
        kmax_bytes: p.buffer_bytes,
        pmax: 0.0,
        delay_ns: (p.rtt_us * 1000.0) as u64,
        // Memory absorbs frames, not the wire's preamble and gap.
        overhead_bytes: 0,
        seed: 1,
    };
    let name = format!("sh{}", kind.name());
    let mut lo = LoopbackOpts::new(qp, [core, core]);
    lo.name = name.clone();
    lo.connections = lanes_n;
    lo.cq_depth = depth * 2 + 16;
    let bottleneck = BottleneckSpec {
        config,
        capacity: 16_000,
        trace: Some((BIN_NS, bins)),
        report: ingress_slot.clone(),
    };
    let shaper = shaper_config(p, kind);
    // Engine B's shaper, sampled by bin.
    let probe = ShaperProbe::new(1, BIN_NS, bins, shaper.classes.len(), shaper_slot.clone());
    let wrap = bottleneck.wrap(lo.connections, Some(probe));
    lo.wrap =
        Some(wrap.map_err(|e| AppError::Failed(format!("starting the {name} engines: {e}")))?);
    lo.shaper = Some(ShaperSpec {
        config: shaper,
        classes: classes.clone(),
    });
    let super::StartedPair {
        a,
        b,
        more,
        running,
    } = super::start_pair(&lo)?;
    let host = |e: portico::rdma::HostError| AppError::Failed(format!("host call: {e}"));
    // Each lane's buffers: `depth` slots of its size, at the same offsets in both regions.
    let size_of = |class: u8| {
        if class == 0 {
            p.read_size
        } else {
            p.write_size
        }
    };
    let mut bases = Vec::with_capacity(lanes_n);
    let mut total = 0u64;
    for &class in &classes {
        bases.push(total);
        total += depth as u64 * u64::from(size_of(class));
    }
    let map_a = super::tagged::map(total as usize)?;
    let map_b = super::tagged::map(total as usize)?;
    *buffers = map_b.kind().to_string();
    let region_a = a.engine.register_all(&map_a, Access::ALL).map_err(host)?;
    let region_b = b.engine.register_all(&map_b, Access::ALL).map_err(host)?;
    // B's ends, but in the served phases the READ queue pairs' A ends (A asks, B answers).
    let ends = std::iter::once((a.qp, a.cq, b.qp, b.cq))
        .chain(more.into_iter().map(|c| (c.a.qp, c.a.cq, c.b.qp, c.b.cq)));
    let mut lanes: Vec<Lane> = ends
        .enumerate()
        .map(|(i, (qa, ca, qb, cb))| {
            if kind.served() && classes[i] == 0 {
                (qa, ca)
            } else {
                (qb, cb)
            }
        })
        .enumerate()
        .map(|(i, (qp, cq))| Lane {
            qp,
            cq,
            class: classes[i] as usize,
            base: bases[i],
            size: size_of(classes[i]),
            slots: vec![None; depth],
            ops: 0,
            steady_bytes: 0,
            failed: false,
        })
        .collect();
    let mut read_latency = Latency::new();
    let mut write_latency = Latency::new();
    let mut wcs = [WorkCompletion::EMPTY; WCS_LEN];
    let mut errors = 0u64;
    let mut first_error = None;
    let run_for = Duration::from_secs_f64(seconds);
    let warm = Duration::from_secs_f64(seconds * WARMUP);
    let t0 = Instant::now();
    let mut steady_from: Option<Instant> = None;
    let mut steady_to: Option<Instant> = None;
    loop {
        let now = t0.elapsed();
        let posting = !stop.load(Ordering::Relaxed) && now < run_for;
        if now >= warm && steady_from.is_none() {
            steady_from = Some(Instant::now());
        }
        if !posting && steady_to.is_none() {
            steady_to = Some(Instant::now());
        }
        let mut outstanding = 0;
        for lane in &mut lanes {
            let read = lane.read();
            if posting && !lane.failed && (!read || kind.reads()) {
                for (k, s) in lane.slots.iter_mut().enumerate() {
                    if s.is_some() {
                        continue;
                    }
                    let off = lane.base + k as u64 * u64::from(lane.size);
                    let wr = if read && kind.served() {
                        WorkRequest::read(
                            k as u64,
                            SgList::one(region_a.lkey(), region_a.addr() + off, lane.size),
                            region_b.addr() + off,
                            region_b.rkey(),
                        )
                    } else if read {
                        WorkRequest::read(
                            k as u64,
                            SgList::one(region_b.lkey(), region_b.addr() + off, lane.size),
                            region_a.addr() + off,
                            region_a.rkey(),
                        )
                    } else {
                        WorkRequest::write(
                            k as u64,
                            SgList::one(region_b.lkey(), region_b.addr() + off, lane.size),
                            region_a.addr() + off,
                            region_a.rkey(),
                            None,
                        )
                    };
                    if lane.qp.post_send(&[wr]).is_err() {
                        break;
                    }
                    *s = Some(Instant::now());
                }
            }
            let n = lane.cq.poll(&mut wcs);
            let done_at = Instant::now();
            for wc in &wcs[..n] {
                let Some(Some(posted)) = lane.slots.get_mut(wc.wr_id as usize).map(|s| s.take())
                else {
                    continue;
                };
                if wc.status != WcStatus::Success {
                    errors += 1;
                    lane.failed = true;
                    let op = if lane.read() { "READ" } else { "WRITE" };
                    first_error.get_or_insert_with(|| format!("{:?} ({op})", wc.status));
                    continue;
                }
                let ns = done_at.duration_since(posted).as_nanos() as u64;
                if lane.read() {
                    read_latency.record(ns);
                } else {
                    write_latency.record(ns);
                }
                lane.ops += 1;
                if steady_from.is_some() && steady_to.is_none() {
                    lane.steady_bytes += u64::from(lane.size);
                }
            }
            outstanding += lane.slots.iter().filter(|s| s.is_some()).count();
        }
        if !posting && outstanding == 0 {
            break;
        }
        if now >= run_for + GRACE {
            return Err(AppError::Failed(format!(
                "{}: {outstanding} operations still outstanding {} s after the phase's end",
                kind.name(),
                GRACE.as_secs()
            )));
        }
        std::hint::spin_loop();
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let steady_s = match (steady_from, steady_to) {
        (Some(a), Some(b)) if b > a => b.duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    let (ports, workers) = running.stop_labelled(kind.name(), &name)?;
    let ingress: IngressReport =
        super::take_report(&ingress_slot, &format!("{name}: the bottleneck"))?;
    let shaper: ShaperReport = super::take_report(&shaper_slot, &format!("{name}: the shaper"))?;
    let counter = |n: &str| workers.iter().filter_map(|w| w.counter(n)).sum::<u64>();
    let phase = to_phase(kind, p, &ingress, &shaper);
    // The steady part in worker time: from WARMUP into the traffic to the last bin in which
    // a WRITE class sent (the WRITEs stop within a round trip of the host's last post; READs
    // still queued, or a queue pair still retrying, would stretch a span measured otherwise).
    let classes_n = p.class_names.len();
    let busy = |b: usize| {
        phase.inbound[b] > 0 || (0..classes_n).any(|c| phase.class_bytes[b * classes_n + c] > 0)
    };
    let first = (0..phase.inbound.len()).find(|&b| busy(b));
    let last = (0..phase.inbound.len())
        .rev()
        .find(|&b| (1..classes_n).any(|c| phase.class_bytes[b * classes_n + c] > 0));
    let (from, to) = match (first, last) {
        (Some(f), Some(z)) if z > f => {
            let span = (z - f) as f64;
            (f + (span * WARMUP) as usize, z - (span * 0.01) as usize)
        }
        _ => (0, 0),
    };
    let inbound = report::inbound_gbps(&phase, from, to).filter(|_| kind.reads() && !kind.served());
    let class_figures: Vec<ClassFigures> = p
        .classes
        .iter()
        .enumerate()
        .map(|(c, cp)| {
            let active = c > 0 || kind.reads();
            let gbps = if kind.served() {
                // Payload completed in the steady part, host-measured: in the free phase
                // B's READ responses do not pass its shaper, whose counters would miss them.
                let bytes: u64 = lanes
                    .iter()
                    .filter(|l| l.class == c)
                    .map(|l| l.steady_bytes)
                    .sum();
                (steady_s > 0.0).then(|| bytes as f64 * 8.0 / steady_s / 1e9)
            } else {
                report::class_rate_gbps(&phase, c, from, to).filter(|_| active)
            };
            let target = match (c, kind) {
                (0, PhaseKind::Paced) => Some(p.absorb_gbps),
                (_, k) if k.served() => Some(class_in(p, kind, c).0),
                (0, _) => None,
                _ => Some(cp.assured_gbps),
            };
            ClassFigures {
                class: cp.name.clone(),
                gbps,
                target_gbps: target,
                ratio: gbps.zip(target).map(|(g, t)| g / t),
                counters: shaper.classes.get(c).copied().unwrap_or_default(),
            }
        })
        .collect();
    // B's outbound data in the served phases (WRITE and READ response payload) over the link
    // its shaper models: at most 1 where the READ responses are charged.
    let outbound_over_link = kind
        .served()
        .then(|| class_figures.iter().filter_map(|c| c.gbps).sum::<f64>() / p.link_gbps);
    let active = |l: &Lane| !l.read() || kind.reads();
    let class_steady = |c: usize| -> u64 {
        lanes
            .iter()
            .filter(|l| l.class == c && active(l))
            .map(|l| l.steady_bytes)
            .sum()
    };
    let queue_pairs = lanes
        .iter()
        .enumerate()
        .filter(|(_, l)| active(l))
        .map(|(i, l)| {
            let gbps = if steady_s > 0.0 {
                l.steady_bytes as f64 * 8.0 / steady_s / 1e9
            } else {
                0.0
            };
            let total = class_steady(l.class);
            let share = (total > 0).then(|| l.steady_bytes as f64 / total as f64);
            let expected = 1.0 / p.classes[l.class].queue_pairs as f64;
            QpFigures {
                qp: i,
                class: p.classes[l.class].name.clone(),
                gbps,
                share,
                expected_share: expected,
                ratio: share.map(|s| s / expected),
            }
        })
        .collect();
    let reads: u64 = lanes.iter().filter(|l| l.read()).map(|l| l.ops).sum();
    let writes_done: u64 = lanes.iter().filter(|l| !l.read()).map(|l| l.ops).sum();
    let bytes: u64 = lanes.iter().map(|l| l.ops * u64::from(l.size)).sum();
    let summary = PhaseSummary {
        phase: kind,
        seconds: elapsed,
        window_us: (
            from as f64 * BIN_NS as f64 / 1e3,
            to as f64 * BIN_NS as f64 / 1e3,
        ),
        inbound_gbps: inbound,
        inbound_over_absorb: inbound.map(|g| g / p.absorb_gbps),
        outbound_over_link,
        drops: ingress.counters.dropped,
        retransmissions: counter("retransmissions"),
        reads,
        writes: writes_done,
        errors,
        failed_qps: lanes.iter().filter(|l| l.failed).count(),
        first_error,
        read_latency_ns: read_latency.summary(),
        write_latency_ns: write_latency.summary(),
        classes: class_figures,
        writes_over_alone: Vec::new(),
        queue_pairs,
        mcus: shaper.mcus.clone(),
        bottleneck: ingress.counters,
        queue_p50_bytes: ingress.queue_p50_bytes,
        queue_p99_bytes: ingress.queue_p99_bytes,
        shaper_misses: counter("shaper_misses"),
        stalls: counter("stalls"),
    };
    let result = OpResult {
        size: None,
        qd: None,
        op: kind.op(),
        ops: reads + writes_done,
        ops_per_sec: (reads + writes_done) as f64 / elapsed,
        gbit_per_sec: bytes as f64 * 8.0 / elapsed / 1e9,
        latency_ns: if kind.reads() {
            read_latency.summary()
        } else {
            write_latency.summary()
        },
    };
    Ok(PhaseRun {
        phase,
        result,
        summary,
        workers,
        ports,
    })
}

/// The traces as the report's input.
fn to_phase(
    kind: PhaseKind,
    p: &ShaperParams,
    ing: &IngressReport,
    sh: &ShaperReport,
) -> report::Phase {
    let n = p.class_names.len();
    let Some(t) = &ing.trace else {
        return report::Phase {
            name: kind.name().into(),
            ..report::Phase::default()
        };
    };
    let bins = t.bins.min(sh.bins);
    let last = (0..bins)
        .rev()
        .find(|&b| t.departed[b] > 0 || (0..t.flows).any(|f| t.arrived[b * t.flows + f] > 0))
        .map_or(0, |b| b + 1);
    let bins = (last + 5).min(bins);
    let inbound = (0..bins)
        .map(|b| (0..t.flows).map(|f| t.arrived[b * t.flows + f]).sum())
        .collect();
    // Per class: WRITE classes' bytes sent, the READ class's response bytes pulled in; the
    // probe's counts are cumulative.
    let cum = |b: usize, c: usize| {
        if b >= sh.bins {
            return 0;
        }
        if c == 0 && !kind.served() {
            sh.pulled[b * n]
        } else {
            sh.sent[b * n + c]
        }
    };
    let mut class_bytes = vec![0u64; bins * n];
    for b in 0..bins {
        for c in 0..n {
            let prev = if b == 0 { 0 } else { cum(b - 1, c) };
            class_bytes[b * n + c] = cum(b, c).saturating_sub(prev);
        }
    }
    report::Phase {
        name: kind.name().into(),
        bin_ns: t.bin_ns,
        absorb_bps: (p.absorb_gbps * 1e9).round() as u64,
        inbound,
        queue_max: t.queue_max[..bins].to_vec(),
        drops: t.drops[..bins].to_vec(),
        class_names: p.class_names.clone(),
        class_bytes,
        class_target_bps: p
            .classes
            .iter()
            .enumerate()
            .map(|(c, cp)| match c {
                _ if kind.served() => Some((class_in(p, kind, c).0 * 1e9).round() as u64),
                0 => (kind == PhaseKind::Paced).then(|| (p.absorb_gbps * 1e9).round() as u64),
                _ => Some((cp.assured_gbps * 1e9).round() as u64),
            })
            .collect(),
    }
}

/// Prints the summary: a table of the phases, or one JSON object.
pub fn print(s: &ShaperBenchSummary, json: bool) {
    if json {
        return print_json(s);
    }
    let sh = &s.shaper;
    let p = &sh.params;
    println!();
    println!(
        "bench shaper: {} x {} KiB READs, absorb {} Gbit/s, buffer {} KB; WRITE classes {:?} of {} Gbit/s ({:.2} s, {} errors)",
        p.reads,
        p.read_size / 1024,
        p.absorb_gbps,
        p.buffer_bytes / 1000,
        p.write_shares,
        p.link_gbps,
        s.seconds,
        s.errors
    );
    let o = |v: Option<f64>, prec: usize| {
        v.map(|v| format!("{v:.prec$}"))
            .unwrap_or_else(|| "-".into())
    };
    print!(
        "  {:<11} {:>9} {:>8} {:>6} {:>6} {:>10} {:>10}",
        "phase", "in Gb/s", "in/abs", "drops", "retx", "READ p50", "READ p99"
    );
    for c in &p.class_names {
        print!(" {:>16}", format!("{c} Gb/s (x)"));
    }
    println!();
    for ph in &sh.phases {
        print!(
            "  {:<11} {:>9} {:>8} {:>6} {:>6} {:>10} {:>10}",
            ph.phase.name(),
            o(ph.inbound_gbps, 3),
            o(ph.inbound_over_absorb, 3),
            ph.drops,
            ph.retransmissions,
            if ph.reads > 0 {
                format!("{} µs", ph.read_latency_ns.p50 / 1000)
            } else {
                "-".into()
            },
            if ph.reads > 0 {
                format!("{} µs", ph.read_latency_ns.p99 / 1000)
            } else {
                "-".into()
            },
        );
        for c in &ph.classes {
            print!(" {:>16}", format!("{} ({})", o(c.gbps, 3), o(c.ratio, 3)));
        }
        println!();
        if let Some(r) = ph.outbound_over_link {
            println!(
                "              B's outbound (WRITEs and READ responses) over the link: {r:.3}"
            );
        }
        if !ph.writes_over_alone.is_empty() && ph.phase != PhaseKind::Alone {
            println!(
                "              WRITE classes over alone: {}",
                ph.writes_over_alone
                    .iter()
                    .map(|r| o(*r, 3))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    print_workers(&s.workers);
    if let (Some(csv), Some(svg)) = (&sh.csv, &sh.svg) {
        println!("  time series: {csv}; plot: {svg}");
    }
}
