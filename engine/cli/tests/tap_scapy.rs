//! An independent RoCEv2 implementation talks to Portico: `portico target` runs on a
//! `net_tap` inside a network namespace this test creates (and removes), and scapy's RoCE
//! layer (`tests/scapy_peer.py`, Debian's python3-scapy) on the kernel side of the tap
//! resolves the engine with ARP, sends an RDMA WRITE and a SEND, and checks the engine's ACKs,
//! ICRC included. The WRITE goes to the address and rkey of the target's `ready` line (the real
//! address of the target's own memory). The target's summary then shows the WRITE's bytes in
//! its region and the SEND's in its receive buffer. Needs root (network namespaces).

mod tap;

const PAYLOAD_HEX: &str =
    "7772697474656e20627920736361707920696e746f20706f727469636f2c20526f43457632212121";

#[test]
fn scapy_writes_and_sends_into_portico_over_a_tap() {
    let pcap = std::env::temp_dir().join(format!("portico-tap-{}.pcapng", std::process::id()));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scapy_peer.py");
    let run = tap::run("ptc", Some(script), None, Some(&pcap));
    assert!(run.peer_ok, "scapy peer: {} {}", run.peer, run.peer_stderr);
    let p = &run.peer;
    let t = &run.summary;
    assert_eq!(
        p["arp"], "02:00:00:00:00:0b",
        "the engine answered ARP for its address"
    );
    assert_eq!(p["acks"].as_array().unwrap().len(), 2);
    for (i, ack) in p["acks"].as_array().unwrap().iter().enumerate() {
        assert_eq!(ack["opcode"], 17, "ACKNOWLEDGE");
        assert_eq!(ack["psn"], i);
        assert_eq!(
            ack["icrc"], ack["icrc_expected"],
            "the engine's ICRC equals scapy's"
        );
    }

    assert!(
        t["region_head"].as_str().unwrap().starts_with(PAYLOAD_HEX),
        "the WRITE landed: {t}"
    );
    assert!(
        t["receive_head"].as_str().unwrap().starts_with(PAYLOAD_HEX),
        "the SEND landed: {t}"
    );
    let c = &t["completions"][0];
    assert_eq!(
        (
            c["opcode"].as_str(),
            c["byte_len"].as_u64(),
            c["status"].as_str()
        ),
        (Some("Recv"), Some(40), Some("Success"))
    );
    assert_eq!(t["counters"]["icrc_errors"], 0);
    assert!(t["counters"]["arp_replies"].as_u64().unwrap() >= 1);

    // The capture holds the RoCEv2 conversation: both requests in, both ACKs out, each a
    // valid frame (ICRC included) as wire parses it.
    let (names, records) = portico::capture::read(&std::fs::read(&pcap).unwrap()).unwrap();
    std::fs::remove_file(&pcap).unwrap();
    assert_eq!(names, ["rdma"]);
    use portico::capture::Direction::{Inbound, Outbound};
    use portico::wire::Opcode;
    let roce = |dir| {
        records
            .iter()
            .filter(|r| r.direction == Some(dir))
            .filter_map(|r| portico::wire::parse_frame(&r.data).ok())
            .map(|(repr, _)| (repr.bth.opcode, repr.bth.psn))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        roce(Inbound),
        [(Opcode::RdmaWriteOnly, 0), (Opcode::SendOnly, 1)]
    );
    assert_eq!(
        roce(Outbound),
        [(Opcode::Acknowledge, 0), (Opcode::Acknowledge, 1)]
    );
}

/// PFC from the link partner, end to end (seed 000): the target's one shaper class travels at
/// priority 3 on a 10 Mbit/s link, and its READ responses pass the shaper in that class. The
/// scapy peer (`tests/scapy_pfc_peer.py`) READs; a PFC frame pausing priority 5 leaves the
/// class going; one pausing priority 3 holds the next response back for as long as the peer
/// waits (1 s of the 3.36 s pause); a resume (quanta 0) lets it go at once. The target counts
/// the three frames as `pfc_frames` and the three responses as the shaper's.
#[test]
fn a_pfc_frame_from_the_link_partner_pauses_only_the_class_of_its_priority() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scapy_pfc_peer.py");
    let shaper = "traffic_class = 0\n[shaper]\nlink_gbps = 0.01\n\
                  [[shaper.classes]]\nceiling_gbps = 0.01\npfc_priority = 3\n";
    let run = tap::run_with(
        "ppf",
        Some(script),
        None,
        None,
        &tap::Extra {
            rdma: shaper,
            ..tap::Extra::default()
        },
    );
    assert!(run.peer_ok, "scapy peer: {} {}", run.peer, run.peer_stderr);
    let steps: Vec<&str> = run.peer["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        steps,
        ["unpaused", "other_priority_paused", "paused", "resumed"]
    );
    let c = &run.summary["counters"];
    assert_eq!(c["pfc_frames"], 3, "{c}");
    assert_eq!(c["mac_control_ignored"], 0, "{c}");
    assert_eq!(c["shaper_read_responses"], 3, "{c}");
}
