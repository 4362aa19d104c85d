//! A standard rdma_cm peer, written independently with scapy (`tests/cm_peer.py`: its own
//! encoding of the MADs and CM messages from the IBTA's tables and the Linux CM's layout),
//! connects to `portico target --listen 7471` on a `net_tap` inside a network namespace this
//! test creates (and removes): REQ with rdma_cm's private-data header, the REP checked field
//! by field and by its ICRC, RTU, then a WRITE and a READ on the new queue pair into the
//! region the REP named, DREQ/DREP; and a REQ to a port nobody listens on, refused with REJ
//! "invalid service ID". Then tshark decodes every CM packet in the target's capture as the
//! message it is, without a malformed-packet warning. Needs root (network namespaces).

use std::process::Command;

/// A JSON value the peer prints as `0x..` hex.
fn hex_str(v: &serde_json::Value) -> Option<u64> {
    v.as_str()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
}

mod tap;

#[test]
fn an_independent_rdma_cm_peer_connects_writes_reads_and_disconnects() {
    let pcap = std::env::temp_dir().join(format!("portico-tapcm-{}.pcapng", std::process::id()));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cm_peer.py");
    let run = tap::run_with(
        "ptcm",
        Some(script),
        None,
        Some(&pcap),
        &tap::Extra {
            script_args: &["7471", "7472"],
            target_args: &["--listen", "7471"],
            ..tap::Extra::default()
        },
    );
    let p = &run.peer;
    assert!(run.peer_ok, "cm peer: {p} {}", run.peer_stderr);
    assert_eq!(p["errors"].as_array().map(Vec::len), Some(0), "{p}");
    // The REP, as the peer decoded it.
    let rep = &p["rep"];
    assert_eq!(rep["remote_comm_id"], p["req"]["local_comm_id"], "{p}");
    assert_ne!(hex_str(&rep["local_qpn"]), Some(0), "{p}");
    assert_eq!(
        p["rep_icrc_ok"], true,
        "the engine's ICRC equals the peer's: {p}"
    );
    assert_eq!(p["rep_frame"]["deth_qkey"], 0x8001_0000u32, "{p}");
    assert_eq!(p["ok"], true, "every check of the peer held: {p}");
    assert_eq!(p["rep_frame"]["deth_srcqp"], 1, "{p}");
    // The region it named is the target's, as its ready line says.
    let hex = |v: &serde_json::Value| hex_str(v).or_else(|| v.as_u64());
    for k in ["rkey", "addr", "len"] {
        assert_eq!(hex(&p["region"][k]), run.ready[k].as_u64(), "{k}: {p}");
    }
    // The queue pair worked: the WRITE acknowledged, the READ returned the bytes.
    assert_eq!(p["write_ack"]["icrc_ok"], true, "{p}");
    assert_eq!(p["read_matches"], true, "{p}");
    assert_eq!(p["drep_ok"], true, "{p}");
    assert_eq!(p["rej_reason"], 8, "invalid service ID: {p}");
    assert_eq!(p["rej_message_rejected"], 0, "the REQ: {p}");

    let t = &run.summary;
    assert_eq!(t["cm"]["accepted"], 1, "{t}");
    assert_eq!(t["cm"]["established"], 1, "{t}");
    assert_eq!(t["cm"]["disconnected"], 1, "{t}");
    assert_eq!(t["counters"]["cm_rej_no_listener"], 1, "{t}");
    assert_eq!(t["counters"]["cm_qps_destroyed"], 1, "{t}");
    assert_eq!(t["counters"]["icrc_errors"], 0, "{t}");

    // tshark: every CM message in the capture decoded as itself, nothing malformed, no
    // expert warning; what the engine sent is the REP, the DREP and the REJ.
    let out = Command::new("tshark")
        .arg("-r")
        .arg(&pcap)
        .args(["-Y", "infiniband.mad", "-T", "fields", "-E", "separator=|"])
        .args(["-e", "ip.src", "-e", "_ws.col.Info", "-e", "_ws.malformed"])
        .args(["-e", "_ws.expert.severity"])
        .output()
        .expect("tshark runs (scripts/install-deps.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = std::fs::remove_file(&pcap);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('|').collect()).collect();
    for r in &rows {
        assert_eq!(r.len(), 4, "{text}");
        assert!(
            r[2].is_empty() && r[3].is_empty(),
            "malformed or expert info: {text}"
        );
    }
    let sent: Vec<&str> = rows
        .iter()
        .filter(|r| r[0] == tap::TARGET_IP)
        .map(|r| r[1].trim())
        .collect();
    assert_eq!(
        sent,
        [
            "CM: ConnectReply",
            "CM: DisconnectReply",
            "CM: ConnectReject"
        ],
        "{text}"
    );
    let received: Vec<&str> = rows
        .iter()
        .filter(|r| r[0] == tap::PEER_IP)
        .map(|r| r[1].trim())
        .collect();
    for m in [
        "CM: ConnectRequest",
        "CM: ReadyToUse",
        "CM: DisconnectRequest",
    ] {
        assert!(received.contains(&m), "{m}: {text}");
    }
}
