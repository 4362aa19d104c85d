//! The planner: the best legal layout (fewest buffers, then least waste), exactly, by dynamic
//! programming over the buffer list.
//!
//! # Why a dynamic program
//!
//! The waste of a WRITE is every unwritten byte between its first and last written byte. A
//! buffer inside a WRITE's span costs all its unwritten bytes; the first buffer of the span
//! costs only what lies after its first written byte, the last only what lies before its last
//! written byte. How many data pages each buffer takes matters only through capacity, so the
//! problem is a small knapsack: giving up pages at a span's edge saves exactly as many bytes,
//! skipping a whole buffer saves its length, and which of those the data can afford depends on
//! every other buffer. Greedy rules (the seed's, and the candidate enumeration this module had
//! before) miss cases; a dynamic program over "pages placed so far" does not.
//!
//! # The program
//!
//! Buffers are visited in order. A state after buffer `j` is how many whole data pages are
//! placed (`p`, or "done" once the last piece is), and whether the header is placed. Each state
//! keeps three numbers:
//!
//! * `c`: the least waste when the current contiguous run has no written byte yet;
//! * `e`: the least waste when the run has written bytes and writes nothing more;
//! * `k`: the least waste plus the unwritten bytes after the run's last written byte, for
//!   when the run goes on to write again (those bytes are then inside the WRITE).
//!
//! The future of a state depends only on these: a later write in the same run pays `k` plus
//! the new buffer's lead, a run that ends (an address gap, or nothing more written) keeps `e`.
//! What one buffer holds (data only, header only, header then data, data then header) is
//! priced by four numbers, one per case of whether the WRITE reaches the buffer from an earlier
//! one and whether it goes on past it ([`Local`]), each with its own best position of the
//! pieces. Because the position of a piece inside a buffer depends only on the buffer, the
//! piece's length and the case, the program is exact.
//!
//! The fewest buffers come first: a linear pre-pass ([`fewest_buffers`]) finds the shortest
//! prefix that can hold everything (capacity alone decides that), and the program then runs
//! only over that prefix, keeping only the page counts from which the rest can still fit. The
//! window is as wide as the prefix's spare capacity in pages, so typical plans keep a handful
//! of states per buffer. The layout is rebuilt by walking back through the kept states.
//!
//! # Cost
//!
//! With the header's alignment at most a page (the usual case), a whole-page piece of a kind
//! has the same prices for every length but one that falls by a page per page ([`Rows`]), and
//! so has the last piece for every source state ([`last_rows`]): a buffer costs, per kind,
//! (window width) x (pages per buffer, bounded by the width) additions, no pricing call. Masks,
//! not divisions, align (a 64-bit division per alignment tripled the cost). Measured with
//! `cargo bench --bench placement` (docs/placement.md): about 0.25 us for plans of one
//! buffer, 2 us for four buffers with 5 pages of slack, 10 us for the case built to keep the
//! most states; the 200 ns is not met beyond the smallest plans. Above a page of
//! header alignment each write is priced on its own (the general path of [`Planner::step`]).
//!
//! [`Planner`] keeps its scratch between plans: after the first plans of a size, planning does
//! not allocate. `tests.rs` holds the planner to an exhaustive search on small inputs.

use super::{Buffer, Layout, MAX_BUFFERS, Piece, Request};

/// Why there is no plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("page size and header alignment must be powers of two (page {page}, align {align})")]
    BadAlignment { page: u32, align: u32 },
    #[error("at most {MAX_BUFFERS} buffers, {0} offered")]
    TooManyBuffers(usize),
    #[error("header and data do not fit in the buffers offered")]
    NoFit,
}

/// The best layout for `req` in `bufs` (a fresh [`Planner`]; keep one to plan without
/// allocating).
pub fn plan(req: &Request, bufs: &[Buffer]) -> Result<Layout, PlanError> {
    Planner::default().plan(req, bufs)
}

const INF: u64 = u64::MAX / 4;

/// The smallest offset `o >= from` with `addr + o` a multiple of `align` (a power of two: a
/// mask, not a division, which would cost more than the rest of a plan).
#[inline]
fn up(addr: u64, from: u64, align: u64) -> u64 {
    ((addr + from + align - 1) & !(align - 1)) - addr
}

/// The largest offset `o <= to` with `addr + o` a multiple of `align` (a power of two), if
/// there is one.
#[inline]
fn down(addr: u64, to: u64, align: u64) -> Option<u64> {
    ((addr + to) & !(align - 1)).checked_sub(addr)
}

