//! What a run prints: a banner, the worker plan, one live line per worker per stats period
//! (like testpmd's `--stats-period`), and a final summary. With `--json`, stdout carries only
//! JSON lines (`{"type":"interval",...}` and one `{"type":"summary",...}`) and the human text
//! goes to stderr.
//!
//! `report` prints the plain data of [`crate::summary`] and never calls `app`; `app`, `bench`
//! and `peer` call it.

use std::time::Instant;

use serde_json::json;

use crate::config::{Task, Worker};
use crate::dataplane::{EalInfo, PortInfo};
use crate::runtime::{Polling, WorkerReport};
use crate::summary::{MemoryChoice, PortSummary, Summary};
use crate::traffic::{CheckCounters, CheckSlot};

macro_rules! human {
    ($json:expr, $($arg:tt)*) => {
        if $json { eprintln!($($arg)*) } else { println!($($arg)*) }
    };
}

pub fn banner(info: &EalInfo, memory: &MemoryChoice, polling: Option<Polling>, json: bool) {
    human!(
        json,
        "portico {} on {} · memory: {} · TSC {:.3} GHz",
        env!("CARGO_PKG_VERSION"),
        info.version,
        memory,
        info.tsc_hz as f64 / 1e9
    );
    human!(json, "EAL: {}", info.args[1..].join(" "));
    if let Some(p) = polling {
        human!(
            json,
            "workers: {} · their wake-ups of a waiting host: {}",
            p.describe(),
            if node::wake::asymmetric() {
                "a compiler fence, the host's membarrier"
            } else {
                "a fence on both sides (no membarrier, or PORTICO_FENCES=symmetric)"
            }
        );
        if matches!(p, Polling::Adaptive { .. }) {
            human!(
                json,
                "workers: idle sleeps end on a host post or a timeout: no RX interrupts are used, and DPDK's power monitor is {}",
                if crate::dataplane::cpu_has_power_monitor() {
                    "on this CPU but not used yet (docs/dataplane.md, \"Polling\")"
                } else {
                    "not on this CPU (neither WAITPKG nor MONITORX)"
                }
            );
        }
    }
}

/// Per worker: its core, its polling's idle counters, and the CPU time it used and its share
/// of a core (what `portico target` and `initiator` summaries carry).
pub fn worker_use(reports: &[WorkerReport]) -> serde_json::Value {
    reports
        .iter()
        .map(|w| {
            json!({"worker": w.worker, "core": w.core, "cpu_ns": w.cpu_ns, "wall_ns": w.wall_ns,
                   "cpu_share": cpu_share(w), "idle": w.idle})
        })
        .collect()
}

/// The share of a core a worker used while its loop ran (0 before it published a reading).
pub fn cpu_share(w: &WorkerReport) -> f64 {
    if w.wall_ns == 0 {
        return 0.0;
    }
    w.cpu_ns as f64 / w.wall_ns as f64
}

/// One line on what a worker's polling did, when it backed off at all.
fn idle_line(w: &WorkerReport) -> Option<String> {
    let i = &w.idle;
    if i.backed_off == 0 && i.slept == 0 {
        return None;
    }
    let mean_over = i.oversleep_ns.checked_div(i.timeouts).unwrap_or(0);
    Some(format!(
        "adaptive: {} iterations busy, {} paused, {} asleep ({:.1} ms in all); woken {} times by the host; sleeps overran by {:.1} µs on average, {:.1} µs at most",
        i.busy,
        i.backed_off,
        i.slept,
        i.sleep_taken_ns as f64 / 1e6,
        i.host_wakes,
        mean_over as f64 / 1e3,
        i.max_oversleep_ns as f64 / 1e3
    ))
}

