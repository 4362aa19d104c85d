//! `portico target` and `portico initiator`: one RoCEv2 engine per process, on a real port
//! (`net_memif` between two processes, a `net_tap`, or a NIC), configured from TOML
//! (`config::peer`).
//!
//! Each side's region is the process's own memory: a file it maps (`rdma.region_file` or
//! `--region-file`, created at `rdma.region_len` bytes when missing) or anonymous memory. The
//! target registers it for remote access and prints a `ready` JSON line with its address (the
//! real address of the bytes, unless `rdma.region_addr` names it otherwise), length, rkey and
//! what the memory is (DAX or not); then it serves until its duration ends or it is signalled,
//! and, for a file, makes the region durable (`persist`) before it exits. The target's region
//! allows FLUSH of both placement types (and with `rdma.durable_region` withholds WRITE ACKs
//! until the data is durable); with `rdma.simulate_power_loss` its file is mapped under pmem's
//! power-loss simulator. The initiator waits for its link, writes `ops` messages from its own
//! mapping into the target's region, READs each back into the other half of its mapping and
//! compares the bytes there. It exits with status 1 if any operation failed or any byte
//! differs. With `--durable` it streams durable WRITEs of [`durable_record`]s instead and prints
//! a line for each as soon as the target has made it durable.
//!
//! Every size is checked before EAL starts (an anonymous region against the memory this
//! process can map, a file to create against its file system's free space, EAL's memory
//! against the mbuf pool), so a bad one ends with one line naming its field and exit status 2.
//! Both summaries carry every counter the engine's worker keeps, by name, and the port's own
//! counters (misses, errors, mbuf allocation failures, drop xstats), so that a frame dropped
//! before the engine saw it is accounted for too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pmem::{MapOptions, Mapping};
use serde_json::json;

use crate::app::{
    AppError, DeviceArg, MemoryChoice, PortSummary, available_cores, check_pool_fits,
    plan_eal_args, port_summary,
};
use crate::config::peer::{
    CoresKey, PeerConfig, RECEIVE_LEN, load_peer, parse_mac, parse_mtu, worker_cores,
};
use crate::config::{ConfigError, MemoryLimit, limits, vdev_driver};
use crate::dataplane::{self, Eal, Mempool, Port, PortConfig};
use crate::hugepages::HugepageStatus;
use crate::latency::Latency;
use crate::rdma::cm::{CmEvents, CmSetup, ConnEvent, RegionAd};
use crate::rdma::{Cq, MemoryRegion, Qp, RdmaCounters, RdmaHandle, RdmaNode, RdmaStage};
use crate::report;
use crate::runtime::{
    CaptureSink, Polling, Runtime, StageBox, TxPolicy, WorkerCapture, WorkerSpec, polling,
};
use crate::telemetry::{self, LatencySlot, LatencySource, QpHome};
use crate::transport::{
    Access, QpConfig, RecvRequest, WcOpcode, WcStatus, WorkCompletion, WorkRequest, random_psn,
};
use crate::wire::rss;

/// Mbufs in the engine's pool.
const POOL_MBUFS: u32 = 8191;

/// A running engine on one port (on one worker or several), and the application's ends of it.
pub struct Peer {
    pub runtime: Runtime,
    pub handle: RdmaHandle,
    /// Queue pair 0 and its completion queue; the initiator's only one.
    pub qp: Qp,
    pub cq: Cq,
    /// Queue pairs 1.. of a target on several workers, with their completion queues.
    pub more: Vec<(Qp, Cq)>,
    /// Per queue pair: its QPN, the peer's, its home worker and its UDP source port.
    qps: Vec<QpPlace>,
    /// The workers' cores.
    pub workers: Vec<usize>,
    pub port: Port,
    pub capture: Option<Arc<CaptureSink>>,
    /// The first PSN this side sends.
    pub psn: u32,
    /// The application's end of tagged messaging, when [`Extras::tags`] asked for it:
    /// worker 0's port (the endpoints homed there).
    pub tags: Option<crate::rdma::TagPort>,
    /// The other workers' ports, worker 1 first: endpoint *e* is homed on worker *e* mod
    /// the workers, and its messages must come on that worker's queue pair.
    pub more_tags: Vec<crate::rdma::TagPort>,
    /// The connection manager's events and the completion queue of the queue pairs it
    /// creates, when [`Extras::cm`] asked for it (on worker 0).
    pub cm: Option<(CmEvents, Cq)>,
}

/// Flushes the capture, if any: how many packets it holds.
pub fn finish_capture(
    c: &Option<Arc<CaptureSink>>,
    pcap: Option<&Path>,
) -> Result<Option<u64>, AppError> {
    match (c, pcap) {
        (Some(sink), Some(path)) => sink.finish().map(Some).map_err(|source| AppError::Capture {
            path: path.display().to_string(),
            source,
        }),
        _ => Ok(None),
    }
}

/// Where a queue pair of this engine lives, for the `ready` line.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct QpPlace {
    qpn: u32,
    peer_qpn: u32,
    /// Its home worker, which is also its RX/TX queue on the port.
    queue: usize,
    core: usize,
    /// The peer's queue its packets are steered to (by their UDP source port).
    peer_queue: u16,
    udp_src_port: u16,
}

fn load(path: &Path) -> Result<PeerConfig, AppError> {
    load_peer(path, &available_cores()).map_err(|source| AppError::Config {
        path: path.display().to_string(),
        source,
    })
}

fn bad(path: &Path, field: &str, message: String) -> AppError {
    AppError::Config {
        path: path.display().to_string(),
        source: ConfigError {
            field: field.into(),
            message,
        },
    }
}

/// This side's region file, if any, and the field that names it: `--region-file` over
/// `rdma.region_file`.
fn choose_region_file(cli: Option<PathBuf>, cfg: &PeerConfig) -> Option<(PathBuf, &'static str)> {
    cli.map(|f| (f, "--region-file"))
        .or_else(|| Some((cfg.rdma.region_file.clone()?, "rdma.region_file")))
}

/// A config error from the config file, a usage error from the command line.
fn field_error(cfg_path: &Path, e: ConfigError) -> AppError {
    if e.field.starts_with("--") {
        AppError::Usage(e.to_string())
    } else {
        AppError::Config {
            path: cfg_path.display().to_string(),
            source: e,
        }
    }
}

/// Before anything is mapped: anonymous memory must fit what this process can map, and a file
/// to create must fit its file system (an existing one is checked for its length when opened).
fn check_region(
    cfg_path: &Path,
    cfg: &PeerConfig,
    file: Option<(&Path, &str)>,
) -> Result<(), AppError> {
    let len = cfg.rdma.region_len as u64;
    match file {
        None => limits::check_memory(
            "rdma.region_len",
            "an anonymous region",
            len,
            MemoryLimit::read().as_ref(),
        ),
        Some((f, field)) if !f.exists() => limits::check_file_room(field, f, len),
        Some(_) => Ok(()),
    }
    .map_err(|e| field_error(cfg_path, e))
}

/// Maps this side's region: the file (opened when it exists and is large enough, created
/// otherwise), under the power-loss simulator when `simulate`, or anonymous memory.
fn map_region(
    cfg_path: &Path,
    cfg: &PeerConfig,
    file: Option<&Path>,
    simulate: bool,
) -> Result<Arc<Mapping>, AppError> {
    let len = cfg.rdma.region_len;
    let opts = MapOptions::new().simulate_power_loss(simulate);
    let map = match file {
        Some(f) if f.exists() => {
            let m = opts
                .open_file(f)
                .map_err(|e| AppError::Failed(format!("region file {}: {e}", f.display())))?;
            if m.len() < len {
                return Err(bad(
                    cfg_path,
                    "rdma.region_file",
                    format!(
                        "{} holds {} bytes, fewer than rdma.region_len {len}",
                        f.display(),
                        m.len()
                    ),
                ));
            }
            m
        }
        Some(f) => opts
            .create_file(f, len)
            .map_err(|e| AppError::Failed(format!("region file {}: {e}", f.display())))?,
        None => Mapping::anonymous(len)
            .map_err(|e| AppError::Failed(format!("mapping {len} bytes for the region: {e}")))?,
    };
    Ok(Arc::new(map))
}

/// Whether `rdma.port` names a PCI device rather than a vdev.
fn is_pci(port: &str) -> bool {
    port.contains(':') && !port.starts_with("net_")
}

