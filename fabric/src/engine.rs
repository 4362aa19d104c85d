//! The process's one Portico engine under libfabric's objects, in safe Rust: started by the
//! first `fi_fabric`, it holds the engine ([`portico::peer::Peer`], with its connection
//! manager and tag port) and the provider's state behind one lock (`FI_THREAD_SAFE`): the
//! connections to peers, the operations in flight, the completion queues' entries, the
//! endpoints and address vectors. The FFI layer (`crate::ffi`) turns libfabric's calls into
//! calls of [`Engine`]'s methods, with buffers as addresses.
//!
//! - **Connections on first use.** A send or RMA to an address with no connection asks the
//!   CM to connect to the address's port and returns `-FI_EAGAIN`; the application retries
//!   (as it does on a full queue) and the operation goes once the connection is up. Each
//!   process sends on the connections it made and receives on those it accepted: two ranks
//!   that both send hold one connection each way, and no race between two crossing requests
//!   needs settling.
//! - **Tagged and untagged receives on the list-processing engine** (seed 001). Endpoint `n`
//!   owns the LPE endpoints `2n` (tagged) and `2n + 1` (untagged: every message of
//!   `fi_send` carries tag 0 and every `fi_recv` ignores all tag bits). A receive is an append
//!   to the priority list; messages nobody waits for land in the endpoint's overflow buffers
//!   and are claimed by a later receive; a directed receive names the sender's engine by its
//!   IPv4 address, which every tagged packet carries as its initiator.
//! - **Progress.** The workers move the data (`FI_PROGRESS_AUTO`); the provider's part, taking
//!   the engine's completions and events into the completion queues, runs in every CQ read.
//!   A thread of the provider serves the CM's events (accepting requests, marking connections
//!   up), so that a process that only waits is still reachable.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use pmem::Mapping;
use portico::lpe::{EndpointConfig, EndpointIndex, ListKind, Options};
use portico::peer::{self, Extras, Peer};
use portico::rdma::cm::{ConnEvent, QpTweak};
use portico::rdma::wake::{self, Wake};
use portico::rdma::{
    Cq, MemoryRegion, Qp, RdmaHandle, TagConfig, TagEntry, TagEvent, TagEventKind, TagPort,
};
use portico::transport::{Access, QpConfig, SgList, WcStatus, WorkCompletion, WorkRequest};

use crate::addr::{self, EpAddr};
use crate::flags;
use crate::info;
use crate::params::{self, Core, Settings};

/// libfabric error numbers the provider returns (positive; negated at the boundary).
pub mod err {
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const EINVAL: i32 = 22;
    pub const ENOSYS: i32 = 38;
    pub const EMSGSIZE: i32 = 90;
    pub const ECONNREFUSED: i32 = 111;
    pub const EHOSTUNREACH: i32 = 113;
    pub const ETIMEDOUT: i32 = 110;
    pub const EIO: i32 = 5;
    pub const EACCES: i32 = 13;
    pub const ENOENT: i32 = 2;
    pub const ENODATA: i32 = 61;
    pub const ENOMSG: i32 = 42;
    pub const EBUSY: i32 = 16;
    pub const ECANCELED: i32 = 125;
    pub const ENOTCONN: i32 = 107;
    pub const EISCONN: i32 = 106;
    pub const EADDRINUSE: i32 = 98;
    pub const EAVAIL: i32 = 259;
    pub const ETRUNC: i32 = 265;
    pub const EOTHER: i32 = 256;
}

/// How long a connection to a peer is retried (REJ: nobody listens yet; no ARP answer: the
/// link is not up yet; no REP) before an operation to it fails.
const CONNECT_FOR: Duration = Duration::from_secs(15);
/// A cookie with this bit names an overflow buffer, not a receive.
const OVERFLOW: u64 = 1 << 63;
/// A work request ID with this bit names a receive the provider keeps posted on an accepted
/// connection for the WRITEs with immediate (`fi_writedata`) that arrive on it: bits 16..48
/// the connection's ID, bits 0..16 the endpoint it was accepted for.
const IMM_RECV: u64 = 1 << 62;
/// Receives kept posted per accepted connection for WRITEs with immediate (a WRITE that finds
/// none is answered RNR, and the writer retries).
const IMM_RECVS: usize = 32;
/// Overflow buffers per list-processing endpoint.
const OVERFLOW_BUFFERS: usize = 4;
/// The queue pair configuration's rendezvous threshold: longer tagged sends are pulled by the
/// target from the sender's buffer, which must then be in a region with REMOTE_READ.
const RNDV_THRESHOLD: u32 = 16 * 1024;

/// The most iovecs a send or an RMA operation gathers (`tx_attr.iov_limit`).
pub const MAX_IOV: usize = 4;

/// One piece of a local buffer: its address, length, and the lkey of its descriptor (none:
/// the implicit local region).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Piece {
    pub addr: u64,
    pub len: usize,
    pub lkey: Option<u32>,
}

/// An operation's local buffer: up to [`MAX_IOV`] pieces (an iovec list), on the stack.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Iov {
    pieces: [Piece; MAX_IOV],
    n: usize,
}

impl Iov {
    /// One buffer.
    pub fn one(addr: u64, len: usize, lkey: Option<u32>) -> Iov {
        let mut v = Iov::default();
        v.pieces[0] = Piece { addr, len, lkey };
        v.n = 1;
        v
    }

    /// Appends a piece; `false` when [`MAX_IOV`] are there already.
    pub fn push(&mut self, p: Piece) -> bool {
        if self.n == MAX_IOV {
            return false;
        }
        self.pieces[self.n] = p;
        self.n += 1;
        true
    }

    pub fn pieces(&self) -> &[Piece] {
        &self.pieces[..self.n]
    }

    /// The bytes of every piece together.
    pub fn total(&self) -> usize {
        self.pieces().iter().map(|p| p.len).sum()
    }

    /// The first piece's address (what a completion's `buf` names).
    pub fn addr(&self) -> u64 {
        self.pieces().first().map_or(0, |p| p.addr)
    }
}

/// One completion as libfabric's widest format has it, plus the error when there is one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Completion {
    pub context: u64,
    pub flags: u64,
    pub len: u64,
    pub buf: u64,
    pub data: u64,
    pub tag: u64,
    /// The sender's engine, for `fi_cq_readfrom` (0: unknown).
    pub source: u32,
    /// A failed operation: the error (positive `FI_E*`), bytes left over, the engine's status.
    pub error: Option<(i32, u64, i32)>,
}

/// A completion queue's entries.
#[derive(Default)]
pub struct CqState {
    pub entries: VecDeque<Completion>,
}

/// What an operation in flight becomes when the engine completes it.
#[derive(Debug, Clone)]
pub(crate) struct Op {
    pub(crate) context: u64,
    /// The completion queue to tell, if the operation asked for a completion.
    pub(crate) cq: Option<usize>,
    pub(crate) flags: u64,
    pub(crate) buf: u64,
    pub(crate) len: u64,
    /// A slot of the inject buffer to give back.
    pub(crate) inject: Option<usize>,
    /// A registration made for this operation only (a rendezvous send from unregistered
    /// memory), taken back when it completes.
    pub(crate) temp: Option<MemoryRegion>,
    /// A rendezvous send of several iovecs, gathered here (the target pulls one piece).
    pub(crate) bounce: Option<Vec<u8>>,
    /// What a tagged probe (`FI_PEEK`) is at.
    pub(crate) peek: Peek,
    /// A receive posted to this list-processing endpoint (`fi_cancel` unlinks it there).
    pub(crate) lpe: Option<u16>,
}

/// The stages of `fi_trecvmsg` with `FI_PEEK` (and `FI_CLAIM`, `FI_DISCARD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peek {
    /// Not a probe.
    No,
    /// The search of the endpoint's unexpected list is under way (`lpe`'s); with `claim`, a
    /// found message is then taken (`discard`: and dropped).
    Search {
        lpe: u16,
        claim: bool,
        discard: bool,
    },
    /// The found message is being taken into the provider's buffer for the later `FI_CLAIM`
    /// receive of the same context.
    Claiming { discard: bool },
}

/// A message `FI_PEEK | FI_CLAIM` took, waiting for the `FI_CLAIM` receive of its context.
#[derive(Debug, Default)]
pub(crate) struct Claimed {
    /// Its bytes (the provider's buffer, where the engine placed them).
    data: Vec<u8>,
    /// Whether they are all there (the peek has completed).
    ready: bool,
    len: u64,
    tag: u64,
    hdr_data: u64,
    source: u32,
}

/// An endpoint's bindings.
#[derive(Debug, Clone, Default)]
pub struct EpState {
    pub index: u16,
    pub tx_cq: Option<usize>,
    pub rx_cq: Option<usize>,
    /// `FI_SELECTIVE_COMPLETION` on the binding: only operations with `FI_COMPLETION` complete.
    pub tx_selective: bool,
    pub rx_selective: bool,
    pub av: Option<usize>,
    pub enabled: bool,
    pub tx_op_flags: u64,
    pub rx_op_flags: u64,
    /// `FI_DIRECTED_RECV`: a receive's source address is honoured (else ignored).
    pub directed: bool,
    /// An `FI_EP_MSG` endpoint: one connection, plain SENDs and receives on its queue pair
    /// (`crate::msg`).
    pub msg: bool,
    /// Its event queue (connection events).
    pub eq: Option<usize>,
    /// The `fid` libfabric knows it by (events name it).
    pub fid: u64,
    /// The connection request it was opened for (`fi_endpoint` with `info->handle`), to accept.
    pub connreq: Option<u32>,
    /// Its connection's ID, once connecting or accepted.
    pub conn: Option<u32>,
    /// Its traffic class (`tx_attr.tclass`, else the domain's; `crate::tclass`): RDM
    /// endpoints of different classes reach a peer over queue pairs of their own.
    pub tclass: u32,
}