/// What one buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Data,
    Header,
    /// The header, then the data from a later page boundary.
    HeaderData,
    /// The data, then the header on its alignment after it.
    DataHeader,
}

/// The four cases of a written buffer, by how the WRITE covers it.
const ALONE: usize = 0; // starts and ends here: the gap between the pieces
const ARRIVES: usize = 1; // from an earlier buffer, ends here: + the bytes before the first piece
const LEAVES: usize = 2; // starts here, goes on: + the bytes after the last piece
const THROUGH: usize = 3; // from an earlier buffer, goes on: every unwritten byte

/// A buffer's contents priced in the four cases, and where the pieces go in each
/// (data offset, header offset; `u64::MAX` for none).
#[derive(Debug, Clone, Copy)]
struct Local {
    m: [u64; 4],
    at: [(u64, u64); 4],
}

const NONE: u64 = u64::MAX;

/// The request in bytes.
#[derive(Debug, Clone, Copy)]
struct Geo {
    page: u64,
    /// log2 of `page`.
    shift: u32,
    hl: u64,
    ha: u64,
    data: u64,
}

impl Geo {
    /// `ty` with `len` data bytes in `b`, if it fits.
    fn local(&self, b: &Buffer, ty: Ty, len: u64) -> Option<Local> {
        let (a, bl, page, hl, ha) = (b.addr, u64::from(b.len), self.page, self.hl, self.ha);
        // The gap residues repeat every `ha / page` page boundaries.
        let period = (ha >> self.shift).max(1);
        match ty {
            Ty::Data | Ty::Header => {
                let (align, len) = if ty == Ty::Data {
                    (page, len)
                } else {
                    (ha, hl)
                };
                let lo = up(a, 0, align);
                if lo + len > bl {
                    return None;
                }
                let hi = down(a, bl - len, align)?;
                let at = |o| if ty == Ty::Data { (o, NONE) } else { (NONE, o) };
                Some(Local {
                    m: [0, lo, bl - len - hi, bl - len],
                    at: [at(lo), at(lo), at(hi), at(lo)],
                })
            }
            Ty::HeaderData => {
                let lo = up(a, up(a, 0, ha) + hl, page);
                if lo + len > bl {
                    return None;
                }
                let hi = down(a, bl - len, page)?;
                // `o >= first aligned + hl`, so an aligned header start fits before `o`.
                let h = |o: u64| down(a, o - hl, ha).unwrap_or(0);
                let (mut gap, mut at_gap, mut o) = (u64::MAX, lo, lo);
                for _ in 0..period {
                    if o > hi {
                        break;
                    }
                    if o - hl - h(o) < gap {
                        (gap, at_gap) = (o - hl - h(o), o);
                    }
                    o += page;
                }
                Some(Local {
                    m: [gap, lo - hl, bl - len - hl - h(hi), bl - len - hl],
                    at: [(at_gap, h(at_gap)), (lo, h(lo)), (hi, h(hi)), (lo, h(lo))],
                })
            }
            Ty::DataHeader => {
                let lo = up(a, 0, page);
                let h = |o: u64| up(a, o + len, ha);
                if h(lo) + hl > bl {
                    return None;
                }
                // The header fits after a piece from `lo`, so `lo + len + hl <= bl`.
                let mut hi = down(a, bl - hl - len, page)?;
                while h(hi) + hl > bl {
                    hi -= page;
                }
                let (mut gap, mut at_gap, mut o) = (u64::MAX, lo, lo);
                for _ in 0..period {
                    if o > hi {
                        break;
                    }
                    if h(o) - o - len < gap {
                        (gap, at_gap) = (h(o) - o - len, o);
                    }
                    o += page;
                }
                Some(Local {
                    m: [gap, h(lo) - len, bl - hi - len - hl, bl - len - hl],
                    at: [(at_gap, h(at_gap)), (lo, h(lo)), (hi, h(hi)), (lo, h(lo))],
                })
            }
        }
    }

    /// The longest data piece `ty` fits in `b` (with the header for the header kinds).
    fn max_len(&self, b: &Buffer, ty: Ty) -> Option<u64> {
        let (a, bl) = (b.addr, u64::from(b.len));
        let longest = match ty {
            Ty::Data => bl.checked_sub(up(a, 0, self.page))?,
            Ty::HeaderData => bl.checked_sub(up(a, up(a, 0, self.ha) + self.hl, self.page))?,
            Ty::DataHeader => {
                let last = down(a, bl.checked_sub(self.hl)?, self.ha)?;
                last.checked_sub(up(a, 0, self.page))?
            }
            Ty::Header => return None,
        };
        (longest > 0).then_some(longest)
    }

