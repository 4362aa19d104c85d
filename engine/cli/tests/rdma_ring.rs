//! One process, two RDMA engines over a `net_ring` link, on real EAL without hugepages. Each
//! side maps its own memory and registers ranges of it, as with verbs; every byte is checked
//! in the application's own mapping, where the engine placed it.
//!
//! 1. RDMA WRITEs of assorted sizes (some with immediate, consuming receives in order), a READ
//!    of everything back, 20 SENDs into posted receives.
//! 2. Scatter/gather: a WRITE gathered from 3 pieces of two regions and one from 16 pieces, a
//!    READ scattered into 3 pieces, a SEND of 2 pieces into a receive of 2 pieces.
//! 3. Deregistration: a region with nothing outstanding deregisters, a second attempt is
//!    refused, and a WRITE to its rkey then completes with a remote access error, leaving the
//!    remote mapping untouched; that error ends the connection, as in verbs (the receive
//!    posted on the remote side and a WRITE posted afterwards are flushed).
//! 4. Errors that end a connection, each on a queue pair of its own on a second pair of
//!    engines: a wrong rkey (NAK, remote memory untouched), a bad lkey and a piece running
//!    past its region (local protection errors, later requests flushed), an lkey of a
//!    deregistered region; a connection beside them still works.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{QPN_A, QPN_B, completions, pattern, start, start_connections, statuses};
use pmem::Mapping;
use portico::rdma::{HostError, MemoryRegion};
use portico::transport::{
    Access, MAX_SGE, QpConfig, RecvRequest, SgList, Sge, WcOpcode, WcStatus, WorkCompletion,
    WorkRequest,
};

const WAIT: Duration = Duration::from_secs(20);
const KIB: usize = 1024;

fn map(len: usize) -> Arc<Mapping> {
    Arc::new(Mapping::anonymous(len).expect("anonymous memory"))
}

/// `len` bytes of `map` at `offset`, read by the application.
fn bytes(map: &Mapping, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    map.read(offset, &mut v).unwrap();
    v
}

fn one(cq: &mut portico::rdma::Cq, what: &str) -> WorkCompletion {
    cq.wait_one(WAIT)
        .unwrap_or_else(|| panic!("{what} completes within {WAIT:?}"))
}

