//! One point of `bench write|read|send|mixed`: a message size and a queue depth, run on
//! connections that stay up from one point to the next (a sweep runs many points on one pair of
//! engines; a single run is a sweep of one point).
//!
//! The host keeps `qd` operations outstanding over the queue pairs. With `--rate`, operation
//! *k* is due at `start + k / rate` and its latency runs from that intended time (no
//! coordinated omission); closed, latency runs from posting to completion. A point lasts its
//! duration, or until `stop` is set (Ctrl-C), and then waits for what is outstanding.
//!
//! The remote end of a queue pair may live in this process (`bench` on a `net_ring` link: its
//! receives are posted here, and `--verify` reads its memory) or in another (`bench --client`:
//! the server keeps its own receives posted, and a SEND is done when it is acknowledged).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{VerifySummary, human, op_index, usage};
use portico::app::AppError;
use portico::latency::{IntervalLog, Latency};
use portico::rdma::{Cq, MemoryRegion, Qp};
use portico::report;
use portico::transport::{RecvRequest, WcOpcode, WcStatus, WorkCompletion, WorkRequest};

/// A point of a run: message size and operations outstanding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Point {
    pub size: u32,
    pub qd: usize,
}

/// Bytes of each of the application's buffers at most.
pub(crate) const BUF_CAP: usize = 64 << 20;

/// Slots a buffer is cut into at most (per point, over all queue pairs).
const MAX_SLOTS: usize = 1024;

/// Operations outstanding on one queue pair at most (its send queue holds 128).
pub(crate) const QD_PER_QP: usize = 120;

/// Completions taken per poll.
pub(crate) const WCS_LEN: usize = 64;

/// Under `--verify`, buffer slots needed per operation outstanding.
const VERIFY_SLOTS_PER_QD: usize = 4;

/// Under `--verify`, a doorbell for every this many filled requests.
const VERIFY_RING_EVERY: usize = 8;

/// How long a point waits for its outstanding operations once posting has ended, before it
/// counts them as errors and the run gives up.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// The slots of `size` bytes in a buffer of `len` bytes, shared by `connections` queue pairs:
/// each queue pair's share (its operation *k* uses slot *k* mod share).
pub(crate) fn share(len: usize, size: usize, connections: usize) -> usize {
    (len / size).clamp(1, MAX_SLOTS) / connections
}

/// Checks a point against the buffers and the queue pairs before anything runs.
pub(crate) fn check_point(
    p: Point,
    connections: usize,
    verify: bool,
    buf_len: usize,
) -> Result<(), AppError> {
    let size = p.size as usize;
    if size == 0 || size > BUF_CAP / 4 {
        return Err(usage(format!(
            "--size: {size} B: must be 1..={} bytes",
            BUF_CAP / 4
        )));
    }
    // --qd is the total over the queue pairs: each holds its share (the widest share is the
    // rounded-up quotient), and each share must fit one send queue.
    if p.qd == 0 || p.qd.div_ceil(connections) > QD_PER_QP {
        return Err(usage(format!(
            "--qd: {}: must be 1..={} ({QD_PER_QP} outstanding on each of the {connections} queue pair{}; a send queue holds 128)",
            p.qd,
            QD_PER_QP * connections,
            if connections == 1 { "" } else { "s" },
        )));
    }
    if p.qd < connections {
        return Err(usage(format!(
            "--qd: {} is fewer than the {connections} queue pairs (--qd is the total outstanding, spread over them)",
            p.qd
        )));
    }
    // With --verify a slot must not be reused while an operation on it may still be
    // outstanding or unchecked. At most a window's worth are outstanding per queue pair, a
    // completion is checked one loop round after it is polled, and a receive completion may be
    // polled a round after its SEND's; four times the window leaves a margin over all of that.
    let share = share(buf_len, size, connections);
    let widest = p.qd.div_ceil(connections);
    if share == 0 || (verify && share < VERIFY_SLOTS_PER_QD * widest) {
        return Err(usage(format!(
            "{}: {} slots of {size} B fit the {} MiB buffers, {}; lower --qd or --size",
            if verify { "--verify" } else { "--size" },
            (buf_len / size).clamp(1, MAX_SLOTS),
            buf_len >> 20,
            if verify {
                format!(
                    "fewer than four times --qd {} (over {connections} queue pairs)",
                    p.qd
                )
            } else {
                format!("fewer than the {connections} queue pairs")
            }
        )));
    }
    Ok(())
}

/// The bytes each buffer needs for every point of a run.
pub(crate) fn buffer_len(points: &[Point]) -> usize {
    points
        .iter()
        .map(|p| {
            // (A size of 0 is refused by `check_point`.)
            let size = (p.size as usize).clamp(1, BUF_CAP);
            (BUF_CAP / size).clamp(1, MAX_SLOTS) * size
        })
        .max()
        .unwrap_or(0)
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

/// The remote buffer WRITEs go to and READs come from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RemoteBuf {
    pub(crate) addr: u64,
    pub(crate) rkey: u32,
}

