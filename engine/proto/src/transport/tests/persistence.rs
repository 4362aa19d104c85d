//! Remote persistence (seed 004): durable WRITEs and their second ACK, ACKs held for durable
//! regions, READ and FLUSH responses that wait for persistence, ATOMIC WRITE; and the
//! power-loss trials: whatever a crash throws away, no write acknowledged durable is lost.

use std::sync::Arc;

use super::harness::{Fate, Faults, Side, Sim};
use super::*;
use crate::transport::{QpState, WcOpcode, WcStatus, WorkCompletion};
use wire::feth::{Placement, Selectivity};
use wire::{NakCode, Opcode, Syndrome};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

/// A and B with durable writes negotiated; B's region is under the power-loss simulator and
/// registered with `access`; persisting takes `persist_ns`. The retransmission timer (10 ms)
/// is longer than any persist here, as it must be where a READ waits for one.
fn durable_pair(access: Access, persist_ns: u64, len: usize) -> (Sim, MrKeys, MrKeys) {
    pair_negotiating(access, persist_ns, len, true)
}

/// [`durable_pair`], the extension negotiated or not.
fn pair_negotiating(
    access: Access,
    persist_ns: u64,
    len: usize,
    durable_writes: bool,
) -> (Sim, MrKeys, MrKeys) {
    let mut cfg = QpConfig::new(0x11, 0x22);
    cfg.durable_writes = durable_writes;
    cfg.durable_timeout_ns = MS;
    cfg.timeout_ns = 10 * MS;
    let mut sim = Sim::new(cfg, Faults::NONE, 9);
    sim.persist_ns = persist_ns;
    let a = sim.a.register(A_BASE, len, Access::ALL);
    let map = pmem::MapOptions::new()
        .simulate_power_loss(true)
        .anonymous(len)
        .expect("simulated memory");
    let b = sim.b.register_map(Arc::new(map), B_BASE, access);
    (sim, a, b)
}

/// All rights, and persistent flushes (so every WRITE is persisted as it lands).
fn persistent() -> Access {
    Access::ALL | Access::FLUSH_PERSISTENT
}

fn durable(wr_id: u64, a: MrKeys, off: u64, len: u32, b: MrKeys, placed: bool) -> WorkRequest {
    WorkRequest::durable_write(
        wr_id,
        SgList::one(a.lkey, A_BASE + off, len),
        B_BASE + off,
        b.rkey,
        placed,
    )
}

fn b_map(sim: &Sim, b: MrKeys) -> Arc<pmem::Mapping> {
    sim.b.mem.mapping(b.lkey).expect("registered").0.clone()
}

fn done(sim: &Sim, wr_id: u64) -> Vec<WorkCompletion> {
    sim.a
        .done
        .iter()
        .filter(|w| w.wr_id == wr_id)
        .copied()
        .collect()
}

#[test]
fn a_durable_write_is_acknowledged_twice_with_one_psn_and_completes_on_the_second() {
    let (mut sim, a, b) = durable_pair(persistent(), 50 * US, 1 << 16);
    assert!(sim.a.mem.write(a.lkey, 0, &[0xab; 100]));
    sim.a.post_send(durable(1, a, 0, 100, b, false));
    // Receipt: the WRITE is placed and the receipt ACK is back, but nothing is durable yet.
    sim.run_until(20 * US, |s| {
        s.count(Side::B, |r| r.bth.opcode == Opcode::Acknowledge) == 1
    });
    sim.step();
    assert!(done(&sim, 1).is_empty(), "completed before durable");
    assert!(!b_map(&sim, b).is_persisted(0, 100));
    sim.run_idle(10 * MS);
    let wc = done(&sim, 1);
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (wc[0].opcode, wc[0].status, wc[0].byte_len),
        (WcOpcode::DurableWrite, WcStatus::Success, 100)
    );
    assert!(b_map(&sim, b).is_persisted(0, 100));
    // On the wire: DURABLE WRITE ONLY, then ACK and DURABLE ACK naming its PSN.
    let psn = sim.trace[0].1.bth.psn;
    assert_eq!(sim.trace[0].1.bth.opcode, Opcode::DurableWriteOnly);
    let acks: Vec<_> = sim.trace.iter().filter(|(s, ..)| *s == Side::B).collect();
    assert_eq!(acks.len(), 2);
    assert_eq!(acks[0].1.bth.opcode, Opcode::Acknowledge);
    assert_eq!(acks[1].1.bth.opcode, Opcode::DurableAcknowledge);
    assert_eq!((acks[0].1.bth.psn, acks[1].1.bth.psn), (psn, psn));
    let stats = sim.a.qp.stats();
    assert_eq!((stats.durable_acks_received, stats.durable_probes), (1, 0));
}

