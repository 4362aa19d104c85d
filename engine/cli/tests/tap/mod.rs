//! `portico target` on a `net_tap` inside a network namespace the test creates (and removes),
//! with a scapy script on the kernel side of the tap as its peer. Needs root.
//!
//! The target: MAC 02:00:00:00:00:0b, IP 10.77.0.2, QPN 0x22, a 64 KiB region (in a file
//! when asked), 4 receive buffers. The kernel side: MAC 02:00:00:00:00:0a, IP 10.77.0.1,
//! QPN 0x11, IPv6 off so that the kernel sends nothing of its own but ARP.
#![allow(dead_code)] // Each test binary uses part of this module.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub const PEER_MAC: &str = "02:00:00:00:00:0a";
pub const PEER_IP: &str = "10.77.0.1";
pub const TARGET_IP: &str = "10.77.0.2";

/// Removes the namespace (and with it the tap) when dropped.
pub struct Netns(pub String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

pub fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("ip runs");
    assert!(st.success(), "ip {args:?} failed");
}

/// What a run left: the target's ready line and summary, the peer's last output line (null
/// when no script ran).
pub struct Run {
    pub ready: serde_json::Value,
    pub summary: serde_json::Value,
    pub peer: serde_json::Value,
    pub peer_ok: bool,
    pub peer_stderr: String,
}

/// Runs the target on a fresh tap (`tag` names the namespace, the tap and the files), then
/// `script` (if any) in the namespace with `IFACE MY_MAC MY_IP DUT_IP RKEY ADDR DUT_QPN
/// MY_QPN`, then stops the target with SIGTERM. `region_file`, when given, is the target's region;
/// `pcap`, when given, its capture.
pub fn run(
    tag: &str,
    script: Option<&str>,
    region_file: Option<&Path>,
    pcap: Option<&Path>,
) -> Run {
    run_with(tag, script, region_file, pcap, &Extra::default())
}

/// What a test adds to [`run`]'s target and script.
#[derive(Default)]
pub struct Extra<'a> {
    /// Lines appended to the target's `[rdma]` section.
    pub rdma: &'a str,
    /// Arguments after the script's eight.
    pub script_args: &'a [&'a str],
    /// Arguments of `portico target` after its config.
    pub target_args: &'a [&'a str],
}

/// [`run`], with `extra` lines in the target's config and arguments for the script.
pub fn run_with(
    tag: &str,
    script: Option<&str>,
    region_file: Option<&Path>,
    pcap: Option<&Path>,
    extra: &Extra,
) -> Run {
    // One target at a time per test binary: a scapy peer's timing is not to depend on how
    // many other EAL processes start beside it on a 2-core machine.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    let ns = Netns(format!("{tag}{pid}"));
    let ifc = format!("{tag}{}", pid % 1_000_000);
    // A namespace left over from an earlier run of this pid, if any (usually none).
    let _ = Command::new("ip")
        .args(["netns", "del", &ns.0])
        .stderr(Stdio::null())
        .status();
    ip(&["netns", "add", &ns.0]);
    ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
    for knob in ["all", "default"] {
        let _ = Command::new("ip")
            .args(["netns", "exec", &ns.0, "sysctl", "-qw"])
            .arg(format!("net.ipv6.conf.{knob}.disable_ipv6=1"))
            .status();
    }

    let cfg: PathBuf = std::env::temp_dir().join(format!("portico-{tag}-{pid}.toml"));
    let core = *portico::app::available_cores().last().unwrap();
    let region = region_file
        .map(|f| format!("region_file = {:?}\n", f.display().to_string()))
        .unwrap_or_default();
    std::fs::write(
        &cfg,
        format!(
            r#"
[eal]
args = ["--file-prefix=portico-{tag}-{pid}"]
hugepages = "off"
memory_mb = 512
[rdma]
port = "net_tap0,iface={ifc}"
core = {core}
mac = "02:00:00:00:00:0b"
ip = "{TARGET_IP}"
qpn = 0x22
peer_mac = "{PEER_MAC}"
peer_ip = "{PEER_IP}"
peer_qpn = 0x11
region_len = 65536
receives = 4
{region}{rdma}
"#,
            rdma = extra.rdma,
        ),
    )
    .unwrap();

    // Bounded: the target stops by itself after 60 s if the test never signals it.
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns",
        "exec",
        &ns.0,
        env!("CARGO_BIN_EXE_portico"),
        "target",
    ])
    .args(["--config", cfg.to_str().unwrap(), "--duration", "60"])
    .args(extra.target_args);
    if let Some(p) = pcap {
        cmd.args(["--pcap", p.to_str().unwrap()]);
    }
    let mut target = cmd
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

    ip(&["-n", &ns.0, "link", "set", &ifc, "down"]);
    ip(&["-n", &ns.0, "link", "set", &ifc, "address", PEER_MAC]);
    ip(&["-n", &ns.0, "addr", "add", "10.77.0.1/24", "dev", &ifc]);
    ip(&["-n", &ns.0, "link", "set", &ifc, "up"]);

    let peer = script.map(|script| {
        Command::new("ip")
            .args(["netns", "exec", &ns.0, "/usr/bin/python3", script, &ifc])
            .args([PEER_MAC, PEER_IP, TARGET_IP])
            .args([rkey.as_str(), addr.as_str(), "0x22", "0x11"])
            .args(extra.script_args)
            .output()
            .unwrap()
    });
    let killed = Command::new("kill")
        .args(["-TERM", &target.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let rest: Vec<String> = out.lines().map(Result::unwrap).collect();
    let status = target.wait().unwrap();
    let _ = std::fs::remove_file(&cfg);
    assert!(status.success(), "target exit {status:?}");
    let summary: serde_json::Value =
        serde_json::from_str(rest.last().expect("a target summary")).unwrap();
    let Some(peer) = peer else {
        return Run {
            ready,
            summary,
            peer: serde_json::Value::Null,
            peer_ok: true,
            peer_stderr: String::new(),
        };
    };
    let peer_out = String::from_utf8_lossy(&peer.stdout).into_owned();
    let peer_stderr = String::from_utf8_lossy(&peer.stderr).into_owned();
    let peer_json = peer_out
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("scapy peer printed no result: {peer_out} {peer_stderr}"));
    Run {
        ready,
        summary,
        peer: peer_json,
        peer_ok: peer.status.success(),
        peer_stderr,
    }
}
