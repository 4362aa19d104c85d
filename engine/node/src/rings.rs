//! The host ↔ worker boundary of an RDMA engine: lock-free single-producer/single-consumer
//! rings, as a NIC's work queues and completion queues are.
//!
//! - Per queue pair, a **send ring** and a **receive ring** (host → worker) of work requests.
//!   Posting a list is one ring commit and one **doorbell**: the queue pair's number goes onto
//!   the engine's doorbell queue, once, until the worker has taken it (a flag per queue pair
//!   keeps it from being queued twice). The worker serves only the queue pairs that rang, so
//!   an idle queue pair costs nothing.
//! - Per completion queue, a **completion ring** (worker → host). The worker takes a work
//!   request off a ring only after reserving a completion slot for it, so a completion never
//!   finds its ring full and nothing is ever lost: a host that does not poll stalls its own
//!   work (counted as `cq_full`) instead.
//! - Waiting for completions spins, then parks; the worker wakes a parked host after it
//!   publishes completions (a flag and a fence on both sides, so a wake-up is never missed;
//!   the worker's is a compiler fence where the host's is `membarrier`, `crate::wake`).
//!   How long it spins follows the worker's polling policy: 50 µs beside a busy worker, a
//!   couple of microseconds beside an adaptive one (the host should not hold a shared core).
//! - The reverse holds too: a worker that runs adaptive polling may sleep, and a post that
//!   queues a doorbell wakes it (`dataplane::wake`).
//!
//! Memory ordering: a ring commit is a release store and a ring read an acquire load. The
//! worker places data in the application's memory before it publishes the completion that
//! names it, so a host that polled a completion sees the data.
//!
//! A work request crosses its ring as an `Entry` of one cache line (64 bytes): its id, its
//! kind and its one piece, as most requests have. The list of a request of more pieces goes
//! into the queue pair's **list ring** just before its entry, and the worker takes it with
//! the entry. (The rings held whole [`WorkRequest`]s before, 304 bytes each with their
//! 16-piece array: five cache lines to cross cores a request, and a `memcpy` of them on the
//! host.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam::sync::{Parker, Unparker};
use crossbeam::utils::CachePadded;
use rtrb::{Consumer, Producer, RingBuffer};

use crate::wake::{self, Wake};
use proto::transport::{RecvRequest, SgList, Sge, WorkCompletion, WorkRequest, WrKind};

/// Queue pairs one engine can have: the doorbell queue holds each at most once.
pub const MAX_QPS: usize = 4096;

/// How long [`Cq::wait`] spins before it parks, beside a busy-polling worker.
pub const SPIN_NS: u64 = 50_000;

/// How long the host's waits spin before they park, in ns: one per engine, shared by its
/// completion queues and its tag port, set from the worker's polling policy.
pub(crate) type HostSpin = Arc<AtomicU64>;

/// The engine's doorbell queue: slots of queue pairs with new work requests, in the order
/// they rang. Many hosts ring, one worker takes: a ring of [`MAX_QPS`] places, each taken by a
/// host with one `fetch_add` of the tail and filled with the slot (plus one; 0 is an empty
/// place), and emptied by the worker in order. A queue pair's flag keeps it in the queue at
/// most once, so the places in use never exceed the queue pairs (were they ever, a doorbell
/// would be lost, as a full queue's push is; never memory). It replaced crossbeam's
/// `ArrayQueue`, whose compare-and-swap on both ends a single consumer does not need
/// (callgrind, a lone 64 B WRITE 3 116.2 -> 3 089.2).
pub(crate) struct Doorbells {
    places: Box<[AtomicU32; MAX_QPS]>,
    /// Places taken by hosts, ever.
    tail: CachePadded<AtomicU64>,
    /// Places emptied by the worker, ever: only it writes this (relaxed; its own index).
    head: CachePadded<AtomicU64>,
    /// Wakes the worker when a doorbell is queued while it sleeps (adaptive polling).
    wake: Arc<Wake>,
}

impl Doorbells {
    pub(crate) fn new() -> Arc<Doorbells> {
        Arc::new(Doorbells {
            places: Box::new([const { AtomicU32::new(0) }; MAX_QPS]),
            tail: CachePadded::new(AtomicU64::new(0)),
            head: CachePadded::new(AtomicU64::new(0)),
            wake: Arc::new(Wake::new()),
        })
    }

