//! A durable WRITE is durable when it completes, even if the target process dies the next
//! instant. Each trial runs a fresh pair of processes over `net_memif`: `portico target` with
//! its region in a file under pmem's power-loss simulator (`simulate_power_loss`: the file
//! holds exactly the persisted cache lines, so what a `SIGKILL` leaves in it is exactly what was
//! made durable), and `portico initiator --durable`, which streams durable WRITEs of 64-byte
//! records (write k carries the record of sequence number k, to slot k mod 128 of the region,
//! 16 outstanding) and prints `{"type":"durable","seq":k,...}` as each completes. At a random
//! moment, 20 to 200 ms after the first durable line (seeded; the seed is printed, and
//! `PORTICO_CRASH_SEED` replays it), the test kills the target with SIGKILL, then the
//! initiator, and reads the file:
//!
//! - every slot some reported write went to holds a well-formed record whose sequence number
//!   is that slot's last reported one or a later write to the same slot (one in flight at the
//!   kill, which may or may not have been persisted); never an older one, zeros, or a mix;
//! - every other slot holds zeros or a well-formed record of a write to that slot that had
//!   been posted (below the reported count plus the queue depth);
//! - the upper half of the region (no write goes there) holds zeros.
//!
//! Records are whole cache lines, and a slot is written again only after the write before it
//! completed (128 slots, 16 outstanding), so no persist of a line races a store to it: the
//! check can be exact. 100 trials by default, `PORTICO_CRASH_TRIALS=N` for more. The checker
//! itself is shown to fail on images that lack a reported write (a test below, and on every
//! real trial's image with one reported record removed or torn).

use portico::rng::splitmix64;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod child;
use child::lines;

/// Bytes per record: one cache line.
const SIZE: usize = 64;
/// Durable WRITEs outstanding.
const QD: u64 = 16;
/// Both regions: the lower half holds the slots (the initiator's sources, the target's
/// records), the upper half is never written.
const REGION_LEN: usize = 16384;
const SLOTS: u64 = (REGION_LEN / 2 / SIZE) as u64;
/// The initiator's first PSN: its `psn`, the target's `peer_psn`.
const INITIATOR_PSN: u32 = 0x2c_0001;
/// The kill comes this many milliseconds after the first durable line, uniformly.
const KILL_AFTER_MS: std::ops::Range<u64> = 20..200;

/// The record of write `seq`, as `docs/rdma.md` defines it (written out again here rather
/// than taken from the engine): little-endian words, word 0 `seq`, word i
/// `splitmix64(seq ^ (i << 48))`.
fn record(seq: u64) -> Vec<u8> {
    (0..SIZE / 8)
        .flat_map(|i| {
            let w = if i == 0 {
                seq
            } else {
                splitmix64(seq ^ ((i as u64) << 48))
            };
            w.to_le_bytes()
        })
        .collect()
}

/// The sequence number of a well-formed record, `None` for anything else.
fn record_seq(bytes: &[u8]) -> Option<u64> {
    let seq = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    (record(seq) == bytes).then_some(seq)
}

/// What a checked image held.
#[derive(Debug, Default, PartialEq, Eq)]
struct Checked {
    /// Reported-durable writes, each found (or a later write to its slot).
    durable: u64,
    /// Slots holding a write later than the last one reported for them: in flight at the
    /// kill, and persisted.
    later: u64,
    /// Slots that no reported write went to and that still hold zeros.
    empty: u64,
}

