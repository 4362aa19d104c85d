//! `portico bench`: RDMA operations between two engines on a `net_ring` link in one process,
//! with throughput and HdrHistogram latency per operation type.
//!
//! The host thread keeps `qd` operations outstanding on engine A's queue pair. With `--rate`,
//! operation *k* is due at `start + k / rate`. Its latency is measured from that intended time,
//! not from when it was actually posted, so a stall of the engine shows up in the percentiles
//! instead of quietly delaying the operations behind it (no coordinated omission). Without a
//! rate the loop is closed, and latency runs from posting to completion.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::app::{AppError, MemoryChoice, available_cores, plan_eal_args};
use crate::config::HugepageMode;
use crate::dataplane::Eal;
use crate::hugepages::HugepageStatus;
use crate::latency::{Latency, LatencySummary};
use crate::rdma::loopback::{self, LoopbackOpts, QPN_A, QPN_B};
use crate::report;
use crate::transport::{
    Access, Mtu, QpConfig, RecvRequest, WcOpcode, WcStatus, WorkRequest, WrKind,
};

/// Which operations to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchOp {
    Write,
    Read,
    Send,
    /// SEND, WRITE and READ in turn.
    Mixed,
}

#[derive(Debug, Clone)]
pub struct BenchOpts {
    pub op: BenchOp,
    /// Message size in bytes.
    pub size: u32,
    /// Operations outstanding at once.
    pub qd: usize,
    /// Operations per second (None: as fast as completions come back).
    pub rate: Option<f64>,
    pub duration: Duration,
    pub mtu: Mtu,
    pub hgrm: Option<PathBuf>,
    /// Capture both engines' ports into this pcapng file.
    pub pcap: Option<PathBuf>,
    pub json: bool,
    pub hugepages: HugepageMode,
    pub memory_mb: u32,
    pub eal: Vec<String>,
}

/// One operation type's results.
#[derive(Debug, Clone, Serialize)]
pub struct OpResult {
    pub op: &'static str,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub gbit_per_sec: f64,
    pub latency_ns: LatencySummary,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchSummary {
    pub op: BenchOp,
    pub size: u32,
    pub qd: usize,
    pub rate: Option<f64>,
    pub seconds: f64,
    pub memory: MemoryChoice,
    pub results: Vec<OpResult>,
    pub errors: u64,
    /// The engines' worker counters (retransmissions, ICRC errors, ...).
    pub workers: Vec<crate::runtime::WorkerReport>,
    pub capture: Option<crate::app::CaptureSummary>,
}

const BUF: usize = 1 << 22;
const A_SRC: u64 = 0x1000_0000;
const A_DST: u64 = 0x2000_0000;
const B_BUF: u64 = 0x4000_0000;
const B_RECV: u64 = 0x5000_0000;

const OP_NAMES: [&str; 3] = ["read", "send", "write"];

fn op_index(op: WcOpcode) -> usize {
    match op {
        WcOpcode::RdmaRead => 0,
        WcOpcode::Send => 1,
        _ => 2,
    }
}

/// Runs the benchmark and returns its summary (printed by the caller).
pub fn run(opts: &BenchOpts) -> Result<BenchSummary, AppError> {
    if opts.size == 0 || opts.size as usize > BUF / 4 {
        return Err(AppError::Usage(format!(
            "--size: must be 1..={} bytes",
            BUF / 4
        )));
    }
    if opts.qd == 0 || opts.qd > 120 {
        return Err(AppError::Usage(
            "--qd: must be 1..=120 (the send queue holds 128)".into(),
        ));
    }
    if opts.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        return Err(AppError::Usage(
            "--rate: must be a positive number of operations per second".into(),
        ));
    }
    let cores = available_cores();
    let (a, b) = (cores[0], *cores.last().unwrap_or(&cores[0]));
    let (args, memory) = plan_eal_args(
        &opts.eal,
        opts.hugepages,
        opts.memory_mb,
        a,
        &[],
        &HugepageStatus::read(),
    )?;
    let info = Eal::init(&args)?;
    report::banner(info, &memory, opts.json);

