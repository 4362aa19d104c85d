//! `portico bench congestion`: N flows into one target through an ECN-marking bottleneck, once
//! per congestion-control scheme (`none`, `dcqcn`, `ack`), in one process, one after the other.
//!
//! Each scheme gets its own pair of engines on one worker, joined by `net_ring` ports: engine A
//! holds the N initiating queue pairs (the flows), engine B the targets, and a bottleneck
//! ([`crate::bottleneck`]) sits in front of B's receive path: a byte FIFO served at
//! `--bottleneck-gbps`, marking CE between Kmin and Kmax with probability up to Pmax, dropping
//! at the tail, and delaying by `--rtt-us` (the whole round trip is on that path; the ACKs come
//! straight back). The flows negotiate the scheme, their senders start at the line rate
//! (`--line-gbps`, the bottleneck's by default: the incast of equal ports).
//!
//! The host thread follows the schedule (`--schedule`: each flow's start and end in µs):
//! while a flow is on, it keeps `--qd` WRITE messages outstanding on its queue pair, their
//! sizes drawn from a fixed mix (4 KiB to 1 MiB, the small ones most often), and records each
//! message's completion time (FCT: post to completion). The bottleneck records, per bin of
//! worker time, each flow's bytes in, the bytes out, the queue, the marks and the drops; the
//! figures ([`report`]) come from that trace, so they are in the time the engines saw.
//!
//! With `--reads` the flows READ instead: engine B's ends post READs of the same sizes from
//! A's memory, so the data (A's READ responses) crosses the bottleneck in front of B, and the
//! requester, not the responder, sees the marks (seed 002's service "RC READ response"):
//! under `ack` it tells A in enhanced CNPs, under `dcqcn` in CNPs, and A's pacer paces its READ
//! responses; `none` is the READ-unaware run (before issue 32, `ack` did not count marks on
//! READ responses at all, which on READ-only traffic is `none`).
//!
//! Output: the bench JSON schema (`results[]` per scheme, with the FCT percentiles as
//! `latency_ns`, and the workers' counters), plus a `congestion` object with each scheme's
//! figures; a CSV of the time series and an SVG plot of the three schemes side by side
//! (`--out DIR`).

pub mod report;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::tagged::Rng;
use super::{BenchOpts, OpResult, WCS_LEN, human, print_json, print_workers, usage};
use crate::bottleneck::BottleneckConfig;
use crate::instrument::{BottleneckSpec, IngressReport};
use portico::app::{AppError, MemoryChoice, PortSummary};
use portico::cc::{CcConfig, CcMode, DcqcnParams};
use portico::latency::Latency;
use portico::rdma::loopback::LoopbackOpts;
use portico::rdma::{Cq, Qp};
use portico::runtime::WorkerReport;
use portico::transport::{Access, QpConfig, SgList, WcStatus, WorkCompletion, WorkRequest};

/// The message sizes of the mixed workload and their weights (of 10).
const SIZE_MIX: [(u32, u32); 5] = [
    (4 << 10, 3),
    (16 << 10, 2),
    (64 << 10, 2),
    (256 << 10, 2),
    (1 << 20, 1),
];
const MAX_MESSAGE: usize = 1 << 20;
/// Messages outstanding per flow, at most.
pub const MAX_QD: usize = 16;
/// Trace bins.
const BIN_NS: u64 = 1_000;
/// How long after the schedule's end the outstanding messages may take.
const GRACE: Duration = Duration::from_secs(5);

/// Which DCQCN parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DcqcnPreset {
    /// The HPCC simulator's ConnectX-like settings ([`DcqcnParams::vendor`]).
    Vendor,
    /// The DCQCN paper's ([`DcqcnParams::paper`]).
    Paper,
}