#[test]
fn placed_then_durable_gives_two_completions_in_that_order() {
    let (mut sim, a, b) = durable_pair(persistent(), 50 * US, 1 << 16);
    sim.a.post_send(durable(1, a, 0, 3000, b, true));
    sim.run_idle(10 * MS);
    let wc = done(&sim, 1);
    let ops: Vec<_> = wc.iter().map(|w| (w.opcode, w.status)).collect();
    assert_eq!(
        ops,
        [
            (WcOpcode::DurablePlaced, WcStatus::Success),
            (WcOpcode::DurableWrite, WcStatus::Success)
        ]
    );
    // Three packets: DURABLE WRITE FIRST, WRITE MIDDLE, WRITE LAST.
    let ops: Vec<_> = sim
        .trace
        .iter()
        .filter(|(s, ..)| *s == Side::A)
        .map(|(_, r, _)| r.bth.opcode)
        .collect();
    assert_eq!(
        ops,
        [
            Opcode::DurableWriteFirst,
            Opcode::RdmaWriteMiddle,
            Opcode::RdmaWriteLast
        ]
    );
}

#[test]
fn writes_keep_flowing_while_earlier_ones_persist_and_complete_in_order() {
    let (mut sim, a, b) = durable_pair(persistent(), 2 * MS, 1 << 16);
    for k in 0..20u64 {
        sim.a.post_send(durable(k, a, k * 256, 256, b, false));
    }
    // All 20 are sent and receipt-acknowledged long before the first persist ends.
    sim.run_until(MS, |s| {
        s.a.qp.requester().in_flight() == 0 && s.a.qp.requester().awaiting_durable() == 20
    });
    assert_eq!(sim.a.qp.requester().awaiting_durable(), 20);
    assert!(sim.a.done.is_empty());
    sim.run_idle(100 * MS);
    let ids: Vec<_> = sim.a.done.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..20).collect::<Vec<_>>());
    assert!(sim.a.done.iter().all(|w| w.status == WcStatus::Success));
    // Persists ended at about the same time: the durable ACKs were coalesced.
    let durable_acks = sim.count(Side::B, |r| r.bth.opcode == Opcode::DurableAcknowledge);
    assert!(
        durable_acks < 20,
        "{durable_acks} durable ACKs for 20 writes"
    );
}

#[test]
fn a_plain_write_behind_a_durable_one_completes_after_it() {
    let (mut sim, a, b) = durable_pair(persistent(), MS, 1 << 16);
    sim.a.post_send(durable(1, a, 0, 64, b, false));
    sim.a
        .post_send(write(2, a.lkey, A_BASE, 64, B_BASE + 4096, b.rkey, None));
    sim.run_idle(100 * MS);
    let ids: Vec<_> = sim.a.done.iter().map(|w| (w.wr_id, w.opcode)).collect();
    assert_eq!(ids, [(1, WcOpcode::DurableWrite), (2, WcOpcode::RdmaWrite)]);
}