/// B's memory when B is in this process: its buffer (for `--verify` of WRITEs, and the
/// pattern READs fetch) and its receive buffer.
pub(crate) struct LocalPeer {
    pub(crate) buf: MemoryRegion,
    pub(crate) recv: MemoryRegion,
}

/// The application's buffers, registered, as every point uses them.
pub(crate) struct Buffers {
    /// A's sources.
    pub(crate) src: MemoryRegion,
    /// A's READ destinations.
    pub(crate) dst: MemoryRegion,
    pub(crate) remote: RemoteBuf,
    pub(crate) peer: Option<LocalPeer>,
    /// Bytes of each buffer.
    pub(crate) len: usize,
    /// Bytes of each receive buffer B posts: the run's largest SEND.
    pub(crate) recv_len: u32,
}

/// A queue pair of the run: A's end, and B's when B is in this process.
pub(crate) struct Conn {
    pub(crate) qp: Qp,
    pub(crate) cq: Cq,
    pub(crate) peer: Option<(Qp, Cq)>,
}

/// Bits of an operation's id that name its queue pair (`--connections` is at most 256): the
/// id of queue pair `index`'s operation `seq` is `seq << LANE_BITS | index`, taken apart with a
/// shift rather than a division per completion.
const LANE_BITS: u32 = 8;

/// One queue pair and its bookkeeping, kept from point to point (a receive posted in one
/// point may take a SEND of the next).
struct Lane {
    index: usize,
    conn: Conn,
    /// Operations this queue pair keeps outstanding at most (this point's share of `qd`).
    window: usize,
    outstanding: usize,
    next_seq: u64,
    /// Start times of outstanding operations, by sequence number modulo a power of two above
    /// the window: at most `window` are outstanding, so entries never collide (and no hashing
    /// per operation).
    started: Vec<Option<Instant>>,
    /// Ids (and sizes) of SENDs in flight, oldest first: receive k gets the k-th SEND.
    send_ids: Vec<u64>,
    sends_posted: u64,
    sends_received: u64,
    recv_posted: u64,
    batch: Vec<WorkRequest>,
    recv_batch: Vec<RecvRequest>,
}

impl Lane {
    fn new(index: usize, conn: Conn) -> Lane {
        Lane {
            index,
            conn,
            window: 0,
            outstanding: 0,
            next_seq: 0,
            started: Vec::new(),
            send_ids: Vec::new(),
            sends_posted: 0,
            sends_received: 0,
            recv_posted: 0,
            batch: Vec::new(),
            recv_batch: Vec::new(),
        }
    }

    /// Sizes the bookkeeping for a point's window (nothing is outstanding between points).
    fn begin(&mut self, window: usize) {
        let ring = (window * 2).next_power_of_two();
        self.window = window;
        self.started = vec![None; ring];
        // SENDs in flight and receives posted ahead reach up to two windows.
        self.send_ids = vec![0; (ring * 2).max(self.send_ids.len())];
        self.batch = Vec::with_capacity(window);
        self.recv_batch = Vec::with_capacity(window * 2);
    }

    fn mask(&self) -> usize {
        self.started.len() - 1
    }

    fn send_mask(&self) -> usize {
        self.send_ids.len() - 1
    }

    /// Posts the batch with one doorbell.
    fn flush(&mut self) -> Result<(), AppError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.conn.qp.post_send(&self.batch).map_err(|e| {
            AppError::Failed(format!("posting {} work requests: {e}", self.batch.len()))
        })?;
        self.outstanding += self.batch.len();
        self.batch.clear();
        Ok(())
    }
}

/// The queue pair after `lane` of `n`, round robin (no division per operation).
fn next_lane(lane: usize, n: usize) -> usize {
    if lane + 1 >= n { 0 } else { lane + 1 }
}

/// What the operations of a run are: one type, or SEND, WRITE and READ in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ops {
    Write,
    Read,
    Send,
    Mixed,
    /// Durable WRITEs (Portico's extension, negotiated per queue pair): each done when the
    /// target has made it durable.
    Durable,
    /// Tagged sends (Portico's tagged messaging, negotiated per queue pair), matched by the
    /// target's list-processing engine; tag = the operation's number.
    Tagged,
}

impl Ops {
    /// 0 WRITE, 1 READ, 2 SEND, for operation `k` of the run.
    fn kind(self, k: u64) -> u64 {
        match self {
            Ops::Write | Ops::Durable | Ops::Tagged => 0,
            Ops::Read => 1,
            Ops::Send => 2,
            Ops::Mixed => k % 3,
        }
    }

    fn uses_send(self) -> bool {
        matches!(self, Ops::Send | Ops::Mixed)
    }
}

