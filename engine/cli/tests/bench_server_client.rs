//! `portico bench <op> --server` and `--client` as two real processes on this machine, each
//! with its own DPDK port, joined by `net_memif`, with the exchange over loopback TCP: a SEND
//! sweep whose every SEND the server counts as received, a READ run, and exchanges that are
//! refused (another op, a size the server does not host, another version, no server), each
//! with one line on both sides that says why. Every wait has a deadline; the processes are
//! killed if the test fails.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod child;
use child::{lines, wait};

/// The runs share this machine's two cores: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const DEADLINE: Duration = Duration::from_secs(90);

/// A running server: killed when dropped, unless it was waited for.
struct Server {
    child: Option<Child>,
    /// Its stderr lines (the human text, with --json).
    err: mpsc::Receiver<String>,
    addr: String,
    sock: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.sock);
    }
}

fn sock(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("portico-bsc-{tag}-{}.sock", std::process::id()))
}

const EAL: [&str; 4] = ["--hugepages", "off", "--memory-mb", "512"];

/// Starts `portico bench <args> --server` on a fresh memif socket and an OS-chosen TCP port,
/// and waits for its `listening on` line.
fn server(tag: &str, args: &[&str]) -> Server {
    let sock = sock(tag);
    let _ = std::fs::remove_file(&sock);
    let dev = format!("net_memif0,role=server,id=0,socket={}", sock.display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_portico"))
        .arg("bench")
        .args(args)
        .args(["--server", "--listen", "127.0.0.1:0", "--dev", &dev])
        .args(["--ip", "10.77.0.1", "--json"])
        .args(EAL)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("portico runs");
    let err = lines(child.stderr.take().unwrap());
    let mut s = Server {
        child: Some(child),
        err,
        addr: String::new(),
        sock,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while s.addr.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = s
            .err
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no listening line: {seen:?}"));
        if let Some(rest) = line.split(" listening on ").nth(1) {
            s.addr = rest.split_whitespace().next().unwrap().to_string();
        }
        seen.push(line);
    }
    s
}

/// Runs `portico bench <args> --client <addr>` on the other end of `s`'s memif socket.
fn client(s: &Server, args: &[&str]) -> Output {
    let dev = format!("net_memif0,role=client,id=0,socket={}", s.sock.display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_portico"))
        .arg("bench")
        .args(args)
        .args([
            "--client",
            &s.addr,
            "--dev",
            &dev,
            "--ip",
            "10.77.0.2",
            "--json",
        ])
        .args(EAL)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("portico runs");
    let (out, err) = (
        lines(child.stdout.take().unwrap()),
        lines(child.stderr.take().unwrap()),
    );
    let status = wait(&mut child, DEADLINE, "the client");
    let collect = |rx: mpsc::Receiver<String>| -> Vec<u8> {
        let mut v = Vec::new();
        while let Ok(l) = rx.recv_timeout(Duration::from_secs(2)) {
            v.extend_from_slice(l.as_bytes());
            v.push(b'\n');
        }
        v
    };
    Output {
        status,
        stdout: collect(out),
        stderr: collect(err),
    }
}

/// Runs the client (as [`client`]); it must succeed. Returns its JSON summary and its stderr.
fn client_json(s: &Server, args: &[&str]) -> (serde_json::Value, String) {
    let out = client(s, args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "client: {stderr}");
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("one JSON object ({e}): {stderr}"));
    (v, stderr)
}

/// Waits for the server to exit: its status, its stdout, and its stderr lines.
fn finish(mut s: Server) -> (std::process::ExitStatus, String, Vec<String>) {
    let mut child = s.child.take().unwrap();
    let status = wait(
        &mut child,
        Duration::from_secs(30),
        "the server, after its client,",
    );
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    let mut err = Vec::new();
    while let Ok(l) = s.err.recv_timeout(Duration::from_secs(2)) {
        err.push(l);
    }
    (status, out, err)
}

/// Checks a client's JSON: no errors, one result of `op` per size of `sizes` (in order), each
/// with operations done, and the server's report of as many messages landed, none in error.
/// Returns the messages sent.
fn every_message_landed(v: &serde_json::Value, op: &str, sizes: &[u64]) -> u64 {
    assert_eq!(v["errors"], 0, "{v}");
    let results = v["results"].as_array().unwrap();
    let got: Vec<(Option<&str>, Option<u64>)> = results
        .iter()
        .map(|r| (r["op"].as_str(), r["size"].as_u64()))
        .collect();
    let want: Vec<(Option<&str>, Option<u64>)> =
        sizes.iter().map(|&b| (Some(op), Some(b))).collect();
    assert_eq!(got, want, "{v}");
    assert!(
        results.iter().all(|r| r["ops"].as_u64().unwrap() > 0),
        "{v}"
    );
    let sent: u64 = results.iter().map(|r| r["ops"].as_u64().unwrap()).sum();
    assert_eq!(v["server"]["receives"].as_u64(), Some(sent), "{v}");
    assert_eq!(v["server"]["receive_errors"], 0);
    sent
}

fn last_error(text: &str) -> String {
    text.lines()
        .rfind(|l| l.starts_with("portico: error: "))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_send_sweep_runs_across_two_processes_and_the_server_receives_every_send() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = server("send", &["send"]);
    let (v, stderr) = client_json(
        &s,
        &["send", "--sizes", "64,4K", "--qd", "4", "--duration", "0.4"],
    );
    assert!(stderr.contains("against the server 127.0.0.1:"), "{stderr}");
    // The server's side, as it reported it to the client: every SEND acknowledged to the
    // client was received into a buffer the server posted, none in error.
    let sent = every_message_landed(&v, "send", &[64, 4096]);
    let (status, out, err) = finish(s);
    assert!(status.success(), "server: {err:?}");
    let r: serde_json::Value = serde_json::from_str(&out).expect("the server's JSON");
    assert_eq!(r["role"], "server");
    assert_eq!(r["server"]["receives"].as_u64(), Some(sent), "{r}");
    assert!(
        err.iter().any(|l| l.contains("serving 127.0.0.1:")),
        "{err:?}"
    );
}

#[test]
fn a_read_run_across_two_processes_completes_every_read() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = server("read", &["read"]);
    let (v, _) = client_json(
        &s,
        &["read", "--size", "8192", "--qd", "8", "--duration", "0.5"],
    );
    assert_eq!(v["errors"], 0, "{v}");
    let r = &v["results"][0];
    assert_eq!(
        (r["op"].as_str(), r["size"].as_u64()),
        (Some("read"), Some(8192))
    );
    let reads = r["ops"].as_u64().unwrap();
    assert!(reads > 0);
    // Each 8 KiB READ came back in 8 response packets of 1 KiB (MTU 1024), at least.
    let rx = v["ports"][0]["stats"]["rx_packets"].as_u64().unwrap();
    assert!(rx >= 8 * reads, "{rx} packets for {reads} READs");
    let (status, _, err) = finish(s);
    assert!(status.success(), "server: {err:?}");
}

