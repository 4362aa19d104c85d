//! Two RDMA engines in one process, joined back to back by a `net_ring` link, on one pinned
//! worker or two: the set-up behind `portico bench`, the example program and the RDMA tests.
//! The first connection's ends have one queue pair and one completion queue each (for their
//! sends and their receives); further connections, when asked for, each have their own. A
//! process can start several pairs under different names.

use std::net::Ipv4Addr;
use std::sync::Arc;

use super::{Cq, Qp, RdmaHandle, RdmaNode, RdmaStage, TagConfig, TagPort};
use crate::dataplane::{DpdkError, Mempool, Port, PortConfig, ring_pair};
use crate::runtime::{
    CaptureSink, CaptureTap, FaultConfig, FaultInjector, Runtime, RuntimeError, StageBox, TxPolicy,
    WorkerSpec,
};
use crate::transport::{QpConfig, random_psn};
use crate::wire::EthernetAddress;

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
    /// endpoints); set `qp.tagged` too for tagged queue pairs. A's rank is 0, B's 1.
    pub tags: Option<TagConfig>,
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
}

/// What the application holds of one end: the engine's control handle, the queue pair and
/// the completion queue.
pub struct LoopbackEnd {
    pub engine: RdmaHandle,
    pub qp: Qp,
    pub cq: Cq,
    /// The tag port, when [`LoopbackOpts::tags`] asked for tagged messaging.
    pub tags: Option<TagPort>,
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
}

/// Starts the pair. EAL must be running.
pub fn start(opts: &LoopbackOpts) -> Result<LoopbackPair, LoopbackError> {
    let name = &opts.name;
    let pool = Arc::new(Mempool::new(
        &format!("{name}_loopback"),
        16383,
        256,
        crate::rdma::FRAME_DATA_ROOM,
        -1,
    )?);
    let (ia, ib) = ring_pair(&format!("{name}_a"), &format!("{name}_b"), 4096)?;
    let port_cfg = |mac: EthernetAddress| PortConfig {
        promiscuous: false,
        mac: Some(mac.0),
        ..PortConfig::default()
    };
    let ports = [
        Port::start(ia, &port_cfg(MAC_A), pool.clone())?.named("a"),
        Port::start(ib, &port_cfg(MAC_B), pool.clone())?.named("b"),
    ];

    let mut node_a = RdmaNode::new(MAC_A, IP_A);
    let mut node_b = RdmaNode::new(MAC_B, IP_B);
    let (tags_a, tags_b) = match &opts.tags {
        Some(t) => (Some(node_a.enable_tags(t)?), Some(node_b.enable_tags(t)?)),
        None => (None, None),
    };
    let mut connect = |i: usize| -> Result<Connection, LoopbackError> {
        let (qpn_a, qpn_b) = qpns(i);
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
        qb.remote_mac = MAC_A;
        qb.remote_ip = IP_A;
        let cq_a = node_a.create_cq(opts.cq_depth);
        let cq_b = node_b.create_cq(opts.cq_depth);
        Ok(Connection {
            a: End {
                qp: node_a.add_qp(qa, &cq_a, &cq_a)?,
                cq: cq_a,
            },
            b: End {
                qp: node_b.add_qp(qb, &cq_b, &cq_b)?,
                cq: cq_b,
            },
        })
    };
    let first = connect(0)?;
    let more = (1..opts.connections.max(1))
        .map(&mut connect)
        .collect::<Result<Vec<_>, _>>()?;

    let (ha, ca) = RdmaHandle::new();
    let (hb, cb) = RdmaHandle::new();
    let faults = |i: u64| {
        opts.faults.map(|f| {
            let f = FaultConfig {
                seed: f.seed + i,
                ..f
            };
            FaultInjector::new(&f, pool.clone())
        })
    };
    let queues = |p: &Port| {
        (
            p.rx_queue(0).expect("fresh port"),
            (p.tx_queue(0).expect("fresh port"), TxPolicy::KeepUnsent),
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
    let tap = || capture.as_ref().map(|s| CaptureTap::new(s.clone()));
    let (rx_a, tx_a) = queues(&ports[0]);
    let (rx_b, tx_b) = queues(&ports[1]);
    let specs = if opts.cores[0] == opts.cores[1] {
        // Both engines on one core; on a 2-core machine the other core is the application's.
        let stage = RdmaStage::new(node_a, pool.clone(), ca, 0).with_engine(node_b, cb, 1);
        vec![WorkerSpec {
            name: name.clone(),
            core: Some(opts.cores[0]),
            rx: vec![rx_a, rx_b],
            tx: vec![tx_a, tx_b],
            burst: opts.burst,
            stage: StageBox::new(stage),
            faults: faults(0),
            capture: tap(),
        }]
    } else {
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
            tags: tags_a,
        },
        b: LoopbackEnd {
            engine: hb,
            qp: first.b.qp,
            cq: first.b.cq,
            tags: tags_b,
        },
        more,
        capture,
    })
}