/// What one point measured.
pub(crate) struct Measured {
    pub(crate) point: Point,
    pub(crate) seconds: f64,
    /// Latency and completions per operation type (read, send, write: [`OP_NAMES`]).
    pub(crate) hist: [Latency; 3],
    pub(crate) counts: [u64; 3],
    pub(crate) errors: u64,
    pub(crate) verify: Option<VerifySummary>,
    /// Posting ended early (Ctrl-C, SIGTERM).
    pub(crate) interrupted: bool,
    /// Operations were still outstanding when the drain limit ran out: the queue pairs are
    /// not fit for another point.
    pub(crate) stuck: bool,
}

/// Where a point records its latencies besides its own histograms: the run's `.hlog` (tags
/// `tag_base + op`) and the plot's timeline (tags by operation type).
pub(crate) struct Logs<'a> {
    pub(crate) hlog: Option<(&'a mut IntervalLog, usize)>,
    pub(crate) timeline: Option<&'a mut IntervalLog>,
}

/// How a point announces itself on the terminal.
pub(crate) struct Progress {
    /// `[point n/m] ` in a sweep, empty otherwise.
    pub(crate) prefix: String,
    pub(crate) json: bool,
}

/// An application loop handed to a worker to run inside its own loop (`--inline`): called once
/// per worker iteration, after the engines' work, until it returns true.
pub(crate) type InlineApp = Box<dyn FnMut() -> bool + Send>;

/// The queue pairs and buffers of a run; [`Runner::run`] runs one point on them.
///
/// The queue pairs are dealt out to host threads (`--host-threads`): thread `t` of `T` owns
/// connections `t`, `t + T`, ... with their completion queues, so with one thread per worker
/// each thread drives the queue pairs of one worker (connection `c` is homed on worker
/// `c mod N`). Thread 0 is the calling thread; the others are spawned for each point, pinned
/// to `host_cores`. They share nothing on the per-operation path: each has its own lanes,
/// histograms and verifier, and publishes its progress in a padded counter of its own.
///
/// Inline (`--inline`, eRPC's model), there are no host threads: group `t`'s loop is handed to
/// worker `t`, which runs a round of it in each of its own iterations, so posting, the rings
/// and the completions stay on the worker's core. The calling thread waits, prints and gathers.
pub(crate) struct Runner {
    groups: Vec<Vec<Lane>>,
    /// The cores of host threads 1.. (thread 0 stays where it is).
    host_cores: Vec<usize>,
    /// Inline: where each worker takes its group's loop.
    inline: Option<Vec<mpsc::Sender<InlineApp>>>,
    buffers: Arc<Buffers>,
    ops: Ops,
    rate: Option<f64>,
    verify: bool,
    /// Operations posted over the whole run, per host thread: mixed runs take turns across
    /// points.
    posted: Vec<u64>,
    /// Where the current point's latency goes for `/portico/latency`, once a second.
    latency: Option<portico::telemetry::LatencySlot>,
}

/// What one host thread's loop measured of a point.
struct Part {
    seconds: f64,
    hist: [Latency; 3],
    counts: [u64; 3],
    errors: u64,
    verify: Option<VerifySummary>,
    interrupted: bool,
    stuck: bool,
    posted: u64,
}

/// A host thread's progress, read for the once-a-second line: on a cache line of its own,
/// written by its thread only.
#[repr(align(128))]
#[derive(Default)]
struct Progressed {
    done: AtomicU64,
    outstanding: AtomicU64,
}

/// What every loop of a point shares, read-only.
struct Shared {
    point: Point,
    buffers: Arc<Buffers>,
    ops: Ops,
    verify: bool,
    duration: Option<Duration>,
    /// The point is to end now (the caller's stop, passed on by whoever watches it).
    stop: Arc<AtomicBool>,
    progress: Progress,
    /// Slots of `size` per queue pair in the buffers, and of receive buffers.
    share: usize,
    recv_share: usize,
    progressed: Vec<Progressed>,
}

impl Shared {
    /// The once-a-second line: every loop's operations since `last_done` (updated).
    fn print(&self, t0: Instant, now: Instant, dt: f64, last_done: &mut u64) {
        let (done, out) = self.progressed.iter().fold((0, 0), |(d, o), p| {
            (
                d + p.done.load(Ordering::Relaxed),
                o + p.outstanding.load(Ordering::Relaxed),
            )
        });
        let new = done.saturating_sub(*last_done) as f64;
        human(
            self.progress.json,
            &format!(
                "{}[{:6.1}s] {:>12} ops/s  {:>14}  outstanding {}",
                self.progress.prefix,
                now.duration_since(t0).as_secs_f64(),
                report::rate(new / dt, ""),
                report::rate(new * self.point.size as f64 * 8.0 / dt, "bit/s"),
                out
            ),
        );
        *last_done = done;
    }
}

