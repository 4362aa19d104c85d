//! A two-QP test bench: endpoints A and B joined by a simulated wire.
//!
//! Every packet a QP emits is turned into real bytes with `wire` (headers,
//! pad, ICRC), may be dropped, duplicated, delayed past later packets or
//! corrupted by a seeded fault injector, and is parsed back (ICRC checked)
//! before the peer sees it. Time is simulated: the bench jumps from one event
//! (packet arrival, QP deadline) to the next, so retransmission timeouts cost
//! no wall-clock time and every run is reproducible from its seed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use std::sync::Arc;

use crate::transport::{
    Access, MemoryTable, MrKeys, PersistJob, QpConfig, QueuePair, RecvRequest, SgList,
    StagedCompletions, WorkCompletion, WorkRequest,
};
use wire::{self, RoceRepr};

/// The generator that drives fault injection.
pub use crate::rng::SplitMix64 as Rng;

/// Fault probabilities in parts per million, per packet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    pub drop: u32,
    pub duplicate: u32,
    pub reorder: u32,
    pub corrupt: u32,
}

impl Faults {
    pub const NONE: Faults = Faults {
        drop: 0,
        duplicate: 0,
        reorder: 0,
        corrupt: 0,
    };

    /// The same probability for every fault.
    pub const fn each(ppm: u32) -> Faults {
        Faults {
            drop: ppm,
            duplicate: ppm,
            reorder: ppm,
            corrupt: ppm,
        }
    }
}

/// Which endpoint sent a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Side {
    A,
    B,
}

/// What a test's packet filter wants done with one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Pass,
    Drop,
    Duplicate,
}

/// Counters of the simulated wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireStats {
    pub sent: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
    /// Packets the receiver rejected because the ICRC did not match.
    pub icrc_errors: u64,
    /// Packets rejected for any other parse error (should stay 0).
    pub parse_errors: u64,
}

/// One QP with its memory and completion queue.
pub struct Endpoint {
    pub qp: QueuePair,
    pub mem: MemoryTable,
    pub cq: StagedCompletions,
    /// Completions drained from `cq` by the bench, in order.
    pub done: Vec<WorkCompletion>,
}

impl Endpoint {
    pub fn new(cfg: QpConfig) -> Endpoint {
        Endpoint {
            qp: QueuePair::new(cfg).expect("valid config"),
            mem: MemoryTable::new(),
            cq: StagedCompletions::new(1 << 16),
            done: Vec::new(),
        }
    }

    /// Maps `len` bytes of anonymous memory and registers them under the address `addr`
    /// (an IOVA, so the tests keep readable addresses).
    pub fn register(&mut self, addr: u64, len: usize, access: Access) -> MrKeys {
        let map = Arc::new(pmem::Mapping::anonymous(len).expect("anonymous memory"));
        self.mem
            .register_iova(map, 0, len, addr, access)
            .expect("registration")
    }

    /// Registers the whole of `map` (e.g. under the power-loss simulator) at `addr`.
    pub fn register_map(&mut self, map: Arc<pmem::Mapping>, addr: u64, access: Access) -> MrKeys {
        let len = map.len();
        self.mem
            .register_iova(map, 0, len, addr, access)
            .expect("registration")
    }

    pub fn post_send(&mut self, wr: WorkRequest) {
        self.qp
            .post_send(&wr, &self.mem, &mut self.cq)
            .expect("post_send");
    }

    pub fn post_recv(&mut self, wr_id: u64, lkey: u32, addr: u64, len: u32) {
        let wr = RecvRequest::new(wr_id, SgList::one(lkey, addr, len));
        self.qp
            .post_recv(&wr, &self.mem, &mut self.cq)
            .expect("post_recv");
    }

    /// Move completions from the CQ to `done`.
    pub fn drain(&mut self) {
        while let Some(wc) = self.cq.poll() {
            self.done.push(wc);
        }
    }
}

type Filter<T = Fate> = Box<dyn FnMut(Side, &RoceRepr) -> T>;

/// A packet on the wire: arrival time, sequence number (FIFO tie-break),
/// sender, frame bytes.
type InFlight = Reverse<(u64, u64, Side, Vec<u8>)>;

