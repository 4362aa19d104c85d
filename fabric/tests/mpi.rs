//! Open MPI over the provider (`--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include
//! portico`): the MPI program `tests/c/mpi_check.c` (tagged ping-pong to 1 MiB, any-source and
//! unexpected receives, probes, a barrier and an allreduce, every byte checked) on 2 ranks over
//! `net_memif` and on 4 ranks over `net_tap` devices joined by a Linux bridge in a network
//! namespace the test makes and removes; and NetPIPE (`NPopenmpi`, Debian's
//! `netpipe-openmpi`) in its integrity mode, bounded in sizes and repeats.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{build_mpi, provider_dir, text};

/// One MPI job at a time: each holds several polling processes.
static JOB: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One rank's application context: its FI_PORTICO_* settings and its program.
struct Rank {
    dev: String,
    ip: String,
    program: Vec<String>,
}

/// `mpirun` with one application context per rank (MPMD: each rank has its own port), the
/// provider selected, ranks not bound (their workers poll adaptively on shared cores).
fn mpirun(dir: &Path, ranks: &[Rank], netns: Option<&str>) -> Command {
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "mpirun"]);
            c
        }
        None => Command::new("mpirun"),
    };
    c.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
        "--mca",
        "pml",
        "cm",
        "--mca",
        "mtl",
        "ofi",
        "--mca",
        "mtl_ofi_provider_include",
        "portico",
        "--mca",
        "btl",
        "self",
    ]);
    for (i, r) in ranks.iter().enumerate() {
        if i > 0 {
            c.arg(":");
        }
        c.args([
            "-np",
            "1",
            "-x",
            &format!("FI_PROVIDER_PATH={}", dir.display()),
        ])
        .args(["-x", &format!("FI_PORTICO_DEV={}", r.dev)])
        .args(["-x", &format!("FI_PORTICO_IP={}", r.ip)])
        .args(["-x", "FI_LOG_LEVEL=warn"])
        .args(&r.program);
    }
    c.env_remove("FI_LOG_LEVEL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn memif_pair(dir: &Path, program: &[String]) -> Vec<Rank> {
    let sock = dir.join("mpi-memif.sock");
    ["server", "client"]
        .iter()
        .enumerate()
        .map(|(i, role)| Rank {
            dev: format!("net_memif0,role={role},id=0,socket={}", sock.display()),
            ip: format!("10.82.0.{}", i + 1),
            program: program.to_vec(),
        })
        .collect()
}

fn run(mut c: Command, what: &str) -> String {
    let out = c
        .output()
        .expect("mpirun (openmpi-bin, scripts/install-deps.sh)");
    let t = text(&out);
    assert!(out.status.success(), "{what} failed:\n{t}");
    t
}