impl Runner {
    pub(crate) fn new(
        conns: Vec<Conn>,
        buffers: Buffers,
        ops: Ops,
        rate: Option<f64>,
        verify: bool,
    ) -> Runner {
        Runner {
            groups: vec![
                conns
                    .into_iter()
                    .enumerate()
                    .map(|(i, c)| Lane::new(i, c))
                    .collect(),
            ],
            host_cores: Vec::new(),
            inline: None,
            buffers: Arc::new(buffers),
            ops,
            rate,
            verify,
            posted: vec![0],
            latency: None,
        }
    }

    /// Deals the queue pairs out to `1 + more_cores.len()` host threads (thread `t` takes
    /// connections `t`, `t + T`, ...); thread `t >= 1` runs on `more_cores[t - 1]`.
    pub(crate) fn with_host_threads(mut self, more_cores: Vec<usize>) -> Runner {
        self.deal(1 + more_cores.len());
        self.host_cores = more_cores;
        self
    }

    /// Inline: worker `t` of `workers.len()` runs the loop of connections `t`, `t + N`, ...
    /// (the ones homed on it), taken from `workers[t]`.
    pub(crate) fn inline(mut self, workers: Vec<mpsc::Sender<InlineApp>>) -> Runner {
        self.deal(workers.len());
        self.inline = Some(workers);
        self
    }

    fn deal(&mut self, t: usize) {
        let mut lanes: Vec<Lane> = self.groups.drain(..).flatten().collect();
        lanes.sort_by_key(|l| l.index);
        let mut groups: Vec<Vec<Lane>> = (0..t).map(|_| Vec::new()).collect();
        for l in lanes {
            groups[l.index % t].push(l);
        }
        groups.retain(|g| !g.is_empty());
        self.posted = vec![0; groups.len()];
        self.groups = groups;
    }

    /// Host threads (or, inline, workers) and the queue pairs (engine A's QPNs) each drives.
    pub(crate) fn host_layout(&self) -> Vec<Vec<u32>> {
        self.groups
            .iter()
            .map(|g| g.iter().map(|l| l.conn.qp.qpn()).collect())
            .collect()
    }

    /// Publishes the current point's latency to `slot` once a second and at its end.
    pub(crate) fn with_latency_slot(mut self, slot: portico::telemetry::LatencySlot) -> Runner {
        self.latency = Some(slot);
        self
    }

    fn publish(&self, hist: &[Latency; 3]) {
        if let Some(slot) = &self.latency {
            for (k, h) in hist.iter().enumerate() {
                if h.count() > 0 {
                    slot.publish(super::OP_NAMES[k], h);
                }
            }
        }
    }

    /// Runs `point` for `duration` (None: until `stop`), and returns what it measured.
    pub(crate) fn run(
        &mut self,
        point: Point,
        duration: Option<Duration>,
        stop: &AtomicBool,
        logs: &mut Logs<'_>,
        progress: &Progress,
    ) -> Result<Measured, AppError> {
        let lanes_n: usize = self.groups.iter().map(Vec::len).sum();
        let size = point.size as usize;
        let recv_len = self.buffers.recv_len as usize;
        let shared = Arc::new(Shared {
            point,
            buffers: self.buffers.clone(),
            ops: self.ops,
            verify: self.verify,
            duration,
            stop: Arc::new(AtomicBool::new(false)),
            progress: Progress {
                prefix: progress.prefix.clone(),
                json: progress.json,
            },
            share: share(self.buffers.len, size, lanes_n),
            recv_share: share_or_one(self.buffers.len, recv_len, lanes_n),
            progressed: self.groups.iter().map(|_| Progressed::default()).collect(),
        });
        for l in self.groups.iter_mut().flatten() {
            // The total window, dealt out: the first `qd % n` queue pairs take one more.
            // Not `usize::from(bool)`: `docs/toolchain.md` (rust-lang/rust#158206).
            let extra = if l.index < point.qd % lanes_n { 1 } else { 0 };
            l.begin(point.qd / lanes_n + extra);
        }
        // A rate is dealt out like the queue pairs.
        let rate = self.rate;
        let loops: Vec<LaneLoop> = self
            .groups
            .iter_mut()
            .enumerate()
            .map(|(t, g)| {
                let rate = rate.map(|r| r * g.len() as f64 / lanes_n as f64);
                let lanes = std::mem::take(g);
                // Thread 0 prints for all; inline, the waiting caller does.
                let prints = t == 0 && self.inline.is_none();
                LaneLoop::new(lanes, t, prints, self.posted[t], rate, shared.clone())
            })
            .collect();
        let results = if let Some(workers) = &self.inline {
            run_inline(loops, workers, &shared, stop)?
        } else {
            // Latency logs have one writer: `--hlog` and `--plot` take one host thread
            // (`bench::run` checks). The telemetry slot shows one loop's histograms, so only
            // a lone loop publishes.
            let slot = if loops.len() == 1 {
                self.latency.clone()
            } else {
                None
            };
            let cores = &self.host_cores;
            let mut loops = loops.into_iter();
            let mut first = loops.next().expect("a loop");
            std::thread::scope(|s| {
                let spawned: Vec<_> = loops
                    .enumerate()
                    .map(|(k, mut l)| {
                        let core = cores.get(k).copied();
                        std::thread::Builder::new()
                            .name(format!("bench-host-{}", k + 1))
                            .spawn_scoped(s, move || {
                                if let Some(c) = core {
                                    core_affinity::set_for_current(core_affinity::CoreId { id: c });
                                }
                                let mut none = Logs::none();
                                while !l.step(&mut none, None)? {}
                                Ok::<_, AppError>(l.finish())
                            })
                    })
                    .collect();
                let mut mine = || {
                    while !first.step(logs, slot.as_ref())? {
                        if stop.load(Ordering::Relaxed) {
                            shared.stop.store(true, Ordering::Relaxed);
                        }
                    }
                    Ok::<_, AppError>(())
                };
                let result = mine();
                if result.is_err() {
                    // The others end their point too.
                    shared.stop.store(true, Ordering::Relaxed);
                }
                let mut results = Vec::new();
                for h in spawned {
                    let h =
                        h.map_err(|e| AppError::Failed(format!("starting a host thread: {e}")))?;
                    results.push(
                        h.join()
                            .map_err(|_| AppError::Failed("a host thread panicked".into()))??,
                    );
                }
                result?;
                results.insert(0, first.finish());
                Ok::<_, AppError>(results)
            })?
        };
        let mut m = Measured {
            point,
            seconds: 0.0,
            hist: Default::default(),
            counts: [0; 3],
            errors: 0,
            verify: None,
            interrupted: false,
            stuck: false,
        };
        for (t, (p, lanes)) in results.into_iter().enumerate() {
            self.groups[t] = lanes;
            self.posted[t] += p.posted;
            m.seconds = m.seconds.max(p.seconds);
            for k in 0..3 {
                m.hist[k].merge(&p.hist[k]);
                m.counts[k] += p.counts[k];
            }
            m.errors += p.errors;
            if let Some(v) = p.verify {
                let t = m.verify.get_or_insert_with(VerifySummary::default);
                t.checked_ops += v.checked_ops;
                t.checked_bytes += v.checked_bytes;
                t.mismatches += v.mismatches;
            }
            m.interrupted |= p.interrupted;
            m.stuck |= p.stuck;
        }
        self.publish(&m.hist);
        Ok(m)
    }
}

