//! The adaptive retransmission timeout and the judge of spurious retransmissions: the
//! estimator on its own (exact arithmetic), then through the simulated wire.

use std::cell::RefCell;
use std::rc::Rc;

use super::harness::{Fate, Faults, Side, Sim};
use super::*;
use crate::transport::rto::RttEstimator;
use crate::transport::{WcStatus, WorkCompletion, psn};
use wire::{self, Opcode, RoceRepr};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

fn bounds(lo: u64, hi: u64) -> QpConfig {
    let mut c = QpConfig::new(0x11, 0x22);
    c.timeout_ns = lo;
    c.max_timeout_ns = hi;
    c
}

#[test]
fn rto_converges_on_a_steady_round_trip() {
    let c = bounds(10 * US, 100 * MS);
    let mut e = RttEstimator::default();
    assert_eq!(
        e.rto(&c),
        10 * US,
        "before any sample: the configured timeout"
    );
    e.sample(40 * US);
    // SRTT = r, RTTVAR = r/2, RTO = SRTT + 4 RTTVAR.
    assert_eq!(
        (e.srtt(), e.rttvar(), e.rto(&c)),
        (Some(40_000), 20_000, 120_000)
    );
    e.sample(40 * US);
    assert_eq!(
        (e.srtt(), e.rttvar(), e.rto(&c)),
        (Some(40_000), 15_000, 100_000)
    );
    e.sample(40 * US);
    assert_eq!((e.rttvar(), e.rto(&c)), (11_250, 85_000));
    // The variation decays by a quarter per sample (integer nanoseconds) until it is gone.
    let mut var = 11_250;
    for _ in 0..40 {
        e.sample(40 * US);
        var = var * 3 / 4;
        assert_eq!(e.rttvar(), var);
    }
    assert_eq!((e.srtt(), e.rttvar(), e.rto(&c)), (Some(40_000), 0, 40_000));
    // A slower path moves SRTT by an eighth of the difference, RTTVAR by a quarter.
    e.sample(120 * US);
    assert_eq!(
        (e.srtt(), e.rttvar(), e.rto(&c)),
        (Some(50_000), 20_000, 130_000)
    );
    assert_eq!(e.min_rtt(), Some(40_000));
}

#[test]
fn rto_is_clamped_to_the_configured_bounds() {
    let c = bounds(200 * US, 10 * MS);
    let mut fast = RttEstimator::default();
    fast.sample(5 * US);
    assert_eq!(fast.rto(&c), 200 * US, "5 + 4 * 2.5 µs is below the floor");
    let mut slow = RttEstimator::default();
    slow.sample(50 * MS);
    assert_eq!(slow.rto(&c), 10 * MS, "150 ms is above the ceiling");
    // A fixed timer: both bounds the same.
    let fixed = bounds(MS, MS);
    assert_eq!((fast.rto(&fixed), slow.rto(&fixed)), (MS, MS));
}

#[test]
fn rto_backs_off_on_timeout_until_a_sample() {
    let mut c = bounds(200 * US, 10 * MS);
    c.max_backoff_shift = 3;
    let mut e = RttEstimator::default();
    e.sample(100 * US);
    assert_eq!(e.rto(&c), 300 * US);
    let mut seen = Vec::new();
    for _ in 0..5 {
        e.back_off(&c);
        seen.push(e.rto(&c));
    }
    // Doubling, at most `max_backoff_shift` times; the backoff may exceed the ceiling.
    assert_eq!(seen, [600 * US, 1200 * US, 2400 * US, 2400 * US, 2400 * US]);
    e.sample(100 * US);
    assert_eq!(e.rto(&c), 250 * US, "a new sample ends the backoff");
}

/// A WRITE of 64 bytes from A's region to B's, wr_id `id`.
fn write64(id: u64, a: MrKeys, b: MrKeys) -> WorkRequest {
    WorkRequest::write(
        id,
        SgList::one(a.lkey, a.addr, 64),
        b.addr + 64 * id,
        b.rkey,
        None,
    )
}

