//! The `rdma_node` fuzz harness: the whole receive path of one [`RdmaNode`], driven by a byte
//! string, with the invariants that must hold whatever the peer sends.
//!
//! One engine (this node) has two RC queue pairs to one peer, registered memory with guard
//! bytes around it, receives posted and a SEND, a WRITE and a READ of its own in flight, so
//! that both the responder (requests from the peer) and the requester (ACKs, NAKs and READ
//! responses from the peer) have state to work on. The input is a sequence of records; each
//! is either a frame the peer sends or something the application does (post, poll,
//! deregister, wait). After every record the node is run as a worker runs it: `service`,
//! `poll_transmit` + `emit` until it has nothing more to send, `flush_completions`. At the
//! end the peer falls silent: time jumps from deadline to deadline until no timer is left,
//! and the completion queues are drained.
//!
//! Everything is deterministic: queue pair numbers and PSNs are pinned, keys come from
//! `MemoryTable::seeded`, regions are named by fixed addresses (`register_iova`), so one
//! input always does the same thing, and `examples/seed_corpus.rs` can rewrite captured
//! frames to reach these queue pairs and regions. Retry limits are 2 (not 7) so that an
//! input's final drain stays short.
//!
//! This file is shared: the fuzz target (`fuzz_targets/rdma_node.rs`), the seed-corpus tool
//! and the replay test (`engine/node/tests/fuzz_regressions.rs`, which includes it by path) all
//! run [`run`], so a crashing input replays under `cargo test` exactly as libFuzzer ran it.
//!
//! # Input format
//!
//! ```text
//! input  := record*
//! record := cmd:u8 body
//!   cmd < 0xc0   a frame from the peer: len:u16 (little-endian), then len bytes (fewer if
//!                the input ends first). Time then advances by (cmd & 0x3f)² µs.
//!   cmd >= 0xc0  an application action on queue pair (cmd >> 3) & 1, with two argument
//!                bytes a, b (missing ones read as 0); cmd & 7 picks it:
//!                  0 post a receive of a·16 bytes at R1 + b·16 (on the tagged queue pair:
//!                    append a use-once tagged receive there, tag b & 3)
//!                  1 post a SEND of a·8 bytes from R2 + b·16 (with immediate if b is odd; on
//!                    the tagged queue pair a tagged send with tag b & 3, rendezvous above
//!                    64 bytes)
//!                  2 post a WRITE of a·8 bytes from R2 to the peer (immediate if b is odd)
//!                  3 post a READ of a·8 bytes from the peer into R1 + b·16
//!                  4 poll both completion queues
//!                  5 deregister R1
//!                  6 wait (a + 1) · 100 µs
//!                  7 post a WRITE gathered from R2 + b·16 and R1 (a·8 bytes each)
//! ```
//!
//! # Invariants checked (any violation panics, which libFuzzer reports as a crash)
//!
//! - No panic anywhere in the node (debug assertions and overflow checks are on).
//! - Every received frame ends in exactly one outcome counter: `rx_frames` equals the sum in
//!   [`outcomes`], and each frame moves exactly the counter its [`RxOutcome`] names. A
//!   dropped frame leaves every queue pair's statistics as they were.
//! - Packets the queue pairs were handed add up: the queue pairs' `rx_packets` sum to
//!   `delivered`.
//! - Every frame the node transmits emits without error at its announced length, parses
//!   back with `wire::parse_frame` (checksums and ICRC included), comes from the node's
//!   addresses, goes to the peer's and to one of the peer's queue pairs, and carries no more
//!   payload than the largest path MTU. An ARP reply parses as an ARP reply from the node.
//! - One step never transmits more than [`MAX_TX_PER_STEP`] frames (no livelock), and once
//!   the peer is silent every queue pair comes to rest (done, or in error after its retries)
//!   within `DRAIN_ROUNDS` timer rounds.
//! - Memory outside the registered regions (guard pages) is never written, nor is R2, which
//!   only allows remote reads; R1 is never written after its deregistration finished.
//! - Every completion names a work request that was posted and has not completed yet, with
//!   that request's opcode; a successful receive is no longer than the buffer posted; no
//!   completion ring overruns; at the end, every completion the node counted was polled.
//! - The second queue pair is tagged (list matching on endpoint 0, receives and an overflow
//!   buffer in R1): every tag event that carries data names an address inside R1 and no
//!   more than the message's length; no event is lost.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, OnceLock};

