//! Real EAL, no hugepages: io forwarding between two net_null ports. The worker's counters and
//! the PMDs' counters must add up exactly: every packet received was either transmitted or
//! counted as dropped, and each port transmitted what its peer received.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use portico::app::{self, FwdOpts, RunOpts, StopReason};
use portico::config::HugepageMode;
use portico::traffic::FwdMode;

#[test]
fn null_forwarding_counters_add_up() {
    let core = *app::available_cores().last().unwrap();
    let opts = FwdOpts {
        mode: FwdMode::Macswap,
        cores: vec![core],
        burst: 32,
        queues: 1,
        rxd: 512,
        txd: 512,
        hugepages: HugepageMode::Off,
        memory_mb: 256,
        eal: ["--vdev", "net_null0,size=64", "--vdev", "net_null1,size=64"]
            .map(String::from)
            .to_vec(),
        run: RunOpts::quiet(Duration::from_millis(500)),
    };
    let s = app::run_fwd(&opts, Arc::new(AtomicBool::new(false))).expect("fwd runs");
    assert_eq!(s.stop_reason, StopReason::Duration);
    assert_eq!(s.workers.len(), 1);
    let w = &s.workers[0];
    assert_eq!(w.stage, "macswap");
    assert!(
        w.io.rx_packets > 10_000,
        "net_null never runs dry: {} packets",
        w.io.rx_packets
    );
    assert_eq!(
        w.io.rx_packets,
        w.io.tx_packets + w.io.drops,
        "received = sent + dropped"
    );
    assert_eq!(w.io.rx_bytes, w.io.rx_packets * 64);
    assert_eq!(w.io.tx_bytes, w.io.tx_packets * 64);

    assert_eq!(s.ports.len(), 2);
    let (p0, p1) = (&s.ports[0].stats, &s.ports[1].stats);
    assert_eq!(
        p0.rx_packets + p1.rx_packets,
        w.io.rx_packets,
        "PMD RX counters = worker RX"
    );
    assert_eq!(
        p0.tx_packets + p1.tx_packets,
        w.io.tx_packets,
        "PMD TX counters = worker TX"
    );
    assert!(s.ports.iter().all(|p| p.driver == "net_null"));
}
