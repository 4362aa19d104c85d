//! Processing engines (shards) and everything around them: the two
//! match-request queues per endpoint (host commands and network requests)
//! with round-robin arbitration between them, the per-endpoint block bit,
//! the persistent-entry cache, per-traffic-class inbound queues served by
//! weighted round robin, the endpoint → processing-engine table and the
//! worker loop that serves its engines round robin.
//!
//! Ordering (as the NIC guarantees it): within one endpoint commands run in
//! arrival order and network requests run in arrival order; a network
//! request that misses the persistent-entry cache also waits for every
//! command that arrived before it (the block bit), while a hit proceeds at
//! once. Endpoints are scheduled round robin, one request per turn, so a
//! blocked endpoint never holds up another.
//!
//! Cross-core hand-off goes through bounded crossbeam `ArrayQueue`s, which
//! are allocated once; nothing on the match path allocates.

use std::collections::VecDeque;
use std::sync::Arc;

use crossbeam::queue::ArrayQueue;

use super::cache::{DEFAULT_CACHE_ENTRIES, PersistentCache};
use super::deep::DeepList;
use super::endpoint::{
    Appended, DropReason, Endpoint, EntryHandle, LpeError, MatchOutcome, MatchReport, SearchMode,
};
use super::entry::{EndpointConfig, EndpointIndex, IncomingHeader, ListKind, MatchEntry};
use super::events::{EventSink, NullSink, Ring};
use super::list::MatchList;

/// Traffic class of a request; selects the inbound queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct TrafficClass(pub u8);

/// Identifier of a processing engine (shard).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EngineId(pub u16);

/// A host command for one endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Append {
        list: ListKind,
        entry: MatchEntry,
    },
    Unlink {
        handle: EntryHandle,
    },
    Search {
        probe: MatchEntry,
        mode: SearchMode,
    },
    Enable,
    Disable,
    EnterSoftwareMode,
    ResumeMatching,
    /// Hand up to `max` headers from the software request list to the host.
    TakeSoftwareRequests {
        max: u32,
    },
}

/// What a match request carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestBody {
    Command(Command),
    Network(IncomingHeader),
}

/// One match request, as queued towards a processing engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub ep: EndpointIndex,
    pub class: TrafficClass,
    /// Caller's identifier, returned in the completion.
    pub tag: u64,
    pub body: RequestBody,
}

impl Request {
    pub const fn network(
        ep: EndpointIndex,
        class: TrafficClass,
        tag: u64,
        hdr: IncomingHeader,
    ) -> Self {
        Self {
            ep,
            class,
            tag,
            body: RequestBody::Network(hdr),
        }
    }

    pub const fn command(ep: EndpointIndex, class: TrafficClass, tag: u64, cmd: Command) -> Self {
        Self {
            ep,
            class,
            tag,
            body: RequestBody::Command(cmd),
        }
    }
}

/// Result of a queued request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionKind {
    Matched(MatchOutcome),
    Appended(Result<Appended, LpeError>),
    Unlinked(Result<MatchEntry, LpeError>),
    Searched(u32),
    StateChanged(Result<(), LpeError>),
    /// One header handed to the host by `TakeSoftwareRequests`.
    SoftwareRequest(IncomingHeader),
    /// The request named an endpoint this engine does not own.
    Rejected(LpeError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub ep: EndpointIndex,
    pub tag: u64,
    pub kind: CompletionKind,
}

/// Where completions of queued requests go.
pub trait CompletionSink {
    fn complete(&mut self, completion: Completion);
}

impl CompletionSink for Vec<Completion> {
    fn complete(&mut self, completion: Completion) {
        self.push(completion);
    }
}

impl CompletionSink for Ring<Completion> {
    fn complete(&mut self, completion: Completion) {
        self.push(completion);
    }
}

impl CompletionSink for NullSink {
    fn complete(&mut self, _completion: Completion) {}
}

