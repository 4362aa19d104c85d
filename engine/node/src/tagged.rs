//! Tagged messages on the worker (seed 001): the list-processing engine behind RoCE.
//!
//! An engine with tagged messaging holds one [`TagShard`]: the [`MatchShard`] shard of the
//! endpoints homed on this worker (an [`EndpointTable`] decides which), the records of the
//! tagged messages in flight or waiting on the unexpected list, and the worker's ends of two
//! lock-free rings shared with the application's [`TagPort`]: host commands in (append,
//! search, search-and-delete), events out (put, put-overflow, unexpected consumed, truncation
//! reported in each). The host sees the events of a burst of received frames when the burst
//! has been received, and the others when the worker's iteration ends: one store of a count
//! each time, not one of the ring's write index per event, a line the host's polls would take
//! back from the worker's core at every event (`docs/rdma.md`, "Lines the other core polls").
//!
//! Per message, on the worker that owns its endpoint, with no allocation:
//! - the first packet's tag header is matched against the endpoint's priority list, then its
//!   overflow list ([`MatchShard::match_incoming`], persistent-entry cache first); the
//!   data of every packet lands straight in the matched buffer, in the application's
//!   registered memory, and what does not fit is discarded (MPI truncation);
//! - the events of the match are held until the message has landed, so an application that
//!   sees a put sees its data (a message of one packet that matched a posted receive is
//!   placed at once, its events written right after, and needs no record);
//! - a rendezvous message brings its envelope and first chunk; on a match the worker READs the
//!   rest into the matched buffer itself and, when the READ is done, tells the sender (whose
//!   send completes then) and writes the put event;
//! - a message that landed in an overflow buffer stays recorded while its header is on the
//!   unexpected list; the append that claims it copies its data into the new buffer (and, for
//!   a rendezvous, READs the rest), and writes an unexpected-consumed event.
//!
//! Host commands and network requests of one endpoint are each served in arrival order: the
//! worker executes a command as it takes it, between two received bursts, and matches a
//! message as its first packet arrives, so neither order can change and no endpoint waits for
//! another (the library's match-request queues and block bit are needed only where commands and
//! packets reach an engine from different cores; here both are on the owning core).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam::utils::CachePadded;
use rtrb::{Consumer, Producer, RingBuffer};

use super::rings::HostSpin;
use crate::wake::{self, Wake};
use proto::lpe::{
    Appended, DeepList, EndpointConfig, EndpointIndex, EndpointTable, EngineConfig, EngineId,
    EntryHandle, Event, EventKind, EventRing, EventSink, IncomingHeader, ListKind, LpeError,
    MatchEntry, MatchId, MatchOutcome, MatchShard, NiFail, Options, ProcessId, SearchMode,
};
use proto::transport::{
    Access, Delivery, Landing, Location, MemoryTable, Next, Pull, Sge, TagTarget, deliver_in_two,
};
use wire::{TagHeader, TagKind};

/// What a tagged engine is built with.
#[derive(Debug, Clone)]
pub struct TagConfig {
    /// The endpoints homed on this engine (from the [`proto::lpe::EndpointTable`]).
    pub endpoints: Vec<(EndpointIndex, EndpointConfig)>,
    /// Persistent-entry cache slots, endpoint index limit.
    pub engine: EngineConfig,
    /// Events the event ring holds.
    pub event_depth: usize,
    /// Host commands the command ring holds.
    pub command_depth: usize,
    /// Tagged messages recorded at once: being received, being pulled, or waiting on an
    /// unexpected list. A message that finds none free is refused with RNR (the sender retries).
    pub max_messages: usize,
    /// No `Link` events for use-once entries and no `AutoUnlink` events on priority lists
    /// (Portals' per-entry link and unlink event disables, for every posted receive): a
    /// receive then costs one event, its put. `Link` events of persistent entries (which
    /// carry the handle to unlink them) and the overflow list's events (which say when to
    /// give it a new buffer) are still written.
    pub quiet: bool,
}

impl Default for TagConfig {
    fn default() -> Self {
        TagConfig {
            endpoints: vec![(EndpointIndex(0), EndpointConfig::default())],
            engine: EngineConfig::default(),
            event_depth: 8192,
            command_depth: 4096,
            max_messages: 4096,
            quiet: false,
        }
    }
}

impl TagConfig {
    /// This configuration for engine `engine` under `table`: the same, with only the
    /// endpoints the table homes there. Queue pairs that carry those endpoints' messages must
    /// be added to the same engine; a tagged message for an endpoint homed elsewhere is
    /// refused (counted as `wrong_engine`), so a header never crosses cores.
    pub fn homed(&self, table: &EndpointTable, engine: EngineId) -> TagConfig {
        TagConfig {
            endpoints: self
                .endpoints
                .iter()
                .copied()
                .filter(|(ep, _)| table.engine_of(*ep) == Some(engine))
                .collect(),
            ..self.clone()
        }
    }

    /// This configuration over `shards` workers, one [`TagConfig::homed`] per worker in
    /// order: under `table`, or endpoint *e* on worker *e* mod `shards` where none is given.
    pub fn sharded(&self, table: Option<&EndpointTable>, shards: usize) -> Vec<TagConfig> {
        let max = self.engine.max_endpoints.max(
            self.endpoints
                .iter()
                .map(|(e, _)| usize::from(e.0) + 1)
                .max()
                .unwrap_or(0),
        );
        let round_robin;
        let table = match table {
            Some(t) => t,
            None => {
                round_robin = EndpointTable::round_robin(max, shards);
                &round_robin
            }
        };
        (0..shards)
            .map(|i| self.homed(table, EngineId(i as u16)))
            .collect()
    }
}

/// A list entry as the application appends it: the match fields and a buffer in its own
/// registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagEntry {
    pub match_bits: u64,
    pub ignore_bits: u64,
    /// Accepted sender rank, or `None` for any.
    pub source: Option<u32>,
    /// Where matched data lands (lkey, address, length); LOCAL_WRITE is required.
    pub buf: Sge,
    /// `USE_ONCE`, `MANAGE_LOCAL`, `NO_TRUNCATE`, `EVENT_LINK_DISABLE`, `EVENT_UNLINK_DISABLE`
    /// ([`Options`]; a quiet shard adds the last two to its receives); `OP_PUT` is implied.
    pub options: Options,
    /// With `MANAGE_LOCAL`: unlink once less than this is left.
    pub min_free: u64,
    /// Returned in every event about the entry.
    pub cookie: u64,
}

impl TagEntry {
    /// A use-once receive of exactly `match_bits` from any source into `buf`.
    pub fn recv(match_bits: u64, buf: Sge, cookie: u64) -> TagEntry {
        TagEntry {
            match_bits,
            ignore_bits: 0,
            source: None,
            buf,
            options: Options::USE_ONCE,
            min_free: 0,
            cookie,
        }
    }

    pub fn with_ignore(mut self, ignore_bits: u64) -> TagEntry {
        self.ignore_bits = ignore_bits;
        self
    }

    pub fn from_rank(mut self, rank: u32) -> TagEntry {
        self.source = Some(rank);
        self
    }

    pub fn with_options(mut self, options: Options) -> TagEntry {
        self.options = options;
        self
    }

    pub fn with_min_free(mut self, min_free: u64) -> TagEntry {
        self.min_free = min_free;
        self
    }

    fn source(&self) -> MatchId {
        match self.source {
            Some(r) => MatchId::rank(r),
            None => MatchId::ANY,
        }
    }
}

