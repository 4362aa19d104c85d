//! The receiving half of the loopback test: verifies every frame (headers, IPv4 checksum,
//! lengths, every payload byte) and tracks the sequence, so that "sent N, received N intact,
//! in order" is a counted fact rather than an assumption.

use super::frame;
use crate::dataplane::Burst;
use crate::runtime::{Counters, Outlook, Outputs, Stage};

crate::counter_set! {
    /// What the checker counts, declared once: its worker's counter names (the summary's,
    /// the JSON's and telemetry's keys) and slots ([`CheckSlot`]) follow this list. The
    /// checker counts straight in its worker's slots.
    pub struct CheckCounters, slots CheckSlot {
        /// Frames that passed every check (headers, checksum, lengths, payload).
        valid: Sum,
        /// Frames that failed one.
        invalid: Sum,
        /// Sequence numbers skipped over (not yet seen when a later one arrived).
        seq_gaps: Sum,
        /// Frames that arrived after a later sequence number.
        late: Sum,
        /// Bytes of the valid frames.
        valid_bytes: Sum,
    }
}

pub struct Checker {
    expect: Option<u64>,
    next_seq: u64,
    valid: u64,
}

impl Checker {
    /// `expect`: the number of frames after which the check is complete.
    pub fn new(expect: Option<u64>) -> Self {
        Checker {
            expect,
            next_seq: 0,
            valid: 0,
        }
    }
}

impl Stage for Checker {
    fn name(&self) -> &'static str {
        "check"
    }

    fn counter_names(&self) -> &'static [&'static str] {
        &CheckCounters::NAMES
    }

    /// Only packets give it work.
    fn outlook(&mut self) -> Outlook {
        Outlook::PACKETS
    }

    fn on_rx(&mut self, _: usize, burst: &mut Burst, _: &mut Outputs, c: &mut Counters) {
        for m in burst.as_slice() {
            match frame::verify(m.data()) {
                Ok(r) => {
                    self.valid += 1;
                    c.stage[CheckSlot::valid_bytes.index()] += m.pkt_len() as u64;
                    if r.seq >= self.next_seq {
                        c.stage[CheckSlot::seq_gaps.index()] += r.seq - self.next_seq;
                        self.next_seq = r.seq + 1;
                    } else {
                        c.stage[CheckSlot::late.index()] += 1;
                    }
                }
                Err(_) => c.stage[CheckSlot::invalid.index()] += 1,
            }
        }
        c.stage[CheckSlot::valid.index()] = self.valid;
        // Consumed, not dropped.
        burst.clear();
    }

    fn is_finite(&self) -> bool {
        self.expect.is_some()
    }

    fn is_done(&self) -> bool {
        self.expect.is_some_and(|n| self.valid >= n)
    }
}
