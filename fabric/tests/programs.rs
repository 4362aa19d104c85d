//! Unmodified libfabric programs over the provider: Debian's `fi_info` and `fi_pingpong`
//! (`libfabric-bin`) load `libportico-fi.so` from `FI_PROVIDER_PATH` and run over a
//! `net_memif` link between two processes, with `fi_pingpong -c` checking every byte.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use common::{build_c, fi, provider_dir, text};

#[test]
fn fi_info_lists_the_provider_its_endpoint_and_its_parameters() {
    let dir = provider_dir();
    let out = fi("fi_info", &dir)
        .args(["-p", "portico", "-v"])
        .env("FI_PORTICO_DEV", "net_tap0,iface=pfi0")
        .env("FI_PORTICO_IP", "10.77.0.1")
        .output()
        .expect("fi_info (libfabric-bin, scripts/install-deps.sh)");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for want in [
        "prov_name: portico",
        "name: portico",
        "name: net_tap0",
        "type: FI_EP_RDM",
        "FI_MSG",
        "FI_TAGGED",
        "FI_DIRECTED_RECV",
        "FI_THREAD_SAFE",
        "FI_PROGRESS_AUTO",
        "FI_MR_PROV_KEY",
        "FI_MR_VIRT_ADDR",
        "FI_SOCKADDR_IN",
        "inject_size: 256",
    ] {
        assert!(t.contains(want), "fi_info -v lacks {want:?}:\n{t}");
    }
    // Every parameter is declared, so `fi_info -e` lists it.
    let env = fi("fi_info", &dir).arg("-e").output().unwrap();
    let e = text(&env);
    for p in [
        "FI_PORTICO_DEV",
        "FI_PORTICO_IP",
        "FI_PORTICO_CORES",
        "FI_PORTICO_EAL",
        "FI_PORTICO_POLLING",
    ] {
        assert!(e.contains(p), "fi_info -e lacks {p}");
    }
    // Not configured: nothing offered, no error.
    let none = fi("fi_info", &dir)
        .args(["-p", "portico"])
        .output()
        .unwrap();
    assert!(!none.status.success());
    assert!(!text(&none).contains("provider: portico"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_bad_parameter_fails_fi_getinfo_with_a_log_line() {
    let dir = provider_dir();
    let out = fi("fi_info", &dir)
        .args(["-p", "portico"])
        .env("FI_PORTICO_DEV", "net_tap0")
        .env("FI_PORTICO_IP", "10.77.0")
        .env("FI_LOG_LEVEL", "warn")
        .output()
        .unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("FI_PORTICO_IP: \"10.77.0\" is not an IPv4 address"),
        "{t}"
    );
    assert!(t.contains("provider portico returned -22"), "{t}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A fresh TCP port for fi_pingpong's out-of-band exchange.
fn oob_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    47000 + (std::process::id() % 500) as u16 * 4 + NEXT.fetch_add(1, Ordering::Relaxed) % 4
}

fn listening(port: u16) -> bool {
    let out = Command::new("ss")
        .args(["-ltnH", &format!("sport = :{port}")])
        .output();
    out.map(|o| !o.stdout.is_empty()).unwrap_or(false)
}

/// One pair of processes at a time: each holds two cores' worth of polling threads.
static PAIR: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// fi_pingpong between two processes over net_memif; returns the client's output.
fn pingpong(dir: &Path, extra: &[&str], size: &str, iters: &str) -> String {
    pingpong_on(dir, "portico", &[], extra, size, iters)
}

/// As [`pingpong`], over provider `prov` (`portico;ofi_rxm`) with `env` in both processes.
fn pingpong_on(
    dir: &Path,
    prov: &str,
    env: &[(&str, &str)],
    extra: &[&str],
    size: &str,
    iters: &str,
) -> String {
    let _one = PAIR.lock().unwrap_or_else(|p| p.into_inner());
    let tmp = dir.join(format!("memif-{size}-{}", extra.join("")));
    std::fs::create_dir_all(&tmp).unwrap();
    let sock = tmp.join("memif.sock");
    let port = oob_port().to_string();
    let cores = portico::app::available_cores();
    let (first, last) = (cores[0], *cores.last().unwrap());
    let args = |c: &mut Command| {
        c.args(["-p", prov, "-e", "rdm", "-c", "-S", size, "-I", iters])
            .args(extra)
            .envs(env.iter().copied());
    };
    let mut server = fi("fi_pingpong", dir);
    args(&mut server);
    server
        .args(["-B", &port])
        .env(
            "FI_PORTICO_DEV",
            format!("net_memif0,role=server,id=0,socket={}", sock.display()),
        )
        .env("FI_PORTICO_IP", "10.78.0.1")
        .env("FI_PORTICO_CORES", last.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let server = server.spawn().expect("fi_pingpong (libfabric-bin)");
    let start = Instant::now();
    while !listening(port.parse().unwrap()) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the fi_pingpong server never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut client = fi("fi_pingpong", dir);
    args(&mut client);
    let client = client
        .args(["-P", &port, "127.0.0.1"])
        .env(
            "FI_PORTICO_DEV",
            format!("net_memif0,role=client,id=0,socket={}", sock.display()),
        )
        .env("FI_PORTICO_IP", "10.78.0.2")
        .env("FI_PORTICO_CORES", first.to_string())
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    let (c, s) = (text(&client), text(&server));
    assert!(client.status.success(), "client failed:\n{c}\nserver:\n{s}");
    assert!(server.status.success(), "server failed:\n{s}\nclient:\n{c}");
    std::fs::remove_dir_all(&tmp).ok();
    c
}

/// The result line: bytes, sent and acknowledged counts.
fn counts(out: &str) -> (String, u64, u64) {
    let line = out
        .lines()
        .find(|l| {
            l.split_whitespace()
                .nth(2)
                .is_some_and(|w| w.starts_with('='))
        })
        .unwrap_or_else(|| panic!("no result line in:\n{out}"));
    let w: Vec<&str> = line.split_whitespace().collect();
    (
        w[0].to_string(),
        w[1].parse().unwrap(),
        w[2][1..].parse().unwrap(),
    )
}

#[test]
fn fi_pingpong_rdm_messages_over_memif_every_byte_checked() {
    let dir = provider_dir();
    // Eager (64 B, 4 KiB) and rendezvous (64 KiB: the target pulls it) messages.
    for (size, label) in [("64", "64"), ("4096", "4k"), ("65536", "64k")] {
        let out = pingpong(&dir, &[], size, "50");
        assert_eq!(counts(&out), (label.to_string(), 50, 50), "{out}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn fi_pingpong_rdm_tagged_over_memif_every_byte_checked() {
    let dir = provider_dir();
    for (size, label) in [("256", "256"), ("1048576", "1m")] {
        let out = pingpong(&dir, &["-m", "tagged"], size, "20");
        assert_eq!(counts(&out), (label.to_string(), 20, 20), "{out}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn rma_write_read_inject_writedata_commit_over_memif_and_a_refused_read() {
    let _one = PAIR.lock().unwrap_or_else(|p| p.into_inner());
    let dir = provider_dir();
    let bin = build_c("rma_check", &dir);
    let sock = dir.join("memif.sock");
    let cores = portico::app::available_cores();
    // The client's tclass is FI_TC_BULK_DATA: its connection goes in the class named for it.
    let shaper = dir.join("shaper.toml");
    std::fs::write(
        &shaper,
        "[shaper]\n[[shaper.classes]]\nname = \"best_effort\"\nceiling_gbps = 100.0\n\n\
         [[shaper.classes]]\nname = \"bulk_data\"\nceiling_gbps = 100.0\n",
    )
    .unwrap();
    let spawn = |role: &str, ip: &str, core: usize| {
        fi(bin.to_str().unwrap(), &dir)
            .args([role, dir.to_str().unwrap()])
            .env(
                "FI_PORTICO_DEV",
                format!("net_memif0,role={role},id=0,socket={}", sock.display()),
            )
            .env("FI_PORTICO_IP", ip)
            .env("FI_PORTICO_CORES", core.to_string())
            .env("FI_PORTICO_SHAPER", &shaper)
            .env("FI_LOG_LEVEL", "debug")
            .env("FI_LOG_PROV", "portico")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // The client first: its memif port is refused until the server's has started, and
    // connects again until it is taken (`PortConfig::reconnect`).
    let client = spawn("client", "10.78.1.2", cores[0]);
    std::thread::sleep(Duration::from_millis(1500));
    let mut server = spawn("server", "10.78.1.1", *cores.last().unwrap());
    let client = client.wait_with_output().unwrap();
    if !client.status.success() {
        // The server waits for a client that finished; it would wait its full minute.
        server.kill().ok();
    }
    let server = server.wait_with_output().unwrap();
    let (c, s) = (text(&client), text(&server));
    assert!(client.status.success(), "client:\n{c}\nserver:\n{s}");
    assert!(server.status.success(), "server:\n{s}\nclient:\n{c}");
    assert!(
        c.contains(
            "out-of-bounds READ refused, 2 receives cancelled, 3-iovec sends, writev and readv"
        ),
        "{c}"
    );
    assert!(
        s.contains(
            "262144 bytes as written, 2 remote CQ data received in order, 2 messages of 3 iovecs"
        ),
        "{s}"
    );
    // The target registered its file mapping as one that durable WRITEs msync, and the
    // FI_COMMIT_COMPLETE write was a durable WRITE, completed by the durable ACK.
    assert!(s.contains("durable WRITEs msync them"), "{s}");
    assert!(c.contains("DurableWrite Success"), "{c}");
    // FI_TC_BULK_DATA: shaper class 1, the engine's DSCP.
    assert!(
        c.contains("in tclass 0x203 (bulk_data): shaper class Some(1), dscp None"),
        "{c}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn fi_pingpong_msg_endpoints_over_memif_every_byte_checked() {
    let dir = provider_dir();
    // A passive endpoint, FI_CONNREQ, fi_accept / fi_connect, FI_CONNECTED, then plain SENDs
    // into receives posted on the connection (the last -e wins).
    for (size, label) in [("64", "64"), ("4096", "4k"), ("1048576", "1m")] {
        let out = pingpong(&dir, &["-e", "msg"], size, "20");
        assert_eq!(counts(&out), (label.to_string(), 20, 20), "{out}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn tagged_messages_over_ofi_rxm_on_portico_message_endpoints() {
    let dir = provider_dir();
    // libfabric's ofi_rxm layered over Portico's FI_EP_MSG endpoints (matching in software,
    // rendezvous by RMA READ over the connection); allowed by FI_PORTICO_LAYERING=1.
    let layering = [("FI_PORTICO_LAYERING", "1")];
    for (size, label) in [("64", "64"), ("1048576", "1m")] {
        let out = pingpong_on(
            &dir,
            "portico;ofi_rxm",
            &layering,
            &["-m", "tagged"],
            size,
            "10",
        );
        assert_eq!(counts(&out), (label.to_string(), 10, 10), "{out}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
