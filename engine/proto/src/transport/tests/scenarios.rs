//! One test per protocol behaviour, each on a fault-free wire unless the
//! behaviour needs a specific loss, duplicate or refusal.

use super::harness::{Fate, Faults, Side, Sim};
use super::*;
use crate::transport::{
    Mtu, PostError, QpState, RecvRequest, WcOpcode, WcStatus, WorkCompletion, psn,
};
use wire::{NakCode, Opcode, Syndrome};

const MS: u64 = 1_000_000;

fn cfg() -> QpConfig {
    QpConfig::new(0x11, 0x22)
}

fn fill_a(sim: &mut Sim, keys: MrKeys, offset: usize, data: &[u8]) {
    assert!(sim.a.mem.write(keys.lkey, offset as u64, data));
}

fn fill_b(sim: &mut Sim, keys: MrKeys, offset: usize, data: &[u8]) {
    assert!(sim.b.mem.write(keys.lkey, offset as u64, data));
}

fn a_bytes(sim: &Sim, keys: MrKeys, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    assert!(sim.a.mem.read(keys.lkey, offset as u64, &mut v));
    v
}

fn b_bytes(sim: &Sim, keys: MrKeys, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    assert!(sim.b.mem.read(keys.lkey, offset as u64, &mut v));
    v
}

fn one(done: &[WorkCompletion], wr_id: u64) -> WorkCompletion {
    let found: Vec<_> = done.iter().filter(|w| w.wr_id == wr_id).collect();
    assert_eq!(found.len(), 1, "wr {wr_id} completions: {done:?}");
    *found[0]
}

fn is_ack(r: &wire::RoceRepr) -> bool {
    r.bth.opcode == Opcode::Acknowledge
        && matches!(r.aeth.map(|a| a.syndrome), Some(Syndrome::Ack { .. }))
}

fn is_nak(r: &wire::RoceRepr, code: NakCode) -> bool {
    r.bth.opcode == Opcode::Acknowledge && r.aeth.map(|a| a.syndrome) == Some(Syndrome::Nak(code))
}

/// Post a SEND of `data` from A, with a receive of `recv_len` posted on B.
fn send_and_check(cfg: QpConfig, data: &[u8], imm: Option<u32>) -> Sim {
    let (mut sim, a, b) = pair(cfg, Faults::NONE, 1, 1 << 20);
    fill_a(&mut sim, a, 0, data);
    sim.b
        .post_recv(7, b.lkey, B_BASE + 64, data.len() as u32 + 100);
    sim.a
        .post_send(send(1, a.lkey, A_BASE, data.len() as u32, imm));
    sim.run_idle(10 * MS);
    let wc = one(&sim.a.done, 1);
    assert_eq!((wc.opcode, wc.status), (WcOpcode::Send, WcStatus::Success));
    let rc = one(&sim.b.done, 7);
    assert_eq!(rc.opcode, WcOpcode::Recv);
    assert_eq!(rc.status, WcStatus::Success);
    assert_eq!(rc.byte_len, data.len() as u32);
    assert_eq!(rc.imm_data, imm);
    assert_eq!(b_bytes(&sim, b, 64, data.len()), data);
    assert_eq!(sim.wire.icrc_errors + sim.wire.parse_errors, 0);
    sim
}

#[test]
fn send_only_single_packet() {
    let sim = send_and_check(cfg(), b"hello, responder", None);
    assert_eq!(sim.count(Side::A, |r| r.bth.opcode == Opcode::SendOnly), 1);
    assert_eq!(sim.b.qp.responder().msn(), 1);
}

#[test]
fn send_multi_packet() {
    let data = pattern(1, 5000);
    let sim = send_and_check(cfg(), &data, None);
    let ops: Vec<Opcode> = sim
        .trace
        .iter()
        .filter(|t| t.0 == Side::A)
        .map(|t| t.1.bth.opcode)
        .collect();
    use Opcode::*;
    assert_eq!(
        ops,
        [SendFirst, SendMiddle, SendMiddle, SendMiddle, SendLast]
    );
    // AckReq only on the last packet (ack_req_every is 16).
    let acks_req: Vec<bool> = sim
        .trace
        .iter()
        .filter(|t| t.0 == Side::A)
        .map(|t| t.1.bth.ack_req)
        .collect();
    assert_eq!(acks_req, [false, false, false, false, true]);
}

#[test]
fn send_with_immediate() {
    let sim = send_and_check(cfg(), &pattern(2, 3000), Some(0xdead_beef));
    assert_eq!(
        sim.count(Side::A, |r| r.bth.opcode == Opcode::SendLastWithImmediate),
        1
    );
    let sim = send_and_check(cfg(), b"x", Some(7));
    assert_eq!(
        sim.count(Side::A, |r| r.bth.opcode == Opcode::SendOnlyWithImmediate),
        1
    );
}

#[test]
fn zero_length_send_write_read() {
    let (mut sim, a, b) = pair(cfg(), Faults::NONE, 1, 4096);
    sim.b.post_recv(9, b.lkey, B_BASE, 16);
    sim.a.post_send(send(1, a.lkey, A_BASE, 0, Some(5)));
    sim.a
        .post_send(write(2, a.lkey, A_BASE, 0, B_BASE, b.rkey, None));
    sim.a.post_send(read(3, a.lkey, A_BASE, 0, B_BASE, b.rkey));
    sim.run_idle(10 * MS);
    for id in 1..=3 {
        assert_eq!(one(&sim.a.done, id).status, WcStatus::Success);
    }
    let rc = one(&sim.b.done, 9);
    assert_eq!((rc.byte_len, rc.imm_data), (0, Some(5)));
}

#[test]
fn send_longer_than_receive_fails_both_sides() {
    let (mut sim, a, b) = pair(cfg(), Faults::NONE, 1, 1 << 16);
    sim.b.post_recv(9, b.lkey, B_BASE, 100);
    sim.a.post_send(send(1, a.lkey, A_BASE, 3000, None));
    sim.run_idle(10 * MS);
    assert_eq!(one(&sim.a.done, 1).status, WcStatus::RemoteInvalidRequest);
    assert_eq!(one(&sim.b.done, 9).status, WcStatus::LocalLengthError);
    assert_eq!(sim.a.qp.state(), QpState::Error);
    assert_eq!(sim.b.qp.state(), QpState::Error);
}

