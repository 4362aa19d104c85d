//! `portico bench persist`: remote durable writes between the two loopback engines, into a
//! region the target maps from a file, made durable in one of five ways (`--mode`):
//!
//! - `durable`: one durable WRITE (Portico's extension, both queue pairs negotiate it); the
//!   operation is done on its `DurableWrite` completion, which the target's durable ACK
//!   releases once the engine's flusher has persisted the range.
//! - `durable-region`: one plain WRITE into a region registered `DURABLE` (both queue pairs
//!   negotiate the extension): the target's receipt ACK (0xE3) moves the window at once and
//!   its durable ACK completes the WRITE once the flusher has persisted it (seed 004's
//!   pipelining without a new kind of work request).
//! - `write-read`: a WRITE and an 8-byte READ of the written range, posted as one list
//!   (librpma's "appliance persistency method"); done when the READ completes. The target
//!   persists every WRITE into a region registered `FLUSH_PERSISTENT` as soon as it is placed,
//!   and answers a READ only once the persists before it are done.
//! - `write-flush`: a WRITE and an IBTA FLUSH (placement persistence, selectivity memory range)
//!   of the written range, posted as one list; done on the FLUSH's completion.
//! - `write-send`: a WRITE and a SEND naming the range, posted as one list (librpma's "general
//!   purpose server persistency method"). A server thread on the target's side takes the
//!   SEND's receive completion, persists the range itself (`Mapping::persist`, an `msync` on
//!   a file that is not DAX) and answers with a SEND; done when the answer arrives.
//!
//! An operation's latency runs from its post to the completion that proves it durable. The
//! loop is closed: `--qd` operations outstanding, each one's place taken by a new one as soon
//! as it is done. The host waits for completions with [`portico::rdma::Cq::wait`] (a short spin,
//! then parked until the worker wakes it), in every mode alike, so that the write-send server
//! thread, on the host's core, gets that core while the host waits.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pmem::Mapping;
use serde::Serialize;

use super::{
    BenchOpts, BenchSummary, Engines, OpResult, Stopped, WCS_LEN, human, start_engines, usage,
    write_hgrm,
};
use portico::app::AppError;
use portico::config::{MemoryLimit, limits};
use portico::latency::{Latency, LatencySummary};
use portico::rdma::loopback;
use portico::rdma::{Cq, MemoryRegion, Qp};
use portico::report;
use portico::transport::{
    Access, QpConfig, RecvRequest, WcOpcode, WcStatus, WorkCompletion, WorkRequest,
};
use portico::wire::{Placement, Selectivity};

/// How an operation's write is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PersistMode {
    /// One durable WRITE; done on its durable completion.
    Durable,
    /// One plain WRITE into a region registered durable; done on its completion, which the
    /// durable ACK releases.
    DurableRegion,
    /// A WRITE and an 8-byte READ of the same range; done when the READ completes.
    WriteRead,
    /// A WRITE and an IBTA FLUSH of the written range; done when the FLUSH completes.
    WriteFlush,
    /// A WRITE and a SEND naming the range; a server thread on the target persists it and
    /// answers; done when the answer arrives.
    WriteSend,
}

impl PersistMode {
    pub fn name(self) -> &'static str {
        match self {
            PersistMode::Durable => "durable",
            PersistMode::DurableRegion => "durable-region",
            PersistMode::WriteRead => "write-read",
            PersistMode::WriteFlush => "write-flush",
            PersistMode::WriteSend => "write-send",
        }
    }

    /// The opcode of the completion that ends an operation.
    fn final_opcode(self) -> WcOpcode {
        match self {
            PersistMode::Durable => WcOpcode::DurableWrite,
            PersistMode::DurableRegion => WcOpcode::RdmaWrite,
            PersistMode::WriteRead => WcOpcode::RdmaRead,
            PersistMode::WriteFlush => WcOpcode::Flush,
            PersistMode::WriteSend => WcOpcode::Recv,
        }
    }
}

