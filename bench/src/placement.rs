//! `portico bench placement`: header + data to a target's buffer list (seed 003), three ways,
//! in one run on one pair of engines.
//!
//! - `coalesced`: the planner's layout ([`portico::placement`]), sent with `Qp::post_placed`
//!   (every message is planned, gathered and posted by that call, as an application would):
//!   one RDMA WRITE with immediate gathered from the header's and the data's own buffers, the
//!   data on page boundaries, the header on its alignment. The target uses the data where it
//!   landed: no copy.
//! - `two-writes`: the header to the start of the first buffer, the data to the start of the
//!   second (page-aligned), as two WRITEs, the second with the immediate. No copy either.
//! - `naive`: one WRITE with immediate of the header and, right after it, the data: the data is
//!   not page-aligned, so the target copies it into a page-aligned buffer of its own before
//!   the message counts as received (one copy of the data per message).
//!
//! The target's buffer list is 16 contiguous, page-aligned buffers (as a pool of posted
//! buffers is), each a quarter of the data plus the header, rounded up to pages, 8 KiB at least.
//! For each header length (64 B to 1 KiB, on a 64-byte alignment) and data length (1 KiB to
//! 1 MiB), each method runs a closed loop of `--qd` messages in flight (fewer for large data:
//! 8 MiB outstanding at most) for `--duration` seconds after a short warm-up. A message counts
//! when the target's receive completes (and, for `naive`, its copy is done); its latency runs
//! from posting to then. Every message's wire cost is reported from the plan: the WRITEs'
//! bytes, the waste among them, and the RoCEv2 frame bytes of the request packets.
//!
//! Before the engines start, the planner's own cost per plan is timed for every point (a
//! warm [`Planner`] planning the same request many times); `benches/placement.rs` (criterion)
//! is the careful measurement.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::tagged::{Clock, Ratio, map, point_timing, ratio_line, retransmissions};
use super::{BenchOp, BenchOpts, WCS_LEN, human, usage};
use portico::app::{AppError, MemoryChoice, PortSummary};
use portico::config::{MemoryLimit, limits};
use portico::latency::{Latency, LatencySummary};
use portico::placement::{Buffer, Planner, Request, Sources};
use portico::rdma::{Cq, MemoryRegion, Qp};
use portico::report;
use portico::runtime::WorkerReport;
use portico::transport::{
    Access, QpConfig, RecvRequest, SgList, WcOpcode, WcStatus, WorkCompletion, WorkRequest,
};

/// Seconds measured per point by default.
pub const DEFAULT_POINT_SECONDS: f64 = 0.3;

const HEADERS: [u32; 4] = [64, 128, 256, 1024];
const HEADER_ALIGN: u32 = 64;
const DATA: [u32; 6] = [1024, 4096, 16384, 65536, 262144, 1 << 20];
const PAGE: u32 = 4096;
const BUFFERS: usize = 16;
/// The target point of the issue: 4 KiB of data, a 128-byte header.
const TARGET_DATA: u32 = 4096;
const TARGET_HEADER: u32 = 128;
/// Bytes outstanding at most (the window shrinks for large messages).
const WINDOW_BYTES: u64 = 8 << 20;
const SQ_DEPTH: usize = 256;
const RQ_DEPTH: usize = 256;
/// The queue pairs' retransmission timeout: a window of 1 MiB WRITEs takes longer than the
/// default to drain on one software core (as `bench tagged`).
const TIMEOUT_NS: u64 = 10_000_000;
/// Plans timed per point for the planner's cost.
const PLANS_TIMED: u32 = 20_000;

/// The three ways of sending a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    Coalesced,
    TwoWrites,
    Naive,
}

impl Method {
    const ALL: [Method; 3] = [Method::Coalesced, Method::TwoWrites, Method::Naive];

    fn name(self) -> &'static str {
        match self {
            Method::Coalesced => "coalesced",
            Method::TwoWrites => "two-writes",
            Method::Naive => "naive",
        }
    }
}