/// Processing-engine parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Persistent-entry cache slots (0 disables the cache).
    pub cache_entries: usize,
    /// Depth of each per-endpoint match-request queue (commands, network).
    pub queue_depth: usize,
    /// Depth of each inbound per-traffic-class queue.
    pub inbound_depth: usize,
    /// Weighted round-robin weights, one per traffic class.
    pub class_weights: Vec<u32>,
    /// Endpoint indices are below this (2 048 by default, the seed's physical endpoints; the
    /// table of them costs a slot each, an endpoint's lists only once it is added).
    pub max_endpoints: usize,
    /// Entries all of the engine's endpoints hold at once, priority and overflow entries
    /// and unexpected headers together (the seed's list-entry memory: 64 K per list
    /// processor, 16 K for each of its four processing engines; [`DEFAULT_POOL_ENTRIES`]).
    /// An endpoint's own lists are bounded by its [`EndpointConfig`] as well.
    pub pool_entries: usize,
}

/// Entries a processing engine's endpoints share by default: the seed's 64 K list entries
/// divided among its four processing engines.
pub const DEFAULT_POOL_ENTRIES: usize = 16 * 1024;

/// The engine's shared entry pool: its size and what its endpoints hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pool {
    cap: usize,
    used: usize,
}

impl Pool {
    /// Runs `f` on `ep`, told whether the pool has room for one more entry (every call adds
    /// at most one), and counts what it added or freed.
    #[inline(always)]
    fn run<L: MatchList, R>(
        &mut self,
        ep: &mut Endpoint<L>,
        f: impl FnOnce(&mut Endpoint<L>) -> R,
    ) -> R {
        ep.set_pool_room(self.used < self.cap);
        let before = ep.held();
        let r = f(ep);
        self.used = self.used + ep.held() - before;
        r
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            cache_entries: DEFAULT_CACHE_ENTRIES,
            queue_depth: 256,
            inbound_depth: 1024,
            class_weights: vec![4, 2, 1, 1],
            max_endpoints: 2048,
            pool_entries: DEFAULT_POOL_ENTRIES,
        }
    }
}

/// Engine counters, read when needed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub commands: u64,
    pub network: u64,
    /// Times the arbiter found a network request held back by the block bit.
    pub blocked: u64,
    /// Network requests that went ahead of older commands on a cache hit.
    pub hits_past_block: u64,
}

#[derive(Clone, Copy, Debug)]
struct Queued<T> {
    seq: u64,
    tag: u64,
    item: T,
}

/// An endpoint with its two match-request queues.
#[derive(Debug)]
struct Port<L: MatchList> {
    ep: Endpoint<L>,
    commands: VecDeque<Queued<Command>>,
    network: VecDeque<Queued<IncomingHeader>>,
    next_seq: u64,
    /// Set while commands are queued: cache misses wait behind them.
    blocked: bool,
    prefer_network: bool,
    scheduled: bool,
}

enum Pick {
    Command,
    Network,
    Idle,
}

/// Inbound per-traffic-class queues of one engine (the cross-core hand-off).
#[derive(Debug)]
pub struct Inbound {
    classes: Vec<ArrayQueue<Request>>,
}

impl Inbound {
    fn new(classes: usize, depth: usize) -> Self {
        Self {
            classes: (0..classes.max(1))
                .map(|_| ArrayQueue::new(depth.max(1)))
                .collect(),
        }
    }

    /// Returns the request back when its class queue is full.
    pub fn push(&self, req: Request) -> Result<(), Request> {
        let class = usize::from(req.class.0) % self.classes.len();
        self.classes[class].push(req)
    }

    pub fn is_empty(&self) -> bool {
        self.classes.iter().all(ArrayQueue::is_empty)
    }
}

/// One shard of the list-processing engine. Owned by one worker core.
#[derive(Debug)]
pub struct MatchShard<L: MatchList = DeepList> {
    id: EngineId,
    config: EngineConfig,
    ports: Vec<Option<Port<L>>>,
    ready: VecDeque<u16>,
    cache: PersistentCache,
    pool: Pool,
    inbound: Arc<Inbound>,
    wrr_class: usize,
    wrr_credit: u32,
    stats: EngineStats,
}

