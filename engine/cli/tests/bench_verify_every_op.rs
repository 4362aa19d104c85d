//! Every bench operation end to end with `--verify`, in whatever profile the tests were built
//! with: `make test` runs this file a second time from the release build (`cargo test --release
//! --test bench_verify_every_op`), the binary users run and every figure comes from. Each run is
//! its own `portico` process over `net_ring`; the JSON must show operations completed, every
//! landed byte compared, no mismatch and no error. Also `--cores 2 --qd 240`: `--qd` is the
//! total over the queue pairs, 120 on each of two; `--host-threads 2`, two host threads each
//! driving its own queue pairs; and `--inline`, each worker running the loop of its own.

use std::process::Command;

fn bench(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_portico"))
        .arg("bench")
        .args(args)
        .args(["--duration", "1", "--verify", "--json"])
        .output()
        .expect("portico runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench {args:?}: {:?}\n{stderr}",
        out.status
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bench {args:?}: no JSON ({e})\n{stderr}"))
}

fn assert_verified(args: &[&str], v: &serde_json::Value) {
    assert_eq!(v["errors"], 0, "{args:?}: {v}");
    assert_eq!(v["interrupted"], false, "{args:?}: {v}");
    let verify = &v["verify"];
    assert_eq!(verify["mismatches"], 0, "{args:?}: {verify}");
    assert!(
        verify["checked_ops"].as_u64().unwrap() > 0,
        "{args:?}: {verify}"
    );
    assert!(
        verify["checked_bytes"].as_u64().unwrap() > 0,
        "{args:?}: {verify}"
    );
    for r in v["results"].as_array().expect("results") {
        assert!(r["ops"].as_u64().unwrap() > 0, "{args:?}: {r}");
    }
}

#[test]
fn every_operation_verifies_every_byte() {
    // Sizes over several packets at the default MTU (1024), and one packet.
    for op in ["write", "read", "send", "mixed"] {
        for size in ["64", "4096"] {
            let args = [op, "--size", size, "--qd", "16"];
            let v = bench(&args);
            assert_verified(&args, &v);
            assert_eq!(v["op"], op, "{v}");
        }
    }
}

#[test]
fn qd_is_the_total_over_the_queue_pairs() {
    let args = ["write", "--cores", "2", "--qd", "240", "--size", "64"];
    let v = bench(&args);
    assert_verified(&args, &v);
    assert_eq!(
        (v["qd"].as_u64(), v["connections"].as_u64()),
        (Some(240), Some(2)),
        "{v}"
    );
    // One more than two send queues take is refused, naming the argument (exit 2).
    let out = Command::new(env!("CARGO_BIN_EXE_portico"))
        .args([
            "bench",
            "write",
            "--cores",
            "2",
            "--qd",
            "241",
            "--duration",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--qd: 241: must be 1..=240"), "{err}");
}

/// The run's `host_threads` (host threads, or inline the workers): `groups` of them, each
/// with its own queue pairs and together all of `connections`; and for WRITEs every completed
/// operation verified.
fn assert_groups(args: &[&str], v: &serde_json::Value, groups: usize, connections: usize) {
    let threads = v["host_threads"].as_array().expect("host_threads");
    let qpns: Vec<Vec<u64>> = threads
        .iter()
        .map(|t| {
            t["qpns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|q| q.as_u64().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(qpns.len(), groups, "{args:?}: {v}");
    assert!(
        qpns.iter().all(|q| q.len() == connections / groups),
        "{args:?}: {qpns:?}"
    );
    let mut all: Vec<u64> = qpns.concat();
    all.sort();
    all.dedup();
    assert_eq!(
        all.len(),
        connections,
        "each queue pair has one loop: {qpns:?}"
    );
    if args[0] == "write" {
        let ops: u64 = v["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["ops"].as_u64().unwrap())
            .sum();
        assert_eq!(
            v["verify"]["checked_ops"].as_u64(),
            Some(ops),
            "{args:?}: {v}"
        );
    }
}

/// Two host threads, each posting to and polling its own queue pairs (connections t and
/// t + 2) and verifying what it posted: every completed operation's bytes compared, none
/// different, and the JSON says which thread drove which queue pairs.
#[test]
fn host_threads_drive_their_own_queue_pairs_and_verify_every_byte() {
    for op in ["write", "mixed"] {
        let args = [
            op,
            "--connections",
            "4",
            "--host-threads",
            "2",
            "--qd",
            "16",
            "--size",
            "4096",
        ];
        let v = bench(&args);
        assert_verified(&args, &v);
        assert_groups(&args, &v, 2, 4);
    }
}

/// Inline: each of two workers runs the application's loop for the connections homed on it,
/// inside its own loop; every operation's bytes compared, and the JSON names the workers'
/// cores and queue pairs.
#[test]
fn inline_workers_run_the_application_and_verify_every_byte() {
    for op in ["write", "mixed"] {
        let args = [
            op,
            "--cores",
            "2",
            "--connections",
            "4",
            "--inline",
            "--qd",
            "16",
            "--size",
            "4096",
        ];
        let v = bench(&args);
        assert_verified(&args, &v);
        assert_eq!(v["inline"], true, "{v}");
        assert_groups(&args, &v, 2, 4);
        // Loop t ran on worker t: the core the JSON names is the one that worker is pinned to.
        let loops = v["host_threads"].as_array().expect("host_threads");
        let workers = v["cores"]["workers"].as_array().expect("cores.workers");
        for (t, l) in loops.iter().enumerate() {
            assert_eq!(
                l["core"].to_string(),
                workers[t]["cpus"].as_str().expect("cpus"),
                "{args:?}: loop {t}: {v}"
            );
        }
    }
}
