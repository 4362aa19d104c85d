//! What the tests that run `portico` as child processes share: reading a child's output with
//! deadlines, and waiting for it with one.

#![allow(dead_code)] // Each test binary uses part of this module.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Lines of a child's output, read on a thread so that every wait can have a deadline.
pub fn lines(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits up to `limit` for `child` to exit; kills it and fails the test otherwise (`what`
/// names it).
pub fn wait(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still ran at its deadline; killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process killed (and reaped) when the test lets go of it without waiting for it.
pub struct Guard(pub Option<Child>);

impl Guard {
    pub fn id(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().unwrap()
    }

    /// Waits until `deadline` for the process to exit; kills it and panics otherwise.
    pub fn wait_until(&mut self, what: &str, deadline: Instant) -> ExitStatus {
        let st = wait(
            self.child(),
            deadline.saturating_duration_since(Instant::now()),
            what,
        );
        self.0 = None;
        st
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One side's MAC, IPv4 address and queue pair number.
pub type Side<'a> = (&'a str, &'a str, u32);

/// The config of `portico target` (`role` "server") or `initiator` ("client") on a memif port
/// at `sock`, its worker on `core`, no hugepages, MTU 4096: `eal_args` are added to EAL's
/// arguments (after the file prefix `prefix`), `rdma_lines` to the `[rdma]` section.
pub fn memif_config(
    role: &str,
    prefix: &str,
    sock: &Path,
    core: usize,
    (me, peer): (Side, Side),
    eal_args: &[&str],
    rdma_lines: &str,
) -> String {
    let eal: String = eal_args.iter().map(|a| format!(", \"{a}\"")).collect();
    format!(
        r#"
[eal]
args = ["--file-prefix={prefix}"{eal}]
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
{rdma_lines}
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

/// A fresh, empty folder `portico-NAME-<pid>` under the system's temporary folder.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("portico-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