    /// Queues `slot` (a host's post). Release: the worker that takes it sees the requests
    /// committed before.
    #[inline]
    fn push(&self, slot: u32) {
        let at = self.tail.fetch_add(1, Ordering::Relaxed);
        self.places[at as usize % MAX_QPS].store(slot + 1, Ordering::Release);
    }

    /// The place at the worker's head.
    #[inline(always)]
    fn place(&self, head: u64) -> &AtomicU32 {
        &self.places[head as usize % MAX_QPS]
    }

    /// The next doorbell (the worker's, only). Most calls find none: one load.
    #[inline]
    pub(crate) fn pop(&self) -> Option<u32> {
        let head = self.head.load(Ordering::Relaxed);
        let place = self.place(head);
        let slot = place.load(Ordering::Acquire).checked_sub(1)?;
        place.store(0, Ordering::Relaxed);
        self.head.store(head + 1, Ordering::Relaxed);
        Some(slot)
    }

    /// Doorbells are queued (the worker checks before it sleeps, and every iteration).
    #[inline]
    pub(crate) fn pending(&self) -> bool {
        self.place(self.head.load(Ordering::Relaxed))
            .load(Ordering::Acquire)
            != 0
    }

    pub(crate) fn wake(&self) -> &Arc<Wake> {
        &self.wake
    }
}

/// What the host and the worker share about one queue pair.
pub(crate) struct QpShared {
    /// Set by a post that queued the doorbell; cleared by the worker when it takes it.
    rung: AtomicBool,
}

/// Not enough room in a ring: the first `posted` requests of the list were posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("queue full: {posted} of the list posted")]
pub struct QueueFull {
    pub posted: usize,
}

/// A work request in its ring: what the worker needs of it, its list inline when it is one
/// piece. `K` is the kind of a send request (`()` for a receive).
#[derive(Clone, Copy)]
pub(crate) struct Entry<K> {
    pub(crate) wr_id: u64,
    pub(crate) kind: K,
    /// Pieces in the request's list: none or one (`first`), or more, in the list ring.
    pieces: u8,
    first: Sge,
}

/// A host request as the rings carry it.
trait Request: Copy {
    type Kind: Copy;
    fn entry(&self) -> Entry<Self::Kind>;
    fn list(&self) -> &SgList;
}

impl Request for WorkRequest {
    type Kind = WrKind;
    #[inline]
    fn entry(&self) -> Entry<WrKind> {
        Entry::new(self.wr_id, self.kind, &self.sgl)
    }
    fn list(&self) -> &SgList {
        &self.sgl
    }
}

impl Request for RecvRequest {
    type Kind = ();
    #[inline]
    fn entry(&self) -> Entry<()> {
        Entry::new(self.wr_id, (), &self.sgl)
    }
    fn list(&self) -> &SgList {
        &self.sgl
    }
}

impl<K> Entry<K> {
    #[inline]
    fn new(wr_id: u64, kind: K, list: &SgList) -> Entry<K> {
        let pieces = list.as_slice();
        Entry {
            wr_id,
            kind,
            pieces: pieces.len() as u8,
            first: pieces.first().copied().unwrap_or(Sge::new(0, 0, 0)),
        }
    }

    fn is_long(&self) -> bool {
        self.pieces > 1
    }

    /// The request's pieces: inline, or the list at the head of `lists` (which the host
    /// pushed before the entry). `None` only were that list not there: then the entry
    /// waits in its ring.
    #[inline]
    pub(crate) fn pieces<'a>(&'a self, lists: &'a Consumer<SgList>) -> Option<&'a [Sge]> {
        match self.pieces {
            0 => Some(&[]),
            1 => Some(std::slice::from_ref(&self.first)),
            _ => lists.peek().ok().map(SgList::as_slice),
        }
    }

    /// The request was taken: its list, if it had one in the list ring, leaves it too.
    #[inline]
    pub(crate) fn taken(&self, lists: &mut Consumer<SgList>) {
        if self.is_long() {
            let _ = lists.pop();
        }
    }
}

/// The host's end of one direction of a queue pair: its requests' entries, and the lists
/// of those of more than one piece.
struct HostRing<K> {
    entries: Producer<Entry<K>>,
    lists: Producer<SgList>,
}

/// The worker's end of one direction of a queue pair.
pub(crate) struct WorkerRing<K> {
    pub(crate) entries: Consumer<Entry<K>>,
    pub(crate) lists: Consumer<SgList>,
}

