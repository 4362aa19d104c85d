//! `portico ports`: start EAL with the user's devices and describe every probed port. Also the
//! size of the mbuf pool for the ports a run opens.

use crate::config::HugepageMode;
use crate::dataplane::{self, PoolLayout, PortConfig, PortInfo};
use crate::hugepages::HugepageStatus;
use crate::summary::MemoryChoice;

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
    start_eal(args, memory, None, json)?;
    dataplane::port_ids()
        .into_iter()
        .map(|id| dataplane::PortInfo::read(id).map_err(AppError::from))
        .collect()
}

/// Mbufs needed: every RX and TX descriptor filled, plus per-worker caches and bursts, as a
/// power of two minus one; `u32::MAX` when more than that (which no memory holds, see
/// [`check_pool_fits`]).
pub fn pool_size(ports: &[PortConfig], workers: usize) -> u32 {
    let desc: u64 = ports
        .iter()
        .map(|p| p.rx_queues as u64 * p.rx_desc as u64 + p.tx_queues as u64 * p.tx_desc as u64)
        .sum();
    let per_worker = POOL_CACHE as u64 + (dataplane::MAX_BURST as u64) * (ports.len() as u64 + 1);
    let n = (desc + workers as u64 * per_worker + 4096).next_power_of_two() - 1;
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The layout of a pool that only ports `ids` use: packed under `--no-huge` when all their
/// drivers only touch buffers with the CPU (see [`PoolLayout`]).
pub(super) fn pool_layout(ids: &[u16]) -> Result<PoolLayout, AppError> {
    let drivers = ids
        .iter()
        .map(|&id| PortInfo::read(id).map(|i| i.driver))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(PoolLayout::for_drivers(drivers.iter().map(String::as_str)))
}

/// Buffers each lcore keeps in its mempool cache.
pub(super) const POOL_CACHE: u32 = 256;

/// Bytes a pool object takes besides its data room: the mbuf header and the mempool's object
/// header, a cache line each.
const MBUF_OVERHEAD: u64 = 128 + 64;

/// EAL's own use of its memory besides the pool, in bytes: what the measurements below leave
/// over (the least that is needed, so that a size that works is never refused).
const EAL_OVERHEAD: u64 = 2 << 20;

/// The page size of EAL's memory under `--no-huge`.
const SMALL_PAGE: u64 = 4096;

/// The bytes of EAL memory a pool of `mbufs` buffers of `data_room` bytes takes at least.
/// Under `--no-huge` EAL's memory is 4 KiB pages, and a pool object no larger than a page
/// never straddles two: the usual 2176-byte data room takes a whole page per mbuf. Larger
/// objects (the RDMA engines' 4 KiB frames) and objects on hugepages are packed. Measured on
/// DPDK 22.11: 16383 mbufs of 2176 bytes need 66 MiB, 131071 of them 516 MiB, 16383 of 4480
/// bytes 76 MiB.
pub fn pool_bytes(mbufs: u32, data_room: u16, memory: &MemoryChoice) -> u64 {
    let object = data_room as u64 + MBUF_OVERHEAD;
    let per_mbuf = match memory {
        MemoryChoice::NoHuge { .. } if object <= SMALL_PAGE => SMALL_PAGE / (SMALL_PAGE / object),
        _ => object,
    };
    mbufs as u64 * per_mbuf + EAL_OVERHEAD
}

/// Whether the memory EAL will have holds a pool of `mbufs` buffers of `data_room` bytes. An
/// error names `memory_field` (the `--no-huge` size) or `hugepages_field`, and says what to
/// lower (`lower`, when not empty). Not checked when the user gave `--no-huge` among the EAL arguments (then
/// the size is theirs too).
pub fn check_pool_fits(
    memory: &MemoryChoice,
    mbufs: u32,
    data_room: u16,
    (memory_field, hugepages_field): (&str, &str),
    lower: &str,
) -> Result<(), AppError> {
    let need = pool_bytes(mbufs, data_room, memory);
    let mib = |b: u64| b.div_ceil(1 << 20);
    let what = format!(
        "the mbuf pool ({mbufs} mbufs of {data_room} bytes) needs {} MiB",
        mib(need)
    );
    let or_lower = if lower.is_empty() {
        String::new()
    } else {
        format!(" or lower {lower}")
    };
    match *memory {
        MemoryChoice::NoHuge { mb: Some(mb) } if need > (mb as u64) << 20 => {
            Err(AppError::Usage(format!(
                "{memory_field}: {mb} MiB is too little: {what} under --no-huge; raise it{or_lower}"
            )))
        }
        MemoryChoice::Hugepages { page_kb, free } if need > free * page_kb * 1024 => {
            Err(AppError::Usage(format!(
                "{hugepages_field}: {free} free hugepages of {page_kb} KiB are too few: {what}; reserve more (scripts/hugepages.sh) or run without hugepages{or_lower}"
            )))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_too_large_for_eal_memory_names_the_field() {
        let no_huge = |mb| MemoryChoice::NoHuge { mb: Some(mb) };
        let fields = ("eal.memory_mb", "eal.hugepages");
        // As measured: 16383 mbufs of 2176 bytes fit 66 MiB, not 65; of 4480 bytes, 76 MiB.
        assert!(check_pool_fits(&no_huge(66), 16383, 2176, fields, "x").is_ok());
        assert!(check_pool_fits(&no_huge(65), 16383, 2176, fields, "x").is_err());
        assert!(check_pool_fits(&no_huge(76), 16383, 4480, fields, "x").is_ok());
        assert!(check_pool_fits(&no_huge(74), 16383, 4480, fields, "x").is_err());
        let e = check_pool_fits(&no_huge(64), 16383, 2176, fields, "ports[].rx_desc").unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert_eq!(
            e.to_string(),
            "eal.memory_mb: 64 MiB is too little: the mbuf pool (16383 mbufs of 2176 bytes) needs 66 MiB under --no-huge; raise it or lower ports[].rx_desc"
        );
        let huge = MemoryChoice::Hugepages {
            page_kb: 2048,
            free: 32,
        };
        assert!(
            check_pool_fits(&huge, 16383, 2176, fields, "x").is_ok(),
            "packed: 42 MiB"
        );
        let e = check_pool_fits(&huge, 131071, 2176, fields, "x").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("eal.hugepages: 32 free hugepages"),
            "{e}"
        );
        assert!(
            check_pool_fits(
                &MemoryChoice::NoHuge { mb: None },
                u32::MAX,
                9000,
                fields,
                "x"
            )
            .is_ok(),
            "the user's own --no-huge is not checked"
        );
    }

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
        let huge = PortConfig {
            rx_queues: 1024,
            tx_queues: 1024,
            rx_desc: 16384,
            tx_desc: 16384,
            ..PortConfig::default()
        };
        assert_eq!(pool_size(&vec![huge; 64], 64), u32::MAX, "saturates");
    }
}
