//! Fault injection on the dataplane: two RDMA engines over `net_ring` with 1 % each of drop,
//! duplicate, reorder and corrupt on both receive paths. Mixed SEND/WRITE/READ of 1 B to
//! 64 KiB all complete exactly once and successfully, and so does the receive each SEND
//! consumes; the application's memory on both sides (its own mappings) is compared byte for
//! byte with a sequential model of the operations; and every corrupted frame shows up as
//! exactly one ICRC error.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::{QPN_A, QPN_B, pattern, start};
use pmem::Mapping;
use portico::rdma::Cq;
use portico::runtime::FaultConfig;
use portico::transport::{
    Access, QpConfig, RecvRequest, WcOpcode, WcStatus, WorkCompletion, WorkRequest,
};

/// The 100 000 operations by default in the release profile, which `make test` runs
/// this test in too (about 7 s there on 2 cores, 64 s in a debug build); 10 000 in a debug
/// build, enough for the debug assertions and overflow checks to see every kind of fault
/// many times over. `PORTICO_FAULT_OPS=N` sets the count in either.
fn ops() -> u64 {
    std::env::var("PORTICO_FAULT_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            10_000
        } else {
            100_000
        })
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
    let mapping = || Arc::new(Mapping::anonymous(region).expect("anonymous memory"));
    // A: the source of WRITEs and SENDs, and where READs land.
    let (src_map, back_map) = (mapping(), mapping());
    let src = p.a.engine.register_all(&src_map, Access::ALL).unwrap();
    let back = p.a.engine.register_all(&back_map, Access::ALL).unwrap();
    // B: the target of WRITEs, the source of READs, and the receive buffers.
    let (wdst_map, rsrc_map, rbuf_map) = (mapping(), mapping(), mapping());
    let wdst = p.b.engine.register_all(&wdst_map, Access::ALL).unwrap();
    let rsrc = p.b.engine.register_all(&rsrc_map, Access::ALL).unwrap();
    let rbuf =
        p.b.engine
            .register_all(&rbuf_map, Access::LOCAL_WRITE)
            .unwrap();
    let a_data = pattern(region, 11);
    let b_data = pattern(region, 22);
    src_map.write(0, &a_data).unwrap();
    rsrc_map.write(0, &b_data).unwrap();

    // What each region must hold at the end: operations applied in posting order. (A slot is
    // reused by the same kind of operation only every 96 operations, twice the window, so two
    // operations on the same bytes are never outstanding together.)
    let mut want_wdst = vec![0u8; region];
    let mut want_back = vec![0u8; region];
    let mut want_rbuf = vec![0u8; region];
    // A's requests outstanding, and B's receives posted and not completed: wr_id → length.
    let mut outstanding = HashMap::new();
    let mut posted = HashMap::new();
    let (mut done, mut sends, mut received) = (0u64, 0u64, 0u64);
    let mut rng = 0x1234_5678_9abc_def1u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let total = ops();
    for op in 0..total {
        while outstanding.len() as u64 >= WINDOW {
            complete_one(&mut p.a.cq, &mut outstanding);
            done += 1;
            received += reap_receives(&mut p.b.cq, &mut posted);
        }
        let len = 1 + (next() % SLOT as u64) as usize;
        let slot = (op as usize % SLOTS) * SLOT;
        let from = (next() % (region - len) as u64) as usize;
        let wr = match op % 3 {
            0 => {
                want_wdst[slot..slot + len].copy_from_slice(&a_data[from..from + len]);
                WorkRequest::write(
                    op,
                    src.sgl(from, len as u32),
                    wdst.addr() + slot as u64,
                    wdst.rkey(),
                    None,
                )
            }
            1 => {
                want_back[slot..slot + len].copy_from_slice(&b_data[from..from + len]);
                WorkRequest::read(
                    op,
                    back.sgl(slot, len as u32),
                    rsrc.addr() + from as u64,
                    rsrc.rkey(),
                )
            }
            _ => {
                want_rbuf[slot..slot + len].copy_from_slice(&a_data[from..from + len]);
                // The receive is posted on B's queue pair before the SEND on A's. B's worker
                // takes it the next time it serves its rings; should the SEND still arrive
                // first, B answers RNR and A sends it again.
                p.b.qp
                    .post_recv(&[RecvRequest::new(op, rbuf.sgl(slot, SLOT as u32))])
                    .unwrap();
                posted.insert(op, len as u32);
                sends += 1;
                WorkRequest::send(op, src.sgl(from, len as u32), None)
            }
        };
        p.a.qp.post_send(&[wr]).unwrap();
        outstanding.insert(op, (wr.wc_opcode(), len as u32));
    }
    while !outstanding.is_empty() {
        complete_one(&mut p.a.cq, &mut outstanding);
        done += 1;
        received += reap_receives(&mut p.b.cq, &mut posted);
    }
    // Every SEND has completed, so its receive has (or is about to).
    while !posted.is_empty() {
        let wc = p.b.cq.wait_one(WAIT).unwrap_or_else(|| {
            panic!("{} receives never completed", posted.len());
        });
        check_receive(&wc, &mut posted);
        received += 1;
    }
    assert_eq!(done, total);
    assert_eq!(received, sends, "one receive completion per SEND");
    assert_eq!(
        p.a.cq.poll_one(),
        None,
        "no completion beyond one per operation"
    );
    assert_eq!(
        p.b.cq.poll_one(),
        None,
        "no completion beyond one per receive"
    );

    // The bytes, in each side's own mappings.
    let whole = |m: &Mapping| {
        let mut v = vec![0u8; region];
        m.read(0, &mut v).unwrap();
        v
    };
    assert!(whole(&wdst_map) == want_wdst, "WRITE targets differ");
    assert!(whole(&back_map) == want_back, "READ results differ");
    assert!(whole(&rbuf_map) == want_rbuf, "SEND receive buffers differ");
    assert!(
        whole(&src_map) == a_data && whole(&rsrc_map) == b_data,
        "sources unchanged"
    );

    let reports = p.runtime.join().expect("workers ran without failure");
    common::fault_totals(&reports).check();
}

