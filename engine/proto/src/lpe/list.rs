//! The list interface every entry list implements (priority and overflow
//! lists are the same structure), the preallocated entry slab with intrusive
//! links that both implementations share, and [`LinearList`]: the plain
//! posting-order walk a simple NIC list engine does, kept as the baseline.

use super::entry::{IncomingHeader, MatchEntry};
use super::reserve::Reserve;

/// "No slot" marker in intrusive links.
pub(crate) const NIL: u32 = u32::MAX;

/// Names one linked entry. The generation makes a handle to an unlinked
/// entry stale even after its slot is reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EntryId {
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

impl EntryId {
    pub fn slot(&self) -> u32 {
        self.slot
    }
}

/// Result of a list search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lookup {
    /// First entry, in posting order, that matches the message.
    pub hit: Option<EntryId>,
    /// An entry posted before the hit matched on bits and source but was
    /// skipped because it was no-truncate and too small. Such a result depends
    /// on the message length, so it must not be remembered by the
    /// persistent-entry cache.
    pub length_skip_before_hit: bool,
}

/// An entry list that keeps posting order. Both lists of an endpoint use it;
/// implementations never allocate after `with_capacity`.
pub trait MatchList {
    fn with_capacity(capacity: usize) -> Self
    where
        Self: Sized;
    fn capacity(&self) -> usize;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Links at the tail; `None` when the list is out of entries.
    fn push(&mut self, entry: &MatchEntry) -> Option<EntryId>;
    fn remove(&mut self, id: EntryId) -> Option<MatchEntry>;
    /// [`MatchList::remove`] without handing the entry back (a match that unlinks its entry
    /// has read what it needs of it already); false when `id` is stale.
    fn unlink(&mut self, id: EntryId) -> bool {
        self.remove(id).is_some()
    }
    fn get(&self, id: EntryId) -> Option<&MatchEntry>;
    /// Moves a manage-local entry's offset (the only field that changes while linked).
    fn set_offset(&mut self, id: EntryId, offset: u64);
    /// The first entry in posting order that matches `hdr`.
    fn find(&self, hdr: &IncomingHeader) -> Lookup;
    /// Visits live entries in posting order (host onload and tests; may be slow).
    fn for_each_in_order(&self, f: &mut dyn FnMut(EntryId, &MatchEntry));
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub entry: MatchEntry,
    /// Global posting sequence number within the list; merging bins by it is
    /// what keeps posting order across the deep structure's parts.
    pub seq: u64,
    pub prev: u32,
    pub next: u32,
    pub generation: u32,
    pub live: bool,
    /// Which part of a deep list holds the node.
    pub home: u8,
    /// The bin of its part's table whose chain holds the node (a deep list's hashed parts).
    pub bin: u32,
    /// Posting-order links across all parts (used by the deep list's
    /// short-list walk).
    pub order_prev: u32,
    pub order_next: u32,
}

// A node is its entry (72 bytes) and 40 of links and bookkeeping; a field added shows here,
// and in an endpoint's memory (`docs/lpe.md`).
const _: () = assert!(size_of::<Node>() == 112);

const EMPTY_ENTRY: MatchEntry = MatchEntry::new(0, 0, 0, 0);

const BLANK_NODE: Node = Node {
    entry: EMPTY_ENTRY,
    seq: 0,
    prev: NIL,
    next: NIL,
    generation: 0,
    live: false,
    home: 0,
    bin: 0,
    order_prev: NIL,
    order_next: NIL,
};

/// Fixed pool of nodes ([`Reserve`]: reserved at once, written as first used, a
/// free stack); allocation and release are O(1) and never touch the allocator.
#[derive(Debug, Clone)]
pub(crate) struct Slab {
    pub nodes: Reserve<Node>,
    next_seq: u64,
}

