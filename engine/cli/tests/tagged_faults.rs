//! Tagged messaging under fault injection: two engines over `net_ring` with 1 % each of drop,
//! duplicate, reorder and corrupt on both receive paths (as `rdma_faults`). A sends a bounded
//! number of tagged messages to B, in rounds: eager (1 B to 16 KiB) and rendezvous (up to
//! 256 KiB); some into receives B posted beforehand (by exact tag, some from rank 0 only, or by
//! wildcard), the others unexpected (they land in B's overflow buffers and are claimed by
//! appends made when B's application sees them, by exact tag or by wildcard).
//!
//! Checked: every send completes exactly once, successfully, with its length; every message
//! lands exactly once, in the buffer the model says, byte for byte (each buffer is compared
//! when its event arrives, then overwritten by the application, and the whole receive region is
//! compared with the model at the end, so a late duplicate write would show); every event is
//! the one the model expects, and their counts are exact; every corrupted frame is exactly one
//! ICRC error.
//!
//! `PORTICO_FAULT_OPS` sets the number of messages (default 12 000: about 25 s in a debug build
//! on 2 cores, some 4 000 of each fault).
//!
//! Both engines run on one worker on the last core and this thread on the first: on a 2-core
//! machine a worker that shares its core with the application stalls for whole scheduler
//! slices, and a stall during a long pull can make the target's queue pair give up on its own
//! done message (see tagged_ring's
//! a_failed_done_message_fails_the_waiting_rendezvous_and_tells_the_target).

mod common;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pattern;
use pmem::Mapping;
use portico::lpe::{ListKind, Options};
use portico::rdma::loopback::{self, LoopbackOpts};
use portico::rdma::{MemoryRegion, TagConfig, TagEntry, TagEvent, TagEventKind, TagPort};
use portico::runtime::FaultConfig;
use portico::transport::{Access, Mtu, QpConfig, WcOpcode, WcStatus, WorkCompletion, WorkRequest};

fn messages() -> u64 {
    std::env::var("PORTICO_FAULT_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12_000)
}

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
const EP: u16 = 0;
/// Largest eager message (the queue pairs' rendezvous threshold).
const EAGER_MAX: usize = 16 * KIB;
const RNDV_MAX: usize = 256 * KIB;
/// Messages per round.
const ROUND: u64 = 16;
/// B's receive buffers: one per message, reused every `SLOTS` messages (4 rounds later).
const SLOT: usize = RNDV_MAX;
const SLOTS: usize = 64;
/// B's overflow buffers: `OVF_LINKED` on the list at any time, the others free or still
/// holding unexpected messages.
const OVF_LEN: usize = 2 * MIB;
const OVF_BUFS: usize = 8;
const OVF_LINKED: usize = 3;
/// What A sends from.
const SRC_LEN: usize = 4 * MIB;
/// What the application writes over a buffer it has checked.
const POISON: u8 = 0xa5;
const WAIT: Duration = Duration::from_secs(30);

/// Tag classes (bits 32..40 of the tag; the message number below): posted with an exact
/// receive, posted with a wildcard receive, unexpected.
const POSTED: u64 = 1 << 32;
const WILD: u64 = 2 << 32;
const UNEXPECTED: u64 = 3 << 32;
const LOW: u64 = 0xffff_ffff;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Class {
    Posted,
    Wild,
    Unexpected,
}

#[derive(Debug, Clone, Copy)]
struct Msg {
    id: u64,
    class: Class,
    len: usize,
    /// Where in A's source it is sent from.
    from: usize,
    slot: usize,
    delivered: bool,
    sent: bool,
}

impl Msg {
    fn tag(&self) -> u64 {
        let class = match self.class {
            Class::Posted => POSTED,
            Class::Wild => WILD,
            Class::Unexpected => UNEXPECTED,
        };
        class | self.id
    }

    fn rendezvous(&self) -> bool {
        self.len > EAGER_MAX
    }
}

/// Events of each kind the model expects, and those that came.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    link: u64,
    put: u64,
    put_overflow: u64,
    consumed: u64,
    auto_unlink: u64,
    auto_free: u64,
}

