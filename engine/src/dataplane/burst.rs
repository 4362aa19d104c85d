//! A fixed-capacity array of owned mbufs: what one RX or TX burst moves.
//!
//! Ownership across `rte_eth_tx_burst` is the sharp edge of DPDK from Rust: the PMD takes the
//! first `n` buffers and the caller keeps the rest. [`Burst::tx`] forgets the sent prefix (never
//! freed by Rust) and moves the unsent tail to the front, still owned.

use std::mem::MaybeUninit;

use dpdk_sys::rte_mbuf;

use super::{Mbuf, Mempool, RxQueue, TxQueue};

/// Largest burst one call moves.
pub const MAX_BURST: usize = 256;

/// Up to [`MAX_BURST`] owned mbufs; the first `len` slots are initialised.
pub struct Burst {
    len: usize,
    slots: [MaybeUninit<Mbuf>; MAX_BURST],
}

impl Default for Burst {
    fn default() -> Self {
        Self::new()
    }
}

impl Burst {
    pub const fn new() -> Self {
        Burst {
            len: 0,
            slots: [const { MaybeUninit::uninit() }; MAX_BURST],
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Free slots.
    #[inline]
    pub fn spare(&self) -> usize {
        MAX_BURST - self.len
    }

    #[inline]
    fn raw_slots(&mut self) -> *mut *mut rte_mbuf {
        // Mbuf is repr(transparent) over NonNull<rte_mbuf>, itself a *mut rte_mbuf.
        self.slots.as_mut_ptr() as *mut *mut rte_mbuf
    }

    /// The buffers held.
    #[inline]
    pub fn as_slice(&self) -> &[Mbuf] {
        // SAFETY: the first `len` slots are initialised.
        unsafe { std::slice::from_raw_parts(self.slots.as_ptr() as *const Mbuf, self.len) }
    }

    /// The buffers held, writable.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [Mbuf] {
        // SAFETY: the first `len` slots are initialised and borrowed exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.slots.as_mut_ptr() as *mut Mbuf, self.len) }
    }

    /// Adds a buffer at the end; gives it back when full.
    #[inline]
    pub fn push(&mut self, m: Mbuf) -> Result<(), Mbuf> {
        if self.len == MAX_BURST {
            return Err(m);
        }
        self.slots[self.len].write(m);
        self.len += 1;
        Ok(())
    }

    /// Removes the last buffer.
    #[inline]
    pub fn pop(&mut self) -> Option<Mbuf> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        // SAFETY: slot `len` was initialised and is now outside the live prefix.
        Some(unsafe { self.slots[self.len].assume_init_read() })
    }

    /// Sum of `pkt_len` over the buffers held.
    #[inline]
    pub fn bytes(&self) -> u64 {
        self.as_slice().iter().map(|m| m.pkt_len() as u64).sum()
    }

    /// Moves as many buffers from `other` as fit to the end of `self`; returns how many.
    #[inline]
    pub fn take_from(&mut self, other: &mut Burst) -> usize {
        let n = other.len.min(self.spare());
        let dst = self.len;
        // SAFETY: copies n initialised pointers into free slots; `other` forgets them by moving
        // its remaining tail to the front, so each mbuf stays owned exactly once.
        unsafe {
            std::ptr::copy_nonoverlapping(other.raw_slots(), self.raw_slots().add(dst), n);
            std::ptr::copy(other.raw_slots().add(n), other.raw_slots(), other.len - n);
        }
        self.len += n;
        other.len -= n;
        n
    }

    /// Receives up to `max` packets into the free slots; returns how many arrived.
    #[inline]
    pub fn rx(&mut self, q: &mut RxQueue, max: usize) -> usize {
        let n = max.min(self.spare()) as u16;
        let dst = self.len;
        // SAFETY: the PMD writes at most n valid, owned mbuf pointers into free slots.
        let got = unsafe {
            dpdk_sys::portico_rx_burst(q.port_id(), q.queue_id(), self.raw_slots().add(dst), n)
        };
        self.len += got as usize;
        got as usize
    }

    /// Transmits the buffers held, in order. The PMD now owns the sent prefix (it is not
    /// freed here); the unsent tail moves to the front and stays owned. Returns how many
    /// were sent.
    #[inline]
    pub fn tx(&mut self, q: &mut TxQueue) -> usize {
        if self.len == 0 {
            return 0;
        }
        let n = self.len as u16;
        // SAFETY: passes n owned mbufs; the PMD takes ownership of the first `sent`.
        let sent =
            unsafe { dpdk_sys::portico_tx_burst(q.port_id(), q.queue_id(), self.raw_slots(), n) }
                as usize;
        // SAFETY: slots sent..len are still ours; move them to the front. The sent ones are
        // forgotten (the PMD frees them after transmission).
        unsafe {
            std::ptr::copy(
                self.raw_slots().add(sent),
                self.raw_slots(),
                self.len - sent,
            )
        };
        self.len -= sent;
        sent
    }

    /// Fills `n` free slots from `pool` in one bulk call; false (and nothing added) when the
    /// pool cannot supply all of them.
    #[inline]
    pub fn alloc(&mut self, pool: &Mempool, n: usize) -> bool {
        let n = n.min(self.spare());
        if n == 0 {
            return true;
        }
        let dst = self.len;
        // SAFETY: on success DPDK writes n fresh mbuf pointers into free slots.
        let rc = unsafe {
            dpdk_sys::portico_pktmbuf_alloc_bulk(pool.as_ptr(), self.raw_slots().add(dst), n as u32)
        };
        if rc == 0 {
            self.len += n;
            true
        } else {
            false
        }
    }

    /// Frees every buffer held, in one bulk call.
    #[inline]
    pub fn clear(&mut self) {
        if self.len == 0 {
            return;
        }
        // SAFETY: frees exactly the initialised prefix, then forgets it.
        unsafe { dpdk_sys::rte_pktmbuf_free_bulk(self.raw_slots(), self.len as u32) };
        self.len = 0;
    }

    /// Keeps the buffers for which `keep` is true, in order; frees the others.
    pub fn retain(&mut self, mut keep: impl FnMut(&mut Mbuf) -> bool) {
        let len = self.len;
        // If `keep` panics, the prefix is leaked rather than freed twice.
        self.len = 0;
        let mut w = 0;
        for r in 0..len {
            // SAFETY: slot r is initialised; it is either moved to slot w (w <= r) or freed.
            let mut m = unsafe { self.slots[r].assume_init_read() };
            if keep(&mut m) {
                self.slots[w].write(m);
                w += 1;
            } else {
                drop(m);
            }
        }
        self.len = w;
    }
}

impl Drop for Burst {
    fn drop(&mut self) {
        self.clear();
    }
}
