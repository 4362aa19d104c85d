//! `portico bench connect`: connection set-up through the IBTA CM between two engines over
//! `net_ring`, in a closed loop, beside the set-up of the TCP exchange that `bench --server`
//! and `--client` use.
//!
//! Engine B listens; for each of `--connections` connections the host thread asks A's CM to
//! connect, accepts the request on B (with a region in the REP's private data, as
//! `portico target --listen` does), and times from the connect call to the later of the two
//! sides' established events (REQ, REP, RTU, and the queue pair on each side); then A
//! disconnects and the teardown (DREQ, DREP, both queue pairs gone) is timed the same way.
//! The TCP exchange is timed on loopback in the same run: a TCP connect and one hello/answer
//! round trip of the JSON lines the two processes exchange, the least a TCP-based set-up
//! costs. Afterwards, once time-wait has passed, the engines' published queue pairs, the
//! CMs' counters and the process's resident memory are compared with their values before the
//! first connection: nothing may be left behind. The resident memory is also read after the
//! first half of the connections (and their time-wait): the allocator keeps the peak that
//! time-wait's connections made, so the second half must leave it where the first did.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{BenchOpts, start_eal_for_pairs};
use portico::app::AppError;
use portico::latency::{Latency, LatencySummary};
use portico::rdma::RdmaHandle;
use portico::rdma::cm::{CmEvents, ConnEvent, RegionAd};
use portico::rdma::loopback::{self, LoopbackOpts};
use portico::transport::QpConfig;

/// The rdma_cm port B listens on.
const PORT: u16 = 7471;
/// Longer than the CMs' time-wait (1 s): the ended connections are forgotten after it.
const TIME_WAIT: Duration = Duration::from_millis(1500);
/// The longest a connection or its end may take before the run fails.
const WAIT: Duration = Duration::from_secs(10);

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectSummary {
    pub connections: u64,
    /// From A's connect call to both sides established, ns.
    pub cm_setup_ns: LatencySummary,
    /// From A's disconnect call to both sides disconnected (queue pairs destroyed), ns.
    pub cm_teardown_ns: LatencySummary,
    /// A TCP connect and one JSON hello/answer round trip on loopback, ns.
    pub tcp_exchange_ns: LatencySummary,
    /// Median CM set-up over median TCP exchange.
    pub p50_ratio: f64,
    /// The loop of connections, without the wait for time-wait halfway.
    pub seconds: f64,
    /// After the run (time-wait over): what is left against before it.
    pub leaks: Leaks,
    pub errors: u64,
}

/// Before and after the run.
#[derive(Debug, Clone, Serialize)]
pub struct Leaks {
    pub qps_before: usize,
    pub qps_after: usize,
    pub cm_qps_created: u64,
    pub cm_qps_destroyed: u64,
    pub rss_kib_before: u64,
    /// After the first half of the connections (and its time-wait): what the allocator kept
    /// of the peak (time-wait holds a second's worth of connections).
    pub rss_kib_half: u64,
    /// After the second half: the same as after the first unless something leaks.
    pub rss_kib_after: u64,
}

/// The process's resident set, KiB (`/proc/self/statm`).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4)
}

/// Queue pairs both engines published (every millisecond of their workers' time).
fn live_qps(handles: [&RdmaHandle; 2]) -> usize {
    std::thread::sleep(Duration::from_millis(20));
    handles
        .iter()
        .map(|h| {
            h.live_qps()
                .read()
                .iter()
                .map(|(qps, _)| qps.len())
                .sum::<usize>()
        })
        .sum()
}

/// Waits for an event `want` takes on `events` (skipping others), at most [`WAIT`].
fn wait_for(
    events: &CmEvents,
    mut want: impl FnMut(&ConnEvent) -> bool,
    what: &str,
) -> Result<ConnEvent, AppError> {
    let t0 = Instant::now();
    loop {
        match events.wait(WAIT.saturating_sub(t0.elapsed())) {
            Some(ev) if want(&ev) => return Ok(ev),
            Some(_) => {}
            None => {
                return Err(AppError::Failed(format!(
                    "bench connect: no {what} in {WAIT:?}"
                )));
            }
        }
    }
}