#[test]
fn write_single_and_multi_packet() {
    let (mut sim, a, b) = pair(cfg(), Faults::NONE, 1, 1 << 20);
    let small = pattern(3, 100);
    let big = pattern(4, 10_000);
    fill_a(&mut sim, a, 0, &small);
    fill_a(&mut sim, a, 4096, &big);
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 100, B_BASE + 8, b.rkey, None));
    sim.a.post_send(write(
        2,
        a.lkey,
        A_BASE + 4096,
        10_000,
        B_BASE + 65536,
        b.rkey,
        None,
    ));
    sim.run_idle(10 * MS);
    assert_eq!(one(&sim.a.done, 1).opcode, WcOpcode::RdmaWrite);
    assert_eq!(one(&sim.a.done, 1).status, WcStatus::Success);
    assert_eq!(one(&sim.a.done, 2).status, WcStatus::Success);
    assert_eq!(b_bytes(&sim, b, 8, 100), small);
    assert_eq!(b_bytes(&sim, b, 65536, 10_000), big);
    // A WRITE consumes no receive and completes nothing at the responder.
    assert!(sim.b.done.is_empty());
    assert_eq!(
        sim.count(Side::A, |r| r.bth.opcode == Opcode::RdmaWriteFirst),
        1
    );
    assert_eq!(
        sim.count(Side::A, |r| r.bth.opcode == Opcode::RdmaWriteMiddle),
        8
    );
    assert_eq!(
        sim.count(Side::A, |r| r.bth.opcode == Opcode::RdmaWriteLast),
        1
    );
    assert_eq!(sim.b.qp.responder().msn(), 2);
}

#[test]
fn write_with_immediate_consumes_a_receive() {
    let (mut sim, a, b) = pair(cfg(), Faults::NONE, 1, 1 << 20);
    let data = pattern(5, 2500);
    fill_a(&mut sim, a, 0, &data);
    sim.b.post_recv(70, b.lkey, B_BASE + 500_000, 8);
    sim.b.post_recv(71, b.lkey, B_BASE + 500_000, 8);
    sim.a.post_send(write(
        1,
        a.lkey,
        A_BASE,
        2500,
        B_BASE,
        b.rkey,
        Some(0x0102_0304),
    ));
    sim.a
        .post_send(write(2, a.lkey, A_BASE, 10, B_BASE + 9000, b.rkey, Some(9)));
    sim.run_idle(10 * MS);
    assert_eq!(one(&sim.a.done, 1).status, WcStatus::Success);
    assert_eq!(one(&sim.a.done, 2).status, WcStatus::Success);
    let r1 = one(&sim.b.done, 70);
    assert_eq!(r1.opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!((r1.byte_len, r1.imm_data), (2500, Some(0x0102_0304)));
    assert_eq!(one(&sim.b.done, 71).imm_data, Some(9));
    assert_eq!(b_bytes(&sim, b, 0, 2500), data);
    assert_eq!(sim.b.qp.responder().posted_receives(), 0);
    assert_eq!(
        sim.count(Side::A, |r| r.bth.opcode
            == Opcode::RdmaWriteLastWithImmediate),
        1
    );
    assert_eq!(
        sim.count(Side::A, |r| r.bth.opcode
            == Opcode::RdmaWriteOnlyWithImmediate),
        1
    );
}

#[test]
fn read_with_multi_mtu_response() {
    let mut c = cfg();
    c.pmtu = Mtu::M256;
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 20);
    let data = pattern(6, 10_000);
    fill_b(&mut sim, b, 1000, &data);
    sim.a
        .post_send(read(1, a.lkey, A_BASE + 7, 10_000, B_BASE + 1000, b.rkey));
    sim.run_idle(10 * MS);
    let wc = one(&sim.a.done, 1);
    assert_eq!(
        (wc.opcode, wc.status, wc.byte_len),
        (WcOpcode::RdmaRead, WcStatus::Success, 10_000)
    );
    assert_eq!(a_bytes(&sim, a, 7, 10_000), data);
    let resp: Vec<(Opcode, usize, bool)> = sim
        .trace
        .iter()
        .filter(|t| t.0 == Side::B)
        .map(|t| (t.1.bth.opcode, t.2, t.1.aeth.is_some()))
        .collect();
    assert_eq!(resp.len(), 40); // ceil(10000 / 256), and no separate ACK
    assert_eq!(resp[0], (Opcode::RdmaReadResponseFirst, 256, true));
    assert!(
        resp[1..39]
            .iter()
            .all(|r| *r == (Opcode::RdmaReadResponseMiddle, 256, false))
    );
    assert_eq!(
        resp[39],
        (Opcode::RdmaReadResponseLast, 10_000 - 39 * 256, true)
    );
    // Consecutive PSNs from the request's PSN.
    let psns: Vec<u32> = sim
        .trace
        .iter()
        .filter(|t| t.0 == Side::B)
        .map(|t| t.1.bth.psn)
        .collect();
    assert!(psns.iter().enumerate().all(|(i, p)| *p == i as u32));
}

#[test]
fn every_path_mtu_segments_correctly() {
    for (mtu, bytes) in [
        (Mtu::M256, 256),
        (Mtu::M512, 512),
        (Mtu::M1024, 1024),
        (Mtu::M2048, 2048),
        (Mtu::M4096, 4096),
    ] {
        let mut c = cfg();
        c.pmtu = mtu;
        let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 16);
        let data = pattern(bytes, 9000);
        fill_a(&mut sim, a, 0, &data);
        sim.a
            .post_send(write(1, a.lkey, A_BASE, 9000, B_BASE, b.rkey, None));
        sim.a
            .post_send(read(2, a.lkey, A_BASE + 20_000, 9000, B_BASE, b.rkey));
        sim.run_idle(10 * MS);
        assert_eq!(one(&sim.a.done, 1).status, WcStatus::Success);
        assert_eq!(one(&sim.a.done, 2).status, WcStatus::Success);
        assert_eq!(a_bytes(&sim, a, 20_000, 9000), data);
        let n = 9000usize.div_ceil(bytes as usize);
        assert_eq!(
            sim.count(Side::A, |r| r.bth.opcode != Opcode::RdmaReadRequest),
            n
        );
        assert_eq!(
            sim.count(Side::B, |r| r.bth.opcode.is_response()
                && r.bth.opcode != Opcode::Acknowledge),
            n
        );
        assert!(sim.trace.iter().all(|t| t.2 <= bytes as usize));
    }
}

#[test]
fn ack_coalescing_every_n_packets() {
    let mut c = cfg();
    c.pmtu = Mtu::M256;
    c.ack_req_every = 8;
    c.ack_coalesce = 1000;
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 16);
    // Packets arrive one by one, so every owed ACK gets its own transmit
    // opportunity.
    sim.serialize_ns = 100;
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 32 * 256, B_BASE, b.rkey, None));
    sim.run_idle(10 * MS);
    assert_eq!(one(&sim.a.done, 1).status, WcStatus::Success);
    assert_eq!(sim.count(Side::A, |r| r.bth.ack_req), 4);
    assert_eq!(sim.count(Side::B, is_ack), 4);
    assert_eq!(sim.count(Side::A, |_| true), 32);
}

#[test]
fn ack_coalescing_by_responder_limit() {
    let mut c = cfg();
    c.pmtu = Mtu::M256;
    c.ack_req_every = 1000;
    c.ack_coalesce = 10;
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 16);
    sim.serialize_ns = 100;
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 35 * 256, B_BASE, b.rkey, None));
    sim.run_idle(10 * MS);
    // Every 10 packets, plus the AckReq on the last one.
    assert_eq!(sim.count(Side::B, is_ack), 4);
}

