//! What a shaper run recorded, as CSV and as an SVG plot with the phases side by side, and
//! the average rates the bench prints for its steady state.
//!
//! A [`Phase`] is binned: bin *b* covers `[b·bin_ns, (b+1)·bin_ns)`. A rate over a bin range
//! is its bytes × 8 over the range's length; bytes per ns × 8 are Gbit/s, so every rate here
//! is in Gbit/s and exact to the bins.
//!
//! Odd input is read, not refused: a series shorter than the others reads as zeros past its
//! end, a phase without bins or without a bin width has nothing to plot or list (and panics
//! nothing), and a rate that cannot be computed is `None`, never NaN.

use std::io::{self, BufWriter, Write};
use std::ops::Range;
use std::path::Path;

use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::plot::{Area, Chart, CsvField, DrawResult, axis_top, drawing_error, kb};
use plotters::style::text_anchor::{HPos, Pos, VPos};

const NS_PER_US: f64 = 1e3;
const NS_PER_MS: f64 = 1e6;
const NS_PER_S: f64 = 1e9;

/// One phase of the run, as the bench recorded it. Bin b covers [b*bin_ns, (b+1)*bin_ns).
#[derive(Debug, Clone, Default)]
pub struct Phase {
    /// "writes alone", "paced", "unpaced" (any label).
    pub name: String,
    pub bin_ns: u64,
    /// The absorb rate (bit/s) the bottleneck serves at; 0 if the phase has none.
    pub absorb_bps: u64,
    /// Per bin: bytes that arrived at the bottleneck (the inbound load, frames).
    pub inbound: Vec<u64>,
    /// Per bin: the largest queue (bytes) seen in the bin.
    pub queue_max: Vec<u32>,
    /// Per bin: frames dropped at the bottleneck's tail.
    pub drops: Vec<u32>,
    /// The traffic classes' labels, class 0 first.
    pub class_names: Vec<String>,
    /// bins × classes, index `b * classes + c`: bytes class c sent (or, for a READ class, pulled in) in bin b.
    pub class_bytes: Vec<u64>,
    /// Per class: the rate (bit/s) it is configured to get, drawn as a dashed reference line; None: no line.
    pub class_target_bps: Vec<Option<u64>>,
}

impl Phase {
    /// Bins recorded: as many as the longest series has (a shorter one reads as zeros past its
    /// end); none without a bin width, since then no bin has a time.
    pub fn bins(&self) -> usize {
        if self.bin_ns == 0 {
            return 0;
        }
        let class_bins = match self.class_names.len() {
            0 => 0,
            classes => self.class_bytes.len().div_ceil(classes),
        };
        self.inbound
            .len()
            .max(self.queue_max.len())
            .max(self.drops.len())
            .max(class_bins)
    }

    /// The end of the recording, ns.
    pub fn end_ns(&self) -> u64 {
        (self.bins() as u64).saturating_mul(self.bin_ns)
    }

    fn inbound_at(&self, bin: usize) -> u64 {
        self.inbound.get(bin).copied().unwrap_or(0)
    }

    fn queue_at(&self, bin: usize) -> u32 {
        self.queue_max.get(bin).copied().unwrap_or(0)
    }

    fn drops_at(&self, bin: usize) -> u32 {
        self.drops.get(bin).copied().unwrap_or(0)
    }

    /// Bytes class `class` sent in bin `bin` (0 past the recorded ones or for no such class).
    fn class_at(&self, bin: usize, class: usize) -> u64 {
        let classes = self.class_names.len();
        if class >= classes {
            return 0;
        }
        bin.checked_mul(classes)
            .and_then(|i| i.checked_add(class))
            .and_then(|i| self.class_bytes.get(i))
            .copied()
            .unwrap_or(0)
    }

    /// `from..to` when it is a non-empty range of recorded bins.
    fn bin_range(&self, from: usize, to: usize) -> Option<Range<usize>> {
        (from < to && to <= self.bins()).then_some(from..to)
    }

    /// The rate (Gbit/s) of `bytes` over `bins` bins.
    fn gbps(&self, bytes: u128, bins: usize) -> f64 {
        bytes as f64 * 8.0 / (bins as f64 * self.bin_ns as f64)
    }

    /// The start of bin `bin`, ns.
    fn bin_start_ns(&self, bin: usize) -> u64 {
        (bin as u64).saturating_mul(self.bin_ns)
    }

    /// Frames dropped over the whole phase.
    fn drops_total(&self) -> u64 {
        self.drops.iter().map(|&d| u64::from(d)).sum()
    }
}

/// The average rate (Gbit/s) of class `class` over bins `from_bin..to_bin`: its bytes there
/// × 8 over the range's length. None when the range is empty, reaches past the recorded bins,
/// or the phase has no such class.
pub fn class_rate_gbps(phase: &Phase, class: usize, from_bin: usize, to_bin: usize) -> Option<f64> {
    if class >= phase.class_names.len() {
        return None;
    }
    let bins = phase.bin_range(from_bin, to_bin)?;
    let len = bins.len();
    let bytes: u128 = bins.map(|b| u128::from(phase.class_at(b, class))).sum();
    Some(phase.gbps(bytes, len))
}

