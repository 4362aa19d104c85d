//! What the `portico` command runs: EAL arguments from config and command line, ports and
//! workers set up from a [`Scenario`] (or from the probed ports for `fwd`), the monitor loop
//! with live stats, a drain so in-flight packets are counted, and the final summary.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::{ConfigError, HugepageMode, PortSource, Scenario, Task};
use crate::dataplane::{self, DpdkError, Eal, EalError, Mempool, Port, PortConfig, PortStats};
use crate::hugepages::HugepageStatus;
use crate::report;
use crate::runtime::{
    CaptureSink, CaptureTap, FaultInjector, Runtime, RuntimeError, StageBox, TxPolicy,
    WorkerReport, WorkerSpec,
};
use crate::traffic::frame::FrameSpec;
use crate::traffic::{Checker, Forward, FwdMode, Generator};

/// Why a command failed; [`AppError::exit_code`] maps it to the process status.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("bad config {path}: {source}")]
    Config { path: String, source: ConfigError },
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Eal(#[from] EalError),
    #[error(transparent)]
    Dpdk(#[from] DpdkError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("check failed: {0}")]
    CheckFailed(String),
    #[error("capture file {path}: {source}")]
    Capture {
        path: String,
        source: std::io::Error,
    },
}

impl AppError {
    /// 2 for what the user must fix in the config or arguments, 1 for failures at run time.
    pub fn exit_code(&self) -> i32 {
        match self {
            AppError::Config { .. } | AppError::Usage(_) => 2,
            _ => 1,
        }
    }
}

/// How the memory for EAL was chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum MemoryChoice {
    /// Hugepages (`free` pages of `page_kb` KiB were free at start).
    Hugepages { page_kb: u64, free: u64 },
    /// `--no-huge` with this many MiB (None: as the user passed it).
    NoHuge { mb: Option<u32> },
}

impl std::fmt::Display for MemoryChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemoryChoice::Hugepages { page_kb, free } => {
                write!(f, "hugepages ({free} free pages of {} MiB)", page_kb / 1024)
            }
            MemoryChoice::NoHuge { mb: Some(mb) } => {
                write!(f, "no hugepages (--no-huge, {mb} MiB)")
            }
            MemoryChoice::NoHuge { mb: None } => write!(f, "no hugepages (--no-huge, as given)"),
        }
    }
}

/// A device to hand to EAL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceArg {
    Vdev(String),
    Pci(String),
}

fn has_any(args: &[String], flags: &[&str]) -> bool {
    args.iter().any(|a| {
        flags.iter().any(|f| {
            a == f
                || (f.starts_with("--") && a.starts_with(&format!("{f}=")))
                || (!f.starts_with("--") && a.starts_with(f) && a.len() > f.len())
        })
    })
}

