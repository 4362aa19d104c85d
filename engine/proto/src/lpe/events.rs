//! Full events and the sinks they are written into (the NIC's event queue).
//! Events carry what an MPI library needs (match bits, rlength, mlength,
//! offset, initiator, header data); sinks are caller-provided so the matching
//! path never allocates: [`Ring`] is a fixed-capacity ring that counts what it
//! could not hold instead of growing.

use std::collections::VecDeque;

use super::entry::{EndpointIndex, ListKind, ProcessId};

/// Event types (the Portals `PTL_EVENT_*` subset the LPE produces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A put landed in a priority or overflow entry.
    Put,
    /// A get was served from a priority or overflow entry.
    Get,
    /// A priority append (or search-and-delete) consumed an unexpected put header.
    PutOverflow,
    /// A priority append (or search-and-delete) consumed an unexpected get header.
    GetOverflow,
    /// The entry was linked into its list.
    Link,
    /// The entry unlinked itself (use-once, or min-free tripped).
    AutoUnlink,
    /// An auto-unlinked overflow entry has no unexpected header left referring to it.
    AutoFree,
    /// Result of a search-only probe (or of a search that found nothing).
    Search,
    /// Flow control disabled the endpoint.
    PtDisabled,
    /// The endpoint now queues headers on the software request list.
    SoftwareMode,
}

/// Completion status of an event (Portals `ni_fail_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NiFail {
    Ok,
    /// A search found no matching unexpected header.
    NoMatch,
    /// Flow control disabled the endpoint.
    PtDisabled,
    /// The endpoint ran out of list entries and fell back to software matching.
    ListFull,
    /// The message could not be delivered whole (its connection failed before all of its
    /// data arrived); `mlength` bytes of it are in place. Set by the wire path only.
    Undeliverable,
}

/// One full event. Fields that do not apply to a kind are zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub fail: NiFail,
    pub ep: EndpointIndex,
    /// List the entry or header was on.
    pub list: ListKind,
    /// The entry's cookie (`user_ptr`).
    pub cookie: u64,
    /// Where the data is: entry start + offset (for overflow events, inside
    /// the overflow buffer the data landed in).
    pub start: u64,
    pub match_bits: u64,
    pub rlength: u64,
    pub mlength: u64,
    pub remote_offset: u64,
    pub initiator: ProcessId,
    pub hdr_data: u64,
    /// The message's [`IncomingHeader::token`](super::IncomingHeader::token) (0 for events
    /// about no message).
    pub token: u64,
}

impl Event {
    /// An event with only kind, endpoint, list and cookie filled in.
    pub const fn bare(kind: EventKind, ep: EndpointIndex, list: ListKind, cookie: u64) -> Self {
        Self {
            kind,
            fail: NiFail::Ok,
            ep,
            list,
            cookie,
            start: 0,
            match_bits: 0,
            rlength: 0,
            mlength: 0,
            remote_offset: 0,
            initiator: ProcessId { nid: 0, pid: 0 },
            hdr_data: 0,
            token: 0,
        }
    }
}

/// Where events go. Implementations must not allocate per event if the
/// caller wants an allocation-free fast path ([`Ring`] does not).
pub trait EventSink {
    fn push_event(&mut self, event: Event);
}

impl EventSink for Vec<Event> {
    fn push_event(&mut self, event: Event) {
        self.push(event);
    }
}

/// Discards events (useful when only the outcome matters).
#[derive(Debug, Default, Clone, Copy)]
pub struct NullSink;

impl EventSink for NullSink {
    fn push_event(&mut self, _event: Event) {}
}

/// Fixed-capacity FIFO ring. Storage is allocated once in [`Ring::new`];
/// pushing into a full ring keeps the older items and counts the lost one,
/// the way a NIC event queue overflows.
#[derive(Debug, Clone)]
pub struct Ring<T> {
    items: VecDeque<T>,
    capacity: usize,
    lost: u64,
}

impl<T> Ring<T> {
    pub fn new(capacity: usize) -> Self {
        Self {
            items: VecDeque::with_capacity(capacity),
            capacity,
            lost: 0,
        }
    }

    /// Returns false (and counts a loss) when full.
    #[inline]
    pub fn push(&mut self, item: T) -> bool {
        if self.items.len() >= self.capacity {
            self.lost += 1;
            return false;
        }
        self.items.push_back(item);
        true
    }

    #[inline]
    pub fn pop(&mut self) -> Option<T> {
        self.items.pop_front()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Items that did not fit since creation.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    pub fn clear(&mut self) {
        self.items.clear();
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter()
    }

    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.items.drain(..)
    }
}

/// An event queue.
pub type EventRing = Ring<Event>;

impl EventSink for Ring<Event> {
    #[inline]
    fn push_event(&mut self, event: Event) {
        self.push(event);
    }
}