/// A host command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagCommand {
    Append {
        endpoint: u16,
        list: ListKind,
        entry: TagEntry,
    },
    /// Search the unexpected list with `probe`'s match fields (its buffer is not used);
    /// `SearchDelete` also removes what it reports.
    Search {
        endpoint: u16,
        probe: TagEntry,
        mode: SearchMode,
    },
    /// Unlink a linked entry (its `Link` event carried the handle). Like `PtlMEUnlink`, no
    /// event; a stale handle gives `CommandFailed`.
    Unlink { handle: TagHandle },
    /// Unlink the first priority entry of `endpoint` whose cookie is `cookie` (a receive the
    /// application cancels; no `Link` event or handle needed). Answered by an `AutoUnlink`
    /// event with the cookie when the entry was there, by `CommandFailed` with
    /// `StaleHandle` when it was not (matched already, or never appended).
    Cancel { endpoint: u16, cookie: u64 },
    /// `PtlPTEnable`: `endpoint` matches messages again (after it was created disabled, was
    /// disabled, or flow control disabled it). No event; `CommandFailed` for an endpoint not
    /// homed here.
    Enable { endpoint: u16 },
    /// `PtlPTDisable`: `endpoint`'s messages are dropped and counted until it is enabled.
    Disable { endpoint: u16 },
    /// Seed 001's software request list: `endpoint` stops matching and keeps the headers of
    /// the messages that arrive (their data is not kept), for the host to match; a
    /// `SoftwareMode` event says so.
    SoftwareMode { endpoint: u16 },
    /// Takes up to `max` headers off `endpoint`'s software request list, oldest first, each
    /// as a `SoftwareRequest` event (`match_bits`, `rlength`, `initiator`, `hdr_data`).
    TakeSoftwareRequests { endpoint: u16, max: u16 },
    /// `endpoint` matches again; refused (`CommandFailed`, `Other`) while headers are still
    /// on its software request list.
    ResumeMatching { endpoint: u16 },
}

/// Names a linked entry, for [`TagPort::unlink`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TagHandle(EntryHandle);

/// What an event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TagEventKind {
    /// A message landed in a priority entry's buffer.
    Put,
    /// A message landed in an overflow buffer; its header is on the unexpected list.
    PutOverflow,
    /// An append claimed an unexpected message: its data is now in the appended buffer (or,
    /// after search-and-delete, still at `addr` in the overflow buffer).
    UnexpectedConsumed,
    Link,
    AutoUnlink,
    AutoFree,
    /// Search-only result (or a search that found nothing: `fail` = `NoMatch`).
    Search,
    PtDisabled,
    SoftwareMode,
    /// A header taken off the software request list
    /// ([`TagCommand::TakeSoftwareRequests`]).
    SoftwareRequest,
    /// A command was refused (`error` says why); `cookie` is the entry's.
    CommandFailed,
}

/// Why a command was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TagCommandError {
    /// The buffer's key, bounds or LOCAL_WRITE permission failed.
    BadBuffer,
    /// The endpoint is not homed on this engine.
    NoSuchEndpoint,
    ListFull,
    /// The entry to unlink is gone (matched, unlinked, or never linked).
    StaleHandle,
    Other,
}

/// One event, as the application reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagEvent {
    pub kind: TagEventKind,
    pub fail: NiFail,
    pub endpoint: u16,
    pub list: ListKind,
    pub cookie: u64,
    /// Where the data is, as the application addresses its registered memory (0: none).
    pub addr: u64,
    pub match_bits: u64,
    /// Bytes the sender sent, and bytes that landed (fewer: truncated).
    pub rlength: u64,
    pub mlength: u64,
    pub initiator: u32,
    pub hdr_data: u64,
    /// `mlength < rlength`: the excess was discarded.
    pub truncated: bool,
    /// The message came by rendezvous.
    pub rendezvous: bool,
    pub error: Option<TagCommandError>,
    /// `Link` events: the entry's handle.
    pub handle: Option<TagHandle>,
}

impl TagEvent {
    /// An empty event (for arrays the application polls into).
    pub const EMPTY: TagEvent = TagEvent {
        kind: TagEventKind::Search,
        fail: NiFail::Ok,
        endpoint: 0,
        list: ListKind::Priority,
        cookie: 0,
        addr: 0,
        match_bits: 0,
        rlength: 0,
        mlength: 0,
        initiator: 0,
        hdr_data: 0,
        truncated: false,
        rendezvous: false,
        error: None,
        handle: None,
    };
}

portico_counters::counter_set! {
    /// What the shard counts, declared once: the names (`TagCounters::NAMES`, the JSON keys)
    /// and how they combine follow this list. The RDMA stage reports those it shares with its
    /// own set under a `tag_` prefix (`tag_dropped`, ...).
    pub struct TagCounters, slots TagSlot {
        /// Messages matched on the priority list (a receive posted before they arrived).
        matched_priority: Sum,
        /// Messages matched on the overflow list (unexpected: no receive was posted).
        matched_overflow: Sum,
        /// Messages that matched nothing (or met a disabled endpoint): consumed, data discarded.
        dropped: Sum,
        /// Messages longer than the buffer they matched (the rest discarded).
        truncated: Sum,
        /// Rendezvous pulls of a message's data (an RDMA READ from the sender).
        rendezvous_pulls: Sum,
        /// Unexpected messages a later receive claimed.
        unexpected_claimed: Sum,
        /// Host commands served.
        commands: Sum,
        /// Host commands that failed (answered with a `CommandFailed` event).
        commands_failed: Sum,
        /// Messages refused with RNR: no event room or no free record.
        not_ready: Sum,
        /// Tagged messages for an endpoint homed on another engine (refused).
        wrong_engine: Sum,
        /// Events the application's ring had no room for (0 unless it stops polling).
        events_lost: Sum,
        /// Messages whose queue pair failed before their data was all in place (reported with
        /// `NiFail::Undeliverable`).
        undeliverable: Sum,
    }
}

/// Host commands wait in their ring while the event ring has fewer free slots than this.
const COMMAND_EVENT_ROOM: usize = 256;
/// Host commands whose slots [`TagShard::begin_burst`] prefetches, at most (about 36 cache
/// lines, 2.3 KiB of a 32 KiB L1: a burst's re-posted receives, without flooding the cache
/// when the host has pushed thousands).
const PREFETCH_COMMANDS: usize = 32;
/// Events one command or one match writes at most, beyond which they are counted lost.
const STAGING: usize = 256;
/// Events a message may still write after it was matched.
const EVENTS_PER_MESSAGE: usize = 4;

/// What an event slot of a record holds before an event is written there.
const NO_EVENT: Event = Event::bare(EventKind::Put, EndpointIndex(0), ListKind::Priority, 0);

/// A registered-memory location as the list engine carries it (entry start + offset
/// arithmetic stays valid inside one region): slot + 1 above bit 48, offset below.
fn pack(at: Location) -> u64 {
    (u64::from(at.region) + 1) << 48 | at.offset
}

fn unpack(v: u64) -> Location {
    match (v >> 48).checked_sub(1) {
        Some(region) => Location {
            region: region as u32,
            offset: v & ((1 << 48) - 1),
        },
        None => Location::NOWHERE,
    }
}

/// An unexpected message's claim: where the appended buffer is.
#[derive(Debug, Clone, Copy)]
struct Claim {
    dest: Location,
    room: u64,
    event: Event,
    /// Bytes already copied into `dest` (a rendezvous pull brings the rest).
    copied: u64,
}

#[derive(Debug, Clone, Copy)]
struct Msg {
    generation: u32,
    live: bool,
    qpn: u32,
    hdr: TagHeader,
    at: Location,
    room: u32,
    /// Landed in an overflow buffer: waits on the unexpected list.
    unexpected: bool,
    landed: bool,
    received: u32,
    /// Events held until the data is in place.
    events: [Event; EVENTS_PER_MESSAGE],
    nev: u8,
    claim: Option<Claim>,
}

