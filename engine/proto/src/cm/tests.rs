//! Two CMs over a simulated wire, in simulated time: the exchanges, their answers to lost,
//! repeated and reordered MADs, their timers, their bounds.

use super::*;

const A_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const A_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
const B_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);
const PORT: u16 = 7471;
/// One way through the simulated wire.
const LATENCY: u64 = 5_000;

fn peer_a() -> Peer {
    Peer {
        ip: A_IP,
        mac: A_MAC,
    }
}

fn peer_b() -> Peer {
    Peer {
        ip: B_IP,
        mac: B_MAC,
    }
}

fn cm(ip: Ipv4Addr, mac: EthernetAddress, seed: u64) -> Cm {
    Cm::new(CmConfig {
        seed,
        ..CmConfig::new(ip, mac)
    })
}

fn connect(port: u16, private: &[u8]) -> Connect {
    Connect {
        peer: peer_b(),
        port,
        local_qpn: 0x100,
        send_psn: 0x1234,
        path_mtu: 3,
        initiator_depth: 8,
        responder_resources: 4,
        retry_count: 7,
        rnr_retry_count: 6,
        traffic_class: 0x68,
        hop_limit: 64,
        private_data: private.to_vec(),
        ext: None,
    }
}

fn accept(private: &[u8]) -> Accept {
    Accept {
        local_qpn: 0x200,
        send_psn: 0xabcdef,
        initiator_depth: 16,
        responder_resources: 2,
        path_mtu: 5,
        rnr_retry_count: 5,
        private_data: private.to_vec(),
        ext: None,
    }
}

/// What the passive application does with a request.
#[derive(Clone, Copy, PartialEq)]
enum App {
    Accept,
    /// Accepts once this much time has passed since the request came.
    AcceptAfter(u64),
    Reject,
}

/// Faults of the simulated wire, each in parts per million.
#[derive(Clone, Copy, Default)]
struct Faults {
    loss: u32,
    dup: u32,
    /// Extra delay of up to this many ns per MAD, drawn: MADs overtake each other.
    jitter: u64,
}

struct Net {
    a: Cm,
    b: Cm,
    now: u64,
    /// In flight: (arrival, to B?, the MAD).
    wire: Vec<(u64, bool, [u8; mad::MAD_LEN])>,
    faults: Faults,
    rng: SplitMix64,
    app: App,
    ev_a: Vec<CmEvent>,
    ev_b: Vec<CmEvent>,
    /// Requests B's application holds, and when they came.
    pending: Vec<(u32, u64)>,
    /// Attributes sent, each direction.
    sent_a: Vec<u16>,
    sent_b: Vec<u16>,
}

impl Net {
    fn new(app: App, faults: Faults, seed: u64) -> Net {
        let mut b = cm(B_IP, B_MAC, seed ^ 0xb);
        b.listen(PORT).unwrap();
        Net {
            a: cm(A_IP, A_MAC, seed ^ 0xa),
            b,
            now: 0,
            wire: Vec::new(),
            faults,
            rng: SplitMix64::new(seed),
            app,
            ev_a: Vec::new(),
            ev_b: Vec::new(),
            pending: Vec::new(),
            sent_a: Vec::new(),
            sent_b: Vec::new(),
        }
    }

    fn ship(&mut self) {
        for to_b in [true, false] {
            loop {
                let (from, sent) = if to_b {
                    (&mut self.a, &mut self.sent_a)
                } else {
                    (&mut self.b, &mut self.sent_b)
                };
                let Some(o) = from.poll_send() else { break };
                assert_eq!(o.to, if to_b { peer_b() } else { peer_a() });
                sent.push(u16::from_be_bytes([o.mad[16], o.mad[17]]));
                if self.rng.chance(self.faults.loss) {
                    continue;
                }
                let copies = if self.rng.chance(self.faults.dup) {
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    let jitter = if self.faults.jitter > 0 {
                        self.rng.below(self.faults.jitter)
                    } else {
                        0
                    };
                    self.wire.push((self.now + LATENCY + jitter, to_b, o.mad));
                }
            }
        }
    }