#[test]
fn a_lost_durable_ack_is_recovered_by_a_probe() {
    let (mut sim, a, b) = durable_pair(persistent(), 10 * US, 1 << 16);
    sim.drop_first(|side, r| side == Side::B && r.bth.opcode == Opcode::DurableAcknowledge);
    sim.a.post_send(durable(1, a, 0, 2500, b, false));
    sim.run_idle(100 * MS);
    let wc = done(&sim, 1);
    assert_eq!((wc.len(), wc[0].status), (1, WcStatus::Success));
    let s = sim.a.qp.stats();
    assert_eq!((s.durable_timeouts, s.durable_probes), (1, 1));
    // The probe is the message's last packet again, with AckReq.
    let probe = sim
        .trace
        .iter()
        .filter(|(s, r, _)| *s == Side::A && r.bth.opcode == Opcode::RdmaWriteLast)
        .count();
    assert_eq!(probe, 2);
    assert_eq!(
        sim.count(Side::B, |r| r.bth.opcode == Opcode::DurableAcknowledge),
        2
    );
}

#[test]
fn a_slow_flush_is_waited_for_and_a_silent_target_is_not() {
    // The flush takes 500 ms, far beyond 1 + 2 + ... + 64 + 64 ms of unanswered probes: the
    // probes are answered (the target is alive), so the write waits and completes.
    let (mut sim, a, b) = durable_pair(persistent(), 500 * MS, 4096);
    sim.a.post_send(durable(1, a, 0, 64, b, false));
    sim.run_idle(2_000 * MS);
    assert_eq!(done(&sim, 1)[0].status, WcStatus::Success);
    assert!(sim.a.qp.stats().durable_probes > 8);
    // A target that goes silent after the receipt ACK: the probes go unanswered, and the
    // write fails after the retry limit.
    let (mut sim, a, b) = durable_pair(persistent(), 500 * MS, 4096);
    let mut acks = 0;
    sim.filter = Some(Box::new(move |side, _| {
        if side == Side::B {
            acks += 1;
            if acks > 1 {
                return Fate::Drop;
            }
        }
        Fate::Pass
    }));
    sim.a.post_send(durable(1, a, 0, 64, b, false));
    sim.run_idle(2_000 * MS);
    assert_eq!(done(&sim, 1)[0].status, WcStatus::RetryExceeded);
    assert_eq!(sim.a.qp.state(), QpState::Error);
}

#[test]
fn duplicated_and_reordered_durable_acks_complete_each_write_once() {
    let (mut sim, a, b) = durable_pair(persistent(), 30 * US, 1 << 16);
    sim.faults = Faults {
        drop: 0,
        duplicate: 0,
        reorder: 300_000,
        corrupt: 0,
    };
    sim.filter = Some(Box::new(move |side, r| {
        if side == Side::B && r.bth.opcode == Opcode::DurableAcknowledge {
            return Fate::Duplicate;
        }
        Fate::Pass
    }));
    sim.persist_jitter_ns = 100 * US;
    for k in 0..50u64 {
        sim.a.post_send(durable(k, a, k * 512, 300, b, k % 3 == 0));
    }
    sim.run_idle(500 * MS);
    for k in 0..50u64 {
        let wc = done(&sim, k);
        let durable = wc
            .iter()
            .filter(|w| w.opcode == WcOpcode::DurableWrite)
            .count();
        assert_eq!(durable, 1, "write {k}: {wc:?}");
        assert!(wc.iter().all(|w| w.status == WcStatus::Success));
        assert!(b_map(&sim, b).is_persisted(k as usize * 512, 300));
    }
    assert!(sim.a.qp.stats().durable_acks_received > sim.b.qp.stats().durable_acks_sent);
}

