use super::*;
use crate::roce::tests::{ack_with_ceth, golden_frames, roce_strategy};
use crate::{Error, Layer};
use proptest::prelude::*;

/// Runs `frame` through [`RxFrame`] and through the reference (`RocePacket::new_checked`,
/// then `RoceRepr::parse`) and panics where they differ: the structure check's verdict, the
/// filters' fields, and the verified headers and payload, with the ICRC computed whole and
/// by a masked fold over the frame as it lies. Returns whether the one pass took the frame.
fn agree(frame: &[u8]) -> bool {
    let mut headers: RxHeaders = RxHeaders::default();
    let reference = RocePacket::new_checked(frame);
    let rx = match (RxFrame::new(frame, &mut headers), &reference) {
        (Err(ours), Err(theirs)) => {
            assert_eq!(ours, *theirs);
            return false;
        }
        (Ok(rx), Ok(p)) => {
            assert_eq!(rx.dst_addr(), p.ipv4().dst_addr());
            assert_eq!(rx.dest_qp(), p.bth().dest_qp());
            rx
        }
        (ours, theirs) => panic!("new: {ours:?} against the reference's {theirs:?}"),
    };
    let one_pass = rx.decoded.is_some();
    let p = reference.expect("both accepted");
    let theirs = RoceRepr::parse(&p).map(|r| (r, p.payload().to_vec()));
    let ours = rx.verify().map(|(r, payload)| (*r, payload.to_vec()));
    assert_eq!(ours, theirs, "verify");

    // The one pass of a masked fold over the frame as it lies (`pmem::crc::update_masked`
    // checks its kernels against this one).
    let mut again: RxHeaders = RxHeaders::default();
    let rx = RxFrame::new(frame, &mut again).expect("accepted above");
    let ours = rx.verify_masked(icrc::fold_masked_tables);
    assert_eq!(
        ours.map(|(r, pl)| (*r, pl.to_vec())),
        theirs,
        "verify_masked"
    );

    // What a transport reads, decoded alone: the reference's headers with the envelope at
    // its defaults.
    let mut transport = TransportHeaders::default();
    let rx = RxFrame::new(frame, &mut transport).expect("accepted above");
    let ours = rx.verify_masked(icrc::fold_masked_tables);
    assert_eq!(
        ours.map(|(r, pl)| (*r, pl.to_vec())),
        cleared(theirs),
        "transport"
    );
    one_pass
}

/// A reference result with [`RoceRepr::clear_envelope`] applied.
fn cleared(r: Result<(RoceRepr, Vec<u8>)>) -> Result<(RoceRepr, Vec<u8>)> {
    r.map(|(mut repr, payload)| {
        repr.clear_envelope();
        (repr, payload)
    })
}

fn emit(repr: &RoceRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len(payload.len())];
    let n = repr.emit(&mut buf, payload).expect("a valid repr");
    buf.truncate(n);
    buf
}