use node::cm::{CmControl, CmEvents, CmReply, CmSetup, ConnEvent};
use node::{
    Control, ControlReply, Cq, NodeCounters, Qp, RdmaNode, RxOutcome, TagConfig, TagEntry,
    TagEvent, TagPort,
};
use pmem::{MapOptions, Mapping};
use proto::lpe::{EndpointConfig, EndpointIndex, ListKind, Options};
use proto::transport::{
    Access, MemoryTable, MrKeys, Mtu, QpConfig, RecvRequest, SgList, Sge, WcOpcode, WcStatus,
    WorkRequest,
};
use wire::{self, EthernetAddress};

pub const NODE_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0b]);
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
pub const PEER_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0a]);
pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
/// The node's queue pairs (local QPN, the peer's QPN, path MTU).
pub const QPS: [(u32, u32, Mtu); 2] = [(0x22, 0x11, Mtu::M256), (0x23, 0x12, Mtu::M1024)];
/// Seed of the node's key generator: the same keys in every run.
pub const KEY_SEED: u64 = 0x5eed;

const PAGE: usize = 4096;
/// The one mapping: guard page, R1, guard page, R2, guard page.
const MAPPING_LEN: usize = 5 * PAGE;
/// R1: local write, remote read and write. Receives, incoming WRITEs and READ responses land
/// here; the peer may READ it.
pub const R1_OFFSET: usize = PAGE;
pub const R1_IOVA: u64 = 0x0000_7f00_0010_0000;
/// R2: remote read only. The source of the node's own SENDs and WRITEs; never written.
pub const R2_OFFSET: usize = 3 * PAGE;
pub const R2_IOVA: u64 = 0x0000_7f00_0020_0000;
pub const REGION_LEN: usize = PAGE;
/// What the node's own WRITEs and READs name on the peer (the peer is the input).
pub const PEER_ADDR: u64 = 0x0000_5500_0000_0000;
/// Seed of the key generator of the peer that `examples/seed_corpus.rs` runs: its first
/// region's rkey is the one the node's WRITEs and READs carry ([`peer_rkey`]).
pub const PEER_KEY_SEED: u64 = 0x9eed;

/// The rdma_cm port the node's CM listens on (QP1's REQs to it are accepted).
pub const CM_PORT: u16 = 7471;
/// The CM's bounds here: small, so that an input can reach them.
const CM_HALF_OPEN: usize = 4;
const CM_CONNECTIONS: usize = 6;

/// Frames one record may make the node transmit before the harness calls it a livelock.
pub const MAX_TX_PER_STEP: usize = 4096;
/// Timer rounds a silent peer may take before every queue pair is at rest: a few per retry
/// and RNR retry of each queue pair is plenty.
const DRAIN_ROUNDS: usize = 160;

/// A posted work request not completed yet.
#[derive(Debug, Clone, Copy)]
struct Outstanding {
    qpn: u32,
    /// The completion opcode a send request ends with; `None` for a receive.
    opcode: Option<WcOpcode>,
    len: u64,
}

/// One node under test, with the application's side of it.
pub struct Harness {
    pub node: RdmaNode,
    qps: Vec<Qp>,
    send_cq: Cq,
    recv_cq: Cq,
    map: Arc<Mapping>,
    pub r1: MrKeys,
    pub r2: MrKeys,
    /// R1's bytes when its deregistration finished; nothing may write them afterwards.
    r1_removed: Option<Vec<u8>>,
    r1_deregistering: bool,
    now: u64,
    next_wr_id: u64,
    outstanding: HashMap<u64, Outstanding>,
    polled: u64,
    tx: Vec<u8>,
    /// When set, every frame the node transmits is kept here (for the seed-corpus tool).
    pub sent: Option<Vec<Vec<u8>>>,
    /// The application's end of the tagged queue pair's list matching.
    tags: TagPort,
    /// The CM's events, and the queue pairs of the connections it accepted.
    cm: CmEvents,
    cm_qps: Vec<Qp>,
    _cm_cq: Cq,
}

impl Default for Harness {
    fn default() -> Self {
        Harness::new()
    }
}