#[test]
fn durable_writes_need_the_extension_and_a_persistent_region() {
    // Not negotiated: the post completes with a local QP operation error.
    let (mut sim, a, b) = pair(QpConfig::new(0x11, 0x22), Faults::NONE, 1, 1 << 16);
    sim.a.post_send(durable(1, a, 0, 64, b, false));
    sim.run_idle(MS);
    assert_eq!(done(&sim, 1)[0].status, WcStatus::LocalQpOperationError);

    // Negotiated, but the region allows no persistence: remote access error, nothing placed.
    let (mut sim, a, b) = durable_pair(Access::ALL, 0, 1 << 16);
    assert!(sim.a.mem.write(a.lkey, 0, &[7; 64]));
    sim.a.post_send(durable(1, a, 0, 64, b, false));
    sim.run_idle(10 * MS);
    assert_eq!(done(&sim, 1)[0].status, WcStatus::RemoteAccessError);
    let mut v = [1u8; 64];
    assert!(sim.b.mem.read(b.lkey, 0, &mut v));
    assert_eq!(v, [0; 64]);
}

#[test]
fn a_standard_responder_refuses_the_durable_opcode() {
    // A requester that (wrongly) believes the extension is on, against a responder without it.
    let mut cfg = QpConfig::new(0x11, 0x22);
    cfg.durable_writes = true;
    let mut sim = Sim::new(cfg, Faults::NONE, 3);
    let a = sim.a.register(A_BASE, 4096, Access::ALL);
    let b = sim
        .b
        .register(B_BASE, 4096, Access::ALL | Access::FLUSH_PERSISTENT);
    let mut peer = QpConfig::new(0x22, 0x11);
    peer.durable_writes = false;
    sim.b.qp = crate::transport::QueuePair::new(peer).unwrap();
    sim.a.post_send(durable(1, a, 0, 64, b, false));
    sim.run_idle(10 * MS);
    assert_eq!(done(&sim, 1)[0].status, WcStatus::RemoteInvalidRequest);
    assert_eq!(sim.b.qp.state(), QpState::Error);
    assert_eq!(
        sim.count(Side::B, |r| r.aeth.map(|a| a.syndrome)
            == Some(Syndrome::Nak(NakCode::InvalidRequest))),
        1
    );
}

#[test]
fn a_durable_region_holds_the_ack_of_a_standard_requester_s_write_until_it_is_durable() {
    // A requester that does not speak the extension.
    let (mut sim, a, b) = pair_negotiating(Access::ALL | Access::DURABLE, MS, 1 << 16, false);
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 64, B_BASE, b.rkey, None));
    sim.run_until(500 * US, |_| false);
    assert_eq!(
        sim.count(Side::B, |r| r.bth.opcode == Opcode::Acknowledge),
        0
    );
    assert!(sim.a.done.is_empty());
    sim.run_idle(100 * MS);
    let wc = done(&sim, 1);
    assert_eq!((wc.len(), wc[0].status), (1, WcStatus::Success));
    assert!(b_map(&sim, b).is_persisted(0, 64));
    assert_eq!(
        sim.count(Side::B, |r| r.bth.opcode == Opcode::Acknowledge),
        1
    );
    assert_eq!(
        sim.count(Side::B, |r| r.bth.opcode == Opcode::ReceiptAcknowledge),
        0
    );
}

/// Seed 004's pipelining for plain WRITEs into a region registered durable, when the
/// requester speaks the extension: the receipt ACK (0xE3) goes at once and moves the window,
/// the WRITEs complete on the durable ACK (0xE2) that follows once the data is durable.
#[test]
fn a_durable_region_sends_a_receipt_ack_at_once_and_completes_writes_on_the_durable_ack() {
    let (mut sim, a, b) = durable_pair(Access::ALL | Access::DURABLE, MS, 1 << 16);
    for i in 0..3u64 {
        sim.a.post_send(write(
            i + 1,
            a.lkey,
            A_BASE + i * 64,
            64,
            B_BASE + i * 64,
            b.rkey,
            None,
        ));
    }
    sim.run_until(500 * US, |_| false);
    // Received and acknowledged (the window moved), not complete: not durable yet.
    assert!(sim.count(Side::B, |r| r.bth.opcode == Opcode::ReceiptAcknowledge) >= 1);
    assert_eq!(
        sim.count(Side::B, |r| r.bth.opcode == Opcode::Acknowledge),
        0
    );
    assert_eq!(
        sim.a.qp.requester().outstanding(),
        0,
        "the receipt ACK moved the window"
    );
    assert!(sim.a.done.is_empty(), "completed before durable");
    assert_eq!(
        sim.count(Side::B, |r| r.bth.opcode == Opcode::DurableAcknowledge),
        0
    );
    sim.run_idle(100 * MS);
    let ids: Vec<u64> = sim.a.done.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [1, 2, 3], "each once, in order");
    assert!(sim.a.done.iter().all(|w| w.status == WcStatus::Success));
    assert!(b_map(&sim, b).is_persisted(0, 192));
    let durable = sim.count(Side::B, |r| r.bth.opcode == Opcode::DurableAcknowledge);
    assert!(durable >= 1);
    let s = sim.a.qp.stats();
    assert_eq!(s.receipt_acks_received, sim.b.qp.stats().receipt_acks_sent);
    assert_eq!((s.retransmissions, s.durable_probes), (0, 0));
}

