//! Congestion control on the dataplane: two flows (queue pairs) between two engines on a
//! `net_ring` link, through a bottleneck in front of the target's receive path (2 Gbit/s, a
//! 20 µs delay, ECN marking between Kmin and Kmax), under each scheme. The flows first send
//! together (twice what the bottleneck serves), then the first goes on alone.
//!
//! - `ack`: the target's ACKs carry the level (BECN and a CETH); the senders' rates go down
//!   from the line rate while they compete, and the one left alone is back at the line rate
//!   at the end. Nothing is dropped and every byte lands.
//! - `dcqcn`: the target sends CNPs and the senders cut.
//! - `none`: packets are marked, nobody is told, nobody slows down.
//!
//! No timing is asserted: what the run shows is read from the counters, the senders'
//! controllers' own counters and rates when the worker stopped.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bench::bottleneck::BottleneckConfig;
use bench::instrument::{BottleneckSpec, IngressReport};
use common::{host_on_first_core, pattern, serial, shared_eal};
use pmem::Mapping;
use portico::cc::{CcConfig, CcMode};
use portico::rdma::loopback::{self, LoopbackOpts};
use portico::rdma::{Cq, Qp};
use portico::runtime::WorkerReport;
use portico::transport::{Access, Mtu, QpConfig, SgList, WcStatus, WorkRequest};

const LINE: u64 = 2_000_000_000;
const MSG: usize = 64 << 10;
/// Messages each flow sends while both compete, and flow 0 alone afterwards.
const TOGETHER: usize = 24;
const ALONE: usize = 24;
const WAIT: Duration = Duration::from_secs(30);

struct Outcome {
    workers: Vec<WorkerReport>,
    report: IngressReport,
}

fn counter(o: &Outcome, name: &str) -> u64 {
    o.workers.iter().filter_map(|w| w.counter(name)).sum()
}

/// Posts `n` WRITEs of `MSG` bytes from slot `first` on, on `qp`.
fn post(qp: &mut Qp, src: u32, src_addr: u64, dst_addr: u64, rkey: u32, first: usize, n: usize) {
    for k in first..first + n {
        let off = (k * MSG) as u64;
        let wr = WorkRequest::write(
            k as u64,
            SgList::one(src, src_addr + off, MSG as u32),
            dst_addr + off,
            rkey,
            None,
        );
        while qp.post_send(&[wr]).is_err() {
            std::thread::yield_now();
        }
    }
}

