//! Scatter/gather lists: a work request's local buffer as up to [`MAX_SGE`] pieces.
//!
//! An application names its buffers with [`Sge`]s (lkey, address, length), as verbs does. When
//! the worker takes a work request it resolves the whole list once into a [`Gather`] of
//! [`Location`]s (every key, bound and permission checked before any byte moves); after that,
//! the packet path copies bytes at a message offset with [`Gather::copy_out`] and
//! [`Gather::copy_in`] without looking a key up again. Both are fixed-size values: nothing
//! allocates per work request.

use super::mr::{Access, AccessError, Location, MemoryTable};

/// The most pieces one work request's local buffer may have.
pub const MAX_SGE: usize = 16;

/// One piece of a local buffer: `len` bytes at `addr` in the region named by `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

impl Sge {
    pub const fn new(lkey: u32, addr: u64, len: u32) -> Sge {
        Sge { addr, len, lkey }
    }
}

/// A list of at most [`MAX_SGE`] pieces, stored inline.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SgList {
    n: u8,
    sges: [Sge; MAX_SGE],
}

/// More than [`MAX_SGE`] pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a work request takes at most {MAX_SGE} scatter/gather entries")]
pub struct TooManySges;

impl Default for SgList {
    fn default() -> Self {
        SgList::new()
    }
}

impl core::fmt::Debug for SgList {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl SgList {
    /// An empty list (a zero-length message).
    pub const fn new() -> SgList {
        SgList {
            n: 0,
            sges: [Sge {
                addr: 0,
                len: 0,
                lkey: 0,
            }; MAX_SGE],
        }
    }

    /// A list of one piece.
    pub const fn one(lkey: u32, addr: u64, len: u32) -> SgList {
        let mut l = SgList::new();
        l.sges[0] = Sge::new(lkey, addr, len);
        l.n = 1;
        l
    }

    pub fn from_slice(sges: &[Sge]) -> Result<SgList, TooManySges> {
        let mut l = SgList::new();
        for &s in sges {
            l.push(s)?;
        }
        Ok(l)
    }

    pub fn push(&mut self, sge: Sge) -> Result<(), TooManySges> {
        let slot = self.sges.get_mut(self.n as usize).ok_or(TooManySges)?;
        *slot = sge;
        self.n += 1;
        Ok(())
    }

    pub fn as_slice(&self) -> &[Sge] {
        &self.sges[..self.n as usize]
    }

    pub fn len(&self) -> usize {
        self.n as usize
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Bytes the list covers.
    pub fn total_len(&self) -> u64 {
        self.as_slice().iter().map(|s| u64::from(s.len)).sum()
    }
}

/// One resolved piece, 16 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Seg {
    offset: u64,
    region: u32,
    len: u32,
}

impl Seg {
    const ZERO: Seg = Seg {
        offset: 0,
        region: 0,
        len: 0,
    };

    const fn new(at: Location, len: u32) -> Seg {
        Seg {
            offset: at.offset,
            region: at.region,
            len,
        }
    }

    const fn at(&self) -> Location {
        Location {
            offset: self.offset,
            region: self.region,
        }
    }
}

/// Why a list did not resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LocalError {
    /// A key, a bound or a permission failed (verbs: local protection error).
    #[error("scatter/gather entry {index}: {error}")]
    Protection { index: usize, error: AccessError },
    /// The pieces add up to more than a message may carry (2^31 bytes).
    #[error("message longer than 2^31 bytes")]
    Length,
    /// The queue pair cannot carry the operation (verbs: local QP operation error).
    #[error("operation not supported on this queue pair")]
    Operation,
    /// More than [`MAX_SGE`] pieces (only a list given as a slice can have them; an
    /// [`SgList`] refuses them with the same error).
    #[error(transparent)]
    TooMany(#[from] TooManySges),
}

/// Where the resolved lists of more than one piece keep their pieces: a ring of whole lists,
/// one owned by each requester and responder, claimed in turn by the requests that need one.
///
/// Most requests have one piece, which their [`Gather`] holds inline, so a work request moves
/// through the engine as 32 bytes and not as a list of sixteen. A request with more claims the
/// ring's next list. The ring has a list for every request that can be alive at once (taken and
/// not yet completed, in the order taken), so a list is claimed again only after the request
/// that held it is gone, and nothing has to be given back.
#[derive(Debug, Clone)]
pub struct Spill {
    lists: Vec<[Seg; MAX_SGE]>,
    next: u32,
}

impl Spill {
    /// A ring for `live` requests alive at once (at least one).
    pub fn new(live: usize) -> Spill {
        Spill {
            lists: vec![[Seg::ZERO; MAX_SGE]; live.max(1)],
            next: 0,
        }
    }

