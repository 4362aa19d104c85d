//! Hostile input at the node: every frame a trusted RDMA implementation refuses is dropped
//! under its own counter, with no NAK, no state change and no byte of registered memory
//! touched; and the frame it was made from is accepted, so each test can fail.

use std::net::Ipv4Addr;
use std::sync::Arc;

use pmem::Mapping;

use crate::RxOutcome;
use crate::testing::{End, pair_with, pump};
use proto::transport::{Access, MrKeys, QpState, SgList, WcStatus, WorkCompletion, WorkRequest};
use wire::icrc::{self, Icrc};
use wire::{self, EthernetAddress, NakCode, Opcode, Syndrome};

const PATTERN: u8 = 0x5a;

/// A is the sender, B the node under attack: B's region is 4096 zero bytes.
struct Setup {
    a: End,
    b: End,
    src: MrKeys,
    dst: MrKeys,
    dst_map: Arc<Mapping>,
}

fn setup() -> Setup {
    setup_with(|_| {})
}

/// [`setup`] with A's queue pair (and so B's, its mirror) adjusted by `tune`.
fn setup_with(tune: impl FnOnce(&mut proto::transport::QpConfig)) -> Setup {
    // A's PSNs start near the 24-bit wrap, so the frames here cross it.
    let (mut a, mut b) = pair_with(64, |cfg| {
        cfg.send_psn = 0x00ff_fff0;
        tune(cfg);
    });
    let src_map = Arc::new(Mapping::anonymous(4096).unwrap());
    src_map.fill(0, 4096, PATTERN).unwrap();
    let src = a.node.register(src_map, 0, 4096, Access::ALL).unwrap();
    let dst_map = Arc::new(Mapping::anonymous(4096).unwrap());
    let dst = b
        .node
        .register(dst_map.clone(), 0, 4096, Access::ALL)
        .unwrap();
    Setup {
        a,
        b,
        src,
        dst,
        dst_map,
    }
}

impl Setup {
    /// The one frame of a `len`-byte WRITE from A to B's region (not delivered).
    fn write_frame(&mut self, len: u32) -> Vec<u8> {
        let wr = WorkRequest::write(
            1,
            SgList::one(self.src.lkey, self.src.addr, len),
            self.dst.addr,
            self.dst.rkey,
            None,
        );
        self.a.qp.post_send(&[wr]).unwrap();
        self.a.node.service(0);
        let tx = self.a.node.poll_transmit(0).expect("the WRITE");
        let mut frame = vec![0u8; self.a.node.frame_len(&tx)];
        self.a.node.emit(&tx, &mut frame).unwrap();
        frame
    }

    fn b_memory(&self) -> Vec<u8> {
        let mut m = vec![0u8; 4096];
        self.dst_map.read(0, &mut m).unwrap();
        m
    }

    /// B dropped `frame` under exactly one counter, which `counter` reads, and nothing
    /// else changed: no memory written, no packet owed, PSN where it was.
    fn assert_refused(&mut self, frame: &[u8], counter: fn(&crate::NodeCounters) -> u64) {
        let before = self.b.node.counters;
        let epsn = self.b.node.qp(0x22).unwrap().responder().expected_psn();
        assert_eq!(self.b.node.receive(0, frame), RxOutcome::Dropped);
        assert_eq!(counter(&self.b.node.counters), counter(&before) + 1);
        assert_eq!(self.b.node.counters.rx_frames, before.rx_frames + 1);
        assert_eq!(self.b.node.counters.delivered, before.delivered);
        assert!(self.b_memory().iter().all(|&x| x == 0), "memory untouched");
        let qp = self.b.node.qp(0x22).unwrap();
        assert_eq!(qp.responder().expected_psn(), epsn);
        assert_eq!(qp.state(), QpState::Ready);
        assert!(self.b.node.poll_transmit(0).is_none(), "no NAK, no ACK");
    }

    /// B takes `frame`: the WRITE lands, and B acknowledges it.
    fn assert_accepted(&mut self, frame: &[u8]) {
        assert_eq!(self.b.node.receive(0, frame), RxOutcome::Delivered);
        let len = wire::parse_frame(frame).unwrap().1.len();
        let m = self.b_memory();
        assert!(m[..len].iter().all(|&x| x == PATTERN));
        assert!(m[len..].iter().all(|&x| x == 0));
    }
}

