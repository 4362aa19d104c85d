//! Congestion control between two queue pairs: the receiver's signal (ACK state or CNPs) from
//! the CE marks a switch put on the requests, and the sender's rate that follows it.

use super::harness::{Endpoint, Faults, Side, Sim};
use super::{A_BASE, B_BASE, pattern, write};
use crate::cc::{AckParams, CcConfig, CcMode, EcnScope};
use crate::transport::{Access, MrKeys};
use crate::transport::{Mtu, QpConfig, WcStatus};
use wire::{self, Ecn, Level, Opcode};

const LINE: u64 = 10_000_000_000;

fn config(mode: CcMode) -> QpConfig {
    let mut cfg = QpConfig::new(0x11, 0x22);
    cfg.pmtu = Mtu::M1024;
    cfg.max_send_wr = 512;
    cfg.cc = CcConfig {
        mode,
        line_rate_bps: LINE,
        burst_ns: 16_000,
        // A 20 µs window and rates of 1/2, 1/4, 1/8 of the line (the numbers below follow
        // from them); one queue pair's own window (no engine keeps a port-wide one here).
        ack: AckParams {
            window_ns: 20_000,
            rate_permille: [1000, 500, 250, 125],
            scope: EcnScope::QueuePair,
            ..AckParams::default()
        },
        ..CcConfig::default()
    };
    cfg
}

/// `n` 1 KiB WRITEs from A into B, each with its own pattern; B runs `peer` (the mirror of
/// A's configuration by default). Returns the bench and B's region.
fn writes_to(cfg: QpConfig, peer: Option<QpConfig>, n: u64) -> (Sim, MrKeys) {
    let mut sim = Sim::new(cfg, Faults::NONE, 7);
    if let Some(peer) = peer {
        sim.b = Endpoint::new(peer);
    }
    let a = sim.a.register(A_BASE, 1 << 20, Access::ALL);
    let b = sim.b.register(B_BASE, 1 << 20, Access::ALL);
    sim.serialize_ns = 800; // 1 KiB frames at about 10 Gbit/s
    for i in 0..n {
        let off = i * 1024;
        assert!(sim.a.mem.write(a.lkey, off, &pattern(i, 1024)));
        sim.a.post_send(write(
            i,
            a.lkey,
            A_BASE + off,
            1024,
            B_BASE + off,
            b.rkey,
            None,
        ));
    }
    (sim, b)
}

fn writes(cfg: QpConfig, n: u64) -> (Sim, MrKeys) {
    writes_to(cfg, None, n)
}

fn check_landed(sim: &Sim, b: MrKeys, n: u64) {
    assert_eq!(sim.a.done.len() as u64, n);
    assert!(sim.a.done.iter().all(|wc| wc.status == WcStatus::Success));
    for i in 0..n {
        let mut got = vec![0u8; 1024];
        assert!(sim.b.mem.read(b.lkey, i * 1024, &mut got));
        assert_eq!(got, pattern(i, 1024), "WRITE {i}");
    }
}