/// The worker's tagged-messaging state (see the module documentation).
pub struct TagShard {
    engine: MatchShard<DeepList>,
    endpoints: Vec<EndpointIndex>,
    quiet: bool,
    commands: Consumer<TagCommand>,
    events: Producer<TagEvent>,
    msgs: Vec<Msg>,
    free: Vec<u32>,
    staging: EventRing,
    /// Whether the commands older than the burst being received are served.
    burst: BurstCheck,
    /// The events of a message matched by `deliver`, which takes no record for it.
    scratch: [Event; EVENTS_PER_MESSAGE],
    /// Events held by recorded messages (kept free in the event ring).
    owed: usize,
    /// Pulls and done messages for queue pairs, from commands (claims), for the engine to hand
    /// to each queue pair.
    actions: VecDeque<(u32, Next)>,
    pub counters: TagCounters,
    paths: Arc<TagWakes>,
    /// Events pushed into the ring, ever.
    pushed: u64,
    /// Of them, those shown to the host ([`TagWakes::shown`]).
    shown: u64,
    /// Of them, those a wake-up followed (`publish_events`).
    woken: u64,
}

/// Where the shard is with the commands older than the frames it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BurstCheck {
    /// Frames one at a time: every message looks for older commands.
    Off,
    /// A burst whose older commands are not all served yet.
    Unserved,
    /// A burst whose older commands are served: its messages need not look.
    Served,
}

/// The wake-ups between the application and the shard: commands wake a sleeping worker,
/// events a waiting host.
#[derive(Debug, Default)]
struct TagWakes {
    commands: Arc<Wake>,
    events: Arc<Wake>,
    /// How long [`TagPort::wait`] spins before it sleeps (the worker's policy sets it).
    spin_ns: HostSpin,
    /// Events the host may take, ever: the worker raises it after a burst's frames and after
    /// an iteration, not at each event (see [`TagShard::show_events`]).
    shown: CachePadded<AtomicU64>,
}

/// The application's end: commands in, events out.
pub struct TagPort {
    commands: Producer<TagCommand>,
    events: Consumer<TagEvent>,
    paths: Arc<TagWakes>,
    /// Events taken, ever.
    taken: u64,
}

/// The command ring is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("tag command ring full")]
pub struct CommandRingFull;

impl TagPort {
    fn push(&mut self, c: TagCommand) -> Result<(), CommandRingFull> {
        self.commands.push(c).map_err(|_| CommandRingFull)?;
        self.paths.commands.notify();
        Ok(())
    }

    /// Appends `entry` to `endpoint`'s priority or overflow list. A priority append first
    /// claims a matching unexpected message (its data is copied into `entry`'s buffer).
    pub fn append(
        &mut self,
        endpoint: u16,
        list: ListKind,
        entry: TagEntry,
    ) -> Result<(), CommandRingFull> {
        self.push(TagCommand::Append {
            endpoint,
            list,
            entry,
        })
    }

    /// Searches `endpoint`'s unexpected list (MPI_Probe; with `SearchDelete`, MPI_Mprobe).
    pub fn search(
        &mut self,
        endpoint: u16,
        probe: TagEntry,
        mode: SearchMode,
    ) -> Result<(), CommandRingFull> {
        self.push(TagCommand::Search {
            endpoint,
            probe,
            mode,
        })
    }

    /// Unlinks the entry `handle` names (from its `Link` event).
    pub fn unlink(&mut self, handle: TagHandle) -> Result<(), CommandRingFull> {
        self.push(TagCommand::Unlink { handle })
    }

    /// Unlinks `endpoint`'s priority entry with `cookie` ([`TagCommand::Cancel`]).
    pub fn cancel(&mut self, endpoint: u16, cookie: u64) -> Result<(), CommandRingFull> {
        self.push(TagCommand::Cancel { endpoint, cookie })
    }

    /// Enables `endpoint` ([`TagCommand::Enable`]).
    pub fn enable(&mut self, endpoint: u16) -> Result<(), CommandRingFull> {
        self.push(TagCommand::Enable { endpoint })
    }

    /// Disables `endpoint` ([`TagCommand::Disable`]).
    pub fn disable(&mut self, endpoint: u16) -> Result<(), CommandRingFull> {
        self.push(TagCommand::Disable { endpoint })
    }

    /// Puts `endpoint` in software mode ([`TagCommand::SoftwareMode`]).
    pub fn software_mode(&mut self, endpoint: u16) -> Result<(), CommandRingFull> {
        self.push(TagCommand::SoftwareMode { endpoint })
    }

    /// Takes up to `max` headers off `endpoint`'s software request list
    /// ([`TagCommand::TakeSoftwareRequests`]).
    pub fn take_software_requests(
        &mut self,
        endpoint: u16,
        max: u16,
    ) -> Result<(), CommandRingFull> {
        self.push(TagCommand::TakeSoftwareRequests { endpoint, max })
    }

    /// `endpoint` matches again ([`TagCommand::ResumeMatching`]).
    pub fn resume_matching(&mut self, endpoint: u16) -> Result<(), CommandRingFull> {
        self.push(TagCommand::ResumeMatching { endpoint })
    }

    /// Commands that fit in the ring now.
    pub fn command_space(&self) -> usize {
        self.commands.slots()
    }

    /// Moves up to `out.len()` events into `out`; returns how many.
    #[inline]
    pub fn poll(&mut self, out: &mut [TagEvent]) -> usize {
        let shown = self.shown() - self.taken;
        let n = out.len().min(shown as usize);
        if n == 0 {
            return 0;
        }
        let Ok(chunk) = self.events.read_chunk(n) else {
            return 0;
        };
        let (a, b) = chunk.as_slices();
        out[..a.len()].copy_from_slice(a);
        out[a.len()..a.len() + b.len()].copy_from_slice(b);
        chunk.commit_all();
        self.taken += n as u64;
        n
    }

    /// Events shown to the host, ever. Acquire: the events are in the ring before it.
    #[inline]
    fn shown(&self) -> u64 {
        self.paths.shown.load(Ordering::Acquire)
    }

    /// The eventfd path the worker writes when it publishes events to a host waiting on it
    /// (as [`super::Cq::events`]).
    pub fn events(&self) -> Arc<Wake> {
        self.paths.events.clone()
    }

    /// Whether events wait to be polled.
    pub fn has_events(&self) -> bool {
        self.shown() != self.taken
    }

    /// Waits up to `timeout` for at least one event: spins for a short while (as
    /// [`super::Cq::wait`] does, by the worker's policy), then sleeps until the worker
    /// publishes one.
    pub fn wait(&mut self, out: &mut [TagEvent], timeout: Duration) -> usize {
        let start = Instant::now();
        let spin = Duration::from_nanos(self.paths.spin_ns.load(Ordering::Relaxed));
        loop {
            let n = self.poll(out);
            if n > 0 {
                return n;
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return 0;
            }
            if waited < spin {
                std::hint::spin_loop();
                continue;
            }
            // Bounded, like every wait here; the fences make a missed wake-up impossible.
            let left = (timeout - waited).min(Duration::from_millis(10));
            let (paths, taken) = (&self.paths, self.taken);
            wake::sleep(&[&paths.events], left.as_nanos() as u64, || {
                paths.shown.load(Ordering::Acquire) != taken
            });
        }
    }

    /// Waits for one event.
    pub fn wait_one(&mut self, timeout: Duration) -> Option<TagEvent> {
        let mut one = [TagEvent::EMPTY];
        (self.wait(&mut one, timeout) == 1).then_some(one[0])
    }
}