/// A lost durable ACK of a WRITE a receipt ACK covered is recovered as a durable WRITE's is:
/// the probe is the WRITE's last packet again (WRITE ONLY with its RETH), and the answer is
/// the durable ACK again.
#[test]
fn a_lost_durable_ack_of_a_region_write_is_recovered_by_a_probe() {
    let (mut sim, a, b) = durable_pair(Access::ALL | Access::DURABLE, 10 * US, 1 << 16);
    sim.drop_first(|side, r| side == Side::B && r.bth.opcode == Opcode::DurableAcknowledge);
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 64, B_BASE, b.rkey, Some(7)));
    sim.b.post_recv(9, b.lkey, B_BASE + 4096, 0);
    sim.run_idle(100 * MS);
    let wc = done(&sim, 1);
    assert_eq!((wc.len(), wc[0].status), (1, WcStatus::Success));
    let s = sim.a.qp.stats();
    assert_eq!((s.durable_timeouts, s.durable_probes), (1, 1));
    let probes = sim
        .trace
        .iter()
        .filter(|(s, r, _)| {
            *s == Side::A && r.bth.opcode == Opcode::RdmaWriteOnlyWithImmediate && r.reth.is_some()
        })
        .count();
    assert_eq!(probes, 2, "the WRITE and its probe");
    assert_eq!(
        sim.count(Side::B, |r| r.bth.opcode == Opcode::DurableAcknowledge),
        2
    );
    // The probe, a duplicate, consumed no second receive.
    assert_eq!(sim.b.done.len(), 1);
}

#[test]
fn a_read_after_writes_waits_until_they_are_persistent() {
    let (mut sim, a, b) = durable_pair(persistent(), MS, 1 << 16);
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 4096, B_BASE, b.rkey, None));
    sim.a
        .post_send(read(2, a.lkey, A_BASE + 8192, 8, B_BASE, b.rkey));
    sim.run_until(900 * US, |_| false);
    assert_eq!(
        sim.count(Side::B, |r| r.bth.opcode == Opcode::RdmaReadResponseOnly),
        0,
        "the READ was answered before the WRITE was persistent"
    );
    sim.run_idle(100 * MS);
    assert_eq!(done(&sim, 2)[0].status, WcStatus::Success);
    assert!(b_map(&sim, b).is_persisted(0, 4096));
    assert_eq!(sim.a.qp.stats().retransmissions, 0);
}

fn flush(
    wr_id: u64,
    addr: u64,
    rkey: u32,
    len: u32,
    persistence: bool,
    sel: Selectivity,
) -> WorkRequest {
    WorkRequest::flush(
        wr_id,
        addr,
        rkey,
        len,
        Placement {
            global_visibility: !persistence,
            persistence,
        },
        sel,
    )
}

