//! Portico's own DPDK telemetry commands, next to DPDK's (`/ethdev/stats`, `/eal/params`, ...)
//! on the same socket, so that `dpdk-telemetry.py` or any telemetry client reads a running
//! engine (see `docs/telemetry.md`):
//!
//! - `/portico/info`: version, DPDK version, role (`target`, `initiator`, `bench`), pid, the
//!   ports by name with their DPDK port ids (for `/ethdev/stats,<id>`), workers and queue pairs;
//! - `/portico/workers[,<i>]`: per worker, its name, core, stage and every counter by name,
//!   as the worker last published it (the stage's counters every 64 loop iterations);
//! - `/portico/qps[,<i>]`: per queue pair, where it lives (QPN, the peer's, home worker and
//!   core, UDP source port) and its live transport state as its worker last published it (once
//!   a millisecond: PSNs, queue depths, RTO and RTT, retransmissions, ...; see
//!   [`crate::rdma::live`]);
//! - `/portico/latency[,<op>]`: the latency percentiles of each operation type, in ns, from a
//!   [`LatencySlot`] the application fills, or `{"source": "none", "reason": ...}` for a
//!   process that runs no operations of its own (a target).
//!
//! A parameter the command does not know is answered `{"error": "..."}`. What each command
//! answers is built here by pure functions over plain data (tested without EAL); [`register`]
//! wires them to DPDK through [`crate::dataplane::telemetry`], whose limits (no floats, no
//! arrays of objects, 16 KiB per answer) the answers are shaped for: dicts keyed by index,
//! integers in ns.
//!
//! ## Latency: the slot API
//!
//! ```ignore
//! let slot = LatencySlot::new();               // before register(), keep a clone
//! let reg = telemetry::register(Instance { latency: LatencySource::Slot(slot.clone()), .. })?;
//! // in the host loop, about once a second and at the end:
//! slot.publish("write_read", &histogram);     // a crate::latency::Latency; op: [A-Za-z0-9_]
//! ```
//! `publish` replaces that operation's figures with the histogram's percentiles (count, min,
//! mean, p50/p90/p99/p99.9/p99.99, max) and stamps the time; readers see the last ones.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::dataplane::telemetry::{self as tel, Command, TelemetryError, error};
use crate::latency::Latency;
use crate::rdma::{LiveReader, QpLive};
use crate::runtime::{CounterReader, WorkerReport};

/// One operation type's latency figures, in ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LatencyFigures {
    pub count: u64,
    pub min_ns: u64,
    /// Rounded to the nanosecond (telemetry carries no floats).
    pub mean_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p99_9_ns: u64,
    pub p99_99_ns: u64,
    pub max_ns: u64,
}

impl LatencyFigures {
    pub fn of(latency: &Latency) -> LatencyFigures {
        let s = latency.summary();
        LatencyFigures {
            count: s.count,
            min_ns: s.min,
            mean_ns: s.mean.round() as u64,
            p50_ns: s.p50,
            p90_ns: s.p90,
            p99_ns: s.p99,
            p99_9_ns: s.p99_9,
            p99_99_ns: s.p99_99,
            max_ns: s.max,
        }
    }
}

#[derive(Debug, Default)]
struct Board {
    ops: BTreeMap<String, LatencyFigures>,
    updated: Option<Instant>,
}

/// Where an application leaves its latency figures for `/portico/latency` (see the module
/// doc). Cloning shares the slot.
#[derive(Debug, Clone, Default)]
pub struct LatencySlot(Arc<Mutex<Board>>);

impl LatencySlot {
    pub fn new() -> LatencySlot {
        LatencySlot::default()
    }

    /// Replaces `op`'s figures with `latency`'s.
    pub fn publish(&self, op: &str, latency: &Latency) {
        let figures = LatencyFigures::of(latency);
        let mut b = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        b.ops.insert(op.to_string(), figures);
        b.updated = Some(Instant::now());
    }

    /// The figures by operation, and milliseconds since the last publication (`None`: never).
    pub fn read(&self) -> (BTreeMap<String, LatencyFigures>, Option<u64>) {
        let b = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        (
            b.ops.clone(),
            b.updated.map(|t| t.elapsed().as_millis() as u64),
        )
    }
}

