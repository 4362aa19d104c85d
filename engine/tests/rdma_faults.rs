//! Fault injection on the dataplane: two RDMA engines over `net_ring` with 1 % each of drop,
//! duplicate, reorder and corrupt on both receive paths. Mixed SEND/WRITE/READ of 1 B to
//! 64 KiB all complete exactly once and successfully; the memory of both sides is compared
//! byte for byte with a sequential model of the operations; and every corrupted frame shows up
//! as exactly one ICRC error.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{QPN_A, QPN_B, pattern, start};
use portico::runtime::FaultConfig;
use portico::transport::{Access, QpConfig, RecvRequest, WcStatus, WorkRequest, WrKind};

/// The 100 000 operations by default (about 95 s in a debug build, 10 s in release);
/// `PORTICO_FAULT_OPS=2000` gives a quick run.
fn ops() -> u64 {
    std::env::var("PORTICO_FAULT_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}
const SLOT: usize = 64 * 1024;
const SLOTS: usize = 32;
const WINDOW: u64 = 48;
const WAIT: Duration = Duration::from_secs(30);

#[test]
fn mixed_operations_survive_faults_exactly_once() {
    let faults = FaultConfig {
        seed: 2026,
        drop: 0.01,
        duplicate: 0.01,
        reorder: 0.01,
        corrupt: 0.01,
    };
    let mut cfg = QpConfig::new(0, 0);
    cfg.pmtu = portico::transport::Mtu::M4096;
    // As `portico bench` does: a window of 64 KiB READ responses can take longer than the
    // 100 µs default to drain through one software core, and spurious timeouts must not
    // exhaust the retry limit of a healthy connection.
    cfg.timeout_ns = 1_000_000;
    let mut p = start(cfg, Some(faults));
    let region = SLOT * SLOTS;
    // A: the source of WRITEs and SENDs, and where READs land.
    let src = p.a.register(0x100_0000, region, Access::ALL).unwrap();
    let back = p.a.register(0x800_0000, region, Access::ALL).unwrap();
    // B: the target of WRITEs, the source of READs, and the receive buffers.
    let wdst = p.b.register(0x400_0000, region, Access::ALL).unwrap();
    let rsrc = p.b.register(0xc00_0000, region, Access::ALL).unwrap();
    let rbuf =
        p.b.register(0x1000_0000, region, Access::LOCAL_WRITE)
            .unwrap();
    let a_data = pattern(region, 11);
    let b_data = pattern(region, 22);
    p.a.write(src.lkey, 0, &a_data).unwrap();
    p.b.write(rsrc.lkey, 0, &b_data).unwrap();

    // What each region must hold at the end: operations applied in posting order.
    let mut want_wdst = vec![0u8; region];
    let mut want_back = vec![0u8; region];
    let mut want_rbuf = vec![0u8; region];
    let mut outstanding = HashSet::new();
    let mut done = 0u64;
    let mut rng = 0x1234_5678_9abc_def1u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let complete_one = |p: &mut common::Pair, outstanding: &mut HashSet<u64>| {
        let wc = p.a.wait(WAIT).unwrap().expect("a completion within 30 s");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        assert!(
            outstanding.remove(&wc.wr_id),
            "completed twice or never posted: {wc:?}"
        );
    };
    let total = ops();
    for op in 0..total {
        while outstanding.len() as u64 >= WINDOW {
            complete_one(&mut p, &mut outstanding);
            done += 1;
        }
        let len = 1 + (next() % SLOT as u64) as usize;
        let slot = (op as usize % SLOTS) * SLOT;
        let from = (next() % (region - len) as u64) as usize;
        let kind = match op % 3 {
            0 => {
                want_wdst[slot..slot + len].copy_from_slice(&a_data[from..from + len]);
                (
                    WrKind::Write {
                        remote_addr: 0x400_0000 + slot as u64,
                        rkey: wdst.rkey,
                        imm: None,
                    },
                    src.lkey,
                    0x100_0000 + from as u64,
                )
            }
            1 => {
                want_back[slot..slot + len].copy_from_slice(&b_data[from..from + len]);
                (
                    WrKind::Read {
                        remote_addr: 0xc00_0000 + from as u64,
                        rkey: rsrc.rkey,
                    },
                    back.lkey,
                    0x800_0000 + slot as u64,
                )
            }
            _ => {
                want_rbuf[slot..slot + len].copy_from_slice(&a_data[from..from + len]);
                p.b.post_recv(
                    QPN_B,
                    RecvRequest {
                        wr_id: op,
                        lkey: rbuf.lkey,
                        addr: 0x1000_0000 + slot as u64,
                        len: SLOT as u32,
                    },
                )
                .unwrap();
                // A round trip to B's worker: the receive is posted before the SEND can arrive.
                p.b.read(rbuf.lkey, 0, 1).unwrap();
                (
                    WrKind::Send { imm: None },
                    src.lkey,
                    0x100_0000 + from as u64,
                )
            }
        };
        let (kind, lkey, local_addr) = kind;
        p.a.post_send(
            QPN_A,
            WorkRequest {
                wr_id: op,
                kind,
                lkey,
                local_addr,
                len: len as u32,
            },
        )
        .unwrap();
        outstanding.insert(op);
    }
    while !outstanding.is_empty() {
        complete_one(&mut p, &mut outstanding);
        done += 1;
    }
    assert_eq!(done, total);
    assert!(
        p.a.poll().unwrap().is_none(),
        "no completion beyond one per operation"
    );

    assert!(
        p.b.read(wdst.lkey, 0, region).unwrap() == want_wdst,
        "WRITE targets differ"
    );
    assert!(
        p.a.read(back.lkey, 0, region).unwrap() == want_back,
        "READ results differ"
    );
    assert!(
        p.b.read(rbuf.lkey, 0, region).unwrap() == want_rbuf,
        "SEND receive buffers differ"
    );

    let reports = p.runtime.join().expect("workers ran without failure");
    let (mut corrupted, mut icrc, mut dropped, mut retx) = (0, 0, 0, 0);
    for r in &reports {
        eprintln!(
            "{}: faults {:?}, counters {:?}",
            r.worker, r.faults, r.counters
        );
        corrupted += r.faults.corrupted;
        dropped += r.faults.dropped;
        icrc += r.counter("icrc_errors").unwrap();
        retx += r.counter("retransmissions").unwrap();
        assert_eq!(r.counter("malformed"), Some(0));
    }
    assert!(corrupted > 0 && dropped > 0, "faults were injected");
    assert_eq!(
        icrc, corrupted,
        "every corrupted frame is exactly one ICRC error"
    );
    assert!(retx > 0, "losses were repaired by retransmission");
}
