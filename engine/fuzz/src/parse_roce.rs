//! The `parse_roce` fuzz harness: arbitrary bytes to the whole-frame RoCEv2 parser and to
//! every header parser of `portico-wire`, QP1's frame, DETH, MAD header and CM messages and the
//! PFC frame included. None of them may panic. When a frame parses, it is emitted again and
//! must parse back to the same headers and payload. The receive path's one-pass decode
//! (`RxFrame`) must judge every input as the reference (`RocePacket`, then `RoceRepr::parse`)
//! does.
//!
//! Shared, like `rdma_node.rs`, by the fuzz target and the replay test
//! (`engine/node/tests/fuzz_regressions.rs`).

use core::net::Ipv4Addr;

use wire::deth::DethRepr;
use wire::mad::MadRepr;
use wire::{
    AethRepr, BthRepr, Checks, EthernetRepr, FethRepr, ImmDtRepr, Ipv4Repr, RethRepr, RocePacket,
    RoceRepr, RxFrame, RxHeaders, TransportHeaders, UdpRepr, aeth, bth, cm, deth, ethernet, feth,
    immdt, ipv4, mad, parse_frame, reth, udp,
};

/// Runs one input; panics when an invariant breaks.
pub fn run(data: &[u8]) {
    // QP1's whole frame and the PFC frame: each parsed one is emitted again and parses back.
    if let Ok((repr, payload)) = wire::gsi::GsiRepr::parse(data) {
        let mut buf = vec![0u8; repr.buffer_len(payload.len())];
        let len = repr
            .emit(payload, &mut buf)
            .expect("a parsed QP1 frame re-emits");
        let (again, again_payload) =
            wire::gsi::GsiRepr::parse(&buf[..len]).expect("an emitted QP1 frame parses");
        assert_eq!((again, again_payload), (repr, payload));
    }
    if let Ok(pfc) = wire::pfc::PfcRepr::parse(data) {
        let mut buf = [0u8; wire::pfc::FRAME_LEN];
        pfc.emit(&mut buf).expect("60 bytes hold a PFC frame");
        assert_eq!(wire::pfc::PfcRepr::parse(&buf), Ok(pfc));
    }
    if let Ok((repr, payload)) = parse_frame(data) {
        let mut buf = vec![0u8; repr.buffer_len(payload.len())];
        let len = repr
            .emit(&mut buf, payload)
            .expect("a parsed frame re-emits");
        let (again, again_payload) = parse_frame(&buf[..len]).expect("an emitted frame parses");
        assert_eq!(again, repr);
        assert_eq!(again_payload, payload);
    }
    if let Ok(packet) = RocePacket::new_checked(data) {
        let _ = RoceRepr::parse_with(&packet, Checks::NONE);
        let _ = (packet.verify_icrc(), packet.payload(), packet.pad());
    }
    // The receive path's one-pass decode judges every frame as the reference does: the
    // same refusal, or the same filter fields, headers and payload.
    let mut headers: RxHeaders = RxHeaders::default();
    match (
        RxFrame::new(data, &mut headers),
        RocePacket::new_checked(data),
    ) {
        (Err(ours), Err(theirs)) => assert_eq!(ours, theirs),
        (Ok(rx), Ok(p)) => {
            assert_eq!(
                (rx.dst_addr(), rx.dest_qp()),
                (p.ipv4().dst_addr(), p.bth().dest_qp())
            );
            let ours = rx.verify().map(|(r, payload)| (*r, payload));
            let theirs = RoceRepr::parse(&p).map(|r| (r, p.payload()));
            assert_eq!(ours, theirs);
            // What a transport reads, decoded alone: the same, with the envelope cleared.
            let mut transport = TransportHeaders::default();
            let rx = RxFrame::new(data, &mut transport).expect("accepted above");
            let ours = rx.verify().map(|(r, payload)| (*r, payload));
            let cleared = theirs.map(|(mut r, payload)| {
                r.clear_envelope();
                (r, payload)
            });
            assert_eq!(ours, cleared);
        }
        (ours, theirs) => panic!("RxFrame {ours:?}, the reference {theirs:?}"),
    }

    if let Ok(p) = ethernet::Packet::new_checked(data) {
        let _ = EthernetRepr::parse(&p);
    }
    if let Ok(p) = ipv4::Packet::new_checked(data) {
        let _ = Ipv4Repr::parse(&p);
    }
    if let Ok(p) = udp::Packet::new_checked(data) {
        let _ = UdpRepr::parse(&p, Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST);
    }
    if let Ok(p) = bth::Packet::new_checked(data) {
        let _ = BthRepr::parse(&p);
    }
    if let Ok(p) = reth::Packet::new_checked(data) {
        let _ = RethRepr::parse(&p);
    }
    if let Ok(p) = aeth::Packet::new_checked(data) {
        let _ = AethRepr::parse(&p);
    }
    if let Ok(p) = immdt::Packet::new_checked(data) {
        let _ = ImmDtRepr::parse(&p);
    }
    if let Ok(p) = feth::Packet::new_checked(data) {
        let _ = FethRepr::parse(&p);
    }
    if let Ok(p) = deth::Packet::new_checked(data) {
        let _ = DethRepr::parse(&p);
    }
    // QP1's MADs and the CM's messages: every message parses from any whole MAD's data, and
    // what was parsed re-emits and parses back the same.
    if let Ok(p) = mad::Packet::new_checked(data) {
        let _ = MadRepr::parse(&p);
        cm_messages(p.data());
    }
}

/// Each CM message from `data` (a MAD's data), emitted again and parsed back.
fn cm_messages(data: &[u8]) {
    let mut out = [0u8; mad::DATA_LEN];
    macro_rules! round_trip {
        ($($repr:ty),*) => {$(
            let r = <$repr>::parse(data).expect("a whole MAD's data parses");
            r.emit(&mut out).expect("a parsed message re-emits");
            assert_eq!(<$repr>::parse(&out).expect("an emitted message parses"), r);
        )*};
    }
    round_trip!(
        cm::ReqRepr,
        cm::RepRepr,
        cm::RejRepr,
        cm::MraRepr,
        cm::IdsRepr,
        cm::DreqRepr
    );
    let _ = cm::rdma_cm::CmaHeader::parse(data);
}
