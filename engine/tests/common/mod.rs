//! Shared set-up for the RDMA tests on real EAL: two RDMA engines on two `net_ring` ports
//! joined back to back in one process, each on its own pinned worker.

use std::net::Ipv4Addr;
use std::sync::Arc;

use portico::dataplane::{Eal, Mempool, Port, PortConfig, ring_pair};
use portico::rdma::{RdmaHandle, RdmaNode, RdmaStage};
use portico::runtime::{FaultConfig, FaultInjector, Runtime, StageBox, TxPolicy, WorkerSpec};
use portico::transport::QpConfig;
use portico::wire::EthernetAddress;

pub const QPN_A: u32 = 0x11;
pub const QPN_B: u32 = 0x22;

pub struct Pair {
    pub runtime: Runtime,
    pub a: RdmaHandle,
    pub b: RdmaHandle,
}

/// Starts EAL (no hugepages) and two engines; `faults` applies to both receive paths.
pub fn start(cfg: QpConfig, faults: Option<FaultConfig>) -> Pair {
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
    Eal::init(&args).expect("EAL starts");
    let pool = Arc::new(Mempool::new("rdma_pool", 16383, 256, 2176 + 4096, -1).expect("pool"));
    let (ia, ib) = ring_pair("rdma_a", "rdma_b", 4096).expect("ring pair");
    let port_cfg = PortConfig::default();
    let pa = Port::start(ia, &port_cfg, pool.clone()).expect("port a");
    let pb = Port::start(ib, &port_cfg, pool.clone()).expect("port b");

    let mac_a = EthernetAddress([2, 0, 0, 0, 0, 0xa]);
    let mac_b = EthernetAddress([2, 0, 0, 0, 0, 0xb]);
    let (ip_a, ip_b) = (Ipv4Addr::new(10, 9, 0, 1), Ipv4Addr::new(10, 9, 0, 2));
    let mut qa = cfg;
    qa.local_qpn = QPN_A;
    qa.remote_qpn = QPN_B;
    qa.remote_mac = mac_b;
    qa.remote_ip = ip_b;
    let mut qb = qa.mirrored();
    qb.remote_mac = mac_a;
    qb.remote_ip = ip_a;

    let mut node_a = RdmaNode::new(mac_a, ip_a, 65536);
    node_a.add_qp(qa).expect("qp a");
    let mut node_b = RdmaNode::new(mac_b, ip_b, 65536);
    node_b.add_qp(qb).expect("qp b");

    let cores = portico::app::available_cores();
    let mut specs = Vec::new();
    let mut handles = Vec::new();
    for (i, (node, port)) in [(node_a, &pa), (node_b, &pb)].into_iter().enumerate() {
        let (handle, commands, events) = RdmaHandle::new();
        handles.push(handle);
        specs.push(WorkerSpec {
            name: format!("rdma{i}"),
            core: Some(cores[i % cores.len()]),
            rx: vec![port.rx_queue(0).unwrap()],
            tx: vec![(port.tx_queue(0).unwrap(), TxPolicy::KeepUnsent)],
            burst: 32,
            stage: StageBox::new(RdmaStage::new(node, pool.clone(), commands, events, 0)),
            faults: faults.map(|f| {
                FaultInjector::new(
                    &FaultConfig {
                        seed: f.seed + i as u64,
                        ..f
                    },
                    pool.clone(),
                )
            }),
            capture: None,
        });
    }
    let runtime = Runtime::start(specs).expect("workers start");
    let b = handles.pop().unwrap();
    let a = handles.pop().unwrap();
    Pair { runtime, a, b }
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