/// The persist object of the JSON summary, beside the fields every bench has.
#[derive(Debug, Clone, Serialize)]
pub struct PersistSummary {
    pub mode: PersistMode,
    /// What the target's region is (`pmem::Kind`'s words: file, DAX or not, how it persists).
    pub mapping: String,
    pub dax: bool,
    pub file: String,
    /// The file was made for this run in a fresh directory and removed afterwards.
    pub temporary: bool,
    /// The region's access flags, as registered.
    pub access: &'static str,
    pub size: u32,
    pub qd: usize,
    /// Slots of `size` bytes the operations cycle through in the region.
    pub slots: usize,
    pub region_bytes: usize,
    /// The queue pairs' tuning for this bench.
    pub max_rd_atomic: u32,
    pub max_in_flight: u32,
    pub timeout_ns: u64,
    pub durable_timeout_ns: u64,
    /// `write-send` only: what the target's server thread did.
    pub server: Option<ServerSummary>,
    /// The region was a file treated as persistent memory (`--pmem emulated`): persists are
    /// cache-line write-backs, and nothing is durable.
    pub emulated_pmem: bool,
    /// Frames both engines put on the wire per completed operation, and their bytes (the
    /// seed's network-load claim: requests, responses and every ACK, retransmissions
    /// included).
    pub wire_packets_per_op: f64,
    /// `None` where the ports do not count bytes (net_ring).
    pub wire_bytes_per_op: Option<f64>,
}

/// What the `write-send` server thread did.
#[derive(Debug, Clone, Serialize)]
pub struct ServerSummary {
    /// Requests received and persisted.
    pub requests: u64,
    /// Answers sent and completed.
    pub replies: u64,
    /// Failed receives, persists or answers.
    pub errors: u64,
    /// Time in `Mapping::persist` per request, on the server thread.
    pub persist_ns: LatencySummary,
}

/// Largest `--size`.
const MAX_SIZE: u32 = 64 << 10;
/// Smallest `--size`: the READ of `write-read` reads 8 bytes of the range written.
const MIN_SIZE: u32 = 8;
/// The operations spread over about this many bytes of the region (at least two slots per
/// operation outstanding, at most [`MAX_SLOTS`]).
const REGION_SPREAD: usize = 4 << 20;
const MAX_SLOTS: usize = 1024;
/// Send queue depth: `write-*` posts two work requests per operation.
const SEND_WR: usize = 256;
/// Receive queue depth, and receives kept posted on each side in `write-send`.
const RECV_WR: usize = 128;
/// The request of `write-send`: region offset, length and operation id, 8 bytes each.
const REQUEST_LEN: usize = 24;
/// The answer: operation id and status (0: persisted).
const REPLY_LEN: usize = 16;
/// The server's answer buffers: more than its send queue can hold outstanding.
const REPLY_SLOTS: usize = 2 * SEND_WR;
/// The retransmission timer: generous, since a READ or FLUSH response waits for an `msync`
/// (0.15 to 0.5 ms per page here, more under load) and must not be retransmitted for it.
const TIMEOUT_NS: u64 = 50_000_000;
/// How long a durable WRITE waits for its durable ACK before probing.
const DURABLE_TIMEOUT_NS: u64 = 200_000_000;
/// One wait for completions at most (then the loop looks at the clock and the stop flag).
const WAIT: Duration = Duration::from_millis(2);
/// How long the end waits for what is outstanding.
const GRACE: Duration = Duration::from_secs(5);

/// A directory made for this run, removed with everything in it when dropped.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory under /var/tmp (on a disk; /tmp may be a tmpfs), else under the
/// system's temporary directory.
pub(crate) fn fresh_dir() -> Result<TempDir, AppError> {
    let var_tmp = Path::new("/var/tmp");
    let base = if var_tmp.is_dir() {
        var_tmp.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for i in 0..100u32 {
        let p = base.join(format!(
            "portico-persist-{}-{}",
            std::process::id(),
            nanos.wrapping_add(i)
        ));
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(TempDir(p)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(AppError::Failed(format!(
                    "creating a directory for the region file in {}: {e}",
                    base.display()
                )));
            }
        }
    }
    Err(AppError::Failed(format!(
        "no fresh directory name free in {}",
        base.display()
    )))
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
}

/// The `write-send` server: the target application's thread.
struct Server {
    qp: Qp,
    cq: Cq,
    /// The target's region, persisted here.
    region: Arc<Mapping>,
    /// Receive buffers for requests, [`RECV_WR`] of [`REQUEST_LEN`] bytes.
    requests: MemoryRegion,
    /// Answer buffers, [`REPLY_SLOTS`] of [`REPLY_LEN`] bytes.
    replies: MemoryRegion,
    stop: Arc<AtomicBool>,
}