/// The EAL command line for a run: Portico's defaults, then the devices, then the user's own
/// arguments (which win where they overlap, as later EAL options do).
pub fn plan_eal_args(
    user: &[String],
    mode: HugepageMode,
    memory_mb: u32,
    main_core: usize,
    devices: &[DeviceArg],
    huge: &HugepageStatus,
) -> Result<(Vec<String>, MemoryChoice), AppError> {
    let mut args: Vec<String> = vec![
        "--log-level=lib.eal:error".into(),
        "--log-level=lib.telemetry:warning".into(),
    ];
    if !has_any(user, &["-l", "-c", "--lcores", "--main-lcore"]) {
        args.push("-l".into());
        args.push(main_core.to_string());
    }
    let memory = if has_any(user, &["--no-huge"]) {
        MemoryChoice::NoHuge { mb: None }
    } else {
        match mode {
            HugepageMode::On if !huge.usable() => {
                return Err(AppError::Usage(format!(
                    "eal.hugepages: \"on\" but no usable hugepages ({} free of {} KiB, hugetlbfs {}): run scripts/hugepages.sh",
                    huge.free,
                    huge.page_kb,
                    if huge.mounted {
                        "mounted"
                    } else {
                        "not mounted"
                    }
                )));
            }
            HugepageMode::On | HugepageMode::Auto if huge.usable() => MemoryChoice::Hugepages {
                page_kb: huge.page_kb,
                free: huge.free,
            },
            _ => {
                args.push("--no-huge".into());
                args.push("-m".into());
                args.push(memory_mb.to_string());
                MemoryChoice::NoHuge {
                    mb: Some(memory_mb),
                }
            }
        }
    };
    // No files under /var/run/dpdk, so that several Portico processes (and CI runs) never
    // collide: --in-memory on hugepages; under --no-huge (which EAL runs in legacy memory
    // mode, incompatible with --in-memory) --no-shconf does the same.
    if !has_any(
        user,
        &["--file-prefix", "--in-memory", "--proc-type", "--no-shconf"],
    ) {
        match memory {
            MemoryChoice::Hugepages { .. } => args.push("--in-memory".into()),
            MemoryChoice::NoHuge { .. } => args.push("--no-shconf".into()),
        }
    }
    let has_pci = devices.iter().any(|d| matches!(d, DeviceArg::Pci(_)));
    if !has_pci && !has_any(user, &["-a", "--allow", "-b", "--block", "--no-pci"]) {
        args.push("--no-pci".into());
    }
    for d in devices {
        match d {
            DeviceArg::Vdev(v) => {
                args.push("--vdev".into());
                args.push(v.clone());
            }
            DeviceArg::Pci(p) => {
                args.push("-a".into());
                args.push(p.clone());
            }
        }
    }
    args.extend(user.iter().cloned());
    Ok((args, memory))
}

/// Mbufs needed: every RX and TX descriptor filled, plus per-worker caches and bursts.
pub fn pool_size(ports: &[PortConfig], workers: usize) -> u32 {
    let desc: u32 = ports
        .iter()
        .map(|p| p.rx_queues as u32 * p.rx_desc as u32 + p.tx_queues as u32 * p.tx_desc as u32)
        .sum();
    let per_worker = POOL_CACHE + (dataplane::MAX_BURST as u32) * (ports.len() as u32 + 1);
    (desc + workers as u32 * per_worker + 4096).next_power_of_two() - 1
}

const POOL_CACHE: u32 = 256;

/// How a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Duration,
    Completed,
    Interrupted,
    WorkerFailed,
}

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

/// One port's line in the summary.
#[derive(Debug, Clone, Serialize)]
pub struct PortSummary {
    pub name: String,
    pub id: u16,
    pub driver: String,
    pub link: String,
    pub stats: PortStats,
}

/// The verdict of one checker.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CheckVerdict {
    pub worker: String,
    /// Frames the generators at the other end of the ring link sent, else the frames the
    /// config expects (None: neither is known; only integrity is checked).
    pub sent: Option<u64>,
    /// Valid frames that must arrive: `sent`, adjusted for injected faults.
    pub expected_valid: Option<u64>,
    pub valid: u64,
    pub invalid: u64,
    pub seq_gaps: u64,
    pub late: u64,
    pub passed: bool,
}

/// Everything a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub command: String,
    pub stop_reason: StopReason,
    pub seconds: f64,
    pub memory: MemoryChoice,
    pub eal_args: Vec<String>,
    pub workers: Vec<WorkerReport>,
    pub ports: Vec<PortSummary>,
    pub checks: Vec<CheckVerdict>,
    /// The pcapng file written with `--pcap`, and how many packets it holds.
    pub capture: Option<CaptureSummary>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CaptureSummary {
    pub path: String,
    pub packets: u64,
}

