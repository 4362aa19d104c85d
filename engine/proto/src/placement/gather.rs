//! From a plan to work requests, and back at the target.
//!
//! [`gather`] turns a [`Layout`] into RDMA WRITEs: one per run of address-contiguous target
//! buffers that holds anything, from its first written byte to its last, gathered straight
//! from the header's and the data's own (registered) buffers; the gaps the plan leaves inside a
//! run come from a pad buffer (any registered bytes; they land in parts of the target's
//! buffers the plan leaves unused). A run whose gather list would exceed [`MAX_SGE`] entries
//! goes as consecutive WRITEs. The last WRITE carries the immediate, the header's offset in the
//! buffer list: the target's completion of it comes after every earlier WRITE of the message
//! has landed (RC order).
//!
//! [`locate`] is the target's side: from the immediate and the same request (header length and
//! alignment and page size are the application's protocol; the data length it reads from its
//! header), it plans again (the planner is deterministic), checks the header's offset and
//! returns where the data is.

use super::{Buffer, Layout, MAX_BUFFERS, PlanError, Planner, Request};
use crate::transport::{MAX_SGE, SgList, Sge, WorkRequest, WrKind};

/// WRITEs one message takes at most.
pub const MAX_WRITES: usize = 8;

/// The initiator's buffers: the header, the data, and a pad buffer the gaps are sent from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sources {
    pub header: Sge,
    pub data: Sge,
    pub pad: Sge,
}

/// Why a plan cannot be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GatherError {
    #[error("the header source holds {have} bytes, the request says {want}")]
    HeaderSource { have: u32, want: u32 },
    #[error("the data source holds {have} bytes, the request says {want}")]
    DataSource { have: u32, want: u32 },
    #[error("the plan leaves gaps inside a WRITE but the pad buffer is empty")]
    NoPad,
    #[error("the plan needs more than {MAX_WRITES} WRITEs")]
    TooManyWrites,
}

/// The WRITEs of one message.
#[derive(Debug, Clone, Copy)]
pub struct Writes {
    wrs: [WorkRequest; MAX_WRITES],
    n: usize,
    /// Bytes the WRITEs carry: header, data and waste.
    pub carried: u64,
    /// The last WRITE's immediate: the header's offset in the buffer list.
    pub immediate: u32,
}

impl Writes {
    pub fn as_slice(&self) -> &[WorkRequest] {
        &self.wrs[..self.n]
    }
}

/// A piece of the message: where it lands and where its bytes come from.
#[derive(Debug, Clone, Copy, Default)]
struct Part {
    run: u8,
    addr: u64,
    src: Sge,
}

/// The WRITEs that carry `layout` (a plan of `req` in `bufs`, all under `rkey`) from `src`;
/// every WRITE has `wr_id`, only the last the immediate.
pub fn gather(
    layout: &Layout,
    req: &Request,
    bufs: &[Buffer],
    rkey: u32,
    src: &Sources,
    wr_id: u64,
) -> Result<Writes, GatherError> {
    if src.header.len != req.header_len {
        return Err(GatherError::HeaderSource {
            have: src.header.len,
            want: req.header_len,
        });
    }
    if src.data.len != req.data_len {
        return Err(GatherError::DataSource {
            have: src.data.len,
            want: req.data_len,
        });
    }
    // Runs: buffer i starts a new one after an address gap.
    let mut run = [0u8; MAX_BUFFERS];
    for i in 1..layout.used as usize {
        let prev = &bufs[i - 1];
        let joined = prev.addr + u64::from(prev.len) == bufs[i].addr;
        // Not `u8::from(!joined)`: `docs/toolchain.md` (rust-lang/rust#158206).
        run[i] = if joined { run[i - 1] } else { run[i - 1] + 1 };
    }
    let mut parts = [Part::default(); MAX_BUFFERS + 1];
    let mut n = 0;
    let mut taken = 0u64;
    for d in layout.data() {
        parts[n] = Part {
            run: run[d.buf as usize],
            addr: bufs[d.buf as usize].addr + u64::from(d.offset),
            src: Sge::new(src.data.lkey, src.data.addr + taken, d.len),
        };
        taken += u64::from(d.len);
        n += 1;
    }
    if let Some(h) = layout.header {
        parts[n] = Part {
            run: run[h.buf as usize],
            addr: bufs[h.buf as usize].addr + u64::from(h.offset),
            src: src.header,
        };
        n += 1;
    }
    let parts = &mut parts[..n];
    parts.sort_unstable_by_key(|p| (p.run, p.addr));

    let immediate = layout.immediate(bufs);
    let mut b = Builder {
        out: Writes {
            wrs: [WorkRequest::write(0, SgList::new(), 0, 0, None); MAX_WRITES],
            n: 0,
            carried: 0,
            immediate,
        },
        open: None,
        rkey,
        wr_id,
    };
    let mut last_run = None;
    for p in parts.iter() {
        if last_run != Some(p.run) {
            b.open_at(p.addr)?;
            last_run = Some(p.run);
        }
        let mut gap = p.addr - b.reached();
        while gap > 0 {
            if src.pad.len == 0 {
                return Err(GatherError::NoPad);
            }
            let take = gap.min(u64::from(src.pad.len)) as u32;
            b.push(Sge::new(src.pad.lkey, src.pad.addr, take))?;
            gap -= u64::from(take);
        }
        if p.src.len > 0 {
            b.push(p.src)?;
        }
    }
    b.close()?;
    let mut out = b.out;
    if let Some(last) = out.wrs[..out.n].last_mut()
        && let WrKind::Write { imm, .. } = &mut last.kind
    {
        *imm = Some(immediate);
    }
    Ok(out)
}