impl Harness {
    /// The node with its queue pairs, regions, receives and first requests posted (not yet
    /// taken: the first step's `service` takes them).
    pub fn new() -> Harness {
        let mut node = RdmaNode::new(NODE_MAC, NODE_IP);
        node.mem = MemoryTable::seeded(KEY_SEED);
        let send_cq = node.create_cq(8);
        let recv_cq = node.create_cq(16);
        // A CM on QP1, listening, deterministic, with short timers and small bounds; its
        // queue pairs complete into a queue of their own (no work is posted on them).
        let cm_cq = node.create_cq(64);
        let mut template = QpConfig::new(0, 0);
        template.max_send_wr = 4;
        template.max_recv_wr = 4;
        template.retry_limit = 2;
        let mut setup = CmSetup::new(template, cm_cq.id(), cm_cq.id());
        setup.cm.seed = KEY_SEED;
        setup.cm.response_timeout = 10;
        setup.cm.max_retries = 2;
        setup.cm.max_half_open = CM_HALF_OPEN;
        setup.cm.max_connections = CM_CONNECTIONS;
        setup.cm.time_wait_ns = 10_000_000;
        setup.first_qpn = 0x40;
        let cm = node.enable_cm(setup);
        match node.control(9, Control::Cm(CmControl::Listen(CM_PORT))) {
            Some((_, ControlReply::Cm(Ok(_)))) => {}
            other => panic!("listen: {other:?}"),
        }
        let tags = node
            .enable_tags(&TagConfig {
                endpoints: vec![(
                    EndpointIndex(0),
                    EndpointConfig {
                        max_priority: 8,
                        max_overflow: 2,
                        max_unexpected: 4,
                        max_software_requests: 2,
                        ..EndpointConfig::default()
                    },
                )],
                event_depth: 512,
                command_depth: 16,
                max_messages: 6,
                ..TagConfig::default()
            })
            .expect("one endpoint");
        let qps = QPS
            .iter()
            .map(|&(local, remote, pmtu)| {
                let mut cfg = QpConfig::new(local, remote);
                cfg.remote_mac = PEER_MAC;
                cfg.remote_ip = PEER_IP;
                cfg.send_psn = 0;
                cfg.recv_psn = 0;
                cfg.pmtu = pmtu;
                cfg.max_send_wr = 8;
                cfg.max_recv_wr = 8;
                cfg.max_rd_atomic = 4;
                // Few retries, so that the final drain (and every input) stays short.
                cfg.retry_limit = 2;
                cfg.rnr_retry_limit = 2;
                // The first queue pair speaks the durable-write extension (0xE0-0xE2), the
                // second tagged messaging (tag header in SEND payload).
                cfg.durable_writes = local == QPS[0].0;
                cfg.tagged = local == QPS[1].0;
                cfg.tag_rank = 9;
                cfg.rndv_threshold = 64;
                node.add_qp(cfg, &send_cq, &recv_cq)
                    .expect("a valid queue pair")
            })
            .collect();
        // Under the power-loss simulator, so that persisting is a ticketed job (run inline:
        // no flusher thread while fuzzing) and every persistence path is reached.
        let map = Arc::new(
            MapOptions::new()
                .simulate_power_loss(true)
                .anonymous(MAPPING_LEN)
                .expect("simulated memory"),
        );
        node.set_persist_inline(true);
        map.write(0, initial_bytes()).expect("inside the mapping");
        let r1 = node
            .mem
            .register_iova(
                map.clone(),
                R1_OFFSET,
                REGION_LEN,
                R1_IOVA,
                Access::ALL | Access::FLUSH_GLOBAL | Access::FLUSH_PERSISTENT | Access::DURABLE,
            )
            .expect("R1 registers");
        let r2 = node
            .mem
            .register_iova(
                map.clone(),
                R2_OFFSET,
                REGION_LEN,
                R2_IOVA,
                Access::REMOTE_READ,
            )
            .expect("R2 registers");
        let mut h = Harness {
            node,
            qps,
            send_cq,
            recv_cq,
            map,
            r1,
            r2,
            r1_removed: None,
            r1_deregistering: false,
            now: 0,
            next_wr_id: 1,
            outstanding: HashMap::new(),
            polled: 0,
            tx: vec![0; 8192],
            sent: None,
            tags,
            cm,
            cm_qps: Vec::new(),
            _cm_cq: cm_cq,
        };
        // Tagged receives for tags 0 and 1, and an overflow buffer (the second half of R1).
        for tag in 0..2u8 {
            h.post_recv(1, 8, 16 * tag);
        }
        let overflow = TagEntry::recv(0, Sge::new(r1.lkey, R1_IOVA + 2048, 2048), 0xf)
            .with_ignore(u64::MAX)
            .with_options(Options::MANAGE_LOCAL)
            .with_min_free(64);
        h.tags
            .append(0, ListKind::Overflow, overflow)
            .expect("room");
        // Four 1 KiB receives per queue pair, covering R1 (both queue pairs share it).
        for q in 0..2 {
            for k in 0..4 {
                h.post_recv(q, 64, 64 * k);
            }
        }
        // Three, one, two and two packets: every request opcode of the requester.
        h.post_send(0, WrOp::Send, 70, 0);
        h.post_send(0, WrOp::Write, 12, 1);
        h.post_send(0, WrOp::Read, 40, 64);
        h.post_send(1, WrOp::Write, 140, 3);
        h
    }