/// Sets byte `at` of a valid frame and writes the ICRC again, so that only the field
/// changed is wrong.
fn patched(frame: &[u8], at: usize, value: u8) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[at] = value;
    RocePacket::new_checked(&mut f[..])
        .expect("structure")
        .fill_icrc();
    f
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Every opcode with any headers and payload: both agree, and the one pass takes every
    /// frame but a CNP and an ACK with BECN set (which may carry a CETH).
    #[test]
    fn prop_the_one_pass_takes_every_plain_frame_and_agrees(
        (repr, payload) in roce_strategy(),
        padding in 0usize..6,
    ) {
        let mut frame = emit(&repr, &payload);
        // Ethernet padding after the datagram (short frames on the wire) is not the packet's.
        frame.extend(std::iter::repeat_n(0, padding));
        let op = repr.bth.opcode;
        let plain = !(op == Opcode::Cnp || (op == Opcode::Acknowledge && repr.bth.becn));
        prop_assert_eq!(agree(&frame), plain, "{:?}", op);
    }

    /// Frames with bytes changed anywhere, lengths changed or cut short: both refuse with
    /// the same error, or accept with the same headers.
    #[test]
    fn prop_changed_frames_are_judged_as_the_reference_judges_them(
        (repr, payload) in roce_strategy(),
        flips in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 0..4),
        cut in proptest::option::of(any::<proptest::sample::Index>()),
        refill_icrc in any::<bool>(),
    ) {
        let mut frame = emit(&repr, &payload);
        for (at, value) in &flips {
            let at = at.index(frame.len());
            frame[at] = *value;
        }
        // Now and then the ICRC made right again, so that the checks behind it are reached.
        if refill_icrc && let Ok(mut p) = RocePacket::new_checked(&mut frame[..]) {
            p.fill_icrc();
        }
        if let Some(cut) = cut {
            frame.truncate(cut.index(frame.len() + 1));
        }
        agree(&frame);
    }

    /// Changes in the headers the one pass reads, on the golden frames (captures and
    /// hand-made frames of the CNP, READ, WRITE, ACK and SEND kinds).
    #[test]
    fn prop_changed_golden_frames_are_judged_as_the_reference_judges_them(
        which in 0usize..6,
        flips in proptest::collection::vec((0usize..80, any::<u8>()), 1..3),
        refill_icrc in any::<bool>(),
    ) {
        let mut frame = golden_frames()[which].clone();
        for &(at, value) in &flips {
            if let Some(b) = frame.get_mut(at) {
                *b = value;
            }
        }
        if refill_icrc && let Ok(mut p) = RocePacket::new_checked(&mut frame[..]) {
            p.fill_icrc();
        }
        agree(&frame);
    }
}

/// One `TransportHeaders` through the golden frames (each one as it is, and with a non-zero
/// UDP checksum, which the reference path takes) and frames from other addresses: the
/// envelope is never a frame's, the rest always the frame's own, in whatever order the two
/// paths come.
#[test]
fn transport_headers_hold_no_envelope_whichever_path_decoded_the_last_frame() {
    let mut frames = Vec::new();
    for f in golden_frames() {
        // A UDP checksum that is not zero: only the reference reads it (it is not checked
        // against the pseudo-header there either, as RoCEv2 allows).
        let mut other = f.clone();
        other[UDP_OFFSET + 6] = 0x12;
        other[UDP_OFFSET + 7] = 0x34;
        if let Ok(mut p) = RocePacket::new_checked(&mut other[..]) {
            p.fill_icrc();
        }
        // Another source MAC, IPv4 identification and UDP source port.
        let mut moved = f.clone();
        moved[6] ^= 0x5a;
        moved[IP_OFFSET + 5] ^= 0x33;
        moved[UDP_OFFSET + 1] ^= 0x0f;
        if let Ok(mut p) = RocePacket::new_checked(&mut moved[..]) {
            p.ipv4_mut().fill_checksum();
            p.fill_icrc();
        }
        frames.extend([f, other, moved]);
    }
    let mut transport = TransportHeaders::default();
    let mut paths = [0; 2];
    for f in &frames {
        let theirs = RocePacket::new_checked(&f[..])
            .and_then(|p| RoceRepr::parse(&p).map(|r| (r, p.payload().to_vec())));
        let rx = RxFrame::new(f, &mut transport).expect("the structure is sound");
        paths[if rx.decoded.is_some() { 1 } else { 0 }] += 1;
        let ours = rx.verify().map(|(r, pl)| (*r, pl.to_vec()));
        assert_eq!(ours, cleared(theirs));
    }
    assert!(paths[0] > 0 && paths[1] > 0, "both paths: {paths:?}");
}

#[test]
fn every_golden_frame_but_the_cnp_takes_the_one_pass() {
    let frames = golden_frames();
    let taken: Vec<bool> = frames.iter().map(|f| agree(f)).collect();
    let cnps: Vec<bool> = frames
        .iter()
        .map(|f| f[BTH_OFFSET] == Opcode::Cnp.as_u8())
        .collect();
    assert!(cnps.iter().any(|&c| c), "the golden frames hold a CNP");
    assert_eq!(taken, cnps.iter().map(|c| !c).collect::<Vec<_>>());
}