    fn header_fits(&self, b: &Buffer) -> bool {
        up(b.addr, 0, self.ha) + self.hl <= u64::from(b.len)
    }
}

/// The shortest prefix that can hold everything, by capacity: the most whole pages each
/// state can have placed (every smaller count is reachable too, by placing fewer), and
/// whether the data or the header can be finished in each buffer.
fn fewest_buffers(g: &Geo, bufs: &[Buffer]) -> Option<usize> {
    let with_header = g.hl > 0;
    // pages[h]: most whole pages placed with the header placed (h = 1) or not; done[h]: the
    // data is placed.
    let mut pages: [Option<u64>; 2] = [None; 2];
    let mut done = [false; 2];
    let h0 = if with_header { 0 } else { 1 };
    if g.data == 0 {
        done[h0] = true;
    } else {
        pages[h0] = Some(0);
    }
    let pmax = g.data.saturating_sub(1) >> g.shift;
    for (j, b) in bufs.iter().enumerate() {
        let (mut np, mut nd) = (pages, done);
        let mut complete = false;
        let room = |ty| g.max_len(b, ty).unwrap_or(0);
        let data_room = room(Ty::Data);
        let header_room = room(Ty::HeaderData).max(room(Ty::DataHeader));
        for h in 0..2 {
            let Some(p) = pages[h] else { continue };
            let left = g.data - p * g.page;
            let more = |room: u64| Some(p + (room >> g.shift).min(pmax - p));
            np[h] = np[h].max(more(data_room));
            if left <= data_room {
                nd[h] = true;
                complete |= h == 1;
            }
            if h == 0 && with_header {
                if header_room > 0 {
                    np[1] = np[1].max(more(header_room));
                }
                if g.header_fits(b) {
                    np[1] = np[1].max(Some(p));
                }
                if left <= header_room {
                    nd[1] = true;
                    complete = true;
                }
            }
        }
        if done[0] && with_header && g.header_fits(b) {
            nd[1] = true;
            complete = true;
        }
        if complete {
            return Some(j + 1);
        }
        (pages, done) = (np, nd);
    }
    None
}

/// One program state: whole pages placed (`None`: the data is done) and the header placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    p: Option<u64>,
    h: usize,
}

/// The three numbers a state keeps (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cell {
    c: u64,
    e: u64,
    k: u64,
}

const EMPTY: Cell = Cell {
    c: INF,
    e: INF,
    k: INF,
};

/// Which of a cell's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tag {
    C,
    E,
    K,
}

impl Cell {
    fn get(&self, t: Tag) -> u64 {
        match t {
            Tag::C => self.c,
            Tag::E => self.e,
            Tag::K => self.k,
        }
    }
}

/// The states kept after one buffer: page counts `lo..lo + width`, and "done", for each header
/// flag; `base` is where they start in the scratch.
#[derive(Debug, Clone, Copy, Default)]
struct Layer {
    lo: u64,
    width: u64,
    base: usize,
}

impl Layer {
    fn len(&self) -> usize {
        2 * (self.width as usize + 1)
    }

    fn index(&self, s: State) -> Option<usize> {
        let slot = match s.p {
            None => self.width,
            Some(p) if p >= self.lo && p < self.lo + self.width => p - self.lo,
            Some(_) => return None,
        };
        Some(self.base + s.h * (self.width as usize + 1) + slot as usize)
    }

    /// Every state of the layer.
    fn states(&self) -> impl Iterator<Item = State> + '_ {
        (0..2).flat_map(move |h| {
            (self.lo..self.lo + self.width)
                .map(Some)
                .chain(std::iter::once(None))
                .map(move |p| State { p, h })
        })
    }
}

/// A write in one buffer, as the program priced it (the four cases of [`Local`]).
#[derive(Debug, Clone, Copy)]
struct Write {
    to: State,
    ty: Ty,
    len: u64,
    m: [u64; 4],
}