fn ok(done: &[WorkCompletion], ids: std::ops::Range<u64>) {
    let got: Vec<_> = done.iter().map(|w| (w.wr_id, w.status)).collect();
    let want: Vec<_> = ids.map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(got, want);
}

#[test]
fn karns_rule_takes_no_sample_from_a_retransmitted_packet() {
    // A round trip of 100 µs against a first timeout of 60 µs.
    let (mut sim, a, b) = pair(bounds(60 * US, 100 * MS), Faults::NONE, 1, 1 << 16);
    sim.latency_ns = 50 * US;
    sim.a.post_send(write64(1, a, b));
    sim.run_idle(10 * MS);
    let st = sim.a.qp.stats();
    assert_eq!((st.timeouts, st.retransmissions), (1, 1));
    // The copy reached B after the original: a duplicate, re-ACKed, and judged spurious.
    assert_eq!(sim.b.qp.stats().duplicate_requests, 1);
    assert_eq!(st.spurious_retransmissions, 1);
    let rtt = *sim.a.qp.requester().rtt();
    // The ACK of the original came 40 µs after the copy left: no sample from it.
    assert_eq!(rtt.srtt(), None);
    assert_eq!(sim.a.qp.requester().rto(sim.a.qp.config()), 120 * US);
    // The next WRITE goes once; its round trip is the first sample, and the backoff ends.
    sim.a.post_send(write64(2, a, b));
    sim.run_idle(10 * MS);
    let rtt = *sim.a.qp.requester().rtt();
    assert_eq!((rtt.srtt(), rtt.rttvar()), (Some(100 * US), 50 * US));
    assert_eq!(sim.a.qp.requester().rto(sim.a.qp.config()), 300 * US);
    assert_eq!(sim.a.qp.stats().timeouts, 1);
    ok(&sim.a.done, 1..3);
}

#[test]
fn rto_converges_through_the_wire_and_nothing_is_resent() {
    let (mut sim, a, b) = pair(bounds(60 * US, 100 * MS), Faults::NONE, 1, 1 << 16);
    sim.latency_ns = 50 * US;
    // The first WRITE times out once (60 µs < 100 µs), as above; the backoff then holds
    // until the second WRITE's sample.
    for id in 1..=45 {
        sim.a.post_send(write64(id, a, b));
        sim.run_idle(10 * MS);
    }
    let rtt = *sim.a.qp.requester().rtt();
    assert_eq!((rtt.srtt(), rtt.rttvar()), (Some(100 * US), 0));
    assert_eq!(sim.a.qp.requester().rto(sim.a.qp.config()), 100 * US);
    let st = sim.a.qp.stats();
    assert_eq!((st.timeouts, st.retransmissions), (1, 1));
    ok(&sim.a.done, 1..46);
}

/// A's requester after one WRITE on a 2 µs round trip: SRTT and the shortest round trip known.
fn warmed_up() -> (Sim, MrKeys, MrKeys) {
    let (mut sim, a, b) = pair(bounds(100 * US, 100 * MS), Faults::NONE, 1, 1 << 16);
    sim.a.post_send(write64(1, a, b));
    sim.run_idle(10 * MS);
    assert_eq!(sim.a.qp.requester().rtt().min_rtt(), Some(2 * US));
    (sim, a, b)
}

#[test]
fn a_lost_packet_resent_is_not_spurious() {
    let (mut sim, a, b) = warmed_up();
    sim.drop_first(|side, r| side == Side::A && r.bth.opcode == Opcode::RdmaWriteOnly);
    sim.a.post_send(write64(2, a, b));
    sim.run_idle(10 * MS);
    let st = sim.a.qp.stats();
    assert_eq!((st.timeouts, st.retransmissions), (1, 1));
    assert_eq!(st.spurious_retransmissions, 0);
    assert_eq!(sim.b.qp.stats().duplicate_requests, 0);
    ok(&sim.a.done, 1..3);
}