/// B's application: its lists, its buffers, and the model of what must happen.
struct Target {
    port: TagPort,
    recv: MemoryRegion,
    ovf: MemoryRegion,
    src: Vec<u8>,
    msgs: Vec<Msg>,
    /// Receive or claim cookie → message.
    entries: HashMap<u64, u64>,
    /// Links not yet seen.
    linking: HashSet<u64>,
    /// Overflow cookie → buffer; buffers free to link.
    ovf_linked: HashMap<u64, usize>,
    ovf_unlinked: HashMap<u64, usize>,
    ovf_free: VecDeque<usize>,
    next_cookie: u64,
    /// What each receive slot holds outside a message: 0, then POISON.
    slot_fill: Vec<u8>,
    expected: Counts,
    seen: Counts,
    claims_by_wildcard: u64,
}

impl Target {
    fn cookie(&mut self) -> u64 {
        self.next_cookie += 1;
        self.next_cookie
    }

    fn link_overflow(&mut self) {
        let Some(buf) = self.ovf_free.pop_front() else {
            panic!("no overflow buffer free: {:?}", self.ovf_unlinked);
        };
        let cookie = self.cookie();
        let e = TagEntry::recv(0, self.ovf.sge(buf * OVF_LEN, OVF_LEN as u32), cookie)
            .with_ignore(u64::MAX)
            .with_options(Options::MANAGE_LOCAL)
            .with_min_free(EAGER_MAX as u64);
        self.port.append(EP, ListKind::Overflow, e).unwrap();
        self.ovf_linked.insert(cookie, buf);
        self.linking.insert(cookie);
        self.expected.link += 1;
    }

    fn post(&mut self, entry: TagEntry, msg: u64) {
        self.port.append(EP, ListKind::Priority, entry).unwrap();
        self.entries.insert(entry.cookie, msg);
        self.linking.insert(entry.cookie);
        self.expected.link += 1;
    }

    /// The message `id` landed whole in its slot: compare, check nothing past it moved, and
    /// overwrite the slot (a duplicate landing later would show at the end).
    fn check_slot(&mut self, id: u64, what: &str) {
        let m = self.msgs[id as usize];
        assert!(!m.delivered, "message {id} delivered twice ({what})");
        let at = m.slot * SLOT;
        let got = self.recv.to_vec(at, SLOT).unwrap();
        if got[..m.len] != self.src[m.from..m.from + m.len] {
            let i = (0..m.len)
                .find(|&i| got[i] != self.src[m.from + i])
                .unwrap();
            panic!("message {id} ({what}, {m:?}) differs at byte {i}");
        }
        let fill = self.slot_fill[m.slot];
        assert!(
            got[m.len..].iter().all(|&b| b == fill),
            "bytes past message {id} in slot {} changed ({what})",
            m.slot
        );
        self.recv.write(at, &vec![POISON; SLOT]).unwrap();
        self.slot_fill[m.slot] = POISON;
        self.msgs[id as usize].delivered = true;
    }