/// The CM's counters of both engines summed, from their workers' published counters.
fn cm_counts(running: &portico::runtime::Runtime) -> (u64, u64) {
    let reports = running.counter_reader().reports();
    let get = |name: &str| -> u64 { reports.iter().filter_map(|w| w.counter(name)).sum() };
    (get("cm_qps_created"), get("cm_qps_destroyed"))
}

/// Runs the bench.
pub fn run(
    opts: &BenchOpts,
    connections: u64,
    stop: Arc<AtomicBool>,
) -> Result<ConnectSummary, AppError> {
    let (_, engine_core, _memory) = start_eal_for_pairs(opts, 1)?;
    let mut qp = QpConfig::new(0x11, 0x22);
    qp.pmtu = opts.mtu;
    let lo = LoopbackOpts {
        cm: true,
        name: "cm".into(),
        ..LoopbackOpts::new(qp, [engine_core, engine_core])
    };
    let pair =
        loopback::start(&lo).map_err(|e| AppError::Failed(format!("starting the engines: {e}")))?;
    let [(ev_a, _cq_a), (ev_b, _cq_b)] = pair.cm.as_ref().expect("asked for");
    let (a, b) = (&pair.a.engine, &pair.b.engine);
    let failed = |e: portico::rdma::HostError| AppError::Failed(format!("bench connect: {e}"));
    b.listen(PORT).map_err(failed)?;
    let ad = RegionAd {
        flags: 0,
        rkey: 0x1234,
        addr: 0x1000,
        len: 4096,
    };
    let (qps_before, rss_before) = (live_qps([a, b]), rss_kib());
    let (created0, destroyed0) = cm_counts(&pair.runtime);
    let mut setup = Latency::new();
    let mut teardown = Latency::new();
    let t_run = Instant::now();
    let mut done = 0;
    let mut errors = 0;
    // B's host: accepts each request as it comes (on this thread, between A's calls).
    let accept = |ev: &ConnEvent| -> Result<bool, AppError> {
        let ConnEvent::Request(r) = ev else {
            return Ok(false);
        };
        // The queue pair's host end is dropped at once: this bench moves no data.
        b.accept(r.id, &ad.to_bytes()).map_err(failed)?;
        Ok(true)
    };
    let mut rss_half = 0;
    // The wait for time-wait halfway, not counted in the run's seconds.
    let mut paused = Duration::ZERO;
    for k in 0..connections {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if k == connections / 2 {
            let t = Instant::now();
            std::thread::sleep(TIME_WAIT);
            rss_half = rss_kib();
            paused += t.elapsed();
        }
        let t0 = Instant::now();
        let id = a.connect(loopback::IP_B, PORT, &[]).map_err(failed)?;
        // B: the request, accepted; then A established (REP came, RTU sent), then B
        // established (RTU came).
        let mut b_up = false;
        let mut a_up = false;
        while !(a_up && b_up) {
            if t0.elapsed() > WAIT {
                return Err(AppError::Failed(format!(
                    "bench connect: connection {done} not established in {WAIT:?}"
                )));
            }
            if let Some(ev) = ev_b.poll()
                && !accept(&ev)?
            {
                b_up |= matches!(ev, ConnEvent::Established { .. });
            }
            if let Some(ev) = ev_a.poll() {
                match ev {
                    ConnEvent::Established { id: got, .. } if got == id => a_up = true,
                    ConnEvent::Rejected { .. }
                    | ConnEvent::TimedOut { .. }
                    | ConnEvent::Unreachable { .. } => {
                        errors += 1;
                        a_up = true;
                        b_up = true;
                    }
                    _ => {}
                }
            }
        }
        setup.record(t0.elapsed().as_nanos() as u64);
        let t1 = Instant::now();
        a.disconnect(id).map_err(failed)?;
        wait_for(
            ev_a,
            |e| matches!(e, ConnEvent::Disconnected { id: d } if *d == id),
            "disconnect on A",
        )?;
        wait_for(
            ev_b,
            |e| matches!(e, ConnEvent::Disconnected { .. }),
            "disconnect on B",
        )?;
        teardown.record(t1.elapsed().as_nanos() as u64);
        done += 1;
    }
    let seconds = (t_run.elapsed() - paused).as_secs_f64();
    // Time-wait passes; then nothing of the connections may be left.
    std::thread::sleep(TIME_WAIT);
    let (qps_after, rss_after) = (live_qps([a, b]), rss_kib());
    let (created, destroyed) = cm_counts(&pair.runtime);
    let tcp = tcp_exchange(connections)?;
    pair.runtime
        .join()
        .map_err(|e| AppError::Failed(format!("the engines' workers: {e}")))?;
    let (cs, ts) = (setup.summary(), tcp.summary());
    Ok(ConnectSummary {
        connections: done,
        p50_ratio: cs.p50 as f64 / ts.p50.max(1) as f64,
        cm_setup_ns: cs,
        cm_teardown_ns: teardown.summary(),
        tcp_exchange_ns: ts,
        seconds,
        leaks: Leaks {
            qps_before,
            qps_after,
            cm_qps_created: created - created0,
            cm_qps_destroyed: destroyed - destroyed0,
            rss_kib_before: rss_before,
            rss_kib_half: rss_half,
            rss_kib_after: rss_after,
        },
        errors,
    })
}

