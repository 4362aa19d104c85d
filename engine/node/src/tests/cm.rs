//! The connection manager end to end on two pure nodes: ARP, QP1 frames, queue pairs created
//! by the exchange and used, destroyed at the end; faults on QP1; bounds and leaks.

use std::net::Ipv4Addr;
use std::sync::Arc;

use pmem::Mapping;
use proto::rng::SplitMix64;
use proto::transport::{Access, MrKeys, QpConfig, SgList, WcStatus, WorkRequest};
use wire::EthernetAddress;

use crate::cm::{CmControl, CmEvents, CmReply, CmSetup, ConnEvent, QpTweak};
use crate::{Control, ControlReply, Cq, Qp, RdmaNode, RxOutcome};

const PORT: u16 = 7471;
const A_IP: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);
/// Time per round of the simulated wire.
const ROUND: u64 = 2_000;

/// One node with a CM, its completion queue and its region.
struct Side {
    node: RdmaNode,
    events: CmEvents,
    cq: Cq,
    mr: MrKeys,
    _map: Arc<Mapping>,
}

fn side(mac: u8, ip: Ipv4Addr, tune: impl FnOnce(&mut CmSetup)) -> Side {
    let mut node = RdmaNode::new(EthernetAddress([2, 0, 0, 0, 0, mac]), ip);
    let cq = node.create_cq(1024);
    let mut qp = QpConfig::new(0, 0);
    qp.timeout_ns = 1_000_000;
    qp.max_timeout_ns = 1_000_000;
    qp.retry_limit = 3;
    let mut setup = CmSetup::new(qp, cq.id(), cq.id());
    setup.cm.seed = u64::from(mac);
    tune(&mut setup);
    let events = node.enable_cm(setup);
    let map = Arc::new(Mapping::anonymous(1 << 16).unwrap());
    let mr = node.register(map.clone(), 0, 1 << 16, Access::ALL).unwrap();
    Side {
        node,
        events,
        cq,
        mr,
        _map: map,
    }
}

fn call(s: &mut Side, c: CmControl) -> CmReply {
    match s.node.control(1, Control::Cm(c)) {
        Some((_, ControlReply::Cm(Ok(r)))) => r,
        other => panic!("{other:?}"),
    }
}

/// What the wire does to QP1 frames (RoCE and ARP frames pass untouched).
#[derive(Clone, Copy, Default)]
struct Faults {
    /// Parts per million lost, repeated.
    loss: u32,
    dup: u32,
    /// Rounds a frame may be held back (reordering).
    hold: u64,
    /// Everything from B is lost from this round on (B vanished).
    b_gone_at: Option<u64>,
    /// A's CM messages of this attribute (its low byte) are lost.
    drop_from_a: Option<u8>,
}

struct Wire {
    a: Side,
    b: Side,
    round: u64,
    faults: Faults,
    rng: SplitMix64,
    /// Held frames: (round due, to B?, bytes).
    held: Vec<(u64, bool, Vec<u8>)>,
    qp1_frames: usize,
}

impl Wire {
    fn new(faults: Faults, seed: u64) -> Wire {
        Wire::tuned(faults, seed, |_| {}, |_| {})
    }

    /// Both sides' CM set-up tuned: A's by `tune_a`, B's (the listener's) by `tune_b`.
    fn tuned(
        faults: Faults,
        seed: u64,
        tune_a: impl FnOnce(&mut CmSetup),
        tune_b: impl FnOnce(&mut CmSetup),
    ) -> Wire {
        let mut b = side(2, B_IP, tune_b);
        call(&mut b, CmControl::Listen(PORT));
        Wire {
            a: side(1, A_IP, tune_a),
            b,
            round: 0,
            faults,
            rng: SplitMix64::new(seed),
            held: Vec::new(),
            qp1_frames: 0,
        }
    }

    fn now(&self) -> u64 {
        self.round * ROUND
    }