/// The average inbound rate (Gbit/s) at the bottleneck over bins `from_bin..to_bin`. None when
/// the range is empty or reaches past the recorded bins.
pub fn inbound_gbps(phase: &Phase, from_bin: usize, to_bin: usize) -> Option<f64> {
    let bins = phase.bin_range(from_bin, to_bin)?;
    let len = bins.len();
    let bytes: u128 = bins.map(|b| u128::from(phase.inbound_at(b))).sum();
    Some(phase.gbps(bytes, len))
}

/// The class names of all phases, each once, in order of first appearance.
fn class_union(phases: &[Phase]) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for name in phases.iter().flat_map(|p| &p.class_names) {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    names
}

/// The phases' series as CSV, one row per phase and bin after a header:
/// `phase,bin,t_us,inbound_gbps,absorb_gbps,queue_kb,drops,<class>_gbps,…`.
///
/// `t_us` is the bin's start; rates are the bin's bytes × 8 over its width, in Gbit/s; the
/// queue is the bin's largest, in KB (1000 bytes); all with four decimals. The class columns
/// are the union of the phases' class names in order of first appearance; a phase without a
/// class leaves its cells empty (two classes of one phase with the same name share a column,
/// their bytes summed), and so does a phase without an absorb rate its `absorb_gbps`. A label
/// holding a comma, quote or line break is quoted.
pub fn write_csv(path: &Path, phases: &[Phase]) -> io::Result<()> {
    let mut out = BufWriter::new(std::fs::File::create(path)?);
    write_csv_to(&mut out, phases)?;
    out.flush()
}

fn write_csv_to(out: &mut impl Write, phases: &[Phase]) -> io::Result<()> {
    let columns = class_union(phases);
    write!(
        out,
        "phase,bin,t_us,inbound_gbps,absorb_gbps,queue_kb,drops"
    )?;
    for name in &columns {
        write!(out, ",{}", CsvField(&format!("{name}_gbps")))?;
    }
    writeln!(out)?;
    for phase in phases {
        // Per column, this phase's classes of that name.
        let members: Vec<Vec<usize>> = columns
            .iter()
            .map(|&column| {
                (0..phase.class_names.len())
                    .filter(|&c| phase.class_names[c] == column)
                    .collect()
            })
            .collect();
        let absorb = match phase.absorb_bps {
            0 => String::new(),
            bps => format!("{:.4}", bps as f64 / NS_PER_S),
        };
        let name = CsvField(&phase.name);
        for b in 0..phase.bins() {
            write!(
                out,
                "{name},{b},{:.4},{:.4},{absorb},{:.4},{}",
                phase.bin_start_ns(b) as f64 / NS_PER_US,
                phase.gbps(u128::from(phase.inbound_at(b)), 1),
                kb(u64::from(phase.queue_at(b))),
                phase.drops_at(b),
            )?;
            for classes in &members {
                if classes.is_empty() {
                    write!(out, ",")?;
                } else {
                    let bytes: u128 = classes
                        .iter()
                        .map(|&c| u128::from(phase.class_at(b, c)))
                        .sum();
                    write!(out, ",{:.4}", phase.gbps(bytes, 1))?;
                }
            }
            writeln!(out)?;
        }
    }
    Ok(())
}

/// Width of one phase's column in the SVG, pixels.
const SVG_COLUMN_WIDTH: u32 = 500;
const SVG_HEIGHT: u32 = 800;
/// Points per plotted series, at most.
const PLOT_POINTS: usize = 1500;

/// The phases side by side as an SVG, under `title`: one column per phase, headed by its name,
/// with three panels over the phase's time (in µs, or in ms for a phase of 2 ms or more): the
/// inbound rate at the bottleneck with the absorb rate (red, dashed); the bottleneck's queue,
/// with red marks at the top where frames were dropped and the phase's total drops in the
/// caption; and each class's throughput, one color per class (the same in every column), with
/// its configured rate dashed in a darker shade of that color and a legend above the panel.
/// Each kind of panel has the same y axis in every column, so the phases compare at a glance.
/// Long phases are drawn with at most 1500 points a series: rates averaged over groups of
/// bins, the queue each group's largest value (so a peak stays visible).
pub fn write_svg(path: &Path, phases: &[Phase], title: &str) -> io::Result<()> {
    std::fs::write(path, render_svg(phases, title)?)
}

fn render_svg(phases: &[Phase], title: &str) -> io::Result<String> {
    let columns = u32::try_from(phases.len().max(1)).unwrap_or(u32::MAX / SVG_COLUMN_WIDTH);
    let width = SVG_COLUMN_WIDTH.saturating_mul(columns);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, SVG_HEIGHT)).into_drawing_area();
        draw(&root, phases, title).map_err(drawing_error)?;
        root.present().map_err(drawing_error)?;
    }
    Ok(svg)
}

