//! The CM under the dataplane's fault injector: two engines over `net_ring`, with 10 % each of
//! drop, duplicate and reorder (and 2 % corrupt) on both receive paths, QP1's frames and ARP
//! included. Thirty connections, one after the other: each ends in exactly one connection on
//! both sides, or in a clean end on both (the active side timed out or was rejected, the
//! passive side keeps nothing), and each connection made is then torn down on both sides.
//! Afterwards both engines hold no queue pair of the CM's: as many destroyed as created.

mod common;

use std::time::{Duration, Instant};

use portico::rdma::cm::{CmEvents, ConnEvent};
use portico::rdma::loopback::{self, LoopbackOpts};
use portico::runtime::FaultConfig;
use portico::transport::QpConfig;

const PORT: u16 = 7471;
const CONNECTIONS: usize = 30;
/// Long enough for every retry of a REQ and a REP at the shortened timers.
const OUTCOME: Duration = Duration::from_secs(20);

#[derive(Default, Debug)]
struct Side {
    established: usize,
    ended: usize,
    failed: usize,
}

fn take(events: &CmEvents, side: &mut Side, accept: &mut Vec<u32>) {
    while let Some(ev) = events.poll() {
        match ev {
            ConnEvent::Request(r) => accept.push(r.id),
            ConnEvent::Established { .. } => side.established += 1,
            ConnEvent::Disconnected { .. } => side.ended += 1,
            ConnEvent::TimedOut { .. }
            | ConnEvent::Rejected { .. }
            | ConnEvent::Unreachable { .. } => side.failed += 1,
        }
    }
}

#[test]
fn lost_repeated_reordered_and_corrupted_cm_frames_end_in_one_connection_or_a_clean_end() {
    let cores = common::start_eal();
    let core = *cores.last().unwrap();
    let lo = LoopbackOpts {
        cm: true,
        // 67 ms and two packet life times per try.
        cm_response_timeout: 14,
        name: "cmf".into(),
        faults: Some(FaultConfig {
            seed: 30,
            drop: 0.10,
            duplicate: 0.10,
            reorder: 0.10,
            corrupt: 0.02,
        }),
        ..LoopbackOpts::new(QpConfig::new(0x11, 0x22), [core, core])
    };
    let pair = loopback::start(&lo).expect("the engines");
    let [(ev_a, _), (ev_b, _)] = pair.cm.as_ref().unwrap();
    let (a, b) = (&pair.a.engine, &pair.b.engine);
    b.listen(PORT).unwrap();
    let (mut sa, mut sb) = (Side::default(), Side::default());
    let mut made = 0;
    for k in 0..CONNECTIONS {
        let id = a.connect(loopback::IP_B, PORT, &[k as u8]).unwrap();
        let before = (sa.established + sa.failed, sb.established, sb.failed);
        let t0 = Instant::now();
        // Until A knows (established, or failed) and B has settled the same way.
        loop {
            let mut accept = Vec::new();
            take(ev_a, &mut sa, &mut accept);
            take(ev_b, &mut sb, &mut accept);
            for id in accept {
                // The request may have timed out meanwhile: then the accept fails.
                let _ = b.accept(id, &[]);
            }
            let a_knows = sa.established + sa.failed > before.0;
            let a_up = sa.established > made;
            let b_up = sb.established > before.1;
            let b_failed = sb.failed > before.2;
            if a_knows
                && (a_up == b_up)
                && (a_up || b_failed || t0.elapsed() > Duration::from_secs(3))
            {
                break;
            }
            assert!(
                t0.elapsed() < OUTCOME,
                "connection {k}: no agreement: A {sa:?} B {sb:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        if sa.established > made {
            made += 1;
            a.disconnect(id).unwrap();
            let t1 = Instant::now();
            while sa.ended < made || sb.ended < made {
                let mut accept = Vec::new();
                take(ev_a, &mut sa, &mut accept);
                take(ev_b, &mut sb, &mut accept);
                assert!(accept.is_empty());
                assert!(t1.elapsed() < OUTCOME, "teardown {k}: A {sa:?} B {sb:?}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    assert_eq!(sa.established, sb.established, "A {sa:?} B {sb:?}");
    assert_eq!(sa.established + sa.failed, CONNECTIONS, "A {sa:?}");
    assert!(made >= CONNECTIONS - 2, "{made} of {CONNECTIONS} connected");
    // Time-wait passes; every queue pair the CMs made is gone.
    std::thread::sleep(Duration::from_millis(1500));
    let reports = pair.runtime.counter_reader().reports();
    let sum = |name: &str| -> u64 { reports.iter().filter_map(|w| w.counter(name)).sum() };
    assert_eq!(
        sum("cm_qps_created"),
        sum("cm_qps_destroyed"),
        "{reports:?}"
    );
    assert!(
        sum("qp1_malformed") > 0 || sum("icrc_errors") > 0,
        "corruption reached QP1 or RC"
    );
    assert!(sum("cm_duplicates") > 0, "duplicates were seen");
    pair.runtime.join().unwrap();
}