/// Checks a region image against the durable reports `seqs` (in the order printed).
fn check_image(image: &[u8], seqs: &[u64]) -> Result<Checked, String> {
    if image.len() != REGION_LEN {
        return Err(format!("{} bytes, not {REGION_LEN}", image.len()));
    }
    let n = seqs.len() as u64;
    let mut last: Vec<Option<u64>> = vec![None; SLOTS as usize];
    for &s in seqs {
        let slot = &mut last[(s % SLOTS) as usize];
        *slot = Some(slot.map_or(s, |l| l.max(s)));
    }
    let mut c = Checked {
        durable: n,
        ..Checked::default()
    };
    for (slot, want) in last.iter().enumerate() {
        let bytes = &image[slot * SIZE..(slot + 1) * SIZE];
        if bytes.iter().all(|&b| b == 0) {
            match want {
                None => c.empty += 1,
                Some(w) => {
                    return Err(format!(
                        "slot {slot}: zeros, but write {w} was reported durable"
                    ));
                }
            }
            continue;
        }
        let Some(seq) = record_seq(bytes) else {
            return Err(format!(
                "slot {slot}: not a well-formed record (last reported: {want:?}): {}",
                hex(bytes)
            ));
        };
        if seq % SLOTS != slot as u64 {
            return Err(format!(
                "slot {slot}: the record of write {seq}, which goes to slot {}",
                seq % SLOTS
            ));
        }
        // The initiator posts at most QD writes beyond those whose completions it printed.
        if seq >= n + QD {
            return Err(format!(
                "slot {slot}: write {seq} was never posted ({n} reported, {QD} outstanding at most)"
            ));
        }
        match want {
            Some(w) if seq < *w => {
                return Err(format!(
                    "slot {slot}: write {seq}, older than write {w} reported durable"
                ));
            }
            Some(w) if seq > *w => c.later += 1,
            None => c.later += 1,
            _ => {}
        }
    }
    if let Some(i) = image[REGION_LEN / 2..].iter().position(|&b| b != 0) {
        return Err(format!(
            "byte {} of the upper half, where nothing is written, is not zero",
            REGION_LEN / 2 + i
        ));
    }
    Ok(c)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An image as a target would leave it after the writes `0..n` all landed.
fn image_of(n: u64) -> Vec<u8> {
    let mut image = vec![0u8; REGION_LEN];
    for seq in 0..n {
        let at = ((seq % SLOTS) as usize) * SIZE;
        image[at..at + SIZE].copy_from_slice(&record(seq));
    }
    image
}

/// The ways an image can lack reported write `seq`: its slot holding zeros, the previous
/// write to the slot (when there was one), or the first half of `seq`'s record with the
/// second half of the previous write's (or zeros).
fn broken_images(image: &[u8], seq: u64) -> Vec<(&'static str, Vec<u8>)> {
    let at = ((seq % SLOTS) as usize) * SIZE;
    let older = seq.checked_sub(SLOTS).map(record);
    let mut out = Vec::new();
    let mut zeros = image.to_vec();
    zeros[at..at + SIZE].fill(0);
    out.push(("zeros", zeros));
    if let Some(older) = &older {
        let mut stale = image.to_vec();
        stale[at..at + SIZE].copy_from_slice(older);
        out.push(("the older write", stale));
    }
    let mut torn = image.to_vec();
    let half = SIZE / 2;
    match &older {
        Some(o) => torn[at + half..at + SIZE].copy_from_slice(&o[half..]),
        None => torn[at + half..at + SIZE].fill(0),
    }
    out.push(("torn", torn));
    out
}

#[test]
fn the_checker_rejects_an_image_that_lacks_a_reported_write() {
    let seqs: Vec<u64> = (0..300).collect();
    let good = image_of(300);
    let c = check_image(&good, &seqs).unwrap();
    assert_eq!(
        c,
        Checked {
            durable: 300,
            later: 0,
            empty: 0
        }
    );
    // A later write to a slot, in flight and persisted: fine.
    let mut later = good.clone();
    let at = ((305 % SLOTS) as usize) * SIZE;
    later[at..at + SIZE].copy_from_slice(&record(305));
    assert_eq!(check_image(&later, &seqs).unwrap().later, 1);
    // Every reported write, removed in each way: rejected.
    for seq in [0, 1, 171, 299] {
        for (how, image) in broken_images(&good, seq) {
            assert!(
                check_image(&image, &seqs).is_err(),
                "write {seq} replaced by {how} went unnoticed"
            );
        }
    }
    // A write that was never posted, one in the wrong slot, a stray byte in the upper half.
    let mut never = good.clone();
    let at = ((300 + QD) % SLOTS) as usize * SIZE;
    never[at..at + SIZE].copy_from_slice(&record(300 + QD));
    assert!(check_image(&never, &seqs).is_err());
    let mut moved = good.clone();
    moved[..SIZE].copy_from_slice(&record(1));
    assert!(check_image(&moved, &seqs).is_err());
    let mut stray = good.clone();
    stray[REGION_LEN - 1] = 1;
    assert!(check_image(&stray, &seqs).is_err());
    // Few writes: the untouched slots are zeros, and a zero image with no report is fine.
    assert_eq!(
        check_image(&image_of(5), &[0, 1, 2, 3, 4]).unwrap().empty,
        SLOTS - 5
    );
    assert!(check_image(&vec![0; REGION_LEN], &[]).is_ok());
}

/// A child killed (and reaped) when the test lets go of it.
struct Guard(Child);

impl Guard {
    /// SIGKILL, then reap.
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.kill();
    }
}

