//! Placeholder for the shaper bench's CSV and SVG (replaced by the full module).

use std::io;
use std::path::Path;

/// One phase of the run, as the bench recorded it. Bin b covers [b*bin_ns, (b+1)*bin_ns).
#[derive(Debug, Clone, Default)]
pub struct Phase {
    pub name: String,
    pub bin_ns: u64,
    pub absorb_bps: u64,
    pub inbound: Vec<u64>,
    pub queue_max: Vec<u32>,
    pub drops: Vec<u32>,
    pub class_names: Vec<String>,
    pub class_bytes: Vec<u64>,
    pub class_target_bps: Vec<Option<u64>>,
}

pub fn write_csv(_path: &Path, _phases: &[Phase]) -> io::Result<()> {
    Ok(())
}

pub fn write_svg(_path: &Path, _phases: &[Phase], _title: &str) -> io::Result<()> {
    Ok(())
}

pub fn class_rate_gbps(phase: &Phase, class: usize, from_bin: usize, to_bin: usize) -> Option<f64> {
    let n = phase.class_names.len();
    if from_bin >= to_bin || to_bin > phase.inbound.len() || class >= n {
        return None;
    }
    let bytes: u64 = (from_bin..to_bin)
        .map(|b| phase.class_bytes[b * n + class])
        .sum();
    Some(bytes as f64 * 8.0 / ((to_bin - from_bin) as f64 * phase.bin_ns as f64))
}

pub fn inbound_gbps(phase: &Phase, from_bin: usize, to_bin: usize) -> Option<f64> {
    if from_bin >= to_bin || to_bin > phase.inbound.len() {
        return None;
    }
    let bytes: u64 = phase.inbound[from_bin..to_bin].iter().sum();
    Some(bytes as f64 * 8.0 / ((to_bin - from_bin) as f64 * phase.bin_ns as f64))
}