/// One measured point, as the JSON's `results[]` holds it.
#[derive(Debug, Clone, Serialize)]
pub struct PlacementResult {
    /// e.g. `coalesced-h128-4096B`.
    pub name: String,
    /// The method (also under `method`).
    pub op: &'static str,
    pub method: Method,
    pub header: u32,
    /// Data bytes per message.
    pub size: u32,
    pub window: usize,
    pub ops: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
    /// Header and data bytes (not waste) per second.
    pub gbit_per_sec: f64,
    pub latency_ns: LatencySummary,
    /// RDMA WRITEs per message.
    pub writes_per_op: usize,
    /// Bytes the WRITEs carry per message: header, data and waste.
    pub write_bytes_per_op: u64,
    /// Of those, neither header nor data (alignment padding).
    pub waste_bytes_per_op: u64,
    /// RoCEv2 request frames per message (Ethernet to ICRC, without ACKs), by the MTU.
    pub frame_bytes_per_op: u64,
    pub packets_per_op: u64,
    /// Copies the target made in the measured interval (one per `naive` message).
    pub target_copies: u64,
    pub target_copied_bytes_per_op: u64,
    pub errors: u64,
    pub retransmissions: u64,
    /// Coalesced points: ops/s over the two-writes point of the same sizes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub over_two_writes: Option<f64>,
    /// Coalesced points: ops/s over the naive point of the same sizes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub over_naive: Option<f64>,
}