/// A ring pair of `depth` requests. The list ring is as deep as the entry ring: a list
/// leaves it no later than its entry leaves the entry ring, so it never has less room.
fn work_ring<K>(depth: usize) -> (HostRing<K>, WorkerRing<K>) {
    let (entries, entries_c) = RingBuffer::new(depth);
    let (lists, lists_c) = RingBuffer::new(depth);
    (
        HostRing { entries, lists },
        WorkerRing {
            entries: entries_c,
            lists: lists_c,
        },
    )
}

/// The application's end of one queue pair: post SENDs, WRITEs, READs and receives.
pub struct Qp {
    qpn: u32,
    slot: u32,
    sq: HostRing<WrKind>,
    rq: HostRing<()>,
    shared: Arc<QpShared>,
    doorbells: Arc<Doorbells>,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.qpn)
            .finish_non_exhaustive()
    }
}

/// The worker's end of one queue pair's rings.
pub(crate) struct QpRings {
    pub(crate) sq: WorkerRing<WrKind>,
    pub(crate) rq: WorkerRing<()>,
    shared: Arc<QpShared>,
}

impl QpRings {
    /// Takes the doorbell: later posts ring again. Acquire: every request posted before the
    /// ring that queued this doorbell is visible in the rings afterwards.
    pub(crate) fn take_doorbell(&self) {
        self.shared.rung.swap(false, Ordering::AcqRel);
    }
}

/// Both ends of a new queue pair's rings.
pub(crate) fn qp_rings(
    qpn: u32,
    slot: u32,
    send_depth: usize,
    recv_depth: usize,
    doorbells: Arc<Doorbells>,
) -> (Qp, QpRings) {
    let (sq_p, sq_c) = work_ring(send_depth);
    let (rq_p, rq_c) = work_ring(recv_depth);
    let shared = Arc::new(QpShared {
        rung: AtomicBool::new(false),
    });
    (
        Qp {
            qpn,
            slot,
            sq: sq_p,
            rq: rq_p,
            shared: shared.clone(),
            doorbells,
        },
        QpRings {
            sq: sq_c,
            rq: rq_c,
            shared,
        },
    )
}

impl Qp {
    /// The queue pair's number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Send requests that fit in the send ring now.
    pub fn send_space(&self) -> usize {
        self.sq.entries.slots()
    }

    /// Receive requests that fit in the receive ring now.
    pub fn recv_space(&self) -> usize {
        self.rq.entries.slots()
    }

    fn ring(&self) {
        if !self.shared.rung.swap(true, Ordering::AcqRel) {
            // The flag admits one entry per queue pair, and the queue has a place for each.
            self.doorbells.push(self.slot);
            self.doorbells.wake.notify();
        }
    }

    /// Posts a list of SENDs, WRITEs and READs with one doorbell. What does not fit is not
    /// posted (the error says how many were). The buffers belong to the engine until each
    /// request's completion.
    pub fn post_send(&mut self, wrs: &[WorkRequest]) -> Result<(), QueueFull> {
        let n = post(&mut self.sq, wrs);
        self.rang(n, wrs.len())
    }

    /// Posts a list of receive buffers with one doorbell.
    pub fn post_recv(&mut self, wrs: &[RecvRequest]) -> Result<(), QueueFull> {
        let n = post(&mut self.rq, wrs);
        self.rang(n, wrs.len())
    }

    /// Rings for the `posted` of `asked` requests just committed.
    fn rang(&self, posted: usize, asked: usize) -> Result<(), QueueFull> {
        if posted > 0 {
            self.ring();
        }
        if posted < asked {
            return Err(QueueFull { posted });
        }
        Ok(())
    }
}

/// Posts as many of `wrs` as the rings hold: the lists of more than one piece first, then
/// the entries, each ring with one commit. Returns how many were posted.
#[inline(always)]
fn post<R: Request>(ring: &mut HostRing<R::Kind>, wrs: &[R]) -> usize {
    // One request with its piece in the entry (a lone operation): `push`, 32 instructions
    // fewer than the chunk's two-slice iterator, and before the list's walk and its frame
    // (callgrind, a lone 64 B WRITE 3 180.1 -> 3 139.2).
    if let [wr] = wrs
        && wr.list().len() <= 1
    {
        return usize::from(ring.entries.push(wr.entry()).is_ok());
    }
    post_list(ring, wrs)
}