impl<L: MatchList> MatchShard<L> {
    pub fn new(id: EngineId, config: EngineConfig) -> Self {
        let inbound = Arc::new(Inbound::new(
            config.class_weights.len(),
            config.inbound_depth,
        ));
        Self::with_inbound(id, config, inbound)
    }

    fn with_inbound(id: EngineId, config: EngineConfig, inbound: Arc<Inbound>) -> Self {
        let mut ports = Vec::with_capacity(config.max_endpoints);
        ports.resize_with(config.max_endpoints, || None);
        Self {
            id,
            ports,
            ready: VecDeque::with_capacity(config.max_endpoints),
            cache: PersistentCache::new(config.cache_entries),
            pool: Pool {
                cap: config.pool_entries,
                used: 0,
            },
            inbound,
            wrr_class: 0,
            wrr_credit: config.class_weights.first().copied().unwrap_or(1),
            stats: EngineStats::default(),
            config,
        }
    }

    pub fn id(&self) -> EngineId {
        self.id
    }

    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    pub fn cache(&self) -> &PersistentCache {
        &self.cache
    }

    /// Entries the engine's endpoints hold, of its shared pool's
    /// ([`EngineConfig::pool_entries`]).
    pub fn pool(&self) -> (usize, usize) {
        (self.pool.used, self.pool.cap)
    }

    /// The inbound queues other cores push requests into.
    pub fn inbound(&self) -> Arc<Inbound> {
        Arc::clone(&self.inbound)
    }

    /// Creates an endpoint on this engine (allocates its lists).
    pub fn add_endpoint(
        &mut self,
        ep: EndpointIndex,
        config: EndpointConfig,
    ) -> Result<(), LpeError> {
        let depth = self.config.queue_depth.max(1);
        let slot = self
            .ports
            .get_mut(usize::from(ep.0))
            .ok_or(LpeError::NoSuchEndpoint(ep))?;
        if slot.is_some() {
            return Err(LpeError::EndpointExists(ep));
        }
        *slot = Some(Port {
            ep: Endpoint::new(ep, config),
            commands: VecDeque::with_capacity(depth),
            network: VecDeque::with_capacity(depth),
            next_seq: 0,
            blocked: false,
            prefer_network: false,
            scheduled: false,
        });
        Ok(())
    }

    pub fn endpoint(&self, ep: EndpointIndex) -> Option<&Endpoint<L>> {
        self.ports.get(usize::from(ep.0))?.as_ref().map(|p| &p.ep)
    }

    fn port_mut(&mut self, ep: EndpointIndex) -> Result<&mut Port<L>, LpeError> {
        Self::port_in(&mut self.ports, ep)
    }

    fn port_in(ports: &mut [Option<Port<L>>], ep: EndpointIndex) -> Result<&mut Port<L>, LpeError> {
        ports
            .get_mut(usize::from(ep.0))
            .and_then(Option::as_mut)
            .ok_or(LpeError::NoSuchEndpoint(ep))
    }

    // ----- direct (synchronous) API: the owning worker calls these -----

    /// Matches one incoming message now (the per-packet fast path). The
    /// persistent-entry cache is consulted first. Does not allocate.
    #[inline]
    pub fn match_incoming(
        &mut self,
        ep: EndpointIndex,
        hdr: &IncomingHeader,
        events: &mut impl EventSink,
    ) -> MatchOutcome {
        let Some(Some(port)) = self.ports.get_mut(usize::from(ep.0)) else {
            return MatchOutcome::Dropped(DropReason::NoSuchEndpoint);
        };
        Self::match_with_cache(&mut self.cache, &mut self.pool, &mut port.ep, hdr, events)
    }