    /// One round: both nodes serviced, everything they send carried to the other.
    fn step(&mut self) {
        let now = self.now();
        let mut frames: Vec<(bool, Vec<u8>)> = Vec::new();
        for from_a in [true, false] {
            let s = if from_a { &mut self.a } else { &mut self.b };
            s.node.service(now);
            let mut buf = vec![0u8; 9000];
            while let Some(n) = s.node.poll_cm_frame(&mut buf) {
                frames.push((from_a, buf[..n].to_vec()));
            }
            while let Some(tx) = s.node.poll_transmit(now) {
                let n = s.node.emit(&tx, &mut buf).unwrap();
                frames.push((from_a, buf[..n].to_vec()));
            }
            s.node.flush_completions();
        }
        let gone = self.faults.b_gone_at.is_some_and(|r| self.round >= r);
        for (to_b, f) in frames {
            if gone && !to_b {
                continue;
            }
            let qp1 = f.len() > 42 && f[12..14] == [8, 0] && f[42] == 0x64;
            if qp1 {
                self.qp1_frames += 1;
                // MAD byte 17, the attribute ID's low byte, after 62 bytes of headers.
                if to_b && self.faults.drop_from_a == Some(f[62 + 17]) {
                    continue;
                }
                if self.rng.chance(self.faults.loss) {
                    continue;
                }
                let copies = if self.rng.chance(self.faults.dup) {
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    let hold = if self.faults.hold > 0 {
                        self.rng.below(self.faults.hold + 1)
                    } else {
                        0
                    };
                    self.held.push((self.round + hold, to_b, f.clone()));
                }
            } else {
                self.held.push((self.round, to_b, f));
            }
        }
        let round = self.round;
        let mut due: Vec<(u64, bool, Vec<u8>)> = Vec::new();
        self.held.retain(|h| {
            if h.0 <= round {
                due.push(h.clone());
                false
            } else {
                true
            }
        });
        for (_, to_b, f) in due {
            let (dst, back) = if to_b {
                (&mut self.b, false)
            } else {
                (&mut self.a, true)
            };
            if let RxOutcome::ArpReply(n) = dst.node.receive(now, &f) {
                // B's answers are lost once B is gone, like the rest of what it sends.
                if !gone || back {
                    let reply = dst.node.arp_reply(n).to_vec();
                    self.held.push((self.round + 1, back, reply));
                }
            }
        }
        self.a.node.flush_completions();
        self.b.node.flush_completions();
        self.round += 1;
    }

    /// Rounds until `until` says stop (true), at most `max`; when nothing moves the clock
    /// jumps to the next deadline. Returns the events seen, each side.
    fn run(
        &mut self,
        max: u64,
        mut app: impl FnMut(&mut Side, bool, &ConnEvent),
        mut until: impl FnMut(&Wire) -> bool,
    ) {
        for _ in 0..max {
            self.step();
            for is_a in [true, false] {
                let s = if is_a { &mut self.a } else { &mut self.b };
                while let Some(ev) = s.events.poll() {
                    app(s, is_a, &ev);
                    log(is_a, ev);
                }
            }
            if until(self) {
                return;
            }
            if self.held.is_empty() {
                let now = self.now();
                let next = [self.a.node.outlook(now), self.b.node.outlook(now)]
                    .iter()
                    .filter_map(|o| o.due_in_ns)
                    .min();
                if let Some(d) = next
                    && d > ROUND
                {
                    self.round += d / ROUND;
                }
            }
        }
    }
}

fn log(is_a: bool, ev: ConnEvent) {
    LOG.with(|l| l.borrow_mut().push((is_a, ev)));
}

