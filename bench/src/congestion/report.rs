//! What a congestion run measured: the figures of one congestion-control scheme's run,
//! computed from the time series the bench recorded, and the series themselves as CSV and as
//! an SVG plot with the schemes side by side.
//!
//! A [`Run`] is binned: bin *b* covers `[b·bin_ns, (b+1)·bin_ns)`, and every instant a figure
//! names is a bin end, so a figure is exact to one bin. The definitions below are the contract
//! of the JSON the bench prints; each says why it is what it is.
//!
//! - **Send rate.** The bytes a flow sent are the bytes it brought to the bottleneck: the
//!   bottleneck is the first thing on the path, so arrivals there are sends with no delay in
//!   between. The rate at a bin end is a moving average ([`rate_series`]): the bytes of the
//!   last `rate_window_ns` (rounded to whole bins, one at least) over that window. A sender
//!   paces a window of packets per round trip, so one bin alone sees bursts, while a window of
//!   about one RTT sees the rate the congestion control actually set. Nothing was sent before
//!   time 0, so the first windows count those empty bins and the rate ramps in from zero.
//! - **`congested_from`**: the first bin end at which at least two flows are active per the
//!   schedule (`join <= t < leave`) and the bin's largest queue is above Kmin. Two flows,
//!   because a queue built by one flow is its own burst, not competition; above Kmin, because
//!   that is where marking starts: the first moment the scheme can be told.
//! - **`reaction_us`**: from `congested_from` to the first bin end at or after it at which the
//!   aggregate send rate is at or below the bottleneck rate. From then on the queue no longer
//!   grows: that is what reacting means for the link, whatever the scheme did to get there.
//!   Only instants at which at least two flows are still active count: a flow leaving lowers
//!   the aggregate too, and a scheme that never reacts (`none`, or one overwhelmed while the
//!   flows compete) has no reaction time (None).
//! - **`competing_left`**: the last flow to leave is the one (or the ones) with the latest
//!   leave time; `competing_left` is the latest leave time among the others, the end of the
//!   competition. None with fewer than two flows, or when all leave together.
//! - **`recovery_us`**: from `competing_left` to the first bin end at or after it at which the
//!   flows still active (those leaving later) send at 95 % of the bottleneck rate or more:
//!   how fast a scheme gives the freed bandwidth back. 95 % and not 100 %, because a paced
//!   sender's moving average sits just under the line rate and would never count as recovered.
//! - **`utilization`**: departed bytes × 8 / (bottleneck rate × duration), over the bins that lie
//!   wholly inside the periods when at least two flows are active. Only that congested period,
//!   because a flow alone is limited by its own demand, not by how well the scheme keeps a
//!   shared link busy; whole bins, so no bytes from outside the period count.
//! - **Per-flow throughput**: a flow's bytes in the bins that overlap its own interval
//!   `[join, leave)`, both ends clamped to the recorded bins, over that interval's length, in
//!   Gbit/s. Its own interval and not the run's, so a late joiner is not charged for the time
//!   before it existed.
//! - **Jain's fairness index** ([`jain`]), over the flows' bytes in the whole bins when all
//!   flows are active at once: fairness is about sharing, and only then do all of them share
//!   the same link. With no such bin, it falls back to the per-flow throughputs over their own
//!   intervals.
//! - **FCT**: nearest-rank percentiles (the smallest value with at least p % of the values at
//!   or below it, so every percentile is a completion that happened) of the messages'
//!   completion times, in µs: p50, p99, p99.9 and the maximum, for all messages and split at
//!   64 KiB. The split because a small message's time is mostly queueing delay, while a large
//!   one's is mostly its share of the bandwidth: the schemes trade one against the other.
//!
//! Odd input is read, not refused: a series shorter than the others reads as zeros, a flow
//! without a schedule entry is active for the whole run, and a run without bins or a bin width
//! has empty series. A figure that cannot be computed is `None` (null in the JSON), never NaN.

use std::io::{self, BufWriter, Write};
use std::ops::Range;
use std::path::Path;

use plotters::prelude::*;

use crate::plot::{Area, Chart, CsvField, DrawResult, axis_top, drawing_error, kb};
use serde::Serialize;

/// Messages of at most this many bytes count as small in the FCT split.
pub const SMALL_MESSAGE_BYTES: u32 = 64 * 1024;
/// The fraction of the bottleneck rate at which the remaining flows count as recovered.
pub const RECOVERED_FRACTION: f64 = 0.95;

const NS_PER_US: f64 = 1e3;
const NS_PER_S: f64 = 1e9;

/// One scheme's run, as the bench recorded it. Bin b covers [b*bin_ns, (b+1)*bin_ns).
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// The scheme: "none", "dcqcn", "ack" (any label).
    pub cc: String,
    pub bin_ns: u64,
    pub flows: usize,
    /// bins × flows, index `b * flows + f`: bytes flow f sent into the bottleneck in bin b.
    pub arrived: Vec<u64>,
    /// Per bin: bytes the bottleneck delivered.
    pub departed: Vec<u64>,
    /// Per bin: the largest queue (bytes) seen in the bin.
    pub queue_max: Vec<u32>,
    /// Per bin: CE marks.
    pub marks: Vec<u32>,
    /// Per bin: drops.
    pub drops: Vec<u32>,
    /// Per flow: `[join_ns, leave_ns)`.
    pub schedule: Vec<(u64, u64)>,
    pub bottleneck_bps: u64,
    pub kmin_bytes: u64,
    pub kmax_bytes: u64,
    /// Window of the moving-average rates (e.g. one RTT; at least one bin is used).
    pub rate_window_ns: u64,
    /// From the bottleneck's own histogram (passed through).
    pub queue_p50_bytes: u64,
    pub queue_p99_bytes: u64,
    pub drops_total: u64,
    pub marks_total: u64,
    /// (message size bytes, completion time ns) of every message of the mixed-size workload.
    pub fct: Vec<(u32, u64)>,
    /// bins × flows, like `arrived`: the rate (bit/s) each sender's congestion controller had
    /// set, last seen in the bin; 0 where none was seen (carried forward) or the scheme has no
    /// controller. Empty: not recorded.
    pub set_rates: Vec<u64>,
}

impl Run {
    /// Bins recorded: as many as the longest series has (a shorter one reads as zeros past its
    /// end); none without a bin width, since then no bin has a time.
    pub fn bins(&self) -> usize {
        if self.bin_ns == 0 {
            return 0;
        }
        // A partial last row of arrivals is a bin too, its missing flows zero.
        let arrived_bins = match self.flows {
            0 => 0,
            flows => self.arrived.len().div_ceil(flows),
        };
        arrived_bins
            .max(self.departed.len())
            .max(self.queue_max.len())
            .max(self.marks.len())
            .max(self.drops.len())
    }

    /// The end of the recording, ns.
    pub fn end_ns(&self) -> u64 {
        (self.bins() as u64).saturating_mul(self.bin_ns)
    }

    /// Bytes flow `flow` sent into the bottleneck in bin `bin` (0 past the recorded ones).
    fn arrived_at(&self, bin: usize, flow: usize) -> u64 {
        if flow >= self.flows {
            return 0;
        }
        bin.checked_mul(self.flows)
            .and_then(|i| i.checked_add(flow))
            .and_then(|i| self.arrived.get(i))
            .copied()
            .unwrap_or(0)
    }

    fn bin_end_ns(&self, bin: usize) -> u64 {
        (bin as u64).saturating_add(1).saturating_mul(self.bin_ns)
    }