/// [`post`] of a list of requests, or of one with a list of pieces.
#[inline(never)]
fn post_list<R: Request>(ring: &mut HostRing<R::Kind>, wrs: &[R]) -> usize {
    let mut n = wrs.len().min(ring.entries.slots());
    // The list ring's room is read only for a list that needs it: it is the worker's index,
    // a line the other core writes.
    let mut room = None;
    let mut long = 0;
    for (k, wr) in wrs[..n].iter().enumerate() {
        if wr.list().len() > 1 {
            // Cannot happen (the list ring has the entry ring's room or more), but were it
            // so, the requests before this one are still posted whole.
            if long == *room.get_or_insert_with(|| ring.lists.slots()) {
                n = k;
                break;
            }
            long += 1;
        }
    }
    if n == 0 {
        return 0;
    }
    // Both chunks are taken before either is committed, so that no list is ever published
    // without its entry (were one, the next long request's entry would take it).
    let Ok(entries) = ring.entries.write_chunk_uninit(n) else {
        return 0;
    };
    if long > 0 {
        let Ok(chunk) = ring.lists.write_chunk_uninit(long) else {
            return 0;
        };
        let lists = wrs[..n]
            .iter()
            .map(R::list)
            .filter(|l| l.len() > 1)
            .copied();
        // The lists are committed first: a worker that sees an entry sees its list.
        chunk.fill_from_iter(lists);
    }
    entries.fill_from_iter(wrs[..n].iter().map(R::entry))
}

/// What the host and the worker share about one completion queue.
pub(crate) struct CqShared {
    /// The host is about to park (or parked) in [`Cq::wait`].
    sleeping: AtomicBool,
    unparker: Unparker,
    /// Times the worker left work in a ring because this queue had no free slot.
    full: AtomicU64,
    /// How long [`Cq::wait`] spins before it parks (the worker's policy sets it).
    spin_ns: HostSpin,
    /// The eventfd path for a host that waits on descriptors ([`Cq::events`]).
    events: Arc<Wake>,
}

/// The application's end of a completion queue.
pub struct Cq {
    id: u32,
    ring: Consumer<WorkCompletion>,
    shared: Arc<CqShared>,
    parker: Parker,
}

/// The worker's end of a completion queue.
pub(crate) struct CqWriter {
    ring: Producer<WorkCompletion>,
    /// Slots promised to work requests taken and not yet completed.
    reserved: usize,
    /// The ring's free slots as last read, less the completions pushed since: never more than
    /// it has (the host only frees more).
    free_seen: usize,
    shared: Arc<CqShared>,
    /// Completions pushed since the last [`CqWriter::publish`].
    pushed: bool,
}

/// Both ends of a new completion queue of `depth` entries.
pub(crate) fn cq_ring(id: u32, depth: usize, spin_ns: HostSpin) -> (Cq, CqWriter) {
    let (p, c) = RingBuffer::new(depth);
    let parker = Parker::new();
    let shared = Arc::new(CqShared {
        sleeping: AtomicBool::new(false),
        unparker: parker.unparker().clone(),
        full: AtomicU64::new(0),
        spin_ns,
        events: Arc::new(Wake::to_host()),
    });
    (
        Cq {
            id,
            ring: c,
            shared: shared.clone(),
            parker,
        },
        CqWriter {
            ring: p,
            reserved: 0,
            free_seen: 0,
            shared,
            pushed: false,
        },
    )
}

impl CqWriter {
    /// Completion slots free and not yet promised.
    pub(crate) fn unreserved(&self) -> usize {
        self.ring.slots().saturating_sub(self.reserved)
    }

    /// Whether `need` slots are free and not yet promised ([`CqWriter::unreserved`]), asked of
    /// the free slots seen last, and of the ring (a load of the host's index, a line the other
    /// core writes) only when those fall short (callgrind, a lone 64 B WRITE 3 076.2 -> 3 064.3).
    #[inline]
    pub(crate) fn has_room(&mut self, need: usize) -> bool {
        if self.free_seen >= self.reserved + need {
            return true;
        }
        self.free_seen = self.ring.slots();
        self.free_seen >= self.reserved + need
    }

    /// Promise one slot to a work request being taken.
    pub(crate) fn reserve(&mut self) {
        self.reserved += 1;
    }

    /// Counts a stall: work left in a ring for want of a completion slot.
    pub(crate) fn note_full(&self) {
        self.shared.full.fetch_add(1, Ordering::Relaxed);
    }

