//! Nothing allocates per operation, on the host or on the worker: after a warm-up, 100 000
//! mixed RDMA WRITE, READ and SEND operations between two engines on a `net_ring` link (real
//! EAL, one worker running both engines, the host loop on this thread) make zero heap
//! allocations in the whole process. A counting global allocator (`stats_alloc`, whose
//! counters are shared by every thread) sees the worker's allocations as well as the host's.

mod common;

use std::alloc::System;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pmem::Mapping;
use portico::rdma::loopback::{self, LoopbackOpts};
use portico::transport::{Access, QpConfig, RecvRequest, WcStatus, WorkCompletion, WorkRequest};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const SIZE: u32 = 256;
const SLOTS: usize = 256;
const QD: usize = 32;

#[test]
fn mixed_operations_allocate_nothing_after_warm_up() {
    let last = *common::start_eal().last().unwrap();
    let mut qp = QpConfig::new(0, 0);
    qp.timeout_ns = 5_000_000;
    let mut pair = loopback::start(&LoopbackOpts::new(qp, [last, last])).expect("engines start");

    let len = SLOTS * SIZE as usize;
    let map = |n: usize| Arc::new(Mapping::anonymous(n).unwrap());
    let (a_src, a_dst, b_buf, b_recv) = (map(len), map(len), map(len), map(len));
    let src = pair.a.engine.register_all(&a_src, Access::ALL).unwrap();
    let dst = pair.a.engine.register_all(&a_dst, Access::ALL).unwrap();
    let remote = pair.b.engine.register_all(&b_buf, Access::ALL).unwrap();
    let recv = pair
        .b
        .engine
        .register_all(&b_recv, Access::LOCAL_WRITE)
        .unwrap();

    let mut wcs = [WorkCompletion::EMPTY; 64];
    let mut batch: Vec<WorkRequest> = Vec::with_capacity(QD);
    let mut recvs: Vec<RecvRequest> = Vec::with_capacity(QD * 2);
    let mut run = |ops: u64| -> (u64, u64) {
        let (mut next, mut done, mut received, mut recv_posted, mut sends) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut outstanding = 0usize;
        let deadline = Instant::now() + Duration::from_secs(120);
        while done < ops || received < sends {
            assert!(Instant::now() < deadline, "{done} of {ops} done in 120 s");
            batch.clear();
            while outstanding + batch.len() < QD && next < ops {
                let slot = (next as usize % SLOTS) * SIZE as usize;
                let raddr = remote.addr() + slot as u64;
                batch.push(match next % 3 {
                    0 => WorkRequest::write(next, src.sgl(slot, SIZE), raddr, remote.rkey(), None),
                    1 => WorkRequest::read(next, dst.sgl(slot, SIZE), raddr, remote.rkey()),
                    _ => {
                        sends += 1;
                        WorkRequest::send(next, src.sgl(slot, SIZE), None)
                    }
                });
                next += 1;
            }
            recvs.clear();
            while recv_posted < sends + QD as u64 && recvs.len() < recvs.capacity() {
                let slot = (recv_posted as usize % SLOTS) * SIZE as usize;
                recvs.push(RecvRequest::new(recv_posted, recv.sgl(slot, SIZE)));
                recv_posted += 1;
            }
            if let Err(full) = pair.b.qp.post_recv(&recvs) {
                recv_posted -= (recvs.len() - full.posted) as u64;
            }
            if !batch.is_empty() {
                pair.a.qp.post_send(&batch).expect("room for the batch");
                outstanding += batch.len();
            }
            let n = pair.a.cq.poll(&mut wcs);
            for wc in &wcs[..n] {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                outstanding -= 1;
                done += 1;
            }
            let n = pair.b.cq.poll(&mut wcs);
            for wc in &wcs[..n] {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                received += 1;
            }
        }
        (done, received)
    };

    // Warm-up: rings, queues, heaps and mempool caches reach their working sizes.
    run(3_000);
    let region = Region::new(GLOBAL);
    let (done, received) = run(100_000);
    let change = region.change();
    assert_eq!(done, 100_000);
    assert_eq!(received, 33_333, "one receive completion per SEND");
    assert_eq!(
        (change.allocations, change.reallocations),
        (0, 0),
        "heap allocations during 100 000 operations: {change:?}"
    );
    let reports = pair.runtime.join().unwrap();
    let retx: u64 = reports
        .iter()
        .filter_map(|r| r.counter("retransmissions"))
        .sum();
    eprintln!("allocations {change:?}, retransmissions {retx}");
}
