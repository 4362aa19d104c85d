//! `portico bench tagged`: tagged messaging (MPI-style tag matching by the engine's
//! list-processing shard) against what an MPI library does without it, in one run.
//!
//! Four parts (`--part`, default all), each a series of short points (`--duration` seconds of
//! measurement per point, after a warm-up that is not counted):
//!
//! - `eager`: tagged sends of 8 B to 8 KiB into receives posted on the target, with 1, 100 and
//!   1000 posted receives (distinct tags), exact (every receive names its tag and source) or
//!   with wildcards (every tenth receive ignores the tag's upper 16 bits and takes any source).
//!   The sender picks the receive each message goes to at random among those posted and not
//!   already targeted, so a message may be matched anywhere in the list. The target's host
//!   polls the tag events and re-posts, for each put, a receive with the same tag: the depth
//!   stays where it was. A use-once receive takes one message, so at most `depth` messages can
//!   be outstanding: the window is `min(--qd, depth)` (1 at depth 1). The same-window check
//!   of the depth target is one more point: depth 1000 with a window of 1.
//! - `unexpected`: every message arrives before its receive is posted and lands in an overflow
//!   buffer (MANAGE_LOCAL entries that take any tag); on its put-overflow event the host posts
//!   the receive, which claims it (the engine copies it in): done on unexpected-consumed.
//! - `rndv`: tagged sends of 64 KiB to 4 MiB (rendezvous: the target READs the data itself,
//!   the send completes on its done message), against plain RDMA READs of the same sizes, in
//!   the same direction (the target reads from the sender), on the same queue pairs.
//! - `baseline`: what an MPI library does without tag matching in the NIC, at the depths,
//!   sizes and windows of `eager`: plain SENDs into posted receive buffers, each starting with
//!   a 16-byte envelope (tag, source, length); the host matches the envelope against its
//!   posted receives in a linked list walked in posting order (MPICH's posted queue), copies
//!   the data into the matched receive's user buffer, re-posts the receive buffer and re-adds
//!   the entry at the tail.
//!
//! Both engines run on one core and the host loop on another (as every `portico bench`: on a
//! 2-core machine a third busy thread would take time slices from the host). The tagged parts
//! run on one loopback pair with tagged queue pairs, the baseline on a second pair, started
//! after the first has stopped. The host loop allocates nothing per message: buffers, free
//! lists and start times are made per point.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pmem::Mapping;
use serde::Serialize;

use super::{BenchOp, BenchOpts, Running, Stopped, WCS_LEN, human, usage};
use portico::app::{AppError, MemoryChoice, PortSummary};
use portico::config::{MemoryLimit, limits};
use portico::latency::{Latency, LatencySummary};
use portico::lpe::{EndpointConfig, EndpointIndex, EngineConfig, ListKind, Options};
use portico::rdma::loopback::{self, LoopbackOpts};
use portico::rdma::{
    Cq, MemoryRegion, Qp, RdmaHandle, TagConfig, TagCounters, TagEntry, TagEvent, TagEventKind,
    TagPort,
};
use portico::report;
use portico::runtime::WorkerReport;
use portico::transport::{
    Access, QpConfig, RecvRequest, WcOpcode, WcStatus, WorkCompletion, WorkRequest,
};

/// Which parts of `bench tagged` to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TaggedPart {
    /// Eager tagged sends into posted receives (depth 1, 100, 1000; exact and wildcards).
    Eager,
    /// Messages that arrive before their receive (overflow buffer, claimed by the append).
    Unexpected,
    /// Rendezvous bandwidth against plain RDMA READ.
    Rndv,
    /// Software matching over plain SENDs, at the depths and sizes of `eager`.
    Baseline,
    /// All four.
    All,
}

impl TaggedPart {
    fn name(self) -> &'static str {
        match self {
            TaggedPart::Eager => "eager",
            TaggedPart::Unexpected => "unexpected",
            TaggedPart::Rndv => "rndv",
            TaggedPart::Baseline => "baseline",
            TaggedPart::All => "all",
        }
    }
}

/// `bench tagged --matching`: which of the eager and baseline points' receives to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Matching {
    /// Every receive names its tag and source.
    Exact,
    /// Every tenth receive ignores the tag's upper 16 bits and takes any source.
    Wild,
}

/// The points of one process's run that `--sizes`, `--depths` and `--matching` leave (each
/// empty: all of them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PointFilter {
    pub sizes: Vec<u32>,
    pub depths: Vec<usize>,
    pub matching: Vec<Matching>,
}

impl PointFilter {
    fn size(&self, size: u32) -> bool {
        self.sizes.is_empty() || self.sizes.contains(&size)
    }

    fn depth(&self, depth: usize) -> bool {
        self.depths.is_empty() || self.depths.contains(&depth)
    }

    fn wild(&self, wild: bool) -> bool {
        let m = if wild {
            Matching::Wild
        } else {
            Matching::Exact
        };
        self.matching.is_empty() || self.matching.contains(&m)
    }

    /// An eager or baseline point.
    fn keeps(&self, size: u32, depth: usize, wild: bool) -> bool {
        self.size(size) && self.depth(depth) && self.wild(wild)
    }

