//! The IBTA CM between two processes over `net_memif`: `portico target --listen 7471` and,
//! one after the other, two `portico initiator --connect 10.9.0.2:7471` runs that copy no key.
//! Each initiator resolves the target with ARP, connects (REQ, REP with the target's region
//! in its private data, RTU) on a queue pair of its own, WRITEs and READs back 50 messages,
//! and disconnects (DREQ, DREP). The target's summary then counts two requests accepted, two
//! connections established and two ended, none left; the capture of the first run holds the
//! whole exchange, which wire parses as QP1 frames carrying the CM's messages in order.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod child;
use child::{Guard, lines};

const OPS: u64 = 50;
const PORT: u16 = 7471;

fn config(role: &str, sock: &Path, core: usize, sides: (child::Side, child::Side)) -> String {
    let prefix = format!("portico-test-cm-{role}-{}", std::process::id());
    child::memif_config(
        role,
        &prefix,
        sock,
        core,
        sides,
        &[],
        "region_len = 1048576",
    )
}

/// Runs one initiator against the target; returns its summary.
fn initiator(exe: &str, cfg: &Path, pcap: Option<&Path>) -> serde_json::Value {
    let mut cmd = Command::new(exe);
    cmd.args(["initiator", "--config", cfg.to_str().unwrap()])
        .args(["--connect", &format!("10.9.0.2:{PORT}")])
        .args(["--ops", &OPS.to_string(), "--size", "1024"]);
    if let Some(p) = pcap {
        cmd.args(["--pcap", p.to_str().unwrap()]);
    }
    let mut init = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = lines(init.stdout.take().unwrap());
    let err = lines(init.stderr.take().unwrap());
    let mut init = Guard(Some(init));
    let status = init.wait_until("the initiator", Instant::now() + Duration::from_secs(90));
    let stdout: Vec<String> = out.iter().collect();
    assert!(
        status.success(),
        "initiator failed: {stdout:?} {:?}",
        err.iter().collect::<Vec<_>>()
    );
    serde_json::from_str(stdout.last().expect("an initiator summary")).unwrap()
}

#[test]
fn two_initiators_connect_through_the_cm_without_copied_keys() {
    let dir = child::temp_dir("cm-two");
    let sock = dir.join("memif.sock");
    let cores = portico::app::available_cores();
    let (c_init, c_target) = (cores[0], *cores.last().unwrap());
    let a = ("02:00:00:00:00:0a", "10.9.0.1", 0x11);
    let b = ("02:00:00:00:00:0b", "10.9.0.2", 0x22);
    let target_cfg = dir.join("target.toml");
    let init_cfg = dir.join("initiator.toml");
    std::fs::write(&target_cfg, config("server", &sock, c_target, (b, a))).unwrap();
    std::fs::write(&init_cfg, config("client", &sock, c_init, (a, b))).unwrap();
    let exe = env!("CARGO_BIN_EXE_portico");
    let mut target = Command::new(exe)
        .args(["target", "--config", target_cfg.to_str().unwrap()])
        .args(["--duration", "120", "--listen", &PORT.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = lines(target.stdout.take().unwrap());
    let err = lines(target.stderr.take().unwrap());
    let mut target = Guard(Some(target));
    let ready = out
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|e| {
            panic!(
                "no ready line ({e}): {:?}",
                err.try_iter().collect::<Vec<_>>()
            )
        });
    let ready: serde_json::Value = serde_json::from_str(&ready).unwrap();
    assert_eq!(ready["listen"], PORT);

    let pcap = dir.join("initiator.pcapng");
    let first = initiator(exe, &init_cfg, Some(&pcap));
    let second = initiator(exe, &init_cfg, None);
    for s in [&first, &second] {
        assert_eq!(s["failed"], 0, "{s}");
        assert_eq!(s["mismatched"], 0, "{s}");
        let cm = &s["cm"];
        assert_eq!(
            cm["rkey"], ready["rkey"],
            "the REP carried the target's rkey: {s}"
        );
        assert_eq!(cm["addr"], ready["addr"], "{s}");
        assert_eq!(cm["len"], ready["len"], "{s}");
        assert_ne!(
            cm["qpn"], 0x11,
            "a queue pair of the CM's, not the config's"
        );
        // The pairs ran on that queue pair, and the summary names it.
        assert_eq!(s["per_qp"][0]["qpn"], cm["qpn"], "{s}");
        assert_eq!(s["per_qp"][0]["ops"], s["ops"], "{s}");
        assert!(s["qps"].is_null(), "{s}");
        assert_eq!(s["counters"]["cm_established"], 1, "{s}");
        assert_eq!(s["counters"]["cm_disconnected"], 1, "{s}");
        assert_eq!(s["counters"]["arp_requests"], 1, "{s}");
        assert_eq!(s["counters"]["cm_qps_destroyed"], 1, "{s}");
    }

    Command::new("kill")
        .args(["-TERM", &target.id().to_string()])
        .status()
        .unwrap();
    let status = target.wait_until("the target", Instant::now() + Duration::from_secs(30));
    assert!(status.success(), "{:?}", err.iter().collect::<Vec<_>>());
    let rest: Vec<String> = out.iter().collect();
    let t: serde_json::Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    let cm = &t["cm"];
    assert_eq!(cm["requests"], 2, "{t}");
    assert_eq!(cm["accepted"], 2, "{t}");
    assert_eq!(cm["established"], 2, "{t}");
    assert_eq!(cm["disconnected"], 2, "{t}");
    assert_eq!(cm["connected_now"], 0, "{t}");
    assert_eq!(t["counters"]["cm_qps_created"], 2, "{t}");
    assert_eq!(t["counters"]["cm_qps_destroyed"], 2, "{t}");
    assert_eq!(t["counters"]["icrc_errors"], 0, "{t}");

    // The first initiator's capture: ARP, then REQ, REP, RTU, the RC traffic, DREQ, DREP.
    let (_, records) = portico::capture::read(&std::fs::read(&pcap).unwrap()).unwrap();
    let attrs: Vec<u16> = records
        .iter()
        .filter_map(|r| portico::wire::gsi::GsiRepr::parse(&r.data).ok())
        .map(|(_, mad)| u16::from_be_bytes([mad[16], mad[17]]))
        .collect();
    use portico::wire::mad::cm_attr;
    assert_eq!(
        attrs,
        [
            cm_attr::REQ,
            cm_attr::REP,
            cm_attr::RTU,
            cm_attr::DREQ,
            cm_attr::DREP
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