    /// A flow's `[join, leave)`; a flow the schedule does not list is taken as active
    /// throughout.
    fn interval(&self, flow: usize) -> (u64, u64) {
        self.schedule.get(flow).copied().unwrap_or((0, u64::MAX))
    }

    /// Flows active at the instant `t`.
    fn active_at(&self, t: u64) -> usize {
        (0..self.flows)
            .filter(|&f| {
                let (join, leave) = self.interval(f);
                join <= t && t < leave
            })
            .count()
    }

    /// The bins lying wholly inside `[from, to)`.
    fn bins_within(&self, from: u64, to: u64) -> Range<usize> {
        if self.bin_ns == 0 || from >= to {
            return 0..0;
        }
        let first = usize::try_from(from.div_ceil(self.bin_ns)).unwrap_or(usize::MAX);
        let last = usize::try_from(to / self.bin_ns).unwrap_or(usize::MAX);
        first.min(self.bins())..last.min(self.bins())
    }

    /// The bins overlapping `[from, to)`.
    fn bins_overlapping(&self, from: u64, to: u64) -> Range<usize> {
        if self.bin_ns == 0 || from >= to {
            return 0..0;
        }
        let first = usize::try_from(from / self.bin_ns).unwrap_or(usize::MAX);
        let last = usize::try_from(to.div_ceil(self.bin_ns)).unwrap_or(usize::MAX);
        first.min(self.bins())..last.min(self.bins())
    }

    /// The moving-average window, in whole bins (nearest, one at least).
    fn window_bins(&self) -> usize {
        if self.bin_ns == 0 {
            return 1;
        }
        let bins = self.rate_window_ns.saturating_add(self.bin_ns / 2) / self.bin_ns;
        usize::try_from(bins.max(1)).unwrap_or(usize::MAX)
    }

    /// The periods in which at least `min_active` flows are active, as disjoint `[from, to)`
    /// in time order.
    fn periods_with_at_least(&self, min_active: usize) -> Vec<(u64, u64)> {
        let mut events: Vec<(u64, isize)> = Vec::new();
        for f in 0..self.flows {
            let (join, leave) = self.interval(f);
            if join < leave {
                events.push((join, 1));
                events.push((leave, -1));
            }
        }
        events.sort_unstable();
        let mut periods = Vec::new();
        let mut active: isize = 0;
        let mut open: Option<u64> = None;
        let mut i = 0;
        while i < events.len() {
            // Every change at one instant first, so a flow leaving as another joins does not
            // split a period.
            let t = events[i].0;
            while i < events.len() && events[i].0 == t {
                active += events[i].1;
                i += 1;
            }
            let enough = usize::try_from(active).is_ok_and(|n| n >= min_active);
            match (open, enough) {
                (None, true) => open = Some(t),
                (Some(from), false) => {
                    periods.push((from, t));
                    open = None;
                }
                _ => {}
            }
        }
        periods
    }
}

/// One flow's throughput over its own active interval.
#[derive(Debug, Clone, Serialize)]
pub struct FlowFigures {
    pub flow: usize,
    pub gbps: f64,
    pub bytes: u64,
}

/// Nearest-rank completion-time percentiles of a set of messages, µs (None without messages).
#[derive(Debug, Clone, Serialize)]
pub struct FctFigures {
    pub count: usize,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    pub max_us: Option<f64>,
}

/// The figures of one scheme's run (see the module documentation for each definition).
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub cc: String,
    pub reaction_us: Option<f64>,
    pub recovery_us: Option<f64>,
    pub queue_p50_bytes: u64,
    pub queue_p99_bytes: u64,
    pub utilization: Option<f64>,
    pub drops: u64,
    pub marks: u64,
    pub flows: Vec<FlowFigures>,
    pub jain: Option<f64>,
    /// All messages.
    pub fct: FctFigures,
    /// Messages of at most [`SMALL_MESSAGE_BYTES`].
    pub fct_small: FctFigures,
    /// Messages larger than [`SMALL_MESSAGE_BYTES`].
    pub fct_large: FctFigures,
    /// The instant `reaction_us` starts from, µs.
    pub congested_from_us: Option<f64>,
    /// The instant `recovery_us` starts from, µs.
    pub competing_left_us: Option<f64>,
    /// What `reaction_us` and `recovery_us` read: `"controller"`, the rates the senders'
    /// controllers set, or `"measured"`, the moving average of the bytes sent (schemes
    /// without a controller).
    pub rate_basis: &'static str,
    /// The same two figures from the measured rates, whatever the basis.
    pub measured_reaction_us: Option<f64>,
    /// From the first CE mark at or after `congested_from` (no scheme can be told before
    /// it) to the same instant `reaction_us` ends at: the scheme's own share of the reaction,
    /// the rest being the time the marker took to mark (HPCC's evaluation measures from the
    /// first marked dequeue).
    pub reaction_from_mark_us: Option<f64>,
    pub measured_recovery_us: Option<f64>,
}

/// The figures of one run.
pub fn figures(run: &Run) -> Figures {
    let bottleneck_bps = run.bottleneck_bps as f64;

    let everyone: Vec<usize> = (0..run.flows).collect();
    let measured = rate_series(run, &everyone);
    let controlled = set_rate_series(run, &everyone);
    let aggregate = controlled.clone().unwrap_or_else(|| measured.clone());
    let congested_from = congested_from_ns(run);
    // Only while the flows still compete: a flow leaving also lowers the aggregate, and a
    // scheme that never reacts has no reaction time.
    let reacted = congested_from.and_then(|from| {
        aggregate
            .iter()
            .enumerate()
            .map(|(b, &bps)| (run.bin_end_ns(b), bps))
            .find(|&(t, bps)| t >= from && run.active_at(t) >= 2 && bps <= bottleneck_bps)
            .map(|(t, _)| t)
    });

    let measured_reacted = congested_from.and_then(|from| {
        measured
            .iter()
            .enumerate()
            .map(|(b, &bps)| (run.bin_end_ns(b), bps))
            .find(|&(t, bps)| t >= from && run.active_at(t) >= 2 && bps <= bottleneck_bps)
            .map(|(t, _)| t)
    });

    let competing_left = competing_left_ns(run);
    let remaining: Vec<usize> = competing_left.map_or(Vec::new(), |left| {
        (0..run.flows)
            .filter(|&f| run.interval(f).1 > left)
            .collect()
    });
    let recovered_in = |rate: &[f64]| {
        competing_left.and_then(|left| {
            first_bin_end_from(run, left, rate, |bps| {
                bps >= RECOVERED_FRACTION * bottleneck_bps
            })
        })
    };
    let measured_recovered = recovered_in(&rate_series(run, &remaining));
    let recovered = match set_rate_series(run, &remaining) {
        Some(rate) if controlled.is_some() => recovered_in(&rate),
        _ => measured_recovered,
    };
    let since = |from: Option<u64>, to: Option<u64>| from.zip(to).map(|(f, t)| us(t - f));
    let first_mark = congested_from.and_then(|from| {
        (0..run.bins())
            .find(|&b| run.bin_end_ns(b) >= from && run.marks.get(b).copied().unwrap_or(0) > 0)
            .map(|b| run.bin_end_ns(b))
    });

    let flows = flow_figures(run);
    let (small, large): (Vec<_>, Vec<_>) = run
        .fct
        .iter()
        .partition(|&&(size, _)| size <= SMALL_MESSAGE_BYTES);

    Figures {
        cc: run.cc.clone(),
        reaction_us: congested_from.zip(reacted).map(|(from, to)| us(to - from)),
        recovery_us: competing_left
            .zip(recovered)
            .map(|(from, to)| us(to - from)),
        queue_p50_bytes: run.queue_p50_bytes,
        queue_p99_bytes: run.queue_p99_bytes,
        utilization: utilization(run),
        drops: run.drops_total,
        marks: run.marks_total,
        jain: fairness(run, &flows),
        flows,
        fct: fct_figures(run.fct.iter().map(|&(_, ns)| ns)),
        fct_small: fct_figures(small.iter().map(|&(_, ns)| ns)),
        fct_large: fct_figures(large.iter().map(|&(_, ns)| ns)),
        congested_from_us: congested_from.map(us),
        competing_left_us: competing_left.map(us),
        rate_basis: if controlled.is_some() {
            "controller"
        } else {
            "measured"
        },
        measured_reaction_us: since(congested_from, measured_reacted),
        reaction_from_mark_us: match (first_mark, reacted) {
            (Some(m), Some(r)) => Some(us(r.saturating_sub(m))),
            _ => None,
        },
        measured_recovery_us: since(competing_left, measured_recovered),
    }
}

