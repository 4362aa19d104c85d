//! Header/data placement on the wire (seed 003): two engines over `net_ring`, A sending a
//! header and its data to lists of buffers in B's registered memory with
//! `Qp::post_placed` (one RDMA WRITE with immediate per contiguous run of target buffers).
//!
//! B's application learns only the immediate: it finds the header at that offset of its
//! buffer list, reads the data length the header carries, and locates the data with
//! `placement::locate`. Checked, byte for byte in B's own mapping: the header and every data
//! piece; the data pages start on page boundaries; every byte outside the WRITEs the plan
//! names still holds the canary B wrote before (nothing else was touched); A's WRITE
//! completions are exactly the plan's count.
//!
//! 1. Every shape of buffer list (contiguous from a page boundary, mid-page, each buffer on its
//!    own page with gaps, mixed), headers 0 B to 1 KiB on 1 to 256 B, data 0 B to 64 KiB.
//! 2. The same through the fault mix (1 % each of drop, duplicate, reorder and corrupt on both
//!    receive paths), pipelined, `PORTICO_FAULT_OPS` messages (default 1 500).

mod common;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pattern;
use pmem::Mapping;
use portico::placement::{self, Buffer, Layout, Planner, Request, Sources};
use portico::rdma::loopback::{self, LoopbackOpts};
use portico::rdma::{Cq, MemoryRegion};
use portico::runtime::FaultConfig;
use portico::transport::{Access, Mtu, QpConfig, RecvRequest, SgList, WcOpcode, WcStatus};

const WAIT: Duration = Duration::from_secs(30);
const KIB: usize = 1024;
const PAGE: u32 = 4096;
/// B's region: `SLOTS` slots, each holding one message's buffer list.
const SLOT: usize = 192 * KIB;
const SLOTS: usize = 16;
const CANARY: u8 = 0x5a;
/// A's pad buffer (the bytes of gaps inside a WRITE): shorter than some gaps, so a gap takes
/// several gather entries.
const PAD: usize = 1500;

fn messages() -> usize {
    std::env::var("PORTICO_FAULT_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500)
}

/// The buffer list shapes, at offset `base` of B's region (page-aligned).
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// Back to back from a page boundary.
    Contiguous,
    /// Back to back from 200 B past a page boundary: every data page must skip to a boundary.
    MidPage,
    /// Each buffer on its own page boundary, a page apart: one WRITE per used buffer.
    Gaps,
    /// Mid-page, contiguous pairs with a gap between them.
    Mixed,
}

const SHAPES: [Shape; 4] = [Shape::Contiguous, Shape::MidPage, Shape::Gaps, Shape::Mixed];

/// Buffer lengths (bytes) of list `i`: whole pages and odd sizes.
fn lens(i: usize) -> Vec<u32> {
    const LISTS: [&[u32]; 5] = [
        &[16384, 16384, 16384],
        &[4096, 6000, 8192, 4096, 12288],
        &[5000, 5000, 5000, 5000, 5000, 5000, 5000, 5000],
        &[40960, 4096, 2048],
        &[1024, 3000, 4096, 20000, 8192, 4096],
    ];
    LISTS[i % LISTS.len()].to_vec()
}

/// The list in B's region at `base`, as offsets into the region (converted to addresses by the
/// caller); every list fits in one slot.
fn shape(shape: Shape, base: u64, lens: &[u32]) -> Vec<(u64, u32)> {
    let page = u64::from(PAGE);
    let mut out = Vec::new();
    let mut end = match shape {
        Shape::Contiguous | Shape::Gaps => base,
        Shape::MidPage | Shape::Mixed => base + 200,
    };
    for (i, &len) in lens.iter().enumerate() {
        let at = match shape {
            Shape::Contiguous | Shape::MidPage => end,
            Shape::Gaps if i > 0 => end.next_multiple_of(page) + page,
            Shape::Mixed if i % 2 == 0 && i > 0 => end + 700,
            _ => end,
        };
        out.push((at, len));
        end = at + u64::from(len);
    }
    assert!(end <= base + SLOT as u64, "list fits its slot");
    out
}

/// What the test knows of one message.
struct Message {
    req: Request,
    bufs: Vec<Buffer>,
    slot: usize,
    header: Vec<u8>,
    data: Vec<u8>,
}