/// The planner's cost for one point's request.
#[derive(Debug, Clone, Serialize)]
pub struct PlannerCost {
    pub header: u32,
    pub size: u32,
    pub buffers_offered: usize,
    /// Buffers the plan uses.
    pub buffers_used: u8,
    pub ns_per_plan: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Checks {
    /// Coalesced over two WRITEs, ops/s, at 4 KiB of data and a 128-byte header.
    pub coalesced_vs_two_writes_4k_h128: Ratio,
    /// Target-side copies of every coalesced point together (target: 0).
    pub coalesced_target_copies: u64,
    /// Points where coalescing carried more waste than naive coalescing (target: none).
    pub waste_above_naive: Vec<String>,
    /// The slowest plan of the sweep, ns (target <= 200 for <= 16 buffers).
    pub planner_max_ns: f64,
    pub planner_target_met: bool,
}

/// The `placement` object of the JSON summary.
#[derive(Debug, Clone, Serialize)]
pub struct PlacementSummary {
    pub point_seconds: f64,
    pub warmup_seconds: f64,
    pub mtu: u32,
    pub page: u32,
    pub header_align: u32,
    /// The target's buffer list, in words.
    pub buffer_list: String,
    pub checks: Checks,
    pub planner: Vec<PlannerCost>,
}

/// What `bench placement` prints: the fields every bench has, its points as `results`, and
/// the `placement` object.
#[derive(Debug, Clone, Serialize)]
pub struct PlacementBenchSummary {
    pub op: BenchOp,
    pub qd: usize,
    pub seconds: f64,
    pub memory: MemoryChoice,
    pub buffers: String,
    pub results: Vec<PlacementResult>,
    pub errors: u64,
    pub failures: Vec<String>,
    pub workers: Vec<WorkerReport>,
    pub ports: Vec<PortSummary>,
    pub placement: PlacementSummary,
}

/// The target's buffer list for `header` + `data`, at `base`.
fn buffer_list(base: u64, header: u32, data: u32) -> [Buffer; BUFFERS] {
    let len = (data / 4 + header).next_multiple_of(PAGE).max(2 * PAGE);
    std::array::from_fn(|i| Buffer {
        addr: base + i as u64 * u64::from(len),
        len,
    })
}

/// The largest target region any point needs.
fn target_len() -> usize {
    let last = buffer_list(0, HEADERS[HEADERS.len() - 1], DATA[DATA.len() - 1]);
    (last[BUFFERS - 1].addr + u64::from(last[BUFFERS - 1].len)) as usize
}

/// RoCEv2 request frames of a WRITE of `len` bytes (with an immediate or not) at `mtu`:
/// Ethernet, IPv4, UDP, BTH and ICRC on every packet, RETH on the first, the immediate on the
/// last, the payload padded to 4 bytes.
fn write_frames(len: u64, imm: bool, mtu: u64) -> (u64, u64) {
    let packets = len.div_ceil(mtu).max(1);
    let per_packet = 14 + 20 + 8 + 12 + 4;
    let pad = (4 - len % 4) % 4;
    (
        packets,
        len + pad + packets * per_packet + 16 + if imm { 4 } else { 0 },
    )
}

/// What one method sends for one point: the WRITEs (built once; the same bytes every
/// message), and its wire cost.
struct Prepared {
    wrs: [WorkRequest; 2],
    n: usize,
    write_bytes: u64,
    waste: u64,
    frames: u64,
    packets: u64,
    /// `naive`: where the data landed in the target's region (offset), to copy out.
    copy_from: Option<usize>,
    /// `coalesced`: what every message plans and gathers again (`Qp::post_placed`), as an
    /// application does; `wrs` is the first message's result, for the wire figures.
    placed: Option<(Request, [Buffer; BUFFERS], Sources)>,
}

/// The session: both ends, the regions, the scratch.
struct Session {
    a_qp: Qp,
    a_cq: Cq,
    b_qp: Qp,
    b_cq: Cq,
    src: MemoryRegion,
    dst: MemoryRegion,
    /// The target application's own page-aligned buffer, where `naive` copies the data.
    user: Vec<Page>,
    planner: Planner,
    /// `RQ_DEPTH` empty receives, posted from as the target's completions come.
    recvs: Vec<RecvRequest>,
    stop: Arc<AtomicBool>,
    wcs: [WorkCompletion; WCS_LEN],
    _engines: (portico::rdma::RdmaHandle, portico::rdma::RdmaHandle),
}

/// A page of the target application's own buffer.
#[repr(C, align(4096))]
struct Page([u8; PAGE as usize]);

/// A's source region: the header, the data, the pad.
const SRC_HEADER: usize = 0;
const SRC_DATA: usize = 4096;
const SRC_PAD: usize = SRC_DATA + (1 << 20);
const SRC_LEN: usize = SRC_PAD + 4096;

impl Session {
    fn prepare(
        &mut self,
        method: Method,
        header: u32,
        data: u32,
        mtu: u64,
    ) -> Result<Prepared, AppError> {
        let bufs = buffer_list(self.dst.addr(), header, data);
        let rkey = self.dst.rkey();
        let h = self.src.sge(SRC_HEADER, header);
        let d = self.src.sge(SRC_DATA, data);
        let mut out = Prepared {
            wrs: [WorkRequest::write(0, SgList::new(), 0, 0, None); 2],
            n: 0,
            write_bytes: 0,
            waste: 0,
            frames: 0,
            packets: 0,
            copy_from: None,
            placed: None,
        };
        let add = |out: &mut Prepared, wr: WorkRequest, imm: bool| {
            let len = wr.sgl.total_len();
            let (p, f) = write_frames(len, imm, mtu);
            out.wrs[out.n] = wr;
            out.n += 1;
            out.write_bytes += len;
            out.packets += p;
            out.frames += f;
        };
        match method {
            Method::Coalesced => {
                let req = Request {
                    header_len: header,
                    header_align: HEADER_ALIGN,
                    data_len: data,
                    page: PAGE,
                };
                let layout = self.planner.plan(&req, &bufs).map_err(|e| {
                    AppError::Failed(format!("planning {header} B + {data} B: {e}"))
                })?;
                let src = Sources {
                    header: h,
                    data: d,
                    pad: self.src.sge(SRC_PAD, 4096),
                };
                let w = portico::placement::gather(&layout, &req, &bufs, rkey, &src, 0)
                    .map_err(|e| AppError::Failed(format!("gathering the plan: {e}")))?;
                if w.as_slice().len() > 2 {
                    return Err(AppError::Failed(format!(
                        "the plan of {header} B + {data} B takes {} WRITEs",
                        w.as_slice().len()
                    )));
                }
                let last = w.as_slice().len() - 1;
                for (i, wr) in w.as_slice().iter().enumerate() {
                    add(&mut out, *wr, i == last);
                }
                out.waste = layout.cost(&req, &bufs).waste;
                out.placed = Some((req, bufs, src));
            }
            Method::TwoWrites => {
                let hw = WorkRequest::write(
                    0,
                    SgList::one(h.lkey, h.addr, h.len),
                    bufs[0].addr,
                    rkey,
                    None,
                );
                let dw = WorkRequest::write(
                    0,
                    SgList::one(d.lkey, d.addr, d.len),
                    bufs[1].addr,
                    rkey,
                    Some(0),
                );
                add(&mut out, hw, false);
                add(&mut out, dw, true);
            }
            Method::Naive => {
                let mut sgl = SgList::one(h.lkey, h.addr, h.len);
                sgl.push(d).expect("two pieces");
                add(
                    &mut out,
                    WorkRequest::write(0, sgl, bufs[0].addr, rkey, Some(0)),
                    true,
                );
                out.copy_from = Some((bufs[0].addr - self.dst.addr()) as usize + header as usize);
            }
        }
        Ok(out)
    }

