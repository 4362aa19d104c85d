//! Remote persistence (seed 004): what a responder owes once data is durable.
//!
//! A WRITE that must be durable lands in a region of the application's mapping like any other
//! WRITE; making it durable is then a `pmem` persist of its range. On a DAX mapping that is a
//! few cache-line write-backs and a fence, done at once on the worker. On a file in the page
//! cache it is an `msync`, a system call the worker must not wait in: the persist becomes a
//! [`PersistJob`] with a ticket, which the engine hands to a flusher thread, and the tickets
//! complete in order (a watermark, [`crate::transport::MemoryTable::mark_persisted`]).
//!
//! This module keeps, per queue pair, what the responder promised to say once a ticket is
//! done (`Durability`):
//! * a **durable ACK** for a durable WRITE (Portico's extension): the receipt ACK goes out at
//!   once as for any WRITE, and the durable ACK, opcode 0xE2 with the same PSN, when the
//!   data is durable. Durable ACKs are cumulative, so one covers several writes;
//! * an **ACK hold** for a plain WRITE into a region registered [`Access::DURABLE`] from a
//!   requester that does not speak the extension: no ACK may name its PSN before it is
//!   durable, so a standard requester completing the WRITE knows it is durable, with nothing
//!   changed on its side;
//! * a **receipt, then a durable ACK** for the same WRITE from a requester that does
//!   (durable writes negotiated): the ACK that covers it goes at once as a receipt ACK
//!   (opcode 0xE3: a durable ACK through its PSN follows), and the durable ACK when the data
//!   is durable, pipelined as for the explicit durable WRITE;
//! * a **gate** on responses that acknowledge implicitly (READ responses, the empty response
//!   to FLUSH and ATOMIC WRITE): they wait until every persist this queue pair asked for
//!   before them is done. That is what PCIe ordering gives a hardware NIC for a READ after
//!   WRITEs (librpma's "appliance persistency method") and what IBTA FLUSH promises.
//!
//! [`Access::DURABLE`]: crate::transport::Access::DURABLE

use std::collections::VecDeque;
use std::sync::Arc;

use pmem::Mapping;

use super::psn;

/// What a request to persist a range got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persist {
    /// Durable already: volatile memory (nothing to do), or DAX, persisted on the spot.
    Done,
    /// Durable once the engine's persisted watermark reaches this ticket.
    Ticket(u64),
}

/// A range to persist off the worker (an `msync`, or the power-loss simulator's copy).
#[derive(Debug, Clone)]
pub struct PersistJob {
    pub ticket: u64,
    pub map: Arc<Mapping>,
    pub offset: usize,
    pub len: usize,
}

