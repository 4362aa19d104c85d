//! The traffic shaper core (issue 14, part 1): which message-chopping unit sends the next
//! packet, so that traffic classes get their bandwidth shares, no MCU starves its class-mates,
//! and READ responses never arrive faster than the host can absorb them.
//!
//! Seed 000 (data request management), in this module's terms:
//! - **Command queues → flow queues**: [`Shaper::enqueue`] hashes a [`Command`]'s flow key into
//!   one of a fixed set of bounded flow queues, so the commands of one flow stay in order; a full
//!   flow queue refuses the command and hands it back ([`Refused::Full`]).
//! - **MCUs (message-chopping units)**: each MCU holds one flow queue at a time and cuts that
//!   queue's commands into MTU-sized packets; a flow queue with commands and no MCU waits in
//!   FIFO order for one to come free (when an MCU's flow queue runs dry).
//! - **Shaper arbitration** ([`Shaper::next`]): strict-priority classes first (bounded by their
//!   ceiling, so they cannot shut out everyone else forever); then the classes whose *assured*
//!   token bucket has tokens, round robin; then those served only up to their *ceiling*; within
//!   a class, deficit round robin over its MCUs, so an MCU with large packets cannot take more
//!   than its quantum per round. An MCU at its outstanding-packet cap is skipped until
//!   [`Shaper::completed`] reports responses/ACKs.
//! - **GET pacing by response size**: a GET (RDMA READ) is cut into request packets each pulling
//!   back up to one MTU of response; the expected response bytes are charged to an inbound
//!   ("absorb") bucket at issue. An MCU whose next request would pull back more than the bucket
//!   holds is skipped and the others are served; it goes again once its response fits. PUT data
//!   is charged to the outbound (class) buckets only. In the engine a queue pair's READs are
//!   sub-requests of [`ShaperConfig::read_split_packets`] packets of response, each charged on
//!   its own, and the READ responses a node serves are a stream of their own in the queue
//!   pair's class: PUT requests and GET responses share one outbound policy.
//!
//! The shape follows HPE's Cassini NIC: per-class buckets with an assured and a ceiling rate,
//! inbound buckets charged with the expected response size, per-MCU outstanding caps (64 by
//! default there), and counters of how often an MCU/class waited for outbound tokens, inbound
//! tokens and its cap ([`Counters::waited_out`], [`Counters::waited_in`],
//! [`Counters::waited_cap`], after Cassini's `NO_OUT_CRD`, `NO_IN_CRD` and outstanding stalls).
//!
//! Pure and driven with times in ns: the caller calls [`Shaper::next`] when the link can take a
//! packet and sets its timer with [`Shaper::next_ready_at`] when nothing may go. Sizes are
//! payload bytes (headers are the caller's business). Everything is allocated in
//! [`Shaper::new`]; the per-packet calls do not allocate.

pub mod bucket;
pub mod port;

pub use bucket::TokenBucket;
pub use port::PortShares;

use std::collections::VecDeque;
use std::sync::Arc;

/// One traffic class: a bandwidth share in bit/s and how it may be exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassConfig {
    /// The rate the class is served at before any class that is only borrowing (may be 0).
    pub assured_bps: u64,
    /// The rate the class is never served above, borrowing included.
    pub ceiling_bps: u64,
    /// The depth of both buckets: how much may go at once after an idle spell.
    pub burst_bytes: u64,
    /// Served before all non-strict classes (the low-latency class), up to its ceiling; its
    /// assured rate is not used (it has priority anyway). Among strict classes the lowest
    /// index goes first.
    pub strict: bool,
    /// The 802.1Qbb priority this class's packets travel at: a PFC frame from the link
    /// partner that pauses it stops the class until the pause ends ([`Shaper::pfc`]); `None`:
    /// PFC does not stop the class.
    pub pfc_priority: Option<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShaperConfig {
    /// Indexed by [`Command::class`]; at most 256.
    pub classes: Vec<ClassConfig>,
    /// The port's rate: every packet of every class is charged to one link bucket, so the
    /// classes share the link by their assured rates and borrow what is left up to their
    /// ceilings; `None`: the link is not modelled (the caller's link paces the calls to
    /// [`Shaper::next`]).
    pub link_bps: Option<u64>,
    /// The link bucket's depth: at least what the link carries between two of the caller's
    /// turns (a software worker that asks every few tens of µs would lose the tokens of a
    /// shallower bucket).
    pub link_burst_bytes: u64,
    /// The rate at which the host absorbs inbound (READ response) data; `None`: unlimited.
    pub absorb_bps: Option<u64>,
    /// The depth of the absorb bucket; at least the MTU of any GET (checked at enqueue).
    pub absorb_burst_bytes: u64,
    /// The number of MCUs, i.e. of flow queues served at once.
    pub mcus: usize,
    /// Packets an MCU may have issued without a response/ACK seen.
    pub outstanding_cap: u32,
    /// Bytes an MCU may send per deficit-round-robin round; at least the MTU of any command
    /// and the request size of any GET (checked at enqueue).
    pub quantum_bytes: u32,
    /// The number of flow queues flows hash into.
    pub flow_queues: usize,
    /// The size of a GET's sub-requests in response packets (seed 000: a GET is split into
    /// sub-requests, each managed and paced on its own): a node with a shaper has its queue
    /// pairs split their READs into requests of at most this many packets of response
    /// (`QpConfig::read_split_packets`), each charged to the absorb bucket as it goes.
    /// 0: READs are not split.
    pub read_split_packets: u32,
    /// Commands each flow queue holds.
    pub flow_queue_depth: usize,
    /// READ responses a node serves are charged to their queue pair's class and wait for
    /// its tokens as its requests do (seed 000: PUTs and GET responses in one outbound
    /// policy). Off: they go in turn, outside the shaper (as before issue 32; a benchmark's
    /// comparison).
    pub shape_read_responses: bool,
}