impl Slab {
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            nodes: Reserve::with_capacity(capacity.min(NIL as usize)),
            next_seq: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.nodes.capacity()
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.nodes.in_use()
    }

    pub fn alloc(&mut self, entry: &MatchEntry, home: u8) -> Option<EntryId> {
        let slot = self.nodes.take(BLANK_NODE)?;
        let seq = self.next_seq;
        self.next_seq += 1;
        let node = &mut self.nodes[slot as usize];
        node.entry = *entry;
        node.seq = seq;
        node.prev = NIL;
        node.next = NIL;
        node.generation = node.generation.wrapping_add(1);
        node.live = true;
        node.home = home;
        Some(EntryId {
            slot,
            generation: node.generation,
        })
    }

    #[inline]
    pub fn valid(&self, id: EntryId) -> bool {
        self.nodes
            .get(id.slot as usize)
            .is_some_and(|n| n.live && n.generation == id.generation)
    }

    pub fn release(&mut self, slot: u32) {
        self.nodes.give(slot);
        self.nodes[slot as usize].live = false;
    }

    #[inline]
    pub fn get(&self, id: EntryId) -> Option<&Node> {
        self.nodes
            .get(id.slot as usize)
            .filter(|n| n.live && n.generation == id.generation)
    }

    /// Walks the chain that starts at `head` and continues through `next`, and returns the
    /// first entry that accepts `hdr` and fits it, noting whether a matching entry was
    /// skipped for being too small (no-truncate) before it.
    #[inline(always)]
    pub fn first_match(
        &self,
        head: u32,
        next: impl Fn(&Node) -> u32,
        hdr: &IncomingHeader,
    ) -> Lookup {
        let mut skipped = false;
        let mut slot = head;
        while slot != NIL {
            let node = &self.nodes[slot as usize];
            if node.entry.accepts_key(hdr.match_bits, hdr.initiator) {
                if node.entry.fits(hdr.rlength, hdr.remote_offset) {
                    return Lookup {
                        hit: Some(self.id_of(slot)),
                        length_skip_before_hit: skipped,
                    };
                }
                skipped = true;
            }
            slot = next(node);
        }
        Lookup {
            hit: None,
            length_skip_before_hit: false,
        }
    }

    #[inline]
    pub fn id_of(&self, slot: u32) -> EntryId {
        EntryId {
            slot,
            generation: self.nodes[slot as usize].generation,
        }
    }

    #[inline]
    pub fn set_offset(&mut self, id: EntryId, offset: u64) {
        if self.valid(id) {
            self.nodes[id.slot as usize].entry.offset = offset;
        }
    }

    /// Live entries in posting order.
    pub fn for_each_in_order(&self, f: &mut dyn FnMut(EntryId, &MatchEntry)) {
        let mut live: Vec<(u64, u32)> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.live)
            .map(|(i, n)| (n.seq, i as u32))
            .collect();
        live.sort_unstable();
        for (_, slot) in live {
            f(self.id_of(slot), &self.nodes[slot as usize].entry);
        }
    }
}

/// Head and tail of a doubly-linked chain threaded through a [`Slab`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chain {
    pub head: u32,
    pub tail: u32,
}

impl Chain {
    pub const EMPTY: Chain = Chain {
        head: NIL,
        tail: NIL,
    };

    pub fn push_back(&mut self, nodes: &mut [Node], slot: u32) {
        nodes[slot as usize].prev = self.tail;
        nodes[slot as usize].next = NIL;
        if self.tail == NIL {
            self.head = slot;
        } else {
            nodes[self.tail as usize].next = slot;
        }
        self.tail = slot;
    }

    /// `push_back` on the posting-order links.
    pub fn push_back_order(&mut self, nodes: &mut [Node], slot: u32) {
        nodes[slot as usize].order_prev = self.tail;
        nodes[slot as usize].order_next = NIL;
        if self.tail == NIL {
            self.head = slot;
        } else {
            nodes[self.tail as usize].order_next = slot;
        }
        self.tail = slot;
    }

    /// `unlink` on the posting-order links.
    pub fn unlink_order(&mut self, nodes: &mut [Node], slot: u32) {
        let Node {
            order_prev: prev,
            order_next: next,
            ..
        } = nodes[slot as usize];
        if prev == NIL {
            self.head = next;
        } else {
            nodes[prev as usize].order_next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            nodes[next as usize].order_prev = prev;
        }
    }

    pub fn unlink(&mut self, nodes: &mut [Node], slot: u32) {
        let Node { prev, next, .. } = nodes[slot as usize];
        if prev == NIL {
            self.head = next;
        } else {
            nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            nodes[next as usize].prev = prev;
        }
    }
}

/// One posting-order chain searched from the head: the reference NIC
/// behaviour and the baseline the deep structure is measured against.
#[derive(Debug, Clone)]
pub struct LinearList {
    slab: Slab,
    order: Chain,
}

impl MatchList for LinearList {
    fn with_capacity(capacity: usize) -> Self {
        Self {
            slab: Slab::with_capacity(capacity),
            order: Chain::EMPTY,
        }
    }

    fn capacity(&self) -> usize {
        self.slab.capacity()
    }

    fn len(&self) -> usize {
        self.slab.len()
    }

    fn push(&mut self, entry: &MatchEntry) -> Option<EntryId> {
        let id = self.slab.alloc(entry, 0)?;
        self.order.push_back(&mut self.slab.nodes, id.slot);
        Some(id)
    }

    fn remove(&mut self, id: EntryId) -> Option<MatchEntry> {
        if !self.slab.valid(id) {
            return None;
        }
        let entry = self.slab.nodes[id.slot as usize].entry;
        self.order.unlink(&mut self.slab.nodes, id.slot);
        self.slab.release(id.slot);
        Some(entry)
    }

    #[inline]
    fn get(&self, id: EntryId) -> Option<&MatchEntry> {
        self.slab.get(id).map(|n| &n.entry)
    }

    #[inline]
    fn set_offset(&mut self, id: EntryId, offset: u64) {
        self.slab.set_offset(id, offset);
    }

    #[inline]
    fn find(&self, hdr: &IncomingHeader) -> Lookup {
        self.slab.first_match(self.order.head, |n| n.next, hdr)
    }

    fn for_each_in_order(&self, f: &mut dyn FnMut(EntryId, &MatchEntry)) {
        let mut slot = self.order.head;
        while slot != NIL {
            f(self.slab.id_of(slot), &self.slab.nodes[slot as usize].entry);
            slot = self.slab.nodes[slot as usize].next;
        }
    }
}
