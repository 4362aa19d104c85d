//! The `portico` binary as a user runs it: bad configs and out-of-bounds sizes, durations and
//! numbers end with one line naming the field and exit status 2 (before EAL starts); `ports`
//! lists what EAL probed; the default scenario runs and its checker passes; `bench` reports
//! JSON with the ports' own drop counters, runs until SIGTERM with `--duration 0` and, with
//! `--verify`, compares every byte that lands. Each case is its own process.

use std::path::PathBuf;
use std::process::{Command, Output};

fn portico(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_portico"))
        .args(args)
        .output()
        .expect("portico runs")
}

fn config_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("portico-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

const GOOD: &str = r#"
[[ports]]
name = "n0"
vdev = "net_null0"
[[ports]]
name = "n1"
vdev = "net_null1"
[[workers]]
core = 0
task = "forward"
paths = [["n0", "n1"]]
"#;

/// Runs `portico run` on `text` and returns (status, stderr lines).
fn bad_config(name: &str, text: &str) -> (i32, Vec<String>) {
    let p = config_file(name, text);
    let out = portico(&["run", "--config", p.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    (
        out.status.code().unwrap_or(-1),
        stderr.lines().map(String::from).collect(),
    )
}

#[test]
fn unknown_vdev_is_named_with_exit_2() {
    let (code, lines) = bad_config("vdev.toml", &GOOD.replace("net_null1", "net_nosuchpmd1"));
    assert_eq!(code, 2, "{lines:?}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("portico: error: bad config "),
        "{lines:?}"
    );
    assert!(
        lines[0].contains("ports[1].vdev: unknown driver \"net_nosuchpmd\""),
        "{lines:?}"
    );
}

#[test]
fn missing_field_is_named_with_exit_2() {
    let (code, lines) = bad_config("missing.toml", &GOOD.replace("name = \"n1\"\n", ""));
    assert_eq!(code, 2, "{lines:?}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].ends_with("ports[1]: missing field `name`"),
        "{lines:?}"
    );
}

#[test]
fn nonexistent_lcore_is_named_with_exit_2() {
    let (code, lines) = bad_config("core.toml", &GOOD.replace("core = 0", "core = 4096"));
    assert_eq!(code, 2, "{lines:?}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("workers[0].core: core 4096 does not exist"),
        "{lines:?}"
    );
}

#[test]
fn unreadable_config_is_a_usage_error() {
    let out = portico(&["run", "--config", "/nonexistent/portico.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

#[test]
fn run_time_failure_exits_1() {
    // Portico's own arguments are valid, but EAL knows no driver for the second device: EAL
    // fails at run time, which is not a config or argument Portico checks.
    let out = portico(&[
        "fwd",
        "--duration",
        "1",
        "--hugepages",
        "off",
        "--memory-mb",
        "128",
        "--",
        "--vdev",
        "net_null0",
        "--vdev",
        "net_bogus1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("portico: error: "), "{stderr}");
}

#[test]
fn ports_lists_probed_vdevs_as_json() {
    let out = portico(&[
        "ports",
        "--json",
        "--xstats",
        "--",
        "--no-huge",
        "-m",
        "128",
        "--vdev",
        "net_null0",
        "--vdev",
        "net_null1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    let ports = v.as_array().unwrap();
    assert_eq!(ports.len(), 2);
    assert_eq!(ports[0]["name"], "net_null0");
    assert_eq!(ports[0]["driver"], "net_null");
    assert_eq!(ports[1]["name"], "net_null1");
    assert!(
        ports[0]["link"]["up"].is_boolean(),
        "ports are probed, not started: link state is reported as is"
    );
    assert_eq!(
        ports[0]["xstats"]["rx_good_packets"], 0,
        "generic xstats are there, nothing received yet"
    );
}

#[test]
fn sigterm_stops_a_run_cleanly_with_a_summary() {
    use std::io::BufRead;
    // Bounded: without the signal the run would end by itself after 60 s.
    let mut child = Command::new(env!("CARGO_BIN_EXE_portico"))
        .args([
            "fwd",
            "--duration",
            "60",
            "--json",
            "--hugepages",
            "off",
            "--memory-mb",
            "256",
            "--",
        ])
        .args(["--vdev", "net_null0", "--vdev", "net_null1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The first stats line means the workers run and the signal handler is installed.
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.contains("\"type\":\"interval\""), "{first}");
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let rest: Vec<String> = stdout.lines().map(Result::unwrap).collect();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    assert_eq!(summary["type"], "summary");
    assert_eq!(summary["stop_reason"], "interrupted");
    let w = &summary["workers"][0];
    assert_eq!(
        w["rx_packets"].as_u64().unwrap(),
        w["tx_packets"].as_u64().unwrap() + w["drops"].as_u64().unwrap()
    );
}

#[test]
fn default_scenario_runs_and_passes_its_check() {
    let cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/loopback.toml");
    let out = portico(&[
        "run",
        "--config",
        cfg,
        "--duration",
        "1.5",
        "--json",
        "--",
        "--no-huge",
        "-m",
        "256",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: serde_json::Value = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["type"] == "summary")
        .expect("a summary line");
    let check = &summary["checks"][0];
    assert_eq!(check["passed"], true, "{summary}");
    for p in summary["ports"].as_array().unwrap() {
        assert_eq!(p["stats"]["rx_missed"], 0, "{p}");
        assert_eq!(p["drop_xstats"]["rx_q0_errors"], 0, "{p}");
    }
    assert!(check["valid"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(check["valid"], check["sent"]);
    assert!(
        stdout.lines().any(|l| l.contains("\"type\":\"interval\"")),
        "live stats are printed once a second"
    );
}

#[test]
fn pcap_holds_every_packet_sent_and_received() {
    let cfg = config_file(
        "pcap.toml",
        r#"
[eal]
hugepages = "off"
memory_mb = 256
[run]
duration_s = 20
[[ports]]
name = "a"
ring = "w"
[[ports]]
name = "b"
ring = "w"
[[workers]]
core = 0
task = "generate"
port = "a"
frame_size = 100
rate_pps = 100000
count = 5000
[[workers]]
core = 1
task = "check"
port = "b"
"#,
    );
    let pcap = cfg.with_extension("pcapng");
    let out = portico(&[
        "run",
        "--config",
        cfg.to_str().unwrap(),
        "--json",
        "--pcap",
        pcap.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (names, records) = portico::capture::read(&std::fs::read(&pcap).unwrap()).unwrap();
    std::fs::remove_file(&pcap).unwrap();
    assert_eq!(names, ["a", "b"]);
    use portico::capture::Direction::{Inbound, Outbound};
    let sent: Vec<_> = records
        .iter()
        .filter(|r| r.interface == 0 && r.direction == Some(Outbound))
        .collect();
    let got: Vec<_> = records
        .iter()
        .filter(|r| r.interface == 1 && r.direction == Some(Inbound))
        .collect();
    assert_eq!((sent.len(), got.len(), records.len()), (5000, 5000, 10_000));
    for (i, (s, g)) in sent.iter().zip(&got).enumerate() {
        assert_eq!(s.data, g.data, "packet {i} arrived as sent");
        assert_eq!(
            portico::traffic::frame::verify(&g.data).unwrap().seq,
            i as u64
        );
        assert_eq!(g.data.len(), 96);
    }
    assert!(
        got.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns),
        "timestamps never go back"
    );
}

#[test]
fn bench_reports_throughput_and_latency_as_json() {
    let hgrm = std::env::temp_dir().join(format!("portico-bench-{}.hgrm", std::process::id()));
    let out = portico(&[
        "bench",
        "mixed",
        "--size",
        "512",
        "--qd",
        "8",
        "--duration",
        "0.5",
        "--json",
        "--hugepages",
        "off",
        "--memory-mb",
        "512",
        "--hgrm",
        hgrm.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["type"], "bench");
    assert_eq!(v["errors"], 0, "{v}");
    let results = v["results"].as_array().unwrap();
    let ops: Vec<&str> = results.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["read", "send", "write"]);
    for r in results {
        let l = &r["latency_ns"];
        assert!(r["ops"].as_u64().unwrap() > 0, "{r}");
        assert!(
            l["p50"].as_u64() <= l["p99"].as_u64() && l["p99"].as_u64() <= l["max"].as_u64(),
            "{r}"
        );
    }
    // The ports' own counters, beside the engines': nothing missed, dropped or failed.
    let ports = v["ports"].as_array().unwrap();
    let names: Vec<&str> = ports.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "b"], "{v}");
    for p in ports {
        assert_eq!(p["driver"], "net_ring", "{p}");
        assert!(p["stats"]["rx_packets"].as_u64().unwrap() > 0, "{p}");
        for k in ["rx_missed", "rx_errors", "tx_errors", "rx_nombuf"] {
            assert_eq!(p["stats"][k], 0, "{k}: {p}");
        }
        let drops = p["drop_xstats"].as_object().unwrap();
        assert_eq!(drops["rx_missed_errors"], 0, "{p}");
        assert_eq!(drops["rx_q0_errors"], 0, "per queue: {p}");
        assert!(
            drops
                .keys()
                .all(|k| !k.ends_with("_bytes") && !k.contains("good")),
            "only drops, misses and errors: {p}"
        );
    }
    // Where the threads ran: the host on its core, the worker on another, and EAL's control
    // threads beside the host, never on a busy-polling worker's core.
    let cores = &v["cores"];
    let host = cores["host"]["cpus"].as_str().unwrap();
    let workers: Vec<&str> = cores["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["cpus"].as_str().unwrap())
        .collect();
    assert_eq!(workers.len(), 1, "{cores}");
    assert_ne!(workers[0], host, "{cores}");
    let eal: Vec<&serde_json::Value> = cores["eal_threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"] != "ctrl-c")
        .collect();
    assert!(!eal.is_empty(), "{cores}");
    for t in eal {
        assert_eq!(
            t["cpus"], host,
            "EAL's control threads on the host's core: {cores}"
        );
    }
    // After the run, a cache line's round trip from the host's core to the worker's: one
    // entry, for the core the worker last ran on, naming it, with a figure, or, when a test
    // running beside this one held a core, the refusal (`portico::app::line_trip` has the
    // figure's own tests).
    let trips = cores["line_trips"].as_array().expect("cores.line_trips");
    assert_eq!(trips.len(), 1, "{cores}");
    assert_eq!(trips[0]["from_cpu"], cores["host"]["last_cpu"], "{cores}");
    assert_eq!(
        trips[0]["to_cpu"], cores["workers"][0]["last_cpu"],
        "{cores}"
    );
    assert_eq!(
        trips[0]["workers"][0], cores["workers"][0]["name"],
        "{cores}"
    );
    // And the same before the worker started, to the core it was to start on.
    let before = cores["line_trips_before"]
        .as_array()
        .expect("cores.line_trips_before");
    assert_eq!(before.len(), 1, "{cores}");
    assert_eq!(before[0]["to_cpu"], trips[0]["to_cpu"], "{cores}");
    for t in [&trips[0], &before[0]] {
        match t["round_trip_ns"].as_f64() {
            Some(ns) => assert!(ns > 0.0, "{cores}"),
            None => assert!(
                t["error"].as_str().unwrap().starts_with("no answer"),
                "{cores}"
            ),
        }
    }
    let text = std::fs::read_to_string(&hgrm).unwrap();
    std::fs::remove_file(&hgrm).unwrap();
    assert!(text.starts_with("       Value     Percentile TotalCount 1/(1-Percentile)"));
    assert!(text.contains("#[Max     ="));
}

/// `portico bench ARGS --qd 16 --duration 1 --verify --json` without hugepages; its JSON.
fn bench_verify(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.extend_from_slice(&[
        "--qd",
        "16",
        "--duration",
        "1",
        "--verify",
        "--json",
        "--hugepages",
        "off",
        "--memory-mb",
        "512",
    ]);
    let out = portico(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn bench_verify_checks_every_byte_that_lands() {
    let v = bench_verify(&["write", "--size", "4096"]);
    assert_eq!(v["type"], "bench");
    assert_eq!(v["errors"], 0, "{v}");
    assert_eq!(v["results"][0]["op"], "write", "{v}");
    assert!(v["results"][0]["ops"].as_u64().unwrap() > 0, "{v}");
    let verify = &v["verify"];
    assert!(verify["checked_ops"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(verify["mismatches"], 0, "{v}");
    assert_eq!(
        verify["checked_bytes"].as_u64().unwrap(),
        4096 * verify["checked_ops"].as_u64().unwrap(),
        "every byte of each checked operation was compared: {v}"
    );
}

/// SEND, WRITE and READ of 16 packets each under --verify: every completed operation of every
/// type had its landed bytes compared (a SEND's in B's receive buffer), and none failed.
#[test]
fn bench_verify_checks_multi_packet_sends_reads_and_writes() {
    let v = bench_verify(&["mixed", "--size", "65536", "--mtu", "4096"]);
    assert_eq!(v["errors"], 0, "{v}");
    let results = v["results"].as_array().unwrap();
    let ops: u64 = results.iter().map(|r| r["ops"].as_u64().unwrap()).sum();
    let mut kinds: Vec<&str> = results.iter().map(|r| r["op"].as_str().unwrap()).collect();
    kinds.sort();
    assert_eq!(kinds, ["read", "send", "write"], "{v}");
    assert_eq!(v["verify"]["checked_ops"].as_u64().unwrap(), ops, "{v}");
    assert_eq!(v["verify"]["mismatches"], 0, "{v}");
}

/// Runs portico with `args`: it must exit with status 2 and its last line of stderr must be
/// `portico: error: ` and a message that names `field`. When `before_eal`, that line is all
/// it printed on stderr (EAL never started, so it printed nothing).
fn assert_bad(args: &[&str], field: &str, before_eal: bool) {
    let out = portico(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    let last = lines.last().copied().unwrap_or_default();
    assert!(
        last.starts_with("portico: error: ") && last.contains(&format!("{field}: ")),
        "{args:?}: {field} is not named: {stderr}"
    );
    if before_eal {
        assert_eq!(lines.len(), 1, "{args:?}: one line: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: EAL did not start");
    }
    assert!(
        !stderr.contains("panicked") && !stderr.contains("memory allocation"),
        "{args:?}: {stderr}"
    );
}

#[test]
fn bench_bounds_name_their_argument_with_exit_2() {
    let bench = |extra: &[&str]| -> Vec<String> {
        let mut a = vec!["bench", "write", "--hugepages", "off"];
        a.extend_from_slice(extra);
        a.into_iter().map(String::from).collect()
    };
    for (extra, field) in [
        (&["--size", "0"][..], "--size"),
        (&["--size", "16777217"], "--size"),
        (&["--qd", "0"], "--qd"),
        (&["--qd", "121"], "--qd"),
        (&["--rate", "0"], "--rate"),
        (&["--mtu", "1500"], "--mtu"),
        (&["--duration", "-1"], "--duration"),
        (&["--duration", "1e300"], "--duration"),
        (&["--memory-mb", "16"], "--memory-mb"),
        (&["--memory-mb", "4000000000"], "--memory-mb"),
        // Enough for EAL, not for the engines' 16383 mbufs of 4 KiB frames.
        (&["--memory-mb", "70"], "--memory-mb"),
        (&["--verify", "--size", "1048576", "--qd", "64"], "--verify"),
        (&["--cores", "0"], "--cores"),
        (&["--cores", "17"], "--cores"),
        (&["--cores", "2", "--connections", "1"], "--connections"),
        (&["--cores", "2", "--qd", "1"], "--qd"),
        (&["--host-threads", "0"], "--host-threads"),
        (
            &["--connections", "2", "--host-threads", "3"],
            "--host-threads",
        ),
        (
            &[
                "--connections",
                "2",
                "--host-threads",
                "2",
                "--hlog",
                "/tmp/h.hlog",
            ],
            "--hlog",
        ),
        (&["--inline", "--host-threads", "1"], "--host-threads"),
        (&["--inline", "--hlog", "/tmp/h.hlog"], "--hlog"),
    ] {
        let args = bench(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_bad(&args, field, true);
    }
    // --cores belongs to the main loop's benches: refused by name (with --connections too
    // before bench connect took a --connections of its own).
    assert_bad(
        &["bench", "persist", "--hugepages", "off", "--cores", "2"],
        "--cores",
        true,
    );
}

#[test]
fn fwd_and_run_bounds_name_their_field_with_exit_2() {
    let fwd = ["fwd", "--hugepages", "off"];
    for (extra, field) in [
        (&["--queues", "0"][..], "--queues"),
        (&["--queues", "1025"], "--queues"),
        (&["--rxd", "8"], "--rxd"),
        (&["--txd", "20000"], "--txd"),
        (&["--burst", "0"], "--burst"),
        (&["--memory-mb", "8"], "--memory-mb"),
        (&["--memory-mb", "4000000000"], "--memory-mb"),
        (&["--duration", "-3"], "--duration"),
        (&["--stats-period", "nan"], "--stats-period"),
    ] {
        let args: Vec<&str> = fwd.iter().chain(extra).copied().collect();
        assert_bad(&args, field, true);
    }
    // The pool's size depends on the ports EAL probed: checked after EAL, before the pool.
    assert_bad(
        &[
            "fwd",
            "--hugepages",
            "off",
            "--memory-mb",
            "64",
            "--rxd",
            "16384",
            "--",
            "--vdev",
            "net_null0",
            "--vdev",
            "net_null1",
        ],
        "--memory-mb",
        false,
    );

    let cfg = config_file("good.toml", GOOD);
    let cfg = cfg.to_str().unwrap();
    assert_bad(
        &["run", "--config", cfg, "--duration", "-1"],
        "--duration",
        true,
    );
    let with = |name: &str, from: &str, to: &str| {
        assert!(GOOD.contains(from), "{from}");
        config_file(name, &GOOD.replacen(from, to, 1))
    };
    for (p, field) in [
        (
            with("d.toml", "[[ports]]", "[run]\nduration_s = -1\n[[ports]]"),
            "run.duration_s",
        ),
        (
            with(
                "p.toml",
                "[[ports]]",
                "[run]\nstats_period_s = 1e30\n[[ports]]",
            ),
            "run.stats_period_s",
        ),
        (
            with(
                "q.toml",
                "vdev = \"net_null1\"",
                "vdev = \"net_null1\"\nrx_queues = 4096",
            ),
            "ports[1].rx_queues",
        ),
        (
            with(
                "r.toml",
                "vdev = \"net_null0\"",
                "vdev = \"net_null0\"\nrx_desc = 8",
            ),
            "ports[0].rx_desc",
        ),
        (
            with(
                "m.toml",
                "[[ports]]",
                "[eal]\nmemory_mb = 4000000000\n[[ports]]",
            ),
            "eal.memory_mb",
        ),
        (
            // 64 MiB do not hold the mbufs for 16384 RX descriptors and the rest.
            config_file(
                "pool.toml",
                &format!(
                    "[eal]\nhugepages = \"off\"\nmemory_mb = 64\n{}",
                    GOOD.replace(
                        "vdev = \"net_null0\"",
                        "vdev = \"net_null0\"\nrx_desc = 16384"
                    )
                ),
            ),
            "eal.memory_mb",
        ),
    ] {
        assert_bad(&["run", "--config", p.to_str().unwrap()], field, true);
    }
}

/// A target's config over memif (it never starts: every case here fails before EAL).
const PEER: &str = r#"
[eal]
hugepages = "off"
[rdma]
port = "net_memif0,role=server,id=0,socket=/tmp/portico-cli-never.sock"
core = 0
mac = "02:00:00:00:00:0b"
ip = "10.9.0.2"
qpn = 0x22
peer_mac = "02:00:00:00:00:0a"
peer_ip = "10.9.0.1"
peer_qpn = 0x11
region_len = 1048576
"#;

#[test]
fn target_and_initiator_bounds_name_their_field_with_exit_2() {
    let with = |name: &str, from: &str, to: &str| {
        assert!(PEER.contains(from), "{from}");
        config_file(name, &PEER.replacen(from, to, 1))
    };
    // Bounded: were a case to pass its checks, the target would stop by itself after 5 s
    // (and the test fail on its exit status).
    let target = |p: &std::path::Path, extra: &[&str]| {
        let mut a = vec![
            "target".to_string(),
            "--config".into(),
            p.display().to_string(),
            "--duration".into(),
            "5".into(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let region_len = "region_len = 1048576";
    for (p, field) in [
        (
            with("t1.toml", region_len, "region_len = 64"),
            "rdma.region_len",
        ),
        (
            // An anonymous region larger than this machine's memory.
            with("t2.toml", region_len, "region_len = 1000000000000000"),
            "rdma.region_len",
        ),
        (
            with(
                "t3.toml",
                region_len,
                "region_len = 1048576\nregion_file = \"/nonexistent/dir/region.bin\"",
            ),
            "rdma.region_file",
        ),
        (
            with(
                "t4.toml",
                region_len,
                "region_len = 1048576\nreceives = 129",
            ),
            "rdma.receives",
        ),
        (
            with("t5.toml", region_len, "region_len = 65536\nreceives = 9"),
            "rdma.receives",
        ),
        (with("t6.toml", "qpn = 0x22", "qpn = 0x1000000"), "rdma.qpn"),
        (
            with(
                "t7.toml",
                region_len,
                "region_len = 1048576\npsn = 0x1000000",
            ),
            "rdma.psn",
        ),
        (
            with(
                "t8.toml",
                region_len,
                "region_len = 1048576\npeer_psn = 16777216",
            ),
            "rdma.peer_psn",
        ),
        (
            with(
                "t9.toml",
                region_len,
                "region_len = 1048576\ntimeout_us = 0",
            ),
            "rdma.timeout_us",
        ),
        (
            with(
                "t10.toml",
                "hugepages = \"off\"",
                "hugepages = \"off\"\nmemory_mb = 32",
            ),
            "eal.memory_mb",
        ),
        (
            with("t13.toml", "core = 0", "core = 0\ncores = 0"),
            "rdma.cores",
        ),
        (
            with("t14.toml", "core = 0", "core = 0\ncores = [0, 0]"),
            "rdma.cores",
        ),
        (
            with(
                "t15.toml",
                "core = 0",
                "core = 0\npeer_queues = 2\npeer_queue = 5",
            ),
            "rdma.peer_queue",
        ),
    ] {
        let args = target(&p, &[]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_bad(&args, field, true);
    }
    let good = config_file("peer.toml", PEER);
    let args = target(&good, &["--region-file", "/nonexistent/dir/region.bin"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_bad(&args, "--region-file", true);
    let good_path = good.to_str().unwrap();
    assert_bad(
        &["target", "--config", good_path, "--duration", "-5"],
        "--duration",
        true,
    );
    let args = target(&good, &["--cores", "17"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_bad(&args, "--cores", true);
    // The initiator runs WRITE+READ pairs on several workers, the durable stream and a CM
    // connection on one; on several, each queue pair needs a slot of its own.
    let two = with("t16.toml", "core = 0", "core = 0\ncores = 2");
    let keys = ["--rkey", "1", "--remote-addr", "0x1000"];
    for (config, extra, field) in [
        (&two, &["--durable"][..], "rdma.cores"),
        (&good, &["--durable", "--cores", "2"], "--cores"),
        (&two, &["--size", "524288"], "--size"),
    ] {
        let config = config.to_str().unwrap();
        let args: Vec<&str> = ["initiator", "--config", config]
            .into_iter()
            .chain(keys)
            .chain(extra.iter().copied())
            .collect();
        assert_bad(&args, field, true);
    }
    assert_bad(
        &[
            "initiator",
            "--config",
            two.to_str().unwrap(),
            "--connect",
            "10.9.0.2:7471",
        ],
        "rdma.cores",
        true,
    );
    // A file to create larger than its file system's free space.
    let big = with("t12.toml", region_len, "region_len = 1000000000000000");
    let file = std::env::temp_dir().join(format!("portico-cli-{}-big.bin", std::process::id()));
    let args = target(&big, &["--region-file", file.to_str().unwrap()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_bad(&args, "--region-file", true);
    assert!(!file.exists(), "nothing was created");

    let good = good.to_str().unwrap();
    let initiator = [
        "initiator",
        "--config",
        good,
        "--rkey",
        "1",
        "--remote-addr",
        "0x1000",
    ];
    for (extra, field) in [
        (&["--size", "0"][..], "--size"),
        (&["--size", "524289"], "--size"),
        (&["--ops", "0"], "--ops"),
    ] {
        let args: Vec<&str> = initiator.iter().chain(extra).copied().collect();
        assert_bad(&args, field, true);
    }
    assert_bad(
        &[
            "initiator",
            "--config",
            good,
            "--rkey",
            "1",
            "--remote-addr",
            "0xffffffffffffff00",
        ],
        "--remote-addr",
        true,
    );
}

/// `bench --duration 0` runs until it is stopped (SIGTERM here), then waits for what is
/// outstanding and prints its summary.
#[test]
fn bench_with_duration_0_runs_until_sigterm() {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_portico"))
        .args(["bench", "write", "--duration", "0", "--json"])
        .args(["--hugepages", "off", "--memory-mb", "512"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The human text goes to stderr: the header, then a live line per second.
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut live = 0;
    let mut header = String::new();
    while live < 2 {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "bench ended early: {header}"
        );
        if line.starts_with("bench ") {
            header = line.clone();
        }
        if line.starts_with('[') {
            live += 1;
        }
    }
    assert!(header.contains("until Ctrl-C"), "{header}");
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["type"], "bench");
    assert_eq!(v["errors"], 0, "{v}");
    assert!(v["seconds"].as_f64().unwrap() >= 2.0, "{v}");
    assert!(v["results"][0]["ops"].as_u64().unwrap() > 0, "{v}");
}

/// `bench persist` in each of its five modes: durable writes complete, into a region on a
/// file (not anonymous memory) that the run made for itself and removed afterwards.
#[test]
fn bench_persist_runs_every_mode_on_a_file_region() {
    for mode in [
        "durable",
        "durable-region",
        "write-read",
        "write-flush",
        "write-send",
    ] {
        let out = portico(&[
            "bench",
            "persist",
            "--mode",
            mode,
            "--qd",
            "4",
            "--duration",
            "1",
            "--json",
            "--hugepages",
            "off",
            "--memory-mb",
            "512",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode}: {stderr}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        assert_eq!(v["type"], "bench");
        assert_eq!(v["op"], "persist");
        assert_eq!(v["errors"], 0, "{v}");
        assert_eq!(v["results"][0]["op"], mode, "{v}");
        assert!(v["results"][0]["ops"].as_u64().unwrap() > 0, "{v}");
        assert!(
            v["results"][0]["latency_ns"]["p50"].as_u64().unwrap() > 0,
            "{v}"
        );
        let p = &v["persist"];
        assert_eq!(p["mode"], mode, "{v}");
        assert!(p["mapping"].as_str().unwrap().starts_with("file ("), "{v}");
        assert!(p["dax"].is_boolean(), "{v}");
        assert_eq!(p["temporary"], true, "{v}");
        let file = std::path::Path::new(p["file"].as_str().unwrap());
        assert!(!file.exists(), "the region file is removed: {v}");
        assert_eq!(p["server"].is_object(), mode == "write-send", "{v}");
    }
}

/// `bench placement` at one data size with tiny points: one JSON object whose results hold
/// the three methods for every header, each with a nonzero rate; coalesced messages take one
/// WRITE and no target copy, naive ones one copy of the data each; the `placement` object
/// holds the checks and the planner's cost.
#[test]
fn bench_placement_runs_the_three_methods_as_json() {
    let out = portico(&[
        "bench",
        "placement",
        "--size",
        "4096",
        "--duration",
        "0.02",
        "--qd",
        "16",
        "--json",
        "--hugepages",
        "off",
        "--memory-mb",
        "512",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["type"], "bench");
    assert_eq!(v["op"], "placement");
    assert_eq!(v["errors"], 0, "{v}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 3 * 4, "3 methods x 4 headers: {v}");
    for r in results {
        assert_eq!(r["size"], 4096, "{r}");
        assert!(r["ops_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["latency_ns"]["p50"].as_u64().unwrap() > 0, "{r}");
        let ops = r["ops"].as_u64().unwrap();
        match r["method"].as_str().unwrap() {
            "coalesced" => {
                assert_eq!(r["writes_per_op"], 1, "{r}");
                assert_eq!(r["target_copies"], 0, "{r}");
                assert_eq!(r["waste_bytes_per_op"], 0, "page-aligned lists: {r}");
                assert!(r["over_two_writes"].as_f64().unwrap() > 0.0, "{r}");
            }
            "two-writes" => assert_eq!(r["writes_per_op"], 2, "{r}"),
            "naive" => {
                assert_eq!(r["target_copies"].as_u64().unwrap(), ops, "{r}");
                assert_eq!(r["target_copied_bytes_per_op"], 4096, "{r}");
            }
            other => panic!("unknown method {other}"),
        }
    }
    let p = &v["placement"];
    assert_eq!(p["checks"]["coalesced_target_copies"], 0, "{p}");
    assert!(
        p["checks"]["waste_above_naive"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{p}"
    );
    assert!(
        p["checks"]["coalesced_vs_two_writes_4k_h128"]["value"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert_eq!(p["planner"].as_array().unwrap().len(), 4, "{p}");
    assert!(!v["workers"].as_array().unwrap().is_empty(), "{v}");

    // A data size it cannot host: a usage error naming the option.
    let out = portico(&["bench", "placement", "--size", "0", "--hugepages", "off"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--size"));
}

/// `portico bench tagged` with tiny points (`--duration 0.02 --qd 16`), `extra` and `--json`:
/// its JSON object, the run checked to have succeeded without errors.
fn tagged_json(extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "bench",
        "tagged",
        "--duration",
        "0.02",
        "--qd",
        "16",
        "--json",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--hugepages", "off", "--memory-mb", "512"]);
    let out = portico(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["errors"], 0, "{v}");
    v
}

/// `bench tagged --sizes --depths --matching` in one process: only the points chosen, and
/// the target's ratio from them; `--sizes` keeps each part's points of that size.
#[test]
fn bench_tagged_runs_only_the_points_chosen() {
    let names = |v: &serde_json::Value| -> Vec<String> {
        let results = v["results"].as_array().unwrap();
        results
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect()
    };
    let v = tagged_json(&[
        "--part",
        "eager,baseline",
        "--sizes",
        "8",
        "--depths",
        "1000",
        "--matching",
        "exact",
    ]);
    assert_eq!(
        names(&v),
        ["eager-8B-d1000-exact-w16", "baseline-8B-d1000-exact-w16"],
        "{v}"
    );
    let points = &v["tagged"]["points"];
    assert_eq!(
        (&points["sizes"], &points["depths"], &points["matching"]),
        (
            &serde_json::json!([8]),
            &serde_json::json!([1000]),
            &serde_json::json!(["exact"])
        ),
        "the filter is in the JSON: {v}"
    );
    let ratios = &v["tagged"]["ratios"];
    assert!(
        ratios["eager_vs_baseline_depth1000"]["value"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{v}"
    );
    // The depth-1 points it compares with did not run.
    assert!(
        ratios["eager_depth1000_vs_depth1"]["value"].is_null(),
        "{v}"
    );
    // Where each pair ran: the tagged pair's worker, then the baseline's, each with a cache
    // line's round trip from the host's core to it.
    let workers: Vec<&str> = v["cores"]
        .as_array()
        .expect("cores")
        .iter()
        .map(|c| c["line_trips"][0]["workers"][0].as_str().unwrap())
        .collect();
    assert_eq!(workers, ["portico-tag", "portico-plain"], "{v}");
    let v = tagged_json(&[
        "--part",
        "eager,unexpected",
        "--sizes",
        "4K",
        "--depths",
        "1",
        "--matching",
        "wild",
    ]);
    assert_eq!(
        names(&v),
        ["eager-4096B-d1-wild-w1", "unexpected-4096B-w16"],
        "{v}"
    );
}

/// `bench tagged` with every part and tiny points: one JSON object whose results hold every
/// part's points, each with a nonzero rate, and whose `tagged` object holds the three target
/// ratios (measured) and the target's tag events.
#[test]
fn bench_tagged_runs_every_part_as_json() {
    let v = tagged_json(&[]);
    assert_eq!(v["type"], "bench");
    assert_eq!(v["op"], "tagged");
    let results = v["results"].as_array().unwrap();
    for part in ["eager", "unexpected", "rndv", "read", "baseline"] {
        assert!(
            results.iter().any(|r| r["part"] == part),
            "no {part} point: {v}"
        );
    }
    for r in results {
        for k in ["name", "op", "size", "window", "ops", "latency_ns"] {
            assert!(!r[k].is_null(), "{k}: {r}");
        }
        assert!(r["ops_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["latency_ns"]["p50"].as_u64().unwrap() > 0, "{r}");
    }
    let t = &v["tagged"];
    for k in [
        "eager_depth1000_vs_depth1",
        "eager_vs_baseline_depth1000",
        "rndv_vs_read_4mib",
    ] {
        let r = &t["ratios"][k];
        assert!(r["value"].as_f64().unwrap() > 0.0, "{k}: {t}");
        assert!(r["target"].as_f64().unwrap() > 0.0, "{k}: {t}");
        assert!(r["met"].is_boolean(), "{k}: {t}");
    }
    let e = &t["target_events"];
    for k in ["put", "put_overflow", "unexpected_consumed", "rendezvous"] {
        assert!(e[k].as_u64().unwrap() > 0, "{k}: {t}");
    }
    assert_eq!(e["stale"], 0, "{t}");
    assert!(!v["workers"].as_array().unwrap().is_empty(), "{v}");
    assert_eq!(v["ports"].as_array().unwrap().len(), 4, "two pairs: {v}");
}

#[test]
fn bench_congestion_reports_each_scheme_and_writes_the_series_and_the_plot() {
    let dir = std::env::temp_dir().join(format!("portico-congestion-{}", std::process::id()));
    // Two flows through a 2 Gbit/s bottleneck, `schedule`, and `extra`: the JSON it prints.
    let congestion = |schedule: &str, extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "bench",
            "congestion",
            "--flows",
            "2",
            "--bottleneck-gbps",
            "2",
            "--schedule",
            schedule,
            "--mtu",
            "4096",
            "--qd",
            "4",
            "--json",
            "--hugepages",
            "off",
            "--memory-mb",
            "1024",
            "--out",
            dir.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = portico(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("one JSON object")
    };
    let v = congestion("0-3000,500-1500", &["--cc", "none,ack"]);
    assert_eq!(
        (v["type"].as_str(), v["op"].as_str()),
        (Some("bench"), Some("congestion"))
    );
    assert_eq!(v["errors"], 0, "{v}");
    let ops: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["congestion-none", "congestion-ack"]);
    let c = &v["congestion"];
    assert_eq!(c["params"]["flows"], 2);
    assert_eq!(c["params"]["kmin_bytes"], 8000, "4 KB per Gbit/s");
    let schemes = c["schemes"].as_array().unwrap();
    for (s, cc) in schemes.iter().zip(["none", "ack"]) {
        assert_eq!(s["cc"], cc);
        for key in [
            "reaction_us",
            "recovery_us",
            "queue_p50_bytes",
            "queue_p99_bytes",
            "utilization",
            "drops",
            "jain",
            "fct",
            "flows",
        ] {
            assert!(s.get(key).is_some(), "{cc}: {key} in {s}");
        }
        assert!(s["messages"].as_u64().unwrap() > 0, "{s}");
        assert!(
            s["bottleneck"]["arrived_packets"].as_u64().unwrap() > 0,
            "{s}"
        );
    }
    assert_eq!(schemes[0]["rate_basis"], "measured");
    assert_eq!(schemes[1]["rate_basis"], "controller");
    let csv = std::fs::read_to_string(dir.join("congestion.csv")).unwrap();
    assert!(csv.starts_with("cc,time_us,aggregate_gbps,queue_bytes,marks,drops,flow_0_gbps"));
    assert!(csv.lines().any(|l| l.starts_with("ack,")));
    let svg = std::fs::read_to_string(dir.join("congestion.svg")).unwrap();
    assert!(svg.starts_with("<svg"));
    for label in ["none", "ack"] {
        assert!(
            svg.lines().any(|l| l.trim() == label),
            "{label} captions a column"
        );
    }
    // READ-heavy flows (`--reads`): B's ends READ, A's READ responses cross the bottleneck;
    // the data lands and the run says so.
    let v = congestion("0-2000,500-1500", &["--reads", "--cc", "ack"]);
    assert_eq!(v["errors"], 0, "{v}");
    assert_eq!(v["congestion"]["params"]["reads"], true);
    let s = &v["congestion"]["schemes"][0];
    assert!(s["messages"].as_u64().unwrap() > 0, "{s}");
    assert!(
        s["bottleneck"]["arrived_bytes"].as_u64().unwrap() > 100_000,
        "{s}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_congestion_bounds_name_their_argument_with_exit_2() {
    let bench = |extra: &[&str]| -> Vec<String> {
        let mut a = vec!["bench", "congestion", "--hugepages", "off"];
        a.extend_from_slice(extra);
        a.into_iter().map(String::from).collect()
    };
    for (extra, field) in [
        (&["--flows", "0"][..], "--flows"),
        (&["--flows", "17"], "--flows"),
        (&["--bottleneck-gbps", "0"], "--bottleneck-gbps"),
        (&["--rtt-us", "-1"], "--rtt-us"),
        (&["--pmax", "1.5"], "--pmax"),
        (&["--kmin-kb", "200", "--kmax-kb", "100"], "--kmin-kb"),
        (&["--schedule", "0-100"], "--schedule"),
        (&["--flows", "2", "--schedule", "0-100,50-10"], "--schedule"),
        (&["--keep-rate-us", "-1"], "--keep-rate-us"),
    ] {
        let args = bench(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_bad(&args, field, true);
    }
    // The congestion options belong to bench congestion alone.
    assert_bad(
        &["bench", "write", "--hugepages", "off", "--flows", "2"],
        "--keep-rate-us",
        true,
    );
}

#[test]
fn bench_shaper_paces_reads_to_the_absorb_rate_and_writes_the_series_and_the_plot() {
    let dir = std::env::temp_dir().join(format!("portico-shaper-{}", std::process::id()));
    let out = portico(&[
        "bench",
        "shaper",
        "--phases",
        "alone,paced,unpaced,served,served-free",
        "--reads",
        "4",
        "--duration",
        "0.3",
        "--mtu",
        "4096",
        "--qd",
        "4",
        "--json",
        "--hugepages",
        "off",
        "--memory-mb",
        "1024",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(
        (v["type"].as_str(), v["op"].as_str()),
        (Some("bench"), Some("shaper"))
    );
    let ops: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["op"].as_str().unwrap())
        .collect();
    assert_eq!(
        ops,
        [
            "shaper-alone",
            "shaper-paced",
            "shaper-unpaced",
            "shaper-served",
            "shaper-served-free"
        ]
    );
    let sh = &v["shaper"];
    assert_eq!(
        sh["params"]["class_names"],
        serde_json::json!(["reads", "writes1", "writes2"])
    );
    let phases = sh["phases"].as_array().unwrap();
    let (alone, paced, unpaced) = (&phases[0], &phases[1], &phases[2]);
    // Served: B answers A's READs; its READ responses pass its shaper in class `reads`, and
    // its outbound data keeps to the link it models. Served free: they bypass it.
    let (served, free) = (&phases[3], &phases[4]);
    for ph in [served, free] {
        assert_eq!(ph["errors"], 0, "{ph}");
        assert!(ph["reads"].as_u64().unwrap() > 0, "{ph}");
        assert!(ph["writes"].as_u64().unwrap() > 0, "{ph}");
    }
    assert!(
        served["classes"][0]["counters"]["packets"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(free["classes"][0]["counters"]["packets"], 0, "{free}");
    let over = served["outbound_over_link"].as_f64().unwrap();
    assert!(over <= 1.05, "served: outbound {over} x the link");
    // The READs' responses are 4 x 4 x 64 KiB at once without pacing, four times the
    // 256 KB absorb buffer: it overflows. Paced, never more than the absorb bucket is asked
    // for beyond the absorb rate, and the buffer holds it.
    assert_eq!(paced["drops"], 0, "{paced}");
    assert_eq!(paced["errors"], 0, "{paced}");
    assert!(paced["reads"].as_u64().unwrap() > 0, "{paced}");
    assert!(unpaced["drops"].as_u64().unwrap() > 0, "{unpaced}");
    assert_eq!(alone["reads"], 0);
    assert!(alone["writes"].as_u64().unwrap() > 0);
    for ph in phases {
        for key in [
            "inbound_gbps",
            "inbound_over_absorb",
            "retransmissions",
            "read_latency_ns",
            "classes",
            "queue_pairs",
            "mcus",
            "writes_over_alone",
        ] {
            assert!(ph.get(key).is_some(), "{key} in {ph}");
        }
        assert_eq!(ph["classes"].as_array().unwrap().len(), 3);
    }
    // The READ class is charged what its requests pull in (64 KiB READs as four sub-requests
    // of 4 response frames each); the WRITE classes only their ACKs, 62 bytes for a packet
    // that asks for one.
    let reads = &paced["classes"][0]["counters"];
    let per_read = 16_384 + 4 * 58 + 2 * 4;
    let (pulled, requests) = (
        reads["response_bytes"].as_u64().unwrap(),
        reads["packets"].as_u64().unwrap(),
    );
    if paced["retransmissions"] == 0 {
        assert_eq!(pulled, requests * per_read, "{reads}");
    } else {
        // A READ asked again after part of it came asks only for the rest.
        assert!(pulled <= requests * per_read, "{reads}");
    }
    let writes = &paced["classes"][1]["counters"];
    let acks = writes["response_bytes"].as_u64().unwrap();
    assert!(acks > 0 && acks % 62 == 0, "{writes}");
    assert!(acks / 62 <= writes["packets"].as_u64().unwrap(), "{writes}");
    assert!(
        reads["waited_in"].as_u64().unwrap() > 0,
        "READs waited for absorb tokens: {reads}"
    );
    assert_eq!(unpaced["classes"][0]["counters"]["waited_in"], 0);
    assert_eq!(paced["writes_over_alone"].as_array().unwrap().len(), 2);
    let csv = std::fs::read_to_string(dir.join("shaper.csv")).unwrap();
    assert!(csv.starts_with("phase,bin,t_us,inbound_gbps,absorb_gbps,queue_kb,drops,reads_gbps"));
    for phase in ["alone", "paced", "unpaced"] {
        assert!(
            csv.lines().any(|l| l.starts_with(&format!("{phase},"))),
            "{phase}"
        );
    }
    let svg = std::fs::read_to_string(dir.join("shaper.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_shaper_bounds_name_their_argument_with_exit_2() {
    let bench = |extra: &[&str]| -> Vec<String> {
        let mut a = vec!["bench", "shaper", "--hugepages", "off"];
        a.extend_from_slice(extra);
        a.into_iter().map(String::from).collect()
    };
    for (extra, field) in [
        (&["--reads", "0"][..], "--reads"),
        (&["--reads", "17"], "--reads"),
        (&["--write-shares", "0.8,0.5"], "--write-shares"),
        (&["--write-shares", "0"], "--write-shares"),
        (&["--absorb-gbps", "0"], "--absorb-gbps"),
        (&["--link-gbps", "-1"], "--link-gbps"),
        (&["--read-size", "0"], "--read-size"),
        (&["--buffer-kb", "0"], "--buffer-kb"),
        (&["--mcus", "0"], "--mcus"),
        (&["--outstanding-cap", "0"], "--outstanding-cap"),
        (&["--duration", "61"], "--duration"),
    ] {
        let args = bench(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_bad(&args, field, true);
    }
    // The shaper options belong to bench shaper alone.
    assert_bad(
        &["bench", "write", "--hugepages", "off", "--mcus", "2"],
        "--quantum",
        true,
    );
}

#[test]
fn bench_hlog_and_plot_write_interval_histograms_that_read_back_and_the_svgs() {
    let path = std::env::temp_dir().join(format!("portico-bench-{}.hlog", std::process::id()));
    let plots = std::env::temp_dir().join(format!("portico-bench-plots-{}", std::process::id()));
    let out = portico(&[
        "bench",
        "write",
        "--duration",
        "1.2",
        "--hlog",
        path.to_str().unwrap(),
        "--hlog-interval",
        "0.3",
        "--plot",
        plots.to_str().unwrap(),
        "--json",
        "--hugepages",
        "off",
        "--memory-mb",
        "1024",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let ops = v["results"][0]["ops"].as_u64().unwrap();
    // --plot: the two SVGs, named in the JSON.
    for name in ["latency.svg", "timeline.svg"] {
        let p = plots.join(name);
        let svg = std::fs::read_to_string(&p).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("write"), "{name}");
        assert!(
            v["plots"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x == p.to_str().unwrap()),
            "{v}"
        );
    }
    let _ = std::fs::remove_dir_all(&plots);
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("#[StartTime: "), "{text}");
    let intervals = portico::latency::read_interval_log(&bytes).unwrap();
    // 1.2 s in 0.3 s intervals: four, and one or two for the last completions after.
    assert!((4..=6).contains(&intervals.len()), "{}", intervals.len());
    assert!(intervals.iter().all(|i| i.tag.as_deref() == Some("write")));
    // Every operation is in exactly one interval, and the intervals follow each other.
    let total: u64 = intervals.iter().map(|i| i.histogram.len()).sum();
    assert_eq!(total, ops);
    // (The log gives times to the millisecond.)
    let ms = std::time::Duration::from_millis(1);
    for w in intervals.windows(2) {
        let end = w[0].start + w[0].duration;
        assert!(end + ms >= w[1].start && w[1].start + ms >= end, "{:?}", w);
    }
    assert_bad(
        &[
            "bench",
            "write",
            "--hugepages",
            "off",
            "--hlog-interval",
            "0",
        ],
        "--hlog-interval",
        true,
    );
    assert_bad(
        &[
            "bench",
            "tagged",
            "--hugepages",
            "off",
            "--hlog",
            "/tmp/x.hlog",
        ],
        "--plot",
        true,
    );
}

/// A sweep: every size at every queue depth (queue depth outer), each point in the JSON, the
/// CSV, the `.hlog` (tagged by point) and the sweep plot, with every byte verified.
#[test]
fn bench_sweep_runs_every_point_into_one_json_one_csv_one_hlog_and_the_plots() {
    let tmp = std::env::temp_dir().join(format!("portico-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let (csv, hlog, plots) = (tmp.join("s.csv"), tmp.join("s.hlog"), tmp.join("plots"));
    let out = portico(&[
        "bench",
        "read",
        "--sizes",
        "64,4K",
        "--qd",
        "4,16",
        "--duration",
        "0.3",
        "--verify",
        "--csv",
        csv.to_str().unwrap(),
        "--hlog",
        hlog.to_str().unwrap(),
        "--plot",
        plots.to_str().unwrap(),
        "--json",
        "--hugepages",
        "off",
        "--memory-mb",
        "1024",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Progress: point n of m, with the time left.
    for n in 1..=4 {
        assert!(stderr.contains(&format!("point {n}/4: ")), "{stderr}");
    }
    assert!(stderr.contains("s left)"), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["interrupted"], false);
    assert_eq!(v["errors"], 0, "{v}");
    let order = [(64, 4), (4096, 4), (64, 16), (4096, 16)];
    let points = v["points"].as_array().unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(points.len(), 4, "{v}");
    assert_eq!(results.len(), 4, "{v}");
    let mut ops = Vec::new();
    for (i, &(size, qd)) in order.iter().enumerate() {
        assert_eq!(points[i]["size"], size);
        assert_eq!(points[i]["qd"], qd);
        let r = &results[i];
        assert_eq!(
            (r["op"].as_str(), r["size"].as_u64(), r["qd"].as_u64()),
            (Some("read"), Some(size), Some(qd as u64))
        );
        assert_eq!(points[i]["results"][0]["ops"], r["ops"]);
        let n = r["ops"].as_u64().unwrap();
        assert!(n > 0, "{r}");
        ops.push(n);
    }
    assert_eq!(
        v["verify"]["checked_ops"].as_u64().unwrap(),
        ops.iter().sum::<u64>(),
        "every READ compared"
    );
    assert_eq!(v["verify"]["mismatches"], 0);
    // The CSV: a header and a row per point, with the JSON's counts.
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<&str> = text.lines().collect();
    assert!(rows[0].starts_with("op,size,qd,ops,"), "{text}");
    assert_eq!(rows.len(), 5, "{text}");
    for (i, &(size, qd)) in order.iter().enumerate() {
        assert!(
            rows[i + 1].starts_with(&format!("read,{size},{qd},{},", ops[i])),
            "{text}"
        );
    }
    // The .hlog: each point's operations under its own tag, every one of them once.
    let bytes = std::fs::read(&hlog).unwrap();
    let intervals = portico::latency::read_interval_log(&bytes).unwrap();
    for (i, &(size, qd)) in order.iter().enumerate() {
        let tag = format!("read-{size}B-qd{qd}");
        let n: u64 = intervals
            .iter()
            .filter(|x| x.tag.as_deref() == Some(tag.as_str()))
            .map(|x| x.histogram.len())
            .sum();
        assert_eq!(n, ops[i], "{tag}");
    }
    // The plots: the sweep's against size, with a line per queue depth.
    let sweep = std::fs::read_to_string(plots.join("sweep.svg")).unwrap();
    assert!(sweep.contains("read qd 4") && sweep.contains("read qd 16"));
    assert!(sweep.contains("message size") && sweep.contains("4K"));
    for name in ["latency.svg", "timeline.svg", "sweep.svg"] {
        let p = plots.join(name);
        assert!(
            v["plots"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x == p.to_str().unwrap()),
            "{name}: {v}"
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
    // A sweep's bad arguments name their flag, before EAL starts.
    // (A size that does not parse is clap's error: exit 2, naming the flag and the value.)
    let out = portico(&["bench", "write", "--hugepages", "off", "--sizes", "64,5X"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--sizes") && err.contains("\"5X\" is not a size"),
        "{err}"
    );
    assert_bad(
        &[
            "bench",
            "write",
            "--hugepages",
            "off",
            "--sizes",
            "64",
            "--size",
            "64",
        ],
        "--sizes",
        true,
    );
    assert_bad(
        &["bench", "write", "--hugepages", "off", "--qd", "8,121"],
        "--qd",
        true,
    );
    assert_bad(
        &["bench", "tagged", "--hugepages", "off", "--qd", "8,16"],
        "--qd",
        true,
    );
}

/// Ctrl-C in a sweep ends the current point cleanly (it drains what is outstanding) and the
/// run, and everything measured until then is still printed and written.
#[test]
fn ctrl_c_in_a_sweep_ends_the_point_and_writes_what_was_measured() {
    use std::io::BufRead;
    let csv = std::env::temp_dir().join(format!("portico-sweep-int-{}.csv", std::process::id()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_portico"))
        .args(["bench", "write", "--all-sizes", "--duration", "1", "--json"])
        .args(["--csv", csv.to_str().unwrap()])
        .args(["--hugepages", "off", "--memory-mb", "1024"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "bench ended early: {seen}"
        );
        seen.push_str(&line);
        if line.starts_with("point 2/23: 4 B") {
            break;
        }
    }
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["interrupted"], true, "{v}");
    assert_eq!(v["errors"], 0, "drained, not abandoned: {v}");
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 2, "{v}");
    assert_eq!(points[0]["interrupted"], false);
    assert_eq!(points[1]["interrupted"], true);
    assert!(points[1]["seconds"].as_f64().unwrap() < 1.0, "{v}");
    let text = std::fs::read_to_string(&csv).unwrap();
    let _ = std::fs::remove_file(&csv);
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(
        text.lines().nth(2).unwrap().starts_with("write,4,64,"),
        "{text}"
    );
}

/// The flags `portico bench <scenario> --help` lists (its lines that start with `--flag`).
fn bench_help_flags(scenario: &str) -> Vec<String> {
    let out = portico(&["bench", scenario, "--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "bench {scenario} --help: {text}");
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .map(|l| format!("--{}", l.split([' ', ',']).next().unwrap()))
        .collect()
}

/// Each scenario of `portico bench` is its own subcommand: its --help lists the flags it
/// honours and none of another scenario's.
#[test]
fn each_bench_scenario_s_help_lists_only_its_own_flags() {
    let out = portico(&["bench", "--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for s in [
        "write",
        "read",
        "send",
        "mixed",
        "persist",
        "tagged",
        "placement",
        "congestion",
        "shaper",
    ] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(s)),
            "{s}: {text}"
        );
    }
    for (scenario, has, lacks) in [
        (
            "write",
            &[
                "--size", "--qd", "--sizes", "--cores", "--verify", "--hlog", "--server", "--mtu",
            ][..],
            &[
                "--flows", "--mcus", "--part", "--mode", "--file", "--rtt-us", "--out",
            ][..],
        ),
        (
            "mixed",
            &["--size", "--verify", "--client", "--connections"],
            &["--schedule", "--phases", "--part"],
        ),
        (
            "persist",
            &["--mode", "--file", "--size", "--qd", "--server", "--hgrm"],
            &["--verify", "--cores", "--part", "--flows"],
        ),
        (
            "tagged",
            &[
                "--part",
                "--qd",
                "--duration",
                "--server",
                "--client",
                "--cores",
            ],
            &["--connections", "--verify", "--mode", "--mcus"],
        ),
        (
            "placement",
            &["--size", "--qd", "--duration", "--json"],
            &[
                "--rate", "--verify", "--hgrm", "--pcap", "--server", "--sizes", "--part",
            ],
        ),
        (
            "congestion",
            &[
                "--cc",
                "--flows",
                "--rtt-us",
                "--rate-window-us",
                "--out",
                "--qd",
            ],
            &[
                "--size",
                "--duration",
                "--verify",
                "--server",
                "--mcus",
                "--sizes",
                "--pcap",
            ],
        ),
        (
            "shaper",
            &[
                "--phases",
                "--mcus",
                "--quantum",
                "--rtt-us",
                "--duration",
                "--qd",
            ],
            &[
                "--flows", "--cc", "--size", "--verify", "--server", "--rate",
            ],
        ),
    ] {
        let flags = bench_help_flags(scenario);
        for f in has {
            assert!(
                flags.iter().any(|x| x == f),
                "bench {scenario}: {f} missing: {flags:?}"
            );
        }
        for f in lacks {
            assert!(
                !flags.iter().any(|x| x == f),
                "bench {scenario}: {f} listed: {flags:?}"
            );
        }
    }
}

/// A flag of another scenario is refused by clap before anything starts (exit 2, one line
/// naming the flag and the scenarios that take it), as is a bench flag before the scenario.
#[test]
fn a_flag_of_another_bench_scenario_is_refused_with_exit_2() {
    for (args, field, owner) in [
        (&["bench", "congestion", "--size", "64"][..], "--size", ""),
        (
            &["bench", "congestion", "--duration", "1"],
            "--duration",
            "",
        ),
        (
            &["bench", "placement", "--verify"],
            "--verify",
            "bench write, read, send and mixed",
        ),
        (
            &["bench", "shaper", "--flows", "2"],
            "--flows",
            "only bench congestion takes",
        ),
        (
            &["bench", "tagged", "--cores", "2"],
            "--cores",
            "needs --server or --client",
        ),
        (
            &["bench", "write", "--part", "eager"],
            "--part",
            "only bench tagged takes",
        ),
        (
            &["bench", "read", "--depths", "1000"],
            "--depths",
            "only bench tagged takes",
        ),
        (
            &["bench", "write", "--mode", "durable"],
            "--mode",
            "only bench persist takes",
        ),
        (
            &["bench", "write", "--rtt-us", "5"],
            "--rtt-us",
            "bench congestion and shaper",
        ),
        (
            &["bench", "--size", "64", "write"],
            "--size",
            "portico bench write --size",
        ),
    ] {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--hugepages", "off"]);
        assert_bad(&all, field, true);
        let err = String::from_utf8_lossy(&portico(&all).stderr).into_owned();
        assert!(err.contains(owner), "{args:?}: {err}");
    }
}

/// clap's ranges, conflicts and requirements: exit 2, one line naming the flag, before EAL.
#[test]
fn bench_ranges_conflicts_and_requirements_name_the_flag_with_exit_2() {
    for (args, field) in [
        (&["bench", "congestion", "--flows", "17"][..], "--flows"),
        (
            &["bench", "shaper", "--read-size", "1048577"],
            "--read-size",
        ),
        (&["bench", "shaper", "--quantum", "0"], "--quantum"),
        (&["bench", "placement", "--qd", "121"], "--qd"),
        (
            &["bench", "persist", "--mode", "durable", "--qd", "0"],
            "--qd",
        ),
        (&["bench", "write", "--connections", "257"], "--connections"),
        (&["bench", "write", "--cores", "17"], "--cores"),
        (&["bench", "persist", "--mode", "sometimes"], "--mode"),
        (&["bench", "persist"], "--mode"),
        (
            &["bench", "write", "--all-sizes", "--sizes", "64"],
            "--all-sizes",
        ),
        (&["bench", "write", "--cc", "ack"], "--cc"),
        (&["bench", "write", "--listen", "127.0.0.1:1"], "--listen"),
        // In one process `--sizes` chooses among the parts' points: one that no part runs,
        // or a depth no point has, is named; so are the eager and baseline points' filters
        // with neither part, or across two processes.
        (&["bench", "tagged", "--sizes", "64,100"], "--sizes"),
        (
            &["bench", "tagged", "--part", "rndv", "--sizes", "4K"],
            "--sizes",
        ),
        (&["bench", "tagged", "--depths", "1,10"], "--depths"),
        (
            &["bench", "tagged", "--part", "rndv", "--depths", "1000"],
            "--depths",
        ),
        (&["bench", "tagged", "--matching", "fuzzy"], "--matching"),
        (
            &[
                "bench", "tagged", "--depths", "1000", "--client", "h", "--dev", "x", "--ip",
                "10.0.0.1",
            ],
            "--depths",
        ),
        (&["bench", "tagged", "--size", "64"], "--size"),
        (
            &["bench", "persist", "--mode", "durable", "--rate", "10"],
            "--rate",
        ),
        (
            &[
                "bench", "tagged", "--part", "eager", "--server", "--dev", "x", "--ip", "10.0.0.1",
            ],
            "--part",
        ),
    ] {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--hugepages", "off"]);
        assert_bad(&all, field, true);
    }
}

/// The bench spellings of the README, docs/, bench/*.sh and the Makefile still parse (clap
/// reads every flag and value before it acts on --help).
#[test]
fn documented_bench_spellings_still_parse() {
    for args in [
        "write --size 64 --qd 64 --rate 10000 --duration 5 --json --polling adaptive",
        "write --sizes 64,512,4K,64K,1M --qd 1,32 --duration 1 --plot plots --csv sweep.csv --hlog sweep.hlog",
        "write --size 4096 --verify --cores 2 --connections 4 --hgrm w.hgrm",
        "read --all-sizes --qd 8",
        "read --size 65536 --qd 16 --mtu 4096 --hgrm read.hgrm",
        "mixed --size 600 --qd 4 --mtu 256 --rate 3000 --duration 1 --pcap mixed.pcapng",
        "write --server --listen 0.0.0.0:18515 --dev net_memif0,role=server,socket=/tmp/b.sock --ip 10.0.0.1 --cc dcqcn",
        "write --client hostA --dev 0000:3b:00.0 --ip 192.168.10.2 --mac 02:00:00:00:00:01 --sizes 64,4K,64K --qd 1,32",
        "persist --mode write-flush --qd 8 --size 256 --duration 1 --json --file /tmp/region",
        "persist --mode durable --server --file /tmp/region --dev net_null0 --ip 10.0.0.1",
        "tagged --duration 0.4 --json --part eager,rndv --qd 16",
        "tagged --part eager,baseline --sizes 8 --depths 1000 --matching exact",
        "tagged --client 10.0.0.1 --dev net_null0 --ip 10.0.0.2 --sizes 4K,64K --qd 4 --rate 1000",
        "placement --size 4096 --duration 0.02 --qd 16",
        "congestion --mtu 4096 --cc none,dcqcn,ack --flows 4 --bottleneck-gbps 10 --rtt-us 20 --kmin-kb 40 --kmax-kb 160 --pmax 0.2 --buffer-kb 640 --schedule 0-3000,500-1500,0-1,0-1 --dcqcn paper --rate-window-us 20 --out dir",
        "shaper --mtu 4096 --qd 8 --json --out dir --phases alone,paced --reads 4 --read-size 4096 --writes 1 --write-size 4096 --write-shares 0.75,0.25 --absorb-gbps 2 --absorb-burst-kb 8 --link-gbps 3 --mcus 16 --outstanding-cap 64 --quantum 4096 --buffer-kb 100 --rtt-us 10 --duration 1",
    ] {
        let mut all = vec!["bench"];
        all.extend(args.split(' '));
        all.extend(["--hugepages", "off", "--memory-mb", "512", "--help"]);
        let out = portico(&all);
        assert!(
            out.status.success(),
            "bench {args}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
