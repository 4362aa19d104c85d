//! What the traffic shaper sees of a queue pair: `peek_request` names the request that
//! `poll_request` would send next, its frame bytes and the response bytes it will pull in,
//! and sends nothing.

use super::harness::Side;
use super::*;
use crate::transport::{Budget, Mtu};
use wire::Opcode;

#[test]
fn a_peek_names_the_next_request_and_what_it_pulls_in_without_sending_it() {
    let mut cfg = QpConfig::new(0x11, 0x22);
    cfg.pmtu = Mtu::M4096;
    cfg.max_in_flight = 16;
    let (mut sim, a, b) = pair(cfg.clone(), Faults::default(), 1, 1 << 20);
    // A WRITE of 10 000 bytes (3 packets), then a READ of 64 KiB (16 response PSNs), which
    // does not fit the window of 16 behind the WRITE's 3.
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 10_000, B_BASE, b.rkey, None));
    sim.a.post_send(read(
        2,
        a.lkey,
        A_BASE + 65_536,
        65_536,
        B_BASE + 65_536,
        b.rkey,
    ));
    let now = sim.now;
    let mut sizes = Vec::new();
    loop {
        let peek = sim.a.qp.peek_request(now);
        // Asking twice changes nothing.
        assert_eq!(sim.a.qp.peek_request(now), peek);
        let sent = sim.a.qp.poll_request(now, &mut Budget::packets(1));
        match (peek, sent) {
            (None, None) => break,
            (Some((frame, back)), Some(p)) => {
                assert_eq!(frame as usize, p.frame_len());
                sizes.push((p.fields.opcode, frame, back));
            }
            other => panic!("peek and poll disagree: {other:?}"),
        }
    }
    let write_hdr = 14 + 20 + 8 + 12 + 4;
    // The last packet asks for the ACK, which it pulls in: 62 bytes (AETH and all).
    assert_eq!(
        sizes,
        [
            (Opcode::RdmaWriteFirst, write_hdr + 16 + 4096, 0),
            (Opcode::RdmaWriteMiddle, write_hdr + 4096, 0),
            (
                Opcode::RdmaWriteLast,
                write_hdr + 10_000 - 8192,
                write_hdr + 4
            ),
        ]
    );
    // Held by the window, not finished.
    assert!(sim.a.qp.has_requests());

    // A READ alone: what the peek says it pulls in is what the responder sends.
    let (mut sim, a, b) = pair(cfg, Faults::default(), 1, 1 << 20);
    sim.a
        .post_send(read(3, a.lkey, A_BASE, 65_536, B_BASE, b.rkey));
    let (frame, back) = sim.a.qp.peek_request(sim.now).unwrap();
    assert_eq!(frame, write_hdr + 16);
    sim.trace.clear();
    assert!(sim.run_until(10_000_000, |s| s.a.qp.requester().pending() == 0));
    let responses: usize = sim
        .trace
        .iter()
        .filter(|(side, r, _)| {
            *side == Side::B
                && matches!(
                    r.bth.opcode,
                    Opcode::RdmaReadResponseFirst
                        | Opcode::RdmaReadResponseMiddle
                        | Opcode::RdmaReadResponseLast
                        | Opcode::RdmaReadResponseOnly
                )
        })
        .map(|(_, r, len)| r.buffer_len(*len))
        .sum();
    assert_eq!(back as usize, responses);
    assert_eq!(back, 65_536 + 16 * write_hdr + 2 * 4);
    assert_eq!(sim.a.qp.peek_request(sim.now), None, "nothing left");
    assert!(!sim.a.qp.has_requests());
}

#[test]
fn packets_spaced_out_by_a_shaper_ask_for_their_ack_before_the_timer_could_expire() {
    // A WRITE of 16 packets sent one every 100 µs (a class shaped to ~330 Mbit/s): with AckReq
    // only every 16 packets the first packet would wait 1.5 ms for its ACK, six times the
    // 250 µs timeout. A packet that leaves a quarter of the timeout after the oldest one not
    // yet asked about asks for the ACK.
    let mut cfg = QpConfig::new(0x11, 0x22);
    cfg.pmtu = Mtu::M4096;
    let (mut sim, a, b) = pair(cfg.clone(), Faults::default(), 1, 1 << 20);
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 16 * 4096, B_BASE, b.rkey, None));
    let rto = sim.a.qp.requester().rto(&cfg);
    assert_eq!(rto, 250_000);
    let t0 = sim.now;
    let mut asks = Vec::new();
    for k in 0..16u64 {
        let p = sim
            .a
            .qp
            .poll_request(t0 + k * 100_000, &mut Budget::packets(1))
            .unwrap();
        asks.push(p.fields.ack_req);
    }
    // An unasked packet is followed 100 µs later (past 62.5 µs) by one that asks; that one
    // leaves nothing unasked, so the next goes unasked again.
    assert_eq!(asks, [false, true].repeat(8));
    // Sent back to back, only the last asks, as before.
    let (mut sim, a, b) = pair(cfg, Faults::default(), 1, 1 << 20);
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 16 * 4096, B_BASE, b.rkey, None));
    let now = sim.now;
    let asks: Vec<bool> = (0..16)
        .map(|_| {
            let p = sim.a.qp.poll_request(now, &mut Budget::packets(1)).unwrap();
            p.fields.ack_req
        })
        .collect();
    assert_eq!(asks.iter().filter(|&&a| a).count(), 1);
    assert!(asks[15]);
}