impl Server {
    fn recv(&self, i: usize) -> RecvRequest {
        RecvRequest::new(
            i as u64,
            self.requests.sgl(i * REQUEST_LEN, REQUEST_LEN as u32),
        )
    }

    /// Posts a receive in every request buffer: before the first request can arrive.
    fn post_receives(&mut self) -> Result<(), AppError> {
        let all: Vec<RecvRequest> = (0..RECV_WR).map(|i| self.recv(i)).collect();
        self.qp
            .post_recv(&all)
            .map_err(|e| AppError::Failed(format!("posting the server's receives: {e}")))
    }

    /// Serves until `stop` is set, then waits (a second at most) for its answers' completions.
    fn run(mut self) -> ServerSummary {
        let mut wcs = [WorkCompletion::EMPTY; WCS_LEN];
        let mut s = ServerSummary {
            requests: 0,
            replies: 0,
            errors: 0,
            persist_ns: Latency::new().summary(),
        };
        let mut persist = Latency::new();
        let mut repost: Vec<RecvRequest> = Vec::with_capacity(WCS_LEN);
        // Answers (operation id, status) not yet in the send ring, oldest first.
        let mut pending: VecDeque<[u64; 2]> = VecDeque::with_capacity(REPLY_SLOTS);
        let (mut posted, mut completed) = (0u64, 0u64);
        let mut drain_until: Option<Instant> = None;
        loop {
            if drain_until.is_none() && self.stop.load(Ordering::Acquire) {
                drain_until = Some(Instant::now() + Duration::from_secs(1));
            }
            if let Some(d) = drain_until
                && ((pending.is_empty() && posted == completed) || Instant::now() >= d)
            {
                break;
            }
            let n = self.cq.wait(&mut wcs, WAIT);
            for wc in &wcs[..n] {
                if wc.opcode != WcOpcode::Recv {
                    completed += 1;
                    if wc.status == WcStatus::Success {
                        s.replies += 1;
                    } else {
                        s.errors += 1;
                    }
                    continue;
                }
                if wc.status != WcStatus::Success {
                    s.errors += 1;
                    continue;
                }
                s.requests += 1;
                let slot = wc.wr_id as usize;
                let mut m = [0u8; REQUEST_LEN];
                let ok = self.requests.read(slot * REQUEST_LEN, &mut m).is_ok() && {
                    let (offset, len) = (u64_at(&m, 0) as usize, u64_at(&m, 1) as usize);
                    let t = Instant::now();
                    let ok = self.region.persist(offset, len).is_ok();
                    persist.record(t.elapsed().as_nanos() as u64);
                    ok
                };
                if !ok {
                    s.errors += 1;
                }
                pending.push_back([u64_at(&m, 2), if ok { 0 } else { 1 }]);
                // Answer at once, before the next request is persisted.
                self.answer(&mut pending, &mut posted, completed);
                repost.push(self.recv(slot));
            }
            if !repost.is_empty() {
                if let Err(full) = self.qp.post_recv(&repost) {
                    // Cannot happen (a receive is reposted only once consumed); counted.
                    s.errors += (repost.len() - full.posted) as u64;
                }
                repost.clear();
            }
            self.answer(&mut pending, &mut posted, completed);
        }
        s.persist_ns = persist.summary();
        s
    }

    /// Posts the pending answers that fit, each in an answer buffer no answer in flight uses.
    fn answer(&mut self, pending: &mut VecDeque<[u64; 2]>, posted: &mut u64, completed: u64) {
        while let Some(&[id, status]) = pending.front() {
            if *posted - completed >= REPLY_SLOTS as u64 {
                return;
            }
            let at = (*posted as usize % REPLY_SLOTS) * REPLY_LEN;
            let mut m = [0u8; REPLY_LEN];
            m[..8].copy_from_slice(&id.to_le_bytes());
            m[8..].copy_from_slice(&status.to_le_bytes());
            if self.replies.write(at, &m).is_err() {
                return;
            }
            let wr = WorkRequest::send(*posted, self.replies.sgl(at, REPLY_LEN as u32), None);
            if self.qp.post_send(&[wr]).is_err() {
                return;
            }
            pending.pop_front();
            *posted += 1;
        }
    }
}