/// What `bench congestion` takes besides the common bench options (`--mtu`, `--qd`, `--json`,
/// the EAL's).
#[derive(Debug, Clone)]
pub struct CongestionArgs {
    pub schemes: Vec<CcMode>,
    pub flows: usize,
    pub bottleneck_gbps: f64,
    pub line_gbps: Option<f64>,
    pub rtt_us: f64,
    pub kmin_kb: Option<f64>,
    pub kmax_kb: Option<f64>,
    pub pmax: f64,
    pub buffer_kb: Option<f64>,
    /// Per flow, `start-end` in µs, comma-separated; default: flow 0 from 0 to 20 000, the
    /// others from 1 000 to 5 000.
    pub schedule: Option<String>,
    pub dcqcn: DcqcnPreset,
    /// Where the CSV and SVG go (default `congestion` in the current directory).
    pub out: Option<PathBuf>,
    /// Moving-average window of the measured rates (µs; default the RTT, at least 50: the
    /// worker sends in bursts as long as its loop, tens of µs with 4 KiB frames).
    pub rate_window_us: Option<f64>,
    pub seed: u64,
    /// The flows READ from the far side instead of WRITE to it (`--reads`).
    pub reads: bool,
    /// `ack`: the CETH carries the bottleneck's queuing delay (`AckParams::delay`).
    pub ack_delay: bool,
    /// `ack`: keep the congested rate this long after the path clears (µs;
    /// `AckParams::keep_rate_ns`; 0 restores at once).
    pub keep_rate_us: f64,
}

impl Default for CongestionArgs {
    fn default() -> Self {
        CongestionArgs {
            schemes: vec![CcMode::None, CcMode::Dcqcn, CcMode::Ack],
            flows: 4,
            bottleneck_gbps: 10.0,
            line_gbps: None,
            rtt_us: 20.0,
            kmin_kb: None,
            kmax_kb: None,
            pmax: 0.2,
            buffer_kb: None,
            schedule: None,
            dcqcn: DcqcnPreset::Vendor,
            out: None,
            rate_window_us: None,
            seed: 1,
            reads: false,
            ack_delay: false,
            keep_rate_us: 0.0,
        }
    }
}

/// The parameters a run used, resolved.
#[derive(Debug, Clone, Serialize)]
pub struct CongestionParams {
    pub flows: usize,
    /// The flows READ (the data is READ responses) instead of WRITE.
    pub reads: bool,
    pub bottleneck_gbps: f64,
    pub line_gbps: f64,
    pub rtt_us: f64,
    pub kmin_bytes: u64,
    pub kmax_bytes: u64,
    pub pmax: f64,
    pub buffer_bytes: u64,
    pub mtu: u32,
    pub qd_per_flow: usize,
    /// Per flow: [start, end) in µs of host time.
    pub schedule_us: Vec<(u64, u64)>,
    pub bin_ns: u64,
    pub rate_window_ns: u64,
    pub dcqcn: DcqcnPreset,
    pub dcqcn_params: DcqcnParams,
    pub ack_params: portico::cc::AckParams,
    pub size_mix: Vec<(u32, u32)>,
}

/// One scheme's figures and counters.
#[derive(Debug, Clone, Serialize)]
pub struct SchemeSummary {
    #[serde(flatten)]
    pub figures: report::Figures,
    pub messages: u64,
    pub errors: u64,
    pub retransmissions: u64,
    pub cnps_sent: u64,
    pub becn_acks_sent: u64,
    pub ce_received: u64,
    /// The bottleneck's counters (its largest queue among them).
    pub bottleneck: crate::bottleneck::BottleneckCounters,
    /// Worker-clock gaps over 50 µs (the worker descheduled): the trace is in worker time,
    /// which such a gap does not advance by more than 50 µs.
    pub stalls: u64,
}

