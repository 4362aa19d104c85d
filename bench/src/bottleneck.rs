//! The bottleneck emulator: one congested switch egress port in software, shared by every flow
//! through it, so that congestion control schemes are compared on the same queue.
//!
//! A frame offered to the bottleneck waits in a byte-counted FIFO, is served at `rate_bps`
//! (its length plus the per-frame wire overhead: preamble, SFD, IFG and FCS), then spends
//! `delay_ns` in a delay line before [`Bottleneck::poll`] hands it back. A frame that would take
//! the queue past `buffer_bytes` is dropped at the tail.
//!
//! Why not DPDK's `rte_red`: it counts packets and marks on an averaged queue, while the switch
//! models the DCQCN and HPCC evaluations use (HPCC's ns-3 `SwitchMmu::ShouldSendCN`) decide at
//! dequeue on the *instantaneous* egress bytes. This module does the latter, so results line up
//! with theirs: a departing ECT frame is marked CE when the queue, counting itself, is above
//! Kmax; with probability Pmax·(q−Kmin)/(Kmax−Kmin) between Kmin and Kmax; never at or below
//! Kmin.
//!
//! Time is simulated and integer: callers pass `now` in ns and every departure between two calls
//! happens at its exact instant, whatever the call granularity. Departures are kept as whole
//! ns plus a remainder in units of 1/`rate_bps` ns, so a long busy period does not drift at
//! rates whose frame times are not whole ns. An event scheduled at a fractional instant becomes
//! visible at the next whole ns.
//!
//! The offer/poll path runs per packet on a DPDK worker: everything it touches (the ring of
//! frames, the queue histogram, the trace) is allocated by [`Bottleneck::new`] and
//! [`Bottleneck::with_trace`]. The item type is generic so that the dataplane queues mbufs and
//! tests queue plain values.

use std::collections::VecDeque;

use hdrhistogram::Histogram;
use serde::Serialize;

use portico::rng::SplitMix64;

/// HPCC's ns-3 presets give thresholds in KB of 1000 bytes.
const KB: u64 = 1000;
const NS_PER_S: u64 = 1_000_000_000;
/// Highest `rate_bps` accepted (1 Pbit/s): keeps the exact-time arithmetic within `u64`.
pub const MAX_RATE_BPS: u64 = 1_000_000_000_000_000;

/// Configuration; all sizes in bytes, times in ns.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BottleneckConfig {
    /// Service rate in bits per second, in `1..=MAX_RATE_BPS`.
    pub rate_bps: u64,
    /// Queue capacity: a frame that would take the queue past it is dropped (drop-tail).
    pub buffer_bytes: u64,
    /// At or below Kmin bytes of queue no frame is marked.
    pub kmin_bytes: u64,
    /// Above Kmax bytes of queue every ECT frame is marked; `kmin_bytes <= kmax_bytes`.
    pub kmax_bytes: u64,
    /// Marking probability reached at Kmax, in `0.0..=1.0`.
    pub pmax: f64,
    /// One-way delay added after service (a delay line); sets the RTT.
    pub delay_ns: u64,
    /// Per-frame wire overhead counted in the service time, not in the queue: 24 is preamble
    /// and SFD (8), inter-frame gap (12) and FCS (4) around a frame counted without its FCS.
    pub overhead_bytes: u32,
    /// Seed of the marking randomness.
    pub seed: u64,
}

impl BottleneckConfig {
    /// Defaults for a given rate: Kmin and Kmax scaled like HPCC's ns-3 presets (100 KB and
    /// 400 KB at 25 Gbit/s, i.e. Kmin 4 KB and Kmax 16 KB per Gbit/s, KB = 1000 bytes), Pmax 0.2,
    /// no delay, 24 bytes of overhead, a buffer of 4 × Kmax, seed 1.
    pub fn for_rate(rate_bps: u64) -> Self {
        let per_gbps = |bytes: u64| u128::from(rate_bps) * u128::from(bytes) / 1_000_000_000;
        let kmin = u64::try_from(per_gbps(4 * KB)).unwrap_or(u64::MAX);
        let kmax = u64::try_from(per_gbps(16 * KB)).unwrap_or(u64::MAX);
        BottleneckConfig {
            rate_bps,
            buffer_bytes: kmax.saturating_mul(4),
            kmin_bytes: kmin,
            kmax_bytes: kmax,
            pmax: 0.2,
            delay_ns: 0,
            overhead_bytes: 24,
            seed: 1,
        }
    }

    /// Checks ranges; the error names the field.
    pub fn validate(&self) -> Result<(), BadBottleneck> {
        if self.rate_bps == 0 || self.rate_bps > MAX_RATE_BPS {
            return Err(bad("rate_bps", "must be in 1..=1e15 bit/s"));
        }
        if self.buffer_bytes == 0 {
            return Err(bad("buffer_bytes", "must be > 0"));
        }
        if self.kmin_bytes > self.kmax_bytes {
            return Err(bad("kmax_bytes", "must be >= kmin_bytes"));
        }
        // Written so that NaN fails too.
        if !(0.0..=1.0).contains(&self.pmax) {
            return Err(bad("pmax", "must be in 0.0..=1.0"));
        }
        Ok(())
    }
}

/// A bottleneck configuration out of range, naming the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("bottleneck {field}: {reason}")]
pub struct BadBottleneck {
    pub field: &'static str,
    pub reason: &'static str,
}

fn bad(field: &'static str, reason: &'static str) -> BadBottleneck {
    BadBottleneck { field, reason }
}