/// EAL's command line and memory for this config, and whether that memory holds the engine's
/// mbuf pool: all known before EAL starts.
pub fn plan(
    cfg: &PeerConfig,
    workers: &[usize],
    extra_eal: &[String],
) -> Result<(Vec<String>, MemoryChoice), AppError> {
    let r = &cfg.rdma;
    let device = if is_pci(&r.port) {
        DeviceArg::Pci(r.port.clone())
    } else {
        // A memif port gets a buffer size that holds every frame (`bench --dev` comes here
        // without the config's check).
        let port = crate::config::peer::memif_port(&r.port, r.mtu)
            .map_err(|why| AppError::Usage(format!("rdma.port (--dev): {why}")))?;
        DeviceArg::Vdev(port)
    };
    let cores = available_cores();
    let main = cores
        .iter()
        .copied()
        .find(|c| !workers.contains(c))
        .unwrap_or(r.core);
    let mut user = cfg.eal.args.clone();
    user.extend(extra_eal.iter().cloned());
    let (args, memory) = plan_eal_args(
        &user,
        cfg.eal.hugepages,
        cfg.eal.memory_mb,
        main,
        &[device],
        &HugepageStatus::read(),
    )?;
    check_pool_fits(
        &memory,
        POOL_MBUFS,
        crate::rdma::FRAME_DATA_ROOM,
        ("eal.memory_mb", "eal.hugepages"),
        "",
    )?;
    Ok((args, memory))
}

/// The policy of the engine's workers: the command line's `--polling`, else the config's
/// (checked when it was parsed).
pub fn polling_of(cfg: &PeerConfig) -> Polling {
    polling::effective(cfg.runtime.polling().unwrap_or_default())
}

/// Starts EAL and the engine on `workers` (one worker per core, each with RX/TX queue *i* of
/// the port and the queue pairs homed on it). A target has one queue pair per worker (QPN
/// `qpn + i` to the peer's `peer_qpn + i`, homed on worker *i*); an initiator has one.
fn start(
    cfg_path: &Path,
    cfg: &PeerConfig,
    (args, memory): (Vec<String>, MemoryChoice),
    workers: &[usize],
    json: bool,
    pcap: Option<&Path>,
    cm: bool,
) -> Result<Peer, AppError> {
    let info = Eal::init(&args)?;
    report::banner(info, &memory, Some(polling_of(cfg)), json);
    let extras = Extras {
        cm,
        ..Extras::default()
    };
    start_engine(cfg_path, cfg, workers, pcap, &extras)
}

/// What an engine may have beyond its config file (`bench --server` and `--client`).
#[derive(Default)]
pub struct Extras<'a> {
    /// Sets what the config has no key for on every queue pair (congestion control, tagged
    /// messaging).
    pub qp: Option<&'a dyn Fn(&mut QpConfig)>,
    /// Tagged messaging on every worker's engine; the ports are [`Peer::tags`] and
    /// [`Peer::more_tags`].
    pub tags: Option<crate::rdma::TagConfig>,
    /// A connection manager on QP1 of worker 0 (`docs/cm.md`); its queue pairs start from
    /// queue pair 0's configuration. Its events are [`Peer::cm`].
    pub cm: bool,
}

/// Completion queue entries of the CM's queue pairs (all of them share one).
const CM_CQ_DEPTH: usize = 16_384;

/// The id of the port `rdma.port` names, once EAL has probed it.
pub fn port_id(cfg: &PeerConfig) -> Result<u16, AppError> {
    let r = &cfg.rdma;
    let name = if is_pci(&r.port) {
        r.port.as_str()
    } else {
        vdev_driver(&r.port).0
    };
    dataplane::port_by_name(name)
        .ok_or_else(|| AppError::Failed(format!("rdma.port: EAL probed no port named {name}")))
}

/// Starts the engine on `workers`, EAL already running (`start`), with `extras`.
pub fn start_engine(
    cfg_path: &Path,
    cfg: &PeerConfig,
    workers: &[usize],
    pcap: Option<&Path>,
    extras: &Extras<'_>,
) -> Result<Peer, AppError> {
    let r = &cfg.rdma;
    let config_error = |source| AppError::Config {
        path: cfg_path.display().to_string(),
        source,
    };
    let id = port_id(cfg)?;
    let pool = Arc::new(Mempool::new(
        "peer_pool",
        POOL_MBUFS,
        256,
        crate::rdma::FRAME_DATA_ROOM,
        -1,
    )?);
    let mac = parse_mac("rdma.mac", &r.mac).map_err(config_error)?;
    // Not promiscuous: the port takes the engine's address and frames for other hosts are
    // not the engine's business (it also drops them itself, counted as `wrong_mac`).
    let n = workers.len().max(1);
    let queues = n as u16;
    let port_cfg = PortConfig {
        promiscuous: false,
        mac: Some(mac.0),
        rx_queues: queues,
        tx_queues: queues,
        // A memif client may start before its server (two MPI ranks, two processes started
        // together): it connects again until the server takes it.
        reconnect: (r.port.starts_with("net_memif") && r.port.contains("role=client"))
            .then_some(std::time::Duration::from_secs(30)),
        ..PortConfig::default()
    };
    // With several queues, RSS under the key the peer computes source ports with.
    let port = Port::start_rss(id, &port_cfg, Some(&rss::MLX5_DEFAULT_KEY), pool.clone())?;

    let peer_mac = parse_mac("rdma.peer_mac", &r.peer_mac).map_err(config_error)?;
    let pmtu = parse_mtu(r.mtu).map_err(config_error)?;
    let peer_rss = rss::Rss::spread(r.peer_queues);
    let mut nodes: Vec<RdmaNode> = (0..n).map(|_| RdmaNode::new(mac, r.ip)).collect();
    if let Some(section) = &cfg.shaper {
        // Checked when the file was read; each worker gets its own shaper.
        let shaper = section.to_config("shaper").map_err(config_error)?;
        // The rates are the port's: with several workers, held across them.
        let shares = (n > 1).then(|| crate::shaper::PortShares::new(n, shaper.classes.len()));
        for (i, node) in nodes.iter_mut().enumerate() {
            node.set_shaper(shaper.clone())
                .map_err(|e| bad(cfg_path, "shaper", e.to_string()))?;
            if let Some(s) = &shares {
                node.share_shaper_port(s.clone(), i);
            }
        }
    }
    // Tagged messaging: each worker's shard holds the endpoints homed on it (endpoint e on
    // worker e mod n), and a message for an endpoint must come on a queue pair of its
    // worker's (queue pair i is worker i's).
    let mut tags = Vec::new();
    if let Some(t) = &extras.tags {
        for (node, homed) in nodes.iter_mut().zip(t.sharded(None, n)) {
            tags.push(
                node.enable_tags(&homed)
                    .map_err(|e| AppError::Failed(format!("tagged messaging: {e}")))?,
            );
        }
    }
    let mut tags = tags.into_iter();
    let (tags, more_tags) = (tags.next(), tags.collect());
    let mut ends = Vec::with_capacity(n);
    let mut places = Vec::with_capacity(n);
    let mut psn = 0;
    let mut cm = None;
    for i in 0..n {
        let (qpn, peer_qpn) = (r.qpn + i as u32, r.peer_qpn + i as u32);
        let mut qp = QpConfig::new(qpn, peer_qpn);
        qp.remote_mac = peer_mac;
        qp.remote_ip = r.peer_ip;
        qp.pmtu = pmtu;
        qp.timeout_ns = r.timeout_us * 1000;
        qp.max_timeout_ns = r.max_timeout_us() * 1000;
        qp.send_psn = r.psn.unwrap_or_else(random_psn);
        qp.recv_psn = r.peer_psn;
        qp.durable_writes = r.durable_writes;
        qp.traffic_class = r.traffic_class;
        qp.dscp = r.dscp;
        if let Some(tweak) = extras.qp {
            tweak(&mut qp);
        }
        let peer_queue = (r.peer_queue + i as u16) % r.peer_queues;
        if r.peer_queues > 1 {
            qp.udp_src_port = rss::source_port(&peer_rss, r.ip, r.peer_ip, peer_queue, qpn as u16)
                .ok_or_else(|| {
                    bad(
                        cfg_path,
                        "rdma.peer_queues",
                        format!("no UDP source port reaches the peer's queue {peer_queue}"),
                    )
                })?;
        }
        if i == 0 {
            psn = qp.send_psn;
        }
        places.push(QpPlace {
            qpn,
            peer_qpn,
            queue: i,
            core: workers[i],
            peer_queue,
            udp_src_port: qp.udp_src_port,
        });
        for (k, other) in nodes.iter_mut().enumerate() {
            if k != i {
                other.add_qp_homed_elsewhere(qpn);
            }
        }
        let node = &mut nodes[i];
        if i == 0 && extras.cm {
            let cq = node.create_cq(CM_CQ_DEPTH);
            let mut setup = CmSetup::new(qp.clone(), cq.id(), cq.id());
            cfg.cm.apply(&mut setup.cm);
            let events = node.enable_cm(setup);
            cm = Some((events, cq));
        }
        let cq = node.create_cq(qp.max_send_wr + qp.max_recv_wr);
        let qp = node
            .add_qp(qp, &cq, &cq)
            .map_err(|e| bad(cfg_path, "rdma.qpn", e.to_string()))?;
        ends.push((qp, cq));
    }
    let capture = match pcap {
        Some(path) => Some(Arc::new(
            CaptureSink::create(path, &[(port.id(), "rdma".to_string())]).map_err(|source| {
                AppError::Capture {
                    path: path.display().to_string(),
                    source,
                }
            })?,
        )),
        None => None,
    };
    let (handle, controls) = RdmaHandle::sharded(n);
    let polling = polling_of(cfg);
    let mut specs = Vec::with_capacity(n);
    for (i, (node, control)) in nodes.into_iter().zip(controls).enumerate() {
        let q = i as u16;
        specs.push(WorkerSpec {
            name: if n == 1 {
                "rdma".into()
            } else {
                format!("rdma{i}")
            },
            core: Some(workers[i]),
            rx: vec![port.rx_queue(q).expect("fresh port")],
            tx: vec![(port.tx_queue(q).expect("fresh port"), TxPolicy::KeepUnsent)],
            burst: 32,
            stage: StageBox::new(RdmaStage::new(node, pool.clone(), control, 0)),
            faults: None,
            capture: capture.as_ref().map(|s| WorkerCapture::new(s.clone())),
            polling,
        });
    }
    let runtime = Runtime::start(specs)?;
    let mut ends = ends.into_iter();
    let (qp, cq) = ends.next().expect("one queue pair at least");
    Ok(Peer {
        capture,
        runtime,
        handle,
        qp,
        cq,
        more: ends.collect(),
        qps: places,
        workers: workers.to_vec(),
        port,
        psn,
        tags,
        more_tags,
        cm,
    })
}