impl TagShard {
    /// The shard and the application's port, whose waits spin for `spin_ns` (its engine's).
    pub(crate) fn new(cfg: &TagConfig, spin_ns: HostSpin) -> Result<(TagShard, TagPort), LpeError> {
        let mut engine = MatchShard::new(EngineId(0), cfg.engine.clone());
        for &(ep, ec) in &cfg.endpoints {
            engine.add_endpoint(ep, ec)?;
        }
        let (cp, cc) = RingBuffer::new(cfg.command_depth.max(1));
        let (ep, ec) = RingBuffer::new(cfg.event_depth.max(COMMAND_EVENT_ROOM * 2));
        // The host always sleeps on its events (`Wake::to_host` is armed: the worker fences
        // once per iteration with new events); the commands' path is armed by an adaptive
        // worker.
        let paths = Arc::new(TagWakes {
            spin_ns,
            events: Arc::new(Wake::to_host()),
            ..Default::default()
        });
        let n = cfg.max_messages.max(1);
        let blank = Msg {
            generation: 0,
            live: false,
            qpn: 0,
            hdr: TagHeader {
                kind: TagKind::Eager,
                endpoint: 0,
                initiator: 0,
                match_bits: 0,
                hdr_data: 0,
                length: 0,
                cookie: 0,
            },
            at: Location::NOWHERE,
            room: 0,
            unexpected: false,
            landed: false,
            received: 0,
            events: [NO_EVENT; EVENTS_PER_MESSAGE],
            nev: 0,
            claim: None,
        };
        Ok((
            TagShard {
                engine,
                endpoints: cfg.endpoints.iter().map(|&(ep, _)| ep).collect(),
                quiet: cfg.quiet,
                commands: cc,
                events: ep,
                msgs: vec![blank; n],
                free: (0..n as u32).rev().collect(),
                staging: EventRing::new(STAGING),
                burst: BurstCheck::Off,
                scratch: [NO_EVENT; EVENTS_PER_MESSAGE],
                owed: 0,
                actions: VecDeque::with_capacity(n),
                counters: TagCounters::default(),
                paths: paths.clone(),
                pushed: 0,
                shown: 0,
                woken: 0,
            },
            TagPort {
                commands: cp,
                events: ec,
                paths,
                taken: 0,
            },
        ))
    }

    /// The processing engine (its endpoints' counters, its cache).
    pub fn engine(&self) -> &MatchShard<DeepList> {
        &self.engine
    }

    /// Messages recorded now (in flight, being pulled, or unexpected).
    pub fn recorded(&self) -> usize {
        self.msgs.len() - self.free.len()
    }

    /// Region `slot` is being deregistered: entries whose buffer lies in it can take no more
    /// messages, so they are unlinked now, each reported by an `AutoUnlink` event (verbs
    /// fails a receive whose buffer was deregistered; here it never matches). The control path
    /// only: this walks every list.
    pub fn region_retired(&mut self, slot: u32) {
        let mut doomed = Vec::new();
        for &ep in &self.endpoints {
            let Some(e) = self.engine.endpoint(ep) else {
                continue;
            };
            for list in [ListKind::Priority, ListKind::Overflow] {
                e.for_each_entry(list, &mut |h, me| {
                    if unpack(me.start).region == slot {
                        doomed.push((h, me.cookie));
                    }
                });
            }
        }
        for (h, cookie) in doomed {
            if self.engine.unlink(h).is_ok() {
                self.push_event(TagEvent {
                    kind: TagEventKind::AutoUnlink,
                    endpoint: h.ep.0,
                    list: h.list,
                    cookie,
                    ..TagEvent::EMPTY
                });
            }
        }
    }

    /// Whether a recorded message (arriving, being pulled, or waiting on an unexpected list
    /// with its data in an overflow buffer) lies in region `slot`: its deregistration waits.
    pub fn uses_region(&self, slot: u32) -> bool {
        self.msgs.iter().any(|m| {
            m.live && (m.at.region == slot || m.claim.is_some_and(|c| c.dest.region == slot))
        })
    }

    /// The queue pair carrying message `token` failed before its data was all in place (its
    /// pull failed or could not start, or it failed while the message arrived): the message's
    /// data event is written now with `NiFail::Undeliverable` and what is in place, and its
    /// record freed.
    pub fn undeliverable(&mut self, token: u64, mem: &MemoryTable) {
        let Some(i) = self.msg(token) else {
            return;
        };
        self.counters.undeliverable += 1;
        let m = self.msgs[i];
        let rndv = matches!(m.hdr.kind, TagKind::Rendezvous { .. });
        if let Some(c) = m.claim {
            let mut e = c.event;
            e.fail = NiFail::Undeliverable;
            e.mlength = c.copied;
            self.emit(&e, mem, rndv);
        } else {
            let have = if m.landed {
                u64::from(m.received.min(m.room))
            } else {
                0
            };
            for k in 0..m.nev as usize {
                if self.msgs[i].events[k].kind == EventKind::Put {
                    self.msgs[i].events[k].fail = NiFail::Undeliverable;
                }
            }
            self.emit_held(i, have, mem);
        }
        self.release(i);
    }

    /// The next queue pair action from a command, for the engine to carry out.
    pub fn take_action(&mut self) -> Option<(u32, Next)> {
        self.actions.pop_front()
    }

    fn token(&self, i: u32) -> u64 {
        u64::from(self.msgs[i as usize].generation) << 32 | u64::from(i)
    }

    fn msg(&mut self, token: u64) -> Option<usize> {
        let i = (token & 0xffff_ffff) as usize;
        let m = self.msgs.get(i)?;
        (m.live && u64::from(m.generation) == token >> 32).then_some(i)
    }

    fn release(&mut self, i: usize) {
        let m = &mut self.msgs[i];
        // Not `usize::from(bool)`: see `docs/toolchain.md` (rust-lang/rust#158206).
        let claim = if m.claim.is_some() { 1 } else { 0 };
        self.owed -= m.nev as usize + claim;
        m.live = false;
        m.nev = 0;
        m.claim = None;
        m.generation = m.generation.wrapping_add(1);
        self.free.push(i as u32);
    }

    /// Writes one event into the application's ring, translating where its data is.
    fn emit(&mut self, e: &Event, mem: &MemoryTable, rendezvous: bool) {
        self.emit_with(e, mem, rendezvous, None)
    }

    fn emit_with(
        &mut self,
        e: &Event,
        mem: &MemoryTable,
        rendezvous: bool,
        handle: Option<TagHandle>,
    ) {
        let ev = tag_event(e, e.mlength, mem, rendezvous, handle);
        if ev.truncated {
            self.counters.truncated += 1;
        }
        self.push_event(ev);
    }

    fn push_event(&mut self, ev: TagEvent) {
        if !push_event(&mut self.events, &mut self.pushed, ev) {
            self.counters.events_lost += 1;
        }
    }

    /// Shows the host the events pushed so far: one store to a line its polls read, where a
    /// push, whose ring's write index the host polls as well, would take the line back from
    /// the host's core at each event.
    fn show_events(&mut self) {
        if self.shown != self.pushed {
            self.shown = self.pushed;
            self.paths.shown.store(self.pushed, Ordering::Release);
        }
    }

    /// After an iteration's events: shows them, and wakes a host sleeping in
    /// [`TagPort::wait`].
    pub fn publish_events(&mut self) {
        self.show_events();
        if self.woken != self.pushed {
            self.woken = self.pushed;
            self.paths.events.notify();
        }
    }

    /// The command path's wake-up, for a worker that sleeps (adaptive polling).
    pub fn command_wake(&self) -> &Arc<Wake> {
        &self.paths.commands
    }

    /// Pulls and done messages wait to be handed to queue pairs.
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// The application has pushed commands not served yet.
    pub fn commands_pending(&self) -> bool {
        !self.commands.is_empty()
    }