portico::counter_set! {
    /// What went through the bottleneck so far. `arrived` counts every offer, drops included,
    /// so `arrived = delivered + dropped + held` for packets and bytes (see
    /// [`Bottleneck::held_packets`]).
    pub struct BottleneckCounters, slots BottleneckSlot {
        /// Frames offered to the bottleneck, drops included.
        arrived_packets: Sum,
        /// Their bytes.
        arrived_bytes: Sum,
        /// Handed out by [`Bottleneck::poll`].
        delivered_packets: Sum,
        /// Their bytes.
        delivered_bytes: Sum,
        /// Frames marked CE at departure (those still in the delay line included).
        marked: Sum,
        /// Frames refused by drop-tail or because the item capacity was full.
        dropped: Sum,
        /// Their bytes.
        dropped_bytes: Sum,
        /// Largest queue (bytes waiting for or in service) there has been.
        max_queue_bytes: Max,
    }
}

/// Per-bin record of what happened at the bottleneck, preallocated by
/// [`Bottleneck::with_trace`]. Bin `b` covers `[b·bin_ns, (b+1)·bin_ns)` of simulated time; an
/// event lands in the bin of its instant (a departure at the whole ns it is visible).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Trace {
    pub bin_ns: u64,
    pub bins: usize,
    pub flows: usize,
    /// `bins × flows`, index `b·flows + f`: bytes of flow `f` offered in bin `b`, drops
    /// included.
    pub arrived: Vec<u64>,
    /// Per bin: bytes that finished service.
    pub departed: Vec<u64>,
    /// Per bin: the largest queue seen at an event, 0 if none: after an arrival (enqueued or
    /// dropped), and at a departure with the departing frame still counted. With at least one
    /// event in the bin that is the largest queue the bin had at any instant.
    pub queue_max: Vec<u32>,
    /// Per bin: frames marked CE at departure.
    pub marks: Vec<u32>,
    /// Per bin: frames dropped at arrival.
    pub drops: Vec<u32>,
    /// Arrivals and departures past the last bin, not recorded in the bins.
    pub overflow: u64,
}

impl Trace {
    fn new(bin_ns: u64, bins: usize, flows: usize) -> Self {
        assert!(bin_ns > 0, "trace bins must be at least 1 ns");
        let cells = bins
            .checked_mul(flows)
            .expect("trace bins × flows fits in memory");
        Trace {
            bin_ns,
            bins,
            flows,
            arrived: vec![0; cells],
            departed: vec![0; bins],
            queue_max: vec![0; bins],
            marks: vec![0; bins],
            drops: vec![0; bins],
            overflow: 0,
        }
    }

    /// Bytes of `flow` offered in `bin`.
    pub fn arrived_bytes(&self, bin: usize, flow: usize) -> u64 {
        self.arrived[bin * self.flows + flow]
    }

    /// The bin an event at `t` lands in, or `None` (counted as overflow) past the last one.
    fn bin(&mut self, t: u64) -> Option<usize> {
        match usize::try_from(t / self.bin_ns) {
            Ok(b) if b < self.bins => Some(b),
            _ => {
                self.overflow += 1;
                None
            }
        }
    }

    fn see_queue(&mut self, b: usize, queue_bytes: u64) {
        let q = u32::try_from(queue_bytes).unwrap_or(u32::MAX);
        self.queue_max[b] = self.queue_max[b].max(q);
    }

    fn arrival(&mut self, t: u64, flow: usize, bytes: u64, queue_after: u64, dropped: bool) {
        let Some(b) = self.bin(t) else {
            return;
        };
        if flow < self.flows {
            self.arrived[b * self.flows + flow] += bytes;
        }
        self.see_queue(b, queue_after);
        if dropped {
            self.drops[b] = self.drops[b].saturating_add(1);
        }
    }

    fn departure(&mut self, t: u64, bytes: u64, queue: u64, marked: bool) {
        let Some(b) = self.bin(t) else {
            return;
        };
        self.departed[b] += bytes;
        self.see_queue(b, queue);
        if marked {
            self.marks[b] = self.marks[b].saturating_add(1);
        }
    }
}

/// An exact instant: `ns` plus `frac`/`rate_bps` ns, `frac < rate_bps`. Ordering on the pair
/// is ordering in time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Exact {
    ns: u64,
    frac: u64,
}

impl Exact {
    /// The whole ns at which an event at this instant is visible.
    fn ceil_ns(self) -> u64 {
        self.ns.saturating_add(if self.frac != 0 { 1 } else { 0 })
    }
}

/// Whether an ECT frame departing with `q` bytes in the queue (itself included) is marked CE:
/// always above Kmax, never at or below Kmin, in between with probability rising linearly from
/// 0 to Pmax. Draws from `rng` only in between, so the draws depend on the queue alone.
fn mark_at(cfg: &BottleneckConfig, rng: &mut SplitMix64, q: u64) -> bool {
    if q > cfg.kmax_bytes {
        true
    } else if q > cfg.kmin_bytes {
        // Here kmax > kmin, so the division is defined.
        let p = cfg.pmax * (q - cfg.kmin_bytes) as f64 / (cfg.kmax_bytes - cfg.kmin_bytes) as f64;
        rng.next_unit() < p
    } else {
        false
    }
}

/// One frame in the ring: waiting, in service, or in the delay line.
struct Slot<T> {
    item: T,
    len: u32,
    /// ECN-capable transport: only these are marked.
    ect: bool,
    /// Decided at departure.
    marked: bool,
    /// Whole ns at which the frame has finished service.
    depart_ns: u64,
}

/// The emulated bottleneck port. See the module documentation.
pub struct Bottleneck<T> {
    cfg: BottleneckConfig,
    capacity: usize,
    /// Every frame held, oldest first: the first `in_delay` have departed and wait in the delay
    /// line, the rest wait for or are in service. One ring suffices because both stages are
    /// FIFO and a constant delay keeps departure order.
    slots: VecDeque<Slot<T>>,
    in_delay: usize,
    queue_bytes: u64,
    delay_bytes: u64,
    /// Exact departure of the last frame accepted: when the server is free again.
    busy_until: Exact,
    /// Latest `now` seen; earlier ones are taken as this.
    now: u64,
    rng: SplitMix64,
    counters: BottleneckCounters,
    /// Queue bytes seen by each arrival, before it is enqueued or dropped.
    arrival_queue: Histogram<u64>,
    trace: Option<Trace>,
}