    /// Drains A's completions; returns how many, or the first failure.
    fn a_completions(&mut self) -> Result<usize, AppError> {
        let n = self.a_cq.poll(&mut self.wcs);
        for wc in &self.wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(AppError::Failed(format!("a WRITE failed: {wc:?}")));
            }
        }
        Ok(n)
    }

    /// Posts `n` receives (at most the receive queue's depth) with one doorbell. A WRITE with
    /// immediate takes no receive buffer: every receive is the same empty request.
    fn post_receives(&mut self, n: usize) -> Result<(), AppError> {
        if n == 0 {
            return Ok(());
        }
        self.b_qp
            .post_recv(&self.recvs[..n])
            .map_err(|e| AppError::Failed(format!("posting {n} receives: {e}")))
    }

    /// One point: a closed loop of `window` messages for the clock's duration.
    fn point(
        &mut self,
        method: Method,
        header: u32,
        data: u32,
        window: usize,
        run: &RunShape,
    ) -> Result<Measured, AppError> {
        let prep = self.prepare(method, header, data, run.mtu)?;
        let mut clock = Clock::new(run.point, run.warm, window);
        let mut hist = Latency::new();
        let (mut ops, mut copies) = (0u64, 0u64);
        let mut starts: VecDeque<Instant> = VecDeque::with_capacity(window);
        let mut a_out = 0usize;
        loop {
            let now = Instant::now();
            if clock.tick(now, &self.stop, ops) {
                (ops, copies) = (0, 0);
                hist = Latency::new();
            }
            while !clock.ended() && starts.len() < window && a_out + prep.n <= SQ_DEPTH {
                let posted = match &prep.placed {
                    // Plan, gather and post: the whole per-message cost of the API.
                    Some((req, bufs, src)) => {
                        let rkey = self.dst.rkey();
                        self.a_qp
                            .post_placed(&mut self.planner, req, bufs, rkey, src, 0)
                            .map_err(|e| {
                                AppError::Failed(format!("posting a placed message: {e}"))
                            })?
                            .writes
                    }
                    None => {
                        self.a_qp
                            .post_send(&prep.wrs[..prep.n])
                            .map_err(|e| AppError::Failed(format!("posting WRITEs: {e}")))?;
                        prep.n
                    }
                };
                a_out += posted;
                starts.push_back(Instant::now());
            }
            let n = self.b_cq.poll(&mut self.wcs);
            let mut took = n;
            for i in 0..n {
                let wc = self.wcs[i];
                if wc.status != WcStatus::Success || wc.opcode != WcOpcode::RecvRdmaWithImm {
                    return Err(AppError::Failed(format!("the target's receive: {wc:?}")));
                }
                if let Some(from) = prep.copy_from {
                    // The target application's copy of the unaligned data into its own
                    // page-aligned buffer: one copy of every byte.
                    let (mut at, mut left) = (from, data as usize);
                    for page in self.user.iter_mut() {
                        if left == 0 {
                            break;
                        }
                        let n = left.min(PAGE as usize);
                        self.dst
                            .read(at, &mut page.0[..n])
                            .map_err(|e| AppError::Failed(format!("target copy: {e}")))?;
                        (at, left) = (at + n, left - n);
                    }
                    if clock.measuring() {
                        copies += 1;
                    }
                }
                let started = starts.pop_front().expect("a message in flight");
                if clock.measuring() {
                    ops += 1;
                    hist.record(Instant::now().saturating_duration_since(started).as_nanos() as u64);
                }
            }
            self.post_receives(n)?;
            let done = self.a_completions()?;
            a_out -= done;
            took += done;
            clock.progressed(took, Instant::now());
            if clock.ended() && starts.is_empty() && a_out == 0 {
                break;
            }
            if clock.overdue(Instant::now()) {
                return Err(AppError::Failed(format!(
                    "{} {header} B + {data} B: {} messages never arrived",
                    method.name(),
                    starts.len()
                )));
            }
        }
        Ok(Measured {
            prep,
            ops,
            seconds: clock.seconds(),
            hist,
            copies,
        })
    }
}

