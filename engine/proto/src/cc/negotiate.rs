//! Congestion control settled by the connection manager: what a Portico end offers in its
//! REQ, what the passive end takes and answers in its REP, and what the active end makes of
//! the answer (`wire::cm::portico_ext`, `docs/wire.md` §20).
//!
//! Only `ack` is offered: `none` and `dcqcn` are what any RoCE peer runs, and a REQ for them
//! carries nothing new. The rules:
//! - The scheme both ends run: the same where they agree; where they differ, `none` if either
//!   runs `none`, otherwise `dcqcn` (the standard scheme both speak).
//! - An end configured `ack` whose peer neither offered nor answered (a standard peer, or the
//!   application's private data left no room for the block) runs `dcqcn`: its ACKs must not
//!   carry a CETH the peer cannot parse.
//! - The CETH's delay word is on only where both ends turned it on.
//! - Keep-rate: each end's configured value is what it asks of the *other* end's sender (the
//!   receiver sees the queue, as in seed 002, where the ACK tells the sender to keep or
//!   restore), so each end's sender keeps the rate its peer asked for.

use wire::cm::portico_ext::{CC_ACK, CC_DCQCN, CC_NONE, ExtRepr};

use super::{CcConfig, CcMode};

fn code(mode: CcMode) -> u8 {
    match mode {
        CcMode::None => CC_NONE,
        CcMode::Dcqcn => CC_DCQCN,
        CcMode::Ack => CC_ACK,
    }
}

fn mode(code: u8) -> CcMode {
    match code {
        CC_ACK => CcMode::Ack,
        CC_DCQCN => CcMode::Dcqcn,
        _ => CcMode::None,
    }
}

/// The scheme two ends run.
fn agree(a: CcMode, b: CcMode) -> CcMode {
    match (a, b) {
        _ if a == b => a,
        (CcMode::None, _) | (_, CcMode::None) => CcMode::None,
        _ => CcMode::Dcqcn,
    }
}

/// This end's block: its scheme, delay word and keep-rate ask.
fn block(own: &CcConfig) -> ExtRepr {
    ExtRepr {
        cc: code(own.mode),
        delay: own.mode == CcMode::Ack && own.ack.delay,
        keep_rate_us: (own.ack.keep_rate_ns / 1_000).min(u64::from(u16::MAX)) as u16,
    }
}

/// `own` settled with the peer's block (`None`: the peer said nothing).
fn settle(own: &CcConfig, peer: Option<&ExtRepr>) -> CcConfig {
    let mut cc = *own;
    match peer {
        None if own.mode == CcMode::Ack => cc.mode = CcMode::Dcqcn,
        None => {}
        Some(p) => cc.mode = agree(own.mode, mode(p.cc)),
    }
    // `ack` is kept only with the peer's block (a silent peer made it `dcqcn` above).
    match (cc.mode, peer) {
        (CcMode::Ack, Some(p)) => {
            cc.ack.delay = own.ack.delay && p.delay;
            cc.ack.keep_rate_ns = u64::from(p.keep_rate_us) * 1_000;
        }
        _ => {
            cc.ack.delay = false;
            cc.ack.keep_rate_ns = 0;
        }
    }
    cc
}

/// What the active end puts in its REQ: a block where it runs `ack`, nothing otherwise.
pub fn offer(own: &CcConfig) -> Option<ExtRepr> {
    (own.mode == CcMode::Ack).then(|| block(own))
}

/// The passive end: the configuration its queue pair runs, given the REQ's block, and the
/// block its REP answers with (only to an offer).
pub fn accept(own: &CcConfig, offer: Option<&ExtRepr>) -> (CcConfig, Option<ExtRepr>) {
    let cc = settle(own, offer);
    let answer = offer.map(|_| ExtRepr {
        cc: code(cc.mode),
        delay: cc.ack.delay,
        keep_rate_us: block(own).keep_rate_us,
    });
    (cc, answer)
}

/// The active end: the configuration its queue pair runs, given the REP's block.
pub fn connected(own: &CcConfig, answer: Option<&ExtRepr>) -> CcConfig {
    if own.mode != CcMode::Ack {
        // It offered nothing; a block in the REP answers no question of its.
        return *own;
    }
    settle(own, answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cc(mode: CcMode, delay: bool, keep_us: u64) -> CcConfig {
        let mut c = CcConfig {
            mode,
            ..CcConfig::default()
        };
        c.ack.delay = delay;
        c.ack.keep_rate_ns = keep_us * 1_000;
        c
    }

    /// Both ends through the exchange: (initiator's, target's) settled configuration.
    fn exchange(a: CcConfig, b: CcConfig) -> (CcConfig, CcConfig) {
        let req = offer(&a);
        let (b_runs, rep) = accept(&b, req.as_ref());
        (connected(&a, rep.as_ref()), b_runs)
    }

    fn summary(c: &CcConfig) -> (CcMode, bool, u64) {
        (c.mode, c.ack.delay, c.ack.keep_rate_ns / 1_000)
    }

    #[test]
    fn both_ends_settle_on_one_scheme_the_delay_word_where_both_want_it_and_the_peer_s_keep_rate() {
        use CcMode::*;
        let cases = [
            // (initiator, target) → (initiator runs, target runs)
            (
                cc(Ack, true, 200),
                cc(Ack, true, 50),
                (Ack, true, 50),
                (Ack, true, 200),
            ),
            (
                cc(Ack, true, 200),
                cc(Ack, false, 0),
                (Ack, false, 0),
                (Ack, false, 200),
            ),
            (
                cc(Ack, true, 200),
                cc(Dcqcn, false, 0),
                (Dcqcn, false, 0),
                (Dcqcn, false, 0),
            ),
            (
                cc(Ack, false, 0),
                cc(None, false, 0),
                (None, false, 0),
                (None, false, 0),
            ),
            // No offer from a dcqcn or none initiator: a target configured ack falls back.
            (
                cc(Dcqcn, false, 0),
                cc(Ack, true, 10),
                (Dcqcn, false, 0),
                (Dcqcn, false, 0),
            ),
            (
                cc(None, false, 0),
                cc(Ack, true, 10),
                (None, false, 0),
                (Dcqcn, false, 0),
            ),
            (
                cc(Dcqcn, false, 0),
                cc(Dcqcn, false, 0),
                (Dcqcn, false, 0),
                (Dcqcn, false, 0),
            ),
        ];
        for (a, b, want_a, want_b) in cases {
            let (got_a, got_b) = exchange(a, b);
            assert_eq!(
                (summary(&got_a), summary(&got_b)),
                (want_a, want_b),
                "{:?} with {:?}",
                summary(&a),
                summary(&b)
            );
        }
    }

    #[test]
    fn only_ack_is_offered_and_a_silent_peer_gets_dcqcn() {
        assert_eq!(offer(&cc(CcMode::Dcqcn, false, 0)), None);
        assert_eq!(offer(&cc(CcMode::None, true, 5)), None);
        let o = offer(&cc(CcMode::Ack, true, 70_000)).unwrap();
        assert_eq!((o.cc, o.delay, o.keep_rate_us), (CC_ACK, true, u16::MAX));
        // A standard target answers nothing: the initiator does not put CETHs in its ACKs.
        let a = connected(&cc(CcMode::Ack, true, 100), None);
        assert_eq!(summary(&a), (CcMode::Dcqcn, false, 0));
        // A standard initiator offers nothing, and the target's REP carries nothing.
        let (b, rep) = accept(&cc(CcMode::Ack, true, 100), None);
        assert_eq!((summary(&b), rep), ((CcMode::Dcqcn, false, 0), None));
    }
}