    #[inline(always)]
    fn match_with_cache(
        cache: &mut PersistentCache,
        pool: &mut Pool,
        endpoint: &mut Endpoint<L>,
        hdr: &IncomingHeader,
        events: &mut impl EventSink,
    ) -> MatchOutcome {
        pool.run(endpoint, |endpoint| {
            Self::match_pooled(cache, endpoint, hdr, events)
        })
    }

    #[inline(always)]
    fn match_pooled(
        cache: &mut PersistentCache,
        endpoint: &mut Endpoint<L>,
        hdr: &IncomingHeader,
        events: &mut impl EventSink,
    ) -> MatchOutcome {
        let ep = endpoint.index();
        let matching = endpoint.config().matching;
        let mut report: Option<MatchReport> = None;
        if cache.capacity() > 0 {
            if let Some(id) = cache.peek(ep, hdr, matching) {
                report = endpoint.match_cached(id, hdr, events);
            }
            cache.count(report.is_some());
        }
        let report = match report {
            Some(r) => r,
            None => {
                let r = endpoint.match_report(hdr, events);
                if let Some(id) = r.cacheable
                    && cache.capacity() > 0
                {
                    cache.insert(ep, hdr, matching, id);
                }
                r
            }
        };
        if let Some(id) = report.unlinked_priority
            && !cache.is_empty()
        {
            cache.free_entry(ep, id);
        }
        report.outcome
    }

    pub fn append(
        &mut self,
        ep: EndpointIndex,
        list: ListKind,
        entry: MatchEntry,
        events: &mut impl EventSink,
    ) -> Result<Appended, LpeError> {
        let port = Self::port_in(&mut self.ports, ep)?;
        self.pool
            .run(&mut port.ep, |e| e.append(list, entry, events))
    }

    pub fn unlink(&mut self, handle: EntryHandle) -> Result<MatchEntry, LpeError> {
        let port = Self::port_in(&mut self.ports, handle.ep)?;
        let removed = self.pool.run(&mut port.ep, |e| e.unlink(handle))?;
        if handle.list == ListKind::Priority {
            self.cache.free_entry(handle.ep, handle.id);
        }
        Ok(removed)
    }

    pub fn search(
        &mut self,
        ep: EndpointIndex,
        probe: MatchEntry,
        mode: SearchMode,
        events: &mut impl EventSink,
    ) -> Result<u32, LpeError> {
        let port = Self::port_in(&mut self.ports, ep)?;
        Ok(self
            .pool
            .run(&mut port.ep, |e| e.search(probe, mode, events)))
    }

    pub fn enable(&mut self, ep: EndpointIndex) -> Result<(), LpeError> {
        self.port_mut(ep)?.ep.enable();
        Ok(())
    }

    pub fn disable(&mut self, ep: EndpointIndex) -> Result<(), LpeError> {
        self.port_mut(ep)?.ep.disable();
        Ok(())
    }

    pub fn enter_software_mode(
        &mut self,
        ep: EndpointIndex,
        events: &mut impl EventSink,
    ) -> Result<(), LpeError> {
        self.port_mut(ep)?.ep.enter_software_mode(events);
        Ok(())
    }

    pub fn resume_matching(&mut self, ep: EndpointIndex) -> Result<(), LpeError> {
        self.port_mut(ep)?.ep.resume_matching()
    }

    pub fn pop_software_request(
        &mut self,
        ep: EndpointIndex,
    ) -> Result<Option<IncomingHeader>, LpeError> {
        Ok(self.port_mut(ep)?.ep.pop_software_request())
    }

    // ----- queued API: match-request queues and arbitration -----

    /// Queues a request on this engine's own core (no hand-off). Fails with
    /// `QueueFull` instead of growing the queue.
    pub fn submit(&mut self, req: Request) -> Result<(), LpeError> {
        let depth = self.config.queue_depth.max(1);
        let port = self.port_mut(req.ep)?;
        let seq = port.next_seq;
        match req.body {
            RequestBody::Command(cmd) => {
                if port.commands.len() >= depth {
                    return Err(LpeError::QueueFull(req.ep));
                }
                port.commands.push_back(Queued {
                    seq,
                    tag: req.tag,
                    item: cmd,
                });
                port.blocked = true;
            }
            RequestBody::Network(hdr) => {
                if port.network.len() >= depth {
                    return Err(LpeError::QueueFull(req.ep));
                }
                port.network.push_back(Queued {
                    seq,
                    tag: req.tag,
                    item: hdr,
                });
            }
        }
        port.next_seq += 1;
        if !port.scheduled {
            port.scheduled = true;
            self.ready.push_back(req.ep.0);
        }
        Ok(())
    }