/// Runs `bench persist` (called by [`super::run`]).
pub(super) fn run(opts: &BenchOpts, stop: Arc<AtomicBool>) -> Result<BenchSummary, AppError> {
    let Some(mode) = opts.mode else {
        return Err(usage(
            "--mode: `bench persist` needs one of durable, write-read, write-flush, write-send"
                .into(),
        ));
    };
    if !(MIN_SIZE..=MAX_SIZE).contains(&opts.size) {
        return Err(usage(format!(
            "--size: must be {MIN_SIZE}..={MAX_SIZE} bytes for `bench persist`"
        )));
    }
    if opts.qd == 0 || opts.qd > 120 {
        return Err(usage(
            "--qd: must be 1..=120 (two work requests per operation, the send queue holds 256)"
                .into(),
        ));
    }
    if opts.rate.is_some() {
        return Err(usage(
            "--rate: `bench persist` runs a closed loop only".into(),
        ));
    }
    if opts.verify {
        return Err(usage("--verify: not with `bench persist`".into()));
    }
    let size = opts.size as usize;
    let slots = (REGION_SPREAD / size).clamp(1, MAX_SLOTS).max(2 * opts.qd);
    let page = 4096;
    let region_len = (slots * size).div_ceil(page) * page;
    limits::check_memory(
        "--size",
        &format!("a region of {slots} slots of {size} bytes and a source as large"),
        2 * region_len as u64,
        MemoryLimit::read().as_ref(),
    )
    .map_err(|e| usage(e.to_string()))?;

    let mut qp = QpConfig::new(0, 0);
    qp.pmtu = opts.mtu;
    qp.max_send_wr = SEND_WR;
    qp.max_recv_wr = RECV_WR;
    // `--qd` operations outstanding in every mode: READ and FLUSH credits (16 by default, as
    // RNICs commonly offer) and the packet window must not be what holds write-read and
    // write-flush back at this depth.
    qp.max_rd_atomic = qp.max_rd_atomic.max(opts.qd as u32);
    let packets = opts.mtu.packets(opts.size) + 1;
    qp.max_in_flight = (opts.qd as u32 * packets).clamp(qp.max_in_flight, 1024);
    qp.timeout_ns = TIMEOUT_NS;
    qp.durable_timeout_ns = DURABLE_TIMEOUT_NS;
    qp.durable_writes = matches!(mode, PersistMode::Durable | PersistMode::DurableRegion);
    let tuning = (
        qp.max_rd_atomic,
        qp.max_in_flight,
        qp.timeout_ns,
        qp.durable_timeout_ns,
    );

    // The target's region: a file, made (or truncated) at the region's length.
    let temp = match &opts.file {
        Some(_) => None,
        None => Some(fresh_dir()?),
    };
    let path = match (&opts.file, &temp) {
        (Some(p), _) => p.clone(),
        (None, Some(dir)) => dir.0.join("region"),
        (None, None) => unreachable!("a directory is made when no file is given"),
    };
    let region_map = Arc::new(
        pmem::MapOptions::new()
            .emulate_pmem(opts.emulate_pmem)
            .create_file(&path, region_len)
            .map_err(|e| {
                AppError::Failed(format!("mapping {} as the region: {e}", path.display()))
            })?,
    );
    // Every block allocated and clean before the run, as in a pool made in advance: the run
    // measures writes into a file, not its growth.
    region_map
        .fill(0, region_len, 0)
        .and_then(|()| region_map.persist(0, region_len))
        .map_err(|e| AppError::Failed(format!("preparing {}: {e}", path.display())))?;
    let mapping = region_map.kind().to_string();
    let dax = region_map.is_dax();

    let Engines {
        memory,
        cores: (a, b),
        a: mut ea,
        b: eb,
        running,
        ..
    } = start_engines(opts, qp)?;
    let host = |e: portico::rdma::HostError| AppError::Failed(format!("host call: {e}"));
    let map = |len: usize| {
        Mapping::anonymous_prefer_huge(len)
            .map(Arc::new)
            .map_err(|e| AppError::Failed(format!("mapping {len} bytes of buffer memory: {e}")))
    };
    // The server persists by itself in write-send: the engine need not (GPSPM asks nothing
    // of the target's NIC). Every other mode needs the engine to persist what lands.
    let (access, access_name) = match mode {
        PersistMode::WriteSend => (Access::ALL, "ALL"),
        PersistMode::DurableRegion => (Access::ALL | Access::DURABLE, "ALL | DURABLE"),
        _ => (
            Access::ALL | Access::FLUSH_GLOBAL | Access::FLUSH_PERSISTENT,
            "ALL | FLUSH_GLOBAL | FLUSH_PERSISTENT",
        ),
    };
    let region = eb.engine.register_all(&region_map, access).map_err(host)?;
    let a_src = map(slots * size)?;
    a_src
        .fill(0, slots * size, 0x5a)
        .map_err(|e| AppError::Failed(format!("filling the source buffer: {e}")))?;
    let buffers = a_src.kind().to_string();
    let src = ea.engine.register_all(&a_src, Access::ALL).map_err(host)?;
    let back = ea
        .engine
        .register_all(&map(slots * 8)?, Access::LOCAL_WRITE)
        .map_err(host)?;
    let requests = ea
        .engine
        .register_all(&map(slots * REQUEST_LEN)?, Access::ALL)
        .map_err(host)?;
    let answers = ea
        .engine
        .register_all(&map(RECV_WR * REPLY_LEN)?, Access::LOCAL_WRITE)
        .map_err(host)?;

    // The write-send server, on its own thread (which starts on the host's core: EAL pinned
    // the main thread there, and threads inherit it).
    let server_stop = Arc::new(AtomicBool::new(false));
    let loopback::LoopbackEnd {
        engine: b_engine,
        qp: b_qp,
        cq: b_cq,
        ..
    } = eb;
    // B's queue pair and completion queue stay with the host until the engines stop, in the
    // modes that have no server to give them to.
    let mut idle_b = None;
    let server = if mode == PersistMode::WriteSend {
        let mut s = Server {
            qp: b_qp,
            cq: b_cq,
            region: region_map.clone(),
            requests: b_engine
                .register_all(&map(RECV_WR * REQUEST_LEN)?, Access::LOCAL_WRITE)
                .map_err(host)?,
            replies: b_engine
                .register_all(&map(REPLY_SLOTS * REPLY_LEN)?, Access::ALL)
                .map_err(host)?,
            stop: server_stop.clone(),
        };
        s.post_receives()?;
        Some(
            std::thread::Builder::new()
                .name("portico-server".into())
                .spawn(move || s.run())
                .map_err(|e| AppError::Failed(format!("starting the server thread: {e}")))?,
        )
    } else {
        idle_b = Some((b_qp, b_cq));
        None
    };

    human(
        opts.json,
        &format!(
            "bench persist, mode {}: {size} B writes, queue depth {}, MTU {}, {}; both engines on core {b}, host on core {a}\n  target region: {} at {}, dax: {dax}, {slots} slots ({region_len} B), registered {access_name}",
            mode.name(),
            opts.qd,
            opts.mtu.bytes(),
            opts.duration
                .map(|d| format!("{} s", d.as_secs_f64()))
                .unwrap_or_else(|| "until Ctrl-C".into()),
            mapping,
            path.display(),
        ),
    );

    let slot_of = |id: u64| id as usize % slots;
    let mut hist = Latency::new();
    // Outstanding operations by id modulo a power of two above the queue depth: (id, posted).
    let mask = (opts.qd * 2).next_power_of_two() - 1;
    let mut started: Vec<Option<(u64, Instant)>> = vec![None; mask + 1];
    let mut batch: Vec<WorkRequest> = Vec::with_capacity(2 * opts.qd);
    let mut recv_batch: Vec<RecvRequest> = Vec::with_capacity(RECV_WR);
    let answer_recv =
        |i: usize| RecvRequest::new(i as u64, answers.sgl(i * REPLY_LEN, REPLY_LEN as u32));
    if mode == PersistMode::WriteSend {
        recv_batch.extend((0..RECV_WR).map(answer_recv));
        ea.qp
            .post_recv(&recv_batch)
            .map_err(|e| AppError::Failed(format!("posting receives: {e}")))?;
        recv_batch.clear();
    }
    let final_opcode = mode.final_opcode();
    let flush_placement = Placement {
        global_visibility: false,
        persistence: true,
    };
    let mut wcs = [WorkCompletion::EMPTY; WCS_LEN];
    let (mut outstanding, mut wqes) = (0usize, 0usize);
    let (mut done, mut errors, mut next_id) = (0u64, 0u64, 0u64);
    let t0 = Instant::now();
    let mut end = opts.duration.and_then(|d| t0.checked_add(d));
    let (mut last_print, mut last_done) = (t0, 0u64);
    loop {
        let now = Instant::now();
        if stop.load(Ordering::Relaxed) && end.is_none_or(|e| e > now) {
            end = Some(now);
        }
        let ended = end.is_some_and(|e| now >= e);
        batch.clear();
        let first = next_id;
        while outstanding + ((next_id - first) as usize) < opts.qd && !ended {
            let id = next_id;
            let slot = slot_of(id);
            let off = slot * size;
            let remote = region.addr() + off as u64;
            let write = || {
                WorkRequest::write(
                    id << 1,
                    src.sgl(off, opts.size),
                    remote,
                    region.rkey(),
                    None,
                )
            };
            match mode {
                PersistMode::Durable => batch.push(WorkRequest::durable_write(
                    id << 1,
                    src.sgl(off, opts.size),
                    remote,
                    region.rkey(),
                    false,
                )),
                PersistMode::DurableRegion => batch.push(write()),
                PersistMode::WriteRead => {
                    batch.push(write());
                    batch.push(WorkRequest::read(
                        id << 1 | 1,
                        back.sgl(slot * 8, 8),
                        remote,
                        region.rkey(),
                    ));
                }
                PersistMode::WriteFlush => {
                    batch.push(write());
                    batch.push(WorkRequest::flush(
                        id << 1 | 1,
                        remote,
                        region.rkey(),
                        opts.size,
                        flush_placement,
                        Selectivity::MemoryRange,
                    ));
                }
                PersistMode::WriteSend => {
                    let mut m = [0u8; REQUEST_LEN];
                    m[..8].copy_from_slice(&(off as u64).to_le_bytes());
                    m[8..16].copy_from_slice(&(size as u64).to_le_bytes());
                    m[16..].copy_from_slice(&id.to_le_bytes());
                    requests
                        .write(slot * REQUEST_LEN, &m)
                        .map_err(|e| AppError::Failed(format!("writing a request: {e}")))?;
                    batch.push(write());
                    batch.push(WorkRequest::send(
                        id << 1 | 1,
                        requests.sgl(slot * REQUEST_LEN, REQUEST_LEN as u32),
                        None,
                    ));
                }
            }
            next_id += 1;
        }
        if !batch.is_empty() {
            let posted_at = Instant::now();
            super::post_batch(&mut ea.qp, &batch)?;
            for id in first..next_id {
                started[id as usize & mask] = Some((id, posted_at));
            }
            outstanding += (next_id - first) as usize;
            wqes += batch.len();
        }
        let n = if outstanding > 0 || wqes > 0 {
            ea.cq.wait(&mut wcs, WAIT)
        } else {
            0
        };
        let polled_at = Instant::now();
        for wc in &wcs[..n] {
            // The operation a completion belongs to, and whether it failed.
            let (id, failed) = if wc.opcode == WcOpcode::Recv {
                let i = wc.wr_id as usize;
                if wc.status != WcStatus::Success {
                    // Flushed: the queue pair failed, and its operations' requests say so.
                    continue;
                }
                let mut m = [0u8; REPLY_LEN];
                answers
                    .read(i * REPLY_LEN, &mut m)
                    .map_err(|e| AppError::Failed(format!("reading an answer: {e}")))?;
                recv_batch.push(answer_recv(i));
                (u64_at(&m, 0), u64_at(&m, 1) != 0)
            } else {
                wqes -= 1;
                (wc.wr_id >> 1, wc.status != WcStatus::Success)
            };
            let entry = &mut started[id as usize & mask];
            let Some((sid, t)) = *entry else { continue };
            if sid != id {
                continue;
            }
            if failed {
                if errors == 0 {
                    // The queue pair is in the error state: everything after fails as well.
                    human(
                        opts.json,
                        &format!(
                            "operation {id} failed: {:?} {:?}; stopping",
                            wc.opcode, wc.status
                        ),
                    );
                    end = Some(polled_at.min(end.unwrap_or(polled_at)));
                }
                errors += 1;
            } else if wc.opcode == final_opcode {
                hist.record(polled_at.saturating_duration_since(t).as_nanos() as u64);
                done += 1;
            } else {
                continue;
            }
            *entry = None;
            outstanding -= 1;
        }
        if !recv_batch.is_empty() {
            ea.qp
                .post_recv(&recv_batch)
                .map_err(|e| AppError::Failed(format!("posting receives: {e}")))?;
            recv_batch.clear();
        }
        if now.duration_since(last_print) >= Duration::from_secs(1) {
            let dt = now.duration_since(last_print).as_secs_f64();
            human(
                opts.json,
                &format!(
                    "[{:6.1}s] {:>12} ops/s  p50 so far {:>9.1} µs  outstanding {}",
                    now.duration_since(t0).as_secs_f64(),
                    report::rate((done - last_done) as f64 / dt, ""),
                    hist.percentile(50.0) as f64 / 1000.0,
                    outstanding
                ),
            );
            (last_print, last_done) = (now, done);
        }
        if ended && outstanding == 0 && wqes == 0 {
            break;
        }
        if end.is_some_and(|e| now.saturating_duration_since(e) >= GRACE) {
            errors += outstanding as u64;
            break;
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    server_stop.store(true, Ordering::Release);
    let server = match server {
        Some(t) => Some(
            t.join()
                .map_err(|_| AppError::Failed("the server thread panicked".into()))?,
        ),
        None => None,
    };
    let Stopped {
        workers,
        cores,
        ports,
        capture,
    } = running.finish(opts.pcap.as_ref())?;
    drop((b_engine, idle_b));
    if let Some(p) = &opts.hgrm {
        write_hgrm(p, &hist)?;
    }
    let per_op = |n: u64| {
        if done > 0 {
            n as f64 / done as f64
        } else {
            0.0
        }
    };
    let tx_bytes: u64 = ports.iter().map(|p| p.stats.tx_bytes).sum();
    let tx_packets: u64 = ports.iter().map(|p| p.stats.tx_packets).sum();
    let wire = (
        per_op(tx_packets),
        (tx_bytes > 0 || tx_packets == 0).then(|| per_op(tx_bytes)),
    );
    let results = if done > 0 {
        vec![OpResult {
            op: mode.name(),
            size: Some(opts.size),
            qd: Some(opts.qd),
            ops: done,
            ops_per_sec: done as f64 / seconds,
            gbit_per_sec: done as f64 * size as f64 * 8.0 / seconds / 1e9,
            latency_ns: hist.summary(),
        }]
    } else {
        Vec::new()
    };
    Ok(BenchSummary {
        plots: Vec::new(),
        op: opts.op,
        size: opts.size,
        qd: opts.qd,
        rate: None,
        seconds,
        memory,
        buffers,
        results,
        errors,
        verify: None,
        connections: 1,
        workers,
        cores,
        ports,
        capture,
        points: Vec::new(),
        interrupted: false,
        csv: None,
        server: None,
        host_threads: Vec::new(),
        inline: false,
        persist: Some(PersistSummary {
            mode,
            mapping,
            dax,
            file: path.display().to_string(),
            temporary: temp.is_some(),
            access: access_name,
            size: opts.size,
            qd: opts.qd,
            slots,
            region_bytes: region_len,
            max_rd_atomic: tuning.0,
            max_in_flight: tuning.1,
            timeout_ns: tuning.2,
            durable_timeout_ns: tuning.3,
            server,
            emulated_pmem: opts.emulate_pmem,
            wire_packets_per_op: wire.0,
            wire_bytes_per_op: wire.1,
        }),
    })
}

/// The human summary's persist lines.
pub(super) fn print(p: &PersistSummary) {
    println!(
        "  persist: mode {}, {} B, queue depth {}; target region: {} at {}{}, dax: {}, registered {}",
        p.mode.name(),
        p.size,
        p.qd,
        p.mapping,
        p.file,
        if p.temporary { " (removed)" } else { "" },
        p.dax,
        p.access
    );
    println!(
        "  queue pairs: max_rd_atomic {}, max_in_flight {}, timeout {} ms, durable timeout {} ms",
        p.max_rd_atomic,
        p.max_in_flight,
        p.timeout_ns as f64 / 1e6,
        p.durable_timeout_ns as f64 / 1e6
    );
    let bytes = p
        .wire_bytes_per_op
        .map_or("bytes not counted by the ports".to_string(), |b| {
            format!("{b:.0} bytes")
        });
    println!(
        "  on the wire: {:.2} frames per operation, {bytes} (both engines' transmits)",
        p.wire_packets_per_op
    );
    if let Some(s) = &p.server {
        let us = |ns: u64| ns as f64 / 1000.0;
        println!(
            "  server: {} requests persisted, {} answers, {} errors; persist µs p50 {:.1} p99 {:.1} max {:.1}",
            s.requests,
            s.replies,
            s.errors,
            us(s.persist_ns.p50),
            us(s.persist_ns.p99),
            us(s.persist_ns.max)
        );
    }
}
