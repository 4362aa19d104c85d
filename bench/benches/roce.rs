//! The RoCEv2 fast path without EAL: what one packet and one operation cost in the pure
//! engine, so that regressions show up in `cargo bench` (issue: the fast path at its limit).
//!
//! - `wire/emit_write_*`: a WRITE Only frame built from its parsed headers and payload
//!   (`RoceRepr::emit`: headers, IPv4 checksum, ICRC).
//! - `wire/emit_write_template_*`: the same frame as a queue pair builds it, from its
//!   prepared header template (`wire::template::HeaderTemplate::emit`: headers copied and
//!   patched, the ICRC continued from the template's), the payload copied in.
//! - `wire/parse_write_*`: the same frame checked and parsed (`wire::parse_frame`: lengths,
//!   checksums, ICRC).
//! - `wire/emit_ack`, `wire/parse_ack`: the ACK path, an ACKNOWLEDGE built from the
//!   responder's template and checked and parsed by the requester's engine.
//! - `node/write_*`: one RDMA WRITE between two `RdmaNode`s in memory, as the worker drives
//!   them: A takes the posted request, builds and emits the frame; B receives it, places the
//!   data in its registered memory and answers with an ACK; A takes the ACK and hands the
//!   completion to the application, which polls it. Both engines' work, as when both run on
//!   one core in `portico bench`.
//! - `node/write_64_x32`: 32 WRITEs of 64 bytes posted at once, then the same round trip for
//!   all of them (per batch; divide by 32).
//! - `crc/copy_then_crc_*`: a payload copied into a frame, then folded into a CRC by the
//!   wire crate's own CRC (tables, `crc32fast` from 64 bytes); `crc/fused_<kernel>_*`: both
//!   in one pass by `pmem::crc` with each kernel the CPU runs (`docs/rdma.md`).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pmem::crc::Kernel;
use portico::wire::roce::RoceIpv4;
use portico::wire::template::HeaderTemplate;
use portico::wire::{self, AethRepr, BthRepr, Opcode, RoceRepr, Syndrome};

mod common;
use common::pair;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("roce");
    for size in [64u32, 4096] {
        let frame = pair().write_frame(size);
        let (repr, payload) = wire::parse_frame(&frame).expect("a valid frame");
        let payload = payload.to_vec();
        g.throughput(Throughput::Elements(1));
        let mut out = vec![0u8; frame.len() + 64];
        g.bench_with_input(BenchmarkId::new("wire/emit_write", size), &size, |b, _| {
            b.iter(|| black_box(repr.emit(black_box(&mut out), black_box(&payload))))
        });
        let template = HeaderTemplate::new(&repr).expect("a template");
        g.bench_with_input(
            BenchmarkId::new("wire/emit_write_template", size),
            &size,
            |b, _| {
                b.iter(|| {
                    black_box(template.emit(
                        black_box(&repr),
                        payload.len(),
                        black_box(&mut out),
                        |d| d.copy_from_slice(black_box(&payload)),
                    ))
                })
            },
        );
        g.bench_with_input(BenchmarkId::new("wire/parse_write", size), &size, |b, _| {
            b.iter(|| black_box(wire::parse_frame(black_box(&frame)).is_ok()))
        });
        let mut p = pair();
        let wrs = p.requests(size);
        g.bench_with_input(BenchmarkId::new("node/write", size), &size, |b, _| {
            b.iter(|| p.writes(&wrs[..1]))
        });
    }
    // The ACK path: B's ACKNOWLEDGE to A, built from B's template, checked and parsed.
    let frame = pair().write_frame(64);
    let (write, _) = wire::parse_frame(&frame).expect("a valid frame");
    let ack = RoceRepr {
        src_mac: write.dst_mac,
        dst_mac: write.src_mac,
        ip: RoceIpv4 {
            src_addr: write.ip.dst_addr,
            dst_addr: write.ip.src_addr,
            ..write.ip
        },
        bth: BthRepr {
            opcode: Opcode::Acknowledge,
            dest_qp: 0x11,
            ack_req: false,
            ..write.bth
        },
        reth: None,
        aeth: Some(AethRepr {
            syndrome: Syndrome::Ack { credit_code: 31 },
            msn: 1,
        }),
        ..write
    };
    let template = HeaderTemplate::new(&ack).expect("a template");
    let mut out = vec![0u8; 128];
    g.throughput(Throughput::Elements(1));
    g.bench_function("wire/emit_ack", |b| {
        b.iter(|| black_box(template.emit(black_box(&ack), 0, black_box(&mut out), |_| {})))
    });
    let len = template.emit(&ack, 0, &mut out, |_| {}).expect("emits");
    let ack_frame = out[..len].to_vec();
    g.bench_function("wire/parse_ack", |b| {
        b.iter(|| black_box(wire::parse_frame(black_box(&ack_frame)).is_ok()))
    });

    let mut p = pair();
    let wrs = p.requests(64);
    g.throughput(Throughput::Elements(32));
    g.bench_function("node/write_64_x32", |b| b.iter(|| p.writes(&wrs)));
    g.finish();

    // A payload copied into a frame and folded into its ICRC: two passes (a copy, then the
    // CRC the wire crate runs without `pmem`'s kernels) against one with each kernel this
    // CPU runs.
    let mut g = c.benchmark_group("crc");
    for size in [80usize, 1024, 4096] {
        let src: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
        let mut dst = vec![0u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::new("copy_then_crc", size), &size, |b, _| {
            b.iter(|| {
                dst.copy_from_slice(black_box(&src));
                black_box(wire::icrc::fold_tables(!0, &dst))
            })
        });
        for k in [Kernel::Portable, Kernel::Pclmul, Kernel::Vpclmul] {
            if !k.available() {
                continue;
            }
            let id = BenchmarkId::new(format!("fused_{}", k.name()), size);
            g.bench_with_input(id, &size, |b, _| {
                b.iter(|| black_box(pmem::crc::copy_with(k, !0, black_box(&src), &mut dst)))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
