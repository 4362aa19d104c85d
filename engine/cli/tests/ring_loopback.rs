//! Real EAL, no hugepages: N generated frames sent from one net_ring port arrive on the other,
//! counted exactly by the worker, by both ports' PMD counters and by the checker, which
//! verified every payload byte. One test per binary: EAL starts once per process.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use portico::app::{self, RunOpts, StopReason};
use portico::config::Scenario;

const N: u64 = 20_000;

#[test]
fn frames_cross_a_ring_link_exactly_once_and_intact() {
    let text = format!(
        r#"
        [eal]
        hugepages = "off"
        memory_mb = 256
        [run]
        burst = 32
        [[ports]]
        name = "a"
        ring = "wire"
        [[ports]]
        name = "b"
        ring = "wire"
        [[workers]]
        name = "gen"
        core = {c0}
        task = "generate"
        port = "a"
        frame_size = 301
        rate_pps = 500000
        count = {N}
        [[workers]]
        name = "check"
        core = {c1}
        task = "check"
        port = "b"
        "#,
        c0 = app::available_cores()[0],
        c1 = *app::available_cores().last().unwrap(),
    );
    let cores = app::available_cores();
    let scenario = Scenario::parse(&text, &cores, &[]).expect("scenario parses");
    let opts = RunOpts::quiet(Duration::from_secs(30));
    let s = app::run_scenario(&scenario, &[], &opts, Arc::new(AtomicBool::new(false)))
        .expect("run succeeds");

    assert_eq!(
        s.stop_reason,
        StopReason::Completed,
        "the checker saw all {N} frames before the deadline"
    );
    let gen_ = s.workers.iter().find(|w| w.worker == "gen").unwrap();
    let check = s.workers.iter().find(|w| w.worker == "check").unwrap();
    assert_eq!(gen_.counter("generated"), Some(N));
    assert_eq!(gen_.io.tx_packets, N);
    assert_eq!(
        gen_.io.tx_bytes,
        N * 297,
        "301-byte frames are 297 bytes without FCS"
    );
    assert_eq!(gen_.io.drops, 0);
    assert_eq!(check.io.rx_packets, N);
    assert_eq!(check.io.rx_bytes, N * 297);
    assert_eq!(check.counter("valid"), Some(N));
    assert_eq!(check.counter("invalid"), Some(0));
    assert_eq!(check.counter("seq_gaps"), Some(0));
    assert_eq!(check.counter("late"), Some(0));
    assert_eq!(check.counter("valid_bytes"), Some(N * 297));

    let a = s.ports.iter().find(|p| p.name == "a").unwrap();
    let b = s.ports.iter().find(|p| p.name == "b").unwrap();
    assert_eq!(a.driver, "net_ring");
    assert_eq!((a.stats.tx_packets, a.stats.rx_packets), (N, 0));
    assert_eq!((b.stats.rx_packets, b.stats.tx_packets), (N, 0));

    assert_eq!(s.checks.len(), 1);
    assert!(s.checks[0].passed);
    assert_eq!(s.checks[0].sent, Some(N));
    assert!(matches!(
        s.memory,
        app::MemoryChoice::NoHuge { mb: Some(256) }
    ));
}