/// An address vector: `fi_addr_t` is the index (for `FI_AV_TABLE` and `FI_AV_MAP` alike).
#[derive(Debug, Default)]
pub struct AvState {
    pub addrs: Vec<Option<EpAddr>>,
}

/// Where an operation goes.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// A peer endpoint, over the connection of this traffic class.
    Peer(EpAddr, u32),
    Connection,
}

/// A connection this process made: to a peer endpoint's (IP, port), in a traffic class.
type ConnKey = (Ipv4Addr, u16, u32);

enum Conn {
    Connecting,
    Up(Qp),
    Failed(i32),
}

/// The provider's state, behind the engine's lock.
pub struct State {
    cq: Cq,
    tags: TagPort,
    /// Connections this process made, by the peer endpoint's (IP, port) and traffic class.
    conns: HashMap<ConnKey, Conn>,
    /// Connection IDs of those connections.
    ids: HashMap<u32, ConnKey>,
    /// When the first attempt to reach a peer was made (connections are retried until
    /// [`CONNECT_FOR`] has passed).
    first_try: HashMap<ConnKey, std::time::Instant>,
    /// Connections accepted (their queue pairs receive; they are kept until they end), and
    /// the endpoint each was accepted for (its port's).
    accepted: HashMap<u32, (Option<Qp>, u16)>,
    ops: Vec<Option<Op>>,
    free_ops: Vec<usize>,
    pub cqs: Vec<Option<CqState>>,
    pub eps: Vec<Option<EpState>>,
    pub avs: Vec<Option<AvState>>,
    /// Ports this engine listens on (endpoints enabled).
    listening: Vec<u16>,
    inject_free: Vec<usize>,
    /// Overflow buffers appended per list-processing endpoint (posted once per enable).
    overflow_posted: Vec<bool>,
    /// Event queues, passive endpoints, and the message endpoints' connections
    /// (`crate::msg`).
    pub(crate) eqs: Vec<Option<crate::msg::EqState>>,
    pub(crate) peps: Vec<Option<crate::msg::PepState>>,
    pub(crate) msg_qps: HashMap<usize, Qp>,
    pub(crate) msg_conns: HashMap<u32, usize>,
    pub(crate) pending_recvs: HashMap<usize, Vec<portico::transport::RecvRequest>>,
    /// Messages claimed by `FI_PEEK | FI_CLAIM`, by the probe's context.
    claims: HashMap<u64, Claimed>,
    /// Per LPE endpoint: claiming searches under way, and the receives the application posted
    /// meanwhile, held back until the claimed message is taken (so that none takes it first).
    claiming: Vec<(u32, VecDeque<TagEntry>)>,
}

/// The process's engine.
pub struct Engine {
    pub settings: Settings,
    pub(crate) handle: RdmaHandle,
    /// Every local buffer, registered for local access: the whole address space (see
    /// [`info::MR_MODE`]).
    implicit: MemoryRegion,
    state: Mutex<State>,
    /// The bytes `fi_inject` copies into: [`info::QUEUE_SIZE`] slots of
    /// [`info::INJECT_SIZE`].
    inject: Arc<Mapping>,
    /// Overflow buffers: one mapping, [`OVERFLOW_BUFFERS`] per LPE endpoint.
    overflow: MemoryRegion,
    overflow_slot: usize,
    borrow: Borrow,
    stop: Arc<AtomicBool>,
    cm_events: portico::rdma::cm::CmEvents,
    cm_thread: Mutex<Option<JoinHandle<()>>>,
    /// The worker → host wake-ups of the engine's completion queue and tag port: what
    /// `fi_cq_sread` sleeps on and an `FI_WAIT_FD` descriptor polls.
    wakes: [Arc<Wake>; 2],
    /// Threads asleep in [`Engine::wait`] now.
    waiters: std::sync::atomic::AtomicUsize,
    /// Kept alive: the runtime, the port, queue pair 0 (the template).
    _peer: Mutex<Peer>,
}

/// Why the engine did not start: a parameter (exit code 2 in a command) or the run time.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Param(#[from] params::ParamError),
    #[error("the provider is not configured: set FI_PORTICO_DEV and FI_PORTICO_IP")]
    NotConfigured,
    #[error("{0}")]
    Failed(String),
}

static ENGINE: Mutex<Option<Arc<Engine>>> = Mutex::new(None);

/// Makes a [`Mapping`] of the application's own memory (`len` bytes at an address; with a
/// path, a shared mapping of that file, persisted by `msync`), under libfabric's registration
/// contract: the FFI layer's, where that promise is made.
pub type Borrow = fn(usize, usize, Option<std::path::PathBuf>) -> Result<Arc<Mapping>, String>;

/// The running engine, if one was started.
pub fn running() -> Option<Arc<Engine>> {
    ENGINE.lock().ok()?.clone()
}

/// The process's engine: the running one, or one started now with `settings`.
/// `around_eal` runs EAL's start (it restores the thread's CPU affinity, which EAL changes).
pub fn get_or_start(
    settings: &Settings,
    borrow: Borrow,
    around_eal: impl FnOnce(&mut dyn FnMut() -> Result<(), String>) -> Result<(), String>,
) -> Result<Arc<Engine>, StartError> {
    let mut slot = ENGINE
        .lock()
        .map_err(|_| StartError::Failed("the engine's lock is poisoned".into()))?;
    if let Some(e) = slot.as_ref() {
        return Ok(e.clone());
    }
    let engine = Arc::new(Engine::start(settings, borrow, around_eal)?);
    let weak = Arc::downgrade(&engine);
    let stop = engine.stop.clone();
    {
        let events = engine.cm_events.clone();
        let t = std::thread::Builder::new()
            .name("portico-fi-cm".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Some(ev) = events.wait(Duration::from_millis(100)) else {
                        continue;
                    };
                    let Some(engine) = weak.upgrade() else { break };
                    engine.on_cm_event(ev);
                }
            })
            .map_err(|e| StartError::Failed(format!("starting the CM thread: {e}")))?;
        *engine.cm_thread.lock().unwrap() = Some(t);
    }
    *slot = Some(engine.clone());
    Ok(engine)
}

/// The engine's config, as a `portico target` config file would say it.
fn config_text(s: &Settings, core: usize) -> String {
    let eal: Vec<String> = s.eal.iter().map(|a| format!("{a:?}")).collect();
    // Every process gets its own EAL run-time directory: MPI ranks start EAL side by side.
    format!(
        "[eal]\nargs = [\"--file-prefix=portico-fi-{pid}\", {eal}]\n\n\
         [rdma]\nport = {dev:?}\ncore = {core}\nmac = \"{mac}\"\nip = \"{ip}\"\n\
         qpn = 0x10\npeer_mac = \"02:00:00:00:00:01\"\npeer_ip = \"192.0.2.1\"\npeer_qpn = 0x10\n\
         mtu = {mtu}\nregion_len = 4096\n\n[runtime]\npolling = \"{polling}\"\nmax_sleep_us = {sleep}\n\n{shaper}\n",
        pid = std::process::id(),
        shaper = s.shaper.as_ref().map_or("", |sh| sh.text.as_str()),
        eal = eal.join(", "),
        dev = s.dev,
        mac = s.mac_text(),
        ip = s.ip,
        mtu = s.mtu,
        polling = if s.adaptive { "adaptive" } else { "busy" },
        sleep = s.max_sleep_us,
    )
}

