//! Header/data placement (seed 003): where a small header and its data go in the target's
//! buffer list so that one RDMA WRITE (or the fewest, when the buffers are not contiguous in the
//! target's address space) carries both, the data lands on page boundaries, the header on its
//! own alignment, the fewest buffers are used and the wire carries the least waste. Pure: no
//! I/O, no allocation in the planner. `docs/placement.md` has the cases with diagrams.
//!
//! # The model (what "legal" and "waste" mean; the planner and the exhaustive reference
//! search both use [`Layout::cost`] and [`Layout::check`])
//!
//! * The target offers buffers in order; a plan uses a **prefix** of the list: buffers
//!   `0..used`, the last of them holding data or the header.
//! * **Data** (`data_len` bytes) is cut into pieces, at most one per buffer, in buffer order
//!   (a buffer may be skipped). Every piece starts at a page-aligned *address*; every piece but
//!   the last is a whole number of pages. So every data page lands whole on a page boundary,
//!   and the target never copies it.
//! * The **header** (`header_len` bytes, 0 for none) is one piece in one used buffer, at an
//!   address aligned to `header_align`, not overlapping the data.
//! * The **writes**: the used buffers fall into maximal runs that are contiguous in the target's
//!   address space (`addr + len` of one is the `addr` of the next). Each run that holds
//!   anything is one RDMA WRITE, from its first written byte to its last. **Waste** is every
//!   byte those WRITEs carry that is neither header nor data (gaps for alignment, slack at buffer
//!   ends inside a run, skipped buffers inside a run).
//! * A plan is better when it uses fewer buffers, then when it wastes less
//!   ([`Cost`] orders them so).
//! * The **immediate** of the (last) WRITE is the header's offset in the buffer list: the
//!   lengths of the buffers before the header's buffer, plus its offset in that buffer.

mod gather;
mod plan;
#[cfg(test)]
pub(crate) mod reference;
#[cfg(test)]
mod tests;

pub use gather::{GatherError, LocateError, MAX_WRITES, Sources, Writes, gather, locate, position};
pub use plan::{PlanError, Planner, plan};

/// Pieces a layout holds at most: one data piece per buffer, one header.
pub const MAX_BUFFERS: usize = 16;

/// One buffer the target offers: its address in the target's registered space and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Buffer {
    pub addr: u64,
    pub len: u32,
}

/// What to place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Request {
    pub header_len: u32,
    /// A power of two (1: any byte).
    pub header_align: u32,
    pub data_len: u32,
    /// A power of two.
    pub page: u32,
}

/// A piece of the message in one buffer: `len` bytes at `offset` in buffer `buf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Piece {
    pub buf: u8,
    pub offset: u32,
    pub len: u32,
}

/// Where everything goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Buffers consumed: `0..used`.
    pub used: u8,
    /// Data pieces in buffer order (`data[..ndata]`).
    pub data: [Piece; MAX_BUFFERS],
    pub ndata: u8,
    /// The header (`None` when `header_len` is 0).
    pub header: Option<Piece>,
}

/// How good a layout is: fewer buffers first, then less waste.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cost {
    pub buffers: u8,
    pub waste: u64,
}

/// Why a layout is not legal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Illegal {
    #[error("a piece lies outside its buffer or past the used prefix")]
    OutOfBuffer,
    #[error("data piece {0} does not start on a page boundary")]
    DataUnaligned(usize),
    #[error("data piece {0} is not the last and not a whole number of pages")]
    DataPartialPage(usize),
    #[error("data pieces are not in increasing buffer order")]
    DataOrder,
    #[error("data pieces do not add up to the data length")]
    DataLength,
    #[error("the header is not on its alignment")]
    HeaderUnaligned,
    #[error("the header overlaps data")]
    Overlap,
    #[error("the header is missing or has the wrong length")]
    HeaderLength,
    #[error("the last used buffer holds nothing")]
    EmptyLast,
}

/// One RDMA WRITE of a plan: `len` bytes at target address `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WriteRange {
    pub addr: u64,
    pub len: u64,
}

impl Layout {
    pub const EMPTY: Layout = Layout {
        used: 0,
        data: [Piece {
            buf: 0,
            offset: 0,
            len: 0,
        }; MAX_BUFFERS],
        ndata: 0,
        header: None,
    };

    pub fn data(&self) -> &[Piece] {
        &self.data[..self.ndata as usize]
    }