/// Inline: hands loop `t` to worker `t`, then waits for all of them, passing the caller's
/// `stop` on and printing the once-a-second line.
fn run_inline(
    loops: Vec<LaneLoop>,
    workers: &[mpsc::Sender<InlineApp>],
    shared: &Shared,
    stop: &AtomicBool,
) -> Result<Vec<(Part, Vec<Lane>)>, AppError> {
    let n = loops.len();
    let (tx, rx) = mpsc::channel();
    for (t, l) in loops.into_iter().enumerate() {
        let tx = tx.clone();
        let mut l = Some(l);
        let app: InlineApp = Box::new(move || {
            let Some(lp) = l.as_mut() else {
                return true;
            };
            let step = lp.step(&mut Logs::none(), None);
            match step {
                Ok(false) => false,
                Ok(true) => {
                    let lp = l.take().expect("the loop");
                    let _ = tx.send((t, Ok(lp.finish())));
                    true
                }
                Err(e) => {
                    l = None;
                    let _ = tx.send((t, Err(e)));
                    true
                }
            }
        });
        workers[t]
            .send(app)
            .map_err(|_| AppError::Failed(format!("worker {t} is gone: no inline loop")))?;
    }
    drop(tx);
    let t0 = Instant::now();
    // The loops end by the duration, plus the drain limit; a worker that stopped running
    // them (it failed) is not waited for for ever.
    let limit = shared
        .duration
        .unwrap_or(Duration::MAX)
        .saturating_add(DRAIN_LIMIT * 2);
    let mut results: Vec<Option<(Part, Vec<Lane>)>> = (0..n).map(|_| None).collect();
    let (mut got, mut last_print, mut last_done) = (0, t0, 0u64);
    let mut failed = None;
    while got < n {
        match rx.recv_timeout(Duration::from_millis(5)) {
            Ok((t, Ok(r))) => {
                results[t] = Some(r);
                got += 1;
            }
            Ok((_, Err(e))) => {
                shared.stop.store(true, Ordering::Relaxed);
                failed.get_or_insert(e);
                got += 1;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if stop.load(Ordering::Relaxed) {
            shared.stop.store(true, Ordering::Relaxed);
        }
        let now = Instant::now();
        if now.duration_since(last_print) >= Duration::from_secs(1) {
            shared.print(
                t0,
                now,
                now.duration_since(last_print).as_secs_f64(),
                &mut last_done,
            );
            last_print = now;
        }
        if now.duration_since(t0) > limit {
            return Err(AppError::Failed(format!(
                "inline: {} of {n} workers did not finish their loop",
                n - got
            )));
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    results
        .into_iter()
        .enumerate()
        .map(|(t, r)| r.ok_or_else(|| AppError::Failed(format!("inline: worker {t} stopped"))))
        .collect()
}

impl Logs<'_> {
    /// No logs (host threads but the first, and inline loops).
    fn none() -> Logs<'static> {
        Logs {
            hlog: None,
            timeline: None,
        }
    }
}

/// Compares what landed for the operations in `to_check` with their patterns.
fn check_landed(v: &mut Verifier, to_check: &mut Vec<(u64, Landed, usize)>, b: &Buffers) {
    for &(id, landed, slot) in to_check.iter() {
        let mr = match (landed, &b.peer) {
            (Landed::Back, _) => &b.dst,
            (Landed::Remote, Some(p)) => &p.buf,
            (Landed::Received, Some(p)) => &p.recv,
            (_, None) => continue,
        };
        v.check(id, mr, slot);
    }
    to_check.clear();
}

/// One loop over a group of queue pairs for a point (a host thread's, or inline a worker's),
/// a round at a time: loop `thread`, whose mixed operations continue from its `base`-th, at
/// `rate` operations a second (None: closed loop).
struct LaneLoop {
    lanes: Vec<Lane>,
    thread: usize,
    /// Prints the once-a-second line for every loop.
    prints: bool,
    base: u64,
    rate: Option<f64>,
    sh: Arc<Shared>,
    verifier: Option<Verifier>,
    hist: [Latency; 3],
    counts: [u64; 3],
    /// With --verify: landed bytes to check, as (operation id, which buffer, offset). They
    /// are checked after the next batch is posted, so the engine has work while the host
    /// compares.
    to_check: Vec<(u64, Landed, usize)>,
    wcs: [WorkCompletion; WCS_LEN],
    errors: u64,
    t0: Instant,
    /// When posting ends: the duration's end, or the moment `stop` is seen.
    end: Option<Instant>,
    interrupted: bool,
    /// Operations posted in this point: operation k is due at t0 + k / rate.
    next_k: u64,
    /// The queue pair that takes the next operation of a closed loop.
    cursor: usize,
    last_print: Instant,
    last_done: u64,
    done: u64,
    stuck: bool,
}

impl LaneLoop {
    fn new(
        lanes: Vec<Lane>,
        thread: usize,
        prints: bool,
        base: u64,
        rate: Option<f64>,
        sh: Arc<Shared>,
    ) -> LaneLoop {
        let t0 = Instant::now();
        let size = sh.point.size as usize;
        LaneLoop {
            verifier: sh.verify.then(|| Verifier::new(size)),
            to_check: Vec::with_capacity(2 * WCS_LEN * lanes.len()),
            end: sh.duration.and_then(|d| t0.checked_add(d)),
            lanes,
            thread,
            prints,
            base,
            rate,
            sh,
            hist: Default::default(),
            counts: [0; 3],
            wcs: [WorkCompletion::EMPTY; WCS_LEN],
            errors: 0,
            t0,
            interrupted: false,
            next_k: 0,
            cursor: 0,
            last_print: t0,
            last_done: 0,
            done: 0,
            stuck: false,
        }
    }

    /// One round: receives kept ahead of the SENDs, what is due and fits posted (each queue
    /// pair's batch with one doorbell), completions polled. True when the point is over for
    /// these queue pairs (everything completed after the end, or the drain limit passed).
    fn step(
        &mut self,
        logs: &mut Logs<'_>,
        slot: Option<&portico::telemetry::LatencySlot>,
    ) -> Result<bool, AppError> {
        // A borrow of the field, not a clone of the `Arc`: a clone per round would be an
        // atomic on a cache line every host thread (or inline worker) shares.
        let sh: &Shared = &self.sh;
        let point = sh.point;
        let lanes_n = self.lanes.len();
        let size = point.size as usize;
        let (share, recv_share) = (sh.share, sh.recv_share);
        let recv_len = sh.buffers.recv_len as usize;
        let slot_of = |lane: usize, k: u64| (lane * share + k as usize % share) * size;
        let recv_slot =
            |lane: usize, k: u64| (lane * recv_share + k as usize % recv_share) * recv_len;
        let Buffers {
            src,
            dst,
            remote,
            peer,
            ..
        } = &*sh.buffers;
        let (ops, rate, base) = (sh.ops, self.rate, self.base);
        let uses_send = ops.uses_send() && peer.is_some();
        let now = Instant::now();
        if sh.stop.load(Ordering::Relaxed) && self.end.is_none_or(|e| e > now) {
            self.end = Some(now);
            self.interrupted = sh.duration.is_some();
        }
        let ended = self.end.is_some_and(|e| now >= e);
        if uses_send {
            // Keep B's receive queues a window ahead of the SENDs, before any of this
            // round's SENDs is posted (filling sources can take longer than the RNR
            // retries last).
            for l in self.lanes.iter_mut() {
                let lane = l.index;
                let Some((rqp, _)) = l.conn.peer.as_mut() else {
                    continue;
                };
                let recv = &peer.as_ref().expect("uses_send has B").recv;
                l.recv_batch.clear();
                while l.recv_posted < l.sends_posted + l.window as u64
                    && l.recv_batch.len() < l.recv_batch.capacity()
                {
                    let slot = recv_slot(lane, l.recv_posted);
                    l.recv_batch.push(RecvRequest::new(
                        l.recv_posted,
                        recv.sgl(slot, recv_len as u32),
                    ));
                    l.recv_posted += 1;
                }
                if let Err(full) = rqp.post_recv(&l.recv_batch) {
                    l.recv_posted -= (l.recv_batch.len() - full.posted) as u64;
                }
            }
        }
        // Post while there is room in a window and (with a rate) the next operation is
        // due: each queue pair's batch with one doorbell. Operations go to the queue pairs
        // in turn.
        for l in self.lanes.iter_mut() {
            l.batch.clear();
        }
        let mut blocked = 0;
        while !ended && blocked < lanes_n {
            // With a rate, operation k belongs to queue pair k mod n and waits for it;
            // closed, the next queue pair in turn that has room takes it.
            let at = match rate {
                Some(_) => (self.next_k % lanes_n as u64) as usize,
                None => self.cursor,
            };
            let l = &mut self.lanes[at];
            if l.outstanding + l.batch.len() >= l.window {
                if rate.is_some() {
                    break;
                }
                blocked += 1;
                self.cursor = next_lane(self.cursor, lanes_n);
                continue;
            }
            blocked = 0;
            let intended = match rate {
                // An operation due beyond any clock reading (a tiny rate) is never due.
                Some(r) => match Duration::try_from_secs_f64(self.next_k as f64 / r)
                    .ok()
                    .and_then(|d| self.t0.checked_add(d))
                {
                    Some(t) => t,
                    None => break,
                },
                None => now,
            };
            if intended > now {
                break;
            }
            let lane = l.index;
            let seq = l.next_seq;
            let id = (seq << LANE_BITS) | lane as u64;
            let slot = slot_of(lane, seq);
            let kind = ops.kind(base + self.next_k);
            if let Some(v) = self.verifier.as_mut() {
                match (kind, peer) {
                    (1, Some(p)) => v.fill(id, &p.buf, slot),
                    (1, None) => {}
                    _ => v.fill(id, src, slot),
                }
            }
            let (out, back) = (src.sgl(slot, point.size), dst.sgl(slot, point.size));
            let at = remote.addr + slot as u64;
            let wr = match kind {
                // Lane i is connection i, whose messages the peer's worker i takes:
                // endpoint i is homed there (`peer::start_engine`).
                0 if ops == Ops::Tagged => {
                    WorkRequest::tagged_send(id, out, lane as u16, base + self.next_k, 0)
                }
                0 if ops == Ops::Durable => {
                    WorkRequest::durable_write(id, out, at, remote.rkey, false)
                }
                0 => WorkRequest::write(id, out, at, remote.rkey, None),
                1 => WorkRequest::read(id, back, at, remote.rkey),
                _ => {
                    let mask = l.send_mask();
                    l.send_ids[l.sends_posted as usize & mask] = id;
                    l.sends_posted += 1;
                    WorkRequest::send(id, out, None)
                }
            };
            l.batch.push(wr);
            let mask = l.mask();
            l.started[seq as usize & mask] = Some(intended);
            l.next_seq += 1;
            self.next_k += 1;
            self.cursor = next_lane(self.cursor, lanes_n);
            if self.verifier.is_some() && l.batch.len() == VERIFY_RING_EVERY {
                // Filling takes time: ring for what is ready rather than for the whole
                // batch.
                l.flush()?;
            }
        }
        for l in self.lanes.iter_mut() {
            l.flush()?;
        }
        if let Some(v) = self.verifier.as_mut() {
            check_landed(v, &mut self.to_check, &sh.buffers);
        }
        let wcs = &mut self.wcs;
        for l in self.lanes.iter_mut() {
            let lane = l.index;
            let n = l.conn.cq.poll(wcs);
            if n > 0 {
                // One clock read per batch of completions: the work they did ended by now.
                let polled_at = Instant::now();
                if let Some((log, _)) = logs.hlog.as_mut() {
                    log.tick(polled_at);
                }
                if let Some(log) = logs.timeline.as_mut() {
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
                        self.errors += 1;
                        continue;
                    }
                    let k = op_index(wc.opcode);
                    let ns = polled_at.saturating_duration_since(t).as_nanos() as u64;
                    self.hist[k].record(ns);
                    if let Some((log, tag_base)) = logs.hlog.as_mut() {
                        log.record(*tag_base + k, ns);
                    }
                    if let Some(log) = logs.timeline.as_mut() {
                        log.record(k, ns);
                    }
                    self.counts[k] += 1;
                    self.done += 1;
                    if self.verifier.is_some() {
                        let slot = slot_of(lane, seq);
                        match wc.opcode {
                            WcOpcode::RdmaWrite => {
                                self.to_check.push((wc.wr_id, Landed::Remote, slot))
                            }
                            WcOpcode::RdmaRead => {
                                self.to_check.push((wc.wr_id, Landed::Back, slot))
                            }
                            _ => {}
                        }
                    }
                }
            }
            if uses_send && let Some((_, rcq)) = l.conn.peer.as_mut() {
                let n = rcq.poll(wcs);
                let mask = l.send_mask();
                for wc in &wcs[..n] {
                    let id = l.send_ids[l.sends_received as usize & mask];
                    l.sends_received += 1;
                    if wc.status != WcStatus::Success {
                        self.errors += 1;
                    } else if self.verifier.is_some() {
                        self.to_check
                            .push((id, Landed::Received, recv_slot(lane, wc.wr_id)));
                    }
                }
            }
        }
        let outstanding: usize = self.lanes.iter().map(|l| l.outstanding).sum();
        if now.duration_since(self.last_print) >= Duration::from_secs(1) {
            let mine = &sh.progressed[self.thread];
            mine.done.store(self.done, Ordering::Relaxed);
            mine.outstanding
                .store(outstanding as u64, Ordering::Relaxed);
            if self.prints {
                let dt = now.duration_since(self.last_print).as_secs_f64();
                sh.print(self.t0, now, dt, &mut self.last_done);
            }
            self.last_print = now;
            if let Some(slot) = slot {
                for (k, h) in self.hist.iter().enumerate() {
                    if h.count() > 0 {
                        slot.publish(super::OP_NAMES[k], h);
                    }
                }
            }
        }
        let receives_done = !uses_send
            || self
                .lanes
                .iter()
                .all(|l| l.sends_received == l.sends_posted);
        if ended && outstanding == 0 && receives_done {
            return Ok(true);
        }
        if self
            .end
            .is_some_and(|e| now.saturating_duration_since(e) >= DRAIN_LIMIT)
        {
            self.errors += outstanding as u64;
            self.stuck = true;
            return Ok(true);
        }
        Ok(false)
    }

    /// What the loop measured, and its queue pairs back. A point of a sweep that does not
    /// send leaves the receives it posted for the next.
    fn finish(mut self) -> (Part, Vec<Lane>) {
        if let Some(v) = self.verifier.as_mut() {
            check_landed(v, &mut self.to_check, &self.sh.buffers);
        }
        let part = Part {
            seconds: self.t0.elapsed().as_secs_f64(),
            hist: self.hist,
            counts: self.counts,
            errors: self.errors,
            verify: self.verifier.map(|v| v.summary),
            interrupted: self.interrupted,
            stuck: self.stuck,
            posted: self.next_k,
        };
        (part, self.lanes)
    }
}

/// A buffer's share of slots of `size` for each of `connections` queue pairs, at least one.
fn share_or_one(len: usize, size: usize, connections: usize) -> usize {
    share(len, size.max(1), connections).max(1)
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

    #[test]
    fn buffers_hold_every_point_and_points_are_checked_against_them() {
        let pts = [
            Point { size: 64, qd: 8 },
            Point {
                size: 8 << 20,
                qd: 1,
            },
        ];
        // 64 B: 1024 slots; 8 MiB: 8 slots.
        assert_eq!(buffer_len(&pts), 64 << 20);
        let len = buffer_len(&pts);
        assert!(check_point(pts[0], 1, true, len).is_ok());
        assert!(check_point(pts[1], 1, false, len).is_ok());
        // Eight 8 MiB slots cannot give four per operation to a --verify window of 4.
        let e = check_point(
            Point {
                size: 8 << 20,
                qd: 4,
            },
            1,
            true,
            len,
        )
        .unwrap_err();
        assert!(e.to_string().contains("--verify"), "{e}");
        let e = check_point(Point { size: 64, qd: 121 }, 1, false, len).unwrap_err();
        assert!(e.to_string().contains("--qd: 121: must be 1..=120"), "{e}");
        // --qd is the total: two queue pairs take 240, 120 each, also under --verify.
        check_point(Point { size: 64, qd: 240 }, 2, true, len).unwrap();
        check_point(Point { size: 64, qd: 256 }, 4, false, len).unwrap();
        let e = check_point(Point { size: 64, qd: 241 }, 2, false, len).unwrap_err();
        assert!(
            e.to_string().contains(
                "--qd: 241: must be 1..=240 (120 outstanding on each of the 2 queue pairs"
            ),
            "{e}"
        );
        let e = check_point(Point { size: 64, qd: 2 }, 4, false, len).unwrap_err();
        assert!(
            e.to_string().contains("fewer than the 4 queue pairs"),
            "{e}"
        );
    }
}