impl<T> Bottleneck<T> {
    /// A bottleneck holding up to `capacity` frames at once (waiting, in service and in the
    /// delay line together), all preallocated; a frame beyond that is dropped and counted so.
    pub fn new(cfg: BottleneckConfig, capacity: usize) -> Result<Self, BadBottleneck> {
        cfg.validate()?;
        if capacity == 0 {
            return Err(bad("capacity", "must be > 0"));
        }
        // The queue never exceeds the buffer; two significant digits (1 % quantisation) keep
        // the histogram at a few KB whatever the buffer.
        let top = cfg.buffer_bytes.clamp(2, u64::MAX / 2);
        let arrival_queue =
            Histogram::new_with_bounds(1, top, 2).expect("bounds 1..=top with top >= 2 are valid");
        Ok(Bottleneck {
            cfg,
            capacity,
            slots: VecDeque::with_capacity(capacity),
            in_delay: 0,
            queue_bytes: 0,
            delay_bytes: 0,
            busy_until: Exact::default(),
            now: 0,
            rng: SplitMix64::new(cfg.seed),
            counters: BottleneckCounters::default(),
            arrival_queue,
            trace: None,
        })
    }

    /// Adds a per-bin trace of `bins` bins of `bin_ns` from time 0 for flows `0..flows`, all
    /// preallocated here.
    ///
    /// # Panics
    /// If `bin_ns` is 0.
    pub fn with_trace(mut self, bin_ns: u64, bins: usize, flows: usize) -> Self {
        self.trace = Some(Trace::new(bin_ns, bins, flows));
        self
    }

    /// A frame of `len` bytes arrives at `now`. The departures due by `now` happen first, so the
    /// arrival sees the exact queue; then drop-tail: if the queue plus `len` would exceed the
    /// buffer, or the item capacity is full, the frame is counted as dropped and handed back as
    /// `Err(item)`. Only `ect` (ECN-capable) frames are ever marked. `flow` indexes the trace;
    /// flows beyond it are counted in the totals only.
    pub fn offer(&mut self, now: u64, item: T, len: u32, ect: bool, flow: usize) -> Result<(), T> {
        let now = self.advance(now);
        let bytes = u64::from(len);
        self.counters.arrived_packets += 1;
        self.counters.arrived_bytes += bytes;
        // In range by construction: the queue stays within the buffer.
        self.arrival_queue.saturating_record(self.queue_bytes);
        let fits = self.queue_bytes + bytes <= self.cfg.buffer_bytes;
        if !fits || self.slots.len() >= self.capacity {
            self.counters.dropped += 1;
            self.counters.dropped_bytes += bytes;
            if let Some(trace) = &mut self.trace {
                trace.arrival(now, flow, bytes, self.queue_bytes, true);
            }
            return Err(item);
        }
        let start = self.busy_until.max(Exact { ns: now, frac: 0 });
        let depart = self.after_service(start, len);
        self.busy_until = depart;
        self.slots.push_back(Slot {
            item,
            len,
            ect,
            marked: false,
            depart_ns: depart.ceil_ns(),
        });
        self.queue_bytes += bytes;
        self.counters.max_queue_bytes = self.counters.max_queue_bytes.max(self.queue_bytes);
        if let Some(trace) = &mut self.trace {
            trace.arrival(now, flow, bytes, self.queue_bytes, false);
        }
        Ok(())
    }

    /// Advances to `now` and hands every frame whose release time (departure + delay) is at or
    /// before `now` to `f`, oldest first, with whether it was marked CE. `poll(u64::MAX, ..)`
    /// hands out everything held (to free mbufs at shutdown).
    pub fn poll(&mut self, now: u64, mut f: impl FnMut(T, bool)) {
        let now = self.advance(now);
        while self.in_delay > 0 {
            match self.slots.front() {
                Some(slot) if self.release_ns(slot) <= now => {}
                _ => break,
            }
            let Some(slot) = self.slots.pop_front() else {
                break;
            };
            self.in_delay -= 1;
            let bytes = u64::from(slot.len);
            self.delay_bytes -= bytes;
            self.counters.delivered_packets += 1;
            self.counters.delivered_bytes += bytes;
            f(slot.item, slot.marked);
        }
    }

    /// Bytes waiting for or in service (not those in the delay line).
    pub fn queue_bytes(&self) -> u64 {
        self.queue_bytes
    }

    /// How long a frame arriving now waits before its service ends, in ns: the bytes queued
    /// (frame overhead included) at the service rate.
    pub fn queue_delay_ns(&self) -> u64 {
        (u128::from(self.queue_bytes) * 8_000_000_000 / u128::from(self.cfg.rate_bps)) as u64
    }

    /// Bytes that finished service and wait in the delay line.
    pub fn delay_bytes(&self) -> u64 {
        self.delay_bytes
    }

    /// Frames held: queued, in service or in the delay line.
    pub fn held_packets(&self) -> usize {
        self.slots.len()
    }

    /// The earliest time at which [`Bottleneck::poll`] would hand something out.
    pub fn next_release(&self) -> Option<u64> {
        // Releases are in ring order, departed or not.
        self.slots.front().map(|slot| self.release_ns(slot))
    }

    pub fn counters(&self) -> BottleneckCounters {
        self.counters
    }

    /// The queue bytes at or below which `q` percent (0..=100) of the arrivals found the queue,
    /// drops included; two significant digits (the highest value of the histogram bucket).
    pub fn queue_percentile(&self, q: f64) -> u64 {
        self.arrival_queue.value_at_percentile(q)
    }

    pub fn trace(&self) -> Option<&Trace> {
        self.trace.as_ref()
    }

    pub fn config(&self) -> &BottleneckConfig {
        &self.cfg
    }

    fn release_ns(&self, slot: &Slot<T>) -> u64 {
        slot.depart_ns.saturating_add(self.cfg.delay_ns)
    }