    /// True when no request is queued on this engine (inbound included).
    pub fn is_idle(&self) -> bool {
        self.ready.is_empty() && self.inbound.is_empty()
    }

    /// Pulls up to `2 * budget` requests from the inbound class queues
    /// (weighted round robin) onto the per-endpoint queues, then runs up to
    /// `budget` requests (endpoint round robin, one request per turn).
    /// Pulling more than is run lets requests for a quiet endpoint get past a
    /// busy endpoint's backlog. Returns the number of requests run.
    pub fn poll(
        &mut self,
        budget: usize,
        events: &mut impl EventSink,
        completions: &mut impl CompletionSink,
    ) -> usize {
        self.pull_inbound(budget.saturating_mul(2), events, completions);
        let mut done = 0;
        while done < budget {
            let Some(idx) = self.ready.pop_front() else {
                break;
            };
            if self.step(idx, events, completions) {
                done += 1;
            }
            let port = self.ports[usize::from(idx)]
                .as_mut()
                .expect("only existing endpoints are scheduled");
            if port.commands.is_empty() && port.network.is_empty() {
                port.scheduled = false;
            } else {
                self.ready.push_back(idx);
            }
        }
        done
    }

    /// Runs until every queued request (inbound included) has completed.
    pub fn run_until_idle(
        &mut self,
        events: &mut impl EventSink,
        completions: &mut impl CompletionSink,
    ) -> usize {
        let mut total = 0;
        while !self.is_idle() {
            total += self.poll(64, events, completions);
        }
        total
    }

    fn pull_inbound(
        &mut self,
        budget: usize,
        events: &mut impl EventSink,
        completions: &mut impl CompletionSink,
    ) {
        let classes = self.inbound.classes.len();
        let mut pulled = 0;
        let mut empty_in_a_row = 0;
        while pulled < budget && empty_in_a_row < classes {
            if self.wrr_credit == 0 {
                self.wrr_class = (self.wrr_class + 1) % classes;
                self.wrr_credit = self
                    .config
                    .class_weights
                    .get(self.wrr_class)
                    .copied()
                    .unwrap_or(1)
                    .max(1);
            }
            let Some(req) = self.inbound.classes[self.wrr_class].pop() else {
                self.wrr_credit = 0;
                empty_in_a_row += 1;
                continue;
            };
            empty_in_a_row = 0;
            self.wrr_credit -= 1;
            pulled += 1;
            self.accept(req, events, completions);
        }
    }

    /// Moves a pulled request onto its endpoint queue, making room by running
    /// that endpoint's queue if it is full (it always can make progress:
    /// commands are never blocked, and a blocked network request waits only
    /// for commands).
    fn accept(
        &mut self,
        req: Request,
        events: &mut impl EventSink,
        completions: &mut impl CompletionSink,
    ) {
        loop {
            match self.submit(req) {
                Ok(()) => return,
                Err(LpeError::QueueFull(_)) => {
                    self.step(req.ep.0, events, completions);
                }
                Err(err) => {
                    let kind = match req.body {
                        RequestBody::Network(_) => CompletionKind::Matched(MatchOutcome::Dropped(
                            DropReason::NoSuchEndpoint,
                        )),
                        RequestBody::Command(_) => CompletionKind::Rejected(err),
                    };
                    completions.complete(Completion {
                        ep: req.ep,
                        tag: req.tag,
                        kind,
                    });
                    return;
                }
            }
        }
    }