#[test]
fn ack_mode_acks_carry_the_level_and_the_sender_follows_at_once() {
    let n = 200;
    let (mut sim, bk) = writes(config(CcMode::Ack), n);
    // A switch marks requests 40..=79 (by PSN).
    sim.marker = Some(Box::new(|side, r| {
        side == Side::A && r.bth.opcode.is_request() && (40..80).contains(&r.bth.psn)
    }));
    let mut rates = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    sim.run_until(50_000_000, |s| {
        let r = s.a.qp.requester().cc().rate_bps().unwrap();
        if seen.insert(r) {
            rates.push(r);
        }
        s.a.done.len() as u64 == n
    });
    check_landed(&sim, bk, n);
    assert_eq!(sim.marked, 40);
    let b = sim.b.qp.stats();
    assert_eq!(b.ce_received, 40);
    // The first ACK with BECN names the first marked packet: a change of level is not
    // coalesced.
    let acks: Vec<_> = sim
        .trace
        .iter()
        .filter(|(s, r, _)| *s == Side::B && r.bth.opcode == Opcode::Acknowledge)
        .map(|(_, r, _)| *r)
        .collect();
    let first = acks
        .iter()
        .position(|r| r.bth.becn)
        .expect("a congested ACK");
    assert_eq!(acks[first].bth.psn, 40);
    // One mark among the 26 packets of the 20 µs window (800 ns apart): light.
    let c = acks[first].ceth.unwrap();
    assert_eq!((c.level, c.marked, c.window), (Level::Light, 1, 26));
    // Every congested ACK carries a CETH; no clear one does.
    assert!(acks.iter().all(|r| r.bth.becn == r.ceth.is_some()));
    assert_eq!(
        b.becn_acks_sent as usize,
        acks.iter().filter(|r| r.bth.becn).count()
    );
    assert_eq!(sim.a.qp.stats().becn_acks_received, b.becn_acks_sent);
    // After the marks stop, the first clear ACK restores the line rate: the sender ends there,
    // having been at rates from the table on the way.
    let last_becn = acks.iter().rposition(|r| r.bth.becn).unwrap();
    assert!(!acks[last_becn + 1].bth.becn);
    let cc = sim.a.qp.requester().cc();
    assert_eq!(cc.rate_bps(), Some(LINE));
    assert!(cc.stats.restores >= 1);
    assert!(
        rates.contains(&(LINE / 8)),
        "heavy: 1/8 of the line, {rates:?}"
    );
    assert!(
        rates
            .iter()
            .all(|r| [LINE, LINE / 2, LINE / 4, LINE / 8].contains(r))
    );
    assert_eq!(sim.wire.dropped, 0);
    assert_eq!(sim.a.qp.stats().retransmissions, 0);
}

#[test]
fn the_ack_scheme_paces_the_sender_to_its_rate() {
    // Everything marked: the sender sits at the heavy rate, 1/8 of 10 Gbit/s, once the first
    // ACK is back; 300 frames of 1098 bytes take about 300 * 1098 * 8 / 1.25e9 s (without
    // the pacer, with no serialization delay, a few microseconds).
    let n = 300;
    let (mut sim, bk) = writes(config(CcMode::Ack), n);
    sim.serialize_ns = 0;
    sim.marker = Some(Box::new(|side, r| {
        side == Side::A && r.bth.opcode.is_request()
    }));
    let t0 = sim.now;
    assert!(sim.run_until(100_000_000, |s| s.a.done.len() as u64 == n));
    let elapsed = sim.now - t0;
    let frames = n * (1024 + 70 + 4);
    let at_rate = frames * 8 * 1_000_000_000 / (LINE / 8);
    assert!(
        elapsed >= at_rate * 9 / 10 && elapsed <= at_rate + 100_000,
        "{elapsed} ns for {frames} bytes at 1.25 Gbit/s ({at_rate} ns)"
    );
    assert!(sim.a.qp.requester().cc().stats.paced > 0);
    check_landed(&sim, bk, n);
}

#[test]
fn a_standard_peer_gets_standard_acks() {
    // A speaks `ack`; B was configured as a standard peer (`none`): marked requests change
    // nothing, B's ACKs carry neither BECN nor a CETH, and A stays at its line rate.
    let n = 100;
    let peer = config(CcMode::None).mirrored();
    let (mut sim, bk) = writes_to(config(CcMode::Ack), Some(peer), n);
    sim.marker = Some(Box::new(|side, r| {
        side == Side::A && r.bth.opcode.is_request()
    }));
    sim.run_idle(50_000_000);
    assert_eq!(sim.count(Side::B, |r| r.bth.becn || r.ceth.is_some()), 0);
    assert_eq!(sim.count(Side::B, |r| r.bth.opcode == Opcode::Cnp), 0);
    assert_eq!(sim.b.qp.stats().ce_received, n);
    assert_eq!(sim.a.qp.requester().cc().rate_bps(), Some(LINE));
    check_landed(&sim, bk, n);
}

use wire::golden::{CNP_CX4LX, hex};