#[test]
fn flush_is_answered_by_an_empty_read_response_once_persistent() {
    for sel in [Selectivity::MemoryRange, Selectivity::MemoryRegion] {
        let (mut sim, a, b) = durable_pair(persistent(), 300 * US, 1 << 16);
        assert!(sim.a.mem.write(a.lkey, 0, &[0x5a; 1000]));
        sim.a
            .post_send(write(1, a.lkey, A_BASE, 1000, B_BASE + 100, b.rkey, None));
        sim.a
            .post_send(flush(2, B_BASE + 100, b.rkey, 1000, true, sel));
        sim.run_idle(100 * MS);
        let wc = done(&sim, 2);
        assert_eq!(
            (wc[0].opcode, wc[0].status),
            (WcOpcode::Flush, WcStatus::Success)
        );
        assert!(b_map(&sim, b).is_persisted(100, 1000));
        let resp: Vec<_> = sim
            .trace
            .iter()
            .filter(|(s, r, _)| *s == Side::B && r.bth.opcode == Opcode::RdmaReadResponseOnly)
            .collect();
        assert_eq!(resp.len(), 1);
        let flush_psn = sim
            .trace
            .iter()
            .find(|(_, r, _)| r.bth.opcode == Opcode::Flush)
            .map(|(_, r, _)| (r.bth.psn, r.feth.unwrap().selectivity))
            .unwrap();
        assert_eq!((resp[0].1.bth.psn, resp[0].2), (flush_psn.0, 0));
        assert_eq!(flush_psn.1, sel);
    }
}

#[test]
fn flush_needs_the_region_flag_of_its_placement_type() {
    // Global visibility on a region that only allows persistent flushes, and persistence on a
    // region without flush rights: both remote access errors.
    for (access, persistence) in [(persistent(), false), (Access::ALL, true)] {
        let (mut sim, _a, b) = durable_pair(access, 0, 4096);
        sim.a.post_send(flush(
            1,
            B_BASE,
            b.rkey,
            64,
            persistence,
            Selectivity::MemoryRange,
        ));
        sim.run_idle(10 * MS);
        assert_eq!(done(&sim, 1)[0].status, WcStatus::RemoteAccessError);
    }
    // Global visibility with its flag: answered at once, nothing to persist.
    let (mut sim, _a, b) = durable_pair(Access::ALL | Access::FLUSH_GLOBAL, MS, 4096);
    sim.a.post_send(flush(
        1,
        B_BASE,
        b.rkey,
        64,
        false,
        Selectivity::MemoryRange,
    ));
    sim.run_until(200 * US, |s| !s.a.done.is_empty());
    assert_eq!(done(&sim, 1)[0].status, WcStatus::Success);
    assert_eq!(sim.persisted_jobs, 0);
}

#[test]
fn atomic_write_stores_eight_bytes_once() {
    let (mut sim, a, b) = durable_pair(persistent(), 0, 4096);
    assert!(
        sim.a
            .mem
            .write(a.lkey, 0, &0x0102_0304_0506_0708u64.to_le_bytes())
    );
    let aw = |id, off| {
        WorkRequest::atomic_write(id, SgList::one(a.lkey, A_BASE, 8), B_BASE + off, b.rkey)
    };
    // Drop the first response: the retry is a duplicate, answered but not stored again.
    let mut first = true;
    sim.filter = Some(Box::new(move |side, r| {
        if side == Side::B && r.bth.opcode == Opcode::RdmaReadResponseOnly && first {
            first = false;
            return Fate::Drop;
        }
        Fate::Pass
    }));
    sim.a.post_send(aw(1, 64));
    sim.run_until(50 * US, |s| s.b.qp.responder().msn() == 1);
    // The host changes the location meanwhile; a second store would overwrite it.
    assert!(sim.b.mem.write(b.lkey, 64, &[9; 8]));
    sim.run_idle(100 * MS);
    let wc = done(&sim, 1);
    assert_eq!(
        (wc[0].opcode, wc[0].status),
        (WcOpcode::AtomicWrite, WcStatus::Success)
    );
    let mut v = [0u8; 8];
    assert!(sim.b.mem.read(b.lkey, 64, &mut v));
    assert_eq!(v, [9; 8]);
    assert_eq!(sim.b.qp.stats().duplicate_requests, 1);

    // A misaligned address is an invalid request, with memory untouched.
    let (mut sim, a, b) = durable_pair(persistent(), 0, 4096);
    sim.a.post_send(WorkRequest::atomic_write(
        1,
        SgList::one(a.lkey, A_BASE, 8),
        B_BASE + 4,
        b.rkey,
    ));
    sim.run_idle(10 * MS);
    assert_eq!(done(&sim, 1)[0].status, WcStatus::RemoteInvalidRequest);
    // And one without remote write rights a remote access error.
    let (mut sim, a, b) = durable_pair(
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::FLUSH_PERSISTENT,
        0,
        4096,
    );
    sim.a.post_send(WorkRequest::atomic_write(
        1,
        SgList::one(a.lkey, A_BASE, 8),
        B_BASE,
        b.rkey,
    ));
    sim.run_idle(10 * MS);
    assert_eq!(done(&sim, 1)[0].status, WcStatus::RemoteAccessError);
}