    /// One arbitration step on one endpoint. Returns false if nothing could run.
    fn step(
        &mut self,
        idx: u16,
        events: &mut impl EventSink,
        completions: &mut impl CompletionSink,
    ) -> bool {
        let Some(port) = self
            .ports
            .get_mut(usize::from(idx))
            .and_then(Option::as_mut)
        else {
            return false;
        };
        let ep = port.ep.index();
        let mut past_block = false;
        let network_ready = match (port.network.front(), port.commands.front()) {
            (None, _) => false,
            (Some(_), _) if !port.blocked => true,
            (Some(_), None) => true,
            (Some(n), Some(c)) if n.seq < c.seq => true,
            (Some(n), Some(_)) => {
                // Block bit set and the request is younger than a queued
                // command: only a persistent-entry cache hit may go ahead.
                let hit = port.ep.is_enabled()
                    && !port.ep.is_software_mode()
                    && self
                        .cache
                        .peek(ep, &n.item, port.ep.config().matching)
                        .is_some();
                if hit {
                    past_block = true;
                } else {
                    self.stats.blocked += 1;
                }
                hit
            }
        };
        let command_ready = !port.commands.is_empty();
        let pick = match (command_ready, network_ready) {
            (true, true) => {
                let p = if port.prefer_network {
                    Pick::Network
                } else {
                    Pick::Command
                };
                port.prefer_network = !port.prefer_network;
                p
            }
            (true, false) => Pick::Command,
            (false, true) => Pick::Network,
            (false, false) => Pick::Idle,
        };
        match pick {
            Pick::Idle => false,
            Pick::Network => {
                let q = port
                    .network
                    .pop_front()
                    .expect("network_ready implies a request");
                let outcome = Self::match_with_cache(
                    &mut self.cache,
                    &mut self.pool,
                    &mut port.ep,
                    &q.item,
                    events,
                );
                self.stats.network += 1;
                if past_block {
                    self.stats.hits_past_block += 1;
                }
                completions.complete(Completion {
                    ep,
                    tag: q.tag,
                    kind: CompletionKind::Matched(outcome),
                });
                true
            }
            Pick::Command => {
                let q = port
                    .commands
                    .pop_front()
                    .expect("command_ready implies a command");
                port.blocked = !port.commands.is_empty();
                self.stats.commands += 1;
                self.run_command(ep, q.tag, q.item, events, completions);
                true
            }
        }
    }

    fn run_command(
        &mut self,
        ep: EndpointIndex,
        tag: u64,
        cmd: Command,
        events: &mut impl EventSink,
        completions: &mut impl CompletionSink,
    ) {
        let done = |kind| Completion { ep, tag, kind };
        let kind = match cmd {
            Command::Append { list, entry } => {
                CompletionKind::Appended(self.append(ep, list, entry, events))
            }
            Command::Unlink { handle } => CompletionKind::Unlinked(self.unlink(handle)),
            Command::Search { probe, mode } => match self.search(ep, probe, mode, events) {
                Ok(n) => CompletionKind::Searched(n),
                Err(e) => CompletionKind::Rejected(e),
            },
            Command::Enable => CompletionKind::StateChanged(self.enable(ep)),
            Command::Disable => CompletionKind::StateChanged(self.disable(ep)),
            Command::EnterSoftwareMode => {
                CompletionKind::StateChanged(self.enter_software_mode(ep, events))
            }
            Command::ResumeMatching => CompletionKind::StateChanged(self.resume_matching(ep)),
            Command::TakeSoftwareRequests { max } => {
                let mut handed = 0;
                while handed < max {
                    match self.pop_software_request(ep) {
                        Ok(Some(hdr)) => {
                            completions.complete(done(CompletionKind::SoftwareRequest(hdr)));
                            handed += 1;
                        }
                        _ => break,
                    }
                }
                CompletionKind::StateChanged(Ok(()))
            }
        };
        completions.complete(done(kind));
    }
}

/// Endpoint → processing-engine table: how load is spread over engines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointTable {
    engine_of: Vec<Option<EngineId>>,
    engines: usize,
}

