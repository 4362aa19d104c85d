//! Planning and gathering a placed message allocate nothing once the planner is warm: the
//! per-message host work of `Qp::post_placed` (plan, then gather into WRITEs) stays off the
//! allocator, as the fast path must. Counted with `allocation-counter`, on this thread only:
//! planning and gathering run on the caller's thread, and a whole-process count also sees the
//! test harness's own thread (a first version counted with `stats_alloc` and failed once in
//! CI on 4 allocations that were not this thread's).
//!
//! Negative control in the same test: a fresh `Planner` per plan allocates its scratch every
//! time, and the counter sees it.

use portico::placement::{self, Buffer, Planner, Request, Sources};
use portico::transport::Sge;

const PAGE: u32 = 4096;

/// Requests and lists of several shapes: contiguous, mid-page, with gaps; header alignments
/// below and above a page (the row path and the general path).
fn cases() -> Vec<(Request, Vec<Buffer>)> {
    let base = 0x7f00_0000_0000u64;
    let contiguous = |start: u64, lens: &[u32]| {
        let mut at = start;
        lens.iter()
            .map(|&len| {
                let b = Buffer { addr: at, len };
                at += u64::from(len);
                b
            })
            .collect::<Vec<_>>()
    };
    let req = |header_len, header_align, data_len| Request {
        header_len,
        header_align,
        data_len,
        page: PAGE,
    };
    let gaps: Vec<Buffer> = (0..16)
        .map(|i| Buffer {
            addr: base + i * 0x4000,
            len: 3 * PAGE,
        })
        .collect();
    vec![
        (req(128, 64, 4096), contiguous(base, &[8192; 16])),
        (req(1024, 64, 65536), contiguous(base, &[20480; 16])),
        (
            req(100, 8, 16000),
            contiguous(base + 200, &[5000, 7000, 9000, 6000, 12000, 4096]),
        ),
        (req(128, 64, 40000), gaps),
        (req(256, 8192, 20000), contiguous(base + 100, &[12000; 8])),
        (req(0, 1, 12289), contiguous(base, &[4096; 8])),
    ]
}

fn sources(r: &Request) -> Sources {
    Sources {
        header: Sge::new(1, 0x1000, r.header_len),
        data: Sge::new(1, 0x10_0000, r.data_len),
        pad: Sge::new(1, 0x20_0000, 4096),
    }
}

#[test]
fn warm_planning_and_gathering_allocate_nothing() {
    let cases = cases();
    let mut planner = Planner::new();
    // Warm-up: the scratch grows to the largest case.
    for (i, (r, bufs)) in cases.iter().enumerate() {
        planner
            .plan(r, bufs)
            .unwrap_or_else(|e| panic!("case {i} has a plan: {e}"));
    }
    let mut writes = 0;
    let info = allocation_counter::measure(|| {
        for _ in 0..100 {
            for (r, bufs) in &cases {
                let layout = planner.plan(r, bufs).expect("a plan");
                let w = placement::gather(&layout, r, bufs, 7, &sources(r), 1).expect("gathered");
                writes += w.as_slice().len();
            }
        }
    });
    assert!(writes >= 600, "{writes} WRITEs built");
    assert_eq!(
        info.count_total, 0,
        "warm planning and gathering allocated: {info:?}"
    );

    // The counter sees allocation: a fresh planner per plan.
    let info = allocation_counter::measure(|| {
        for (r, bufs) in &cases {
            Planner::new().plan(r, bufs).expect("a plan");
        }
    });
    assert!(
        info.count_total >= cases.len() as u64,
        "a fresh planner allocates its scratch: {info:?}"
    );
}
