//! Two RDMA engines in one process, joined back to back by a `net_ring` link, on one pinned
//! worker or two: the set-up behind `portico bench`, the example program and the RDMA tests.
//! The first connection's ends have one queue pair and one completion queue each (for their
//! sends and their receives); further connections, when asked for, each have their own. A
//! process can start several pairs under different names.
//!
//! With [`LoopbackOpts::workers`] both engines run on N workers instead: each port has N queue
//! pairs (`ring_pair_queues`: TX queue *i* of one port feeds RX queue *i* of the other), and
//! worker *i* serves queue *i* of both ports with shard *i* of both engines, the queue pairs
//! homed on it (connection *c* on worker *c* mod N unless [`LoopbackOpts::homes`] says
//! otherwise). Each queue pair's UDP source port is chosen so that the peer's RSS would give
//! its packets to the peer end's home queue (`wire::rss`), as on a NIC.

use super::cm::{CmEvents, CmSetup};
use std::net::Ipv4Addr;
use std::sync::Arc;

use super::{Cq, Qp, RdmaHandle, RdmaNode, RdmaStage, TagConfig, TagPort};
use crate::dataplane::{DpdkError, Mempool, Port, PortConfig, ring_pair_queues};
use crate::runtime::{
    CaptureSink, FaultConfig, FaultInjector, Polling, Runtime, RuntimeError, StageBox, TxPolicy,
    WorkerCapture, WorkerSpec, polling,
};
use crate::shaper::ShaperConfig;
use crate::transport::{QpConfig, random_psn};
use crate::wire::EthernetAddress;
use crate::wire::rss::{self, Rss};

/// QP numbers of the two ends of the first connection.
pub const QPN_A: u32 = 0x11;
pub const QPN_B: u32 = 0x22;

/// QP numbers of connection `i` on A and on B (connection 0: [`QPN_A`], [`QPN_B`]).
pub const fn qpns(i: usize) -> (u32, u32) {
    let step = (i as u32) << 8;
    (QPN_A + step, QPN_B + step)
}
pub const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xa]);
pub const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xb]);
pub const IP_A: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
pub const IP_B: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);

/// How to build the pair.
#[derive(Debug, Clone)]
pub struct LoopbackOpts {
    /// QP settings of end A (B mirrors them); QPNs, MACs and IPs are filled in.
    pub qp: QpConfig,
    /// Fault injection on both receive paths (B's seed is A's + 1).
    pub faults: Option<FaultConfig>,
    /// Cores of engine A and engine B; the same core twice puts both on one worker.
    pub cores: [usize; 2],
    pub burst: usize,
    /// Entries of each end's completion queue.
    pub cq_depth: usize,
    /// Capture both ports into this pcapng file.
    pub pcap: Option<std::path::PathBuf>,
    /// Names the mempool, the link and the workers (`rdma`: one pair per name in a process).
    pub name: String,
    /// Queue pairs joining the two engines (at least one).
    pub connections: usize,
    /// Keep the PSNs of `qp` (tests that look at them); otherwise every connection starts
    /// both directions at PSNs drawn at random, as verbs applications do.
    pub pin_psn: bool,
    /// Tagged messaging on both engines (each gets a list-processing shard with these
    /// endpoints); set `qp.tagged` too for tagged queue pairs. A's rank is 0, B's 1. With
    /// `workers`, each worker's shard holds the endpoints `tag_table` homes on it (seed 001:
    /// endpoints sharded over processing engines), and a message reaches an endpoint over a
    /// connection whose ends are homed on that endpoint's worker: the sender steers by its
    /// choice of queue pair, as for RDMA; over another it is refused (`tag_wrong_engine`).
    pub tags: Option<TagConfig>,
    /// With `tags` and `workers`: which worker each endpoint is homed on (index into
    /// `workers`); `None`: endpoint *i* on worker *i* mod N.
    pub tag_table: Option<crate::lpe::EndpointTable>,
    /// Run both engines on these cores, one worker each, each port with as many queues
    /// (at most `dataplane::RING_MAX_QUEUES`); worker *i* holds shard *i* of both engines.
    /// Empty: `cores` decides, one queue per port.
    pub workers: Vec<usize>,
    /// With `workers`: the home workers of connection *c*'s ends on A and on B (`homes[c]`);
    /// connections beyond the list are homed round robin, on worker *c* mod N at both ends.
    /// Ends homed on different indexes are a misconfiguration (their packets arrive at the
    /// wrong worker and are dropped as `wrong_core`); tests make one on purpose.
    pub homes: Vec<[usize; 2]>,
    /// Wraps the stage of each worker that runs both engines before it starts (both engines
    /// on one worker, or `workers`): instrumentation around the engines, such as the benches'
    /// emulated bottleneck in front of B's receive path.
    pub wrap: Option<StageWrap>,
    /// A traffic shaper on engine B's requests (both engines on one worker only).
    pub shaper: Option<ShaperSpec>,
    /// How the workers wait when idle (the command line's `--polling` overrides it).
    pub polling: Polling,
    /// A connection manager on QP1 of both engines (shard 0), its queue pairs starting from
    /// `qp` ([`LoopbackPair::cm`]).
    pub cm: bool,
    /// The CMs' response time code (4.096 µs · 2^n; rdma_cm's 20 is 4.3 s): how long each
    /// waits for the other's answer before it resends. Tests with faults shorten it.
    pub cm_response_timeout: u8,
}