    /// Push one completion into a slot reserved for it (tests); false if it did not fit.
    #[cfg(test)]
    pub(crate) fn push(&mut self, wc: WorkCompletion) -> bool {
        self.push_all(&[wc]) == 0
    }

    /// Push completions into slots reserved for them, with one ring commit. Returns how many
    /// did not fit (0 unless the reservation rule is broken; those are not kept).
    pub(crate) fn push_all(&mut self, wcs: &[WorkCompletion]) -> usize {
        if wcs.is_empty() {
            return 0;
        }
        self.reserved = self.reserved.saturating_sub(wcs.len());
        self.free_seen = self.free_seen.saturating_sub(wcs.len());
        self.pushed = true;
        // One completion (a lone operation's) goes in by `push`: through the chunk's two-slice
        // iterator it was 40 instructions more (callgrind, a lone WRITE).
        if let [wc] = wcs {
            return usize::from(self.ring.push(*wc).is_err());
        }
        let n = wcs.len().min(self.ring.slots());
        // Copied a slice at a time (the slots' default values first, then `memcpy`): through
        // `fill_from_iter`'s iterator a completion took 9 instructions more (callgrind: a
        // batched 64 B WRITE 1 720.6 -> 1 711.3).
        if let Ok(mut chunk) = self.ring.write_chunk(n) {
            let (a, b) = chunk.as_mut_slices();
            let (first, second) = wcs[..n].split_at(a.len());
            a.copy_from_slice(first);
            b.copy_from_slice(second);
            chunk.commit_all();
        }
        wcs.len() - n
    }

    /// After a batch of pushes: wake the host if it parked waiting.
    #[inline(always)]
    pub(crate) fn publish(&mut self) {
        if !self.pushed {
            return;
        }
        self.pushed = false;
        // Pairs with the fence in `Cq::wait`: either the host sees the completions before it
        // parks, or the worker sees that it is sleeping (a compiler fence where the host's is
        // `membarrier`: `crate::wake`).
        wake::publish_fence();
        if self.shared.sleeping.load(Ordering::Relaxed) {
            self.shared.unparker.unpark();
        }
        // A host waiting on the eventfd (crate::wake::prepare_external_wait, or wake::sleep):
        // a relaxed load after the fence above when nobody waits.
        if self.shared.events.is_sleeping() {
            self.shared.events.notify();
        }
    }
}

impl Cq {
    /// The queue's id inside its engine (what [`super::RdmaNode::add_qp`] takes).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The eventfd path the worker writes when it publishes completions to a host waiting on
    /// it (with [`crate::wake::sleep`] or [`crate::wake::prepare_external_wait`]), so that one
    /// host thread can wait for this queue and other paths at once.
    pub fn events(&self) -> Arc<Wake> {
        self.shared.events.clone()
    }

    /// Whether completions wait to be polled.
    pub fn has_completions(&self) -> bool {
        !self.ring.is_empty()
    }

    /// Whether `writer` is the worker's end of this queue.
    pub(crate) fn feeds_from(&self, writer: &CqWriter) -> bool {
        Arc::ptr_eq(&self.shared, &writer.shared)
    }

    /// Takes up to `out.len()` completions, oldest first; returns how many.
    ///
    /// Inline in the caller for none or one (a lone operation's: `pop`, where the chunk
    /// copied its two slices with two calls to `memcpy`); more are copied out of line.
    #[inline]
    pub fn poll(&mut self, out: &mut [WorkCompletion]) -> usize {
        let n = out.len().min(self.ring.slots());
        match n {
            0 => 0,
            1 => match self.ring.pop() {
                Ok(wc) => {
                    out[0] = wc;
                    1
                }
                Err(_) => 0,
            },
            _ => self.poll_chunk(out, n),
        }
    }

    #[inline(never)]
    fn poll_chunk(&mut self, out: &mut [WorkCompletion], n: usize) -> usize {
        let Ok(chunk) = self.ring.read_chunk(n) else {
            return 0;
        };
        let (a, b) = chunk.as_slices();
        out[..a.len()].copy_from_slice(a);
        out[a.len()..n].copy_from_slice(b);
        chunk.commit_all();
        n
    }

    /// One completion, if any.
    pub fn poll_one(&mut self) -> Option<WorkCompletion> {
        self.ring.pop().ok()
    }

