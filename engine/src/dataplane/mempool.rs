//! Packet-buffer pools.

use std::ptr::NonNull;

use dpdk_sys::rte_mempool;

use super::{DpdkError, Eal, Mbuf, c_string};

/// Drivers that only ever touch packet buffers with the CPU (they copy, or pass pointers
/// between queues in memory): no device DMAs into a buffer, so a buffer may straddle two
/// pages. Any other driver, a PCI NIC's or `net_af_xdp`'s (whose kernel side rejects frames
/// that cross a page boundary), keeps DPDK's page-aligned layout.
const CPU_ONLY_DRIVERS: &[&str] = &[
    "net_null",
    "net_ring",
    "net_tap",
    "net_pcap",
    "net_af_packet",
];

/// Where a pool puts its buffers relative to page boundaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PoolLayout {
    /// DPDK's default: no buffer crosses a page boundary, so that any device can DMA into
    /// any buffer. On 4 KiB pages (`--no-huge`) a default 2176-byte mbuf (2368 bytes with its
    /// headers) then takes a page of its own, and every mbuf header sits at the same offset
    /// in its page: the headers compete for the same few L1 cache sets, and each mbuf costs a
    /// TLB entry. On `net_null` that halves the forwarding rate (docs/dataplane.md).
    #[default]
    PageAligned,
    /// Buffers back to back, across page boundaries (`RTE_MEMPOOL_F_NO_IOVA_CONTIG`). DPDK then
    /// marks the pool as unusable for DMA, which is what it is. Only for ports whose drivers
    /// are all CPU-only; [`PoolLayout::for_drivers`] decides.
    Packed,
}

impl PoolLayout {
    /// The layout for a pool used only by ports with these drivers: packed when EAL runs
    /// without hugepages and every driver is CPU-only, page-aligned otherwise (on hugepages
    /// the two differ only at 2 MiB boundaries).
    pub fn for_drivers<'a>(drivers: impl IntoIterator<Item = &'a str>) -> PoolLayout {
        let small_pages = Eal::get().is_some_and(|e| !e.hugepages);
        let mut drivers = drivers.into_iter().peekable();
        if small_pages && drivers.peek().is_some() && drivers.all(|d| CPU_ONLY_DRIVERS.contains(&d))
        {
            PoolLayout::Packed
        } else {
            PoolLayout::PageAligned
        }
    }
}

/// A DPDK mbuf pool. Shared by reference between cores (DPDK pools are multi-producer,
/// multi-consumer, with a per-lcore cache for registered threads).
pub struct Mempool {
    raw: NonNull<rte_mempool>,
    name: String,
}

// SAFETY: rte_mempool operations are thread-safe; the handle is only a pointer.
unsafe impl Send for Mempool {}
// SAFETY: as above: concurrent get/put from several threads is the pool's design.
unsafe impl Sync for Mempool {}

impl Mempool {
    /// Creates a pool of `count` mbufs with `data_room` bytes each (headroom included) and a
    /// per-lcore cache of `cache` buffers, on `socket` (-1: any), in DPDK's default
    /// (page-aligned) layout.
    pub fn new(
        name: &str,
        count: u32,
        cache: u32,
        data_room: u16,
        socket: i32,
    ) -> Result<Self, DpdkError> {
        Self::with_layout(
            name,
            count,
            cache,
            data_room,
            socket,
            PoolLayout::PageAligned,
        )
    }