    fn claim(&mut self) -> u32 {
        let i = self.next;
        self.next = if i as usize + 1 == self.lists.len() {
            0
        } else {
            i + 1
        };
        i
    }
}

/// A resolved scatter/gather list: one piece inline, more in the owner's [`Spill`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gather {
    first: Seg,
    total: u32,
    /// The [`Spill`] list holding the pieces when there is more than one.
    spill: u32,
    n: u8,
}

impl Gather {
    /// No bytes.
    pub const EMPTY: Gather = Gather {
        first: Seg::ZERO,
        total: 0,
        spill: 0,
        n: 0,
    };

    /// One resolved piece of `len` bytes at `at` (the engine's own buffers: a rendezvous pull).
    pub const fn at(at: Location, len: u32) -> Gather {
        if len == 0 {
            return Gather::EMPTY;
        }
        Gather {
            first: Seg::new(at, len),
            total: len,
            spill: 0,
            n: 1,
        }
    }

    /// The one piece this list is, if it is one.
    pub fn single(&self) -> Option<(Location, u32)> {
        (self.n == 1).then(|| (self.first.at(), self.first.len))
    }

    /// Check every piece of `list` against `mem` for `need` and resolve it; a list of more
    /// than one piece claims a list of `spill`. At most [`MAX_SGE`] pieces.
    #[inline(always)]
    pub fn resolve(
        mem: &MemoryTable,
        list: &[Sge],
        need: Access,
        spill: &mut Spill,
    ) -> Result<Gather, LocalError> {
        // Most requests have one piece: the same checks and result without the loop's
        // bookkeeping (callgrind: 133 instructions a batched WRITE before, 73 with it), and
        // inline, where the call saved and restored six registers.
        if let [s] = list {
            return Gather::resolve_one(mem, s, need);
        }
        Gather::resolve_list(mem, list, need, spill)
    }

    /// [`Gather::resolve`] of a list of the one piece `s`.
    #[inline(always)]
    pub(crate) fn resolve_one(
        mem: &MemoryTable,
        s: &Sge,
        need: Access,
    ) -> Result<Gather, LocalError> {
        let at = mem
            .check_local(s.lkey, s.addr, u64::from(s.len), need)
            .map_err(|error| LocalError::Protection { index: 0, error })?;
        if s.len > 1 << 31 {
            return Err(LocalError::Length);
        }
        Ok(Gather::at(at, s.len))
    }

    /// [`Gather::resolve`] of a list of any other length.
    #[inline(never)]
    pub(crate) fn resolve_list(
        mem: &MemoryTable,
        list: &[Sge],
        need: Access,
        spill: &mut Spill,
    ) -> Result<Gather, LocalError> {
        if list.len() > MAX_SGE {
            return Err(TooManySges.into());
        }
        let mut g = Gather::EMPTY;
        let mut total = 0u64;
        for (index, s) in list.iter().enumerate() {
            let at = mem
                .check_local(s.lkey, s.addr, u64::from(s.len), need)
                .map_err(|error| LocalError::Protection { index, error })?;
            total += u64::from(s.len);
            if s.len == 0 {
                continue;
            }
            let seg = Seg::new(at, s.len);
            match g.n {
                0 => g.first = seg,
                1 => {
                    g.spill = spill.claim();
                    let l = &mut spill.lists[g.spill as usize];
                    l[0] = g.first;
                    l[1] = seg;
                }
                n => spill.lists[g.spill as usize][n as usize] = seg,
            }
            g.n += 1;
        }
        if total > 1 << 31 {
            return Err(LocalError::Length);
        }
        g.total = total as u32;
        Ok(g)
    }

    /// Bytes in the list.
    pub fn len(&self) -> u32 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    #[inline]
    fn pieces<'a>(&'a self, spill: &'a Spill) -> &'a [Seg] {
        match self.n {
            0 => &[],
            1 => core::slice::from_ref(&self.first),
            n => &spill.lists[self.spill as usize][..n as usize],
        }
    }

    /// Whether any piece lies in region `slot`.
    pub fn uses_region(&self, spill: &Spill, slot: u32) -> bool {
        self.pieces(spill).iter().any(|s| s.region == slot)
    }