    /// Checks every rule of the model.
    pub fn check(&self, req: &Request, bufs: &[Buffer]) -> Result<(), Illegal> {
        let used = self.used as usize;
        if used == 0 || used > bufs.len() {
            return Err(Illegal::OutOfBuffer);
        }
        let inside = |p: &Piece| {
            (p.buf as usize) < used
                && u64::from(p.offset) + u64::from(p.len) <= u64::from(bufs[p.buf as usize].len)
        };
        let mut total = 0u64;
        let mut last_buf: Option<u8> = None;
        let n = self.ndata as usize;
        for (i, p) in self.data().iter().enumerate() {
            if !inside(p) || p.len == 0 {
                return Err(Illegal::OutOfBuffer);
            }
            if last_buf.is_some_and(|b| p.buf <= b) {
                return Err(Illegal::DataOrder);
            }
            last_buf = Some(p.buf);
            let addr = bufs[p.buf as usize].addr + u64::from(p.offset);
            if !addr.is_multiple_of(u64::from(req.page)) {
                return Err(Illegal::DataUnaligned(i));
            }
            if i + 1 < n && !p.len.is_multiple_of(req.page) {
                return Err(Illegal::DataPartialPage(i));
            }
            total += u64::from(p.len);
        }
        if total != u64::from(req.data_len) {
            return Err(Illegal::DataLength);
        }
        match (self.header, req.header_len) {
            (None, 0) => {}
            (Some(h), len) if h.len == len && len > 0 => {
                if !inside(&h) {
                    return Err(Illegal::OutOfBuffer);
                }
                let addr = bufs[h.buf as usize].addr + u64::from(h.offset);
                if !addr.is_multiple_of(u64::from(req.header_align)) {
                    return Err(Illegal::HeaderUnaligned);
                }
                let overlaps = self.data().iter().any(|d| {
                    d.buf == h.buf && d.offset < h.offset + h.len && h.offset < d.offset + d.len
                });
                if overlaps {
                    return Err(Illegal::Overlap);
                }
            }
            _ => return Err(Illegal::HeaderLength),
        }
        let last = (used - 1) as u8;
        let holds =
            self.data().iter().any(|d| d.buf == last) || self.header.is_some_and(|h| h.buf == last);
        if !holds {
            return Err(Illegal::EmptyLast);
        }
        Ok(())
    }

    /// The WRITEs this layout needs (one per address-contiguous run of used buffers that holds
    /// anything, from its first written byte to its last), written into `out`; returns how
    /// many, and the waste they carry.
    pub fn writes(
        &self,
        req: &Request,
        bufs: &[Buffer],
        out: &mut [WriteRange; MAX_BUFFERS],
    ) -> (usize, u64) {
        let used = self.used as usize;
        let mut n = 0;
        let mut carried = 0u64;
        // The written span of the current run, as target addresses.
        let mut span: Option<(u64, u64)> = None;
        let mut flush = |span: &mut Option<(u64, u64)>, n: &mut usize, carried: &mut u64| {
            if let Some((lo, hi)) = span.take() {
                out[*n] = WriteRange {
                    addr: lo,
                    len: hi - lo,
                };
                *n += 1;
                *carried += hi - lo;
            }
        };
        for i in 0..used {
            if i > 0 && bufs[i - 1].addr + u64::from(bufs[i - 1].len) != bufs[i].addr {
                flush(&mut span, &mut n, &mut carried);
            }
            let base = bufs[i].addr;
            let pieces = self
                .data()
                .iter()
                .filter(|p| p.buf as usize == i)
                .chain(self.header.iter().filter(|h| h.buf as usize == i));
            for p in pieces {
                let (lo, hi) = (
                    base + u64::from(p.offset),
                    base + u64::from(p.offset) + u64::from(p.len),
                );
                span = Some(match span {
                    None => (lo, hi),
                    Some((a, b)) => (a.min(lo), b.max(hi)),
                });
            }
        }
        flush(&mut span, &mut n, &mut carried);
        let payload = u64::from(req.header_len) + u64::from(req.data_len);
        (n, carried - payload)
    }

    /// Buffers used and waste.
    pub fn cost(&self, req: &Request, bufs: &[Buffer]) -> Cost {
        let mut out = [WriteRange::default(); MAX_BUFFERS];
        let (_, waste) = self.writes(req, bufs, &mut out);
        Cost {
            buffers: self.used,
            waste,
        }
    }

    /// The immediate: the header's offset in the buffer list (0 without a header).
    pub fn immediate(&self, bufs: &[Buffer]) -> u32 {
        match self.header {
            None => 0,
            Some(h) => {
                let before: u64 = bufs[..h.buf as usize]
                    .iter()
                    .map(|b| u64::from(b.len))
                    .sum();
                (before + u64::from(h.offset)) as u32
            }
        }
    }
}
