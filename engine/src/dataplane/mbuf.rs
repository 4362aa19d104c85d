//! An owning handle to one DPDK packet buffer.

use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr::NonNull;

use dpdk_sys::rte_mbuf;

/// One single-segment packet buffer, owned: dropping it returns it to its mempool.
///
/// `#[repr(transparent)]` over the raw pointer so that an array of `Mbuf` is an array of
/// `*mut rte_mbuf`, which is what burst calls take. `Send` (a buffer may move to another core)
/// but not `Sync`: the reference count and the data are not synchronised.
#[repr(transparent)]
pub struct Mbuf {
    raw: NonNull<rte_mbuf>,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: an mbuf is owned by exactly one `Mbuf`; moving it between threads is what DPDK does
// on every pipeline. Its mempool is multi-thread safe.
unsafe impl Send for Mbuf {}

impl Mbuf {
    /// Takes ownership of a raw mbuf.
    ///
    /// # Safety
    /// `raw` must be a valid mbuf that nothing else frees or uses afterwards.
    #[inline]
    pub(crate) unsafe fn from_raw(raw: NonNull<rte_mbuf>) -> Self {
        Mbuf {
            raw,
            _not_sync: PhantomData,
        }
    }

    #[inline]
    fn hdr(&self) -> &rte_mbuf {
        // SAFETY: `raw` is valid while self is alive and nothing else mutates it.
        unsafe { self.raw.as_ref() }
    }

    /// Bytes of packet data in this (first) segment.
    #[inline]
    pub fn len(&self) -> usize {
        self.hdr().data_len as usize
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total packet length over all segments.
    #[inline]
    pub fn pkt_len(&self) -> u32 {
        self.hdr().pkt_len
    }

    /// Number of segments.
    #[inline]
    pub fn segments(&self) -> u16 {
        self.hdr().nb_segs
    }

    /// Room left after the data.
    #[inline]
    pub fn tailroom(&self) -> usize {
        let h = self.hdr();
        (h.buf_len as usize).saturating_sub(h.data_off as usize + h.data_len as usize)
    }

    /// The port the packet was received on.
    #[inline]
    pub fn port(&self) -> u16 {
        self.hdr().port
    }

    /// The packet data of the first segment.
    #[inline]
    pub fn data(&self) -> &[u8] {
        let h = self.hdr();
        // SAFETY: buf_addr + data_off .. + data_len lies inside the mbuf's buffer, which is
        // initialised by whoever set data_len (the PMD on RX, `append` on TX).
        unsafe {
            std::slice::from_raw_parts(
                (h.buf_addr as *const u8).add(h.data_off as usize),
                h.data_len as usize,
            )
        }
    }

    /// The packet data of the first segment, writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        let h = self.hdr();
        let (addr, off, len) = (
            h.buf_addr as *mut u8,
            h.data_off as usize,
            h.data_len as usize,
        );
        // SAFETY: as in `data`; `&mut self` means no other view of this mbuf exists, and Portico
        // never creates indirect or shared (refcnt > 1) mbufs.
        unsafe { std::slice::from_raw_parts_mut(addr.add(off), len) }
    }

    /// Extends the data by `len` bytes and returns the new tail, or `None` without room.
    #[inline]
    pub fn append(&mut self, len: u16) -> Option<&mut [u8]> {
        // One segment (every buffer the engine builds): what `rte_pktmbuf_append` does for
        // it, inline, instead of a call through the shim per packet. Chains go to DPDK.
        // SAFETY: `raw` is valid and owned by self; nothing else reads or writes it now.
        let m = unsafe { self.raw.as_mut() };
        if m.nb_segs == 1 {
            let tail = usize::from(m.data_off) + usize::from(m.data_len);
            if tail + usize::from(len) > usize::from(m.buf_len) {
                return None;
            }
            // Cannot overflow: data_off + data_len + len <= buf_len, a u16.
            m.data_len += len;
            m.pkt_len += u32::from(len);
            // SAFETY: buf_addr + tail .. + len lies inside the buffer (checked above), which
            // this handle owns; the bytes become packet data, for the caller to fill.
            return Some(unsafe {
                std::slice::from_raw_parts_mut((m.buf_addr as *mut u8).add(tail), usize::from(len))
            });
        }
        // SAFETY: valid mbuf; rte_pktmbuf_append returns NULL when the tailroom is too small.
        let p = unsafe { dpdk_sys::portico_pktmbuf_append(self.raw.as_ptr(), len) };
        // SAFETY: on success `p` points at `len` bytes inside the buffer, owned through self.
        NonNull::new(p as *mut u8)
            .map(|p| unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len as usize) })
    }

    /// Removes `len` bytes from the end of the data; false if the packet is shorter.
    #[inline]
    pub fn trim(&mut self, len: u16) -> bool {
        // SAFETY: valid mbuf; the call checks the length.
        unsafe { dpdk_sys::portico_pktmbuf_trim(self.raw.as_ptr(), len) == 0 }
    }

    /// A copy of this packet's (first segment) data in a fresh buffer from `pool`.
    pub fn duplicate(&self, pool: &super::Mempool) -> Option<Mbuf> {
        let mut copy = pool.alloc()?;
        let len = u16::try_from(self.len()).ok()?;
        copy.append(len)?.copy_from_slice(self.data());
        Some(copy)
    }

    /// Empties the packet (length 0, default headroom).
    #[inline]
    pub fn reset(&mut self) {
        // SAFETY: valid, exclusively owned mbuf.
        unsafe { dpdk_sys::portico_pktmbuf_reset(self.raw.as_ptr()) }
    }
}

impl Drop for Mbuf {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: we own the mbuf and it is freed exactly once.
        unsafe { dpdk_sys::portico_pktmbuf_free(self.raw.as_ptr()) }
    }
}

impl std::fmt::Debug for Mbuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mbuf")
            .field("len", &self.len())
            .field("pkt_len", &self.pkt_len())
            .field("segments", &self.segments())
            .finish()
    }
}