    let mut qp = QpConfig::new(0, 0);
    qp.pmtu = opts.mtu;
    qp.max_send_wr = 128;
    qp.max_recv_wr = 128;
    // A window of large READ responses takes longer than the 100 µs default to drain on one
    // software core; a longer timeout keeps retransmissions for real losses.
    qp.timeout_ns = 1_000_000;
    // Both engines on the last core, the host loop on the first (EAL's main lcore): on a
    // 2-core machine a third busy thread would leave the host waiting for CPU time slices.
    let pair = loopback::start(&LoopbackOpts {
        qp,
        faults: None,
        cores: [b, b],
        burst: 32,
        pcap: opts.pcap.clone(),
    })
    .map_err(|e| AppError::Usage(format!("starting the engines: {e}")))?;
    let loopback::LoopbackPair {
        runtime,
        a: mut ha,
        b: hb,
        capture,
    } = pair;
    let host = |e: crate::rdma::HostError| AppError::Usage(format!("host call: {e}"));
    let src = ha.register(A_SRC, BUF, Access::ALL).map_err(host)?;
    let dst = ha.register(A_DST, BUF, Access::ALL).map_err(host)?;
    let remote = hb.register(B_BUF, BUF, Access::ALL).map_err(host)?;
    let recv = hb
        .register(B_RECV, BUF, Access::LOCAL_WRITE)
        .map_err(host)?;
    let size = opts.size;
    let slots = (BUF / size as usize).clamp(1, 1024) as u64;

    human(
        opts.json,
        &format!(
            "bench {:?}: {} B messages, queue depth {}, {}, MTU {}, {} s; both engines on core {b}, host on core {a}",
            opts.op,
            size,
            opts.qd,
            opts.rate
                .map(|r| format!("{} ops/s intended", report::rate(r, "")))
                .unwrap_or_else(|| "closed loop".into()),
            opts.mtu.bytes(),
            opts.duration.as_secs_f64()
        ),
    );