/// The `congestion` object of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct CongestionSummary {
    pub params: CongestionParams,
    pub schemes: Vec<SchemeSummary>,
    /// DCQCN's figure over `ack`'s, where both exist (reaction, recovery, queue p99).
    pub dcqcn_over_ack: Ratios,
    pub csv: Option<String>,
    pub svg: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Ratios {
    pub reaction: Option<f64>,
    pub recovery: Option<f64>,
    pub queue_p99: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CongestionBenchSummary {
    pub op: &'static str,
    pub seconds: f64,
    pub memory: MemoryChoice,
    pub buffers: String,
    pub results: Vec<OpResult>,
    pub errors: u64,
    pub workers: Vec<WorkerReport>,
    pub ports: Vec<PortSummary>,
    pub congestion: CongestionSummary,
}

/// `start-end` pairs in µs, comma-separated, one per flow.
fn parse_schedule(s: &str, flows: usize) -> Result<Vec<(u64, u64)>, AppError> {
    let bad = |why: String| usage(format!("--schedule: {why}"));
    let spans: Vec<(u64, u64)> = s
        .split(',')
        .map(|part| {
            let (a, b) = part
                .trim()
                .split_once('-')
                .ok_or_else(|| bad(format!("`{part}` is not start-end (µs)")))?;
            let n = |x: &str| {
                x.trim()
                    .parse::<u64>()
                    .map_err(|_| bad(format!("`{x}` is not a whole number of µs")))
            };
            let (a, b) = (n(a)?, n(b)?);
            if a >= b {
                return Err(bad(format!("`{part}` ends before it starts")));
            }
            Ok((a, b))
        })
        .collect::<Result<_, _>>()?;
    if spans.len() != flows {
        return Err(bad(format!(
            "{} spans for {flows} flows (--flows)",
            spans.len()
        )));
    }
    if spans.iter().any(|&(_, b)| b > 60_000_000) {
        return Err(bad("a flow ends after 60 s".into()));
    }
    Ok(spans)
}

fn default_schedule(flows: usize) -> Vec<(u64, u64)> {
    (0..flows)
        .map(|f| if f == 0 { (0, 20_000) } else { (1_000, 5_000) })
        .collect()
}

/// A size drawn from [`SIZE_MIX`] by its weights.
fn draw_size(rng: &mut Rng) -> u32 {
    let total: u32 = SIZE_MIX.iter().map(|&(_, w)| w).sum();
    let mut pick = (rng.next() % u64::from(total)) as u32;
    for &(size, w) in &SIZE_MIX {
        if pick < w {
            return size;
        }
        pick -= w;
    }
    SIZE_MIX[0].0
}

/// One flow on the host's side.
struct Flow {
    qp: Qp,
    cq: Cq,
    span: (Duration, Duration),
    /// Per slot: the size and post time of the message in it, if any.
    slots: Vec<Option<(u32, Instant)>>,
    rng: Rng,
    messages: u64,
    bytes: u64,
}

struct SchemeRun {
    run: report::Run,
    result: OpResult,
    summary: SchemeSummary,
    workers: Vec<WorkerReport>,
    ports: Vec<PortSummary>,
}

fn resolve(opts: &BenchOpts, args: &CongestionArgs) -> Result<CongestionParams, AppError> {
    if args.flows == 0 || args.flows > 16 {
        return Err(usage("--flows: must be 1..=16".into()));
    }
    if !(args.bottleneck_gbps > 0.0 && args.bottleneck_gbps <= 400.0) {
        return Err(usage("--bottleneck-gbps: must be in (0, 400]".into()));
    }
    let line = args.line_gbps.unwrap_or(args.bottleneck_gbps);
    if !(line > 0.0 && line <= 400.0) {
        return Err(usage("--line-gbps: must be in (0, 400]".into()));
    }
    if !(args.rtt_us >= 0.0 && args.rtt_us <= 10_000.0) {
        return Err(usage("--rtt-us: must be 0..=10000".into()));
    }
    if !(args.keep_rate_us.is_finite() && (0.0..=1e6).contains(&args.keep_rate_us)) {
        return Err(usage("--keep-rate-us: must be 0..=1000000".into()));
    }
    if !(0.0..=1.0).contains(&args.pmax) {
        return Err(usage("--pmax: must be 0..=1".into()));
    }
    if opts.qd == 0 {
        return Err(usage("--qd: at least 1".into()));
    }
    let rate_bps = (args.bottleneck_gbps * 1e9) as u64;
    let preset = BottleneckConfig::for_rate(rate_bps);
    let kb = |v: Option<f64>, field: &str, default: u64| -> Result<u64, AppError> {
        match v {
            None => Ok(default),
            Some(k) if (0.0..=1e6).contains(&k) => Ok((k * 1000.0) as u64),
            Some(_) => Err(usage(format!("{field}: must be 0..=1000000 KB"))),
        }
    };
    let kmin = kb(args.kmin_kb, "--kmin-kb", preset.kmin_bytes)?;
    let kmax = kb(args.kmax_kb, "--kmax-kb", preset.kmax_bytes)?;
    if kmin > kmax {
        return Err(usage("--kmin-kb: above --kmax-kb".into()));
    }
    let buffer = kb(args.buffer_kb, "--buffer-kb", 4 * kmax.max(16_000))?;
    let schedule_us = match &args.schedule {
        Some(s) => parse_schedule(s, args.flows)?,
        None => default_schedule(args.flows),
    };
    let rtt_ns = (args.rtt_us * 1000.0) as u64;
    let rate_window_ns = match args.rate_window_us {
        Some(w) if w > 0.0 && w <= 10_000.0 => (w * 1000.0) as u64,
        Some(_) => return Err(usage("--rate-window-us: must be in (0, 10000]".into())),
        None => rtt_ns.max(50_000),
    };
    Ok(CongestionParams {
        flows: args.flows,
        reads: args.reads,
        bottleneck_gbps: args.bottleneck_gbps,
        line_gbps: line,
        rtt_us: args.rtt_us,
        kmin_bytes: kmin,
        kmax_bytes: kmax,
        pmax: args.pmax,
        buffer_bytes: buffer,
        mtu: opts.mtu.bytes(),
        qd_per_flow: opts.qd.min(MAX_QD),
        schedule_us,
        bin_ns: BIN_NS,
        rate_window_ns,
        dcqcn: args.dcqcn,
        dcqcn_params: match args.dcqcn {
            DcqcnPreset::Vendor => DcqcnParams::vendor(),
            DcqcnPreset::Paper => DcqcnParams::paper(),
        },
        ack_params: portico::cc::AckParams {
            delay: args.ack_delay,
            keep_rate_ns: (args.keep_rate_us * 1000.0) as u64,
            ..portico::cc::AckParams::default()
        },
        size_mix: SIZE_MIX.to_vec(),
    })
}

/// Runs every scheme of `args` and returns the summary (printed by the caller); the CSV and
/// SVG are written on the way.
pub fn run(
    opts: &BenchOpts,
    args: &CongestionArgs,
    stop: Arc<AtomicBool>,
) -> Result<CongestionBenchSummary, AppError> {
    if args.schemes.is_empty() {
        return Err(usage("--cc: at least one scheme".into()));
    }
    let params = resolve(opts, args)?;
    // One pair of engines per scheme, one after the other.
    let (host_core, engine_core, memory) =
        super::start_eal_for_pairs(opts, args.schemes.len() as u32)?;
    human(
        opts.json,
        &format!(
            "bench congestion: {} flows into {} Gbit/s (line {} Gbit/s), RTT {} µs, Kmin {} KB, Kmax {} KB, Pmax {}, buffer {} KB, MTU {}, {} messages outstanding per flow; schemes {}; both engines on core {engine_core}, host on core {host_core}",
            params.flows,
            params.bottleneck_gbps,
            params.line_gbps,
            params.rtt_us,
            params.kmin_bytes / 1000,
            params.kmax_bytes / 1000,
            params.pmax,
            params.buffer_bytes / 1000,
            params.mtu,
            params.qd_per_flow,
            args.schemes
                .iter()
                .map(|m| m.name())
                .collect::<Vec<_>>()
                .join(", "),
        ),
    );
    let t0 = Instant::now();
    let mut runs = Vec::new();
    let mut results = Vec::new();
    let mut schemes = Vec::new();
    let mut workers = Vec::new();
    let mut ports = Vec::new();
    let mut buffers = String::new();
    for &mode in &args.schemes {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let s = run_scheme(opts, args, &params, mode, engine_core, &stop, &mut buffers)?;
        human(
            opts.json,
            &format!(
                "  {}: {} messages, {:.2} Gbit/s, reaction {}, recovery {}, queue p99 {} KB, drops {}",
                mode.name(),
                s.summary.messages,
                s.result.gbit_per_sec,
                fmt_us(s.summary.figures.reaction_us),
                fmt_us(s.summary.figures.recovery_us),
                s.summary.figures.queue_p99_bytes / 1000,
                s.summary.figures.drops
            ),
        );
        runs.push(s.run);
        results.push(s.result);
        schemes.push(s.summary);
        workers.extend(s.workers);
        ports.extend(s.ports);
    }
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("congestion"));
    let files = std::fs::create_dir_all(&dir).and_then(|_| {
        let csv = dir.join("congestion.csv");
        let svg = dir.join("congestion.svg");
        report::write_csv(&csv, &runs)?;
        let title = format!(
            "{} flows into {} Gbit/s, RTT {} µs, Kmin/Kmax {}/{} KB, Pmax {}",
            params.flows,
            params.bottleneck_gbps,
            params.rtt_us,
            params.kmin_bytes / 1000,
            params.kmax_bytes / 1000,
            params.pmax
        );
        report::write_svg(&svg, &runs, &title)?;
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
    let by = |m: &str| schemes.iter().find(|s| s.figures.cc == m);
    let ratio = |f: fn(&SchemeSummary) -> Option<f64>| match (by("dcqcn"), by("ack")) {
        (Some(d), Some(a)) => match (f(d), f(a)) {
            (Some(x), Some(y)) if y > 0.0 => Some(x / y),
            _ => None,
        },
        _ => None,
    };
    let dcqcn_over_ack = Ratios {
        reaction: ratio(|s| s.figures.reaction_us),
        recovery: ratio(|s| s.figures.recovery_us),
        queue_p99: ratio(|s| Some(s.figures.queue_p99_bytes as f64)),
    };
    let errors = schemes.iter().map(|s| s.errors).sum();
    Ok(CongestionBenchSummary {
        op: "congestion",
        seconds: t0.elapsed().as_secs_f64(),
        memory,
        buffers,
        results,
        errors,
        workers,
        ports,
        congestion: CongestionSummary {
            params,
            schemes,
            dcqcn_over_ack,
            csv,
            svg,
        },
    })
}

fn fmt_us(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.1} µs"))
        .unwrap_or_else(|| "never".into())
}

fn scheme_name(mode: CcMode) -> &'static str {
    match mode {
        CcMode::None => "congestion-none",
        CcMode::Dcqcn => "congestion-dcqcn",
        CcMode::Ack => "congestion-ack",
    }
}

