//! ns per plan of the header/data placement planner (`placement::Planner::plan`, warm
//! scratch), for lists of up to 16 buffers: the `bench placement` lists (contiguous,
//! page-aligned), lists of odd sizes starting mid-page, lists with address gaps (one WRITE per
//! buffer), and lists built to keep the most states alive (every buffer a little more than a
//! whole number of pages, data that needs nearly all of them).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use portico::placement::{Buffer, Planner, Request};

const PAGE: u32 = 4096;

fn req(header_len: u32, data_len: u32) -> Request {
    Request {
        header_len,
        header_align: 64,
        data_len,
        page: PAGE,
    }
}

/// `lens` back to back from `addr`.
fn contiguous(addr: u64, lens: &[u32]) -> Vec<Buffer> {
    let mut at = addr;
    lens.iter()
        .map(|&len| {
            let b = Buffer { addr: at, len };
            at += u64::from(len);
            b
        })
        .collect()
}

fn cases() -> Vec<(String, Request, Vec<Buffer>)> {
    let base = 0x7f00_0000_0000u64;
    let mut out = Vec::new();
    // The `bench placement` lists: 16 buffers of max(8 KiB, data/4 + header) in pages.
    for (h, d) in [
        (128u32, 4096u32),
        (64, 1024),
        (1024, 65536),
        (1024, 1 << 20),
    ] {
        let len = (d / 4 + h).next_multiple_of(PAGE).max(2 * PAGE);
        out.push((
            format!("bench-list/h{h}-{d}B"),
            req(h, d),
            contiguous(base, &[len; 16]),
        ));
    }
    // Odd sizes from mid-page: every boundary is mid-page.
    let odd: Vec<u32> = (0..16).map(|i| 5000 + 777 * (i % 5)).collect();
    for d in [4096, 20000, 36000] {
        out.push((
            format!("mid-page-odd/h128-{d}B"),
            req(128, d),
            contiguous(base + 200, &odd),
        ));
    }
    // Address gaps: each buffer on its own page, a page apart.
    let gaps: Vec<Buffer> = (0..16)
        .map(|i| Buffer {
            addr: base + i * 0x4000,
            len: 3 * PAGE,
        })
        .collect();
    out.push(("gaps/h128-40000B".into(), req(128, 40000), gaps));
    // Many states: 16 buffers of 4 pages + 100 B from mid-page (49 whole pages in all), data
    // needing 44 of them.
    out.push((
        "worst/h1024-44pages".into(),
        req(1024, 44 * PAGE - 1),
        contiguous(base + 3000, &[4 * PAGE + 100; 16]),
    ));
    out
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("placement_plan");
    for (name, r, bufs) in cases() {
        let mut p = Planner::new();
        let l = p.plan(&r, &bufs).unwrap_or_else(|e| panic!("{name}: {e}"));
        eprintln!("{name}: {} of {} buffers used", l.used, bufs.len());
        g.bench_with_input(
            BenchmarkId::from_parameter(&name),
            &(r, bufs),
            |b, (r, bufs)| b.iter(|| black_box(p.plan(black_box(r), black_box(bufs)))),
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