    fn wr_id(&mut self) -> u64 {
        self.next_wr_id += 1;
        self.next_wr_id
    }

    fn note(&mut self, wr_id: u64, qpn: u32, opcode: Option<WcOpcode>, len: u64) {
        self.outstanding
            .insert(wr_id, Outstanding { qpn, opcode, len });
    }

    /// Posts a receive of `a`·16 bytes at R1 + `b`·16 (which may run past R1: that completes
    /// with a local protection error).
    fn post_recv(&mut self, q: usize, a: u8, b: u8) {
        let len = u32::from(a) * 16;
        if q == 1 {
            let buf = Sge::new(self.r1.lkey, R1_IOVA + u64::from(b) * 16, len);
            let cookie = self.wr_id();
            let _ = self.tags.append(
                0,
                ListKind::Priority,
                TagEntry::recv(u64::from(b & 3), buf, cookie),
            );
            return;
        }
        let sgl = SgList::one(self.r1.lkey, R1_IOVA + u64::from(b) * 16, len);
        let id = self.wr_id();
        if self.qps[q].post_recv(&[RecvRequest::new(id, sgl)]).is_ok() {
            self.note(id, QPS[q].0, None, u64::from(len));
        }
    }

    fn post_send(&mut self, q: usize, op: WrOp, a: u8, b: u8) {
        let len = u32::from(a) * 8;
        let at = u64::from(b) * 16;
        let imm = (b & 1 == 1).then_some(0x1234_5678 ^ u32::from(b));
        let id = self.wr_id();
        let wr = match op {
            WrOp::Send if q == 1 => {
                let sgl = SgList::one(self.r2.lkey, R2_IOVA + at, len);
                WorkRequest::tagged_send(id, sgl, 0, u64::from(b & 3), u64::from(a))
            }
            WrOp::Send => WorkRequest::send(id, SgList::one(self.r2.lkey, R2_IOVA + at, len), imm),
            WrOp::Write => WorkRequest::write(
                id,
                SgList::one(self.r2.lkey, R2_IOVA + at, len),
                PEER_ADDR + at,
                peer_rkey(),
                imm,
            ),
            WrOp::Read => WorkRequest::read(
                id,
                SgList::one(self.r1.lkey, R1_IOVA + at, len),
                PEER_ADDR + at,
                peer_rkey(),
            ),
            WrOp::GatherWrite => {
                let sgl = SgList::from_slice(&[
                    Sge::new(self.r2.lkey, R2_IOVA + at, len),
                    Sge::new(self.r1.lkey, R1_IOVA, len),
                ])
                .expect("two entries");
                WorkRequest::write(id, sgl, PEER_ADDR, peer_rkey(), None)
            }
        };
        if self.qps[q].post_send(&[wr]).is_ok() {
            self.note(id, QPS[q].0, Some(wr.wc_opcode()), wr.sgl.total_len());
        }
    }