    /// The exact instant a frame of `len` bytes starting service at `start` has left.
    fn after_service(&self, start: Exact, len: u32) -> Exact {
        let rate = self.cfg.rate_bps;
        let bits = (u64::from(len) + u64::from(self.cfg.overhead_bytes)) * 8;
        // Service time is bits·1e9/rate ns; the product overflows u64 only for frames of
        // gigabytes, so the u128 division is the rare path.
        let (whole, rem) = match bits.checked_mul(NS_PER_S) {
            Some(n) => (n / rate, n % rate),
            None => {
                let n = u128::from(bits) * u128::from(NS_PER_S);
                let rate = u128::from(rate);
                (
                    u64::try_from(n / rate).unwrap_or(u64::MAX),
                    (n % rate) as u64,
                )
            }
        };
        // Both remainders are below rate <= 1e15, so the sum cannot overflow.
        let mut frac = start.frac + rem;
        let mut ns = start.ns.saturating_add(whole);
        if frac >= rate {
            frac -= rate;
            ns = ns.saturating_add(1);
        }
        Exact { ns, frac }
    }

    /// Processes every departure due by `now` and returns the time the emulation is at.
    fn advance(&mut self, now: u64) -> u64 {
        let now = now.max(self.now);
        self.now = now;
        while let Some(slot) = self.slots.get_mut(self.in_delay) {
            if slot.depart_ns > now {
                break;
            }
            // Marking at dequeue on the instantaneous queue, the departing frame included. It is
            // exact however late this runs: an arrival first processes the departures due by its
            // time, so no frame arriving after this departure is in `queue_bytes` yet.
            if slot.ect && mark_at(&self.cfg, &mut self.rng, self.queue_bytes) {
                slot.marked = true;
                self.counters.marked += 1;
            }
            let bytes = u64::from(slot.len);
            if let Some(trace) = &mut self.trace {
                trace.departure(slot.depart_ns, bytes, self.queue_bytes, slot.marked);
            }
            self.queue_bytes -= bytes;
            self.delay_bytes += bytes;
            self.in_delay += 1;
        }
        now
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::test_runner::RngSeed;

    use super::*;

    /// A plain config: no overhead, no delay, marking out of the way unless a test sets it.
    fn plain(rate_bps: u64, buffer_bytes: u64) -> BottleneckConfig {
        BottleneckConfig {
            rate_bps,
            buffer_bytes,
            kmin_bytes: buffer_bytes,
            kmax_bytes: buffer_bytes,
            pmax: 0.0,
            delay_ns: 0,
            overhead_bytes: 0,
            seed: 1,
        }
    }

    /// Polls at every release time until nothing is held: (release time, item, marked).
    fn drain(b: &mut Bottleneck<u32>) -> Vec<(u64, u32, bool)> {
        let mut out = Vec::new();
        while let Some(t) = b.next_release() {
            b.poll(t, |item, marked| out.push((t, item, marked)));
        }
        out
    }

    #[test]
    fn for_rate_scales_like_hpcc_presets() {
        let c = BottleneckConfig::for_rate(25_000_000_000);
        assert_eq!(
            c,
            BottleneckConfig {
                rate_bps: 25_000_000_000,
                buffer_bytes: 1_600_000,
                kmin_bytes: 100_000,
                kmax_bytes: 400_000,
                pmax: 0.2,
                delay_ns: 0,
                overhead_bytes: 24,
                seed: 1,
            }
        );
        let c = BottleneckConfig::for_rate(100_000_000_000);
        assert_eq!(
            (c.kmin_bytes, c.kmax_bytes, c.buffer_bytes),
            (400_000, 1_600_000, 6_400_000)
        );
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn validation_names_each_bad_field() {
        let good = BottleneckConfig::for_rate(10_000_000_000);
        let field = |c: BottleneckConfig| c.validate().map_err(|e| e.field);
        assert_eq!(field(good), Ok(()));
        assert_eq!(
            field(BottleneckConfig {
                rate_bps: 0,
                ..good
            }),
            Err("rate_bps")
        );
        assert_eq!(
            field(BottleneckConfig {
                rate_bps: MAX_RATE_BPS + 1,
                ..good
            }),
            Err("rate_bps")
        );
        assert_eq!(
            field(BottleneckConfig {
                buffer_bytes: 0,
                ..good
            }),
            Err("buffer_bytes")
        );
        assert_eq!(
            field(BottleneckConfig {
                kmin_bytes: 2,
                kmax_bytes: 1,
                ..good
            }),
            Err("kmax_bytes")
        );
        for pmax in [-0.1, 1.01, f64::NAN] {
            assert_eq!(field(BottleneckConfig { pmax, ..good }), Err("pmax"));
        }
        // Kmin = Kmax is a step marker, and Pmax at both ends is allowed.
        for (k, pmax) in [(5, 0.0), (5, 1.0)] {
            let c = BottleneckConfig {
                kmin_bytes: k,
                kmax_bytes: k,
                pmax,
                ..good
            };
            assert_eq!(field(c), Ok(()));
        }
        assert_eq!(
            Bottleneck::<u32>::new(good, 0).err().map(|e| e.field),
            Some("capacity")
        );
        let err = Bottleneck::<u32>::new(BottleneckConfig { pmax: 2.0, ..good }, 8)
            .err()
            .expect("pmax out of range");
        assert_eq!(err.to_string(), "bottleneck pmax: must be in 0.0..=1.0");
    }

    #[test]
    fn back_to_back_frames_depart_exactly_800ns_apart() {
        // 1000 B at 10 Gbit/s: 8000 bits, 800 ns.
        let n = 10_000u32;
        let mut b = Bottleneck::new(plain(10_000_000_000, 100_000_000), n as usize).unwrap();
        for i in 0..n {
            b.offer(0, i, 1000, true, 0).unwrap();
        }
        assert_eq!(b.queue_bytes(), 10_000_000);
        let out = drain(&mut b);
        assert_eq!(out.len(), n as usize);
        for (i, &(t, item, _)) in out.iter().enumerate() {
            assert_eq!((t, item), (800 * (i as u64 + 1), i as u32));
        }
        assert_eq!(b.queue_bytes(), 0);
    }

    #[test]
    fn odd_rate_accumulates_no_drift() {
        // 1 B + 24 B of overhead at 3 Gbit/s: 200 bits, 200/3 ns each. The k-th departure is at
        // exactly 200k/3 ns, visible at the whole ns above it.
        let cfg = BottleneckConfig {
            overhead_bytes: 24,
            ..plain(3_000_000_000, 1_000_000)
        };
        let mut b = Bottleneck::new(cfg, 256).unwrap();
        // Keep the server busy: 100 frames queued, one more offered at each release.
        let total = 1_000_000u64;
        let mut offered = 0u64;
        while offered < 100 {
            b.offer(0, 0, 1, true, 0).unwrap();
            offered += 1;
        }
        let mut released = 0u64;
        while let Some(t) = b.next_release() {
            let mut n = 0;
            b.poll(t, |_, _| n += 1);
            assert_eq!(n, 1);
            released += 1;
            assert_eq!(t, (200 * released).div_ceil(3), "departure {released}");
            if offered < total {
                b.offer(t, 0, 1, true, 0).unwrap();
                offered += 1;
            }
        }
        assert_eq!(released, total);
        assert_eq!(b.counters().delivered_packets, total);
        // 2e8/3 ns = 66 666 666.67 ns.
        assert_eq!(b.next_release(), None);
        assert_eq!(b.busy_until.ceil_ns(), 66_666_667);
    }

    #[test]
    fn delay_line_releases_at_departure_plus_delay() {
        // 1000 B at 8 Gbit/s: 1000 ns of service, then 5000 ns of delay.
        let cfg = BottleneckConfig {
            delay_ns: 5000,
            ..plain(8_000_000_000, 100_000)
        };
        let mut b = Bottleneck::new(cfg, 8).unwrap();
        b.offer(0, 1, 1000, true, 0).unwrap();
        b.offer(0, 2, 1000, true, 0).unwrap();
        assert_eq!(b.next_release(), Some(6000));
        let mut got = Vec::new();
        b.poll(1500, |i, _| got.push(i));
        assert!(got.is_empty());
        // Frame 1 departed at 1000 and waits in the delay line; frame 2 is in service.
        assert_eq!((b.queue_bytes(), b.delay_bytes()), (1000, 1000));
        b.poll(5999, |i, _| got.push(i));
        assert!(got.is_empty());
        b.poll(6000, |i, _| got.push(i));
        assert_eq!(got, [1]);
        assert_eq!(b.next_release(), Some(7000));
        // The server has been idle since 2000: frame 3 starts at its arrival.
        b.offer(6500, 3, 1000, true, 0).unwrap();
        assert_eq!((b.queue_bytes(), b.delay_bytes()), (1000, 1000));
        assert_eq!(drain(&mut b), [(7000, 2, false), (12_500, 3, false)]);
    }

    #[test]
    fn fifo_order_is_kept_for_mixed_sizes_and_times() {
        let cfg = BottleneckConfig {
            delay_ns: 3000,
            overhead_bytes: 24,
            ..plain(7_000_000_000, 10_000_000)
        };
        let mut b = Bottleneck::new(cfg, 1024).unwrap();
        let mut now = 0;
        let mut out = Vec::new();
        for i in 0..1000u32 {
            // Gaps from 0 to 2 µs and lengths from 64 to 1500 B, in a scrambled order.
            now += u64::from(i * 104_729 % 2000);
            let len = 64 + i * 7919 % 1437;
            b.offer(now, i, len, true, 0).unwrap();
            if i % 7 == 0 {
                b.poll(now, |item, _| out.push(item));
            }
        }
        out.extend(drain(&mut b).into_iter().map(|(_, item, _)| item));
        assert_eq!(out, (0..1000).collect::<Vec<u32>>());
    }

    #[test]
    fn drop_tail_accepts_a_frame_that_exactly_fills_the_buffer() {
        let mut b = Bottleneck::new(plain(8_000_000_000, 3000), 8).unwrap();
        assert_eq!(b.offer(0, 1, 1000, true, 0), Ok(()));
        assert_eq!(b.offer(0, 2, 2000, true, 0), Ok(()));
        assert_eq!(b.queue_bytes(), 3000);
        // One byte more than the buffer holds.
        assert_eq!(b.offer(0, 3, 1, true, 0), Err(3));
        // Frame 1 leaves at 1000 ns; an arrival at that instant sees 2000 bytes.
        assert_eq!(b.offer(1000, 4, 1001, true, 0), Err(4));
        assert_eq!(b.offer(1000, 5, 1000, true, 0), Ok(()));
        assert_eq!(
            b.counters(),
            BottleneckCounters {
                arrived_packets: 5,
                arrived_bytes: 5002,
                delivered_packets: 0,
                delivered_bytes: 0,
                marked: 0,
                dropped: 2,
                dropped_bytes: 1002,
                max_queue_bytes: 3000,
            }
        );
        // A frame larger than the whole buffer never fits.
        let mut b = Bottleneck::new(plain(8_000_000_000, 3000), 8).unwrap();
        assert_eq!(b.offer(0, 6, 3001, true, 0), Err(6));
    }

    #[test]
    fn full_item_capacity_drops_until_poll_frees_a_slot() {
        let cfg = BottleneckConfig {
            delay_ns: 10_000,
            ..plain(8_000_000_000, 1_000_000)
        };
        let mut b = Bottleneck::new(cfg, 2).unwrap();
        assert_eq!(b.offer(0, 1, 1000, true, 0), Ok(()));
        assert_eq!(b.offer(0, 2, 1000, true, 0), Ok(()));
        assert_eq!(b.offer(0, 3, 1000, true, 0), Err(3));
        // Both have left the queue at 3000 ns but still occupy the delay line.
        assert_eq!(b.offer(3000, 4, 1000, true, 0), Err(4));
        assert_eq!(b.queue_bytes(), 0);
        let mut got = Vec::new();
        b.poll(11_000, |i, _| got.push(i));
        assert_eq!(got, [1]);
        assert_eq!(b.offer(11_000, 5, 1000, true, 0), Ok(()));
        let c = b.counters();
        assert_eq!((c.dropped, c.dropped_bytes), (2, 2000));
    }

    /// Holds the queue at `depth` frames of 1000 B (8 Gbit/s, 1000 ns each): one frame is offered
    /// at every departure, after it, so every departure sees `depth` × 1000 bytes. Returns which
    /// of `departures` departures were marked.
    fn marks_at_held_depth(
        cfg: BottleneckConfig,
        depth: u32,
        departures: usize,
        ect: bool,
    ) -> Vec<bool> {
        let cfg = BottleneckConfig {
            rate_bps: 8_000_000_000,
            buffer_bytes: 10_000_000,
            overhead_bytes: 0,
            delay_ns: 0,
            ..cfg
        };
        let mut b = Bottleneck::new(cfg, depth as usize + 1).unwrap();
        for i in 0..depth {
            b.offer(0, i, 1000, ect, 0).unwrap();
        }
        let mut marks = Vec::with_capacity(departures);
        while marks.len() < departures {
            let t = b.next_release().unwrap();
            assert_eq!(b.queue_bytes(), u64::from(depth) * 1000);
            b.poll(t, |_, marked| marks.push(marked));
            b.offer(t, 0, 1000, ect, 0).unwrap();
        }
        assert_eq!(
            b.counters().marked,
            marks.iter().filter(|&&m| m).count() as u64
        );
        marks
    }

    fn count(marks: &[bool]) -> usize {
        marks.iter().filter(|&&m| m).count()
    }

    fn ramp(kmin_bytes: u64, kmax_bytes: u64, pmax: f64, seed: u64) -> BottleneckConfig {
        BottleneckConfig {
            kmin_bytes,
            kmax_bytes,
            pmax,
            seed,
            ..plain(8_000_000_000, 10_000_000)
        }
    }

    #[test]
    fn never_marked_at_or_below_kmin() {
        // 30 000 bytes at each departure, Kmin exactly there, Pmax 1.
        let marks = marks_at_held_depth(ramp(30_000, 60_000, 1.0, 1), 30, 10_000, true);
        assert_eq!(count(&marks), 0);
        let marks = marks_at_held_depth(ramp(31_000, 60_000, 1.0, 1), 30, 10_000, true);
        assert_eq!(count(&marks), 0);
    }

    #[test]
    fn always_marked_above_kmax() {
        // One byte above Kmax, Pmax 0: the ramp does not matter there.
        let marks = marks_at_held_depth(ramp(10_000, 29_999, 0.0, 1), 30, 10_000, true);
        assert_eq!(count(&marks), 10_000);
        // A step marker (Kmin = Kmax) marks above and never at the step.
        let marks = marks_at_held_depth(ramp(29_999, 29_999, 0.0, 1), 30, 1000, true);
        assert_eq!(count(&marks), 1000);
        let marks = marks_at_held_depth(ramp(30_000, 30_000, 1.0, 1), 30, 1000, true);
        assert_eq!(count(&marks), 0);
    }

    #[test]
    fn non_ect_frames_are_never_marked() {
        let marks = marks_at_held_depth(ramp(0, 0, 1.0, 1), 30, 10_000, false);
        assert_eq!(count(&marks), 0);
    }

    #[test]
    fn marked_fraction_between_kmin_and_kmax_follows_the_ramp() {
        // q = 30 000 between Kmin 10 000 and Kmax 50 000 with Pmax 0.2: p = 0.2 · 20/40 = 0.1.
        // Over n = 100 000 departures the count is binomial, sd = sqrt(n p (1-p)) ≈ 94.9; the
        // seeded run must land within 4 sd (±380) of n p, and its exact count pins the PRNG.
        let n = 100_000;
        let marked = count(&marks_at_held_depth(
            ramp(10_000, 50_000, 0.2, 1),
            30,
            n,
            true,
        ));
        assert!(marked.abs_diff(10_000) <= 380, "{marked}");
        assert_eq!(marked, 9912, "golden count for seed 1");
        // At Kmax itself p = Pmax = 0.2: sd ≈ 126.5, 4 sd = ±506.
        let marked = count(&marks_at_held_depth(
            ramp(10_000, 30_000, 0.2, 1),
            30,
            n,
            true,
        ));
        assert!(marked.abs_diff(20_000) <= 506, "{marked}");
        assert_eq!(marked, 19_928, "golden count for seed 1");
    }

    #[test]
    fn marks_are_determined_by_the_seed() {
        let cfg = ramp(10_000, 50_000, 0.2, 1);
        let a = marks_at_held_depth(cfg, 30, 10_000, true);
        assert_eq!(a, marks_at_held_depth(cfg, 30, 10_000, true));
        let b = marks_at_held_depth(BottleneckConfig { seed: 2, ..cfg }, 30, 10_000, true);
        assert_ne!(a, b);
    }

    #[test]
    fn marks_do_not_depend_on_poll_granularity() {
        // The same arrivals polled once at the end or at every ns give the same marks: the
        // queue each departure sees is exact either way.
        let cfg = BottleneckConfig {
            overhead_bytes: 24,
            ..ramp(2_000, 12_000, 0.5, 3)
        };
        let arrivals: Vec<(u64, u32)> = (0..400u32)
            .map(|i| {
                (
                    u64::from(i) * 600 + u64::from(i * 7919 % 500),
                    200 + i * 104_729 % 1300,
                )
            })
            .collect();
        let run = |poll_every_ns: bool| {
            let mut b = Bottleneck::new(cfg, 512).unwrap();
            let mut out = Vec::new();
            let mut t = 0;
            for &(at, len) in &arrivals {
                if poll_every_ns {
                    while t < at {
                        b.poll(t, |i, m| out.push((i, m)));
                        t += 1;
                    }
                }
                b.offer(at, len, len, true, 0).unwrap();
            }
            b.poll(u64::MAX, |i, m| out.push((i, m)));
            (out, b.counters())
        };
        let (coarse, c1) = run(false);
        let (fine, c2) = run(true);
        assert_eq!(coarse, fine);
        assert_eq!(c1, c2);
        assert!(c1.marked > 0 && c1.marked < 400, "{}", c1.marked);
    }

    #[test]
    fn hdrhistogram_records_zero_with_lowest_bound_one() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 1000, 2).unwrap();
        h.record(0).unwrap();
        h.record(0).unwrap();
        h.record(7).unwrap();
        assert_eq!((h.len(), h.min(), h.count_at(0)), (3, 0, 2));
        assert_eq!(h.value_at_percentile(50.0), 0);
        assert_eq!(h.value_at_percentile(100.0), 7);
    }