#[test]
fn ack_coalescing_one_cumulative_ack_per_burst() {
    let (mut sim, a, b) = pair(cfg(), Faults::NONE, 1, 1 << 16);
    for i in 0..10 {
        sim.b.post_recv(100 + i, b.lkey, B_BASE + i * 64, 64);
    }
    for i in 0..10 {
        sim.a.post_send(send(i, a.lkey, A_BASE, 8, None));
    }
    sim.run_idle(10 * MS);
    // Ten AckReq packets arrive in one burst: a single ACK with MSN 10.
    assert_eq!(sim.count(Side::A, |r| r.bth.ack_req), 10);
    let acks: Vec<_> = sim.trace.iter().filter(|t| t.0 == Side::B).collect();
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].1.aeth.unwrap().msn, 10);
    assert_eq!(acks[0].1.bth.psn, 9);
    assert_eq!(sim.a.done.len(), 10);
    assert!(sim.a.done.iter().all(|w| w.status == WcStatus::Success));
}

#[test]
fn psn_sequence_error_nak_and_go_back_n() {
    let mut c = cfg();
    c.pmtu = Mtu::M256;
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 16);
    let data = pattern(8, 20 * 256);
    fill_a(&mut sim, a, 0, &data);
    sim.drop_first(|side, r| side == Side::A && r.bth.psn == 3);
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 20 * 256, B_BASE, b.rkey, None));
    sim.run_idle(10 * MS);
    assert_eq!(one(&sim.a.done, 1).status, WcStatus::Success);
    assert_eq!(b_bytes(&sim, b, 0, 20 * 256), data);
    // Sixteen packets arrived out of order, one NAK went out.
    let naks: Vec<_> = sim
        .trace
        .iter()
        .filter(|t| t.0 == Side::B && is_nak(&t.1, NakCode::PsnSequenceError))
        .collect();
    assert_eq!(naks.len(), 1);
    assert_eq!(naks[0].1.bth.psn, 3);
    assert_eq!(sim.b.qp.stats().out_of_sequence, 16);
    // Go-back-N resent PSNs 3..20 without waiting for a timeout.
    let st = sim.a.qp.stats();
    assert_eq!(st.timeouts, 0);
    assert_eq!(st.go_back_n, 1);
    assert_eq!(st.retransmissions, 17);
    let resent: Vec<u32> = sim
        .trace
        .iter()
        .filter(|t| t.0 == Side::A)
        .skip(20)
        .map(|t| t.1.bth.psn)
        .collect();
    assert_eq!(resent, (3..20).collect::<Vec<_>>());
}

/// Post `wr` against a responder region and expect a remote access error
/// NAK with the responder's memory unchanged.
fn expect_access_error(
    b_access: Access,
    wr_for: impl Fn(MrKeys, MrKeys) -> crate::transport::WorkRequest,
) {
    let mut sim = Sim::new(cfg(), Faults::NONE, 1);
    let a = sim.a.register(A_BASE, 1 << 16, Access::ALL);
    let b = sim.b.register(B_BASE, 8192, b_access);
    fill_a(&mut sim, a, 0, &pattern(10, 1 << 16));
    fill_b(&mut sim, b, 0, &pattern(11, 8192));
    let before = b_bytes(&sim, b, 0, 8192);
    let a_before = a_bytes(&sim, a, 0, 1 << 16);
    sim.a.post_send(wr_for(a, b));
    sim.a.post_send(send(2, a.lkey, A_BASE, 10, None));
    sim.run_idle(10 * MS);
    assert_eq!(
        b_bytes(&sim, b, 0, 8192),
        before,
        "responder memory changed"
    );
    assert_eq!(
        a_bytes(&sim, a, 0, 1 << 16),
        a_before,
        "requester memory changed"
    );
    assert_eq!(one(&sim.a.done, 1).status, WcStatus::RemoteAccessError);
    assert_eq!(one(&sim.a.done, 2).status, WcStatus::WrFlushError);
    assert_eq!(
        sim.count(Side::B, |r| is_nak(r, NakCode::RemoteAccessError)),
        1
    );
    assert_eq!(sim.a.qp.state(), QpState::Error);
    assert_eq!(sim.b.qp.state(), QpState::Error);
    // Later posts complete at once with a flush error.
    sim.a.post_send(send(3, a.lkey, A_BASE, 10, None));
    sim.a.drain();
    assert_eq!(one(&sim.a.done, 3).status, WcStatus::WrFlushError);
}

#[test]
fn remote_access_error_bad_rkey() {
    expect_access_error(Access::ALL, |a, b| {
        write(1, a.lkey, A_BASE, 3000, B_BASE, b.rkey ^ 0x40, None)
    });
    expect_access_error(Access::ALL, |a, b| {
        read(1, a.lkey, A_BASE, 100, B_BASE, b.lkey)
    });
}

#[test]
fn remote_access_error_out_of_bounds() {
    // A multi-packet WRITE whose range ends 1 byte past the region: not even
    // its first packet may land.
    expect_access_error(Access::ALL, |a, b| {
        write(1, a.lkey, A_BASE, 4097, B_BASE + 4096, b.rkey, None)
    });
    expect_access_error(Access::ALL, |a, b| {
        write(1, a.lkey, A_BASE, 16, B_BASE - 1, b.rkey, None)
    });
    expect_access_error(Access::ALL, |a, b| {
        read(1, a.lkey, A_BASE, 8193, B_BASE, b.rkey)
    });
}

#[test]
fn remote_access_error_missing_permission() {
    expect_access_error(Access::REMOTE_READ | Access::LOCAL_WRITE, |a, b| {
        write(1, a.lkey, A_BASE, 100, B_BASE, b.rkey, None)
    });
    expect_access_error(Access::REMOTE_WRITE | Access::LOCAL_WRITE, |a, b| {
        read(1, a.lkey, A_BASE, 100, B_BASE, b.rkey)
    });
}

#[test]
fn retry_exhaustion_completes_with_retry_exceeded_and_errors_the_qp() {
    let mut c = cfg();
    c.retry_limit = 3;
    c.timeout_ns = 50_000;
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 16);
    sim.filter = Some(Box::new(|side, _| {
        if side == Side::A {
            Fate::Drop
        } else {
            Fate::Pass
        }
    }));
    sim.b.post_recv(5, b.lkey, B_BASE, 64);
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 100, B_BASE, b.rkey, None));
    sim.a.post_send(send(2, a.lkey, A_BASE, 10, None));
    let start = sim.now;
    sim.run_idle(100 * MS);
    assert_eq!(one(&sim.a.done, 1).status, WcStatus::RetryExceeded);
    assert_eq!(one(&sim.a.done, 2).status, WcStatus::WrFlushError);
    assert_eq!(sim.a.qp.state(), QpState::Error);
    assert_eq!(sim.a.qp.stats().timeouts, 4);
    // Exponential backoff: the timeouts were T, 2T, 4T, 8T.
    assert_eq!(sim.now - start, 15 * 50_000);
    // Each retransmission round resent both messages.
    let times: Vec<u32> = sim
        .trace
        .iter()
        .filter(|t| t.0 == Side::A)
        .map(|t| t.1.bth.psn)
        .collect();
    assert_eq!(times, [0, 1, 0, 1, 0, 1, 0, 1]);
    sim.a.post_send(read(3, a.lkey, A_BASE, 10, B_BASE, b.rkey));
    sim.a.drain();
    assert_eq!(one(&sim.a.done, 3).status, WcStatus::WrFlushError);
    // The responder never heard of any of it.
    assert_eq!(sim.b.qp.state(), QpState::Ready);
}