/// A time axis' unit: µs, or ms once a phase is long enough that µs read badly.
#[derive(Clone, Copy)]
struct TimeUnit {
    ns: f64,
    name: &'static str,
}

impl TimeUnit {
    fn for_phase(end_ns: u64) -> TimeUnit {
        if end_ns >= 2_000_000 {
            TimeUnit {
                ns: NS_PER_MS,
                name: "ms",
            }
        } else {
            TimeUnit {
                ns: NS_PER_US,
                name: "µs",
            }
        }
    }

    fn of(self, ns: u64) -> f64 {
        ns as f64 / self.ns
    }
}

/// What a column plots, in the plot's units (time unit, Gbit/s, KB).
struct Plotted {
    unit: TimeUnit,
    /// The middle of each group of bins.
    times: Vec<f64>,
    /// The end of the phase.
    end: f64,
    inbound_gbps: Vec<f64>,
    queue_kb: Vec<f64>,
    /// The middles of the groups with drops.
    drop_times: Vec<f64>,
    /// Per class of the phase.
    classes_gbps: Vec<Vec<f64>>,
}

impl Plotted {
    fn of(phase: &Phase) -> Plotted {
        let unit = TimeUnit::for_phase(phase.end_ns());
        let bins = phase.bins();
        // At most PLOT_POINTS points a series: a long phase has tens of thousands of bins.
        let group = bins.div_ceil(PLOT_POINTS).max(1);
        let groups: Vec<Range<usize>> = (0..bins)
            .step_by(group)
            .map(|from| from..(from + group).min(bins))
            .collect();
        let rate = |bytes: &dyn Fn(usize) -> u64| -> Vec<f64> {
            groups
                .iter()
                .map(|g| {
                    let sum: u128 = g.clone().map(|b| u128::from(bytes(b))).sum();
                    phase.gbps(sum, g.len())
                })
                .collect()
        };
        let times: Vec<f64> = groups
            .iter()
            .map(|g| {
                (unit.of(phase.bin_start_ns(g.start)) + unit.of(phase.bin_start_ns(g.end))) / 2.0
            })
            .collect();
        Plotted {
            drop_times: groups
                .iter()
                .zip(&times)
                .filter(|&(g, _)| g.clone().any(|b| phase.drops_at(b) > 0))
                .map(|(_, &t)| t)
                .collect(),
            times,
            unit,
            end: unit.of(phase.end_ns()),
            inbound_gbps: rate(&|b| phase.inbound_at(b)),
            queue_kb: groups
                .iter()
                .map(|g| {
                    let max = g.clone().map(|b| phase.queue_at(b)).max().unwrap_or(0);
                    kb(u64::from(max))
                })
                .collect(),
            classes_gbps: (0..phase.class_names.len())
                .map(|c| rate(&|b| phase.class_at(b, c)))
                .collect(),
        }
    }

    fn line<'a>(&'a self, values: &'a [f64]) -> impl Iterator<Item = (f64, f64)> + Clone + 'a {
        self.times.iter().copied().zip(values.iter().copied())
    }
}

/// A tick label formatter with as many decimals as ticks `span` apart need.
fn tick_format(span: f64) -> impl Fn(&f64) -> String {
    let step = span / 5.0;
    let decimals = if step >= 1.0 || step <= 0.0 || !step.is_finite() {
        0
    } else {
        // 0.4 needs one, 0.04 two, …
        (-step.log10().floor()).min(6.0) as usize
    };
    move |v: &f64| format!("{v:.decimals$}")
}

/// Font sizes as given to plotters (its SVG backend draws text at about 0.8 of them).
const TITLE_FONT: u32 = 26;
const CAPTION_FONT: u32 = 24;
const PANEL_FONT: u32 = 17;
const LABEL_FONT: u32 = 15;

/// The classes' line colors, in turn: saturated and far apart, so thin lines stay readable,
/// and none red, which is the absorb rate's and the drops'.
const CLASS_COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(23, 190, 207),
];
const INBOUND_COLOR: RGBColor = RGBColor(20, 20, 20);
const QUEUE_COLOR: RGBColor = RGBColor(40, 40, 120);
/// Left of a panel's plotting area: the y labels and their description.
const Y_LABEL_AREA: u32 = 58;

/// The y ranges every column shares, per kind of panel.
struct Axes {
    inbound: f64,
    queue: f64,
    classes: f64,
}