thread_local! {
    static LOG: std::cell::RefCell<Vec<(bool, ConnEvent)>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn take_log() -> Vec<(bool, ConnEvent)> {
    LOG.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

/// The passive application: accepts every request, its region's keys in the private data.
fn accept_all(s: &mut Side, is_a: bool, ev: &ConnEvent) {
    if let (false, ConnEvent::Request(r)) = (is_a, ev) {
        let mut pd = vec![1, 0, 0, 0];
        pd.extend_from_slice(&s.mr.rkey.to_be_bytes());
        pd.extend_from_slice(&s.mr.addr.to_be_bytes());
        // The request may have timed out meanwhile: then the accept fails, and nothing is kept.
        if let Some((_, ControlReply::Cm(Ok(CmReply::Accepted(qp))))) = s.node.control(
            7,
            Control::Cm(CmControl::Accept {
                id: r.id,
                private_data: pd,
                cqs: None,
                tweak: QpTweak::default(),
            }),
        ) {
            ACCEPTED.with(|a| a.borrow_mut().push(qp));
        }
    }
}

thread_local! {
    static ACCEPTED: std::cell::RefCell<Vec<Qp>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn connect(w: &mut Wire, private: &[u8]) -> u32 {
    match call(
        &mut w.a,
        CmControl::Connect {
            ip: B_IP,
            port: PORT,
            private_data: private.to_vec(),
            cqs: None,
            tweak: QpTweak::default(),
        },
    ) {
        CmReply::Connecting(id) => id,
        r => panic!("{r:?}"),
    }
}

/// A's queue pair, from its established event in `log`.
fn a_queue_pair(log: Vec<(bool, ConnEvent)>) -> Option<Qp> {
    log.into_iter().find_map(|(is_a, e)| match (is_a, e) {
        (true, ConnEvent::Established { qp: Some(qp), .. }) => Some(qp),
        _ => None,
    })
}

/// Posts on `qp` a WRITE of `len` bytes from A's region to B's.
fn write_to_b(w: &Wire, qp: &mut Qp, id: u64, len: u32) {
    let sgl = SgList::one(w.a.mr.lkey, w.a.mr.addr, len);
    qp.post_send(&[WorkRequest::write(id, sgl, w.b.mr.addr, w.b.mr.rkey, None)])
        .unwrap();
}

fn established(log: &[(bool, ConnEvent)], side_a: bool) -> usize {
    log.iter()
        .filter(|(a, e)| *a == side_a && matches!(e, ConnEvent::Established { .. }))
        .count()
}

#[test]
fn a_connection_resolves_arp_connects_carries_a_write_and_a_read_and_ends_with_no_trace() {
    let _ = take_log();
    let mut w = Wire::new(Faults::default(), 1);
    let id = connect(&mut w, b"hi");
    let mut rep = Vec::new();
    w.run(
        10_000,
        |s, is_a, ev| {
            accept_all(s, is_a, ev);
            if let ConnEvent::Established {
                qp: Some(_),
                private_data,
                ..
            } = ev
            {
                rep = private_data.clone();
            }
        },
        |w| {
            w.a.node.cm_connections() == Some((1, 1))
                && w.b.node.cm_counters().unwrap().0.cm_established == 1
        },
    );
    let log = take_log();
    assert_eq!(established(&log, true), 1, "{log:?}");
    assert_eq!(established(&log, false), 1, "{log:?}");
    let (_, ConnEvent::Request(r)) = &log[0] else {
        panic!("{log:?}")
    };
    assert_eq!(&r.private_data[..2], b"hi");
    assert_eq!(r.peer.ip, A_IP);
    // A asked ARP for B's address once; B learned nothing it did not ask for.
    let q1 = w.a.node.cm_counters().unwrap().1;
    assert_eq!(q1.arp_requests, 1);
    assert_eq!(q1.arp_learned, 1);
    let mut qp_a = a_queue_pair(log).expect("A's queue pair");
    // The REP carried B's region: WRITE 64 bytes there, READ them back.
    assert_eq!(rep[0], 1);
    let rkey = u32::from_be_bytes(rep[4..8].try_into().unwrap());
    let addr = u64::from_be_bytes(rep[8..16].try_into().unwrap());
    assert_eq!((rkey, addr), (w.b.mr.rkey, w.b.mr.addr));
    w.a.node.mem.write(w.a.mr.lkey, 0, &[0x5a; 64]);
    qp_a.post_send(&[
        WorkRequest::write(
            1,
            SgList::one(w.a.mr.lkey, w.a.mr.addr, 64),
            addr,
            rkey,
            None,
        ),
        WorkRequest::read(
            2,
            SgList::one(w.a.mr.lkey, w.a.mr.addr + 64, 64),
            addr,
            rkey,
        ),
    ])
    .unwrap();
    let mut wcs = Vec::new();
    // A thousand rounds: the WRITE, its ACK, the READ and its response, and quiet after.
    w.run(1000, |_, _, _| {}, |_| false);
    while let Some(wc) = w.a.cq.poll_one() {
        wcs.push(wc);
    }
    assert_eq!(wcs.len(), 2, "{wcs:?}");
    assert!(wcs.iter().all(|c| c.status == WcStatus::Success), "{wcs:?}");
    let mut back = [0u8; 64];
    w.a.node.mem.read(w.a.mr.lkey, 64, &mut back);
    assert_eq!(back, [0x5a; 64]);
    let mut there = [0u8; 64];
    w.b.node.mem.read(w.b.mr.lkey, 0, &mut there);
    assert_eq!(there, [0x5a; 64]);

    // Teardown: both sides disconnected, queue pairs gone, the CMs empty after time-wait.
    call(&mut w.a, CmControl::Disconnect { id });
    w.run(
        100_000,
        |_, _, _| {},
        |w| w.a.node.cm_connections() == Some((0, 0)) && w.b.node.cm_connections() == Some((0, 0)),
    );
    let log = take_log();
    assert!(
        log.iter()
            .any(|(a, e)| *a && matches!(e, ConnEvent::Disconnected { id: d } if *d == id))
    );
    assert!(
        log.iter()
            .any(|(a, e)| !*a && matches!(e, ConnEvent::Disconnected { .. }))
    );
    assert_eq!((w.a.node.qp_count(), w.b.node.qp_count()), (0, 0));
    let (cm_a, q1_a) = w.a.node.cm_counters().unwrap();
    assert_eq!((q1_a.cm_qps_created, q1_a.cm_qps_destroyed), (1, 1));
    assert_eq!(cm_a.cm_disconnected, 1);
    ACCEPTED.with(|a| a.borrow_mut().clear());
}

#[test]
fn a_connection_s_tweak_sets_its_queue_pair_s_class_and_dscp_and_only_its_own() {
    let _ = take_log();
    let mut w = Wire::new(Faults::default(), 3);
    let tweak = QpTweak {
        traffic_class: Some(0),
        dscp: Some(46),
        tagged: Some(false),
    };
    let call_reply = call(
        &mut w.a,
        CmControl::Connect {
            ip: B_IP,
            port: PORT,
            private_data: Vec::new(),
            cqs: None,
            tweak,
        },
    );
    assert!(
        matches!(call_reply, CmReply::Connecting(_)),
        "{call_reply:?}"
    );
    w.run(10_000, accept_all, |w| {
        w.a.node.cm_connections() == Some((1, 1))
            && w.b.node.cm_counters().unwrap().0.cm_established == 1
    });
    let _ = take_log();
    let a: Vec<u8> = w.a.node.qps().map(|q| q.config().dscp).collect();
    let b: Vec<u8> = w.b.node.qps().map(|q| q.config().dscp).collect();
    // A's queue pair has the tweak's DSCP; B accepted with none and keeps its template's.
    assert_eq!(a, [46]);
    assert_eq!(b, [QpConfig::new(0, 0).dscp]);
    ACCEPTED.with(|a| a.borrow_mut().clear());
}

/// Congestion control as each side's template says: `(mode, delay word, keep-rate µs)`.
fn cc_template(mode: proto::cc::CcMode, delay: bool, keep_us: u64) -> impl FnOnce(&mut CmSetup) {
    move |s: &mut CmSetup| {
        s.qp.cc.mode = mode;
        s.qp.cc.ack.delay = delay;
        s.qp.cc.ack.keep_rate_ns = keep_us * 1_000;
    }
}

#[test]
fn the_cm_settles_congestion_control_and_its_options_between_two_portico_ends() {
    use proto::cc::CcMode::{self, Ack, Dcqcn};
    // (A's template, B's template) → (A's queue pair, B's queue pair, negotiated, fallbacks
    // on A and B): mode, delay word, keep-rate (µs; each end keeps what the other asked).
    type Cc = (CcMode, bool, u64);
    /// (negotiated, fallbacks), each on (A, B).
    type Counts = ((u64, u64), (u64, u64));
    let cases: [(Cc, Cc, Cc, Cc, Counts); 4] = [
        (
            (Ack, true, 200),
            (Ack, true, 50),
            (Ack, true, 50),
            (Ack, true, 200),
            ((1, 1), (0, 0)),
        ),
        (
            (Ack, true, 200),
            (Ack, false, 0),
            (Ack, false, 0),
            (Ack, false, 200),
            ((1, 1), (0, 0)),
        ),
        (
            (Ack, true, 200),
            (Dcqcn, false, 0),
            (Dcqcn, false, 0),
            (Dcqcn, false, 0),
            ((1, 1), (0, 0)),
        ),
        (
            (CcMode::None, false, 0),
            (Ack, true, 10),
            (CcMode::None, false, 0),
            (Dcqcn, false, 0),
            ((0, 0), (0, 1)),
        ),
    ];
    for (i, (a, b, want_a, want_b, counts)) in cases.into_iter().enumerate() {
        let _ = take_log();
        let mut w = Wire::tuned(
            Faults::default(),
            20 + i as u64,
            cc_template(a.0, a.1, a.2),
            cc_template(b.0, b.1, b.2),
        );
        connect(&mut w, b"hi");
        w.run(10_000, accept_all, |w| {
            w.a.node.cm_connections() == Some((1, 1))
                && w.b.node.cm_counters().unwrap().0.cm_established == 1
        });
        let log = take_log();
        // The applications are handed their private data without the block.
        let (req, rep) = log.iter().fold((None, None), |(q, p), (_, e)| match e {
            ConnEvent::Request(r) => (Some(r.private_data.clone()), p),
            ConnEvent::Established {
                qp: Some(_),
                private_data,
                ..
            } => (q, Some(private_data.clone())),
            _ => (q, p),
        });
        let (req, rep) = (req.unwrap(), rep.unwrap());
        assert!(req[2..].iter().all(|&b| b == 0), "case {i}: {req:?}");
        assert!(rep[16..].iter().all(|&b| b == 0), "case {i}: {rep:?}");
        let cc = |s: &Side| -> Vec<Cc> {
            s.node
                .qps()
                .map(|q| {
                    let c = q.config().cc;
                    (c.mode, c.ack.delay, c.ack.keep_rate_ns / 1_000)
                })
                .collect()
        };
        assert_eq!(
            (cc(&w.a), cc(&w.b)),
            (vec![want_a], vec![want_b]),
            "case {i}"
        );
        let q1 = |s: &Side| s.node.cm_counters().unwrap().1;
        let (qa, qb) = (q1(&w.a), q1(&w.b));
        assert_eq!(
            (
                (qa.cm_cc_negotiated, qb.cm_cc_negotiated),
                (qa.cm_cc_fallbacks, qb.cm_cc_fallbacks)
            ),
            counts,
            "case {i}"
        );
        ACCEPTED.with(|a| a.borrow_mut().clear());
    }
}

#[test]
fn a_thousand_connections_to_one_listener_leave_nothing_behind() {
    let _ = take_log();
    let mut w = Wire::new(Faults::default(), 2);
    let created_before = w.b.node.cm_counters().unwrap().1;
    for k in 0..1000u32 {
        let id = connect(&mut w, &k.to_be_bytes());
        w.run(10_000, accept_all, |w| {
            w.a.node.cm_connections().unwrap().1 == 1
                && w.b.node.cm_counters().unwrap().0.cm_established == u64::from(k) + 1
        });
        call(&mut w.a, CmControl::Disconnect { id });
        w.run(
            10_000,
            |_, _, _| {},
            |w| {
                w.a.node.cm_connections().unwrap().1 == 0
                    && w.b.node.cm_connections().unwrap().1 == 0
            },
        );
        assert_eq!(
            (w.a.node.qp_count(), w.b.node.qp_count()),
            (0, 0),
            "connection {k}"
        );
    }
    // Time-wait ends; nothing is left.
    w.run(
        1_000_000,
        |_, _, _| {},
        |w| w.a.node.cm_connections() == Some((0, 0)) && w.b.node.cm_connections() == Some((0, 0)),
    );
    let log = take_log();
    assert_eq!(established(&log, true), 1000);
    assert_eq!(established(&log, false), 1000);
    let (cm_b, q1_b) = w.b.node.cm_counters().unwrap();
    assert_eq!(q1_b.cm_qps_created - created_before.cm_qps_created, 1000);
    assert_eq!(q1_b.cm_qps_destroyed, 1000);
    assert_eq!(cm_b.cm_timeouts + cm_b.cm_resends + cm_b.cm_duplicates, 0);
    assert_eq!(w.b.node.cm_connections(), Some((0, 0)));
    // Slots were reused: the node never held more than one queue pair at once.
    assert!(w.b.node.qps().count() == 0);
    assert_eq!(w.b.node.counters.cq_overruns, 0);
    ACCEPTED.with(|a| a.borrow_mut().clear());
}

#[test]
fn lost_repeated_and_reordered_mads_end_in_one_connection_or_a_clean_timeout_on_both_sides() {
    let mut connected = 0;
    for seed in 0..40u64 {
        let _ = take_log();
        let faults = Faults {
            loss: 300_000,
            dup: 200_000,
            hold: 3,
            b_gone_at: None,
            drop_from_a: None,
        };
        let mut w = Wire::new(faults, seed);
        let id = connect(&mut w, b"");
        // Run until A knows its outcome and B has settled (established or nothing held).
        w.run(2_000_000, accept_all, |w| {
            let a = w.a.node.cm_connections().unwrap();
            let b = w.b.node.cm_connections().unwrap();
            let b_est = w.b.node.cm_counters().unwrap().0.cm_established;
            (a.1 == 1 && b_est == 1) || (a.0 == 0 && b.0 == 0)
        });
        let log = take_log();
        let (ea, eb) = (established(&log, true), established(&log, false));
        assert_eq!(ea, eb, "seed {seed}: {log:?}");
        assert!(ea <= 1, "seed {seed}");
        if ea == 1 {
            connected += 1;
            assert_eq!(
                (w.a.node.qp_count(), w.b.node.qp_count()),
                (1, 1),
                "seed {seed}"
            );
            call(&mut w.a, CmControl::Disconnect { id });
        } else {
            assert!(
                log.iter().any(|(a, e)| *a
                    && matches!(e, ConnEvent::TimedOut { .. } | ConnEvent::Rejected { .. })),
                "seed {seed}: {log:?}"
            );
        }
        w.run(10_000_000, accept_all, |w| {
            w.a.node.cm_connections() == Some((0, 0)) && w.b.node.cm_connections() == Some((0, 0))
        });
        assert_eq!(
            (w.a.node.qp_count(), w.b.node.qp_count()),
            (0, 0),
            "seed {seed}"
        );
        ACCEPTED.with(|a| a.borrow_mut().clear());
    }
    assert!(connected >= 30, "{connected} of 40 connected");
}

#[test]
fn a_peer_that_vanishes_is_disconnected_by_the_timers() {
    let _ = take_log();
    let mut w = Wire::new(Faults::default(), 3);
    let id = connect(&mut w, b"");
    w.run(
        10_000,
        |s, is_a, ev| {
            accept_all(s, is_a, ev);
        },
        |w| {
            w.b.node.cm_counters().unwrap().0.cm_established == 1
                && w.a.node.cm_connections().unwrap().1 == 1
        },
    );
    let mut qp_a = a_queue_pair(take_log()).expect("A is up");
    // B disappears; A's next WRITE is never acknowledged.
    w.faults.b_gone_at = Some(w.round);
    write_to_b(&w, &mut qp_a, 1, 8);
    w.run(
        10_000_000,
        |_, _, _| {},
        |w| w.a.node.cm_connections() == Some((0, 0)),
    );
    let log = take_log();
    assert!(
        log.iter()
            .any(|(a, e)| *a && matches!(e, ConnEvent::Disconnected { id: d } if *d == id)),
        "{log:?}"
    );
    let wc = w.a.cq.poll_one().unwrap();
    assert_eq!(wc.status, WcStatus::RetryExceeded);
    assert_eq!(w.a.node.qp_count(), 0);
    let dreqs = w.a.node.cm_counters().unwrap().0.cm_resends;
    assert_eq!(dreqs, 15, "the DREQ resent until it timed out");
    ACCEPTED.with(|a| a.borrow_mut().clear());
}

#[test]
fn an_address_nobody_answers_for_is_unreachable() {
    let _ = take_log();
    let mut w = Wire::new(Faults::default(), 4);
    let id = match call(
        &mut w.a,
        CmControl::Connect {
            ip: Ipv4Addr::new(10, 9, 0, 99),
            port: PORT,
            private_data: vec![],
            cqs: None,
            tweak: QpTweak::default(),
        },
    ) {
        CmReply::Connecting(id) => id,
        r => panic!("{r:?}"),
    };
    w.run(
        10_000_000,
        |_, _, _| {},
        |w| w.a.node.cm_connections() == Some((0, 0)),
    );
    let log = take_log();
    assert!(
        matches!(log.as_slice(), [(true, ConnEvent::Unreachable { id: d })] if *d == id),
        "{log:?}"
    );
    let q1 = w.a.node.cm_counters().unwrap().1;
    assert_eq!((q1.arp_requests, q1.arp_failures), (5, 1));
    assert_eq!(w.a.node.qp_count(), 0);
}

#[test]
fn qp1_frames_that_fail_their_checks_are_counted_by_reason() {
    let mut w = Wire::new(Faults::default(), 5);
    // A REQ from A, captured.
    connect(&mut w, b"");
    let mut buf = vec![0u8; 9000];
    // ARP first: learn B's MAC by hand so the REQ goes out at once.
    w.a.node.service(0);
    let n = w.a.node.poll_cm_frame(&mut buf).unwrap();
    let arp = buf[..n].to_vec();
    let RxOutcome::ArpReply(m) = w.b.node.receive(0, &arp) else {
        panic!()
    };
    let reply = w.b.node.arp_reply(m).to_vec();
    w.a.node.receive(0, &reply);
    w.a.node.service(1);
    let n = w.a.node.poll_cm_frame(&mut buf).unwrap();
    let req = buf[..n].to_vec();
    assert_eq!(n, wire::gsi::FRAME_LEN);
    // Wrong Q_Key.
    let mut f = req.clone();
    let (mut r, payload) = wire::gsi::GsiRepr::parse(&f)
        .map(|(r, p)| (r, p.to_vec()))
        .unwrap();
    r.deth.qkey = 0x1234;
    r.emit(&payload, &mut f).unwrap();
    w.b.node.receive(1, &f);
    // Not to QP 1.
    let mut f = req.clone();
    r.deth.qkey = wire::deth::GSI_QKEY;
    r.dest_qp = 5;
    r.emit(&payload, &mut f).unwrap();
    w.b.node.receive(1, &f);
    // A flipped bit.
    let mut f = req.clone();
    f[100] ^= 1;
    w.b.node.receive(1, &f);
    // A MAD of the wrong length (a 200-byte payload).
    let mut f = vec![0u8; 400];
    r.dest_qp = 1;
    let n = r.emit(&payload[..200], &mut f).unwrap();
    w.b.node.receive(1, &f[..n]);
    let (cm, q1) = w.b.node.cm_counters().unwrap();
    assert_eq!(q1.qp1_bad_deth, 1);
    assert_eq!(q1.qp1_wrong_qp, 1);
    assert_eq!(q1.qp1_malformed, 1);
    assert_eq!(cm.mad_bad_length, 1);
    assert_eq!(
        cm.cm_established + cm.mads_received,
        1,
        "only the short MAD reached the CM"
    );
    // The real one is taken.
    w.b.node.receive(1, &req);
    assert_eq!(w.b.node.cm_counters().unwrap().1.qp1_frames, 2);
    assert!(matches!(w.b.events.poll(), Some(ConnEvent::Request(_))));
}

#[test]
fn the_first_packet_on_its_queue_pair_establishes_a_connection_whose_rtu_was_lost() {
    let _ = take_log();
    let faults = Faults {
        drop_from_a: Some(wire::mad::cm_attr::RTU as u8),
        ..Faults::default()
    };
    let mut w = Wire::new(faults, 6);
    connect(&mut w, b"");
    w.run(10_000, accept_all, |w| {
        w.a.node.cm_connections() == Some((1, 1))
    });
    let mut qp_a = a_queue_pair(take_log()).expect("A is up");
    assert_eq!(
        w.b.node.cm_counters().unwrap().0.cm_established,
        0,
        "no RTU came"
    );
    write_to_b(&w, &mut qp_a, 1, 8);
    w.run(
        10_000,
        |_, _, _| {},
        |w| w.b.node.cm_counters().unwrap().0.cm_established == 1,
    );
    let (cm_b, _) = w.b.node.cm_counters().unwrap();
    assert_eq!(cm_b.cm_established, 1);
    assert_eq!(
        cm_b.cm_resends, 0,
        "established by the WRITE, not by a resent REP"
    );
    assert!(
        take_log()
            .iter()
            .any(|(a, e)| !*a && matches!(e, ConnEvent::Established { .. }))
    );
    ACCEPTED.with(|a| a.borrow_mut().clear());
}

#[test]
fn a_nak_reaches_the_requester_before_the_cm_ends_the_connection() {
    let _ = take_log();
    let mut w = Wire::new(Faults::default(), 5);
    connect(&mut w, b"");
    w.run(10_000, accept_all, |w| {
        w.a.node.cm_connections() == Some((1, 1))
            && w.b.node.cm_counters().unwrap().0.cm_established == 1
    });
    let mut qp = a_queue_pair(take_log()).expect("A's queue pair");
    // A READ past the end of B's region: B's responder NAKs it (remote access error) and its
    // queue pair goes to the error state, with the NAK still to send.
    let sgl = SgList::one(w.a.mr.lkey, w.a.mr.addr, 64);
    qp.post_send(&[WorkRequest::read(
        9,
        sgl,
        w.b.mr.addr + (1 << 16),
        w.b.mr.rkey,
    )])
    .unwrap();
    let in_error = |w: &Wire| {
        w.b.node
            .qps()
            .any(|q| q.state() == proto::transport::QpState::Error)
    };
    for _ in 0..1000 {
        if in_error(&w) {
            break;
        }
        w.step();
    }
    assert!(in_error(&w), "B's responder refused the READ");
    // The CM's error scan is due in B's next iteration, the one that sends the NAK; its DREQ
    // leaves first. Disconnecting at that first sight let the DREQ overtake the NAK: A's
    // queue pair was destroyed and the READ flushed (WrFlushError) instead of failed.
    w.round += 1_000_000 / ROUND + 1;
    let mut wc = None;
    for _ in 0..100 {
        w.step();
        wc = w.a.cq.poll_one();
        if wc.is_some() {
            break;
        }
    }
    let wc = wc.expect("the READ's completion");
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::RemoteAccessError));
    // Then the CM ends the connection on both sides, a scan period later.
    w.run(
        10_000,
        |_, _, _| {},
        |w| w.a.node.cm_connections() == Some((0, 0)),
    );
    assert_eq!(w.a.node.cm_connections(), Some((0, 0)));
}