    /// Waits up to `timeout` for at least one completion and takes up to `out.len()`: spins
    /// for a short while (50 µs beside a busy-polling worker, 2 µs beside an adaptive one),
    /// then parks until the worker publishes one.
    pub fn wait(&mut self, out: &mut [WorkCompletion], timeout: Duration) -> usize {
        let n = self.poll(out);
        if n > 0 || out.is_empty() {
            return n;
        }
        let start = Instant::now();
        let spin = Duration::from_nanos(self.shared.spin_ns.load(Ordering::Relaxed));
        let spin_until = start + spin.min(timeout);
        loop {
            for _ in 0..64 {
                let n = self.poll(out);
                if n > 0 {
                    return n;
                }
                std::hint::spin_loop();
            }
            if Instant::now() >= spin_until {
                break;
            }
        }
        let deadline = start + timeout;
        loop {
            self.shared.sleeping.store(true, Ordering::Relaxed);
            wake::sleeper_fence();
            let n = self.poll(out);
            let now = Instant::now();
            if n > 0 || now >= deadline {
                self.shared.sleeping.store(false, Ordering::Relaxed);
                return n;
            }
            // Bounded: a wake-up the fence pairing cannot miss, and a deadline regardless.
            self.parker
                .park_timeout((deadline - now).min(Duration::from_millis(10)));
            self.shared.sleeping.store(false, Ordering::Relaxed);
        }
    }

    /// Waits up to `timeout` for one completion.
    pub fn wait_one(&mut self, timeout: Duration) -> Option<WorkCompletion> {
        let mut one = [WorkCompletion::EMPTY];
        (self.wait(&mut one, timeout) == 1).then_some(one[0])
    }

    /// Times the worker left work waiting because this queue had no free completion slot
    /// (the host did not poll fast enough). Nothing is lost; the work waits.
    pub fn full_stalls(&self) -> u64 {
        self.shared.full.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::transport::{MAX_SGE, WcOpcode};

    fn wc(wr_id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            ..WorkCompletion::EMPTY
        }
    }

    #[test]
    fn a_list_is_one_doorbell_and_what_does_not_fit_is_reported() {
        let doorbells = Doorbells::new();
        let (mut qp, rings) = qp_rings(7, 3, 4, 4, doorbells.clone());
        let wr = WorkRequest::send(1, SgList::new(), None);
        qp.post_send(&[wr, wr]).unwrap();
        qp.post_send(&[wr]).unwrap();
        assert_eq!(doorbells.pop(), Some(3));
        assert_eq!(doorbells.pop(), None, "rung once until taken");
        assert_eq!(qp.post_send(&[wr, wr]), Err(QueueFull { posted: 1 }));
        rings.take_doorbell();
        qp.post_recv(&[RecvRequest::new(9, SgList::new())]).unwrap();
        assert_eq!(doorbells.pop(), Some(3), "rings again once taken");
        assert_eq!(rings.sq.entries.slots(), 4);
        assert_eq!(rings.rq.entries.slots(), 1);
    }

    #[test]
    fn doorbells_come_out_once_each_in_order_across_the_ring_s_wrap() {
        let doorbells = Doorbells::new();
        assert!(!doorbells.pending());
        // Three times round the ring, a few in the queue at a time.
        let mut next = 0u32;
        for round in 0..3 * MAX_QPS / 5 {
            for k in 0..5 {
                doorbells.push(round as u32 * 5 + k);
            }
            for _ in 0..5 {
                assert!(doorbells.pending());
                assert_eq!(doorbells.pop(), Some(next));
                next += 1;
            }
            assert!(!doorbells.pending());
            assert_eq!(doorbells.pop(), None);
        }
        // A full queue: every queue pair rang.
        for slot in 0..MAX_QPS as u32 {
            doorbells.push(slot);
        }
        for slot in 0..MAX_QPS as u32 {
            assert_eq!(doorbells.pop(), Some(slot));
        }
        assert_eq!(doorbells.pop(), None);
    }