fn run_scheme(
    opts: &BenchOpts,
    args: &CongestionArgs,
    p: &CongestionParams,
    mode: CcMode,
    core: usize,
    stop: &AtomicBool,
    buffers: &mut String,
) -> Result<SchemeRun, AppError> {
    let mut qp = QpConfig::new(0, 0);
    qp.pmtu = opts.mtu;
    qp.max_send_wr = p.qd_per_flow + 8;
    qp.max_recv_wr = 8;
    qp.cc = CcConfig {
        mode,
        line_rate_bps: (p.line_gbps * 1e9) as u64,
        dcqcn: p.dcqcn_params,
        ack: p.ack_params,
        ..CcConfig::default()
    };
    let rtt_ns = (p.rtt_us * 1000.0) as u64;
    let end_us = p.schedule_us.iter().map(|s| s.1).max().unwrap_or(0);
    let bins = ((end_us * 1000 + GRACE.as_nanos() as u64 / 10) / BIN_NS) as usize + 1;
    let slot = Arc::new(Mutex::new(None));
    let config = BottleneckConfig {
        rate_bps: (p.bottleneck_gbps * 1e9) as u64,
        buffer_bytes: p.buffer_bytes,
        kmin_bytes: p.kmin_bytes,
        kmax_bytes: p.kmax_bytes,
        pmax: p.pmax,
        delay_ns: rtt_ns,
        overhead_bytes: 24,
        seed: args.seed,
    };
    let name = format!("cc{}", mode.name());
    let mut lo = LoopbackOpts::new(qp, [core, core]);
    lo.name = name.clone();
    lo.connections = p.flows;
    lo.cq_depth = p.qd_per_flow * 2 + 16;
    let bottleneck = BottleneckSpec {
        config,
        capacity: 12_000,
        trace: Some((BIN_NS, bins)),
        report: slot.clone(),
    };
    let wrap = bottleneck.wrap(lo.connections, None);
    lo.wrap =
        Some(wrap.map_err(|e| AppError::Failed(format!("starting the {name} engines: {e}")))?);
    let super::StartedPair {
        a,
        b,
        more,
        running,
    } = super::start_pair(&lo)?;
    let host = |e: portico::rdma::HostError| AppError::Failed(format!("host call: {e}"));
    let per_flow = p.qd_per_flow * MAX_MESSAGE;
    let src_map = super::tagged::map(p.flows * per_flow)?;
    let dst_map = super::tagged::map(p.flows * per_flow)?;
    *buffers = src_map.kind().to_string();
    let src = a.engine.register_all(&src_map, Access::ALL).map_err(host)?;
    let dst = b.engine.register_all(&dst_map, Access::ALL).map_err(host)?;
    // The flows post on A's ends (WRITEs through the bottleneck in front of B), or with
    // `--reads` on B's (READs whose responses come through it).
    let ends = std::iter::once((a.qp, a.cq, b.qp, b.cq))
        .chain(more.into_iter().map(|c| (c.a.qp, c.a.cq, c.b.qp, c.b.cq)));
    let mut flows: Vec<Flow> = ends
        .map(|(qa, ca, qb, cb)| if p.reads { (qb, cb) } else { (qa, ca) })
        .enumerate()
        .map(|(i, (qp, cq))| {
            let (s, e) = p.schedule_us[i];
            Flow {
                qp,
                cq,
                span: (Duration::from_micros(s), Duration::from_micros(e)),
                slots: vec![None; p.qd_per_flow],
                rng: Rng::new(args.seed ^ (i as u64 + 1)),
                messages: 0,
                bytes: 0,
            }
        })
        .collect();
    let mut fct: Vec<(u32, u64)> = Vec::with_capacity(1 << 16);
    let mut latency = Latency::new();
    let mut wcs = [WorkCompletion::EMPTY; WCS_LEN];
    let mut errors = 0u64;
    let end = Duration::from_micros(end_us);
    let t0 = Instant::now();
    loop {
        let now = t0.elapsed();
        let stopping = stop.load(Ordering::Relaxed);
        let mut outstanding = 0;
        for (i, f) in flows.iter_mut().enumerate() {
            let on = !stopping && now >= f.span.0 && now < f.span.1;
            if on {
                for (k, s) in f.slots.iter_mut().enumerate() {
                    if s.is_some() {
                        continue;
                    }
                    let size = draw_size(&mut f.rng);
                    let off = (i * per_flow + k * MAX_MESSAGE) as u64;
                    let wr = if p.reads {
                        WorkRequest::read(
                            k as u64,
                            SgList::one(dst.lkey(), dst.addr() + off, size),
                            src.addr() + off,
                            src.rkey(),
                        )
                    } else {
                        WorkRequest::write(
                            k as u64,
                            SgList::one(src.lkey(), src.addr() + off, size),
                            dst.addr() + off,
                            dst.rkey(),
                            None,
                        )
                    };
                    if f.qp.post_send(&[wr]).is_err() {
                        break;
                    }
                    *s = Some((size, Instant::now()));
                }
            }
            let n = f.cq.poll(&mut wcs);
            let done_at = Instant::now();
            for wc in &wcs[..n] {
                let Some(Some((size, posted))) =
                    f.slots.get_mut(wc.wr_id as usize).map(|s| s.take())
                else {
                    continue;
                };
                if wc.status != WcStatus::Success {
                    errors += 1;
                    continue;
                }
                let ns = done_at.duration_since(posted).as_nanos() as u64;
                fct.push((size, ns));
                latency.record(ns);
                f.messages += 1;
                f.bytes += u64::from(size);
            }
            outstanding += f.slots.iter().filter(|s| s.is_some()).count();
        }
        if (now >= end || stopping) && outstanding == 0 {
            break;
        }
        if now >= end + GRACE {
            return Err(AppError::Failed(format!(
                "{}: {outstanding} messages still outstanding {} s after the schedule's end",
                mode.name(),
                GRACE.as_secs()
            )));
        }
        std::hint::spin_loop();
    }
    let seconds = t0.elapsed().as_secs_f64();
    let (ports, workers) = running.stop_labelled(mode.name(), &name)?;
    let ingress: IngressReport = super::take_report(&slot, &format!("{name}: the bottleneck"))?;
    let counter = |n: &str| workers.iter().filter_map(|w| w.counter(n)).sum::<u64>();
    let run = to_run(mode, p, &ingress, fct);
    let figures = report::figures(&run);
    let messages: u64 = flows.iter().map(|f| f.messages).sum();
    let bytes: u64 = flows.iter().map(|f| f.bytes).sum();
    let summary = SchemeSummary {
        figures,
        messages,
        errors,
        retransmissions: counter("retransmissions"),
        cnps_sent: counter("cnps_sent"),
        becn_acks_sent: counter("becn_acks_sent"),
        ce_received: counter("ce_received"),
        bottleneck: ingress.counters,
        stalls: counter("stalls"),
    };
    let result = OpResult {
        size: None,
        qd: None,
        op: scheme_name(mode),
        ops: messages,
        ops_per_sec: messages as f64 / seconds,
        gbit_per_sec: bytes as f64 * 8.0 / seconds / 1e9,
        latency_ns: latency.summary(),
    };
    Ok(SchemeRun {
        run,
        result,
        summary,
        workers,
        ports,
    })
}

