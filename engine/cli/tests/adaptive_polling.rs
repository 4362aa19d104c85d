//! Adaptive polling on real EAL (issue 16): two RDMA engines on one worker over a `net_ring`
//! link, the worker running `adaptive`. The host pauses between batches of WRITE+READ pairs,
//! so the worker backs off and sleeps; every batch must still complete with the right bytes
//! read back, the posts that found it asleep must have woken it (counted), and with packets
//! dropped on the wire every loss must still be repaired by retransmission. (That a sleep
//! never runs past the retransmission timer is shown where it is decided, without timing:
//! `runtime::polling` and `rdma::node`'s outlook test.)
//!
//! No timing is asserted: the counters say what the worker did.

mod common;

use std::sync::Arc;
use std::time::Duration;

use pmem::Mapping;
use portico::rdma::loopback::{self, LoopbackOpts};
use portico::runtime::{FaultConfig, Polling, WorkerReport};
use portico::transport::{Access, QpConfig, WcOpcode, WcStatus, WorkRequest};

const WAIT: Duration = Duration::from_secs(20);
const MSG: usize = 2048;
const BATCHES: usize = 6;
const PER_BATCH: usize = 25;

fn adaptive_pair(name: &str, faults: Option<FaultConfig>) -> loopback::LoopbackPair {
    let cores = common::cores();
    let core = *cores.last().unwrap();
    let mut opts = LoopbackOpts::new(QpConfig::new(0, 0), [core, core]);
    opts.name = name.into();
    opts.faults = faults;
    opts.polling = Polling::Adaptive {
        max_sleep_ns: 200_000,
    };
    loopback::start(&opts).expect("two engines start")
}

/// Runs `BATCHES` batches of `PER_BATCH` WRITE+READ pairs at queue depth 1, the host idle for
/// 20 ms between batches; checks every completion and every byte read back. Returns the
/// worker's report.
fn pairs_with_pauses(mut p: loopback::LoopbackPair) -> WorkerReport {
    let a_map = Arc::new(Mapping::anonymous(1 << 20).unwrap());
    let b_map = Arc::new(Mapping::anonymous(1 << 20).unwrap());
    let src =
        p.a.engine
            .register(&a_map, 0, 256 << 10, Access::ALL)
            .unwrap();
    let back =
        p.a.engine
            .register(&a_map, 512 << 10, 256 << 10, Access::ALL)
            .unwrap();
    let dst =
        p.b.engine
            .register(&b_map, 0, 256 << 10, Access::ALL)
            .unwrap();
    for batch in 0..BATCHES {
        // The worker has been idle: it sleeps when this batch's first post comes.
        std::thread::sleep(Duration::from_millis(20));
        for k in 0..PER_BATCH {
            let i = batch * PER_BATCH + k;
            let at = (i % 64) * MSG;
            let data = common::pattern(MSG, i as u64);
            a_map.write(at, &data).unwrap();
            let w = WorkRequest::write(
                2 * i as u64,
                src.sgl(at, MSG as u32),
                dst.addr() + at as u64,
                dst.rkey(),
                None,
            );
            let r = WorkRequest::read(
                2 * i as u64 + 1,
                back.sgl(at, MSG as u32),
                dst.addr() + at as u64,
                dst.rkey(),
            );
            p.a.qp.post_send(&[w, r]).unwrap();
            for (want, op) in [
                (2 * i as u64, WcOpcode::RdmaWrite),
                (2 * i as u64 + 1, WcOpcode::RdmaRead),
            ] {
                let wc =
                    p.a.cq
                        .wait_one(WAIT)
                        .unwrap_or_else(|| panic!("pair {i}: {op:?} completes within {WAIT:?}"));
                assert_eq!(
                    (wc.wr_id, wc.opcode, wc.status),
                    (want, op, WcStatus::Success)
                );
            }
            let mut got = vec![0u8; MSG];
            a_map.read((512 << 10) + at, &mut got).unwrap();
            assert!(got == data, "pair {i}: the READ brought back other bytes");
        }
    }
    let reports = p.runtime.join().expect("the worker ran");
    assert_eq!(reports.len(), 1, "both engines on one worker");
    reports.into_iter().next().unwrap()
}

#[test]
fn an_adaptive_worker_sleeps_between_batches_and_every_pair_completes() {
    let _one = common::serial();
    common::shared_eal();
    common::host_on_first_core();
    let r = pairs_with_pauses(adaptive_pair("adaptive", None));
    let i = r.idle;
    // It slept (20 ms pauses, 200 µs sleeps: at least one sleep per pause), and the time it
    // slept is accounted for.
    assert!(i.slept >= BATCHES as u64, "{i:?}");
    assert!(i.sleep_taken_ns > 0 && i.sleep_asked_ns > 0, "{i:?}");
    assert_eq!(
        i.timeouts + i.host_wakes + i.skipped,
        i.slept,
        "each sleep ended one way: {i:?}"
    );
    // Each batch's first post found it asleep, and the host's eventfd write woke it (a post
    // landing just as the worker raised its flags is counted as skipped instead: rare).
    assert!(i.host_wakes >= BATCHES as u64 / 2, "{i:?}");
    assert!(i.wakeups >= BATCHES as u64, "{i:?}");
    assert!(i.busy > 0 && i.backed_off > 0, "{i:?}");
    assert_eq!(r.counter("retransmissions"), Some(0), "{r:?}");

    // 5 % of the frames dropped: every loss is repaired by retransmission under adaptive
    // polling too.
    let lossy = FaultConfig {
        seed: 16,
        drop: 0.05,
        duplicate: 0.0,
        reorder: 0.0,
        corrupt: 0.0,
    };
    let r = pairs_with_pauses(adaptive_pair("adaptive_lossy", Some(lossy)));
    assert!(r.faults.dropped > 0, "{r:?}");
    assert!(r.counter("retransmissions").unwrap() > 0, "{r:?}");
    assert!(r.idle.slept > 0, "{:?}", r.idle);
}

#[test]
fn a_busy_worker_never_backs_off() {
    // The default policy: the idle counters stay at zero.
    let _one = common::serial();
    common::shared_eal();
    let cores = common::cores();
    let core = *cores.last().unwrap();
    let mut opts = LoopbackOpts::new(QpConfig::new(0, 0), [core, core]);
    opts.name = "busy".into();
    let p = loopback::start(&opts).expect("two engines start");
    std::thread::sleep(Duration::from_millis(50));
    let r = p.runtime.join().unwrap();
    assert_eq!(r[0].idle, Default::default());
    assert!(r[0].io.empty_polls > 0);
}