#[test]
fn lost_ack_recovered_by_timer() {
    let (mut sim, a, b) = pair(cfg(), Faults::NONE, 1, 1 << 16);
    sim.drop_first(|side, _| side == Side::B);
    fill_a(&mut sim, a, 0, b"abcdef");
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 6, B_BASE, b.rkey, None));
    sim.run_idle(10 * MS);
    assert_eq!(one(&sim.a.done, 1).status, WcStatus::Success);
    assert_eq!(sim.a.qp.stats().timeouts, 1);
    assert_eq!(sim.b.qp.stats().duplicate_requests, 1);
    // The duplicate was re-ACKed with the current MSN.
    let acks: Vec<u32> = sim
        .trace
        .iter()
        .filter(|t| t.0 == Side::B)
        .map(|t| t.1.aeth.unwrap().msn)
        .collect();
    assert_eq!(acks, [1, 1]);
}

#[test]
fn duplicate_write_is_not_reapplied() {
    let (mut sim, a, b) = pair(cfg(), Faults::NONE, 1, 1 << 16);
    fill_a(&mut sim, a, 0, &[0xaa; 64]);
    fill_a(&mut sim, a, 64, &[0xbb; 64]);
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 64, B_BASE, b.rkey, None));
    sim.transmit();
    // Keep a copy of the first WRITE's frame.
    let pkt = sim.trace.last().unwrap().1;
    let mut frame = vec![0u8; 512];
    let n = pkt.emit(&mut frame, &[0xaa; 64]).unwrap();
    frame.truncate(n);
    sim.run_idle(10 * MS);
    // A second WRITE overwrites the same bytes.
    sim.a
        .post_send(write(2, a.lkey, A_BASE + 64, 64, B_BASE, b.rkey, None));
    sim.run_idle(10 * MS);
    assert_eq!(b_bytes(&sim, b, 0, 64), [0xbb; 64]);
    let acks_before = sim.b.qp.stats().acks_sent;
    // The stale first WRITE shows up again.
    sim.inject(Side::A, frame);
    sim.run_idle(10 * MS);
    assert_eq!(
        b_bytes(&sim, b, 0, 64),
        [0xbb; 64],
        "duplicate WRITE re-applied"
    );
    assert_eq!(sim.b.qp.stats().duplicate_requests, 1);
    assert_eq!(sim.b.qp.stats().acks_sent, acks_before + 1);
    let last = sim.trace.last().unwrap();
    assert_eq!(last.0, Side::B);
    assert_eq!(
        last.1.aeth.unwrap().msn,
        2,
        "re-ACK carries the current MSN"
    );
    assert_eq!(last.1.bth.psn, 1);
    assert_eq!(sim.a.done.len(), 2);
}

#[test]
fn duplicate_send_is_not_delivered_twice() {
    let (mut sim, a, b) = pair(cfg(), Faults::NONE, 1, 1 << 16);
    let mut n = 0;
    sim.filter = Some(Box::new(move |side, _| {
        n += 1;
        if side == Side::A && n == 1 {
            Fate::Duplicate
        } else {
            Fate::Pass
        }
    }));
    sim.b.post_recv(1, b.lkey, B_BASE, 64);
    sim.b.post_recv(2, b.lkey, B_BASE + 64, 64);
    sim.a.post_send(send(10, a.lkey, A_BASE, 32, None));
    sim.run_idle(10 * MS);
    assert_eq!(one(&sim.a.done, 10).status, WcStatus::Success);
    assert_eq!(sim.b.done.len(), 1);
    assert_eq!(sim.b.qp.responder().posted_receives(), 1);
    assert_eq!(sim.b.qp.stats().duplicate_requests, 1);
}

#[test]
fn duplicate_read_is_reexecuted_from_memory() {
    let mut c = cfg();
    c.pmtu = Mtu::M512;
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 16);
    fill_b(&mut sim, b, 0, &pattern(20, 2048));
    // Lose every response of the first execution.
    let mut from_b = 0;
    sim.filter = Some(Box::new(move |side, _| {
        if side == Side::B {
            from_b += 1;
            if from_b <= 4 {
                return Fate::Drop;
            }
        }
        Fate::Pass
    }));
    sim.a
        .post_send(read(1, a.lkey, A_BASE, 2048, B_BASE, b.rkey));
    // Change the source while the responses are lost: the retry must see it.
    sim.run_until(MS, |s| s.b.qp.stats().read_responses_sent == 4);
    let newer = pattern(21, 2048);
    fill_b(&mut sim, b, 0, &newer);
    sim.run_idle(10 * MS);
    assert_eq!(one(&sim.a.done, 1).status, WcStatus::Success);
    assert_eq!(a_bytes(&sim, a, 0, 2048), newer);
    assert_eq!(sim.a.qp.stats().timeouts, 1);
    assert_eq!(sim.b.qp.stats().duplicate_requests, 1);
    assert_eq!(sim.b.qp.stats().reexecuted_reads, 1);
    assert_eq!(sim.b.qp.stats().read_responses_sent, 8);
    assert_eq!(
        sim.b.qp.responder().msn(),
        1,
        "a re-executed READ is not a new message"
    );
}

#[test]
fn read_response_gap_requests_only_the_rest() {
    let mut c = cfg();
    c.pmtu = Mtu::M256;
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 16);
    let data = pattern(22, 2560);
    fill_b(&mut sim, b, 0, &data);
    sim.drop_first(|side, r| side == Side::B && r.bth.psn == 4);
    sim.a
        .post_send(read(1, a.lkey, A_BASE, 2560, B_BASE, b.rkey));
    sim.run_idle(10 * MS);
    assert_eq!(one(&sim.a.done, 1).status, WcStatus::Success);
    assert_eq!(a_bytes(&sim, a, 0, 2560), data);
    assert_eq!(sim.a.qp.stats().timeouts, 0);
    // The retry asked for PSN 4 onwards: 6 packets, starting 1024 bytes in.
    let reqs: Vec<_> = sim
        .trace
        .iter()
        .filter(|t| t.1.bth.opcode == Opcode::RdmaReadRequest)
        .collect();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[1].1.bth.psn, 4);
    let reth = reqs[1].1.reth.unwrap();
    assert_eq!((reth.virtual_addr, reth.dma_len), (B_BASE + 1024, 1536));
}

