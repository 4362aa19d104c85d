//! Tagged messaging (MPI-style tag matching in the engine) between two engines over a
//! `net_ring` link, on real EAL without hugepages. Each test starts its own pair (A is rank 0,
//! B rank 1; tagged queue pairs, endpoint 0, MTU 1024, eager up to 16 KiB) and checks one rule;
//! every byte is compared in the application's own mappings, where the engine placed it.
//!
//! - wildcard source: a receive from any rank takes what a receive from another rank does not;
//! - ignore bits: only the ignored bits of the tag are free;
//! - order: two messages that match two receives land first → first, posted or unexpected;
//! - an unexpected eager message of several packets lands in the overflow buffer, its sender
//!   completes, and a later append claims it;
//! - truncation: what does not fit is discarded (eager, rendezvous and claimed), the event says
//!   so, the bytes past the buffer are untouched, and the queue pair goes on working;
//! - rendezvous (1 MiB and 4 MiB + 3) from the priority list and from the unexpected list;
//! - a rendezvous send completes only after the target took the message;
//! - a capture of eager and rendezvous traffic decodes in tshark as standard RoCEv2.
//!
//! The tests share one EAL (`common::shared_eal`) and run one at a time (`common::serial`).
//! Both engines of a pair run on one worker on the last core, the test on the first (see
//! `common::host_on_first_core` for why).
//!
//! Two tests guard faults these tests found in the engine (both failed before their fix): an
//! unexpected rendezvous reported truncated, and a queue pair that gave up on its own done
//! message without telling anyone, leaving the next rendezvous send waiting forever (the
//! second without EAL, on two `RdmaNode`s, deterministically).

mod common;

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use common::pattern;
use pmem::Mapping;
use portico::lpe::{ListKind, Options};
use portico::rdma::loopback::{self, LoopbackOpts, LoopbackPair};
use portico::rdma::{
    Cq, MemoryRegion, RdmaNode, TagConfig, TagEntry, TagEvent, TagEventKind, TagPort,
};
use portico::transport::{
    Access, QpConfig, SgList, WcOpcode, WcStatus, WorkCompletion, WorkRequest,
};
use portico::wire::EthernetAddress;

const WAIT: Duration = Duration::from_secs(20);
const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
/// Every tagged message here goes to endpoint 0.
const EP: u16 = 0;
/// Data bytes of a rendezvous request's first packet at MTU 1024 (48-byte tag header).
const FIRST_CHUNK: u64 = 1024 - 48;

/// One side's tag port and every event it produced.
struct Events {
    port: TagPort,
    /// Every event, in the order the port gave them.
    seen: Vec<TagEvent>,
    /// Events not yet taken by [`Events::take`].
    pending: VecDeque<TagEvent>,
}

impl Events {
    fn new(port: TagPort) -> Events {
        Events {
            port,
            seen: Vec::new(),
            pending: VecDeque::new(),
        }
    }

    /// The first event (pending, or arriving within [`WAIT`]) for which `f` holds.
    fn take(&mut self, what: &str, f: impl Fn(&TagEvent) -> bool) -> TagEvent {
        if let Some(i) = self.pending.iter().position(&f) {
            return self.pending.remove(i).unwrap();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                panic!(
                    "{what}: no such event within {WAIT:?}; events: {:#?}",
                    self.seen
                );
            }
            if let Some(e) = self.port.wait_one(left.min(Duration::from_millis(100))) {
                self.seen.push(e);
                if f(&e) {
                    return e;
                }
                self.pending.push_back(e);
            }
        }
    }

    /// The next event of `kind` about the entry `cookie`.
    fn event(&mut self, kind: TagEventKind, cookie: u64) -> TagEvent {
        self.take(&format!("{kind:?} for entry {cookie}"), |e| {
            e.kind == kind && e.cookie == cookie
        })
    }

    /// Takes in whatever arrives for a short while.
    fn settle(&mut self) {
        let mut out = [TagEvent::EMPTY; 64];
        let until = Instant::now() + Duration::from_millis(100);
        while Instant::now() < until {
            let n = self.port.wait(&mut out, Duration::from_millis(10));
            self.seen.extend_from_slice(&out[..n]);
            self.pending.extend(&out[..n]);
        }
    }

    /// What happened to entry `cookie`, in order (after [`Events::settle`]).
    fn kinds(&self, cookie: u64) -> Vec<TagEventKind> {
        self.seen
            .iter()
            .filter(|e| e.cookie == cookie)
            .map(|e| e.kind)
            .collect()
    }

    /// Events that are not about list entries (command failures, searches) never came.
    fn no_failures(&self) {
        let bad: Vec<_> = self
            .seen
            .iter()
            .filter(|e| e.kind == TagEventKind::CommandFailed || e.error.is_some())
            .collect();
        assert!(bad.is_empty(), "failed commands: {bad:#?}");
    }
}

/// A running pair of tagged engines with memory registered on both sides.
struct Tagged {
    pair: LoopbackPair,
    /// A's memory (the source of its sends; where B's sends land).
    a: MemoryRegion,
    /// B's memory (receive buffers, overflow buffers; the source of B's sends).
    b: MemoryRegion,
    a_ev: Events,
    b_ev: Events,
    /// Last: the next test starts only after this one's engines stopped.
    _one_at_a_time: MutexGuard<'static, ()>,
}

impl Tagged {
    /// Starts the pair under `name` (each test its own) with `a_mem` and `b_mem` bytes of
    /// memory, all of it registered with every access (a rendezvous source must be remotely
    /// readable).
    fn start(name: &str, a_mem: usize, b_mem: usize, pcap: Option<&Path>) -> Tagged {
        let guard = common::serial();
        let cores = common::shared_eal();
        let mut qp = QpConfig::new(0, 0);
        qp.tagged = true;
        // A 4 MiB pull is 4096 READ responses; one software core takes a while to drain a
        // window of them (as `portico bench` and rdma_faults set it).
        qp.timeout_ns = 1_000_000;
        // Both engines on one worker on the last core; this thread on the first.
        let last = *cores.last().unwrap();
        common::host_on_first_core();
        let mut opts = LoopbackOpts::new(qp, [last, last]);
        opts.name = name.into();
        opts.tags = Some(TagConfig::default());
        opts.pcap = pcap.map(Path::to_path_buf);
        let mut pair = loopback::start(&opts).expect("two tagged engines start");
        let a_map = Arc::new(Mapping::anonymous(a_mem).expect("A's memory"));
        let b_map = Arc::new(Mapping::anonymous(b_mem).expect("B's memory"));
        let a = pair.a.engine.register_all(&a_map, Access::ALL).unwrap();
        let b = pair.b.engine.register_all(&b_map, Access::ALL).unwrap();
        let a_ev = Events::new(pair.a.tags.take().expect("A's tag port"));
        let b_ev = Events::new(pair.b.tags.take().expect("B's tag port"));
        Tagged {
            pair,
            a,
            b,
            a_ev,
            b_ev,
            _one_at_a_time: guard,
        }
    }

