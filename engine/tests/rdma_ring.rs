//! One process, two RDMA engines over a `net_ring` link, on real EAL without hugepages.
//! An application writes into the remote region (RDMA WRITE, with and without immediate),
//! reads it back (RDMA READ), sends messages into posted receives, and compares every byte.
//! Then a wrong rkey is refused with the standard NAK, and the remote memory is untouched.

mod common;

use std::time::Duration;

use common::{QPN_A, QPN_B, pattern, start};
use portico::transport::{Access, QpConfig, RecvRequest, WcOpcode, WcStatus, WorkRequest, WrKind};

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn write_read_send_between_two_engines() {
    let mut p = start(QpConfig::new(0, 0), None);
    let src = p.a.register(0x10_0000, 256 * 1024, Access::ALL).unwrap();
    let back = p.a.register(0x20_0000, 256 * 1024, Access::ALL).unwrap();
    let dst = p.b.register(0x40_0000, 256 * 1024, Access::ALL).unwrap();
    let rbuf =
        p.b.register(0x80_0000, 64 * 1024, Access::LOCAL_WRITE)
            .unwrap();
    let data = pattern(256 * 1024, 1);
    p.a.write(src.lkey, 0, &data).unwrap();

    // WRITEs of assorted sizes, packed one after another into the remote region.
    let sizes = [1usize, 3, 64, 1023, 1024, 1025, 4096, 9000, 65536, 100_000];
    let mut at = 0;
    for (i, &len) in sizes.iter().enumerate() {
        let imm = (i % 3 == 0).then_some(i as u32);
        if imm.is_some() {
            p.b.post_recv(
                QPN_B,
                RecvRequest {
                    wr_id: 1000 + i as u64,
                    lkey: rbuf.lkey,
                    addr: 0x80_0000,
                    len: 0,
                },
            )
            .unwrap();
        }
        p.a.post_send(
            QPN_A,
            WorkRequest {
                wr_id: i as u64,
                kind: WrKind::Write {
                    remote_addr: 0x40_0000 + at as u64,
                    rkey: dst.rkey,
                    imm,
                },
                lkey: src.lkey,
                local_addr: 0x10_0000 + at as u64,
                len: len as u32,
            },
        )
        .unwrap();
        at += len;
    }
    for i in 0..sizes.len() {
        let wc = p.a.wait(WAIT).unwrap().expect("a WRITE completes");
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.status),
            (i as u64, WcOpcode::RdmaWrite, WcStatus::Success)
        );
    }
    let remote = p.b.read(dst.lkey, 0, at).unwrap();
    assert!(remote == data[..at], "RDMA WRITE data differs");
    // Immediates consumed receives on B, in order.
    for i in (0..sizes.len()).filter(|i| i % 3 == 0) {
        let wc = p.b.wait(WAIT).unwrap().expect("a receive completes");
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.imm_data),
            (1000 + i as u64, WcOpcode::RecvRdmaWithImm, Some(i as u32))
        );
    }

    // READ it all back into another region of A.
    p.a.post_send(
        QPN_A,
        WorkRequest {
            wr_id: 50,
            kind: WrKind::Read {
                remote_addr: 0x40_0000,
                rkey: dst.rkey,
            },
            lkey: back.lkey,
            local_addr: 0x20_0000,
            len: at as u32,
        },
    )
    .unwrap();
    let wc = p.a.wait(WAIT).unwrap().expect("the READ completes");
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status, wc.byte_len),
        (50, WcOpcode::RdmaRead, WcStatus::Success, at as u32)
    );
    assert!(
        p.a.read(back.lkey, 0, at).unwrap() == data[..at],
        "RDMA READ data differs"
    );

    // SENDs into posted receives.
    for i in 0..20u64 {
        p.b.post_recv(
            QPN_B,
            RecvRequest {
                wr_id: 2000 + i,
                lkey: rbuf.lkey,
                addr: 0x80_0000 + i * 3000,
                len: 3000,
            },
        )
        .unwrap();
    }
    for i in 0..20u64 {
        p.a.post_send(
            QPN_A,
            WorkRequest {
                wr_id: 100 + i,
                kind: WrKind::Send { imm: None },
                lkey: src.lkey,
                local_addr: 0x10_0000 + i * 1000,
                len: 1000 + i as u32 * 50,
            },
        )
        .unwrap();
    }
    for i in 0..20u64 {
        let wc = p.a.wait(WAIT).unwrap().expect("a SEND completes");
        assert_eq!((wc.wr_id, wc.status), (100 + i, WcStatus::Success));
        let wc = p.b.wait(WAIT).unwrap().expect("a receive completes");
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.byte_len),
            (2000 + i, WcOpcode::Recv, 1000 + i as u32 * 50)
        );
        let got =
            p.b.read(rbuf.lkey, (i * 3000) as usize, 1000 + i as usize * 50)
                .unwrap();
        assert!(
            got == data[(i * 1000) as usize..(i * 1000) as usize + 1000 + i as usize * 50],
            "SEND {i} data differs"
        );
    }

    // A wrong rkey: NAK remote access error, remote memory untouched. A remote access error
    // moves the requester's QP to the error state, as in IBTA RC, so there is one such case per
    // QP here; the transport's own tests cover out-of-bounds ranges and missing permissions.
    let before = p.b.read(dst.lkey, 0, 256 * 1024).unwrap();
    p.a.post_send(
        QPN_A,
        WorkRequest {
            wr_id: 900,
            kind: WrKind::Write {
                remote_addr: 0x40_0000,
                rkey: dst.rkey ^ 0x5a5a,
                imm: None,
            },
            lkey: src.lkey,
            local_addr: 0x10_0000,
            len: 100,
        },
    )
    .unwrap();
    let wc = p.a.wait(WAIT).unwrap().expect("the bad WRITE completes");
    assert_eq!((wc.wr_id, wc.status), (900, WcStatus::RemoteAccessError));
    assert!(
        p.b.read(dst.lkey, 0, 256 * 1024).unwrap() == before,
        "refused WRITE touched memory"
    );

    let reports = p.runtime.join().expect("workers ran without failure");
    for r in &reports {
        assert_eq!(r.counter("icrc_errors"), Some(0), "{r:?}");
        assert_eq!(r.counter("malformed"), Some(0), "{r:?}");
        assert_eq!(r.drops, 0, "{r:?}");
    }
}