/// Opens the capture file for `ports` when `--pcap` was given.
fn open_capture(opts: &RunOpts, ports: &[Port]) -> Result<Option<Arc<CaptureSink>>, AppError> {
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
fn close_capture(
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

impl Summary {
    pub fn total_rx_packets(&self) -> u64 {
        self.workers.iter().map(|w| w.rx_packets).sum()
    }
    pub fn total_tx_packets(&self) -> u64 {
        self.workers.iter().map(|w| w.tx_packets).sum()
    }
    /// Forwarded (transmitted) packets per second over the run.
    pub fn tx_pps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.total_tx_packets() as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// The cores this process may run on: the calling thread's affinity set, so call it before
/// EAL starts (EAL pins the thread that starts it to the main lcore).
pub fn available_cores() -> Vec<usize> {
    let mut ids: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    ids.sort_unstable();
    ids
}

fn main_core_for(workers: &[usize], cores: &[usize]) -> usize {
    cores
        .iter()
        .copied()
        .find(|c| !workers.contains(c))
        .or_else(|| cores.first().copied())
        .unwrap_or(0)
}

struct Started {
    memory: MemoryChoice,
    args: Vec<String>,
}

fn start_eal(args: Vec<String>, memory: MemoryChoice, json: bool) -> Result<Started, AppError> {
    let info = Eal::init(&args)?;
    report::banner(info, &memory, json);
    Ok(Started { memory, args })
}

/// Runs a scenario from a config file.
pub fn run_scenario(
    scenario: &Scenario,
    extra_eal: &[String],
    opts: &RunOpts,
    interrupted: Arc<AtomicBool>,
) -> Result<Summary, AppError> {
    let cores = available_cores();
    let worker_cores: Vec<usize> = scenario.workers.iter().map(|w| w.core).collect();
    let devices: Vec<DeviceArg> = scenario
        .sources
        .iter()
        .filter_map(|s| match s {
            PortSource::Vdev(v) => Some(DeviceArg::Vdev(v.clone())),
            PortSource::Pci(p) => Some(DeviceArg::Pci(p.clone())),
            PortSource::Ring { .. } => None,
        })
        .collect();
    let mut user = scenario.eal.args.clone();
    user.extend(extra_eal.iter().cloned());
    let (args, memory) = plan_eal_args(
        &user,
        scenario.eal.hugepages,
        scenario.eal.memory_mb,
        main_core_for(&worker_cores, &cores),
        &devices,
        &HugepageStatus::read(),
    )?;
    let started = start_eal(args, memory, opts.json)?;

    // Resolve port ids: ring links are created here, vdevs and PCI devices were probed by EAL.
    let mut ids: Vec<Option<u16>> = vec![None; scenario.ports.len()];
    let mut links: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, src) in scenario.sources.iter().enumerate() {
        match src {
            PortSource::Ring { link } => links.entry(link).or_default().push(i),
            PortSource::Vdev(v) => {
                let (dev, _) = crate::config::vdev_driver(v);
                ids[i] = Some(dataplane::port_by_name(dev).ok_or_else(|| {
                    AppError::Usage(format!("ports[{i}].vdev: EAL probed no port named {dev}"))
                })?);
            }
            PortSource::Pci(p) => {
                ids[i] = Some(dataplane::port_by_name(p).ok_or_else(|| {
                    AppError::Usage(format!(
                        "ports[{i}].pci: no DPDK port at {p} (is it bound to vfio-pci or uio?)"
                    ))
                })?);
            }
        }
    }
    for members in links.values() {
        let (a, b) = (members[0], members[1]);
        let ring_size = (scenario.ports[a].tx_desc.max(scenario.ports[b].tx_desc) as u32 * 2)
            .next_power_of_two();
        let (pa, pb) =
            dataplane::ring_pair(&scenario.ports[a].name, &scenario.ports[b].name, ring_size)?;
        ids[a] = Some(pa);
        ids[b] = Some(pb);
    }

    let port_cfgs: Vec<PortConfig> = scenario
        .ports
        .iter()
        .map(|p| PortConfig {
            rx_queues: p.rx_queues,
            tx_queues: p.tx_queues,
            rx_desc: p.rx_desc,
            tx_desc: p.tx_desc,
            promiscuous: true,
        })
        .collect();
    let pool = Arc::new(Mempool::new(
        "portico_pool",
        pool_size(&port_cfgs, scenario.workers.len()),
        POOL_CACHE,
        dpdk_sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16,
        -1,
    )?);
    let mut ports = Vec::new();
    for (i, cfg) in port_cfgs.iter().enumerate() {
        let id = ids[i].expect("every port resolved above");
        let port = Port::start(id, cfg, pool.clone())?.named(&scenario.ports[i].name);
        ports.push(port);
    }
    let names: Vec<String> = scenario.ports.iter().map(|p| p.name.clone()).collect();
    let capture = open_capture(opts, &ports)?;

    let take_rx = |q: crate::config::QueueRef| {
        ports[q.port].rx_queue(q.queue).ok_or_else(|| {
            AppError::Usage(format!(
                "RX queue {}:{} is not available",
                names[q.port], q.queue
            ))
        })
    };
    let take_tx = |q: crate::config::QueueRef| {
        ports[q.port].tx_queue(q.queue).ok_or_else(|| {
            AppError::Usage(format!(
                "TX queue {}:{} is not available",
                names[q.port], q.queue
            ))
        })
    };
    let burst = scenario.run.burst;
    let mut specs = Vec::new();
    for w in &scenario.workers {
        let (rx, tx, stage): (_, _, StageBox) = match &w.task {
            Task::Generate {
                tx,
                frame_size,
                rate_pps,
                count,
            } => {
                let spec = FrameSpec {
                    frame_size: *frame_size,
                    ..FrameSpec::default()
                };
                let gen_ = Generator::new(pool.clone(), &spec, *rate_pps, *count, burst, 0);
                (
                    vec![],
                    vec![(take_tx(*tx)?, TxPolicy::KeepUnsent)],
                    StageBox::new(gen_),
                )
            }
            Task::Check { rx, expect } => (
                vec![take_rx(*rx)?],
                vec![],
                StageBox::new(Checker::new(*expect)),
            ),
            Task::Forward { mode, paths } => {
                let mut rx = Vec::new();
                let mut outs: Vec<crate::config::QueueRef> = Vec::new();
                let mut map = Vec::new();
                for (r, t) in paths {
                    rx.push(take_rx(*r)?);
                    let o = match outs.iter().position(|x| x == t) {
                        Some(o) => o,
                        None => {
                            outs.push(*t);
                            outs.len() - 1
                        }
                    };
                    map.push(o);
                }
                let tx = outs
                    .iter()
                    .map(|t| Ok((take_tx(*t)?, TxPolicy::DropUnsent)))
                    .collect::<Result<Vec<_>, AppError>>()?;
                (rx, tx, StageBox::new(Forward::new(*mode, map)))
            }
        };
        specs.push(WorkerSpec {
            name: w.name.clone(),
            core: Some(w.core),
            rx,
            tx,
            burst,
            stage,
            faults: w.faults.map(|f| FaultInjector::new(&f, pool.clone())),
            capture: capture.as_ref().map(|s| CaptureTap::new(s.clone())),
        });
    }
    report::plan(&scenario.workers, &names, opts.json);

    let mut summary = execute(specs, &ports, started, "run", true, opts, interrupted)?;
    close_capture(capture, opts, &mut summary)?;
    summary.checks = verdicts(scenario, &summary.workers);
    if let Some(bad) = summary.checks.iter().find(|c| !c.passed) {
        report::summary(&summary, opts.json);
        return Err(AppError::CheckFailed(format!(
            "worker {}: sent {}, valid {}, invalid {}, sequence gaps {}, late {}",
            bad.worker,
            bad.sent
                .map(|s| s.to_string())
                .unwrap_or_else(|| "?".into()),
            bad.valid,
            bad.invalid,
            bad.seq_gaps,
            bad.late
        )));
    }
    Ok(summary)
}

/// Pairs each checker with the generators at the other end of its ring link.
fn verdicts(s: &Scenario, reports: &[WorkerReport]) -> Vec<CheckVerdict> {
    let peer_of = |port: usize| -> Option<usize> {
        let PortSource::Ring { link } = &s.sources[port] else {
            return None;
        };
        (0..s.sources.len()).find(|&p| {
            p != port && matches!(&s.sources[p], PortSource::Ring { link: l } if l == link)
        })
    };
    s.workers
        .iter()
        .zip(reports)
        .filter_map(|(w, r)| {
            let Task::Check { rx, .. } = w.task else {
                return None;
            };
            let sent = peer_of(rx.port).and_then(|peer| {
                let gens: Vec<u64> = s
                    .workers
                    .iter()
                    .zip(reports)
                    .filter(|(g, _)| matches!(g.task, Task::Generate { tx, .. } if tx.port == peer))
                    .filter_map(|(_, gr)| gr.counter("generated"))
                    .collect();
                (!gens.is_empty()).then(|| gens.iter().sum())
            });
            let valid = r.counter("valid").unwrap_or(0);
            let invalid = r.counter("invalid").unwrap_or(0);
            let seq_gaps = r.counter("seq_gaps").unwrap_or(0);
            let late = r.counter("late").unwrap_or(0);
            // What the generators on the other end sent, else what the config expects.
            let expected = sent.or(match w.task {
                Task::Check { expect, .. } => expect,
                _ => None,
            });
            // Injected faults change what must arrive, exactly: each drop or corruption
            // removes one valid frame, each duplicate adds one, each corruption is one invalid
            // frame; drops and reorders show up as gaps and late frames.
            let f = r.faults;
            let faulty = w.faults.is_some();
            let expected_valid =
                expected.map(|s| (s + f.duplicated).saturating_sub(f.dropped + f.corrupted));
            Some(CheckVerdict {
                worker: r.worker.clone(),
                sent: expected,
                expected_valid,
                valid,
                invalid,
                seq_gaps,
                late,
                passed: invalid == f.corrupted
                    && (faulty || (seq_gaps == 0 && late == 0))
                    && expected_valid.is_none_or(|e| e == valid),
            })
        })
        .collect()
}

/// Options of `portico fwd`.
#[derive(Debug, Clone)]
pub struct FwdOpts {
    pub mode: FwdMode,
    pub cores: Vec<usize>,
    pub burst: usize,
    pub queues: u16,
    pub rxd: u16,
    pub txd: u16,
    pub hugepages: HugepageMode,
    pub memory_mb: u32,
    pub eal: Vec<String>,
    pub run: RunOpts,
}

/// Raw forwarding between the probed ports, paired 0↔1, 2↔3, ... (an odd last port
/// forwards to itself), like testpmd's default paired topology.
pub fn run_fwd(opts: &FwdOpts, interrupted: Arc<AtomicBool>) -> Result<Summary, AppError> {
    let cores = available_cores();
    if opts.cores.is_empty() {
        return Err(AppError::Usage("--cores: give at least one core".into()));
    }
    for (i, c) in opts.cores.iter().enumerate() {
        if !cores.contains(c) {
            return Err(AppError::Usage(format!(
                "--cores: core {c} does not exist (cores available: {cores:?})"
            )));
        }
        if opts.cores[..i].contains(c) {
            return Err(AppError::Usage(format!("--cores: core {c} is given twice")));
        }
    }
    if opts.burst == 0 || opts.burst > dataplane::MAX_BURST {
        return Err(AppError::Usage(format!(
            "--burst: must be 1..={}",
            dataplane::MAX_BURST
        )));
    }
    if opts.queues == 0 {
        return Err(AppError::Usage("--queues: must be at least 1".into()));
    }
    let (args, memory) = plan_eal_args(
        &opts.eal,
        opts.hugepages,
        opts.memory_mb,
        main_core_for(&opts.cores, &cores),
        &[],
        &HugepageStatus::read(),
    )?;
    let started = start_eal(args, memory, opts.run.json)?;
    let ids = dataplane::port_ids();
    if ids.is_empty() {
        return Err(AppError::Usage(
            "no ports: pass devices after --, e.g. `portico fwd -- --vdev net_null0 --vdev net_null1`".into(),
        ));
    }
    let ncores = opts.cores.len() as u16;
    let cfg = PortConfig {
        rx_queues: opts.queues,
        tx_queues: ncores,
        rx_desc: opts.rxd,
        tx_desc: opts.txd,
        promiscuous: true,
    };
    let cfgs = vec![cfg.clone(); ids.len()];
    let pool = Arc::new(Mempool::new(
        "portico_fwd_pool",
        pool_size(&cfgs, opts.cores.len()),
        POOL_CACHE,
        dpdk_sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16,
        -1,
    )?);
    let ports: Vec<Port> = ids
        .iter()
        .map(|&id| Port::start(id, &cfg, pool.clone()))
        .collect::<Result<_, _>>()?;
    let capture = open_capture(&opts.run, &ports)?;
    let peer = |i: usize| {
        if i.is_multiple_of(2) {
            (i + 1).min(ports.len() - 1)
        } else {
            i - 1
        }
    };

    // Streams (port, rx queue) are dealt round-robin to the cores; each core has its own TX
    // queue on every port, so no two cores share a queue.
    let mut per_core: Vec<Vec<(usize, u16)>> = vec![Vec::new(); opts.cores.len()];
    let mut k = 0;
    for q in 0..opts.queues {
        for p in 0..ports.len() {
            per_core[k % opts.cores.len()].push((p, q));
            k += 1;
        }
    }
    let mut specs = Vec::new();
    for (w, streams) in per_core.into_iter().enumerate() {
        if streams.is_empty() {
            continue;
        }
        let mut rx = Vec::new();
        let mut out_ports: Vec<usize> = Vec::new();
        let mut map = Vec::new();
        for (p, q) in streams {
            rx.push(ports[p].rx_queue(q).expect("each RX queue is dealt once"));
            let dst = peer(p);
            let o = match out_ports.iter().position(|&x| x == dst) {
                Some(o) => o,
                None => {
                    out_ports.push(dst);
                    out_ports.len() - 1
                }
            };
            map.push(o);
        }
        let tx = out_ports
            .iter()
            .map(|&p| {
                (
                    ports[p].tx_queue(w as u16).expect("one TX queue per core"),
                    TxPolicy::DropUnsent,
                )
            })
            .collect();
        specs.push(WorkerSpec {
            name: format!("fwd{w}"),
            core: Some(opts.cores[w]),
            rx,
            tx,
            burst: opts.burst,
            stage: StageBox::new(Forward::new(opts.mode, map)),
            faults: None,
            capture: capture.as_ref().map(|s| CaptureTap::new(s.clone())),
        });
    }
    let mut summary = execute(specs, &ports, started, "fwd", false, &opts.run, interrupted)?;
    close_capture(capture, &opts.run, &mut summary)?;
    Ok(summary)
}

/// Starts the workers, prints live stats until a stop condition, drains (when `drain`: for
/// generated traffic, whose sources stop, unlike a forwarding source that never goes quiet),
/// joins and reads the port counters. `seconds` in the summary runs until the workers stopped,
/// so that rates divide counts by the time that produced them.
fn execute(
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
                .map(|r| r.rx_packets + r.tx_packets)
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
        .map(|p| {
            let info = p.info()?;
            Ok(PortSummary {
                name: p.name().to_string(),
                id: p.id(),
                driver: info.driver,
                link: info.link.to_string(),
                stats: p.stats()?,
            })
        })
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

/// Starts EAL with `eal` and describes every probed port.
pub fn list_ports(eal: &[String], json: bool) -> Result<Vec<dataplane::PortInfo>, AppError> {
    let cores = available_cores();
    let (args, memory) = plan_eal_args(
        eal,
        HugepageMode::Auto,
        256,
        main_core_for(&[], &cores),
        &[],
        &HugepageStatus::read(),
    )?;
    start_eal(args, memory, json)?;
    dataplane::port_ids()
        .into_iter()
        .map(|id| dataplane::PortInfo::read(id).map_err(AppError::from))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn huge(free: u64, mounted: bool) -> HugepageStatus {
        HugepageStatus {
            page_kb: 2048,
            total: free,
            free,
            mounted,
        }
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn defaults_without_hugepages() {
        let (args, mem) = plan_eal_args(
            &[],
            HugepageMode::Auto,
            512,
            0,
            &[DeviceArg::Vdev("net_null0".into())],
            &huge(0, false),
        )
        .unwrap();
        assert_eq!(
            args,
            s(&[
                "--log-level=lib.eal:error",
                "--log-level=lib.telemetry:warning",
                "-l",
                "0",
                "--no-huge",
                "-m",
                "512",
                "--no-shconf",
                "--no-pci",
                "--vdev",
                "net_null0"
            ])
        );
        assert_eq!(mem, MemoryChoice::NoHuge { mb: Some(512) });
    }

    #[test]
    fn hugepages_used_when_free_and_mounted() {
        let (args, mem) =
            plan_eal_args(&[], HugepageMode::Auto, 512, 1, &[], &huge(512, true)).unwrap();
        assert!(!args.contains(&"--no-huge".to_string()));
        assert!(args.contains(&"--in-memory".to_string()));
        assert_eq!(
            mem,
            MemoryChoice::Hugepages {
                page_kb: 2048,
                free: 512
            }
        );
        let (args, _) =
            plan_eal_args(&[], HugepageMode::Off, 256, 1, &[], &huge(512, true)).unwrap();
        assert!(args.contains(&"--no-huge".to_string()));
        let e = plan_eal_args(&[], HugepageMode::On, 256, 1, &[], &huge(0, true)).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().starts_with("eal.hugepages:"), "{e}");
    }

    #[test]
    fn user_arguments_replace_defaults() {
        let user = s(&[
            "-l",
            "0-1",
            "--file-prefix=x",
            "--no-huge",
            "-a",
            "0000:01:00.0",
        ]);
        let (args, mem) =
            plan_eal_args(&user, HugepageMode::Auto, 512, 0, &[], &huge(512, true)).unwrap();
        assert_eq!(
            args,
            [
                s(&[
                    "--log-level=lib.eal:error",
                    "--log-level=lib.telemetry:warning"
                ]),
                user
            ]
            .concat()
        );
        assert_eq!(mem, MemoryChoice::NoHuge { mb: None });
    }

    #[test]
    fn pci_devices_are_allowed_not_blocked() {
        let (args, _) = plan_eal_args(
            &[],
            HugepageMode::Auto,
            512,
            0,
            &[DeviceArg::Pci("0000:3b:00.0".into())],
            &huge(512, true),
        )
        .unwrap();
        assert!(!args.contains(&"--no-pci".to_string()));
        assert!(args.windows(2).any(|w| w == ["-a", "0000:3b:00.0"]));
    }

    #[test]
    fn pool_covers_descriptors() {
        let p = PortConfig::default();
        let n = pool_size(&[p.clone(), p], 2);
        assert!(n >= 4 * 1024 + 2 * 256);
        assert_eq!(
            (n + 1).count_ones(),
            1,
            "2^k - 1 is the optimal mempool size"
        );
    }
}