    /// Writes `len` bytes of test data at `offset` of A's memory and sends them from there.
    fn a_send(
        &mut self,
        wr_id: u64,
        offset: usize,
        len: usize,
        tag: u64,
        hdr_data: u64,
    ) -> Vec<u8> {
        let data = pattern(len, wr_id ^ tag.rotate_left(17) ^ len as u64);
        self.a.write(offset, &data).unwrap();
        let wr = WorkRequest::tagged_send(wr_id, self.a.sgl(offset, len as u32), EP, tag, hdr_data);
        self.pair.a.qp.post_send(&[wr]).unwrap();
        data
    }

    /// Appends `entry` to B's list `list` and waits for its link event.
    fn b_post(&mut self, list: ListKind, entry: TagEntry) {
        self.b_ev.port.append(EP, list, entry).unwrap();
        let e = self.b_ev.event(TagEventKind::Link, entry.cookie);
        assert_eq!(e.list, list);
    }

    /// A receive of `len` bytes at `offset` of B's memory.
    fn b_recv(&self, tag: u64, offset: usize, len: usize, cookie: u64) -> TagEntry {
        TagEntry::recv(tag, self.b.sge(offset, len as u32), cookie)
    }

    /// A catch-all overflow buffer of `len` bytes at `offset` of B's memory, filled from its
    /// start (MANAGE_LOCAL), unlinked when less than 16 KiB is left.
    fn b_overflow(&mut self, offset: usize, len: usize, cookie: u64) {
        let e = TagEntry::recv(0, self.b.sge(offset, len as u32), cookie)
            .with_ignore(u64::MAX)
            .with_options(Options::MANAGE_LOCAL)
            .with_min_free(16 * KIB as u64);
        self.b_post(ListKind::Overflow, e);
    }

    fn b_bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        self.b.to_vec(offset, len).unwrap()
    }

    fn a_bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        self.a.to_vec(offset, len).unwrap()
    }

    /// Stops the engines: no ICRC error, no malformed frame, nothing dropped at a port.
    fn stop(self) {
        let Tagged {
            pair,
            mut a_ev,
            mut b_ev,
            ..
        } = self;
        a_ev.settle();
        b_ev.settle();
        a_ev.no_failures();
        b_ev.no_failures();
        let reports = pair.runtime.join().expect("workers ran without failure");
        for r in &reports {
            assert_eq!(r.counter("icrc_errors"), Some(0), "{r:?}");
            assert_eq!(r.counter("malformed"), Some(0), "{r:?}");
            assert_eq!(r.io.drops, 0, "{r:?}");
            // No tagged message matched nothing, none was refused, no event was lost.
            for c in ["tag_dropped", "tag_wrong_engine", "tag_events_lost"] {
                assert_eq!(r.counter(c), Some(0), "{c}: {r:?}");
            }
        }
    }
}

/// The successful completion of tagged send `wr_id` of `len` bytes.
fn sent(cq: &mut Cq, wr_id: u64, len: usize) -> WorkCompletion {
    let wc = cq
        .wait_one(WAIT)
        .unwrap_or_else(|| panic!("send {wr_id} completes within {WAIT:?}"));
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status, wc.byte_len),
        (wr_id, WcOpcode::TaggedSend, WcStatus::Success, len as u32),
        "{wc:?}"
    );
    wc
}

/// Asserts `got == want` without printing megabytes: the first differing offset.
#[track_caller]
fn same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!(
            "{what}: first difference at byte {i} of {} (got {:#04x}, want {:#04x})",
            want.len(),
            got[i],
            want[i]
        );
    }
}

#[test]
fn wildcard_source_takes_what_a_specific_rank_does_not() {
    let mut t = Tagged::start("tg_src", MIB, MIB, None);
    // B (rank 1) posts a receive for tag 7 from rank 1 (itself: no sender matches it), then one
    // for tag 7 from any rank. A is rank 0: its message skips the first and lands in the second.
    let only_rank1 = t.b_recv(7, 0, 4 * KIB, 1).from_rank(1);
    t.b_post(ListKind::Priority, only_rank1);
    t.b_post(ListKind::Priority, t.b_recv(7, 64 * KIB, 4 * KIB, 2));
    let m1 = t.a_send(1, 0, 3000, 7, 0x11);
    let put = t.b_ev.event(TagEventKind::Put, 2);
    assert_eq!(
        (
            put.addr,
            put.rlength,
            put.mlength,
            put.initiator,
            put.hdr_data
        ),
        (t.b.addr() + 64 * KIB as u64, 3000, 3000, 0, 0x11)
    );
    assert!(!put.truncated && !put.rendezvous);
    sent(&mut t.pair.a.cq, 1, 3000);
    same(
        &t.b_bytes(64 * KIB, 3000),
        &m1,
        "message 1 in the any-rank receive",
    );

    // A receive from rank 0 now takes the next tag-7 message, though the rank-1 receive is
    // still first on the list.
    t.b_post(
        ListKind::Priority,
        t.b_recv(7, 128 * KIB, 4 * KIB, 3).from_rank(0),
    );
    let m2 = t.a_send(2, 8 * KIB, 2000, 7, 0x22);
    let put = t.b_ev.event(TagEventKind::Put, 3);
    assert_eq!((put.initiator, put.mlength), (0, 2000));
    sent(&mut t.pair.a.cq, 2, 2000);
    same(
        &t.b_bytes(128 * KIB, 2000),
        &m2,
        "message 2 in the rank-0 receive",
    );

    // The other way: B (rank 1) sends to A, which posted a rank-0 receive first.
    let a_entry =
        |tag, off: usize, cookie| TagEntry::recv(tag, t.a.sge(off, 4 * KIB as u32), cookie);
    let (from0, from1) = (
        a_entry(9, 256 * KIB, 11).from_rank(0),
        a_entry(9, 320 * KIB, 12).from_rank(1),
    );
    for e in [from0, from1] {
        t.a_ev.port.append(EP, ListKind::Priority, e).unwrap();
        t.a_ev.event(TagEventKind::Link, e.cookie);
    }
    let m3 = pattern(1500, 3);
    t.b.write(512 * KIB, &m3).unwrap();
    let wr = WorkRequest::tagged_send(3, t.b.sgl(512 * KIB, 1500), EP, 9, 0x33);
    t.pair.b.qp.post_send(&[wr]).unwrap();
    let put = t.a_ev.event(TagEventKind::Put, 12);
    assert_eq!((put.initiator, put.hdr_data, put.mlength), (1, 0x33, 1500));
    sent(&mut t.pair.b.cq, 3, 1500);
    same(
        &t.a_bytes(320 * KIB, 1500),
        &m3,
        "B's message in A's rank-1 receive",
    );

    t.b_ev.settle();
    t.a_ev.settle();
    use TagEventKind::*;
    assert_eq!(t.b_ev.kinds(1), [Link], "the rank-1 receive never matched");
    assert_eq!(t.b_ev.kinds(2), [Link, Put, AutoUnlink]);
    assert_eq!(t.b_ev.kinds(3), [Link, Put, AutoUnlink]);
    assert_eq!(t.a_ev.kinds(11), [Link], "A's rank-0 receive never matched");
    assert_eq!(t.a_ev.kinds(12), [Link, Put, AutoUnlink]);
    assert!(
        t.b_bytes(0, 4 * KIB).iter().all(|&x| x == 0),
        "rank-1 buffer untouched"
    );
    assert!(
        t.a_bytes(256 * KIB, 4 * KIB).iter().all(|&x| x == 0),
        "rank-0 buffer untouched"
    );
    assert_eq!(t.pair.a.cq.poll_one(), None);
    t.stop();
}

