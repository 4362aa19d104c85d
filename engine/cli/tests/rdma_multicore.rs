//! An RDMA engine on two workers, on real EAL: both engines of `rdma::loopback` run as two
//! shards each, worker *i* serving RX/TX queue *i* of both `net_ring` ports and the queue pairs
//! homed on it (four connections, two per worker).
//!
//! - WRITEs and READs of 1 B to 4000 B on every queue pair, one at a time per queue pair (so
//!   that every packet is accounted for: a WRITE of *p* packets is *p* requests and one ACK, a
//!   READ one request and *p* responses), every byte read back and compared, and the target
//!   region compared too. The regions are registered once per engine and used by the queue
//!   pairs of both workers (the registration reaches every shard's table).
//! - Exact per-worker counters: each worker delivered exactly the packets of its own queue
//!   pairs' operations, which is also what its RX queues received (the ports' per-queue
//!   counters), and nothing arrived at the wrong worker (`wrong_core` 0, `unknown_qp` 0).
//! - Each end's UDP source port is one that the peer's RSS (mlx5's key, two queues) sends to
//!   the peer end's home queue.
//! - Then a misconfigured pair: a connection whose ends are homed on different workers. A's
//!   packets arrive on B's queue 0, whose worker does not hold B's queue pair: each is dropped
//!   and counted as `wrong_core` (the first send and its two retransmissions), nothing is
//!   placed, and the WRITE fails with `RetryExceeded`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{pattern, start_eal};
use pmem::Mapping;
use portico::dataplane::{self, PortInfo};
use portico::rdma::loopback::{self, IP_A, IP_B, LoopbackOpts};
use portico::runtime::WorkerReport;
use portico::transport::{Access, Mtu, QpConfig, WcOpcode, WcStatus, WorkRequest};
use portico::wire::rss::Rss;

/// Operations (a WRITE and a READ each) per queue pair on worker 0 and on worker 1: different,
/// so that a worker counting the other's packets cannot match by chance.
const OPS: [usize; 2] = [5, 8];
/// Message sizes, in turn: one packet up to four at MTU 1024.
const SIZES: [usize; 5] = [1, 1000, 1024, 1025, 4000];
/// Each connection's share of every region.
const SLOT: usize = 64 << 10;
const WAIT: Duration = Duration::from_secs(10);

fn counter(r: &WorkerReport, name: &str) -> u64 {
    r.counter(name)
        .unwrap_or_else(|| panic!("{name} not counted"))
}

/// Packets on the wire for one WRITE and one READ of `len` bytes at MTU 1024.
fn packets(len: usize) -> u64 {
    let p = len.div_ceil(1024).max(1) as u64;
    (p + 1) + (1 + p)
}

/// The port named `net_ring_<name>_<end>`'s packets received on RX queue `q`.
fn rx_queue_packets(name: &str, end: &str, q: usize) -> u64 {
    let suffix = format!("{name}_{end}");
    let id = dataplane::port_ids()
        .into_iter()
        .find(|&id| PortInfo::read(id).is_ok_and(|p| p.name.ends_with(&suffix)))
        .expect("the ring port");
    let key = format!("rx_q{q}_packets");
    dataplane::port_xstats(id)
        .expect("xstats")
        .into_iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no {key} on {suffix}"))
}

