//! DPDK telemetry of a running engine, read as any telemetry client reads it: through the
//! process's `dpdk_telemetry.v2` socket (`portico::dataplane::telemetry::Client`, a
//! `SOCK_SEQPACKET` client; `dpdk-telemetry.py` talks the same protocol).
//!
//! - `a_running_target_answers_portico_commands`: a real `portico target` (its own
//!   `--file-prefix`, so its socket is its own) serves `/portico/...` next to DPDK's
//!   `/ethdev/stats`; a real `portico initiator` WRITEs and READs back 200 messages over
//!   `net_memif`; the target's queue pair then expects exactly the PSN after the last request,
//!   and its worker counters read over the socket are exactly those its summary prints at exit.
//! - `commands_registered_in_this_process`: the adapter itself on EAL in this process: errors
//!   answered as `{"error": ...}` (unknown parameter, a panicking handler, an answer over
//!   DPDK's 16 KiB), names DPDK refuses and a second registration refused, and a command whose
//!   [`portico::dataplane::telemetry::Command`] was dropped answering `{"stopped": 1}`.
//!
//! Every wait has a deadline; processes are killed and their EAL directories removed when the
//! test ends, pass or fail.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use portico::dataplane::telemetry::{self, Client};
use serde_json::{Value, json};

mod child;
use child::lines;

const OPS: u64 = 200;
const SIZE: usize = 4096;
/// The initiator's first PSN: its `psn`, the target's `peer_psn`.
const INITIATOR_PSN: u64 = 0x12_3456;
const TARGET_QPN: u64 = 0x22;
const INITIATOR_QPN: u64 = 0x11;

/// A child process killed (and reaped) when the test lets go of it without waiting for it,
/// and the EAL runtime directory it leaves (its socket among the files) removed.
struct Guard {
    child: Option<Child>,
    eal_dir: PathBuf,
}

impl Guard {
    fn id(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn wait_until(&mut self, what: &str, deadline: Instant) -> std::process::ExitStatus {
        let child = self.child.as_mut().unwrap();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{what} still running at its deadline"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.eal_dir);
    }
}

/// A directory removed when the test ends, pass or fail.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn config(
    prefix: &str,
    role: &str,
    sock: &Path,
    core: usize,
    me: (&str, &str, u64),
    peer: (&str, &str, u64),
    psn: &str,
) -> String {
    format!(
        r#"
[eal]
args = ["--file-prefix={prefix}"]
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
timeout_us = 100000
{psn}
region_len = 1048576
"#,
        me.0,
        me.1,
        me.2,
        peer.0,
        peer.1,
        peer.2,
        sock = sock.display(),
    )
}

/// `request`'s answer (what DPDK wraps as `{"/command": ...}`).
fn ask(c: &Client, request: &str) -> Value {
    let v = c
        .query(request)
        .unwrap_or_else(|e| panic!("{request}: {e}"));
    let command = request.split(',').next().unwrap();
    v.get(command)
        .cloned()
        .unwrap_or_else(|| panic!("{request}: answer not under {command}: {v}"))
}