    /// Emits a recorded message's held events with the final `mlength` on its put. Always
    /// inline: a quiet shard's message holds one event, its put, and the call around that one
    /// was 39 instructions (callgrind, `tagged8x32` 3 252.8 -> 3 213.9).
    #[inline(always)]
    fn emit_held(&mut self, i: usize, mlength: u64, mem: &MemoryTable) {
        // The record's fields, not a copy of it: a `Msg` with its held events and claim is
        // about 600 bytes, and copying it whole here and in `landed` was 76 instructions of
        // `memcpy` a message (callgrind, `tagged8x32`).
        let m = &self.msgs[i];
        let (nev, rndv) = (
            m.nev as usize,
            matches!(m.hdr.kind, TagKind::Rendezvous { .. }),
        );
        for k in 0..nev {
            let e = self.msgs[i].events[k];
            self.emit_landed(e, mlength, mem, rndv);
        }
        self.owed -= nev;
        self.msgs[i].nev = 0;
    }

    /// Writes event `e`, held while its message arrived, once `mlength` bytes of it are in
    /// place.
    #[inline(always)]
    fn emit_landed(&mut self, mut e: Event, mlength: u64, mem: &MemoryTable, rndv: bool) {
        landed(&mut e, mlength);
        self.emit(&e, mem, rndv);
    }