impl EndpointTable {
    pub fn new(max_endpoints: usize, engines: usize) -> Self {
        Self {
            engine_of: vec![None; max_endpoints],
            engines: engines.max(1),
        }
    }

    /// Endpoint `i` goes to engine `i mod engines`.
    pub fn round_robin(max_endpoints: usize, engines: usize) -> Self {
        let mut t = Self::new(max_endpoints, engines);
        for i in 0..max_endpoints {
            t.engine_of[i] = Some(EngineId((i % t.engines) as u16));
        }
        t
    }

    pub fn engines(&self) -> usize {
        self.engines
    }

    pub fn assign(&mut self, ep: EndpointIndex, engine: EngineId) {
        if let Some(slot) = self.engine_of.get_mut(usize::from(ep.0)) {
            *slot = Some(engine);
        }
    }

    #[inline]
    pub fn engine_of(&self, ep: EndpointIndex) -> Option<EngineId> {
        self.engine_of.get(usize::from(ep.0)).copied().flatten()
    }
}

/// Producer side: routes requests to the owning engine's inbound queues.
/// Cheap to clone; usable from any core.
#[derive(Clone, Debug)]
pub struct Dispatcher {
    table: Arc<EndpointTable>,
    inbound: Vec<Arc<Inbound>>,
}

impl Dispatcher {
    /// Returns the request back if its queue is full or its endpoint is not
    /// in the table.
    #[inline]
    pub fn submit(&self, req: Request) -> Result<(), Request> {
        match self.table.engine_of(req.ep) {
            Some(e) => match self.inbound.get(usize::from(e.0)) {
                Some(q) => q.push(req),
                None => Err(req),
            },
            None => Err(req),
        }
    }

    pub fn table(&self) -> &EndpointTable {
        &self.table
    }
}

/// Builds one engine per table column, creates each endpoint on its engine
/// and returns the dispatcher plus the engines (to be moved to workers).
pub fn build_shards<L: MatchList>(
    config: &EngineConfig,
    table: EndpointTable,
    endpoints: &[(EndpointIndex, EndpointConfig)],
) -> Result<(Dispatcher, Vec<MatchShard<L>>), LpeError> {
    let mut engines: Vec<MatchShard<L>> = (0..table.engines())
        .map(|i| MatchShard::new(EngineId(i as u16), config.clone()))
        .collect();
    for &(ep, ep_config) in endpoints {
        let engine = table.engine_of(ep).ok_or(LpeError::NoSuchEndpoint(ep))?;
        engines[usize::from(engine.0)].add_endpoint(ep, ep_config)?;
    }
    let inbound = engines.iter().map(MatchShard::inbound).collect();
    Ok((
        Dispatcher {
            table: Arc::new(table),
            inbound,
        },
        engines,
    ))
}

/// A worker core's loop body: serves its engines round robin.
#[derive(Debug)]
pub struct Worker<L: MatchList = DeepList> {
    engines: Vec<MatchShard<L>>,
    next: usize,
}

impl<L: MatchList> Worker<L> {
    pub fn new(engines: Vec<MatchShard<L>>) -> Self {
        Self { engines, next: 0 }
    }

    pub fn engines(&self) -> &[MatchShard<L>] {
        &self.engines
    }

    pub fn engines_mut(&mut self) -> &mut [MatchShard<L>] {
        &mut self.engines
    }

    /// Gives each engine `budget` requests, starting one further each call.
    pub fn poll(
        &mut self,
        budget: usize,
        events: &mut impl EventSink,
        completions: &mut impl CompletionSink,
    ) -> usize {
        let n = self.engines.len();
        if n == 0 {
            return 0;
        }
        let mut done = 0;
        for i in 0..n {
            done += self.engines[(self.next + i) % n].poll(budget, events, completions);
        }
        self.next = (self.next + 1) % n;
        done
    }

    pub fn is_idle(&self) -> bool {
        self.engines.iter().all(MatchShard::is_idle)
    }
}