#[test]
fn ignore_bits_free_only_the_bits_they_name() {
    let mut t = Tagged::start("tg_ign", MIB, MIB, None);
    // 1: 0xab00 with the low byte ignored; 2: exactly 0xac42.
    t.b_post(
        ListKind::Priority,
        t.b_recv(0xab00, 0, 4 * KIB, 1).with_ignore(0xff),
    );
    t.b_post(ListKind::Priority, t.b_recv(0xac42, 64 * KIB, 4 * KIB, 2));
    // 0xac42 differs from 0xab00 outside the ignored byte: it skips 1 and takes 2.
    let m1 = t.a_send(1, 0, 1000, 0xac42, 0);
    let put = t.b_ev.event(TagEventKind::Put, 2);
    assert_eq!((put.match_bits, put.mlength), (0xac42, 1000));
    // 0xab42 matches 1; the event carries the sender's bits.
    let m2 = t.a_send(2, 8 * KIB, 1100, 0xab42, 0);
    let put = t.b_ev.event(TagEventKind::Put, 1);
    assert_eq!((put.match_bits, put.mlength), (0xab42, 1100));
    sent(&mut t.pair.a.cq, 1, 1000);
    sent(&mut t.pair.a.cq, 2, 1100);
    same(
        &t.b_bytes(64 * KIB, 1000),
        &m1,
        "0xac42 in the exact receive",
    );
    same(&t.b_bytes(0, 1100), &m2, "0xab42 in the masked receive");

    // 3 ignores only the low nibble, 4 the low byte: 0xab42 (bit 6 set) skips 3 for 4, and
    // 0xab05 then takes 3.
    t.b_post(
        ListKind::Priority,
        t.b_recv(0xab00, 128 * KIB, 4 * KIB, 3).with_ignore(0x0f),
    );
    t.b_post(
        ListKind::Priority,
        t.b_recv(0xab00, 192 * KIB, 4 * KIB, 4).with_ignore(0xff),
    );
    let m3 = t.a_send(3, 16 * KIB, 900, 0xab42, 0);
    let put = t.b_ev.event(TagEventKind::Put, 4);
    assert_eq!(put.match_bits, 0xab42);
    let m4 = t.a_send(4, 24 * KIB, 800, 0xab05, 0);
    let put = t.b_ev.event(TagEventKind::Put, 3);
    assert_eq!(put.match_bits, 0xab05);
    sent(&mut t.pair.a.cq, 3, 900);
    sent(&mut t.pair.a.cq, 4, 800);
    same(
        &t.b_bytes(192 * KIB, 900),
        &m3,
        "0xab42 in the byte-masked receive",
    );
    same(
        &t.b_bytes(128 * KIB, 800),
        &m4,
        "0xab05 in the nibble-masked receive",
    );

    t.b_ev.settle();
    use TagEventKind::*;
    for cookie in 1..=4 {
        assert_eq!(
            t.b_ev.kinds(cookie),
            [Link, Put, AutoUnlink],
            "entry {cookie}"
        );
    }
    t.stop();
}

#[test]
fn two_matching_messages_land_first_to_first() {
    let mut t = Tagged::start("tg_ord", MIB, 4 * MIB, None);
    // Two receives that both match 0x500..0x5ff. The first message has 9 packets, the second
    // one: the first posted receive still gets the first message.
    for (cookie, off) in [(1, 0), (2, 64 * KIB)] {
        t.b_post(
            ListKind::Priority,
            t.b_recv(0x500, off, 16 * KIB, cookie).with_ignore(0xff),
        );
    }
    let m1 = t.a_send(1, 0, 9000, 0x501, 1);
    let m2 = t.a_send(2, 16 * KIB, 100, 0x502, 2);
    let p1 = t.b_ev.event(TagEventKind::Put, 1);
    let p2 = t.b_ev.event(TagEventKind::Put, 2);
    assert_eq!((p1.match_bits, p1.mlength, p1.hdr_data), (0x501, 9000, 1));
    assert_eq!((p2.match_bits, p2.mlength, p2.hdr_data), (0x502, 100, 2));
    same(
        &t.b_bytes(0, 9000),
        &m1,
        "first message in the first receive",
    );
    same(
        &t.b_bytes(64 * KIB, 100),
        &m2,
        "second message in the second receive",
    );
    sent(&mut t.pair.a.cq, 1, 9000);
    sent(&mut t.pair.a.cq, 2, 100);

    // The same through the unexpected list: two messages wait, in arrival order; each append
    // of a matching receive claims the oldest.
    t.b_overflow(2 * MIB, MIB, 100);
    let m3 = t.a_send(3, 32 * KIB, 5000, 0x503, 3);
    let m4 = t.a_send(4, 48 * KIB, 200, 0x504, 4);
    let o3 = t.b_ev.event(TagEventKind::PutOverflow, 100);
    let o4 = t.b_ev.event(TagEventKind::PutOverflow, 100);
    assert_eq!(
        (o3.match_bits, o4.match_bits),
        (0x503, 0x504),
        "arrival order"
    );
    sent(&mut t.pair.a.cq, 3, 5000);
    sent(&mut t.pair.a.cq, 4, 200);
    for (cookie, off) in [(3, 128 * KIB), (4, 192 * KIB)] {
        let r = t.b_recv(0x500, off, 16 * KIB, cookie).with_ignore(0xff);
        t.b_ev.port.append(EP, ListKind::Priority, r).unwrap();
    }
    let c3 = t.b_ev.event(TagEventKind::UnexpectedConsumed, 3);
    let c4 = t.b_ev.event(TagEventKind::UnexpectedConsumed, 4);
    assert_eq!((c3.match_bits, c3.mlength, c3.hdr_data), (0x503, 5000, 3));
    assert_eq!((c4.match_bits, c4.mlength, c4.hdr_data), (0x504, 200, 4));
    same(
        &t.b_bytes(128 * KIB, 5000),
        &m3,
        "first unexpected message, first append",
    );
    same(
        &t.b_bytes(192 * KIB, 200),
        &m4,
        "second unexpected message, second append",
    );

    t.b_ev.settle();
    use TagEventKind::*;
    assert_eq!(t.b_ev.kinds(3), [UnexpectedConsumed, AutoUnlink]);
    assert_eq!(t.b_ev.kinds(4), [UnexpectedConsumed, AutoUnlink]);
    assert_eq!(t.b_ev.kinds(100), [Link, PutOverflow, PutOverflow]);
    t.stop();
}