    #[test]
    fn queue_percentile_of_a_known_sequence() {
        // 50 B at 0.8 Gbit/s: 500 ns each. Four arrivals at 0 see 0, 50, 100 and 150 bytes; one
        // at 10 µs, when all have left, sees 0; at 20 µs a 200 B frame sees 0 and a 51 B one,
        // dropped (200 + 51 > 250), sees 200. Below 256 the histogram is exact.
        let mut b = Bottleneck::new(plain(800_000_000, 250), 8).unwrap();
        for i in 0..4 {
            b.offer(0, i, 50, true, 0).unwrap();
        }
        b.offer(10_000, 4, 50, true, 0).unwrap();
        b.offer(20_000, 5, 200, true, 0).unwrap();
        assert_eq!(b.offer(20_000, 6, 51, true, 0), Err(6));
        // Sorted: 0, 0, 0, 50, 100, 150, 200; the value at q is the ceil(q·7/100)-th.
        assert_eq!(b.arrival_queue.len(), 7);
        let p = |q| b.queue_percentile(q);
        assert_eq!(
            [
                p(0.0),
                p(40.0),
                p(50.0),
                p(60.0),
                p(80.0),
                p(90.0),
                p(100.0)
            ],
            [0, 0, 50, 100, 150, 200, 200]
        );
    }