    fn handle(&mut self, e: TagEvent) {
        let rndv = |m: &Msg| m.rendezvous();
        match e.kind {
            TagEventKind::Link => {
                self.seen.link += 1;
                assert!(self.linking.remove(&e.cookie), "unexpected link: {e:?}");
            }
            TagEventKind::Put => {
                self.seen.put += 1;
                let id = self.entries[&e.cookie];
                let m = self.msgs[id as usize];
                assert!(m.class != Class::Unexpected, "{e:?} {m:?}");
                assert_eq!(
                    (
                        e.list,
                        e.match_bits,
                        e.hdr_data,
                        e.rlength,
                        e.mlength,
                        e.truncated,
                        e.rendezvous,
                        e.initiator,
                        e.addr
                    ),
                    (
                        ListKind::Priority,
                        m.tag(),
                        id,
                        m.len as u64,
                        m.len as u64,
                        false,
                        rndv(&m),
                        0,
                        self.recv.addr() + (m.slot * SLOT) as u64
                    ),
                    "{e:?} for {m:?}"
                );
                self.check_slot(id, "posted");
            }
            TagEventKind::PutOverflow => {
                self.seen.put_overflow += 1;
                assert!(self.ovf_linked.contains_key(&e.cookie), "{e:?}");
                let id = e.match_bits & LOW;
                let m = self.msgs[id as usize];
                assert_eq!(m.class, Class::Unexpected, "{e:?} {m:?}");
                assert_eq!(
                    (e.match_bits, e.hdr_data, e.rlength, e.rendezvous),
                    (m.tag(), id, m.len as u64, rndv(&m)),
                    "{e:?} for {m:?}"
                );
                // Nothing is discarded: a rendezvous holds its first chunk, the rest waits
                // at the sender for the claim.
                assert!(!e.truncated, "{e:?} for {m:?}");
                // Eager: all of it is in the overflow buffer now; rendezvous: its first chunk.
                let held = if rndv(&m) { e.mlength } else { m.len as u64 };
                assert!(e.mlength == held && held > 0, "{e:?} for {m:?}");
                let off = (e.addr - self.ovf.addr()) as usize;
                let got = self.ovf.to_vec(off, held as usize).unwrap();
                assert!(
                    got[..] == self.src[m.from..m.from + held as usize],
                    "message {id} in the overflow buffer differs"
                );
                // Claim it: by exact tag, or (every other one) by wildcard, which takes the
                // oldest unexpected message, and that is this one (each earlier one has its
                // claim ahead of this in the command ring).
                let cookie = self.cookie();
                let buf = self.recv.sge(m.slot * SLOT, SLOT as u32);
                let claim = if id.is_multiple_of(2) {
                    TagEntry::recv(m.tag(), buf, cookie)
                } else {
                    self.claims_by_wildcard += 1;
                    TagEntry::recv(UNEXPECTED, buf, cookie).with_ignore(LOW)
                };
                self.port.append(EP, ListKind::Priority, claim).unwrap();
                self.entries.insert(cookie, id);
                self.expected.consumed += 1;
                self.expected.auto_unlink += 1;
            }
            TagEventKind::UnexpectedConsumed => {
                self.seen.consumed += 1;
                let id = self.entries[&e.cookie];
                let m = self.msgs[id as usize];
                assert_eq!(
                    (
                        e.match_bits,
                        e.hdr_data,
                        e.rlength,
                        e.mlength,
                        e.truncated,
                        e.rendezvous,
                        e.addr
                    ),
                    (
                        m.tag(),
                        id,
                        m.len as u64,
                        m.len as u64,
                        false,
                        rndv(&m),
                        self.recv.addr() + (m.slot * SLOT) as u64
                    ),
                    "{e:?} for {m:?} (claimed by entry {})",
                    e.cookie
                );
                self.check_slot(id, "claimed");
            }
            TagEventKind::AutoUnlink => {
                self.seen.auto_unlink += 1;
                if let Some(buf) = self.ovf_linked.remove(&e.cookie) {
                    // A full overflow buffer left the list: link another one. It is free for
                    // reuse once its last unexpected message has been claimed (AutoFree).
                    self.ovf_unlinked.insert(e.cookie, buf);
                    self.expected.auto_unlink += 1;
                    self.expected.auto_free += 1;
                    self.link_overflow();
                } else {
                    assert!(self.entries.contains_key(&e.cookie), "{e:?}");
                }
            }
            TagEventKind::AutoFree => {
                self.seen.auto_free += 1;
                let buf = self
                    .ovf_unlinked
                    .remove(&e.cookie)
                    .unwrap_or_else(|| panic!("AutoFree of a buffer still linked: {e:?}"));
                self.ovf_free.push_back(buf);
            }
            _ => panic!("event the model does not expect: {e:?}"),
        }
    }

    /// Takes the events there are (waiting up to `wait` for the first); returns how many.
    fn events(&mut self, wait: Duration) -> usize {
        let mut out = [TagEvent::EMPTY; 64];
        let n = self.port.wait(&mut out, wait);
        for e in &out[..n] {
            self.handle(*e);
        }
        n
    }
}