/// How every point runs.
struct RunShape {
    point: Duration,
    warm: Duration,
    mtu: u64,
}

/// What one point measured.
struct Measured {
    prep: Prepared,
    ops: u64,
    seconds: f64,
    hist: Latency,
    copies: u64,
}

/// The planner's cost per plan, warm, for one point.
fn time_planner(header: u32, data: u32) -> PlannerCost {
    let bufs = buffer_list(0x7f00_0000_0000, header, data);
    let req = Request {
        header_len: header,
        header_align: HEADER_ALIGN,
        data_len: data,
        page: PAGE,
    };
    let mut p = Planner::new();
    let used = p.plan(&req, &bufs).map(|l| l.used).unwrap_or(0);
    // Median of five batches.
    let mut batches: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..PLANS_TIMED / 5 {
                let r = std::hint::black_box(&req);
                let _ = std::hint::black_box(p.plan(r, std::hint::black_box(&bufs)));
            }
            t.elapsed().as_nanos() as f64 / f64::from(PLANS_TIMED / 5)
        })
        .collect();
    batches.sort_by(f64::total_cmp);
    PlannerCost {
        header,
        size: data,
        buffers_offered: BUFFERS,
        buffers_used: used,
        ns_per_plan: batches[2],
    }
}

/// Runs `bench placement`.
pub fn run(opts: &BenchOpts, stop: Arc<AtomicBool>) -> Result<PlacementBenchSummary, AppError> {
    if opts.mode.is_some() || opts.file.is_some() || !opts.part.is_empty() {
        return Err(usage(
            "--mode, --file, --part: not with `bench placement`".into(),
        ));
    }
    if opts.rate.is_some() || opts.verify || opts.hgrm.is_some() || opts.pcap.is_some() {
        return Err(usage(
            "--rate, --verify, --hgrm, --pcap: not with `bench placement` (closed loops over many points; tests/placement_ring.rs checks the bytes)".into(),
        ));
    }
    if opts.qd == 0 || opts.qd > 120 {
        return Err(usage(
            "--qd: must be 1..=120 (two WRITEs per message in a send queue of 256)".into(),
        ));
    }
    let (point_len, warm) = point_timing(opts, "placement")?;
    limits::check_memory(
        "--qd",
        "the benchmark's buffers",
        (SRC_LEN + 2 * target_len()) as u64,
        MemoryLimit::read().as_ref(),
    )
    .map_err(|e| usage(e.to_string()))?;

    let sizes: Vec<u32> = if opts.size_given {
        if opts.size == 0 || opts.size > DATA[DATA.len() - 1] {
            return Err(usage(format!(
                "--size: 1 to {} bytes of data for `bench placement`",
                DATA[DATA.len() - 1]
            )));
        }
        vec![opts.size]
    } else {
        DATA.to_vec()
    };
    // The planner first, with nothing else running.
    let planner: Vec<PlannerCost> = HEADERS
        .iter()
        .flat_map(|&h| sizes.iter().map(move |&d| time_planner(h, d)))
        .collect();

    let mut qp = QpConfig::new(0, 0);
    qp.pmtu = opts.mtu;
    qp.max_send_wr = SQ_DEPTH;
    qp.max_recv_wr = RQ_DEPTH;
    qp.timeout_ns = TIMEOUT_NS;
    let engines = super::start_engines(opts, qp)?;
    let mtu = u64::from(opts.mtu.bytes());
    let (host_core, engine_core) = engines.cores;
    human(
        opts.json,
        &format!(
            "bench placement: headers {HEADERS:?} B on {HEADER_ALIGN}, data {sizes:?} B, into {BUFFERS} contiguous page-aligned buffers; coalesced, two-writes, naive; {} s per point after {} s of warm-up; window (--qd) {}; MTU {}; both engines on core {engine_core}, host on core {host_core}",
            point_len.as_secs_f64(),
            warm.as_secs_f64(),
            opts.qd,
            opts.mtu.bytes(),
        ),
    );
    let host = |e: portico::rdma::HostError| AppError::Failed(format!("host call: {e}"));
    let t0 = Instant::now();
    let src_map = map(SRC_LEN)?;
    let buffers = src_map.kind().to_string();
    let src = engines
        .a
        .engine
        .register_all(&src_map, Access::ALL)
        .map_err(host)?;
    let dst = engines
        .b
        .engine
        .register_all(&map(target_len())?, Access::ALL)
        .map_err(host)?;
    src_map
        .write(SRC_DATA, &vec![0xd5; 1 << 20])
        .map_err(|e| AppError::Failed(format!("filling the source: {e}")))?;
    let running = engines.running;
    let mut s = Session {
        a_qp: engines.a.qp,
        a_cq: engines.a.cq,
        b_qp: engines.b.qp,
        b_cq: engines.b.cq,
        src,
        dst,
        user: (0..(1 << 20) / PAGE)
            .map(|_| Page([0; PAGE as usize]))
            .collect(),
        planner: Planner::new(),
        recvs: vec![RecvRequest::new(0, SgList::new()); RQ_DEPTH],
        stop: stop.clone(),
        wcs: [WorkCompletion::EMPTY; WCS_LEN],
        _engines: (engines.a.engine, engines.b.engine),
    };
    let shape = RunShape {
        point: point_len,
        warm,
        mtu,
    };
    let mut results = Vec::new();
    let mut failures = Vec::new();
    let r = (|| -> Result<(), AppError> {
        s.post_receives(RQ_DEPTH)?;
        for &header in &HEADERS {
            for &data in &sizes {
                let window = opts
                    .qd
                    .min((WINDOW_BYTES / u64::from(data + header)).max(1) as usize);
                for method in Method::ALL {
                    if stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    let retx0 = retransmissions(&running);
                    let Measured {
                        prep,
                        ops,
                        seconds,
                        hist,
                        copies,
                    } = s.point(method, header, data, window, &shape)?;
                    let rate = if seconds > 0.0 {
                        ops as f64 / seconds
                    } else {
                        0.0
                    };
                    let r = PlacementResult {
                        name: format!("{}-h{header}-{data}B", method.name()),
                        op: method.name(),
                        method,
                        header,
                        size: data,
                        window,
                        ops,
                        seconds,
                        ops_per_sec: rate,
                        gbit_per_sec: rate * f64::from(header + data) * 8.0 / 1e9,
                        latency_ns: hist.summary(),
                        writes_per_op: prep.n,
                        write_bytes_per_op: prep.write_bytes,
                        waste_bytes_per_op: prep.waste,
                        frame_bytes_per_op: prep.frames,
                        packets_per_op: prep.packets,
                        target_copies: copies,
                        target_copied_bytes_per_op: if prep.copy_from.is_some() {
                            u64::from(data)
                        } else {
                            0
                        },
                        errors: 0,
                        retransmissions: retransmissions(&running).saturating_sub(retx0),
                        over_two_writes: None,
                        over_naive: None,
                    };
                    let l = &r.latency_ns;
                    human(
                        opts.json,
                        &format!(
                            "  {:<26} {:>10} msg/s {:>8.3} Gbit/s  p50 {:>8.1} µs  p99 {:>8.1} µs  {} WRITE(s), {} B on the wire, waste {} B{}",
                            r.name,
                            report::rate(r.ops_per_sec, ""),
                            r.gbit_per_sec,
                            l.p50 as f64 / 1000.0,
                            l.p99 as f64 / 1000.0,
                            r.writes_per_op,
                            r.frame_bytes_per_op,
                            r.waste_bytes_per_op,
                            if r.retransmissions > 0 {
                                format!("  retransmissions {}", r.retransmissions)
                            } else {
                                String::new()
                            },
                        ),
                    );
                    results.push(r);
                }
            }
        }
        Ok(())
    })();
    if let Err(e) = r {
        failures.push(e.to_string());
    }
    let stopped = running.finish(None);
    drop(s);
    let stopped = stopped?;
    let seconds = t0.elapsed().as_secs_f64();

    // Ratios per point, and the checks.
    let find = |results: &[PlacementResult], m: Method, h: u32, d: u32| {
        results
            .iter()
            .find(|r| r.method == m && r.header == h && r.size == d && r.ops > 0)
            .map(|r| (r.ops_per_sec, r.waste_bytes_per_op))
    };
    let mut waste_above_naive = Vec::new();
    let lookups: Vec<(usize, Option<f64>, Option<f64>)> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| r.method == Method::Coalesced && r.ops > 0)
        .map(|(i, r)| {
            let two = find(&results, Method::TwoWrites, r.header, r.size);
            let naive = find(&results, Method::Naive, r.header, r.size);
            if let Some((_, w)) = naive
                && r.waste_bytes_per_op > w
            {
                waste_above_naive.push(r.name.clone());
            }
            (
                i,
                two.map(|t| r.ops_per_sec / t.0),
                naive.map(|n| r.ops_per_sec / n.0),
            )
        })
        .collect();
    for (i, two, naive) in lookups {
        results[i].over_two_writes = two;
        results[i].over_naive = naive;
    }
    let planner_max_ns = planner.iter().map(|p| p.ns_per_plan).fold(0.0, f64::max);
    let checks = Checks {
        coalesced_vs_two_writes_4k_h128: Ratio::new(
            "msg/s at 4 KiB of data, 128 B header: coalesced / two WRITEs",
            find(&results, Method::Coalesced, TARGET_HEADER, TARGET_DATA).map(|x| x.0),
            find(&results, Method::TwoWrites, TARGET_HEADER, TARGET_DATA).map(|x| x.0),
            Some(1.5),
        ),
        coalesced_target_copies: results
            .iter()
            .filter(|r| r.method == Method::Coalesced)
            .map(|r| r.target_copies)
            .sum(),
        waste_above_naive,
        planner_max_ns,
        planner_target_met: planner_max_ns <= 200.0,
    };
    let errors = failures.len() as u64;
    Ok(PlacementBenchSummary {
        op: BenchOp::Placement,
        qd: opts.qd,
        seconds,
        memory: engines.memory,
        buffers,
        results,
        errors,
        failures,
        workers: stopped.workers,
        ports: stopped.ports,
        placement: PlacementSummary {
            point_seconds: point_len.as_secs_f64(),
            warmup_seconds: warm.as_secs_f64(),
            mtu: opts.mtu.bytes(),
            page: PAGE,
            header_align: HEADER_ALIGN,
            buffer_list: format!(
                "{BUFFERS} contiguous page-aligned buffers of max(8 KiB, data/4 + header rounded up to 4 KiB)"
            ),
            checks,
            planner,
        },
    })
}

