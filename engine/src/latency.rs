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

    /// The percentile distribution as (percentile 0..=100, value ns) points, five per halving
    /// of what is left (the points of a `.hgrm`), ending at the maximum.
    pub fn percentile_curve(&self) -> Vec<(f64, u64)> {
        self.h
            .iter_quantiles(5)
            .map(|v| (v.quantile_iterated_to() * 100.0, v.value_iterated_to()))
            .collect()
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

/// Per-interval latency histograms for an HdrHistogram interval log (`.hlog`, what
/// `HistogramLogProcessor`, wrk2 and TRex write and read): one histogram per tag (operation
/// type) per interval, closed by [`IntervalLog::tick`] when the interval is over, written at
/// the end by [`IntervalLog::write`]. Recording does not allocate; closing an interval copies
/// its histograms (once per interval, on the host's thread).
pub struct IntervalLog {
    tags: Vec<String>,
    interval: std::time::Duration,
    /// Start of the log and of the open interval.
    t0: std::time::Instant,
    open_at: std::time::Duration,
    current: Vec<Latency>,
    /// Closed intervals: (start since t0, length, tag index, histogram); empty ones are left out.
    closed: Vec<(std::time::Duration, std::time::Duration, usize, Latency)>,
    start_wall: std::time::SystemTime,
}

impl IntervalLog {
    /// A log starting now, with histograms tagged `tags`, closed every `interval`.
    pub fn new(tags: &[String], interval: std::time::Duration) -> IntervalLog {
        IntervalLog {
            tags: tags.to_vec(),
            interval,
            t0: std::time::Instant::now(),
            open_at: std::time::Duration::ZERO,
            current: tags.iter().map(|_| Latency::new()).collect(),
            closed: Vec::new(),
            start_wall: std::time::SystemTime::now(),
        }
    }

    /// Records one latency under tag `tag` (an index into the tags) in the open interval.
    #[inline]
    pub fn record(&mut self, tag: usize, ns: u64) {
        self.current[tag].record(ns);
    }

    /// Closes the open interval if it is over at `now`.
    pub fn tick(&mut self, now: std::time::Instant) {
        let at = now.saturating_duration_since(self.t0);
        if at >= self.open_at + self.interval {
            self.close(at);
        }
    }

    /// Closes the open interval at `now` (the end of the run).
    pub fn finish(&mut self, now: std::time::Instant) {
        let at = now.saturating_duration_since(self.t0);
        self.close(at.max(self.open_at));
    }

    fn close(&mut self, at: std::time::Duration) {
        let len = at - self.open_at;
        for (k, h) in self.current.iter_mut().enumerate() {
            if h.count() > 0 {
                self.closed.push((self.open_at, len, k, h.clone()));
                h.h.reset();
            }
        }
        self.open_at = at;
    }

    /// The interval's nominal length.
    pub fn interval(&self) -> std::time::Duration {
        self.interval
    }

    /// Intervals closed so far (one line each in the log).
    pub fn intervals(&self) -> usize {
        self.closed.len()
    }

    /// The closed intervals: start (since the log began), length, tag, histogram.
    pub fn closed(
        &self,
    ) -> impl Iterator<Item = (std::time::Duration, std::time::Duration, &str, &Latency)> + '_ {
        self.closed
            .iter()
            .map(|(start, len, k, h)| (*start, *len, self.tags[*k].as_str(), h))
    }

    /// Writes the log: a comment, the start time, values in microseconds in the max column
    /// (`MaxValueDivisor` 1000; the histograms themselves hold nanoseconds), then one line per
    /// interval and tag with its compressed histogram.
    pub fn write(&self, mut w: impl Write, comment: &str) -> io::Result<()> {
        use hdrhistogram::serialization::V2DeflateSerializer;
        use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
        let mut serializer = V2DeflateSerializer::new();
        let mut log = IntervalLogWriterBuilder::new()
            .add_comment(comment)
            .add_comment("the histograms hold ns; the max column is in µs")
            .with_start_time(self.start_wall)
            .with_base_time(self.start_wall)
            .with_max_value_divisor(1000.0)
            .begin_log_with(&mut w, &mut serializer)?;
        for (start, len, k, h) in &self.closed {
            log.write_histogram(&h.h, *start, *len, Tag::new(&self.tags[*k]))
                .map_err(|e| io::Error::other(format!("writing an interval: {e:?}")))?;
        }
        Ok(())
    }
}

/// One line of an interval log read back: its tag, start, length and histogram.
#[derive(Debug, Clone)]
pub struct LoggedInterval {
    pub tag: Option<String>,
    pub start: std::time::Duration,
    pub duration: std::time::Duration,
    pub histogram: hdrhistogram::Histogram<u64>,
}

/// Reads an interval log (`.hlog`) back: every interval line, decoded; an error names what
/// could not be read.
pub fn read_interval_log(bytes: &[u8]) -> Result<Vec<LoggedInterval>, String> {
    use base64::Engine;
    use hdrhistogram::serialization::Deserializer;
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
    let mut de = Deserializer::new();
    let mut out = Vec::new();
    for entry in IntervalLogIterator::new(bytes) {
        let entry = entry.map_err(|e| format!("a line of the log: {e:?}"))?;
        let LogEntry::Interval(h) = entry else {
            continue;
        };
        let raw = base64::engine::general_purpose::STANDARD
            .decode(h.encoded_histogram())
            .map_err(|e| format!("an interval's base64: {e}"))?;
        let histogram = de
            .deserialize(&mut std::io::Cursor::new(raw))
            .map_err(|e| format!("an interval's histogram: {e:?}"))?;
        out.push(LoggedInterval {
            tag: h.tag().map(|t| t.as_str().to_string()),
            start: h.start_timestamp(),
            duration: h.duration(),
            histogram,
        });
    }
    Ok(out)
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
    #[test]
    fn an_interval_log_parses_back_interval_by_interval() {
        use std::time::Duration;
        let mut log = super::IntervalLog::new(
            &["write".to_string(), "read".to_string()],
            Duration::from_millis(100),
        );
        let t0 = log.t0;
        // Interval 1: 1000 writes of 1..=1000 µs; interval 2: 10 reads of 5 ms; then nothing
        // for an interval (no line), then 3 writes of 2 µs.
        for i in 1..=1000u64 {
            log.record(0, i * 1000);
        }
        log.tick(t0 + Duration::from_millis(50));
        assert_eq!(log.intervals(), 0, "not over yet");
        log.tick(t0 + Duration::from_millis(100));
        for _ in 0..10 {
            log.record(1, 5_000_000);
        }
        log.tick(t0 + Duration::from_millis(200));
        log.tick(t0 + Duration::from_millis(300));
        for _ in 0..3 {
            log.record(0, 2000);
        }
        log.finish(t0 + Duration::from_millis(350));
        assert_eq!(log.intervals(), 3);
        let mut out = Vec::new();
        log.write(&mut out, "portico test").unwrap();
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(text.starts_with("#portico test\n"), "{text}");
        assert!(text.contains("#[MaxValueDivisor: 1000.000]"), "{text}");
        let seen: Vec<_> = super::read_interval_log(&out)
            .unwrap()
            .into_iter()
            .map(|i| {
                (
                    i.tag,
                    i.start.as_millis(),
                    i.duration.as_millis(),
                    i.histogram.len(),
                    i.histogram.max(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (Some("write".into()), 0, 100, 1000, 1_000_447),
                (Some("read".into()), 100, 100, 10, 5_001_215),
                (Some("write".into()), 300, 50, 3, 2000),
            ]
        );
    }

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