struct Sides {
    a_src: MemoryRegion,
    a_map: Arc<Mapping>,
    b_region: MemoryRegion,
    b_map: Arc<Mapping>,
    /// Offsets in A's source region.
    header_at: usize,
    data_at: usize,
    pad_at: usize,
}

/// A's source region: 16 header slots of 1 KiB, 16 data slots of 64 KiB, the pad.
const SRC_HEADERS: usize = 0;
const SRC_DATA: usize = 16 * KIB;
const SRC_PAD: usize = SRC_DATA + 16 * 64 * KIB;
const SRC_LEN: usize = SRC_PAD + 4 * KIB;

fn sides(p: &loopback::LoopbackPair) -> Sides {
    let a_map = Arc::new(Mapping::anonymous(SRC_LEN).unwrap());
    let a_src = p.a.engine.register_all(&a_map, Access::ALL).unwrap();
    a_map.write(SRC_PAD, &[0xee; PAD]).unwrap();
    let b_map = Arc::new(Mapping::anonymous(SLOT * SLOTS).unwrap());
    let b_region = p.b.engine.register_all(&b_map, Access::ALL).unwrap();
    b_map.write(0, &vec![CANARY; SLOT * SLOTS]).unwrap();
    Sides {
        a_src,
        a_map,
        b_region,
        b_map,
        header_at: SRC_HEADERS,
        data_at: SRC_DATA,
        pad_at: SRC_PAD,
    }
}

/// Message `i` for slot `slot`: its shape, list, header and data.
fn message(
    i: usize,
    slot: usize,
    s: &Sides,
    header_len: u32,
    align: u32,
    data_len: u32,
) -> Message {
    let base = s.b_region.addr();
    let list = shape(
        SHAPES[i % SHAPES.len()],
        (slot * SLOT) as u64,
        &lens(i / SHAPES.len()),
    );
    let bufs = list
        .iter()
        .map(|&(off, len)| Buffer {
            addr: base + off,
            len,
        })
        .collect();
    // The header carries the data length (the application's protocol), then its own bytes.
    let mut header = pattern(header_len as usize, 1000 + i as u64);
    if header_len >= 4 {
        header[..4].copy_from_slice(&data_len.to_le_bytes());
    }
    Message {
        req: Request {
            header_len,
            header_align: align,
            data_len,
            page: PAGE,
        },
        bufs,
        slot,
        header,
        data: pattern(data_len as usize, 2000 + i as u64),
    }
}

/// A posts message `m` (its bytes into A's source slots `k`); returns the plan and the number
/// of WRITEs.
fn post(
    p: &mut loopback::LoopbackPair,
    planner: &mut Planner,
    s: &Sides,
    m: &Message,
    k: usize,
    wr_id: u64,
) -> placement::Layout {
    let (h_at, d_at) = (s.header_at + k * KIB, s.data_at + k * 64 * KIB);
    s.a_map.write(h_at, &m.header).unwrap();
    s.a_map.write(d_at, &m.data).unwrap();
    let src = Sources {
        header: s.a_src.sge(h_at, m.req.header_len),
        data: s.a_src.sge(d_at, m.req.data_len),
        pad: s.a_src.sge(s.pad_at, PAD as u32),
    };
    let placed =
        p.a.qp
            .post_placed(planner, &m.req, &m.bufs, s.b_region.rkey(), &src, wr_id)
            .expect("posted");
    assert_eq!(placed.layout.check(&m.req, &m.bufs), Ok(()));
    placed.layout
}