fn draw(root: &Area<'_>, phases: &[Phase], title: &str) -> DrawResult {
    root.fill(&WHITE)?;
    let body = root.titled(title, ("sans-serif", TITLE_FONT))?;
    if phases.is_empty() {
        body.draw(&Text::new(
            "no phases",
            (20, 20),
            ("sans-serif", LABEL_FONT),
        ))?;
        return Ok(());
    }
    let plotted: Vec<Plotted> = phases.iter().map(Plotted::of).collect();
    let axes = Axes {
        inbound: axis_top(
            phases
                .iter()
                .map(|p| p.absorb_bps as f64 / NS_PER_S)
                .chain(plotted.iter().flat_map(|p| p.inbound_gbps.iter().copied())),
        ),
        queue: axis_top(plotted.iter().flat_map(|p| p.queue_kb.iter().copied())),
        classes: axis_top(
            phases
                .iter()
                .flat_map(|p| p.class_target_bps.iter().flatten())
                .map(|&bps| bps as f64 / NS_PER_S)
                .chain(
                    plotted
                        .iter()
                        .flat_map(|p| p.classes_gbps.iter().flatten().copied()),
                ),
        ),
    };
    // A class has one color in every column: its place among all the phases' classes.
    let union = class_union(phases);
    let columns = body.split_evenly((1, phases.len()));
    let mut legends = Vec::with_capacity(phases.len());
    for (column, phase) in columns.iter().zip(phases) {
        let colors: Vec<RGBColor> = phase
            .class_names
            .iter()
            .map(|name| {
                let i = union.iter().position(|u| u == name).unwrap_or(0);
                CLASS_COLORS[i % CLASS_COLORS.len()]
            })
            .collect();
        let (legend, height) = legend_layout(column, phase, &colors)?;
        legends.push((colors, legend, height));
    }
    // Every column's legend as high as the highest, so the panels line up.
    let legend_height = legends.iter().map(|(_, _, h)| *h).max().unwrap_or(0);
    for (((column, phase), p), (colors, legend, _)) in
        columns.iter().zip(phases).zip(&plotted).zip(legends)
    {
        let column = column.titled(&phase.name, ("sans-serif", CAPTION_FONT))?;
        let (_, height) = column.dim_in_pixel();
        // The class panel also holds the legend and the time axis' description.
        let first = height * 30 / 100;
        let (inbound, rest) = column.split_vertically(first);
        let (queue, classes) = rest.split_vertically(first);
        draw_inbound(&inbound, phase, p, &axes)?;
        draw_queue(&queue, phase, p, &axes)?;
        draw_classes(&classes, phase, p, &axes, &colors, (legend, legend_height))?;
    }
    Ok(())
}

/// One entry of a class legend: where it goes, its text, and its class' color (None: the
/// dashed configured rate).
struct LegendEntry {
    x: i32,
    y: i32,
    name: String,
    color: Option<RGBColor>,
}

/// The legend of a phase's classes: a stroke and the name of each, wrapping into rows as wide
/// as `area`, then what the dashed lines are; and its height.
fn legend_layout(
    area: &Area<'_>,
    phase: &Phase,
    colors: &[RGBColor],
) -> Result<(Vec<LegendEntry>, i32), DrawingAreaErrorKind<io::Error>> {
    let style = TextStyle::from(("sans-serif", LABEL_FONT).into_font());
    let (width, _) = area.dim_in_pixel();
    let mut entries: Vec<(String, Option<RGBColor>)> = phase
        .class_names
        .iter()
        .cloned()
        .zip(colors.iter().copied().map(Some))
        .collect();
    if phase.class_target_bps.iter().any(Option::is_some) {
        entries.push(("configured rate".to_owned(), None));
    }
    let left = Y_LABEL_AREA as i32;
    let right = i32::try_from(width).unwrap_or(i32::MAX) - 10;
    let mut placed = Vec::with_capacity(entries.len());
    let (mut x, mut y) = (left, LEGEND_ROW / 2 + 2);
    for (name, color) in entries {
        let (text_width, _) = area.estimate_text_size(&name, &style)?;
        let entry_width = 26 + i32::try_from(text_width).unwrap_or(0) + 16;
        if x > left && x + entry_width > right {
            x = left;
            y += LEGEND_ROW;
        }
        placed.push(LegendEntry { x, y, name, color });
        x += entry_width;
    }
    let height = if placed.is_empty() {
        0
    } else {
        y + LEGEND_ROW / 2
    };
    Ok((placed, height))
}

/// Height of a legend row, pixels.
const LEGEND_ROW: i32 = 20;

/// A panel over the phase's time with its axes and grid; the time axis is described only when
/// `time_desc` (the bottom panel), the others only carry its ticks.
fn panel<'a>(
    area: &Area<'a>,
    caption: &str,
    p: &Plotted,
    y: (f64, &str),
    time_desc: bool,
) -> Result<Chart<'a>, DrawingAreaErrorKind<io::Error>> {
    let x_end = if p.end > 0.0 { p.end } else { 1.0 };
    let (y_top, y_desc) = y;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", PANEL_FONT))
        .margin(6)
        // Room for the last time label, centred on the right edge.
        .margin_right(24)
        .x_label_area_size(if time_desc { 44 } else { 24 })
        .y_label_area_size(Y_LABEL_AREA)
        .build_cartesian_2d(0.0..x_end, 0.0..y_top)?;
    let x_format = tick_format(x_end);
    let y_format = tick_format(y_top);
    let x_desc = format!("time ({})", p.unit.name);
    let mut mesh = chart.configure_mesh();
    mesh.y_desc(y_desc)
        .x_labels(6)
        .x_label_formatter(&x_format)
        .y_labels(5)
        .y_label_formatter(&y_format)
        .max_light_lines(0)
        .bold_line_style(RGBColor(225, 225, 225))
        .label_style(("sans-serif", LABEL_FONT))
        .axis_desc_style(("sans-serif", LABEL_FONT));
    if time_desc {
        mesh.x_desc(x_desc.as_str());
    }
    mesh.draw()?;
    Ok(chart)
}

