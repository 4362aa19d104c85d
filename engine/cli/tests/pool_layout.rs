//! Mbuf pool layouts on real EAL without hugepages (4 KiB pages): DPDK's default puts every
//! mbuf at the start of a page of its own (the cause of the slow `--no-huge` forwarding in
//! docs/dataplane.md); the packed layout puts them back to back, across page boundaries, and
//! such buffers still carry packets intact through a CPU-only driver (`net_ring`).

use std::collections::BTreeSet;
use std::sync::Arc;

use portico::dataplane::{Burst, Eal, Mempool, PoolLayout, Port, PortConfig, PortInfo, ring_pair};
use portico::traffic::frame::{self, FrameSpec};

const PAGE: usize = 4096;

/// Offsets within their 4 KiB page of the data of `n` mbufs taken from `pool`.
fn page_offsets(pool: &Mempool, n: usize) -> BTreeSet<usize> {
    let mut b = Burst::new();
    assert!(b.alloc(pool, n));
    b.as_slice()
        .iter()
        .map(|m| m.data().as_ptr() as usize % PAGE)
        .collect()
}

#[test]
fn packed_pools_spread_mbufs_over_pages_and_carry_packets_intact() {
    let args: Vec<String> = [
        "--no-huge",
        "-m",
        "256",
        "--no-shconf",
        "--no-pci",
        "-l",
        "0",
        "--log-level=lib.eal:error",
    ]
    .map(String::from)
    .to_vec();
    Eal::init(&args).expect("EAL starts");

    assert_eq!(
        PoolLayout::for_drivers(["net_null", "net_ring"]),
        PoolLayout::Packed
    );
    assert_eq!(
        PoolLayout::for_drivers(["net_ring", "net_ixgbe"]),
        PoolLayout::PageAligned,
        "one driver that may DMA keeps the default"
    );
    assert_eq!(PoolLayout::for_drivers([]), PoolLayout::PageAligned);

    let aligned = Mempool::with_layout("lay_a", 1023, 0, 2176, -1, PoolLayout::PageAligned)
        .expect("default pool");
    assert_eq!(
        page_offsets(&aligned, 256).len(),
        1,
        "DPDK's default under --no-huge: every mbuf at the same offset of its own page"
    );
    let packed = Arc::new(
        Mempool::with_layout("lay_p", 1023, 0, 2176, -1, PoolLayout::Packed).expect("packed"),
    );
    // 2368-byte objects back to back: the offsets step by 2368 modulo 4096, which reaches
    // 64 different values (every multiple of 64).
    assert_eq!(
        page_offsets(&packed, 256).len(),
        64,
        "packed: mbufs at every cache-line offset of a page"
    );
    let base = packed.in_use();

    // 1500-byte frames from the packed pool cross net_ring intact, some of them across a
    // page boundary.
    let (a, b) = ring_pair("lay_a", "lay_b", 512).unwrap();
    // Ring links of a scenario are such ports: their driver is on the CPU-only list.
    assert_eq!(PortInfo::read(a).unwrap().driver, "net_ring");
    let cfg = PortConfig {
        rx_desc: 256,
        tx_desc: 256,
        ..PortConfig::default()
    };
    let pa = Port::start(a, &cfg, packed.clone()).unwrap();
    let pb = Port::start(b, &cfg, packed.clone()).unwrap();
    let (mut txq, mut rxq) = (pa.tx_queue(0).unwrap(), pb.rx_queue(0).unwrap());
    let spec = FrameSpec {
        frame_size: 1500,
        ..FrameSpec::default()
    };
    let mut out = Burst::new();
    assert!(out.alloc(&packed, 200));
    let mut straddling = 0;
    for (seq, m) in out.as_mut_slice().iter_mut().enumerate() {
        let data = m.append(spec.buffer_len() as u16).unwrap();
        frame::write_template(&spec, data);
        frame::stamp(data, seq as u64);
        if data.as_ptr() as usize % PAGE + data.len() > PAGE {
            straddling += 1;
        }
    }
    assert!(straddling > 0, "some frames cross a page boundary");
    let bytes = out.bytes();
    assert_eq!(out.tx(&mut txq), (200, bytes));
    let mut got = Burst::new();
    assert_eq!(got.rx(&mut rxq, 256), 200);
    assert_eq!(got.bytes(), bytes);
    for (i, m) in got.as_slice().iter().enumerate() {
        let r = frame::verify(m.data()).expect("frame intact");
        assert_eq!(r.seq, i as u64);
    }
    drop(got);
    assert_eq!(packed.in_use(), base, "every mbuf went back");
}