/// Registers the engine's telemetry commands (`/portico/...`, see [`crate::telemetry`]); if
/// that fails, says so and runs on without them.
pub fn serve_telemetry(
    peer: &Peer,
    role: &'static str,
    latency: LatencySource,
) -> Option<telemetry::Registration> {
    let engine = telemetry::Instance {
        role,
        ports: vec![("rdma".into(), peer.port.id())],
        counters: peer.runtime.counter_reader(),
        qps: peer
            .qps
            .iter()
            .map(|q| QpHome {
                qpn: q.qpn,
                peer_qpn: q.peer_qpn,
                worker: q.queue,
                core: q.core,
                peer_queue: q.peer_queue,
                udp_src_port: q.udp_src_port,
            })
            .collect(),
        live: Some(peer.handle.live_qps()),
        latency,
    };
    telemetry::register(engine)
        .map_err(|e| eprintln!("warning: no telemetry commands: {e}"))
        .ok()
}

fn host(e: crate::rdma::HostError) -> AppError {
    AppError::Failed(format!("host call: {e}"))
}

/// Registers the region with `access`, under `rdma.region_addr` when the config names one.
fn register(
    peer: &Peer,
    cfg: &PeerConfig,
    map: &Arc<Mapping>,
    access: Access,
) -> Result<MemoryRegion, AppError> {
    let len = cfg.rdma.region_len;
    match cfg.rdma.region_addr {
        Some(iova) => peer.handle.register_iova(map, 0, len, iova, access),
        None => peer.handle.register(map, 0, len, access),
    }
    .map_err(host)
}

/// What the target's region allows: local write and remote READ and WRITE, FLUSH of either
/// placement type (a standard peer may ask for visibility or persistence), and with
/// `rdma.durable_region` the withholding of plain WRITEs' ACKs until they are durable.
fn target_access(cfg: &PeerConfig) -> Access {
    let access = Access::ALL | Access::FLUSH_GLOBAL | Access::FLUSH_PERSISTENT;
    if cfg.rdma.durable_region {
        access | Access::DURABLE
    } else {
        access
    }
}

/// The names of the flags of `access`, for the `ready` line.
fn access_names(access: Access) -> Vec<&'static str> {
    [
        (Access::LOCAL_WRITE, "local_write"),
        (Access::REMOTE_READ, "remote_read"),
        (Access::REMOTE_WRITE, "remote_write"),
        (Access::FLUSH_GLOBAL, "flush_global"),
        (Access::FLUSH_PERSISTENT, "flush_persistent"),
        (Access::DURABLE, "durable"),
    ]
    .into_iter()
    .filter(|(flag, _)| access.contains(*flag))
    .map(|(_, name)| name)
    .collect()
}

/// The power-loss simulator keeps the persisted image in the region file: it needs one.
/// `simulate` is the field that asked for it (`--simulate-power-loss` or
/// `rdma.simulate_power_loss`), if any.
fn check_power_loss(simulate: Option<&str>, file: Option<&Path>) -> Result<(), ConfigError> {
    match (simulate, file) {
        (Some(field), None) => Err(ConfigError {
            field: field.into(),
            message: "needs a region file (rdma.region_file or --region-file): the simulator keeps the persisted image in it".into(),
        }),
        _ => Ok(()),
    }
}

/// Keys that only a target uses are refused by an initiator, rather than ignored.
fn check_initiator_keys(cfg: &PeerConfig) -> Result<(), ConfigError> {
    for (field, set) in [
        ("rdma.durable_region", cfg.rdma.durable_region),
        ("rdma.simulate_power_loss", cfg.rdma.simulate_power_loss),
    ] {
        if set {
            return Err(ConfigError {
                field: field.into(),
                message: "applies to portico target only".into(),
            });
        }
    }
    Ok(())
}