/// The WRITE being built: where it starts, its gather list, the address it has reached.
#[derive(Debug, Clone, Copy)]
struct Open {
    start: u64,
    sgl: SgList,
    end: u64,
}

struct Builder {
    out: Writes,
    open: Option<Open>,
    rkey: u32,
    wr_id: u64,
}

impl Builder {
    /// Ends the open WRITE and opens one at `addr`.
    fn open_at(&mut self, addr: u64) -> Result<(), GatherError> {
        self.close()?;
        self.open = Some(Open {
            start: addr,
            sgl: SgList::new(),
            end: addr,
        });
        Ok(())
    }

    fn reached(&self) -> u64 {
        self.open.as_ref().map_or(0, |o| o.end)
    }

    fn close(&mut self) -> Result<(), GatherError> {
        let Some(o) = self.open.take() else {
            return Ok(());
        };
        if self.out.n == MAX_WRITES {
            return Err(GatherError::TooManyWrites);
        }
        self.out.wrs[self.out.n] = WorkRequest::write(self.wr_id, o.sgl, o.start, self.rkey, None);
        self.out.n += 1;
        self.out.carried += o.end - o.start;
        Ok(())
    }

    /// Appends `sge`, going on in a new WRITE when the list is full.
    fn push(&mut self, sge: Sge) -> Result<(), GatherError> {
        if self.open.as_ref().is_some_and(|o| o.sgl.len() == MAX_SGE) {
            self.open_at(self.reached())?;
        }
        let o = self.open.as_mut().expect("a WRITE is open");
        o.sgl.push(sge).expect("room checked");
        o.end += u64::from(sge.len);
        Ok(())
    }
}

/// Why the target could not find a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LocateError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("the immediate says the header is at {got}, the plan puts it at {planned}")]
    Mismatch { got: u32, planned: u32 },
}

/// The target's side: the layout the initiator used for `req` in `bufs`, checked against the
/// immediate the WRITE brought.
pub fn locate(
    planner: &mut Planner,
    req: &Request,
    bufs: &[Buffer],
    immediate: u32,
) -> Result<Layout, LocateError> {
    let layout = planner.plan(req, bufs)?;
    let planned = layout.immediate(bufs);
    if planned != immediate {
        return Err(LocateError::Mismatch {
            got: immediate,
            planned,
        });
    }
    Ok(layout)
}

/// Where offset `at` of the buffer list (the immediate's unit) lies: the buffer and the offset
/// in it.
pub fn position(bufs: &[Buffer], at: u32) -> Option<(usize, u32)> {
    let mut before = 0u64;
    for (i, b) in bufs.iter().enumerate() {
        let at = u64::from(at);
        if at < before + u64::from(b.len) {
            return Some((i, (at - before) as u32));
        }
        before += u64::from(b.len);
    }
    None
}