    fn events(&mut self) {
        while let Some(e) = self.a.poll_event() {
            self.ev_a.push(e);
        }
        while let Some(e) = self.b.poll_event() {
            if let CmEvent::ConnectRequest(r) = &e {
                match self.app {
                    App::Accept => {
                        self.b.accept(self.now, r.id, &accept(b"rep")).unwrap();
                    }
                    App::AcceptAfter(_) => self.pending.push((r.id, self.now)),
                    App::Reject => self.b.reject(r.id, b"no thanks").unwrap(),
                }
            }
            self.ev_b.push(e);
        }
        if let App::AcceptAfter(delay) = self.app {
            let now = self.now;
            let due: Vec<u32> = self
                .pending
                .iter()
                .filter(|&&(_, at)| now >= at + delay)
                .map(|&(id, _)| id)
                .collect();
            self.pending.retain(|&(_, at)| now < at + delay);
            for id in due {
                // The request may have expired meanwhile.
                let _ = self.b.accept(now, id, &accept(b"rep"));
            }
        }
    }

    /// Runs until nothing is in flight, nothing is pending and no timer is due before
    /// `until`.
    fn run(&mut self, until: u64) {
        loop {
            self.events();
            self.ship();
            let next_wire = self.wire.iter().map(|w| w.0).min();
            let next_app = match self.app {
                App::AcceptAfter(d) => self.pending.iter().map(|p| p.1 + d).min(),
                _ => None,
            };
            let next = [
                next_wire,
                next_app,
                self.a.next_deadline(),
                self.b.next_deadline(),
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(next) = next.filter(|&t| t <= until) else {
                return;
            };
            self.now = self.now.max(next);
            let now = self.now;
            let mut due: Vec<_> = Vec::new();
            self.wire.retain(|w| {
                if w.0 <= now {
                    due.push(*w);
                    false
                } else {
                    true
                }
            });
            due.sort_by_key(|w| w.0);
            for (_, to_b, m) in due {
                if to_b {
                    self.b.on_mad(now, peer_a(), &m).unwrap();
                } else {
                    self.a.on_mad(now, peer_b(), &m).unwrap();
                }
            }
            self.a.on_timer(now);
            self.b.on_timer(now);
        }
    }
}

fn count(evs: &[CmEvent], f: impl Fn(&CmEvent) -> bool) -> usize {
    evs.iter().filter(|e| f(e)).count()
}

fn established(evs: &[CmEvent]) -> usize {
    count(evs, |e| matches!(e, CmEvent::Established { .. }))
}

const HOUR: u64 = 3_600_000_000_000;

#[test]
fn a_connection_is_made_its_parameters_agree_and_it_ends_cleanly() {
    let mut n = Net::new(App::Accept, Faults::default(), 1);
    let id = n.a.connect(0, &connect(PORT, b"hello")).unwrap();
    n.run(HOUR);
    assert_eq!(n.sent_a, [cm_attr::REQ, cm_attr::RTU]);
    assert_eq!(n.sent_b, [cm_attr::REP]);
    let CmEvent::ConnectRequest(req) = &n.ev_b[0] else {
        panic!("{:?}", n.ev_b)
    };
    assert_eq!(req.port, PORT);
    assert_eq!(req.peer, peer_a());
    assert_eq!(req.remote_qpn, 0x100);
    assert_eq!(&req.private_data[..5], b"hello");
    assert_eq!(req.private_data.len(), CONNECT_PRIVATE_LEN);
    let CmEvent::Connected {
        id: got,
        params: pa,
    } = n.ev_a[0]
    else {
        panic!("{:?}", n.ev_a)
    };
    assert_eq!(got, id);
    let CmEvent::Established { private_data, .. } = &n.ev_a[1] else {
        panic!()
    };
    assert_eq!(&private_data[..3], b"rep");
    assert_eq!(established(&n.ev_b), 1);
    // Both sides' queue pairs agree: QPNs and PSNs crossed, the smaller limits on both.
    assert_eq!((pa.local_qpn, pa.remote_qpn), (0x100, 0x200));
    assert_eq!((pa.send_psn, pa.recv_psn), (0x1234, 0xabcdef));
    assert_eq!(pa.path_mtu, 3);
    // A may have 8 READs out; B answers min(8, its 2) of them: the REP says 2.
    assert_eq!(pa.initiator_depth, 2);
    // B may have min(16, A's 4) out at A.
    assert_eq!(pa.responder_resources, 4);
    assert_eq!(pa.rnr_retry_count, 5, "the REP's RNR retry count");
    assert_eq!((pa.traffic_class, pa.hop_limit), (0x68, 64));
    assert_eq!(n.a.half_open() + n.b.half_open(), 0);

    n.a.disconnect(n.now, id).unwrap();
    n.run(n.now + 1_000_000);
    assert_eq!(n.sent_a.last(), Some(&cm_attr::DREQ));
    assert_eq!(n.sent_b.last(), Some(&cm_attr::DREP));
    assert!(matches!(n.ev_a.last(), Some(CmEvent::Disconnected { id: d }) if *d == id));
    assert!(matches!(n.ev_b.last(), Some(CmEvent::Disconnected { .. })));
    assert_eq!((n.a.connections(), n.b.connections()), (1, 1), "time-wait");
    n.run(HOUR);
    assert_eq!((n.a.connections(), n.b.connections()), (0, 0));
    assert_eq!(n.a.counters.cm_established, 1);
    assert_eq!(n.b.counters.cm_established, 1);
}

#[test]
fn the_passive_side_agrees_with_the_active_side_on_every_parameter() {
    let mut b = cm(B_IP, B_MAC, 2);
    let mut a = cm(A_IP, A_MAC, 3);
    b.listen(PORT).unwrap();
    a.connect(0, &connect(PORT, b"")).unwrap();
    let req = a.poll_send().unwrap();
    b.on_mad(1, peer_a(), &req.mad).unwrap();
    let Some(CmEvent::ConnectRequest(r)) = b.poll_event() else {
        panic!()
    };
    let pb = b.accept(2, r.id, &accept(b"")).unwrap();
    let rep = b.poll_send().unwrap();
    a.on_mad(3, peer_b(), &rep.mad).unwrap();
    let Some(CmEvent::Connected { params: pa, .. }) = a.poll_event() else {
        panic!()
    };
    assert_eq!((pb.local_qpn, pb.remote_qpn), (pa.remote_qpn, pa.local_qpn));
    assert_eq!((pb.send_psn, pb.recv_psn), (pa.recv_psn, pa.send_psn));
    assert_eq!(pb.initiator_depth, pa.responder_resources);
    assert_eq!(pb.responder_resources, pa.initiator_depth);
    assert_eq!(pb.path_mtu, pa.path_mtu);
    assert_eq!(pb.retry_count, 7);
    assert_eq!(pb.rnr_retry_count, 6, "the REQ's");
    assert_eq!(pb.peer, peer_a());
    assert_eq!((pb.traffic_class, pb.hop_limit), (0x68, 64));
}

/// A REQ from `a` to `b` and `b`'s accept with `rep_ext`, MAD by MAD: the request as `b`'s
/// application saw it, the REQ's private data on the wire, and both sides' parameters.
fn exchange_ext(
    req_data: &[u8],
    req_ext: Option<ExtRepr>,
    rep_ext: Option<ExtRepr>,
) -> (Request, Vec<u8>, QpParams, QpParams, Vec<u8>) {
    exchange_ext_rep(req_data, req_ext, b"rep", rep_ext)
}

/// [`exchange_ext`] with the REP's application bytes `rep_data`.
fn exchange_ext_rep(
    req_data: &[u8],
    req_ext: Option<ExtRepr>,
    rep_data: &[u8],
    rep_ext: Option<ExtRepr>,
) -> (Request, Vec<u8>, QpParams, QpParams, Vec<u8>) {
    let mut b = cm(B_IP, B_MAC, 2);
    let mut a = cm(A_IP, A_MAC, 3);
    b.listen(PORT).unwrap();
    a.connect(
        0,
        &Connect {
            ext: req_ext,
            ..connect(PORT, req_data)
        },
    )
    .unwrap();
    let req = a.poll_send().unwrap();
    let on_wire = ReqRepr::parse(&req.mad[mad::HEADER_LEN..])
        .unwrap()
        .private_data
        .to_vec();
    b.on_mad(1, peer_a(), &req.mad).unwrap();
    let Some(CmEvent::ConnectRequest(r)) = b.poll_event() else {
        panic!()
    };
    let pb = b
        .accept(
            2,
            r.id,
            &Accept {
                ext: rep_ext,
                ..accept(rep_data)
            },
        )
        .unwrap();
    let rep = b.poll_send().unwrap();
    a.on_mad(3, peer_b(), &rep.mad).unwrap();
    let Some(CmEvent::Connected { params: pa, .. }) = a.poll_event() else {
        panic!()
    };
    let Some(CmEvent::Established { private_data, .. }) = a.poll_event() else {
        panic!()
    };
    (r, on_wire, pa, pb, private_data)
}

#[test]
fn the_portico_block_rides_in_the_private_data_s_tail_and_the_application_sees_zeros_there() {
    let offer = ExtRepr {
        cc: portico_ext::CC_ACK,
        delay: true,
        keep_rate_us: 100,
    };
    let answer = ExtRepr {
        keep_rate_us: 30,
        ..offer
    };
    let (r, on_wire, pa, pb, rep_data) = exchange_ext(b"hello", Some(offer), Some(answer));
    assert_eq!(&on_wire[84..], &[b'P', b'X', 1, 2, 1, 0, 0, 100]);
    assert_eq!(
        (r.ext, pb.peer_ext, pa.peer_ext),
        (Some(offer), Some(offer), Some(answer))
    );
    assert_eq!(&r.private_data[..5], b"hello");
    assert!(
        r.private_data[5..].iter().all(|&b| b == 0),
        "{:?}",
        r.private_data
    );
    assert_eq!(&rep_data[..3], b"rep");
    assert!(rep_data[3..].iter().all(|&b| b == 0));
    // The application's bytes reach into the tail: no block, and its bytes arrive whole.
    let long: Vec<u8> = (1..=CONNECT_PRIVATE_LEN as u8 - 7).collect();
    let (r, _, pa, pb, _) = exchange_ext(&long, Some(offer), Some(answer));
    assert_eq!((r.ext, pb.peer_ext), (None, None));
    assert_eq!(&r.private_data[..long.len()], &long[..]);
    assert_eq!(pa.peer_ext, Some(answer));
    // The REP's application bytes leave no room for the answer: neither side has a block,
    // so both settle without one.
    let (r, _, pa, pb, _) = exchange_ext_rep(b"", Some(offer), &[7; 189], Some(answer));
    assert_eq!((r.ext, pb.peer_ext, pa.peer_ext), (Some(offer), None, None));
    // A standard peer: nothing either way.
    let (r, on_wire, pa, _, _) = exchange_ext(b"", None, None);
    assert!(on_wire[36..].iter().all(|&b| b == 0));
    assert_eq!((r.ext, pa.peer_ext), (None, None));
}

#[test]
fn a_req_to_a_port_nobody_listens_on_is_rejected_invalid_service_id() {
    let mut n = Net::new(App::Accept, Faults::default(), 3);
    let id = n.a.connect(0, &connect(PORT + 1, b"")).unwrap();
    n.run(HOUR);
    assert_eq!(n.sent_b, [cm_attr::REJ]);
    assert_eq!(
        n.ev_a,
        [CmEvent::Rejected {
            id,
            reason: rej_reason::INVALID_SERVICE_ID,
            private_data: vec![0; cm::REJ_PRIVATE_DATA_LEN],
        }]
    );
    assert!(n.ev_b.is_empty());
    assert_eq!(n.b.counters.cm_rej_no_listener, 1);
    assert_eq!((n.a.connections(), n.b.connections()), (0, 0));
}

#[test]
fn an_application_reject_carries_its_private_data() {
    let mut n = Net::new(App::Reject, Faults::default(), 4);
    let id = n.a.connect(0, &connect(PORT, b"")).unwrap();
    n.run(HOUR);
    let CmEvent::Rejected {
        id: got,
        reason,
        private_data,
    } = &n.ev_a[0]
    else {
        panic!("{:?}", n.ev_a)
    };
    assert_eq!((*got, *reason), (id, rej_reason::CONSUMER_DEFINED));
    assert_eq!(&private_data[..9], b"no thanks");
    assert_eq!((n.a.connections(), n.b.connections()), (0, 0));
    assert_eq!(n.b.half_open(), 0);
}

#[test]
fn a_lost_rep_is_resent_when_the_req_comes_again_and_one_connection_results() {
    let mut n = Net::new(App::Accept, Faults::default(), 5);
    n.a.connect(0, &connect(PORT, b"")).unwrap();
    // Deliver the REQ, lose the REP.
    n.ship();
    let (_, _, req) = n.wire.pop().unwrap();
    n.b.on_mad(LATENCY, peer_a(), &req).unwrap();
    n.events();
    assert_eq!(n.b.poll_send().map(|o| o.mad[17]), Some(cm_attr::REP as u8));
    n.run(HOUR);
    // The repeated REQ is answered with the same REP (B's own timer resends it too, at
    // about the same time); each REP that finds A established gets the RTU again.
    assert_eq!(&n.sent_a[..3], [cm_attr::REQ, cm_attr::REQ, cm_attr::RTU]);
    assert!(n.sent_b.iter().all(|&a| a == cm_attr::REP));
    let rtus = n.sent_a.iter().filter(|&&a| a == cm_attr::RTU).count();
    assert_eq!(
        n.b.counters.cm_duplicates as usize,
        1 + (rtus - 1),
        "the REQ, RTUs after the first"
    );
    assert_eq!((established(&n.ev_a), established(&n.ev_b)), (1, 1));
}

#[test]
fn a_repeated_req_while_the_application_decides_gets_an_mra_and_the_active_side_waits() {
    // The application takes 6 s, longer than A's first wait (4.3 s and a round trip): A's
    // repeated REQ gets an MRA, and A then waits the MRA's time instead of resending.
    let mut n = Net::new(App::AcceptAfter(6_000_000_000), Faults::default(), 6);
    n.a.connect(0, &connect(PORT, b"")).unwrap();
    n.run(HOUR);
    assert_eq!(n.sent_b, [cm_attr::MRA, cm_attr::REP]);
    assert_eq!(n.sent_a, [cm_attr::REQ, cm_attr::REQ, cm_attr::RTU]);
    assert_eq!((established(&n.ev_a), established(&n.ev_b)), (1, 1));
}

#[test]
fn a_req_nobody_answers_is_resent_max_retries_times_then_times_out() {
    let mut n = Net::new(
        App::Accept,
        Faults {
            loss: 1_000_000,
            ..Faults::default()
        },
        7,
    );
    let id = n.a.connect(0, &connect(PORT, b"")).unwrap();
    n.run(HOUR);
    let reqs = n.sent_a.iter().filter(|&&a| a == cm_attr::REQ).count();
    assert_eq!(reqs, 1 + 15);
    assert_eq!(n.sent_a.last(), Some(&cm_attr::REJ), "the REQ withdrawn");
    assert_eq!(n.ev_a, [CmEvent::TimedOut { id }]);
    assert_eq!(n.a.connections(), 0);
    // 16 waits of 4.3 s and two packet life times.
    let wait = time_code_ns(20) + 2 * time_code_ns(PACKET_LIFE_TIME);
    assert_eq!(n.now, 16 * wait);
}

#[test]
fn a_rep_nobody_answers_times_out_on_the_passive_side_and_frees_the_half_open_slot() {
    let mut n = Net::new(App::Accept, Faults::default(), 8);
    let mut a_quiet = cm(A_IP, A_MAC, 9);
    std::mem::swap(&mut n.a, &mut a_quiet);
    a_quiet.connect(0, &connect(PORT, b"")).unwrap();
    let req = a_quiet.poll_send().unwrap();
    n.b.on_mad(0, peer_a(), &req.mad).unwrap();
    n.events();
    assert_eq!(n.b.half_open(), 1);
    // Nothing comes back from A (its CM is not on the wire).
    let mut reps = 0;
    while let Some(o) = n.b.poll_send() {
        reps += if o.mad[17] == cm_attr::REP as u8 {
            1
        } else {
            0
        };
    }
    let mut t = 0;
    while let Some(d) = n.b.next_deadline() {
        t = d;
        n.b.on_timer(t);
        while let Some(o) = n.b.poll_send() {
            reps += if o.mad[17] == cm_attr::REP as u8 {
                1
            } else {
                0
            };
        }
    }
    assert_eq!(reps, 1 + 15, "the REP and its resends");
    assert!(t > 0);
    assert_eq!(n.b.half_open(), 0);
    assert_eq!(n.b.connections(), 0);
    assert!(matches!(n.b.poll_event(), Some(CmEvent::TimedOut { .. })));
}

#[test]
fn a_req_flood_is_bounded_by_the_half_open_limit_and_expires() {
    let mut b = cm(B_IP, B_MAC, 10);
    b.listen(PORT).unwrap();
    let mut a = cm(A_IP, A_MAC, 11);
    let mut rejected = 0;
    for i in 0..1000u32 {
        let mut c = connect(PORT, b"");
        c.local_qpn = 0x1000 + i;
        a.connect(0, &c).unwrap();
        let req = a.poll_send().unwrap();
        b.on_mad(0, peer_a(), &req.mad).unwrap();
        while let Some(o) = b.poll_send() {
            rejected += if o.mad[17] == cm_attr::REJ as u8 {
                1
            } else {
                0
            };
        }
    }
    assert_eq!(b.half_open(), 256);
    assert_eq!(b.connections(), 256);
    assert_eq!(rejected, 1000 - 256);
    assert_eq!(b.counters.cm_rej_no_resources, 744);
    // The application never answers; the requests expire.
    while let Some(d) = b.next_deadline() {
        b.on_timer(d);
    }
    assert_eq!((b.half_open(), b.connections()), (0, 0));
    assert_eq!(b.counters.cm_timeouts, 256);
}

#[test]
fn a_lost_drep_is_answered_again_from_time_wait() {
    let mut n = Net::new(App::Accept, Faults::default(), 12);
    // Longer than A's wait for the DREP, so that the repeated DREQ finds the connection.
    n.b.cfg.time_wait_ns = 60_000_000_000;
    let id = n.a.connect(0, &connect(PORT, b"")).unwrap();
    n.run(HOUR);
    n.a.disconnect(n.now, id).unwrap();
    // The DREQ arrives; the DREP is lost.
    n.ship();
    let (at, _, dreq) = n.wire.pop().unwrap();
    n.now = at;
    n.b.on_mad(at, peer_a(), &dreq).unwrap();
    assert_eq!(
        n.b.poll_send().map(|o| o.mad[17]),
        Some(cm_attr::DREP as u8)
    );
    n.run(n.now + 30_000_000_000);
    assert_eq!(
        n.sent_a.iter().filter(|&&a| a == cm_attr::DREQ).count(),
        2,
        "resent"
    );
    assert_eq!(n.sent_b, [cm_attr::REP, cm_attr::DREP], "from time-wait");
    assert_eq!(n.b.counters.cm_duplicates, 1);
    assert_eq!(
        count(&n.ev_a, |e| matches!(e, CmEvent::Disconnected { .. })),
        1
    );
    assert_eq!(
        count(&n.ev_b, |e| matches!(e, CmEvent::Disconnected { .. })),
        1
    );
}

#[test]
fn a_dreq_nobody_answers_still_ends_the_connection() {
    let mut n = Net::new(App::Accept, Faults::default(), 13);
    let id = n.a.connect(0, &connect(PORT, b"")).unwrap();
    n.run(HOUR);
    n.faults.loss = 1_000_000;
    n.a.disconnect(n.now, id).unwrap();
    n.run(n.now + HOUR);
    assert_eq!(n.sent_a.iter().filter(|&&a| a == cm_attr::DREQ).count(), 16);
    assert!(matches!(n.ev_a.last(), Some(CmEvent::Disconnected { .. })));
    assert_eq!(n.a.connections(), 0);
}

#[test]
fn a_req_repeated_after_the_connection_ended_is_rejected_stale() {
    let mut n = Net::new(App::Accept, Faults::default(), 14);
    let id = n.a.connect(0, &connect(PORT, b"")).unwrap();
    n.ship();
    let req = n.wire[0].2;
    n.run(HOUR);
    n.a.disconnect(n.now, id).unwrap();
    n.run(n.now + 1_000_000);
    // B is in time-wait; the old REQ arrives late.
    n.b.on_mad(n.now, peer_a(), &req).unwrap();
    let rej = n.b.poll_send().unwrap();
    let r = RejRepr::parse(&rej.mad[mad::HEADER_LEN..]).unwrap();
    assert_eq!(r.reason, rej_reason::STALE_CONN);
}

#[test]
fn messages_for_unknown_ids_are_counted_and_answered_only_where_the_ibta_says() {
    let mut b = cm(B_IP, B_MAC, 15);
    let mut m = [0u8; mad::MAD_LEN];
    // A DREQ for a connection B does not have: DREP (the peer may have missed ours).
    write_mad(&mut m, cm_attr::DREQ, 9, |d| {
        DreqRepr {
            local_comm_id: 5,
            remote_comm_id: 77,
            remote_qpn: 1,
            private_data: [0; cm::DREQ_PRIVATE_DATA_LEN],
        }
        .emit(d)
    });
    b.on_mad(0, peer_a(), &m).unwrap();
    assert_eq!(b.poll_send().map(|o| o.mad[17]), Some(cm_attr::DREP as u8));
    // RTU, DREP, MRA, REJ for nothing: dropped.
    for attr in [cm_attr::RTU, cm_attr::DREP, cm_attr::MRA, cm_attr::REJ] {
        write_mad(&mut m, attr, 9, |d| {
            d[..8].copy_from_slice(&[0, 0, 0, 5, 0, 0, 0, 77]);
            Ok(())
        });
        b.on_mad(0, peer_a(), &m).unwrap();
        assert!(b.poll_send().is_none(), "attribute {attr:#x}");
    }
    // A REP for nothing: REJ "invalid communication ID".
    write_mad(&mut m, cm_attr::REP, 9, |d| {
        d[..8].copy_from_slice(&[0, 0, 0, 5, 0, 0, 0, 77]);
        Ok(())
    });
    b.on_mad(0, peer_a(), &m).unwrap();
    let rej = b.poll_send().unwrap();
    let r = RejRepr::parse(&rej.mad[mad::HEADER_LEN..]).unwrap();
    assert_eq!(r.reason, rej_reason::INVALID_COMM_ID);
    assert_eq!(r.remote_comm_id, 5);
    assert_eq!(b.counters.cm_unknown_comm_id, 6);
    assert_eq!(b.connections(), 0);
}

#[test]
fn malformed_mads_are_refused_by_reason() {
    let mut b = cm(B_IP, B_MAC, 16);
    let mut good = [0u8; mad::MAD_LEN];
    write_mad(&mut good, cm_attr::RTU, 1, |_| Ok(()));
    let cases: [(usize, u8, MadRefusal); 4] = [
        (0, 2, MadRefusal::BaseVersion),
        (1, 0x81, MadRefusal::Class),
        (2, 1, MadRefusal::ClassVersion),
        (3, 0x01, MadRefusal::Method),
    ];
    for (at, v, why) in cases {
        let mut m = good;
        m[at] = v;
        assert_eq!(b.on_mad(0, peer_a(), &m), Err(why));
    }
    for attr in [cm_attr::LAP, cm_attr::APR, cm_attr::SIDR_REQ, 0x0099] {
        let mut m = good;
        m[16..18].copy_from_slice(&attr.to_be_bytes());
        assert_eq!(b.on_mad(0, peer_a(), &m), Err(MadRefusal::Attribute));
    }
    assert_eq!(b.on_mad(0, peer_a(), &good[..255]), Err(MadRefusal::Length));
    let c = b.counters;
    assert_eq!(
        (
            c.mad_bad_base_version,
            c.mad_bad_class,
            c.mad_bad_class_version,
            c.mad_bad_method,
            c.mad_unsupported_attribute,
            c.mad_bad_length
        ),
        (1, 1, 1, 1, 4, 1)
    );
    assert!(b.poll_send().is_none(), "nothing answered");
}

#[test]
fn reqs_with_impossible_fields_are_rejected_with_their_reason() {
    for (tweak, reason) in [
        (0usize, rej_reason::INVALID_TRANSPORT_TYPE),
        (1, rej_reason::INVALID_MTU),
        (2, rej_reason::INVALID_GID),
        (3, rej_reason::CONSUMER_DEFINED),
    ] {
        let mut b = cm(B_IP, B_MAC, 17);
        b.listen(PORT).unwrap();
        let mut a = cm(A_IP, A_MAC, 18);
        a.connect(0, &connect(PORT, b"")).unwrap();
        let mut m = a.poll_send().unwrap().mad;
        let mut req = ReqRepr::parse(&m[mad::HEADER_LEN..]).unwrap();
        match tweak {
            0 => req.transport_service_type = 1,
            1 => req.path_mtu = 6,
            2 => req.primary_path.remote_gid = mapped(Ipv4Addr::new(10, 9, 9, 9)),
            _ => req.private_data[0] = 0x77, // not rdma_cm's header version
        }
        req.emit(&mut m[mad::HEADER_LEN..]).unwrap();
        b.on_mad(0, peer_a(), &m).unwrap();
        let rej = b.poll_send().unwrap();
        let r = RejRepr::parse(&rej.mad[mad::HEADER_LEN..]).unwrap();
        assert_eq!(r.reason, reason, "tweak {tweak}");
        assert_eq!(b.connections(), 0);
    }
}

/// Lost, repeated and reordered MADs, many seeds: every run ends in exactly one connection
/// on both sides, or in a clean end on both (the active side timed out or was rejected, the
/// passive side holds nothing once its timers ran).
#[test]
fn under_loss_duplication_and_reordering_the_ends_agree() {
    let mut outcomes = [0usize; 2];
    for seed in 0..300u64 {
        let faults = Faults {
            loss: 250_000,
            dup: 200_000,
            jitter: 3 * LATENCY,
        };
        let mut n = Net::new(App::Accept, faults, seed);
        let id = n.a.connect(0, &connect(PORT, b"")).unwrap();
        n.run(HOUR);
        let (ea, eb) = (established(&n.ev_a), established(&n.ev_b));
        assert!(ea <= 1 && eb <= 1, "seed {seed}: {:?} {:?}", n.ev_a, n.ev_b);
        if ea == 1 {
            // The active side is up; the passive side too, or it times out its REP and the
            // active side's queue pair then sees nothing: both count as one outcome each,
            // so insist on the passive side's RTU having come (RTUs are resent on REPs).
            assert_eq!(eb, 1, "seed {seed}: {:?} {:?}", n.ev_a, n.ev_b);
            outcomes[0] += 1;
            // And teardown under the same faults ends both.
            n.a.disconnect(n.now, id).unwrap();
            n.run(n.now + HOUR);
            assert!(
                matches!(n.ev_a.last(), Some(CmEvent::Disconnected { .. })),
                "seed {seed}"
            );
            assert_eq!(n.a.connections(), 0, "seed {seed}");
        } else {
            assert_eq!(eb, 0, "seed {seed}");
            assert!(
                matches!(
                    n.ev_a.last(),
                    Some(CmEvent::TimedOut { .. } | CmEvent::Rejected { .. })
                ),
                "seed {seed}: {:?}",
                n.ev_a
            );
            outcomes[1] += 1;
        }
        n.run(n.now + HOUR);
        assert_eq!(n.b.half_open(), 0, "seed {seed}");
        assert_eq!(n.a.connections(), 0, "seed {seed}");
    }
    assert!(outcomes[0] > 250, "most connect: {outcomes:?}");
}

#[test]
fn a_packet_on_the_queue_pair_establishes_a_connection_whose_rtu_was_lost() {
    let mut b = cm(B_IP, B_MAC, 20);
    b.listen(PORT).unwrap();
    let mut a = cm(A_IP, A_MAC, 21);
    a.connect(0, &connect(PORT, b"")).unwrap();
    let req = a.poll_send().unwrap();
    b.on_mad(1, peer_a(), &req.mad).unwrap();
    let Some(CmEvent::ConnectRequest(r)) = b.poll_event() else {
        panic!()
    };
    assert!(!b.traffic(r.id), "not before the accept");
    b.accept(2, r.id, &accept(b"")).unwrap();
    assert!(b.awaits_rtu(r.id));
    let rep = b.poll_send().unwrap();
    a.on_mad(3, peer_b(), &rep.mad).unwrap();
    assert_eq!(
        a.poll_send().map(|o| o.mad[17]),
        Some(cm_attr::RTU as u8),
        "lost"
    );
    assert!(b.traffic(r.id));
    assert!(matches!(b.poll_event(), Some(CmEvent::Established { .. })));
    assert_eq!(b.half_open(), 0);
    assert_eq!(b.counters.cm_established, 1);
    assert!(!b.traffic(r.id), "once");
    assert_eq!(b.next_deadline(), None, "the REP is not resent");
    // The RTU, late: a duplicate.
    let rtu = IdsRepr {
        local_comm_id: req.mad[24..28]
            .iter()
            .fold(0, |v, &x| v << 8 | u32::from(x)),
        remote_comm_id: r.id,
        private_data: [0; cm::SHORT_PRIVATE_DATA_LEN],
    };
    let mut m = [0u8; mad::MAD_LEN];
    write_mad(&mut m, cm_attr::RTU, 1, |d| rtu.emit(d));
    b.on_mad(4, peer_a(), &m).unwrap();
    assert!(b.poll_event().is_none());
    assert_eq!(b.counters.cm_duplicates, 1);
}
