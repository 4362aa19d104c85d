//! `portico ports`: start EAL with the user's devices and describe every probed port. Also the
//! size of the mbuf pool for the ports a run opens.

use crate::config::HugepageMode;
use crate::dataplane::{self, PortConfig};
use crate::hugepages::HugepageStatus;

use super::AppError;
use super::eal::{available_cores, main_core_for, plan_eal_args, start_eal};

/// Starts EAL with `eal` and describes every probed port.
pub fn list_ports(eal: &[String], json: bool) -> Result<Vec<dataplane::PortInfo>, AppError> {
    let cores = available_cores();
    let (args, memory) = plan_eal_args(
        eal,
        HugepageMode::Auto,
        256,
        main_core_for(&[], &cores),
        &[],
        &HugepageStatus::read(),
    )?;
    start_eal(args, memory, json)?;
    dataplane::port_ids()
        .into_iter()
        .map(|id| dataplane::PortInfo::read(id).map_err(AppError::from))
        .collect()
}

/// Mbufs needed: every RX and TX descriptor filled, plus per-worker caches and bursts.
pub fn pool_size(ports: &[PortConfig], workers: usize) -> u32 {
    let desc: u32 = ports
        .iter()
        .map(|p| p.rx_queues as u32 * p.rx_desc as u32 + p.tx_queues as u32 * p.tx_desc as u32)
        .sum();
    let per_worker = POOL_CACHE + (dataplane::MAX_BURST as u32) * (ports.len() as u32 + 1);
    (desc + workers as u32 * per_worker + 4096).next_power_of_two() - 1
}

/// Buffers each lcore keeps in its mempool cache.
pub(super) const POOL_CACHE: u32 = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_covers_descriptors() {
        let p = PortConfig::default();
        let n = pool_size(&[p.clone(), p], 2);
        assert!(n >= 4 * 1024 + 2 * 256);
        assert_eq!(
            (n + 1).count_ones(),
            1,
            "2^k - 1 is the optimal mempool size"
        );
    }
}