/// B's side of message `m`, from the immediate alone: header, data, alignment, canary.
fn verify(planner: &mut Planner, s: &Sides, m: &Message, imm: u32, what: &str) -> Layout {
    let base = s.b_region.addr();
    let read = |addr: u64, len: usize| {
        let mut v = vec![0u8; len];
        s.b_map.read((addr - base) as usize, &mut v).unwrap();
        v
    };
    let mut req = m.req;
    if m.req.header_len >= 4 {
        // The header's offset comes from the immediate, the data length from the header.
        let (i, off) = placement::position(&m.bufs, imm).expect("the immediate names a byte");
        let h = read(m.bufs[i].addr + u64::from(off), m.req.header_len as usize);
        assert_eq!(h, m.header, "{what}: header bytes");
        req.data_len = u32::from_le_bytes(h[..4].try_into().unwrap());
    }
    let layout = placement::locate(planner, &req, &m.bufs, imm).expect("the target finds it");
    let mut got = Vec::new();
    for d in layout.data() {
        let addr = m.bufs[d.buf as usize].addr + u64::from(d.offset);
        assert_eq!(
            addr % u64::from(PAGE),
            0,
            "{what}: data pieces start on pages"
        );
        got.extend(read(addr, d.len as usize));
    }
    assert!(got == m.data, "{what}: data bytes");
    // Nothing outside the WRITEs was touched.
    let mut ranges = [placement::WriteRange::default(); placement::MAX_BUFFERS];
    let (n, _) = layout.writes(&req, &m.bufs, &mut ranges);
    let slot_lo = base + (m.slot * SLOT) as u64;
    let slot = read(slot_lo, SLOT);
    for (j, &byte) in slot.iter().enumerate() {
        let addr = slot_lo + j as u64;
        let written = ranges[..n]
            .iter()
            .any(|r| addr >= r.addr && addr < r.addr + r.len);
        if !written {
            assert_eq!(
                byte, CANARY,
                "{what}: byte {j} of the slot outside the WRITEs"
            );
        }
    }
    // Ready for the slot's next message.
    s.b_map.write(m.slot * SLOT, &vec![CANARY; SLOT]).unwrap();
    layout
}

fn post_recv(p: &mut loopback::LoopbackPair, n: usize) {
    for i in 0..n {
        p.b.qp
            .post_recv(&[RecvRequest::new(i as u64, SgList::new())])
            .unwrap();
    }
}

fn b_completion(cq: &mut Cq, what: &str) -> u32 {
    let wc = cq
        .wait_one(WAIT)
        .unwrap_or_else(|| panic!("{what}: B completes"));
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::RecvRdmaWithImm),
        "{what}: {wc:?}"
    );
    wc.imm_data.expect("WRITE with immediate")
}

fn qp_config() -> QpConfig {
    let mut cfg = QpConfig::new(0, 0);
    cfg.pmtu = Mtu::M4096;
    cfg.max_send_wr = 256;
    cfg.max_recv_wr = 256;
    cfg
}

/// (header length, alignment, data length) of the sweep.
fn cases() -> Vec<(u32, u32, u32)> {
    let mut out = Vec::new();
    for (h, a) in [(0, 1), (8, 8), (64, 64), (128, 64), (100, 8), (1024, 256)] {
        for d in [0, 1, 100, 4095, 4096, 4097, 12288, 20000, 65536] {
            if h == 0 && d == 0 {
                continue;
            }
            out.push((h, a, d));
        }
    }
    out
}

#[test]
fn placed_messages_land_byte_for_byte() {
    let _serial = common::serial();
    let cores = common::shared_eal();
    common::host_on_first_core();
    let last = *cores.last().unwrap();
    let mut opts = LoopbackOpts::new(qp_config(), [last, last]);
    opts.name = "place".into();
    let mut p = loopback::start(&opts).expect("engines start");
    let s = sides(&p);
    let (mut pa, mut pb) = (Planner::new(), Planner::new());
    let mut i = 0;
    let (mut sent, mut writes, mut multi_run) = (0, 0, 0);
    for &(h, a, d) in &cases() {
        for _ in 0..SHAPES.len() * 2 {
            let m = message(i, i % SLOTS, &s, h, a, d);
            let what = format!("message {i} ({h} B on {a}, {d} B, {:?})", SHAPES[i % 4]);
            if pa.plan(&m.req, &m.bufs).is_err() {
                i += 1;
                continue;
            }
            post_recv(&mut p, 1);
            let layout = post(&mut p, &mut pa, &s, &m, 0, i as u64);
            let mut ranges = [placement::WriteRange::default(); placement::MAX_BUFFERS];
            let (runs, _) = layout.writes(&m.req, &m.bufs, &mut ranges);
            multi_run += if runs > 1 { 1 } else { 0 };
            let imm = b_completion(&mut p.b.cq, &what);
            assert_eq!(imm, layout.immediate(&m.bufs), "{what}");
            let found = verify(&mut pb, &s, &m, imm, &what);
            assert_eq!(
                found, layout,
                "{what}: the target finds the initiator's plan"
            );
            // A: one completion per WRITE, all successful.
            let mut n = 0;
            while n < runs {
                let wc = p.a.cq.wait_one(WAIT).expect("A's WRITEs complete");
                assert_eq!(
                    (wc.status, wc.wr_id),
                    (WcStatus::Success, i as u64),
                    "{what}"
                );
                n += 1;
            }
            writes += n;
            sent += 1;
            i += 1;
        }
    }
    assert_eq!(
        p.a.cq.poll_one(),
        None,
        "no completion beyond one per WRITE"
    );
    assert!(multi_run > 0, "some plans take several WRITEs");
    eprintln!(
        "{sent} messages ({} without a plan), {writes} WRITEs, {multi_run} with more than one",
        i - sent
    );
    assert!(sent > 300, "most cases have a plan: {sent} of {i}");
    p.runtime.stop();
    p.runtime.join().expect("workers ran without failure");
}