/// What one buffer offers, priced once per plan. With the header's alignment at most a page,
/// every page boundary is on the header's alignment, and a whole-page piece of `k` pages has
/// the same prices for every `k` but the `THROUGH` case, which falls by a page per page (see
/// [`Geo::local`]): so the pieces of a kind are one row, `k` up to `most` pages. Otherwise
/// (`rows` is false) each piece is priced on its own.
#[derive(Debug, Clone, Copy)]
struct Rows {
    rows: bool,
    /// Data, header then data, data then header: most whole pages, and the prices with
    /// `THROUGH` for 0 pages.
    pages: [Option<(u64, [u64; 4])>; 3],
    header: Option<[u64; 4]>,
}

impl Rows {
    /// The rows of `b`; the last buffer of a plan takes no whole-page pieces (only the last
    /// piece or the header), so it needs none.
    fn of(g: &Geo, b: &Buffer, last: bool) -> Rows {
        let header = (g.hl > 0)
            .then(|| g.local(b, Ty::Header, 0))
            .flatten()
            .map(|l| l.m);
        if g.ha > g.page || last {
            return Rows {
                rows: false,
                pages: [None; 3],
                header,
            };
        }
        let row = |ty| {
            let most = g.max_len(b, ty)? >> g.shift;
            let one = g.local(b, ty, g.page)?;
            let mut m = one.m;
            m[THROUGH] += g.page;
            (most > 0).then_some((most, m))
        };
        Rows {
            rows: true,
            pages: [row(Ty::Data), row(Ty::HeaderData), row(Ty::DataHeader)],
            header,
        }
    }
}

const KINDS: [Ty; 3] = [Ty::Data, Ty::HeaderData, Ty::DataHeader];

/// The last piece of each kind in one buffer, priced once (header alignment at most a page).
/// From `p` placed pages the rest is `data - p * page`: it changes by whole pages, so every
/// price but `THROUGH` is the same for every `p`, and `THROUGH` falls by a page per page less
/// placed. Per kind: the fewest placed pages the rest fits from, and the prices at `pmax`.
fn last_rows(g: &Geo, b: &Buffer, pmax: u64) -> [Option<(u64, [u64; 4])>; 3] {
    KINDS.map(|ty| {
        let most = g.max_len(b, ty)?;
        let least_rest = g.data - (pmax << g.shift);
        if least_rest > most {
            return None;
        }
        let m = g.local(b, ty, least_rest)?.m;
        let pmin = (g.data.saturating_sub(most) + g.page - 1) >> g.shift;
        Some((pmin, m))
    })
}

/// Plans without allocating once its scratch has grown to the sizes it sees.
#[derive(Debug, Default)]
pub struct Planner {
    cells: Vec<Cell>,
}

impl Planner {
    pub fn new() -> Planner {
        Planner::default()
    }

    /// The best layout for `req` in `bufs`.
    pub fn plan(&mut self, req: &Request, bufs: &[Buffer]) -> Result<Layout, PlanError> {
        if !req.page.is_power_of_two() || !req.header_align.is_power_of_two() {
            return Err(PlanError::BadAlignment {
                page: req.page,
                align: req.header_align,
            });
        }
        if bufs.len() > MAX_BUFFERS {
            return Err(PlanError::TooManyBuffers(bufs.len()));
        }
        let g = Geo {
            page: u64::from(req.page),
            shift: req.page.trailing_zeros(),
            hl: u64::from(req.header_len),
            ha: u64::from(req.header_align),
            data: u64::from(req.data_len),
        };
        let used = fewest_buffers(&g, bufs).ok_or(PlanError::NoFit)?;
        let bufs = &bufs[..used];
        let pmax = g.data.saturating_sub(1) >> g.shift;

        // The windows: layer 0 is before any buffer, layer j + 1 after buffer j.
        let mut layers = [Layer::default(); MAX_BUFFERS + 1];
        if g.data > 0 {
            layers[0].width = 1;
        }
        let mut room = [0u64; MAX_BUFFERS];
        for (r, b) in room.iter_mut().zip(bufs) {
            *r = g.max_len(b, Ty::Data).unwrap_or(0);
        }
        let mut behind = 0u64; // most whole pages buffers 0..=j can hold
        let mut ahead: u64 = room[..used].iter().sum(); // most bytes buffers j+1.. can hold
        let mut total = layers[0].len();
        for j in 0..used {
            behind += room[j] >> g.shift;
            ahead -= room[j];
            let l = &mut layers[j + 1];
            if g.data > 0 && j + 1 < used {
                let lo = (g.data.saturating_sub(ahead) + g.page - 1) >> g.shift;
                let hi = behind.min(pmax);
                if lo <= hi {
                    (l.lo, l.width) = (lo, hi - lo + 1);
                }
            }
            l.base = total;
            total += l.len();
        }
        self.cells.clear();
        self.cells.resize(total, EMPTY);
        let start = State {
            p: (g.data > 0).then_some(0),
            h: if g.hl == 0 { 1 } else { 0 },
        };
        let i0 = layers[0].index(start).expect("the start state is kept");
        self.cells[i0].c = 0;

        for j in 0..used {
            self.step(&g, bufs, &layers, j, pmax);
        }
        let goal = State { p: None, h: 1 };
        let gi = layers[used].index(goal).expect("done is always kept");
        let waste = self.cells[gi].e;
        if waste >= INF {
            // The pre-pass and the program disagree about feasibility: a bug, not bad input.
            debug_assert!(false, "no plan over the prefix the pre-pass chose");
            return Err(PlanError::NoFit);
        }
        Ok(self.rebuild(&g, bufs, &layers, pmax, goal, waste))
    }