    let mut hist: [Latency; 3] = Default::default();
    let mut counts = [0u64; 3];
    // Start times of outstanding operations, by wr_id modulo a power of two above the queue
    // depth: at most `qd` are outstanding, so slots never collide (and no hashing per op).
    let slots_len = (opts.qd * 2).next_power_of_two();
    let mut started: Vec<Option<Instant>> = vec![None; slots_len];
    let mut outstanding = 0usize;
    let mut errors = 0u64;
    let t0 = Instant::now();
    let end = t0 + opts.duration;
    let mut next_id = 0u64;
    let mut last_print = t0;
    let mut last_done = 0u64;
    let mut done = 0u64;
    let mut recv_posted = 0u64;
    loop {
        let now = Instant::now();
        // Post while there is room in the window and (with a rate) the next operation is due.
        while outstanding < opts.qd && now < end {
            let intended = match opts.rate {
                Some(r) => t0 + Duration::from_secs_f64(next_id as f64 / r),
                None => now,
            };
            if intended > now {
                break;
            }
            let kind_ix = match opts.op {
                BenchOp::Write => 0,
                BenchOp::Read => 1,
                BenchOp::Send => 2,
                BenchOp::Mixed => next_id % 3,
            };
            let slot = (next_id % slots) * size as u64;
            let (kind, lkey, local) = match kind_ix {
                0 => (
                    WrKind::Write {
                        remote_addr: B_BUF + slot,
                        rkey: remote.rkey,
                        imm: None,
                    },
                    src.lkey,
                    A_SRC + slot,
                ),
                1 => (
                    WrKind::Read {
                        remote_addr: B_BUF + slot,
                        rkey: remote.rkey,
                    },
                    dst.lkey,
                    A_DST + slot,
                ),
                _ => {
                    // Keep the receive queue ahead of the SENDs.
                    while recv_posted <= next_id + opts.qd as u64 {
                        let at = (recv_posted % slots) * size as u64;
                        hb.post_recv(
                            QPN_B,
                            RecvRequest {
                                wr_id: recv_posted,
                                lkey: recv.lkey,
                                addr: B_RECV + at,
                                len: size,
                            },
                        )
                        .map_err(host)?;
                        recv_posted += 1;
                    }
                    (WrKind::Send { imm: None }, src.lkey, A_SRC + slot)
                }
            };
            ha.post_send(
                QPN_A,
                WorkRequest {
                    wr_id: next_id,
                    kind,
                    lkey,
                    local_addr: local,
                    len: size,
                },
            )
            .map_err(host)?;
            started[next_id as usize & (slots_len - 1)] = Some(intended);
            outstanding += 1;
            next_id += 1;
        }
        // One clock read per batch of completions: the work they did ended by now.
        let polled_at = Instant::now();
        while let Some(wc) = ha.poll().map_err(host)? {
            let Some(t) = started[wc.wr_id as usize & (slots_len - 1)].take() else {
                continue;
            };
            outstanding -= 1;
            if wc.status != WcStatus::Success {
                errors += 1;
                continue;
            }
            let k = op_index(wc.opcode);
            hist[k].record(polled_at.saturating_duration_since(t).as_nanos() as u64);
            counts[k] += 1;
            done += 1;
        }
        let now = Instant::now();
        if now.duration_since(last_print) >= Duration::from_secs(1) {
            let dt = now.duration_since(last_print).as_secs_f64();
            human(
                opts.json,
                &format!(
                    "[{:6.1}s] {:>12} ops/s  {:>14}  outstanding {}",
                    now.duration_since(t0).as_secs_f64(),
                    report::rate((done - last_done) as f64 / dt, ""),
                    report::rate((done - last_done) as f64 * size as f64 * 8.0 / dt, "bit/s"),
                    outstanding
                ),
            );
            last_print = now;
            last_done = done;
        }
        if now >= end && outstanding == 0 {
            break;
        }
        if now >= end + Duration::from_secs(5) {
            errors += outstanding as u64;
            break;
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let workers = runtime.join()?;
    let captured = match (capture, &opts.pcap) {
        (Some(sink), Some(path)) => Some(crate::app::CaptureSummary {
            path: path.display().to_string(),
            packets: sink.finish().map_err(|source| AppError::Capture {
                path: path.display().to_string(),
                source,
            })?,
        }),
        _ => None,
    };

    let results: Vec<OpResult> = (0..3)
        .filter(|&k| counts[k] > 0)
        .map(|k| OpResult {
            op: OP_NAMES[k],
            ops: counts[k],
            ops_per_sec: counts[k] as f64 / seconds,
            gbit_per_sec: counts[k] as f64 * size as f64 * 8.0 / seconds / 1e9,
            latency_ns: hist[k].summary(),
        })
        .collect();
    if let Some(path) = &opts.hgrm {
        let mut all = Latency::new();
        for h in &hist {
            all.merge(h);
        }
        let file = std::fs::File::create(path).map_err(|source| AppError::Capture {
            path: path.display().to_string(),
            source,
        })?;
        all.write_hgrm(std::io::BufWriter::new(file), 1000.0)
            .map_err(|source| AppError::Capture {
                path: path.display().to_string(),
                source,
            })?;
    }
    Ok(BenchSummary {
        op: opts.op,
        size,
        qd: opts.qd,
        rate: opts.rate,
        seconds,
        memory,
        results,
        errors,
        workers,
        capture: captured,
    })
}

fn human(json: bool, line: &str) {
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// Prints the summary: a table per operation type, or one JSON object.
pub fn print(s: &BenchSummary, json: bool, hgrm: Option<&PathBuf>) {
    if json {
        let mut v = serde_json::to_value(s).expect("summary serialises");
        v["type"] = serde_json::json!("bench");
        println!("{v}");
        return;
    }
    println!();
    println!("bench summary: {:.2} s, {} errors", s.seconds, s.errors);
    println!(
        "  {:<6} {:>10} {:>12} {:>10}   latency µs: {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "op", "ops", "ops/s", "Gbit/s", "p50", "p90", "p99", "p99.9", "p99.99", "max"
    );
    for r in &s.results {
        let l = &r.latency_ns;
        let us = |ns: u64| ns as f64 / 1000.0;
        println!(
            "  {:<6} {:>10} {:>12.0} {:>10.3}               {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            r.op,
            r.ops,
            r.ops_per_sec,
            r.gbit_per_sec,
            us(l.p50),
            us(l.p90),
            us(l.p99),
            us(l.p99_9),
            us(l.p99_99),
            us(l.max)
        );
    }
    for w in &s.workers {
        let c: Vec<String> = w
            .counters
            .iter()
            .filter(|(_, v)| *v > 0)
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        println!(
            "  worker {} (core {}): {}",
            w.worker,
            w.core.unwrap_or(0),
            c.join(", ")
        );
    }
    if let Some(p) = hgrm {
        println!("  latency distribution (µs) written to {}", p.display());
    }
    if let Some(c) = &s.capture {
        println!("  capture: {} packets written to {}", c.packets, c.path);
    }
}
