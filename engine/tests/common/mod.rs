//! Shared set-up for the RDMA tests on real EAL: `portico::rdma::loopback` (two engines on a
//! `net_ring` link in one process) after starting EAL without hugepages.

use portico::dataplane::Eal;
use portico::rdma::loopback::{self, LoopbackOpts};
use portico::runtime::FaultConfig;
use portico::transport::QpConfig;

pub use portico::rdma::loopback::{LoopbackPair as Pair, QPN_A, QPN_B};

/// Starts EAL and the two engines; `faults` applies to both receive paths.
pub fn start(qp: QpConfig, faults: Option<FaultConfig>) -> Pair {
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
    let cores = portico::app::available_cores();
    Eal::init(&args).expect("EAL starts");
    let opts = LoopbackOpts {
        qp,
        faults,
        cores: [cores[0], *cores.last().unwrap()],
        burst: 32,
        pcap: None,
    };
    loopback::start(&opts).expect("two engines start")
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