    /// Calls `f(location, len)` for the pieces that cover message bytes
    /// `offset..offset + len`, in order.
    #[inline]
    fn walk(
        &self,
        spill: &Spill,
        mut offset: u32,
        mut len: usize,
        mut f: impl FnMut(Location, usize),
    ) {
        for s in self.pieces(spill) {
            if len == 0 {
                return;
            }
            if offset >= s.len {
                offset -= s.len;
                continue;
            }
            let n = ((s.len - offset) as usize).min(len);
            f(s.at().advance(u64::from(offset)), n);
            len -= n;
            offset = 0;
        }
        debug_assert_eq!(len, 0, "copy past the end of a gather list");
    }

    /// Copy message bytes `offset..offset + dst.len()` out of the application's memory.
    ///
    /// A list of one piece (the common one) is copied inline; a longer one is walked out of
    /// line, so that the short path's caller saves no registers for the walk.
    #[inline(always)]
    pub fn copy_out(&self, mem: &MemoryTable, spill: &Spill, offset: u32, dst: &mut [u8]) {
        if self.n == 1 {
            return mem.fetch(self.first.at().advance(u64::from(offset)), dst);
        }
        self.copy_out_walk(mem, spill, offset, dst);
    }

    #[inline(never)]
    fn copy_out_walk(&self, mem: &MemoryTable, spill: &Spill, offset: u32, dst: &mut [u8]) {
        let mut done = 0;
        self.walk(spill, offset, dst.len(), |at, n| {
            mem.fetch(at, &mut dst[done..done + n]);
            done += n;
        });
    }

    /// [`Gather::copy_out`] folding the bytes into the CRC register `reg` as they are copied;
    /// returns the register after them.
    #[inline(always)]
    pub fn copy_out_crc(
        &self,
        mem: &MemoryTable,
        spill: &Spill,
        offset: u32,
        dst: &mut [u8],
        reg: u32,
    ) -> u32 {
        if self.n == 1 {
            return mem.fetch_crc(self.first.at().advance(u64::from(offset)), dst, reg);
        }
        self.copy_out_crc_walk(mem, spill, offset, dst, reg)
    }

    #[inline(never)]
    fn copy_out_crc_walk(
        &self,
        mem: &MemoryTable,
        spill: &Spill,
        offset: u32,
        dst: &mut [u8],
        reg: u32,
    ) -> u32 {
        let (mut done, mut reg) = (0, reg);
        self.walk(spill, offset, dst.len(), |at, n| {
            reg = mem.fetch_crc(at, &mut dst[done..done + n], reg);
            done += n;
        });
        reg
    }

    /// Place `src` at message offset `offset` into the application's memory.
    #[inline]
    pub fn copy_in(&self, mem: &MemoryTable, spill: &Spill, offset: u32, src: &[u8]) {
        if self.n == 1 {
            return mem.store(self.first.at().advance(u64::from(offset)), src);
        }
        let mut done = 0;
        self.walk(spill, offset, src.len(), |at, n| {
            mem.store(at, &src[done..done + n]);
            done += n;
        });
    }
}