/// What `/portico/latency` reads.
#[derive(Debug, Clone)]
pub enum LatencySource {
    /// The process measures no operations of its own: why.
    None(&'static str),
    Slot(LatencySlot),
}

/// Where a queue pair lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QpHome {
    pub qpn: u32,
    pub peer_qpn: u32,
    /// Its home worker (index into `/portico/workers`), also its RX/TX queue on the port.
    pub worker: usize,
    pub core: usize,
    /// The peer's RX queue its packets are steered to, by their UDP source port.
    pub peer_queue: u16,
    pub udp_src_port: u16,
}

/// A running Portico process (a target, an initiator or a bench), as telemetry reads it.
pub struct Instance {
    /// `target`, `initiator` or `bench`.
    pub role: &'static str,
    /// The engine's ports: name and DPDK port id.
    pub ports: Vec<(String, u16)>,
    pub counters: CounterReader,
    pub qps: Vec<QpHome>,
    /// `None`: the engine's workers publish no queue pair state.
    pub live: Option<LiveReader>,
    pub latency: LatencySource,
}

/// The commands [`register`] adds, with their help text.
pub const COMMANDS: [(&str, &str); 4] = [
    (
        "/portico/info",
        "Portico: version, role, pid, ports (name: DPDK port id), workers, queue pairs",
    ),
    (
        "/portico/workers",
        "Portico: every counter of each worker. Parameters: worker index (optional)",
    ),
    (
        "/portico/qps",
        "Portico: each queue pair's placement and live transport state. Parameters: index",
    ),
    (
        "/portico/latency",
        "Portico: latency percentiles (ns) per operation type. Parameters: op (optional)",
    ),
];

/// `params` as an index below `len`: `None` for no parameter, an error answer for anything
/// else.
fn index(params: &str, what: &str, len: usize) -> Result<Option<usize>, Value> {
    let p = params.trim();
    if p.is_empty() {
        return Ok(None);
    }
    match p.parse::<usize>() {
        Ok(i) if i < len => Ok(Some(i)),
        _ => Err(error(format!(
            "unknown parameter {p:?}: a {what} index, 0..{len} (exclusive), or none"
        ))),
    }
}

/// Answers with every item keyed by index, or the one `params` selects.
fn select(params: &str, what: &str, items: Vec<Value>) -> Value {
    match index(params, what, items.len()) {
        Err(e) => e,
        Ok(Some(i)) => {
            let mut v = items[i].clone();
            if let Some(m) = v.as_object_mut() {
                m.insert("index".into(), json!(i));
            }
            v
        }
        Ok(None) => Value::Object(
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (i.to_string(), v))
                .collect(),
        ),
    }
}

/// One worker: name, core, stage, the runtime's counters, the stage's by name, faults, what
/// its polling did while idle, and its CPU time.
fn worker(r: &WorkerReport) -> Value {
    let stage: Map<String, Value> = r
        .counters
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let mut w = json!({
        "name": r.worker, "core": r.core.map_or(json!("none"), |c| json!(c)), "stage": r.stage,
        "counters": stage, "faults": r.faults, "idle": r.idle, "cpu_ns": r.cpu_ns,
        "wall_ns": r.wall_ns,
    });
    // The loop's own counters, one key each, as declared (`LoopCounters`).
    for (k, v) in r.io.iter() {
        w[k] = json!(v);
    }
    w
}

/// `/portico/workers`.
pub fn workers_answer(reports: &[WorkerReport], params: &str) -> Value {
    select(params, "worker", reports.iter().map(worker).collect())
}

/// `/portico/qps`: each queue pair's placement, with the live state its home worker published
/// (`live` per worker, as [`LiveReader::read`] gives it); `"live": 0` until it has.
pub fn qps_answer(qps: &[QpHome], live: &[(Vec<QpLive>, u64)], params: &str) -> Value {
    let items = qps
        .iter()
        .map(|q| {
            let mut v = json!(q);
            let found = live
                .get(q.worker)
                .and_then(|(l, _)| l.iter().find(|l| l.qpn == q.qpn));
            let m = v.as_object_mut().expect("a struct serialises to an object");
            m.insert("live".into(), json!(if found.is_some() { 1 } else { 0 }));
            if let Some(l) = found
                && let Value::Object(fields) = json!(l)
            {
                m.extend(fields.into_iter().filter(|(k, _)| k != "qpn"));
            }
            v
        })
        .collect();
    select(params, "queue pair", items)
}

