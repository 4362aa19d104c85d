//! The loop every run shares: start the workers, print live stats once per period, and stop on
//! the duration, on Ctrl-C or SIGTERM, when the finite work is done, or when a worker fails;
//! then drain, join, and collect the [`Summary`]. Also the `--pcap` capture file around it.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::dataplane::{DpdkError, Port, PortInfo, PortStats, port_xstats};
use crate::report;
use crate::runtime::{CaptureSink, Runtime, WorkerSpec};
use crate::summary::{CaptureSummary, PortSummary, StopReason, Summary, is_drop_xstat};

use super::AppError;
use super::eal::Started;

/// Options common to every command that runs workers.
#[derive(Debug, Clone)]
pub struct RunOpts {
    /// None: until the finite work is done or interrupted.
    pub duration: Option<Duration>,
    pub stats_period: Option<Duration>,
    pub json: bool,
    /// Capture every packet sent and received into this pcapng file.
    pub pcap: Option<PathBuf>,
}

impl RunOpts {
    /// A run bounded by `duration` with no live stats, its human text on stderr (for
    /// programs and tests that read the summary).
    pub fn quiet(duration: Duration) -> Self {
        RunOpts {
            duration: Some(duration),
            stats_period: None,
            json: true,
            pcap: None,
        }
    }
}

/// Starts the workers, prints live stats until a stop condition, drains (when `drain`: for
/// generated traffic, whose sources stop, unlike a forwarding source that never goes quiet),
/// joins and reads the port counters. `seconds` in the summary runs until the workers stopped,
/// so that rates divide counts by the time that produced them.
pub(super) fn execute(
    specs: Vec<WorkerSpec>,
    ports: &[Port],
    started: Started,
    command: &str,
    drain: bool,
    opts: &RunOpts,
    interrupted: Arc<AtomicBool>,
) -> Result<Summary, AppError> {
    let rt = Runtime::start(specs)?;
    let t0 = Instant::now();
    let mut last = (t0, rt.reports());
    let tick = Duration::from_millis(5);
    let reason = loop {
        std::thread::sleep(tick);
        if rt.has_failed() {
            break StopReason::WorkerFailed;
        }
        if interrupted.load(Ordering::Relaxed) {
            break StopReason::Interrupted;
        }
        if rt.finite_work_done() {
            break StopReason::Completed;
        }
        if opts.duration.is_some_and(|d| t0.elapsed() >= d) {
            break StopReason::Duration;
        }
        if let Some(p) = opts.stats_period
            && last.0.elapsed() >= p
        {
            let now = (Instant::now(), rt.reports());
            report::interval(t0, &last, &now, opts.json);
            last = now;
        }
    };
    if drain && reason != StopReason::WorkerFailed {
        // Let what is in flight arrive: stop generating, wait until RX is quiet.
        rt.drain();
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut prev = u64::MAX;
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            let moved: u64 = rt
                .reports()
                .iter()
                .map(|r| r.io.rx_packets + r.io.tx_packets)
                .sum();
            if moved == prev {
                break;
            }
            prev = moved;
        }
    }
    let workers = rt.join()?;
    let seconds = t0.elapsed().as_secs_f64();
    let ports = ports
        .iter()
        .map(|p| port_summary(p.id(), p.name()))
        .collect::<Result<Vec<_>, DpdkError>>()?;
    Ok(Summary {
        command: command.to_string(),
        stop_reason: reason,
        seconds,
        memory: started.memory,
        eal_args: started.args,
        workers,
        ports,
        checks: Vec::new(),
        capture: None,
    })
}

/// What port `id` (shown as `name`) counted: its basic stats, link, and the extended stats
/// that count drops, misses and errors. Read it while the port is still started.
pub fn port_summary(id: u16, name: &str) -> Result<PortSummary, DpdkError> {
    let info = PortInfo::read(id)?;
    let drop_xstats = port_xstats(id)?
        .into_iter()
        .filter(|(k, _)| is_drop_xstat(k))
        .collect();
    Ok(PortSummary {
        name: name.to_string(),
        id,
        driver: info.driver,
        link: info.link.to_string(),
        stats: PortStats::read(id)?,
        drop_xstats,
    })
}

/// Opens the capture file for `ports` when `--pcap` was given.
pub(super) fn open_capture(
    opts: &RunOpts,
    ports: &[Port],
) -> Result<Option<Arc<CaptureSink>>, AppError> {
    let Some(path) = &opts.pcap else {
        return Ok(None);
    };
    let names: Vec<(u16, String)> = ports
        .iter()
        .map(|p| (p.id(), p.name().to_string()))
        .collect();
    CaptureSink::create(path, &names)
        .map(|s| Some(Arc::new(s)))
        .map_err(|source| AppError::Capture {
            path: path.display().to_string(),
            source,
        })
}

/// Flushes the capture file and records it in the summary.
pub(super) fn close_capture(
    sink: Option<Arc<CaptureSink>>,
    opts: &RunOpts,
    summary: &mut Summary,
) -> Result<(), AppError> {
    if let (Some(sink), Some(path)) = (sink, &opts.pcap) {
        let packets = sink.finish().map_err(|source| AppError::Capture {
            path: path.display().to_string(),
            source,
        })?;
        summary.capture = Some(CaptureSummary {
            path: path.display().to_string(),
            packets,
        });
    }
    Ok(())
}