/// The hello the TCP exchange's client sends: about the size of `bench --client`'s.
const HELLO: &str = r#"{"type":"hello","op":"write","size":64,"qd":64,"connections":1,"cc":"none","mac":"02:00:00:00:00:0a","ip":"10.9.0.1","qpn":17,"psn":1193046,"rkey":4660,"addr":4096,"len":1048576,"version":1}"#;

/// `n` TCP set-ups on loopback: connect, the hello line, the answer line.
fn tcp_exchange(n: u64) -> Result<Latency, AppError> {
    let io = |e: std::io::Error| AppError::Failed(format!("TCP exchange: {e}"));
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io)?;
    let addr = listener.local_addr().map_err(io)?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        for _ in 0..n {
            let (s, _) = listener.accept()?;
            let mut r = BufReader::new(s.try_clone()?);
            let mut line = String::new();
            r.read_line(&mut line)?;
            let mut w = s;
            w.write_all(HELLO.replace("hello", "answer").as_bytes())?;
            w.write_all(b"\n")?;
        }
        Ok(())
    });
    let mut lat = Latency::new();
    for _ in 0..n {
        let t0 = Instant::now();
        let mut s = TcpStream::connect(addr).map_err(io)?;
        s.set_nodelay(true).map_err(io)?;
        s.write_all(HELLO.as_bytes()).map_err(io)?;
        s.write_all(b"\n").map_err(io)?;
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).map_err(io)?;
        lat.record(t0.elapsed().as_nanos() as u64);
    }
    server
        .join()
        .map_err(|_| AppError::Failed("TCP exchange: the server thread panicked".into()))?
        .map_err(io)?;
    Ok(lat)
}

/// Prints the summary: JSON, or a few lines.
pub fn print(s: &ConnectSummary, json: bool) {
    if json {
        println!("{}", serde_json::to_string(s).unwrap_or_default());
        return;
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    println!(
        "bench connect: {} connections in {:.2} s, {} errors",
        s.connections, s.seconds, s.errors
    );
    for (what, l) in [
        (
            "CM set-up (REQ to established on both sides)",
            &s.cm_setup_ns,
        ),
        (
            "CM teardown (DREQ to both queue pairs gone)",
            &s.cm_teardown_ns,
        ),
        (
            "TCP exchange (connect + hello/answer, loopback)",
            &s.tcp_exchange_ns,
        ),
    ] {
        println!(
            "  {what:<50} p50 {:>8.1} µs  p99 {:>8.1} µs  max {:>8.1} µs",
            us(l.p50),
            us(l.p99),
            us(l.max)
        );
    }
    println!("  CM / TCP at p50: {:.2}", s.p50_ratio);
    let l = &s.leaks;
    println!(
        "  after: queue pairs {} (before {}), CM queue pairs created {} destroyed {}, RSS {} KiB (before {}, after the first half {})",
        l.qps_after,
        l.qps_before,
        l.cm_qps_created,
        l.cm_qps_destroyed,
        l.rss_kib_after,
        l.rss_kib_before,
        l.rss_kib_half
    );
}