pub fn print(s: &PlacementBenchSummary, json: bool) {
    if json {
        return super::print_json(s);
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    println!();
    println!(
        "bench placement summary: {:.1} s, {} errors; {} s per point; MTU {}",
        s.seconds, s.errors, s.placement.point_seconds, s.placement.mtu
    );
    println!();
    println!(
        "  {:>6} {:>8} {:>6} | {:>10} {:>7} {:>7} | {:>10} {:>7} | {:>10} {:>7} | {:>6} {:>6} | {:>9} {:>9}",
        "header",
        "data",
        "window",
        "coalesced",
        "p50 µs",
        "waste",
        "two-writes",
        "p50 µs",
        "naive",
        "p50 µs",
        "/two",
        "/naive",
        "frame B",
        "plan ns"
    );
    let find = |m: Method, h: u32, d: u32| {
        s.results
            .iter()
            .find(|r| r.method == m && r.header == h && r.size == d)
    };
    let mut sizes: Vec<u32> = s.results.iter().map(|r| r.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for &h in &HEADERS {
        for &d in &sizes {
            let Some(c) = find(Method::Coalesced, h, d) else {
                continue;
            };
            let t = find(Method::TwoWrites, h, d);
            let n = find(Method::Naive, h, d);
            let plan = s
                .placement
                .planner
                .iter()
                .find(|p| p.header == h && p.size == d);
            let cell = |r: Option<&PlacementResult>| {
                r.map_or(("-".to_string(), "-".to_string()), |r| {
                    (
                        format!("{:.0}", r.ops_per_sec),
                        format!("{:.1}", us(r.latency_ns.p50)),
                    )
                })
            };
            let (tr, tl) = cell(t);
            let (nr, nl) = cell(n);
            println!(
                "  {:>6} {:>8} {:>6} | {:>10.0} {:>7.1} {:>7} | {:>10} {:>7} | {:>10} {:>7} | {:>6} {:>6} | {:>9} {:>9}",
                h,
                d,
                c.window,
                c.ops_per_sec,
                us(c.latency_ns.p50),
                c.waste_bytes_per_op,
                tr,
                tl,
                nr,
                nl,
                c.over_two_writes.map_or("-".into(), |x| format!("{x:.2}")),
                c.over_naive.map_or("-".into(), |x| format!("{x:.2}")),
                c.frame_bytes_per_op,
                plan.map_or("-".into(), |p| format!("{:.0}", p.ns_per_plan)),
            );
        }
    }
    for f in &s.failures {
        println!("  FAILED: {f}");
    }
    let c = &s.placement.checks;
    println!();
    println!("  targets:");
    println!("    {}", ratio_line(&c.coalesced_vs_two_writes_4k_h128));
    println!(
        "    target-side copies of coalesced messages: {} (target 0): {}",
        c.coalesced_target_copies,
        if c.coalesced_target_copies == 0 {
            "met"
        } else {
            "NOT met"
        }
    );
    println!(
        "    points where coalescing wasted more than naive: {} (target none): {}",
        if c.waste_above_naive.is_empty() {
            "none".to_string()
        } else {
            c.waste_above_naive.join(", ")
        },
        if c.waste_above_naive.is_empty() {
            "met"
        } else {
            "NOT met"
        }
    );
    println!(
        "    slowest plan: {:.0} ns (target <= 200 ns for <= {BUFFERS} buffers): {}",
        c.planner_max_ns,
        if c.planner_target_met {
            "met"
        } else {
            "NOT met"
        }
    );
    super::print_workers(&s.workers);
    report::port_table(&s.ports);
}