#[test]
fn durable_writes_across_two_processes_land_in_the_servers_file() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let file = std::env::temp_dir().join(format!("portico-bsc-region-{}", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let s = server(
        "durable",
        &[
            "persist",
            "--mode",
            "durable",
            "--file",
            file.to_str().unwrap(),
        ],
    );
    let (v, _) = client_json(
        &s,
        &[
            "persist",
            "--mode",
            "durable",
            "--size",
            "256",
            "--qd",
            "8",
            "--duration",
            "0.4",
        ],
    );
    assert_eq!(v["errors"], 0, "{v}");
    let r = &v["results"][0];
    assert_eq!(r["op"], "durable", "{v}");
    assert!(r["ops"].as_u64().unwrap() > 0, "{v}");
    // The server persisted what landed, into the file it was given, and failed nothing.
    assert_eq!(v["server"]["region"]["file"], file.to_str().unwrap(), "{v}");
    // (A worker's counters are [name, value] pairs.)
    let counter = |name: &str| {
        v["server"]["workers"][0]["counters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c[0] == name)
            .and_then(|c| c[1].as_u64())
    };
    assert!(counter("persist_jobs").unwrap() > 0, "{v}");
    assert_eq!(counter("persist_failures"), Some(0));
    let (status, _, err) = finish(s);
    assert!(status.success(), "server: {err:?}");
    // The file holds the client's bytes where the first WRITE went.
    let bytes = std::fs::read(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(
        bytes[..256].iter().all(|&b| b == 0x5a),
        "{:?}",
        &bytes[..16]
    );
}

#[test]
fn tagged_sends_across_two_processes_are_matched_by_the_server_eager_and_rendezvous() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = server("tagged", &["tagged"]);
    // 4 KiB goes eager; 64 KiB is above the 16 KiB threshold and goes by rendezvous (the
    // server READs the rest).
    let (v, _) = client_json(
        &s,
        &[
            "tagged",
            "--sizes",
            "4K,64K",
            "--qd",
            "8",
            "--duration",
            "0.4",
        ],
    );
    // Every tagged send the client saw complete was matched and landed at the server.
    every_message_landed(&v, "tagged", &[4096, 65536]);
    let (status, _, err) = finish(s);
    assert!(status.success(), "server: {err:?}");
}

#[test]
fn tagged_sends_over_two_workers_are_matched_on_the_worker_that_homes_their_endpoint() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = server("tagged2", &["tagged", "--cores", "2"]);
    let (v, _) = client_json(
        &s,
        &[
            "tagged",
            "--cores",
            "2",
            "--size",
            "4096",
            "--qd",
            "8",
            "--duration",
            "0.4",
        ],
    );
    let sent = every_message_landed(&v, "tagged", &[4096]);
    // Connection i sends to endpoint i, homed on the server's worker i: each worker matched
    // its own, none was refused for an endpoint homed elsewhere.
    let counter = |w: &serde_json::Value, name: &str| -> u64 {
        w["counters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c[0] == name)
            .and_then(|c| c[1].as_u64())
            .unwrap_or_else(|| panic!("no counter {name}: {w}"))
    };
    let workers = v["server"]["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2, "{v}");
    let matched: Vec<u64> = workers
        .iter()
        .map(|w| counter(w, "tag_matched_priority"))
        .collect();
    assert!(matched.iter().all(|&m| m > 0), "{matched:?}");
    assert_eq!(matched.iter().sum::<u64>(), sent);
    assert!(workers.iter().all(|w| counter(w, "tag_wrong_engine") == 0));
    let (status, _, err) = finish(s);
    assert!(status.success(), "server: {err:?}");
}

#[test]
fn the_client_s_congestion_control_is_the_server_s_queue_pairs_too() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = server("cc", &["write"]);
    let (v, _) = client_json(
        &s,
        &[
            "write",
            "--cc",
            "ack",
            "--size",
            "4096",
            "--duration",
            "0.3",
        ],
    );
    assert_eq!(v["errors"], 0, "{v}");
    assert_eq!(v["server"]["cc"], "ack", "{v}");
    let (status, _, _) = finish(s);
    assert!(status.success());
    // A server that names another scheme refuses.
    let s = server("cc2", &["write", "--cc", "dcqcn"]);
    let out = client(&s, &["write", "--cc", "ack", "--duration", "0.2"]);
    assert_eq!(out.status.code(), Some(1));
    let line = last_error(&String::from_utf8_lossy(&out.stderr));
    assert!(
        line.ends_with(
            "congestion control: the server runs --cc dcqcn, the client asked for --cc ack"
        ),
        "{line}"
    );
    let (status, _, _) = finish(s);
    assert_eq!(status.code(), Some(1));
}

#[test]
fn a_refused_exchange_gives_one_line_on_both_sides() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Another op.
    let s = server("op", &["write"]);
    let out = client(&s, &["read", "--duration", "0.2"]);
    assert_eq!(out.status.code(), Some(1));
    let line = last_error(&String::from_utf8_lossy(&out.stderr));
    assert!(
        line.contains(
            " refused: wrong op: the server runs bench write, the client asked for bench read"
        ),
        "{line}"
    );
    let (status, _, err) = finish(s);
    assert_eq!(status.code(), Some(1));
    let line = last_error(&err.join("\n"));
    assert!(
        line.starts_with("portico: error: refused the client 127.0.0.1:")
            && line.ends_with(
                "wrong op: the server runs bench write, the client asked for bench read"
            ),
        "{line}"
    );
    // A size the server does not host (its --size).
    let s = server("size", &["write", "--size", "4096"]);
    let out = client(&s, &["write", "--sizes", "64,64K", "--duration", "0.2"]);
    assert_eq!(out.status.code(), Some(1));
    let line = last_error(&String::from_utf8_lossy(&out.stderr));
    assert!(
        line.contains(" refused: size 65536 B: the server hosts messages of at most 4096 B"),
        "{line}"
    );
    let (status, _, err) = finish(s);
    assert_eq!(status.code(), Some(1));
    assert!(
        last_error(&err.join("\n")).contains("size 65536 B"),
        "{err:?}"
    );
    // Another version of the exchange, spoken by hand.
    let s = server("version", &["write"]);
    let mut tcp = std::net::TcpStream::connect(&s.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    tcp.write_all(b"{\"protocol\":\"portico-bench\",\"version\":99,\"op\":\"write\"}\n")
        .unwrap();
    let mut answer = String::new();
    BufReader::new(&tcp).read_line(&mut answer).unwrap();
    let a: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(a["msg"], "refused");
    assert_eq!(
        a["reason"],
        "version mismatch: the client speaks portico-bench version 99, this server 1"
    );
    let (status, _, err) = finish(s);
    assert_eq!(status.code(), Some(1));
    assert!(
        last_error(&err.join("\n")).contains("version mismatch"),
        "{err:?}"
    );
    // No server at all: the client says where it looked.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap().to_string();
    drop(free);
    let out = Command::new(env!("CARGO_BIN_EXE_portico"))
        .args(["bench", "write", "--client", &addr, "--dev", "net_null0"])
        .args(["--ip", "10.77.0.2"])
        .args(EAL)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let line = last_error(&String::from_utf8_lossy(&out.stderr));
    assert!(
        line.starts_with(&format!("portico: error: --client {addr}: "))
            && line.contains("(is `portico bench write --server` running there?)"),
        "{line}"
    );
}

#[test]
fn server_and_client_flags_are_checked_before_anything_starts() {
    // Each must end at once; one that went on (a server waiting for its client) is killed.
    let run = |args: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_portico"))
            .args(args)
            .args(EAL)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait(&mut child, Duration::from_secs(30), &format!("{args:?}"));
        child.wait_with_output().unwrap()
    };
    for (args, field) in [
        (
            &[
                "bench",
                "placement",
                "--server",
                "--dev",
                "net_null0",
                "--ip",
                "10.0.0.1",
            ][..],
            "--server",
        ),
        (
            &[
                "bench",
                "write",
                "--client",
                "127.0.0.1",
                "--dev",
                "net_null0",
                "--ip",
                "10.0.0.1",
                "--verify",
            ][..],
            "--verify",
        ),
        (
            &[
                "bench",
                "write",
                "--client",
                "127.0.0.1",
                "--dev",
                "net_null0",
                "--ip",
                "10.0.0.1",
                "--mac",
                "zz",
            ][..],
            "--mac",
        ),
        (&["bench", "write", "--dev", "net_null0"][..], "--dev"),
        (
            &[
                "bench",
                "persist",
                "--mode",
                "write-read",
                "--client",
                "127.0.0.1",
                "--dev",
                "net_null0",
                "--ip",
                "10.0.0.1",
            ][..],
            "--mode",
        ),
    ] {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.trim_end().lines().count() == 1
                && err.starts_with(&format!("portico: error: {field}: ")),
            "{args:?}: {err}"
        );
    }
    // --server needs its port (clap: exit 2, naming what is missing).
    let out = run(&["bench", "write", "--server"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dev"));
}

#[test]
fn with_cm_the_queue_pair_is_connected_through_the_cm_and_every_send_lands() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = server("cm", &["send", "--cm", "--cc", "ack"]);
    let (v, _) = client_json(
        &s,
        &[
            "send",
            "--size",
            "256",
            "--qd",
            "4",
            "--duration",
            "0.4",
            "--cm",
            "--cc",
            "ack",
        ],
    );
    every_message_landed(&v, "send", &[256]);
    // The client's engine connected once through its CM (ARP, REQ, REP, RTU), settled `ack`
    // with the server in the REQ's and REP's Portico block, and ended the connection (DREQ,
    // DREP) before it stopped.
    let text = v.to_string();
    for k in [
        "[\"cm_established\",1]",
        "[\"cm_disconnected\",1]",
        "[\"cm_qps_destroyed\",1]",
        "[\"arp_requests\",1]",
        "[\"cm_cc_negotiated\",1]",
        "[\"cm_cc_fallbacks\",0]",
    ] {
        assert!(text.contains(k), "{k}: {v}");
    }
    let (status, out, err) = finish(s);
    assert!(status.success(), "server: {err:?}");
    let r: serde_json::Value = serde_json::from_str(&out).expect("the server's JSON");
    let r = r.to_string();
    for k in [
        "[\"cm_established\",1]",
        "[\"cm_events_dropped\",0]",
        "[\"cm_cc_negotiated\",1]",
        "[\"cm_cc_fallbacks\",0]",
    ] {
        assert!(r.contains(k), "{k}: {r}");
    }
}

#[test]
fn a_client_without_cm_is_refused_by_a_server_with_it() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = server("nocm", &["write", "--cm"]);
    let out = client(&s, &["write", "--duration", "0.2"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        last_error(&stderr).contains("both sides connect through the CM or neither"),
        "{stderr}"
    );
    let (status, _, _) = finish(s);
    assert!(!status.success());
}
