//! `portico fwd`: raw forwarding between the probed ports, like testpmd's `io` and `macswap`
//! modes on its default paired topology.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::config::{DESC_RANGE, HugepageMode, MAX_QUEUES, MemoryLimit, limits};
use crate::dataplane::{self, Mempool, Port, PortConfig};
use crate::hugepages::HugepageStatus;
use crate::runtime::{Polling, StageBox, TxPolicy, WorkerCapture, WorkerSpec, polling};
use crate::summary::Summary;
use crate::traffic::{Forward, FwdMode};

use super::AppError;
use super::eal::{available_cores, main_core_for, plan_eal_args, start_eal};
use super::monitor::{RunOpts, close_capture, execute, open_capture};
use super::ports::{POOL_CACHE, check_pool_fits, pool_layout, pool_size};

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
    if !(1..=MAX_QUEUES).contains(&opts.queues) {
        return Err(AppError::Usage(format!(
            "--queues: must be 1..={MAX_QUEUES}"
        )));
    }
    if opts.cores.len() > MAX_QUEUES as usize {
        return Err(AppError::Usage(format!(
            "--cores: at most {MAX_QUEUES} (each core has a TX queue on every port)"
        )));
    }
    for (field, v) in [("--rxd", opts.rxd), ("--txd", opts.txd)] {
        if !DESC_RANGE.contains(&v) {
            return Err(AppError::Usage(format!(
                "{field}: must be {}..={} descriptors",
                DESC_RANGE.start(),
                DESC_RANGE.end()
            )));
        }
    }
    limits::check_memory_mb("--memory-mb", opts.memory_mb, MemoryLimit::read().as_ref())
        .map_err(|e| AppError::Usage(e.to_string()))?;
    let (args, memory) = plan_eal_args(
        &opts.eal,
        opts.hugepages,
        opts.memory_mb,
        main_core_for(&opts.cores, &cores),
        &[],
        &HugepageStatus::read(),
    )?;
    let polling = polling::effective(Polling::Busy);
    let started = start_eal(args, memory, Some(polling), opts.run.json)?;
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
        mac: None,
        reconnect: None,
    };
    let cfgs = vec![cfg.clone(); ids.len()];
    // The ports are known only now that EAL has probed them; the pool is not allocated yet.
    let mbufs = pool_size(&cfgs, opts.cores.len());
    check_pool_fits(
        &started.memory,
        mbufs,
        dpdk_sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16,
        ("--memory-mb", "--hugepages"),
        "--queues/--rxd/--txd",
    )?;
    let layout = pool_layout(&ids)?;
    let pool = Arc::new(Mempool::with_layout(
        "portico_fwd_pool",
        mbufs,
        POOL_CACHE,
        dpdk_sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16,
        -1,
        layout,
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
            capture: capture.as_ref().map(|s| WorkerCapture::new(s.clone())),
            polling,
        });
    }
    let mut summary = execute(specs, &ports, started, "fwd", false, &opts.run, interrupted)?;
    close_capture(capture, &opts.run, &mut summary)?;
    Ok(summary)
}