/// A field no header allows (a reserved AETH syndrome bit) in a frame whose ICRC is also
/// wrong: the ICRC is reported, as the reference checks it first; with the ICRC right, the
/// field. The one pass leaves both frames to the reference.
#[test]
fn a_bad_field_behind_a_bad_icrc_is_an_icrc_error_as_in_the_reference() {
    let frame = emit(&ack_with_ceth_less(), &[]);
    let syndrome = EXT_OFFSET;
    let bad_field = patched(&frame, syndrome, frame[syndrome] | 0x80);
    let mut both = bad_field.clone();
    let icrc_at = both.len() - ICRC_LEN;
    both[icrc_at] ^= 1;
    let mut h: RxHeaders = RxHeaders::default();
    let rx = RxFrame::new(&both, &mut h).expect("the structure is sound");
    assert!(rx.decoded.is_none());
    assert!(matches!(rx.verify(), Err(Error::BadIcrc { .. })));
    let rx = RxFrame::new(&bad_field, &mut h).expect("the structure is sound");
    assert!(matches!(
        rx.verify(),
        Err(Error::BadField {
            layer: Layer::Aeth,
            field: "syndrome",
            ..
        })
    ));
    assert!(!agree(&both) && !agree(&bad_field));
}

/// An ACK without BECN: the one pass takes it.
fn ack_with_ceth_less() -> RoceRepr {
    let mut r = ack_with_ceth();
    r.ceth = None;
    r.bth.becn = false;
    r
}

/// Each integrity check refused in the reference's order, with its error: the IPv4
/// checksum, then a non-zero UDP checksum, then the ICRC.
#[test]
fn each_integrity_check_is_refused_with_the_reference_error() {
    let frame = golden_frames()[2].clone();
    let mut h: RxHeaders = RxHeaders::default();
    assert!(RxFrame::new(&frame, &mut h).unwrap().verify().is_ok());

    // IPv4 checksum (the ICRC does not cover it).
    let mut bad_ip = frame.clone();
    bad_ip[IP_OFFSET + 10] ^= 0x40;
    let rx = RxFrame::new(&bad_ip, &mut h).unwrap();
    assert!(rx.decoded.is_some());
    assert!(matches!(
        rx.verify(),
        Err(Error::BadChecksum {
            layer: Layer::Ipv4,
            ..
        })
    ));

    // A UDP checksum: a right one is accepted (by the reference), a wrong one refused.
    let mut udp_sum = frame.clone();
    let (src, dst) = {
        let p = RocePacket::new_checked(&frame[..]).unwrap();
        (p.ipv4().src_addr(), p.ipv4().dst_addr())
    };
    let udp_end = UDP_OFFSET + usize::from(u16::from_be_bytes([frame[38], frame[39]]));
    crate::udp::Packet::new_unchecked(&mut udp_sum[UDP_OFFSET..udp_end]).fill_checksum(src, dst);
    assert_ne!(&udp_sum[40..42], &[0, 0]);
    assert!(agree(&udp_sum));
    let (repr, _) = RxFrame::new(&udp_sum, &mut h).unwrap().verify().unwrap();
    assert_eq!(*repr, crate::parse_frame(&frame).unwrap().0);
    udp_sum[41] ^= 1;
    assert!(matches!(
        RxFrame::new(&udp_sum, &mut h).unwrap().verify(),
        Err(Error::BadChecksum {
            layer: Layer::Udp,
            ..
        })
    ));

    // The ICRC.
    let mut bad_icrc = frame.clone();
    let last = bad_icrc.len() - 1;
    bad_icrc[last] ^= 0x10;
    assert!(matches!(
        RxFrame::new(&bad_icrc, &mut h).unwrap().verify(),
        Err(Error::BadIcrc { .. })
    ));
}

/// An ACK that carries a CETH is left to the reference and comes back with it.
#[test]
fn an_ack_with_a_ceth_comes_back_with_it() {
    let r = ack_with_ceth();
    let frame = emit(&r, &[]);
    let mut h: RxHeaders = RxHeaders::default();
    let rx = RxFrame::new(&frame, &mut h).unwrap();
    assert!(rx.decoded.is_none());
    let (back, payload) = rx.verify().unwrap();
    assert_eq!((*back, payload), (r, &[][..]));
}