/// `/portico/latency`.
pub fn latency_answer(source: &LatencySource, params: &str) -> Value {
    let slot = match source {
        LatencySource::None(reason) => {
            return json!({"source": "none", "reason": reason});
        }
        LatencySource::Slot(s) => s,
    };
    let (ops, age) = slot.read();
    let p = params.trim();
    if !p.is_empty() {
        return match ops.get(p) {
            Some(f) => {
                let mut v = json!(f);
                v["op"] = json!(p);
                v
            }
            None => error(format!(
                "unknown parameter {p:?}: an operation ({}), or none",
                ops.keys().cloned().collect::<Vec<_>>().join(", ")
            )),
        };
    }
    let mut v = json!({"source": "slot", "ops": ops});
    if let Some(ms) = age {
        v["updated_ms_ago"] = json!(ms);
    }
    v
}

/// `/portico/info`.
pub fn info_answer(e: &Instance, pid: u32, dpdk: &str, params: &str) -> Value {
    if !params.trim().is_empty() {
        return error(format!(
            "{:?}: /portico/info takes no parameter",
            params.trim()
        ));
    }
    let ports: Map<String, Value> = e
        .ports
        .iter()
        .map(|(name, id)| (name.clone(), json!(id)))
        .collect();
    json!({
        "version": env!("CARGO_PKG_VERSION"), "dpdk": dpdk, "role": e.role, "pid": pid,
        "ports": ports, "workers": e.counters.reports().len(), "qps": e.qps.len(),
        "commands": COMMANDS.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
    })
}

/// The registered commands. Dropping it (when the engine stops) makes every one of them
/// answer `{"stopped": 1, ...}`.
pub struct Registration {
    _commands: Vec<Command>,
    /// The telemetry socket, if EAL serves one.
    pub socket: Option<PathBuf>,
}