    #[test]
    fn doorbells_rung_by_many_hosts_at_once_each_come_out_once() {
        // Each host rings as a queue pair does: again only once the worker has taken its last
        // doorbell (its flag). A doorbell lost or taken twice stalls a host or over-counts.
        const HOSTS: usize = 3;
        const ROUNDS: u32 = 20_000;
        let doorbells = Doorbells::new();
        let rung: Vec<AtomicBool> = (0..HOSTS).map(|_| AtomicBool::new(false)).collect();
        let mut taken = [0u32; HOSTS];
        let deadline = Instant::now() + Duration::from_secs(20);
        std::thread::scope(|s| {
            for h in 0..HOSTS {
                let (d, rung) = (&doorbells, &rung);
                s.spawn(move || {
                    for _ in 0..ROUNDS {
                        while rung[h].load(Ordering::Acquire) {
                            assert!(Instant::now() < deadline, "host {h}'s doorbell was lost");
                            std::thread::yield_now();
                        }
                        rung[h].store(true, Ordering::Release);
                        d.push(h as u32);
                    }
                });
            }
            while taken.iter().sum::<u32>() < HOSTS as u32 * ROUNDS {
                assert!(Instant::now() < deadline, "doorbells lost: {taken:?}");
                match doorbells.pop() {
                    Some(slot) => {
                        taken[slot as usize] += 1;
                        rung[slot as usize].store(false, Ordering::Release);
                    }
                    None => std::thread::yield_now(),
                }
            }
        });
        assert_eq!(taken, [ROUNDS; HOSTS]);
        assert_eq!(doorbells.pop(), None);
    }

    #[test]
    fn a_request_crosses_its_ring_in_one_cache_line() {
        assert!(std::mem::size_of::<Entry<WrKind>>() <= 64);
        assert!(std::mem::size_of::<Entry<()>>() <= 32);
    }

    /// A list of `n` pieces that names its request and its place in it.
    fn list(id: u64, n: usize) -> SgList {
        let pieces: Vec<Sge> = (0..n as u64)
            .map(|k| Sge::new(id as u32, id << 32 | k, 10 * k as u32 + 1))
            .collect();
        SgList::from_slice(&pieces).unwrap()
    }

    /// Takes up to `max` requests off `ring` as the worker does, each with its pieces.
    fn take<K: Copy>(ring: &mut WorkerRing<K>, max: usize) -> Vec<(u64, K, Vec<Sge>)> {
        let mut out = Vec::new();
        while out.len() < max {
            let Ok(e) = ring.entries.peek().copied() else {
                break;
            };
            let sges = e.pieces(&ring.lists).expect("its list came first").to_vec();
            e.taken(&mut ring.lists);
            ring.entries.pop().unwrap();
            out.push((e.wr_id, e.kind, sges));
        }
        out
    }

    #[test]
    fn every_request_is_taken_with_its_own_pieces_in_order() {
        let (mut qp, mut rings) = qp_rings(7, 3, 4, 4, Doorbells::new());
        // Lists of none, one and several pieces, in every order, wrapping both rings many
        // times; sometimes more than fits, sometimes taken only in part.
        let sizes = [0, 1, 2, MAX_SGE, 1, 3, 0, MAX_SGE, 2, 2, 1, 5];
        let (mut next, mut expect) = (0u64, std::collections::VecDeque::new());
        let mut refused = 0;
        for round in 0..40 {
            let wrs: Vec<WorkRequest> = (0..1 + round % 5)
                .map(|k| {
                    let id = next + k;
                    let sgl = list(id, sizes[id as usize % sizes.len()]);
                    WorkRequest::write(id, sgl, id * 7, id as u32, None)
                })
                .collect();
            let posted = match qp.post_send(&wrs) {
                Ok(()) => wrs.len(),
                Err(QueueFull { posted }) => {
                    refused += wrs.len() - posted;
                    posted
                }
            };
            expect.extend(wrs[..posted].iter().copied());
            next += posted as u64;
            let recv = RecvRequest::new(round, list(round, sizes[round as usize % 12]));
            qp.post_recv(&[recv]).unwrap();
            for (wr_id, kind, sges) in take(&mut rings.sq, 1 + round as usize % 3) {
                let want = expect.pop_front().unwrap();
                assert_eq!(
                    (wr_id, kind, &sges[..]),
                    (want.wr_id, want.kind, want.sgl.as_slice())
                );
            }
            let got = take(&mut rings.rq, 1);
            assert_eq!((got[0].0, &got[0].2[..]), (recv.wr_id, recv.sgl.as_slice()));
        }
        for (wr_id, _, sges) in take(&mut rings.sq, usize::MAX) {
            let want = expect.pop_front().unwrap();
            assert_eq!((wr_id, &sges[..]), (want.wr_id, want.sgl.as_slice()));
        }
        assert!(expect.is_empty());
        assert!(
            refused > 0,
            "the ring was full at times: posts of part of a list"
        );
        assert!(next > 40);
        assert_eq!(
            rings.sq.lists.slots(),
            0,
            "every list left with its request"
        );
    }