impl Engine {
    fn start(
        s: &Settings,
        borrow: Borrow,
        around_eal: impl FnOnce(&mut dyn FnMut() -> Result<(), String>) -> Result<(), String>,
    ) -> Result<Engine, StartError> {
        let cores = portico::app::available_cores();
        let core = match s.core {
            Core::Fixed(c) => c,
            Core::Auto => params::auto_core(&cores, params::local_rank(|v| std::env::var(v).ok()))
                .ok_or_else(|| StartError::Failed("no core to run the worker on".into()))?,
        };
        let text = config_text(s, core);
        let cfg = portico::config::peer::parse_peer(&text, &cores).map_err(|e| {
            StartError::Failed(format!(
                "the engine's configuration (from FI_PORTICO_*): {e}"
            ))
        })?;
        let fail = |e: portico::app::AppError| StartError::Failed(e.to_string());
        let plan = peer::plan(&cfg, &[core], &[]).map_err(fail)?;
        let mut started = None;
        around_eal(&mut || {
            started = Some(portico::dataplane::Eal::init(&plan.0).map_err(|e| e.to_string()));
            Ok(())
        })
        .map_err(StartError::Failed)?;
        match started {
            Some(Ok(_)) => {}
            Some(Err(e)) if e.contains("already") => {}
            Some(Err(e)) => return Err(StartError::Failed(format!("EAL: {e}"))),
            None => return Err(StartError::Failed("EAL was not started".into())),
        }
        let my_ip = s.ip;
        let tweak = move |qp: &mut QpConfig| {
            qp.tagged = true;
            qp.tag_rank = addr::initiator(my_ip);
            qp.rndv_threshold = RNDV_THRESHOLD;
            qp.max_send_wr = info::QUEUE_SIZE;
            qp.max_recv_wr = 64;
            // Both ends are Portico: FI_COMMIT_COMPLETE writes are durable WRITEs (seed 004).
            qp.durable_writes = true;
        };
        let lpe_endpoints = s.endpoints * 2;
        let tags = TagConfig {
            endpoints: (0..lpe_endpoints)
                .map(|i| (EndpointIndex(i), EndpointConfig::default()))
                .collect(),
            quiet: true,
            ..TagConfig::default()
        };
        let extras = Extras {
            qp: Some(&tweak),
            tags: Some(tags),
            cm: true,
        };
        let mut peer = peer::start_engine(Path::new("FI_PORTICO_*"), &cfg, &[core], None, &extras)
            .map_err(fail)?;
        let (cm_events, cq) = peer
            .cm
            .take()
            .ok_or_else(|| StartError::Failed("the engine started without its CM".into()))?;
        let tag_port = peer
            .tags
            .take()
            .ok_or_else(|| StartError::Failed("the engine started without its tag port".into()))?;
        let handle = std::mem::replace(&mut peer.handle, RdmaHandle::new().0);
        let wakes = [cq.events(), tag_port.events()];
        // The whole address space, for local access only: 4 KiB up to 2^47.
        let all = borrow(4096, (1usize << 47) - 8192, None)
            .map_err(|e| StartError::Failed(format!("the local region: {e}")))?;
        let implicit = handle
            .register_all(&all, Access::LOCAL_WRITE)
            .map_err(|e| StartError::Failed(format!("registering the local region: {e}")))?;
        let inject = Arc::new(
            Mapping::anonymous(info::QUEUE_SIZE * info::INJECT_SIZE)
                .map_err(|e| StartError::Failed(format!("the inject buffer: {e}")))?,
        );
        let overflow_slot = s.overflow_bytes / OVERFLOW_BUFFERS;
        let overflow_map = Arc::new(
            Mapping::anonymous(s.overflow_bytes * lpe_endpoints as usize)
                .map_err(|e| StartError::Failed(format!("the overflow buffers: {e}")))?,
        );
        let overflow = handle
            .register_all(&overflow_map, Access::LOCAL_WRITE)
            .map_err(|e| StartError::Failed(format!("registering the overflow buffers: {e}")))?;
        let state = State {
            cq,
            tags: tag_port,
            conns: HashMap::new(),
            ids: HashMap::new(),
            first_try: HashMap::new(),
            accepted: HashMap::new(),
            ops: Vec::with_capacity(4 * info::QUEUE_SIZE),
            free_ops: Vec::with_capacity(4 * info::QUEUE_SIZE),
            cqs: Vec::new(),
            eps: Vec::new(),
            avs: Vec::new(),
            listening: Vec::new(),
            inject_free: (0..info::QUEUE_SIZE).rev().collect(),
            overflow_posted: vec![false; lpe_endpoints as usize],
            eqs: Vec::new(),
            peps: Vec::new(),
            msg_qps: HashMap::new(),
            msg_conns: HashMap::new(),
            pending_recvs: HashMap::new(),
            claims: HashMap::new(),
            claiming: (0..lpe_endpoints).map(|_| (0, VecDeque::new())).collect(),
        };
        Ok(Engine {
            settings: s.clone(),
            handle,
            implicit,
            state: Mutex::new(state),
            inject,
            overflow,
            overflow_slot,
            borrow,
            stop: Arc::new(AtomicBool::new(false)),
            cm_events,
            cm_thread: Mutex::new(None),
            wakes,
            waiters: std::sync::atomic::AtomicUsize::new(0),
            _peer: Mutex::new(peer),
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Endpoint `index`'s address.
    pub fn ep_addr(&self, index: u16) -> EpAddr {
        EpAddr {
            ip: self.settings.ip,
            port: self.settings.port + index,
            index,
        }
    }

    // ---- objects --------------------------------------------------------------------

    pub fn cq_open(&self) -> usize {
        let mut st = self.lock();
        put(&mut st.cqs, CqState::default())
    }

    pub fn cq_close(&self, id: usize) {
        let mut st = self.lock();
        if let Some(c) = st.cqs.get_mut(id) {
            *c = None;
        }
        for ep in st.eps.iter_mut().flatten() {
            if ep.tx_cq == Some(id) {
                ep.tx_cq = None;
            }
            if ep.rx_cq == Some(id) {
                ep.rx_cq = None;
            }
        }
    }

    pub fn av_open(&self) -> usize {
        put(&mut self.lock().avs, AvState::default())
    }

    pub fn av_close(&self, id: usize) {
        if let Some(a) = self.lock().avs.get_mut(id) {
            *a = None;
        }
    }

    /// Inserts addresses; returns their `fi_addr_t`s (`None` for one that is not an address).
    pub fn av_insert(&self, id: usize, addrs: &[Option<EpAddr>]) -> Vec<Option<u64>> {
        let mut st = self.lock();
        let Some(Some(av)) = st.avs.get_mut(id) else {
            return vec![None; addrs.len()];
        };
        addrs
            .iter()
            .map(|a| {
                a.map(|a| {
                    av.addrs.push(Some(a));
                    (av.addrs.len() - 1) as u64
                })
            })
            .collect()
    }

    pub fn av_remove(&self, id: usize, fi_addr: u64) -> bool {
        let mut st = self.lock();
        match st.avs.get_mut(id).and_then(|a| a.as_mut()) {
            Some(av) => match av.addrs.get_mut(fi_addr as usize) {
                Some(slot @ Some(_)) => {
                    *slot = None;
                    true
                }
                _ => false,
            },
            None => false,
        }
    }

    pub fn av_lookup(&self, id: usize, fi_addr: u64) -> Option<EpAddr> {
        let st = self.lock();
        st.avs
            .get(id)?
            .as_ref()?
            .addrs
            .get(fi_addr as usize)
            .copied()
            .flatten()
    }

    /// Opens endpoint `index` (a free one when `None`); returns its id, or `None` when every
    /// endpoint the settings allow is open.
    pub fn ep_open(
        &self,
        tx_op_flags: u64,
        rx_op_flags: u64,
        directed: bool,
        tclass: u32,
    ) -> Option<usize> {
        let mut st = self.lock();
        let used: Vec<u16> = st.eps.iter().flatten().map(|e| e.index).collect();
        let index = (0..self.settings.endpoints).find(|i| !used.contains(i))?;
        Some(put(
            &mut st.eps,
            EpState {
                index,
                tx_op_flags,
                rx_op_flags,
                directed,
                tclass,
                ..EpState::default()
            },
        ))
    }

    pub fn ep_bind_cq(&self, ep: usize, cq: usize, flags: u64) -> Result<(), i32> {
        let mut st = self.lock();
        slot(&st.cqs, cq)?;
        let e = slot_mut(&mut st.eps, ep)?;
        if flags & (flags::TRANSMIT | flags::RECV) == 0 {
            return Err(err::EINVAL);
        }
        let selective = flags & flags::SELECTIVE_COMPLETION != 0;
        if flags & flags::TRANSMIT != 0 {
            e.tx_cq = Some(cq);
            e.tx_selective = selective;
        }
        if flags & flags::RECV != 0 {
            e.rx_cq = Some(cq);
            e.rx_selective = selective;
        }
        Ok(())
    }

    pub fn ep_bind_av(&self, ep: usize, av: usize) -> Result<(), i32> {
        let mut st = self.lock();
        slot(&st.avs, av)?;
        let e = slot_mut(&mut st.eps, ep)?;
        e.av = Some(av);
        Ok(())
    }

    /// Enables the endpoint: listens on its port and gives its list-processing endpoints
    /// their overflow buffers.
    pub fn ep_enable(&self, ep: usize) -> Result<(), String> {
        let index = {
            let mut st = self.lock();
            let e = st
                .eps
                .get_mut(ep)
                .and_then(|e| e.as_mut())
                .ok_or("no such endpoint")?;
            if e.msg {
                // A message endpoint needs no address vector: its peer is its connection.
                e.enabled = true;
                return Ok(());
            }
            if e.av.is_none() {
                return Err("no address vector bound (fi_ep_bind with an AV first)".into());
            }
            if e.enabled {
                return Ok(());
            }
            e.index
        };
        let port = self.settings.port + index;
        let first = !self.lock().listening.contains(&port);
        if first {
            self.handle
                .listen(port)
                .map_err(|e| format!("listening on rdma_cm port {port}: {e}"))?;
        }
        let mut st = self.lock();
        if first {
            st.listening.push(port);
        }
        for lpe in [index * 2, index * 2 + 1] {
            if !st.overflow_posted[lpe as usize] {
                for b in 0..OVERFLOW_BUFFERS {
                    self.append_overflow(&mut st, lpe, b)
                        .map_err(|_| "the tag port's command ring is full".to_string())?;
                }
                st.overflow_posted[lpe as usize] = true;
            }
        }
        if let Some(Some(e)) = st.eps.get_mut(ep) {
            e.enabled = true;
        }
        Ok(())
    }

    pub fn ep_close(&self, ep: usize) {
        let mut st = self.lock();
        let Some(slot) = st.eps.get_mut(ep) else {
            return;
        };
        let gone = slot.take();
        if let Some(e) = gone.as_ref().filter(|e| !e.msg) {
            self.cancel_all(&mut st, e.index);
        }
        let last_rdm =
            gone.as_ref().is_some_and(|e| !e.msg) && !st.eps.iter().flatten().any(|e| !e.msg);
        // The RDM endpoints' connections are the engine's, shared by them: the last one to
        // close ends them all (DREQ; the peers see their queue pairs go).
        let ends: Vec<u32> = if last_rdm {
            st.conns.clear();
            st.first_try.clear();
            let mut ids: Vec<u32> = st.ids.drain().map(|(id, _)| id).collect();
            ids.extend(st.accepted.drain().map(|(id, _)| id));
            ids
        } else {
            Vec::new()
        };
        drop(st);
        for id in ends {
            let _ = self.handle.disconnect(id);
        }
        if let Some(e) = gone.filter(|e| e.msg) {
            self.msg_ep_closed(ep, e.conn);
        }
    }

    /// `fi_cancel`: the first receive of endpoint `ep` posted with `context` and still on its
    /// list is unlinked by the worker and completes with `FI_ECANCELED` (one that has matched
    /// meanwhile completes as usual). `ENOENT` when no receive has that context.
    pub fn cancel(&self, ep: usize, context: u64) -> Result<(), i32> {
        let mut st = self.lock();
        let e = slot(&st.eps, ep)?.clone();
        if e.msg {
            // A receive on a queue pair cannot be taken back (as in verbs).
            return Err(err::ENOSYS);
        }
        let mine = [e.index * 2, e.index * 2 + 1];
        let found = st.ops.iter().enumerate().find_map(|(i, o)| {
            o.as_ref()
                .filter(|o| o.context == context && o.lpe.is_some_and(|l| mine.contains(&l)))
                .map(|o| (i, o.lpe.unwrap_or_default()))
        });
        let (id, lpe) = found.ok_or(err::ENOENT)?;
        st.tags.cancel(lpe, id as u64).map_err(|_| err::EAGAIN)
    }

    /// The receives still posted for endpoint `index` are unlinked (its close): none may
    /// place data into a buffer the application frees after closing the endpoint.
    fn cancel_all(&self, st: &mut State, index: u16) {
        let mine = [index * 2, index * 2 + 1];
        let pending: Vec<(usize, u16)> = st
            .ops
            .iter()
            .enumerate()
            .filter_map(|(i, o)| {
                o.as_ref()
                    .and_then(|o| o.lpe)
                    .filter(|l| mine.contains(l))
                    .map(|l| (i, l))
            })
            .collect();
        for (id, lpe) in pending {
            if st.tags.cancel(lpe, id as u64).is_err() {
                log_warn("closing an endpoint: the tag port's command ring is full");
            }
        }
        for lpe in mine {
            if let Some(c) = st.claiming.get_mut(lpe as usize) {
                *c = (0, VecDeque::new());
            }
        }
    }

    fn append_overflow(&self, st: &mut State, lpe: u16, b: usize) -> Result<(), ()> {
        let at = (lpe as usize * OVERFLOW_BUFFERS + b) * self.overflow_slot;
        let entry = TagEntry::recv(
            0,
            self.overflow.sge(at, self.overflow_slot as u32),
            OVERFLOW | u64::from(lpe) << 8 | b as u64,
        )
        .with_ignore(u64::MAX)
        .with_options(Options::MANAGE_LOCAL)
        .with_min_free(u64::from(RNDV_THRESHOLD) + 64);
        st.tags
            .append(lpe, ListKind::Overflow, entry)
            .map_err(|_| ())
    }

    // ---- memory ------------------------------------------------------------------------

    /// Registers `len` bytes at `addr` (the application's memory) with libfabric access bits.
    pub fn mr_reg(&self, addr: usize, len: usize, access: u64) -> Result<MemoryRegion, String> {
        let mut a = Access::LOCAL_WRITE;
        // A send buffer may be the source of a rendezvous: the target pulls it (READ).
        if access == 0 || access & (flags::SEND | flags::REMOTE_READ) != 0 {
            a = a | Access::REMOTE_READ;
        }
        if access == 0 || access & flags::REMOTE_WRITE != 0 {
            a = a | Access::REMOTE_WRITE;
        }
        // A region remote writes may reach is the target of durable WRITEs
        // (FI_COMMIT_COMPLETE): in a shared file mapping, they are made durable by msync.
        let file = if a.contains(Access::REMOTE_WRITE) {
            crate::maps::shared_file_now(addr as u64, len as u64)
        } else {
            None
        };
        if file.is_some() {
            // Durable WRITEs may name it; plain WRITEs into it are persisted in the
            // background (a READ waits for them), as IBV_ACCESS_FLUSH_PERSISTENT says.
            a = a | Access::FLUSH_PERSISTENT;
        }
        if let Some(f) = &file {
            trace(|| {
                format!(
                    "{len} bytes at {addr:#x} are a shared mapping of {}: durable WRITEs msync them",
                    f.display()
                )
            });
        }
        let map = (self.borrow)(addr, len, file)?;
        self.handle.register_all(&map, a).map_err(|e| e.to_string())
    }

    pub fn mr_close(&self, mr: MemoryRegion) -> Result<(), String> {
        self.handle.deregister(mr).map_err(|e| e.to_string())
    }

    // ---- operations --------------------------------------------------------------------

    pub(crate) fn new_op(st: &mut State, op: Op) -> usize {
        match st.free_ops.pop() {
            Some(i) => {
                st.ops[i] = Some(op);
                i
            }
            None => {
                st.ops.push(Some(op));
                st.ops.len() - 1
            }
        }
    }

    pub(crate) fn take_op(st: &mut State, i: usize) -> Option<Op> {
        let op = st.ops.get_mut(i)?.take()?;
        st.free_ops.push(i);
        Some(op)
    }

    /// The queue pair to `dest`, or why there is none yet (`EAGAIN` while connecting: a
    /// connection was asked for).
    fn qp_to<'a>(&self, st: &'a mut State, dest: EpAddr, tclass: u32) -> Result<&'a mut Qp, i32> {
        let key = (dest.ip, dest.port, tclass);
        match st.conns.get(&key) {
            Some(Conn::Up(_)) => {}
            Some(Conn::Connecting) => return Err(err::EAGAIN),
            Some(Conn::Failed(e)) => {
                // A peer that is not listening yet (its endpoint not enabled), or whose link
                // is not up yet (ARP unanswered), is asked again until CONNECT_FOR has passed
                // since the first try; then the failure is the operation's.
                let e = *e;
                let first = st.first_try.get(&key).copied();
                if first.is_some_and(|t| t.elapsed() < CONNECT_FOR) {
                    self.connect(st, key)?;
                    return Err(err::EAGAIN);
                }
                st.conns.remove(&key);
                st.first_try.remove(&key);
                return Err(e);
            }
            None => {
                trace(|| format!("connecting to {}", dest.to_text()));
                st.first_try.insert(key, std::time::Instant::now());
                self.connect(st, key)?;
                return Err(err::EAGAIN);
            }
        }
        match st.conns.get_mut(&key) {
            Some(Conn::Up(qp)) => Ok(qp),
            _ => Err(err::EAGAIN),
        }
    }

    fn connect(&self, st: &mut State, key: ConnKey) -> Result<(), i32> {
        let classes = self
            .settings
            .shaper
            .as_ref()
            .map_or(&[][..], |s| &s.classes[..]);
        let (traffic_class, dscp) = crate::tclass::place(key.2, classes);
        let tweak = QpTweak {
            traffic_class,
            dscp,
            ..QpTweak::default()
        };
        trace(|| {
            format!(
                "connection to {}:{} in tclass {:#x} ({}): shaper class {traffic_class:?}, dscp {dscp:?}",
                key.0,
                key.1,
                key.2,
                crate::tclass::name(key.2).unwrap_or_else(|| "unspecified".into())
            )
        });
        let id = self
            .handle
            .connect_with(key.0, key.1, &[], tweak)
            .map_err(|_| err::EAGAIN)?;
        st.conns.insert(key, Conn::Connecting);
        st.ids.insert(id, key);
        Ok(())
    }

    /// Where an endpoint's operation goes: the peer an address names (RDM), or the
    /// endpoint's connection (MSG).
    fn target(st: &State, e: &EpState, fi_addr: u64) -> Result<Target, i32> {
        if e.msg {
            Ok(Target::Connection)
        } else {
            Self::dest(st, e, fi_addr).map(|d| Target::Peer(d, e.tclass))
        }
    }

    fn qp_for<'a>(&self, st: &'a mut State, ep: usize, target: Target) -> Result<&'a mut Qp, i32> {
        match target {
            Target::Peer(dest, tclass) => self.qp_to(st, dest, tclass),
            Target::Connection => st.msg_qps.get_mut(&ep).ok_or(err::ENOTCONN),
        }
    }

    /// The sender a receive from `src` accepts (its engine's rank, the initiator of its tag
    /// headers): `None` for anyone (`FI_ADDR_UNSPEC`, or an endpoint without
    /// `FI_DIRECTED_RECV`).
    fn source(st: &State, e: &EpState, src: u64) -> Result<Option<u32>, i32> {
        if src == flags::ADDR_UNSPEC || !e.directed {
            return Ok(None);
        }
        Ok(Some(addr::initiator(Self::dest(st, e, src)?.ip)))
    }

    fn dest(st: &State, ep: &EpState, fi_addr: u64) -> Result<EpAddr, i32> {
        let av = ep.av.ok_or(err::EINVAL)?;
        st.avs
            .get(av)
            .and_then(|a| a.as_ref())
            .and_then(|a| a.addrs.get(fi_addr as usize).copied().flatten())
            .ok_or(err::EINVAL)
    }

    /// A send (`tagged`: `fi_tsend`; else `fi_send`) of `len` bytes at `buf`, or an inject of
    /// `inline` (its bytes copied). `lkey`: the descriptor's region, else the implicit one.
    #[allow(clippy::too_many_arguments)]
    pub fn send(
        &self,
        ep: usize,
        io: &Iov,
        dest: u64,
        tag: u64,
        data: Option<u64>,
        context: u64,
        op_flags: u64,
        inline: Option<&[u8]>,
    ) -> Result<(), i32> {
        let tagged = op_flags & flags::TAGGED != 0;
        let len = io.total();
        let buf = io.addr();
        if len as u64 > info::MAX_MSG_SIZE {
            return Err(err::EMSGSIZE);
        }
        let mut st = self.lock();
        let e = slot(&st.eps, ep)?.clone();
        if !e.enabled {
            return Err(err::EINVAL);
        }
        let target = Self::target(&st, &e, dest)?;
        // Connect first: nothing below is spent on an operation that must be retried.
        self.qp_for(&mut st, ep, target)?;
        let mut op = Op {
            context,
            cq: None,
            flags: flags::SEND | if tagged { flags::TAGGED } else { flags::MSG },
            buf,
            len: len as u64,
            inject: None,
            temp: None,
            bounce: None,
            peek: Peek::No,
            lpe: None,
        };
        let wants = inline.is_none()
            && (!e.tx_selective
                || op_flags & flags::COMPLETION != 0
                || e.tx_op_flags & flags::COMPLETION != 0);
        if wants {
            op.cq = e.tx_cq;
        }
        let sgl = match inline {
            Some(bytes) => {
                let slot = st.inject_free.pop().ok_or(err::EAGAIN)?;
                let at = slot * info::INJECT_SIZE;
                self.inject.write(at, bytes).map_err(|_| err::EINVAL)?;
                op.inject = Some(slot);
                SgList::one(
                    self.implicit.lkey(),
                    self.inject.as_ptr() as u64 + at as u64,
                    bytes.len() as u32,
                )
            }
            None if !e.msg && len as u64 > u64::from(RNDV_THRESHOLD) && io.pieces().len() > 1 => {
                // A rendezvous is pulled from one piece: several are gathered into a buffer of
                // the provider's first, registered until the target has taken it.
                drop(st);
                let mut bounce = vec![0u8; len];
                let mut at = 0;
                for p in io.pieces() {
                    if p.len > 0 {
                        let map =
                            (self.borrow)(p.addr as usize, p.len, None).map_err(|_| err::EINVAL)?;
                        map.read(0, &mut bounce[at..at + p.len])
                            .map_err(|_| err::EINVAL)?;
                    }
                    at += p.len;
                }
                let mr = self
                    .mr_reg(bounce.as_ptr() as usize, len, flags::SEND)
                    .map_err(|_| err::ENOMEM)?;
                st = self.lock();
                let sgl = SgList::one(mr.lkey(), bounce.as_ptr() as u64, len as u32);
                op.temp = Some(mr);
                op.bounce = Some(bounce);
                sgl
            }
            None => {
                let key = match io.pieces() {
                    [p] if p.lkey.is_none() && !e.msg && len as u64 > u64::from(RNDV_THRESHOLD) => {
                        // A rendezvous from memory the application did not register: the
                        // target pulls it, so it is registered (REMOTE_READ) until done.
                        drop(st);
                        let mr = self
                            .mr_reg(buf as usize, len, flags::SEND)
                            .map_err(|_| err::ENOMEM)?;
                        st = self.lock();
                        let k = mr.lkey();
                        op.temp = Some(mr);
                        Some(k)
                    }
                    _ => None,
                };
                self.gather(io, key)?
            }
        };
        let hdr = data.unwrap_or(0);
        let temp = op.temp.clone();
        let inject = op.inject;
        let id = Self::new_op(&mut st, op);
        let wr = match target {
            Target::Peer(dest, _) => {
                let lpe = dest.lpe_endpoint(tagged);
                trace(|| {
                    format!(
                        "send op {id}: {len} bytes to {} lpe {lpe} tag {tag:#x}",
                        dest.to_text()
                    )
                });
                WorkRequest::tagged_send(id as u64, sgl, lpe, if tagged { tag } else { 0 }, hdr)
            }
            // A message endpoint's SEND is plain RoCEv2; its data is the immediate.
            Target::Connection => WorkRequest::send(id as u64, sgl, data.map(|d| d as u32)),
        };
        let posted = match self.qp_for(&mut st, ep, target) {
            Ok(qp) => qp.post_send(&[wr]).map_err(|_| err::EAGAIN),
            Err(e) => Err(e),
        };
        if let Err(e) = posted {
            Self::take_op(&mut st, id);
            if let Some(slot) = inject {
                st.inject_free.push(slot);
            }
            drop(st);
            if let Some(mr) = temp {
                let _ = self.handle.deregister(mr);
            }
            return Err(e);
        }
        Ok(())
    }

    /// An RMA operation: `fi_write` (or `fi_inject_write`, its bytes in `inline`) of `len`
    /// bytes at `buf` to `addr` under `key` at `dest`, or `fi_read` of them into `buf`. `data`:
    /// `fi_writedata`'s, the WRITE's immediate (the target's CQ gets it). With
    /// `FI_COMMIT_COMPLETE` (the operation's flags or the endpoint's), a WRITE is Portico's
    /// durable WRITE (seed 004): it completes when the target says the data is durable.
    #[allow(clippy::too_many_arguments)]
    pub fn rma(
        &self,
        ep: usize,
        read: bool,
        io: &Iov,
        dest: u64,
        addr: u64,
        key: u64,
        data: Option<u64>,
        context: u64,
        op_flags: u64,
        inline: Option<&[u8]>,
    ) -> Result<(), i32> {
        let len = io.total();
        let buf = io.addr();
        if len as u64 > info::MAX_MSG_SIZE {
            return Err(err::EMSGSIZE);
        }
        // Keys are 32 bits, and so is a WRITE's immediate (the domain's cq_data_size).
        if key > u64::from(u32::MAX) || data.is_some_and(|d| d > u64::from(u32::MAX) || read) {
            return Err(err::EINVAL);
        }
        let mut st = self.lock();
        let e = slot(&st.eps, ep)?.clone();
        if !e.enabled {
            return Err(err::EINVAL);
        }
        let commit = !read && (op_flags | e.tx_op_flags) & flags::COMMIT_COMPLETE != 0;
        if commit && data.is_some() {
            // A durable WRITE carries no immediate (docs/wire.md §13).
            return Err(err::ENOSYS);
        }
        let target = Self::target(&st, &e, dest)?;
        self.qp_for(&mut st, ep, target)?;
        let mut op = Op {
            context,
            cq: None,
            flags: flags::RMA | if read { flags::READ } else { flags::WRITE },
            buf,
            len: len as u64,
            inject: None,
            temp: None,
            bounce: None,
            peek: Peek::No,
            lpe: None,
        };
        let wants = inline.is_none()
            && (!e.tx_selective
                || op_flags & flags::COMPLETION != 0
                || e.tx_op_flags & flags::COMPLETION != 0);
        if wants {
            op.cq = e.tx_cq;
        }
        let sgl = match inline {
            Some(bytes) => {
                let slot = st.inject_free.pop().ok_or(err::EAGAIN)?;
                let at = slot * info::INJECT_SIZE;
                self.inject.write(at, bytes).map_err(|_| err::EINVAL)?;
                op.inject = Some(slot);
                SgList::one(
                    self.implicit.lkey(),
                    self.inject.as_ptr() as u64 + at as u64,
                    bytes.len() as u32,
                )
            }
            None => self.gather(io, None)?,
        };
        let inject = op.inject;
        let id = Self::new_op(&mut st, op);
        let wr = if read {
            WorkRequest::read(id as u64, sgl, addr, key as u32)
        } else if commit {
            WorkRequest::durable_write(id as u64, sgl, addr, key as u32, false)
        } else {
            WorkRequest::write(id as u64, sgl, addr, key as u32, data.map(|d| d as u32))
        };
        let posted = match self.qp_for(&mut st, ep, target) {
            Ok(qp) => qp.post_send(&[wr]).map_err(|_| err::EAGAIN),
            Err(e) => Err(e),
        };
        if let Err(e) = posted {
            Self::take_op(&mut st, id);
            if let Some(slot) = inject {
                st.inject_free.push(slot);
            }
            return Err(e);
        }
        Ok(())
    }

    /// A receive (`tagged`: `fi_trecv` with `tag` and `ignore`; else `fi_recv`) into `len`
    /// bytes at `buf`, from `src` (`FI_ADDR_UNSPEC`: anyone).
    #[allow(clippy::too_many_arguments)]
    pub fn recv(
        &self,
        ep: usize,
        buf: u64,
        len: usize,
        lkey: Option<u32>,
        src: u64,
        tag: u64,
        ignore: u64,
        context: u64,
        op_flags: u64,
    ) -> Result<(), i32> {
        let tagged = op_flags & flags::TAGGED != 0;
        let mut st = self.lock();
        let e = slot(&st.eps, ep)?.clone();
        if e.msg {
            drop(st);
            return self.msg_recv(ep, buf, len, lkey, context, op_flags);
        }
        if !e.enabled {
            return Err(err::EINVAL);
        }
        if tagged && op_flags & flags::PEEK != 0 {
            return self.peek(&mut st, &e, src, tag, ignore, context, op_flags);
        }
        if tagged && op_flags & flags::CLAIM != 0 {
            return self.claimed_recv(&mut st, &e, buf, len, context, op_flags);
        }
        let source = Self::source(&st, &e, src)?;
        if st.tags.command_space() == 0 {
            return Err(err::EAGAIN);
        }
        let wants = !e.rx_selective
            || op_flags & flags::COMPLETION != 0
            || e.rx_op_flags & flags::COMPLETION != 0;
        let op = Op {
            context,
            cq: if wants { e.rx_cq } else { None },
            flags: flags::RECV | if tagged { flags::TAGGED } else { flags::MSG },
            buf,
            len: len as u64,
            inject: None,
            temp: None,
            bounce: None,
            peek: Peek::No,
            lpe: Some(self.ep_addr(e.index).lpe_endpoint(tagged)),
        };
        let id = Self::new_op(&mut st, op);
        let sge = {
            let (k, a) = self.local(lkey, buf, len);
            portico::transport::Sge::new(k, a, len as u32)
        };
        let mut entry = if tagged {
            TagEntry::recv(tag, sge, id as u64).with_ignore(ignore)
        } else {
            TagEntry::recv(0, sge, id as u64).with_ignore(u64::MAX)
        };
        if let Some(s) = source {
            entry = entry.from_rank(s);
        }
        let lpe = self.ep_addr(e.index).lpe_endpoint(tagged);
        trace(|| {
            format!(
                "recv op {id}: {len} bytes lpe {lpe} tag {tag:#x} ignore {ignore:#x} from {source:?}"
            )
        });
        if let Some((n, held)) = st.claiming.get_mut(lpe as usize)
            && *n > 0
        {
            // A claiming probe is under way here: this receive waits until it has taken its
            // message, in order with the others held.
            held.push_back(entry);
            return Ok(());
        }
        if st.tags.append(lpe, ListKind::Priority, entry).is_err() {
            Self::take_op(&mut st, id);
            return Err(err::EAGAIN);
        }
        Ok(())
    }

    /// `fi_trecvmsg` with `FI_PEEK`: a search of the endpoint's unexpected list for the first
    /// message the receive would match (the list-processing engine's search command); it
    /// completes with the message's length, tag and data, or in error with `FI_ENOMSG`. With
    /// `FI_CLAIM` (or `FI_DISCARD`) the message found is then taken into the provider's
    /// buffer, for the later `FI_CLAIM` receive of the same context (or dropped).
    #[allow(clippy::too_many_arguments)]
    fn peek(
        &self,
        st: &mut State,
        e: &EpState,
        src: u64,
        tag: u64,
        ignore: u64,
        context: u64,
        op_flags: u64,
    ) -> Result<(), i32> {
        let source = Self::source(st, e, src)?;
        // The search, and for a claim the append that follows it.
        if st.tags.command_space() < 2 {
            return Err(err::EAGAIN);
        }
        let claim = op_flags & (flags::CLAIM | flags::DISCARD) != 0;
        if claim && st.claims.get(&context).is_some_and(|c| !c.ready) {
            // A claim of this context is under way: the engine may be writing its buffer.
            return Err(err::EBUSY);
        }
        let lpe = e.index * 2;
        let id = Self::new_op(
            st,
            Op {
                context,
                cq: e.rx_cq,
                flags: flags::RECV | flags::TAGGED,
                buf: 0,
                len: 0,
                inject: None,
                temp: None,
                bounce: None,
                peek: Peek::Search {
                    lpe,
                    claim,
                    discard: op_flags & flags::DISCARD != 0,
                },
                lpe: None,
            },
        );
        let (k, a) = self.local(None, 0, 0);
        let mut probe = TagEntry::recv(tag, portico::transport::Sge::new(k, a, 0), id as u64)
            .with_ignore(ignore);
        if let Some(s) = source {
            probe = probe.from_rank(s);
        }
        trace(|| format!("peek op {id}: lpe {lpe} tag {tag:#x} ignore {ignore:#x} claim {claim}"));
        if st
            .tags
            .search(lpe, probe, portico::lpe::SearchMode::SearchOnly)
            .is_err()
        {
            Self::take_op(st, id);
            return Err(err::EAGAIN);
        }
        if claim {
            if let Some((n, _)) = st.claiming.get_mut(lpe as usize) {
                *n += 1;
            }
            // Held (not ready) until the claim completes: see the check above.
            st.claims.insert(context, Claimed::default());
        }
        Ok(())
    }

    /// `fi_trecvmsg` with `FI_CLAIM`: the message an earlier `FI_PEEK | FI_CLAIM` of the same
    /// context took, copied into `buf` (or dropped with `FI_DISCARD`).
    fn claimed_recv(
        &self,
        st: &mut State,
        e: &EpState,
        buf: u64,
        len: usize,
        context: u64,
        op_flags: u64,
    ) -> Result<(), i32> {
        let Some(c) = st.claims.remove(&context) else {
            log_warn("fi_trecvmsg(FI_CLAIM): no message was claimed with this context");
            return Err(err::EINVAL);
        };
        if !c.ready {
            // The claiming probe has not completed yet: the application is early.
            st.claims.insert(context, c);
            return Err(err::EAGAIN);
        }
        let n = (c.len as usize).min(len);
        if op_flags & flags::DISCARD == 0 && n > 0 {
            let map = (self.borrow)(buf as usize, n, None).map_err(|_| err::EINVAL)?;
            map.write(0, &c.data[..n]).map_err(|_| err::EINVAL)?;
        }
        let wants = !e.rx_selective
            || op_flags & flags::COMPLETION != 0
            || e.rx_op_flags & flags::COMPLETION != 0;
        if let (true, Some(cq)) = (wants, e.rx_cq)
            && let Some(Some(q)) = st.cqs.get_mut(cq)
        {
            let olen = c.len - n as u64;
            q.entries.push_back(Completion {
                context,
                flags: flags::RECV
                    | flags::TAGGED
                    | if c.hdr_data != 0 {
                        flags::REMOTE_CQ_DATA
                    } else {
                        0
                    },
                len: n as u64,
                buf,
                data: c.hdr_data,
                tag: c.tag,
                source: c.source,
                error: (olen > 0).then_some((err::ETRUNC, olen, 0)),
            });
        }
        Ok(())
    }

    /// A probe's search answered (`Search` event): complete the peek, or go on to take the
    /// message for its claim.
    fn on_search(&self, st: &mut State, op: Op, ev: &TagEvent) {
        let Peek::Search {
            lpe,
            claim,
            discard,
        } = op.peek
        else {
            return;
        };
        let found = ev.fail == portico::lpe::NiFail::Ok;
        if claim && let Some((n, _)) = st.claiming.get_mut(lpe as usize) {
            *n = n.saturating_sub(1);
        }
        if claim && !found {
            st.claims.remove(&op.context);
        }
        if found && claim && ev.rlength > info::MAX_MSG_SIZE {
            // A length no receive could take (the sender's word): not claimed, nor allocated.
            st.claims.remove(&op.context);
            self.complete_err(st, &op, err::EMSGSIZE, ev.rlength);
        } else if found && claim {
            // Take it: a use-once receive of exactly its tag from exactly its sender claims the
            // first such unexpected message, which is this one (the receives the application
            // posted since are held back until this append is on its way).
            let mut data = vec![0u8; ev.rlength as usize];
            let (k, a) = self.local(None, data.as_mut_ptr() as u64, data.len());
            let id = Self::new_op(
                st,
                Op {
                    peek: Peek::Claiming { discard },
                    ..op.clone()
                },
            );
            let entry = TagEntry::recv(
                ev.match_bits,
                portico::transport::Sge::new(k, a, data.len() as u32),
                id as u64,
            )
            .from_rank(ev.initiator);
            st.claims.insert(
                op.context,
                Claimed {
                    data,
                    ..Claimed::default()
                },
            );
            if st.tags.append(lpe, ListKind::Priority, entry).is_err() {
                Self::take_op(st, id);
                st.claims.remove(&op.context);
                self.complete_err(st, &op, err::EAGAIN, 0);
            }
        } else if found {
            self.complete(st, &op, probe_completion(&op, ev));
        } else {
            self.complete_err(st, &op, err::ENOMSG, 0);
        }
        // The receives held back while claiming go on, in order.
        if let Some((0, held)) = st.claiming.get_mut(lpe as usize) {
            let held = std::mem::take(held);
            for entry in held {
                if st.tags.append(lpe, ListKind::Priority, entry).is_err() {
                    log_warn("the tag port's command ring is full: a receive was lost");
                }
            }
        }
    }

    /// Completes `op` in error `e` (a positive `FI_E*`), `len` the length it reports.
    fn complete_err(&self, st: &mut State, op: &Op, e: i32, len: u64) {
        let c = Completion {
            context: op.context,
            flags: op.flags,
            len,
            error: Some((e, 0, 0)),
            ..Completion::default()
        };
        self.complete(st, op, c);
    }

    /// Writes `c` to `op`'s completion queue, if it has one.
    fn complete(&self, st: &mut State, op: &Op, c: Completion) {
        if let Some(Some(q)) = op.cq.and_then(|cq| st.cqs.get_mut(cq)) {
            q.entries.push_back(c);
        }
    }

    /// The scatter/gather list of `io` (`key`, when given, for a single piece: a registration
    /// made for the operation).
    fn gather(&self, io: &Iov, key: Option<u32>) -> Result<SgList, i32> {
        if let ([p], Some(k)) = (io.pieces(), key) {
            return Ok(SgList::one(k, p.addr, p.len as u32));
        }
        let mut sgl = SgList::new();
        for p in io.pieces() {
            let (k, a) = self.local(p.lkey, p.addr, p.len);
            sgl.push(portico::transport::Sge::new(k, a, p.len as u32))
                .map_err(|_| err::EINVAL)?;
        }
        if sgl.is_empty() {
            let (k, a) = self.local(None, 0, 0);
            sgl = SgList::one(k, a, 0);
        }
        Ok(sgl)
    }

    /// The key and address a local buffer is named by: its descriptor's region, else the
    /// local region; a zero-length buffer may be null (MPI's empty messages), which no region
    /// holds, and is named by the local region's first byte.
    pub(crate) fn local(&self, lkey: Option<u32>, buf: u64, len: usize) -> (u32, u64) {
        if len == 0 {
            (self.implicit.lkey(), self.implicit.addr())
        } else {
            (lkey.unwrap_or(self.implicit.lkey()), buf)
        }
    }

    // ---- progress ----------------------------------------------------------------------

    /// Takes the engine's completions and tag events into the completion queues.
    pub fn progress(&self, st: &mut State) {
        let mut wcs = [WorkCompletion::EMPTY; 32];
        let mut done = Vec::new();
        loop {
            let n = st.cq.poll(&mut wcs);
            for wc in &wcs[..n] {
                if let Some(mr) = self.on_completion(st, wc) {
                    done.push(mr);
                }
            }
            if n < wcs.len() {
                break;
            }
        }
        let mut evs = [TagEvent::EMPTY; 32];
        loop {
            let n = st.tags.poll(&mut evs);
            for ev in &evs[..n] {
                self.on_tag_event(st, ev);
            }
            if n < evs.len() {
                break;
            }
        }
        for mr in done {
            let _ = self.handle.deregister(mr);
        }
    }

    fn on_completion(&self, st: &mut State, wc: &WorkCompletion) -> Option<MemoryRegion> {
        trace(|| {
            format!(
                "completion of op {:#x}: {:?} {:?}",
                wc.wr_id, wc.opcode, wc.status
            )
        });
        if wc.wr_id & IMM_RECV != 0 {
            self.on_remote_write(st, wc);
            return None;
        }
        let op = Self::take_op(st, wc.wr_id as usize)?;
        if let Some(slot) = op.inject {
            st.inject_free.push(slot);
        }
        if let Some(cq) = op.cq {
            let error = (wc.status != WcStatus::Success)
                .then(|| (status_errno(wc.status), 0, wc.status as i32));
            // A flush is what a closing connection does to the receives still posted: not news.
            if error.is_some() && wc.status != WcStatus::WrFlushError {
                log_warn(&format!("an operation completed in error: {:?}", wc.status));
            }
            // A receive (a message endpoint's) is as long as what came, with the SEND's
            // immediate as its data.
            let recv = op.flags & flags::RECV != 0;
            let mut c = Completion {
                context: op.context,
                flags: op.flags,
                len: match (error, recv) {
                    (Some(_), _) => 0,
                    (None, true) => u64::from(wc.byte_len),
                    (None, false) => op.len,
                },
                buf: if recv { op.buf } else { 0 },
                error,
                ..Completion::default()
            };
            if let (true, Some(imm)) = (recv, wc.imm_data) {
                c.data = u64::from(imm);
                c.flags |= flags::REMOTE_CQ_DATA;
            }
            // A message endpoint's receive that a WRITE with immediate consumed (as verbs
            // does: the `FI_RX_CQ_DATA` way) reports the remote write, not a message.
            if wc.opcode == portico::transport::WcOpcode::RecvRdmaWithImm {
                c.flags = flags::RMA | flags::REMOTE_WRITE | flags::REMOTE_CQ_DATA;
                c.buf = 0;
            }
            if let Some(Some(q)) = st.cqs.get_mut(cq) {
                q.entries.push_back(c);
            }
        }
        op.temp
    }

    /// Keeps [`IMM_RECVS`] receives posted on accepted connection `id` (endpoint `index`'s).
    fn post_imm_recvs(st: &mut State, id: u32, n: usize) {
        let Some((Some(qp), index)) = st.accepted.get_mut(&id) else {
            return;
        };
        let wr_id = IMM_RECV | u64::from(id) << 16 | u64::from(*index);
        let r = portico::transport::RecvRequest::new(wr_id, SgList::new());
        for _ in 0..n {
            if qp.post_recv(&[r]).is_err() {
                break;
            }
        }
    }

    /// A WRITE with immediate arrived on an accepted connection (it consumed one of the
    /// receives kept there): the immediate goes to the receive CQ of the endpoint the
    /// connection was accepted for, as `FI_REMOTE_CQ_DATA`, and the receive is posted again.
    fn on_remote_write(&self, st: &mut State, wc: &WorkCompletion) {
        let id = ((wc.wr_id >> 16) & 0xffff_ffff) as u32;
        let index = (wc.wr_id & 0xffff) as u16;
        if wc.status != WcStatus::Success {
            // The connection ended (flushed): nothing to report, nothing to post again.
            return;
        }
        let cq = st
            .eps
            .iter()
            .flatten()
            .find(|e| !e.msg && e.index == index)
            .and_then(|e| e.rx_cq);
        if let Some(Some(q)) = cq.and_then(|cq| st.cqs.get_mut(cq)) {
            q.entries.push_back(Completion {
                flags: flags::RMA | flags::REMOTE_WRITE | flags::REMOTE_CQ_DATA,
                len: u64::from(wc.byte_len),
                data: u64::from(wc.imm_data.unwrap_or(0)),
                ..Completion::default()
            });
        }
        Self::post_imm_recvs(st, id, 1);
    }

    fn on_tag_event(&self, st: &mut State, ev: &TagEvent) {
        trace(|| {
            format!(
                "tag event {:?} cookie {:#x} lpe {} tag {:#x} {} of {} bytes from {} fail {:?}",
                ev.kind,
                ev.cookie,
                ev.endpoint,
                ev.match_bits,
                ev.mlength,
                ev.rlength,
                Ipv4Addr::from(ev.initiator),
                ev.fail
            )
        });
        if ev.cookie & OVERFLOW != 0 {
            // An overflow buffer that every message it held has left is appended again.
            if ev.kind == TagEventKind::AutoFree {
                let lpe = ((ev.cookie >> 8) & 0xffff) as u16;
                let b = (ev.cookie & 0xff) as usize;
                let _ = self.append_overflow(st, lpe, b);
            }
            return;
        }
        match ev.kind {
            TagEventKind::Put
            | TagEventKind::UnexpectedConsumed
            | TagEventKind::CommandFailed
            | TagEventKind::Search
            | TagEventKind::AutoUnlink => {}
            _ => return,
        }
        if ev.kind == TagEventKind::CommandFailed
            && ev.error == Some(portico::rdma::TagCommandError::StaleHandle)
        {
            // A cancel that came too late: the receive matched and completes as usual.
            return;
        }
        let Some(op) = Self::take_op(st, ev.cookie as usize) else {
            return;
        };
        if ev.kind == TagEventKind::AutoUnlink {
            // A receive fi_cancel (or its endpoint's close) unlinked: FI_ECANCELED.
            let c = Completion {
                context: op.context,
                flags: op.flags,
                buf: op.buf,
                error: Some((err::ECANCELED, op.len, 0)),
                ..Completion::default()
            };
            self.complete(st, &op, c);
            return;
        }
        if ev.kind == TagEventKind::Search {
            self.on_search(st, op, ev);
            return;
        }
        if let Peek::Claiming { discard } = op.peek {
            // The claimed message is in the provider's buffer: the peek completes.
            let taken = ev.kind != TagEventKind::CommandFailed;
            if let Some(c) = st.claims.get_mut(&op.context) {
                c.ready = true;
                c.len = ev.mlength;
                c.tag = ev.match_bits;
                c.hdr_data = ev.hdr_data;
                c.source = ev.initiator;
            }
            if discard || !taken {
                st.claims.remove(&op.context);
            }
            let c = Completion {
                error: (!taken).then_some((err::ENOMSG, 0, 0)),
                ..probe_completion(&op, ev)
            };
            self.complete(st, &op, c);
            return;
        }
        let Some(cq) = op.cq else { return };
        let failed = ev.kind == TagEventKind::CommandFailed;
        let error = if failed {
            Some((err::EINVAL, 0, 0))
        } else if ev.truncated {
            Some((err::ETRUNC, ev.rlength - ev.mlength, 0))
        } else {
            None
        };
        if let Some((e, olen, _)) = error {
            log_warn(&format!(
                "a receive completed in error {e}: {:?}, {olen} bytes over its buffer, tag {:#x}",
                ev.kind, ev.match_bits
            ));
        }
        let mut flags = op.flags;
        if ev.hdr_data != 0 {
            flags |= flags::REMOTE_CQ_DATA;
        }
        let c = Completion {
            context: op.context,
            flags,
            len: ev.mlength,
            buf: op.buf,
            data: ev.hdr_data,
            tag: if op.flags & flags::TAGGED != 0 {
                ev.match_bits
            } else {
                0
            },
            source: ev.initiator,
            error,
        };
        if let Some(Some(q)) = st.cqs.get_mut(cq) {
            q.entries.push_back(c);
        }
    }

    /// Completions of `cq` into `out` (as many as fit), after progress; how many. `Err(EAVAIL)`
    /// when an error entry is first, `Err(EAGAIN)` when there is none. Allocates nothing.
    pub fn cq_read(&self, cq: usize, out: &mut [Completion]) -> Result<usize, i32> {
        self.end_wait();
        let mut st = self.lock();
        self.progress(&mut st);
        let q = slot_mut(&mut st.cqs, cq)?;
        match q.entries.front() {
            None => return Err(err::EAGAIN),
            Some(c) if c.error.is_some() => return Err(err::EAVAIL),
            Some(_) => {}
        }
        let mut n = 0;
        while n < out.len() {
            match q.entries.front() {
                Some(c) if c.error.is_none() => {
                    out[n] = *c;
                    q.entries.pop_front();
                    n += 1;
                }
                _ => break,
            }
        }
        Ok(n)
    }

    /// Whether anything waits to be read: the engine's completions or tag events not yet
    /// taken, or entries in one of `cqs`.
    fn pending(&self, cqs: &[usize]) -> bool {
        let st = self.lock();
        st.cq.has_completions()
            || st.tags.has_events()
            || cqs.iter().any(|&c| {
                st.cqs
                    .get(c)
                    .and_then(|q| q.as_ref())
                    .is_some_and(|q| !q.entries.is_empty())
            })
    }

    /// Sleeps up to `timeout` or until the worker publishes a completion or a tag event
    /// (`fi_cq_sread`); at once when `cq` has entries already.
    pub fn wait(&self, cq: usize, timeout: Duration) {
        let [a, b] = &self.wakes;
        // The wake-up is one per path, not per thread: the first sleeper to wake lowers the
        // flags and empties the eventfds, so a thread that sleeps beside others sleeps in
        // short spells (1 ms) instead of its whole timeout.
        let others = self.waiters.fetch_add(1, Ordering::AcqRel);
        let spell = if others > 0 {
            timeout.min(Duration::from_millis(1))
        } else {
            timeout
        };
        wake::sleep(&[a, b], spell.as_nanos() as u64, || self.pending(&[cq]));
        self.waiters.fetch_sub(1, Ordering::AcqRel);
    }

    /// `fi_trywait`: true when nothing waits to be read in `cqs` or the engine, and the worker
    /// will write the wait descriptor ([`Engine::wait_fd`]) when something comes; false when
    /// the application must read first.
    pub fn try_wait(&self, cqs: &[usize]) -> bool {
        let [a, b] = &self.wakes;
        wake::prepare_external_wait(&[a, b], || self.pending(cqs))
    }

    /// The end of a wait `try_wait` began (every CQ read ends it, unless a thread sleeps in
    /// [`Engine::wait`], whose flags these are too).
    pub fn end_wait(&self) {
        if self.waiters.load(Ordering::Acquire) > 0 {
            return;
        }
        let [a, b] = &self.wakes;
        wake::finish_external_wait(&[a, b]);
    }

    /// A descriptor readable when the worker has published to a waiting host: `FI_WAIT_FD`.
    pub fn wait_fd(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        let [a, b] = &self.wakes;
        wake::epoll_of(&[a, b])
    }

    /// The error entry at the head of `cq`.
    pub fn cq_readerr(&self, cq: usize) -> Option<Completion> {
        let mut st = self.lock();
        self.progress(&mut st);
        let q = st.cqs.get_mut(cq)?.as_mut()?;
        match q.entries.front() {
            Some(c) if c.error.is_some() => q.entries.pop_front(),
            _ => None,
        }
    }

    /// The `fi_addr_t` of the endpoint whose engine is `initiator`, in `ep`'s address vector.
    pub fn source_addr(&self, cq_ep_av: usize, initiator: u32) -> u64 {
        let st = self.lock();
        let ip = Ipv4Addr::from(initiator);
        st.avs
            .get(cq_ep_av)
            .and_then(|a| a.as_ref())
            .and_then(|a| a.addrs.iter().position(|x| x.is_some_and(|x| x.ip == ip)))
            .map_or(flags::ADDR_UNSPEC, |i| i as u64)
    }

    // ---- the CM ------------------------------------------------------------------------

    fn on_cm_event(&self, ev: ConnEvent) {
        let ev = match self.msg_cm_event(ev) {
            Some(ev) => ev,
            None => return,
        };
        trace(|| format!("cm event {ev:?}"));
        match ev {
            ConnEvent::Request(req) => {
                let ours = self.lock().listening.contains(&req.port);
                if ours {
                    match self.handle.accept(req.id, &[]) {
                        Ok(qp) => {
                            let mut st = self.lock();
                            let index = req.port - self.settings.port;
                            st.accepted.insert(req.id, (Some(qp), index));
                            Self::post_imm_recvs(&mut st, req.id, IMM_RECVS);
                        }
                        Err(e) => log_warn(&format!("accepting connection {}: {e}", req.id)),
                    }
                } else {
                    let _ = self.handle.reject(req.id, &[]);
                }
            }
            ConnEvent::Established { id, qp, .. } => {
                let mut st = self.lock();
                if let (Some(qp), Some(key)) = (qp, st.ids.get(&id).copied()) {
                    st.conns.insert(key, Conn::Up(qp));
                }
            }
            ConnEvent::Rejected { id, .. } => self.failed(id, err::ECONNREFUSED),
            ConnEvent::TimedOut { id } => self.failed(id, err::ETIMEDOUT),
            ConnEvent::Unreachable { id } => self.failed(id, err::EHOSTUNREACH),
            ConnEvent::Disconnected { id } => {
                let mut st = self.lock();
                st.accepted.remove(&id);
                if let Some(key) = st.ids.remove(&id) {
                    st.conns.remove(&key);
                }
            }
        }
    }

    fn failed(&self, id: u32, e: i32) {
        let mut st = self.lock();
        if let Some(key) = st.ids.remove(&id) {
            st.conns.insert(key, Conn::Failed(e));
        }
    }
}