#[test]
fn unexpected_eager_message_waits_for_its_append() {
    let mut t = Tagged::start("tg_unx", MIB, 4 * MIB, None);
    const OVF: usize = 2 * MIB;
    t.b_overflow(OVF, MIB, 100);
    // 10 000 bytes: 10 packets (32-byte tag header + data, MTU 1024), no receive posted.
    let m1 = t.a_send(1, 0, 10_000, 42, 77);
    let o = t.b_ev.event(TagEventKind::PutOverflow, 100);
    assert_eq!(
        (
            o.addr,
            o.match_bits,
            o.hdr_data,
            o.rlength,
            o.mlength,
            o.initiator
        ),
        (t.b.addr() + OVF as u64, 42, 77, 10_000, 10_000, 0)
    );
    assert!(!o.rendezvous && !o.truncated);
    same(
        &t.b_bytes(OVF, 10_000),
        &m1,
        "the unexpected message in the overflow buffer",
    );
    // An eager send is done once its message is at the target, claimed or not.
    sent(&mut t.pair.a.cq, 1, 10_000);

    // A second unexpected message lands after the first in the same buffer.
    let m2 = t.a_send(2, 16 * KIB, 3000, 43, 78);
    let o = t.b_ev.event(TagEventKind::PutOverflow, 100);
    assert_eq!(
        (o.addr, o.mlength),
        (t.b.addr() + OVF as u64 + 10_000, 3000)
    );
    sent(&mut t.pair.a.cq, 2, 3000);

    // The receives come later: each claims its message (by tag, so in any order), and the
    // data is copied into its buffer.
    t.b_ev
        .port
        .append(EP, ListKind::Priority, t.b_recv(43, 64 * KIB, 4 * KIB, 6))
        .unwrap();
    t.b_ev
        .port
        .append(EP, ListKind::Priority, t.b_recv(42, 0, 16 * KIB, 5))
        .unwrap();
    let c = t.b_ev.event(TagEventKind::UnexpectedConsumed, 5);
    assert_eq!(
        (c.addr, c.match_bits, c.hdr_data, c.rlength, c.mlength),
        (t.b.addr(), 42, 77, 10_000, 10_000)
    );
    assert!(!c.rendezvous && !c.truncated);
    let c = t.b_ev.event(TagEventKind::UnexpectedConsumed, 6);
    assert_eq!(
        (c.addr, c.match_bits, c.mlength),
        (t.b.addr() + 64 * KIB as u64, 43, 3000)
    );
    same(
        &t.b_bytes(0, 10_000),
        &m1,
        "message 1 in the receive that claimed it",
    );
    same(
        &t.b_bytes(64 * KIB, 3000),
        &m2,
        "message 2 in the receive that claimed it",
    );
    assert!(
        t.b_bytes(10_000, 6 * KIB).iter().all(|&x| x == 0),
        "nothing past message 1"
    );

    t.b_ev.settle();
    use TagEventKind::*;
    assert_eq!(t.b_ev.kinds(5), [UnexpectedConsumed, AutoUnlink]);
    assert_eq!(t.b_ev.kinds(6), [UnexpectedConsumed, AutoUnlink]);
    assert_eq!(t.pair.a.cq.poll_one(), None);
    t.stop();
}

#[test]
fn truncation_discards_the_excess_and_the_queue_pair_goes_on() {
    let mut t = Tagged::start("tg_trunc", MIB, 4 * MIB, None);
    // Every buffer sits in 64 KiB of guard bytes.
    let guard = vec![0xeeu8; 3 * MIB];
    t.b.write(0, &guard).unwrap();

    // Eager: 12 345 bytes into 5000.
    t.b_post(ListKind::Priority, t.b_recv(9, 0, 5000, 1));
    let m1 = t.a_send(1, 0, 12_345, 9, 0);
    let put = t.b_ev.event(TagEventKind::Put, 1);
    assert_eq!(
        (put.rlength, put.mlength, put.truncated),
        (12_345, 5000, true)
    );
    sent(&mut t.pair.a.cq, 1, 12_345);
    same(
        &t.b_bytes(0, 5000),
        &m1[..5000],
        "what fits of the eager message",
    );
    same(
        &t.b_bytes(5000, 64 * KIB - 5000),
        &guard[..64 * KIB - 5000],
        "past the eager buffer",
    );

    // Rendezvous: 100 000 bytes into 40 000 (the first chunk, then a pull of what fits).
    t.b_post(ListKind::Priority, t.b_recv(10, 128 * KIB, 40_000, 2));
    let m2 = t.a_send(2, 64 * KIB, 100_000, 10, 0);
    let put = t.b_ev.event(TagEventKind::Put, 2);
    assert_eq!(
        (put.rlength, put.mlength, put.truncated, put.rendezvous),
        (100_000, 40_000, true, true)
    );
    sent(&mut t.pair.a.cq, 2, 100_000);
    same(
        &t.b_bytes(128 * KIB, 40_000),
        &m2[..40_000],
        "what fits of the rendezvous",
    );
    same(
        &t.b_bytes(128 * KIB + 40_000, 64 * KIB),
        &guard[..64 * KIB],
        "past it",
    );

    // A rendezvous smaller than its first chunk's room is cut short too: 30 000 into 500.
    t.b_post(ListKind::Priority, t.b_recv(11, 256 * KIB, 500, 3));
    let m3 = t.a_send(3, 192 * KIB, 30_000, 11, 0);
    let put = t.b_ev.event(TagEventKind::Put, 3);
    assert_eq!(
        (put.rlength, put.mlength, put.truncated),
        (30_000, 500, true)
    );
    sent(&mut t.pair.a.cq, 3, 30_000);
    same(
        &t.b_bytes(256 * KIB, 500),
        &m3[..500],
        "what fits of the short rendezvous",
    );
    same(
        &t.b_bytes(256 * KIB + 500, 64 * KIB),
        &guard[..64 * KIB],
        "past it",
    );

    // Claimed from the unexpected list into a smaller buffer: 3000 into 1000.
    t.b_overflow(2 * MIB, MIB, 100);
    let m4 = t.a_send(4, 256 * KIB, 3000, 12, 0);
    t.b_ev.event(TagEventKind::PutOverflow, 100);
    sent(&mut t.pair.a.cq, 4, 3000);
    t.b_ev
        .port
        .append(EP, ListKind::Priority, t.b_recv(12, 384 * KIB, 1000, 4))
        .unwrap();
    let c = t.b_ev.event(TagEventKind::UnexpectedConsumed, 4);
    assert_eq!((c.rlength, c.mlength, c.truncated), (3000, 1000, true));
    same(
        &t.b_bytes(384 * KIB, 1000),
        &m4[..1000],
        "what fits of the claimed message",
    );
    same(
        &t.b_bytes(384 * KIB + 1000, 64 * KIB),
        &guard[..64 * KIB],
        "past it",
    );

    // The queue pair goes on: whole messages, eager and rendezvous, land whole.
    t.b_post(ListKind::Priority, t.b_recv(13, 512 * KIB, 64 * KIB, 5));
    t.b_post(ListKind::Priority, t.b_recv(14, 640 * KIB, 64 * KIB, 6));
    let m5 = t.a_send(5, 320 * KIB, 4000, 13, 0);
    let m6 = t.a_send(6, 384 * KIB, 50_000, 14, 0);
    let put = t.b_ev.event(TagEventKind::Put, 5);
    assert_eq!((put.mlength, put.truncated), (4000, false));
    let put = t.b_ev.event(TagEventKind::Put, 6);
    assert_eq!(
        (put.mlength, put.truncated, put.rendezvous),
        (50_000, false, true)
    );
    sent(&mut t.pair.a.cq, 5, 4000);
    sent(&mut t.pair.a.cq, 6, 50_000);
    same(&t.b_bytes(512 * KIB, 4000), &m5, "eager after truncation");
    same(
        &t.b_bytes(640 * KIB, 50_000),
        &m6,
        "rendezvous after truncation",
    );
    t.stop();
}