    /// Copies `len` bytes inside registered memory (overflow buffer → appended buffer).
    fn copy(mem: &MemoryTable, from: Location, to: Location, len: u64) {
        let mut buf = [0u8; 2048];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            mem.fetch(from.advance(done), &mut buf[..n]);
            mem.store(to.advance(done), &buf[..n]);
            done += n as u64;
        }
    }

    /// An unexpected message `i` that has landed is claimed into `claim.dest`: copy what the
    /// overflow buffer holds, and pull the rest of a rendezvous.
    fn settle_claim(&mut self, i: usize, claim: Claim, mem: &MemoryTable) -> Next {
        self.counters.unexpected_claimed += 1;
        let m = self.msgs[i];
        let rlength = u64::from(m.hdr.length);
        let want = rlength.min(claim.room);
        let held = u64::from(m.received.min(m.room));
        let have = held.min(want);
        if claim.dest != Location::NOWHERE {
            Self::copy(mem, m.at, claim.dest, have);
        }
        let mut event = claim.event;
        event.start = pack(claim.dest);
        event.rlength = rlength;
        event.mlength = want;
        match m.hdr.kind {
            TagKind::Rendezvous { addr, rkey } if want > have => {
                // Held until the pull completes (see `pulled`).
                self.msgs[i].claim = Some(Claim {
                    event,
                    copied: have,
                    ..claim
                });
                self.owed += 1;
                self.counters.rendezvous_pulls += 1;
                Next::Pull(Pull {
                    local: claim.dest.advance(have),
                    len: (want - have) as u32,
                    remote_addr: addr.wrapping_add(have),
                    rkey,
                    token: self.token(i as u32),
                })
            }
            kind => {
                self.emit(&event, mem, matches!(kind, TagKind::Rendezvous { .. }));
                let cookie = m.hdr.cookie;
                self.release(i);
                match kind {
                    TagKind::Rendezvous { .. } => Next::Done {
                        cookie,
                        length: want as u32,
                    },
                    _ => Next::Nothing,
                }
            }
        }
    }

    /// Whether the event ring has room for `need` more events. The room the producer knows
    /// of is asked first, the ring only when that falls short: its read index is the host's,
    /// on a line the host's core writes as it takes events, and loading it for every message
    /// and every command was a cache miss each (`perf`: three quarters of `serve_commands`'s
    /// samples were this load, the command ring's index and the command itself).
    #[inline(always)]
    fn event_room(&self, need: usize) -> bool {
        self.events.cached_slots() >= need || self.events.slots() >= need
    }

    /// Serves host commands while the event ring has room for what they may write. True
    /// when it served them all (false: some wait for room).
    pub fn serve_commands(&mut self, mem: &MemoryTable) -> bool {
        while self.event_room(self.owed + COMMAND_EVENT_ROOM) {
            let Ok(cmd) = self.commands.pop() else {
                return true;
            };
            self.counters.commands += 1;
            self.command(cmd, mem);
        }
        false
    }

    /// The slots of the `ready` commands waiting (up to [`PREFETCH_COMMANDS`]) are lines the
    /// host's core wrote: asked for together, before the first is read, they come over side
    /// by side, not one after another as each command is served. Out of line: a lone command,
    /// read at once, does not need it.
    #[inline(never)]
    fn prefetch_commands(&mut self, ready: usize) {
        if let Ok(chunk) = self.commands.read_chunk(ready.min(PREFETCH_COMMANDS)) {
            let (a, b) = chunk.as_slices();
            pmem::prefetch(a);
            pmem::prefetch(b);
        }
    }

    /// Frames taken off the wire together are received from now until [`TagShard::end_burst`]
    /// ([`crate::RdmaNode::begin_rx_burst`]): the commands pushed before them are served at the
    /// burst's first tagged message, and not looked for again at the others. Each look loads
    /// the command ring's write index, a line the host's core writes as it posts receives: a
    /// cache miss at nearly every message (`portico bench tagged`, eager 8 B at depth 1 000,
    /// 5 interleaved pairs: 4.24-4.75 -> 4.74-4.95 M msg/s in this VM's fast phase). Any
    /// command older than the burst is still served before its first message is matched.
    ///
    /// That one look is made here, before the frames are parsed: the ring's write index is
    /// loaded now and cached by the ring, so the miss overlaps the first frame's work instead
    /// of stalling the first match (one process, alternating pairs, eager 8 B at depth 1 000:
    /// ×1.166 in the VM's middle level, 15 of 16; ×1.007 in its fast level, 11 of 16). The
    /// commands served before the first match are still at least every one pushed before the
    /// burst. The commands it finds have their lines prefetched here too
    /// (`prefetch_commands`), and so are the event slots the burst's `frames` messages fill
    /// (`prefetch_events`).
    pub fn begin_burst(&mut self, frames: usize) {
        self.burst = BurstCheck::Unserved;
        let ready = self.commands.slots();
        if ready > 1 {
            self.prefetch_commands(ready);
        }
        self.prefetch_events(frames);
    }

    /// The next event slots, one for each of a burst's `frames` messages (an eager message
    /// makes one event), asked for writing (`pmem::prefetch_write`). They are lines the host's
    /// core read last, as it took the events they held one lap of the ring ago: each event's
    /// store waited at the head of the store buffer for its line, and the stores behind it
    /// waited too (`perf`: the worker's samples in the VM's slow level sat on a store,
    /// `match_incoming`'s first `push`). Asked for together, they come over side by side
    /// (one process, alternating, eager 8 B at depth 1 000: see `docs/rdma.md`).
    #[inline(never)]
    fn prefetch_events(&mut self, frames: usize) {
        let n = frames.min(self.events.slots());
        if let Ok(mut chunk) = self.events.write_chunk_uninit(n) {
            // Not committed: dropped, the chunk leaves the ring as it was.
            let (a, b) = chunk.as_mut_slices();
            pmem::prefetch_write(a);
            pmem::prefetch_write(b);
        }
    }

    /// The burst [`TagShard::begin_burst`] began has been received: each message looks for
    /// older commands again.
    pub fn end_burst(&mut self) {
        self.burst = BurstCheck::Off;
        self.show_events();
    }

    fn fail_command(&mut self, endpoint: u16, cookie: u64, error: TagCommandError) {
        self.counters.commands_failed += 1;
        self.push_event(TagEvent {
            kind: TagEventKind::CommandFailed,
            endpoint,
            cookie,
            error: Some(error),
            ..TagEvent::EMPTY
        });
    }

    fn command(&mut self, cmd: TagCommand, mem: &MemoryTable) {
        match cmd {
            TagCommand::Append {
                endpoint,
                list,
                entry,
            } => {
                let ep = EndpointIndex(endpoint);
                if self.engine.endpoint(ep).is_none() {
                    return self.fail_command(
                        endpoint,
                        entry.cookie,
                        TagCommandError::NoSuchEndpoint,
                    );
                }
                let b = entry.buf;
                let Ok(at) = mem.check_local(b.lkey, b.addr, u64::from(b.len), Access::LOCAL_WRITE)
                else {
                    return self.fail_command(endpoint, entry.cookie, TagCommandError::BadBuffer);
                };
                // Quiet: the list-processing engine writes no events the host would be
                // spared (they were written, staged and dropped here; callgrind, `tagged8x32`:
                // 3 857.5 -> 3 650.1 a message).
                let mut options = entry.options | Options::OP_PUT;
                if self.quiet && entry.options.contains(Options::USE_ONCE) {
                    options |= Options::EVENT_LINK_DISABLE;
                }
                if self.quiet && list == ListKind::Priority {
                    options |= Options::EVENT_UNLINK_DISABLE;
                }
                let me = MatchEntry {
                    match_bits: entry.match_bits,
                    ignore_bits: entry.ignore_bits,
                    source: entry.source(),
                    start: pack(at),
                    length: u64::from(b.len),
                    offset: 0,
                    min_free: entry.min_free,
                    options,
                    cookie: entry.cookie,
                };
                self.staging.clear();
                let r = self.engine.append(ep, list, me, &mut self.staging);
                let handle = match r {
                    Ok(Appended::Linked { handle, .. }) => Some(TagHandle(handle)),
                    Ok(Appended::ConsumedUnexpected) => None,
                    Err(e) => {
                        let why = match e {
                            LpeError::ListFull(_) => TagCommandError::ListFull,
                            _ => TagCommandError::Other,
                        };
                        self.fail_command(endpoint, entry.cookie, why);
                        None
                    }
                };
                self.after_command(Some((at, u64::from(b.len))), handle, mem);
            }
            TagCommand::Search {
                endpoint,
                probe,
                mode,
            } => {
                let ep = EndpointIndex(endpoint);
                let me = MatchEntry {
                    match_bits: probe.match_bits,
                    ignore_bits: probe.ignore_bits,
                    source: probe.source(),
                    start: 0,
                    length: u64::MAX,
                    offset: 0,
                    min_free: 0,
                    options: probe.options | Options::OP_PUT,
                    cookie: probe.cookie,
                };
                self.staging.clear();
                if self.engine.search(ep, me, mode, &mut self.staging).is_err() {
                    return self.fail_command(
                        endpoint,
                        probe.cookie,
                        TagCommandError::NoSuchEndpoint,
                    );
                }
                self.after_command(None, None, mem);
            }
            TagCommand::Cancel { endpoint, cookie } => {
                let ep = EndpointIndex(endpoint);
                let mut found = None;
                if let Some(e) = self.engine.endpoint(ep) {
                    e.for_each_entry(ListKind::Priority, &mut |h, me| {
                        if found.is_none() && me.cookie == cookie {
                            found = Some(h);
                        }
                    });
                }
                match found.map(|h| self.engine.unlink(h)) {
                    Some(Ok(_)) => self.push_event(TagEvent {
                        kind: TagEventKind::AutoUnlink,
                        endpoint,
                        list: ListKind::Priority,
                        cookie,
                        ..TagEvent::EMPTY
                    }),
                    _ => self.fail_command(endpoint, cookie, TagCommandError::StaleHandle),
                }
            }
            TagCommand::Unlink { handle } => {
                if self.engine.unlink(handle.0).is_err() {
                    let cookie = 0;
                    self.fail_command(handle.0.ep.0, cookie, TagCommandError::StaleHandle);
                }
            }
            TagCommand::Enable { endpoint } => {
                if self.engine.enable(EndpointIndex(endpoint)).is_err() {
                    self.fail_command(endpoint, 0, TagCommandError::NoSuchEndpoint);
                }
            }
            TagCommand::Disable { endpoint } => {
                if self.engine.disable(EndpointIndex(endpoint)).is_err() {
                    self.fail_command(endpoint, 0, TagCommandError::NoSuchEndpoint);
                }
            }
            TagCommand::SoftwareMode { endpoint } => {
                self.staging.clear();
                let ep = EndpointIndex(endpoint);
                if self
                    .engine
                    .enter_software_mode(ep, &mut self.staging)
                    .is_err()
                {
                    return self.fail_command(endpoint, 0, TagCommandError::NoSuchEndpoint);
                }
                self.after_command(None, None, mem);
            }
            TagCommand::TakeSoftwareRequests { endpoint, max } => {
                let ep = EndpointIndex(endpoint);
                if self.engine.endpoint(ep).is_none() {
                    return self.fail_command(endpoint, 0, TagCommandError::NoSuchEndpoint);
                }
                // Within the event room this command was served with: the rest stays listed.
                let room = self.events.slots().saturating_sub(self.owed);
                for _ in 0..usize::from(max).min(room) {
                    let Ok(Some(h)) = self.engine.pop_software_request(ep) else {
                        break;
                    };
                    self.push_event(TagEvent {
                        kind: TagEventKind::SoftwareRequest,
                        endpoint,
                        match_bits: h.match_bits,
                        rlength: h.rlength,
                        initiator: h.initiator.nid,
                        hdr_data: h.hdr_data,
                        ..TagEvent::EMPTY
                    });
                }
            }
            TagCommand::ResumeMatching { endpoint } => {
                match self.engine.resume_matching(EndpointIndex(endpoint)) {
                    Ok(()) => {}
                    Err(LpeError::NoSuchEndpoint(_)) => {
                        self.fail_command(endpoint, 0, TagCommandError::NoSuchEndpoint)
                    }
                    Err(_) => self.fail_command(endpoint, 0, TagCommandError::Other),
                }
            }
        }
    }

    /// Writes the events a command produced; unexpected messages it claimed are settled into
    /// `dest` (an append) or handed over where they are (search-and-delete). A command that
    /// produced none (a quiet shard's append of a receive that claimed nothing) is told
    /// apart inline: as a call, the look at the empty staging ring was 22 instructions a
    /// re-posted receive (callgrind, `tagged8x32`).
    #[inline(always)]
    fn after_command(
        &mut self,
        dest: Option<(Location, u64)>,
        handle: Option<TagHandle>,
        mem: &MemoryTable,
    ) {
        if self.staging.is_empty() && self.staging.lost() == 0 {
            return;
        }
        self.write_staged(dest, handle, mem);
    }

    /// [`TagShard::after_command`] of a command that staged events or lost some.
    #[inline(never)]
    fn write_staged(
        &mut self,
        dest: Option<(Location, u64)>,
        handle: Option<TagHandle>,
        mem: &MemoryTable,
    ) {
        self.counters.events_lost += self.staging.lost();
        // A claimed message still arriving into its overflow buffer: that buffer's AUTO_FREE
        // waits with it, or the application could re-link the buffer under the data.
        let mut arriving: Option<usize> = None;
        while let Some(e) = self.staging.pop() {
            if e.kind == EventKind::AutoFree
                && let Some(i) = arriving
                && (self.msgs[i].nev as usize) < EVENTS_PER_MESSAGE
            {
                let m = &mut self.msgs[i];
                m.events[m.nev as usize] = e;
                m.nev += 1;
                self.owed += 1;
                continue;
            }
            if e.kind != EventKind::PutOverflow {
                match e.kind {
                    EventKind::Link => self.emit_with(&e, mem, false, handle),
                    _ => self.emit(&e, mem, false),
                }
                continue;
            }
            let Some(i) = self.msg(e.token) else {
                self.emit(&e, mem, false);
                continue;
            };
            let qpn = self.msgs[i].qpn;
            let claim = match dest {
                Some((at, room)) => Claim {
                    dest: at,
                    room,
                    event: e,
                    copied: 0,
                },
                // Search-and-delete: the data stays in the overflow buffer.
                None => Claim {
                    dest: Location::NOWHERE,
                    room: 0,
                    event: Event {
                        start: pack(self.msgs[i].at),
                        ..e
                    },
                    copied: 0,
                },
            };
            if !self.msgs[i].landed {
                // Still arriving: settled when its last packet lands.
                self.msgs[i].claim = Some(claim);
                self.owed += 1;
                arriving = Some(i);
                continue;
            }
            let next = if dest.is_some() {
                self.settle_claim(i, claim, mem)
            } else {
                self.hand_over(i, claim.event, mem)
            };
            if next != Next::Nothing {
                self.actions.push_back((qpn, next));
            }
        }
    }

    /// Search-and-delete took unexpected message `i`: the application gets it where it is; a
    /// rendezvous sender is told it is done with what the overflow buffer holds.
    fn hand_over(&mut self, i: usize, mut event: Event, mem: &MemoryTable) -> Next {
        let m = self.msgs[i];
        let held = u64::from(m.received.min(m.room));
        event.rlength = u64::from(m.hdr.length);
        event.mlength = held;
        let rndv = matches!(m.hdr.kind, TagKind::Rendezvous { .. });
        self.emit(&event, mem, rndv);
        self.release(i);
        if rndv {
            Next::Done {
                cookie: m.hdr.cookie,
                length: held as u32,
            }
        } else {
            Next::Nothing
        }
    }
}