/// The shaper [`LoopbackOpts::shaper`] asks for.
#[derive(Debug, Clone)]
pub struct ShaperSpec {
    pub config: ShaperConfig,
    /// Per connection: the traffic class of its queue pair on engine B (0 beyond the list).
    pub classes: Vec<u8>,
}

/// Turns worker `i`'s stage (engine A is engine 0 on input 0, B engine 1 on input 1) into
/// the stage the worker runs ([`LoopbackOpts::wrap`]).
#[derive(Clone)]
pub struct StageWrap(pub Arc<dyn Fn(usize, RdmaStage) -> StageBox + Send + Sync>);

impl StageWrap {
    pub fn new(f: impl Fn(usize, RdmaStage) -> StageBox + Send + Sync + 'static) -> StageWrap {
        StageWrap(Arc::new(f))
    }
}

impl std::fmt::Debug for StageWrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StageWrap(..)")
    }
}

impl LoopbackOpts {
    /// Both engines on `cores`, no faults, bursts of 32, a completion queue as deep as both of
    /// the queue pair's queues.
    pub fn new(qp: QpConfig, cores: [usize; 2]) -> LoopbackOpts {
        let cq_depth = qp.max_send_wr + qp.max_recv_wr;
        LoopbackOpts {
            qp,
            faults: None,
            cores,
            burst: 32,
            cq_depth,
            pcap: None,
            name: "rdma".into(),
            connections: 1,
            pin_psn: false,
            tags: None,
            tag_table: None,
            workers: Vec::new(),
            homes: Vec::new(),
            wrap: None,
            shaper: None,
            polling: Polling::Busy,
            cm: false,
            cm_response_timeout: 20,
        }
    }

