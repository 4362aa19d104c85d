//! Packet-buffer pools.

use std::ptr::NonNull;

use dpdk_sys::rte_mempool;

use super::{DpdkError, Eal, Mbuf, c_string};

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
    /// per-lcore cache of `cache` buffers, on `socket` (-1: any).
    pub fn new(
        name: &str,
        count: u32,
        cache: u32,
        data_room: u16,
        socket: i32,
    ) -> Result<Self, DpdkError> {
        if Eal::get().is_none() {
            return Err(DpdkError {
                what: format!("mempool {name}"),
                code: 0,
                text: "EAL is not running".into(),
            });
        }
        let cname = c_string("mempool name", name)?;
        // SAFETY: EAL is running; the name is a valid C string copied by DPDK.
        let raw = unsafe {
            dpdk_sys::rte_pktmbuf_pool_create(cname.as_ptr(), count, cache, 0, data_room, socket)
        };
        let raw = NonNull::new(raw).ok_or_else(|| {
            DpdkError::from_code(format!("creating mempool {name} ({count} mbufs)"), 0)
        })?;
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
