//! The benches' instrumentation around the engines' stage, outside the library: a stage that
//! wraps a loopback pair's [`RdmaStage`] ([`Instrumented`]) and adds
//! - an emulated bottleneck ([`Ingress`], [`crate::bottleneck`]) in front of one engine's
//!   receive path: every frame that input receives waits in it, is served at its rate, may be
//!   marked CE or dropped, and reaches the engine after its delay; the engine is told the
//!   queue's depth ([`portico::rdma::RdmaNode::set_ingress_queue`]);
//! - a probe of one engine's traffic shaper ([`ShaperProbe`]), sampled on every poll.
//!
//! The wrapper is its own stage type: the worker loop is compiled per concrete stage
//! ([`StageBox`]), so a pair without instrumentation runs the bare `RdmaStage`, with no branch
//! or indirection of the wrapper's on its packet path. [`wrap`] hands it to
//! [`LoopbackOpts::wrap`](portico::rdma::loopback::LoopbackOpts::wrap).

use std::sync::{Arc, Mutex, OnceLock};

use portico::dataplane::wake::Wake;
use portico::dataplane::{Burst, Mbuf};
use portico::rdma::loopback::{StageWrap, qpns};
use portico::rdma::{RdmaCounters, RdmaStage};
use portico::runtime::{Counters, Outlook, Outputs, Polling, STAGE_COUNTERS, Stage, StageBox};
use portico::wire::{self, Ecn};

use crate::bottleneck::{Bottleneck, BottleneckConfig, BottleneckCounters, BottleneckSlot, Trace};

/// A bottleneck in front of one engine's receive path ([`crate::bottleneck`]).
pub struct Ingress {
    /// The input (and engine) it sits in front of.
    pub input: usize,
    pub bottleneck: Bottleneck<Mbuf>,
    /// The trace's flow of each queue pair: `flows[i]` is the QPN (the BTH's destination QP
    /// as the engine receives it) of flow `i`.
    pub flows: Vec<u32>,
    /// Where the stage leaves what the bottleneck measured when it stops.
    pub report: Arc<Mutex<Option<IngressReport>>>,
    /// The senders whose controller rates are sampled into `rates`: QPNs on engine 0, one
    /// per flow (the flows' other ends).
    pub senders: Vec<u32>,
    /// Per bin of the trace and flow (`bin * flows + flow`): the lowest rate the sender's
    /// congestion controller had at the polls in the bin (0: not seen, or no controller).
    /// Preallocated.
    pub rates: Vec<u64>,
}

/// What a bottleneck measured over a run.
#[derive(Debug, Clone)]
pub struct IngressReport {
    pub counters: BottleneckCounters,
    pub queue_p50_bytes: u64,
    pub queue_p99_bytes: u64,
    pub trace: Option<Trace>,
    /// [`Ingress::rates`].
    pub rates: Vec<u64>,
    /// Per sender, when the stage stopped: its controller's counters and rate (`None`: no
    /// controller).
    pub senders: Vec<(portico::cc::CcStats, Option<u64>)>,
}

/// The bottleneck in front of engine B's receive path of a loopback pair: every connection's
/// A-to-B traffic shares it.
#[derive(Debug, Clone)]
pub struct BottleneckSpec {
    pub config: BottleneckConfig,
    /// Frames it may hold at once (queue and delay line).
    pub capacity: usize,
    /// A per-bin trace: bin length (ns) and bins; the flows are the connections.
    pub trace: Option<(u64, usize)>,
    /// Filled with what it measured when the worker stops.
    pub report: Arc<Mutex<Option<IngressReport>>>,
}

impl BottleneckSpec {
    /// The bottleneck for a pair of `connections` connections ([`qpns`]): in front of input 1
    /// (engine B), its flows B's ends, the senders A's.
    pub fn ingress(&self, connections: usize) -> Result<Ingress, String> {
        let connections = connections.max(1);
        let mut bn = Bottleneck::new(self.config, self.capacity).map_err(|e| e.to_string())?;
        if let Some((bin_ns, bins)) = self.trace {
            bn = bn.with_trace(bin_ns, bins, connections);
        }
        let bins = self.trace.map_or(0, |(_, bins)| bins);
        Ok(Ingress {
            input: 1,
            bottleneck: bn,
            flows: (0..connections).map(|i| qpns(i).1).collect(),
            report: self.report.clone(),
            senders: (0..connections).map(|i| qpns(i).0).collect(),
            rates: vec![0; bins * connections],
        })
    }

    /// [`wrap`] with this bottleneck (for `connections` connections) and `probe`.
    pub fn wrap(
        &self,
        connections: usize,
        probe: Option<ShaperProbe>,
    ) -> Result<StageWrap, String> {
        Ok(wrap(Some(self.ingress(connections)?), probe))
    }
}