    /// Both engines on N workers, one per core of `cores` (see [`LoopbackOpts::workers`]),
    /// with `connections` queue pairs homed round robin.
    pub fn multicore(qp: QpConfig, cores: &[usize], connections: usize) -> LoopbackOpts {
        let first = cores.first().copied().unwrap_or(0);
        LoopbackOpts {
            workers: cores.to_vec(),
            connections,
            ..LoopbackOpts::new(qp, [first, first])
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoopbackError {
    #[error(transparent)]
    Dpdk(#[from] DpdkError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("queue pair: {0}")]
    Qp(#[from] super::AddQpError),
    #[error("capture file: {0}")]
    Capture(std::io::Error),
    #[error("tagged messaging: {0}")]
    Tags(#[from] crate::lpe::LpeError),
    #[error("{0}")]
    Layout(String),
}

/// What the application holds of one end: the engine's control handle, the queue pair and
/// the completion queue.
pub struct LoopbackEnd {
    pub engine: RdmaHandle,
    pub qp: Qp,
    pub cq: Cq,
    /// The tag port, when [`LoopbackOpts::tags`] asked for tagged messaging: of worker 0's
    /// shard when [`LoopbackOpts::workers`] shards the engine.
    pub tags: Option<TagPort>,
    /// With `workers` and `tags`: the tag ports of workers 1.. (`more_tags[i - 1]` is worker
    /// *i*'s), each for the endpoints homed there.
    pub more_tags: Vec<TagPort>,
}

/// One end of a further connection: its queue pair and its own completion queue.
pub struct End {
    pub qp: Qp,
    pub cq: Cq,
}

/// A queue pair on engine A connected to one on engine B.
pub struct Connection {
    pub a: End,
    pub b: End,
}

/// The running pair: the workers, each end (with the first connection), and the further
/// connections.
pub struct LoopbackPair {
    pub runtime: Runtime,
    pub a: LoopbackEnd,
    pub b: LoopbackEnd,
    /// Connections 1.. ([`qpns`]), when `connections` asked for more than one.
    pub more: Vec<Connection>,
    /// The capture, when asked for: `finish()` it after the runtime has stopped.
    pub capture: Option<Arc<CaptureSink>>,
    /// Per connection (0 first): the home workers of its ends on A and on B (index into
    /// [`LoopbackOpts::workers`]; 0 for the other layouts).
    pub homes: Vec<[usize; 2]>,
    /// Per connection: the UDP source ports of its ends on A and on B.
    pub source_ports: Vec<[u16; 2]>,
    /// With [`LoopbackOpts::cm`]: each engine's CM events and the completion queue of the
    /// queue pairs its CM creates (A, then B).
    pub cm: Option<[(CmEvents, Cq); 2]>,
}

/// Completion queue entries of each engine's CM queue pairs (they share one).
pub const CM_CQ_DEPTH: usize = 16_384;

/// Starts the pair. EAL must be running.
pub fn start(opts: &LoopbackOpts) -> Result<LoopbackPair, LoopbackError> {
    let name = &opts.name;
    let sharded = !opts.workers.is_empty();
    let shards = opts.workers.len().max(1);
    if let Some(t) = &opts.tag_table
        && t.engines() != shards
    {
        return Err(LoopbackError::Layout(format!(
            "tag_table: {} engines for {shards} workers",
            t.engines()
        )));
    }
    let queues = u16::try_from(shards)
        .ok()
        .filter(|&q| q <= crate::dataplane::RING_MAX_QUEUES)
        .ok_or_else(|| {
            LoopbackError::Layout(format!(
                "{shards} workers: a ring port has at most {} queues",
                crate::dataplane::RING_MAX_QUEUES
            ))
        })?;
    let connections = opts.connections.max(1);
    let one_worker = !sharded && opts.cores[0] == opts.cores[1];
    if opts.shaper.is_some() && !one_worker {
        return Err(LoopbackError::Layout(
            "a shaper needs both engines on one worker".into(),
        ));
    }
    if opts.wrap.is_some() && !(one_worker || sharded) {
        return Err(LoopbackError::Layout(
            "a stage wrapper needs both engines on one worker".into(),
        ));
    }
    let homes: Vec<[usize; 2]> = (0..connections)
        .map(|c| opts.homes.get(c).copied().unwrap_or([c % shards; 2]))
        .collect();
    if let Some(bad) = homes.iter().flatten().find(|&&h| h >= shards) {
        return Err(LoopbackError::Layout(format!(
            "home worker {bad} of {shards}"
        )));
    }
    let pool = Arc::new(Mempool::new(
        &format!("{name}_loopback"),
        16383,
        256,
        crate::rdma::FRAME_DATA_ROOM,
        -1,
    )?);
    let (ia, ib) = ring_pair_queues(&format!("{name}_a"), &format!("{name}_b"), 4096, queues)?;
    let port_cfg = |mac: EthernetAddress| PortConfig {
        promiscuous: false,
        mac: Some(mac.0),
        rx_queues: queues,
        tx_queues: queues,
        ..PortConfig::default()
    };
    // RSS as a NIC would be set up; a ring port has none and keeps queue-to-queue delivery.
    let key = Some(&rss::MLX5_DEFAULT_KEY);
    let ports = [
        Port::start_rss(ia, &port_cfg(MAC_A), key, pool.clone())?.named("a"),
        Port::start_rss(ib, &port_cfg(MAC_B), key, pool.clone())?.named("b"),
    ];
    // How each port spreads what it receives: the peer of a queue pair picks its source port
    // for it.
    let rss_of = Rss::spread(queues);

    let mut nodes_a: Vec<RdmaNode> = (0..shards).map(|_| RdmaNode::new(MAC_A, IP_A)).collect();
    let mut nodes_b: Vec<RdmaNode> = (0..shards).map(|_| RdmaNode::new(MAC_B, IP_B)).collect();
    if let Some(sh) = &opts.shaper {
        for n in &mut nodes_b {
            n.set_shaper(sh.config.clone())
                .map_err(|e| LoopbackError::Layout(e.to_string()))?;
        }
    }
    // Each worker's shard holds the endpoints homed on it (all of them with one worker).
    let (mut tags_a, mut tags_b) = (Vec::new(), Vec::new());
    if let Some(t) = &opts.tags {
        for (i, homed) in t
            .sharded(opts.tag_table.as_ref(), shards)
            .iter()
            .enumerate()
        {
            tags_a.push(nodes_a[i].enable_tags(homed)?);
            tags_b.push(nodes_b[i].enable_tags(homed)?);
        }
    }
    let (mut tags_a, mut tags_b) = (tags_a.into_iter(), tags_b.into_iter());
    let (first_a, first_b) = (tags_a.next(), tags_b.next());
    let cm = opts.cm.then(|| {
        [
            (&mut nodes_a[0], MAC_A, IP_A),
            (&mut nodes_b[0], MAC_B, IP_B),
        ]
        .map(|(n, mac, ip)| {
            let cq = n.create_cq(CM_CQ_DEPTH);
            let mut qp = opts.qp.clone();
            (qp.local_mac, qp.local_ip) = (mac, ip);
            let mut setup = CmSetup::new(qp, cq.id(), cq.id());
            setup.cm.response_timeout = opts.cm_response_timeout;
            (n.enable_cm(setup), cq)
        })
    });
    let mut source_ports = Vec::with_capacity(connections);
    let mut connect = |i: usize| -> Result<Connection, LoopbackError> {
        let (qpn_a, qpn_b) = qpns(i);
        let [home_a, home_b] = homes[i];
        let mut qa = opts.qp.clone();
        qa.local_qpn = qpn_a;
        qa.remote_qpn = qpn_b;
        qa.remote_mac = MAC_B;
        qa.remote_ip = IP_B;
        qa.tag_rank = 0;
        if !opts.pin_psn {
            qa.send_psn = random_psn();
            qa.recv_psn = random_psn();
        }
        let mut qb = qa.mirrored();
        qb.tag_rank = 1;
        if let Some(sh) = &opts.shaper {
            qb.traffic_class = sh.classes.get(i).copied().unwrap_or(0);
        }
        qb.remote_mac = MAC_A;
        qb.remote_ip = IP_A;
        if queues > 1 {
            // Each end's packets must reach the other end's home queue.
            let port = |src, dst, queue, qpn: u32| {
                rss::source_port(&rss_of, src, dst, queue as u16, qpn as u16).ok_or_else(|| {
                    LoopbackError::Layout(format!("no UDP source port reaches queue {queue}"))
                })
            };
            qa.udp_src_port = port(IP_A, IP_B, home_b, qpn_a)?;
            qb.udp_src_port = port(IP_B, IP_A, home_a, qpn_b)?;
        }
        source_ports.push([qa.udp_src_port, qb.udp_src_port]);
        for (k, n) in nodes_a.iter_mut().enumerate() {
            if k != home_a {
                n.add_qp_homed_elsewhere(qpn_a);
            }
        }
        for (k, n) in nodes_b.iter_mut().enumerate() {
            if k != home_b {
                n.add_qp_homed_elsewhere(qpn_b);
            }
        }
        let (na, nb) = (&mut nodes_a[home_a], &mut nodes_b[home_b]);
        let cq_a = na.create_cq(opts.cq_depth);
        let cq_b = nb.create_cq(opts.cq_depth);
        Ok(Connection {
            a: End {
                qp: na.add_qp(qa, &cq_a, &cq_a)?,
                cq: cq_a,
            },
            b: End {
                qp: nb.add_qp(qb, &cq_b, &cq_b)?,
                cq: cq_b,
            },
        })
    };
    let first = connect(0)?;
    let more = (1..connections)
        .map(&mut connect)
        .collect::<Result<Vec<_>, _>>()?;

    let (ha, ports_a) = RdmaHandle::sharded(shards);
    let (hb, ports_b) = RdmaHandle::sharded(shards);
    let faults = |i: u64| {
        opts.faults.map(|f| {
            let f = FaultConfig {
                seed: f.seed + i,
                ..f
            };
            FaultInjector::new(&f, pool.clone())
        })
    };
    let queue = |p: &Port, q: u16| {
        (
            p.rx_queue(q).expect("fresh port"),
            (p.tx_queue(q).expect("fresh port"), TxPolicy::KeepUnsent),
        )
    };
    let capture = match &opts.pcap {
        Some(path) => Some(Arc::new(
            CaptureSink::create(
                path,
                &[(ports[0].id(), "a".into()), (ports[1].id(), "b".into())],
            )
            .map_err(LoopbackError::Capture)?,
        )),
        None => None,
    };
    let tap = || capture.as_ref().map(|s| WorkerCapture::new(s.clone()));
    let polling = polling::effective(opts.polling);
    let specs = if sharded || opts.cores[0] == opts.cores[1] {
        // Worker i serves queue i of both ports with shard i of both engines. One worker
        // without `workers`: both engines on one core, the other core is the application's.
        let cores = if sharded {
            opts.workers.clone()
        } else {
            vec![opts.cores[0]]
        };
        let shard_ports = ports_a.into_iter().zip(ports_b);
        let mut specs = Vec::with_capacity(shards);
        for (i, ((node_a, node_b), (ca, cb))) in nodes_a
            .into_iter()
            .zip(nodes_b)
            .zip(shard_ports)
            .enumerate()
        {
            let (rx_a, tx_a) = queue(&ports[0], i as u16);
            let (rx_b, tx_b) = queue(&ports[1], i as u16);
            let stage = RdmaStage::new(node_a, pool.clone(), ca, 0).with_engine(node_b, cb, 1);
            let stage = match &opts.wrap {
                Some(w) => (w.0)(i, stage),
                None => StageBox::new(stage),
            };
            specs.push(WorkerSpec {
                name: if sharded {
                    format!("{name}{i}")
                } else {
                    name.clone()
                },
                core: Some(cores[i]),
                rx: vec![rx_a, rx_b],
                tx: vec![tx_a, tx_b],
                burst: opts.burst,
                stage,
                faults: faults(i as u64),
                capture: tap(),
                polling,
            });
        }
        specs
    } else {
        let (rx_a, tx_a) = queue(&ports[0], 0);
        let (rx_b, tx_b) = queue(&ports[1], 0);
        let (node_a, node_b) = (nodes_a.remove(0), nodes_b.remove(0));
        let (ca, cb) = (
            ports_a.into_iter().next().expect("one shard"),
            ports_b.into_iter().next().expect("one shard"),
        );
        vec![
            WorkerSpec {
                name: format!("{name}_a"),
                core: Some(opts.cores[0]),
                rx: vec![rx_a],
                tx: vec![tx_a],
                burst: opts.burst,
                stage: StageBox::new(RdmaStage::new(node_a, pool.clone(), ca, 0)),
                faults: faults(0),
                capture: tap(),
                polling,
            },
            WorkerSpec {
                name: format!("{name}_b"),
                core: Some(opts.cores[1]),
                rx: vec![rx_b],
                tx: vec![tx_b],
                burst: opts.burst,
                stage: StageBox::new(RdmaStage::new(node_b, pool.clone(), cb, 0)),
                faults: faults(1),
                capture: tap(),
                polling,
            },
        ]
    };
    let runtime = Runtime::start(specs)?;
    Ok(LoopbackPair {
        runtime,
        a: LoopbackEnd {
            engine: ha,
            qp: first.a.qp,
            cq: first.a.cq,
            tags: first_a,
            more_tags: tags_a.collect(),
        },
        b: LoopbackEnd {
            engine: hb,
            qp: first.b.qp,
            cq: first.b.cq,
            tags: first_b,
            more_tags: tags_b.collect(),
        },
        more,
        capture,
        homes,
        source_ports,
        cm,
    })
}