fn config(
    role: &str,
    sock: &Path,
    core: usize,
    me: (&str, &str, u32),
    peer: (&str, &str, u32),
    extra: &str,
) -> String {
    // No --file-prefix: Portico's --no-shconf keeps EAL's files out of /var/run/dpdk, so
    // that two hundred processes leave nothing behind there.
    format!(
        r#"
[eal]
hugepages = "off"
memory_mb = 64
[rdma]
port = "net_memif0,role={role},id=0,socket={sock}"
core = {core}
mac = "{}"
ip = "{}"
qpn = {}
peer_mac = "{}"
peer_ip = "{}"
peer_qpn = {}
region_len = {REGION_LEN}
durable_writes = true
{extra}
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

/// A target started for a trial, in the trial's directory.
struct Target {
    dir: PathBuf,
    guard: Guard,
    out: mpsc::Receiver<String>,
    err: mpsc::Receiver<String>,
    started: Instant,
}

/// The addresses of the two sides: (MAC, IP, QPN).
const INITIATOR: (&str, &str, u32) = ("02:00:00:00:00:0a", "10.9.0.1", 0x11);
const TARGET: (&str, &str, u32) = ("02:00:00:00:00:0b", "10.9.0.2", 0x22);

/// Writes both configs into a fresh `dir` and starts the target there (its region file
/// created under the simulator).
fn start_target(dir: PathBuf) -> Target {
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let started = Instant::now();
    let sock = dir.join("memif.sock");
    let cores = portico::app::available_cores();
    let (c_init, c_target) = (cores[0], *cores.last().unwrap());
    let target_extra = format!(
        "peer_psn = {INITIATOR_PSN:#x}\nregion_file = {:?}\nsimulate_power_loss = true",
        dir.join("region.bin").display().to_string()
    );
    let target_cfg = dir.join("target.toml");
    std::fs::write(
        &target_cfg,
        config("server", &sock, c_target, TARGET, INITIATOR, &target_extra),
    )
    .unwrap();
    let init_extra = format!("psn = {INITIATOR_PSN:#x}");
    std::fs::write(
        dir.join("initiator.toml"),
        config("client", &sock, c_init, INITIATOR, TARGET, &init_extra),
    )
    .unwrap();
    // Bounded: the target stops by itself after 60 s.
    let mut child = Command::new(env!("CARGO_BIN_EXE_portico"))
        .args(["target", "--config", target_cfg.to_str().unwrap()])
        .args(["--duration", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = lines(child.stdout.take().unwrap());
    let err = lines(child.stderr.take().unwrap());
    Target {
        dir,
        guard: Guard(child),
        out,
        err,
        started,
    }
}

/// One trial's outcome.
struct Trial {
    checked: Checked,
    /// From the first durable line to the SIGKILL.
    kill_after: Duration,
    /// From the target's start to the check's end.
    took: Duration,
}

/// A trial on a fresh `target`: an initiator against it, the target killed `kill_after_ms`
/// after the first durable line, then the initiator; the file checked. `next`, when given,
/// starts the next trial's target (another memif socket, another directory) as soon as this
/// trial's initiator is started, so that it is ready by the time this trial ends: the two
/// EAL starts of a trial do not add up.
fn trial(
    mut target: Target,
    kill_after_ms: u64,
    next: Option<&dyn Fn() -> Target>,
) -> (Trial, Option<Target>) {
    let dir = target.dir.clone();
    let ready = target
        .out
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|e| {
            panic!(
                "no ready line from the target ({e}): {:?}",
                target.err.try_iter().collect::<Vec<_>>()
            )
        });
    let ready: serde_json::Value = serde_json::from_str(&ready).unwrap();
    assert_eq!(ready["type"], "ready", "{ready}");
    assert_eq!(ready["simulated"], true, "{ready}");
    assert_eq!(ready["durable_writes"], true, "{ready}");
    let rkey = ready["rkey"].as_u64().unwrap().to_string();
    let addr = format!("{:#x}", ready["addr"].as_u64().unwrap());

    // Many more writes than fit before the kill: the initiator is killed, never done.
    let init_cfg = dir.join("initiator.toml");
    let mut init = Command::new(env!("CARGO_BIN_EXE_portico"))
        .args(["initiator", "--config", init_cfg.to_str().unwrap()])
        .args(["--rkey", &rkey, "--remote-addr", &addr])
        .args(["--durable", "--ops", "100000000"])
        .args(["--size", &SIZE.to_string(), "--qd", &QD.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let init_out = lines(init.stdout.take().unwrap());
    let init_err = lines(init.stderr.take().unwrap());
    let mut init = Guard(init);
    let next = next.map(|start| start());
    let first = init_out
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|e| {
            panic!(
                "no durable line from the initiator ({e}): {:?}",
                init_err.try_iter().collect::<Vec<_>>()
            )
        });
    let t_first = Instant::now();
    std::thread::sleep(Duration::from_millis(kill_after_ms));
    // Both still running: nothing has failed before the kill.
    assert!(
        target.guard.0.try_wait().unwrap().is_none(),
        "the target ended before the kill: {:?}",
        target.err.try_iter().collect::<Vec<_>>()
    );
    assert!(
        init.0.try_wait().unwrap().is_none(),
        "the initiator ended before the kill: {:?}",
        init_err.try_iter().collect::<Vec<_>>()
    );
    let kill_after = t_first.elapsed();
    target.guard.kill();
    init.kill();

    // Every line the initiator printed: the pipe is read to its end.
    let mut seqs = Vec::new();
    for line in std::iter::once(first).chain(init_out.iter()) {
        let v: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
        if v["type"] == "durable" {
            let seq = v["seq"].as_u64().unwrap();
            assert_eq!(v["offset"], (seq % SLOTS) * SIZE as u64, "{v}");
            seqs.push(seq);
        }
    }
    assert!(!seqs.is_empty());
    // Completions come in order, each once.
    assert!(
        seqs.iter().enumerate().all(|(i, &s)| s == i as u64),
        "durable lines out of order: {:?}",
        &seqs[..seqs.len().min(40)]
    );

    let image = std::fs::read(dir.join("region.bin")).unwrap();
    let checked = check_image(&image, &seqs).unwrap_or_else(|e| {
        panic!(
            "after {} durable lines and a kill {kill_after:?} after the first: {e}",
            seqs.len()
        )
    });
    // Not vacuous on real data either: this image without its last reported write fails.
    let last = *seqs.last().unwrap();
    for (how, broken) in broken_images(&image, last) {
        assert!(
            check_image(&broken, &seqs).is_err(),
            "the checker missed write {last} replaced by {how}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let t = Trial {
        checked,
        kill_after,
        took: target.started.elapsed(),
    };
    (t, next)
}

#[test]
fn every_write_reported_durable_survives_a_sigkill_of_the_target() {
    let trials: u64 = std::env::var("PORTICO_CRASH_TRIALS")
        .ok()
        .map(|v| v.parse().expect("PORTICO_CRASH_TRIALS: a number"))
        .unwrap_or(100);
    let seed: u64 = std::env::var("PORTICO_CRASH_SEED")
        .ok()
        .map(|v| v.parse().expect("PORTICO_CRASH_SEED: a number"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("crash_persist: seed {seed} (PORTICO_CRASH_SEED={seed} replays the kill times)");
    let root: PathBuf = std::env::temp_dir().join(format!("portico-crash-{}", std::process::id()));
    let t0 = Instant::now();
    let mut total = Checked::default();
    let (mut slowest, mut kill_min, mut kill_max) = (Duration::ZERO, Duration::MAX, Duration::ZERO);
    let mut target = Some(start_target(root.join("t0")));
    for i in 0..trials {
        let kill_after_ms = KILL_AFTER_MS.start
            + splitmix64(seed.wrapping_add(i)) % (KILL_AFTER_MS.end - KILL_AFTER_MS.start);
        let start_next = || start_target(root.join(format!("t{}", i + 1)));
        let next: Option<&dyn Fn() -> Target> = (i + 1 < trials).then_some(&start_next);
        let (t, after) = trial(target.take().unwrap(), kill_after_ms, next);
        target = after;
        total.durable += t.checked.durable;
        total.later += t.checked.later;
        total.empty += t.checked.empty;
        slowest = slowest.max(t.took);
        kill_min = kill_min.min(t.kill_after);
        kill_max = kill_max.max(t.kill_after);
    }
    let _ = std::fs::remove_dir_all(&root);
    eprintln!(
        "crash_persist: {trials} trials in {:.1} s (slowest {:.2} s), kills {:?}..{:?} after the first durable line; \
         {} writes reported durable, every one found in its slot; {} slots held a later write in flight at the kill",
        t0.elapsed().as_secs_f64(),
        slowest.as_secs_f64(),
        kill_min,
        kill_max,
        total.durable,
        total.later
    );
    assert!(
        total.durable >= trials,
        "every trial reported durable writes"
    );
}

#[test]
fn the_simulator_needs_a_region_file_and_durable_writes_need_the_key() {
    let dir = std::env::temp_dir().join(format!("portico-crash-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("never.sock");
    let a = ("02:00:00:00:00:0a", "10.9.0.1", 0x11);
    let b = ("02:00:00:00:00:0b", "10.9.0.2", 0x22);
    let exe = env!("CARGO_BIN_EXE_portico");
    // Each case fails before EAL starts: exit 2, one line naming the field.
    let expect_2 = |args: &[&str], field: &str| {
        let out = Command::new(exe).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(field), "{args:?} names {field}: {stderr}");
    };
    let anon = dir.join("anon.toml");
    std::fs::write(
        &anon,
        config("server", &sock, 0, b, a, "simulate_power_loss = true"),
    )
    .unwrap();
    let anon = anon.to_str().unwrap();
    expect_2(
        &["target", "--config", anon, "--duration", "1"],
        "rdma.simulate_power_loss: needs a region file",
    );
    let plain = dir.join("plain.toml");
    std::fs::write(&plain, config("server", &sock, 0, b, a, "")).unwrap();
    let plain = plain.to_str().unwrap();
    expect_2(
        &[
            "target",
            "--config",
            plain,
            "--simulate-power-loss",
            "--duration",
            "1",
        ],
        "--simulate-power-loss: needs a region file",
    );
    // The initiator: --durable needs the key, and the target's keys are refused.
    let no_durable = dir.join("no-durable.toml");
    std::fs::write(
        &no_durable,
        config("client", &sock, 0, a, b, "").replace("durable_writes = true", ""),
    )
    .unwrap();
    let initiator = |cfg: &str, extra: &[&str]| {
        let mut v = vec!["initiator", "--config", cfg, "--rkey", "1"];
        v.extend(["--remote-addr", "0x1000"]);
        v.extend(extra);
        v.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let args = initiator(no_durable.to_str().unwrap(), &["--durable"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    expect_2(&args, "rdma.durable_writes");
    let args = initiator(anon, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    expect_2(
        &args,
        "rdma.simulate_power_loss: applies to portico target only",
    );
    for (extra, field) in [
        (&["--durable", "--size", "60"][..], "--size"),
        (&["--durable", "--size", "8"], "--size"),
        (&["--durable", "--qd", "0"], "--qd"),
        (&["--durable", "--qd", "129"], "--qd"),
        // 8 KiB of 4 KiB records: two slots.
        (&["--durable", "--size", "4096", "--qd", "3"], "--qd"),
    ] {
        let args = initiator(plain, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        expect_2(&args, field);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