/// The counters both roles print at the end: the RDMA stage's declared counters
/// ([`RdmaCounters`]), each combined over the workers as declared (all summed), by name;
/// every one is there, at 0 when no worker counted it, so a counter added to the declaration
/// appears without a change here.
pub fn counts(reports: &[crate::runtime::WorkerReport]) -> BTreeMap<String, u64> {
    let mut all = RdmaCounters::default();
    for r in reports {
        all.combine(&RdmaCounters::from_pairs(r.counter_pairs()));
    }
    all.iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The port's own counters, as the `ports` array of a summary (the port is still started:
/// the `Peer` holds it).
fn ports(port: &Port) -> Result<Vec<PortSummary>, AppError> {
    Ok(vec![port_summary(port.id(), "rdma")?])
}

/// How often `portico target` samples its port's counters (and polls its completions).
const TALLY_PERIOD: Duration = Duration::from_millis(2);

/// A port's counters summed across the PMD's own resets. `net_memif` counts only the current
/// connection (its counters read 0 once the peer has gone), so the target samples them while
/// it serves: a counter that went down has started again from 0, and what it had counted is
/// kept. What arrives between the last sample and a disconnection ([`TALLY_PERIOD`] at most) is
/// missed. (At 20 ms, a release build's 200 WRITE+READ pairs could begin and end between two
/// samples, and the summary then showed no packet at all.)
#[derive(Default)]
struct PortTally {
    /// What earlier connections counted.
    before: Counters,
    /// The last sample, and its counters.
    last: Option<(PortSummary, Counters)>,
}

/// A port's counters by section (`stats`, `drop_xstats`) and name.
type Counters = BTreeMap<(String, String), u64>;

impl PortTally {
    fn counters(p: &PortSummary) -> Counters {
        let v = serde_json::to_value(p).expect("port summary serialises");
        ["stats", "drop_xstats"]
            .iter()
            .flat_map(|section| {
                v[*section]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(move |(k, x)| Some(((section.to_string(), k.clone()), x.as_u64()?)))
            })
            .collect()
    }

    fn sample(&mut self, now: PortSummary) {
        let counters = Self::counters(&now);
        if let Some((_, last)) = &self.last {
            for (k, &v) in last {
                if counters.get(k).copied().unwrap_or(0) < v {
                    *self.before.entry(k.clone()).or_default() += v;
                }
            }
        }
        self.last = Some((now, counters));
    }

    /// The last sample with each counter's earlier connections added: a `ports` entry.
    fn total(&self) -> serde_json::Value {
        let Some((last, counters)) = &self.last else {
            return serde_json::Value::Null;
        };
        let mut v = serde_json::to_value(last).expect("port summary serialises");
        for ((section, name), before) in &self.before {
            let now = counters
                .get(&(section.clone(), name.clone()))
                .copied()
                .unwrap_or(0);
            v[section.as_str()][name.as_str()] = json!(before + now);
        }
        v
    }
}

/// `portico target`: serves its region until `duration` ends or `stop` is set. With
/// `simulate_power_loss` (`--simulate-power-loss`) or `rdma.simulate_power_loss`, the region
/// file is mapped under pmem's power-loss simulator.
///
/// With `cores` (`--cores N`, over `rdma.cores`), or `rdma.cores`, the engine runs on several
/// workers, one queue pair homed on each; receives are posted on queue pair 0.
#[allow(clippy::too_many_arguments)]
pub fn run_target(
    path: &Path,
    region_file: Option<PathBuf>,
    simulate_power_loss: bool,
    duration: Option<Duration>,
    cores: Option<usize>,
    extra_eal: &[String],
    stop: Arc<AtomicBool>,
    pcap: Option<&Path>,
    listen: Option<u16>,
) -> Result<(), AppError> {
    // rdma.receives and the region's least length were checked with the config.
    let cfg = load(path)?;
    let workers = match cores {
        Some(n) => worker_cores(
            "--cores",
            cfg.rdma.core,
            Some(&CoresKey::Count(n)),
            &available_cores(),
        ),
        None => worker_cores(
            "rdma.cores",
            cfg.rdma.core,
            cfg.rdma.cores.as_ref(),
            &available_cores(),
        ),
    }
    .map_err(|e| field_error(path, e))?;
    let file = choose_region_file(region_file, &cfg);
    let simulate = if simulate_power_loss {
        Some("--simulate-power-loss")
    } else {
        cfg.rdma
            .simulate_power_loss
            .then_some("rdma.simulate_power_loss")
    };
    check_power_loss(simulate, file.as_ref().map(|(f, _)| f.as_path()))
        .map_err(|e| field_error(path, e))?;
    check_region(path, &cfg, file.as_ref().map(|(f, k)| (f.as_path(), *k)))?;
    let planned = plan(&cfg, &workers, extra_eal)?;
    let file = file.map(|(f, _)| f);
    let half = cfg.rdma.region_len / 2;
    let receives = cfg.rdma.receives as usize;
    let map = map_region(path, &cfg, file.as_deref(), simulate.is_some())?;
    let mut peer = start(path, &cfg, planned, &workers, true, pcap, listen.is_some())?;
    let telemetry = serve_telemetry(
        &peer,
        "target",
        LatencySource::None(
            "portico target runs no operations of its own; its initiator measures latency",
        ),
    );
    let access = target_access(&cfg);
    let mr = register(&peer, &cfg, &map, access)?;
    let recvs: Vec<RecvRequest> = (0..receives)
        .map(|i| RecvRequest::new(i as u64, mr.sgl(half + i * RECEIVE_LEN, RECEIVE_LEN as u32)))
        .collect();
    for chunk in recvs.chunks(64) {
        peer.qp
            .post_recv(chunk)
            .map_err(|e| AppError::Failed(format!("posting receive buffers: {e}")))?;
    }
    let mut served = listen
        .map(|port| -> Result<Served, AppError> {
            peer.handle.listen(port).map_err(host)?;
            let ad = RegionAd {
                flags: if cfg.rdma.durable_writes {
                    RegionAd::DURABLE
                } else {
                    0
                },
                rkey: mr.rkey(),
                addr: mr.addr(),
                len: mr.len() as u64,
            };
            Ok(Served::new(port, ad, recvs.clone()))
        })
        .transpose()?;
    let kind = map.kind();
    let rss = peer.port.rss();
    println!(
        "{}",
        json!({"type": "ready", "qpn": peer.qp.qpn(), "psn": peer.psn, "addr": mr.addr(), "len": mr.len(),
               "rkey": mr.rkey(), "region": kind.to_string(), "dax": map.is_dax(),
               "simulated": kind.is_simulated(), "access": access_names(access),
               "durable_writes": cfg.rdma.durable_writes, "listen": listen,
               "file": file.as_ref().map(|f| f.display().to_string()),
               "cores": peer.workers, "qps": peer.qps,
               "telemetry": telemetry.as_ref().and_then(|t| t.socket.as_ref()).map(|p| p.display().to_string()),
               "rss": {"queues": peer.workers.len(), "hash_fields": rss.hash_fields,
                       "reta_size": rss.reta_size, "key_set": rss.key_set}})
    );
    let t0 = Instant::now();
    let mut completions = Vec::new();
    let mut wcs = [WorkCompletion::EMPTY; 64];
    let mut collect = |cq: &mut Cq, completions: &mut Vec<serde_json::Value>| {
        let n = cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            completions.push(
                json!({"wr_id": wc.wr_id, "opcode": format!("{:?}", wc.opcode),
                "status": format!("{:?}", wc.status), "byte_len": wc.byte_len, "imm": wc.imm_data}),
            );
        }
    };
    let mut tally = PortTally::default();
    while !stop.load(Ordering::Relaxed)
        && duration.is_none_or(|d| t0.elapsed() < d)
        && !peer.runtime.has_failed()
    {
        collect(&mut peer.cq, &mut completions);
        for (_, cq) in &mut peer.more {
            collect(cq, &mut completions);
        }
        if let Ok(p) = port_summary(peer.port.id(), "rdma") {
            tally.sample(p);
        }
        match (&mut served, &mut peer.cm) {
            (Some(served), Some((events, cq))) => {
                collect(cq, &mut completions);
                served.serve(&peer.handle, events, TALLY_PERIOD);
            }
            _ => std::thread::sleep(TALLY_PERIOD),
        }
    }
    let link = peer.port.link();
    if let Some((_, cq)) = &mut peer.cm {
        collect(cq, &mut completions);
    }
    collect(&mut peer.cq, &mut completions);
    for (_, cq) in &mut peer.more {
        collect(cq, &mut completions);
    }
    // The first bytes of the region and of the first receive buffer, for checks from outside.
    let head = mr
        .to_vec(0, 64.min(mr.len()))
        .map_err(|e| AppError::Failed(e.to_string()))?;
    let recv_head = mr
        .to_vec(half, 64.min(mr.len() - half))
        .map_err(|e| AppError::Failed(e.to_string()))?;
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let reports = peer.runtime.join()?;
    drop(telemetry);
    // A file region is made durable before the process ends.
    let persisted = if file.is_some() {
        map.persist(0, map.len())
            .map_err(|e| AppError::Failed(format!("making the region durable: {e}")))?;
        true
    } else {
        false
    };
    tally.sample(port_summary(peer.port.id(), "rdma")?);
    let ports = [tally.total()];
    let captured = finish_capture(&peer.capture, pcap)?;
    println!(
        "{}",
        json!({"type": "target_summary", "seconds": t0.elapsed().as_secs_f64(), "link": link.to_string(),
               "counters": counts(&reports), "ports": ports, "completions": completions,
               "region_head": hex(&head), "receive_head": hex(&recv_head), "persisted": persisted,
               "captured": captured, "workers": workers_json(&reports),
               "cm": served.map(|s| s.summary())})
    );
    Ok(())
}

/// What `portico target --listen` does with its connections: accepts every request, its
/// region in the REP's private data ([`RegionAd`]), each on its own queue pair with the
/// target's receive buffers posted; forgets the queue pair when the connection ends.
struct Served {
    port: u16,
    ad: RegionAd,
    recvs: Vec<RecvRequest>,
    qps: Vec<(u32, Qp)>,
    requests: u64,
    accepted: u64,
    refused: u64,
    established: u64,
    disconnected: u64,
    timed_out: u64,
}