#[test]
fn tagged_messages_survive_faults_exactly_once() {
    let faults = FaultConfig {
        seed: 2026,
        drop: 0.01,
        duplicate: 0.01,
        reorder: 0.01,
        corrupt: 0.01,
    };
    let cores = common::start_eal();
    let last = *cores.last().unwrap();
    // Both engines on one worker on the last core, the application on the first.
    common::host_on_first_core();
    let mut qp = QpConfig::new(0, 0);
    qp.tagged = true;
    qp.rndv_threshold = EAGER_MAX as u32;
    qp.pmtu = Mtu::M4096;
    // As rdma_faults: a window of READ responses takes a while to drain through one core.
    qp.timeout_ns = 1_000_000;
    let mut opts = LoopbackOpts::new(qp, [last, last]);
    opts.faults = Some(faults);
    opts.tags = Some(TagConfig::default());
    let mut pair = loopback::start(&opts).expect("two tagged engines start");

    let map = |len: usize| Arc::new(Mapping::anonymous(len).expect("anonymous memory"));
    let src_map = map(SRC_LEN);
    let src = pair.a.engine.register_all(&src_map, Access::ALL).unwrap();
    let recv_map = map(SLOT * SLOTS);
    let recv = pair.b.engine.register_all(&recv_map, Access::ALL).unwrap();
    let ovf = pair
        .b
        .engine
        .register_all(&map(OVF_LEN * OVF_BUFS), Access::ALL)
        .unwrap();
    let src_data = pattern(SRC_LEN, 7);
    src.write(0, &src_data).unwrap();

    let mut b = Target {
        port: pair.b.tags.take().unwrap(),
        recv,
        ovf,
        src: src_data,
        msgs: Vec::new(),
        entries: HashMap::new(),
        linking: HashSet::new(),
        ovf_linked: HashMap::new(),
        ovf_unlinked: HashMap::new(),
        ovf_free: (0..OVF_BUFS).collect(),
        next_cookie: 0,
        slot_fill: vec![0; SLOTS],
        expected: Counts::default(),
        seen: Counts::default(),
        claims_by_wildcard: 0,
    };
    for _ in 0..OVF_LINKED {
        b.link_overflow();
    }

    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let total = messages();
    let started = Instant::now();
    let mut wcs = [WorkCompletion::EMPTY; 64];
    let (mut completed, mut rendezvous, mut ranked) = (0u64, 0u64, 0u64);
    let mut first = 0u64;
    while first < total {
        let ids = first..(first + ROUND).min(total);
        // Plan the round and post its receives.
        for id in ids.clone() {
            let r = next();
            let class = match r % 5 {
                0 | 1 => Class::Posted,
                2 => Class::Wild,
                _ => Class::Unexpected,
            };
            let len = if (r >> 8) % 10 < 7 {
                1 + ((r >> 16) % EAGER_MAX as u64) as usize
            } else {
                EAGER_MAX + 1 + ((r >> 16) % (RNDV_MAX - EAGER_MAX) as u64) as usize
            };
            let from = ((r >> 40) % (SRC_LEN - len) as u64) as usize;
            let m = Msg {
                id,
                class,
                len,
                from,
                slot: id as usize % SLOTS,
                delivered: false,
                sent: false,
            };
            rendezvous += if m.rendezvous() { 1 } else { 0 };
            b.msgs.push(m);
            let buf = b.recv.sge(m.slot * SLOT, SLOT as u32);
            let cookie = b.cookie();
            match class {
                Class::Posted => {
                    let mut e = TagEntry::recv(m.tag(), buf, cookie);
                    if r & (1 << 60) != 0 {
                        e = e.from_rank(0);
                        ranked += 1;
                    }
                    b.post(e, id);
                }
                // The k-th wildcard receive of the round takes its k-th wildcard message.
                Class::Wild => b.post(TagEntry::recv(WILD, buf, cookie).with_ignore(LOW), id),
                Class::Unexpected => {}
            }
            if class != Class::Unexpected {
                b.expected.put += 1;
                b.expected.auto_unlink += 1;
            } else {
                b.expected.put_overflow += 1;
            }
        }
        // The receives are linked before the messages leave.
        let deadline = Instant::now() + WAIT;
        while !b.linking.is_empty() {
            assert!(Instant::now() < deadline, "links missing: {:?}", b.linking);
            b.events(Duration::from_millis(10));
        }
        let wrs: Vec<WorkRequest> = ids
            .clone()
            .map(|id| {
                let m = b.msgs[id as usize];
                WorkRequest::tagged_send(id, src.sgl(m.from, m.len as u32), EP, m.tag(), id)
            })
            .collect();
        pair.a.qp.post_send(&wrs).unwrap();

        // Until every message of the round has landed and every send has completed.
        let deadline = Instant::now() + WAIT;
        loop {
            let pending = ids
                .clone()
                .filter(|&id| {
                    let m = b.msgs[id as usize];
                    !m.delivered || !m.sent
                })
                .count();
            if pending == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round from {first}: {pending} messages not done within {WAIT:?}: {:?}",
                ids.clone()
                    .map(|id| b.msgs[id as usize])
                    .filter(|m| !m.delivered || !m.sent)
                    .collect::<Vec<_>>()
            );
            b.events(Duration::from_millis(1));
            let n = pair.a.cq.poll(&mut wcs);
            for wc in &wcs[..n] {
                let m = b
                    .msgs
                    .get_mut(wc.wr_id as usize)
                    .expect("a send of this test");
                assert!(!m.sent, "send {} completed twice: {wc:?}", wc.wr_id);
                assert_eq!(
                    (wc.status, wc.opcode, wc.byte_len),
                    (WcStatus::Success, WcOpcode::TaggedSend, m.len as u32),
                    "{wc:?}"
                );
                m.sent = true;
                completed += 1;
            }
        }
        first = ids.end;
    }
    // Whatever is still coming (the unlinks, frees and links the last events caused).
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until || !b.linking.is_empty() {
        b.events(Duration::from_millis(10));
        assert!(
            Instant::now() < until + WAIT,
            "links missing: {:?}",
            b.linking
        );
    }
    let elapsed = started.elapsed();
    assert_eq!(completed, total, "one completion per send");
    assert_eq!(
        pair.a.cq.poll_one(),
        None,
        "no completion beyond one per send"
    );
    assert_eq!(b.seen, b.expected, "event counts: seen vs expected");
    assert!(b.msgs.iter().all(|m| m.delivered && m.sent));
    // Every slot the run used was checked and overwritten: a late duplicate landing would
    // have changed it.
    let whole = b.recv.to_vec(0, SLOT * SLOTS).unwrap();
    for (slot, fill) in b.slot_fill.iter().enumerate() {
        assert!(
            whole[slot * SLOT..(slot + 1) * SLOT]
                .iter()
                .all(|x| x == fill),
            "receive slot {slot} changed after its message was checked"
        );
    }
    assert!(
        b.src[..] == src.to_vec(0, SRC_LEN).unwrap()[..],
        "the sources are unchanged"
    );

    let reports = pair.runtime.join().expect("workers ran without failure");
    let sum = |name: &str| -> u64 { reports.iter().map(|r| r.counter(name).unwrap()).sum() };
    // The engine's own count: each message matched once (a duplicate packet is never matched
    // again), none dropped, each rendezvous pulled once, none truncated, no event lost.
    let unexpected = b.expected.put_overflow;
    assert_eq!(
        (
            sum("tag_matched_priority"),
            sum("tag_matched_overflow"),
            sum("tag_dropped"),
            sum("tag_rendezvous_pulls"),
            sum("tag_wrong_engine"),
            sum("tag_events_lost"),
            sum("tag_truncated"),
        ),
        (total - unexpected, unexpected, 0, rendezvous, 0, 0, 0),
        "tag counters (matched priority, matched overflow, dropped, rendezvous pulls, wrong engine, events lost, truncated)"
    );
    let totals = common::fault_totals(&reports);
    eprintln!(
        "{total} messages ({rendezvous} rendezvous, {} unexpected of which {} claimed by \
         wildcard, {ranked} receives from rank 0 only) in {elapsed:?}; events {:?}",
        b.expected.put_overflow, b.claims_by_wildcard, b.seen
    );
    assert!(totals.duplicated > 0, "duplicates were injected");
    totals.check();
}