#[test]
fn psn_wraps_across_0xffffff() {
    let mut c = cfg();
    c.pmtu = Mtu::M256;
    c.send_psn = 0xff_fff8;
    c.recv_psn = 0xff_fff0;
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 20);
    // Drop one packet right after the wrap to exercise NAK/go-back-N there.
    sim.drop_first(|side, r| side == Side::A && r.bth.psn == 1);
    let w = pattern(30, 16 * 256);
    let s = pattern(31, 3000);
    let r = pattern(32, 5000);
    fill_a(&mut sim, a, 0, &w);
    fill_a(&mut sim, a, 100_000, &s);
    fill_b(&mut sim, b, 200_000, &r);
    sim.b.post_recv(50, b.lkey, B_BASE + 300_000, 4000);
    sim.a.post_send(write(
        1,
        a.lkey,
        A_BASE,
        w.len() as u32,
        B_BASE,
        b.rkey,
        None,
    ));
    sim.a
        .post_send(send(2, a.lkey, A_BASE + 100_000, 3000, None));
    sim.a.post_send(read(
        3,
        a.lkey,
        A_BASE + 400_000,
        5000,
        B_BASE + 200_000,
        b.rkey,
    ));
    // And traffic the other way, whose PSNs wrap from 0xfffff0.
    let back = pattern(33, 8000);
    fill_b(&mut sim, b, 600_000, &back);
    sim.b.post_send(write(
        9,
        b.lkey,
        B_BASE + 600_000,
        8000,
        A_BASE + 600_000,
        a.rkey,
        None,
    ));
    sim.run_idle(10 * MS);
    for id in 1..=3 {
        assert_eq!(one(&sim.a.done, id).status, WcStatus::Success, "wr {id}");
    }
    assert_eq!(one(&sim.b.done, 9).status, WcStatus::Success);
    assert_eq!(one(&sim.b.done, 50).byte_len, 3000);
    assert_eq!(b_bytes(&sim, b, 0, w.len()), w);
    assert_eq!(b_bytes(&sim, b, 300_000, 3000), s);
    assert_eq!(a_bytes(&sim, a, 400_000, 5000), r);
    assert_eq!(a_bytes(&sim, a, 600_000, 8000), back);
    // 16 + 12 + 20 PSNs from 0xfffff8 end at 0x28.
    assert_eq!(
        sim.b.qp.responder().expected_psn(),
        psn::add(0xff_fff8, 16 + 12 + 20)
    );
    assert_eq!(sim.a.qp.responder().expected_psn(), psn::add(0xff_fff0, 32));
    assert_eq!(sim.a.qp.requester().snd_una(), 0x28);
    assert!(sim.trace.iter().any(|t| t.1.bth.psn == 0xff_ffff));
    assert_eq!(
        sim.count(Side::B, |r| is_nak(r, NakCode::PsnSequenceError)),
        1
    );
}

#[test]
fn in_flight_cap_is_respected_and_resumes_on_ack() {
    let mut c = cfg();
    c.pmtu = Mtu::M256;
    c.max_in_flight = 8;
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 16);
    for i in 0..10u64 {
        sim.a.post_send(write(
            i,
            a.lkey,
            A_BASE,
            4 * 256,
            B_BASE + i * 1024,
            b.rkey,
            None,
        ));
    }
    // After the first transmit opportunity exactly 8 packets are out.
    sim.transmit();
    assert_eq!(sim.count(Side::A, |_| true), 8);
    assert_eq!(sim.a.qp.requester().in_flight(), 8);
    assert!(sim.a.qp.poll_transmit(sim.now).is_none());
    // The window-filling packet asks for an ACK.
    assert!(sim.trace.last().unwrap().1.bth.ack_req);
    sim.run_idle(10 * MS);
    assert_eq!(sim.a.done.len(), 10);
    assert!(sim.a.done.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(sim.max_in_flight[Side::A as usize], 8);
    assert_eq!(sim.count(Side::A, |_| true), 40);
}

#[test]
fn in_flight_cap_holds_under_faults() {
    let mut c = cfg();
    c.pmtu = Mtu::M256;
    c.max_in_flight = 5;
    let (mut sim, a, b) = pair(c, Faults::each(30_000), 77, 1 << 16);
    for i in 0..20u64 {
        sim.a.post_send(write(
            i,
            a.lkey,
            A_BASE,
            3 * 256,
            B_BASE + i * 1024,
            b.rkey,
            None,
        ));
    }
    sim.run_idle(100 * MS);
    assert_eq!(sim.a.done.len(), 20);
    assert!(sim.a.done.iter().all(|w| w.status == WcStatus::Success));
    assert!(sim.max_in_flight[Side::A as usize] <= 5);
}

#[test]
fn rnr_nak_then_retry_after_rnr_timer() {
    let mut c = cfg();
    c.rnr_timer_code = 5; // 60 µs
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 16);
    sim.a.post_send(send(1, a.lkey, A_BASE, 2000, None));
    // No receive posted: the responder refuses with RNR NAKs.
    sim.run_until(MS, |s| s.a.qp.stats().rnr_naks_received == 2);
    assert_eq!(
        sim.count(Side::B, |r| r.aeth.map(|a| a.syndrome)
            == Some(Syndrome::RnrNak { timer_code: 5 })),
        2
    );
    assert!(sim.a.done.is_empty());
    // The retries were spaced by the RNR timer.
    let firsts: Vec<_> = sim
        .trace
        .iter()
        .filter(|t| t.1.bth.opcode == Opcode::SendFirst)
        .collect();
    assert_eq!(firsts.len(), 2);
    sim.b.post_recv(9, b.lkey, B_BASE, 4096);
    sim.run_idle(10 * MS);
    assert_eq!(one(&sim.a.done, 1).status, WcStatus::Success);
    assert_eq!(one(&sim.b.done, 9).byte_len, 2000);
    assert_eq!(sim.a.qp.stats().timeouts, 0);
    // Only one NAK per refused PSN burst: the SEND MIDDLE behind the refused
    // FIRST was dropped silently.
    assert_eq!(
        sim.b.qp.stats().rnr_naks_sent,
        sim.a.qp.stats().rnr_naks_received
    );
}

#[test]
fn rnr_retry_limit_ends_in_error() {
    let mut c = cfg();
    c.rnr_retry_limit = 2;
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 16);
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 8, B_BASE, b.rkey, None));
    sim.a
        .post_send(write(2, a.lkey, A_BASE, 8, B_BASE, b.rkey, Some(1)));
    sim.run_idle(100 * MS);
    assert_eq!(one(&sim.a.done, 1).status, WcStatus::Success);
    assert_eq!(one(&sim.a.done, 2).status, WcStatus::RnrRetryExceeded);
    assert_eq!(sim.a.qp.stats().rnr_naks_received, 3);
    assert_eq!(sim.a.qp.state(), QpState::Error);
    // The responder stays usable: RNR is not a fatal error for it.
    assert_eq!(sim.b.qp.state(), QpState::Ready);
}

#[test]
fn icrc_corruption_is_counted_and_recovered() {
    let (mut sim, a, b) = pair(cfg(), Faults::NONE, 1, 1 << 16);
    sim.faults.corrupt = 1_000_000;
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 100, B_BASE, b.rkey, None));
    sim.run_until(MS, |s| s.wire.icrc_errors == 2);
    sim.faults.corrupt = 0;
    sim.run_idle(10 * MS);
    assert_eq!(one(&sim.a.done, 1).status, WcStatus::Success);
    assert_eq!(sim.wire.parse_errors, 0);
    assert!(sim.wire.icrc_errors >= 2);
}