impl Served {
    fn new(port: u16, ad: RegionAd, recvs: Vec<RecvRequest>) -> Served {
        Served {
            port,
            ad,
            recvs,
            qps: Vec::new(),
            requests: 0,
            accepted: 0,
            refused: 0,
            established: 0,
            disconnected: 0,
            timed_out: 0,
        }
    }

    /// Takes the CM's events for up to `period`.
    fn serve(&mut self, handle: &RdmaHandle, events: &CmEvents, period: Duration) {
        let until = Instant::now() + period;
        while let Some(ev) = events.wait(until.saturating_duration_since(Instant::now())) {
            match ev {
                ConnEvent::Request(r) => {
                    self.requests += 1;
                    match handle.accept(r.id, &self.ad.to_bytes()) {
                        Ok(mut qp) => {
                            for chunk in self.recvs.chunks(64) {
                                let _ = qp.post_recv(chunk);
                            }
                            self.accepted += 1;
                            self.qps.push((r.id, qp));
                        }
                        Err(_) => self.refused += 1,
                    }
                }
                ConnEvent::Established { .. } => self.established += 1,
                ConnEvent::Disconnected { id } => {
                    self.disconnected += 1;
                    self.qps.retain(|(q, _)| *q != id);
                }
                ConnEvent::TimedOut { id } => {
                    self.timed_out += 1;
                    self.qps.retain(|(q, _)| *q != id);
                }
                ConnEvent::Rejected { id, .. } | ConnEvent::Unreachable { id } => {
                    self.qps.retain(|(q, _)| *q != id);
                }
            }
        }
    }

    fn summary(&self) -> serde_json::Value {
        json!({"listen": self.port, "requests": self.requests, "accepted": self.accepted,
               "refused": self.refused, "established": self.established,
               "disconnected": self.disconnected, "timed_out": self.timed_out,
               "connected_now": self.qps.len()})
    }
}

/// What `portico initiator` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitiatorMode {
    /// WRITE each message, READ it back into the other half of this side's region, compare.
    WriteRead,
    /// Stream durable WRITEs of [`durable_record`]s, keeping `qd` outstanding, and print a
    /// `durable` line for each as soon as its completion says it is durable at the target.
    Durable { qd: usize },
}

/// `portico initiator`'s options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitiatorOpts {
    /// The target's rkey and its region's address (from its `ready` line).
    pub rkey: u32,
    pub remote_addr: u64,
    /// Messages to WRITE (and READ back), or durable WRITEs to stream.
    pub ops: u64,
    /// Bytes per message; `None`: [`WRITE_READ_SIZE`] or [`DURABLE_SIZE`], by mode.
    pub size: Option<usize>,
    pub mode: InitiatorMode,
    /// Connect through the CM to a `portico target --listen` (or any rdma_cm listener that
    /// puts a [`RegionAd`] in its REP) at this address and port, instead of the config's
    /// queue pair and the keys above.
    pub connect: Option<(std::net::Ipv4Addr, u16)>,
    /// Workers (`--cores N`, over `rdma.cores`): one queue pair each, QPN `rdma.qpn + i` on
    /// worker *i* to the target's `rdma.peer_qpn + i`, each driven by its own host thread.
    pub cores: Option<usize>,
}

/// The default message size of the WRITE+READ mode.
pub const WRITE_READ_SIZE: usize = 4096;
/// The default record size of the durable mode: one cache line.
pub const DURABLE_SIZE: usize = 64;
/// The default number of durable WRITEs outstanding.
pub const DURABLE_QD: usize = 16;

/// Fills `out` (a multiple of 8 bytes, at least 16) with the record that durable WRITE `seq`
/// carries: little-endian 8-byte words, word 0 `seq` and word `i` `splitmix64(seq ^ (i << 48))`.
/// So a record names its write, and differs from zeros, from any other record and from a
/// mix of two.
pub fn durable_record(seq: u64, out: &mut [u8]) {
    for (i, word) in out.chunks_exact_mut(8).enumerate() {
        let v = if i == 0 {
            seq
        } else {
            crate::rng::splitmix64(seq ^ ((i as u64) << 48))
        };
        word.copy_from_slice(&v.to_le_bytes());
    }
}

/// The message size for `mode`, checked: 1 up to `max` for WRITE+READ; for durable records a
/// multiple of 8, at least 16 (word 0 and one check word).
fn check_size(size: Option<usize>, mode: InitiatorMode, max: usize) -> Result<usize, AppError> {
    match mode {
        InitiatorMode::WriteRead => {
            let size = size.unwrap_or(WRITE_READ_SIZE);
            if size == 0 || size > max {
                return Err(AppError::Usage(format!(
                    "--size: must be 1..={max} (half of rdma.region_len, at most 2^32-1)"
                )));
            }
            Ok(size)
        }
        InitiatorMode::Durable { .. } => {
            let size = size.unwrap_or(DURABLE_SIZE);
            if size < 16 || !size.is_multiple_of(8) || size > max {
                return Err(AppError::Usage(format!(
                    "--size: a durable record is a multiple of 8 bytes, 16..={} (half of rdma.region_len, at most 2^32-1)",
                    max - max % 8
                )));
            }
            Ok(size)
        }
    }
}

/// `--qd` of the durable mode: 1 up to the send queue's depth, and at most `slots`, so that
/// no two outstanding WRITEs share a source buffer or a slot of the target's region.
fn check_qd(qd: usize, slots: u64) -> Result<(), AppError> {
    let depth = QpConfig::new(0, 0).max_send_wr;
    if qd == 0 || qd > depth {
        return Err(AppError::Usage(format!(
            "--qd: must be 1..={depth} (the send queue's depth)"
        )));
    }
    if qd as u64 > slots {
        return Err(AppError::Usage(format!(
            "--qd: {qd} is more than the {slots} slots of --size bytes in half of rdma.region_len: two outstanding WRITEs would share a slot"
        )));
    }
    Ok(())
}