/// [`ShaperConfig::read_split_packets`] by default: a GET's sub-requests pull back 4 packets
/// of response each (4 KiB at RoCE's default 1 KiB MTU, 16 KiB at 4 KiB).
pub const DEFAULT_READ_SPLIT_PACKETS: u32 = 4;

/// A configuration field that cannot work, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("shaper config: {field}: {reason}")]
pub struct ShaperError {
    pub field: String,
    pub reason: &'static str,
}

fn bad(field: impl Into<String>, reason: &'static str) -> Result<(), ShaperError> {
    Err(ShaperError {
        field: field.into(),
        reason,
    })
}

impl ShaperConfig {
    /// `classes` with Cassini-like defaults: 16 MCUs, 64 outstanding packets each, a 4 KiB
    /// quantum (one maximum RoCE MTU), 256 flow queues of 16 commands, no absorb limit, GETs
    /// split into sub-requests of 4 packets of response.
    pub fn new(classes: Vec<ClassConfig>) -> ShaperConfig {
        ShaperConfig {
            classes,
            link_bps: None,
            link_burst_bytes: 64 * 1024,
            absorb_bps: None,
            absorb_burst_bytes: 64 * 1024,
            mcus: 16,
            outstanding_cap: 64,
            quantum_bytes: 4096,
            flow_queues: 256,
            flow_queue_depth: 16,
            read_split_packets: DEFAULT_READ_SPLIT_PACKETS,
            shape_read_responses: true,
        }
    }

    pub fn validate(&self) -> Result<(), ShaperError> {
        if self.classes.is_empty() {
            return bad("classes", "at least one class");
        }
        if self.classes.len() > 256 {
            return bad("classes", "at most 256 (a class is a u8)");
        }
        for (i, c) in self.classes.iter().enumerate() {
            if c.ceiling_bps == 0 {
                return bad(format!("classes[{i}].ceiling_bps"), "must be > 0");
            }
            if c.assured_bps > c.ceiling_bps {
                return bad(format!("classes[{i}].assured_bps"), "above the ceiling");
            }
            if c.burst_bytes == 0 {
                return bad(format!("classes[{i}].burst_bytes"), "must be > 0");
            }
        }
        if self.link_bps == Some(0) {
            return bad("link_bps", "must be > 0 (None for no link)");
        }
        if self.link_bps.is_some() && self.link_burst_bytes == 0 {
            return bad("link_burst_bytes", "must be > 0 with a link rate");
        }
        if self.absorb_bps == Some(0) {
            return bad("absorb_bps", "must be > 0 (None for unlimited)");
        }
        if self.absorb_bps.is_some() && self.absorb_burst_bytes == 0 {
            return bad("absorb_burst_bytes", "must be > 0 with an absorb rate");
        }
        if self.mcus == 0 {
            return bad("mcus", "must be > 0");
        }
        if self.outstanding_cap == 0 {
            return bad("outstanding_cap", "must be > 0");
        }
        if self.quantum_bytes == 0 {
            return bad("quantum_bytes", "must be > 0");
        }
        if self.flow_queues == 0 {
            return bad("flow_queues", "must be > 0");
        }
        if self.flow_queue_depth == 0 {
            return bad("flow_queue_depth", "must be > 0");
        }
        Ok(())
    }
}

/// What a command moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Send `bytes` (RDMA WRITE/SEND): charged to the class's outbound buckets.
    Put { bytes: u64 },
    /// Fetch `response_bytes` (RDMA READ) with requests of `request_bytes` each: the requests
    /// are charged outbound, the responses they pull back to the absorb bucket.
    Get {
        request_bytes: u32,
        response_bytes: u64,
    },
    /// Work its owner chops: the flow queue's packets come from the owner at arbitration time
    /// ([`Shaper::next_with`]) until it says it is done ([`Shaper::deactivate`]). Made by
    /// [`Shaper::activate`], never enqueued directly.
    Stream,
}

/// A host command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Command {
    /// The flow key hashed to pick the flow queue (e.g. the queue pair).
    pub flow: u64,
    pub class: u8,
    pub kind: Kind,
    /// Largest payload per packet (PUT) or response per request (GET).
    pub mtu: u32,
}

