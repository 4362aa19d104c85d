//! `portico bench write|read|send|mixed --plot DIR`: the plots latency-benchmark users look at.
//!
//! - `latency.svg`: each operation type's latency percentile distribution on HdrHistogram's
//!   plotter axis, the percentile spread out as 1 / (1 - p) on a log scale (so 90 %, 99 %,
//!   99.9 % and 99.99 % take equal room and the tail is visible), latency in µs on a log
//!   scale too (the body and a tail a thousand times longer on one plot);
//! - `timeline.svg`: per operation type, operations per second and p99 latency over the run,
//!   from interval histograms (`IntervalLog`, 100 ms by default);
//! - `sweep.svg`, for a sweep (`--sizes`, `--all-sizes`, a `--qd` list): throughput and
//!   latency (p50, p99) against message size, one line per operation type and queue depth.
//!
//! In a sweep `latency.svg` has one curve per point, and the timeline runs through the points
//! one after the other.

use std::io;
use std::path::Path;

use plotters::prelude::*;

use crate::OpResult;
use plotters::chart::MeshStyle;
use plotters::coord::CoordTranslate;
use plotters::coord::ranged1d::Ranged;

use crate::plot::{Area, DrawResult, axis_top, drawing_error};
use portico::latency::{IntervalLog, Latency};

/// Colors of the operation types, in turn.
const COLORS: [RGBColor; 3] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
];
const TITLE_FONT: u32 = 24;
const LABEL_FONT: u32 = 16;
/// The rightmost point of the percentile axis: 1 / (1 - 99.999 %).
const MAX_SPREAD: f64 = 1e5;

/// (name, histogram) per operation type with something recorded.
pub type Named<'a> = Vec<(String, &'a Latency)>;

/// Writes `latency.svg` and `timeline.svg` into `dir` (created if missing); returns their
/// paths.
pub fn write(
    dir: &Path,
    title: &str,
    hists: &Named<'_>,
    log: &IntervalLog,
) -> io::Result<(std::path::PathBuf, std::path::PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let latency = dir.join("latency.svg");
    let timeline = dir.join("timeline.svg");
    std::fs::write(&latency, render_latency(title, hists)?)?;
    std::fs::write(&timeline, render_timeline(title, log)?)?;
    Ok((latency, timeline))
}

/// The color of curve `i` of `n`: the three operation types' own, or a palette for the many
/// curves of a sweep.
fn color(i: usize, n: usize) -> RGBColor {
    if n <= COLORS.len() {
        COLORS[i]
    } else {
        let (r, g, b) = Palette99::pick(i).rgb();
        RGBColor(r, g, b)
    }
}

/// A panel of the timeline or the sweep: its caption, margins and label areas.
fn panel<'a, 'x>(area: &'a Area<'x>, caption: &str) -> ChartBuilder<'a, 'static, SVGBackend<'x>> {
    let mut b = ChartBuilder::on(area);
    b.caption(caption, ("sans-serif", LABEL_FONT + 4))
        .margin(12)
        .margin_right(30)
        .x_label_area_size(40)
        .y_label_area_size(80);
    b
}

/// The meshes' common look: grey grid lines, no light ones, the label fonts.
fn look<'m, 'a, 'b, X: Ranged, Y: Ranged, DB: DrawingBackend>(
    m: &'m mut MeshStyle<'a, 'b, X, Y, DB>,
) -> &'m mut MeshStyle<'a, 'b, X, Y, DB> {
    m.max_light_lines(0)
        .bold_line_style(RGBColor(225, 225, 225))
        .label_style(("sans-serif", LABEL_FONT))
        .axis_desc_style(("sans-serif", LABEL_FONT))
}

/// The legend, at `at`.
fn legend<'a, 'x: 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'x>, CT>,
    at: SeriesLabelPosition,
) -> DrawResult {
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(200, 200, 200))
        .label_font(("sans-serif", LABEL_FONT))
        .draw()
}