    /// A usage error for a size or depth that none of the parts `wants` runs: a filter that
    /// leaves nothing of what was asked for is a mistake, not an empty run.
    fn check(&self, wants: &dyn Fn(TaggedPart) -> bool) -> Result<(), AppError> {
        let eagers = wants(TaggedPart::Eager)
            || wants(TaggedPart::Unexpected)
            || wants(TaggedPart::Baseline);
        let rndv = wants(TaggedPart::Rndv);
        let list = |v: &[u32]| {
            v.iter()
                .map(|s| human_size(*s))
                .collect::<Vec<_>>()
                .join(", ")
        };
        for &size in &self.sizes {
            let ran =
                (eagers && EAGER_SIZES.contains(&size)) || (rndv && RNDV_SIZES.contains(&size));
            if !ran {
                return Err(usage(format!(
                    "--sizes: {} is not a size of the parts run (eager, unexpected and baseline: {}; rndv: {})",
                    human_size(size),
                    list(&EAGER_SIZES),
                    list(&RNDV_SIZES),
                )));
            }
        }
        for &depth in &self.depths {
            if !DEPTHS.contains(&depth) {
                return Err(usage(format!(
                    "--depths: {depth} is not a depth of the eager and baseline points (1, 100, 1000)"
                )));
            }
        }
        if !(wants(TaggedPart::Eager) || wants(TaggedPart::Baseline)) {
            for (flag, given) in [
                ("--depths", !self.depths.is_empty()),
                ("--matching", !self.matching.is_empty()),
            ] {
                if given {
                    return Err(usage(format!(
                        "{flag}: chooses among the eager and baseline points; add eager or baseline to --part"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// `size` as the `--sizes` list writes it (K and M for KiB and MiB).
fn human_size(size: u32) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{}M", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{}K", s >> 10),
        s => s.to_string(),
    }
}

/// Measured seconds per point when `--duration` is not given.
pub const DEFAULT_POINT_SECONDS: f64 = 0.4;

const EAGER_SIZES: [u32; 5] = [8, 64, 512, 4096, 8192];
const DEPTHS: [usize; 3] = [1, 100, 1000];
const RNDV_SIZES: [u32; 4] = [64 << 10, 256 << 10, 1 << 20, 4 << 20];
/// Every this many receives is a wildcard in the wildcard points.
const WILD_EVERY: usize = 10;
/// The size and depth of the targets' figures.
const TARGET_SIZE: u32 = 8;
const TARGET_DEPTH: usize = 1000;
const TARGET_RNDV: u32 = 4 << 20;

/// A tag: bits 0..32 the receive's index, 32..48 the point (so nothing left from one point
/// can match in the next), 48..64 a field the wildcard receives ignore (the sender varies it).
const POINT_SHIFT: u32 = 32;
const SEQ_SHIFT: u32 = 48;
const SEQ_MASK: u64 = 0xffff << SEQ_SHIFT;

fn tag(point: u16, index: u32, seq: u16) -> u64 {
    u64::from(seq) << SEQ_SHIFT | u64::from(point) << POINT_SHIFT | u64::from(index)
}

fn tag_index(t: u64) -> u32 {
    t as u32
}

fn tag_point(t: u64) -> u16 {
    (t >> POINT_SHIFT) as u16
}

/// Cookies: receives of the expected parts are their index; these flags mark the others.
const OVF_COOKIE: u64 = 1 << 40;
const UNEXP_COOKIE: u64 = 1 << 41;
const COOKIE_LOW: u64 = (1 << 32) - 1;

/// Overflow buffers: two linked at all times, re-linked once the engine frees them.
const OVF_BUFS: usize = 4;
const OVF_LEN: usize = 2 << 20;
const OVF_LINKED: usize = 2;
/// An overflow buffer unlinks when less than this is left: the largest eager message fits.
const OVF_MIN_FREE: u64 = 8192;

/// The regions: A's source (REMOTE_READ: rendezvous and READ read from it), B's receive
/// buffers. The largest eager point needs 1000 × 8 KiB, a rendezvous or READ window
/// [`RNDV_BYTES`] at most.
const REGION_LEN: usize = 16 << 20;
/// Rendezvous and READ: bytes outstanding at most, and the window's bounds.
const RNDV_BYTES: usize = 8 << 20;
const RNDV_WINDOW: usize = 16;

/// Baseline envelope: tag (8 bytes), source rank (4), length (4).
const ENV_LEN: usize = 16;
const MAX_EAGER: usize = 8192;
/// Receive buffers of the baseline (the receive queue's depth).
const RQ_SLOTS: usize = 128;
const RQ_SLOT_LEN: usize = ENV_LEN + MAX_EAGER;

/// The queue pairs' retransmission timeout.
const TIMEOUT_NS: u64 = 10_000_000;
/// Send queue depth of every queue pair, and what the host keeps outstanding at most.
const SQ_DEPTH: usize = 128;
/// Events taken per poll.
const EVENTS: usize = 256;
/// Warm-up before each point's measurement: this fraction of it, at most [`WARM_MAX`].
const WARM_FRACTION: f64 = 0.25;
const WARM_MAX: Duration = Duration::from_millis(100);
/// How long a point may go without progress (no event, no completion) once its
/// measurement is over and something is still outstanding.
const GRACE: Duration = Duration::from_secs(5);
/// The host's rank as a source in the baseline's envelope (A's tag rank is 0 too).
const SOURCE_RANK: u32 = 0;
const ANY_SOURCE: u32 = u32::MAX;

/// A point bench's seconds measured per point (`--duration`, required) and the warm-up
/// before each.
pub(super) fn point_timing(
    opts: &BenchOpts,
    bench: &str,
) -> Result<(Duration, Duration), AppError> {
    let Some(point_len) = opts.duration else {
        return Err(usage(format!(
            "--duration: `bench {bench}` needs seconds per point (0 is not allowed)"
        )));
    };
    Ok((point_len, point_len.mul_f64(WARM_FRACTION).min(WARM_MAX)))
}

/// One measured point, as the JSON's `results[]` holds it.
#[derive(Debug, Clone, Serialize)]
pub struct TaggedResult {
    /// e.g. `eager-8B-d1000-exact-w64`.
    pub name: String,
    /// `eager`, `unexpected`, `rndv`, `read` or `baseline` (also under `op`, as in every
    /// bench's results).
    pub part: &'static str,
    pub op: &'static str,
    /// Payload bytes per message.
    pub size: u32,
    /// Posted receives on the target (eager, baseline, rendezvous).
    pub depth: Option<usize>,
    /// Every tenth receive a wildcard.
    pub wildcards: bool,
    /// Messages outstanding at most.
    pub window: usize,
    /// Messages (or READs) completed in the measured interval.
    pub ops: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
    pub gbit_per_sec: f64,
    /// From post to the event (or completion) that ends it.
    pub latency_ns: LatencySummary,
    /// Eager: messages that arrived before their receive was linked and were claimed from
    /// the overflow buffer (0 expected).
    pub late: u64,
    pub errors: u64,
    /// The engines' retransmissions while the point ran (as the workers last published
    /// them: the count may lag by a few polls).
    pub retransmissions: u64,
    /// Baseline points: the tagged eager point of the same size, depth and window over this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tagged_over_baseline: Option<f64>,
}

/// One target ratio.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// What is divided by what.
    pub of: &'static str,
    /// None when a part it needs did not run (or measured nothing).
    pub value: Option<f64>,
    /// At least this; None for a figure given for reference.
    pub target: Option<f64>,
    pub met: Option<bool>,
}

impl Ratio {
    pub(super) fn new(
        of: &'static str,
        num: Option<f64>,
        den: Option<f64>,
        target: Option<f64>,
    ) -> Ratio {
        let value = match (num, den) {
            (Some(n), Some(d)) if d > 0.0 => Some(n / d),
            _ => None,
        };
        Ratio {
            of,
            value,
            target,
            met: target.and_then(|t| value.map(|v| v >= t)),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Ratios {
    /// Eager 8 B, depth 1000 over depth 1, both with a window of 1 (the depth alone).
    pub eager_depth1000_vs_depth1: Ratio,
    /// Eager 8 B, depth 1000 with its window (`--qd`) over depth 1 (window 1 by necessity):
    /// for reference, not the target (it compares windows as much as depths).
    pub eager_depth1000_vs_depth1_windowed: Ratio,
    /// Eager 8 B at depth 1000 over the software baseline at depth 1000, same window.
    pub eager_vs_baseline_depth1000: Ratio,
    /// Rendezvous 4 MiB over RDMA READ 4 MiB, Gbit/s.
    pub rndv_vs_read_4mib: Ratio,
}

/// Tag events the target's host saw, by kind (its view of the target's counters).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct TargetEvents {
    pub put: u64,
    pub put_overflow: u64,
    pub unexpected_consumed: u64,
    /// Puts, put-overflows and claims of rendezvous messages.
    pub rendezvous: u64,
    pub truncated: u64,
    pub link: u64,
    pub auto_unlink: u64,
    pub auto_free: u64,
    pub command_failed: u64,
    pub other: u64,
    /// Puts for no receive of the running point (left from an earlier one).
    pub stale: u64,
}

/// The `tagged` object of the JSON summary.
#[derive(Debug, Clone, Serialize)]
pub struct TaggedSummary {
    pub parts: Vec<&'static str>,
    /// The points asked for (`--sizes`, `--depths`, `--matching`; each empty: all).
    pub points: PointFilter,
    /// Measured seconds per point, and the warm-up before each.
    pub point_seconds: f64,
    pub warmup_seconds: f64,
    pub mtu: u32,
    pub rndv_threshold: u32,
    pub ratios: Ratios,
    /// The target's tag events as its host polled them.
    pub target_events: TargetEvents,
    /// The target shard's own counters: not reachable from the host while the engine runs
    /// on a worker (no control request returns them, and the worker's counters do not
    /// include them), so null.
    pub target_counters: Option<TagCounters>,
}

/// What `bench tagged` prints: the fields every bench has, its points as `results`, and the
/// `tagged` object.
#[derive(Debug, Clone, Serialize)]
pub struct TaggedBenchSummary {
    pub op: BenchOp,
    pub qd: usize,
    pub seconds: f64,
    pub memory: MemoryChoice,
    pub buffers: String,
    pub results: Vec<TaggedResult>,
    pub errors: u64,
    /// Why a part stopped before its last point (a failed completion, a message that never
    /// arrived); counted in `errors`.
    pub failures: Vec<String>,
    /// Both pairs' workers: the tagged pair's (`tag_*`), then the baseline's (`plain_*`).
    pub workers: Vec<WorkerReport>,
    /// Where each pair's threads ran, and a cache line's round trip from the host's core to
    /// its worker's (the tagged pair's, then the baseline's).
    pub cores: Vec<portico::app::CoresReport>,
    pub ports: Vec<PortSummary>,
    pub tagged: TaggedSummary,
}

/// The sender's choice of receive (and `bench congestion`'s message sizes).
pub(super) struct Rng(pub(super) portico::rng::SplitMix64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(portico::rng::SplitMix64::new(seed))
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, n: usize) -> usize {
        self.0.below(n as u64) as usize
    }
}

/// A point's clock: warm-up, measurement, then the end of posting. The measurement lasts
/// its duration and, beyond it, until it has counted `min_ops` operations (for
/// [`MAX_EXTENSION`] at most): a short point of large messages still measures some.
pub(super) struct Clock {
    warm_end: Instant,
    end: Instant,
    min_ops: u64,
    measure: Option<Instant>,
    ended: Option<Instant>,
    /// The last event or completion.
    progress: Instant,
}

/// How long a point's measurement may run past its duration to count its minimum.
const MAX_EXTENSION: Duration = Duration::from_secs(2);

impl Clock {
    pub(super) fn new(point: Duration, warm: Duration, window: usize) -> Clock {
        let t0 = Instant::now();
        Clock {
            warm_end: t0 + warm,
            end: t0 + warm + point,
            min_ops: (2 * window as u64).max(8),
            measure: None,
            ended: None,
            progress: t0,
        }
    }

    /// Notes progress at `now` when `n` events or completions were taken.
    pub(super) fn progressed(&mut self, n: usize, now: Instant) {
        if n > 0 {
            self.progress = now;
        }
    }

    /// Moves on at `now`, `ops` operations measured so far; true when the measurement
    /// starts now (the caller resets its counts).
    pub(super) fn tick(&mut self, now: Instant, stop: &AtomicBool, ops: u64) -> bool {
        let mut started = false;
        if self.measure.is_none() && now >= self.warm_end {
            self.measure = Some(now);
            started = true;
        }
        let done = now >= self.end && (ops >= self.min_ops || now >= self.end + MAX_EXTENSION);
        if self.ended.is_none() && (done || stop.load(Ordering::Relaxed)) {
            self.ended = Some(now);
        }
        started
    }

    pub(super) fn measuring(&self) -> bool {
        self.measure.is_some() && self.ended.is_none()
    }

    pub(super) fn ended(&self) -> bool {
        self.ended.is_some()
    }

    pub(super) fn seconds(&self) -> f64 {
        match (self.measure, self.ended) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
            _ => 0.0,
        }
    }

    /// The measurement is over and nothing has moved for [`GRACE`].
    pub(super) fn overdue(&self, now: Instant) -> bool {
        self.ended
            .is_some_and(|e| now.saturating_duration_since(e.max(self.progress)) >= GRACE)
    }
}

/// What a point measured.
struct Measured {
    ops: u64,
    seconds: f64,
    hist: Latency,
    late: u64,
    errors: u64,
}

impl Measured {
    fn new() -> Measured {
        Measured {
            ops: 0,
            seconds: 0.0,
            hist: Latency::new(),
            late: 0,
            errors: 0,
        }
    }

    fn record(&mut self, clock: &Clock, started: Instant, now: Instant) {
        if clock.measuring() {
            self.ops += 1;
            self.hist
                .record(now.saturating_duration_since(started).as_nanos() as u64);
        }
    }

    fn result(self, part: &'static str, p: PointSpec) -> TaggedResult {
        let rate = if self.seconds > 0.0 {
            self.ops as f64 / self.seconds
        } else {
            0.0
        };
        let name = match part {
            "eager" | "baseline" => format!(
                "{part}-{}B-d{}-{}-w{}",
                p.size,
                p.depth,
                if p.wild { "wild" } else { "exact" },
                p.window
            ),
            _ => format!("{part}-{}B-w{}", p.size, p.window),
        };
        TaggedResult {
            name,
            part,
            op: part,
            size: p.size,
            depth: (part != "unexpected" && part != "read").then_some(p.depth),
            wildcards: p.wild,
            window: p.window,
            ops: self.ops,
            seconds: self.seconds,
            ops_per_sec: rate,
            gbit_per_sec: rate * f64::from(p.size) * 8.0 / 1e9,
            latency_ns: self.hist.summary(),
            late: self.late,
            errors: self.errors,
            retransmissions: 0,
            tagged_over_baseline: None,
        }
    }
}

/// A point's shape.
#[derive(Debug, Clone, Copy)]
struct PointSpec {
    size: u32,
    depth: usize,
    window: usize,
    wild: bool,
}

/// Whether receive `k` of a wildcard point is a wildcard.
fn is_wild(p: &PointSpec, k: usize) -> bool {
    p.wild && k.is_multiple_of(WILD_EVERY)
}

/// The overflow buffers' states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ovf {
    Free,
    Linked,
    /// Unlinked; its unexpected messages not all claimed yet.
    Draining,
}

/// The tagged pair, as the host drives it: A sends, B matches.
struct TagSession {
    a_qp: Qp,
    a_cq: Cq,
    b_qp: Qp,
    b_cq: Cq,
    port: TagPort,
    /// A's source (REMOTE_READ) and B's receive buffers.
    src: MemoryRegion,
    dst: MemoryRegion,
    ovf: MemoryRegion,
    ovf_state: [Ovf; OVF_BUFS],
    point: u16,
    rng: Rng,
    events: TargetEvents,
    batch: Vec<WorkRequest>,
    stop: Arc<AtomicBool>,
    /// The engines' handles: kept until the engines stop.
    _engines: (RdmaHandle, RdmaHandle),
}

impl TagSession {
    /// Appends `entry`, waiting (1 s at most) while the command ring is full.
    fn append(&mut self, list: ListKind, entry: TagEntry) -> Result<(), AppError> {
        let mut since: Option<Instant> = None;
        loop {
            if self.port.append(0, list, entry).is_ok() {
                return Ok(());
            }
            let t = *since.get_or_insert_with(Instant::now);
            if t.elapsed() > Duration::from_secs(1) {
                return Err(AppError::Failed(
                    "the tag command ring stayed full for 1 s".into(),
                ));
            }
            std::hint::spin_loop();
        }
    }

    fn overflow_entry(&self, b: usize) -> TagEntry {
        TagEntry::recv(
            0,
            self.ovf.sge(b * OVF_LEN, OVF_LEN as u32),
            OVF_COOKIE | b as u64,
        )
        .with_ignore(u64::MAX)
        .with_options(Options::MANAGE_LOCAL)
        .with_min_free(OVF_MIN_FREE)
    }

    /// Keeps [`OVF_LINKED`] overflow buffers linked while free ones are left.
    fn link_overflow(&mut self) -> Result<(), AppError> {
        while self.ovf_state.iter().filter(|&&s| s == Ovf::Linked).count() < OVF_LINKED {
            let Some(b) = self.ovf_state.iter().position(|&s| s == Ovf::Free) else {
                return Ok(());
            };
            self.ovf_state[b] = Ovf::Linked;
            self.append(ListKind::Overflow, self.overflow_entry(b))?;
        }
        Ok(())
    }

    /// Counts an event and keeps the overflow buffers linked (the point looks at the event
    /// itself afterwards).
    fn account(&mut self, e: &TagEvent) -> Result<(), AppError> {
        let ovf = e.cookie & OVF_COOKIE != 0 && e.list == ListKind::Overflow;
        let c = &mut self.events;
        match e.kind {
            TagEventKind::Put => c.put += 1,
            TagEventKind::PutOverflow => c.put_overflow += 1,
            TagEventKind::UnexpectedConsumed => c.unexpected_consumed += 1,
            TagEventKind::Link => c.link += 1,
            TagEventKind::AutoUnlink => c.auto_unlink += 1,
            TagEventKind::AutoFree => c.auto_free += 1,
            TagEventKind::CommandFailed => c.command_failed += 1,
            _ => c.other += 1,
        }
        let data = matches!(
            e.kind,
            TagEventKind::Put | TagEventKind::PutOverflow | TagEventKind::UnexpectedConsumed
        );
        if data && e.rendezvous {
            c.rendezvous += 1;
        }
        if e.truncated {
            c.truncated += 1;
        }
        let b = (e.cookie & COOKIE_LOW) as usize;
        match e.kind {
            TagEventKind::AutoUnlink if ovf && b < OVF_BUFS => {
                self.ovf_state[b] = Ovf::Draining;
                self.link_overflow()?;
            }
            TagEventKind::AutoFree if ovf && b < OVF_BUFS => {
                self.ovf_state[b] = Ovf::Free;
                self.link_overflow()?;
            }
            _ => {}
        }
        Ok(())
    }

    fn post(&mut self) -> Result<(), AppError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let r = self.a_qp.post_send(&self.batch);
        self.batch.clear();
        r.map_err(|e| AppError::Failed(format!("posting tagged sends: {e}")))
    }

    fn expected_entry(&self, point: u16, p: &PointSpec, k: usize) -> TagEntry {
        let size = p.size as usize;
        let e = TagEntry::recv(
            tag(point, k as u32, 0),
            self.dst.sge(k * size, p.size),
            k as u64,
        );
        if is_wild(p, k) {
            e.with_ignore(SEQ_MASK)
        } else {
            e.from_rank(0)
        }
    }

    /// Eager or rendezvous messages into `p.depth` posted receives (see the module
    /// documentation). A rendezvous receive is targeted again only once its send has
    /// completed as well (the source slot is then free).
    fn expected(
        &mut self,
        p: PointSpec,
        point_len: Duration,
        warm: Duration,
        rndv: bool,
    ) -> Result<Measured, AppError> {
        self.point = self.point.wrapping_add(1);
        let point = self.point;
        let part = if rndv { "rndv" } else { "eager" };
        let n = p.depth;
        let size = p.size as usize;
        let mut free: Vec<u32> = (0..n as u32).collect();
        let mut started = vec![Instant::now(); n];
        let mut got = vec![false; n];
        let mut sent = vec![false; n];
        for k in 0..n {
            self.append(ListKind::Priority, self.expected_entry(point, &p, k))?;
        }
        let mut m = Measured::new();
        let mut clock = Clock::new(point_len, warm, p.window);
        let mut evs = [TagEvent::EMPTY; EVENTS];
        let mut wcs = [WorkCompletion::EMPTY; WCS_LEN];
        let (mut in_flight, mut sq_out) = (0usize, 0usize);
        // After the measurement and once nothing is in flight: one message to each receive
        // still posted, which is not re-posted, so that the list is empty for the next point.
        let mut draining = false;
        let mut drained = 0usize;
        loop {
            let now = Instant::now();
            if clock.tick(now, &self.stop, m.ops) {
                m = Measured::new();
            }
            if clock.ended() && !draining && in_flight == 0 {
                draining = true;
            }
            let sending = !clock.ended() || draining;
            while sending && in_flight < p.window && sq_out < SQ_DEPTH && !free.is_empty() {
                let k = free.swap_remove(self.rng.below(free.len())) as usize;
                let seq = if is_wild(&p, k) {
                    self.rng.next() as u16 | 1
                } else {
                    0
                };
                started[k] = now;
                self.batch.push(WorkRequest::tagged_send(
                    k as u64,
                    self.src.sgl(k * size, p.size),
                    0,
                    tag(point, k as u32, seq),
                    0,
                ));
                in_flight += 1;
                sq_out += 1;
            }
            self.post()?;
            let nc = self.a_cq.poll(&mut wcs);
            clock.progressed(nc, now);
            let polled_at = if nc > 0 { Instant::now() } else { now };
            for wc in &wcs[..nc] {
                sq_out -= 1;
                if wc.status != WcStatus::Success {
                    return Err(failed_completion(&point_name(&p, part), wc));
                }
                let k = wc.wr_id as usize;
                if rndv && k < n {
                    sent[k] = true;
                    if got[k] {
                        (got[k], sent[k]) = (false, false);
                        in_flight -= 1;
                        m.record(&clock, started[k], polled_at);
                        if draining {
                            drained += 1;
                        } else {
                            free.push(k as u32);
                        }
                    }
                }
            }
            let ne = self.port.poll(&mut evs);
            clock.progressed(ne, now);
            let polled_at = if ne > 0 { Instant::now() } else { polled_at };
            for e in &evs[..ne] {
                self.account(e)?;
                match e.kind {
                    TagEventKind::Put | TagEventKind::UnexpectedConsumed
                        if e.cookie < n as u64 && tag_point(e.match_bits) == point =>
                    {
                        if e.kind == TagEventKind::UnexpectedConsumed {
                            m.late += 1;
                        }
                        let j = e.cookie as usize;
                        if !draining {
                            self.append(ListKind::Priority, self.expected_entry(point, &p, j))?;
                        }
                        let t = tag_index(e.match_bits) as usize;
                        if t >= n {
                            m.errors += 1;
                            continue;
                        }
                        got[t] = true;
                        if !rndv || sent[t] {
                            (got[t], sent[t]) = (false, false);
                            in_flight -= 1;
                            m.record(&clock, started[t], polled_at);
                            if draining {
                                drained += 1;
                            } else {
                                free.push(t as u32);
                            }
                        }
                    }
                    TagEventKind::Put | TagEventKind::UnexpectedConsumed
                        if e.cookie & (OVF_COOKIE | UNEXP_COOKIE) == 0 =>
                    {
                        self.events.stale += 1;
                    }
                    TagEventKind::CommandFailed => m.errors += 1,
                    _ => {}
                }
            }
            if draining && drained == n && in_flight == 0 && sq_out == 0 {
                break;
            }
            if clock.overdue(now) {
                // What is missing, for the report (this allocates; the point is over).
                let mut missing: Vec<String> = Vec::new();
                for k in 0..n {
                    if missing.len() < 8 && (got[k] || sent[k] || !free.contains(&(k as u32))) {
                        missing.push(format!(
                            "receive {k} (put seen {}, send completed {})",
                            got[k], sent[k]
                        ));
                    }
                }
                return Err(AppError::Failed(format!(
                    "tagged point {}: {in_flight} messages still outstanding, no progress for {} s after the end of the measurement ({} sends not completed, {} of {n} receives drained, {} measured); first outstanding: {}; target's events so far: {:?}",
                    point_name(&p, part),
                    GRACE.as_secs(),
                    sq_out,
                    if draining { drained } else { 0 },
                    m.ops,
                    missing.join(", "),
                    self.events
                )));
            }
        }
        m.seconds = clock.seconds();
        Ok(m)
    }

    /// Messages that arrive before their receive (see the module documentation).
    fn unexpected(
        &mut self,
        p: PointSpec,
        point_len: Duration,
        warm: Duration,
    ) -> Result<Measured, AppError> {
        self.point = self.point.wrapping_add(1);
        let point = self.point;
        let size = p.size as usize;
        let ring = (2 * p.window).next_power_of_two();
        let mut started = vec![Instant::now(); ring];
        // User buffers for the receives the host posts: twice the window.
        let mut slots: Vec<u32> = (0..2 * p.window as u32).collect();
        let mut m = Measured::new();
        let mut clock = Clock::new(point_len, warm, p.window);
        let mut evs = [TagEvent::EMPTY; EVENTS];
        let mut wcs = [WorkCompletion::EMPTY; WCS_LEN];
        let (mut in_flight, mut sq_out) = (0usize, 0usize);
        let mut next: u32 = 0;
        loop {
            let now = Instant::now();
            if clock.tick(now, &self.stop, m.ops) {
                m = Measured::new();
            }
            while !clock.ended() && in_flight < p.window && sq_out < SQ_DEPTH {
                let seq = next;
                next = next.wrapping_add(1);
                started[seq as usize & (ring - 1)] = now;
                self.batch.push(WorkRequest::tagged_send(
                    u64::from(seq),
                    self.src.sgl((seq as usize % p.window) * size, p.size),
                    0,
                    tag(point, seq, 0),
                    0,
                ));
                in_flight += 1;
                sq_out += 1;
            }
            self.post()?;
            let nc = self.a_cq.poll(&mut wcs);
            clock.progressed(nc, now);
            for wc in &wcs[..nc] {
                sq_out -= 1;
                if wc.status != WcStatus::Success {
                    return Err(failed_completion(&point_name(&p, "unexpected"), wc));
                }
            }
            let ne = self.port.poll(&mut evs);
            clock.progressed(ne, now);
            let polled_at = Instant::now();
            for e in &evs[..ne] {
                self.account(e)?;
                match e.kind {
                    TagEventKind::PutOverflow if tag_point(e.match_bits) == point => {
                        let Some(s) = slots.pop() else {
                            m.errors += 1;
                            continue;
                        };
                        let entry = TagEntry::recv(
                            e.match_bits,
                            self.dst.sge(s as usize * size, p.size),
                            UNEXP_COOKIE | u64::from(s),
                        )
                        .from_rank(0);
                        self.append(ListKind::Priority, entry)?;
                    }
                    TagEventKind::UnexpectedConsumed
                        if e.cookie & UNEXP_COOKIE != 0 && tag_point(e.match_bits) == point =>
                    {
                        slots.push((e.cookie & COOKIE_LOW) as u32);
                        in_flight -= 1;
                        let seq = tag_index(e.match_bits);
                        m.record(&clock, started[seq as usize & (ring - 1)], polled_at);
                    }
                    TagEventKind::Put | TagEventKind::UnexpectedConsumed => {
                        self.events.stale += 1;
                    }
                    TagEventKind::CommandFailed => m.errors += 1,
                    _ => {}
                }
            }
            if clock.ended() && in_flight == 0 && sq_out == 0 {
                break;
            }
            if clock.overdue(now) {
                return Err(AppError::Failed(format!(
                    "unexpected point {} B: {in_flight} messages still unclaimed, no progress for {} s after the end of the measurement",
                    p.size,
                    GRACE.as_secs()
                )));
            }
        }
        m.seconds = clock.seconds();
        Ok(m)
    }

    /// Plain RDMA READs by B from A's source: the direction of a rendezvous pull.
    fn read(
        &mut self,
        p: PointSpec,
        point_len: Duration,
        warm: Duration,
    ) -> Result<Measured, AppError> {
        let size = p.size as usize;
        let mut free: Vec<u32> = (0..p.window as u32).collect();
        let mut started = vec![Instant::now(); p.window];
        let mut m = Measured::new();
        let mut clock = Clock::new(point_len, warm, p.window);
        let mut wcs = [WorkCompletion::EMPTY; WCS_LEN];
        let mut evs = [TagEvent::EMPTY; EVENTS];
        let mut batch: Vec<WorkRequest> = Vec::with_capacity(p.window);
        let mut in_flight = 0usize;
        loop {
            let now = Instant::now();
            if clock.tick(now, &self.stop, m.ops) {
                m = Measured::new();
            }
            while !clock.ended() && !free.is_empty() {
                let k = free.pop().expect("not empty") as usize;
                started[k] = now;
                batch.push(WorkRequest::read(
                    k as u64,
                    self.dst.sgl(k * size, p.size),
                    self.src.addr() + (k * size) as u64,
                    self.src.rkey(),
                ));
                in_flight += 1;
            }
            if !batch.is_empty() {
                self.b_qp
                    .post_send(&batch)
                    .map_err(|e| AppError::Failed(format!("posting READs: {e}")))?;
                batch.clear();
            }
            let nc = self.b_cq.poll(&mut wcs);
            clock.progressed(nc, now);
            let polled_at = Instant::now();
            for wc in &wcs[..nc] {
                let k = wc.wr_id as usize;
                if wc.status != WcStatus::Success || wc.opcode != WcOpcode::RdmaRead {
                    return Err(failed_completion(&point_name(&p, "read"), wc));
                }
                if k < p.window {
                    in_flight -= 1;
                    m.record(&clock, started[k], polled_at);
                    free.push(k as u32);
                }
            }
            // Nothing is expected from the tag port; keep it drained.
            let ne = self.port.poll(&mut evs);
            clock.progressed(ne, now);
            for e in &evs[..ne] {
                self.account(e)?;
            }
            if clock.ended() && in_flight == 0 {
                break;
            }
            if clock.overdue(now) {
                return Err(AppError::Failed(format!(
                    "READ point {} B: {in_flight} READs still outstanding, no progress for {} s after the end of the measurement",
                    p.size,
                    GRACE.as_secs()
                )));
            }
        }
        m.seconds = clock.seconds();
        Ok(m)
    }
}

/// A failed completion: the queue pair is in the error state, so the point (and the pair's
/// next points) cannot go on.
fn failed_completion(point: &str, wc: &WorkCompletion) -> AppError {
    AppError::Failed(format!(
        "{point}: {:?} completion of work request {} failed with {:?} (the queue pair is in the error state)",
        wc.opcode, wc.wr_id, wc.status
    ))
}

fn point_name(p: &PointSpec, part: &str) -> String {
    format!(
        "{part} {} B depth {} {} window {}",
        p.size,
        p.depth,
        if p.wild { "wild" } else { "exact" },
        p.window
    )
}

/// The baseline's posted receives: a linked list in posting order, its nodes in one vector
/// (node `k` is receive `k`, re-linked at the tail when its message has been taken).
struct SoftList {
    nodes: Vec<SoftEntry>,
    head: u32,
    tail: u32,
}

#[derive(Debug, Clone, Copy)]
struct SoftEntry {
    tag: u64,
    ignore: u64,
    source: u32,
    next: u32,
}

const NIL: u32 = u32::MAX;

impl SoftList {
    fn new(capacity: usize) -> SoftList {
        SoftList {
            nodes: Vec::with_capacity(capacity),
            head: NIL,
            tail: NIL,
        }
    }

    fn clear(&mut self) {
        self.nodes.clear();
        self.head = NIL;
        self.tail = NIL;
    }

    /// Adds node `k` (which exists) at the tail.
    fn link(&mut self, k: u32) {
        self.nodes[k as usize].next = NIL;
        if self.tail == NIL {
            self.head = k;
        } else {
            self.nodes[self.tail as usize].next = k;
        }
        self.tail = k;
    }

    /// The first node in posting order that takes (`tag`, `source`), unlinked.
    fn take(&mut self, tag: u64, source: u32) -> Option<u32> {
        let (mut prev, mut cur) = (NIL, self.head);
        while cur != NIL {
            let e = self.nodes[cur as usize];
            if (e.tag ^ tag) & !e.ignore == 0 && (e.source == ANY_SOURCE || e.source == source) {
                if prev == NIL {
                    self.head = e.next;
                } else {
                    self.nodes[prev as usize].next = e.next;
                }
                if self.tail == cur {
                    self.tail = prev;
                }
                return Some(cur);
            }
            prev = cur;
            cur = e.next;
        }
        None
    }
}

/// The baseline's pair: plain SENDs, a receive queue, software matching.
struct PlainSession {
    a_qp: Qp,
    a_cq: Cq,
    b_qp: Qp,
    b_cq: Cq,
    /// A's source: slot `k` is the envelope and data of messages to receive `k`.
    src: MemoryRegion,
    /// B's receive buffers, [`RQ_SLOTS`] of [`RQ_SLOT_LEN`] bytes.
    rq: MemoryRegion,
    /// The receives' user buffers (the application's memory, not registered: the library
    /// copies into them).
    user: Vec<u8>,
    list: SoftList,
    point: u16,
    rng: Rng,
    stop: Arc<AtomicBool>,
    _engines: (RdmaHandle, RdmaHandle),
}

impl PlainSession {
    fn post_all_receives(&mut self) -> Result<(), AppError> {
        let all: Vec<RecvRequest> = (0..RQ_SLOTS)
            .map(|r| RecvRequest::new(r as u64, self.rq.sgl(r * RQ_SLOT_LEN, RQ_SLOT_LEN as u32)))
            .collect();
        self.b_qp
            .post_recv(&all)
            .map_err(|e| AppError::Failed(format!("posting the baseline's receives: {e}")))
    }

    fn point(
        &mut self,
        p: PointSpec,
        point_len: Duration,
        warm: Duration,
    ) -> Result<Measured, AppError> {
        self.point = self.point.wrapping_add(1);
        let point = self.point;
        let n = p.depth;
        let size = p.size as usize;
        self.list.clear();
        for k in 0..n {
            let wild = is_wild(&p, k);
            self.list.nodes.push(SoftEntry {
                tag: tag(point, k as u32, 0),
                ignore: if wild { SEQ_MASK } else { 0 },
                source: if wild { ANY_SOURCE } else { SOURCE_RANK },
                next: NIL,
            });
            self.list.link(k as u32);
        }
        let mut free: Vec<u32> = (0..n as u32).collect();
        let mut started = vec![Instant::now(); n];
        let mut m = Measured::new();
        let mut clock = Clock::new(point_len, warm, p.window);
        let mut wcs = [WorkCompletion::EMPTY; WCS_LEN];
        let mut batch: Vec<WorkRequest> = Vec::with_capacity(p.window);
        let mut reposts: Vec<RecvRequest> = Vec::with_capacity(WCS_LEN);
        let (mut in_flight, mut sq_out) = (0usize, 0usize);
        let mut env = [0u8; ENV_LEN];
        loop {
            let now = Instant::now();
            if clock.tick(now, &self.stop, m.ops) {
                m = Measured::new();
            }
            while !clock.ended() && in_flight < p.window && sq_out < SQ_DEPTH && !free.is_empty() {
                let k = free.swap_remove(self.rng.below(free.len())) as usize;
                let seq = if is_wild(&p, k) {
                    self.rng.next() as u16 | 1
                } else {
                    0
                };
                // The library writes the envelope before the data it sends.
                env[..8].copy_from_slice(&tag(point, k as u32, seq).to_le_bytes());
                env[8..12].copy_from_slice(&SOURCE_RANK.to_le_bytes());
                env[12..].copy_from_slice(&p.size.to_le_bytes());
                let off = k * RQ_SLOT_LEN;
                self.src
                    .write(off, &env)
                    .map_err(|e| AppError::Failed(format!("writing an envelope: {e}")))?;
                started[k] = now;
                batch.push(WorkRequest::send(
                    k as u64,
                    self.src.sgl(off, (ENV_LEN + size) as u32),
                    None,
                ));
                in_flight += 1;
                sq_out += 1;
            }
            if !batch.is_empty() {
                self.a_qp
                    .post_send(&batch)
                    .map_err(|e| AppError::Failed(format!("posting SENDs: {e}")))?;
                batch.clear();
            }
            let nc = self.a_cq.poll(&mut wcs);
            clock.progressed(nc, now);
            for wc in &wcs[..nc] {
                sq_out -= 1;
                if wc.status != WcStatus::Success {
                    return Err(failed_completion(&point_name(&p, "baseline"), wc));
                }
            }
            let nr = self.b_cq.poll(&mut wcs);
            clock.progressed(nr, now);
            let polled_at = if nr > 0 { Instant::now() } else { now };
            for wc in &wcs[..nr] {
                let r = wc.wr_id as usize;
                if wc.status != WcStatus::Success || r >= RQ_SLOTS {
                    return Err(failed_completion(&point_name(&p, "baseline"), wc));
                }
                let at = r * RQ_SLOT_LEN;
                self.rq
                    .read(at, &mut env)
                    .map_err(|e| AppError::Failed(format!("reading an envelope: {e}")))?;
                let t = u64::from_le_bytes(env[..8].try_into().expect("8 bytes"));
                let source = u32::from_le_bytes(env[8..12].try_into().expect("4 bytes"));
                let len = (u32::from_le_bytes(env[12..].try_into().expect("4 bytes")) as usize)
                    .min((wc.byte_len as usize).saturating_sub(ENV_LEN))
                    .min(size);
                match self.list.take(t, source) {
                    Some(k) => {
                        let k = k as usize;
                        self.rq
                            .read(at + ENV_LEN, &mut self.user[k * size..k * size + len])
                            .map_err(|e| AppError::Failed(format!("copying a message: {e}")))?;
                        // The receive is posted again, as the tagged point re-posts it.
                        self.list.link(k as u32);
                    }
                    // MPI would queue it as unexpected; it never happens here (the sender
                    // only sends to posted receives).
                    None => m.errors += 1,
                }
                reposts.push(RecvRequest::new(
                    r as u64,
                    self.rq.sgl(at, RQ_SLOT_LEN as u32),
                ));
                let target = tag_index(t) as usize;
                if target < n && tag_point(t) == point {
                    in_flight -= 1;
                    m.record(&clock, started[target], polled_at);
                    free.push(target as u32);
                } else {
                    m.errors += 1;
                }
            }
            if !reposts.is_empty() {
                self.b_qp
                    .post_recv(&reposts)
                    .map_err(|e| AppError::Failed(format!("re-posting receives: {e}")))?;
                reposts.clear();
            }
            if clock.ended() && in_flight == 0 && sq_out == 0 {
                break;
            }
            if clock.overdue(now) {
                return Err(AppError::Failed(format!(
                    "baseline point {}: {in_flight} messages still outstanding, no progress for {} s after the end of the measurement",
                    point_name(&p, "baseline"),
                    GRACE.as_secs()
                )));
            }
        }
        self.list.clear();
        m.seconds = clock.seconds();
        Ok(m)
    }
}

/// Retransmissions on `running`'s workers so far.
/// The engines' retransmissions so far, as their workers last published them.
pub(super) fn retransmissions(running: &Running) -> u64 {
    running
        .runtime
        .reports()
        .iter()
        .filter_map(|r| r.counter("retransmissions"))
        .sum()
}

/// Starts a loopback pair named `name` with `qp` (and `tags`), both engines on `core`.
fn start_pair(
    name: &'static str,
    qp: QpConfig,
    tags: Option<TagConfig>,
    core: usize,
    port_names: [&'static str; 2],
) -> Result<(loopback::LoopbackEnd, loopback::LoopbackEnd, Running), AppError> {
    let mut lo = LoopbackOpts::new(qp, [core, core]);
    lo.name = name.into();
    lo.tags = tags;
    let super::StartedPair {
        a, b, mut running, ..
    } = super::start_pair(&lo)?;
    for (port, label) in running.port_ids.iter_mut().zip(port_names) {
        port.0 = label;
    }
    Ok((a, b, running))
}

/// Application buffer memory: hugetlb pages when free, else anonymous memory.
pub(super) fn map(len: usize) -> Result<Arc<Mapping>, AppError> {
    Mapping::anonymous_prefer_huge(len)
        .map(Arc::new)
        .map_err(|e| AppError::Failed(format!("mapping {len} bytes of buffer memory: {e}")))
}

/// Everything measured, for the summary.
#[derive(Default)]
struct Collected {
    results: Vec<TaggedResult>,
    workers: Vec<WorkerReport>,
    cores: Vec<portico::app::CoresReport>,
    ports: Vec<PortSummary>,
    errors: u64,
    /// The tagged pair's target events, when it ran.
    events: Option<TargetEvents>,
    /// Why a part stopped early.
    failures: Vec<String>,
}

impl Collected {
    /// Records point `r`, which ran from `retx0` retransmissions on `running`'s workers.
    fn push(&mut self, mut r: TaggedResult, running: &Running, retx0: u64, json: bool) {
        r.retransmissions = retransmissions(running).saturating_sub(retx0);
        let l = &r.latency_ns;
        human(
            json,
            &format!(
                "  {:<34} {:>12} msg/s {:>9.3} Gbit/s  p50 {:>8.1} µs  p99 {:>8.1} µs{}{}{}",
                r.name,
                report::rate(r.ops_per_sec, ""),
                r.gbit_per_sec,
                l.p50 as f64 / 1000.0,
                l.p99 as f64 / 1000.0,
                if r.late > 0 {
                    format!("  late {}", r.late)
                } else {
                    String::new()
                },
                if r.errors > 0 {
                    format!("  errors {}", r.errors)
                } else {
                    String::new()
                },
                if r.retransmissions > 0 {
                    format!("  retransmissions {}", r.retransmissions)
                } else {
                    String::new()
                },
            ),
        );
        self.errors += r.errors;
        self.results.push(r);
    }

    /// A part that failed: counted as an error, its reason kept; the summary still reports
    /// what was measured.
    fn failed(&mut self, r: Result<(), AppError>) {
        if let Err(e) = r {
            self.errors += 1;
            self.failures.push(e.to_string());
        }
    }

    fn stopped(&mut self, s: Stopped) {
        self.workers.extend(s.workers);
        self.cores.push(s.cores);
        self.ports.extend(s.ports);
    }

    fn find(&self, part: &str, size: u32, depth: usize, wild: bool, window: usize) -> Option<f64> {
        self.results
            .iter()
            .find(|r| {
                r.part == part
                    && r.size == size
                    && r.depth.is_none_or(|d| d == depth)
                    && r.wildcards == wild
                    && r.window == window
                    && r.ops > 0
            })
            .map(|r| r.ops_per_sec)
    }
}

/// The tag shards' configuration of the tagged part (`roce_count`'s `tagged8` cases count
/// the same): one endpoint with room for 4 096 posted receives and 4 096 unexpected headers,
/// and one event per posted receive (its put), as an MPI library configures it.
pub fn target_tags() -> TagConfig {
    TagConfig {
        endpoints: vec![(
            EndpointIndex(0),
            EndpointConfig {
                max_priority: 4096,
                max_unexpected: 4096,
                ..EndpointConfig::default()
            },
        )],
        engine: EngineConfig::default(),
        event_depth: 16384,
        command_depth: 8192,
        max_messages: 4096,
        quiet: true,
    }
}

/// Runs `bench tagged`.
pub fn run(opts: &BenchOpts, stop: Arc<AtomicBool>) -> Result<TaggedBenchSummary, AppError> {
    if opts.mode.is_some() || opts.file.is_some() {
        return Err(usage(
            "--mode, --file: only `bench persist` takes them".into(),
        ));
    }
    if opts.rate.is_some() {
        return Err(usage(
            "--rate: `bench tagged` runs closed loops only".into(),
        ));
    }
    if opts.verify {
        return Err(usage("--verify: not with `bench tagged`".into()));
    }
    if opts.hgrm.is_some() || opts.pcap.is_some() {
        return Err(usage(
            "--hgrm, --pcap: not with `bench tagged` (it runs many points on two pairs)".into(),
        ));
    }
    if opts.qd == 0 || opts.qd > 120 {
        return Err(usage(
            "--qd: must be 1..=120 (the send queue holds 128)".into(),
        ));
    }
    let (point_len, warm) = point_timing(opts, "tagged")?;
    let all = opts.part.is_empty() || opts.part.contains(&TaggedPart::All);
    let wants = |p: TaggedPart| all || opts.part.contains(&p);
    let parts: Vec<&'static str> = [
        TaggedPart::Eager,
        TaggedPart::Unexpected,
        TaggedPart::Rndv,
        TaggedPart::Baseline,
    ]
    .into_iter()
    .filter(|&p| wants(p))
    .map(TaggedPart::name)
    .collect();
    opts.points.check(&wants)?;
    let tagged_pair =
        wants(TaggedPart::Eager) || wants(TaggedPart::Unexpected) || wants(TaggedPart::Rndv);
    let plain_pair = wants(TaggedPart::Baseline);
    limits::check_memory(
        "--part",
        "the benchmark's buffers",
        (4 * REGION_LEN + OVF_BUFS * OVF_LEN + RQ_SLOTS * RQ_SLOT_LEN) as u64,
        MemoryLimit::read().as_ref(),
    )
    .map_err(|e| usage(e.to_string()))?;

    // Two pairs, one after the other.
    let pairs = u32::from(tagged_pair) + u32::from(plain_pair);
    let (host_core, engine_core, memory) = super::start_eal_for_pairs(opts, pairs)?;

    let mut qp = QpConfig::new(0, 0);
    qp.pmtu = opts.mtu;
    qp.max_send_wr = SQ_DEPTH;
    qp.max_recv_wr = RQ_SLOTS;
    // A window of large READ responses (a READ or a rendezvous pull of 4 MiB is 4096
    // packets at MTU 1024) takes longer than the 100 µs default to drain on one software
    // core, and a spurious timeout re-reads the rest of the READ: the timer waits for real
    // losses only (there are none on the ring link).
    qp.timeout_ns = TIMEOUT_NS;
    let rndv_threshold = qp.rndv_threshold;
    human(
        opts.json,
        &format!(
            "bench tagged: parts {}; {} s per point after {} s of warm-up; window (--qd) {}; MTU {}; rendezvous above {} B; both engines on core {engine_core}, host on core {host_core}",
            parts.join(", "),
            point_len.as_secs_f64(),
            warm.as_secs_f64(),
            opts.qd,
            opts.mtu.bytes(),
            rndv_threshold,
        ),
    );
    let t0 = Instant::now();
    let mut out = Collected::default();
    let mut buffers = String::new();

    if tagged_pair {
        let mut tq = qp.clone();
        tq.tagged = true;
        let (ea, eb, running) = start_pair(
            "tag",
            tq,
            Some(target_tags()),
            engine_core,
            ["tag_a", "tag_b"],
        )?;
        let host = |e: portico::rdma::HostError| AppError::Failed(format!("host call: {e}"));
        let src_map = map(REGION_LEN)?;
        buffers = src_map.kind().to_string();
        let src = ea
            .engine
            .register_all(&src_map, Access::ALL)
            .map_err(host)?;
        let dst = eb
            .engine
            .register_all(&map(REGION_LEN)?, Access::ALL)
            .map_err(host)?;
        let ovf = eb
            .engine
            .register_all(&map(OVF_BUFS * OVF_LEN)?, Access::ALL)
            .map_err(host)?;
        let port = eb
            .tags
            .ok_or_else(|| AppError::Failed("the target has no tag port".into()))?;
        let mut s = TagSession {
            a_qp: ea.qp,
            a_cq: ea.cq,
            b_qp: eb.qp,
            b_cq: eb.cq,
            port,
            src,
            dst,
            ovf,
            ovf_state: [Ovf::Free; OVF_BUFS],
            point: 0,
            rng: Rng::new(1),
            events: TargetEvents::default(),
            batch: Vec::with_capacity(SQ_DEPTH),
            stop: stop.clone(),
            _engines: (ea.engine, eb.engine),
        };
        let r = run_tagged(&mut s, &running, opts, &wants, point_len, warm, &mut out);
        let stopped = running.finish(None);
        let events = s.events;
        drop(s);
        out.stopped(stopped?);
        out.failed(r);
        out.events = Some(events);
    }
    if plain_pair && !stop.load(Ordering::Relaxed) {
        let (ea, eb, running) = start_pair("plain", qp, None, engine_core, ["plain_a", "plain_b"])?;
        let host = |e: portico::rdma::HostError| AppError::Failed(format!("host call: {e}"));
        let src_map = map(TARGET_DEPTH * RQ_SLOT_LEN)?;
        if buffers.is_empty() {
            buffers = src_map.kind().to_string();
        }
        let src = ea
            .engine
            .register_all(&src_map, Access::ALL)
            .map_err(host)?;
        let rq = eb
            .engine
            .register_all(&map(RQ_SLOTS * RQ_SLOT_LEN)?, Access::LOCAL_WRITE)
            .map_err(host)?;
        let mut s = PlainSession {
            a_qp: ea.qp,
            a_cq: ea.cq,
            b_qp: eb.qp,
            b_cq: eb.cq,
            src,
            rq,
            user: vec![0; TARGET_DEPTH * MAX_EAGER],
            list: SoftList::new(TARGET_DEPTH),
            point: 0,
            rng: Rng::new(1),
            stop: stop.clone(),
            _engines: (ea.engine, eb.engine),
        };
        let r = run_baseline(&mut s, &running, opts, point_len, warm, &mut out);
        let stopped = running.finish(None);
        drop(s);
        out.stopped(stopped?);
        out.failed(r);
    }
    let seconds = t0.elapsed().as_secs_f64();

    // Tagged over baseline, per baseline point.
    let eager: Vec<(u32, Option<usize>, bool, usize, f64)> = out
        .results
        .iter()
        .filter(|r| r.part == "eager" && r.ops > 0)
        .map(|r| (r.size, r.depth, r.wildcards, r.window, r.ops_per_sec))
        .collect();
    for r in out.results.iter_mut().filter(|r| r.part == "baseline") {
        r.tagged_over_baseline = eager
            .iter()
            .find(|e| (e.0, e.1, e.2, e.3) == (r.size, r.depth, r.wildcards, r.window))
            .and_then(|e| (r.ops_per_sec > 0.0).then(|| e.4 / r.ops_per_sec));
    }
    let wide = opts.qd.min(TARGET_DEPTH);
    let gbit = |part: &str, size: u32| {
        out.results
            .iter()
            .find(|r| r.part == part && r.size == size && r.ops > 0)
            .map(|r| r.gbit_per_sec)
    };
    let ratios = Ratios {
        eager_depth1000_vs_depth1: Ratio::new(
            "eager 8 B msg/s: depth 1000 / depth 1, window 1 both",
            out.find("eager", TARGET_SIZE, TARGET_DEPTH, false, 1),
            out.find("eager", TARGET_SIZE, 1, false, 1),
            Some(0.8),
        ),
        eager_depth1000_vs_depth1_windowed: Ratio::new(
            "eager 8 B msg/s: depth 1000 with window --qd / depth 1 (window 1)",
            out.find("eager", TARGET_SIZE, TARGET_DEPTH, false, wide),
            out.find("eager", TARGET_SIZE, 1, false, 1),
            None,
        ),
        eager_vs_baseline_depth1000: Ratio::new(
            "msg/s at 8 B, depth 1000, window --qd: tagged eager / software baseline",
            out.find("eager", TARGET_SIZE, TARGET_DEPTH, false, wide),
            out.find("baseline", TARGET_SIZE, TARGET_DEPTH, false, wide),
            Some(10.0),
        ),
        rndv_vs_read_4mib: Ratio::new(
            "Gbit/s at 4 MiB: rendezvous / RDMA READ",
            gbit("rndv", TARGET_RNDV),
            gbit("read", TARGET_RNDV),
            Some(0.9),
        ),
    };
    Ok(TaggedBenchSummary {
        op: BenchOp::Tagged,
        qd: opts.qd,
        seconds,
        memory,
        buffers,
        errors: out.errors,
        failures: out.failures,
        workers: out.workers,
        cores: out.cores,
        ports: out.ports,
        results: out.results,
        tagged: TaggedSummary {
            parts,
            points: opts.points.clone(),
            point_seconds: point_len.as_secs_f64(),
            warmup_seconds: warm.as_secs_f64(),
            mtu: opts.mtu.bytes(),
            rndv_threshold,
            ratios,
            target_events: out.events.unwrap_or_default(),
            target_counters: None,
        },
    })
}

/// The parts on the tagged pair.
fn run_tagged(
    s: &mut TagSession,
    running: &Running,
    opts: &BenchOpts,
    wants: &dyn Fn(TaggedPart) -> bool,
    point_len: Duration,
    warm: Duration,
    out: &mut Collected,
) -> Result<(), AppError> {
    s.link_overflow()?;
    let stopped = |s: &TagSession| s.stop.load(Ordering::Relaxed);
    if wants(TaggedPart::Eager) {
        human(opts.json, "eager: tagged sends into posted receives");
        for wild in [false, true] {
            for depth in DEPTHS {
                for size in EAGER_SIZES {
                    if !opts.points.keeps(size, depth, wild) {
                        continue;
                    }
                    let mut points = vec![PointSpec {
                        size,
                        depth,
                        window: opts.qd.min(depth),
                        wild,
                    }];
                    // The depth target's point at depth 1000 with the window depth 1 has,
                    // measured right after its counterpart at depth 1 (drift of a shared
                    // machine falls on both alike), when both depths run.
                    if (size, depth, wild) == (TARGET_SIZE, 1, false)
                        && opts.qd.min(TARGET_DEPTH) != 1
                        && opts.points.depth(TARGET_DEPTH)
                    {
                        points.push(PointSpec {
                            depth: TARGET_DEPTH,
                            ..points[0]
                        });
                    }
                    for p in points {
                        if stopped(s) {
                            return Ok(());
                        }
                        let r0 = retransmissions(running);
                        let m = s.expected(p, point_len, warm, false)?;
                        out.push(m.result("eager", p), running, r0, opts.json);
                    }
                }
            }
        }
    }
    if wants(TaggedPart::Unexpected) {
        human(
            opts.json,
            "unexpected: messages before their receives, claimed from the overflow buffer",
        );
        for size in EAGER_SIZES.into_iter().filter(|&z| opts.points.size(z)) {
            if stopped(s) {
                return Ok(());
            }
            let p = PointSpec {
                size,
                depth: 0,
                window: opts.qd,
                wild: false,
            };
            let r0 = retransmissions(running);
            let m = s.unexpected(p, point_len, warm)?;
            out.push(m.result("unexpected", p), running, r0, opts.json);
        }
    }
    if wants(TaggedPart::Rndv) {
        human(
            opts.json,
            "rndv: rendezvous tagged sends (the target READs), then plain RDMA READs",
        );
        for size in RNDV_SIZES.into_iter().filter(|&z| opts.points.size(z)) {
            let window = (RNDV_BYTES / size as usize).clamp(2, RNDV_WINDOW);
            let p = PointSpec {
                size,
                depth: window,
                window,
                wild: false,
            };
            if stopped(s) {
                return Ok(());
            }
            let r0 = retransmissions(running);
            let m = s.expected(p, point_len, warm, true)?;
            out.push(m.result("rndv", p), running, r0, opts.json);
            if stopped(s) {
                return Ok(());
            }
            let r0 = retransmissions(running);
            let m = s.read(p, point_len, warm)?;
            out.push(m.result("read", p), running, r0, opts.json);
        }
    }
    Ok(())
}

/// The baseline part on the plain pair.
fn run_baseline(
    s: &mut PlainSession,
    running: &Running,
    opts: &BenchOpts,
    point_len: Duration,
    warm: Duration,
    out: &mut Collected,
) -> Result<(), AppError> {
    human(
        opts.json,
        "baseline: plain SENDs, envelope matched by the host in a linked list, data copied",
    );
    s.post_all_receives()?;
    for wild in [false, true] {
        for depth in DEPTHS {
            for size in EAGER_SIZES {
                if !opts.points.keeps(size, depth, wild) {
                    continue;
                }
                if s.stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                let p = PointSpec {
                    size,
                    depth,
                    window: opts.qd.min(depth),
                    wild,
                };
                let r0 = retransmissions(running);
                let m = s.point(p, point_len, warm)?;
                out.push(m.result("baseline", p), running, r0, opts.json);
            }
        }
    }
    Ok(())
}

/// Prints the summary: a table per part and the targets, or one JSON object.
pub fn print(s: &TaggedBenchSummary, json: bool) {
    if json {
        return super::print_json(s);
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    println!();
    println!(
        "bench tagged summary: {:.1} s, {} errors; {} s per point",
        s.seconds, s.errors, s.tagged.point_seconds
    );
    let part = |name: &'static str| s.results.iter().filter(move |r| r.part == name);
    if part("eager").next().is_some() || part("baseline").next().is_some() {
        println!();
        println!(
            "  eager tagged vs software baseline, msg/s (window: messages outstanding, at most the posted receives)"
        );
        println!(
            "  {:>5} {:>5} {:>5} {:>6} {:>12} {:>9} {:>9} {:>5} {:>12} {:>9} {:>8}",
            "size",
            "depth",
            "wild",
            "window",
            "tagged",
            "p50 µs",
            "p99 µs",
            "late",
            "baseline",
            "p50 µs",
            "tag/base"
        );
        let base = |r: &TaggedResult| {
            part("baseline").find(|b| {
                (b.size, b.depth, b.wildcards, b.window) == (r.size, r.depth, r.wildcards, r.window)
            })
        };
        for r in part("eager") {
            let b = base(r);
            println!(
                "  {:>5} {:>5} {:>5} {:>6} {:>12.0} {:>9.1} {:>9.1} {:>5} {:>12} {:>9} {:>8}",
                r.size,
                r.depth.unwrap_or(0),
                if r.wildcards { "10%" } else { "-" },
                r.window,
                r.ops_per_sec,
                us(r.latency_ns.p50),
                us(r.latency_ns.p99),
                r.late,
                b.map_or("-".into(), |b| format!("{:.0}", b.ops_per_sec)),
                b.map_or("-".into(), |b| format!("{:.1}", us(b.latency_ns.p50))),
                b.and_then(|b| b.tagged_over_baseline)
                    .map_or("-".into(), |x| format!("{x:.2}")),
            );
        }
        if part("eager").next().is_none() {
            for b in part("baseline") {
                println!(
                    "  {:>5} {:>5} {:>5} {:>6} {:>12} {:>9} {:>9} {:>5} {:>12.0} {:>9.1} {:>8}",
                    b.size,
                    b.depth.unwrap_or(0),
                    if b.wildcards { "10%" } else { "-" },
                    b.window,
                    "-",
                    "-",
                    "-",
                    "-",
                    b.ops_per_sec,
                    us(b.latency_ns.p50),
                    "-"
                );
            }
        }
    }
    if part("unexpected").next().is_some() {
        println!();
        println!("  unexpected: message first, receive posted on its put-overflow event");
        println!(
            "  {:>5} {:>6} {:>12} {:>9} {:>9}",
            "size", "window", "msg/s", "p50 µs", "p99 µs"
        );
        for r in part("unexpected") {
            println!(
                "  {:>5} {:>6} {:>12.0} {:>9.1} {:>9.1}",
                r.size,
                r.window,
                r.ops_per_sec,
                us(r.latency_ns.p50),
                us(r.latency_ns.p99)
            );
        }
    }
    if part("rndv").next().is_some() {
        println!();
        println!("  rendezvous vs RDMA READ (same direction, same queue pairs), Gbit/s");
        println!(
            "  {:>8} {:>6} {:>10} {:>10} {:>8}",
            "size", "window", "rndv", "READ", "ratio"
        );
        for r in part("rndv") {
            let read = part("read").find(|x| x.size == r.size);
            println!(
                "  {:>8} {:>6} {:>10.2} {:>10} {:>8}",
                r.size,
                r.window,
                r.gbit_per_sec,
                read.map_or("-".into(), |x| format!("{:.2}", x.gbit_per_sec)),
                read.filter(|x| x.gbit_per_sec > 0.0)
                    .map_or("-".into(), |x| format!(
                        "{:.3}",
                        r.gbit_per_sec / x.gbit_per_sec
                    )),
            );
        }
    }
    for f in &s.failures {
        println!("  FAILED: {f}");
    }
    println!();
    println!("  targets:");
    let rt = &s.tagged.ratios;
    for r in [
        &rt.eager_depth1000_vs_depth1,
        &rt.eager_depth1000_vs_depth1_windowed,
        &rt.eager_vs_baseline_depth1000,
        &rt.rndv_vs_read_4mib,
    ] {
        println!("    {}", ratio_line(r));
    }
    let e = &s.tagged.target_events;
    println!(
        "  target's tag events: {} put, {} put-overflow, {} unexpected-consumed, {} rendezvous, {} truncated, {} command failed, {} stale",
        e.put,
        e.put_overflow,
        e.unexpected_consumed,
        e.rendezvous,
        e.truncated,
        e.command_failed,
        e.stale
    );
    super::print_workers(&s.workers);
    for line in s.cores.iter().filter_map(|c| c.trips_line()) {
        println!("  {line}");
    }
    report::port_table(&s.ports);
}

/// `of: value (target >= t): met`, or what is missing.
pub fn ratio_line(r: &Ratio) -> String {
    let value = r
        .value
        .map_or("n/a (a part it needs did not run)".into(), |v| {
            format!("{v:.3}")
        });
    match (r.target, r.met) {
        (Some(t), Some(met)) => format!(
            "{}: {value} (target >= {t}): {}",
            r.of,
            if met { "met" } else { "NOT met" }
        ),
        (Some(t), None) => format!("{}: {value} (target >= {t}): not measured", r.of),
        (None, _) => format!("{}: {value} (for reference)", r.of),
    }
}