/// A command [`Shaper::enqueue`] did not take, handed back so nothing is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its flow queue is full; try again later.
    Full(Command),
    /// It can never be sent under this configuration.
    Invalid { cmd: Command, reason: &'static str },
}

/// One arbitration decision: the MCU whose next packet goes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    pub mcu: usize,
    /// The flow queue the MCU serves (for a stream, the caller's own queue index).
    pub queue: usize,
    pub class: u8,
    /// Bytes on the wire out (PUT data or the GET request).
    pub packet_bytes: u32,
    /// Bytes this packet will pull back (GET), 0 for a PUT.
    pub response_bytes: u32,
    pub last_of_command: bool,
}

/// What a class or an MCU sent, and how often it was passed over and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Counters {
    pub packets: u64,
    pub bytes: u64,
    pub response_bytes: u64,
    /// Arbitration steps it had a packet but its class was out of outbound (ceiling) tokens.
    pub waited_out: u64,
    /// Arbitration steps its next response did not fit the absorb bucket.
    pub waited_in: u64,
    /// Arbitration steps it was at its outstanding-packet cap.
    pub waited_cap: u64,
    /// Arbitration steps a stream's owner had nothing it could send (its own window, pacer
    /// or timer held it).
    pub waited_flow: u64,
    /// Classes: arbitration steps it had work but its priority was paused by PFC.
    pub waited_pfc: u64,
    /// Classes: PFC frames that paused it (a resume, quanta 0, is not counted).
    pub pfc_pauses: u64,
}

/// A stream's next packet, as its owner tells [`Shaper::next_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// Bytes out (charged to the class).
    pub out: u32,
    /// Bytes it will pull back (charged to the absorb bucket), 0 if none.
    pub back: u32,
}

/// The command an MCU is chopping.
#[derive(Debug, Clone, Copy)]
struct Chopping {
    class: u8,
    /// PUT bytes or GET response bytes still to go.
    remaining: u64,
    mtu: u32,
    /// `Some(request bytes)` for a GET.
    request: Option<u32>,
    /// The owner chops ([`Kind::Stream`]): `remaining`, `mtu`, `request` are unused.
    stream: bool,
}

impl Chopping {
    fn of(cmd: &Command) -> Chopping {
        let (remaining, request, stream) = match cmd.kind {
            Kind::Put { bytes } => (bytes, None, false),
            Kind::Get {
                request_bytes,
                response_bytes,
            } => (response_bytes, Some(request_bytes), false),
            Kind::Stream => (u64::MAX, None, true),
        };
        Chopping {
            class: cmd.class,
            remaining,
            mtu: cmd.mtu,
            request,
            stream,
        }
    }

    /// (bytes out, bytes back) of the next packet.
    fn next_packet(&self) -> (u32, u32) {
        let chunk = self.remaining.min(self.mtu as u64) as u32;
        match self.request {
            None => (chunk, 0),
            Some(req) => (req, chunk),
        }
    }
}

#[derive(Debug)]
struct Mcu {
    flow_queue: Option<usize>,
    cmd: Option<Chopping>,
    deficit: u64,
    outstanding: u32,
    /// A stream's response bytes that last did not fit the absorb bucket (for
    /// [`Shaper::next_ready_at`]), 0 if none.
    blocked_back: u32,
    counters: Counters,
}

#[derive(Debug)]
struct Class {
    cfg: ClassConfig,
    assured: TokenBucket,
    ceiling: TokenBucket,
    /// The MCU deficit round robin looks at next.
    cursor: usize,
    /// Whether `cursor` arrived at its MCU since it was last given a quantum.
    fresh: bool,
    /// MCUs chopping a command of this class.
    busy: usize,
    /// The arbitration step this class was last tried in (so skips count once per step).
    tried: u64,
    /// PFC paused its priority until this time (ns; 0: not paused).
    paused_until: u64,
    counters: Counters,
}

#[derive(Debug)]
struct FlowQueue {
    cmds: VecDeque<Command>,
    mcu: Option<usize>,
    waiting: bool,
    /// A stream is queued or being served ([`Shaper::activate`]).
    stream: bool,
}

/// The link rate PFC quanta are timed at when the configuration names none
/// ([`ShaperConfig::link_bps`]): 10 Gbit/s.
pub const PFC_DEFAULT_LINK_BPS: u64 = 10_000_000_000;

