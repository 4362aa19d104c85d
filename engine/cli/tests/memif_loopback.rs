//! Real EAL, no hugepages: two net_memif ports in one process (server and client on one
//! socket file) carry N generated frames; the checker sees all of them, intact and in order.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use portico::app::{self, RunOpts, StopReason};
use portico::config::Scenario;

const N: u64 = 50_000;

#[test]
fn frames_cross_a_memif_pair_intact() {
    let sock = std::env::temp_dir().join(format!("portico-memif-{}.sock", std::process::id()));
    let sock = sock.to_str().unwrap();
    let cores = app::available_cores();
    let text = format!(
        r#"
        [eal]
        hugepages = "off"
        memory_mb = 256
        [[ports]]
        name = "srv"
        vdev = "net_memif0,role=server,id=0,socket={sock}"
        [[ports]]
        name = "cli"
        vdev = "net_memif1,role=client,id=0,socket={sock}"
        [[workers]]
        name = "gen"
        core = {c0}
        task = "generate"
        port = "srv"
        frame_size = 1024
        rate_pps = 200000
        count = {N}
        [[workers]]
        name = "check"
        core = {c1}
        task = "check"
        port = "cli"
        expect = {N}
        "#,
        c0 = cores[0],
        c1 = *cores.last().unwrap(),
    );
    let scenario = Scenario::parse(&text, &cores, &[]).expect("scenario parses");
    let opts = RunOpts::quiet(Duration::from_secs(30));
    let s = app::run_scenario(&scenario, &[], &opts, Arc::new(AtomicBool::new(false)))
        .expect("run succeeds");
    let _ = std::fs::remove_file(sock);

    assert_eq!(s.stop_reason, StopReason::Completed);
    let check = s.workers.iter().find(|w| w.worker == "check").unwrap();
    assert_eq!(check.counter("valid"), Some(N));
    assert_eq!(check.counter("valid_bytes"), Some(N * 1020));
    assert_eq!(check.counter("invalid"), Some(0));
    assert_eq!(check.counter("seq_gaps"), Some(0));
    assert_eq!(s.checks[0].sent, Some(N));
    assert!(s.checks[0].passed);
    assert!(s.ports.iter().all(|p| p.driver == "net_memif"));
    assert_eq!(s.ports[0].stats.tx_packets, N);
    assert_eq!(s.ports[1].stats.rx_packets, N);
}