/// An axis value: whole numbers on an axis that reaches 10, two decimals below.
fn value_label(v: f64, whole: bool) -> String {
    if whole {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// A percentile as the distance from 100 %: 1 / (1 - p), 1 at 0 %.
fn spread(percentile: f64) -> f64 {
    let p = (percentile / 100.0).min(1.0 - 1.0 / MAX_SPREAD);
    1.0 / (1.0 - p)
}

fn render_latency(title: &str, hists: &Named<'_>) -> io::Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 560)).into_drawing_area();
        draw_latency(&root, title, hists).map_err(drawing_error)?;
        root.present().map_err(drawing_error)?;
    }
    Ok(svg)
}

fn draw_latency(root: &Area<'_>, title: &str, hists: &Named<'_>) -> DrawResult {
    root.fill(&WHITE)?;
    let curves: Vec<(&str, Vec<(f64, f64)>)> = hists
        .iter()
        .map(|(name, h)| {
            let pts = h
                .percentile_curve()
                .into_iter()
                .map(|(p, ns)| (spread(p), ns as f64 / 1e3))
                .collect();
            (name.as_str(), pts)
        })
        .collect();
    // A log axis for latency too: the body (tens of µs) and the tail (ms) on one plot.
    let top = axis_top(curves.iter().flat_map(|(_, c)| c.iter().map(|p| p.1))) * 1.5;
    let bottom = curves
        .iter()
        .flat_map(|(_, c)| c.iter().map(|p| p.1))
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let bottom = if bottom.is_finite() {
        bottom / 1.5
    } else {
        top / 10.0
    };
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!("{title}: latency by percentile"),
            ("sans-serif", TITLE_FONT),
        )
        .margin(16)
        .margin_right(30)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d((1.0..MAX_SPREAD).log_scale(), (bottom..top).log_scale())?;
    look(&mut chart.configure_mesh())
        .x_desc("percentile")
        .y_desc("latency (µs)")
        .x_label_formatter(&|x| {
            // 10 is 90 %, 100 is 99 %, 1000 is 99.9 %: as many nines as the power of ten.
            let p = 100.0 * (1.0 - 1.0 / x);
            let decimals = (x.log10().round() as usize).saturating_sub(2);
            format!("{p:.decimals$}%")
        })
        .y_labels(8)
        .y_label_formatter(&|v| value_label(*v, *v >= 10.0))
        .draw()?;
    for (i, (name, pts)) in curves.iter().enumerate() {
        let color = color(i, curves.len());
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

/// One operation type's points over the run: (time s at the interval's end, ops/s, p99 µs).
type Series<'a> = (&'a str, Vec<(f64, f64, f64)>);

/// Per operation type, its points over the run.
fn timeline_series(log: &IntervalLog) -> Vec<Series<'_>> {
    let mut out: Vec<Series> = Vec::new();
    for (start, len, tag, h) in log.closed() {
        let secs = len.as_secs_f64();
        // The last interval is whatever was left when the run ended (the drain of the
        // operations still outstanding): a rate over a sliver of it is not the run's.
        if len < log.interval() / 2 {
            continue;
        }
        let point = (
            (start + len).as_secs_f64(),
            h.count() as f64 / secs,
            h.percentile(99.0) as f64 / 1e3,
        );
        match out.iter_mut().find(|(t, _)| *t == tag) {
            Some((_, v)) => v.push(point),
            None => out.push((tag, vec![point])),
        }
    }
    out
}

fn render_timeline(title: &str, log: &IntervalLog) -> io::Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 700)).into_drawing_area();
        draw_timeline(&root, title, log).map_err(drawing_error)?;
        root.present().map_err(drawing_error)?;
    }
    Ok(svg)
}