/// Re-encodes a frame after changing its headers (checksums and ICRC made valid again).
fn rewrite(frame: &[u8], change: impl FnOnce(&mut wire::RoceRepr)) -> Vec<u8> {
    let (mut repr, payload) = wire::parse_frame(frame).unwrap();
    change(&mut repr);
    let mut out = vec![0u8; repr.buffer_len(payload.len())];
    let n = repr.emit(&mut out, payload).unwrap();
    out.truncate(n);
    out
}

/// Recomputes the IPv4 checksum and the ICRC of a frame edited byte by byte (20-byte IPv4
/// header at 14, UDP at 34, BTH at 42).
fn reseal(frame: &mut [u8]) {
    frame[24..26].fill(0);
    let sum = wire::checksum::of(&frame[14..34]);
    frame[24..26].copy_from_slice(&sum.to_be_bytes());
    let end = frame.len() - icrc::ICRC_LEN;
    let mut covered = frame[14..end].to_vec();
    for i in [1, 8, 10, 11, 26, 27, 32] {
        covered[i] = 0xff;
    }
    let mut crc = Icrc::new();
    crc.update(&covered);
    frame[end..].copy_from_slice(&icrc::to_wire(crc.finish()));
}

#[test]
fn a_foreign_p_key_or_the_invalid_one_is_dropped_and_counted() {
    let mut s = setup();
    let frame = s.write_frame(64);
    for pkey in [0x1234, 0x0000, 0x8000] {
        let bad = rewrite(&frame, |r| r.bth.pkey = pkey);
        s.assert_refused(&bad, |c| c.bad_pkey);
    }
    // A limited member of the default partition talks to the full member B is.
    let limited = rewrite(&frame, |r| r.bth.pkey = 0x7fff);
    s.assert_accepted(&limited);
}

#[test]
fn a_packet_from_another_address_than_the_peers_is_dropped_and_counted() {
    let mut s = setup();
    let frame = s.write_frame(64);
    let bad = rewrite(&frame, |r| r.ip.src_addr = Ipv4Addr::new(10, 9, 0, 77));
    s.assert_refused(&bad, |c| c.wrong_source);
    s.assert_accepted(&frame);
}

#[test]
fn a_frame_to_another_hosts_mac_is_dropped_even_with_our_ip() {
    let mut s = setup();
    let frame = s.write_frame(64);
    let other = rewrite(&frame, |r| {
        r.dst_mac = EthernetAddress([2, 0, 0, 0, 0, 0x77])
    });
    s.assert_refused(&other, |c| c.wrong_mac);
    let broadcast = rewrite(&frame, |r| r.dst_mac = EthernetAddress([0xff; 6]));
    s.assert_refused(&broadcast, |c| c.not_for_us);
    let multicast = rewrite(&frame, |r| {
        r.dst_mac = EthernetAddress([0x01, 0, 0x5e, 0, 0, 1])
    });
    s.assert_refused(&multicast, |c| c.not_for_us);
    s.assert_accepted(&frame);
}

/// An ARP request sent to our MAC (a unicast one, as a peer refreshing its cache sends) is
/// answered, and counted as a reply, not as a frame for someone else; one for another
/// address is dropped as not ours. (The node looks for ARP only in frames that are not
/// RoCEv2.)
#[test]
fn a_unicast_arp_request_for_our_address_is_answered() {
    let mut s = setup();
    let (peer_mac, peer_ip) = (
        EthernetAddress([2, 0, 0, 0, 0, 0x42]),
        Ipv4Addr::new(10, 0, 0, 42),
    );
    let request = |target: Ipv4Addr, to: EthernetAddress| {
        let mut f = vec![0u8; 64];
        let n = wire::arp::request(peer_mac, peer_ip, target, &mut f).unwrap();
        f.truncate(n);
        f[..6].copy_from_slice(&to.0);
        f
    };
    let (b_mac, b_ip) = (s.b.node.mac, s.b.node.ip);
    let before = s.b.node.counters;
    let RxOutcome::ArpReply(n) = s.b.node.receive(0, &request(b_ip, b_mac)) else {
        panic!("a unicast ARP request for our address is answered");
    };
    let reply = wire::arp::parse_frame(s.b.node.arp_reply(n)).expect("an ARP frame");
    assert_eq!(reply.op, wire::ArpOp::Reply);
    assert_eq!((reply.sender_hw, reply.sender_ip), (b_mac, b_ip));
    assert_eq!((reply.target_hw, reply.target_ip), (peer_mac, peer_ip));
    let after = s.b.node.counters;
    assert_eq!(after.arp_replies, before.arp_replies + 1);
    assert_eq!(after.not_for_us, before.not_for_us);
    let other = request(Ipv4Addr::new(10, 0, 0, 99), b_mac);
    assert!(matches!(s.b.node.receive(0, &other), RxOutcome::Dropped));
    assert_eq!(s.b.node.counters.arp_replies, before.arp_replies + 1);
    assert_eq!(s.b.node.counters.not_for_us, before.not_for_us + 1);
}