/// The summed controller rates (bit/s) of the given flows at the end of each bin, each flow's
/// last value carried forward over bins without one; `None` when the run recorded none (no
/// controller).
pub fn set_rate_series(run: &Run, flows: &[usize]) -> Option<Vec<f64>> {
    let bins = run.bins();
    if run.set_rates.len() < bins * run.flows || run.set_rates.iter().all(|&r| r == 0) {
        return None;
    }
    let mut out = vec![0.0; bins];
    for &f in flows.iter().filter(|&&f| f < run.flows) {
        let mut last = 0u64;
        for (b, o) in out.iter_mut().enumerate() {
            let r = run.set_rates[b * run.flows + f];
            if r != 0 {
                last = r;
            }
            // A flow counts only while it is on: before its first and after its last bytes
            // its controller's rate sends nothing.
            let t = run.bin_end_ns(b);
            let (join, leave) = run.interval(f);
            if t > join && t <= leave {
                *o += last as f64;
            }
        }
    }
    Some(out)
}

/// Moving-average rate (bit/s) of the given flows at the end of each bin: bytes in the last
/// `rate_window_ns` (rounded to whole bins, at least 1) / window. Bins before time 0 count as
/// empty, so the first values ramp in. A flow index past `run.flows` adds nothing.
pub fn rate_series(run: &Run, flows: &[usize]) -> Vec<f64> {
    let window = run.window_bins();
    let window_ns = window as f64 * run.bin_ns as f64;
    // u128: a sum of u64 byte counts cannot overflow it.
    let per_bin: Vec<u128> = (0..run.bins())
        .map(|b| {
            flows
                .iter()
                .map(|&f| u128::from(run.arrived_at(b, f)))
                .sum()
        })
        .collect();
    let mut in_window: u128 = 0;
    per_bin
        .iter()
        .enumerate()
        .map(|(b, &bytes)| {
            in_window += bytes;
            if let Some(gone) = b.checked_sub(window) {
                in_window -= per_bin[gone];
            }
            in_window as f64 * 8.0 * NS_PER_S / window_ns
        })
        .collect()
}

/// Jain's fairness index, (Σx)² / (n·Σx²): 1 when all shares are equal, 1/n when one takes
/// everything. None for no shares or all of them zero (no fairness to speak of).
pub fn jain(xs: &[f64]) -> Option<f64> {
    let sum: f64 = xs.iter().sum();
    let sum_of_squares: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || sum_of_squares <= 0.0 {
        return None;
    }
    let index = sum * sum / (xs.len() as f64 * sum_of_squares);
    index.is_finite().then_some(index)
}

/// The first bin end at which at least two flows are active and the bin's queue went above
/// Kmin.
fn congested_from_ns(run: &Run) -> Option<u64> {
    (0..run.bins())
        .find(|&b| {
            let queue = run.queue_max.get(b).copied().unwrap_or(0);
            u64::from(queue) > run.kmin_bytes && run.active_at(run.bin_end_ns(b)) >= 2
        })
        .map(|b| run.bin_end_ns(b))
}

/// The latest leave time among the flows other than the last to leave.
fn competing_left_ns(run: &Run) -> Option<u64> {
    let leaves: Vec<u64> = (0..run.flows).map(|f| run.interval(f).1).collect();
    let last = leaves.iter().copied().max()?;
    leaves.into_iter().filter(|&leave| leave < last).max()
}

/// The first bin end at or after `from` whose value in `series` satisfies `reached`.
fn first_bin_end_from(
    run: &Run,
    from: u64,
    series: &[f64],
    reached: impl Fn(f64) -> bool,
) -> Option<u64> {
    series
        .iter()
        .enumerate()
        .find(|&(b, &value)| run.bin_end_ns(b) >= from && reached(value))
        .map(|(b, _)| run.bin_end_ns(b))
}

/// Departed bits over what the bottleneck could have sent, in the whole bins when at least two
/// flows are active.
fn utilization(run: &Run) -> Option<f64> {
    if run.bottleneck_bps == 0 {
        return None;
    }
    let mut bins: u64 = 0;
    let mut departed: u128 = 0;
    for (from, to) in run.periods_with_at_least(2) {
        for b in run.bins_within(from, to) {
            bins += 1;
            departed += u128::from(run.departed.get(b).copied().unwrap_or(0));
        }
    }
    if bins == 0 {
        return None;
    }
    let capacity_bits = run.bottleneck_bps as f64 * (bins as f64 * run.bin_ns as f64) / NS_PER_S;
    Some(departed as f64 * 8.0 / capacity_bits)
}

/// Every flow's throughput over its own interval, clamped to the recorded bins.
fn flow_figures(run: &Run) -> Vec<FlowFigures> {
    let end = run.end_ns();
    (0..run.flows)
        .map(|flow| {
            let (join, leave) = run.interval(flow);
            let (from, to) = (join.min(end), leave.min(end));
            let bytes: u64 = run
                .bins_overlapping(from, to)
                .map(|b| run.arrived_at(b, flow))
                .fold(0, u64::saturating_add);
            let ns = to.saturating_sub(from);
            // Bits per ns are Gbit/s.
            let gbps = if ns == 0 {
                0.0
            } else {
                bytes as f64 * 8.0 / ns as f64
            };
            FlowFigures { flow, gbps, bytes }
        })
        .collect()
}

/// Jain's index over the flows' bytes in the whole bins when all of them are active, or, with no
/// such bin, over their throughputs over their own intervals.
fn fairness(run: &Run, flows: &[FlowFigures]) -> Option<f64> {
    let intervals: Vec<(u64, u64)> = (0..run.flows).map(|f| run.interval(f)).collect();
    let all_joined = intervals.iter().map(|&(join, _)| join).max()?;
    let first_left = intervals.iter().map(|&(_, leave)| leave).min()?;
    let shared = run.bins_within(all_joined, first_left);
    if shared.is_empty() {
        let gbps: Vec<f64> = flows.iter().map(|f| f.gbps).collect();
        return jain(&gbps);
    }
    // Every flow over the same bins: the index is the same for bytes as for rates.
    let bytes: Vec<f64> = (0..run.flows)
        .map(|f| {
            shared
                .clone()
                .map(|b| run.arrived_at(b, f) as f64)
                .sum::<f64>()
        })
        .collect();
    jain(&bytes)
}