const _: () = assert!(core::mem::size_of::<Seg>() == 16);
const _: () = assert!(core::mem::size_of::<Gather>() == 32);

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn lists_hold_sixteen_pieces_and_no_more() {
        let mut l = SgList::new();
        for i in 0..MAX_SGE {
            l.push(Sge::new(1, i as u64, 1)).unwrap();
        }
        assert_eq!(l.push(Sge::new(1, 0, 1)), Err(TooManySges));
        assert_eq!(l.total_len(), 16);
        assert_eq!(SgList::one(3, 4, 5).as_slice(), [Sge::new(3, 4, 5)]);
    }

    #[test]
    fn gather_and_scatter_cross_piece_boundaries() {
        let map = Arc::new(pmem::Mapping::anonymous(4096).unwrap());
        let mut mem = MemoryTable::new();
        let k = mem
            .register_iova(map.clone(), 0, 4096, 0x1000, Access::ALL)
            .unwrap();
        // Three pieces out of order in the region, one empty.
        let list = SgList::from_slice(&[
            Sge::new(k.lkey, 0x1000 + 100, 3),
            Sge::new(k.lkey, 0x1000 + 10, 0),
            Sge::new(k.lkey, 0x1000, 4),
            Sge::new(k.lkey, 0x1000 + 50, 5),
        ])
        .unwrap();
        let mut spill = Spill::new(1);
        let g = Gather::resolve(&mem, list.as_slice(), Access::LOCAL_WRITE, &mut spill).unwrap();
        assert_eq!(g.len(), 12);
        g.copy_in(&mem, &spill, 0, b"abcdefghijkl");
        let mut back = [0u8; 12];
        g.copy_out(&mem, &spill, 0, &mut back);
        assert_eq!(&back, b"abcdefghijkl");
        let mut mid = [0u8; 6];
        g.copy_out(&mem, &spill, 2, &mut mid);
        assert_eq!(&mid, b"cdefgh");
        let mut at = [0u8; 4];
        map.read(0, &mut at).unwrap();
        assert_eq!(&at, b"defg", "the second piece starts at message byte 3");
        map.read(100, &mut at[..3]).unwrap();
        assert_eq!(&at[..3], b"abc");
    }

    #[test]
    fn a_one_piece_list_resolves_as_the_general_walk_does() {
        let map = Arc::new(pmem::Mapping::anonymous(64).unwrap());
        let mut mem = MemoryTable::new();
        let k = mem.register_iova(map, 0, 64, 0x40, Access::ALL).unwrap();
        let spill = &mut Spill::new(2);
        let one = |addr, len| SgList::one(k.lkey, addr, len);
        // The same piece followed by an empty one goes through the loop.
        let walked = |addr, len| {
            SgList::from_slice(&[Sge::new(k.lkey, addr, len), Sge::new(k.lkey, 0x40, 0)]).unwrap()
        };
        for (addr, len) in [
            (0x40, 64),
            (0x48, 8),
            (0x50, 0),
            (0x7f, 1),
            (0x30, 8),
            (0x78, 9),
        ] {
            let fast = Gather::resolve(&mem, one(addr, len).as_slice(), Access::LOCAL_WRITE, spill);
            let slow = Gather::resolve(
                &mem,
                walked(addr, len).as_slice(),
                Access::LOCAL_WRITE,
                spill,
            );
            assert_eq!(fast, slow, "{addr:#x} + {len}");
        }
        let g = Gather::resolve(&mem, one(0x48, 8).as_slice(), Access::LOCAL_WRITE, spill).unwrap();
        let (at, len) = g.single().expect("one piece");
        assert_eq!((at.offset, len), (8, 8));
        assert_eq!(spill.next, 0, "one piece claims no spilled list");
        // An empty piece is still checked.
        assert!(matches!(
            Gather::resolve(
                &mem,
                SgList::one(k.lkey ^ 0x100, 0x40, 0).as_slice(),
                Access::NONE,
                spill
            ),
            Err(LocalError::Protection { index: 0, .. })
        ));
    }

    #[test]
    fn a_bad_piece_is_a_local_protection_error_naming_it() {
        let map = Arc::new(pmem::Mapping::anonymous(64).unwrap());
        let mut mem = MemoryTable::new();
        let k = mem
            .register_iova(map, 0, 64, 0, Access::REMOTE_READ)
            .unwrap();
        let list = SgList::from_slice(&[Sge::new(k.lkey, 0, 8), Sge::new(k.lkey, 60, 8)]).unwrap();
        let spill = &mut Spill::new(1);
        assert_eq!(
            Gather::resolve(&mem, list.as_slice(), Access::NONE, spill),
            Err(LocalError::Protection {
                index: 1,
                error: AccessError::OutOfBounds { addr: 60, len: 8 }
            })
        );
        let one = SgList::one(k.lkey, 0, 8);
        assert!(matches!(
            Gather::resolve(&mem, one.as_slice(), Access::LOCAL_WRITE, spill),
            Err(LocalError::Protection {
                index: 0,
                error: AccessError::Permission
            })
        ));
    }

    #[test]
    fn a_slice_of_more_pieces_than_a_list_holds_is_refused_not_indexed_past() {
        let map = Arc::new(pmem::Mapping::anonymous(4096).unwrap());
        let mut mem = MemoryTable::new();
        let k = mem.register_iova(map, 0, 4096, 0, Access::ALL).unwrap();
        let pieces: Vec<Sge> = (0..MAX_SGE as u64 + 1)
            .map(|i| Sge::new(k.lkey, i * 8, 8))
            .collect();
        let spill = &mut Spill::new(1);
        assert_eq!(
            Gather::resolve(&mem, &pieces, Access::NONE, spill),
            Err(LocalError::TooMany(TooManySges))
        );
        let g = Gather::resolve(&mem, &pieces[..MAX_SGE], Access::NONE, spill).unwrap();
        assert_eq!(g.len(), 8 * MAX_SGE as u32);
    }
}