#[test]
fn two_workers_each_serve_only_their_own_queue_pairs() {
    let cores = start_eal();
    // On a 2-core machine worker 0 shares core 0 with this thread: slower, equally correct.
    let workers = [cores[0], *cores.last().unwrap()];
    let mut qp = QpConfig::new(0, 0);
    qp.pmtu = Mtu::M1024;
    // Nothing is lost on a ring: a timer that never fires keeps the packet counts exact.
    qp.timeout_ns = 2_000_000_000;
    qp.max_timeout_ns = qp.timeout_ns;
    let mut opts = LoopbackOpts::multicore(qp.clone(), &workers, 4);
    opts.name = "mc".into();
    let mut pair = loopback::start(&opts).expect("the engines start on two workers");
    assert_eq!(pair.homes, [[0, 0], [1, 1], [0, 0], [1, 1]], "round robin");
    let rss = Rss::spread(2);
    for (c, (&[ha, hb], &[sa, sb])) in pair.homes.iter().zip(&pair.source_ports).enumerate() {
        assert_eq!(
            rss.queue_of_roce(IP_A, IP_B, sa) as usize,
            hb,
            "connection {c}: A's packets hash to B's home queue"
        );
        assert_eq!(
            rss.queue_of_roce(IP_B, IP_A, sb) as usize,
            ha,
            "connection {c}: B's packets hash to A's home queue"
        );
    }

    // One region per engine and role, registered once: every shard has it.
    let len = 4 * SLOT;
    let map = || Arc::new(Mapping::anonymous(len).expect("anonymous memory"));
    let (a_src, a_dst, b_mem) = (map(), map(), map());
    let src = pair.a.engine.register_all(&a_src, Access::ALL).unwrap();
    let dst = pair.a.engine.register_all(&a_dst, Access::ALL).unwrap();
    let remote = pair.b.engine.register_all(&b_mem, Access::ALL).unwrap();
    assert_eq!(pair.a.engine.shards(), 2);

    let mut ends: Vec<(&mut portico::rdma::Qp, &mut portico::rdma::Cq)> =
        vec![(&mut pair.a.qp, &mut pair.a.cq)];
    for conn in &mut pair.more {
        ends.push((&mut conn.a.qp, &mut conn.a.cq));
    }
    let homes = pair.homes.clone();
    let mut expected = [0u64; 2];
    let rounds = *OPS.iter().max().unwrap();
    for i in 0..rounds {
        // Round i: every queue pair that still has work posts its WRITE+READ, then all wait.
        let mut busy = Vec::new();
        for (c, (qp, _)) in ends.iter_mut().enumerate() {
            let home = homes[c][0];
            if i >= OPS[home] {
                continue;
            }
            let size = SIZES[(i + c) % SIZES.len()];
            let data = pattern(size, (c * 1000 + i) as u64);
            let off = c * SLOT;
            src.write(off, &data).unwrap();
            let at = remote.addr() + off as u64;
            let write = WorkRequest::write(
                2 * i as u64,
                src.sgl(off, size as u32),
                at,
                remote.rkey(),
                None,
            );
            let read = WorkRequest::read(
                2 * i as u64 + 1,
                dst.sgl(off, size as u32),
                at,
                remote.rkey(),
            );
            // One at a time: the READ is posted once the WRITE has completed.
            qp.post_send(&[write]).unwrap();
            busy.push((c, size, data, read));
            expected[home] += packets(size);
        }
        for (c, _, _, read) in &busy {
            let (qp, cq) = &mut ends[*c];
            let wc = cq.wait_one(WAIT).expect("the WRITE completes");
            assert_eq!(
                (wc.opcode, wc.status),
                (WcOpcode::RdmaWrite, WcStatus::Success)
            );
            qp.post_send(&[*read]).unwrap();
        }
        for (c, size, data, _) in &busy {
            let (_, cq) = &mut ends[*c];
            let wc = cq.wait_one(WAIT).expect("the READ completes");
            assert_eq!(
                (wc.opcode, wc.status, wc.byte_len as usize),
                (WcOpcode::RdmaRead, WcStatus::Success, *size)
            );
            let off = c * SLOT;
            assert_eq!(
                &dst.to_vec(off, *size).unwrap(),
                data,
                "read back, connection {c}"
            );
            assert_eq!(
                &remote.to_vec(off, *size).unwrap(),
                data,
                "B's region, connection {c}"
            );
        }
    }
    drop(ends);
    let queued: Vec<u64> = (0..2)
        .map(|q| rx_queue_packets("mc", "a", q) + rx_queue_packets("mc", "b", q))
        .collect();
    let reports = pair.runtime.join().expect("the workers stop cleanly");
    assert_eq!(reports.len(), 2);
    for (w, r) in reports.iter().enumerate() {
        assert_eq!(r.worker, format!("mc{w}"));
        assert_eq!(
            counter(r, "delivered"),
            expected[w],
            "worker {w} delivered exactly its own queue pairs' packets"
        );
        assert_eq!(queued[w], expected[w], "RX queue {w} of both ports");
        assert_eq!(counter(r, "wrong_core"), 0, "worker {w}");
        assert_eq!(counter(r, "unknown_qp"), 0, "worker {w}");
        assert_eq!(counter(r, "retransmissions"), 0, "worker {w}");
    }
    assert_ne!(expected[0], expected[1], "the workers' loads differ");

    misrouted_packets_are_dropped_at_the_wrong_worker(workers);
}

/// A connection whose ends are homed on different workers: A's end on worker 0 sends on
/// queue 0, so its packets reach B's shard 0, which does not hold B's end.
fn misrouted_packets_are_dropped_at_the_wrong_worker(workers: [usize; 2]) {
    let mut qp = QpConfig::new(0, 0);
    qp.timeout_ns = 1_000_000;
    qp.max_backoff_shift = 0;
    qp.retry_limit = 2;
    let mut opts = LoopbackOpts::multicore(qp, &workers, 1);
    opts.name = "mcwrong".into();
    opts.homes = vec![[0, 1]];
    let mut pair = loopback::start(&opts).expect("the misconfigured pair starts");
    let map = Arc::new(Mapping::anonymous(4096).unwrap());
    let target = Arc::new(Mapping::anonymous(4096).unwrap());
    let src = pair.a.engine.register_all(&map, Access::ALL).unwrap();
    let remote = pair.b.engine.register_all(&target, Access::ALL).unwrap();
    src.write(0, &[0xab; 64]).unwrap();
    pair.a
        .qp
        .post_send(&[WorkRequest::write(
            7,
            src.sgl(0, 64),
            remote.addr(),
            remote.rkey(),
            None,
        )])
        .unwrap();
    let wc = pair.a.cq.wait_one(WAIT).expect("the WRITE fails");
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::RetryExceeded));
    assert_eq!(
        remote.to_vec(0, 4096).unwrap(),
        vec![0u8; 4096],
        "nothing placed"
    );
    let reports = pair.runtime.join().expect("the workers stop cleanly");
    let wrong: Vec<u64> = reports.iter().map(|r| counter(r, "wrong_core")).collect();
    assert_eq!(
        wrong,
        [3, 0],
        "the WRITE and its two retransmissions, at worker 0"
    );
    let delivered: Vec<u64> = reports.iter().map(|r| counter(r, "delivered")).collect();
    assert_eq!(delivered, [0, 0]);
    assert_eq!(counter(&reports[0], "unknown_qp"), 0);
}