/// `portico initiator`: WRITE then READ back `ops` messages, or stream `ops` durable WRITEs.
pub fn run_initiator(
    path: &Path,
    region_file: Option<PathBuf>,
    o: &InitiatorOpts,
    extra_eal: &[String],
    pcap: Option<&Path>,
) -> Result<(), AppError> {
    let cfg = load(path)?;
    check_initiator_keys(&cfg).map_err(|e| field_error(path, e))?;
    let (cores_key, cores) = match o.cores {
        Some(n) => ("--cores", Some(CoresKey::Count(n))),
        None => ("rdma.cores", cfg.rdma.cores.clone()),
    };
    let workers = worker_cores(cores_key, cfg.rdma.core, cores.as_ref(), &available_cores())
        .map_err(|e| field_error(path, e))?;
    if workers.len() > 1 {
        // The durable stream's lines come in the order of one queue pair's completions, and
        // the CM connects one queue pair.
        let alone = match (o.mode, o.connect) {
            (InitiatorMode::Durable { .. }, _) => Some("--durable"),
            (_, Some(_)) => Some("--connect"),
            _ => None,
        };
        if let Some(option) = alone {
            let message = format!("{option} runs on one worker; WRITE+READ pairs run on several");
            return Err(match o.cores {
                Some(_) => AppError::Usage(format!("--cores: {message}")),
                None => bad(path, cores_key, message),
            });
        }
    }
    if matches!(o.mode, InitiatorMode::Durable { .. }) && !cfg.rdma.durable_writes {
        return Err(bad(
            path,
            "rdma.durable_writes",
            "--durable needs durable_writes = true here and in the target's config".into(),
        ));
    }
    let half = cfg.rdma.region_len / 2;
    // A message goes out of the lower half and is read back into the upper one; the host
    // keeps two copies of it, and a work request's length is 32 bits.
    let max_size = half.min(u32::MAX as usize);
    let size = check_size(o.size, o.mode, max_size)?;
    limits::check_memory(
        "--size",
        "two copies of a message",
        2 * size as u64,
        MemoryLimit::read().as_ref(),
    )
    .map_err(|e| AppError::Usage(e.to_string()))?;
    if o.ops == 0 {
        return Err(AppError::Usage("--ops: must be at least 1".into()));
    }
    if o.remote_addr.checked_add(half as u64).is_none() {
        return Err(AppError::Usage(format!(
            "--remote-addr: {:#x} + {half} bytes (half of rdma.region_len, where the messages go) runs past the end of the 64-bit address space",
            o.remote_addr
        )));
    }
    let slots = (half / size).max(1) as u64;
    if let InitiatorMode::Durable { qd } = o.mode {
        check_qd(qd, slots)?;
    }
    // Each queue pair writes its own slots (slot s belongs to queue pair s mod n), so that
    // two never write the same bytes at once.
    if slots < workers.len() as u64 {
        return Err(AppError::Usage(format!(
            "--size: {size} bytes leaves {slots} slots in half of rdma.region_len, fewer than the {} queue pairs",
            workers.len()
        )));
    }
    let file = choose_region_file(region_file, &cfg);
    check_region(path, &cfg, file.as_ref().map(|(f, k)| (f.as_path(), *k)))?;
    let planned = plan(&cfg, &workers, extra_eal)?;
    let file = file.map(|(f, _)| f);
    let map = map_region(path, &cfg, file.as_deref(), false)?;
    let mut peer = start(
        path,
        &cfg,
        planned,
        &workers,
        true,
        pcap,
        o.connect.is_some(),
    )?;
    let latency = LatencySlot::new();
    let telemetry = serve_telemetry(&peer, "initiator", LatencySource::Slot(latency.clone()));
    let t_link = Instant::now();
    while !peer.port.link().up {
        if t_link.elapsed() > Duration::from_secs(30) {
            return Err(AppError::Failed(format!(
                "rdma.port: link still down after 30 s (is the target running on {}?)",
                cfg.rdma.port
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mr = register(&peer, &cfg, &map, Access::ALL)?;
    let mut o = *o;
    let connected = match o.connect {
        Some((ip, port)) => {
            let c = connect_cm(&mut peer, ip, port, CONNECT_WAIT)?;
            if c.ad.len < (slots as usize * size) as u64 {
                return Err(AppError::Failed(format!(
                    "{ip}:{port}: the target's region holds {} bytes, fewer than --size {size} times {slots} slots",
                    c.ad.len
                )));
            }
            (o.rkey, o.remote_addr) = (c.ad.rkey, c.ad.addr);
            Some(c)
        }
        None => None,
    };
    let o = &o;
    let base = json!({"type": "initiator_summary", "ops": o.ops, "size": size, "psn": peer.psn,
                      "region": map.kind().to_string(), "cores": peer.workers,
                      // Where the config's queue pairs are (the CM's is under "cm").
                      "qps": connected.is_none().then_some(&peer.qps),
                      "cm": connected.as_ref().map(|c| json!({"id": c.id, "qpn": peer.qp.qpn(),
                          "rkey": c.ad.rkey, "addr": c.ad.addr, "len": c.ad.len,
                          "setup_us": c.setup.as_secs_f64() * 1e6}))});
    let t0 = Instant::now();
    let (mut summary, outcome) = match o.mode {
        InitiatorMode::WriteRead => write_read(&mut peer, &mr, o, size, slots, &latency)?,
        InitiatorMode::Durable { qd } => {
            stream_durable(&mut peer, &mr, o, size, qd, slots, &latency)?
        }
    };
    let seconds = t0.elapsed().as_secs_f64();
    if let (Some(c), Some((events, _))) = (&connected, &peer.cm) {
        disconnect_cm(&peer.handle, events, c.id, CONNECT_WAIT)?;
    }
    let reports = peer.runtime.join()?;
    drop(telemetry);
    let ports = ports(&peer.port)?;
    let captured = finish_capture(&peer.capture, pcap)?;
    let fields = summary.as_object_mut().expect("a JSON object");
    for (k, v) in base.as_object().expect("a JSON object") {
        fields.insert(k.clone(), v.clone());
    }
    fields.insert("seconds".into(), json!(seconds));
    fields.insert("counters".into(), json!(counts(&reports)));
    fields.insert("ports".into(), json!(ports));
    fields.insert("captured".into(), json!(captured));
    fields.insert("workers".into(), workers_json(&reports));
    println!("{summary}");
    outcome.map_err(AppError::CheckFailed)
}

/// The summaries' `workers`: each worker's use of its core ([`report::worker_use`]) and the
/// packets it delivered to its queue pairs.
fn workers_json(reports: &[crate::runtime::WorkerReport]) -> serde_json::Value {
    let mut list = report::worker_use(reports);
    if let Some(list) = list.as_array_mut() {
        for (w, r) in list.iter_mut().zip(reports) {
            w["delivered"] = json!(r.counter("delivered").unwrap_or(0));
        }
    }
    list
}

/// How long the initiator waits for the CM: its connection (ARP, REQ, REP) or its end.
const CONNECT_WAIT: Duration = Duration::from_secs(30);

/// A connection the CM made for the initiator.
pub struct Connected {
    pub id: u32,
    pub ad: RegionAd,
    /// From the connect call to the established event.
    pub setup: Duration,
}

/// Connects to `ip:port` through the CM; the new queue pair and its completion queue take
/// the places of the config's in `peer`.
pub fn connect_cm(
    peer: &mut Peer,
    ip: std::net::Ipv4Addr,
    port: u16,
    wait: Duration,
) -> Result<Connected, AppError> {
    let to = format!("--connect {ip}:{port}");
    let t0 = Instant::now();
    let id = peer
        .handle
        .connect(ip, port, &[])
        .map_err(|e| AppError::Failed(format!("{to}: {e}")))?;
    let Some((events, _)) = &peer.cm else {
        return Err(AppError::Failed(format!("{to}: the engine has no CM")));
    };
    loop {
        let left = wait.saturating_sub(t0.elapsed());
        let Some(ev) = events.wait(left) else {
            return Err(AppError::Failed(format!(
                "{to}: no connection after {wait:?}"
            )));
        };
        match ev {
            ConnEvent::Established {
                id: got,
                qp: Some(qp),
                private_data,
            } if got == id => {
                let Some(ad) = RegionAd::parse(&private_data) else {
                    return Err(AppError::Failed(format!(
                        "{to}: the REP's private data names no region (not a portico target --listen?)"
                    )));
                };
                let setup = t0.elapsed();
                peer.qp = qp;
                let (_, cq) = peer.cm.as_mut().expect("checked above");
                std::mem::swap(&mut peer.cq, cq);
                return Ok(Connected { id, ad, setup });
            }
            ConnEvent::Rejected { reason, .. } => {
                return Err(AppError::Failed(format!(
                    "{to}: rejected, reason {reason} ({})",
                    crate::wire::cm::rej_reason::name(reason)
                )));
            }
            ConnEvent::TimedOut { .. } => {
                return Err(AppError::Failed(format!(
                    "{to}: the peer's CM never answered"
                )));
            }
            ConnEvent::Unreachable { .. } => {
                return Err(AppError::Failed(format!(
                    "{to}: nobody answered ARP for {ip}"
                )));
            }
            _ => {}
        }
    }
}

/// Ends connection `id` (of `handle`'s engine, whose CM events are `events`) and waits for
/// its end (bounded by `wait`).
pub fn disconnect_cm(
    handle: &RdmaHandle,
    events: &CmEvents,
    id: u32,
    wait: Duration,
) -> Result<(), AppError> {
    handle
        .disconnect(id)
        .map_err(|e| AppError::Failed(format!("disconnecting: {e}")))?;
    let t0 = Instant::now();
    while let Some(ev) = events.wait(wait.saturating_sub(t0.elapsed())) {
        if matches!(ev, ConnEvent::Disconnected { id: d } if d == id) {
            return Ok(());
        }
    }
    Err(AppError::Failed(format!(
        "disconnecting: no end of connection {id:#x} after {wait:?}"
    )))
}

/// How often the initiator's latency figures are published to telemetry.
const PUBLISH_LATENCY: Duration = Duration::from_secs(1);

/// The WRITE+READ mode: each message written, read back and compared, one pair at a time on
/// each queue pair, every queue pair driven by its own host thread ([`pairs_on`]). Its
/// summary fields (`per_qp`: each queue pair's share), and a failure message if any operation
/// failed or read back differently. The latency figures of all the queue pairs go to `slot`
/// (`write_read`) once a second and at the end.
fn write_read(
    peer: &mut Peer,
    mr: &MemoryRegion,
    o: &InitiatorOpts,
    size: usize,
    slots: u64,
    slot: &LatencySlot,
) -> Result<(serde_json::Value, Result<(), String>), AppError> {
    let n = 1 + peer.more.len();
    // The queue pairs' own numbers (the CM's, when it made queue pair 0).
    let qpns: Vec<u32> = std::iter::once(peer.qp.qpn())
        .chain(peer.more.iter().map(|(qp, _)| qp.qpn()))
        .collect();
    let ends = std::iter::once((&mut peer.qp, &mut peer.cq))
        .chain(peer.more.iter_mut().map(|(qp, cq)| (qp, cq)));
    // Each thread's latency so far, for the once-a-second figure of all of them.
    let board = std::sync::Mutex::new(vec![Latency::new(); n]);
    let runs: Vec<Result<PairsRun, AppError>> = std::thread::scope(|scope| {
        let threads: Vec<_> = ends
            .enumerate()
            .map(|(q, (qp, cq))| {
                let share = Share { q, n, size, slots };
                let board = &board;
                std::thread::Builder::new()
                    .name(format!("initiator{q}"))
                    .spawn_scoped(scope, move || {
                        pairs_on(share, qp, cq, mr, o, |latency| {
                            let mut all = board.lock().unwrap_or_else(|e| e.into_inner());
                            all[q] = latency.clone();
                            slot.publish("write_read", &merged(all.iter()));
                        })
                    })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| match t {
                Ok(t) => t.join().unwrap_or_else(|_| {
                    Err(AppError::Failed(
                        "a host thread of the initiator panicked".into(),
                    ))
                }),
                Err(e) => Err(AppError::Failed(format!("starting a host thread: {e}"))),
            })
            .collect()
    });
    let runs = runs.into_iter().collect::<Result<Vec<_>, _>>()?;
    let latency = merged(runs.iter().map(|r| &r.latency));
    slot.publish("write_read", &latency);
    let failed: u64 = runs.iter().map(|r| r.failed).sum();
    let mismatched: u64 = runs.iter().map(|r| r.mismatched).sum();
    let per_qp: Vec<serde_json::Value> = runs
        .iter()
        .zip(qpns)
        .map(|(r, qpn)| {
            json!({"qpn": qpn, "ops": r.ops, "failed": r.failed, "mismatched": r.mismatched,
                   "write_read_latency_ns": r.latency.summary()})
        })
        .collect();
    let summary = json!({"mode": "write_read", "failed": failed, "mismatched": mismatched,
                         "write_read_latency_ns": latency.summary(), "per_qp": per_qp});
    let outcome = if failed > 0 || mismatched > 0 {
        Err(format!(
            "{failed} operations failed, {mismatched} of {} read back differently",
            o.ops
        ))
    } else {
        Ok(())
    };
    Ok((summary, outcome))
}

/// One histogram of several.
fn merged<'a>(all: impl IntoIterator<Item = &'a Latency>) -> Latency {
    let mut m = Latency::new();
    for l in all {
        m.merge(l);
    }
    m
}

/// Which of the WRITE+READ pairs a queue pair makes, and where: queue pair `q` of `n` makes
/// operations `q`, `q + n`, `q + 2n`... and writes its `k`-th into slot `(k mod slots / n)
/// n + q`, so that the queue pairs' slots are disjoint (with one queue pair, operation `i`
/// goes to slot `i mod slots`).
#[derive(Clone, Copy)]
struct Share {
    q: usize,
    n: usize,
    size: usize,
    slots: u64,
}

impl Share {
    /// The operations of this queue pair, with their offsets in the lower half.
    fn ops(self, total: u64) -> impl Iterator<Item = (u64, usize)> {
        let own = (self.slots / self.n as u64).max(1);
        (self.q as u64..total)
            .step_by(self.n)
            .enumerate()
            .map(move |(k, i)| {
                let slot = (k as u64 % own) * self.n as u64 + self.q as u64;
                (i, slot as usize * self.size)
            })
    }
}

/// What one queue pair's thread did.
struct PairsRun {
    ops: u64,
    failed: u64,
    mismatched: u64,
    latency: Latency,
}

/// The WRITE+READ pairs of one queue pair (`share`), one at a time: message `i` (byte `k`
/// is `i * 31 + k * 7`) written into this side's region, sent by an RDMA WRITE to the same
/// offset of the target's, READ back into the upper half of this side's and compared.
/// `publish` gets the latency so far about once a second.
fn pairs_on(
    share: Share,
    qp: &mut Qp,
    cq: &mut Cq,
    mr: &MemoryRegion,
    o: &InitiatorOpts,
    publish: impl Fn(&Latency),
) -> Result<PairsRun, AppError> {
    let half = mr.len() / 2;
    let size = share.size;
    let mut run = PairsRun {
        ops: 0,
        failed: 0,
        mismatched: 0,
        latency: Latency::new(),
    };
    let mut published = Instant::now();
    let mut data = vec![0u8; size];
    let mut back = vec![0u8; size];
    for (i, off) in share.ops(o.ops) {
        for (k, b) in data.iter_mut().enumerate() {
            *b = (i as usize * 31 + k * 7) as u8;
        }
        mr.write(off, &data)
            .map_err(|e| AppError::Failed(e.to_string()))?;
        let started = Instant::now();
        let len = size as u32;
        let write = WorkRequest::write(
            2 * i,
            mr.sgl(off, len),
            o.remote_addr + off as u64,
            o.rkey,
            None,
        );
        let read = WorkRequest::read(
            2 * i + 1,
            mr.sgl(half + off, len),
            o.remote_addr + off as u64,
            o.rkey,
        );
        qp.post_send(&[write, read])
            .map_err(|e| AppError::Failed(format!("posting: {e}")))?;
        for _ in 0..2 {
            match cq.wait_one(Duration::from_secs(10)) {
                Some(wc) if wc.status == WcStatus::Success => {}
                _ => run.failed += 1,
            }
        }
        run.latency.record(started.elapsed().as_nanos() as u64);
        run.ops += 1;
        if published.elapsed() >= PUBLISH_LATENCY {
            publish(&run.latency);
            published = Instant::now();
        }
        // The READ's completion made the bytes visible in this process's own mapping.
        mr.read(half + off, &mut back)
            .map_err(|e| AppError::Failed(e.to_string()))?;
        if back != data {
            run.mismatched += 1;
        }
    }
    Ok(run)
}

/// How long the durable mode waits for a completion before it gives up.
const DURABLE_WAIT: Duration = Duration::from_secs(10);

/// The durable mode: durable WRITE `seq` carries [`durable_record`]`(seq)` from slot
/// `seq % slots` of the lower half of this side's region to the same offset of the target's,
/// `qd` outstanding. Each completion prints `{"type":"durable","seq":..,"offset":..}` at once
/// (stdout is flushed per line), so that whoever reads the lines knows, for every WRITE they
/// name, that the target had made it durable. The first error completion ends the run. The
/// latency figures go to `slot` (`durable`) once a second and at the end.
fn stream_durable(
    peer: &mut Peer,
    mr: &MemoryRegion,
    o: &InitiatorOpts,
    size: usize,
    qd: usize,
    slots: u64,
    slot: &LatencySlot,
) -> Result<(serde_json::Value, Result<(), String>), AppError> {
    use std::io::Write as _;
    let offset = |seq: u64| ((seq % slots) as usize) * size;
    let mut record = vec![0u8; size];
    let mut started: BTreeMap<u64, Instant> = BTreeMap::new();
    let mut latency = Latency::new();
    let mut published = Instant::now();
    let (mut posted, mut durable) = (0u64, 0u64);
    let mut wrs = Vec::with_capacity(qd);
    let mut wcs = [WorkCompletion::EMPTY; 64];
    let stdout = std::io::stdout();
    let printing = |e: std::io::Error| AppError::Failed(format!("printing a durable line: {e}"));
    let mut error = None;
    'run: while durable < o.ops {
        wrs.clear();
        while posted < o.ops && started.len() + wrs.len() < qd {
            let off = offset(posted);
            durable_record(posted, &mut record);
            mr.write(off, &record)
                .map_err(|e| AppError::Failed(e.to_string()))?;
            wrs.push(WorkRequest::durable_write(
                posted,
                mr.sgl(off, size as u32),
                o.remote_addr + off as u64,
                o.rkey,
                false,
            ));
            posted += 1;
        }
        if !wrs.is_empty() {
            let now = Instant::now();
            started.extend(wrs.iter().map(|w| (w.wr_id, now)));
            peer.qp
                .post_send(&wrs)
                .map_err(|e| AppError::Failed(format!("posting durable WRITEs: {e}")))?;
        }
        let n = peer.cq.wait(&mut wcs, DURABLE_WAIT);
        if n == 0 {
            error = Some(format!(
                "no completion in {} s with {} durable WRITEs outstanding (the oldest is {})",
                DURABLE_WAIT.as_secs(),
                started.len(),
                started.keys().next().copied().unwrap_or(posted)
            ));
            break;
        }
        let mut out = stdout.lock();
        for wc in &wcs[..n] {
            let seq = wc.wr_id;
            let began = started.remove(&seq);
            if wc.status != WcStatus::Success || wc.opcode != WcOpcode::DurableWrite {
                error = Some(format!(
                    "durable WRITE {seq} (offset {}) completed as {:?} with status {:?}",
                    offset(seq),
                    wc.opcode,
                    wc.status
                ));
                break 'run;
            }
            if let Some(t) = began {
                latency.record(t.elapsed().as_nanos() as u64);
            }
            durable += 1;
            writeln!(
                out,
                "{}",
                json!({"type": "durable", "seq": seq, "offset": offset(seq)})
            )
            .map_err(printing)?;
        }
        out.flush().map_err(printing)?;
        if published.elapsed() >= PUBLISH_LATENCY {
            slot.publish("durable", &latency);
            published = Instant::now();
        }
    }
    slot.publish("durable", &latency);
    let summary = json!({"mode": "durable", "qd": qd, "slots": slots, "durable": durable,
                         "failed": if error.is_some() { 1 } else { 0 }, "error": error,
                         "durable_latency_ns": latency.summary()});
    Ok((summary, error.map_or(Ok(()), Err)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::PortStats;

    /// A summary's `counters`: one key per declared RDMA counter, each summed over the
    /// workers; the ones the summaries always had (`delivered`, `icrc_errors`, ...) at 0 even
    /// with no worker to report them.
    #[test]
    fn summary_counters_are_the_declared_ones_summed_over_workers() {
        let mut c = crate::runtime::Counters::default();
        for (i, v) in c.stage.iter_mut().enumerate() {
            *v = i as u64 + 1;
        }
        let names = &RdmaCounters::NAMES;
        let r = crate::runtime::WorkerReport::new("rdma", None, "rdma", names, &c);
        let counted = counts(&[r.clone(), r]);
        assert_eq!(counted.len(), RdmaCounters::LEN);
        for (i, name) in names.iter().enumerate() {
            assert_eq!(counted[*name], 2 * (i as u64 + 1), "{name}");
        }
        let none = counts(&[]);
        assert_eq!(none.len(), RdmaCounters::LEN);
        for k in [
            "delivered",
            "icrc_errors",
            "malformed",
            "not_for_us",
            "arp_replies",
        ] {
            assert_eq!(none[k], 0, "{k}");
        }
    }

    fn port(rx_packets: u64, rx_q0_errors: u64) -> PortSummary {
        PortSummary {
            name: "rdma".into(),
            id: 0,
            driver: "net_memif".into(),
            link: "up".into(),
            stats: PortStats {
                rx_packets,
                ..PortStats::default()
            },
            drop_xstats: [("rx_q0_errors".to_string(), rx_q0_errors)].into(),
        }
    }

    #[test]
    fn each_queue_pair_makes_its_share_of_the_operations_in_slots_of_its_own() {
        for (n, slots) in [(1, 128), (1, 7), (2, 2), (2, 7), (3, 128), (4, 9)] {
            let size = 64;
            let mut made = vec![0u32; 50];
            for q in 0..n {
                let share = Share { q, n, size, slots };
                for (i, off) in share.ops(50) {
                    made[i as usize] += 1;
                    let slot = (off / size) as u64;
                    assert!(slot < slots, "{n} {slots}: op {i} at slot {slot}");
                    assert_eq!(
                        slot as usize % n,
                        q,
                        "{n} {slots}: slot {slot} is another's"
                    );
                    if n == 1 {
                        assert_eq!(slot, i % slots);
                    }
                }
            }
            assert!(made.iter().all(|&m| m == 1), "{n} {slots}: {made:?}");
        }
    }

    #[test]
    fn a_durable_record_names_its_write() {
        let mut a = [0u8; 64];
        let mut b = [0u8; 64];
        durable_record(7, &mut a);
        durable_record(8, &mut b);
        assert_eq!(u64::from_le_bytes(a[..8].try_into().unwrap()), 7);
        assert_ne!(a[8..], b[8..], "the check words differ per write");
        assert!(a[8..].chunks(8).all(|w| w != [0u8; 8]));
        let mut again = [0u8; 64];
        durable_record(7, &mut again);
        assert_eq!(a, again);
    }

    #[test]
    fn sizes_and_depths_of_each_mode() {
        let durable = InitiatorMode::Durable { qd: 1 };
        assert_eq!(
            check_size(None, InitiatorMode::WriteRead, 1 << 19).unwrap(),
            4096
        );
        assert_eq!(check_size(None, durable, 1 << 19).unwrap(), 64);
        assert_eq!(
            check_size(Some(1), InitiatorMode::WriteRead, 64).unwrap(),
            1
        );
        for bad in [0, 8, 60, 1 << 20] {
            assert!(check_size(Some(bad), durable, 1 << 19).is_err(), "{bad}");
        }
        assert!(check_size(Some(65), InitiatorMode::WriteRead, 64).is_err());
        assert!(check_qd(16, 128).is_ok());
        assert!(check_qd(128, 128).is_ok());
        for (qd, slots) in [(0, 128), (129, 1000), (3, 2)] {
            let e = check_qd(qd, slots).unwrap_err();
            assert!(e.to_string().starts_with("--qd: "), "{e}");
        }
    }

    #[test]
    fn the_simulator_needs_a_file_and_the_initiator_refuses_target_keys() {
        let e = check_power_loss(Some("--simulate-power-loss"), None).unwrap_err();
        assert_eq!(e.field, "--simulate-power-loss");
        assert!(check_power_loss(Some("rdma.simulate_power_loss"), Some(Path::new("f"))).is_ok());
        assert!(check_power_loss(None, None).is_ok());
        let text = r#"
            [rdma]
            port = "net_null0"
            core = 0
            mac = "02:00:00:00:00:01"
            ip = "10.0.0.1"
            qpn = 1
            peer_mac = "02:00:00:00:00:02"
            peer_ip = "10.0.0.2"
            peer_qpn = 2
            region_len = 4096
        "#;
        let cfg = crate::config::peer::parse_peer(text, &[0]).unwrap();
        assert!(check_initiator_keys(&cfg).is_ok());
        assert_eq!(
            target_access(&cfg),
            Access::ALL | Access::FLUSH_GLOBAL | Access::FLUSH_PERSISTENT
        );
        let durable = crate::config::peer::parse_peer(
            &text.replace("region_len", "durable_region = true\nregion_len"),
            &[0],
        )
        .unwrap();
        assert_eq!(
            check_initiator_keys(&durable).unwrap_err().field,
            "rdma.durable_region"
        );
        assert!(target_access(&durable).contains(Access::DURABLE));
        assert_eq!(
            access_names(target_access(&durable)),
            [
                "local_write",
                "remote_read",
                "remote_write",
                "flush_global",
                "flush_persistent",
                "durable"
            ]
        );
    }

    #[test]
    fn a_tally_keeps_what_a_reset_counter_had_counted() {
        let mut t = PortTally::default();
        assert!(t.total().is_null());
        t.sample(port(10, 1));
        t.sample(port(25, 2));
        assert_eq!(t.total()["stats"]["rx_packets"], 25);
        // The peer went away: the PMD starts again from 0.
        t.sample(port(0, 0));
        t.sample(port(4, 0));
        let v = t.total();
        assert_eq!(v["stats"]["rx_packets"], 29);
        assert_eq!(v["drop_xstats"]["rx_q0_errors"], 2);
        assert_eq!(v["stats"]["rx_missed"], 0);
        assert_eq!(v["name"], "rdma");
    }
}