/// Nearest-rank percentiles of completion times given in ns.
fn fct_figures(ns: impl Iterator<Item = u64>) -> FctFigures {
    let mut sorted: Vec<u64> = ns.collect();
    sorted.sort_unstable();
    // Per mille, in integers, so that the rank of p99.9 of 1000 values is 999 and not 1000
    // through rounding.
    let at = |per_mille: usize| {
        let rank = (sorted.len() * per_mille).div_ceil(1000).max(1);
        sorted.get(rank - 1).copied().map(us)
    };
    FctFigures {
        count: sorted.len(),
        p50_us: at(500),
        p99_us: at(990),
        p999_us: at(999),
        max_us: sorted.last().copied().map(us),
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / NS_PER_US
}

/// The runs' series as CSV: `cc,time_us,aggregate_gbps,queue_bytes,marks,drops,flow_0_gbps,…`
/// with as many flow columns as the run with the most flows has (empty where a run has fewer),
/// one row per bin per run. Time is the bin's end; rates are [`rate_series`]; the queue is
/// the bin's largest.
pub fn write_csv(path: &Path, runs: &[Run]) -> io::Result<()> {
    let mut out = BufWriter::new(std::fs::File::create(path)?);
    write_csv_to(&mut out, runs)?;
    out.flush()
}

fn write_csv_to(out: &mut impl Write, runs: &[Run]) -> io::Result<()> {
    let columns = runs.iter().map(|r| r.flows).max().unwrap_or(0);
    write!(out, "cc,time_us,aggregate_gbps,queue_bytes,marks,drops")?;
    for f in 0..columns {
        write!(out, ",flow_{f}_gbps")?;
    }
    for f in 0..columns {
        write!(out, ",flow_{f}_set_gbps")?;
    }
    writeln!(out)?;
    for run in runs {
        let everyone: Vec<usize> = (0..run.flows).collect();
        let aggregate = rate_series(run, &everyone);
        let per_flow: Vec<Vec<f64>> = everyone.iter().map(|&f| rate_series(run, &[f])).collect();
        let set: Vec<Option<Vec<f64>>> = everyone
            .iter()
            .map(|&f| set_rate_series(run, &[f]))
            .collect();
        let cc = CsvField(&run.cc);
        for (b, &bps) in aggregate.iter().enumerate() {
            let queue = run.queue_max.get(b).copied().unwrap_or(0);
            let marks = run.marks.get(b).copied().unwrap_or(0);
            let drops = run.drops.get(b).copied().unwrap_or(0);
            write!(
                out,
                "{cc},{},{},{queue},{marks},{drops}",
                us(run.bin_end_ns(b)),
                bps / NS_PER_S
            )?;
            for f in 0..columns {
                match per_flow.get(f) {
                    Some(rates) => write!(out, ",{}", rates[b] / NS_PER_S)?,
                    None => write!(out, ",")?,
                }
            }
            for f in 0..columns {
                match set.get(f) {
                    Some(Some(rates)) => write!(out, ",{}", rates[b] / NS_PER_S)?,
                    _ => write!(out, ",")?,
                }
            }
            writeln!(out)?;
        }
    }
    Ok(())
}

/// Width of one run's column in the SVG, pixels.
const SVG_COLUMN_WIDTH: u32 = 500;
const SVG_HEIGHT: u32 = 800;

/// The runs side by side as an SVG: one column per run, captioned with its `cc`; on top the
/// per-flow send rates, the aggregate (thick, black) and the bottleneck rate (dashed); below,
/// the queue with Kmin and Kmax (dashed). Gray verticals are the flows' joins and leaves. Every
/// column has the same axes, so the schemes compare at a glance.
pub fn write_svg(path: &Path, runs: &[Run], title: &str) -> io::Result<()> {
    std::fs::write(path, render_svg(runs, title)?)
}

fn render_svg(runs: &[Run], title: &str) -> io::Result<String> {
    let width = SVG_COLUMN_WIDTH * u32::try_from(runs.len().max(3)).unwrap_or(u32::MAX / 1000);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, SVG_HEIGHT)).into_drawing_area();
        draw(&root, runs, title).map_err(drawing_error)?;
        root.present().map_err(drawing_error)?;
    }
    Ok(svg)
}

/// What a column plots, in the plot's units (µs, Gbit/s, KB).
/// Points per plotted series, at most.
const PLOT_POINTS: usize = 1500;

struct Plotted {
    times_us: Vec<f64>,
    aggregate_gbps: Vec<f64>,
    flows_gbps: Vec<Vec<f64>>,
    /// The rates the flows' controllers set, when recorded.
    set_gbps: Vec<Vec<f64>>,
    queue_kb: Vec<f64>,
    /// Joins and leaves within the recording.
    events_us: Vec<f64>,
}

impl Plotted {
    fn of(run: &Run) -> Plotted {
        let gbps = |rates: Vec<f64>| rates.into_iter().map(|bps| bps / NS_PER_S).collect();
        let end = run.end_ns();
        let mut events_us: Vec<f64> = (0..run.flows)
            .flat_map(|f| {
                let (join, leave) = run.interval(f);
                [join, leave]
            })
            .filter(|&t| t > 0 && t < end)
            .map(us)
            .collect();
        events_us.sort_by(f64::total_cmp);
        events_us.dedup();
        // At most PLOT_POINTS points a series (a long run has tens of thousands of bins):
        // rates averaged over each group of bins, the queue its largest value (a peak stays
        // visible).
        let group = run.bins().div_ceil(PLOT_POINTS).max(1);
        let mean = |v: Vec<f64>| -> Vec<f64> {
            v.chunks(group)
                .map(|c| c.iter().sum::<f64>() / c.len() as f64)
                .collect()
        };
        let queue: Vec<f64> = (0..run.bins())
            .map(|b| kb(u64::from(run.queue_max.get(b).copied().unwrap_or(0))))
            .collect();
        Plotted {
            times_us: (0..run.bins())
                .step_by(group)
                .map(|b| us(run.bin_end_ns((b + group - 1).min(run.bins() - 1))))
                .collect(),
            aggregate_gbps: mean(gbps(rate_series(run, &(0..run.flows).collect::<Vec<_>>()))),
            flows_gbps: (0..run.flows)
                .map(|f| mean(gbps(rate_series(run, &[f]))))
                .collect(),
            set_gbps: (0..run.flows)
                .filter_map(|f| set_rate_series(run, &[f]).map(|r| mean(gbps(r))))
                .collect(),
            queue_kb: queue
                .chunks(group)
                .map(|c| c.iter().copied().fold(0.0, f64::max))
                .collect(),
            events_us,
        }
    }

    /// The points of a series, starting from (0, 0): nothing was sent and nothing queued
    /// before the run.
    fn line<'a>(&'a self, values: &'a [f64]) -> impl Iterator<Item = (f64, f64)> + Clone + 'a {
        std::iter::once((0.0, 0.0)).chain(self.times_us.iter().copied().zip(values.iter().copied()))
    }
}

/// Font sizes as given to plotters (its SVG backend draws text at about 0.8 of them).
const TITLE_FONT: u32 = 26;
const CAPTION_FONT: u32 = 24;
const LABEL_FONT: u32 = 16;

/// The flows' line colors, in turn: saturated and far apart, so thin lines stay readable and
/// distinct from the black aggregate and the red bottleneck.
const FLOW_COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(23, 190, 207),
];