    /// Hands one frame to the node and checks that exactly the counter its outcome names moved.
    pub fn receive(&mut self, frame: &[u8]) {
        let before = outcomes(&self.node.counters);
        let stats: Vec<_> = self.node.qps().map(|qp| qp.stats()).collect();
        let outcome = self.node.receive(self.now, frame);
        let after = outcomes(&self.node.counters);
        assert_eq!(
            after.rx_frames,
            after.sum(),
            "every frame ends in exactly one outcome counter: {:?}",
            self.node.counters
        );
        let moved = (
            after.delivered - before.delivered,
            after.arp_replies - before.arp_replies,
            after.cm_frames - before.cm_frames,
            after.dropped - before.dropped,
        );
        let expect = match outcome {
            RxOutcome::Delivered => (1, 0, 0, 0),
            RxOutcome::ArpReply(len) => {
                self.check_arp_reply(len);
                (0, 1, 0, 0)
            }
            RxOutcome::Cm => (0, 0, 1, 0),
            RxOutcome::Dropped => {
                assert!(
                    self.node.qps().map(|qp| qp.stats()).eq(stats),
                    "a dropped frame changed a queue pair"
                );
                (0, 0, 0, 1)
            }
        };
        assert_eq!(moved, expect, "{outcome:?} moved its own counter");
    }

    fn check_arp_reply(&self, len: usize) {
        use wire::arp::{ArpOp, ArpRepr, Packet};
        let reply = self.node.arp_reply(len);
        let eth = wire::ethernet::Packet::new_checked(reply).expect("an Ethernet frame");
        let eth = wire::EthernetRepr::parse(&eth).expect("an Ethernet header");
        assert_eq!(eth.src_addr, NODE_MAC);
        let arp = ArpRepr::parse(
            &Packet::new_checked(&reply[wire::ethernet::HEADER_LEN..]).expect("an ARP packet"),
        )
        .expect("an ARP reply");
        assert_eq!(
            (arp.op, arp.sender_hw, arp.sender_ip),
            (ArpOp::Reply, NODE_MAC, NODE_IP)
        );
    }

    /// One worker iteration after a received frame or an application action.
    pub fn step(&mut self) {
        let now = self.now;
        self.node.service(now);
        let mut sent = 0;
        while let Some(tx) = self.node.poll_transmit(now) {
            sent += 1;
            assert!(
                sent <= MAX_TX_PER_STEP,
                "more than {MAX_TX_PER_STEP} frames in one step"
            );
            let want = self.node.frame_len(&tx);
            assert!(want <= self.tx.len(), "a {want}-byte frame");
            let len = self
                .node
                .emit(&tx, &mut self.tx)
                .expect("a frame the node chose to send emits");
            assert_eq!(len, want, "emit writes the announced length");
            check_transmitted(&self.tx[..len]);
            if let Some(sent) = &mut self.sent {
                sent.push(self.tx[..len].to_vec());
            }
        }
        // The CM's application: accepts every request, keeps the queue pairs.
        while let Some(ev) = self.cm.poll() {
            if let ConnEvent::Request(r) = ev {
                let call = CmControl::Accept {
                    id: r.id,
                    private_data: vec![1, 0, 0, 0],
                    cqs: None,
                    tweak: Default::default(),
                };
                if let Some((_, ControlReply::Cm(Ok(CmReply::Accepted(qp))))) =
                    self.node.control(9, Control::Cm(call))
                {
                    self.cm_qps.push(qp);
                }
            }
        }
        // The CM's frames: QP1 frames that parse (a 256-byte MAD the CM itself would take)
        // from the node's addresses, or ARP requests from it.
        let mut cm_sent = 0;
        while let Some(len) = self.node.poll_cm_frame(&mut self.tx) {
            cm_sent += 1;
            assert!(cm_sent <= MAX_TX_PER_STEP, "the CM sends without end");
            check_cm_frame(&self.tx[..len]);
            if let Some(sent) = &mut self.sent {
                sent.push(self.tx[..len].to_vec());
            }
        }
        let (held, _) = self.node.cm_connections().expect("a CM");
        assert!(
            held <= CM_CONNECTIONS,
            "{held} connections, bound {CM_CONNECTIONS}"
        );
        self.node.flush_completions();
        // As a worker's iteration ends: the tag events made are shown to the host.
        self.node.publish_tag_events();
        assert_eq!(self.node.counters.cq_overruns, 0, "no completion is lost");
        let mut deregistered = false;
        self.node.take_replies(|(_, reply)| {
            assert_eq!(reply, ControlReply::Deregistered(true));
            deregistered = true;
        });
        if deregistered {
            self.r1_gone();
        }
    }