#[test]
fn full_queues_refuse_posts() {
    let mut c = cfg();
    c.max_send_wr = 2;
    c.max_recv_wr = 1;
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 4096);
    let mem = &sim.a.mem;
    let cq = &mut sim.a.cq;
    let qp = &mut sim.a.qp;
    qp.post_send(&send(1, a.lkey, A_BASE, 8, None), mem, cq)
        .unwrap();
    qp.post_send(&send(2, a.lkey, A_BASE, 8, None), mem, cq)
        .unwrap();
    assert!(!qp.send_queue_has_room());
    assert_eq!(
        qp.post_send(&send(3, a.lkey, A_BASE, 8, None), mem, cq),
        Err(PostError::SendQueueFull)
    );
    let rr = |wr_id| RecvRequest::new(wr_id, SgList::one(b.lkey, B_BASE, 8));
    sim.b
        .qp
        .post_recv(&rr(1), &sim.b.mem, &mut sim.b.cq)
        .unwrap();
    assert_eq!(
        sim.b.qp.post_recv(&rr(2), &sim.b.mem, &mut sim.b.cq),
        Err(PostError::RecvQueueFull)
    );
    assert!(sim.a.cq.is_empty() && sim.b.cq.is_empty());
    assert!(QueuePairCheck::bad_config());
}

/// Each bad local buffer completes its request with the verbs status and moves the QP to the
/// error state; what is posted afterwards completes with a flush error. Nothing panics.
#[test]
fn bad_local_buffers_complete_with_local_protection_errors() {
    for case in 0..4 {
        let (mut sim, a, b) = pair(cfg(), Faults::NONE, 1, 4096);
        let ro = sim.a.register(0x9000_0000, 4096, Access::NONE);
        let (what, wr) = match case {
            // A READ must land in LOCAL_WRITE memory.
            0 => (
                "read into read-only memory",
                read(1, ro.lkey, 0x9000_0000, 8, B_BASE, b.rkey),
            ),
            1 => (
                "range past the region",
                send(1, a.lkey, A_BASE + 4000, 200, None),
            ),
            2 => ("an rkey used as an lkey", send(1, a.rkey, A_BASE, 1, None)),
            _ => (
                "a second piece with a bad key",
                WorkRequest::send(
                    1,
                    SgList::from_slice(&[
                        crate::transport::Sge::new(ro.lkey, 0x9000_0000, 8),
                        crate::transport::Sge::new(0xdead_0000, 0, 8),
                    ])
                    .unwrap(),
                    None,
                ),
            ),
        };
        let (mem, cq, qp) = (&sim.a.mem, &mut sim.a.cq, &mut sim.a.qp);
        qp.post_send(&wr, mem, cq).expect("accepted, then failed");
        assert_eq!(qp.state(), crate::transport::QpState::Error, "{what}");
        qp.post_send(&send(2, a.lkey, A_BASE, 8, None), mem, cq)
            .unwrap();
        let got: Vec<_> = std::iter::from_fn(|| cq.poll())
            .map(|w| (w.wr_id, w.status))
            .collect();
        assert_eq!(
            got,
            [
                (1, WcStatus::LocalProtectionError),
                (2, WcStatus::WrFlushError)
            ],
            "{what}"
        );
    }
    // A receive buffer without LOCAL_WRITE.
    let (mut sim, _, _) = pair(cfg(), Faults::NONE, 1, 4096);
    let ro = sim.b.register(0x9000_0000, 4096, Access::REMOTE_READ);
    let rr = RecvRequest::new(5, SgList::one(ro.lkey, 0x9000_0000, 64));
    sim.b.qp.post_recv(&rr, &sim.b.mem, &mut sim.b.cq).unwrap();
    let wc = sim.b.cq.poll().unwrap();
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (5, WcOpcode::Recv, WcStatus::LocalProtectionError)
    );
}

struct QueuePairCheck;

impl QueuePairCheck {
    fn bad_config() -> bool {
        let mut c = cfg();
        c.max_in_flight = 0;
        let e1 = crate::transport::QueuePair::new(c).is_err();
        let mut c = cfg();
        c.send_psn = 1 << 24;
        e1 && crate::transport::QueuePair::new(c).is_err()
    }
}

/// A packet's frame written into a buffer one byte short is refused as truncated with the
/// buffer untouched; into one of its length, it is the frame of the packet's whole headers
/// (`QueuePair::packet_repr`) and payload.
#[test]
fn a_frame_is_written_whole_or_not_at_all() {
    let (mut sim, a, b) = pair(cfg(), Faults::NONE, 1, 4096);
    let sent: Vec<u8> = (1..=10).collect();
    assert!(sim.a.mem.write(a.lkey, 0, &sent));
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 10, B_BASE, b.rkey, None));
    let pkt = sim.a.qp.poll_transmit(sim.now).unwrap();
    let len = pkt.frame_len();
    let mut short = vec![0xee; len - 1];
    assert_eq!(
        sim.a.qp.emit(&pkt, &sim.a.mem, &mut short),
        Err(wire::Error::Truncated {
            layer: wire::Layer::Buffer,
            need: len,
            have: len - 1
        })
    );
    assert!(short.iter().all(|&b| b == 0xee));
    let mut frame = vec![0; len];
    assert_eq!(sim.a.qp.emit(&pkt, &sim.a.mem, &mut frame), Ok(len));
    let (repr, payload) = wire::parse_frame(&frame).unwrap();
    let mut expected = sim.a.qp.packet_repr(&pkt);
    expected.bth.pad_count = wire::pad_for(10);
    assert_eq!(repr, expected);
    assert_eq!(payload, &sent[..]);
}

#[test]
fn packets_for_other_qpns_are_ignored() {
    let (mut sim, a, b) = pair(cfg(), Faults::NONE, 1, 4096);
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 8, B_BASE, b.rkey, None));
    let pkt = sim.a.qp.poll_transmit(sim.now).unwrap();
    let mut repr = sim.a.qp.packet_repr(&pkt);
    repr.bth.dest_qp = 0x999;
    let mut payload = vec![0u8; pkt.payload_len()];
    sim.a
        .qp
        .copy_payload(pkt.payload.as_ref().unwrap(), &sim.a.mem, &mut payload);
    sim.b
        .qp
        .on_packet(sim.now, &repr, &payload, &mut sim.b.mem, &mut sim.b.cq);
    assert_eq!(sim.b.qp.stats().rx_dropped, 1);
    assert_eq!(sim.b.qp.responder().expected_psn(), 0);
}

