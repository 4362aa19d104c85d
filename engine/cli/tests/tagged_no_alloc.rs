//! Tagged messaging allocates nothing per message on the worker: after a warm-up, thousands of
//! tagged messages between two engines on a `net_ring` link (real EAL, one worker running both
//! engines, the application on this thread) make zero heap allocations on the worker, and none
//! on this thread either. Each round has every kind of message: eager of one and of several
//! packets into posted receives, unexpected eager messages claimed by appends, a rendezvous
//! into a posted receive and an unexpected rendezvous claimed by an append (each pulled by the
//! target's worker), with overflow buffers unlinked, relinked and freed as they fill.
//!
//! The counting global allocator is `stats_alloc`, as in `rdma_no_alloc.rs`: its counters are
//! shared by every thread, so it sees the worker's allocations as well as this thread's.

mod common;

use std::alloc::System;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pmem::Mapping;
use portico::lpe::{ListKind, Options};
use portico::rdma::loopback::{self, LoopbackOpts};
use portico::rdma::{MemoryRegion, TagConfig, TagEntry, TagEvent, TagEventKind, TagPort};
use portico::transport::{Access, QpConfig, WcStatus, WorkCompletion, WorkRequest};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const KIB: usize = 1024;
const EP: u16 = 0;
/// Messages per round: (length, posted beforehand or unexpected). Eager up to 16 KiB.
const ROUND: [(usize, bool); 8] = [
    (256, true),
    (3000, true),
    (16 * KIB, true),
    (2000, false),
    (9000, false),
    (64 * KIB, true),
    (40 * KIB, false),
    (1, true),
];
const SLOT: usize = 64 * KIB;
const OVF_LEN: usize = 512 * KIB;
const OVF_BUFS: usize = 4;
/// Claims and overflow buffers have cookies of their own.
const CLAIM: u64 = 1 << 40;
const OVF: u64 = 1 << 50;
const WAIT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, PartialEq, Debug)]
enum Ovf {
    Free,
    Linked,
    /// Unlinked, still holding unexpected messages until its AutoFree.
    Draining,
}

struct Host {
    port: TagPort,
    recv: MemoryRegion,
    ovf: MemoryRegion,
    src: Vec<u8>,
    /// Where received bytes are read into for comparison (never grows).
    check: Vec<u8>,
    ovf_state: [Ovf; OVF_BUFS],
    ovf_gen: [u64; OVF_BUFS],
    links: u64,
    delivered: u64,
}

impl Host {
    fn link_overflow(&mut self) {
        let i = self
            .ovf_state
            .iter()
            .position(|s| *s == Ovf::Free)
            .expect("an overflow buffer free");
        self.ovf_gen[i] += 1;
        let cookie = OVF | self.ovf_gen[i] << 8 | i as u64;
        let e = TagEntry::recv(0, self.ovf.sge(i * OVF_LEN, OVF_LEN as u32), cookie)
            .with_ignore(u64::MAX)
            .with_options(Options::MANAGE_LOCAL)
            .with_min_free(16 * KIB as u64);
        self.port.append(EP, ListKind::Overflow, e).unwrap();
        self.ovf_state[i] = Ovf::Linked;
    }

    /// Message `seq` is in its slot: compare it with what was sent.
    fn verify(&mut self, seq: u64, mlength: u64) {
        let pos = (seq % ROUND.len() as u64) as usize;
        let len = ROUND[pos].0;
        assert_eq!(mlength, len as u64, "message {seq}");
        self.recv.read(pos * SLOT, &mut self.check[..len]).unwrap();
        let from = src_offset(seq);
        assert!(
            self.check[..len] == self.src[from..from + len],
            "message {seq} differs"
        );
        self.delivered += 1;
    }

    fn handle(&mut self, e: &TagEvent) {
        let ovf_index = (e.cookie & 0xff) as usize;
        match e.kind {
            TagEventKind::Link if e.cookie & OVF == 0 => self.links += 1,
            TagEventKind::Link => {}
            TagEventKind::Put => self.verify(e.cookie, e.mlength),
            TagEventKind::UnexpectedConsumed => self.verify(e.cookie & !CLAIM, e.mlength),
            TagEventKind::PutOverflow => {
                // Claim it into its slot.
                let seq = e.match_bits;
                let pos = (seq % ROUND.len() as u64) as usize;
                let buf = self.recv.sge(pos * SLOT, SLOT as u32);
                self.port
                    .append(
                        EP,
                        ListKind::Priority,
                        TagEntry::recv(seq, buf, seq | CLAIM),
                    )
                    .unwrap();
            }
            TagEventKind::AutoUnlink if e.cookie & OVF != 0 => {
                self.ovf_state[ovf_index] = Ovf::Draining;
                self.link_overflow();
            }
            TagEventKind::AutoUnlink => {}
            TagEventKind::AutoFree => {
                assert_eq!(self.ovf_state[ovf_index], Ovf::Draining, "{e:?}");
                self.ovf_state[ovf_index] = Ovf::Free;
            }
            _ => panic!("unexpected event {e:?}"),
        }
    }
}