    fn r1_gone(&mut self) {
        let mut bytes = vec![0; REGION_LEN];
        self.map
            .read(R1_OFFSET, &mut bytes)
            .expect("inside the mapping");
        self.r1_removed = Some(bytes);
    }

    /// An application action (see the module documentation); `cmd & 7` picks it.
    fn act(&mut self, cmd: u8, a: u8, b: u8) {
        let q = usize::from((cmd >> 3) & 1);
        match cmd & 7 {
            0 => self.post_recv(q, a, b),
            1 => self.post_send(q, WrOp::Send, a, b),
            2 => self.post_send(q, WrOp::Write, a, b),
            3 => self.post_send(q, WrOp::Read, a, b),
            4 => self.poll(),
            5 => self.deregister_r1(),
            6 => self.now += (u64::from(a) + 1) * 100_000,
            _ => self.post_send(q, WrOp::GatherWrite, a, b),
        }
    }

    /// The node's clock, in nanoseconds.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Carries out one record of an input, then runs a worker iteration.
    pub fn apply(&mut self, record: &Record) {
        match *record {
            Record::Frame { dt, frame } => {
                self.receive(frame);
                self.step();
                let dt = u64::from(dt);
                self.now += dt * dt * 1000;
            }
            Record::Act { cmd, a, b } => {
                self.act(cmd, a, b);
                self.step();
            }
        }
    }

    fn deregister_r1(&mut self) {
        if self.r1_deregistering {
            return;
        }
        self.r1_deregistering = true;
        let lkey = self.r1.lkey;
        if let Some((_, reply)) = self.node.control(1, Control::Deregister { lkey }) {
            panic!("R1 is registered, yet deregistering it answered {reply:?}");
        }
        // Answered later, through take_replies (in `step`), when nothing uses R1 any more.
    }

    /// Polls both completion queues and checks every completion against what was posted, and
    /// the tag events.
    pub fn poll(&mut self) {
        let mut evs = [TagEvent::EMPTY; 32];
        loop {
            let n = self.tags.poll(&mut evs);
            if n == 0 {
                break;
            }
            for e in &evs[..n] {
                assert!(e.mlength <= e.rlength || e.rlength == 0, "{e:?}");
                if e.addr != 0 {
                    let r1 = R1_IOVA..R1_IOVA + REGION_LEN as u64;
                    assert!(
                        r1.contains(&e.addr) && e.addr + e.mlength <= r1.end,
                        "{e:?} names its data inside R1"
                    );
                }
            }
        }
        while let Some(wc) = self.send_cq.poll_one().or_else(|| self.recv_cq.poll_one()) {
            self.polled += 1;
            let Some(posted) = self.outstanding.remove(&wc.wr_id) else {
                panic!("a completion for no outstanding work request: {wc:?}");
            };
            assert_eq!(wc.qpn, posted.qpn, "{wc:?} on its own queue pair");
            match posted.opcode {
                Some(op) => assert_eq!(wc.opcode, op, "{wc:?}"),
                None => {
                    assert!(
                        matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm),
                        "{wc:?} for a receive"
                    );
                    if wc.status == WcStatus::Success {
                        assert!(
                            u64::from(wc.byte_len) <= posted.len,
                            "{wc:?} fits its buffer"
                        );
                    }
                }
            }
        }
    }

    /// Runs time on until every timer has fired, drains the completion queues, and checks
    /// what must hold at the end.
    pub fn finish(&mut self) {
        // The peer falls silent: each round jumps to the earliest deadline, fires it and
        // sends what it made. Every queue pair must come to rest (done, or in error after its
        // retries) within a bounded number of rounds.
        let mut rounds = 0;
        loop {
            self.poll();
            self.step();
            let cm = self.node.cm_deadline();
            let next = self
                .node
                .qps()
                .filter_map(|qp| qp.next_deadline())
                .chain(cm)
                .min();
            let Some(deadline) = next else { break };
            rounds += 1;
            assert!(
                rounds <= DRAIN_ROUNDS,
                "a queue pair still has a deadline after {DRAIN_ROUNDS} rounds of a silent peer"
            );
            self.now = deadline.max(self.now + 1000);
        }
        self.poll();
        let tags = self.node.tags().expect("tagged engine").counters;
        assert_eq!(tags.events_lost, 0, "no tag event lost: {tags:?}");
        assert_eq!(
            self.polled, self.node.counters.completions,
            "every completion counted was delivered"
        );
        let (cm, qp1) = self.node.cm_counters().expect("a CM");
        assert_eq!(
            cm.mads_received, qp1.qp1_frames,
            "every QP1 frame that passed its checks reached the CM"
        );
        let delivered: u64 = self.node.qps().map(|qp| qp.stats().rx_packets).sum();
        assert_eq!(
            delivered, self.node.counters.delivered,
            "the queue pairs saw every packet delivered to them"
        );
        let mut now = vec![0; MAPPING_LEN];
        self.map.read(0, &mut now).expect("inside the mapping");
        for (name, range) in [
            ("guard page before R1", 0..R1_OFFSET),
            (
                "guard page between R1 and R2",
                R1_OFFSET + REGION_LEN..R2_OFFSET,
            ),
            ("R2 (remote read only)", R2_OFFSET..R2_OFFSET + REGION_LEN),
            ("guard page after R2", R2_OFFSET + REGION_LEN..MAPPING_LEN),
        ] {
            let initial = initial_bytes();
            // Slices compare with memcmp, which the coverage instrumentation leaves alone.
            if now[range.clone()] != initial[range.clone()] {
                let i = range.clone().find(|&i| now[i] != initial[i]);
                panic!("{name} was written (first at mapping offset {i:?})");
            }
        }
        if let Some(removed) = &self.r1_removed {
            assert!(
                now[R1_OFFSET..R1_OFFSET + REGION_LEN] == removed[..],
                "R1 was written after its deregistration finished"
            );
        }
    }
}

