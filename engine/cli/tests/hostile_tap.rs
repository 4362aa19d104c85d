//! Hostile input over a real PMD: `portico target` on a `net_tap` (in a network namespace
//! this test creates and removes) and `tests/hostile_peer.py` (scapy) on the kernel side,
//! sending one frame for every check the engine makes before its transport, a zero-length
//! WRITE with a bogus rkey, one real WRITE and a CmpSwap. The target's region is a file, read
//! back after it exits: only the real WRITE's 40 bytes may be in it. Needs root.

mod tap;

const PAYLOAD: &[u8] = b"only this WRITE may land in the region!!";

#[test]
fn every_refused_frame_is_counted_under_its_reason_and_touches_no_memory() {
    let region =
        std::env::temp_dir().join(format!("portico-hostile-{}.region", std::process::id()));
    let _ = std::fs::remove_file(&region);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hostile_peer.py");
    let run = tap::run("pth", Some(script), Some(&region), None);
    let bytes = std::fs::read(&region).unwrap();
    std::fs::remove_file(&region).unwrap();

    assert!(
        run.peer_ok,
        "the peer saw ACK 0, ACK 1, NAK Invalid Request 2: {} {}",
        run.peer, run.peer_stderr
    );
    assert_eq!(run.peer["arp"], "02:00:00:00:00:0b");

    // Every hostile frame under its own reason, exactly once per frame sent.
    let counters = &run.summary["counters"];
    let sent = run.peer["sent"].as_object().unwrap();
    assert_eq!(sent.len(), 8, "{sent:?}");
    for (reason, n) in sent {
        assert_eq!(
            counters[reason], *n,
            "counter {reason} in {counters} (sent {n})"
        );
    }
    // The zero-length WRITE, the real WRITE and the CmpSwap reached the transport; nothing
    // else was malformed or failed its ICRC.
    assert_eq!(counters["delivered"], 3, "{counters}");
    assert_eq!(counters["malformed"], 0, "{counters}");
    assert_eq!(counters["icrc_errors"], 0, "{counters}");

    // Memory: the real WRITE's bytes at 0, zeros everywhere else (the hostile WRITEs aimed at
    // 4096, the CmpSwap too).
    assert_eq!(bytes.len(), 65536);
    assert_eq!(&bytes[..PAYLOAD.len()], PAYLOAD);
    let stray = bytes[PAYLOAD.len()..].iter().filter(|&&b| b != 0).count();
    assert_eq!(stray, 0, "bytes written outside the one real WRITE");
}

#[test]
fn two_runs_hand_out_different_rkeys() {
    // Two processes registering the same region the same way: the keys are drawn from the
    // operating system, not counted from a convention a stranger could follow.
    let first = tap::run("pk1", None, None, None);
    let second = tap::run("pk2", None, None, None);
    let rkey = |r: &tap::Run| r.ready["rkey"].as_u64().unwrap();
    assert_ne!(rkey(&first), rkey(&second));
}