impl PersistJob {
    /// Persist the range (on the flusher thread, or in tests).
    pub fn run(&self) -> Result<(), pmem::Error> {
        self.map.persist(self.offset, self.len)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owed {
    /// Send a durable ACK for this PSN once durable.
    DurableAck,
    /// No ACK may name this PSN before it is durable.
    AckHold,
}

#[derive(Debug, Clone, Copy)]
struct Obligation {
    /// Durable once the watermark reaches this (0: as soon as the ones before it are).
    ticket: u64,
    psn: u32,
    owed: Owed,
}

/// A responder's promises that wait for persistence, oldest first.
#[derive(Debug)]
pub(crate) struct Durability {
    pending: VecDeque<Obligation>,
    capacity: usize,
    /// The latest ticket this queue pair asked for.
    last_ticket: u64,
    /// The engine's persisted watermark as last seen.
    persisted: u64,
    /// The last PSN of the latest durable WRITE known durable (with every one before it).
    durable_psn: Option<u32>,
    /// A durable ACK for `durable_psn` is owed.
    ack_due: bool,
    /// ACK holds among `pending`, so that the common case (none) costs no scan per ACK.
    holds: usize,
    /// The highest PSN a receipt ACK (0xE3) promised a durable ACK through: the last PSN of a
    /// plain WRITE into a durable region (pipelined), or the PSN a receipt ACK named.
    receipt_psn: Option<u32>,
}

impl Durability {
    pub(crate) fn new(capacity: usize) -> Durability {
        Durability {
            pending: VecDeque::with_capacity(capacity),
            capacity,
            last_ticket: 0,
            persisted: 0,
            durable_psn: None,
            ack_due: false,
            holds: 0,
            receipt_psn: None,
        }
    }

    /// No room for another promise: the request must wait (RNR) before it touches memory.
    pub(crate) fn full(&self) -> bool {
        self.pending.len() >= self.capacity
    }

    /// Record what a persist request got.
    pub(crate) fn note(&mut self, p: Persist) {
        if let Persist::Ticket(t) = p {
            self.last_ticket = self.last_ticket.max(t);
        }
    }

    /// What a response accepted now must wait for: the latest ticket of this queue pair, or 0
    /// when everything it asked for is durable.
    pub(crate) fn gate(&self) -> u64 {
        if self.last_ticket > self.persisted {
            self.last_ticket
        } else {
            0
        }
    }

    /// Whether a response gated at `gate` may go.
    pub(crate) fn passed(&self, gate: u64) -> bool {
        gate <= self.persisted
    }

    /// Whether this queue pair waits for a ticket.
    pub(crate) fn waiting(&self) -> bool {
        self.last_ticket > self.persisted
    }

    /// A durable WRITE whose last PSN is `psn` has been placed and its persist asked for.
    pub(crate) fn durable_write(&mut self, psn: u32) {
        self.promise(psn, Owed::DurableAck);
    }

    /// A plain WRITE into a durable region, from a requester that speaks the extension, has
    /// been placed and its persist asked for: the ACK that covers it is a receipt ACK, and a
    /// durable ACK through `psn` follows once durable ([`Durability::receipt_owed`]).
    pub(crate) fn region_write(&mut self, psn: u32) {
        self.promise(psn, Owed::DurableAck);
        self.receipt_psn = Some(psn);
    }

    /// Whether an ACK naming `psn` must be a receipt ACK: it covers a WRITE promised a durable
    /// ACK that is not durable yet. If so, the durable ACK to come is promised through `psn`
    /// itself (the requester holds every WRITE the receipt ACK covers until then).
    #[inline]
    pub(crate) fn receipt_owed(&mut self, psn: u32) -> bool {
        let Some(r) = self.receipt_psn else {
            return false;
        };
        self.receipt_owed_after(r, psn)
    }

    fn receipt_owed_after(&mut self, r: u32, psn: u32) -> bool {
        if !psn::before_eq(r, psn) || self.durable_psn.is_some_and(|d| psn::before_eq(r, d)) {
            return false;
        }
        if psn::before(r, psn) {
            self.promise(psn, Owed::DurableAck);
            self.receipt_psn = Some(psn);
        }
        true
    }

    /// A plain WRITE into a durable region has been placed: hold ACKs at `psn` until durable.
    pub(crate) fn hold_ack(&mut self, psn: u32) {
        self.promise(psn, Owed::AckHold);
    }

    fn promise(&mut self, psn: u32, owed: Owed) {
        let ticket = self.gate();
        if ticket == 0 && self.pending.is_empty() {
            self.kept(psn, owed);
        } else {
            // Branches, not `usize::from(bool)`: `docs/toolchain.md` (rust-lang/rust#158206).
            if owed == Owed::AckHold {
                self.holds += 1;
            }
            self.pending.push_back(Obligation { ticket, psn, owed });
        }
    }

    fn kept(&mut self, psn: u32, owed: Owed) {
        if owed == Owed::DurableAck {
            self.durable_psn = Some(psn);
            self.ack_due = true;
        }
    }

    /// The engine's watermark moved to `persisted`: keep the promises it covers, in order.
    /// Returns whether anything became sendable.
    pub(crate) fn on_persisted(&mut self, persisted: u64) -> bool {
        if persisted <= self.persisted {
            return false;
        }
        self.persisted = persisted;
        while let Some(o) = self.pending.front() {
            if o.ticket > persisted {
                break;
            }
            let o = *o;
            self.pending.pop_front();
            if o.owed == Owed::AckHold {
                self.holds -= 1;
            }
            self.kept(o.psn, o.owed);
        }
        true
    }

    /// The highest PSN an ACK may name: one before the oldest held WRITE (None: no limit).
    pub(crate) fn ack_limit(&self) -> Option<u32> {
        if self.holds == 0 {
            return None;
        }
        self.pending
            .iter()
            .find(|o| o.owed == Owed::AckHold)
            .map(|o| psn::sub(o.psn, 1))
    }

    /// The PSN of the oldest promise still waiting.
    pub(crate) fn oldest(&self) -> Option<u32> {
        self.pending.front().map(|o| o.psn)
    }

    /// Whether a durable ACK is due ([`Durability::take_ack`] would take it).
    #[inline(always)]
    pub(crate) fn ack_due(&self) -> bool {
        self.ack_due
    }

    /// The durable ACK owed, if any, without taking it.
    pub(crate) fn ack_owed(&self) -> Option<u32> {
        if self.ack_due { self.durable_psn } else { None }
    }

    /// The durable ACK owed, if any (taken: it is sent once per call).
    pub(crate) fn take_ack(&mut self) -> Option<u32> {
        if !self.ack_due {
            return None;
        }
        self.ack_due = false;
        self.durable_psn
    }

    /// A duplicate of a request at `psn` arrived (a retransmission, or the requester's probe
    /// for a lost durable ACK): say again what is durable if it covers `psn`.
    pub(crate) fn on_duplicate(&mut self, psn: u32) {
        if self.durable_psn.is_some_and(|d| psn::before_eq(psn, d)) {
            self.ack_due = true;
        }
    }

    /// Error state: nothing more will be said.
    pub(crate) fn clear(&mut self) {
        self.pending.clear();
        self.holds = 0;
        self.ack_due = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promises_are_kept_in_ticket_order_and_durable_acks_are_cumulative() {
        let mut d = Durability::new(8);
        // Nothing pending: a durable write on volatile or DAX memory is durable at once.
        d.durable_write(10);
        assert_eq!(d.take_ack(), Some(10));
        assert_eq!(d.take_ack(), None);

        d.note(Persist::Ticket(1));
        d.durable_write(11);
        d.note(Persist::Ticket(2));
        d.hold_ack(12);
        d.note(Persist::Ticket(3));
        d.durable_write(13);
        assert_eq!(d.gate(), 3);
        assert_eq!(d.ack_limit(), Some(11));
        assert_eq!(d.take_ack(), None);

        // Ticket 1 done: the durable ACK for 11; 12 still holds ACKs.
        assert!(d.on_persisted(1));
        assert_eq!(d.take_ack(), Some(11));
        assert_eq!(d.ack_limit(), Some(11));
        assert!(!d.passed(3));
        // Tickets 2 and 3 at once: one durable ACK, for 13, covers both.
        assert!(d.on_persisted(3));
        assert_eq!(d.take_ack(), Some(13));
        assert_eq!(d.ack_limit(), None);
        assert!(d.passed(3) && !d.waiting());
        // A stale watermark changes nothing; a duplicate at or before 13 re-owes the ACK.
        assert!(!d.on_persisted(2));
        d.on_duplicate(14);
        assert_eq!(d.take_ack(), None);
        d.on_duplicate(12);
        assert_eq!(d.take_ack(), Some(13));
    }

    #[test]
    fn a_write_durable_at_once_still_waits_for_earlier_tickets() {
        let mut d = Durability::new(8);
        d.note(Persist::Ticket(5));
        d.durable_write(1);
        // DAX: durable at once, but the write before it is not yet.
        d.note(Persist::Done);
        d.durable_write(2);
        assert_eq!(d.take_ack(), None);
        d.on_persisted(5);
        assert_eq!(d.take_ack(), Some(2));
    }
}