/// The shaper: flow queues, MCUs and the class and absorb buckets. See the module doc.
#[derive(Debug)]
pub struct Shaper {
    /// The rate a PFC quantum (512 bit times) is timed at: the link's, else
    /// [`PFC_DEFAULT_LINK_BPS`].
    pfc_link_bps: u64,
    classes: Vec<Class>,
    mcus: Vec<Mcu>,
    flows: Vec<FlowQueue>,
    /// Flow queues with commands waiting for an MCU, oldest first.
    waiting: VecDeque<usize>,
    /// Idle MCUs (a stack: the most recently freed goes first).
    free: Vec<usize>,
    absorb: Option<TokenBucket>,
    link: Option<TokenBucket>,
    outstanding_cap: u32,
    quantum: u64,
    flow_queue_depth: usize,
    /// Where the round robin over classes starts: [assured pass, ceiling pass].
    rr: [usize; 2],
    step: u64,
    /// The strict classes, in index order (the most urgent first).
    strict: Vec<usize>,
    /// Per class, a bitset of the MCUs chopping a command of that class (`words` u64s per
    /// class, bit `m` for MCU `m`): deficit round robin and the wait counters visit these
    /// MCUs only, instead of scanning every MCU for its class.
    members: Vec<u64>,
    words: usize,
    read_split_packets: u32,
    shape_read_responses: bool,
    /// The port's shares, when the port's rates are divided among workers.
    port: Option<port::PortLink>,
}

/// The first set bit of `bits` in `[lo, hi)`.
#[inline(always)]
fn first_set(bits: &[u64], lo: usize, hi: usize) -> Option<usize> {
    if lo >= hi {
        return None;
    }
    let mut w = lo / 64;
    let mut word = bits[w] & (u64::MAX << (lo % 64));
    loop {
        if word != 0 {
            let i = w * 64 + word.trailing_zeros() as usize;
            return (i < hi).then_some(i);
        }
        w += 1;
        if w * 64 >= hi {
            return None;
        }
        word = bits[w];
    }
}

/// A fixed, well-mixed hash so flow placement is the same every run.
use crate::rng::splitmix64 as mix;

impl Shaper {
    /// A shaper with full buckets at time 0 and all MCUs idle.
    pub fn new(cfg: ShaperConfig) -> Result<Shaper, ShaperError> {
        cfg.validate()?;
        let words = cfg.mcus.div_ceil(64);
        let strict = (0..cfg.classes.len())
            .filter(|&c| cfg.classes[c].strict)
            .collect();
        let classes = cfg
            .classes
            .iter()
            .map(|&c| Class {
                cfg: c,
                assured: TokenBucket::new(c.assured_bps, c.burst_bytes, 0),
                ceiling: TokenBucket::new(c.ceiling_bps, c.burst_bytes, 0),
                cursor: 0,
                fresh: true,
                busy: 0,
                tried: 0,
                paused_until: 0,
                counters: Counters::default(),
            })
            .collect();
        let mcus = (0..cfg.mcus)
            .map(|_| Mcu {
                flow_queue: None,
                cmd: None,
                deficit: 0,
                outstanding: 0,
                blocked_back: 0,
                counters: Counters::default(),
            })
            .collect();
        let flows = (0..cfg.flow_queues)
            .map(|_| FlowQueue {
                cmds: VecDeque::with_capacity(cfg.flow_queue_depth),
                mcu: None,
                waiting: false,
                stream: false,
            })
            .collect();
        Ok(Shaper {
            pfc_link_bps: cfg.link_bps.unwrap_or(PFC_DEFAULT_LINK_BPS),
            classes,
            mcus,
            flows,
            waiting: VecDeque::with_capacity(cfg.flow_queues),
            free: (0..cfg.mcus).rev().collect(),
            absorb: cfg
                .absorb_bps
                .map(|r| TokenBucket::new(r, cfg.absorb_burst_bytes, 0)),
            link: cfg
                .link_bps
                .map(|r| TokenBucket::new(r, cfg.link_burst_bytes, 0)),
            outstanding_cap: cfg.outstanding_cap,
            quantum: cfg.quantum_bytes as u64,
            flow_queue_depth: cfg.flow_queue_depth,
            rr: [0, 0],
            step: 0,
            strict,
            members: vec![0; cfg.classes.len() * words],
            words,
            read_split_packets: cfg.read_split_packets,
            shape_read_responses: cfg.shape_read_responses,
            port: None,
        })
    }

    /// The flow queue a flow key hashes to.
    pub fn flow_queue_of(&self, flow: u64) -> usize {
        (mix(flow) % self.flows.len() as u64) as usize
    }

    /// Queues a command behind its flow's earlier ones; an idle MCU takes the flow queue at
    /// once if there is one.
    pub fn enqueue(&mut self, cmd: Command) -> Result<(), Refused> {
        let invalid = |reason| Err(Refused::Invalid { cmd, reason });
        if cmd.class as usize >= self.classes.len() {
            return invalid("no such class");
        }
        if cmd.mtu == 0 {
            return invalid("mtu must be > 0");
        }
        if cmd.mtu as u64 > self.quantum {
            // With a quantum of at least one packet, one DRR round always serves an MCU.
            return invalid("mtu above quantum_bytes");
        }
        if let Kind::Get { request_bytes, .. } = cmd.kind
            && request_bytes as u64 > self.quantum
        {
            return invalid("request_bytes above quantum_bytes");
        }
        if let (Kind::Get { .. }, Some(a)) = (cmd.kind, &self.absorb)
            && cmd.mtu as u64 > a.burst_bytes()
        {
            return invalid("GET mtu above absorb_burst_bytes: its responses would never fit");
        }
        if cmd.kind == Kind::Stream {
            return invalid("a stream is started with activate");
        }
        let q = self.flow_queue_of(cmd.flow);
        // The configured depth, not the capacity, which may be rounded up.
        if self.flows[q].cmds.len() == self.flow_queue_depth {
            return Err(Refused::Full(cmd));
        }
        self.push(q, cmd);
        Ok(())
    }