/// The bottleneck's trace as the report's input: the flows' spans are where their bytes were
/// seen (worker time), the series cut after the last bin with traffic.
fn to_run(
    mode: CcMode,
    p: &CongestionParams,
    ing: &IngressReport,
    fct: Vec<(u32, u64)>,
) -> report::Run {
    let Some(t) = &ing.trace else {
        return report::Run {
            cc: mode.name().into(),
            ..report::Run::default()
        };
    };
    let last = (0..t.bins)
        .rev()
        .find(|&b| t.departed[b] > 0 || (0..t.flows).any(|f| t.arrived[b * t.flows + f] > 0))
        .map_or(0, |b| b + 1);
    let bins = (last + 10).min(t.bins);
    let schedule = (0..t.flows)
        .map(|f| {
            let seen: Vec<usize> = (0..bins)
                .filter(|&b| t.arrived[b * t.flows + f] > 0)
                .collect();
            match (seen.first(), seen.last()) {
                (Some(&a), Some(&z)) => (a as u64 * t.bin_ns, (z as u64 + 1) * t.bin_ns),
                _ => (0, 0),
            }
        })
        .collect();
    report::Run {
        cc: mode.name().into(),
        bin_ns: t.bin_ns,
        flows: t.flows,
        arrived: t.arrived[..bins * t.flows].to_vec(),
        departed: t.departed[..bins].to_vec(),
        queue_max: t.queue_max[..bins].to_vec(),
        marks: t.marks[..bins].to_vec(),
        drops: t.drops[..bins].to_vec(),
        schedule,
        bottleneck_bps: (p.bottleneck_gbps * 1e9) as u64,
        kmin_bytes: p.kmin_bytes,
        kmax_bytes: p.kmax_bytes,
        rate_window_ns: p.rate_window_ns,
        queue_p50_bytes: ing.queue_p50_bytes,
        queue_p99_bytes: ing.queue_p99_bytes,
        drops_total: ing.counters.dropped,
        marks_total: ing.counters.marked,
        fct,
        set_rates: ing
            .rates
            .get(..bins * t.flows)
            .map_or(Vec::new(), <[u64]>::to_vec),
    }
}