fn draw(root: &Area<'_>, runs: &[Run], title: &str) -> DrawResult {
    root.fill(&WHITE)?;
    let body = root.titled(title, ("sans-serif", TITLE_FONT))?;
    if runs.is_empty() {
        body.draw(&Text::new("no runs", (20, 20), ("sans-serif", LABEL_FONT)))?;
        return Ok(());
    }
    let plotted: Vec<Plotted> = runs.iter().map(Plotted::of).collect();
    // Time runs to the end of the longest recording, with no headroom: nothing is after it.
    let x_max = runs.iter().map(|r| us(r.end_ns())).fold(0.0, f64::max);
    let x_max = if x_max > 0.0 { x_max } else { 1.0 };
    let rate_max = axis_top(
        runs.iter()
            .map(|r| r.bottleneck_bps as f64 / NS_PER_S)
            .chain(plotted.iter().flat_map(|p| {
                p.aggregate_gbps
                    .iter()
                    .chain(p.flows_gbps.iter().flatten())
                    .copied()
            })),
    );
    let queue_max = axis_top(
        runs.iter()
            .map(|r| kb(r.kmax_bytes))
            .chain(plotted.iter().flat_map(|p| p.queue_kb.iter().copied())),
    );
    // The legend goes where it names every flow: on the first run with the most flows.
    let most_flows = runs.iter().map(|r| r.flows).max().unwrap_or(0);
    let legend_column = runs.iter().position(|r| r.flows == most_flows);
    let cells = body.split_evenly((2, runs.len()));
    let (rates, queues) = cells.split_at(runs.len());
    for (i, (run, p)) in runs.iter().zip(&plotted).enumerate() {
        let legend = legend_column == Some(i);
        draw_rates(&rates[i], run, p, (0.0..x_max, 0.0..rate_max), legend)?;
        draw_queue(&queues[i], run, p, (0.0..x_max, 0.0..queue_max))?;
    }
    Ok(())
}

/// A chart with its axes, its grid and the flows' joins and leaves (gray verticals).
fn chart<'a>(
    area: &Area<'a>,
    caption: Option<&str>,
    p: &Plotted,
    (x, y): (Range<f64>, Range<f64>),
    y_desc: &str,
) -> Result<Chart<'a>, DrawingAreaErrorKind<io::Error>> {
    let mut builder = ChartBuilder::on(area);
    if let Some(caption) = caption {
        builder.caption(caption, ("sans-serif", CAPTION_FONT));
    }
    let top = y.end;
    let mut chart = builder
        .margin(12)
        // Room for the last time label, centred on the right edge.
        .margin_right(30)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .x_desc("time (µs)")
        .y_desc(y_desc)
        .x_labels(6)
        .x_label_formatter(&|us| format!("{us:.0}"))
        .y_labels(6)
        .max_light_lines(0)
        .bold_line_style(RGBColor(225, 225, 225))
        .label_style(("sans-serif", LABEL_FONT))
        .axis_desc_style(("sans-serif", LABEL_FONT))
        .draw()?;
    for &t in &p.events_us {
        chart.draw_series(LineSeries::new(
            [(t, 0.0), (t, top)],
            RGBColor(170, 170, 170).stroke_width(1),
        ))?;
    }
    Ok(chart)
}

/// A legend entry: a short stroke in the series' style.
fn legend_stroke(style: ShapeStyle) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style)
}