#[test]
fn portico_cnps_have_the_format_of_the_connectx_capture() {
    // A queue pair with the capture's addresses and QPN, the capture's source port (0): its CNP
    // is the captured frame but for the IPv4 identification (ConnectX counts, Portico sends 0)
    // and what follows from it: the IPv4 checksum and the ICRC (which covers the
    // identification). With the capture's identification, the frames are identical.
    let cx = hex(CNP_CX4LX);
    let mut cfg = config(CcMode::Dcqcn);
    cfg.local_mac = wire::EthernetAddress([0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32]);
    cfg.remote_mac = wire::EthernetAddress([0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2]);
    cfg.local_ip = "10.0.17.1".parse().unwrap();
    cfg.remote_ip = "10.0.18.1".parse().unwrap();
    cfg.remote_qpn = 0x118;
    cfg.udp_src_port = 0;
    let mut ep = Endpoint::new(cfg.clone());
    // One marked WRITE ONLY from the peer: the notification point answers with a CNP.
    let mut peer = Endpoint::new(cfg.mirrored());
    let keys = ep.register(B_BASE, 4096, Access::ALL);
    let pk = peer.register(A_BASE, 4096, Access::ALL);
    peer.post_send(write(1, pk.lkey, A_BASE, 8, B_BASE, keys.rkey, None));
    let out = peer.qp.poll_transmit(0).unwrap();
    let mut frame = vec![0u8; 2048];
    let len = peer.qp.emit(&out, &peer.mem, &mut frame).unwrap();
    let mut p = wire::RocePacket::new_checked(&mut frame[..len]).unwrap();
    p.ipv4_mut().set_ecn(Ecn::Ce);
    p.ipv4_mut().fill_checksum();
    let (repr, payload) = wire::parse_frame(&frame[..len]).unwrap();
    ep.qp.on_packet(0, &repr, payload, &mut ep.mem, &mut ep.cq);
    let cnp = ep.qp.poll_response(0).expect("a CNP");
    assert_eq!(cnp.fields.opcode, Opcode::Cnp);
    let mut ours = vec![0u8; 128];
    let n = ep.qp.emit(&cnp, &ep.mem, &mut ours).unwrap();
    assert_eq!(n, cx.len());
    for (i, (a, b)) in ours[..n - 4].iter().zip(&cx).enumerate() {
        // IPv4 identification (18, 19) and header checksum (24, 25).
        if ![18, 19, 24, 25].contains(&i) {
            assert_eq!(a, b, "byte {i}: ours {a:#04x}, ConnectX {b:#04x}");
        }
    }
    wire::parse_frame(&ours[..n]).expect("a valid frame");
    ours[18..20].copy_from_slice(&cx[18..20]);
    let mut p = wire::RocePacket::new_checked(&mut ours[..n]).unwrap();
    p.ipv4_mut().fill_checksum();
    let icrc = p.compute_icrc();
    ours[n - 4..n].copy_from_slice(&wire::icrc::to_wire(icrc));
    assert_eq!(&ours[..n], &cx[..], "with the capture's identification");
    assert_eq!(ep.qp.stats().cnps_sent, 1);
}