/// Messages in flight at once in the fault run (each has its own source slot and target slot).
const WINDOW: usize = 8;

#[test]
fn placed_messages_survive_faults() {
    let _serial = common::serial();
    let cores = common::shared_eal();
    common::host_on_first_core();
    let last = *cores.last().unwrap();
    let mut opts = LoopbackOpts::new(qp_config(), [last, last]);
    opts.name = "placef".into();
    opts.faults = Some(FaultConfig {
        seed: 11,
        drop: 0.01,
        duplicate: 0.01,
        reorder: 0.01,
        corrupt: 0.01,
    });
    let mut p = loopback::start(&opts).expect("engines start");
    let s = sides(&p);
    let (mut pa, mut pb) = (Planner::new(), Planner::new());
    let cases = cases();
    let total = messages();
    post_recv(&mut p, 128);
    // In flight, oldest first: the message, whether B has verified it, A's WRITEs to come.
    let mut flight: VecDeque<(usize, Message, bool, usize)> = VecDeque::new();
    let (mut next, mut retired, mut skipped, mut writes) = (0, 0, 0, 0);
    let mut last_progress = Instant::now();
    while retired + skipped < total {
        while flight.len() < WINDOW && next < total {
            let (h, a, d) = cases[next % cases.len()];
            let i = next;
            next += 1;
            let m = message(i, i % SLOTS, &s, h, a, d);
            if pa.plan(&m.req, &m.bufs).is_err() {
                skipped += 1;
                continue;
            }
            let layout = post(&mut p, &mut pa, &s, &m, i % SLOTS, i as u64);
            let mut ranges = [placement::WriteRange::default(); placement::MAX_BUFFERS];
            let (runs, _) = layout.writes(&m.req, &m.bufs, &mut ranges);
            writes += runs;
            flight.push_back((i, m, false, runs));
        }
        let mut progress = false;
        if let Some(wc) = p.b.cq.wait_one(Duration::from_millis(1)) {
            assert_eq!(
                (wc.status, wc.opcode),
                (WcStatus::Success, WcOpcode::RecvRdmaWithImm),
                "{wc:?}"
            );
            // RC: B's completions come in message order.
            let (i, m, seen, _) = flight
                .iter_mut()
                .find(|f| !f.2)
                .expect("a completion for a message in flight");
            let what = format!("message {i}");
            verify(&mut pb, &s, m, wc.imm_data.expect("immediate"), &what);
            *seen = true;
            post_recv(&mut p, 1);
            progress = true;
        }
        while let Some(wc) = p.a.cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            let f = flight
                .iter_mut()
                .find(|f| f.0 as u64 == wc.wr_id)
                .unwrap_or_else(|| panic!("a completion of a message in flight: {wc:?}"));
            assert!(f.3 > 0, "no more completions than WRITEs: {wc:?}");
            f.3 -= 1;
            progress = true;
        }
        while flight.front().is_some_and(|f| f.2 && f.3 == 0) {
            flight.pop_front();
            retired += 1;
        }
        if progress {
            last_progress = Instant::now();
        }
        assert!(
            last_progress.elapsed() < WAIT,
            "no progress for {WAIT:?}: {retired} retired, {} in flight",
            flight.len()
        );
    }
    assert_eq!(p.a.cq.wait_one(Duration::from_millis(50)), None);
    assert_eq!(p.b.cq.poll_one(), None);
    p.runtime.stop();
    let reports = p.runtime.join().expect("workers ran without failure");
    let totals = common::fault_totals(&reports);
    eprintln!("{retired} messages ({skipped} without a plan), {writes} WRITEs");
    totals.check();
}