/// The outcome of a batch of power-loss trials.
#[derive(Debug, Default)]
struct Trials {
    trials: u64,
    /// Writes acknowledged durable before the crash, checked in the persisted image.
    checked: u64,
    /// Of those, missing or different after the crash.
    lost: u64,
    /// Writes placed but not (wholly) persisted when the crash came: the crash did bite.
    torn: u64,
}

/// `n` trials: A streams durable writes of random sizes into disjoint slots of B's region
/// (under the power-loss simulator) over a wire with faults and random persist times; after a
/// random number of steps the power fails (`crash`), and every write A saw complete as durable
/// must be in the persisted image, byte for byte. With `region`, B's region is registered
/// `DURABLE` and every other write is a plain WRITE, pipelined by receipt ACKs (0xE3), which
/// counts as durable on its plain completion.
fn power_loss_trials(n: u64, seed: u64, lie: bool, region: bool) -> Trials {
    const SLOT: usize = 2048;
    const WRITES: u64 = 12;
    let mut t = Trials::default();
    let mut rng = super::harness::Rng::new(seed);
    for trial in 0..n {
        let access = if region {
            Access::ALL | Access::DURABLE
        } else {
            persistent()
        };
        let (mut sim, a, b) = durable_pair(access, 0, SLOT * WRITES as usize);
        sim.rng = super::harness::Rng::new(seed ^ trial.wrapping_mul(0x9e37));
        sim.faults = Faults::each(10_000);
        sim.persist_ns = rng.below(200) * US;
        sim.persist_jitter_ns = 1 + rng.below(300) * US;
        sim.persist_lies = lie;
        let mut sizes = Vec::new();
        for k in 0..WRITES {
            let len = 1 + rng.below(SLOT as u64) as u32;
            let data = pattern(trial * 100 + k, len as usize);
            assert!(sim.a.mem.write(a.lkey, k * SLOT as u64, &data));
            sizes.push((len, data));
            let off = k * SLOT as u64;
            sim.a.post_send(if region && k % 2 == 0 {
                write(k, a.lkey, A_BASE + off, len, B_BASE + off, b.rkey, None)
            } else {
                durable(k, a, off, len, b, false)
            });
        }
        let steps = rng.below(120);
        for _ in 0..steps {
            if !sim.step() {
                break;
            }
        }
        let map = b_map(&sim, b);
        let acked: Vec<u64> = sim
            .a
            .done
            .iter()
            .filter(|w| {
                matches!(w.opcode, WcOpcode::DurableWrite | WcOpcode::RdmaWrite)
                    && w.status == WcStatus::Success
            })
            .map(|w| w.wr_id)
            .collect();
        let placed: Vec<bool> = (0..WRITES)
            .map(|k| {
                let mut v = vec![0u8; sizes[k as usize].0 as usize];
                map.read(k as usize * SLOT, &mut v).unwrap();
                v == sizes[k as usize].1
            })
            .collect();
        map.crash().expect("simulated");
        t.trials += 1;
        for k in 0..WRITES {
            let (len, data) = &sizes[k as usize];
            let mut v = vec![0u8; *len as usize];
            map.read(k as usize * SLOT, &mut v).unwrap();
            let survived = v == *data;
            if acked.contains(&k) {
                t.checked += 1;
                t.lost += if survived { 0 } else { 1 };
            } else if placed[k as usize] && !survived {
                t.torn += 1;
            }
        }
    }
    t
}