/// A horizontal dashed line across the panel at `level`.
fn dashed_level(chart: &mut Chart<'_>, x_end: f64, level: f64, style: ShapeStyle) -> DrawResult {
    chart.draw_series(DashedLineSeries::new(
        [(0.0, level), (x_end, level)],
        8,
        5,
        style,
    ))?;
    Ok(())
}

fn draw_inbound(area: &Area<'_>, phase: &Phase, p: &Plotted, axes: &Axes) -> DrawResult {
    let absorb = phase.absorb_bps as f64 / NS_PER_S;
    let caption = if phase.absorb_bps > 0 {
        format!(
            "inbound rate; absorb {} Gbit/s (red, dashed)",
            short(absorb)
        )
    } else {
        "inbound rate".to_owned()
    };
    let mut chart = panel(area, &caption, p, (axes.inbound, "Gbit/s"), false)?;
    chart.draw_series(LineSeries::new(
        p.line(&p.inbound_gbps),
        INBOUND_COLOR.stroke_width(2),
    ))?;
    // Over the inbound line, so it stays visible where the rate sits on it.
    if phase.absorb_bps > 0 {
        let x_end = chart.x_range().end;
        dashed_level(&mut chart, x_end, absorb, RED.stroke_width(2))?;
    }
    Ok(())
}

fn draw_queue(area: &Area<'_>, phase: &Phase, p: &Plotted, axes: &Axes) -> DrawResult {
    let drops = phase.drops_total();
    let caption = match drops {
        0 => "bottleneck queue; no drops".to_owned(),
        1 => "bottleneck queue; 1 drop (red marks)".to_owned(),
        n => format!("bottleneck queue; {n} drops (red marks)"),
    };
    let mut chart = panel(area, &caption, p, (axes.queue, "KB"), false)?;
    chart.draw_series(LineSeries::new(
        p.line(&p.queue_kb),
        QUEUE_COLOR.stroke_width(2),
    ))?;
    // A mark hanging from the top of the panel wherever frames were dropped.
    let top = axes.queue;
    chart.draw_series(
        p.drop_times
            .iter()
            .map(|&t| EmptyElement::at((t, top)) + Circle::new((0, 5), 3, RED.filled())),
    )?;
    Ok(())
}

fn draw_classes(
    area: &Area<'_>,
    phase: &Phase,
    p: &Plotted,
    axes: &Axes,
    colors: &[RGBColor],
    (legend, legend_height): (Vec<LegendEntry>, i32),
) -> DrawResult {
    let style = TextStyle::from(("sans-serif", LABEL_FONT).into_font())
        .pos(Pos::new(HPos::Left, VPos::Center));
    // The legend above the panel, so it never covers a line.
    let (legend_area, plot) = area.split_vertically(legend_height);
    for LegendEntry { x, y, name, color } in legend {
        match color {
            Some(color) => {
                legend_area.draw(&PathElement::new(
                    [(x, y), (x + 20, y)],
                    color.stroke_width(3),
                ))?;
            }
            None => {
                legend_area.draw(&DashedPathElement::new(
                    [(x, y), (x + 20, y)],
                    5,
                    3,
                    BLACK.stroke_width(2),
                ))?;
            }
        }
        legend_area.draw(&Text::new(name, (x + 26, y), style.clone()))?;
    }

    let mut chart = panel(
        &plot,
        "throughput per class",
        p,
        (axes.classes, "Gbit/s"),
        true,
    )?;
    let x_end = chart.x_range().end;
    for (rates, color) in p.classes_gbps.iter().zip(colors) {
        chart.draw_series(LineSeries::new(p.line(rates), color.stroke_width(2)))?;
    }
    // The targets over all the lines, darker than their class, so a class running at its
    // target does not hide it.
    for (c, target) in phase.class_target_bps.iter().enumerate() {
        if let (Some(bps), Some(&color)) = (target, colors.get(c)) {
            let level = *bps as f64 / NS_PER_S;
            dashed_level(&mut chart, x_end, level, darker(color).stroke_width(2))?;
        }
    }
    Ok(())
}

/// `color` at 60 % of its brightness.
fn darker(RGBColor(r, g, b): RGBColor) -> RGBColor {
    let dim = |v: u8| u8::try_from(u16::from(v) * 3 / 5).unwrap_or(v);
    RGBColor(dim(r), dim(g), dim(b))
}

