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

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pmem::Mapping;
use portico::rdma::{Cq, Qp, RdmaNode};
use portico::transport::{Access, MrKeys, Mtu, QpConfig, SgList, WorkCompletion, WorkRequest};
use portico::wire::roce::RoceIpv4;
use portico::wire::template::HeaderTemplate;
use portico::wire::{self, AethRepr, BthRepr, EthernetAddress, Opcode, RoceRepr, Syndrome};

const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xa]);
const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xb]);
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);
const REGION: usize = 1 << 20;

/// Two engines joined in memory, one queue pair each, A's source and B's target registered.
struct Pair {
    a: RdmaNode,
    b: RdmaNode,
    qp: Qp,
    cq: Cq,
    _b_cq: Cq,
    src: MrKeys,
    dst: MrKeys,
    buf: Vec<u8>,
    wcs: [WorkCompletion; 64],
    now: u64,
}

fn pair() -> Pair {
    let mut a = RdmaNode::new(MAC_A, IP_A);
    let mut b = RdmaNode::new(MAC_B, IP_B);
    let mut cfg = QpConfig::new(0x11, 0x22);
    cfg.remote_mac = MAC_B;
    cfg.remote_ip = IP_B;
    cfg.pmtu = Mtu::M4096;
    cfg.max_send_wr = 64;
    cfg.max_recv_wr = 64;
    let mut cfg_b = cfg.mirrored();
    cfg_b.remote_mac = MAC_A;
    cfg_b.remote_ip = IP_A;
    let cq = a.create_cq(256);
    let b_cq = b.create_cq(256);
    let qp = a.add_qp(cfg, &cq, &cq).expect("queue pair A");
    b.add_qp(cfg_b, &b_cq, &b_cq).expect("queue pair B");
    let map = |fill: u8| {
        let m = Arc::new(Mapping::anonymous(REGION).expect("memory"));
        m.write(0, &vec![fill; REGION]).expect("inside");
        m
    };
    let src = a
        .mem
        .register_iova(map(0xa5), 0, REGION, 0x7f00_0000_0000, Access::ALL)
        .expect("A registers");
    let dst = b
        .mem
        .register_iova(map(0), 0, REGION, 0x7f10_0000_0000, Access::ALL)
        .expect("B registers");
    Pair {
        a,
        b,
        qp,
        cq,
        _b_cq: b_cq,
        src,
        dst,
        buf: vec![0; 16384],
        wcs: [WorkCompletion::EMPTY; 64],
        now: 0,
    }
}

impl Pair {
    /// 32 WRITEs of `size` bytes, built once (outside the measured loop).
    fn requests(&self, size: u32) -> Vec<WorkRequest> {
        (0..32u64)
            .map(|i| {
                WorkRequest::write(
                    i,
                    SgList::one(self.src.lkey, 0x7f00_0000_0000 + i * 8192, size),
                    0x7f10_0000_0000 + i * 8192,
                    self.dst.rkey,
                    None,
                )
            })
            .collect()
    }

    /// Posts `wrs` and runs both engines until A has their completions.
    fn writes(&mut self, wrs: &[WorkRequest]) {
        let n = wrs.len();
        self.qp.post_send(wrs).expect("room");
        let mut done = 0;
        while done < n {
            self.now += 1_000;
            self.a.service(self.now);
            while let Some(tx) = self.a.poll_transmit(self.now) {
                let len = self.a.emit(&tx, &mut self.buf).expect("emits");
                self.b.receive(self.now, &self.buf[..len]);
            }
            self.b.service(self.now);
            while let Some(tx) = self.b.poll_transmit(self.now) {
                let len = self.b.emit(&tx, &mut self.buf).expect("emits");
                self.a.receive(self.now, &self.buf[..len]);
            }
            self.a.flush_completions();
            done += self.cq.poll(&mut self.wcs);
        }
    }

    /// The frame A sends for one WRITE of `size` bytes (B does not see it).
    fn write_frame(&mut self, size: u32) -> Vec<u8> {
        let wr = WorkRequest::write(
            0,
            SgList::one(self.src.lkey, 0x7f00_0000_0000, size),
            0x7f10_0000_0000,
            self.dst.rkey,
            None,
        );
        self.qp.post_send(&[wr]).expect("room");
        self.now += 1_000;
        self.a.service(self.now);
        let tx = self.a.poll_transmit(self.now).expect("a frame");
        let len = self.a.emit(&tx, &mut self.buf).expect("emits");
        self.buf[..len].to_vec()
    }
}

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
}

criterion_group!(benches, bench);
criterion_main!(benches);