    /// Queues `cmd` on flow queue `q`; an idle MCU takes the queue at once if there is one.
    fn push(&mut self, q: usize, cmd: Command) {
        let fq = &mut self.flows[q];
        fq.cmds.push_back(cmd);
        if fq.mcu.is_none() && !fq.waiting {
            match self.free.pop() {
                Some(m) => self.assign(m, q),
                None => {
                    fq.waiting = true;
                    self.waiting.push_back(q);
                }
            }
        }
    }

    /// Flow queue `queue` has work of `class` that its owner cuts into packets itself (a
    /// queue pair's send queue: the requester knows its window, retransmissions and READ
    /// sizes): an MCU takes the queue (or it waits in order for one), and while it holds it
    /// [`Shaper::next_with`] asks the owner for each packet. Nothing happens if the queue's
    /// stream is already active. `queue` is the caller's own index, below `flow_queues`; a
    /// queue used for streams should not also get hashed commands.
    pub fn activate(&mut self, queue: usize, class: u8) -> Result<(), &'static str> {
        if class as usize >= self.classes.len() {
            return Err("no such class");
        }
        if queue >= self.flows.len() {
            return Err("queue beyond flow_queues");
        }
        if self.flows[queue].stream {
            return Ok(());
        }
        self.flows[queue].stream = true;
        let cmd = Command {
            flow: queue as u64,
            class,
            kind: Kind::Stream,
            mtu: 1,
        };
        // A stream takes no room from the queue's commands: at most one is ever queued.
        self.push(queue, cmd);
        Ok(())
    }

    /// Whether flow queue `queue` has an active stream.
    pub fn is_active(&self, queue: usize) -> bool {
        self.flows.get(queue).is_some_and(|f| f.stream)
    }

    /// The stream of flow queue `queue` has nothing more to send: its MCU moves on (to the
    /// queue's next command, or to the longest-waiting queue). Nothing happens if it has no
    /// active stream.
    pub fn deactivate(&mut self, queue: usize) {
        let Some(fq) = self.flows.get_mut(queue) else {
            return;
        };
        if !fq.stream {
            return;
        }
        fq.stream = false;
        if let Some(m) = fq.mcu
            && self.mcus[m].cmd.is_some_and(|k| k.stream)
        {
            self.take_next_command(m);
            return;
        }
        // Still queued behind commands, or waiting for an MCU.
        fq.cmds.retain(|c| c.kind != Kind::Stream);
        if fq.cmds.is_empty() && fq.mcu.is_none() && fq.waiting {
            fq.waiting = false;
            self.waiting.retain(|&w| w != queue);
        }
    }

    /// The MCU serving flow queue `queue`, if one is.
    pub fn mcu_of(&self, queue: usize) -> Option<usize> {
        self.flows.get(queue).and_then(|f| f.mcu)
    }

    /// Sets MCU `mcu`'s outstanding packets to what its owner counts (a stream's owner knows
    /// its packets in flight better than issues minus completions).
    pub fn set_outstanding(&mut self, mcu: usize, packets: u32) {
        self.mcus[mcu].outstanding = packets;
    }

    /// Gives idle MCU `m` flow queue `q` and its first command.
    fn assign(&mut self, m: usize, q: usize) {
        self.flows[q].mcu = Some(m);
        self.mcus[m].flow_queue = Some(q);
        self.mcus[m].deficit = 0;
        self.take_next_command(m);
    }

    /// Moves MCU `m` to the next command of its flow queue, or frees it (and gives it the
    /// longest-waiting flow queue) if that queue is empty.
    fn take_next_command(&mut self, m: usize) {
        let q = self.mcus[m]
            .flow_queue
            .expect("an MCU with work holds a flow queue");
        let old = self.mcus[m].cmd.take().map(|c| c.class);
        let new = self.flows[q].cmds.pop_front().map(|c| Chopping::of(&c));
        if let Some(c) = old {
            self.classes[c as usize].busy -= 1;
            self.members[c as usize * self.words + m / 64] &= !(1 << (m % 64));
        }
        if let Some(n) = new {
            self.classes[n.class as usize].busy += 1;
            self.members[n.class as usize * self.words + m / 64] |= 1 << (m % 64);
            if old != Some(n.class) {
                // A deficit earned in another class's rounds does not carry over.
                self.mcus[m].deficit = 0;
            }
            self.mcus[m].cmd = Some(n);
            return;
        }
        self.flows[q].mcu = None;
        self.mcus[m].flow_queue = None;
        self.mcus[m].deficit = 0;
        match self.waiting.pop_front() {
            Some(q2) => {
                self.flows[q2].waiting = false;
                self.assign(m, q2);
            }
            None => self.free.push(m),
        }
    }

    /// The arbitration step at `now`: the MCU whose packet goes next, with the buckets charged
    /// and its command advanced; `None` if nothing may go (see [`Shaper::next_ready_at`]).
    pub fn next(&mut self, now: u64) -> Option<Pick> {
        self.next_with(now, |_| None)
    }

    /// [`Shaper::next`], with the packets of streams ([`Shaper::activate`]) from `peek`: given
    /// a stream's queue, the size of the packet its owner would send now, or `None` if it has
    /// none it may send (the MCU is then passed over, counted in `waited_flow`). `peek` must
    /// not change anything: the caller sends the packet after the pick.
    pub fn next_with(
        &mut self,
        now: u64,
        mut peek: impl FnMut(usize) -> Option<Packet>,
    ) -> Option<Pick> {
        self.step += 1;
        if let Some(l) = &mut self.link
            && !l.conforms(now)
        {
            return None;
        }
        let n = self.classes.len();
        // Strict classes in index order: the lowest index is the most urgent.
        for i in 0..self.strict.len() {
            let c = self.strict[i];
            if self.classes[c].busy > 0 && !self.pfc_held(c, now) {
                if self.classes[c].ceiling.conforms(now) {
                    if let Some(p) = self.serve_class(c, now, false, &mut peek) {
                        return Some(p);
                    }
                } else {
                    self.count_out_wait(c);
                }
            }
        }
        // Pass 0: classes within their assured rate; pass 1: those borrowing up to the ceiling.
        for pass in 0..2 {
            let mut c = self.rr[pass];
            for i in 0..n {
                if i > 0 {
                    c = if c + 1 == n { 0 } else { c + 1 };
                }
                let class = &mut self.classes[c];
                if class.cfg.strict || class.busy == 0 || class.tried == self.step {
                    continue;
                }
                if class.paused_until > now {
                    class.tried = self.step;
                    class.counters.waited_pfc += 1;
                    continue;
                }
                if !class.ceiling.conforms(now) {
                    // Out of ceiling tokens it cannot go in either pass: count it once.
                    class.tried = self.step;
                    self.count_out_wait(c);
                    continue;
                }
                if pass == 0 && !class.assured.conforms(now) {
                    continue;
                }
                if let Some(p) = self.serve_class(c, now, pass == 0, &mut peek) {
                    self.rr[pass] = if c + 1 == n { 0 } else { c + 1 };
                    return Some(p);
                }
            }
        }
        None
    }

    /// Whether class `c` is paused by PFC at `now` (counted as a wait when it is).
    #[inline]
    fn pfc_held(&mut self, c: usize, now: u64) -> bool {
        let class = &mut self.classes[c];
        if class.paused_until > now {
            class.counters.waited_pfc += 1;
            true
        } else {
            false
        }
    }

    /// A PFC frame from the link partner (802.1Qbb, [`wire::pfc::PfcRepr`]) at `now`: every class
    /// whose [`ClassConfig::pfc_priority`] the frame names is paused for the quanta it gives
    /// (512 bit times each at the link's rate, [`ShaperConfig::link_bps`], else
    /// [`PFC_DEFAULT_LINK_BPS`]) from now, or resumed by quanta 0. ACKs, NAKs and CNPs never
    /// pass the shaper, so a pause holds back the class's requests and READ responses. Returns the
    /// classes it paused.
    pub fn pfc(&mut self, now: u64, frame: &wire::pfc::PfcRepr) -> u32 {
        let link_bps = self.pfc_link_bps;
        let mut paused = 0;
        for class in &mut self.classes {
            let Some(p) = class.cfg.pfc_priority else {
                continue;
            };
            match frame.pause_ns(usize::from(p), link_bps) {
                None => {}
                Some(0) => class.paused_until = 0,
                Some(ns) => {
                    class.paused_until = now.saturating_add(ns);
                    class.counters.pfc_pauses += 1;
                    paused += 1;
                }
            }
        }
        paused
    }

    /// Counts a step that class `c` (and each of its MCUs with a packet) lost to outbound tokens.
    fn count_out_wait(&mut self, c: usize) {
        self.classes[c].counters.waited_out += 1;
        let bits = &self.members[c * self.words..(c + 1) * self.words];
        for (w, &word) in bits.iter().enumerate() {
            let mut word = word;
            while word != 0 {
                let m = w * 64 + word.trailing_zeros() as usize;
                self.mcus[m].counters.waited_out += 1;
                word &= word - 1;
            }
        }
    }

    /// Deficit round robin over class `c`'s MCUs: serves the first that may send, charging the
    /// assured bucket too if the class is served within its assured rate.
    #[inline]
    fn serve_class(
        &mut self,
        c: usize,
        now: u64,
        assured: bool,
        peek: &mut impl FnMut(usize) -> Option<Packet>,
    ) -> Option<Pick> {
        self.classes[c].tried = self.step;
        let n = self.mcus.len();
        let base = c * self.words;
        let words = base..base + self.words;
        // The cursor moves over every MCU and comes back to the first one (n moves), which may
        // have been passed only for lack of deficit and is now due a fresh quantum. MCUs not
        // chopping for this class are passed without a look: only the class's members are
        // visited, first those from the cursor on, then, wrapped round, those up to it again.
        let start = self.classes[c].cursor;
        let (mut lo, mut hi, mut wrapped) = (start, n, false);
        // The first MCU in turn whose turn it is but whose response does not fit yet.
        let mut first_waiting = None;
        loop {
            let Some(m) = first_set(&self.members[words.clone()], lo, hi) else {
                if wrapped {
                    break;
                }
                (lo, hi, wrapped) = (0, start + 1, true);
                continue;
            };
            lo = m + 1;
            let class = &mut self.classes[c];
            if wrapped || m != start {
                // The cursor moved (at least once) to get here.
                class.cursor = m;
                class.fresh = true;
            }
            // The first MCU comes round twice; count its skips once.
            let counting = !wrapped || m != start;
            let mcu = &mut self.mcus[m];
            let k = mcu
                .cmd
                .as_ref()
                .expect("a member of the class has a command");
            let next = if k.stream {
                let q = mcu.flow_queue.expect("an MCU with work holds a flow queue");
                peek(q).map(|p| (p.out, p.back))
            } else {
                Some(k.next_packet())
            };
            if mcu.outstanding >= self.outstanding_cap {
                if counting {
                    mcu.counters.waited_cap += 1;
                    class.counters.waited_cap += 1;
                }
            } else if let Some((out, back)) = next {
                // A GET's turn costs the larger of what it sends and what it pulls in: the
                // MCUs of a READ class share the absorb rate by bytes, as PUT MCUs share the
                // link (a 74-byte READ request is not a 64 KiB READ's cost).
                let cost = u64::from(out.max(back));
                if class.fresh {
                    // A visit earns the quantum, or the packet's cost if that is more (DRR's
                    // quantum must cover the largest packet for one visit to be enough: a READ
                    // request costs its response). Earned while it waits for absorb tokens
                    // too, so that it is due its turn when they come; bounded, so a long wait
                    // builds no credit beyond that.
                    let grant = cost.max(self.quantum);
                    mcu.deficit = (mcu.deficit + grant).min(grant + self.quantum);
                    class.fresh = false;
                }
                if mcu.deficit < cost {
                    // Its turn is over: the next visit, after the others, earns it more.
                } else if back > 0
                    && self
                        .absorb
                        .as_mut()
                        .is_some_and(|a| !a.admits(now, back as u64))
                {
                    mcu.blocked_back = back;
                    first_waiting.get_or_insert(m);
                    if counting {
                        mcu.counters.waited_in += 1;
                        class.counters.waited_in += 1;
                    }
                } else {
                    mcu.blocked_back = 0;
                    mcu.deficit -= cost;
                    return Some(self.issue(m, c, now, assured, out, back));
                }
            } else if counting {
                mcu.counters.waited_flow += 1;
                class.counters.waited_flow += 1;
            }
        }
        // Every MCU passed: the cursor goes back to the first one whose turn it was and which
        // waits for absorb tokens, so that it is the first when they come (left anywhere else,
        // the next READ would go to whichever MCU the empty passes happened to stop at: at
        // random, in runs); with none such, to where the pass began.
        let class = &mut self.classes[c];
        class.cursor = first_waiting.unwrap_or(start);
        class.fresh = first_waiting.is_none_or(|m| m != start);
        None
    }

    /// Sends MCU `m`'s next packet: charges the buckets, counts it, advances the chopping.
    #[inline]
    fn issue(&mut self, m: usize, c: usize, now: u64, assured: bool, out: u32, back: u32) -> Pick {
        let class = &mut self.classes[c];
        let units = TokenBucket::units(out as u64);
        if assured {
            class.assured.charge_units(now, units);
        }
        class.ceiling.charge_units(now, units);
        if let Some(l) = &mut self.link {
            l.charge_units(now, units);
        }
        if back > 0
            && let Some(a) = &mut self.absorb
        {
            a.charge(now, back as u64);
        }
        for k in [&mut class.counters, &mut self.mcus[m].counters] {
            k.packets += 1;
            k.bytes += out as u64;
            k.response_bytes += back as u64;
        }
        let mcu = &mut self.mcus[m];
        mcu.outstanding += 1;
        let queue = mcu.flow_queue.expect("an MCU with work holds a flow queue");
        let k = mcu.cmd.as_mut().expect("served MCU has a command");
        if k.stream {
            // The owner chops, and says when it is done.
            return Pick {
                mcu: m,
                queue,
                class: c as u8,
                packet_bytes: out,
                response_bytes: back,
                last_of_command: false,
            };
        }
        let chunk = k.remaining.min(k.mtu as u64);
        k.remaining -= chunk;
        let last = k.remaining == 0;
        if last {
            self.take_next_command(m);
            let class = &mut self.classes[c];
            if self.mcus[m].cmd.is_none_or(|k| k.class as usize != c) {
                // Done with this class: its round robin moves on.
                class.cursor = if m + 1 == self.mcus.len() { 0 } else { m + 1 };
                class.fresh = true;
            }
        }
        Pick {
            mcu: m,
            queue,
            class: c as u8,
            packet_bytes: out,
            response_bytes: back,
            last_of_command: last,
        }
    }

    /// Responses or ACKs for `packets` of MCU `m`'s packets were seen.
    pub fn completed(&mut self, mcu: usize, packets: u32) {
        let o = &mut self.mcus[mcu].outstanding;
        *o = o.saturating_sub(packets);
    }

    /// The earliest time `>= now` tokens allow a pick, for the caller's timer; `None` if no
    /// MCU has a packet it may send on tokens alone (idle, or all at their cap).
    pub fn next_ready_at(&self, now: u64) -> Option<u64> {
        let mut best: Option<u64> = None;
        for mcu in &self.mcus {
            let Some(k) = mcu.cmd else { continue };
            if mcu.outstanding >= self.outstanding_cap {
                continue;
            }
            let class = &self.classes[k.class as usize];
            let Some(mut t) = class.ceiling.ready_at(now, 0) else {
                continue;
            };
            // A paused class may go again when its pause ends.
            t = t.max(class.paused_until);
            let back = if k.stream {
                // Its packet is its owner's to say: what last did not fit, if anything.
                mcu.blocked_back
            } else {
                k.next_packet().1
            };
            if let (true, Some(a)) = (back > 0, &self.absorb) {
                match a.ready_at(now, (back as u64).min(a.burst_bytes())) {
                    Some(ta) => t = t.max(ta),
                    None => continue,
                }
            }
            best = Some(best.map_or(t, |b| b.min(t)));
        }
        match (best, &self.link) {
            (Some(t), Some(l)) => l.ready_at(now, 0).map(|lt| t.max(lt)),
            (best, _) => best,
        }
    }

    /// Makes this shaper worker `me` of a port whose configured rates (this shaper's, as
    /// configured) are held across its workers ([`port::PortShares`]): from now on the classes'
    /// and the link's rates are the port's divided among the workers with work in them,
    /// rebalanced every `interval_ns` by [`Shaper::rebalance`].
    pub fn share_port(&mut self, shares: Arc<PortShares>, me: usize, interval_ns: u64) {
        self.port = Some(port::PortLink {
            me: me.min(shares.workers() - 1),
            bits: vec![0; self.classes.len().div_ceil(64).max(1)],
            packets_then: vec![0; self.classes.len()],
            shares,
            interval_ns: interval_ns.max(1),
            next_at: 0,
            link_bps: self.link.as_ref().map(|l| l.rate_bps()),
        });
    }

    /// With [`Shaper::share_port`]: once every interval, says which classes had work here
    /// (queued now, or sent since the last time) and sets this worker's rates to its share of
    /// the port's. Nothing else happens (and nothing is read across cores) between intervals.
    pub fn rebalance(&mut self, now: u64) {
        let Some(p) = &mut self.port else {
            return;
        };
        if now < p.next_at {
            return;
        }
        p.next_at = now + p.interval_ns;
        p.bits.fill(0);
        for (c, class) in self.classes.iter().enumerate() {
            if class.busy > 0 || class.counters.packets != p.packets_then[c] {
                p.bits[c / 64] |= 1 << (c % 64);
            }
            p.packets_then[c] = class.counters.packets;
        }
        p.shares.publish(p.me, &p.bits);
        for (c, class) in self.classes.iter_mut().enumerate() {
            // The class's configuration holds the port's rates; its buckets this worker's.
            let n = 1 + p.shares.others_in(p.me, c) as u64;
            class.assured.set_rate(now, class.cfg.assured_bps / n);
            class
                .ceiling
                .set_rate(now, (class.cfg.ceiling_bps / n).max(1));
        }
        if let (Some(l), Some(rate)) = (&mut self.link, p.link_bps) {
            let n = 1 + p.shares.others_busy(p.me) as u64;
            l.set_rate(now, (rate / n).max(1));
        }
    }

    /// [`ShaperConfig::read_split_packets`].
    pub fn read_split_packets(&self) -> u32 {
        self.read_split_packets
    }

    /// [`ShaperConfig::shape_read_responses`].
    pub fn shapes_read_responses(&self) -> bool {
        self.shape_read_responses
    }

    /// The number of traffic classes.
    pub fn classes(&self) -> usize {
        self.classes.len()
    }

    /// The number of MCUs.
    pub fn mcus(&self) -> usize {
        self.mcus.len()
    }

    pub fn class_counters(&self, class: u8) -> Counters {
        self.classes[class as usize].counters
    }

    pub fn mcu_counters(&self, mcu: usize) -> Counters {
        self.mcus[mcu].counters
    }

    /// Packets MCU `mcu` has issued without a response/ACK seen.
    pub fn outstanding(&self, mcu: usize) -> u32 {
        self.mcus[mcu].outstanding
    }
}

#[cfg(test)]
mod tests;