#[test]
fn rendezvous_into_posted_receives() {
    let mut t = Tagged::start("tg_rndv_p", 6 * MIB, 8 * MIB, None);
    const BIG: usize = 4 * MIB + 3;
    t.b_post(ListKind::Priority, t.b_recv(1, 0, MIB, 1));
    t.b_post(ListKind::Priority, t.b_recv(2, 2 * MIB, BIG, 2));
    let m1 = t.a_send(1, 0, MIB, 1, 10);
    let m2 = t.a_send(2, MIB + 5, BIG, 2, 20);
    for (wr_id, cookie, len, at) in [(1, 1, MIB, 0), (2, 2, BIG, 2 * MIB)] {
        let put = t.b_ev.event(TagEventKind::Put, cookie);
        assert_eq!(
            (
                put.addr,
                put.rlength,
                put.mlength,
                put.rendezvous,
                put.truncated
            ),
            (t.b.addr() + at as u64, len as u64, len as u64, true, false)
        );
        sent(&mut t.pair.a.cq, wr_id, len);
    }
    same(&t.b_bytes(0, MIB), &m1, "1 MiB rendezvous");
    same(&t.b_bytes(2 * MIB, BIG), &m2, "4 MiB + 3 rendezvous");
    assert!(
        t.b_bytes(2 * MIB + BIG, 64).iter().all(|&x| x == 0),
        "nothing past it"
    );
    t.b_ev.settle();
    use TagEventKind::*;
    assert_eq!(t.b_ev.kinds(1), [Link, Put, AutoUnlink]);
    assert_eq!(t.b_ev.kinds(2), [Link, Put, AutoUnlink]);
    t.stop();
}

#[test]
fn rendezvous_from_the_unexpected_list() {
    let mut t = Tagged::start("tg_rndv_u", 6 * MIB, 16 * MIB, None);
    const BIG: usize = 4 * MIB + 3;
    const OVF: usize = 8 * MIB;
    // A rendezvous takes its whole length of the overflow buffer (only its first chunk lands
    // there), so the buffer has room for both.
    t.b_overflow(OVF, 8 * MIB, 100);
    let m1 = t.a_send(1, 0, MIB, 1, 10);
    let m2 = t.a_send(2, MIB + 5, BIG, 2, 20);
    for (tag, len, m) in [(1, MIB, &m1), (2, BIG, &m2)] {
        let o = t.b_ev.event(TagEventKind::PutOverflow, 100);
        assert_eq!(
            (o.match_bits, o.rlength, o.rendezvous),
            (tag, len as u64, true)
        );
        assert!(
            o.mlength > 0 && o.mlength <= FIRST_CHUNK,
            "first chunk only: {o:?}"
        );
        let off = (o.addr - t.b.addr()) as usize;
        same(
            &t.b_bytes(off, o.mlength as usize),
            &m[..o.mlength as usize],
            "first chunk",
        );
    }
    assert_eq!(
        t.pair.a.cq.wait_one(Duration::from_millis(200)),
        None,
        "no rendezvous send completes before its message is taken"
    );
    // The second message is claimed first. Its send is done, but completions come in posting
    // order: nothing yet.
    t.b_ev
        .port
        .append(EP, ListKind::Priority, t.b_recv(2, 2 * MIB, BIG, 2))
        .unwrap();
    let c = t.b_ev.event(TagEventKind::UnexpectedConsumed, 2);
    assert_eq!(
        (c.addr, c.rlength, c.mlength, c.rendezvous, c.hdr_data),
        (
            t.b.addr() + 2 * MIB as u64,
            BIG as u64,
            BIG as u64,
            true,
            20
        )
    );
    same(
        &t.b_bytes(2 * MIB, BIG),
        &m2,
        "4 MiB + 3 claimed from the unexpected list",
    );
    assert_eq!(
        t.pair.a.cq.wait_one(Duration::from_millis(200)),
        None,
        "send 2 completes after send 1"
    );
    t.b_ev
        .port
        .append(EP, ListKind::Priority, t.b_recv(1, 0, MIB, 1))
        .unwrap();
    let c = t.b_ev.event(TagEventKind::UnexpectedConsumed, 1);
    assert_eq!(
        (c.addr, c.mlength, c.rendezvous, c.hdr_data),
        (t.b.addr(), MIB as u64, true, 10)
    );
    same(
        &t.b_bytes(0, MIB),
        &m1,
        "1 MiB claimed from the unexpected list",
    );
    sent(&mut t.pair.a.cq, 1, MIB);
    sent(&mut t.pair.a.cq, 2, BIG);
    t.b_ev.settle();
    use TagEventKind::*;
    // The claim's unlink is reported as the append runs, its consumed event when the pull
    // has brought the rest (see the report about this order).
    for cookie in [1, 2] {
        let mut k = t.b_ev.kinds(cookie);
        k.sort_by_key(|k| format!("{k:?}"));
        assert_eq!(k, [AutoUnlink, UnexpectedConsumed], "entry {cookie}");
    }
    t.stop();
}