/// Samples one engine's traffic shaper into per-bin series of worker time, and leaves its
/// counters when the stage stops (the shaper bench's figures and plot).
pub struct ShaperProbe {
    /// The engine whose shaper it reads.
    pub engine: usize,
    pub bin_ns: u64,
    pub bins: usize,
    /// Where the stage leaves what it sampled when it stops.
    pub report: Arc<Mutex<Option<ShaperReport>>>,
    /// bins × classes (`bin * classes + class`): the class's bytes sent and response bytes
    /// pulled in so far, as last seen in the bin (0: no poll in the bin). Preallocated.
    sent: Vec<u64>,
    pulled: Vec<u64>,
}

impl ShaperProbe {
    pub fn new(
        engine: usize,
        bin_ns: u64,
        bins: usize,
        classes: usize,
        report: Arc<Mutex<Option<ShaperReport>>>,
    ) -> ShaperProbe {
        ShaperProbe {
            engine,
            bin_ns: bin_ns.max(1),
            bins,
            report,
            sent: vec![0; bins * classes],
            pulled: vec![0; bins * classes],
        }
    }
}

/// What a [`ShaperProbe`] saw: the shaper's counters at the end, per class and per MCU, and
/// the series of cumulative bytes (a bin with no poll carries the bin before it).
#[derive(Debug, Clone, Default)]
pub struct ShaperReport {
    pub classes: Vec<portico::shaper::Counters>,
    pub mcus: Vec<portico::shaper::Counters>,
    pub bin_ns: u64,
    pub bins: usize,
    /// bins × classes: bytes the class sent by the end of the bin.
    pub sent: Vec<u64>,
    /// bins × classes: response bytes the class's requests pulled in by the end of the bin.
    pub pulled: Vec<u64>,
}

/// The flow of a frame: the index of its destination QP in `flows`, or `flows.len()`.
fn flow_of(frame: &[u8], flows: &[u32]) -> usize {
    const DEST_QP: usize = wire::roce::BASE_HEADER_LEN - 12 + 5;
    let Some(q) = frame.get(DEST_QP..DEST_QP + 3) else {
        return flows.len();
    };
    let qpn = u32::from_be_bytes([0, q[0], q[1], q[2]]);
    flows.iter().position(|&f| f == qpn).unwrap_or(flows.len())
}

/// Whether an IPv4 frame is ECN-capable (ECT(0), ECT(1) or already CE).
fn ect(frame: &[u8]) -> bool {
    frame.len() > 15 && frame[12..14] == [0x08, 0x00] && frame[15] & 3 != 0
}

/// Marks an IPv4 frame CE and mends its header checksum (RFC 1624), as a switch does; the
/// ICRC does not cover either.
fn mark_ce(frame: &mut [u8]) {
    if frame.len() < 34 {
        return;
    }
    let old = u16::from_be_bytes([frame[14], frame[15]]);
    frame[15] |= Ecn::Ce.bits();
    let new = u16::from_be_bytes([frame[14], frame[15]]);
    let sum = u16::from_be_bytes([frame[24], frame[25]]);
    // HC' = ~(~HC + ~m + m')
    let mut acc = u32::from(!sum) + u32::from(!old) + u32::from(new); // check-shapes: integers
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    frame[24..26].copy_from_slice(&(!(acc as u16)).to_be_bytes());
}

/// Hands `burst` to `inner` as received on `input`; what it leaves is freed and counted as
/// dropped, as the worker loop does.
fn deliver(
    inner: &mut RdmaStage,
    input: usize,
    burst: &mut Burst,
    out: &mut Outputs,
    c: &mut Counters,
) {
    if burst.is_empty() {
        return;
    }
    inner.on_rx(input, burst, out, c);
    if !burst.is_empty() {
        c.io.drops += burst.len() as u64;
        burst.clear();
    }
}

/// The bottleneck's counters the wrapper publishes, in the worker's stage slots after the
/// engine's own ([`RdmaCounters`]), under these names: what it marked and dropped, which add
/// up over workers. (Its other counters go into the benches' reports directly.)
const PUBLISHED: [(BottleneckSlot, &str); 2] = [
    (BottleneckSlot::marked, "bottleneck_marked"),
    (BottleneckSlot::dropped, "bottleneck_dropped"),
];
const _: () = assert!(RdmaCounters::LEN + PUBLISHED.len() <= STAGE_COUNTERS);

/// The wrapper's counter names: the engine's, then [`PUBLISHED`]'s.
fn counter_names() -> &'static [&'static str] {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let mut names = RdmaCounters::NAMES.to_vec();
        names.extend(PUBLISHED.map(|(_, name)| name));
        names
    })
}