    #[test]
    fn completions_fill_the_callers_slice_in_order_and_wake_a_waiter() {
        let (mut cq, mut w) = cq_ring(0, 8, HostSpin::default());
        assert_eq!(w.unreserved(), 8);
        for i in 0..5 {
            w.reserve();
            assert!(w.push(wc(i)));
        }
        w.publish();
        let mut out = [WorkCompletion::EMPTY; 3];
        assert_eq!(cq.poll(&mut out), 3);
        assert_eq!(out.map(|c| c.wr_id), [0, 1, 2]);
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!(out[..2].iter().map(|c| c.wr_id).collect::<Vec<_>>(), [3, 4]);
        let worker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            w.reserve();
            w.push(wc(42));
            w.publish();
            w
        });
        let got = cq.wait_one(Duration::from_secs(10));
        assert_eq!(got.map(|c| c.wr_id), Some(42));
        worker.join().unwrap();
        assert_eq!(cq.wait_one(Duration::from_millis(1)), None);
    }

    #[test]
    fn reservations_keep_room_for_every_completion_promised() {
        let (mut cq, mut w) = cq_ring(0, 2, HostSpin::default());
        w.reserve();
        w.reserve();
        assert_eq!(w.unreserved(), 0, "no third request may be taken");
        assert!(w.push(wc(1)));
        assert!(w.push(wc(2)));
        assert_eq!(w.unreserved(), 0, "both slots hold unpolled completions");
        assert_eq!(cq.poll_one().map(|c| c.wr_id), Some(1));
        assert_eq!(w.unreserved(), 1);
    }

    #[test]
    fn room_asked_of_the_slots_seen_last_is_never_more_than_the_ring_has() {
        let (mut cq, mut w) = cq_ring(0, 3, HostSpin::default());
        assert!(w.has_room(3), "an empty ring, read");
        assert!(!w.has_room(4));
        w.reserve();
        w.reserve();
        assert!(w.has_room(1) && !w.has_room(2), "two promised");
        assert!(w.push(wc(1)));
        assert!(w.push(wc(2)));
        // Two slots hold unpolled completions: one is free, seen without a read.
        assert!(w.has_room(1) && !w.has_room(2));
        w.reserve();
        assert!(w.push(wc(3)));
        assert!(!w.has_room(1), "full");
        // The host polls: the ring is read again when the slots seen fall short.
        assert_eq!(cq.poll_one().map(|c| c.wr_id), Some(1));
        assert_eq!(cq.poll_one().map(|c| c.wr_id), Some(2));
        assert!(w.has_room(2) && !w.has_room(3));
    }

    /// Runs of completions pushed at once, across the ring's wrap (the chunk's second
    /// slice): every one comes out, whole and in order, and what does not fit is reported.
    #[test]
    fn runs_of_completions_cross_the_ring_s_wrap_whole_and_in_order() {
        let (mut cq, mut w) = cq_ring(0, 8, HostSpin::default());
        let full = |i: u64| WorkCompletion {
            qpn: 0x11 + i as u32,
            byte_len: 100 + i as u32,
            imm_data: (i % 2 == 1).then_some(i as u32),
            opcode: if i.is_multiple_of(3) {
                WcOpcode::Recv
            } else {
                WcOpcode::RdmaWrite
            },
            ..wc(i)
        };
        let mut next = 0u64;
        let mut seen = Vec::new();
        let mut out = [WorkCompletion::EMPTY; 8];
        // Runs of 5 into 8 slots, polled in between: the head moves round, and from the
        // second run on each one wraps.
        for _ in 0..6 {
            let run: Vec<WorkCompletion> = (next..next + 5).map(full).collect();
            next += 5;
            assert_eq!(w.push_all(&run), 0);
            w.publish();
            let n = cq.poll(&mut out);
            seen.extend_from_slice(&out[..n]);
        }
        assert_eq!(seen, (0..next).map(full).collect::<Vec<_>>());
        // 10 into 8 free slots: 2 refused, the 8 whole.
        let run: Vec<WorkCompletion> = (100..110).map(full).collect();
        assert_eq!(w.push_all(&run), 2);
        w.publish();
        assert_eq!(cq.poll(&mut out), 8);
        assert_eq!(out.to_vec(), run[..8].to_vec());
    }
}
