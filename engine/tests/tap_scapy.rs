//! An independent RoCEv2 implementation talks to Portico: `portico target` runs on a
//! `net_tap` inside a network namespace this test creates (and removes), and scapy's RoCE
//! layer (`tests/scapy_peer.py`, Debian's python3-scapy) on the kernel side of the tap
//! resolves the engine with ARP, sends an RDMA WRITE and a SEND, and checks the engine's ACKs,
//! ICRC included. The WRITE goes to the address and rkey of the target's `ready` line (the real
//! address of the target's own memory). The target's summary then shows the WRITE's bytes in
//! its region and the SEND's in its receive buffer. Needs root (network namespaces).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("ip runs");
    assert!(st.success(), "ip {args:?} failed");
}

const PAYLOAD_HEX: &str =
    "7772697474656e20627920736361707920696e746f20706f727469636f2c20526f43457632212121";

#[test]
fn scapy_writes_and_sends_into_portico_over_a_tap() {
    let ns = Netns(format!("ptc{}", std::process::id()));
    let ifc = format!("ptc{}", std::process::id() % 1_000_000);
    // A namespace left over from an earlier run of this pid, if any (usually none).
    let _ = Command::new("ip")
        .args(["netns", "del", &ns.0])
        .stderr(Stdio::null())
        .status();
    ip(&["netns", "add", &ns.0]);
    ip(&["-n", &ns.0, "link", "set", "lo", "up"]);

    let cfg = std::env::temp_dir().join(format!("portico-tap-{}.toml", std::process::id()));
    let core = *portico::app::available_cores().last().unwrap();
    std::fs::write(
        &cfg,
        format!(
            r#"
[eal]
args = ["--file-prefix=portico-tap-{pid}"]
hugepages = "off"
memory_mb = 512
[rdma]
port = "net_tap0,iface={ifc}"
core = {core}
mac = "02:00:00:00:00:0b"
ip = "10.77.0.2"
qpn = 0x22
peer_mac = "02:00:00:00:00:0a"
peer_ip = "10.77.0.1"
peer_qpn = 0x11
region_len = 65536
receives = 4
"#,
            pid = std::process::id()
        ),
    )
    .unwrap();

    // Bounded: the target stops by itself after 60 s if the test never signals it.
    let pcap = cfg.with_extension("pcapng");
    let mut target = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.0,
            env!("CARGO_BIN_EXE_portico"),
            "target",
            "--config",
            cfg.to_str().unwrap(),
        ])
        .args(["--duration", "60", "--pcap", pcap.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(target.stdout.take().unwrap());
    let mut ready = String::new();
    out.read_line(&mut ready).unwrap();
    let ready: serde_json::Value =
        serde_json::from_str(&ready).unwrap_or_else(|e| panic!("no ready line ({e}): {ready:?}"));
    assert_eq!(ready["type"], "ready");
    // The region is the target's own memory: its rkey names it by its real address.
    let rkey = ready["rkey"].as_u64().unwrap().to_string();
    let addr = format!(
        "{:#x}",
        ready["addr"].as_u64().expect("the region's address")
    );

    // The kernel side of the tap: a fixed MAC and an address next to the engine's.
    ip(&["-n", &ns.0, "link", "set", &ifc, "down"]);
    ip(&[
        "-n",
        &ns.0,
        "link",
        "set",
        &ifc,
        "address",
        "02:00:00:00:00:0a",
    ]);
    ip(&["-n", &ns.0, "addr", "add", "10.77.0.1/24", "dev", &ifc]);
    ip(&["-n", &ns.0, "link", "set", &ifc, "up"]);

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scapy_peer.py");
    let peer = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.0,
            "/usr/bin/python3",
            script,
            &ifc,
            "02:00:00:00:00:0a",
            "10.77.0.1",
            "10.77.0.2",
        ])
        .args([rkey.as_str(), addr.as_str(), "0x22", "0x11"])
        .output()
        .unwrap();
    let killed = Command::new("kill")
        .args(["-TERM", &target.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let rest: Vec<String> = out.lines().map(Result::unwrap).collect();
    let status = target.wait().unwrap();
    let _ = std::fs::remove_file(&cfg);

    let peer_out = String::from_utf8_lossy(&peer.stdout);
    assert!(
        peer.status.success(),
        "scapy peer: {peer_out} {}",
        String::from_utf8_lossy(&peer.stderr)
    );
    let p: serde_json::Value = serde_json::from_str(peer_out.lines().last().unwrap()).unwrap();
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

    assert!(status.success(), "target exit {status:?}");
    let t: serde_json::Value =
        serde_json::from_str(rest.last().expect("a target summary")).unwrap();
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