    /// A source cell as buffer `j` sees it: an address gap before `j` ends the run.
    fn entering(cell: Cell, gap: bool) -> Cell {
        if gap {
            Cell {
                c: cell.c.min(cell.e),
                e: INF,
                k: INF,
            }
        } else {
            cell
        }
    }

    /// Whether buffer `j` starts a new run (an address gap before it).
    fn gap_before(bufs: &[Buffer], j: usize) -> bool {
        j > 0 && bufs[j - 1].addr + u64::from(bufs[j - 1].len) != bufs[j].addr
    }

    /// Every write buffer `j` can hold from state `from`, into a kept state of `to`.
    #[allow(clippy::too_many_arguments)]
    fn writes(
        g: &Geo,
        b: &Buffer,
        rows: &Rows,
        from: State,
        to: &Layer,
        last: bool,
        pmax: u64,
        f: &mut impl FnMut(Write),
    ) {
        let kinds = if from.h == 0 { 3 } else { 1 };
        let kept = |s: State| to.index(s).is_some() && (!last || s == State { p: None, h: 1 });
        if let Some(p) = from.p {
            for (i, &ty) in KINDS[..kinds].iter().enumerate() {
                let h = if ty == Ty::Data { from.h } else { 1 };
                // The last piece: the rest of the data.
                let rest = g.data - p * g.page;
                let done = State { p: None, h };
                if kept(done)
                    && let Some(local) = g.local(b, ty, rest)
                {
                    f(Write {
                        to: done,
                        ty,
                        len: rest,
                        m: local.m,
                    });
                }
                // Whole pages, more data after them.
                if last {
                    continue;
                }
                let k0 = to.lo.saturating_sub(p).max(1);
                let k1 = (to.lo + to.width).saturating_sub(p).min(pmax - p + 1);
                if rows.rows {
                    let Some((most, m)) = rows.pages[i] else {
                        continue;
                    };
                    for k in k0..k1.min(most + 1) {
                        let len = k << g.shift;
                        let mut m = m;
                        m[THROUGH] -= len;
                        f(Write {
                            to: State { p: Some(p + k), h },
                            ty,
                            len,
                            m,
                        });
                    }
                    continue;
                }
                for k in k0..k1 {
                    let len = k << g.shift;
                    let Some(local) = g.local(b, ty, len) else {
                        break; // longer pieces do not fit either
                    };
                    f(Write {
                        to: State { p: Some(p + k), h },
                        ty,
                        len,
                        m: local.m,
                    });
                }
            }
        }
        if from.h == 0 {
            let to_state = State { p: from.p, h: 1 };
            if kept(to_state)
                && let Some(m) = rows.header
            {
                f(Write {
                    to: to_state,
                    ty: Ty::Header,
                    len: 0,
                    m,
                });
            }
        }
    }