/// Asks until `done` holds for the answer (a worker publishes on its own schedule); returns it.
fn ask_until(c: &Client, request: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = ask(c, request);
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "{request}: still {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_running_target_answers_portico_commands() {
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("portico-telemetry-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = Cleanup(dir.clone());
    let sock = dir.join("memif.sock");
    let cores = portico::app::available_cores();
    let (c_init, c_target) = (cores[0], *cores.last().unwrap());
    let a = ("02:00:00:00:00:0a", "10.9.0.1", INITIATOR_QPN);
    let b = ("02:00:00:00:00:0b", "10.9.0.2", TARGET_QPN);
    let (p_target, p_init) = (
        format!("portico-tel-{pid}-target"),
        format!("portico-tel-{pid}-initiator"),
    );
    let target_cfg = dir.join("target.toml");
    let init_cfg = dir.join("initiator.toml");
    let peer_psn = format!("peer_psn = {INITIATOR_PSN:#x}");
    let psn = format!("psn = {INITIATOR_PSN:#x}");
    std::fs::write(
        &target_cfg,
        config(&p_target, "server", &sock, c_target, b, a, &peer_psn),
    )
    .unwrap();
    std::fs::write(
        &init_cfg,
        config(&p_init, "client", &sock, c_init, a, b, &psn),
    )
    .unwrap();
    let run_dir = |prefix: &str| Path::new("/var/run/dpdk").join(prefix);

    let exe = env!("CARGO_BIN_EXE_portico");
    let mut child = Command::new(exe)
        .args(["target", "--config", target_cfg.to_str().unwrap()])
        .args(["--duration", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = lines(child.stdout.take().unwrap());
    let err = lines(child.stderr.take().unwrap());
    let mut target = Guard {
        child: Some(child),
        eal_dir: run_dir(&p_target),
    };
    let ready = out
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|e| {
            panic!(
                "no ready line ({e}): {:?}",
                err.try_iter().collect::<Vec<_>>()
            )
        });
    let ready: Value = serde_json::from_str(&ready).unwrap();
    assert_eq!(ready["type"], "ready", "{ready}");
    let socket = run_dir(&p_target).join("dpdk_telemetry.v2");
    assert_eq!(ready["telemetry"], socket.to_str().unwrap(), "{ready}");

    let c = Client::connect(&socket, Duration::from_secs(10)).unwrap();
    assert_eq!(c.info["pid"], target.id(), "{}", c.info);
    assert_eq!(c.info["max_output_len"], telemetry::MAX_OUTPUT_LEN);

    // DPDK's list of commands holds Portico's next to its own.
    let list = ask(&c, "/");
    let list: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for cmd in [
        "/portico/info",
        "/portico/workers",
        "/portico/qps",
        "/portico/latency",
        "/ethdev/stats",
    ] {
        assert!(list.contains(&cmd), "{cmd} missing from {list:?}");
    }
    let help = ask(&c, "/help,/portico/qps");
    assert!(
        help["/portico/qps"]
            .as_str()
            .unwrap()
            .contains("queue pair"),
        "{help}"
    );

    let info = ask(&c, "/portico/info");
    assert_eq!(info["role"], "target");
    assert_eq!(info["pid"], target.id());
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        (info["workers"].clone(), info["qps"].clone()),
        (json!(1), json!(1))
    );
    let port = info["ports"]["rdma"].as_u64().expect("the port's id");
    assert!(
        info["dpdk"].as_str().unwrap().starts_with("DPDK 22.11"),
        "{info}"
    );

    // DPDK's own command on the port Portico names, on the same socket.
    let stats = ask(&c, &format!("/ethdev/stats,{port}"));
    for k in ["ipackets", "opackets", "imissed", "rx_nombuf"] {
        assert!(stats[k].is_u64(), "{k}: {stats}");
    }
    assert!(ask(&c, "/ethdev/stats,99").is_null(), "DPDK's own error");

    // The target has no operations: an explicit answer, not an error.
    let latency = ask(&c, "/portico/latency");
    assert_eq!(latency["source"], "none");
    assert!(
        latency["reason"].as_str().unwrap().contains("initiator"),
        "{latency}"
    );

    // Its queue pair, from the config, live once the worker has published it: before any
    // request it expects the initiator's first PSN.
    let qp = ask_until(&c, "/portico/qps", |v| v["0"]["live"] == 1);
    let qp = &qp["0"];
    assert_eq!(qp["qpn"], TARGET_QPN, "{qp}");
    assert_eq!(qp["peer_qpn"], INITIATOR_QPN);
    assert_eq!(qp["worker"], 0);
    assert_eq!(qp["core"], c_target);
    assert_eq!(qp["expected_psn"], INITIATOR_PSN, "{qp}");
    assert_eq!(qp["rx_packets"], 0, "{qp}");
    // Parameters the commands do not know are answered as errors.
    for bad in ["/portico/qps,1", "/portico/workers,x", "/portico/info,1"] {
        assert!(ask(&c, bad)["error"].is_string(), "{bad}");
    }

    let rkey = ready["rkey"].as_u64().unwrap().to_string();
    let addr = ready["addr"].as_u64().unwrap();
    let mut child = Command::new(exe)
        .args(["initiator", "--config", init_cfg.to_str().unwrap()])
        .args(["--rkey", &rkey, "--remote-addr", &format!("{addr:#x}")])
        .args(["--ops", &OPS.to_string(), "--size", &SIZE.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let init_out = lines(child.stdout.take().unwrap());
    let init_err = lines(child.stderr.take().unwrap());
    let mut init = Guard {
        child: Some(child),
        eal_dir: run_dir(&p_init),
    };
    let status = init.wait_until("the initiator", Instant::now() + Duration::from_secs(90));
    let init_lines: Vec<String> = init_out.try_iter().collect();
    assert!(
        status.success(),
        "{init_lines:?} {:?}",
        init_err.try_iter().collect::<Vec<_>>()
    );
    let summary: Value = serde_json::from_str(init_lines.last().unwrap()).unwrap();
    assert_eq!(summary["failed"], 0, "{summary}");

    // Each WRITE and each READ of one 4 KiB packet took one PSN: the target now expects the
    // PSN after the last request, and received every request once at least.
    let next = (INITIATOR_PSN + 2 * OPS) & 0xff_ffff;
    let qp = ask_until(&c, "/portico/qps,0", |v| v["expected_psn"] == next);
    assert_eq!(qp["index"], 0);
    assert!(qp["rx_packets"].as_u64().unwrap() >= 2 * OPS, "{qp}");
    assert_eq!(qp["error_state"], 0);

    // The worker's packet counters settle once the initiator is gone (nothing more arrives;
    // `loops` and `empty_polls` go on, and `stalls` counts gaps in the worker's clock).
    let traffic = |w: &Value| {
        let mut c = w["0"]["counters"].clone();
        c.as_object_mut().unwrap().remove("stalls");
        (
            w["0"]["rx_packets"].clone(),
            w["0"]["tx_packets"].clone(),
            c,
        )
    };
    let mut workers = ask(&c, "/portico/workers");
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let again = ask(&c, "/portico/workers");
        if traffic(&again) == traffic(&workers) {
            break;
        }
        workers = again;
    }
    let w = &workers["0"];
    assert_eq!(w["name"], "rdma");
    assert_eq!(w["core"], c_target);
    assert!(
        w["counters"]["delivered"].as_u64().unwrap() >= 2 * OPS,
        "{w}"
    );
    assert_eq!(
        traffic(&json!({"0": ask(&c, "/portico/workers,0")})),
        traffic(&workers)
    );

    let killed = Command::new("kill")
        .args(["-TERM", &target.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = target.wait_until("the target", Instant::now() + Duration::from_secs(30));
    assert!(status.success(), "{:?}", err.try_iter().collect::<Vec<_>>());
    let rest: Vec<String> = out.try_iter().collect();
    let summary: Value = serde_json::from_str(rest.last().expect("a target summary")).unwrap();
    assert_eq!(summary["type"], "target_summary");
    // Every counter the summary prints is what telemetry read, exactly (but `stalls`).
    let counted = summary["counters"].as_object().unwrap();
    assert!(counted.len() > 10, "{summary}");
    for (k, v) in counted.iter().filter(|(k, _)| *k != "stalls") {
        assert_eq!(&w["counters"][k], v, "{k}: telemetry {w} summary {summary}");
    }
}

#[test]
fn commands_registered_in_this_process() {
    let prefix = format!("portico-tel-{}-inproc", std::process::id());
    let run_dir = Path::new("/var/run/dpdk").join(&prefix);
    let _cleanup = Cleanup(run_dir.clone());

    // Before EAL: refused, telemetry is not running.
    let e = telemetry::register("/test/early", "h", |_| json!({})).unwrap_err();
    assert!(e.to_string().contains("EAL is not running"), "{e}");

    let args: Vec<String> = [
        "--no-huge",
        "-m",
        "128",
        "--no-pci",
        "-l",
        "0",
        "--log-level=lib.eal:error",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("--file-prefix={prefix}")])
    .collect();
    portico::dataplane::Eal::init(&args).expect("EAL starts");
    let socket = telemetry::socket_path().expect("telemetry runs");
    assert_eq!(socket, run_dir.join("dpdk_telemetry.v2"));

    let echo = telemetry::register("/test/echo", "echoes", |p| {
        if p == "bad" {
            return telemetry::error("unknown parameter \"bad\"");
        }
        json!({"params": p, "n": 7, "neg": -2, "f": 1.5, "list": [1, 2], "objs": [{"a": 1}],
               "deep": {"x": {"y": 3}}})
    })
    .unwrap();
    for bad in ["test/x", "/test/a-b", "/test/é"] {
        let e = telemetry::register(bad, "h", |_| json!({})).unwrap_err();
        assert!(
            e.to_string().contains("a name starts with '/'"),
            "{bad}: {e}"
        );
    }
    let e = telemetry::register("/test/echo", "again", |_| json!({})).unwrap_err();
    assert!(e.to_string().contains("already registered"), "{e}");
    let _panics = telemetry::register("/test/panics", "panics", |_| panic!("on purpose")).unwrap();
    let _big = telemetry::register("/test/big", "too big", |_| {
        let m: serde_json::Map<String, Value> = (0..200)
            .map(|i| (format!("k{i}"), json!("x".repeat(100))))
            .collect();
        Value::Object(m)
    })
    .unwrap();

    let c = Client::connect(&socket, Duration::from_secs(10)).unwrap();
    assert_eq!(
        ask(&c, "/test/echo,a,b"),
        json!({"params": "a,b", "n": 7, "neg": -2, "f": "1.5", "list": [1, 2],
               "objs": {"0": {"a": 1}}, "deep": {"x": {"y": 3}}})
    );
    assert_eq!(ask(&c, "/test/echo")["params"], "");
    assert_eq!(
        ask(&c, "/test/echo,bad"),
        json!({"error": "unknown parameter \"bad\""})
    );
    assert_eq!(
        ask(&c, "/test/panics"),
        json!({"error": "the handler panicked: on purpose"})
    );
    let big = ask(&c, "/test/big");
    assert!(
        big["error"].as_str().unwrap().contains("over DPDK's 16384"),
        "{big}"
    );

    // Dropped: answered as stopped, never a call into what it had; served again afterwards.
    drop(echo);
    let stopped = ask(&c, "/test/echo");
    assert_eq!(stopped["stopped"], 1, "{stopped}");
    let again = telemetry::register("/test/echo", "echoes", |_| json!({"back": 1})).unwrap();
    assert_eq!(ask(&c, "/test/echo"), json!({"back": 1}));
    drop(again);
    // DPDK lists it once: the second registration reused the first.
    let list = ask(&c, "/");
    let n = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| *v == "/test/echo")
        .count();
    assert_eq!(n, 1, "{list}");
}
