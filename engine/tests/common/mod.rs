//! Shared set-up for the RDMA tests on real EAL, started without hugepages:
//!
//! - [`start`]: `portico::rdma::loopback`, two engines on a `net_ring` link in one process,
//!   one queue pair and one completion queue per end (what `portico bench` runs);
//! - [`start_connections`]: a second, independent pair of engines (its own link, pool and
//!   worker) joined by several queue pairs, each end of each with its own completion queue.
//!   Errors that end a connection (a NAK for a bad rkey ends both of its queue pairs, a bad
//!   local buffer ends one) each get a connection of their own there.
//!
//! One EAL per process: every test binary that uses these holds a single test function.
#![allow(dead_code, unused_imports)] // Each test binary uses part of this module.

use std::sync::{Arc, OnceLock};

use portico::dataplane::{Eal, Mempool, Port, PortConfig, ring_pair};
use portico::rdma::loopback::{self, IP_A, IP_B, LoopbackOpts, MAC_A, MAC_B};
use portico::rdma::{Cq, Qp, RdmaHandle, RdmaNode, RdmaStage};
use portico::runtime::{FaultConfig, Runtime, StageBox, TxPolicy, WorkerSpec};
use portico::transport::{QpConfig, WcStatus, WorkCompletion};

pub use portico::rdma::loopback::{LoopbackPair as Pair, QPN_A, QPN_B};

static CORES: OnceLock<Vec<usize>> = OnceLock::new();

/// The cores this process may use, as they were before EAL pinned the calling thread to its
/// main lcore (after that the thread sees only that one).
pub fn cores() -> &'static [usize] {
    CORES.get_or_init(portico::app::available_cores)
}

/// Starts EAL without hugepages on core 0; returns the cores the process may use.
pub fn start_eal() -> &'static [usize] {
    let args: Vec<String> = [
        "--no-huge",
        "-m",
        "512",
        "--no-shconf",
        "--no-pci",
        "-l",
        "0",
        "--log-level=lib.eal:error",
    ]
    .map(String::from)
    .to_vec();
    // Before EAL starts: EAL pins the calling thread to its main lcore.
    let cores = cores();
    Eal::init(&args).expect("EAL starts");
    cores
}

/// Starts EAL and the two engines of `portico::rdma::loopback`, A on the first core and B on
/// the last; `faults` applies to both receive paths.
pub fn start(qp: QpConfig, faults: Option<FaultConfig>) -> Pair {
    let cores = start_eal();
    let mut opts = LoopbackOpts::new(qp, [cores[0], *cores.last().unwrap()]);
    opts.faults = faults;
    loopback::start(&opts).expect("two engines start")
}

/// One end of one connection: its queue pair and its own completion queue.
pub struct End {
    pub qp: Qp,
    pub cq: Cq,
}

/// A queue pair on engine A connected to one on engine B.
pub struct Connection {
    pub a: End,
    pub b: End,
}

/// Two engines on one worker, joined by several connections.
pub struct Engines {
    pub runtime: Runtime,
    pub a: RdmaHandle,
    pub b: RdmaHandle,
    pub conns: Vec<Connection>,
}

/// QP numbers of connection `i` on A and on B.
pub fn conn_qpns(i: usize) -> (u32, u32) {
    (0x100 + i as u32, 0x200 + i as u32)
}

/// Starts two more engines (EAL must be running) on their own `net_ring` link named after
/// `name`, both on one worker pinned to `core`, joined by `connections` queue pairs set up
/// from `qp` (QPNs from [`conn_qpns`]).
pub fn start_connections(name: &str, qp: QpConfig, connections: usize, core: usize) -> Engines {
    let pool = Arc::new(
        Mempool::new(
            &format!("{name}_pool"),
            4095,
            256,
            portico::rdma::FRAME_DATA_ROOM,
            -1,
        )
        .expect("a pool for the second pair"),
    );
    let (ia, ib) = ring_pair(&format!("{name}_a"), &format!("{name}_b"), 1024).expect("a link");
    let port_a = Port::start(ia, &PortConfig::default(), pool.clone()).expect("port A starts");
    let port_b = Port::start(ib, &PortConfig::default(), pool.clone()).expect("port B starts");
    let mut node_a = RdmaNode::new(MAC_A, IP_A);
    let mut node_b = RdmaNode::new(MAC_B, IP_B);
    let depth = qp.max_send_wr + qp.max_recv_wr;
    let conns = (0..connections)
        .map(|i| {
            let (qpn_a, qpn_b) = conn_qpns(i);
            let mut qa = qp.clone();
            qa.local_qpn = qpn_a;
            qa.remote_qpn = qpn_b;
            qa.remote_mac = MAC_B;
            qa.remote_ip = IP_B;
            let mut qb = qa.mirrored();
            qb.remote_mac = MAC_A;
            qb.remote_ip = IP_A;
            let cq_a = node_a.create_cq(depth);
            let cq_b = node_b.create_cq(depth);
            Connection {
                a: End {
                    qp: node_a.add_qp(qa, &cq_a, &cq_a).expect("a queue pair on A"),
                    cq: cq_a,
                },
                b: End {
                    qp: node_b.add_qp(qb, &cq_b, &cq_b).expect("a queue pair on B"),
                    cq: cq_b,
                },
            }
        })
        .collect();
    let (ha, ca) = RdmaHandle::new();
    let (hb, cb) = RdmaHandle::new();
    let stage = RdmaStage::new(node_a, pool.clone(), ca, 0).with_engine(node_b, cb, 1);
    let runtime = Runtime::start(vec![WorkerSpec {
        name: name.into(),
        core: Some(core),
        rx: vec![port_a.rx_queue(0).unwrap(), port_b.rx_queue(0).unwrap()],
        tx: vec![
            (port_a.tx_queue(0).unwrap(), TxPolicy::KeepUnsent),
            (port_b.tx_queue(0).unwrap(), TxPolicy::KeepUnsent),
        ],
        burst: 32,
        stage: StageBox::new(stage),
        faults: None,
        capture: None,
    }])
    .expect("the second pair's worker starts");
    Engines {
        runtime,
        a: ha,
        b: hb,
        conns,
    }
}

/// Waits for exactly `n` completions on `cq` (each within `wait`), then checks that no
/// further completion arrives for a short while.
pub fn completions(cq: &mut Cq, n: usize, wait: std::time::Duration) -> Vec<WorkCompletion> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        match cq.wait_one(wait) {
            Some(wc) => got.push(wc),
            None => panic!("{} of {n} completions within {wait:?}: {got:?}", got.len()),
        }
    }
    let extra = cq.wait_one(std::time::Duration::from_millis(50));
    assert_eq!(extra, None, "no completion beyond the {n} expected");
    got
}

/// (wr_id, status) of each completion, in order.
pub fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|wc| (wc.wr_id, wc.status)).collect()
}

/// Deterministic test data.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
