//! What the benches' SVG plots and CSVs share (`plotters` with its SVG backend writing into a
//! string): the drawing types, the error mapping, the y-axis headroom, a CSV field.

use std::fmt;
use std::io;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

pub(crate) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
pub(crate) type Chart<'a> =
    ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;
pub(crate) type DrawResult = Result<(), DrawingAreaErrorKind<io::Error>>;

/// The backend writes into a string, so a drawing error is not one of the file's.
pub(crate) fn drawing_error<E: std::error::Error + Send + Sync>(
    e: DrawingAreaErrorKind<E>,
) -> io::Error {
    io::Error::other(format!("drawing the plot: {e}"))
}

/// The largest of `values` with headroom above it, so lines do not run along the plot's top
/// (1 when there is nothing above zero, so the axis still has a range).
pub(crate) fn axis_top(values: impl Iterator<Item = f64>) -> f64 {
    let top = values.filter(|v| v.is_finite()).fold(0.0, f64::max);
    if top > 0.0 { top * 1.1 } else { 1.0 }
}

/// Bytes in KB (of 1000).
pub(crate) fn kb(bytes: u64) -> f64 {
    bytes as f64 / 1e3
}

/// A CSV field, quoted when it holds a separator, a quote or a line break.
pub(crate) struct CsvField<'a>(pub(crate) &'a str);

impl fmt::Display for CsvField<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.contains([',', '"', '\n', '\r']) {
            write!(f, "\"{}\"", self.0.replace('"', "\"\""))
        } else {
            f.write_str(self.0)
        }
    }
}