#[test]
fn dcqcn_sends_at_most_one_cnp_per_interval_and_the_sender_cuts_and_recovers() {
    let n = 400;
    let (mut sim, bk) = writes(config(CcMode::Dcqcn), n);
    sim.marker = Some(Box::new(|side, r| {
        side == Side::A && r.bth.opcode.is_request() && (50..250).contains(&r.bth.psn)
    }));
    let mut min_rate = LINE;
    sim.run_until(100_000_000, |s| {
        min_rate = min_rate.min(s.a.qp.requester().cc().rate_bps().unwrap());
        s.a.done.len() as u64 == n
    });
    check_landed(&sim, bk, n);
    let b = sim.b.qp.stats();
    assert_eq!(b.ce_received, 200);
    // One CNP per 4 µs at most: the marked packets spanned the time between the first and
    // the last marked arrival.
    let cnps = sim.count(Side::B, |r| r.bth.opcode == Opcode::Cnp) as u64; // check-shapes: integers
    assert_eq!(cnps, b.cnps_sent);
    assert!((1..200).contains(&cnps), "{cnps} CNPs for 200 marks");
    let notifier = sim.b.qp.notifier().stats;
    assert_eq!(notifier.cnps + notifier.cnps_suppressed, 200);
    assert_eq!(sim.a.qp.stats().cnps_received, cnps);
    assert!(min_rate < LINE, "a CNP cut the rate");
    // No ACK ever carries congestion state under DCQCN.
    assert_eq!(sim.count(Side::B, |r| r.ceth.is_some()), 0);
    // Once the CNPs stop, the increase timer (300 µs) raises the rate step by step: fast
    // recovery, additive, then hyper increase, back to the line rate in milliseconds.
    let idle_rate = sim.a.qp.requester().cc().rate_bps().unwrap();
    let t = sim.now;
    sim.run_until(1_000_000, |s| s.now >= t + 1_000_000);
    let later = sim.a.qp.requester().cc().rate_bps().unwrap();
    assert!(later > idle_rate && later < LINE, "{idle_rate} -> {later}");
    sim.run_until(100_000_000, |s| {
        s.a.qp.requester().cc().rate_bps() == Some(LINE)
    });
    assert_eq!(sim.a.qp.requester().cc().rate_bps(), Some(LINE));
}

#[test]
fn a_cnp_from_a_standard_peer_throttles_portico() {
    // The ConnectX frame, addressed to A's queue pair from B's address: A runs DCQCN and cuts.
    let n = 50;
    let (mut sim, bk) = writes(config(CcMode::Dcqcn), n);
    let cfg = sim.a.qp.config().clone();
    let mut frame = hex(CNP_CX4LX);
    {
        let mut p = wire::RocePacket::new_checked(&mut frame[..]).unwrap();
        p.ipv4_mut().set_src_addr(cfg.remote_ip);
        p.ipv4_mut().set_dst_addr(cfg.local_ip);
        p.ipv4_mut().fill_checksum();
        p.bth_mut().set_dest_qp(cfg.local_qpn);
    }
    frame[..6].copy_from_slice(&cfg.local_mac.0);
    frame[6..12].copy_from_slice(&cfg.remote_mac.0);
    let icrc = wire::RocePacket::new_checked(&frame[..])
        .unwrap()
        .compute_icrc();
    let at = frame.len() - 4;
    frame[at..].copy_from_slice(&wire::icrc::to_wire(icrc));
    sim.inject(Side::B, frame);
    sim.run_until(10_000_000, |s| s.a.qp.stats().cnps_received == 1);
    assert_eq!(sim.a.qp.stats().cnps_received, 1);
    let rate = sim.a.qp.requester().cc().rate_bps().unwrap();
    assert!(rate < LINE / 2 + LINE / 1000, "cut to about half: {rate}");
    sim.run_idle(100_000_000);
    check_landed(&sim, bk, n);
}

/// A reads 20 × 10 KiB of test data from B under `mode`; a switch marks B's READ responses
/// with PSNs 40..=79 on their way to A. Returns the bench, A's region and the data.
fn marked_reads(mode: CcMode) -> (Sim, MrKeys, Vec<u8>) {
    let mut sim = Sim::new(config(mode), Faults::NONE, 7);
    let a = sim.a.register(A_BASE, 1 << 20, Access::ALL);
    let b = sim.b.register(B_BASE, 1 << 20, Access::ALL);
    sim.serialize_ns = 800;
    let data = pattern(5, 200 * 1024);
    assert!(sim.b.mem.write(b.lkey, 0, &data));
    for i in 0..20u64 {
        let off = i * 10 * 1024;
        sim.a.post_send(super::read(
            i,
            a.lkey,
            A_BASE + off,
            10 * 1024,
            B_BASE + off,
            b.rkey,
        ));
    }
    sim.marker = Some(Box::new(|side, r| {
        side == Side::B && r.bth.opcode.is_read_response() && (40..80).contains(&r.bth.psn)
    }));
    (sim, a, data)
}

