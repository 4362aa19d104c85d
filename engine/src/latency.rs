//! Latency histograms in nanoseconds (HdrHistogram, 3 significant digits: at most 0.1 %
//! quantisation), the percentiles users of latency tools expect (p50/p90/p99/p99.9/p99.99/max
//! with min, mean and standard deviation), and the `.hgrm` percentile-distribution text that
//! HdrHistogram's plotters and `HistogramLogProcessor` read.
//!
//! Callers that send at a set rate record latency from the *intended* send time, not the
//! actual one, so that a stall shows up in the histogram instead of silently delaying the
//! measurements behind it (coordinated omission).

use std::io::{self, Write};

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency recorded exactly: 1 hour. Longer ones are clamped to it.
pub const MAX_NS: u64 = 3_600_000_000_000;
const SIGFIG: u8 = 3;

/// The percentiles a summary reports, in order.
pub const PERCENTILES: [f64; 5] = [50.0, 90.0, 99.0, 99.9, 99.99];

/// A latency histogram in nanoseconds.
#[derive(Clone)]
pub struct Latency {
    h: Histogram<u64>,
}

impl Default for Latency {
    fn default() -> Self {
        Self::new()
    }
}

/// What a run prints and writes as JSON, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub min: u64,
    pub mean: f64,
    pub stddev: f64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p99_9: u64,
    pub p99_99: u64,
    pub max: u64,
}

impl Latency {
    pub fn new() -> Self {
        Latency {
            h: Histogram::new_with_bounds(1, MAX_NS, SIGFIG).expect("valid bounds"),
        }
    }

    /// Records one latency; never allocates (the histogram has a fixed range).
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.h.saturating_record(ns.clamp(1, MAX_NS));
    }

    /// Adds another histogram's counts (per-core histograms merged for the summary).
    pub fn merge(&mut self, other: &Latency) {
        self.h.add(&other.h).expect("same bounds");
    }

    pub fn count(&self) -> u64 {
        self.h.len()
    }

    /// Value at `percentile` (0..=100), in ns.
    pub fn percentile(&self, percentile: f64) -> u64 {
        self.h.value_at_percentile(percentile)
    }

    pub fn summary(&self) -> LatencySummary {
        let p = |q| self.h.value_at_percentile(q);
        LatencySummary {
            count: self.h.len(),
            min: if self.h.is_empty() { 0 } else { self.h.min() },
            mean: self.h.mean(),
            stddev: self.h.stdev(),
            p50: p(50.0),
            p90: p(90.0),
            p99: p(99.0),
            p99_9: p(99.9),
            p99_99: p(99.99),
            max: self.h.max(),
        }
    }

    /// Writes the percentile distribution in HdrHistogram's `.hgrm` text format, with values
    /// divided by `unit_ns` (1000 gives microseconds), five ticks per half-distance.
    pub fn write_hgrm(&self, mut w: impl Write, unit_ns: f64) -> io::Result<()> {
        writeln!(
            w,
            "{:>12} {:>14} {:>10} {:>14}",
            "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
        )?;
        writeln!(w)?;
        let mut total = 0u64;
        for v in self.h.iter_quantiles(5) {
            total += v.count_since_last_iteration();
            let value = v.value_iterated_to() as f64 / unit_ns;
            let q = v.quantile_iterated_to();
            if q < 1.0 {
                writeln!(
                    w,
                    "{value:12.3} {q:2.12} {total:10} {:14.2}",
                    1.0 / (1.0 - q)
                )?;
            } else {
                writeln!(w, "{value:12.3} {q:2.12} {total:10}")?;
            }
        }
        let sub_buckets = (2.0 * 10f64.powi(SIGFIG as i32)).log2().ceil().exp2() as u64;
        writeln!(
            w,
            "#[Mean    = {:12.3}, StdDeviation   = {:12.3}]",
            self.h.mean() / unit_ns,
            self.h.stdev() / unit_ns
        )?;
        writeln!(
            w,
            "#[Max     = {:12.3}, Total count    = {:12}]",
            self.h.max() as f64 / unit_ns,
            self.h.len()
        )?;
        writeln!(
            w,
            "#[Buckets = {:12}, SubBuckets     = {:12}]",
            self.h.buckets(),
            sub_buckets
        )
    }
}

impl std::fmt::Display for LatencySummary {
    /// `p50 1.23 µs  p90 ...  max ...` with a unit picked for the values.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let us = |ns: u64| format!("{:.2}", ns as f64 / 1000.0);
        write!(
            f,
            "n {}  min {}  p50 {}  p90 {}  p99 {}  p99.9 {}  p99.99 {}  max {}  (µs; mean {:.2}, sd {:.2})",
            self.count,
            us(self.min),
            us(self.p50),
            us(self.p90),
            us(self.p99),
            us(self.p99_9),
            us(self.p99_99),
            us(self.max),
            self.mean / 1000.0,
            self.stddev / 1000.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut l = Latency::new();
        for ns in 1..=10_000u64 {
            l.record(ns * 100); // 100 ns .. 1 ms, uniform
        }
        let s = l.summary();
        assert_eq!(s.count, 10_000);
        assert_eq!(s.min, 100);
        // Within HdrHistogram's 0.1 % quantisation of the exact values.
        for (got, exact) in [
            (s.p50, 500_000.0),
            (s.p90, 900_000.0),
            (s.p99, 990_000.0),
            (s.max, 1_000_000.0),
        ] {
            assert!(
                (got as f64 - exact).abs() <= exact * 0.001,
                "{got} vs {exact}"
            );
        }
        assert!((s.mean - 500_050.0).abs() < 500.0);
    }

    #[test]
    fn merge_adds_counts_and_clamps_extremes() {
        let mut a = Latency::new();
        let mut b = Latency::new();
        a.record(0);
        b.record(u64::MAX);
        a.merge(&b);
        let s = a.summary();
        assert_eq!(s.count, 2);
        assert_eq!(s.min, 1);
        assert!(s.max >= MAX_NS && s.max <= MAX_NS + MAX_NS / 1000);
    }

    #[test]
    fn hgrm_has_the_hdrhistogram_layout() {
        let mut l = Latency::new();
        for ns in [1000u64, 2000, 3000, 4000] {
            l.record(ns);
        }
        let mut out = Vec::new();
        l.write_hgrm(&mut out, 1000.0).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "       Value     Percentile TotalCount 1/(1-Percentile)"
        );
        assert_eq!(lines[1], "");
        assert_eq!(
            lines[2],
            "       1.000 0.000000000000          1           1.00"
        );
        let last_row = lines[lines.len() - 4];
        // Values are the highest equivalent value of their bucket, as HdrHistogram prints them.
        assert_eq!(last_row, "       4.001 1.000000000000          4");
        assert_eq!(
            lines[lines.len() - 3],
            "#[Mean    =        2.501, StdDeviation   =        1.118]"
        );
        assert_eq!(
            lines[lines.len() - 2],
            "#[Max     =        4.001, Total count    =            4]"
        );
        assert!(lines[lines.len() - 1].starts_with("#[Buckets = "));
        assert!(lines[lines.len() - 1].ends_with("SubBuckets     =         2048]"));
    }
}
