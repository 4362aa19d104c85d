//! Raw forwarding: every packet received on input `i` leaves on output `map[i]`, untouched
//! (`io`) or with its Ethernet source and destination swapped (`macswap`), as testpmd does.

use crate::dataplane::Burst;
use crate::runtime::{Counters, Outlook, Outputs, Stage};

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum FwdMode {
    /// Forward packets unchanged.
    Io,
    /// Swap source and destination MAC addresses.
    Macswap,
}

pub struct Forward {
    mode: FwdMode,
    map: Vec<usize>,
}

impl Forward {
    /// `map[i]` is the output that input `i` forwards to.
    pub fn new(mode: FwdMode, map: Vec<usize>) -> Self {
        Forward { mode, map }
    }
}

/// Swaps the destination and source MAC of an Ethernet frame; shorter buffers are left alone.
#[inline]
pub fn swap_macs(frame: &mut [u8]) {
    if let Some(hdr) = frame.get_mut(..12) {
        let (dst, src) = hdr.split_at_mut(6);
        dst.swap_with_slice(src);
    }
}

impl Stage for Forward {
    fn name(&self) -> &'static str {
        match self.mode {
            FwdMode::Io => "io",
            FwdMode::Macswap => "macswap",
        }
    }

    /// Only packets give it work.
    fn outlook(&mut self) -> Outlook {
        Outlook::PACKETS
    }

    #[inline]
    fn on_rx(&mut self, input: usize, burst: &mut Burst, out: &mut Outputs, _c: &mut Counters) {
        if self.mode == FwdMode::Macswap {
            burst.for_each_data_mut(swap_macs);
        }
        // Whatever does not fit in the output buffer stays in `burst` and is counted as
        // dropped by the worker.
        out.buffer(self.map[input]).take_from(burst);
    }
}

#[cfg(test)]
mod tests {
    use super::swap_macs;

    #[test]
    fn macswap_swaps_exactly_the_two_addresses() {
        let mut f: Vec<u8> = (0u8..20).collect();
        swap_macs(&mut f);
        assert_eq!(&f[..12], &[6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5]);
        assert_eq!(&f[12..], &[12, 13, 14, 15, 16, 17, 18, 19]);
        let mut short = vec![1u8, 2, 3];
        swap_macs(&mut short);
        assert_eq!(short, [1, 2, 3]);
    }
}