    #[test]
    fn queue_percentile_is_quantised_to_two_significant_digits() {
        // 300 frames of 1000 B queued at once; the 301st arrival sees 300 000 bytes, which the
        // histogram holds in the bucket 299 008..=301 055 (steps of 2048 above 2^18).
        let mut b = Bottleneck::new(plain(8_000_000_000, 400_000), 512).unwrap();
        for i in 0..301 {
            b.offer(0, i, 1000, true, 0).unwrap();
        }
        assert_eq!(b.queue_percentile(100.0), 301_055);
        assert_eq!(b.queue_percentile(0.0), 0);
    }

    #[test]
    fn trace_bins_events_by_their_time() {
        // 8 Gbit/s, 1 µs bins, 3 bins, flows 0 and 1; CE above 1000 bytes only (Pmax 0).
        let cfg = BottleneckConfig {
            kmin_bytes: 0,
            kmax_bytes: 1000,
            ..plain(8_000_000_000, 3000)
        };
        let mut b = Bottleneck::new(cfg, 8).unwrap().with_trace(1000, 3, 2);
        b.offer(0, 1, 1000, true, 0).unwrap(); // departs at 1000 seeing 2500: CE
        b.offer(0, 2, 1000, true, 1).unwrap(); // departs at 2000 seeing 1500: CE
        assert_eq!(b.offer(500, 3, 1500, true, 1), Err(3)); // 2000 + 1500 > 3000
        b.offer(500, 4, 500, true, 5).unwrap(); // no such flow; departs at 2500 seeing 500
        b.poll(3000, |_, _| {});
        b.offer(3000, 5, 1000, true, 0).unwrap(); // past the last bin, and so is its departure
        assert_eq!(drain(&mut b).len(), 1);
        let t = b.trace().unwrap();
        assert_eq!(t.arrived, [1000, 2500, 0, 0, 0, 0]);
        assert_eq!(t.arrived_bytes(0, 1), 2500);
        assert_eq!(t.departed, [0, 1000, 1500]);
        assert_eq!(t.queue_max, [2500, 2500, 1500]);
        assert_eq!(t.marks, [0, 1, 1]);
        assert_eq!(t.drops, [1, 0, 0]);
        assert_eq!(t.overflow, 2);
        assert_eq!(b.counters().marked, 2);
    }