/// The rkey of the first region registered on a `MemoryTable::seeded(PEER_KEY_SEED)`.
pub fn peer_rkey() -> u32 {
    static KEY: OnceLock<u32> = OnceLock::new();
    *KEY.get_or_init(|| {
        let mut table = MemoryTable::seeded(PEER_KEY_SEED);
        let map = Arc::new(Mapping::anonymous(PAGE).expect("anonymous memory"));
        table
            .register_iova(map, 0, PAGE, PEER_ADDR, Access::ALL)
            .expect("a page registers")
            .rkey
    })
}

/// The mapping as set up: guard pages and R2 must still hold these bytes at the end.
fn initial_bytes() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        (0..MAPPING_LEN)
            .map(|i| (i as u8).wrapping_mul(31) ^ 0xa5)
            .collect()
    })
}

#[derive(Debug, Clone, Copy)]
enum WrOp {
    Send,
    Write,
    Read,
    GatherWrite,
}

/// What became of the frames a node received, from its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcomes {
    pub rx_frames: u64,
    pub delivered: u64,
    pub arp_replies: u64,
    pub cm_frames: u64,
    /// Frames dropped, over every drop reason.
    pub dropped: u64,
}

impl Outcomes {
    pub fn sum(&self) -> u64 {
        self.delivered + self.arp_replies + self.cm_frames + self.dropped
    }
}

/// Sorts the node's counters into outcomes. The destructuring names every field, so a
/// counter added to `NodeCounters` fails to compile here until it is placed on one side.
pub fn outcomes(c: &NodeCounters) -> Outcomes {
    let NodeCounters {
        rx_frames,
        delivered,
        arp_replies,
        cm_frames,
        icrc_errors,
        malformed,
        not_for_us,
        pfc_frames,
        mac_control_ignored,
        wrong_mac,
        vlan_tagged,
        ip_options,
        ip_fragments,
        wrong_transport,
        unknown_qp,
        bad_pkey,
        wrong_source,
        wrong_core,
        // Not about received frames.
        tx_packets: _,
        posted: _,
        completions: _,
        cq_full: _,
        cq_overruns: _,
        persist_jobs: _,
        persist_failures: _,
        shaper_picks: _,
        shaper_misses: _,
        shaper_read_responses: _,
    } = *c;
    Outcomes {
        rx_frames,
        delivered,
        arp_replies,
        cm_frames,
        dropped: icrc_errors
            + malformed
            + not_for_us
            + pfc_frames
            + mac_control_ignored
            + wrong_mac
            + vlan_tagged
            + ip_options
            + ip_fragments
            + wrong_transport
            + unknown_qp
            + bad_pkey
            + wrong_source
            + wrong_core,
    }
}