/// Registers [`COMMANDS`] for `engine`. Requires EAL (telemetry starts with it).
pub fn register(engine: Instance) -> Result<Registration, TelemetryError> {
    let engine = Arc::new(engine);
    let pid = std::process::id();
    let dpdk = crate::dataplane::dpdk_version();
    type Answer = Box<dyn Fn(&str) -> Value + Send + Sync>;
    let e = engine.clone();
    let info: Answer = Box::new(move |p| info_answer(&e, pid, &dpdk, p));
    let e = engine.clone();
    let workers: Answer = Box::new(move |p| workers_answer(&e.counters.reports(), p));
    let e = engine.clone();
    let qps: Answer = Box::new(move |p| {
        let live = e.live.as_ref().map(LiveReader::read).unwrap_or_default();
        qps_answer(&e.qps, &live, p)
    });
    let e = engine;
    let latency: Answer = Box::new(move |p| latency_answer(&e.latency, p));
    // In the order of COMMANDS.
    let mut commands = Vec::with_capacity(COMMANDS.len());
    for ((name, help), answer) in COMMANDS.into_iter().zip([info, workers, qps, latency]) {
        commands.push(tel::register(name, help, answer)?);
    }
    Ok(Registration {
        _commands: commands,
        socket: tel::socket_path(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::telemetry::{json_len, to_tel};
    use crate::runtime::Counters;

    fn report(name: &str, rx: u64) -> WorkerReport {
        let mut c = Counters::default();
        c.io.rx_packets = rx;
        c.stage[0] = 7;
        c.idle.slept = 3;
        c.cpu_ns = 5;
        WorkerReport::new(name, Some(1), "rdma", &["delivered", "icrc_errors"], &c)
    }

    /// Every answer must be something DPDK carries whole.
    fn carried(v: &Value) {
        let t = to_tel(v).unwrap_or_else(|e| panic!("{e}: {v}"));
        assert!(json_len(&t) < 16000, "{v}");
    }

    #[test]
    fn workers_by_index_or_one() {
        let r = [report("rdma0", 10), report("rdma1", 20)];
        let all = workers_answer(&r, "");
        carried(&all);
        assert_eq!(all["0"]["name"], "rdma0");
        assert_eq!(all["1"]["rx_packets"], 20);
        // Every counter of the loop's declared set is a key of the worker's answer.
        for name in crate::runtime::LoopCounters::NAMES {
            assert!(all["1"][name].is_u64(), "{name}: {}", all["1"]);
        }
        assert_eq!(all["1"]["counters"]["delivered"], 7);
        assert_eq!(all["0"]["core"], 1);
        assert_eq!(
            (&all["1"]["idle"]["slept"], &all["1"]["cpu_ns"]),
            (&json!(3), &json!(5))
        );
        let one = workers_answer(&r, "1");
        assert_eq!(
            (one["index"].clone(), one["name"].clone()),
            (json!(1), json!("rdma1"))
        );
        for bad in ["2", "x", "-1"] {
            let e = workers_answer(&r, bad);
            assert!(
                e["error"].as_str().unwrap().contains("worker index"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn every_counter_of_a_real_stage_fits_one_answer() {
        let names = &crate::rdma::COUNTER_NAMES;
        let c = Counters::default();
        let r: Vec<WorkerReport> = (0..4)
            .map(|i| WorkerReport::new(&format!("rdma{i}"), Some(i), "rdma", names, &c))
            .collect();
        let all = workers_answer(&r, "");
        carried(&all);
        assert_eq!(all["3"]["counters"].as_object().unwrap().len(), names.len());
        // Every key is a declared counter, with its slot's value.
        let mut c = Counters::default();
        for (i, v) in c.stage.iter_mut().enumerate() {
            *v = i as u64;
        }
        let one = workers_answer(&[WorkerReport::new("rdma0", None, "rdma", names, &c)], "0");
        let keys = one["counters"].as_object().unwrap();
        for (k, v) in keys {
            let slot = names.iter().position(|n| n == k);
            assert_eq!(slot.map(|i| json!(i)).as_ref(), Some(v), "{k}");
        }
    }

    #[test]
    fn qps_join_placement_and_live_state() {
        let place = |qpn, worker| QpHome {
            qpn,
            peer_qpn: qpn - 0x11,
            worker,
            core: worker + 1,
            peer_queue: 0,
            udp_src_port: 0xc000,
        };
        let qps = [place(0x22, 0), place(0x23, 1)];
        let live0 = QpLive {
            qpn: 0x22,
            next_tx_psn: 500,
            retransmissions: 3,
            ..QpLive::default()
        };
        let live = vec![(vec![live0], 0), (vec![], 0)];
        let all = qps_answer(&qps, &live, "");
        carried(&all);
        assert_eq!(all["0"]["qpn"], 0x22);
        assert_eq!(all["0"]["live"], 1);
        assert_eq!(all["0"]["next_tx_psn"], 500);
        assert_eq!(all["0"]["retransmissions"], 3);
        assert_eq!(all["1"]["live"], 0);
        assert!(all["1"].get("next_tx_psn").is_none());
        assert_eq!(qps_answer(&qps, &live, "1")["peer_qpn"], 0x12);
        assert!(qps_answer(&qps, &live, "0x22")["error"].is_string());
    }

    #[test]
    fn latency_from_a_slot_or_none() {
        let none = latency_answer(&LatencySource::None("no operations here"), "");
        assert_eq!(none["source"], "none");
        assert_eq!(none["reason"], "no operations here");
        let slot = LatencySlot::new();
        let src = LatencySource::Slot(slot.clone());
        let before = latency_answer(&src, "");
        assert_eq!(before["source"], "slot");
        assert!(before["ops"].as_object().unwrap().is_empty());
        assert!(before.get("updated_ms_ago").is_none());
        let mut l = Latency::new();
        for ns in [1_000, 2_000, 3_000, 4_000] {
            l.record(ns);
        }
        slot.publish("write_read", &l);
        let after = latency_answer(&src, "");
        carried(&after);
        let w = &after["ops"]["write_read"];
        assert_eq!(w["count"], 4);
        assert_eq!(w["min_ns"], l.summary().min);
        assert_eq!(w["p50_ns"], l.percentile(50.0));
        assert_eq!(w["max_ns"], l.summary().max);
        assert_eq!(w["mean_ns"], l.summary().mean.round() as u64);
        assert!(after["updated_ms_ago"].is_u64());
        assert_eq!(latency_answer(&src, "write_read")["count"], 4);
        let e = latency_answer(&src, "read");
        assert!(e["error"].as_str().unwrap().contains("write_read"), "{e}");
    }

    #[test]
    fn command_names_and_help_are_what_dpdk_takes() {
        for (name, help) in COMMANDS {
            assert!(tel::valid_command_name(name), "{name}");
            assert!(help.len() <= tel::MAX_STRING_LEN, "{name}");
        }
    }
}