fn draw_rates(
    area: &Area<'_>,
    run: &Run,
    p: &Plotted,
    axes: (Range<f64>, Range<f64>),
    legend: bool,
) -> DrawResult {
    let x = axes.0.clone();
    let mut chart = chart(area, Some(&run.cc), p, axes, "send rate (Gbit/s)")?;
    for (f, rates) in p.flows_gbps.iter().enumerate() {
        let style = FLOW_COLORS[f % FLOW_COLORS.len()].stroke_width(2);
        chart
            .draw_series(LineSeries::new(p.line(rates), style))?
            .label(format!("flow {f}"))
            .legend(legend_stroke(style));
    }
    for (f, rates) in p.set_gbps.iter().enumerate() {
        let style = FLOW_COLORS[f % FLOW_COLORS.len()].mix(0.6).stroke_width(1);
        let series = chart.draw_series(DashedLineSeries::new(p.line(rates), 4, 3, style))?;
        if f == 0 {
            series
                .label("controller rate (dashed)")
                .legend(legend_stroke(style));
        }
    }
    let style = BLACK.stroke_width(3);
    chart
        .draw_series(LineSeries::new(p.line(&p.aggregate_gbps), style))?
        .label("aggregate")
        .legend(legend_stroke(style));
    let bottleneck = run.bottleneck_bps as f64 / NS_PER_S;
    let style = RED.stroke_width(2);
    chart
        .draw_series(DashedLineSeries::new(
            [(x.start, bottleneck), (x.end, bottleneck)],
            8,
            5,
            style,
        ))?
        .label("bottleneck")
        .legend(legend_stroke(style));
    // One legend is enough: every column draws its series in the same colors.
    if legend {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", LABEL_FONT))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

fn draw_queue(
    area: &Area<'_>,
    run: &Run,
    p: &Plotted,
    axes: (Range<f64>, Range<f64>),
) -> DrawResult {
    let x = axes.0.clone();
    let mut chart = chart(area, None, p, axes, "queue (KB)")?;
    chart.draw_series(LineSeries::new(
        p.line(&p.queue_kb),
        RGBColor(40, 40, 120).stroke_width(2),
    ))?;
    let thresholds = [
        ("Kmin", run.kmin_bytes, RGBColor(230, 140, 0)),
        ("Kmax", run.kmax_bytes, RED),
    ];
    for (name, bytes, color) in thresholds {
        let level = kb(bytes);
        chart.draw_series(DashedLineSeries::new(
            [(x.start, level), (x.end, level)],
            8,
            5,
            color.stroke_width(2),
        ))?;
        // The name just above the line, at its left end.
        chart.draw_series(std::iter::once(
            EmptyElement::at((x.start, level))
                + Text::new(
                    name,
                    (6, -20),
                    ("sans-serif", LABEL_FONT).into_font().color(&color),
                ),
        ))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIN_NS: u64 = 1_000;
    /// 8 Gbit/s: 1000 bytes per 1 µs bin.
    const BOTTLENECK_BPS: u64 = 8_000_000_000;

    /// Two flows through an 8 Gbit/s bottleneck in 1 µs bins, rates averaged over 2 bins.
    /// Flow 0 runs over [0, 20) µs, flow 1 over [5, 15) µs. Each sends 1000 B per bin, so from
    /// bin 5 the link is oversubscribed twice and the queue grows 1000 B per bin; from bin 9
    /// both send 400 B per bin (the queue drains 200 B per bin); once flow 1 has left, flow 0
    /// takes the link back: 1000 B per bin from bin 15. The bottleneck delivers 1000 B in
    /// every bin.
    fn two_flows() -> Run {
        let bins = 20;
        let mut arrived = Vec::new();
        let mut queue_max = Vec::new();
        let mut queue: u32 = 0;
        for b in 0..bins {
            let (f0, f1) = match b {
                0..=4 => (1000, 0),
                5..=8 => (1000, 1000),
                9..=14 => (400, 400),
                _ => (1000, 0),
            };
            arrived.extend([f0, f1]);
            queue = (queue + (f0 + f1) as u32).saturating_sub(1000);
            queue_max.push(queue);
        }
        Run {
            cc: "dcqcn".into(),
            bin_ns: BIN_NS,
            flows: 2,
            arrived,
            departed: vec![1000; bins],
            queue_max,
            marks: vec![0; bins],
            drops: vec![0; bins],
            schedule: vec![(0, 20_000), (5_000, 15_000)],
            bottleneck_bps: BOTTLENECK_BPS,
            kmin_bytes: 2_500,
            kmax_bytes: 8_000,
            rate_window_ns: 2_000,
            queue_p50_bytes: 2_800,
            queue_p99_bytes: 4_000,
            drops_total: 0,
            marks_total: 17,
            fct: Vec::new(),
            set_rates: Vec::new(),
        }
    }

    /// One flow sending `bytes[b]` in bin b.
    fn one_flow(bytes: &[u64], rate_window_ns: u64) -> Run {
        Run {
            bin_ns: BIN_NS,
            flows: 1,
            arrived: bytes.to_vec(),
            rate_window_ns,
            bottleneck_bps: BOTTLENECK_BPS,
            ..Run::default()
        }
    }

    #[test]
    fn the_queue_of_the_two_flow_run_is_as_described() {
        let run = two_flows();
        assert_eq!(
            run.queue_max,
            [
                0, 0, 0, 0, 0, 1000, 2000, 3000, 4000, 3800, 3600, 3400, 3200, 3000, 2800, 2800,
                2800, 2800, 2800, 2800
            ]
        );
    }

    #[test]
    fn aggregate_rate_is_a_moving_average_over_the_window() {
        let run = two_flows();
        let gbps: Vec<f64> = rate_series(&run, &[0, 1])
            .iter()
            .map(|bps| bps / 1e9)
            .collect();
        assert_eq!(
            gbps,
            [
                4.0, 8.0, 8.0, 8.0, 8.0, 12.0, 16.0, 16.0, 16.0, 11.2, 6.4, 6.4, 6.4, 6.4, 6.4,
                7.2, 8.0, 8.0, 8.0, 8.0
            ]
        );
    }

    #[test]
    fn rate_window_rounds_to_whole_bins_and_is_at_least_one() {
        let bytes = [1000, 3000, 0, 2000];
        // 0 and 1.499 µs are one bin: the rate of each bin alone.
        for window in [0, 1_499] {
            assert_eq!(
                rate_series(&one_flow(&bytes, window), &[0]),
                [8e9, 24e9, 0.0, 16e9]
            );
        }
        // 1.5 µs is two bins.
        assert_eq!(
            rate_series(&one_flow(&bytes, 1_500), &[0]),
            [4e9, 16e9, 12e9, 8e9]
        );
    }

    #[test]
    fn rate_series_ignores_unknown_flows_and_handles_no_bins() {
        let run = one_flow(&[1000, 1000], 1_000);
        assert_eq!(rate_series(&run, &[0, 7]), [8e9, 8e9]);
        assert_eq!(rate_series(&run, &[]), [0.0, 0.0]);
        assert!(rate_series(&Run::default(), &[0]).is_empty());
        // A run without a bin width has no time axis, whatever it recorded.
        let no_width = Run { bin_ns: 0, ..run };
        assert!(rate_series(&no_width, &[0]).is_empty());
    }

    #[test]
    fn reaction_runs_from_the_queue_passing_kmin_to_the_aggregate_falling_to_the_bottleneck() {
        let f = figures(&two_flows());
        // The queue first exceeds Kmin (2500 B) in bin 7 (3000 B), with both flows active.
        assert_eq!(f.congested_from_us, Some(8.0));
        // The aggregate falls to 6.4 Gbit/s <= 8 at the end of bin 10 (11 µs).
        assert_eq!(f.reaction_us, Some(3.0));
    }

    #[test]
    fn recovery_runs_from_the_competitor_leaving_to_95_percent_of_the_bottleneck() {
        let f = figures(&two_flows());
        assert_eq!(f.competing_left_us, Some(15.0));
        // Flow 0 alone: 3.2 Gbit/s at 15 µs, 5.6 at 16, 8.0 >= 7.6 at 17.
        assert_eq!(f.recovery_us, Some(2.0));
    }

    #[test]
    fn recovery_starts_at_the_first_bin_end_after_a_leave_inside_a_bin() {
        let mut run = two_flows();
        run.schedule[1].1 = 14_500;
        let f = figures(&run);
        assert_eq!(f.competing_left_us, Some(14.5));
        // The first bin end at or after 14.5 µs is 15 µs; flow 0 reaches 8.0 at 17 µs.
        assert_eq!(f.recovery_us, Some(2.5));
    }

    #[test]
    fn reaction_and_recovery_are_none_when_they_never_happen() {
        // Both flows keep sending 1000 B per bin while both are active, then flow 0 alone
        // sends `after` per bin.
        let run_with = |after: u64| {
            let mut run = two_flows();
            for b in 0..20 {
                let both = (5..15).contains(&b);
                run.arrived[2 * b] = if b < 15 { 1000 } else { after };
                run.arrived[2 * b + 1] = if both { 1000 } else { 0 };
            }
            run
        };

        // 1500 B per bin keeps the aggregate above the bottleneck: no reaction; flow 0 alone
        // is at 8 Gbit/s already at the end of bin 14 (15 µs), the instant flow 1 leaves.
        let f = figures(&run_with(1500));
        assert_eq!(f.congested_from_us, Some(8.0));
        assert_eq!(f.reaction_us, None);
        assert_eq!(f.competing_left_us, Some(15.0));
        assert_eq!(f.recovery_us, Some(0.0));

        // Flow 0 alone sending 500 B per bin (4 Gbit/s) never recovers.
        let mut run = two_flows();
        for b in 15..20 {
            run.arrived[2 * b] = 500;
        }
        let f = figures(&run);
        assert_eq!(f.reaction_us, Some(3.0));
        assert_eq!(f.recovery_us, None);

        // A queue that never passes Kmin starts no reaction.
        let mut run = run_with(1500);
        run.kmin_bytes = 10_000;
        let f = figures(&run);
        assert_eq!(f.congested_from_us, None);
        assert_eq!(f.reaction_us, None);
    }

    #[test]
    fn a_queue_built_by_one_flow_alone_is_not_congestion() {
        let mut run = two_flows();
        // Flow 0 alone, before flow 1 joins, queues 3000 B in bin 2.
        run.queue_max[2] = 3000;
        assert_eq!(figures(&run).congested_from_us, Some(8.0));
    }

    #[test]
    fn competing_left_is_the_latest_leave_but_the_last_flows() {
        let with_leaves = |leaves: &[u64]| Run {
            flows: leaves.len(),
            schedule: leaves.iter().map(|&leave| (0, leave)).collect(),
            ..Run::default()
        };
        assert_eq!(competing_left_ns(&with_leaves(&[30, 10, 20])), Some(20));
        // Two flows leaving last together: the competition ended with the one before them.
        assert_eq!(competing_left_ns(&with_leaves(&[30, 10, 30])), Some(10));
        assert_eq!(competing_left_ns(&with_leaves(&[30, 30])), None);
        assert_eq!(competing_left_ns(&with_leaves(&[30])), None);
        assert_eq!(competing_left_ns(&with_leaves(&[])), None);
    }

    #[test]
    fn utilization_of_a_link_kept_exactly_full_is_one() {
        let f = figures(&two_flows());
        assert_eq!(f.utilization, Some(1.0));
    }

    #[test]
    fn utilization_counts_only_whole_bins_with_two_flows_active() {
        let mut run = two_flows();
        // Outside the congested period [5, 15) µs, nothing counts.
        for b in (0..5).chain(15..20) {
            run.departed[b] = 0;
        }
        // Inside it, 7 full bins and 3 half-full ones: (7000 + 1500) / 10000.
        for b in 12..15 {
            run.departed[b] = 500;
        }
        assert_eq!(figures(&run).utilization, Some(0.85));

        // Flow 1 joining in the middle of bin 5 and leaving in the middle of bin 14 leaves
        // bins 6..=13 whole: 6 full and 2 half-full ones.
        run.schedule[1] = (5_500, 14_500);
        assert_eq!(figures(&run).utilization, Some(0.875));
    }

    #[test]
    fn utilization_is_none_without_two_flows_at_once_or_a_bottleneck_rate() {
        let mut run = two_flows();
        run.schedule[1] = (20_000, 25_000);
        assert_eq!(figures(&run).utilization, None);
        let mut run = two_flows();
        run.bottleneck_bps = 0;
        assert_eq!(figures(&run).utilization, None);
    }

    #[test]
    fn per_flow_throughput_is_over_each_flows_own_interval() {
        let f = figures(&two_flows());
        let flows: Vec<(usize, u64, f64)> =
            f.flows.iter().map(|f| (f.flow, f.bytes, f.gbps)).collect();
        // Flow 0: 5·1000 + 4·1000 + 6·400 + 5·1000 B over 20 µs; flow 1: 4·1000 + 6·400 B over
        // 10 µs.
        assert_eq!(flows, [(0, 16_400, 6.56), (1, 6_400, 5.12)]);
    }

    #[test]
    fn per_flow_throughput_clamps_the_interval_to_the_recording() {
        let mut run = two_flows();
        run.schedule[0] = (0, u64::MAX);
        run.schedule[1] = (30_000, 40_000);
        let f = figures(&run);
        assert_eq!(f.flows[0].gbps, 6.56);
        assert_eq!((f.flows[1].bytes, f.flows[1].gbps), (0, 0.0));
    }

    #[test]
    fn jain_of_equal_shares_is_one_and_of_one_taker_is_one_over_n() {
        assert_eq!(jain(&[2.0, 2.0, 2.0]), Some(1.0));
        assert_eq!(jain(&[5.0, 0.0, 0.0, 0.0]), Some(0.25));
        // (1 + 3)² / (2 · (1 + 9)) = 16 / 20.
        assert_eq!(jain(&[1.0, 3.0]), Some(0.8));
    }

    #[test]
    fn jain_is_none_for_nothing_to_share() {
        assert_eq!(jain(&[]), None);
        assert_eq!(jain(&[0.0, 0.0]), None);
        assert_eq!(jain(&[f64::NAN, 1.0]), None);
    }

    #[test]
    fn jain_of_a_run_is_over_the_time_all_flows_are_active() {
        // Over [5, 15) µs both flows sent the same bytes, though their own throughputs differ.
        let f = figures(&two_flows());
        assert_eq!(f.jain, Some(1.0));

        let mut run = two_flows();
        // Flow 1 takes three times what flow 0 gets while both are active.
        for b in 5..15 {
            run.arrived[2 * b] = 250;
            run.arrived[2 * b + 1] = 750;
        }
        assert_eq!(figures(&run).jain, Some(0.8));
    }

    #[test]
    fn jain_of_a_run_falls_back_to_own_intervals_when_flows_never_overlap() {
        // Flow 0 sends 1000 B per bin over [0, 2) µs, flow 1 3000 B per bin over [2, 4) µs:
        // 8 and 24 Gbit/s over their own intervals.
        let run = Run {
            bin_ns: BIN_NS,
            flows: 2,
            arrived: vec![1000, 0, 1000, 0, 0, 3000, 0, 3000],
            schedule: vec![(0, 2_000), (2_000, 4_000)],
            ..Run::default()
        };
        let f = figures(&run);
        let gbps: Vec<f64> = f.flows.iter().map(|f| f.gbps).collect();
        assert_eq!(gbps, [8.0, 24.0]);
        assert_eq!(f.jain, Some(0.8));
    }

    #[test]
    fn fct_percentiles_are_nearest_rank_overall_and_split_at_64_kib() {
        // Messages of 1..=1000 µs, in a scrambled order; the first 600 are small (the last of
        // them exactly 64 KiB), the others 1 MiB.
        let fct: Vec<(u32, u64)> = (0..1000u64)
            .map(|i| (i * 7919) % 1000 + 1)
            .map(|us| {
                let size = match us {
                    600 => SMALL_MESSAGE_BYTES,
                    1..=599 => 4096,
                    _ => 1 << 20,
                };
                (size, us * 1000)
            })
            .collect();
        let f = figures(&Run {
            fct,
            ..Run::default()
        });
        let all = &f.fct;
        assert_eq!(all.count, 1000);
        assert_eq!(
            (all.p50_us, all.p99_us, all.p999_us, all.max_us),
            (Some(500.0), Some(990.0), Some(999.0), Some(1000.0))
        );
        let small = &f.fct_small;
        assert_eq!(small.count, 600);
        assert_eq!(
            (small.p50_us, small.p99_us, small.p999_us, small.max_us),
            (Some(300.0), Some(594.0), Some(600.0), Some(600.0))
        );
        let large = &f.fct_large;
        assert_eq!(large.count, 400);
        assert_eq!(
            (large.p50_us, large.p99_us, large.p999_us, large.max_us),
            (Some(800.0), Some(996.0), Some(1000.0), Some(1000.0))
        );
    }

    #[test]
    fn fct_of_one_message_is_that_message_everywhere() {
        let f = fct_figures([2_500].into_iter());
        assert_eq!(
            (f.count, f.p50_us, f.p99_us, f.p999_us, f.max_us),
            (1, Some(2.5), Some(2.5), Some(2.5), Some(2.5))
        );
    }

    #[test]
    fn empty_runs_give_none_and_serialize_without_nan() {
        let odd = [
            Run::default(),
            // Flows and a schedule but no bins.
            Run {
                bin_ns: BIN_NS,
                flows: 2,
                schedule: vec![(0, 10_000), (0, 10_000)],
                bottleneck_bps: BOTTLENECK_BPS,
                ..Run::default()
            },
            // Bins but no bin width, and series of different lengths.
            Run {
                flows: 3,
                arrived: vec![1, 2, 3, 4],
                departed: vec![5],
                queue_max: vec![u32::MAX; 3],
                ..Run::default()
            },
        ];
        for run in odd {
            let f = figures(&run);
            assert_eq!(f.reaction_us, None);
            assert_eq!(f.recovery_us, None);
            assert_eq!(f.utilization, None);
            assert_eq!(f.jain, None);
            assert_eq!(f.fct.count, 0);
            assert_eq!(f.fct.p50_us, None);
            assert_eq!(f.fct_small.max_us, None);
            assert_eq!(f.fct_large.p999_us, None);
            let json = serde_json::to_string(&f).unwrap();
            assert!(!json.contains("NaN") && !json.contains("inf"), "{json}");
            assert!(json.contains("\"reaction_us\":null"), "{json}");
        }
        assert!(figures(&Run::default()).flows.is_empty());
    }

    #[test]
    fn short_series_read_as_zeros() {
        // Three bins of arrivals, one of everything else.
        let run = Run {
            bin_ns: BIN_NS,
            flows: 1,
            arrived: vec![1000, 1000, 1000],
            departed: vec![1000],
            queue_max: vec![10],
            ..Run::default()
        };
        assert_eq!(run.bins(), 3);
        assert_eq!(rate_series(&run, &[0]), [8e9, 8e9, 8e9]);
        // A partial last row of arrivals is a bin whose missing flows sent nothing.
        let partial = Run {
            flows: 2,
            arrived: vec![1000, 3000, 2000],
            ..run
        };
        assert_eq!(partial.bins(), 2);
        assert_eq!(rate_series(&partial, &[0, 1]), [32e9, 16e9]);
    }

    fn csv_text(runs: &[Run]) -> String {
        let mut out = Vec::new();
        write_csv_to(&mut out, runs).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// A three-flow run of two bins, each flow sending 1000, 2000, 3000 B per bin.
    fn three_flows() -> Run {
        Run {
            cc: "ack".into(),
            bin_ns: 2 * BIN_NS,
            flows: 3,
            arrived: vec![1000, 2000, 3000, 1000, 2000, 3000],
            departed: vec![6000, 6000],
            queue_max: vec![100, 200],
            marks: vec![1, 2],
            drops: vec![3, 4],
            rate_window_ns: 2_000,
            ..Run::default()
        }
    }

    #[test]
    fn csv_has_the_header_and_one_row_per_bin_per_run() {
        let csv = csv_text(&[two_flows(), three_flows()]);
        let mut lines = csv.lines();
        assert_eq!(
            lines.next(),
            Some(
                "cc,time_us,aggregate_gbps,queue_bytes,marks,drops,flow_0_gbps,flow_1_gbps,flow_2_gbps,flow_0_set_gbps,flow_1_set_gbps,flow_2_set_gbps"
            )
        );
        let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
        assert_eq!(rows.len(), 20 + 2);
        // Without controller rates the set columns are empty.
        assert!(
            rows.iter()
                .all(|r| r.len() == 12 && r[9..].iter().all(|c| c.is_empty()))
        );
        assert_eq!(rows.iter().filter(|r| r[0] == "dcqcn").count(), 20);
        assert_eq!(rows.iter().filter(|r| r[0] == "ack").count(), 2);
    }

    #[test]
    fn csv_parses_back_to_the_numbers() {
        let runs = [two_flows(), three_flows()];
        let csv = csv_text(&runs);
        let rows: Vec<Vec<String>> = csv
            .lines()
            .skip(1)
            .map(|l| l.split(',').map(str::to_owned).collect())
            .collect();
        let number = |s: &str| s.parse::<f64>().unwrap();

        // The two-flow run, bin 10: 11 µs, 6.4 Gbit/s (3.2 each), 3600 B queued; its third
        // flow column is empty.
        let row = &rows[10];
        assert_eq!(row[0], "dcqcn");
        let numbers: Vec<f64> = row[1..8].iter().map(|s| number(s)).collect();
        assert_eq!(numbers, [11.0, 6.4, 3600.0, 0.0, 0.0, 3.2, 3.2]);
        assert_eq!(row[8], "");
        // Every row of it agrees with the series.
        let aggregate = rate_series(&runs[0], &[0, 1]);
        for (b, row) in rows[..20].iter().enumerate() {
            assert_eq!(number(&row[1]), (b + 1) as f64);
            assert_eq!(number(&row[2]), aggregate[b] / 1e9);
            assert_eq!(number(&row[3]), f64::from(runs[0].queue_max[b]));
        }

        // The three-flow run (2 µs bins, a 2 µs window), bin 1: 4, 8 and 12 Gbit/s.
        let row = &rows[21];
        assert_eq!(row[0], "ack");
        let numbers: Vec<f64> = row[1..9].iter().map(|s| number(s)).collect();
        assert_eq!(numbers, [4.0, 24.0, 200.0, 2.0, 4.0, 4.0, 8.0, 12.0]);
    }

    #[test]
    fn csv_quotes_a_label_with_a_comma_or_quote() {
        let run = Run {
            cc: "dcqcn, \"tuned\"".into(),
            ..one_flow(&[1000], 1_000)
        };
        let csv = csv_text(&[run]);
        assert_eq!(
            csv.lines().nth(1),
            Some("\"dcqcn, \"\"tuned\"\"\",1,8,0,0,0,8,")
        );
    }

    #[test]
    fn csv_of_no_runs_is_the_header_alone() {
        assert_eq!(
            csv_text(&[]),
            "cc,time_us,aggregate_gbps,queue_bytes,marks,drops\n"
        );
    }

    fn temp_path(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("portico-report-{}-{name}", std::process::id()))
    }

    #[test]
    fn write_csv_writes_the_file_and_reports_a_bad_path() {
        let path = temp_path("series.csv");
        write_csv(&path, &[two_flows()]).unwrap();
        let written = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(written, csv_text(&[two_flows()]));
        let missing = temp_path("no-such-dir").join("series.csv");
        assert!(write_csv(&missing, &[two_flows()]).is_err());
    }

    /// The contents of the SVG's text elements, trimmed.
    fn svg_texts(svg: &str) -> Vec<&str> {
        svg.split("<text")
            .skip(1)
            .filter_map(|element| {
                let (_, rest) = element.split_once('>')?;
                let (text, _) = rest.split_once("</text>")?;
                Some(text.trim())
            })
            .collect()
    }

    #[test]
    fn svg_has_a_column_per_run_with_its_label() {
        let mut runs = vec![two_flows(), two_flows(), three_flows()];
        runs[0].cc = "none".into();
        let path = temp_path("plot.svg");
        write_svg(&path, &runs, "congestion: 2 flows").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        assert!(svg.trim_end().ends_with("</svg>"));
        let texts = svg_texts(&svg);
        for label in [
            "none",
            "dcqcn",
            "ack",
            "congestion: 2 flows",
            "time (µs)",
            "queue (KB)",
        ] {
            assert!(texts.contains(&label), "no {label} in {texts:?}");
        }
        // One legend, in the column of the three-flow run; the Kmin and Kmax names on each of
        // the three queue charts.
        assert_eq!(texts.iter().filter(|&&t| t == "aggregate").count(), 1);
        assert!(texts.contains(&"flow 2"));
        assert_eq!(texts.iter().filter(|&&t| t == "Kmin").count(), 3);
    }

    #[test]
    fn svg_of_odd_runs_is_still_written() {
        for runs in [
            vec![],
            vec![Run::default()],
            vec![Run::default(), two_flows()],
        ] {
            let svg = render_svg(&runs, "<odd> & empty").unwrap();
            assert!(svg.starts_with("<svg"));
            assert!(svg_texts(&svg).contains(&"&lt;odd&gt; &amp; empty"));
        }
        let missing = temp_path("no-such-dir").join("plot.svg");
        assert!(write_svg(&missing, &[two_flows()], "t").is_err());
    }
    #[test]
    fn with_controller_rates_reaction_and_recovery_read_them() {
        // The two-flow run, with controller rates: flow 0 at 8 Gbit/s, cut to 3 at bin 9 (its
        // end, 10 µs, is 2 µs after the queue passed Kmin at 8 µs); flow 1 at 5 from its join;
        // flow 0 back to 8 in bin 16 (end 17 µs, 2 µs after flow 1 left at 15 µs).
        let mut run = two_flows();
        let bins = run.bins();
        let mut rates = vec![0u64; bins * 2];
        for b in 0..bins {
            rates[b * 2] = match b {
                0..=8 => 8_000_000_000,
                9..=15 => 3_000_000_000,
                _ => 8_000_000_000,
            };
            if b == 5 {
                rates[b * 2 + 1] = 5_000_000_000; // then carried forward
            }
        }
        run.set_rates = rates;
        let f = figures(&run);
        assert_eq!(f.rate_basis, "controller");
        assert_eq!(f.reaction_us, Some(2.0));
        assert_eq!(f.recovery_us, Some(2.0));
        let sum = set_rate_series(&run, &[0, 1]).unwrap();
        assert_eq!(sum[4], 8e9, "flow 1 not on yet");
        assert_eq!(sum[6], 13e9);
        assert_eq!(sum[9], 8e9);
        let without = Run {
            set_rates: Vec::new(),
            ..run
        };
        assert_eq!(figures(&without).rate_basis, "measured");
    }
}