/// A rate for a caption: no more decimals than it has (up to 3).
fn short(value: f64) -> String {
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    text.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv_text(phases: &[Phase]) -> String {
        let mut out = Vec::new();
        write_csv_to(&mut out, phases).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// Two 1 µs bins through a 2 Gbit/s bottleneck: 250 then 500 bytes inbound (2 and 4
    /// Gbit/s); a READ class pulling in 200 then 400 bytes and a WRITE class sending 50 then
    /// 100.
    fn tiny() -> Phase {
        Phase {
            name: "paced".into(),
            bin_ns: 1_000,
            absorb_bps: 2_000_000_000,
            inbound: vec![250, 500],
            queue_max: vec![1_500, 0],
            drops: vec![0, 3],
            class_names: vec!["read".into(), "write".into()],
            class_bytes: vec![200, 50, 400, 100],
            class_target_bps: vec![Some(1_500_000_000), None],
        }
    }

    #[test]
    fn csv_of_a_tiny_phase_is_exact() {
        assert_eq!(
            csv_text(&[tiny()]),
            "phase,bin,t_us,inbound_gbps,absorb_gbps,queue_kb,drops,read_gbps,write_gbps\n\
             paced,0,0.0000,2.0000,2.0000,1.5000,0,1.6000,0.4000\n\
             paced,1,1.0000,4.0000,2.0000,0.0000,3,3.2000,0.8000\n"
        );
    }

    #[test]
    fn csv_columns_are_the_union_of_the_classes_in_order_of_first_appearance() {
        // No absorb rate, 2 µs bins, a label to quote; classes "w0", "read".
        let first = Phase {
            name: "writes, alone".into(),
            bin_ns: 2_000,
            inbound: vec![1_000],
            class_names: vec!["w0".into(), "read".into()],
            class_bytes: vec![500, 250],
            ..Phase::default()
        };
        // Classes "w1", "w0": "read" is missing, "w1" new.
        let second = Phase {
            name: "unpaced".into(),
            bin_ns: 1_000,
            absorb_bps: 2_500_000_000,
            inbound: vec![125, 0],
            queue_max: vec![64, 128],
            drops: vec![1, 0],
            class_names: vec!["w1".into(), "w0".into()],
            class_bytes: vec![1, 2, 3, 4],
            ..Phase::default()
        };
        assert_eq!(
            csv_text(&[first, second]),
            "phase,bin,t_us,inbound_gbps,absorb_gbps,queue_kb,drops,w0_gbps,read_gbps,w1_gbps\n\
             \"writes, alone\",0,0.0000,4.0000,,0.0000,0,2.0000,1.0000,\n\
             unpaced,0,0.0000,1.0000,2.5000,0.0640,1,0.0160,,0.0080\n\
             unpaced,1,1.0000,0.0000,2.5000,0.1280,0,0.0320,,0.0240\n"
        );
    }

    #[test]
    fn csv_of_nothing_or_empty_phases_is_the_header_alone() {
        let header = "phase,bin,t_us,inbound_gbps,absorb_gbps,queue_kb,drops\n";
        assert_eq!(csv_text(&[]), header);
        assert_eq!(csv_text(&[Phase::default()]), header);
        // Classes but no bins, and bins but no bin width: a header with the classes, no rows.
        let no_bins = Phase {
            class_names: vec!["a".into()],
            bin_ns: 1_000,
            ..Phase::default()
        };
        let no_width = Phase {
            inbound: vec![1, 2],
            ..Phase::default()
        };
        assert_eq!(
            csv_text(&[no_bins, no_width]),
            "phase,bin,t_us,inbound_gbps,absorb_gbps,queue_kb,drops,a_gbps\n"
        );
    }

    #[test]
    fn averages_over_a_bin_range_are_exact() {
        let phase = tiny();
        assert_eq!(inbound_gbps(&phase, 0, 1), Some(2.0));
        assert_eq!(inbound_gbps(&phase, 1, 2), Some(4.0));
        assert_eq!(inbound_gbps(&phase, 0, 2), Some(3.0));
        assert_eq!(class_rate_gbps(&phase, 0, 0, 2), Some(2.4));
        assert_eq!(class_rate_gbps(&phase, 1, 0, 2), Some(0.6));
        assert_eq!(class_rate_gbps(&phase, 1, 1, 2), Some(0.8));
        // 2.5 ms of 1 MB per 100 µs bin: 80 Gbit/s.
        let long = Phase {
            bin_ns: 100_000,
            inbound: vec![1_000_000; 25],
            class_names: vec!["x".into()],
            class_bytes: vec![1_000_000; 25],
            ..Phase::default()
        };
        assert_eq!(inbound_gbps(&long, 5, 25), Some(80.0));
        assert_eq!(class_rate_gbps(&long, 0, 0, 25), Some(80.0));
    }

    #[test]
    fn averages_over_an_empty_or_outside_range_are_none() {
        let phase = tiny();
        assert_eq!(inbound_gbps(&phase, 1, 1), None);
        assert_eq!(inbound_gbps(&phase, 2, 1), None);
        assert_eq!(inbound_gbps(&phase, 0, 3), None);
        assert_eq!(class_rate_gbps(&phase, 0, 1, 1), None);
        assert_eq!(class_rate_gbps(&phase, 0, 0, 3), None);
        assert_eq!(class_rate_gbps(&phase, 2, 0, 2), None);
        assert_eq!(inbound_gbps(&Phase::default(), 0, 1), None);
        assert_eq!(class_rate_gbps(&Phase::default(), 0, 0, 1), None);
        let no_width = Phase {
            bin_ns: 0,
            ..tiny()
        };
        assert_eq!(inbound_gbps(&no_width, 0, 2), None);
    }

    #[test]
    fn short_series_read_as_zeros() {
        let phase = Phase {
            bin_ns: 1_000,
            inbound: vec![125],
            drops: vec![0, 0, 7],
            class_names: vec!["a".into(), "b".into()],
            class_bytes: vec![125, 250, 125],
            ..Phase::default()
        };
        assert_eq!(phase.bins(), 3);
        assert_eq!(inbound_gbps(&phase, 0, 2), Some(0.5));
        assert_eq!(class_rate_gbps(&phase, 1, 0, 2), Some(1.0));
        assert_eq!(phase.drops_total(), 7);
    }

    fn temp_path(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("portico-shaper-{}-{name}", std::process::id()))
    }

    #[test]
    fn write_csv_writes_the_file_and_reports_a_bad_path() {
        let path = temp_path("series.csv");
        write_csv(&path, &[tiny()]).unwrap();
        let written = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(written, csv_text(&[tiny()]));
        let missing = temp_path("no-such-dir").join("series.csv");
        assert!(write_csv(&missing, &[tiny()]).is_err());
    }

    /// A small deterministic noise source, in [-1, 1).
    struct Noise(u64);

    impl Noise {
        fn next(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        }
    }

    const ABSORB_BPS: u64 = 2_000_000_000;
    const BUFFER_BYTES: u64 = 256 * 1024;

    /// A phase of `bins` 10 µs bins like the bench records: two WRITE classes at about 4 and
    /// 2 Gbit/s out, and with `reads`, a READ class of 8 QPs × 64 KiB through a 2 Gbit/s
    /// bottleneck with a 256 KiB buffer; paced at 1.8 Gbit/s, or not (bursts at 25 Gbit/s).
    fn realistic(name: &str, bins: usize, reads: bool, paced: bool, seed: u64) -> Phase {
        let bin_ns = 10_000u64;
        let mut noise = Noise(seed);
        let per_bin = |gbps: f64| gbps * bin_ns as f64 / 8.0;
        let absorb_per_bin = per_bin(ABSORB_BPS as f64 / 1e9);
        let mut phase = Phase {
            name: name.into(),
            bin_ns,
            absorb_bps: ABSORB_BPS,
            class_names: vec!["write tc1".into(), "write tc2".into(), "read tc3".into()],
            class_target_bps: vec![
                Some(4_000_000_000),
                Some(2_000_000_000),
                reads.then_some(1_800_000_000),
            ],
            ..Phase::default()
        };
        let mut queue = 0.0f64;
        let mut burst_left = 0.0f64;
        for b in 0..bins {
            let acks = per_bin(0.05 * (1.0 + 0.3 * noise.next()));
            let mut read = 0.0;
            if reads {
                if paced {
                    read = per_bin(1.8 * (1.0 + 0.05 * noise.next()));
                } else {
                    // A new round of 8 × 64 KiB READs once the last one has drained.
                    if burst_left <= 0.0 && queue <= 0.0 && b % 40 == 0 {
                        burst_left = 8.0 * 65_536.0;
                    }
                    read = burst_left.min(per_bin(25.0));
                    burst_left -= read;
                }
            }
            let arrived = acks + read;
            queue += arrived;
            let mut dropped = 0u32;
            if queue > BUFFER_BYTES as f64 {
                dropped = ((queue - BUFFER_BYTES as f64) / 4_096.0).ceil() as u32;
                queue = BUFFER_BYTES as f64;
            }
            let peak = queue;
            queue = (queue - absorb_per_bin).max(0.0);
            phase.inbound.push(arrived as u64);
            phase.queue_max.push(peak as u32);
            phase.drops.push(dropped);
            let pulled = if paced {
                read
            } else {
                read.min(absorb_per_bin * 1.2)
            };
            phase.class_bytes.extend([
                per_bin(4.0 * (1.0 + 0.04 * noise.next())) as u64,
                per_bin(2.0 * (1.0 + 0.04 * noise.next())) as u64,
                pulled as u64,
            ]);
        }
        phase
    }

    fn example() -> Vec<Phase> {
        vec![
            realistic("writes alone", 2_000, false, false, 1),
            realistic("paced", 2_000, true, true, 2),
            realistic("unpaced", 2_000, true, false, 3),
        ]
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

    /// The number of points of each `<polyline` in the SVG.
    fn polyline_points(svg: &str) -> Vec<usize> {
        svg.split("<polyline")
            .skip(1)
            .filter_map(|element| {
                let (_, rest) = element.split_once("points=\"")?;
                let (points, _) = rest.split_once('"')?;
                Some(points.split_whitespace().count())
            })
            .collect()
    }

    #[test]
    fn svg_has_a_column_per_phase_with_its_name_title_and_classes() {
        let phases = example();
        let path = temp_path("plot.svg");
        write_svg(&path, &phases, "shaper: 8 QPs × 64 KiB READs").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("width=\"1500\""));
        let texts = svg_texts(&svg);
        for label in [
            "shaper: 8 QPs × 64 KiB READs",
            "writes alone",
            "paced",
            "unpaced",
            "time (ms)",
            "inbound rate; absorb 2 Gbit/s (red, dashed)",
            "bottleneck queue; no drops",
            "configured rate",
        ] {
            assert!(texts.contains(&label), "no {label} in {texts:?}");
        }
        // Every column names each class in its legend.
        for class in ["write tc1", "write tc2", "read tc3"] {
            assert_eq!(
                texts.iter().filter(|&&t| t == class).count(),
                3,
                "{class} in {texts:?}"
            );
        }
        // Only the unpaced phase drops, and says how many.
        let drops = phases[2].drops_total();
        assert!(drops > 0);
        let caption = format!("bottleneck queue; {drops} drops (red marks)");
        assert!(
            texts.contains(&caption.as_str()),
            "no {caption} in {texts:?}"
        );
        assert_eq!(
            texts
                .iter()
                .filter(|&&t| t == "bottleneck queue; no drops")
                .count(),
            2
        );
        // The drops are marked: red dots at the top of the unpaced queue panel.
        assert!(svg.contains("<circle"));
    }

    #[test]
    fn svg_series_have_at_most_1500_points() {
        let long = realistic("long", 100_000, true, false, 4);
        let svg = render_svg(&[long, tiny()], "long").unwrap();
        let points = polyline_points(&svg);
        let longest = points.iter().copied().max().unwrap_or(0);
        // 100 000 bins in groups of 67: 1493 points.
        assert_eq!(longest, 1493, "{points:?}");
        // A short phase is drawn bin by bin.
        assert!(points.contains(&2), "{points:?}");
        assert!(svg_texts(&svg).contains(&"time (ms)"));
    }

    #[test]
    fn the_queue_of_a_group_is_its_peak() {
        // 3000 bins in groups of 2: a one-bin spike survives, the rates are averaged.
        let mut phase = Phase {
            bin_ns: 1_000,
            inbound: vec![250; 3_000],
            queue_max: vec![0; 3_000],
            drops: vec![0; 3_000],
            ..Phase::default()
        };
        phase.queue_max[1_001] = 9_000;
        phase.inbound[1_001] = 750;
        phase.drops[2_999] = 1;
        let p = Plotted::of(&phase);
        assert_eq!(p.times.len(), 1_500);
        assert_eq!(p.queue_kb[500], 9.0);
        assert_eq!(p.inbound_gbps[500], 4.0);
        assert_eq!(p.inbound_gbps[499], 2.0);
        // 3 ms: in ms, each point in the middle of its two bins.
        assert_eq!(p.times[0], 0.001);
        assert_eq!(p.drop_times, [2.999]);
        assert_eq!(p.end, 3.0);
    }

    #[test]
    fn svg_of_odd_phases_is_still_written() {
        for phases in [
            vec![],
            vec![Phase::default()],
            vec![Phase::default(), tiny(), Phase::default()],
            vec![Phase {
                name: "classes, no bins".into(),
                bin_ns: 1_000,
                class_names: vec!["a".into()],
                class_target_bps: vec![Some(1)],
                ..Phase::default()
            }],
        ] {
            let svg = render_svg(&phases, "<odd> & empty").unwrap();
            assert!(svg.starts_with("<svg"));
            assert!(svg.trim_end().ends_with("</svg>"));
            assert!(svg_texts(&svg).contains(&"&lt;odd&gt; &amp; empty"));
        }
        let missing = temp_path("no-such-dir").join("plot.svg");
        assert!(write_svg(&missing, &[tiny()], "t").is_err());
    }

    #[test]
    fn tick_labels_have_the_decimals_their_steps_need() {
        assert_eq!(tick_format(20.0)(&5.0), "5");
        assert_eq!(tick_format(2.0)(&0.5), "0.5");
        assert_eq!(tick_format(0.2)(&0.05), "0.05");
        assert_eq!(tick_format(0.0)(&0.0), "0");
    }

    #[test]
    fn captions_print_rates_without_needless_decimals() {
        assert_eq!(short(2.0), "2");
        assert_eq!(short(2.5), "2.5");
        assert_eq!(short(0.125), "0.125");
        assert_eq!(short(1.23456), "1.235");
    }

    /// Writes the example plot to /tmp/shaper-example.svg, to look at.
    #[test]
    #[ignore = "writes /tmp/shaper-example.svg, to look at"]
    fn render_example() {
        write_svg(
            Path::new("/tmp/shaper-example.svg"),
            &example(),
            "portico bench shaper: 8 QPs × 64 KiB READs, 2 Gbit/s absorb",
        )
        .unwrap();
        write_csv(Path::new("/tmp/shaper-example.csv"), &example()).unwrap();
    }
}