#[test]
fn vlan_tags_ip_options_and_fragments_have_their_own_counters() {
    let mut s = setup();
    let frame = s.write_frame(64);

    // An 802.1Q tag between the addresses and the EtherType (the ICRC does not cover it).
    let mut tagged = frame[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
    tagged.extend_from_slice(&frame[12..]);
    s.assert_refused(&tagged, |c| c.vlan_tagged);

    // Four bytes of options (NOPs): IHL 6, total length + 4.
    let mut options = frame[..34].to_vec();
    options.extend_from_slice(&[1, 1, 1, 1]);
    options.extend_from_slice(&frame[34..]);
    options[14] = 0x46;
    let total = u16::from_be_bytes([options[16], options[17]]) + 4;
    options[16..18].copy_from_slice(&total.to_be_bytes());
    options[24..26].fill(0);
    let sum = wire::checksum::of(&options[14..38]);
    options[24..26].copy_from_slice(&sum.to_be_bytes());
    s.assert_refused(&options, |c| c.ip_options);

    // More fragments set (and DF cleared), checksum and ICRC valid.
    let mut fragment = frame.clone();
    fragment[20] = 0x20;
    reseal(&mut fragment);
    s.assert_refused(&fragment, |c| c.ip_fragments);
    // A later fragment: offset 8 bytes.
    let mut later = frame.clone();
    later[20..22].copy_from_slice(&1u16.to_be_bytes());
    reseal(&mut later);
    s.assert_refused(&later, |c| c.ip_fragments);

    s.assert_accepted(&frame);
}

#[test]
fn uc_and_ud_packets_to_an_rc_queue_pair_are_dropped_silently() {
    let mut s = setup();
    let frame = s.write_frame(64);
    // UC RDMA WRITE ONLY: the same headers (RETH, payload) under a UC opcode.
    let mut uc = frame.clone();
    uc[42] = 0x2a;
    reseal(&mut uc);
    s.assert_refused(&uc, |c| c.wrong_transport);
    // UD SEND ONLY: the 8 bytes after the BTH read as a DETH.
    let mut ud = frame.clone();
    ud[42] = 0x64;
    reseal(&mut ud);
    s.assert_refused(&ud, |c| c.wrong_transport);
    s.assert_accepted(&frame);
}

#[test]
fn a_reseal_that_changed_nothing_is_accepted() {
    // The byte-level helper itself: resealing an untouched frame keeps it valid, so the
    // refusals above are the edits' doing and not a broken checksum.
    let mut s = setup();
    let mut frame = s.write_frame(64);
    reseal(&mut frame);
    s.assert_accepted(&frame);
}

#[test]
fn atomics_are_answered_with_nak_invalid_request_and_touch_nothing() {
    for opcode in [Opcode::CompareSwap, Opcode::FetchAdd] {
        let mut s = setup();
        let frame = s.write_frame(64);
        let (mut repr, _) = wire::parse_frame(&frame).unwrap();
        repr.bth.opcode = opcode;
        repr.reth = None;
        let mut atomic_eth = Vec::new();
        atomic_eth.extend_from_slice(&s.dst.addr.to_be_bytes());
        atomic_eth.extend_from_slice(&s.dst.rkey.to_be_bytes());
        atomic_eth.extend_from_slice(&7u64.to_be_bytes());
        atomic_eth.extend_from_slice(&0u64.to_be_bytes());
        let mut atomic = vec![0u8; repr.buffer_len(atomic_eth.len())];
        let n = repr.emit(&mut atomic, &atomic_eth).unwrap();
        assert_eq!(s.b.node.receive(0, &atomic[..n]), RxOutcome::Delivered);
        let tx = s.b.node.poll_transmit(0).expect("a NAK");
        let mut nak = vec![0u8; s.b.node.frame_len(&tx)];
        s.b.node.emit(&tx, &mut nak).unwrap();
        let (nak, _) = wire::parse_frame(&nak).unwrap();
        assert_eq!(nak.bth.opcode, Opcode::Acknowledge);
        assert_eq!(nak.bth.psn, repr.bth.psn);
        assert_eq!(
            nak.aeth.unwrap().syndrome,
            Syndrome::Nak(NakCode::InvalidRequest)
        );
        assert!(s.b_memory().iter().all(|&x| x == 0));
        assert_eq!(s.b.node.qp(0x22).unwrap().state(), QpState::Error);
    }
}

#[test]
fn zero_length_reads_and_writes_are_not_checked_against_rkey_or_address() {
    let mut s = setup();
    // Neither key nor address names anything at B: with DMA length 0 they are not looked at.
    let nowhere = u64::MAX - 3;
    let wrs = [
        WorkRequest::write(1, SgList::new(), nowhere, 0xdead_beef, None),
        WorkRequest::read(2, SgList::new(), nowhere, 0xdead_beef),
        // And a real WRITE afterwards: the connection is still up.
        WorkRequest::write(
            3,
            SgList::one(s.src.lkey, s.src.addr, 8),
            s.dst.addr,
            s.dst.rkey,
            None,
        ),
    ];
    s.a.qp.post_send(&wrs).unwrap();
    pump(&mut s.a.node, &mut s.b.node, 0);
    let mut wcs = [WorkCompletion::EMPTY; 8];
    let n = s.a.cq.poll(&mut wcs);
    assert_eq!(
        wcs[..n]
            .iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        [
            (1, WcStatus::Success, 0),
            (2, WcStatus::Success, 0),
            (3, WcStatus::Success, 8)
        ]
    );
    let m = s.b_memory();
    assert!(m[..8].iter().all(|&x| x == PATTERN));
    assert!(m[8..].iter().all(|&x| x == 0));
    assert_eq!(s.b.node.qp(0x22).unwrap().state(), QpState::Ready);
}

#[test]
fn a_zero_length_write_request_on_the_wire_is_acknowledged() {
    let mut s = setup();
    let frame = s.write_frame(64);
    let zero = rewrite(&frame, |r| {
        let reth = r.reth.as_mut().unwrap();
        reth.dma_len = 0;
        reth.rkey = 0x0bad_0bad;
        reth.virtual_addr = 0;
        r.bth.ack_req = true;
    });
    // The payload must match the DMA length: rebuild without one.
    let (repr, _) = wire::parse_frame(&zero).unwrap();
    let mut empty = vec![0u8; repr.buffer_len(0)];
    let n = repr.emit(&mut empty, &[]).unwrap();
    assert_eq!(s.b.node.receive(0, &empty[..n]), RxOutcome::Delivered);
    let tx = s.b.node.poll_transmit(0).expect("an ACK");
    let mut ack = vec![0u8; s.b.node.frame_len(&tx)];
    s.b.node.emit(&tx, &mut ack).unwrap();
    let (ack, _) = wire::parse_frame(&ack).unwrap();
    assert_eq!(ack.bth.opcode, Opcode::Acknowledge);
    assert_eq!(ack.aeth.unwrap().syndrome, Syndrome::ACK_UNLIMITED);
    assert!(s.b_memory().iter().all(|&x| x == 0));
}

/// The rules at DMA length 0, one test per row of the table in `docs/security.md` ("Length
/// 0"): which request opcodes are checked against rkey, bounds and access flags when they
/// name no bytes. Each request is crafted from A's WRITE frame with B's expected PSN, sent to
/// B alone, and B's one answer is read back.
mod zero_length {
    use super::*;
    use proto::transport::RecvRequest;
    use wire::{FethRepr, ImmDtRepr, Placement, RethRepr, Selectivity};

    /// A key and an address that name nothing at B.
    const BOGUS_RKEY: u32 = 0x1234_5678;
    const BOGUS_ADDR: u64 = 0xdead_0000;

    /// What B sent back to one request.
    #[derive(Debug, PartialEq)]
    struct Answer {
        opcode: Opcode,
        syndrome: Option<Syndrome>,
        payload: usize,
        state: QpState,
    }

    fn ack(opcode: Opcode) -> Answer {
        Answer {
            opcode,
            syndrome: Some(Syndrome::ACK_UNLIMITED),
            payload: 0,
            state: QpState::Ready,
        }
    }

    fn nak(code: NakCode) -> Answer {
        Answer {
            opcode: Opcode::Acknowledge,
            syndrome: Some(Syndrome::Nak(code)),
            payload: 0,
            state: QpState::Error,
        }
    }

    /// A region of B that allows FLUSH of both placement types (B's `dst` allows neither).
    fn flushable(s: &mut Setup) -> MrKeys {
        let map = Arc::new(Mapping::anonymous(4096).unwrap());
        let access = Access::ALL | Access::FLUSH_GLOBAL | Access::FLUSH_PERSISTENT;
        s.b.node.register(map, 0, 4096, access).unwrap()
    }

    /// One request of `opcode` with these extension headers and payload, at B's expected PSN
    /// and with AckReq set, made from a WRITE frame of A's.
    fn request(
        s: &mut Setup,
        opcode: Opcode,
        reth: Option<RethRepr>,
        feth: Option<FethRepr>,
        imm: bool,
        payload: &[u8],
    ) -> Vec<u8> {
        let frame = s.write_frame(8);
        let (mut repr, _) = wire::parse_frame(&frame).unwrap();
        repr.bth.opcode = opcode;
        repr.bth.ack_req = true;
        repr.reth = reth;
        repr.feth = feth;
        repr.immdt = imm.then_some(ImmDtRepr { data: [1, 2, 3, 4] });
        let mut out = vec![0u8; repr.buffer_len(payload.len())];
        let n = repr.emit(&mut out, payload).unwrap();
        out.truncate(n);
        out
    }

    /// [`request`] of `opcode` with no immediate and no payload, and B's answer to it.
    fn ask(
        s: &mut Setup,
        opcode: Opcode,
        reth: Option<RethRepr>,
        feth: Option<FethRepr>,
    ) -> Answer {
        let f = request(s, opcode, reth, feth, false, &[]);
        answer(s, &f)
    }

    /// B takes `frame` and answers it once.
    fn answer(s: &mut Setup, frame: &[u8]) -> Answer {
        assert_eq!(s.b.node.receive(0, frame), RxOutcome::Delivered);
        s.b.node.service(0);
        let tx = s.b.node.poll_transmit(0).expect("an answer");
        let mut out = vec![0u8; s.b.node.frame_len(&tx)];
        s.b.node.emit(&tx, &mut out).unwrap();
        let (repr, payload) = wire::parse_frame(&out).unwrap();
        Answer {
            opcode: repr.bth.opcode,
            syndrome: repr.aeth.map(|a| a.syndrome),
            payload: payload.len(),
            state: s.b.node.qp(0x22).unwrap().state(),
        }
    }

    fn reth(virtual_addr: u64, rkey: u32, dma_len: u32) -> Option<RethRepr> {
        Some(RethRepr {
            virtual_addr,
            rkey,
            dma_len,
        })
    }

    fn feth(
        selectivity: Selectivity,
        global_visibility: bool,
        persistence: bool,
    ) -> Option<FethRepr> {
        Some(FethRepr {
            selectivity,
            placement: Placement {
                global_visibility,
                persistence,
            },
        })
    }

    fn untouched(s: &Setup) {
        assert!(s.b_memory().iter().all(|&x| x == 0), "B's memory untouched");
    }

    #[test]
    fn send_only_of_zero_bytes_needs_a_receive_and_completes_it_empty() {
        let mut s = setup();
        let f = request(&mut s, Opcode::SendOnly, None, None, false, &[]);
        // No receive posted: RNR NAK, nothing consumed.
        let rnr = answer(&mut s, &f);
        assert!(
            matches!(rnr.syndrome, Some(Syndrome::RnrNak { .. })),
            "{rnr:?}"
        );
        let mut s = setup();
        let sgl = SgList::one(s.dst.lkey, s.dst.addr, 64);
        s.b.qp.post_recv(&[RecvRequest::new(9, sgl)]).unwrap();
        s.b.node.service(0);
        let f = request(&mut s, Opcode::SendOnly, None, None, false, &[]);
        assert_eq!(answer(&mut s, &f), ack(Opcode::Acknowledge));
        s.b.node.flush_completions();
        let mut wcs = [WorkCompletion::EMPTY; 4];
        let n = s.b.cq.poll(&mut wcs);
        assert_eq!(
            wcs[..n]
                .iter()
                .map(|w| (w.wr_id, w.status, w.byte_len))
                .collect::<Vec<_>>(),
            [(9, WcStatus::Success, 0)]
        );
        untouched(&s);
    }

    #[test]
    fn write_only_of_zero_bytes_is_not_checked_c9_88() {
        let mut s = setup();
        assert_eq!(
            ask(
                &mut s,
                Opcode::RdmaWriteOnly,
                reth(BOGUS_ADDR, BOGUS_RKEY, 0),
                None
            ),
            ack(Opcode::Acknowledge)
        );
        untouched(&s);
    }

    #[test]
    fn write_only_with_immediate_of_zero_bytes_is_not_checked_and_consumes_a_receive() {
        let mut s = setup();
        s.b.qp
            .post_recv(&[RecvRequest::new(9, SgList::new())])
            .unwrap();
        s.b.node.service(0);
        let f = request(
            &mut s,
            Opcode::RdmaWriteOnlyWithImmediate,
            reth(BOGUS_ADDR, BOGUS_RKEY, 0),
            None,
            true,
            &[],
        );
        assert_eq!(answer(&mut s, &f), ack(Opcode::Acknowledge));
        s.b.node.flush_completions();
        let mut wcs = [WorkCompletion::EMPTY; 4];
        let n = s.b.cq.poll(&mut wcs);
        assert_eq!(n, 1);
        assert_eq!(
            (wcs[0].wr_id, wcs[0].status, wcs[0].byte_len),
            (9, WcStatus::Success, 0)
        );
        untouched(&s);
    }

    #[test]
    fn write_first_of_zero_bytes_is_malformed() {
        // A FIRST carries exactly one MTU: a zero-length message is WRITE ONLY.
        let mut s = setup();
        let (addr, rkey) = (s.dst.addr, s.dst.rkey);
        assert_eq!(
            ask(&mut s, Opcode::RdmaWriteFirst, reth(addr, rkey, 0), None),
            nak(NakCode::InvalidRequest)
        );
        untouched(&s);
    }

    #[test]
    fn read_of_zero_bytes_is_not_checked_c9_88() {
        let mut s = setup();
        assert_eq!(
            ask(
                &mut s,
                Opcode::RdmaReadRequest,
                reth(BOGUS_ADDR, BOGUS_RKEY, 0),
                None
            ),
            ack(Opcode::RdmaReadResponseOnly)
        );
    }

    #[test]
    fn flush_of_a_zero_length_range_checks_the_rkey() {
        // The independent peer's frame: rkey 0x12345678, address 0xDEAD0000, length 0.
        let mut s = setup();
        assert_eq!(
            ask(
                &mut s,
                Opcode::Flush,
                reth(BOGUS_ADDR, BOGUS_RKEY, 0),
                feth(Selectivity::MemoryRange, false, true)
            ),
            nak(NakCode::RemoteAccessError)
        );
        untouched(&s);
    }

    #[test]
    fn flush_of_a_zero_length_range_checks_the_bounds() {
        let mut s = setup();
        let r = flushable(&mut s);
        // One byte past the region's end: [VA, VA + 0) is not inside it.
        assert_eq!(
            ask(
                &mut s,
                Opcode::Flush,
                reth(r.addr + 4097, r.rkey, 0),
                feth(Selectivity::MemoryRange, true, false)
            ),
            nak(NakCode::RemoteAccessError)
        );
    }

    #[test]
    fn flush_of_a_zero_length_range_checks_the_access_flags() {
        // B's `dst` allows READ and WRITE, not FLUSH.
        for (global, persistent) in [(true, false), (false, true)] {
            let mut s = setup();
            let (addr, rkey) = (s.dst.addr, s.dst.rkey);
            assert_eq!(
                ask(
                    &mut s,
                    Opcode::Flush,
                    reth(addr, rkey, 0),
                    feth(Selectivity::MemoryRange, global, persistent)
                ),
                nak(NakCode::RemoteAccessError)
            );
        }
    }

    #[test]
    fn flush_of_a_zero_length_range_that_passes_every_check_is_answered() {
        // The row's other side: the same request, legitimate, gets its empty response, also
        // at the region's very end.
        for offset in [0, 4096] {
            let mut s = setup();
            let r = flushable(&mut s);
            assert_eq!(
                ask(
                    &mut s,
                    Opcode::Flush,
                    reth(r.addr + offset, r.rkey, 0),
                    feth(Selectivity::MemoryRange, true, true)
                ),
                ack(Opcode::RdmaReadResponseOnly)
            );
        }
    }

    #[test]
    fn flush_of_a_whole_region_checks_the_rkey_whatever_the_length() {
        let mut s = setup();
        assert_eq!(
            ask(
                &mut s,
                Opcode::Flush,
                reth(0, BOGUS_RKEY, 0),
                feth(Selectivity::MemoryRegion, false, true)
            ),
            nak(NakCode::RemoteAccessError)
        );
        let mut s = setup();
        let r = flushable(&mut s);
        assert_eq!(
            ask(
                &mut s,
                Opcode::Flush,
                reth(0, r.rkey, 0),
                feth(Selectivity::MemoryRegion, false, true)
            ),
            ack(Opcode::RdmaReadResponseOnly)
        );
    }

    #[test]
    fn atomic_write_of_dma_length_zero_is_an_invalid_request() {
        // ATOMIC WRITE is always 8 bytes: its payload is exactly 8 (`wire` cannot even encode
        // another length, and parses none), and a DMA length other than 8 is refused.
        let mut s = setup();
        let (addr, rkey) = (s.dst.addr, s.dst.rkey);
        let value = 7u64.to_be_bytes();
        let f = request(
            &mut s,
            Opcode::AtomicWrite,
            reth(addr, rkey, 0),
            None,
            false,
            &value,
        );
        assert_eq!(answer(&mut s, &f), nak(NakCode::InvalidRequest));
        untouched(&s);
        // And with DMA length 8 the same request lands (the row can fail).
        let mut s = setup();
        let (addr, rkey) = (s.dst.addr, s.dst.rkey);
        let f = request(
            &mut s,
            Opcode::AtomicWrite,
            reth(addr, rkey, 8),
            None,
            false,
            &value,
        );
        assert_eq!(answer(&mut s, &f), ack(Opcode::RdmaReadResponseOnly));
        assert_eq!(s.b_memory()[..8], value);
    }

    #[test]
    fn durable_write_only_of_zero_bytes_is_not_checked_like_a_write() {
        // Portico's durable WRITE is a WRITE (C9-88 applies); its durable ACK vouches for the
        // durable WRITEs before it, which were checked, and for no range of its own. Nothing
        // to persist: the durable ACK is owed at once and goes alone, standing for the receipt
        // ACK too (it names the last PSN received).
        let mut s = setup_with(|cfg| cfg.durable_writes = true);
        assert_eq!(
            ask(
                &mut s,
                Opcode::DurableWriteOnly,
                reth(BOGUS_ADDR, BOGUS_RKEY, 0),
                None
            ),
            ack(Opcode::DurableAcknowledge)
        );
        // Without the negotiation the opcode is refused at any length.
        let mut s = setup();
        assert_eq!(
            ask(
                &mut s,
                Opcode::DurableWriteOnly,
                reth(BOGUS_ADDR, BOGUS_RKEY, 0),
                None
            ),
            nak(NakCode::InvalidRequest)
        );
    }
}
