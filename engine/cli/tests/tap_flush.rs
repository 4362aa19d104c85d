//! Remote persistence checked by a peer Portico did not write: `portico target` on a
//! `net_tap` (in a network namespace this test creates and removes), its region a file under
//! pmem's power-loss simulator (`simulate_power_loss`: the file holds exactly the persisted
//! cache lines), and `tests/scapy_flush_peer.py` on the kernel side of the tap. scapy sends an
//! RDMA WRITE, an IBTA FLUSH of its range, an ATOMIC WRITE, a FLUSH of the whole region and a
//! FLUSH under a wrong rkey, one at a time, and compares each answer byte for byte with the
//! one expected (READ RESPONSE ONLY without payload for FLUSH and ATOMIC WRITE, NAK remote
//! access error for the wrong rkey), ICRC included. After each FLUSH and ATOMIC WRITE answer it
//! reads the region file: the bytes are durable before the answer. After the run, the file
//! holds the WRITE's 64 bytes at 0 and the ATOMIC WRITE's 8 at 4096, and nothing else. Needs
//! root (network namespaces).

mod tap;

const PAYLOAD: &[u8] = b"flushed by scapy into portico's file, one cache line of RoCEv2!!";
const ATOMIC: &[u8] = b"ATOMIC!!";
const ATOMIC_OFFSET: usize = 4096;

#[test]
fn scapy_flushes_and_atomically_writes_into_a_simulated_persistent_region() {
    let region =
        std::env::temp_dir().join(format!("portico-tapflush-{}.region", std::process::id()));
    let _ = std::fs::remove_file(&region);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scapy_flush_peer.py");
    let region_arg = region.to_str().unwrap();
    let run = tap::run_with(
        "ptf",
        Some(script),
        Some(&region),
        None,
        &tap::Extra {
            rdma: "simulate_power_loss = true",
            script_args: &[region_arg],
            ..tap::Extra::default()
        },
    );
    let bytes = std::fs::read(&region).unwrap();
    std::fs::remove_file(&region).unwrap();

    let steps = run.peer["steps"].as_array().cloned().unwrap_or_default();
    for s in &steps {
        eprintln!(
            "tap_flush: {:<14} opcode {:#04x} psn {} syndrome {:#04x} msn {} icrc {:#010x} (scapy's {:#010x})",
            s["name"].as_str().unwrap_or("?"),
            s["opcode"].as_u64().unwrap_or(0),
            s["psn"],
            s["syndrome"].as_u64().unwrap_or(0),
            s["msn"],
            s["icrc"].as_u64().unwrap_or(0),
            s["icrc_expected"].as_u64().unwrap_or(0),
        );
    }
    assert!(
        run.peer_ok,
        "scapy peer: {}\n{}",
        serde_json::to_string_pretty(&run.peer).unwrap(),
        run.peer_stderr
    );
    assert_eq!(run.peer["arp"], "02:00:00:00:00:0b");
    let names: Vec<&str> = steps.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "write",
            "flush_range",
            "atomic_write",
            "flush_region",
            "flush_bad_rkey"
        ]
    );
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(s["ok"], true, "{s}");
        assert_eq!(s["psn"], i, "{s}");
        assert_eq!(s["icrc"], s["icrc_expected"], "{s}");
        assert_eq!(s["udp_payload"], s["expected"], "byte for byte: {s}");
    }
    let opcodes: Vec<u64> = steps
        .iter()
        .map(|s| s["opcode"].as_u64().unwrap())
        .collect();
    assert_eq!(opcodes, [0x11, 0x10, 0x10, 0x10, 0x11]);
    assert_eq!(steps[4]["syndrome"], 0x62, "NAK remote access error");
    assert_eq!(
        steps[1]["file_holds_write"], true,
        "durable before the FLUSH's answer"
    );
    assert_eq!(
        steps[2]["file_holds_atomic"], true,
        "durable before the answer"
    );

    // The target: a simulated file, FLUSH allowed, nothing refused on the way in.
    let ready = &run.ready;
    assert_eq!(ready["simulated"], true, "{ready}");
    let access: Vec<&str> = ready["access"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        access.contains(&"flush_global") && access.contains(&"flush_persistent"),
        "{ready}"
    );
    assert!(
        !access.contains(&"durable"),
        "durable_region is off: {ready}"
    );
    let counters = &run.summary["counters"];
    assert_eq!(counters["delivered"], 5, "{counters}");
    assert_eq!(counters["icrc_errors"], 0, "{counters}");
    assert_eq!(counters["malformed"], 0, "{counters}");
    assert_eq!(counters["persist_failures"], 0, "{counters}");
    assert!(
        counters["persist_jobs"].as_u64().unwrap() >= 3,
        "the WRITE, the FLUSHes and the ATOMIC WRITE persisted: {counters}"
    );

    // The file: the WRITE at 0, the ATOMIC WRITE at 4096, zeros elsewhere.
    assert_eq!(bytes.len(), 65536);
    assert_eq!(&bytes[..PAYLOAD.len()], PAYLOAD);
    assert_eq!(&bytes[ATOMIC_OFFSET..ATOMIC_OFFSET + 8], ATOMIC);
    let stray = bytes
        .iter()
        .enumerate()
        .filter(|&(i, &b)| {
            b != 0 && i >= PAYLOAD.len() && !(ATOMIC_OFFSET..ATOMIC_OFFSET + 8).contains(&i)
        })
        .count();
    assert_eq!(
        stray, 0,
        "bytes written outside the WRITE and the ATOMIC WRITE"
    );
}