    /// One step of random traffic: an offer (or only a poll) `dt` ns after the last step.
    #[derive(Debug, Clone)]
    struct Step {
        dt: u64,
        len: u32,
        ect: bool,
        flow: usize,
        poll_only: bool,
    }

    fn step() -> impl Strategy<Value = Step> {
        (
            0u64..3000,
            1u32..2000,
            any::<bool>(),
            0usize..5,
            proptest::bool::weighted(0.2),
        )
            .prop_map(|(dt, len, ect, flow, poll_only)| Step {
                dt,
                len,
                ect,
                flow,
                poll_only,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 200,
            rng_seed: RngSeed::Fixed(0x00b0_771e),
            ..ProptestConfig::default()
        })]

        /// Nothing is created or lost: every frame offered is delivered, dropped or still held,
        /// after every call; and the trace adds up to the counters.
        #[test]
        fn counters_conserve_frames_and_the_trace_adds_up(
            steps in proptest::collection::vec(step(), 1..300),
            capacity in 1usize..40,
        ) {
            let cfg = BottleneckConfig {
                delay_ns: 2500,
                overhead_bytes: 24,
                ..ramp(4000, 12_000, 0.5, 9)
            };
            let cfg = BottleneckConfig { buffer_bytes: 20_000, ..cfg };
            // 1 µs bins over 2 ms: more than the steps and the drain can take.
            let mut b = Bottleneck::new(cfg, capacity).unwrap().with_trace(1000, 2000, 4);
            let mut now = 0;
            let mut untraced_flow_bytes = 0;
            let check = |b: &Bottleneck<u32>| {
                let c = b.counters();
                prop_assert_eq!(
                    c.arrived_packets,
                    c.delivered_packets + c.dropped + b.held_packets() as u64
                );
                prop_assert_eq!(
                    c.arrived_bytes,
                    c.delivered_bytes + c.dropped_bytes + b.queue_bytes() + b.delay_bytes()
                );
                prop_assert!(b.queue_bytes() <= cfg.buffer_bytes);
                prop_assert!(b.queue_bytes() <= c.max_queue_bytes);
                prop_assert!(b.held_packets() <= capacity);
                Ok(())
            };
            for s in &steps {
                now += s.dt;
                if s.poll_only {
                    b.poll(now, |_, _| {});
                } else {
                    if s.flow >= 4 {
                        untraced_flow_bytes += u64::from(s.len);
                    }
                    let _ = b.offer(now, 0, s.len, s.ect, s.flow);
                }
                check(&b)?;
            }
            b.poll(u64::MAX, |_, _| {});
            check(&b)?;
            prop_assert_eq!(b.held_packets(), 0);
            let c = b.counters();
            prop_assert_eq!(b.arrival_queue.len(), c.arrived_packets);
            let t = b.trace().unwrap();
            prop_assert_eq!(t.overflow, 0);
            prop_assert_eq!(t.arrived.iter().sum::<u64>() + untraced_flow_bytes, c.arrived_bytes);
            prop_assert_eq!(t.departed.iter().sum::<u64>(), c.delivered_bytes);
            prop_assert_eq!(t.marks.iter().map(|&m| u64::from(m)).sum::<u64>(), c.marked);
            prop_assert_eq!(t.drops.iter().map(|&d| u64::from(d)).sum::<u64>(), c.dropped);
            prop_assert_eq!(t.queue_max.iter().map(|&q| u64::from(q)).max(), Some(c.max_queue_bytes));
        }
    }

    /// Four flows each at 10 Gbit/s into a 10 Gbit/s bottleneck for 100 µs: every 800 ns each
    /// flow offers 1000 B (no overhead), all four at the same instant. Returns the queue found
    /// before each group of four, after the departure due at that instant.
    fn incast(b: &mut Bottleneck<u32>) -> Vec<u64> {
        let mut before = Vec::new();
        for k in 0..125u64 {
            let t = 800 * k;
            b.poll(t, |_, _| {});
            before.push(b.queue_bytes());
            for flow in 0..4 {
                let _ = b.offer(t, flow as u32, 1000, true, flow);
            }
        }
        before
    }

    fn ten_gbps(buffer_bytes: u64) -> BottleneckConfig {
        BottleneckConfig {
            buffer_bytes,
            overhead_bytes: 0,
            ..BottleneckConfig::for_rate(10_000_000_000)
        }
    }

    #[test]
    fn incast_queue_grows_at_30_gbps_and_departures_keep_the_line_rate() {
        // 640 KB of buffer (the 10 Gbit/s default) is not reached in 100 µs.
        let mut b = Bottleneck::new(ten_gbps(640_000), 1024)
            .unwrap()
            .with_trace(8000, 13, 4);
        let before = incast(&mut b);
        // 4000 B in and 1000 B out per 800 ns: 3000 B per 800 ns is 30 Gbit/s.
        for (k, &q) in before.iter().enumerate() {
            assert_eq!(q, 3000 * k as u64, "group {k}");
        }
        // At 100 µs: 30 Gbit/s × 100 µs = 375 000 bytes.
        b.poll(100_000, |_, _| {});
        assert_eq!(b.queue_bytes(), 375_000);
        b.poll(103_999, |_, _| {});
        let t = b.trace().unwrap();
        // 10 Gbit/s × 8 µs = 10 000 bytes a bin; bin 0 loses the first 800 ns of service.
        let mut line_rate = [10_000u64; 13];
        line_rate[0] = 9000;
        assert_eq!(t.departed, line_rate);
        for flow in 0..4 {
            let arrived: Vec<u64> = (0..13).map(|bin| t.arrived_bytes(bin, flow)).collect();
            let mut offered = [10_000u64; 13];
            offered[12] = 5000;
            assert_eq!(arrived, offered, "flow {flow}");
        }
        assert_eq!(t.overflow, 0);
        let c = b.counters();
        assert_eq!(
            (c.arrived_packets, c.dropped, c.max_queue_bytes),
            (500, 0, 376_000)
        );
    }

    #[test]
    fn incast_fills_the_buffer_then_drops_at_the_tail() {
        let mut b = Bottleneck::new(ten_gbps(100_000), 1024).unwrap();
        let before = incast(&mut b);
        // Growth at 30 Gbit/s until the group at 25.6 µs fills the 100 000 B exactly; from
        // then on one departure per 800 ns makes room for one of the four frames.
        for (k, &q) in before.iter().enumerate() {
            assert_eq!(q, (3000 * k as u64).min(99_000), "group {k}");
        }
        let c = b.counters();
        // Groups 33..=124 each drop three frames.
        assert_eq!((c.dropped, c.dropped_bytes), (276, 276_000));
        assert_eq!(c.max_queue_bytes, 100_000);
        assert_eq!(b.queue_bytes(), 100_000);
    }

    #[test]
    fn an_earlier_now_is_taken_as_the_latest_seen() {
        let mut b = Bottleneck::new(plain(8_000_000_000, 100_000), 8).unwrap();
        b.offer(5000, 1, 1000, true, 0).unwrap();
        b.offer(100, 2, 1000, true, 0).unwrap();
        assert_eq!(drain(&mut b), [(6000, 1, false), (7000, 2, false)]);
    }
}