/// A transmitted frame parses back and goes from this node to one of the peer's queue pairs.
fn check_transmitted(frame: &[u8]) {
    let (repr, payload) = match wire::parse_frame(frame) {
        Ok(parsed) => parsed,
        Err(e) => panic!("a transmitted frame does not parse: {e}: {frame:02x?}"),
    };
    assert_eq!((repr.src_mac, repr.ip.src_addr), (NODE_MAC, NODE_IP));
    assert_eq!((repr.dst_mac, repr.ip.dst_addr), (PEER_MAC, PEER_IP));
    assert!(
        QPS.iter().any(|&(_, remote, _)| remote == repr.bth.dest_qp),
        "to QPN {:#x}, not one of the peer's",
        repr.bth.dest_qp
    );
    assert!(
        payload.len() <= Mtu::M1024.bytes() as usize,
        "{} payload bytes",
        payload.len()
    );
}

/// A frame of the CM's parses: a QP1 frame from the node carrying a well-formed CM MAD, or an
/// ARP request from the node.
fn check_cm_frame(frame: &[u8]) {
    if let Some(arp) = wire::arp::parse_frame(frame) {
        assert_eq!((arp.sender_hw, arp.sender_ip), (NODE_MAC, NODE_IP));
        return;
    }
    let (repr, mad) = match wire::gsi::GsiRepr::parse(frame) {
        Ok(p) => p,
        Err(e) => panic!("a CM frame does not parse: {e}: {frame:02x?}"),
    };
    assert_eq!((repr.src_mac, repr.ip.src_addr), (NODE_MAC, NODE_IP));
    assert_eq!((repr.dest_qp, repr.deth.src_qp), (1, 1));
    assert_eq!(repr.deth.qkey, wire::deth::GSI_QKEY);
    assert!(
        proto::cm::check_mad(mad).is_ok(),
        "the CM sends what a CM takes: {mad:02x?}"
    );
}

/// One record of an input (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record<'a> {
    /// A frame from the peer; time advances by `dt`² µs after it.
    Frame { dt: u8, frame: &'a [u8] },
    /// An application action (`cmd` >= 0xc0) with its two argument bytes.
    Act { cmd: u8, a: u8, b: u8 },
}

impl Record<'_> {
    /// Appends the record's bytes to an input.
    pub fn encode(&self, input: &mut Vec<u8>) {
        match *self {
            Record::Frame { dt, frame } => {
                let len = u16::try_from(frame.len()).expect("a frame shorter than 64 KiB");
                input.push(dt & 0x3f);
                input.extend_from_slice(&len.to_le_bytes());
                input.extend_from_slice(frame);
            }
            Record::Act { cmd, a, b } => input.extend_from_slice(&[cmd | 0xc0, a, b]),
        }
    }
}

/// The records of an input, in order. Every byte string is a valid input: a record cut short
/// by the end of the input takes what there is.
pub fn records(mut rest: &[u8]) -> impl Iterator<Item = Record<'_>> {
    std::iter::from_fn(move || {
        let (&cmd, tail) = rest.split_first()?;
        if cmd < 0xc0 {
            let len = u16::from_le_bytes([byte(tail, 0), byte(tail, 1)]);
            let body = tail.get(2..).unwrap_or_default();
            let (frame, tail) = body.split_at(usize::from(len).min(body.len()));
            rest = tail;
            Some(Record::Frame {
                dt: cmd & 0x3f,
                frame,
            })
        } else {
            let (a, b) = (byte(tail, 0), byte(tail, 1));
            rest = tail.get(2..).unwrap_or_default();
            Some(Record::Act { cmd, a, b })
        }
    })
}

fn byte(data: &[u8], i: usize) -> u8 {
    data.get(i).copied().unwrap_or(0)
}

/// Runs `data` through a fresh node, record by record, checking every invariant. Panics on a
/// violation.
pub fn run(data: &[u8]) {
    let mut h = Harness::new();
    for record in records(data) {
        h.apply(&record);
    }
    h.finish();
}

/// The `dt_code` whose time step is closest to `ns` nanoseconds.
pub fn dt_code(ns: u64) -> u8 {
    let us = ns / 1000;
    (0..=0x3fu64)
        .min_by_key(|c| (c * c).abs_diff(us))
        .unwrap_or(0) as u8
}