/// Prints the summary: a table of the schemes, or one JSON object.
pub fn print(s: &CongestionBenchSummary, json: bool) {
    if json {
        return print_json(s);
    }
    let c = &s.congestion;
    println!();
    println!(
        "bench congestion: {} flows into {} Gbit/s, RTT {} µs ({:.2} s, {} errors)",
        c.params.flows, c.params.bottleneck_gbps, c.params.rtt_us, s.seconds, s.errors
    );
    println!(
        "  {:<6} {:>11} {:>9} {:>11} {:>9} {:>9} {:>6} {:>6} {:>7} {:>6} {:>10} {:>10} {:>6}",
        "cc",
        "reaction µs",
        "from mark",
        "recovery µs",
        "q p50 KB",
        "q p99 KB",
        "util",
        "drops",
        "marks",
        "jain",
        "FCT p50 µs",
        "FCT p99 µs",
        "retx"
    );
    let o = |v: Option<f64>, prec: usize| {
        v.map(|v| format!("{v:.prec$}"))
            .unwrap_or_else(|| "-".into())
    };
    for sc in &c.schemes {
        let f = &sc.figures;
        println!(
            "  {:<6} {:>11} {:>9} {:>11} {:>9.1} {:>9.1} {:>6} {:>6} {:>7} {:>6} {:>10} {:>10} {:>6}",
            f.cc,
            o(f.reaction_us, 1),
            o(f.reaction_from_mark_us, 1),
            o(f.recovery_us, 1),
            f.queue_p50_bytes as f64 / 1000.0,
            f.queue_p99_bytes as f64 / 1000.0,
            o(f.utilization, 3),
            f.drops,
            f.marks,
            o(f.jain, 3),
            o(f.fct.p50_us, 1),
            o(f.fct.p99_us, 1),
            sc.retransmissions
        );
    }
    let r = &c.dcqcn_over_ack;
    println!(
        "  dcqcn / ack: reaction {}x, recovery {}x, queue p99 {}x",
        o(r.reaction, 1),
        o(r.recovery, 1),
        o(r.queue_p99, 2)
    );
    print_workers(&s.workers);
    if let (Some(csv), Some(svg)) = (&c.csv, &c.svg) {
        println!("  time series: {csv}; plot: {svg}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_parse_or_name_the_problem() {
        assert_eq!(
            parse_schedule("0-100, 10-50", 2).unwrap(),
            vec![(0, 100), (10, 50)]
        );
        for (bad, why) in [
            ("0-100", "1 spans for 2 flows"),
            ("0-100,50", "is not start-end"),
            ("0-100,x-5", "is not a whole number"),
            ("0-100,60-50", "ends before it starts"),
        ] {
            let e = parse_schedule(bad, 2).unwrap_err().to_string();
            assert!(e.contains("--schedule") && e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_size_mix_is_drawn_with_its_weights() {
        let mut r = Rng::new(7);
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..100_000 {
            *counts.entry(draw_size(&mut r)).or_insert(0u32) += 1;
        }
        for (size, w) in SIZE_MIX {
            let got = f64::from(counts[&size]) / 100_000.0;
            assert!((got - f64::from(w) / 10.0).abs() < 0.01, "{size}: {got}");
        }
    }
}