fn src_offset(seq: u64) -> usize {
    (seq as usize * 4099) % (256 * KIB)
}

#[test]
fn tagged_messages_allocate_nothing_after_warm_up() {
    let last = *common::start_eal().last().unwrap();
    common::host_on_first_core();
    let mut qp = QpConfig::new(0, 0);
    qp.tagged = true;
    qp.timeout_ns = 5_000_000;
    let mut opts = LoopbackOpts::new(qp, [last, last]);
    opts.tags = Some(TagConfig::default());
    let mut pair = loopback::start(&opts).expect("engines start");

    let map = |n: usize| Arc::new(Mapping::anonymous(n).unwrap());
    let src = pair
        .a
        .engine
        .register_all(&map(512 * KIB), Access::ALL)
        .unwrap();
    let recv = pair
        .b
        .engine
        .register_all(&map(SLOT * ROUND.len()), Access::ALL)
        .unwrap();
    let ovf = pair
        .b
        .engine
        .register_all(&map(OVF_LEN * OVF_BUFS), Access::ALL)
        .unwrap();
    let src_data = common::pattern(512 * KIB, 5);
    src.write(0, &src_data).unwrap();
    let mut host = Host {
        port: pair.b.tags.take().unwrap(),
        recv,
        ovf,
        src: src_data,
        check: vec![0; SLOT],
        ovf_state: [Ovf::Free; OVF_BUFS],
        ovf_gen: [0; OVF_BUFS],
        links: 0,
        delivered: 0,
    };
    host.link_overflow();
    host.link_overflow();

    let mut events = [TagEvent::EMPTY; 64];
    let mut wcs = [WorkCompletion::EMPTY; 64];
    let mut wrs = [WorkRequest::tagged_send(0, src.sgl(0, 1), EP, 0, 0); ROUND.len()];
    let mut seq = 0u64;
    let mut run = |host: &mut Host, rounds: u64| -> u64 {
        let mut sent = 0u64;
        for _ in 0..rounds {
            let base = seq;
            // Receives for the posted messages, linked before the messages leave.
            let links = host.links;
            let mut posted = 0;
            for (pos, &(len, prior)) in ROUND.iter().enumerate() {
                let s = base + pos as u64;
                if prior {
                    let buf = host.recv.sge(pos * SLOT, SLOT as u32);
                    host.port
                        .append(EP, ListKind::Priority, TagEntry::recv(s, buf, s))
                        .unwrap();
                    posted += 1;
                }
                let from = src_offset(s);
                wrs[pos] = WorkRequest::tagged_send(s, src.sgl(from, len as u32), EP, s, 0);
            }
            let deadline = Instant::now() + WAIT;
            let delivered = host.delivered;
            while host.links < links + posted {
                assert!(Instant::now() < deadline, "receives not linked");
                let n = host.port.poll(&mut events);
                for e in &events[..n] {
                    host.handle(e);
                }
            }
            pair.a.qp.post_send(&wrs).expect("room for the round");
            let mut done = 0;
            while done < ROUND.len() || host.delivered < delivered + ROUND.len() as u64 {
                assert!(Instant::now() < deadline, "round from {base} not done");
                let n = host.port.poll(&mut events);
                for e in &events[..n] {
                    host.handle(e);
                }
                let n = pair.a.cq.poll(&mut wcs);
                for wc in &wcs[..n] {
                    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                    done += 1;
                }
                if n == 0 {
                    std::hint::spin_loop();
                }
            }
            seq += ROUND.len() as u64;
            sent += ROUND.len() as u64;
        }
        sent
    };

    // Warm-up: rings, queues, lists and mempool caches reach their working sizes, and every
    // overflow buffer is linked, filled, unlinked and freed at least once.
    run(&mut host, 300);
    // The allocator sees other threads' allocations.
    let probe = Region::new(GLOBAL);
    std::thread::spawn(|| std::hint::black_box(vec![1u8; 100]).len())
        .join()
        .unwrap();
    assert!(
        probe.change().allocations > 0,
        "the counter sees other threads"
    );
    let started = Instant::now();
    let region = Region::new(GLOBAL);
    let sent = run(&mut host, 2000);
    let change = region.change();
    let elapsed = started.elapsed();
    let reports = pair.runtime.join().unwrap();
    let retx: u64 = reports
        .iter()
        .filter_map(|r| r.counter("retransmissions"))
        .sum();
    eprintln!(
        "{sent} tagged messages in {elapsed:?}: allocations {change:?}; retransmissions {retx}"
    );
    assert_eq!(
        (change.allocations, change.reallocations),
        (0, 0),
        "heap allocations (worker and application) during {sent} tagged messages: {change:?}"
    );
}