#[test]
fn read_larger_than_window_goes_alone_and_read_limit_holds() {
    let mut c = cfg();
    c.pmtu = Mtu::M256;
    c.max_in_flight = 4;
    c.max_rd_atomic = 2;
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 16);
    let data = pattern(40, 4096);
    fill_b(&mut sim, b, 0, &data);
    // 16 response PSNs, four times the window.
    sim.a
        .post_send(read(1, a.lkey, A_BASE, 4096, B_BASE, b.rkey));
    for i in 0..4u64 {
        sim.a.post_send(read(
            10 + i,
            a.lkey,
            A_BASE + 8192 + i * 64,
            64,
            B_BASE + i * 64,
            b.rkey,
        ));
    }
    sim.transmit();
    // Only the big READ went out: the small ones wait for the window.
    assert_eq!(sim.count(Side::A, |_| true), 1);
    sim.run_until(MS, |s| !s.a.done.is_empty());
    sim.transmit();
    // Now at most two READs (max_rd_atomic) are outstanding.
    assert_eq!(sim.count(Side::A, |_| true), 3);
    sim.run_idle(10 * MS);
    assert_eq!(sim.a.done.len(), 5);
    assert!(sim.a.done.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(a_bytes(&sim, a, 0, 4096), data);
    for i in 0..4 {
        assert_eq!(
            a_bytes(&sim, a, 8192 + i * 64, 64),
            data[i * 64..i * 64 + 64]
        );
    }
}

#[test]
fn bidirectional_traffic_under_faults() {
    let mut c = cfg();
    c.pmtu = Mtu::M512;
    c.max_in_flight = 16;
    let (mut sim, a, b) = pair(c, Faults::each(20_000), 99, 1 << 20);
    let n = 40u64;
    let len = 3000usize;
    for i in 0..n {
        let off = i as usize * 4096;
        fill_a(&mut sim, a, off, &pattern(1000 + i, len));
        fill_b(&mut sim, b, off, &pattern(2000 + i, len));
        let (la, lb) = (A_BASE + off as u64, B_BASE + off as u64);
        let (ra, rb) = (
            A_BASE + 512 * 1024 + off as u64,
            B_BASE + 512 * 1024 + off as u64,
        );
        match i % 3 {
            0 => {
                sim.a
                    .post_send(write(i, a.lkey, la, len as u32, rb, b.rkey, None));
                sim.b
                    .post_send(write(i, b.lkey, lb, len as u32, ra, a.rkey, None));
            }
            1 => {
                sim.a.post_send(read(i, a.lkey, ra, len as u32, lb, b.rkey));
                sim.b.post_send(read(i, b.lkey, rb, len as u32, la, a.rkey));
            }
            _ => {
                sim.a.post_recv(100 + i, a.lkey, ra, 4096);
                sim.b.post_recv(100 + i, b.lkey, rb, 4096);
                sim.a.post_send(send(i, a.lkey, la, len as u32, None));
                sim.b.post_send(send(i, b.lkey, lb, len as u32, None));
            }
        }
    }
    sim.run_idle(1000 * MS);
    let recvs = (0..n).filter(|i| i % 3 == 2).count();
    for ep in [&sim.a, &sim.b] {
        assert_eq!(ep.done.len(), n as usize + recvs);
        assert!(ep.done.iter().all(|w| w.status == WcStatus::Success));
    }
    for i in 0..n {
        let off = 512 * 1024 + i as usize * 4096;
        // What A wrote/sent to B, or B read from A, sits at B's mirror offset.
        let (from_a, from_b) = (pattern(1000 + i, len), pattern(2000 + i, len));
        match i % 3 {
            1 => {
                assert_eq!(a_bytes(&sim, a, off, len), from_b);
                assert_eq!(b_bytes(&sim, b, off, len), from_a);
            }
            _ => {
                assert_eq!(b_bytes(&sim, b, off, len), from_a);
                assert_eq!(a_bytes(&sim, a, off, len), from_b);
            }
        }
    }
    assert!(sim.wire.dropped > 0 && sim.wire.icrc_errors > 0);
}

/// Seed 000's GET split: a READ longer than `read_split_packets` goes as sub-requests at the
/// sub-request boundaries, each its own READ request (counted against `max_rd_atomic` as the
/// responder counts it) pulling back its own First..Last responses; a response lost in the
/// second sub-request is asked for again to the end of that sub-request only; the data and
/// the one completion are as for one request.
#[test]
fn a_split_read_goes_as_sub_requests_and_a_retry_asks_for_the_rest_of_one() {
    let mut c = cfg();
    c.pmtu = Mtu::M256;
    c.read_split_packets = 4;
    c.max_rd_atomic = 2;
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 16);
    // 10 packets of response (2 500 bytes): sub-requests of 4, 4 and 2 packets.
    let data = pattern(41, 2500);
    fill_b(&mut sim, b, 0, &data);
    sim.drop_first(|side, r| side == Side::B && r.bth.psn == 5);
    sim.a
        .post_send(read(1, a.lkey, A_BASE, 2500, B_BASE, b.rkey));
    sim.run_idle(10 * MS);
    let wc = one(&sim.a.done, 1);
    assert_eq!(
        (wc.opcode, wc.status, wc.byte_len),
        (WcOpcode::RdmaRead, WcStatus::Success, 2500)
    );
    assert_eq!(a_bytes(&sim, a, 0, 2500), data);
    let reqs: Vec<(u32, u64, u32)> = sim
        .trace
        .iter()
        .filter(|t| t.1.bth.opcode == Opcode::RdmaReadRequest)
        .map(|t| {
            let reth = t.1.reth.unwrap();
            (t.1.bth.psn, reth.virtual_addr - B_BASE, reth.dma_len)
        })
        .collect();
    // Two sub-requests at once (max_rd_atomic 2); the retry of the rest of the second (PSN 5
    // to its end at 7); the third only once the first was answered.
    assert_eq!(
        reqs,
        [
            (0, 0, 1024),
            (4, 1024, 1024),
            (5, 1280, 768),
            (8, 2048, 452)
        ]
    );
    let at = |side: Side, psn: u32, op: Opcode| {
        sim.trace
            .iter()
            .position(|t| t.0 == side && t.1.bth.psn == psn && t.1.bth.opcode == op)
            .unwrap()
    };
    assert!(at(Side::A, 8, Opcode::RdmaReadRequest) > at(Side::B, 3, Opcode::RdmaReadResponseLast));
    // Every sub-request is answered First..Last (the retry's too).
    let firsts = sim
        .trace
        .iter()
        .filter(|t| t.0 == Side::B && t.1.bth.opcode == Opcode::RdmaReadResponseFirst)
        .count();
    assert_eq!(firsts, 4);
    assert_eq!(sim.a.qp.stats().timeouts, 0);
}

