//! Two processes, one RoCEv2 engine each, joined by `net_memif`: `portico target` serves a
//! region and prints its rkey; `portico initiator` WRITEs 200 messages of 4 KiB into it,
//! READs each back and compares every byte. Then the target is stopped with SIGTERM and
//! reports what it received. Real processes, real EAL (no hugepages), bounded in time.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn config(
    role: &str,
    sock: &str,
    core: usize,
    me: (&str, &str, u32),
    peer: (&str, &str, u32),
    addr: u64,
) -> String {
    format!(
        r#"
[eal]
args = ["--file-prefix=portico-test-{role}-{pid}"]
hugepages = "off"
memory_mb = 512
[rdma]
port = "net_memif0,role={role},id=0,socket={sock}"
core = {core}
mac = "{}"
ip = "{}"
qpn = {}
peer_mac = "{}"
peer_ip = "{}"
peer_qpn = {}
mtu = 4096
region_addr = {addr}
region_len = 1048576
"#,
        me.0,
        me.1,
        me.2,
        peer.0,
        peer.1,
        peer.2,
        pid = std::process::id(),
    )
}

#[test]
fn initiator_and_target_processes_over_memif() {
    let dir = std::env::temp_dir().join(format!("portico-2p-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("memif.sock");
    let sock = sock.to_str().unwrap();
    let cores = portico::app::available_cores();
    let (c_init, c_target) = (cores[0], *cores.last().unwrap());
    let a = ("02:00:00:00:00:0a", "10.9.0.1", 0x11);
    let b = ("02:00:00:00:00:0b", "10.9.0.2", 0x22);
    let target_cfg = dir.join("target.toml");
    let init_cfg = dir.join("initiator.toml");
    std::fs::write(
        &target_cfg,
        config("server", sock, c_target, b, a, 0x4000_0000),
    )
    .unwrap();
    std::fs::write(&init_cfg, config("client", sock, c_init, a, b, 0x1000_0000)).unwrap();

    let exe = env!("CARGO_BIN_EXE_portico");
    // Bounded: the target stops by itself after 120 s if the test never signals it.
    let mut target = Command::new(exe)
        .args([
            "target",
            "--config",
            target_cfg.to_str().unwrap(),
            "--duration",
            "120",
        ])
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
    let rkey = ready["rkey"].as_u64().unwrap().to_string();

    let init = Command::new(exe)
        .args([
            "initiator",
            "--config",
            init_cfg.to_str().unwrap(),
            "--rkey",
            &rkey,
            "--remote-addr",
            "0x40000000",
        ])
        .args(["--ops", "200", "--size", "4096"])
        .output()
        .unwrap();
    let killed = Command::new("kill")
        .args(["-TERM", &target.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let rest: Vec<String> = out.lines().map(Result::unwrap).collect();
    let status = target.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);

    assert!(
        init.status.success(),
        "initiator failed: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    let stdout = String::from_utf8_lossy(&init.stdout);
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["type"], "initiator_summary");
    assert_eq!(summary["ops"], 200);
    assert_eq!(summary["failed"], 0);
    assert_eq!(summary["mismatched"], 0);
    assert_eq!(summary["counters"]["icrc_errors"], 0);

    assert!(status.success(), "target exit {status:?}");
    let t: serde_json::Value =
        serde_json::from_str(rest.last().expect("a target summary")).unwrap();
    assert_eq!(t["type"], "target_summary");
    // 200 WRITEs of one 4 KiB packet and 200 READ requests at least.
    assert!(t["counters"]["delivered"].as_u64().unwrap() >= 400, "{t}");
    assert_eq!(t["counters"]["icrc_errors"], 0);
}