/// Event `e`, held while its message arrived, made the event of its landing once `mlength`
/// bytes of it are in place: a put says that many.
#[inline(always)]
fn landed(e: &mut Event, mlength: u64) {
    e.mlength = landed_length(e, mlength);
}

/// The `mlength` of held event `e` once `mlength` bytes of its message are in place.
#[inline(always)]
fn landed_length(e: &Event, mlength: u64) -> u64 {
    if e.kind == EventKind::Put {
        mlength
    } else {
        e.mlength
    }
}

/// Pushes `ev` into the application's event ring `events` (`pushed` counts it); false when
/// the ring is full (the event is lost).
#[inline(always)]
fn push_event(events: &mut Producer<TagEvent>, pushed: &mut u64, ev: TagEvent) -> bool {
    if events.push(ev).is_err() {
        return false;
    }
    *pushed += 1;
    true
}

/// The application's event for the list-processing engine's event `e`, whose `mlength` is
/// `mlength`, translating where its data is.
#[inline(always)]
fn tag_event(
    e: &Event,
    mlength: u64,
    mem: &MemoryTable,
    rendezvous: bool,
    handle: Option<TagHandle>,
) -> TagEvent {
    let kind = match e.kind {
        EventKind::Put | EventKind::Get => match e.list {
            ListKind::Priority => TagEventKind::Put,
            ListKind::Overflow => TagEventKind::PutOverflow,
        },
        EventKind::PutOverflow | EventKind::GetOverflow => TagEventKind::UnexpectedConsumed,
        EventKind::Link => TagEventKind::Link,
        EventKind::AutoUnlink => TagEventKind::AutoUnlink,
        EventKind::AutoFree => TagEventKind::AutoFree,
        EventKind::Search => TagEventKind::Search,
        EventKind::PtDisabled => TagEventKind::PtDisabled,
        EventKind::SoftwareMode => TagEventKind::SoftwareMode,
    };
    let carries = matches!(
        kind,
        TagEventKind::Put | TagEventKind::PutOverflow | TagEventKind::UnexpectedConsumed
    );
    // A rendezvous that went unexpected holds only its first chunk: the rest waits at the
    // sender for the claim, nothing was discarded.
    let waits_for_claim = rendezvous && kind == TagEventKind::PutOverflow;
    TagEvent {
        kind,
        fail: e.fail,
        endpoint: e.ep.0,
        list: e.list,
        cookie: e.cookie,
        addr: if e.start == 0 {
            0
        } else {
            mem.address_of(unpack(e.start))
        },
        match_bits: e.match_bits,
        rlength: e.rlength,
        mlength,
        initiator: e.initiator.nid,
        hdr_data: e.hdr_data,
        truncated: carries && mlength < e.rlength && !waits_for_claim && e.fail == NiFail::Ok,
        rendezvous: carries && rendezvous,
        error: None,
        handle,
    }
}

/// The events of a one-packet eager message's match (`deliver`): an overflow buffer's held
/// for the message's claim, as [`Held`] holds them; the others written into the
/// application's ring at once, with the length that lands (`data_len` bytes came, and are
/// placed before the host is shown the events: [`TagShard::show_events`]). Held and read
/// back, they were 40 instructions more a message (callgrind, `tagged8x32` 2 746.4 ->
/// 2 706.2, with this sink's `push_event` inline in the match: out of line it saved 7).
struct Direct<'a> {
    held: Held<'a>,
    events: &'a mut Producer<TagEvent>,
    mem: &'a MemoryTable,
    data_len: u64,
    pushed: u64,
    truncated: u64,
    lost: u64,
}

impl EventSink for Direct<'_> {
    #[inline(always)]
    fn push_event(&mut self, event: Event) {
        if event.list == ListKind::Overflow {
            return self.held.push_event(event);
        }
        // A put places what came, as far as the match's room goes.
        let mlength = landed_length(&event, self.data_len.min(event.mlength));
        let ev = tag_event(&event, mlength, self.mem, false, None);
        if ev.truncated {
            self.truncated += 1;
        }
        if !push_event(self.events, &mut self.pushed, ev) {
            self.lost += 1;
        }
    }
}

/// The events of a message's match, written into its record (or, for `deliver`, the shard's
/// scratch array): the first [`EVENTS_PER_MESSAGE`], the rest counted.
struct Held<'a> {
    events: &'a mut [Event; EVENTS_PER_MESSAGE],
    n: u8,
    extra: u64,
}

impl EventSink for Held<'_> {
    #[inline]
    fn push_event(&mut self, event: Event) {
        match self.events.get_mut(usize::from(self.n)) {
            Some(slot) => {
                *slot = event;
                self.n += 1;
            }
            None => self.extra += 1,
        }
    }
}

impl TagShard {
    /// Whether a message may be matched now: its endpoint homed here (else it is refused),
    /// the commands pushed before it served, room for its events and a record (else not
    /// yet). The free record's index, not taken.
    #[inline(always)]
    fn admit(&mut self, hdr: &TagHeader, mem: &MemoryTable) -> Result<u32, Landing> {
        let ep = EndpointIndex(hdr.endpoint);
        if self.engine.endpoint(ep).is_none() {
            self.counters.wrong_engine += 1;
            return Err(Landing::Refuse);
        }
        // Every command the application pushed before this packet was taken off the wire is
        // carried out first, so a receive posted before the message arrived is matched (the
        // library's block bit: a network request sees every older command). In a burst, once
        // for all of its packets (`begin_burst`).
        if self.burst != BurstCheck::Served {
            let served = self.commands.is_empty() || self.serve_commands(mem);
            if served && self.burst == BurstCheck::Unserved {
                self.burst = BurstCheck::Served;
            }
        }
        if !self.event_room(self.owed + EVENTS_PER_MESSAGE * 2) {
            self.counters.not_ready += 1;
            return Err(Landing::NotReady);
        }
        let Some(&i) = self.free.last() else {
            self.counters.not_ready += 1;
            return Err(Landing::NotReady);
        };
        Ok(i)
    }

