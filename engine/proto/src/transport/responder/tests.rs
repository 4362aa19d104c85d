//! Which answer a request with two faults gets: the order of the checks where it is visible
//! to the peer and differs from IBTA's (the receive of a WRITE with immediate and the
//! READ-like response slots are checked after the remote key), and where it matches (the
//! receive of a SEND is checked before its length).

use wire::aeth::{NakCode, Syndrome};
use wire::{ImmDtRepr, Opcode, RethRepr, RoceRepr};

use crate::transport::QpConfig;
use crate::transport::cq::StagedCompletions;
use crate::transport::mr::MemoryTable;
use crate::transport::tagged::NoTags;

use super::{Responder, Verdict};

fn request(cfg: &QpConfig, opcode: Opcode) -> RoceRepr {
    cfg.header(opcode, cfg.recv_psn, false)
}

/// A RETH naming 64 bytes under an rkey nobody registered.
const BAD_RETH: RethRepr = RethRepr {
    virtual_addr: 0x1000,
    rkey: 0x1234,
    dma_len: 64,
};

fn deliver(cfg: &QpConfig, resp: &mut Responder, repr: &RoceRepr, payload: &[u8]) -> Verdict {
    let mut mem = MemoryTable::new();
    let mut cq = StagedCompletions::new(16);
    resp.on_request(
        cfg,
        repr,
        repr.bth.opcode,
        payload,
        &mut mem,
        &mut cq,
        &mut NoTags,
    )
}

#[test]
fn send_without_receive_is_rnr_before_its_length_is_looked_at() {
    let cfg = QpConfig::new(1, 2);
    let mut resp = Responder::new(&cfg);
    let too_long = vec![0u8; cfg.pmtu.bytes() as usize + 1];
    let verdict = deliver(&cfg, &mut resp, &request(&cfg, Opcode::SendOnly), &too_long);
    assert_eq!(verdict, Verdict::Ok);
    assert!(matches!(resp.nak, Some((Syndrome::RnrNak { .. }, _))));
}

#[test]
fn write_with_immediate_bad_rkey_and_no_receive_is_a_remote_access_error() {
    let cfg = QpConfig::new(1, 2);
    let mut resp = Responder::new(&cfg);
    let mut repr = request(&cfg, Opcode::RdmaWriteOnlyWithImmediate);
    repr.reth = Some(BAD_RETH);
    repr.immdt = Some(ImmDtRepr { data: [0, 0, 0, 7] });
    let verdict = deliver(&cfg, &mut resp, &repr, &[0u8; 64]);
    assert_eq!(verdict, Verdict::Fatal);
    assert_eq!(
        resp.nak,
        Some((Syndrome::Nak(NakCode::RemoteAccessError), cfg.recv_psn))
    );
}

#[test]
fn write_with_immediate_bad_length_and_no_receive_is_an_invalid_request() {
    let cfg = QpConfig::new(1, 2);
    let mut resp = Responder::new(&cfg);
    let mut repr = request(&cfg, Opcode::RdmaWriteOnlyWithImmediate);
    repr.reth = Some(BAD_RETH);
    repr.immdt = Some(ImmDtRepr { data: [0, 0, 0, 7] });
    let verdict = deliver(&cfg, &mut resp, &repr, &[0u8; 63]);
    assert_eq!(verdict, Verdict::Fatal);
    assert_eq!(
        resp.nak,
        Some((Syndrome::Nak(NakCode::InvalidRequest), cfg.recv_psn))
    );
}

#[test]
fn read_bad_rkey_without_a_free_slot_is_a_remote_access_error_not_a_drop() {
    let mut cfg = QpConfig::new(1, 2);
    cfg.max_rd_atomic = 0;
    let mut resp = Responder::new(&cfg);
    let mut repr = request(&cfg, Opcode::RdmaReadRequest);
    repr.reth = Some(BAD_RETH);
    let verdict = deliver(&cfg, &mut resp, &repr, &[]);
    assert_eq!(verdict, Verdict::Fatal);
    assert_eq!(
        resp.nak,
        Some((Syndrome::Nak(NakCode::RemoteAccessError), cfg.recv_psn))
    );
    assert_eq!(resp.stats.dropped_requests, 0);
}

#[test]
fn read_of_nothing_without_a_free_slot_is_dropped() {
    let mut cfg = QpConfig::new(1, 2);
    cfg.max_rd_atomic = 0;
    let mut resp = Responder::new(&cfg);
    let mut repr = request(&cfg, Opcode::RdmaReadRequest);
    // Length 0: no rkey check (C9-88), so only the slot can stop it.
    repr.reth = Some(RethRepr {
        dma_len: 0,
        ..BAD_RETH
    });
    let verdict = deliver(&cfg, &mut resp, &repr, &[]);
    assert_eq!(verdict, Verdict::Ok);
    assert_eq!(resp.nak, None);
    assert_eq!(resp.stats.dropped_requests, 1);
    assert_eq!(resp.expected_psn(), cfg.recv_psn);
}
