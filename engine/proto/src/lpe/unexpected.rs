//! The unexpected list (headers of messages that landed in an overflow entry,
//! waiting for the receive that will claim them) and the software request
//! list (headers handed to host-managed matching).
//!
//! Unexpected headers are exact, the receive searching them may have
//! wildcards: headers are binned by match bits (walked in arrival order when
//! the receive has no ignore bits) and also chained in arrival order for
//! receives with ignore bits. Storage is a fixed slab.

use std::collections::{HashMap, VecDeque};

use super::entry::{IncomingHeader, MatchEntry, ProcessId};
use super::hash::BuildWordHasher;
use super::list::NIL;
use super::reserve::Reserve;

/// A header stored on the unexpected list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnexpectedHeader {
    pub header: IncomingHeader,
    /// Where the data landed inside the overflow buffer.
    pub start: u64,
    pub mlength: u64,
    /// Cookie of the overflow entry that holds the data.
    pub overflow_cookie: u64,
    /// Overflow accounting record (for AUTO_FREE).
    pub(crate) account: u32,
}

#[derive(Clone, Copy, Debug)]
struct HdrNode {
    hdr: UnexpectedHeader,
    all_prev: u32,
    all_next: u32,
    bin_prev: u32,
    bin_next: u32,
    live: bool,
}

#[derive(Clone, Copy, Debug)]
struct Ends {
    head: u32,
    tail: u32,
}

const NO_ENDS: Ends = Ends {
    head: NIL,
    tail: NIL,
};

const BLANK_HDR: HdrNode = HdrNode {
    hdr: UnexpectedHeader {
        header: IncomingHeader::put(ProcessId { nid: 0, pid: 0 }, 0, 0),
        start: 0,
        mlength: 0,
        overflow_cookie: 0,
        account: 0,
    },
    all_prev: NIL,
    all_next: NIL,
    bin_prev: NIL,
    bin_next: NIL,
    live: false,
};

/// Headers in arrival order, with per-match-bits bins. Its nodes are a
/// `Reserve`, as the entry lists' (`list::Slab`).
#[derive(Debug, Clone)]
pub struct UnexpectedList {
    nodes: Reserve<HdrNode>,
    all: Ends,
    bins: HashMap<u64, Ends, BuildWordHasher>,
}

impl UnexpectedList {
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.min(NIL as usize);
        Self {
            nodes: Reserve::with_capacity(capacity),
            all: NO_ENDS,
            bins: HashMap::with_capacity_and_hasher(
                capacity.saturating_mul(2),
                BuildWordHasher::default(),
            ),
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.in_use()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_full(&self) -> bool {
        self.nodes.is_full()
    }

    /// Appends in arrival order; `None` when full.
    pub fn push(&mut self, hdr: UnexpectedHeader) -> Option<u32> {
        // Written just below.
        let slot = self.nodes.take(BLANK_HDR)?;
        let bin = self.bins.entry(hdr.header.match_bits).or_insert(NO_ENDS);
        let nodes = &mut self.nodes;
        nodes[slot as usize] = HdrNode {
            hdr,
            all_prev: self.all.tail,
            all_next: NIL,
            bin_prev: bin.tail,
            bin_next: NIL,
            live: true,
        };
        if self.all.tail == NIL {
            self.all.head = slot;
        } else {
            nodes[self.all.tail as usize].all_next = slot;
        }
        self.all.tail = slot;
        if bin.tail == NIL {
            bin.head = slot;
        } else {
            nodes[bin.tail as usize].bin_next = slot;
        }
        bin.tail = slot;
        Some(slot)
    }

    pub fn remove(&mut self, slot: u32) -> UnexpectedHeader {
        let node = self.nodes[slot as usize];
        debug_assert!(node.live);
        if node.all_prev == NIL {
            self.all.head = node.all_next;
        } else {
            self.nodes[node.all_prev as usize].all_next = node.all_next;
        }
        if node.all_next == NIL {
            self.all.tail = node.all_prev;
        } else {
            self.nodes[node.all_next as usize].all_prev = node.all_prev;
        }
        let bits = node.hdr.header.match_bits;
        if let Some(bin) = self.bins.get_mut(&bits) {
            if node.bin_prev == NIL {
                bin.head = node.bin_next;
            } else {
                self.nodes[node.bin_prev as usize].bin_next = node.bin_next;
            }
            if node.bin_next == NIL {
                bin.tail = node.bin_prev;
            } else {
                self.nodes[node.bin_next as usize].bin_prev = node.bin_prev;
            }
            if bin.head == NIL {
                self.bins.remove(&bits);
            }
        }
        self.nodes[slot as usize].live = false;
        self.nodes.give(slot);
        node.hdr
    }

    pub fn get(&self, slot: u32) -> &UnexpectedHeader {
        &self.nodes[slot as usize].hdr
    }

    fn claims(entry: &MatchEntry, h: &IncomingHeader) -> bool {
        entry.matches(h)
    }

    /// Walks from `slot` (inclusive) along the chain a search for `entry` uses.
    fn walk(&self, entry: &MatchEntry, mut slot: u32) -> Option<u32> {
        let by_bin = entry.ignore_bits == 0;
        while slot != NIL {
            let node = &self.nodes[slot as usize];
            if Self::claims(entry, &node.hdr.header) {
                return Some(slot);
            }
            slot = if by_bin { node.bin_next } else { node.all_next };
        }
        None
    }

    /// Oldest header the receive `entry` would claim. The look at an empty list (every
    /// receive posted ahead of its message) is inline, the search out of line.
    #[inline(always)]
    pub fn first_match(&self, entry: &MatchEntry) -> Option<u32> {
        if self.is_empty() {
            return None;
        }
        self.first_match_in(entry)
    }

    #[inline(never)]
    fn first_match_in(&self, entry: &MatchEntry) -> Option<u32> {
        let start = if entry.ignore_bits == 0 {
            self.bins.get(&entry.match_bits).map_or(NIL, |b| b.head)
        } else {
            self.all.head
        };
        self.walk(entry, start)
    }

    /// Next header after `slot` (still linked) that `entry` would claim.
    pub fn next_match(&self, entry: &MatchEntry, slot: u32) -> Option<u32> {
        let node = &self.nodes[slot as usize];
        let next = if entry.ignore_bits == 0 {
            node.bin_next
        } else {
            node.all_next
        };
        self.walk(entry, next)
    }

    /// Headers in arrival order.
    pub fn for_each(&self, mut f: impl FnMut(&UnexpectedHeader)) {
        let mut slot = self.all.head;
        while slot != NIL {
            let node = &self.nodes[slot as usize];
            f(&node.hdr);
            slot = node.all_next;
        }
    }
}

/// Headers waiting for host-managed matching, in arrival order.
#[derive(Debug, Clone)]
pub struct SoftwareRequestList {
    queue: VecDeque<IncomingHeader>,
    capacity: usize,
}

impl SoftwareRequestList {
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            queue: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// False when full (nothing is stored).
    pub fn push(&mut self, hdr: IncomingHeader) -> bool {
        if self.queue.len() >= self.capacity {
            return false;
        }
        self.queue.push_back(hdr);
        true
    }

    pub fn pop(&mut self) -> Option<IncomingHeader> {
        self.queue.pop_front()
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}
