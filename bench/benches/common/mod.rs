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
    pair_with(|_| {})
}

/// [`pair`] with A's queue pair configured further by `tweak` (B's mirrors it).
pub fn pair_with(tweak: impl FnOnce(&mut QpConfig)) -> Pair {
    let mut a = RdmaNode::new(MAC_A, IP_A);
    let mut b = RdmaNode::new(MAC_B, IP_B);
    let mut cfg = QpConfig::new(0x11, 0x22);
    cfg.remote_mac = MAC_B;
    cfg.remote_ip = IP_B;
    cfg.pmtu = Mtu::M4096;
    cfg.max_send_wr = 64;
    cfg.max_recv_wr = 64;
    tweak(&mut cfg);
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
            self.exchange();
            done += self.cq.poll(&mut self.wcs);
        }
    }

    /// One iteration of both engines: A's packets carried to B, then B's to A, and A's
    /// completions published.
    #[inline(always)]
    fn exchange(&mut self) {
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

/// Two engines with tagged messaging between them (`roce_count`'s `tagged8` cases): B's host
/// keeps `depth` use-once receives posted, A sends 8 B tagged messages to them.
#[allow(dead_code)] // Not used by the criterion benchmark, which includes this module too.
pub struct TaggedPair {
    pair: Pair,
    port: portico::rdma::TagPort,
    depth: u64,
    /// Which receive each send aims at: a fixed random order, 32 distinct in each window of 32.
    order: Vec<u64>,
    next: usize,
    events: [portico::rdma::TagEvent; 64],
    batch: Vec<WorkRequest>,
}

/// The receive `k` of a [`TaggedPair`]: its tag, and 64 bytes of B's region.
#[allow(dead_code)]
fn tagged_receive(p: &Pair, k: u64) -> portico::rdma::TagEntry {
    let buf = portico::transport::Sge {
        addr: p.dst.addr + k * 64,
        len: 64,
        lkey: p.dst.lkey,
    };
    portico::rdma::TagEntry::recv(k, buf, k).from_rank(0)
}

#[allow(dead_code)]
pub fn tagged_pair(depth: u64) -> TaggedPair {
    use portico::lpe::ListKind;
    let mut pair = pair_with(|cfg| cfg.tagged = true);
    // As `portico bench tagged` configures its target.
    let tags = portico_bench::tagged::target_tags();
    pair.a.enable_tags(&tags).expect("A's tags");
    let mut port = pair.b.enable_tags(&tags).expect("B's tags");
    for k in 0..depth {
        port.append(0, ListKind::Priority, tagged_receive(&pair, k))
            .expect("room");
    }
    pair.now += 1_000;
    pair.b.service(pair.now);
    // Windows of 32 distinct receives drawn at random, none from the window before: a
    // receive's new post is served by B's next `service`, which comes after the next round's
    // messages arrive, so a message must not aim at a receive of the round before.
    let mut order: Vec<u64> = Vec::new();
    let mut seed = 7u64;
    while order.len() < 32 * 1024 {
        let previous = order.len().saturating_sub(32);
        let mut window: Vec<u64> = Vec::with_capacity(32);
        while window.len() < 32 {
            seed += 1;
            let k = portico::rng::splitmix64(seed) % depth;
            if !window.contains(&k) && !order[previous..].contains(&k) {
                window.push(k);
            }
        }
        order.extend(window);
    }
    TaggedPair {
        pair,
        port,
        depth,
        order,
        next: 0,
        events: [portico::rdma::TagEvent::EMPTY; 64],
        batch: Vec::with_capacity(32),
    }
}

#[allow(dead_code)]
impl TaggedPair {
    /// `n` (at most 32) tagged sends, run until A has their completions and B's host has
    /// their put events and has posted their receives again; returns the puts.
    pub fn round(&mut self, n: usize) -> usize {
        use portico::lpe::ListKind;
        use portico::rdma::TagEventKind;
        self.batch.clear();
        for _ in 0..n {
            let k = self.order[self.next % self.order.len()];
            self.next += 1;
            let sgl = SgList::one(self.pair.src.lkey, self.pair.src.addr + k * 64, 8);
            self.batch.push(WorkRequest::tagged_send(k, sgl, 0, k, 0));
        }
        self.pair.qp.post_send(&self.batch).expect("room");
        let (mut done, mut puts) = (0, 0);
        while done < n || puts < n {
            let p = &mut self.pair;
            p.exchange();
            p.b.publish_tag_events();
            done += p.cq.poll(&mut p.wcs);
            let got = self.port.poll(&mut self.events);
            for e in &self.events[..got] {
                assert_eq!(e.kind, TagEventKind::Put, "{e:?}");
                assert!(e.cookie < self.depth);
                let entry = tagged_receive(p, e.cookie);
                self.port
                    .append(0, ListKind::Priority, entry)
                    .expect("room");
                puts += 1;
            }
        }
        puts
    }
}