fn draw_timeline(root: &Area<'_>, title: &str, log: &IntervalLog) -> DrawResult {
    root.fill(&WHITE)?;
    let body = root.titled(
        &format!("{title}: over the run"),
        ("sans-serif", TITLE_FONT),
    )?;
    let panels = body.split_evenly((2, 1));
    let series = timeline_series(log);
    let end = series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.0))
        .fold(0.0, f64::max)
        .max(1e-3);
    for (area, (caption, pick)) in panels.iter().zip([
        ("operations per second", 1usize),
        ("p99 latency (µs)", 2usize),
    ]) {
        let value = |p: &(f64, f64, f64)| if pick == 1 { p.1 } else { p.2 };
        let top = axis_top(series.iter().flat_map(|(_, v)| v.iter().map(value)));
        let mut chart = panel(area, caption).build_cartesian_2d(0.0..end, 0.0..top)?;
        look(&mut chart.configure_mesh())
            .x_desc("time (s)")
            .y_labels(6)
            .y_label_formatter(&|v| value_label(*v, top >= 10.0))
            .draw()?;
        for (i, (tag, pts)) in series.iter().enumerate() {
            let color = color(i, series.len());
            chart
                .draw_series(LineSeries::new(
                    pts.iter().map(|p| (p.0, value(p))),
                    color.stroke_width(2),
                ))?
                .label(*tag)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    }
    Ok(())
}

/// A sweep's line: one operation type at one queue depth, its points in size order.
type SweepLine = (String, Vec<(u32, f64, f64, f64)>);

/// Per operation type and queue depth, (size, Gbit/s, p50 µs, p99 µs) at each size.
fn sweep_lines(results: &[OpResult]) -> Vec<SweepLine> {
    let mut lines: Vec<SweepLine> = Vec::new();
    for r in results {
        let (Some(size), Some(qd)) = (r.size, r.qd) else {
            continue;
        };
        let name = format!("{} qd {qd}", r.op);
        let point = (
            size,
            r.gbit_per_sec,
            r.latency_ns.p50 as f64 / 1e3,
            r.latency_ns.p99 as f64 / 1e3,
        );
        match lines.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(point),
            None => lines.push((name, vec![point])),
        }
    }
    for (_, v) in &mut lines {
        v.sort_by_key(|p| p.0);
    }
    lines
}

/// Writes `sweep.svg` into `dir`: throughput and latency (p50 solid, p99 dashed) against
/// message size, one line per operation type and queue depth; returns its path.
pub fn write_sweep(dir: &Path, op: &str, results: &[OpResult]) -> io::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("sweep.svg");
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 760)).into_drawing_area();
        draw_sweep(&root, op, &sweep_lines(results)).map_err(drawing_error)?;
        root.present().map_err(drawing_error)?;
    }
    std::fs::write(&path, svg)?;
    Ok(path)
}