    /// Buffer `j`: layer `j` to layer `j + 1`.
    fn step(&mut self, g: &Geo, bufs: &[Buffer], layers: &[Layer], j: usize, pmax: u64) {
        if g.ha <= g.page {
            return self.step_rows(g, bufs, layers, j, pmax);
        }
        let (from, to) = (&layers[j], &layers[j + 1]);
        let b = &bufs[j];
        let bl = u64::from(b.len);
        let gap = Self::gap_before(bufs, j);
        let last = j + 1 == bufs.len();
        let rows = Rows::of(g, b, last);
        let cells = &mut self.cells;
        for s in from.states() {
            let i = from.index(s).expect("a layer's own state");
            let cell = Self::entering(cells[i], gap);
            if cell.c >= INF && cell.e >= INF && cell.k >= INF {
                continue;
            }
            let writable = cell.c < INF || cell.k < INF;
            // Nothing written in this buffer.
            if !last && let Some(t) = to.index(s) {
                let t = &mut cells[t];
                t.c = t.c.min(cell.c);
                t.e = t.e.min(cell.e);
                t.k = t.k.min(cell.k.saturating_add(bl));
            }
            if !writable {
                continue;
            }
            Self::writes(g, b, &rows, s, to, last, pmax, &mut |w| {
                let t = &mut cells[to.index(w.to).expect("writes go to kept states")];
                let m = &w.m;
                t.e = t.e.min((cell.c + m[ALONE]).min(cell.k + m[ARRIVES]));
                t.k = t.k.min((cell.c + m[LEAVES]).min(cell.k + m[THROUGH]));
            });
        }
    }

    /// Buffer `j` when the header's alignment is at most a page: every kind of write is a row
    /// (see [`Rows`] and [`last_rows`]), so each target state takes the minimum over the
    /// source states that reach it, without pricing each write on its own. The same numbers
    /// as [`Planner::step`]'s general path (debug builds check every price against
    /// [`Geo::local`]).
    fn step_rows(&mut self, g: &Geo, bufs: &[Buffer], layers: &[Layer], j: usize, pmax: u64) {
        let (from, to) = (layers[j], layers[j + 1]);
        let b = &bufs[j];
        let bl = u64::from(b.len);
        let gap = Self::gap_before(bufs, j);
        let last = j + 1 == bufs.len();
        let rows = Rows::of(g, b, last);
        let lasts = if g.data > 0 {
            last_rows(g, b, pmax)
        } else {
            [None; 3]
        };
        let goal = State { p: None, h: 1 };
        let cells = &mut self.cells;
        let read = |cells: &[Cell], s: State| {
            from.index(s)
                .map_or(EMPTY, |i| Self::entering(cells[i], gap))
        };
        let relax = |cells: &mut [Cell], s: State, e: u64, k: u64| {
            if let Some(t) = to.index(s) {
                let t = &mut cells[t];
                t.e = t.e.min(e);
                t.k = t.k.min(k);
            }
        };
        // Nothing written in this buffer.
        if !last {
            for s in from.states() {
                let c = read(cells, s);
                if let Some(t) = to.index(s) {
                    let t = &mut cells[t];
                    t.c = t.c.min(c.c);
                    t.e = t.e.min(c.e);
                    t.k = t.k.min(c.k.saturating_add(bl));
                }
            }
        }
        let (flo, fhi) = (from.lo, from.lo + from.width);
        for h in 0..2usize {
            let kinds = if h == 0 && g.hl > 0 { 3 } else { 1 };
            for (i, &ty) in KINDS[..kinds].iter().enumerate() {
                let h2 = if ty == Ty::Data { h } else { 1 };
                // Whole pages: target p2 from every source p with 1 <= p2 - p <= most.
                if !last && let Some((most, m)) = rows.pages[i] {
                    for p2 in to.lo..to.lo + to.width {
                        let (mut e, mut k) = (INF, INF);
                        for p in flo.max(p2.saturating_sub(most))..fhi.min(p2) {
                            let c = read(cells, State { p: Some(p), h });
                            let through = m[THROUGH] - ((p2 - p) << g.shift);
                            debug_assert_eq!(
                                g.local(b, ty, (p2 - p) << g.shift).map(|l| l.m),
                                Some([m[ALONE], m[ARRIVES], m[LEAVES], through]),
                                "row prices of {ty:?}"
                            );
                            e = e.min((c.c + m[ALONE]).min(c.k + m[ARRIVES]));
                            k = k.min((c.c + m[LEAVES]).min(c.k + through));
                        }
                        relax(cells, State { p: Some(p2), h: h2 }, e, k);
                    }
                }
                // The last piece: the rest of the data, from every source it fits from.
                let done = State { p: None, h: h2 };
                if let Some((pmin, l)) = lasts[i]
                    && to.index(done).is_some()
                    && (!last || done == goal)
                {
                    let (mut e, mut k) = (INF, INF);
                    for p in flo.max(pmin)..fhi {
                        let c = read(cells, State { p: Some(p), h });
                        let through = l[THROUGH] - ((pmax - p) << g.shift);
                        debug_assert_eq!(
                            g.local(b, ty, g.data - (p << g.shift)).map(|x| x.m),
                            Some([l[ALONE], l[ARRIVES], l[LEAVES], through]),
                            "last-piece prices of {ty:?}"
                        );
                        e = e.min((c.c + l[ALONE]).min(c.k + l[ARRIVES]));
                        k = k.min((c.c + l[LEAVES]).min(c.k + through));
                    }
                    relax(cells, done, e, k);
                }
            }
            // The header alone.
            if h == 0
                && let Some(m) = rows.header
            {
                for s in from.states().filter(|s| s.h == 0) {
                    let t = State { p: s.p, h: 1 };
                    if last && t != goal {
                        continue;
                    }
                    let c = read(cells, s);
                    let e = (c.c + m[ALONE]).min(c.k + m[ARRIVES]);
                    let k = (c.c + m[LEAVES]).min(c.k + m[THROUGH]);
                    relax(cells, t, e, k);
                }
            }
        }
    }