#[test]
fn rendezvous_send_completes_only_after_the_target_took_it() {
    let mut t = Tagged::start("tg_rndv_done", MIB, 4 * MIB, None);
    // Unexpected: the message waits, and so does its send.
    t.b_overflow(2 * MIB, MIB, 100);
    let m1 = t.a_send(1, 0, 200_000, 5, 0);
    let o = t.b_ev.event(TagEventKind::PutOverflow, 100);
    assert!(o.rendezvous);
    assert_eq!(
        t.pair.a.cq.wait_one(Duration::from_millis(300)),
        None,
        "the send is not done while its message waits on the unexpected list"
    );
    t.b_ev
        .port
        .append(EP, ListKind::Priority, t.b_recv(5, 0, 256 * KIB, 1))
        .unwrap();
    sent(&mut t.pair.a.cq, 1, 200_000);
    // The target wrote its event before it told the sender: it is there now.
    let mut out = [TagEvent::EMPTY; 16];
    let n = t.b_ev.port.poll(&mut out);
    t.b_ev.seen.extend_from_slice(&out[..n]);
    t.b_ev.pending.extend(&out[..n]);
    assert!(
        t.b_ev
            .pending
            .iter()
            .any(|e| e.kind == TagEventKind::UnexpectedConsumed && e.cookie == 1),
        "the sender completed before the target's event: {:?}",
        t.b_ev.seen
    );
    same(&t.b_bytes(0, 200_000), &m1, "the claimed rendezvous");

    // Posted: the same order.
    t.b_post(ListKind::Priority, t.b_recv(6, 256 * KIB, 256 * KIB, 2));
    let m2 = t.a_send(2, 256 * KIB, 250_000, 6, 0);
    sent(&mut t.pair.a.cq, 2, 250_000);
    let n = t.b_ev.port.poll(&mut out);
    t.b_ev.seen.extend_from_slice(&out[..n]);
    t.b_ev.pending.extend(&out[..n]);
    assert!(
        t.b_ev
            .pending
            .iter()
            .any(|e| e.kind == TagEventKind::Put && e.cookie == 2),
        "the sender completed before the target's put: {:?}",
        t.b_ev.seen
    );
    same(&t.b_bytes(256 * KIB, 250_000), &m2, "the posted rendezvous");
    t.stop();
}

/// Found here (minor, fixed): the put-overflow event of an unexpected rendezvous message said
/// `truncated` (and `TagCounters::truncated` counted it), though nothing was discarded: the
/// overflow buffer holds the first chunk, the rest waits at the sender and the claim pulls it.
#[test]
fn an_unexpected_rendezvous_is_not_reported_truncated() {
    let mut t = Tagged::start("tg_rndv_trunc", MIB, 2 * MIB, None);
    t.b_overflow(MIB, MIB, 100);
    let m = t.a_send(1, 0, 100_000, 3, 0);
    let o = t.b_ev.event(TagEventKind::PutOverflow, 100);
    assert_eq!((o.rlength, o.rendezvous), (100_000, true));
    assert!(o.mlength <= FIRST_CHUNK, "{o:?}");
    t.b_ev
        .port
        .append(EP, ListKind::Priority, t.b_recv(3, 0, 128 * KIB, 1))
        .unwrap();
    let c = t.b_ev.event(TagEventKind::UnexpectedConsumed, 1);
    assert_eq!((c.mlength, c.truncated), (100_000, false));
    sent(&mut t.pair.a.cq, 1, 100_000);
    same(
        &t.b_bytes(0, 100_000),
        &m,
        "the whole message, after the claim",
    );
    t.stop();
    assert!(
        !o.truncated,
        "the put-overflow event of a rendezvous says truncated, but the whole message arrived \
         when claimed: {o:?}"
    );
}

/// tshark's path, or a failure that says how to install it.
fn tshark() -> &'static str {
    const PATH: &str = "tshark";
    match Command::new(PATH).arg("--version").output() {
        Ok(o) if o.status.success() => PATH,
        _ => panic!("tshark is not installed: run scripts/install-deps.sh (it installs tshark)"),
    }
}