#[test]
fn write_read_send_between_two_engines() {
    let mut p = start(QpConfig::new(0, 0), None);
    // The control path of each engine: registration and deregistration.
    let (a_engine, b_engine) = (&p.a.engine, &p.b.engine);

    // A's memory: the source of WRITEs and SENDs, where READs land, and a second source.
    let a_map = map(1024 * KIB);
    let src = a_engine
        .register(&a_map, 0, 256 * KIB, Access::ALL)
        .unwrap();
    let back = a_engine
        .register(&a_map, 512 * KIB, 256 * KIB, Access::ALL)
        .unwrap();
    let aux = a_engine
        .register(&a_map, 768 * KIB, 64 * KIB, Access::ALL)
        .unwrap();
    // B's memory: the WRITE target (not at the start of the mapping), the receive buffers,
    // and a region to deregister.
    let b_map = map(1024 * KIB);
    const DST: usize = 64 * KIB;
    const RBUF: usize = 512 * KIB;
    const SPARE: usize = 768 * KIB;
    let dst = b_engine
        .register(&b_map, DST, 256 * KIB, Access::ALL)
        .unwrap();
    let rbuf = b_engine
        .register(&b_map, RBUF, 128 * KIB, Access::LOCAL_WRITE)
        .unwrap();
    let spare = b_engine
        .register(&b_map, SPARE, 16 * KIB, Access::ALL)
        .unwrap();
    assert_eq!(
        dst.addr(),
        b_map.as_ptr() as u64 + DST as u64,
        "an rkey names the real address of the bytes"
    );
    assert_eq!((src.len(), rbuf.len()), (256 * KIB, 128 * KIB));
    let data = pattern(256 * KIB, 1);
    let aux_data = pattern(64 * KIB, 2);
    a_map.write(0, &data).unwrap();
    a_map.write(768 * KIB, &aux_data).unwrap();

    // 1. WRITEs of assorted sizes, packed one after another into B's region; every third
    // carries an immediate, which consumes a receive (posted first, with no buffer).
    let sizes = [1usize, 3, 64, 1023, 1024, 1025, 4096, 9000, 65536, 100_000];
    let mut writes = Vec::new();
    let mut recvs = Vec::new();
    let mut at = 0;
    for (i, &len) in sizes.iter().enumerate() {
        let imm = (i % 3 == 0).then_some(i as u32);
        if imm.is_some() {
            recvs.push(RecvRequest::new(1000 + i as u64, SgList::new()));
        }
        writes.push(WorkRequest::write(
            i as u64,
            src.sgl(at, len as u32),
            dst.addr() + at as u64,
            dst.rkey(),
            imm,
        ));
        at += len;
    }
    p.b.qp.post_recv(&recvs).unwrap();
    p.a.qp.post_send(&writes).unwrap();
    for (i, &len) in sizes.iter().enumerate() {
        let wc = one(&mut p.a.cq, "a WRITE");
        assert_eq!(
            (wc.wr_id, wc.qpn, wc.opcode, wc.status, wc.byte_len),
            (
                i as u64,
                QPN_A,
                WcOpcode::RdmaWrite,
                WcStatus::Success,
                len as u32
            )
        );
    }
    assert!(
        bytes(&b_map, DST, at) == data[..at],
        "RDMA WRITE data differs in B's mapping"
    );
    assert!(
        bytes(&b_map, DST + at, 1024).iter().all(|&b| b == 0),
        "nothing written past the last WRITE"
    );
    // Immediates consumed receives on B, in order.
    for i in (0..sizes.len()).filter(|i| i % 3 == 0) {
        let wc = one(&mut p.b.cq, "a receive");
        assert_eq!(
            (wc.wr_id, wc.qpn, wc.opcode, wc.status, wc.imm_data),
            (
                1000 + i as u64,
                QPN_B,
                WcOpcode::RecvRdmaWithImm,
                WcStatus::Success,
                Some(i as u32)
            )
        );
    }

    // READ it all back into another region of A.
    p.a.qp
        .post_send(&[WorkRequest::read(
            50,
            back.sgl(0, at as u32),
            dst.addr(),
            dst.rkey(),
        )])
        .unwrap();
    let wc = one(&mut p.a.cq, "the READ");
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status, wc.byte_len),
        (50, WcOpcode::RdmaRead, WcStatus::Success, at as u32)
    );
    assert!(
        bytes(&a_map, 512 * KIB, at) == data[..at],
        "RDMA READ data differs in A's mapping"
    );

    // SENDs into posted receives of 3000 bytes each.
    let recvs: Vec<RecvRequest> = (0..20)
        .map(|i| RecvRequest::new(2000 + i as u64, rbuf.sgl(i * 3000, 3000)))
        .collect();
    let sends: Vec<WorkRequest> = (0..20)
        .map(|i| {
            WorkRequest::send(
                100 + i as u64,
                src.sgl(i * 1000, 1000 + i as u32 * 50),
                None,
            )
        })
        .collect();
    p.b.qp.post_recv(&recvs).unwrap();
    p.a.qp.post_send(&sends).unwrap();
    for i in 0..20usize {
        let len = 1000 + i * 50;
        let wc = one(&mut p.a.cq, "a SEND");
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.status),
            (100 + i as u64, WcOpcode::Send, WcStatus::Success)
        );
        let wc = one(&mut p.b.cq, "a receive");
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.status, wc.byte_len),
            (
                2000 + i as u64,
                WcOpcode::Recv,
                WcStatus::Success,
                len as u32
            )
        );
        assert!(
            bytes(&b_map, RBUF + i * 3000, len) == data[i * 1000..i * 1000 + len],
            "SEND {i} data differs in B's mapping"
        );
    }

    // 2. Scatter/gather. A WRITE gathered from 3 pieces in two regions, out of order, crossing
    // packet boundaries (MTU 1024).
    let (s, x) = ((&src, &data[..]), (&aux, &aux_data[..]));
    let pieces = [(s, 5000, 700), (x, 100, 1500), (s, 200, 333)];
    let want = gathered(&pieces);
    let sgl = sg_list(&pieces);
    assert_eq!(sgl.total_len(), 2533);
    let to = 200_000;
    p.a.qp
        .post_send(&[WorkRequest::write(
            60,
            sgl,
            dst.addr() + to as u64,
            dst.rkey(),
            None,
        )])
        .unwrap();
    let wc = one(&mut p.a.cq, "the 3-piece WRITE");
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (60, WcStatus::Success, 2533)
    );
    assert!(
        bytes(&b_map, DST + to, want.len()) == want,
        "a WRITE gathered from 3 pieces landed differently"
    );

    // A WRITE gathered from the most pieces a request takes, alternating regions.
    let pieces: Vec<Piece> = (0..MAX_SGE)
        .map(|i| {
            let len = 1 + i * 97;
            if i % 2 == 0 {
                (s, (i * 7919) % 200_000, len)
            } else {
                (x, (i * 1231) % 60_000, len)
            }
        })
        .collect();
    let want = gathered(&pieces);
    let sgl = sg_list(&pieces);
    assert_eq!(sgl.len(), MAX_SGE);
    assert!(
        SgList::from_slice(&[Sge::new(src.lkey(), src.addr(), 1); MAX_SGE + 1]).is_err(),
        "no more than {MAX_SGE} pieces"
    );
    let to = 204_000;
    p.a.qp
        .post_send(&[WorkRequest::write(
            61,
            sgl,
            dst.addr() + to as u64,
            dst.rkey(),
            None,
        )])
        .unwrap();
    let wc = one(&mut p.a.cq, "the 16-piece WRITE");
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (61, WcStatus::Success, want.len() as u32)
    );
    assert!(
        bytes(&b_map, DST + to, want.len()) == want,
        "a WRITE gathered from 16 pieces landed differently"
    );

    // A READ of 3000 bytes scattered into 3 pieces of A's READ region, out of order; the bytes
    // around each piece stay as they were (zero).
    let scatter = [(240_000usize, 1000usize), (230_000, 1500), (250_000, 500)];
    let sgl = SgList::from_slice(&scatter.map(|(off, len)| back.sge(off, len as u32))).unwrap();
    p.a.qp
        .post_send(&[WorkRequest::read(62, sgl, dst.addr(), dst.rkey())])
        .unwrap();
    let wc = one(&mut p.a.cq, "the scattered READ");
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status, wc.byte_len),
        (62, WcOpcode::RdmaRead, WcStatus::Success, 3000)
    );
    let mut from = 0;
    for (off, len) in scatter {
        assert!(
            bytes(&a_map, 512 * KIB + off, len) == data[from..from + len],
            "READ piece at {off} differs"
        );
        assert!(
            bytes(&a_map, 512 * KIB + off + len, 64)
                .iter()
                .all(|&b| b == 0)
                && bytes(&a_map, 512 * KIB + off - 64, 64)
                    .iter()
                    .all(|&b| b == 0),
            "READ wrote outside its piece at {off}"
        );
        from += len;
    }

    // A SEND (with immediate) of 2 pieces into a receive of 2 pieces: 700 bytes fill the first,
    // the other 1300 the start of the second; the rest of the second stays untouched.
    let recv = SgList::from_slice(&[rbuf.sge(70_000, 700), rbuf.sge(90_000, 2000)]).unwrap();
    p.b.qp.post_recv(&[RecvRequest::new(2100, recv)]).unwrap();
    let pieces = [(s, 1000, 1200), (x, 0, 800)];
    let want = gathered(&pieces);
    p.a.qp
        .post_send(&[WorkRequest::send(63, sg_list(&pieces), Some(0xdead_beef))])
        .unwrap();
    let wc = one(&mut p.a.cq, "the 2-piece SEND");
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status, wc.byte_len),
        (63, WcOpcode::Send, WcStatus::Success, 2000)
    );
    let wc = one(&mut p.b.cq, "the 2-piece receive");
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status, wc.byte_len, wc.imm_data),
        (
            2100,
            WcOpcode::Recv,
            WcStatus::Success,
            2000,
            Some(0xdead_beef)
        )
    );
    assert!(
        bytes(&b_map, RBUF + 70_000, 700) == want[..700],
        "first receive piece differs"
    );
    assert!(
        bytes(&b_map, RBUF + 90_000, 1300) == want[700..],
        "second receive piece differs"
    );
    assert!(
        bytes(&b_map, RBUF + 90_000 + 1300, 700)
            .iter()
            .all(|&b| b == 0),
        "nothing placed past the message"
    );

    // 3. Deregistration. The spare region works, then deregisters (nothing uses it); a second
    // attempt names no region any more.
    p.a.qp
        .post_send(&[WorkRequest::write(
            70,
            src.sgl(9000, 4096),
            spare.addr(),
            spare.rkey(),
            None,
        )])
        .unwrap();
    let wc = one(&mut p.a.cq, "the WRITE to the spare region");
    assert_eq!((wc.wr_id, wc.status), (70, WcStatus::Success));
    assert!(bytes(&b_map, SPARE, 4096) == data[9000..9000 + 4096]);
    let stale = spare.clone();
    b_engine
        .deregister(spare)
        .expect("an idle region deregisters");
    assert_eq!(
        b_engine.deregister(stale.clone()),
        Err(HostError::NotRegistered(stale.lkey()))
    );
    // A source region whose requests have all completed deregisters too.
    a_engine
        .deregister(aux)
        .expect("an idle source region deregisters");

    // Its rkey is now refused by B: NAK remote access error, and B's mapping, the bytes of the
    // deregistered range included, stays as it was. The error ends the connection on both
    // sides, as in verbs: B's posted receive and A's next request are flushed.
    let before = bytes(&b_map, 0, b_map.len());
    p.b.qp
        .post_recv(&[RecvRequest::new(3000, rbuf.sgl(0, 4096))])
        .unwrap();
    p.a.qp
        .post_send(&[WorkRequest::write(
            71,
            src.sgl(0, 100),
            stale.addr(),
            stale.rkey(),
            None,
        )])
        .unwrap();
    let wc = one(&mut p.a.cq, "the WRITE to a deregistered rkey");
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (71, WcOpcode::RdmaWrite, WcStatus::RemoteAccessError)
    );
    let wc = one(&mut p.b.cq, "B's posted receive");
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (3000, WcOpcode::Recv, WcStatus::WrFlushError)
    );
    p.a.qp
        .post_send(&[WorkRequest::write(
            72,
            src.sgl(0, 100),
            dst.addr(),
            dst.rkey(),
            None,
        )])
        .unwrap();
    let wc = one(&mut p.a.cq, "a WRITE after the error");
    assert_eq!((wc.wr_id, wc.status), (72, WcStatus::WrFlushError));
    assert!(
        bytes(&b_map, 0, b_map.len()) == before,
        "a refused or flushed WRITE touched B's memory"
    );
    assert_eq!(p.a.cq.poll_one(), None, "one completion per request on A");
    assert_eq!(p.b.cq.poll_one(), None, "one completion per receive on B");

    let reports = p.runtime.join().expect("workers ran without failure");
    for r in &reports {
        assert_eq!(r.counter("icrc_errors"), Some(0), "{r:?}");
        assert_eq!(r.counter("malformed"), Some(0), "{r:?}");
        assert_eq!(r.io.drops, 0, "{r:?}");
    }

    // 4. A second pair of engines on the freed core, one connection per error that ends one.
    let mut e = start_connections(
        "rdma_err",
        QpConfig::new(0, 0),
        4,
        *common::cores().last().unwrap(),
    );
    let ea_map = map(64 * KIB);
    let eb_map = map(64 * KIB);
    let (a_engine, b_engine) = (&e.a, &e.b);
    let ea = a_engine.register_all(&ea_map, Access::ALL).unwrap();
    let eb = b_engine.register_all(&eb_map, Access::ALL).unwrap();
    // A region registered and deregistered at once: its lkey is stale.
    let gone = a_engine
        .register(&ea_map, 32 * KIB, 4 * KIB, Access::ALL)
        .unwrap();
    a_engine.deregister(gone.clone()).unwrap();
    let a_bytes = pattern(64 * KIB, 3);
    let b_bytes = pattern(64 * KIB, 4);
    ea_map.write(0, &a_bytes).unwrap();
    eb_map.write(0, &b_bytes).unwrap();

    // Connection 0: a wrong rkey. NAK remote access error, B's memory untouched; both queue
    // pairs are in the error state (B's receive flushed, A's next WRITE flushed).
    let c = &mut e.conns[0];
    c.b.qp
        .post_recv(&[RecvRequest::new(10, eb.sgl(0, 1024))])
        .unwrap();
    c.a.qp
        .post_send(&[WorkRequest::write(
            1,
            ea.sgl(0, 100),
            eb.addr(),
            eb.rkey() ^ 0x5a5a,
            None,
        )])
        .unwrap();
    let wcs = completions(&mut c.a.cq, 1, WAIT);
    assert_eq!(statuses(&wcs), [(1, WcStatus::RemoteAccessError)]);
    assert_eq!(
        statuses(&completions(&mut c.b.cq, 1, WAIT)),
        [(10, WcStatus::WrFlushError)]
    );
    flushed(
        &mut c.a,
        WorkRequest::write(2, ea.sgl(0, 100), eb.addr(), eb.rkey(), None),
    );
    assert!(
        bytes(&eb_map, 0, eb_map.len()) == b_bytes,
        "refused WRITE touched memory"
    );

    // Connection 1: a piece naming a bad lkey on A, and on B a list whose second piece runs
    // past the end of its region. Each is a local protection error before any byte moves;
    // requests posted afterwards are flushed.
    let c = &mut e.conns[1];
    let bad_lkey = SgList::one(ea.lkey() ^ 0x5a5a, ea.addr(), 100);
    c.a.qp
        .post_send(&[WorkRequest::write(1, bad_lkey, eb.addr(), eb.rkey(), None)])
        .unwrap();
    let wc = completions(&mut c.a.cq, 1, WAIT)[0];
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (1, WcOpcode::RdmaWrite, WcStatus::LocalProtectionError)
    );
    flushed(
        &mut c.a,
        WorkRequest::write(2, ea.sgl(0, 100), eb.addr(), eb.rkey(), None),
    );
    let past_end = SgList::from_slice(&[eb.sge(0, 512), eb.sge(eb.len() - 100, 200)]).unwrap();
    c.b.qp
        .post_send(&[WorkRequest::write(3, past_end, ea.addr(), ea.rkey(), None)])
        .unwrap();
    let wc = completions(&mut c.b.cq, 1, WAIT)[0];
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (3, WcOpcode::RdmaWrite, WcStatus::LocalProtectionError)
    );
    flushed(
        &mut c.b,
        WorkRequest::read(4, eb.sgl(0, 512), ea.addr(), ea.rkey()),
    );

    // Connection 2: the lkey of a deregistered region is a bad lkey too.
    let c = &mut e.conns[2];
    c.a.qp
        .post_send(&[WorkRequest::write(
            1,
            gone.sgl(0, 100),
            eb.addr(),
            eb.rkey(),
            None,
        )])
        .unwrap();
    assert_eq!(
        statuses(&completions(&mut c.a.cq, 1, WAIT)),
        [(1, WcStatus::LocalProtectionError)]
    );
    assert!(
        bytes(&ea_map, 0, ea_map.len()) == a_bytes && bytes(&eb_map, 0, eb_map.len()) == b_bytes,
        "a request that failed its local checks moved bytes"
    );

    // Connection 3, on the same engines, is unaffected: a WRITE and a READ back succeed.
    let c = &mut e.conns[3];
    c.a.qp
        .post_send(&[
            WorkRequest::write(1, ea.sgl(0, 5000), eb.addr() + 8192, eb.rkey(), None),
            WorkRequest::read(2, ea.sgl(16 * KIB, 5000), eb.addr() + 8192, eb.rkey()),
        ])
        .unwrap();
    assert_eq!(
        statuses(&completions(&mut c.a.cq, 2, WAIT)),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert!(bytes(&eb_map, 8192, 5000) == a_bytes[..5000]);
    assert!(bytes(&ea_map, 16 * KIB, 5000) == a_bytes[..5000]);

    let reports = e
        .runtime
        .join()
        .expect("the second pair ran without failure");
    for r in &reports {
        assert_eq!(r.counter("icrc_errors"), Some(0), "{r:?}");
        assert_eq!(r.counter("malformed"), Some(0), "{r:?}");
    }
}

/// A piece of a message: a source region with the bytes the test wrote into it, an offset
/// and a length.
type Piece<'a> = ((&'a MemoryRegion, &'a [u8]), usize, usize);

/// The scatter/gather list of `pieces`.
/// Posts `wr` on a queue pair in the error state; it completes with a flush error.
fn flushed(end: &mut common::End, wr: WorkRequest) {
    let id = wr.wr_id;
    end.qp.post_send(&[wr]).unwrap();
    assert_eq!(
        statuses(&completions(&mut end.cq, 1, WAIT)),
        [(id, WcStatus::WrFlushError)]
    );
}

fn sg_list(pieces: &[Piece]) -> SgList {
    let sges: Vec<Sge> = pieces
        .iter()
        .map(|&((mr, _), off, len)| mr.sge(off, len as u32))
        .collect();
    SgList::from_slice(&sges).unwrap()
}

/// The message `pieces` make, from what the test wrote into their regions.
fn gathered(pieces: &[Piece]) -> Vec<u8> {
    pieces
        .iter()
        .flat_map(|&((_, bytes), off, len)| bytes[off..off + len].to_vec())
        .collect()
}