/// Trials in the default run; `PORTICO_POWER_TRIALS` sets more.
fn trial_count() -> u64 {
    std::env::var("PORTICO_POWER_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

#[test]
fn power_loss_never_loses_a_write_acknowledged_durable() {
    let t = power_loss_trials(trial_count(), 0x0dd5_eed5, false, false);
    eprintln!("power-loss trials: {t:?}");
    nothing_acknowledged_lost(&t);
}

/// No write acknowledged durable was lost, and the trials were not vacuous: many writes were
/// acknowledged durable before the crash, and the crash did throw away writes that were
/// placed but not yet persistent.
fn nothing_acknowledged_lost(t: &Trials) {
    assert_eq!(t.lost, 0, "{t:?}");
    assert!(t.checked > t.trials, "{t:?}");
    assert!(t.torn > 0, "{t:?}");
}

#[test]
fn power_loss_trials_catch_an_engine_that_acknowledges_before_persisting() {
    let t = power_loss_trials(200, 0x0bad_5eed, true, false);
    eprintln!("negative control: {t:?}");
    assert!(
        t.lost > 0,
        "acknowledging before persisting went unnoticed: {t:?}"
    );
}

/// The same trials with half the writes plain WRITEs into a `DURABLE` region, completed on
/// the durable ACK that follows their receipt ACK: none acknowledged is lost either.
#[test]
fn power_loss_never_loses_a_region_write_completed_after_its_receipt_ack() {
    let t = power_loss_trials(trial_count() / 2, 0x5ec0_da7a, false, true);
    eprintln!("power-loss trials, durable region: {t:?}");
    nothing_acknowledged_lost(&t);
}

/// A NAK acknowledges everything before its PSN, as an ACK does: after a standard requester's
/// WRITE into a durable region, a sequence-error NAK for a later packet waits until that WRITE
/// is durable, or the requester would complete it early. The requester here loses the first
/// packet of its second WRITE, so the responder owes that NAK while the first WRITE's persist
/// (1 ms) runs.
#[test]
fn a_nak_does_not_acknowledge_a_durable_region_s_write_before_it_is_durable() {
    let (mut sim, a, b) = pair_negotiating(Access::ALL | Access::DURABLE, MS, 1 << 16, false);
    sim.drop_first(|side, r| side == Side::A && r.bth.psn == 1);
    sim.a
        .post_send(write(1, a.lkey, A_BASE, 64, B_BASE, b.rkey, None));
    // Three packets at 1 KiB: PSNs 1..=3; PSN 1 lost.
    sim.a.post_send(write(
        2,
        a.lkey,
        A_BASE + 4096,
        3000,
        B_BASE + 4096,
        b.rkey,
        None,
    ));
    sim.run_until(500 * US, |_| false);
    assert!(
        sim.count(Side::B, |r| r.aeth.is_some_and(|a| matches!(
            a.syndrome,
            Syndrome::Nak(NakCode::PsnSequenceError)
        ))) == 0,
        "a NAK went before the first WRITE was durable"
    );
    assert!(sim.a.done.is_empty(), "completed before durable");
    sim.run_idle(100 * MS);
    let ids: Vec<u64> = sim.a.done.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [1, 2]);
    assert!(sim.a.done.iter().all(|w| w.status == WcStatus::Success));
    assert!(b_map(&sim, b).is_persisted(0, 64));
}