#[test]
fn capture_of_tagged_traffic_decodes_as_standard_rocev2() {
    let tshark = tshark();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let pcap = dir.join("tagged_ring.pcapng");
    let mut t = Tagged::start("tg_pcap", MIB, MIB, Some(&pcap));
    // Eager of one packet and of several (FIRST, MIDDLE, LAST), one of 16 KiB (the largest
    // eager), a rendezvous pulled by a READ of several responses, and one whose pull fits a
    // single response (READ RESPONSE ONLY). The done messages go back as SEND ONLY.
    let sizes = [(1, 100), (2, 5000), (3, 16 * KIB), (4, 40_000), (5, 20_000)];
    for (cookie, len) in sizes {
        let room = if cookie == 5 { 1500 } else { len };
        t.b_post(
            ListKind::Priority,
            t.b_recv(cookie, cookie as usize * 64 * KIB, room, cookie),
        );
    }
    let mut msgs = Vec::new();
    for (i, len) in sizes {
        msgs.push(t.a_send(i, i as usize * 64 * KIB, len, i, i));
    }
    for (i, len) in sizes {
        t.b_ev.event(TagEventKind::Put, i);
        sent(&mut t.pair.a.cq, i, len);
        let room = if i == 5 { 1500 } else { len };
        same(
            &t.b_bytes(i as usize * 64 * KIB, room),
            &msgs[i as usize - 1][..room],
            "data",
        );
    }
    let capture = t.pair.capture.clone().expect("capture on");
    t.stop();
    let packets = capture.finish().expect("capture written");
    assert!(packets > 0);

    let out = Command::new(tshark)
        .args(["-r"])
        .arg(&pcap)
        .args([
            "-T",
            "fields",
            "-E",
            "separator=|",
            "-e",
            "frame.number",
            "-e",
            "udp.dstport",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "_ws.malformed",
            "-e",
            "_ws.expert.severity",
            "-e",
            "_ws.expert.message",
        ])
        .output()
        .expect("tshark runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut opcodes = std::collections::BTreeMap::<u32, u32>::new();
    let mut roce = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split('|').collect();
        assert_eq!(f.len(), 6, "{line}");
        assert!(
            f[3].is_empty(),
            "tshark finds frame {} malformed: {line}",
            f[0]
        );
        // Expert infos of warning level (0x00600000) or above.
        for sev in f[4].split(',').filter(|s| !s.is_empty()) {
            let sev: u32 = sev.parse().unwrap_or(u32::MAX);
            assert!(
                sev < 0x0060_0000,
                "tshark warns about frame {}: {line}",
                f[0]
            );
        }
        if f[1] != "4791" {
            continue;
        }
        roce += 1;
        let op: u32 = f[2]
            .parse()
            .unwrap_or_else(|_| panic!("frame {} to port 4791 without a BTH opcode: {line}", f[0]));
        assert!(
            matches!(op, 0 | 1 | 2 | 4 | 12..=17),
            "frame {}: opcode {op} is not SEND/READ/ACK: {line}",
            f[0]
        );
        *opcodes.entry(op).or_default() += 1;
    }
    eprintln!("{roce} RoCEv2 frames of {packets} captured, by BTH opcode: {opcodes:?}");
    assert!(roce > 0 && roce as u64 <= packets);
    for (op, name) in [
        (0, "SEND FIRST"),
        (1, "SEND MIDDLE"),
        (2, "SEND LAST"),
        (4, "SEND ONLY"),
        (12, "RDMA READ request"),
        (13, "READ response FIRST"),
        (14, "READ response MIDDLE"),
        (15, "READ response LAST"),
        (16, "READ response ONLY"),
        (17, "ACK"),
    ] {
        assert!(
            opcodes.contains_key(&op),
            "no {name} ({op}) in the capture: {opcodes:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// A failure of the engine, reproduced without EAL (two `RdmaNode`s, frames moved by hand, time
// simulated); it failed before the fix described in the test's documentation.

/// Moves every frame `src` has for `dst`, unless `cut`; returns the BTH opcodes it sent.
fn carry(src: &mut RdmaNode, dst: &mut RdmaNode, now: u64, cut: bool) -> Vec<u8> {
    let mut frame = vec![0u8; 9000];
    let mut opcodes = Vec::new();
    src.service(now);
    while let Some(tx) = src.poll_transmit(now) {
        let len = src.emit(&tx, &mut frame).unwrap();
        // Ethernet (14) + IPv4 (20) + UDP (8): the BTH's first byte is the opcode.
        opcodes.push(frame[42]);
        if !cut {
            dst.receive(now, &frame[..len]);
        }
    }
    src.flush_completions();
    dst.flush_completions();
    src.publish_tag_events();
    dst.publish_tag_events();
    opcodes
}

/// Found by `rendezvous_from_the_unexpected_list` on a loaded 2-core machine, now fixed: when
/// the target's queue pair failed on one of the engine's own work requests (a pull, or the
/// done message of a rendezvous), nobody was told, and a rendezvous send could then wait
/// forever.
///
/// A sends two rendezvous messages; both wait on B's unexpected list (their sends wait for
/// B's done messages). B claims the second: B pulls it and sends its done message, which A
/// takes, but A's ACKs to B are lost (here the A→B direction is cut for a second; in the
/// loopback run it was flooded by duplicate READ responses after spurious timeouts during a
/// 4 MiB pull, see the report). B retries the done message until its retry limit and enters the
/// error state; the done is an internal request, so B's application gets no completion and no
/// event. The link comes back and B's application claims the first message: it gets the
/// claim's AUTO_UNLINK, and nothing more, ever; the pull is dropped because the queue pair is
/// in error (`QueuePair::tag_next` does nothing then). A's first send waits for a done message
/// that will never come, with nothing in flight, so no timer ever fails it.
///
/// What must hold: the send completes (with an error status, if need be) and B's application
/// hears that the message it claimed will not arrive. The fix: a held rendezvous send is
/// probed by the requester's durable timer (its envelope again, which a live target only
/// ACKs), so a silent target fails it with RetryExceeded; and a claim whose pull cannot run
/// (or fails) is reported with `NiFail::Undeliverable`.
#[test]
fn a_failed_done_message_fails_the_waiting_rendezvous_and_tells_the_target() {
    // No EAL, but not beside a pair of engines either (it would take their worker's core).
    let _one_at_a_time = common::serial();
    use portico::transport::{QpState, Sge};
    const A_QPN: u32 = 0x11;
    const B_QPN: u32 = 0x22;
    let (mac_a, mac_b) = (
        EthernetAddress([2, 0, 0, 0, 0, 1]),
        EthernetAddress([2, 0, 0, 0, 0, 2]),
    );
    let (ip_a, ip_b) = (Ipv4Addr::new(10, 9, 0, 1), Ipv4Addr::new(10, 9, 0, 2));
    let mut a = RdmaNode::new(mac_a, ip_a);
    let mut b = RdmaNode::new(mac_b, ip_b);
    let mut cfg = QpConfig::new(A_QPN, B_QPN);
    cfg.remote_mac = mac_b;
    cfg.remote_ip = ip_b;
    cfg.tagged = true;
    cfg.timeout_ns = 1_000_000;
    let mut peer = cfg.mirrored();
    peer.remote_mac = mac_a;
    peer.remote_ip = ip_a;
    peer.tag_rank = 1;
    let mut cq_a = a.create_cq(64);
    let mut cq_b = b.create_cq(64);
    let mut qp_a = a.add_qp(cfg, &cq_a, &cq_a).unwrap();
    let _qp_b = b.add_qp(peer, &cq_b, &cq_b).unwrap();
    let _port_a = a.enable_tags(&TagConfig::default()).unwrap();
    let mut port_b = b.enable_tags(&TagConfig::default()).unwrap();
    let ka = a
        .register(
            Arc::new(Mapping::anonymous(MIB).unwrap()),
            0,
            MIB,
            Access::ALL,
        )
        .unwrap();
    let kb = b
        .register(
            Arc::new(Mapping::anonymous(MIB).unwrap()),
            0,
            MIB,
            Access::ALL,
        )
        .unwrap();
    let b_buf = |off: usize, len: usize| Sge::new(kb.lkey, kb.addr + off as u64, len as u32);

    // Simulated time, 100 µs per round; `cut` drops what A sends to B.
    let mut now = 0u64;
    let mut run =
        |a: &mut RdmaNode, b: &mut RdmaNode, ms: u64, cut: &mut bool, cut_on_done: bool| {
            for _ in 0..ms * 10 {
                now += 100_000;
                carry(a, b, now, *cut);
                // B's first SEND (its done message) cuts the A→B direction.
                if carry(b, a, now, false).contains(&4) && cut_on_done {
                    *cut = true;
                }
            }
        };
    let mut cut = false;
    let ovf = TagEntry::recv(0, b_buf(512 * KIB, 512 * KIB), 100)
        .with_ignore(u64::MAX)
        .with_options(Options::MANAGE_LOCAL);
    port_b.append(EP, ListKind::Overflow, ovf).unwrap();
    run(&mut a, &mut b, 1, &mut cut, false);
    let len = 100_000u32;
    qp_a.post_send(&[
        WorkRequest::tagged_send(1, SgList::one(ka.lkey, ka.addr, len), EP, 1, 0),
        WorkRequest::tagged_send(2, SgList::one(ka.lkey, ka.addr + 128 * 1024, len), EP, 2, 0),
    ])
    .unwrap();
    run(&mut a, &mut b, 10, &mut cut, false);
    assert_eq!(
        cq_a.poll_one(),
        None,
        "both sends wait for their done messages"
    );

    // B claims the second message; its done message reaches A, A's ACKs do not reach B.
    port_b
        .append(
            EP,
            ListKind::Priority,
            TagEntry::recv(2, b_buf(0, 128 * KIB), 2),
        )
        .unwrap();
    run(&mut a, &mut b, 1000, &mut cut, true);
    assert!(cut, "B sent its done message");
    assert_eq!(
        b.qp(B_QPN).unwrap().state(),
        QpState::Error,
        "B gave up on its unacknowledged done message"
    );
    assert_eq!(
        cq_b.poll_one(),
        None,
        "(B's application got no completion for that)"
    );

    // The link is back; B's application claims the first message and waits.
    cut = false;
    port_b
        .append(
            EP,
            ListKind::Priority,
            TagEntry::recv(1, b_buf(128 * KIB, 128 * KIB), 1),
        )
        .unwrap();
    run(&mut a, &mut b, 10_000, &mut cut, false);
    let mut events = [TagEvent::EMPTY; 64];
    let n = port_b.poll(&mut events);
    let about_claim: Vec<TagEventKind> = events[..n]
        .iter()
        .filter(|e| e.cookie == 1)
        .map(|e| e.kind)
        .collect();
    let a_wcs: Vec<_> = std::iter::from_fn(|| cq_a.poll_one())
        .map(|w| (w.wr_id, w.status))
        .collect();
    let b_wcs: Vec<_> = std::iter::from_fn(|| cq_b.poll_one())
        .map(|w| (w.wr_id, w.status))
        .collect();
    // What the fix does: A's probes of its held send go unanswered (B is in the error state),
    // so it fails with RetryExceeded; B's claim reports the message undeliverable, with the
    // first chunk it copied.
    let claim = events[..n]
        .iter()
        .find(|e| e.cookie == 1 && e.kind == TagEventKind::UnexpectedConsumed);
    assert!(
        claim.is_some_and(|e| e.fail == portico::lpe::NiFail::Undeliverable && !e.truncated),
        "{:?}",
        &events[..n]
    );
    assert!(
        a_wcs.contains(&(1, portico::transport::WcStatus::RetryExceeded)),
        "{a_wcs:?}"
    );
    let hung = !a_wcs.iter().any(|&(id, _)| id == 1);
    let silent = about_claim.iter().all(|&k| k == TagEventKind::AutoUnlink) && b_wcs.is_empty();
    assert!(
        !hung && !silent,
        "10 s after B claimed the first message: A's send 1 {} (A's completions {a_wcs:?}, A \
         state {:?}, nothing in flight: {}); B's application {} (events for the claim \
         {about_claim:?}, B's completions {b_wcs:?})",
        if hung { "never completed" } else { "completed" },
        a.qp(A_QPN).unwrap().state(),
        a.qp(A_QPN).unwrap().requester().in_flight() == 0,
        if silent {
            "was told nothing"
        } else {
            "heard of it"
        },
    );
}

/// Seed 001's sharded processing engines on the wire: each engine runs as two workers, and
/// each worker's list-processing shard holds the endpoints homed on it (endpoint 0 on worker
/// 0, endpoint 1 on worker 1). A sender reaches an endpoint over a connection homed on that
/// endpoint's worker, as RDMA steers by queue pair: messages to both endpoints land in the
/// receives posted on their own worker's tag port, each counted by that worker alone. A
/// message for endpoint 1 sent over worker 0's connection is refused there
/// (`tag_wrong_engine`, the sender's completion `RemoteInvalidRequest`) and touches no buffer.
#[test]
fn tagged_messages_reach_endpoints_homed_on_two_workers_over_their_own_connections() {
    let _one_at_a_time = common::serial();
    let cores = common::shared_eal();
    common::host_on_first_core();
    let workers = [cores[0], *cores.last().unwrap()];
    let mut qp = QpConfig::new(0, 0);
    qp.tagged = true;
    let mut opts = LoopbackOpts::multicore(qp, &workers, 2);
    opts.name = "tg_two".into();
    let ep_config = TagConfig::default().endpoints[0].1;
    opts.tags = Some(TagConfig {
        endpoints: vec![
            (portico::lpe::EndpointIndex(0), ep_config),
            (portico::lpe::EndpointIndex(1), ep_config),
        ],
        ..TagConfig::default()
    });
    let mut pair = loopback::start(&opts).expect("two tagged engines on two workers");
    assert_eq!(pair.homes, [[0, 0], [1, 1]]);
    let a_map = Arc::new(Mapping::anonymous(MIB).unwrap());
    let b_map = Arc::new(Mapping::anonymous(MIB).unwrap());
    let a = pair.a.engine.register_all(&a_map, Access::ALL).unwrap();
    let b = pair.b.engine.register_all(&b_map, Access::ALL).unwrap();
    let mut b0 = Events::new(pair.b.tags.take().expect("worker 0's tag port"));
    let mut b1 = Events::new(pair.b.more_tags.remove(0));
    // A receive on each endpoint, each on its own worker's port; endpoint 1 is not on worker
    // 0's shard.
    for (ev, ep, off, cookie) in [(&mut b0, 0u16, 0, 10u64), (&mut b1, 1, 64 * KIB, 11)] {
        let r = TagEntry::recv(0x77, b.sge(off, 16 * KIB as u32), cookie);
        ev.port.append(ep, ListKind::Priority, r).unwrap();
        ev.event(TagEventKind::Link, cookie);
    }
    b0.port
        .append(
            1,
            ListKind::Priority,
            TagEntry::recv(0x77, b.sge(0, 64), 99),
        )
        .unwrap();
    let refused = b0.take("endpoint 1 refused on worker 0", |e| {
        e.kind == TagEventKind::CommandFailed
    });
    assert_eq!(refused.cookie, 99);
    let more = &mut pair.more[0];
    let mut sends = Vec::new();
    for (qp, ep, off, len) in [
        (&mut pair.a.qp, 0u16, 0usize, 5000usize),
        (&mut more.a.qp, 1, 16 * KIB, 3000),
    ] {
        let data = pattern(len, u64::from(ep) + 5);
        a.write(off, &data).unwrap();
        let wr = WorkRequest::tagged_send(u64::from(ep), a.sgl(off, len as u32), ep, 0x77, 0);
        qp.post_send(&[wr]).unwrap();
        sends.push(data);
    }
    let p0 = b0.event(TagEventKind::Put, 10);
    let p1 = b1.event(TagEventKind::Put, 11);
    assert_eq!((p0.endpoint, p0.mlength), (0, 5000));
    assert_eq!((p1.endpoint, p1.mlength), (1, 3000));
    same(
        &b.to_vec(0, 5000).unwrap(),
        &sends[0],
        "endpoint 0's message",
    );
    same(
        &b.to_vec(64 * KIB, 3000).unwrap(),
        &sends[1],
        "endpoint 1's message",
    );
    sent(&mut pair.a.cq, 0, 5000);
    sent(&mut more.a.cq, 1, 3000);
    // Endpoint 1 over worker 0's connection: refused there, nothing placed.
    let r = TagEntry::recv(0x78, b.sge(128 * KIB, 64), 12);
    b1.port.append(1, ListKind::Priority, r).unwrap();
    b1.event(TagEventKind::Link, 12);
    let wr = WorkRequest::tagged_send(7, a.sgl(0, 64), 1, 0x78, 0);
    pair.a.qp.post_send(&[wr]).unwrap();
    let wc = pair
        .a
        .cq
        .wait_one(WAIT)
        .expect("the misrouted send completes");
    assert_eq!(
        (wc.wr_id, wc.status),
        (7, WcStatus::RemoteInvalidRequest),
        "{wc:?}"
    );
    assert_eq!(b.to_vec(128 * KIB, 64).unwrap(), vec![0u8; 64]);
    b1.settle();
    assert_eq!(b1.kinds(12), [TagEventKind::Link], "the entry kept waiting");
    let reports = pair.runtime.join().expect("workers ran");
    let c = |w: usize, n: &str| reports[w].counter(n).unwrap();
    assert_eq!((c(0, "tag_wrong_engine"), c(1, "tag_wrong_engine")), (1, 0));
    assert_eq!(
        c(0, "tag_matched_priority"),
        1,
        "worker 0 matched endpoint 0's"
    );
    assert_eq!(
        c(1, "tag_matched_priority"),
        1,
        "worker 1 matched endpoint 1's"
    );
    assert_eq!(c(0, "wrong_core") + c(1, "wrong_core"), 0);
}
