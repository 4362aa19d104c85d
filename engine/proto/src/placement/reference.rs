//! The exhaustive reference for the planner: it generates every legal layout of a (small)
//! request and keeps the cheapest. No cleverness: every prefix length, every ordered choice of
//! the buffers that hold data, every page-aligned start and every legal length of each piece,
//! every aligned header position that does not overlap the data. Each generated layout must
//! pass [`Layout::check`] (the generator only makes legal layouts; a failing one panics), and is
//! priced by [`Layout::cost`].
//!
//! The one shortcut: prefix lengths are tried from the shortest, and the search stops after the
//! first length that has any legal layout. That is exact because [`Cost`] orders by `buffers`
//! (= `used`) first, so a layout over a longer prefix never beats one over a shorter prefix.
//! [`search`] with `all_prefixes` set skips even that shortcut.
//!
//! It is exponential and byte-granular in the header position: use it on a few buffers of a
//! few small pages (e.g. 64 bytes).

use super::{Buffer, Cost, Layout, MAX_BUFFERS, Piece, Request};

/// What a search found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Found {
    /// The least cost and one layout that has it.
    pub best: Option<(Cost, Layout)>,
    /// Legal layouts generated (all of them checked and priced).
    pub legal: u64,
}

/// The least cost of any legal layout, and one layout that has it; `None` when no legal layout
/// exists or the input is invalid (page or alignment not a power of two, more than
/// [`MAX_BUFFERS`] buffers: what the planner rejects).
pub(crate) fn best(req: &Request, bufs: &[Buffer]) -> Option<(Cost, Layout)> {
    search(req, bufs, false).best
}

/// [`best`], and how many legal layouts were looked at; with `all_prefixes`, every prefix length
/// is searched (not only up to the first that has a legal layout).
pub(crate) fn search(req: &Request, bufs: &[Buffer], all_prefixes: bool) -> Found {
    let mut found = Found {
        best: None,
        legal: 0,
    };
    if !valid(req, bufs) {
        return found;
    }
    for used in 1..=bufs.len() {
        for_each_legal(req, bufs, used, &mut |layout| {
            if let Err(e) = layout.check(req, bufs) {
                panic!(
                    "reference generated an illegal layout ({e}):\n  {req:?}\n  {bufs:?}\n  {layout:?}"
                );
            }
            found.legal += 1;
            let cost = layout.cost(req, bufs);
            assert_eq!(cost.buffers as usize, used);
            if found.best.is_none_or(|(c, _)| cost < c) {
                found.best = Some((cost, *layout));
            }
        });
        if found.best.is_some() && !all_prefixes {
            break;
        }
    }
    found
}

/// The inputs the model accepts.
pub(crate) fn valid(req: &Request, bufs: &[Buffer]) -> bool {
    req.page.is_power_of_two() && req.header_align.is_power_of_two() && bufs.len() <= MAX_BUFFERS
}

/// Calls `f` with every legal layout that uses exactly `bufs[..used]` (each exactly once).
pub(crate) fn for_each_legal(
    req: &Request,
    bufs: &[Buffer],
    used: usize,
    f: &mut dyn FnMut(&Layout),
) {
    assert!(valid(req, bufs) && used >= 1 && used <= bufs.len());
    let mut pieces = Vec::with_capacity(used);
    each_data(req, bufs, used, 0, req.data_len, &mut pieces, &mut |data| {
        each_header(req, bufs, used, data, f);
    });
}

/// The offsets in `buf` whose address is a multiple of `align`, from `first` up.
fn aligned_offsets(buf: &Buffer, align: u32) -> impl Iterator<Item = u32> {
    let align = u64::from(align);
    let first = (align - buf.addr % align) % align;
    (first..u64::from(buf.len))
        .step_by(align as usize)
        .map(|o| o as u32)
}

/// Every way to cut `remaining` data bytes into pieces in buffers `from..used` (in increasing
/// buffer order, one piece a buffer at most, each on a page-aligned address, all but the last a
/// positive whole number of pages, the last any positive length); `pieces` holds those already
/// placed in earlier buffers.
fn each_data(
    req: &Request,
    bufs: &[Buffer],
    used: usize,
    from: usize,
    remaining: u32,
    pieces: &mut Vec<Piece>,
    f: &mut dyn FnMut(&[Piece]),
) {
    if remaining == 0 {
        // Only reached with no data at all: a cut below never leaves 0 bytes for later.
        f(pieces);
        return;
    }
    for b in from..used {
        let buf = bufs[b];
        for offset in aligned_offsets(&buf, req.page) {
            let room = buf.len - offset;
            // This piece is the last: it takes everything left.
            if remaining <= room {
                pieces.push(Piece {
                    buf: b as u8,
                    offset,
                    len: remaining,
                });
                f(pieces);
                pieces.pop();
            }
            // This piece is not the last: whole pages, leaving something for a later piece.
            let mut len = req.page;
            while len < remaining && len <= room {
                pieces.push(Piece {
                    buf: b as u8,
                    offset,
                    len,
                });
                each_data(req, bufs, used, b + 1, remaining - len, pieces, f);
                pieces.pop();
                len += req.page;
            }
        }
    }
}

/// Every header position for the data pieces `data` (in `bufs[..used]`), keeping the layouts
/// whose last used buffer holds something.
fn each_header(
    req: &Request,
    bufs: &[Buffer],
    used: usize,
    data: &[Piece],
    f: &mut dyn FnMut(&Layout),
) {
    let mut layout = Layout::EMPTY;
    layout.used = used as u8;
    layout.ndata = data.len() as u8;
    layout.data[..data.len()].copy_from_slice(data);
    let last = (used - 1) as u8;
    let data_in_last = data.iter().any(|d| d.buf == last);
    if req.header_len == 0 {
        if data_in_last {
            f(&layout);
        }
        return;
    }
    let hl = req.header_len;
    for (b, buf) in bufs[..used].iter().enumerate() {
        let b = b as u8;
        if !data_in_last && b != last {
            continue;
        }
        for offset in aligned_offsets(buf, req.header_align) {
            if u64::from(offset) + u64::from(hl) > u64::from(buf.len) {
                break;
            }
            let overlaps = data
                .iter()
                .any(|d| d.buf == b && d.offset < offset + hl && offset < d.offset + d.len);
            if overlaps {
                continue;
            }
            layout.header = Some(Piece {
                buf: b,
                offset,
                len: hl,
            });
            f(&layout);
        }
    }
}