/// A size on the axis: B, KiB or MiB, whole.
fn size_label(log2: f64) -> String {
    let b = 2f64.powf(log2).round() as u64;
    match b {
        b if b >= 1 << 20 => format!("{}M", b >> 20),
        b if b >= 1 << 10 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

fn draw_sweep(root: &Area<'_>, op: &str, lines: &[SweepLine]) -> DrawResult {
    root.fill(&WHITE)?;
    let body = root.titled(
        &format!("bench {op}: against message size"),
        ("sans-serif", TITLE_FONT),
    )?;
    let panels = body.split_evenly((2, 1));
    let sizes = || {
        lines
            .iter()
            .flat_map(|(_, v)| v.iter().map(|p| (p.0 as f64).log2()))
    };
    let lo = sizes().fold(f64::INFINITY, f64::min);
    let hi = sizes().fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo, hi)
    } else {
        (0.0, 1.0)
    };
    // Throughput, linear.
    let top = axis_top(lines.iter().flat_map(|(_, v)| v.iter().map(|p| p.1)));
    let mut chart =
        panel(&panels[0], "throughput (Gbit/s)").build_cartesian_2d(lo..hi, 0.0..top)?;
    look(&mut chart.configure_mesh())
        .x_desc("message size (bytes)")
        .x_labels(((hi - lo) as usize + 1).min(24))
        .x_label_formatter(&|x| size_label(*x))
        .y_labels(6)
        .y_label_formatter(&|v| value_label(*v, top >= 10.0))
        .draw()?;
    for (i, (name, pts)) in lines.iter().enumerate() {
        let c = color(i, lines.len());
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| ((p.0 as f64).log2(), p.1)),
                c.stroke_width(2),
            ))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(
            pts.iter()
                .map(|p| Circle::new(((p.0 as f64).log2(), p.1), 3, c.filled())),
        )?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    // Latency, log: p50 solid, p99 dashed.
    let lat = || {
        lines
            .iter()
            .flat_map(|(_, v)| v.iter().flat_map(|p| [p.2, p.3]))
    };
    let top = axis_top(lat()) * 1.5;
    let bottom = lat().filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
    let bottom = if bottom.is_finite() && bottom < top {
        bottom / 1.5
    } else {
        top / 10.0
    };
    let mut chart = panel(&panels[1], "latency (µs): p50 solid, p99 dashed")
        .build_cartesian_2d(lo..hi, (bottom..top).log_scale())?;
    look(&mut chart.configure_mesh())
        .x_desc("message size (bytes)")
        .x_labels(((hi - lo) as usize + 1).min(24))
        .x_label_formatter(&|x| size_label(*x))
        .y_labels(8)
        .y_label_formatter(&|v| value_label(*v, *v >= 10.0))
        .draw()?;
    for (i, (name, pts)) in lines.iter().enumerate() {
        let c = color(i, lines.len());
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| ((p.0 as f64).log2(), p.2)),
                c.stroke_width(2),
            ))?
            .label(format!("{name} p50"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(DashedLineSeries::new(
            pts.iter().map(|p| ((p.0 as f64).log2(), p.3)),
            6,
            4,
            c.stroke_width(2),
        ))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn the_percentile_axis_spreads_the_tail() {
        assert_eq!(spread(0.0), 1.0);
        assert!((spread(90.0) - 10.0).abs() < 1e-9);
        assert!((spread(99.0) - 100.0).abs() < 1e-6);
        assert!(
            (spread(100.0) - MAX_SPREAD).abs() < 1e-3,
            "the maximum is drawn at the edge"
        );
    }

    #[test]
    fn both_plots_hold_each_operation_type_and_the_timeline_its_rates() {
        let mut w = Latency::new();
        let mut r = Latency::new();
        let mut log = IntervalLog::new(
            &["read", "send", "write"].map(String::from),
            Duration::from_millis(100),
        );
        let t0 = Instant::now();
        for i in 1..=1000u64 {
            w.record(i * 1000);
            log.record(2, i * 1000);
        }
        log.tick(t0 + Duration::from_secs(1));
        for _ in 0..500 {
            r.record(3000);
            log.record(0, 3000);
        }
        log.finish(t0 + Duration::from_secs(2));
        let series = timeline_series(&log);
        // 1000 writes in the first second (up to when it was closed) and 500 reads after.
        let (tag, pts) = &series[0];
        assert_eq!(*tag, "write");
        assert_eq!(pts.len(), 1);
        assert!((pts[0].1 - 1000.0).abs() < 50.0, "{pts:?}");
        assert_eq!(series[1].0, "read");
        let hists: Named<'_> = vec![("write".into(), &w), ("read".into(), &r)];
        let lat = render_latency("t", &hists).unwrap();
        let tl = render_timeline("t", &log).unwrap();
        for svg in [&lat, &tl] {
            assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
            for name in ["write", "read"] {
                assert!(svg.contains(name), "{name}");
            }
        }
        assert!(lat.contains("99.99%") && lat.contains("latency (µs)"));
        assert!(
            !lat.contains("99.9990"),
            "labels as many nines as they need"
        );
        assert!(tl.contains("operations per second") && tl.contains("p99 latency"));
    }
}