/// Waits for one of A's completions: successful, of an outstanding request, with its opcode
/// and length.
fn complete_one(cq: &mut Cq, outstanding: &mut HashMap<u64, (WcOpcode, u32)>) {
    let wc = cq.wait_one(WAIT).expect("a completion within 30 s");
    assert_eq!((wc.status, wc.qpn), (WcStatus::Success, QPN_A), "{wc:?}");
    let Some((opcode, len)) = outstanding.remove(&wc.wr_id) else {
        panic!("completed twice or never posted: {wc:?}");
    };
    assert_eq!((wc.opcode, wc.byte_len), (opcode, len), "{wc:?}");
}

/// Takes B's receive completions that are there (B's completion queue never fills); returns
/// how many.
fn reap_receives(cq: &mut Cq, posted: &mut HashMap<u64, u32>) -> u64 {
    let mut wcs = [WorkCompletion::EMPTY; 64];
    let n = cq.poll(&mut wcs);
    for wc in &wcs[..n] {
        check_receive(wc, posted);
    }
    n as u64
}

/// A receive completed once, successfully, with the length of the SEND that consumed it.
fn check_receive(wc: &WorkCompletion, posted: &mut HashMap<u64, u32>) {
    assert_eq!(
        (wc.status, wc.opcode, wc.qpn),
        (WcStatus::Success, WcOpcode::Recv, QPN_B),
        "{wc:?}"
    );
    let Some(len) = posted.remove(&wc.wr_id) else {
        panic!("receive completed twice or never posted: {wc:?}");
    };
    assert_eq!(wc.byte_len, len, "{wc:?}");
}