#[test]
fn a_lost_ack_recovered_by_the_timer_is_not_spurious() {
    let (mut sim, a, b) = warmed_up();
    sim.drop_first(|side, _| side == Side::B);
    sim.a.post_send(write64(2, a, b));
    sim.run_idle(10 * MS);
    let st = sim.a.qp.stats();
    assert_eq!((st.timeouts, st.retransmissions), (1, 1));
    // B had the data, but without the copy A would never have heard so: a loss, repaired.
    assert_eq!(sim.b.qp.stats().duplicate_requests, 1);
    assert_eq!(st.spurious_retransmissions, 0);
    ok(&sim.a.done, 1..3);
}

#[test]
fn a_spurious_retransmission_is_counted_once() {
    let (mut sim, a, b) = warmed_up();
    let cfg = sim.a.qp.config().clone();
    // B's ACK of the second WRITE is held back (taken off the wire) ...
    let held: Rc<RefCell<Option<RoceRepr>>> = Rc::default();
    let keep = held.clone();
    let mut once = true;
    sim.filter = Some(Box::new(move |side, r: &RoceRepr| {
        if side == Side::B && r.bth.psn == psn::add(0, 1) && once {
            once = false;
            *keep.borrow_mut() = Some(*r);
            return Fate::Drop;
        }
        Fate::Pass
    }));
    sim.a.post_send(write64(2, a, b));
    assert!(sim.run_until(MS, |s| s.a.qp.stats().timeouts == 1));
    assert_eq!(
        sim.a.qp.stats().retransmissions,
        1,
        "the copy has just left"
    );
    // ... and reaches A 0.5 µs after the copy left (the timer fired and the copy left at the
    // new deadline minus the new timeout): sooner than the 2 µs round trip could answer it.
    let resent_at = sim.a.qp.next_deadline().unwrap() - sim.a.qp.requester().rto(&cfg);
    assert_eq!(
        resent_at,
        3_000 + 100 * US,
        "warm-up ended at 3 µs; the timeout was 100 µs"
    );
    let ack = held.borrow_mut().take().expect("the ACK was held");
    let mut frame = vec![0u8; 256];
    let n = ack.emit(&mut frame, &[]).unwrap();
    let (repr, payload) = wire::parse_frame(&frame[..n]).unwrap();
    let ep = &mut sim.a;
    ep.qp
        .on_packet(resent_at + 500, &repr, payload, &mut ep.mem, &mut ep.cq);
    assert_eq!(sim.a.qp.stats().spurious_retransmissions, 1);
    // The copy still reaches B, which answers it with a repeat ACK: the same copy, not
    // counted again.
    sim.run_idle(10 * MS);
    assert_eq!(sim.b.qp.stats().duplicate_requests, 1);
    let st = sim.a.qp.stats();
    assert_eq!(
        st.acks_received, 3,
        "the first WRITE's, the held one, the repeat"
    );
    assert_eq!((st.retransmissions, st.spurious_retransmissions), (1, 1));
    ok(&sim.a.done, 1..3);
}

#[test]
fn a_window_resent_after_a_stall_is_judged_spurious_by_the_repeat_acks() {
    let (mut sim, a, b) = warmed_up();
    // Frames follow each other 1 µs apart, so B takes them one by one.
    sim.serialize_ns = US;
    // B does not run for 150 µs: what A sends waits in its RX ring. A's timer (100 µs) fires
    // meanwhile and resends the whole window behind the originals.
    sim.freeze_link(Side::A, sim.now + 150 * US);
    for id in 2..34 {
        sim.a.post_send(write64(id, a, b));
    }
    sim.run_idle(10 * MS);
    let st = sim.a.qp.stats();
    assert_eq!((st.timeouts, st.retransmissions), (1, 32));
    assert_eq!(sim.b.qp.stats().duplicate_requests, 32);
    assert_eq!(st.spurious_retransmissions, 32);
    ok(&sim.a.done, 1..34);
}