fn wait_all(cq: &mut Cq, n: usize) {
    for i in 0..n {
        let wc = cq
            .wait_one(WAIT)
            .unwrap_or_else(|| panic!("completion {i} of {n} within {WAIT:?}"));
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
}

fn run(mode: CcMode, name: &str) -> Outcome {
    let _one = serial();
    let cores = shared_eal();
    host_on_first_core();
    let mut qp = QpConfig::new(0, 0);
    qp.pmtu = Mtu::M4096;
    qp.max_send_wr = 64;
    qp.cc = CcConfig {
        mode,
        line_rate_bps: LINE,
        ..CcConfig::default()
    };
    let slot = Arc::new(Mutex::new(None));
    let mut opts = LoopbackOpts::new(qp, [*cores.last().unwrap(); 2]);
    opts.name = name.into();
    opts.connections = 2;
    opts.cq_depth = 128;
    let bottleneck = BottleneckSpec {
        config: BottleneckConfig {
            delay_ns: 20_000,
            ..BottleneckConfig::for_rate(LINE)
        },
        capacity: 4096,
        trace: Some((1_000, 200_000)),
        report: slot.clone(),
    };
    opts.wrap = Some(
        bottleneck
            .wrap(opts.connections, None)
            .expect("a bottleneck"),
    );
    let pair = loopback::start(&opts).expect("engines start");
    let per_flow = (TOGETHER + ALONE) * MSG;
    let a_map = Arc::new(Mapping::anonymous(2 * per_flow).unwrap());
    let b_map = Arc::new(Mapping::anonymous(2 * per_flow).unwrap());
    for f in 0..2 {
        a_map
            .write(f * per_flow, &pattern(per_flow, f as u64 + 1))
            .unwrap();
    }
    let src = pair.a.engine.register_all(&a_map, Access::ALL).unwrap();
    let dst = pair.b.engine.register_all(&b_map, Access::ALL).unwrap();
    let (mut qa, mut ca) = (pair.a.qp, pair.a.cq);
    let mut more = pair.more;
    let c1 = more.remove(0);
    let (mut qb, mut cb) = (c1.a.qp, c1.a.cq);
    let base = |f: usize| {
        (
            src.addr() + (f * per_flow) as u64,
            dst.addr() + (f * per_flow) as u64,
        )
    };
    // Both flows at once, then flow 0 alone.
    let (s0, d0) = base(0);
    let (s1, d1) = base(1);
    post(&mut qa, src.lkey(), s0, d0, dst.rkey(), 0, TOGETHER);
    post(&mut qb, src.lkey(), s1, d1, dst.rkey(), 0, TOGETHER);
    wait_all(&mut ca, TOGETHER);
    wait_all(&mut cb, TOGETHER);
    post(&mut qa, src.lkey(), s0, d0, dst.rkey(), TOGETHER, ALONE);
    wait_all(&mut ca, ALONE);
    // Every byte of both flows landed where it was written to.
    for f in 0..2 {
        let len = if f == 0 { per_flow } else { TOGETHER * MSG };
        let mut got = vec![0u8; len];
        b_map.read(f * per_flow, &mut got).unwrap();
        assert!(
            got == pattern(per_flow, f as u64 + 1)[..len],
            "flow {f}'s bytes landed"
        );
    }
    let workers = pair.runtime.join().expect("workers stop");
    let report = slot
        .lock()
        .unwrap()
        .take()
        .expect("the bottleneck's report");
    Outcome { workers, report }
}

/// Per flow, the controller rates the trace saw (bins where one was seen).
fn rates(o: &Outcome, flow: usize) -> Vec<u64> {
    o.report
        .rates
        .chunks(2)
        .map(|row| row[flow])
        .filter(|&r| r > 0)
        .collect()
}

#[test]
fn ack_carries_the_congestion_and_the_senders_follow_it() {
    let o = run(CcMode::Ack, "cgack");
    let b = o.report.counters;
    assert!(b.marked > 0, "the bottleneck marked: {b:?}");
    assert_eq!(b.dropped, 0, "nothing dropped: {b:?}");
    // The benches' wrapper publishes the bottleneck's marks and drops after the engine's own
    // counters (the library's stage has no such counters).
    assert_eq!(counter(&o, "bottleneck_marked"), b.marked);
    assert_eq!(counter(&o, "bottleneck_dropped"), b.dropped);
    assert!(counter(&o, "ce_received") > 0);
    assert!(counter(&o, "becn_acks_sent") > 0, "congested ACKs went out");
    assert_eq!(counter(&o, "cnps_sent"), 0);
    // Each sender heard the congestion and changed its rate, and went back to its line rate
    // on a clear ACK.
    for (f, (stats, _)) in o.report.senders.iter().enumerate() {
        assert!(stats.congestion_signals > 0, "flow {f} was told: {stats:?}");
        assert!(stats.rate_changes > 0, "flow {f} slowed down: {stats:?}");
        assert!(stats.restores > 0, "flow {f} restored: {stats:?}");
    }
    // Where the trace saw flow 0 slower, it saw it back at its line rate afterwards. (The
    // trace samples once per worker iteration, so a slowdown that a burst of ACKs began and
    // ended within one iteration is in the counters above but not in the trace: CI saw that
    // once. Its rate when the worker stopped is not asserted either: alone at the
    // bottleneck's own rate, a burst after the worker was descheduled queues past Kmin, and
    // the last ACK may carry that; it did in about one run in five in debug builds.)
    let trace = rates(&o, 0);
    if let Some(slower) = trace.iter().position(|&x| x < LINE) {
        assert!(
            trace[slower..].contains(&LINE),
            "the trace saw flow 0 back at its line rate after it was slower: {:?}",
            &trace[slower..]
        );
    }
}

#[test]
fn dcqcn_answers_marks_with_cnps_and_the_senders_cut() {
    let o = run(CcMode::Dcqcn, "cgdcqcn");
    assert!(o.report.counters.marked > 0);
    let sent = counter(&o, "cnps_sent");
    assert!(sent > 0, "CNPs went out");
    assert_eq!(
        counter(&o, "cnps_received"),
        sent,
        "and each reached its sender"
    );
    assert_eq!(counter(&o, "becn_acks_sent"), 0);
    for (f, (stats, _)) in o.report.senders.iter().enumerate() {
        assert!(stats.congestion_signals > 0, "flow {f} got CNPs: {stats:?}");
        assert!(stats.rate_changes > 0, "flow {f} cut: {stats:?}");
    }
}

#[test]
fn without_congestion_control_marks_change_nothing() {
    let o = run(CcMode::None, "cgnone");
    assert!(o.report.counters.marked > 0);
    assert!(counter(&o, "ce_received") > 0);
    assert_eq!(counter(&o, "becn_acks_sent") + counter(&o, "cnps_sent"), 0);
    assert!(o.report.rates.iter().all(|&r| r == 0), "no controller");
    assert!(o.report.senders.iter().all(|(_, rate)| rate.is_none()));
}