/// An [`RdmaStage`] with an emulated bottleneck in front of one of its inputs and/or a probe
/// of one engine's shaper. The bottleneck's counters named in `PUBLISHED` follow the
/// engine's in the worker's stage slots: the library's stage knows nothing of them.
pub struct Instrumented {
    // Declared before `inner` (which holds the mempool): the mbufs held here are freed first.
    ingress: Option<Ingress>,
    /// Frames the bottleneck released, handed to the engine a burst at a time.
    released: Burst,
    probe: Option<ShaperProbe>,
    inner: RdmaStage,
}

impl Instrumented {
    pub fn new(inner: RdmaStage, ingress: Option<Ingress>, probe: Option<ShaperProbe>) -> Self {
        Instrumented {
            ingress,
            released: Burst::new(),
            probe,
            inner,
        }
    }

    /// Hands the frames the bottleneck releases by `now` to their engine.
    fn release(&mut self, now: u64, out: &mut Outputs, c: &mut Counters) {
        let Some(ing) = &mut self.ingress else {
            return;
        };
        let (inner, released, input) = (&mut self.inner, &mut self.released, ing.input);
        ing.bottleneck.poll(now, |mut m, marked| {
            if marked {
                mark_ce(m.data_mut());
            }
            // ARP goes through as well (the peer resolved the address before the flows
            // started: none comes).
            if let Err(m) = released.push(m) {
                deliver(inner, input, released, out, c);
                let _ = released.push(m);
            }
        });
        deliver(inner, input, released, out, c);
        if let Some(node) = inner.node_mut(input) {
            node.set_ingress_queue(Some(
                ing.bottleneck.queue_bytes().min(u64::from(u32::MAX - 1)) as u32,
            ));
            node.set_ingress_delay(Some(
                ing.bottleneck.queue_delay_ns().min(u64::from(u32::MAX - 1)) as u32,
            ));
        }
        // The senders' controller rates, for the bench's figures.
        if let (Some(t), Some(sender)) = (ing.bottleneck.trace(), inner.node(0)) {
            let bin = (now / t.bin_ns) as usize;
            let n = ing.senders.len();
            if let Some(row) = ing.rates.get_mut(bin * n..(bin + 1) * n) {
                for (r, &qpn) in row.iter_mut().zip(&ing.senders) {
                    let rate = sender
                        .qp(qpn)
                        .and_then(|q| q.requester().cc().rate_bps())
                        .unwrap_or(0);
                    if *r == 0 || rate < *r {
                        *r = rate;
                    }
                }
            }
        }
    }

    /// Records the shaper's cumulative bytes per class in the current bin.
    fn sample_shaper(&mut self, now: u64) {
        let Some(p) = &mut self.probe else {
            return;
        };
        let Some(sh) = self.inner.node(p.engine).and_then(|n| n.shaper()) else {
            return;
        };
        let n = sh.classes();
        let bin = (now / p.bin_ns) as usize;
        if bin >= p.bins {
            return;
        }
        for c in 0..n {
            let k = sh.class_counters(c as u8);
            p.sent[bin * n + c] = k.bytes;
            p.pulled[bin * n + c] = k.response_bytes;
        }
    }

    /// The bottleneck's published counters into the slots after the engine's.
    fn store_counters(&self, c: &mut Counters) {
        let b = self
            .ingress
            .as_ref()
            .map(|ing| ing.bottleneck.counters().values())
            .unwrap_or_default();
        for (i, (slot, _)) in PUBLISHED.iter().enumerate() {
            c.stage[RdmaCounters::LEN + i] = b[slot.index()];
        }
    }
}