pub struct Sim {
    pub now: u64,
    pub a: Endpoint,
    pub b: Endpoint,
    pub faults: Faults,
    pub rng: Rng,
    pub latency_ns: u64,
    /// Time one packet occupies each direction of the link; 0 makes every
    /// packet of a burst arrive at once (one RX burst at the receiver).
    pub serialize_ns: u64,
    link_free: [u64; 2],
    pub wire: WireStats,
    /// Every packet emitted, with its payload length, when `tracing` is on.
    pub trace: Vec<(Side, RoceRepr, usize)>,
    pub tracing: bool,
    /// Decides the fate of each emitted packet before random faults apply.
    pub filter: Option<Filter>,
    /// Marks the packets it returns true for with ECN CE (as a congested switch does: the
    /// IPv4 ECN bits and checksum rewritten, the ICRC untouched).
    pub marker: Option<Filter<bool>>,
    /// Packets marked CE.
    pub marked: u64,
    /// Largest `in_flight()` of each requester seen right after an emission.
    pub max_in_flight: [u32; 2],
    queue: BinaryHeap<InFlight>,
    seq: u64,
    frame: Vec<u8>,
    /// How long a persist job takes (the flusher's `msync`), plus up to `persist_jitter_ns`.
    pub persist_ns: u64,
    pub persist_jitter_ns: u64,
    /// Mark jobs done without running them: a broken engine that acknowledges durability
    /// before persisting (the negative control of the power-loss tests).
    pub persist_lies: bool,
    /// Persist jobs in progress, in ticket order per side: (done at, side, job).
    persisting: VecDeque<(u64, Side, PersistJob)>,
    /// Persist jobs run so far.
    pub persisted_jobs: u64,
}

impl Sim {
    /// Two QPs: A with `cfg`, B with its mirror image.
    pub fn new(cfg: QpConfig, faults: Faults, seed: u64) -> Sim {
        let peer = cfg.mirrored();
        Sim {
            now: 1_000,
            a: Endpoint::new(cfg),
            b: Endpoint::new(peer),
            faults,
            rng: Rng::new(seed),
            latency_ns: 1_000,
            serialize_ns: 0,
            link_free: [0; 2],
            wire: WireStats::default(),
            trace: Vec::new(),
            tracing: true,
            filter: None,
            marker: None,
            marked: 0,
            max_in_flight: [0; 2],
            queue: BinaryHeap::new(),
            seq: 0,
            frame: vec![0u8; 8192],
            persist_ns: 0,
            persist_jitter_ns: 0,
            persist_lies: false,
            persisting: VecDeque::new(),
            persisted_jobs: 0,
        }
    }

    /// The flusher of both endpoints: take new persist jobs, finish those that are due (in
    /// order, as the engine's flusher does), and tell the queue pairs.
    fn run_persists(&mut self) {
        for side in [Side::A, Side::B] {
            let ep = match side {
                Side::A => &mut self.a,
                Side::B => &mut self.b,
            };
            while let Some(job) = ep.mem.take_persist_job() {
                let jitter = match self.persist_jitter_ns {
                    0 => 0,
                    j => self.rng.below(j),
                };
                // In order: never done before the job ahead of it.
                let ahead = self.persisting.back().map_or(0, |(t, ..)| *t);
                let due = (self.now + self.persist_ns + jitter).max(ahead);
                self.persisting.push_back((due, side, job));
            }
        }
        while let Some((due, ..)) = self.persisting.front() {
            if *due > self.now {
                break;
            }
            let (_, side, job) = self.persisting.pop_front().expect("peeked");
            if !self.persist_lies {
                job.run().expect("persist");
            }
            self.persisted_jobs += 1;
            let ep = match side {
                Side::A => &mut self.a,
                Side::B => &mut self.b,
            };
            ep.mem.mark_persisted(job.ticket);
            ep.qp.on_persisted(ep.mem.persisted());
        }
    }

    /// Let both QPs emit everything they can now and put it on the wire.
    pub fn transmit(&mut self) {
        for side in [Side::A, Side::B] {
            loop {
                let now = self.now;
                let ep = match side {
                    Side::A => &mut self.a,
                    Side::B => &mut self.b,
                };
                let Some(pkt) = ep.qp.poll_transmit(now) else {
                    break;
                };
                let in_flight = ep.qp.requester().in_flight();
                let len = ep.qp.emit(&pkt, &ep.mem, &mut self.frame).expect("emit");
                let slot = &mut self.max_in_flight[side as usize];
                *slot = (*slot).max(in_flight);
                let repr = ep.qp.packet_repr(&pkt);
                if self.tracing {
                    self.trace.push((side, repr, pkt.payload_len()));
                }
                let frame = self.frame[..len].to_vec();
                self.send_frame(side, &repr, frame);
            }
        }
    }

    fn send_frame(&mut self, side: Side, repr: &RoceRepr, mut frame: Vec<u8>) {
        self.wire.sent += 1;
        let fate = match self.filter.as_mut() {
            Some(f) => f(side, repr),
            None => Fate::Pass,
        };
        if fate == Fate::Drop || self.rng.chance(self.faults.drop) {
            self.wire.dropped += 1;
            return;
        }
        if let Some(m) = self.marker.as_mut()
            && m(side, repr)
        {
            let mut p = wire::RocePacket::new_checked(&mut frame[..]).expect("own frame");
            p.ipv4_mut().set_ecn(wire::Ecn::Ce);
            p.ipv4_mut().fill_checksum();
            self.marked += 1;
        }
        if self.rng.chance(self.faults.corrupt) {
            // Flip a byte the ICRC covers and the structural checks do not
            // look at: from BTH DestQP to the end of the ICRC.
            let start = wire::roce::BASE_HEADER_LEN - 12 + 5;
            let at = start + self.rng.below((frame.len() - start) as u64) as usize;
            frame[at] ^= 1 + self.rng.below(255) as u8;
            self.wire.corrupted += 1;
        }
        let start = self.now.max(self.link_free[side as usize]);
        self.link_free[side as usize] = start + self.serialize_ns;
        let mut arrival = start + self.serialize_ns + self.latency_ns;
        if self.rng.chance(self.faults.reorder) {
            // Arrive after packets sent up to a few microseconds later.
            arrival += self.latency_ns * (1 + self.rng.below(4));
            self.wire.reordered += 1;
        }
        if fate == Fate::Duplicate || self.rng.chance(self.faults.duplicate) {
            self.wire.duplicated += 1;
            self.enqueue(arrival + self.latency_ns / 2, side, frame.clone());
        }
        self.enqueue(arrival, side, frame);
    }

