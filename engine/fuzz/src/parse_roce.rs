//! The `parse_roce` fuzz harness: arbitrary bytes to the whole-frame RoCEv2 parser and to
//! every header parser of `portico-wire`. None of them may panic. When a frame parses, it is
//! emitted again and must parse back to the same headers and payload.
//!
//! Shared, like `rdma_node.rs`, by the fuzz target and the replay test
//! (`engine/node/tests/fuzz_regressions.rs`).

use core::net::Ipv4Addr;

use wire::{
    AethRepr, BthRepr, Checks, EthernetRepr, FethRepr, ImmDtRepr, Ipv4Repr, RethRepr, RocePacket,
    RoceRepr, UdpRepr, aeth, bth, ethernet, feth, immdt, ipv4, parse_frame, reth, udp,
};

/// Runs one input; panics when an invariant breaks.
pub fn run(data: &[u8]) {
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
}