/// Seed 002 for READ responses (the CETH's service "RC READ response"): B answers A's READs;
/// a switch marks B's responses 40..=79 (by PSN) on their way to A. A counts the marks in its
/// window as it would a request's and, with no ACK going back for READ responses, tells B in
/// enhanced CNPs (a CETH, service READ responses, in the CNP's reserved bytes): at once on a
/// change of level, so B's pacer, which paces its READ responses, follows as a WRITE sender
/// follows its ACKs, and back to the line rate once the marks stop.
#[test]
fn ack_mode_read_responses_are_paced_by_enhanced_cnps_from_the_requester() {
    let (mut sim, a, data) = marked_reads(CcMode::Ack);
    let mut rates = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    sim.run_until(50_000_000, |s| {
        let r = s.b.qp.requester().cc().rate_bps().unwrap();
        if seen.insert(r) {
            rates.push(r);
        }
        s.a.done.len() == 20
    });
    assert!(sim.a.done.iter().all(|w| w.status == WcStatus::Success));
    let mut got = vec![0u8; data.len()];
    assert!(sim.a.mem.read(a.lkey, 0, &mut got));
    assert!(got == data, "every READ landed");
    assert_eq!(sim.marked, 40);
    let (sa, sb) = (sim.a.qp.stats(), sim.b.qp.stats());
    assert_eq!(
        sa.ce_received, 40,
        "the requester counts marked READ responses"
    );
    let cnps: Vec<_> = sim
        .trace
        .iter()
        .filter(|(s, r, _)| *s == Side::A && r.bth.opcode == Opcode::Cnp)
        .map(|(_, r, _)| *r)
        .collect();
    // Every one enhanced, about READ responses; the first says the first mark at once.
    assert!(cnps.len() >= 2, "{cnps:?}");
    assert!(cnps.iter().all(|r| {
        r.ceth
            .is_some_and(|c| c.service == wire::ceth::service::RC_READ_RESPONSE)
    }));
    let c = cnps[0].ceth.unwrap();
    assert_eq!((c.level, c.marked), (Level::Light, 1));
    // The last says the path is clear again, and B is back at the line rate, having been
    // paced at rates from the table on the way.
    assert_eq!(cnps.last().unwrap().ceth.unwrap().level, Level::None);
    assert_eq!(sa.read_cnps_sent, cnps.len() as u64);
    assert_eq!(sb.read_cnps_received, sa.read_cnps_sent);
    assert_eq!(sb.cnps_received, 0);
    let cc = sim.b.qp.requester().cc();
    assert_eq!(cc.rate_bps(), Some(LINE));
    assert!(cc.stats.restores >= 1);
    assert!(
        rates.iter().any(|&r| r < LINE),
        "B's READ responses were slowed: {rates:?}"
    );
    assert!(cc.stats.paced > 0, "B's pacer held READ responses back");
    assert_eq!(sim.wire.dropped, 0);
    assert_eq!(sa.retransmissions, 0);
}

/// Under `dcqcn` a marked READ response makes the requester (the notification point) send a
/// standard CNP to the responder, whose DCQCN rate, which paces its READ responses, is cut:
/// what a ConnectX requester does for READ responses.
#[test]
fn dcqcn_read_responses_marked_bring_cnps_that_cut_the_responder() {
    let (mut sim, _, _) = marked_reads(CcMode::Dcqcn);
    let mut lowest = LINE;
    sim.run_until(50_000_000, |s| {
        lowest = lowest.min(s.b.qp.requester().cc().rate_bps().unwrap());
        s.a.done.len() == 20
    });
    assert!(sim.a.done.iter().all(|w| w.status == WcStatus::Success));
    let (sa, sb) = (sim.a.qp.stats(), sim.b.qp.stats());
    assert_eq!(sa.ce_received, 40);
    assert!(sa.cnps_sent >= 1);
    assert_eq!(sb.cnps_received, sa.cnps_sent);
    assert_eq!(sa.read_cnps_sent, 0, "standard CNPs under dcqcn");
    assert!(
        sim.trace
            .iter()
            .filter(|(s, r, _)| *s == Side::A && r.bth.opcode == Opcode::Cnp)
            .all(|(_, r, _)| r.ceth.is_none())
    );
    assert!(lowest < LINE, "the responder's rate was cut");
}