/// What a probe (`FI_PEEK`) reports of the message `ev` names: its length, tag, data and
/// sender.
fn probe_completion(op: &Op, ev: &TagEvent) -> Completion {
    Completion {
        context: op.context,
        flags: op.flags
            | if ev.hdr_data != 0 {
                flags::REMOTE_CQ_DATA
            } else {
                0
            },
        len: ev.rlength,
        data: ev.hdr_data,
        tag: ev.match_bits,
        source: ev.initiator,
        ..Completion::default()
    }
}

/// Object `i` of a table of the provider's objects (`EINVAL` when there is none).
pub(crate) fn slot<T>(v: &[Option<T>], i: usize) -> Result<&T, i32> {
    v.get(i).and_then(Option::as_ref).ok_or(err::EINVAL)
}

/// [`slot`], to change it.
pub(crate) fn slot_mut<T>(v: &mut [Option<T>], i: usize) -> Result<&mut T, i32> {
    v.get_mut(i).and_then(Option::as_mut).ok_or(err::EINVAL)
}

pub(crate) fn put<T>(v: &mut Vec<Option<T>>, x: T) -> usize {
    match v.iter().position(Option::is_none) {
        Some(i) => {
            v[i] = Some(x);
            i
        }
        None => {
            v.push(Some(x));
            v.len() - 1
        }
    }
}

/// The libfabric error for an engine completion status.
fn status_errno(s: WcStatus) -> i32 {
    match s {
        WcStatus::Success => 0,
        WcStatus::LocalLengthError => err::EMSGSIZE,
        WcStatus::LocalProtectionError | WcStatus::RemoteAccessError => err::EACCES,
        WcStatus::RetryExceeded | WcStatus::RnrRetryExceeded => err::ETIMEDOUT,
        WcStatus::WrFlushError => err::ECANCELED,
        _ => err::EIO,
    }
}

/// Where the provider's warnings go: libfabric's log, through the FFI layer.
pub fn log_warn(msg: &str) {
    crate::ffi::log(crate::ffi::Level::Warn, msg);
}

/// A line of the provider's trace: every operation posted, completed or matched and every
/// connection event, at libfabric's debug level (`FI_LOG_LEVEL=debug`); built only when that
/// level is on.
fn trace(msg: impl FnOnce() -> String) {
    if crate::ffi::trace_enabled() {
        crate::ffi::log(crate::ffi::Level::Debug, &msg());
    }
}