    /// As [`Mempool::new`], in the given layout.
    pub fn with_layout(
        name: &str,
        count: u32,
        cache: u32,
        data_room: u16,
        socket: i32,
        layout: PoolLayout,
    ) -> Result<Self, DpdkError> {
        if Eal::get().is_none() {
            return Err(DpdkError {
                what: format!("mempool {name}"),
                code: 0,
                text: "EAL is not running".into(),
            });
        }
        let cname = c_string("mempool name", name)?;
        let what = || format!("creating mempool {name} ({count} mbufs)");
        let raw = match layout {
            // SAFETY: EAL is running; the name is a valid C string copied by DPDK.
            PoolLayout::PageAligned => unsafe {
                dpdk_sys::rte_pktmbuf_pool_create(
                    cname.as_ptr(),
                    count,
                    cache,
                    0,
                    data_room,
                    socket,
                )
            },
            PoolLayout::Packed => packed_pool(&cname, count, cache, data_room, socket)
                .map_err(|code| DpdkError::from_code(what(), code))?,
        };
        let raw = NonNull::new(raw).ok_or_else(|| DpdkError::from_code(what(), 0))?;
        Ok(Mempool {
            raw,
            name: name.to_string(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn as_ptr(&self) -> *mut rte_mempool {
        self.raw.as_ptr()
    }

    /// One buffer, or `None` when the pool is empty.
    #[inline]
    pub fn alloc(&self) -> Option<Mbuf> {
        // SAFETY: valid pool; a non-null result is a fresh mbuf we now own.
        let m = unsafe { dpdk_sys::portico_pktmbuf_alloc(self.raw.as_ptr()) };
        NonNull::new(m).map(|m| unsafe { Mbuf::from_raw(m) })
    }

    /// Buffers available (in the ring and the caches).
    pub fn available(&self) -> u32 {
        // SAFETY: valid pool.
        unsafe { dpdk_sys::rte_mempool_avail_count(self.raw.as_ptr()) }
    }

    /// Buffers currently out of the pool.
    pub fn in_use(&self) -> u32 {
        // SAFETY: valid pool.
        unsafe { dpdk_sys::rte_mempool_in_use_count(self.raw.as_ptr()) }
    }
}

/// `rte_pktmbuf_pool_create` (DPDK 22.11, `rte_mbuf.c`) with `RTE_MEMPOOL_F_NO_IOVA_CONTIG`,
/// the one flag it does not let a caller pass. Returns the pool, NULL with `rte_errno` set, or
/// a negative errno.
fn packed_pool(
    name: &std::ffi::CStr,
    count: u32,
    cache: u32,
    data_room: u16,
    socket: i32,
) -> Result<*mut rte_mempool, i32> {
    let mut private = dpdk_sys::rte_pktmbuf_pool_private {
        mbuf_data_room_size: data_room,
        ..Default::default()
    };
    let elt_size = std::mem::size_of::<dpdk_sys::rte_mbuf>() as u32 + data_room as u32;
    // SAFETY: EAL is running; name is a valid C string copied by DPDK; the private area is
    // sized for rte_pktmbuf_pool_private, which rte_pktmbuf_pool_init fills below.
    let mp = unsafe {
        dpdk_sys::rte_mempool_create_empty(
            name.as_ptr(),
            count,
            elt_size,
            cache,
            std::mem::size_of::<dpdk_sys::rte_pktmbuf_pool_private>() as u32,
            socket,
            dpdk_sys::RTE_MEMPOOL_F_NO_IOVA_CONTIG,
        )
    };
    if mp.is_null() {
        return Ok(mp);
    }
    // SAFETY: mp is a fresh, empty pool that only this function holds. Each step is the one
    // rte_pktmbuf_pool_create takes; on failure the pool is freed and never used again.
    unsafe {
        let rc = dpdk_sys::rte_mempool_set_ops_byname(
            mp,
            dpdk_sys::rte_mbuf_best_mempool_ops(),
            std::ptr::null_mut(),
        );
        if rc != 0 {
            dpdk_sys::rte_mempool_free(mp);
            return Err(rc);
        }
        dpdk_sys::rte_pktmbuf_pool_init(mp, (&raw mut private).cast());
        let rc = dpdk_sys::rte_mempool_populate_default(mp);
        if rc < 0 {
            dpdk_sys::rte_mempool_free(mp);
            return Err(rc);
        }
        dpdk_sys::rte_mempool_obj_iter(mp, Some(dpdk_sys::rte_pktmbuf_init), std::ptr::null_mut());
    }
    Ok(mp)
}

impl Drop for Mempool {
    fn drop(&mut self) {
        // A buffer still out (in a queue or a leaked Mbuf) would point into freed memory, so a
        // pool with buffers in use is deliberately leaked instead.
        if self.in_use() == 0 {
            // SAFETY: no mbuf of this pool is alive and no port references it any more
            // (ports hold an Arc to their pool).
            unsafe { dpdk_sys::rte_mempool_free(self.raw.as_ptr()) }
        }
    }
}