    /// Walks back from the goal through cells whose numbers explain each other.
    fn rebuild(
        &self,
        g: &Geo,
        bufs: &[Buffer],
        layers: &[Layer],
        pmax: u64,
        goal: State,
        waste: u64,
    ) -> Layout {
        let mut l = Layout::EMPTY;
        l.used = bufs.len() as u8;
        let (mut s, mut tag, mut v) = (goal, Tag::E, waste);
        for j in (0..bufs.len()).rev() {
            let (from, to) = (&layers[j], &layers[j + 1]);
            let b = &bufs[j];
            let gap = Self::gap_before(bufs, j);
            let last = j + 1 == bufs.len();
            let rows = Rows::of(g, b, last);
            // Nothing written here?
            let mut step: Option<(State, Tag, u64)> = None;
            if !last && let Some(i) = from.index(s) {
                let raw = self.cells[i];
                let cell = Self::entering(raw, gap);
                let carried = match tag {
                    Tag::C => cell.c == v,
                    Tag::E => cell.e == v,
                    Tag::K => cell.k.saturating_add(u64::from(b.len)) == v,
                };
                if carried {
                    // Through a gap, `c` came from the source's `c` or `e`.
                    let t = if tag == Tag::C && gap && raw.c != v {
                        Tag::E
                    } else {
                        tag
                    };
                    step = Some((s, t, raw.get(t)));
                }
            }
            if step.is_none() {
                let mut found: Option<(State, Tag, u64, Write, usize)> = None;
                for src in from.states() {
                    if found.is_some() {
                        break;
                    }
                    let i = from.index(src).expect("a layer's own state");
                    let raw = self.cells[i];
                    let cell = Self::entering(raw, gap);
                    if cell.c >= INF && cell.k >= INF {
                        continue; // no write from here has a finite price
                    }
                    Self::writes(g, b, &rows, src, to, last, pmax, &mut |w| {
                        if found.is_some() || w.to != s {
                            return;
                        }
                        let m = &w.m;
                        let options = match tag {
                            Tag::C => [None, None],
                            Tag::E => [
                                (cell.c + m[ALONE] == v).then_some((Tag::C, ALONE)),
                                (cell.k + m[ARRIVES] == v).then_some((Tag::K, ARRIVES)),
                            ],
                            Tag::K => [
                                (cell.c + m[LEAVES] == v).then_some((Tag::C, LEAVES)),
                                (cell.k + m[THROUGH] == v).then_some((Tag::K, THROUGH)),
                            ],
                        };
                        if let Some((t, case)) = options.into_iter().flatten().next() {
                            // A `c` that came through a gap came from the source's `c` or `e`.
                            let t = if t == Tag::C && gap && raw.c != cell.c {
                                Tag::E
                            } else {
                                t
                            };
                            found = Some((src, t, raw.get(t), w, case));
                        }
                    });
                }
                let (src, t, value, w, case) =
                    found.expect("every kept number is explained by the layer before");
                let local = g.local(b, w.ty, w.len).expect("a priced write fits");
                debug_assert_eq!(local.m, w.m, "rows price as the buffer does");
                let (data_at, header_at) = local.at[case];
                if data_at != NONE && w.ty != Ty::Header {
                    l.data[l.ndata as usize] = Piece {
                        buf: j as u8,
                        offset: data_at as u32,
                        len: w.len as u32,
                    };
                    l.ndata += 1;
                }
                if header_at != NONE {
                    l.header = Some(Piece {
                        buf: j as u8,
                        offset: header_at as u32,
                        len: g.hl as u32,
                    });
                }
                step = Some((src, t, value));
            }
            (s, tag, v) = step.expect("set above");
        }
        debug_assert_eq!((tag, v), (Tag::C, 0), "the walk back ends at the start");
        l.data[..l.ndata as usize].reverse();
        l
    }
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::placement::Cost;