/// Lists of several pieces keep theirs in a ring with a list per request that can be alive
/// (`Spill`), reused without being given back. Five rounds of a full send queue of 3-piece
/// WRITEs and SENDs into 3-piece receive buffers (multi-packet, so each list is read again
/// after later ones were taken) wrap both rings: every byte lands where its own pieces say.
/// With a ring of one list instead of `max_send_wr`, the WRITEs gather each other's pieces.
#[test]
fn many_piece_lists_at_full_depth_keep_their_pieces_while_the_ring_wraps() {
    let mut c = cfg();
    c.max_send_wr = 4;
    c.max_recv_wr = 4;
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 20);
    let pieces = |base: u64, i: u64| {
        let at = base + i * 8192;
        [(at, 100u32), (at + 1000, 1500), (at + 3000, 700)]
    };
    let list = |lkey: u32, p: [(u64, u32); 3]| {
        SgList::from_slice(&p.map(|(addr, len)| crate::transport::Sge::new(lkey, addr, len)))
            .unwrap()
    };
    for round in 0..5u64 {
        let mut expect = Vec::new();
        for k in 0..4u64 {
            let i = round * 4 + k;
            let data = pattern(100 + i, 2300);
            let mut off = 0;
            for (addr, len) in pieces(A_BASE, k) {
                let len = len as usize;
                fill_a(&mut sim, a, (addr - A_BASE) as usize, &data[off..off + len]);
                off += len;
            }
            let send = k % 2 == 1;
            if send {
                let wr = crate::transport::RecvRequest::new(i, list(b.lkey, pieces(B_BASE, k)));
                sim.b.qp.post_recv(&wr, &sim.b.mem, &mut sim.b.cq).unwrap();
                sim.a
                    .post_send(WorkRequest::send(i, list(a.lkey, pieces(A_BASE, k)), None));
            } else {
                let to = B_BASE + 0x8_0000 + k * 4096;
                let sgl = list(a.lkey, pieces(A_BASE, k));
                sim.a
                    .post_send(WorkRequest::write(i, sgl, to, b.rkey, None));
            }
            expect.push((k, send, data));
        }
        sim.run_idle(10 * MS);
        sim.a.drain();
        for (k, send, data) in expect {
            let got = if send {
                let mut got = Vec::new();
                for (addr, len) in pieces(B_BASE, k) {
                    got.extend(b_bytes(&sim, b, (addr - B_BASE) as usize, len as usize));
                }
                got
            } else {
                b_bytes(&sim, b, 0x8_0000 + k as usize * 4096, 2300)
            };
            assert!(
                got == data,
                "round {round}, request {k} ({})",
                if send { "SEND" } else { "WRITE" }
            );
        }
    }
    assert_eq!(sim.a.done.len(), 20);
    assert!(sim.a.done.iter().all(|wc| wc.status == WcStatus::Success));
}

#[test]
fn frames_carry_their_payload_and_icrc_on_both_sides_of_the_copy_then_fold_cut() {
    // `QueuePair::emit` copies a payload of up to 256 bytes into the frame first and folds it
    // into the ICRC with the extension headers in one call, and folds a longer one as it
    // copies it. WRITEs (payload from the send queue) and READ responses (from a region) of
    // lengths on both sides of the cut, of one packet and of several: every frame's ICRC
    // verifies, and each message's payloads, joined, are its bytes.
    let mut c = cfg();
    c.pmtu = Mtu::M1024;
    let (mut sim, a, b) = pair(c, Faults::NONE, 1, 1 << 16);
    let mut frame = vec![0u8; 8192];
    use crate::transport::{MemoryTable, OutPacket, QueuePair};
    let mut emit_parse = |qp: &QueuePair, mem: &MemoryTable, pkt: &OutPacket| {
        let n = qp.emit(pkt, mem, &mut frame).unwrap();
        let (repr, payload) = wire::parse_frame(&frame[..n]).expect("its ICRC verifies");
        (repr, payload.to_vec())
    };
    for (k, len) in [1usize, 3, 64, 255, 256, 257, 300, 1024, 1025, 1300, 4096]
        .into_iter()
        .enumerate()
    {
        let k = k as u64;
        let data = pattern(k, len);
        fill_a(&mut sim, a, 0, &data);
        fill_b(&mut sim, b, 8192, &data);
        let len = len as u32;
        sim.a
            .post_send(write(k, a.lkey, A_BASE, len, B_BASE, b.rkey, None));
        sim.a.post_send(read(
            100 + k,
            a.lkey,
            A_BASE + 8192,
            len,
            B_BASE + 8192,
            b.rkey,
        ));
        let (mut written, mut read_back) = (Vec::new(), Vec::new());
        while let Some(pkt) = sim.a.qp.poll_transmit(sim.now) {
            let (repr, payload) = emit_parse(&sim.a.qp, &sim.a.mem, &pkt);
            if repr.bth.opcode.is_request() && repr.bth.opcode != Opcode::RdmaReadRequest {
                written.extend_from_slice(&payload);
            }
            let b_side = &mut sim.b;
            b_side
                .qp
                .on_packet(sim.now, &repr, &payload, &mut b_side.mem, &mut b_side.cq);
        }
        while let Some(pkt) = sim.b.qp.poll_transmit(sim.now) {
            let (repr, payload) = emit_parse(&sim.b.qp, &sim.b.mem, &pkt);
            if repr.bth.opcode.is_read_response() {
                read_back.extend_from_slice(&payload);
            }
            let a_side = &mut sim.a;
            a_side
                .qp
                .on_packet(sim.now, &repr, &payload, &mut a_side.mem, &mut a_side.cq);
        }
        assert_eq!(written, data, "WRITE of {len} bytes");
        assert_eq!(read_back, data, "READ of {len} bytes");
        assert_eq!(a_bytes(&sim, a, 8192, data.len()), data);
    }
}

/// A rendezvous send's tag header is written from the request when its packet goes (the
/// send queue keeps no copy): the envelope, the sender's rank, the buffer's address and rkey
/// and the request's first PSN as its cookie, and so while its region is being deregistered
/// (retired, held by the request) as when it was posted.
#[test]
fn a_rendezvous_header_names_its_buffer_while_the_region_is_retired() {
    use crate::transport::SgList;
    let mut c = cfg();
    c.tagged = true;
    c.tag_rank = 7;
    c.rndv_threshold = 64;
    let (mut sim, a, _b) = pair(c, Faults::NONE, 1, 4096);
    // A first request moves the next PSN on, so that the cookie is not 0.
    let eager = WorkRequest::tagged_send(1, SgList::one(a.lkey, A_BASE, 16), 3, 0xabc, 0x55);
    sim.a.post_send(eager);
    let rndv = WorkRequest::tagged_send(2, SgList::one(a.lkey, A_BASE + 256, 1000), 3, 0xdef, 9);
    sim.a.post_send(rndv);
    assert!(sim.a.mem.retire(a.lkey).is_some(), "retired, still held");
    let mut headers = Vec::new();
    while let Some(pkt) = sim.a.qp.poll_transmit(sim.now) {
        let mut frame = vec![0; pkt.frame_len()];
        assert_eq!(sim.a.qp.emit(&pkt, &sim.a.mem, &mut frame), Ok(frame.len()));
        let (_, payload) = wire::parse_frame(&frame).unwrap();
        headers.push(wire::tag::TagHeader::parse(payload).unwrap());
    }
    assert_eq!(
        headers,
        [
            wire::tag::TagHeader {
                kind: wire::tag::TagKind::Eager,
                endpoint: 3,
                initiator: 7,
                match_bits: 0xabc,
                hdr_data: 0x55,
                length: 16,
                cookie: 0,
            },
            wire::tag::TagHeader {
                kind: wire::tag::TagKind::Rendezvous {
                    addr: A_BASE + 256,
                    rkey: a.rkey,
                },
                endpoint: 3,
                initiator: 7,
                match_bits: 0xdef,
                hdr_data: 9,
                length: 1000,
                cookie: 1,
            },
        ]
    );
}