    fn enqueue(&mut self, arrival: u64, side: Side, frame: Vec<u8>) {
        self.seq += 1;
        self.queue.push(Reverse((arrival, self.seq, side, frame)));
    }

    /// Nothing `from` sends leaves before `until`: what it sends meanwhile waits, in order,
    /// as it would in the RX ring of a receiver that is not running.
    /// Drops the first packet for which `pick` holds and passes every other (a loss the
    /// test places); replaces any filter.
    pub fn drop_first(&mut self, mut pick: impl FnMut(Side, &RoceRepr) -> bool + 'static) {
        let mut dropped = false;
        self.filter = Some(Box::new(move |side, r| {
            if !dropped && pick(side, r) {
                dropped = true;
                Fate::Drop
            } else {
                Fate::Pass
            }
        }));
    }

    pub fn freeze_link(&mut self, from: Side, until: u64) {
        let free = &mut self.link_free[from as usize];
        *free = (*free).max(until);
    }

    /// Put raw frame bytes on the wire as if `from` had sent them.
    pub fn inject(&mut self, from: Side, frame: Vec<u8>) {
        self.enqueue(self.now + self.latency_ns, from, frame);
    }

    /// Deliver every frame due by `now` to its receiver.
    fn deliver_due(&mut self) -> bool {
        let mut any = false;
        while let Some(Reverse((t, _, _, _))) = self.queue.peek() {
            if *t > self.now {
                break;
            }
            let Reverse((_, _, from, frame)) = self.queue.pop().expect("peeked");
            any = true;
            let now = self.now;
            let parsed = wire::parse_frame(&frame);
            match parsed {
                Ok((repr, payload)) => {
                    self.wire.delivered += 1;
                    let to = match from {
                        Side::A => &mut self.b,
                        Side::B => &mut self.a,
                    };
                    to.qp
                        .on_packet(now, &repr, payload, &mut to.mem, &mut to.cq);
                }
                Err(wire::Error::BadIcrc { .. }) => self.wire.icrc_errors += 1,
                Err(_) => self.wire.parse_errors += 1,
            }
        }
        any
    }

    fn run_timers(&mut self) {
        let now = self.now;
        for ep in [&mut self.a, &mut self.b] {
            if ep.qp.next_deadline().is_some_and(|d| d <= now) {
                ep.qp.on_timer(now, &mut ep.cq);
            }
        }
    }

    /// The next time anything happens, if anything will.
    fn next_event(&self) -> Option<u64> {
        let arrival = self.queue.peek().map(|Reverse((t, ..))| *t);
        let persist = self.persisting.front().map(|(t, ..)| *t);
        [
            arrival,
            persist,
            self.a.qp.next_deadline(),
            self.b.qp.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// One round: transmit, deliver what is due, fire timers, transmit again,
    /// collect completions, then jump to the next event. Returns false when
    /// nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.transmit();
        self.deliver_due();
        self.run_persists();
        self.run_timers();
        self.transmit();
        self.a.drain();
        self.b.drain();
        match self.next_event() {
            Some(t) => {
                self.now = self.now.max(t);
                true
            }
            None => false,
        }
    }

    /// Step until `done` holds or the simulation goes idle or past `limit_ns`
    /// of simulated time. Returns whether `done` held.
    pub fn run_until(&mut self, limit_ns: u64, mut done: impl FnMut(&Sim) -> bool) -> bool {
        let end = self.now + limit_ns;
        loop {
            if done(self) {
                return true;
            }
            if !self.step() || self.now > end {
                return done(self);
            }
        }
    }

    /// Step until nothing is left to happen (all acknowledged, no timers).
    pub fn run_idle(&mut self, limit_ns: u64) {
        let end = self.now + limit_ns;
        while self.step() && self.now <= end {}
        self.a.drain();
        self.b.drain();
    }

    /// Packets of the trace sent by `side` matching `pred`.
    pub fn count(&self, side: Side, pred: impl Fn(&RoceRepr) -> bool) -> usize {
        self.trace
            .iter()
            .filter(|(s, r, _)| *s == side && pred(r))
            .count()
    }
}