#[test]
fn mpi_program_on_two_ranks_over_memif_every_byte_checked() {
    let _one = JOB.lock().unwrap_or_else(|p| p.into_inner());
    let dir = provider_dir();
    let bin = build_mpi("mpi_check", &dir);
    let ranks = memif_pair(&dir, &[bin.display().to_string()]);
    let out = run(mpirun(&dir, &ranks, None), "mpi_check on 2 ranks");
    assert!(
        out.contains("mpi_check: 2 ranks, 33 ping-pong rounds to 1 MiB, any-source, unexpected, probes, allreduce: every byte checked"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn netpipe_integrity_over_memif() {
    let _one = JOB.lock().unwrap_or_else(|p| p.into_inner());
    let dir = provider_dir();
    // Integrity mode (-i): every message's bytes are checked; sizes 1 B to 256 KiB. NetPIPE
    // writes its results to a file (np.out by default, where it runs).
    let np_out = dir.join("np.out").display().to_string();
    let np: Vec<String> = [
        "NPopenmpi",
        "-i",
        "-l",
        "1",
        "-u",
        "262144",
        "-n",
        "5",
        "-p",
        "0",
        "-o",
        &np_out,
    ]
    .map(String::from)
    .to_vec();
    let ranks = memif_pair(&dir, &np);
    let out = run(mpirun(&dir, &ranks, None), "NPopenmpi -i");
    // NetPIPE's integrity mode prints a line per size: 36 sizes from 1 B to 256 KiB without
    // perturbations, each of whose 5 messages was compared byte for byte.
    let sizes: Vec<&str> = out
        .lines()
        .filter(|l| l.contains(" bytes ") && l.contains(" times -->"))
        .collect();
    assert_eq!(sizes.len(), 36, "{out}");
    assert!(
        sizes.iter().all(|l| l.ends_with("Integrity check passed")),
        "{out}"
    );
    assert!(sizes[35].contains("262144 bytes"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A network namespace with a bridge; removed when dropped.
struct Netns(String);

impl Netns {
    fn new(name: &str) -> Netns {
        let ns = Netns(name.to_string());
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        ns.ip(&["netns", "add", name], false);
        ns.ip(&["link", "set", "lo", "up"], true);
        ns.ip(&["link", "add", "br0", "type", "bridge"], true);
        ns.ip(&["link", "set", "br0", "up"], true);
        ns
    }

    /// `ip` on the host (`inside` false) or in the namespace (`ip -n`: no process of its own
    /// in the namespace, one spawn).
    fn ip(&self, args: &[&str], inside: bool) -> String {
        let mut c = Command::new("ip");
        if inside {
            c.args(["-n", &self.0]);
        }
        let out = c.args(args).output().expect("ip (iproute2)");
        assert!(out.status.success(), "ip {args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Every link in the namespace with its MAC, from one `ip -o link`.
    fn links(&self) -> Vec<(String, String)> {
        self.ip(&["-o", "link", "show"], true)
            .lines()
            .filter_map(|l| {
                let name = l.split(": ").nth(1)?.split('@').next()?.to_string();
                let mac = l
                    .split("link/ether ")
                    .nth(1)?
                    .split(' ')
                    .next()?
                    .to_string();
                Some((name, mac))
            })
            .collect()
    }

    /// What the namespace looks like, for a failure's message: the links and the bridge's
    /// forwarding table.
    fn describe(&self) -> String {
        let run = |prog: &str, args: &[&str]| {
            Command::new(prog)
                .args(args)
                .output()
                .map(|o| text(&o))
                .unwrap_or_else(|e| format!("{prog}: {e}"))
        };
        format!(
            "links:\n{}\nbridge fdb:\n{}",
            run("ip", &["-n", &self.0, "-br", "link", "show"]),
            run("bridge", &["-n", &self.0, "fdb", "show", "br", "br0"])
        )
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

#[test]
fn mpi_program_on_four_ranks_over_taps_on_a_bridge() {
    let _one = JOB.lock().unwrap_or_else(|p| p.into_inner());
    let dir = provider_dir();
    let bin = build_mpi("mpi_check", &dir);
    let ns = Netns::new(&format!("pfi{}", std::process::id()));
    let ranks: Vec<Rank> = (0..4)
        .map(|r| Rank {
            dev: format!("net_tap0,iface=pfit{r}"),
            ip: format!("10.83.0.{}", r + 1),
            program: vec![bin.display().to_string()],
        })
        .collect();
    let mut job = mpirun(&dir, &ranks, Some(&ns.0)).spawn().unwrap();
    // The job's output is read as it comes, so that a full pipe never stalls a rank while
    // this thread watches the taps.
    let pipe = |p: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut p) = p {
                let _ = p.read_to_end(&mut v);
            }
            v
        })
    };
    let stdout = pipe(job.stdout.take().map(|p| Box::new(p) as _));
    let stderr = pipe(job.stderr.take().map(|p| Box::new(p) as _));
    // Each rank's tap appears when its engine starts, with the engine's own MAC (the tap PMD
    // sets the kernel side to it). A bridge port whose address is the engine's keeps the
    // frames for that address to the bridge itself, so each tap's kernel side gets an address
    // of its own as it joins the bridge. The tap appears with the engine's MAC before its
    // port is started, and `rte_eth_dev_start` sets the MAC again (ethdev replays the
    // default address into the driver), so a tap given its own address before that gets the
    // engine's back, and that rank is cut off: the taps are watched, and mended, until the
    // job ends. Each poll is one `ip`, each mend one more, well inside the engines' address
    // resolution (3.4 s) and the provider's connection retries (15 s).
    let start = Instant::now();
    let mut mended = [0u32; 4];
    let mut seen = String::new();
    let status = loop {
        if let Some(status) = job.try_wait().unwrap() {
            break status;
        }
        let all = mended.iter().all(|&m| m > 0);
        if !all && start.elapsed() > Duration::from_secs(60) {
            let _ = job.kill();
            panic!("the ranks' taps did not all appear:\n{}", ns.describe());
        }
        // Bounded: the job takes a few seconds here.
        if start.elapsed() > Duration::from_secs(300) {
            let _ = job.kill();
            panic!(
                "mpi_check on 4 ranks still running after 300 s:\n{}",
                ns.describe()
            );
        }
        let links = ns.links();
        for (name, mac) in &links {
            let Some(r) = name
                .strip_prefix("pfit")
                .and_then(|r| r.parse::<usize>().ok())
                .filter(|&r| r < 4)
            else {
                continue;
            };
            if *mac == format!("02:50:0a:53:00:{:02x}", r + 1) {
                let own = format!("06:00:00:00:00:{:02x}", r + 1);
                ns.ip(
                    &[
                        "link", "set", "dev", name, "address", &own, "master", "br0", "up",
                    ],
                    true,
                );
                mended[r] += 1;
            }
        }
        if links.iter().any(|(n, _)| n.starts_with("pfit")) {
            seen = format!("{links:?}");
        }
        std::thread::sleep(Duration::from_millis(if all { 50 } else { 10 }));
    };
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout.join().unwrap()),
        String::from_utf8_lossy(&stderr.join().unwrap())
    );
    eprintln!("taps given their own address (times per rank): {mended:?}");
    assert!(
        status.success(),
        "mpi_check on 4 ranks failed:\n{t}\ntaps given their own address (times per rank): \
         {mended:?}\nthe links last seen: {seen}"
    );
    assert!(
        t.contains("mpi_check: 4 ranks, 33 ping-pong rounds to 1 MiB, any-source, unexpected, probes, allreduce: every byte checked"),
        "{t}"
    );
    drop(ns);
    std::fs::remove_dir_all(&dir).ok();
}
