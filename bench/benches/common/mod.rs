//! The two in-memory engines the RoCEv2 benchmarks drive (`roce` with criterion, `roce_count`
//! under callgrind).

use std::net::Ipv4Addr;
use std::sync::Arc;

use pmem::Mapping;
use portico::rdma::{Cq, Qp, RdmaNode};
use portico::transport::{Access, MrKeys, Mtu, QpConfig, SgList, WorkCompletion, WorkRequest};
use portico::wire::EthernetAddress;

const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xa]);
const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0xb]);
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);
const REGION: usize = 1 << 20;

/// Two engines joined in memory, one queue pair each, A's source and B's target registered.
pub struct Pair {
    a: RdmaNode,
    b: RdmaNode,
    qp: Qp,
    cq: Cq,
    _b_cq: Cq,
    src: MrKeys,
    dst: MrKeys,
    buf: Vec<u8>,
    wcs: [WorkCompletion; 64],
    now: u64,
}

pub fn pair() -> Pair {
    let mut a = RdmaNode::new(MAC_A, IP_A);
    let mut b = RdmaNode::new(MAC_B, IP_B);
    let mut cfg = QpConfig::new(0x11, 0x22);
    cfg.remote_mac = MAC_B;
    cfg.remote_ip = IP_B;
    cfg.pmtu = Mtu::M4096;
    cfg.max_send_wr = 64;
    cfg.max_recv_wr = 64;
    let mut cfg_b = cfg.mirrored();
    cfg_b.remote_mac = MAC_A;
    cfg_b.remote_ip = IP_A;
    let cq = a.create_cq(256);
    let b_cq = b.create_cq(256);
    let qp = a.add_qp(cfg, &cq, &cq).expect("queue pair A");
    b.add_qp(cfg_b, &b_cq, &b_cq).expect("queue pair B");
    let map = |fill: u8| {
        let m = Arc::new(Mapping::anonymous(REGION).expect("memory"));
        m.write(0, &vec![fill; REGION]).expect("inside");
        m
    };
    let src = a
        .mem
        .register_iova(map(0xa5), 0, REGION, 0x7f00_0000_0000, Access::ALL)
        .expect("A registers");
    let dst = b
        .mem
        .register_iova(map(0), 0, REGION, 0x7f10_0000_0000, Access::ALL)
        .expect("B registers");
    Pair {
        a,
        b,
        qp,
        cq,
        _b_cq: b_cq,
        src,
        dst,
        buf: vec![0; 16384],
        wcs: [WorkCompletion::EMPTY; 64],
        now: 0,
    }
}

impl Pair {
    /// 32 WRITEs of `size` bytes, built once (outside the measured loop).
    pub fn requests(&self, size: u32) -> Vec<WorkRequest> {
        (0..32u64)
            .map(|i| {
                WorkRequest::write(
                    i,
                    SgList::one(self.src.lkey, 0x7f00_0000_0000 + i * 8192, size),
                    0x7f10_0000_0000 + i * 8192,
                    self.dst.rkey,
                    None,
                )
            })
            .collect()
    }

    /// 32 READs of `size` bytes of B's region into A's, built once (`roce_count`'s `read64`).
    #[allow(dead_code)] // Not used by the criterion benchmark, which includes this module too.
    pub fn read_requests(&self, size: u32) -> Vec<WorkRequest> {
        (0..32u64)
            .map(|i| {
                WorkRequest::read(
                    i,
                    SgList::one(self.src.lkey, 0x7f00_0000_0000 + i * 8192, size),
                    0x7f10_0000_0000 + i * 8192,
                    self.dst.rkey,
                )
            })
            .collect()
    }

    /// Posts `wrs` and runs both engines until A has their completions.
    pub fn writes(&mut self, wrs: &[WorkRequest]) {
        let n = wrs.len();
        self.qp.post_send(wrs).expect("room");
        let mut done = 0;
        while done < n {
            self.now += 1_000;
            self.a.service(self.now);
            while let Some(tx) = &self.a.poll_transmit(self.now) {
                let len = self.a.emit(tx, &mut self.buf).expect("emits");
                self.b.receive(self.now, &self.buf[..len]);
            }
            self.b.service(self.now);
            while let Some(tx) = &self.b.poll_transmit(self.now) {
                let len = self.b.emit(tx, &mut self.buf).expect("emits");
                self.a.receive(self.now, &self.buf[..len]);
            }
            self.a.flush_completions();
            done += self.cq.poll(&mut self.wcs);
        }
    }

    /// The frame A sends for one WRITE of `size` bytes (B does not see it).
    pub fn write_frame(&mut self, size: u32) -> Vec<u8> {
        let wr = WorkRequest::write(
            0,
            SgList::one(self.src.lkey, 0x7f00_0000_0000, size),
            0x7f10_0000_0000,
            self.dst.rkey,
            None,
        );
        self.qp.post_send(&[wr]).expect("room");
        self.now += 1_000;
        self.a.service(self.now);
        let tx = self.a.poll_transmit(self.now).expect("a frame");
        let len = self.a.emit(&tx, &mut self.buf).expect("emits");
        self.buf[..len].to_vec()
    }
}