impl Stage for Instrumented {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn counter_names(&self) -> &'static [&'static str] {
        counter_names()
    }

    fn start(&mut self, polling: Polling) {
        self.inner.start(polling);
    }

    fn is_finite(&self) -> bool {
        self.inner.is_finite()
    }

    fn is_done(&self) -> bool {
        self.inner.is_done()
    }

    fn outlook(&mut self) -> Outlook {
        let now = self.inner.now_ns();
        // Frames held by the bottleneck leave when it releases them.
        let held = Outlook::due_in(
            self.ingress
                .as_ref()
                .and_then(|i| i.bottleneck.next_release())
                .map(|t| t.saturating_sub(now)),
        );
        held.and(self.inner.outlook())
    }

    fn wakes(&self) -> Vec<Arc<Wake>> {
        self.inner.wakes()
    }

    fn host_work_pending(&self) -> bool {
        self.inner.host_work_pending()
    }

    fn slept(&mut self, ns: u64) {
        self.inner.slept(ns);
    }

    fn on_rx(&mut self, input: usize, burst: &mut Burst, out: &mut Outputs, c: &mut Counters) {
        if let Some(ing) = &mut self.ingress
            && ing.input == input
        {
            let now = self.inner.now_ns();
            for m in burst.drain() {
                let (len, ect, flow) =
                    (m.len() as u32, ect(m.data()), flow_of(m.data(), &ing.flows));
                // A frame the buffer has no room for is freed here: dropped at the tail.
                let _ = ing.bottleneck.offer(now, m, len, ect, flow);
            }
            self.release(now, out, c);
            return;
        }
        self.inner.on_rx(input, burst, out, c);
    }

    fn on_poll(&mut self, out: &mut Outputs, c: &mut Counters) {
        let now = self.inner.now_ns();
        self.release(now, out, c);
        self.inner.on_poll(out, c);
        self.sample_shaper(now);
        self.store_counters(c);
    }

    fn on_stop(&mut self, c: &mut Counters) {
        self.inner.on_stop(c);
        self.store_counters(c);
        if let Some(p) = &mut self.probe
            && let Some(sh) = self.inner.node(p.engine).and_then(|n| n.shaper())
        {
            let n = sh.classes();
            // A bin without a poll carries the one before it (the counts only grow).
            for v in [&mut p.sent, &mut p.pulled] {
                for i in n..v.len() {
                    v[i] = v[i].max(v[i - n]);
                }
            }
            let report = ShaperReport {
                classes: (0..n).map(|c| sh.class_counters(c as u8)).collect(),
                mcus: (0..sh.mcus()).map(|m| sh.mcu_counters(m)).collect(),
                bin_ns: p.bin_ns,
                bins: p.bins,
                sent: std::mem::take(&mut p.sent),
                pulled: std::mem::take(&mut p.pulled),
            };
            if let Ok(mut slot) = p.report.lock() {
                *slot = Some(report);
            }
        }
        if let Some(ing) = &mut self.ingress {
            let b = &ing.bottleneck;
            let sender = self.inner.node(0);
            let report = IngressReport {
                counters: b.counters(),
                queue_p50_bytes: b.queue_percentile(50.0),
                queue_p99_bytes: b.queue_percentile(99.0),
                trace: b.trace().cloned(),
                rates: std::mem::take(&mut ing.rates),
                senders: ing
                    .senders
                    .iter()
                    .map(|&qpn| {
                        let cc = sender.and_then(|n| n.qp(qpn)).map(|q| q.requester().cc());
                        (
                            cc.map(|c| c.stats).unwrap_or_default(),
                            cc.and_then(|c| c.rate_bps()),
                        )
                    })
                    .collect(),
            };
            if let Ok(mut slot) = ing.report.lock() {
                *slot = Some(report);
            }
            // Free what is still held while the pool is alive.
            ing.bottleneck.poll(u64::MAX, |m, _| drop(m));
        }
        self.released.clear();
    }
}

/// For [`LoopbackOpts::wrap`](portico::rdma::loopback::LoopbackOpts::wrap): worker 0's stage
/// with `ingress` and `probe` (the other workers' as they are; none without either).
pub fn wrap(ingress: Option<Ingress>, probe: Option<ShaperProbe>) -> StageWrap {
    let parts = Mutex::new(Some((ingress, probe)));
    StageWrap::new(move |worker, stage| {
        let parts = if worker == 0 {
            parts.lock().ok().and_then(|mut p| p.take())
        } else {
            None
        };
        match parts {
            Some((ingress, probe)) if ingress.is_some() || probe.is_some() => {
                StageBox::new(Instrumented::new(stage, ingress, probe))
            }
            _ => StageBox::new(stage),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wrapper's names are the engine's, then the bottleneck's published counters, each
    /// `bottleneck_` and the name it is declared with.
    #[test]
    fn the_wrapper_names_the_engine_counters_then_the_bottlenecks() {
        let names = counter_names();
        assert_eq!(&names[..RdmaCounters::LEN], RdmaCounters::NAMES);
        assert_eq!(
            &names[RdmaCounters::LEN..],
            ["bottleneck_marked", "bottleneck_dropped"]
        );
        for (slot, name) in PUBLISHED {
            assert_eq!(
                name,
                format!("bottleneck_{}", BottleneckCounters::NAMES[slot.index()])
            );
        }
    }

    #[test]
    fn a_frame_marked_ce_keeps_a_valid_checksum_and_icrc() {
        let cfg = portico::transport::QpConfig::new(1, 2);
        let repr = cfg.header(portico::wire::Opcode::SendOnly, 7, true);
        let mut frame = vec![0u8; repr.buffer_len(100)];
        repr.emit(&mut frame, &[0x5a; 100]).unwrap();
        assert!(ect(&frame));
        mark_ce(&mut frame);
        let (back, _) = portico::wire::parse_frame(&frame).expect("checksum and ICRC hold");
        assert_eq!(back.ip.ecn, Ecn::Ce);
        assert_eq!(back.ip.dscp, cfg.dscp, "the DSCP is untouched");
        // Not ECN-capable: not ECT.
        frame[15] &= !3;
        assert!(!ect(&frame));
    }
}