    /// Matches the message `token` names, its match's events into `events` (the message's
    /// record, or the scratch array): where its data goes, the room there, and whether that is
    /// an overflow buffer (the message unexpected); then the events held and those lost.
    #[inline(always)]
    fn match_message(
        engine: &mut MatchShard<DeepList>,
        counters: &mut TagCounters,
        token: u64,
        hdr: &TagHeader,
        events: &mut impl EventSink,
    ) -> (Location, u32, bool) {
        let ih = IncomingHeader::put(
            ProcessId::rank(hdr.initiator),
            hdr.match_bits,
            u64::from(hdr.length),
        )
        .with_hdr_data(hdr.hdr_data)
        .with_token(token);
        match engine.match_incoming(EndpointIndex(hdr.endpoint), &ih, events) {
            MatchOutcome::Delivered(d) => {
                if d.list == ListKind::Priority {
                    counters.matched_priority += 1;
                } else {
                    counters.matched_overflow += 1;
                }
                (
                    unpack(d.address),
                    d.mlength.min(u64::from(u32::MAX)) as u32,
                    d.list == ListKind::Overflow,
                )
            }
            // Consumed with nothing placed: the endpoint dropped it, disabled itself, or
            // queued the header for host matching (data is not kept).
            _ => {
                counters.dropped += 1;
                (Location::NOWHERE, 0, false)
            }
        }
    }

    /// Record `i` (taken) for a message being received: its header, where it lands, and
    /// `nev` held events (already in the record); `extra` more were lost.
    #[inline(always)]
    fn record(
        &mut self,
        i: u32,
        qpn: u32,
        hdr: &TagHeader,
        (at, room, unexpected): (Location, u32, bool),
        nev: u8,
        extra: u64,
    ) {
        let m = &mut self.msgs[i as usize];
        m.live = true;
        m.qpn = qpn;
        m.hdr = *hdr;
        m.at = at;
        m.room = room;
        m.unexpected = unexpected;
        m.landed = false;
        m.received = 0;
        m.claim = None;
        m.nev = nev;
        self.owed += usize::from(nev);
        self.counters.events_lost += extra;
    }
}

impl TagTarget for TagShard {
    fn arrive(&mut self, qpn: u32, hdr: &TagHeader, mem: &MemoryTable) -> Landing {
        let i = match self.admit(hdr, mem) {
            Ok(i) => i,
            Err(refused) => return refused,
        };
        self.free.pop();
        let token = self.token(i);
        // The match's events go straight into the message's record, where they wait for its
        // data (through the staging ring they were copied twice more: callgrind,
        // `tagged8x32`, 3 566.0 -> 3 495.9 a message).
        let mut held = Held {
            events: &mut self.msgs[i as usize].events,
            n: 0,
            extra: 0,
        };
        let place =
            Self::match_message(&mut self.engine, &mut self.counters, token, hdr, &mut held);
        let (nev, extra) = (held.n, held.extra);
        self.record(i, qpn, hdr, place, nev, extra);
        Landing::Place {
            at: place.0,
            room: place.1,
            token,
        }
    }

    /// A message of one packet: matched, placed and reported at once. One that matched a
    /// posted receive (or nothing) takes no record: its events are written into the host's
    /// ring as the match makes them (`Direct`) and shown to the host after its data is in
    /// place (through `arrive` and `landed`, with the record written, read and released,
    /// callgrind counted 54 instructions more: `tagged8x32` 3 213.9 -> 3 159.9). One on an
    /// overflow buffer waits there for its claim, which finds it by its record. A rendezvous
    /// envelope goes the two calls' way (its pull finds its record).
    fn deliver(&mut self, qpn: u32, hdr: &TagHeader, data: &[u8], mem: &MemoryTable) -> Delivery {
        if hdr.kind != TagKind::Eager {
            return deliver_in_two(self, qpn, hdr, data, mem);
        }
        let i = match self.admit(hdr, mem) {
            Ok(i) => i,
            Err(Landing::NotReady) => return Delivery::NotReady,
            Err(_) => return Delivery::Refuse,
        };
        let token = self.token(i);
        let mut direct = Direct {
            held: Held {
                events: &mut self.scratch,
                n: 0,
                extra: 0,
            },
            events: &mut self.events,
            mem,
            data_len: data.len() as u64,
            pushed: 0,
            truncated: 0,
            lost: 0,
        };
        let place = Self::match_message(
            &mut self.engine,
            &mut self.counters,
            token,
            hdr,
            &mut direct,
        );
        let (nev, extra) = (direct.held.n, direct.held.extra);
        self.pushed += direct.pushed;
        self.counters.truncated += direct.truncated;
        self.counters.events_lost += direct.lost;
        let (at, room, unexpected) = place;
        if unexpected {
            self.free.pop();
            self.msgs[i as usize].events = self.scratch;
            self.record(i, qpn, hdr, place, nev, extra);
            mem.store(at, &data[..data.len().min(room as usize)]);
            return Delivery::Placed(self.landed(qpn, token, data.len() as u32, mem));
        }
        // The token named this message only inside the match (in its events, written): the
        // record's next user gets another.
        let m = &mut self.msgs[i as usize];
        m.generation = m.generation.wrapping_add(1);
        let placed = data.len().min(room as usize);
        mem.store(at, &data[..placed]);
        self.counters.events_lost += extra;
        // Events held for an overflow buffer in a match that placed nothing there (none is
        // known to make one): written now, as they were before the held events went direct.
        for k in 0..usize::from(nev) {
            let e = self.scratch[k];
            self.emit_landed(e, placed as u64, mem, false);
        }
        Delivery::Placed(Next::Nothing)
    }

    fn landed(&mut self, _qpn: u32, token: u64, received: u32, mem: &MemoryTable) -> Next {
        let Some(i) = self.msg(token) else {
            return Next::Nothing;
        };
        let m = &mut self.msgs[i];
        m.landed = true;
        m.received = received;
        let landed = u64::from(received.min(m.room));
        let (room, at, hdr) = (m.room, m.at, m.hdr);
        if m.unexpected {
            // In the overflow buffer; the header waits on the unexpected list for its claim.
            self.emit_held(i, landed, mem);
            return match self.msgs[i].claim.take() {
                Some(c) => {
                    self.owed -= 1;
                    if c.dest == Location::NOWHERE {
                        self.hand_over(i, c.event, mem)
                    } else {
                        self.settle_claim(i, c, mem)
                    }
                }
                None => Next::Nothing,
            };
        }
        match hdr.kind {
            TagKind::Rendezvous { addr, rkey } if u64::from(room) > landed => {
                self.counters.rendezvous_pulls += 1;
                Next::Pull(Pull {
                    local: at.advance(landed),
                    len: room - landed as u32,
                    remote_addr: addr.wrapping_add(landed),
                    rkey,
                    token,
                })
            }
            kind => {
                self.emit_held(i, landed, mem);
                self.release(i);
                match kind {
                    TagKind::Rendezvous { .. } => Next::Done {
                        cookie: hdr.cookie,
                        length: landed as u32,
                    },
                    _ => Next::Nothing,
                }
            }
        }
    }
}

impl TagShard {
    /// A pull a queue pair issued for `token` completed: the message is whole; its events go
    /// out and its sender is told (the returned done message).
    pub fn pulled(&mut self, token: u64, mem: &MemoryTable) -> Next {
        let Some(i) = self.msg(token) else {
            return Next::Nothing;
        };
        let m = self.msgs[i];
        let length = match m.claim {
            Some(c) => {
                let e = c.event;
                self.emit(&e, mem, true);
                e.mlength
            }
            None => {
                self.emit_held(i, u64::from(m.room), mem);
                u64::from(m.room)
            }
        };
        self.release(i);
        Next::Done {
            cookie: m.hdr.cookie,
            length: length as u32,
        }
    }
}
