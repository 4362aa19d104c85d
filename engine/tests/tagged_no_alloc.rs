//! Tagged messaging allocates nothing per message on the worker: after a warm-up, thousands of
//! tagged messages between two engines on a `net_ring` link (real EAL, one worker running both
//! engines, the application on this thread) make zero heap allocations on the worker, and none
//! on this thread either. Each round has every kind of message: eager of one and of several
//! packets into posted receives, unexpected eager messages claimed by appends, a rendezvous
//! into a posted receive and an unexpected rendezvous claimed by an append (each pulled by the
//! target's worker), with overflow buffers unlinked, relinked and freed as they fill.
//!
//! The counting global allocator of this binary tells the application's thread (marked) from
//! every other one; the first allocations off it during the measured phase are recorded with
//! their backtraces, so a failure says where.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pmem::Mapping;
use portico::lpe::{ListKind, Options};
use portico::rdma::loopback::{self, LoopbackOpts};
use portico::rdma::{MemoryRegion, TagConfig, TagEntry, TagEvent, TagEventKind, TagPort};
use portico::transport::{Access, QpConfig, WcStatus, WorkCompletion, WorkRequest};

/// Counts allocations while armed: on the marked (application) thread, and elsewhere.
struct Counting;

static ARMED: AtomicBool = AtomicBool::new(false);
static HOST_ALLOCS: AtomicU64 = AtomicU64::new(0);
static OTHER_ALLOCS: AtomicU64 = AtomicU64::new(0);
/// Backtraces of the first allocations off the application's thread while armed.
static WHERE: Mutex<Vec<String>> = Mutex::new(Vec::new());
const BACKTRACES: usize = 3;

thread_local! {
    static HOST: Cell<bool> = const { Cell::new(false) };
    /// Inside the recording below (its own allocations are not counted).
    static RECORDING: Cell<bool> = const { Cell::new(false) };
}

impl Counting {
    fn count(&self) {
        if !ARMED.load(Ordering::Relaxed) || RECORDING.with(Cell::get) {
            return;
        }
        if HOST.with(Cell::get) {
            HOST_ALLOCS.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if OTHER_ALLOCS.fetch_add(1, Ordering::Relaxed) < BACKTRACES as u64 {
            RECORDING.with(|r| r.set(true));
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("unnamed").to_string();
            let trace = std::backtrace::Backtrace::force_capture().to_string();
            if let Ok(mut w) = WHERE.lock() {
                w.push(format!("thread {name}:\n{trace}"));
            }
            RECORDING.with(|r| r.set(false));
        }
    }
}

// SAFETY: every call goes to the system allocator unchanged; counting touches only atomics and
// const-initialised thread-locals without destructors (recording guards its own allocations).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.count();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

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
    HOST.with(|h| h.set(true));
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
    // The allocator sees other threads' allocations (a thread that allocates while armed).
    ARMED.store(true, Ordering::SeqCst);
    std::thread::spawn(|| std::hint::black_box(vec![1u8; 100]).len())
        .join()
        .unwrap();
    ARMED.store(false, Ordering::SeqCst);
    assert!(
        OTHER_ALLOCS.load(Ordering::SeqCst) > 0,
        "the counter sees other threads"
    );
    OTHER_ALLOCS.store(0, Ordering::SeqCst);
    HOST_ALLOCS.store(0, Ordering::SeqCst);
    WHERE.lock().unwrap().clear();
    let started = Instant::now();
    ARMED.store(true, Ordering::SeqCst);
    let sent = run(&mut host, 2000);
    ARMED.store(false, Ordering::SeqCst);
    let elapsed = started.elapsed();
    let (on_host, elsewhere) = (
        HOST_ALLOCS.load(Ordering::SeqCst),
        OTHER_ALLOCS.load(Ordering::SeqCst),
    );
    let reports = pair.runtime.join().unwrap();
    let retx: u64 = reports
        .iter()
        .filter_map(|r| r.counter("retransmissions"))
        .sum();
    eprintln!(
        "{sent} tagged messages in {elapsed:?}: {elsewhere} allocations on the worker, \
         {on_host} on the application's thread; retransmissions {retx}"
    );
    let traces = WHERE.lock().unwrap().join("\n----\n");
    assert_eq!(
        elsewhere, 0,
        "heap allocations off the application's thread (the worker) during {sent} tagged \
         messages; the first ones:\n{traces}"
    );
    assert_eq!(on_host, 0, "heap allocations on the application's thread");
}