pub fn plan(workers: &[Worker], ports: &[String], json: bool) {
    for w in workers {
        let what = match &w.task {
            Task::Generate {
                tx,
                frame_size,
                rate_pps,
                count,
            } => format!(
                "generate {frame_size} B frames {}{} on {}:{}",
                rate_pps
                    .map(|r| format!("at {}", rate(r as f64, "pps")))
                    .unwrap_or_else(|| "at full speed".into()),
                count.map(|c| format!(" ({c} in all)")).unwrap_or_default(),
                ports[tx.port],
                tx.queue
            ),
            Task::Check { rx, expect } => format!(
                "check frames from {}:{}{}",
                ports[rx.port],
                rx.queue,
                expect
                    .map(|e| format!(", expecting {e}"))
                    .unwrap_or_default()
            ),
            Task::Forward { mode, paths } => format!(
                "forward ({mode:?}) {}",
                paths
                    .iter()
                    .map(|(r, t)| format!(
                        "{}:{} → {}:{}",
                        ports[r.port], r.queue, ports[t.port], t.queue
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        human!(json, "worker {} on core {}: {}", w.name, w.core, what);
    }
}

/// "12.34 Mpps", "980.0 kpps", ...
pub fn rate(v: f64, unit: &str) -> String {
    if v >= 1e9 {
        format!("{:.2} G{unit}", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} M{unit}", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k{unit}", v / 1e3)
    } else {
        format!("{v:.0} {unit}")
    }
}

/// The checker's byte count, left out of the live lines (the rates say it).
const VALID_BYTES: &str = CheckCounters::NAMES[CheckSlot::valid_bytes.index()];

/// One line per worker with the rates over the last period.
pub fn interval(
    t0: Instant,
    last: &(Instant, Vec<WorkerReport>),
    now: &(Instant, Vec<WorkerReport>),
    json: bool,
) {
    let dt = now.0.duration_since(last.0).as_secs_f64().max(1e-9);
    let t = now.0.duration_since(t0).as_secs_f64();
    let mut rows = Vec::new();
    for (a, b) in last.1.iter().zip(&now.1) {
        let rx_pps = (b.io.rx_packets - a.io.rx_packets) as f64 / dt;
        let tx_pps = (b.io.tx_packets - a.io.tx_packets) as f64 / dt;
        let rx_bps = (b.io.rx_bytes - a.io.rx_bytes) as f64 * 8.0 / dt;
        let tx_bps = (b.io.tx_bytes - a.io.tx_bytes) as f64 * 8.0 / dt;
        let loops = (b.io.loops - a.io.loops).max(1);
        let idle = (b.io.empty_polls - a.io.empty_polls) as f64 / loops as f64;
        let drops = b.io.drops - a.io.drops;
        if json {
            rows.push(json!({
                "worker": b.worker, "rx_pps": rx_pps, "tx_pps": tx_pps, "rx_bps": rx_bps,
                "tx_bps": tx_bps, "drops": drops, "idle": idle,
                "counters": b.counters.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
            }));
        } else {
            let extra: String = b
                .counters
                .iter()
                .filter(|(k, _)| k != VALID_BYTES)
                .map(|(k, v)| format!(" {k} {v}"))
                .collect();
            println!(
                "[{t:6.1}s] {:<8} rx {:>11} {:>12} | tx {:>11} {:>12} | drops {drops} | idle {:4.1}% |{extra}",
                b.worker,
                rate(rx_pps, "pps"),
                rate(rx_bps, "bit/s"),
                rate(tx_pps, "pps"),
                rate(tx_bps, "bit/s"),
                idle * 100.0
            );
        }
    }
    if json {
        println!("{}", json!({"type": "interval", "t": t, "workers": rows}));
    }
}

pub fn summary(s: &Summary, json: bool) {
    if json {
        let mut v = serde_json::to_value(s).expect("summary serialises");
        v["type"] = json!("summary");
        v["tx_pps"] = json!(s.tx_pps());
        println!("{v}");
        return;
    }
    println!();
    println!(
        "summary: {} stopped ({:?}) after {:.2} s",
        s.command, s.stop_reason, s.seconds
    );
    println!(
        "  {:<8} {:>5} {:<9} {:>14} {:>14} {:>12} {:>12} {:>7}",
        "worker", "core", "stage", "rx packets", "tx packets", "rx Mpps", "tx Mpps", "drops"
    );
    for w in &s.workers {
        println!(
            "  {:<8} {:>5} {:<9} {:>14} {:>14} {:>12.3} {:>12.3} {:>7}",
            w.worker,
            w.core.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
            w.stage,
            w.io.rx_packets,
            w.io.tx_packets,
            w.io.rx_packets as f64 / s.seconds / 1e6,
            w.io.tx_packets as f64 / s.seconds / 1e6,
            w.io.drops
        );
        if !w.counters.is_empty() {
            let c: Vec<String> = w.counters.iter().map(|(k, v)| format!("{k} {v}")).collect();
            println!("  {:<8} {}", "", c.join(", "));
        }
        println!("  {:<8} cpu {:.1} % of a core", "", 100.0 * cpu_share(w));
        if let Some(line) = idle_line(w) {
            println!("  {:<8} {line}", "");
        }
        let f = &w.faults;
        if *f != Default::default() {
            println!(
                "  {:<8} faults injected: dropped {}, duplicated {}, reordered {}, corrupted {}",
                "", f.dropped, f.duplicated, f.reordered, f.corrupted
            );
        }
    }
    port_table(&s.ports);
    for c in &s.checks {
        println!(
            "  check {}: {} — sent {}, valid {} (expected {}), invalid {}, sequence gaps {}, late {}",
            c.worker,
            if c.passed { "PASS" } else { "FAIL" },
            c.sent.map(|v| v.to_string()).unwrap_or_else(|| "?".into()),
            c.valid,
            c.expected_valid
                .map(|v| v.to_string())
                .unwrap_or_else(|| "?".into()),
            c.invalid,
            c.seq_gaps,
            c.late
        );
    }
    if let Some(c) = &s.capture {
        println!("  capture: {} packets written to {}", c.packets, c.path);
    }
    println!(
        "  total: {} forwarded/sent, {:.3} Mpps",
        s.total_tx_packets(),
        s.tx_pps() / 1e6
    );
}

/// The ports' lines of a summary: what each PMD counted, its misses (frames dropped for want
/// of an RX descriptor), errors and mbuf allocation failures, then every drop xstat that is
/// not zero.
pub fn port_table(ports: &[PortSummary]) {
    println!(
        "  {:<8} {:>3} {:<12} {:>14} {:>14} {:>10} {:>10} {:>8}",
        "port", "id", "driver", "rx packets", "tx packets", "missed", "errors", "nombuf"
    );
    for p in ports {
        println!(
            "  {:<8} {:>3} {:<12} {:>14} {:>14} {:>10} {:>10} {:>8}   link {}",
            p.name,
            p.id,
            p.driver,
            p.stats.rx_packets,
            p.stats.tx_packets,
            p.stats.rx_missed,
            p.stats.rx_errors + p.stats.tx_errors,
            p.stats.rx_nombuf,
            p.link
        );
        let drops: Vec<String> = p
            .nonzero_drop_xstats()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        if !drops.is_empty() {
            println!("  {:<8} drops: {}", "", drops.join(", "));
        }
    }
}

/// The port table; `xstats[i]` (when given) are port i's extended statistics.
pub fn ports(list: &[PortInfo], xstats: &[Vec<(String, u64)>], json: bool) {
    if json {
        let mut v = serde_json::to_value(list).expect("port info serialises");
        for (port, xs) in v.as_array_mut().into_iter().flatten().zip(xstats) {
            port["xstats"] = xs
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect::<serde_json::Map<_, _>>()
                .into();
        }
        println!("{v}");
        return;
    }
    if list.is_empty() {
        println!(
            "no ports probed (pass devices after --, e.g. `-- --vdev net_null0` or `-- -a 0000:3b:00.0`)"
        );
        return;
    }
    println!(
        "{:>3}  {:<20} {:<14} {:<17} {:>6} {:>11} {:>11}  link",
        "id", "name", "driver", "mac", "socket", "max rxq", "max txq"
    );
    for p in list {
        println!(
            "{:>3}  {:<20} {:<14} {:<17} {:>6} {:>11} {:>11}  {}",
            p.id, p.name, p.driver, p.mac, p.socket, p.max_rx_queues, p.max_tx_queues, p.link
        );
    }
    for (p, xs) in list.iter().zip(xstats) {
        println!("xstats of port {} ({}):", p.id, p.name);
        for (k, v) in xs {
            println!("  {k:<40} {v:>16}");
        }
    }
}