    const P: u32 = 4096;

    fn req(header_len: u32, header_align: u32, data_len: u32) -> Request {
        Request {
            header_len,
            header_align,
            data_len,
            page: P,
        }
    }

    /// `lens` contiguous from a page-aligned address.
    fn contiguous(lens: &[u32]) -> Vec<Buffer> {
        let mut addr = 0x10_0000u64;
        lens.iter()
            .map(|&len| {
                let b = Buffer { addr, len };
                addr += u64::from(len);
                b
            })
            .collect()
    }

    fn cost(r: &Request, bufs: &[Buffer]) -> (Cost, Layout) {
        let l = plan(r, bufs).unwrap();
        assert_eq!(l.check(r, bufs), Ok(()));
        (l.cost(r, bufs), l)
    }

    #[test]
    fn header_just_before_the_data_rather_than_padded_after_it() {
        // Right after 5000 B of data the header would cost 56 B of padding (5000 → 5056);
        // just before the second page boundary, with the data from there, it costs nothing.
        let bufs = contiguous(&[4 * P]);
        let (c, l) = cost(&req(128, 64, 5000), &bufs);
        assert_eq!(
            c,
            Cost {
                buffers: 1,
                waste: 0
            }
        );
        assert_eq!(l.header.unwrap().offset, P - 128);
        assert_eq!(l.data()[0].offset, P);
        assert_eq!(l.immediate(&bufs), P - 128);
    }

    #[test]
    fn header_right_after_the_data_when_nothing_precedes_it() {
        // One page: no page boundary after the first leaves room for the data, so the header
        // follows the data on its alignment.
        let bufs = contiguous(&[P]);
        let (c, l) = cost(&req(128, 64, 100), &bufs);
        assert_eq!(
            c,
            Cost {
                buffers: 1,
                waste: 28
            }
        );
        assert_eq!(l.header.unwrap().offset, 128);
    }

    #[test]
    fn whole_pages_then_header_wastes_nothing() {
        let bufs = contiguous(&[4 * P]);
        let (c, l) = cost(&req(128, 64, 2 * P), &bufs);
        assert_eq!(
            c,
            Cost {
                buffers: 1,
                waste: 0
            }
        );
        assert_eq!(l.data().len(), 1);
    }

    #[test]
    fn header_in_the_penultimate_buffers_slack() {
        // Buffer 0: one page and 512 bytes of slack; buffer 1 starts right after, so its
        // first page boundary is 3584 bytes in: a piece there must start at that boundary.
        let bufs = contiguous(&[P + 512, 3584 + P]);
        let r = req(256, 64, 2 * P);
        let (c, l) = cost(&r, &bufs);
        assert_eq!(c.buffers, 2);
        // The header sits in the slack between the two data pages (buffer 0's tail or buffer
        // 1's head: the same waste), so the WRITE carries nothing extra for it.
        let at = |p: &Piece| bufs[p.buf as usize].addr + u64::from(p.offset);
        let (d0, d1, h) = (l.data()[0], l.data()[1], l.header.unwrap());
        assert!(at(&d0) + u64::from(d0.len) <= at(&h));
        assert!(at(&h) + u64::from(h.len) <= at(&d1));
        assert_eq!(c.waste, 3584 + 512 - 256);
    }

    #[test]
    fn no_fit_and_bad_input() {
        let bufs = contiguous(&[P]);
        assert_eq!(plan(&req(0, 1, P + 1), &bufs), Err(PlanError::NoFit));
        assert_eq!(plan(&req(0, 1, 0), &bufs), Err(PlanError::NoFit));
        assert!(matches!(
            plan(&req(8, 3, 1), &bufs),
            Err(PlanError::BadAlignment { .. })
        ));
    }

    #[test]
    fn planner_reuses_its_scratch() {
        let bufs = contiguous(&[4 * P, 4 * P, 4 * P]);
        let mut p = Planner::new();
        let a = p.plan(&req(128, 64, 9 * P), &bufs).unwrap();
        let cap = p.cells.capacity();
        let b = p.plan(&req(128, 64, 9 * P), &bufs).unwrap();
        assert_eq!(a, b);
        assert_eq!(p.cells.capacity(), cap);
    }
}
